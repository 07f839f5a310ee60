"""What the patching analysis costs (analyses/core/budget.py), and its sweeps in the order they give way.

Row passes, for n examples of P positions, L layers, H heads: the clean and corrupted runs (2n);
per site type a run over the n examples per cell, resumed at the cell's layer (a share s of a
pass, budget.resumed_share): L P cells for residual, attention and MLP outputs, L H for heads
(head_out, q, k, v, pattern), L H P for head_out_by_pos, each plus one null run per layer (the layer's hook
patching nothing: what its cells' effects subtract); attribution estimates: 3n per direction
(two); path patching: n (s L H + 2) (with its null run); causal tracing (trace_samples noise draws): samples n
(1 + 3 s L P) (every layer, position and kind restored in every draw, resumed at its layer), charged only where
the task has prompts to trace (analysis.traces), so a budget never records a cut of trace_samples for a task it
would not trace.

Where resumed passes also skip the positions before an edit (resume.supports(model).prefix), the
edits the engine applies to the captured run (engine._resumed: resid_pre, and the heads' z where
the z shortcut holds: head_out, head_out_by_pos) count only the positions their passes compute:
nothing before the first position d where clean and corrupted prompts differ (the edit changes
nothing there), head_out P - d positions, and each pass of a layer's per-position cells the
positions from its first patched one (at least d) on. The other sites' runs resume with hooks
at every position.
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


def _traces(model, task) -> bool:
    from headscope.analyses.patching.analysis import traces

    return traces(model, task)


def first_difference(task, n: int) -> int:
    """The first position where the first n clean and corrupted prompts differ (0 without them)."""
    corrupted = getattr(task, "corrupted_tokens", None)
    if corrupted is None or corrupted.shape != task.tokens.shape:
        return 0
    differ = (task.tokens[:n] != corrupted[:n]).any(0).nonzero()
    return int(differ[0]) if len(differ) else 0


def position_cells(positions: list[int], n_pos: int, first: int, n_prompts: int, per_forward: int) -> float:
    """One layer's per-position runs (`positions`: the position each run patches, in engine order;
    -1 for the unpatched run, which joins layer 0), in whole-prompt runs, as the sweep engine
    computes them when passes skip the positions before their first edit (sweep.by_position): the
    runs before `first` cost nothing, the others form up to 4 sub-segments (more prompts x
    positions, more of them), each split into passes of at most per_forward runs; a pass computes
    its runs from its first position on."""
    from headscope.execution.sweep import by_position, chunks

    total = 0.0
    for sub in by_position(range(len(positions)), lambda i: max(positions[i], 0), first, n_prompts * n_pos):
        for part in chunks(len(sub), per_forward):
            moved = [p for p in positions[sub.start + part.start:sub.start + part.stop] if p >= first and p >= 0]
            if moved:
                total += len(moved) * (n_pos - moved[0]) / n_pos
    return total


def estimate(model, task, config) -> Cost:
    from headscope.analyses.patching.engine import runs_per_forward
    from headscope.execution import resume

    f = model.facts
    n, n_pos = n_rows(task, config, FULL, QUICK), task_length(task, model)
    L, H = f.n_layers, f.n_heads
    share = resumed_share(model)  # a cell's run resumes at its layer
    support = resume.supports(model)
    weights = [(L - layer) / L if support.ok else 1.0 for layer in range(L)]  # the blocks a run at each layer runs
    prefix = support.ok and support.prefix
    skips = {"resid_pre"} | ({"head_out", "head_out_by_pos"} if support.shortcut else set())  # see the module doc
    first = min(first_difference(task, n), n_pos - 1) if prefix else 0
    per_forward = runs_per_forward(model, n, n_pos)
    parts = {"clean_corrupted": 2 * n, "attribution": 6 * n}
    for i, site in enumerate(_sites(config)):
        k = H if site == "head_out_by_pos" else 1
        if not (prefix and site in skips):
            # and one null run per layer (analysis.exact_sweep: the layer's hook patching nothing, review 19c B1)
            cells = L * share * ((k * n_pos if site in PER_POSITION or site == "head_out_by_pos" else H) + 1)
        elif site == "head_out":
            cells = L * H * share * (n_pos - first) / n_pos
        else:
            runs = [p for p in range(n_pos) for _ in range(k)]
            cells = sum(w * position_cells([-1] * (i == 0 and layer == 0) + runs, n_pos, first, n, per_forward)
                        for layer, w in enumerate(weights))
        parts[f"exact_{site}"] = n * cells
    if config.path_patching:
        parts["path_patching"] = n * (L * H * share + 2)  # + its null run (review 19c B1)
    samples = _samples(config)
    if samples and _traces(model, task):  # a task with nothing to trace costs nothing there (review 17a A2)
        parts["causal_tracing"] = samples * n * (1 + 3 * L * n_pos * share)
    return Cost(parts=parts, n_pos=n_pos)


def fewer_trace_samples(config, model):
    samples = _samples(config)
    return dataclasses.replace(config, trace_samples=samples // 3) if samples > 0 else None


GROUPS = (("head_out_by_pos",), ("q", "k", "v", "pattern"), ("resid_mid", "resid_post"), ("attn_out", "mlp_out"))


def _with_sites(fitted, original, sites):
    """fitted with `sites`; the original's own setting (None: the preset's) where they are all of its sites."""
    return dataclasses.replace(fitted, sites=original.sites if sites == tuple(_sites(original)) else sites)


def fewer_sites(config, model):
    """Drop head_out_by_pos, then q/k/v/pattern, then resid_mid/resid_post, then attn_out/mlp_out
    (resid_pre and head_out stay: where information flows, and which heads carry it)."""
    sites = tuple(_sites(config))
    for group in GROUPS:
        kept = tuple(s for s in sites if s not in group)
        if kept != sites and kept:
            return dataclasses.replace(config, sites=kept)
    return None


def _more_sites(fitted, original):
    """fewer_sites' regrow: one candidate per site group the cut took away, restored in the original's order
    (none while residual_only's cut of head_out stands)."""
    have, want = set(_sites(fitted)), tuple(_sites(original))
    if not set(want) & {"head_out"} <= have:
        return None
    return [_with_sites(fitted, original, tuple(s for s in want if s in have or s in group))
            for group in GROUPS if set(group) & set(want) - have] or None


def residual_only(config, model):
    """The last resort, once the examples are at their floor: resid_pre alone (no head sweep)."""
    sites = tuple(_sites(config))
    return dataclasses.replace(config, sites=("resid_pre",)) if "resid_pre" in sites and len(sites) > 1 else None


def _head_out_back(fitted, original):
    """residual_only's regrow: head_out back beside resid_pre."""
    have, want = set(_sites(fitted)), tuple(_sites(original))
    if "head_out" in have or "head_out" not in want:
        return None
    return _with_sites(fitted, original, tuple(s for s in want if s in have or s == "head_out"))


def no_path_patching(config, model):
    return dataclasses.replace(config, path_patching=False) if config.path_patching else None


# what fit gives back once every cut is made, cheapest first (review 18d C5: path patching, the first cut, was never
# given back after dropping attn_out/mlp_out alone made the plan fit, so a full run reported less than --quick)
no_path_patching.regrow = lambda fitted, original: (  # type: ignore[attr-defined]
    dataclasses.replace(fitted, path_patching=True) if original.path_patching and not fitted.path_patching else None)


fewer_sites.regrow = _more_sites  # type: ignore[attr-defined]
residual_only.regrow = _head_out_back  # type: ignore[attr-defined]

COST = CostModel(estimate=estimate, knobs=(fewer_trace_samples, no_path_patching, fewer_sites,
                                           examples_knob(FULL, QUICK, floor=4), residual_only), weight=2.0)
