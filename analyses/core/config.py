"""AnalysisConfig: the settings every analysis family shares, and its preset rule.

Every family has `run(model, task=None, config=None) -> Result` and a frozen, keyword-only
config dataclass that subclasses AnalysisConfig. `Family.preset(quick=..., seed=..., ...)` is
the family's default for those shared settings: `quick=True` shrinks the family's own sizes
(fewer orderings, steps or bootstrap draws) as a smoke run. A config built directly keeps the
values it is given; its `quick` only shrinks the default number of examples.
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from headscope.errors import ConfigError

C = TypeVar("C", bound="AnalysisConfig")

MAX_SEED = 2**32 - 1  # numpy's generators take 0..2**32 - 1 (torch and random take more)
# Examples per analysis: every family holds each example's tokens and per-example results, and
# building a zoo task of 100,000 examples alone takes ~20 s and ~230 MB; a billion would exhaust
# memory before any output. A task file's sample is also at most its row count.
MAX_EXAMPLES = 100_000


def check_shared(*, seed: Any = 0, n_examples: Any = None) -> None:
    """A ConfigError (one line) for a seed outside 0..MAX_SEED or an n_examples that is not None
    and not 1..MAX_EXAMPLES, so that a bad number fails before any work or file."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"seed (--seed) must be an integer from 0 to {MAX_SEED}, got {seed!r}.")
    if n_examples is not None and (isinstance(n_examples, bool) or not isinstance(n_examples, numbers.Integral)
                                   or not 1 <= n_examples <= MAX_EXAMPLES):
        raise ConfigError(f"n_examples (--n-examples) must be an integer from 1 to {MAX_EXAMPLES:,} (examples per "
                          f"analysis; omit it for each analysis's default), got {n_examples!r}.")


@dataclass(frozen=True, kw_only=True)
class AnalysisConfig:
    """seed: every random draw of the analysis. quick: reduced sizes. n_examples: examples of
    the default task (None: the family's default, smaller when quick). progress: tqdm bars
    (off in the Python API, on in the CLI)."""

    seed: int = 0
    quick: bool = False
    n_examples: int | None = None
    progress: bool = False
    min_examples: ClassVar[int] = 1  # the fewest examples the family can run on (heads 2, probes 3)

    def __post_init__(self) -> None:
        check_shared(seed=self.seed, n_examples=self.n_examples)
        if self.n_examples is not None and self.n_examples < self.min_examples:
            raise ConfigError(f"n_examples (--n-examples) {self.n_examples} is too few for {type(self).__name__}: it "
                              f"needs at least {self.min_examples}.")

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
