"""AnalysisConfig: the settings every analysis family shares, and its preset rule.

Every family has `run(model, task=None, config=None) -> Result` and a frozen, keyword-only
config dataclass that subclasses AnalysisConfig. `Family.preset(quick=..., seed=..., ...)` is
the family's default for those shared settings: `quick=True` shrinks the family's own sizes
(fewer orderings, steps or bootstrap draws) as a smoke run. A config built directly keeps the
values it is given; its `quick` only shrinks the default number of examples.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

C = TypeVar("C", bound="AnalysisConfig")


@dataclass(frozen=True, kw_only=True)
class AnalysisConfig:
    """seed: every random draw of the analysis. quick: reduced sizes. n_examples: examples of
    the default task (None: the family's default, smaller when quick). progress: tqdm bars
    (off in the Python API, on in the CLI)."""

    seed: int = 0
    quick: bool = False
    n_examples: int | None = None
    progress: bool = False

    @classmethod
    def preset(cls: type[C], **common: Any) -> C:
        """The family's settings for the shared options (seed, quick, n_examples, progress)."""
        return cls(**common)

    def examples(self, full: int, quick: int) -> int:
        """n_examples, or the family's default for a full or quick run."""
        return self.n_examples or (quick if self.quick else full)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def with_overrides(config: C, **overrides: Any) -> C:
    """config with the given fields replaced; None values leave a field as it is."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(config, **given) if given else config
