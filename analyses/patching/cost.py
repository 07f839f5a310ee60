"""What the patching analysis costs (analyses/core/budget.py), and its sweeps in the order they give way.

Row passes, for n examples of P positions, L layers, H heads: the clean and corrupted runs (2n);
per site type a run over the n examples per cell, resumed at the cell's layer (a share s of a
pass, budget.resumed_share): L P cells for residual, attention and MLP outputs, L H for heads
(head_out, q, k, v, pattern), L H P for head_out_by_pos; attribution estimates: 3n per direction
(two); path patching: n (s L H + 1); causal tracing (trace_samples noise draws): samples n
(1 + 3 s L P) (every layer, position and kind restored in every draw, resumed at its layer).
"""
from __future__ import annotations

import dataclasses

from headscope.analyses.core.budget import Cost, CostModel, examples_knob, n_rows, resumed_share, task_length

FULL, QUICK = 32, 8
PER_POSITION = {"resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"}
PER_HEAD = {"head_out", "q", "k", "v", "pattern"}


def _sites(config):
    from headscope.analyses.patching.analysis import FULL_SITES, QUICK_SITES

    return config.sites or (QUICK_SITES if config.quick else FULL_SITES)


def _samples(config) -> int:
    return config.trace_samples if config.trace_samples is not None else (3 if config.quick else 10)


def estimate(model, task, config) -> Cost:
    f = model.facts
    n, n_pos = n_rows(task, config, FULL, QUICK), task_length(task, model)
    L, H = f.n_layers, f.n_heads
    share = resumed_share(model)  # a cell's run resumes at its layer
    parts = {"clean_corrupted": 2 * n, "attribution": 6 * n}
    for site in _sites(config):
        cells = L * n_pos if site in PER_POSITION else L * H * n_pos if site == "head_out_by_pos" else L * H
        parts[f"exact_{site}"] = n * cells * share
    if config.path_patching:
        parts["path_patching"] = n * (L * H * share + 1)
    samples = _samples(config)
    if samples:
        parts["causal_tracing"] = samples * n * (1 + 3 * L * n_pos * share)
    return Cost(parts=parts, n_pos=n_pos)


def fewer_trace_samples(config, model):
    samples = _samples(config)
    return dataclasses.replace(config, trace_samples=samples // 3) if samples > 0 else None


def fewer_sites(config, model):
    """Drop head_out_by_pos, then q/k/v/pattern, then resid_mid/resid_post, then attn_out/mlp_out
    (resid_pre and head_out stay: where information flows, and which heads carry it)."""
    sites = tuple(_sites(config))
    for group in (("head_out_by_pos",), ("q", "k", "v", "pattern"), ("resid_mid", "resid_post"), ("attn_out", "mlp_out")):
        kept = tuple(s for s in sites if s not in group)
        if kept != sites and kept:
            return dataclasses.replace(config, sites=kept)
    return None


def residual_only(config, model):
    """The last resort, once the examples are at their floor: resid_pre alone (no head sweep)."""
    sites = tuple(_sites(config))
    return dataclasses.replace(config, sites=("resid_pre",)) if "resid_pre" in sites and len(sites) > 1 else None


def no_path_patching(config, model):
    return dataclasses.replace(config, path_patching=False) if config.path_patching else None


COST = CostModel(estimate=estimate, knobs=(fewer_trace_samples, no_path_patching, fewer_sites,
                                           examples_knob(FULL, QUICK, floor=4), residual_only), weight=2.0)
