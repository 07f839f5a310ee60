"""AnalysisConfig: the settings every analysis family shares, and its preset rule.

Every family has `run(model, task=None, config=None) -> Result` and a frozen, keyword-only
config dataclass that subclasses AnalysisConfig; its named functions take (model, task=None,
config=None, **config_overrides) (`configure`). One seed per run: nested settings (heads' pruning
and L0) have none of their own.

`quick` has one meaning: a smoke run, where every size the caller leaves unset takes the family's
quick value. The fixed ones are the class's QUICK table, applied when the config is built
(`HeadsConfig(quick=True)` equals `HeadsConfig.preset(quick=True)`; `HeadsConfig(quick=True,
n_induction=8)` keeps 8); the sizes that default to None (n_examples, patching's sites and trace
samples, probes' folds) take theirs when the analysis runs. `Family.preset(...)` is the report's
config: the class with the shared options (attribution's full report searches adversarial
attention for 50 steps instead of 100).
"""
from __future__ import annotations

import dataclasses
import difflib
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

    QUICK: ClassVar[dict[str, Any]] = {}  # field -> its quick value (a smoke run's size)

    def __new__(cls, *args: Any, **given: Any) -> AnalysisConfig:
        self = super().__new__(cls)
        object.__setattr__(self, "_given", frozenset(given))  # the fields the caller set (the rest are defaults)
        return self

    def __post_init__(self) -> None:
        check_shared(seed=self.seed, n_examples=self.n_examples)
        if self.quick:  # every size the caller left unset takes its quick value
            for name, value in self.QUICK.items():
                if name not in self.given:
                    object.__setattr__(self, name, value)
        if self.n_examples is not None and self.n_examples < self.min_examples:
            raise ConfigError(f"n_examples (--n-examples) {self.n_examples} is too few for {type(self).__name__}: it "
                              f"needs at least {self.min_examples}.")

    @property
    def given(self) -> frozenset[str]:
        """The fields set when the config was built (dataclasses.replace sets them all)."""
        return getattr(self, "_given", frozenset())

    @classmethod
    def preset(cls: type[C], **common: Any) -> C:
        """The family's settings for the shared options (seed, quick, n_examples, progress)."""
        return cls(**common)

    def examples(self, full: int, quick: int) -> int:
        """n_examples, or the family's default for a full or quick run."""
        return self.n_examples or (quick if self.quick else full)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def configure(cls: type[C], config: Any, overrides: dict[str, Any], *, name: str, default: C | None = None,
              positional: str | None = None) -> C:
    """The config a named analysis runs with: `config` (None: `default`, else cls()) with the keyword
    `overrides` (fields of cls; None leaves a field as it is) replaced. `hs.head_importance(model, task,
    methods=("zero",))` equals `hs.head_importance(model, task, HeadsConfig(methods=("zero",)))`.
    positional: the field an older call form gave third, in the config's place (activation_patching's
    sites, path_patching's receivers, probe_sweep's site): such a value is that field's override.
    A config of another type is an InputTypeError, an unknown keyword one ConfigError naming the
    closest fields, both before any work."""
    from headscope.errors import InputTypeError, did_you_mean

    if positional and config is not None and not isinstance(config, AnalysisConfig):
        if overrides.get(positional) is not None:
            raise ConfigError(f"{name} got {positional} twice: as its third argument and as {positional}=.")
        config, overrides = None, {positional: config, **overrides}
    if config is not None and not isinstance(config, cls):
        raise InputTypeError(f"{name} takes a {cls.__name__} as config, got {type(config).__name__}.")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in overrides if k not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=3, cutoff=0.5)
        hint = f"did you mean {did_you_mean(unknown[0], names)}? " if close else ""
        raise ConfigError(f"{name} has no setting {unknown[0]!r}; {hint}its settings are the fields of "
                          f"{cls.__name__}: {', '.join(names)}.")
    return with_overrides(config if config is not None else (default if default is not None else cls()), **overrides)


def with_overrides(config: C, **overrides: Any) -> C:
    """config with the given fields replaced; None values leave a field as it is. Turning quick on
    rebuilds the config from the fields its caller set, so the others take their quick sizes."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if "quick" in given and bool(given["quick"]) != bool(config.quick):  # rebuilt: unset sizes follow quick
        return type(config)(**{**{k: getattr(config, k) for k in chosen(config) if k != "quick"}, **given})
    return dataclasses.replace(config, **given) if given else config


def chosen(config: AnalysisConfig) -> set[str]:
    """The fields the caller chose: those set when the config was built, less any still at the class
    default or (quick) at its quick value. dataclasses.replace sets every field, so the values decide there."""
    out = set()
    for f in dataclasses.fields(config):
        if not f.init or f.name not in config.given:
            continue
        value = getattr(config, f.name)
        default = (f.default if f.default is not dataclasses.MISSING else
                   f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if value == default or (config.quick and f.name in config.QUICK and value == config.QUICK[f.name]):
            continue
        out.add(f.name)
    return out
