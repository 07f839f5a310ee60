"""The patching family's configs: PatchingConfig (activation_patching, attribution_patching and the
family's `run`), PathPatchingConfig (path_patching) and TracingConfig (causal_tracing).

Each is an AnalysisConfig: one seed, one `quick`, n_examples for the default task, progress bars.
`metric` is a name (inputs.METRICS) or a callable output -> [batch] (a core.metrics.Metric too);
batch_size / memory_budget size the patched runs per forward pass (None: from the memory budget).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from headscope.analyses.core.config import AnalysisConfig

MetricSpec = str | Callable[[Any], Any] | None  # a metric name, a callable output -> [batch], or None (the default)


@dataclass(frozen=True, kw_only=True)
class PatchingConfig(AnalysisConfig):
    """sites: site types (patching/sites.py SITE_TYPES; None: the four main ones for activation_patching,
    and for `run` every type the model exposes, the four main ones when quick); direction: "denoise"
    (corrupted run, clean activation restored) or "noise"; metric: see the module doc (None: logit
    difference when the task has wrong answers); attribution: add attribution-patching estimates
    and their correlation with the exact effects (`run` always does). `run` only: path_patching
    (every head into the logits) and trace_samples (causal tracing's noise samples; None: 10, 3
    when quick; 0 skips tracing)."""

    sites: str | Sequence[str] | None = None
    direction: str = "denoise"
    metric: MetricSpec = None
    attribution: bool = False
    batch_size: int | None = None
    memory_budget: int | None = None
    path_patching: bool = True
    trace_samples: int | None = None


@dataclass(frozen=True, kw_only=True)
class PathPatchingConfig(AnalysisConfig):
    """receivers: "logits" or (layer, head) pairs; senders: (layer, head) pairs (None: every head
    before the last receiver layer); component: the receivers' input reached ("q", "k", "v");
    per_receiver: one run per (sender, receiver) instead of all receivers jointly; direction:
    "noise" (Wang et al.: clean run, corrupted sender output) or "denoise"; metric: see the module doc."""

    receivers: str | Sequence[tuple[int, int]] = "logits"
    senders: Sequence[tuple[int, int]] | None = None
    component: str = "q"
    per_receiver: bool = False
    direction: str = "noise"
    metric: MetricSpec = None
    batch_size: int | None = None
    memory_budget: int | None = None


@dataclass(frozen=True, kw_only=True)
class TracingConfig(AnalysisConfig):
    """kinds: what is restored ("resid", "mlp", "attn"); span: the noised span's name; n_samples:
    noise draws (seeded by `seed`); noise_scale: noise std in units of the span embeddings' std
    (3 in Meng et al.); window: layers restored around each MLP/attention cell (None: 10/48 of the
    layers); metric: see the module doc (default the answer's probability)."""

    kinds: Sequence[str] = ("resid", "mlp", "attn")
    span: str = "subject"
    n_samples: int = 10
    noise_scale: float = 3.0
    window: int | None = None
    metric: MetricSpec = "prob"
    batch_size: int | None = None
    memory_budget: int | None = None


__all__ = ["PatchingConfig", "PathPatchingConfig", "TracingConfig"]
