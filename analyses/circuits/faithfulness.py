"""Exact circuit faithfulness, batched over examples and circuits (issue #23).

A circuit is a set of edges of the EdgeGraph. Every edge outside it is ablated: the clean run
goes forward, and each receiver's input (the residual stream before its norm) has, for every
sender u that reaches it off the circuit, the sender's live write replaced by its write on the
corrupted prompt: x_v = x_v - sum_{u -> v not kept} (a_live[u] - a_corrupt[u]). Kept edges carry
the live (possibly already ablated upstream) write, as in TransformerLens 4.3's `faithfulness`.
The empty circuit reproduces the corrupted run and the full graph the clean one. Forward only;
rows = circuits x examples stacked along the batch axis.

faithfulness(circuit) = (M(circuit) - M(corrupt)) / (M(clean) - M(corrupt)), M the task metric's
mean over examples.

MIB's circuit-localisation metrics (Mueller et al. 2025, "MIB: a Mechanistic Interpretability
Benchmark"; computed as the benchmark's own evaluation code does, MIB-circuit-track
`MIB_circuit_track/evaluation.py::evaluate_area_under_curve` with its defaults): the top-k circuit
at k = int(p * n_edges) for p in MIB_FRACTIONS (0.1% ... 100%), faithfulness
f(C) = (m(C) - m(empty)) / (m(full) - m(empty)), and by the trapezoid rule over the *linear*
fraction p (log_scale=False, the default its run_evaluation script uses), from p = 0.001 to 1:
CPR = area under f (higher is better, at most 0.999 for a faithful curve at 1) and
CMD = area under |1 - f| (lower is better). Two differences, both stated in the summary: MIB
prunes edges that no longer connect the input to the logits before evaluating (headscope does
not), and its m(full) is a plain clean run; headscope measures m(empty) and m(full) as circuits of
the same batched ablation pass, so f is exactly 0 and 1 there (the two differ by rounding only).

CPR and CMD carry a percentile bootstrap interval over examples (`mib_bootstrap`): f is a ratio of
means, so each resample takes every circuit's mean over the same drawn examples (the empty and the
full circuit's too) and recomputes f and both areas; summary mib_cpr_ci, mib_cmd_ci, mib_n_examples,
mib_ci_method.

Every one of these (faithfulness, smallest_k_80, CPR, CMD) is a ratio over the clean-corrupted gap of the
task metric (edge_metric: the logit difference answer minus wrong answer, or the answer's logit where the
task has no wrong answers). Where that gap is within noise by patching's rule (`gap_noise`:
chance.gap_within_noise on the per-example pairs, the 0.1-logit floor of a logit difference, as both
metrics are in logits) the summary carries gap_within_noise (gap, its 95% CI, n, reason) and none of the
ratios is computed, stored or drawn: only the edge scores (review 14b A4, 15a C4: CPR 1.009 over a gap of
1.4e-5 logits in float32, where bfloat16's exact 0 gap skipped edges; one rule for both dtypes).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from headscope.analyses.circuits import edges as E
from headscope.analyses.circuits.headsplit import per_head
from headscope.analyses.core.tasks import Task
from headscope.errors import ConfigError

RANDOM_DRAWS = 3
N_BOOT = 1000  # bootstrap resamples of the examples behind CPR and CMD
MIB_CI_METHOD = ("percentile bootstrap over examples (numpy default_rng(seed), n examples drawn with replacement "
                 "per resample; every circuit's mean metric, m(empty) and m(full) included, over the same draw, then "
                 "f and the areas recomputed; resamples where m(full) = m(empty) are dropped)")
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


METRIC_NAMES = {True: "logit difference (answer - wrong answer)", False: "answer logit"}  # by: has wrong answers


def gap_noise(clean, corrupted, wrong: bool) -> dict | None:
    """chance.gap_within_noise (patching's rule) for the edge metric's per-example clean and corrupted values
    [n]: None when the gap is clear, else its entry, the reason naming the metric (`wrong`: the task has wrong
    answers, the metric is a logit difference; else the answer's logit). Both are in logits, so both take a
    logit difference's floor (0.1 logits)."""
    from headscope.analyses.core import chance

    entry = chance.gap_within_noise(clean, corrupted, "logit_diff")
    if entry is not None and not wrong:  # the rule's words name the logit difference; this metric is a logit
        entry["reason"] = entry["reason"].replace(" logit difference", " answer logit", 1)
    return entry


def circuit_metrics(model, task: Task, graph: E.EdgeGraph, keep: torch.Tensor) -> torch.Tensor:
    """[n_circuits, n_examples] metric of each circuit on each example. keep: [n_circuits,
    n_receivers, n_senders] bool (edges outside graph.reach are ignored)."""
    E.check_model(model, task)
    n, n_pos = len(task), task.tokens.shape[1]
    n_c = keep.shape[0]
    ablate = (graph.reach[None] & ~keep.bool()).to(torch.float32)  # [C, R, S]
    pos, answers, wrong, mask = task.answer_positions(), task.answers, task.wrong_answers, task.attention_mask
    out = torch.empty(n_c, n)
    rows = E._chunk_rows(model, n_pos, graph, grad=False)
    bridge = model.bridge
    with E.edge_hooks_enabled(bridge), torch.no_grad():
        w_corr, _ = E.capture_writers(model, task.corrupted_tokens, mask)  # [n, pos, S, d]
        w_corr = w_corr.to(model.device)
        ablate = ablate.to(model.device)
        pairs = torch.cartesian_prod(torch.arange(n_c), torch.arange(n))  # [C*n, 2]: (circuit, example)
        for start in range(0, len(pairs), rows):
            c_idx, e_idx = pairs[start:start + rows].unbind(1)
            corr = w_corr[e_idx.to(model.device)]  # [b, pos, S, d]
            abl = ablate[c_idx.to(model.device)]  # [b, R, S]
            logits = _ablated_pass(model, graph, task.tokens[e_idx], None if mask is None else mask[e_idx], corr, abl)
            value = E.row_metric(logits.float(), pos[e_idx], answers[e_idx], None if wrong is None else wrong[e_idx])
            out[c_idx, e_idx] = value.cpu()
    return out


def _ablated_pass(model, graph: E.EdgeGraph, tokens: torch.Tensor, mask: torch.Tensor | None, corr: torch.Tensor,
                  abl: torch.Tensor) -> torch.Tensor:
    """Logits [b, pos, vocab] of the clean `tokens` with the edges marked in abl [b, R, S] fed their
    corrupted writes corr [b, pos, S, d]; the caller has edge_hooks_enabled and no_grad."""
    diffs: list[torch.Tensor] = []  # live - corrupted writes so far, in sender order
    real = E.real_tokens(mask, corr)  # [b, pos, 1, 1] or None: padding is never ablated
    split = E.head_split(model)  # None: the bridge's own hook_result and split inputs
    msplit = E.mlp_split(model, split)  # None: the bridge's own hook_mlp_in
    normed_in: dict[str, torch.Tensor] = {}  # split: ln1's input of each layer, read before its heads

    def on_write(first: int, layer: int | None = None):
        def hook(act, hook):
            if layer is not None:  # split: hook_z -> each head's write
                act = split.result(layer, per_head(act, graph.n_heads))
            live = act if act.ndim == 4 else act[:, :, None]  # [b, pos, width, d]
            d = live.float() - corr[:, :, first:first + live.shape[2]]
            diffs.append(d if real is None else torch.where(real, d, 0.0))
        return hook

    def removed(sl: slice) -> torch.Tensor:  # [b, pos, r, d]: the ablated edges' live - corrupted writes
        d = torch.cat(diffs, dim=2)  # [b, pos, S_so_far, d]
        return torch.einsum("bpsd,brs->bprd", d, abl[:, sl, : d.shape[2]])

    def on_read(sl: slice):
        def hook(act, hook):
            if act.ndim == 4:
                return act - removed(sl).to(act.dtype)
            return act - removed(sl)[:, :, 0].to(act.dtype)
        return hook

    def on_split_read(sl: slice, layer: int, kind: str):  # hook_q/k/v: re-project each head's own input
        def hook(act, hook):
            heads = per_head(act, sl.stop - sl.start)
            x = normed_in[split.norm_input(layer)]
            gone = removed(sl)  # [b, pos, r, d]
            cut = split.reproject(layer, kind, x, torch.zeros_like(gone)) - split.reproject(layer, kind, x, gone)
            return (heads - cut.to(act.dtype)).reshape(act.shape)
        return hook

    def on_split_mlp(sl: slice, layer: int):  # mlp.hook_in: re-norm the MLP's input less the ablated writes
        def hook(act, hook):
            x = normed_in[msplit.mlp_norm_input(layer)]
            gone = removed(sl)[:, :, 0]  # [b, pos, d]
            return act - (msplit.mlp_input(layer, x, torch.zeros_like(gone)) - msplit.mlp_input(layer, x, gone)).to(act.dtype)
        return hook

    hooks = [("hook_embed", on_write(0))]
    for layer in range(graph.n_layers):
        sl = graph.receiver_slices(layer)
        if split is None:
            hooks += [(f"blocks.{layer}.attn.hook_{x}_input", on_read(sl[x])) for x in "qkv"]
            hooks.append((f"blocks.{layer}.attn.hook_result", on_write(graph.sender_index(layer, 0))))
        else:
            hooks.append((split.norm_input(layer), E._keeper(normed_in)))
            hooks += [(f"blocks.{layer}.attn.hook_{x}", on_split_read(sl[x], layer, x)) for x in "qkv"]
            hooks.append((f"blocks.{layer}.attn.hook_z", on_write(graph.sender_index(layer, 0), layer)))
        if msplit is None:
            hooks.append((f"blocks.{layer}.hook_mlp_in", on_read(sl["mlp"])))
        else:
            hooks += [(msplit.mlp_norm_input(layer), E._keeper(normed_in)),
                      (f"blocks.{layer}.mlp.hook_in", on_split_mlp(sl["mlp"], layer))]
        hooks.append((f"blocks.{layer}.hook_mlp_out", on_write(graph.sender_index(layer))))
    last = len(graph.receivers) - 1
    hooks.append((f"blocks.{graph.n_layers - 1}.hook_resid_post", on_read(slice(last, last + 1))))
    return E._forward(model, tokens, mask, hooks)


def keep_masks(graph: E.EdgeGraph, scores: torch.Tensor, k_values, seed: int, draws: int = RANDOM_DRAWS):
    """(keep [len(k_values) * (1 + draws), R, S] bool, labels [(k, kind, draw)]): for each k the
    top-k edges by |score| and `draws` random circuits of k edges (seeded)."""
    r_idx, s_idx = graph.reach.nonzero(as_tuple=True)
    flat = scores[r_idx, s_idx].abs()
    order = torch.sort(flat, descending=True, stable=True).indices
    gen = torch.Generator().manual_seed(seed)
    masks, labels = [], []
    for k in k_values:
        if not 0 <= k <= len(flat):
            raise ConfigError(f"k must lie in [0, {len(flat)}] (the graph's edges), got {k}.")
        chosen = [("top", 0, order[:k])]
        chosen += [("random", d, torch.randperm(len(flat), generator=gen)[:k]) for d in range(draws)]
        for kind, draw, idx in chosen:
            m = torch.zeros_like(graph.reach)
            m[r_idx[idx], s_idx[idx]] = True
            masks.append(m)
            labels.append((int(k), kind, draw))
    return torch.stack(masks), labels


def default_k_values(n_edges: int, count: int = 10) -> tuple[int, ...]:
    """About `count` circuit sizes from 1 to all edges, evenly spaced in log scale."""
    ks = np.unique(np.round(np.geomspace(1, n_edges, count)).astype(int))
    return tuple(int(k) for k in ks)


def faithfulness_sweep(model, task: Task, graph: E.EdgeGraph, scores: torch.Tensor, k_values, *, seed: int = 0,
                       metric_clean: float, metric_corrupt: float) -> pd.DataFrame:
    """Faithfulness of the top-k circuit and of random circuits of k edges, for each k: tidy rows
    (k, circuit = "top"/"random", draw, metric, faithfulness), all circuits from stacked passes."""
    gap = metric_clean - metric_corrupt
    if gap == 0:
        raise ConfigError("the clean and corrupted runs give the same metric; faithfulness is undefined.")
    keep, labels = keep_masks(graph, scores, k_values, seed)
    metric = circuit_metrics(model, task, graph, keep).mean(1)  # [C]
    frame = pd.DataFrame(labels, columns=["k", "circuit", "draw"])
    frame["metric"] = metric.double().numpy()
    frame["faithfulness"] = (frame.metric - metric_corrupt) / gap
    return frame


def mib_k_values(n_edges: int, fractions=MIB_FRACTIONS) -> tuple[int, ...]:
    """Edges in each of MIB's circuits: int(p * n_edges), as MIB's evaluation rounds (down)."""
    return tuple(int(p * n_edges) for p in fractions)


def mib_areas(fractions, faith) -> tuple[float, float]:
    """(CPR, CMD): trapezoid areas under f and under |1 - f| over the linear fractions, as MIB."""
    x, f = np.asarray(fractions, dtype=float), np.asarray(faith, dtype=float)
    if len(x) != len(f) or len(x) < 2:
        raise ConfigError(f"need one faithfulness per fraction (at least two), got {len(f)} for {len(x)}.")
    width = np.diff(x)
    cpr = float(np.sum(width * (f[1:] + f[:-1]) / 2))
    cmd = float(np.sum(width * (np.abs(1 - f[1:]) + np.abs(1 - f[:-1])) / 2))
    return cpr, cmd


def mib_bootstrap(metrics, fractions=MIB_FRACTIONS, *, n_boot: int = N_BOOT, seed: int = 0,
                  level: float = 0.95) -> dict:
    """Percentile bootstrap of (CPR, CMD) over examples. metrics: [2 + len(fractions), n] per-example
    metric of the empty circuit (row 0), the full one (row 1) and the top-k circuit at each fraction.
    f = (mean m(C) - mean m(empty)) / (mean m(full) - mean m(empty)) is a ratio of means, so every
    resample draws n examples with replacement once and takes all rows' means over that draw.
    Returns {"cpr_ci": [lo, hi], "cmd_ci": [lo, hi], "n_examples", "n_boot" (resamples kept: a draw
    with m(full) = m(empty) has no f), "level"}; the intervals are None for one example."""
    m = np.asarray(metrics, dtype=np.float64)  # [2 + F, n]
    x = np.asarray(fractions, dtype=np.float64)  # [F]
    if m.ndim != 2 or m.shape[0] != len(x) + 2:
        raise ConfigError(f"need the empty, the full and one circuit per fraction ({len(x) + 2} rows), got {m.shape}.")
    n = m.shape[1]
    out = {"cpr_ci": None, "cmd_ci": None, "n_examples": int(n), "n_boot": 0, "level": level}
    if n < 2:
        return out
    draws = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))  # [n_boot, n] example indices
    means = m[:, draws].mean(-1)  # [2 + F, n_boot]
    empty, full, curve = means[0], means[1], means[2:]
    ok = full != empty  # [n_boot]
    f = (curve[:, ok] - empty[ok]) / (full[ok] - empty[ok])  # [F, kept]
    width = np.diff(x)[:, None]  # [F - 1, 1]
    cpr = (width * (f[1:] + f[:-1]) / 2).sum(0)  # [kept]
    cmd = (width * (np.abs(1 - f[1:]) + np.abs(1 - f[:-1])) / 2).sum(0)  # [kept]
    tail = (1 - level) / 2
    if ok.any():
        out["cpr_ci"] = [float(v) for v in np.quantile(cpr, [tail, 1 - tail])]
        out["cmd_ci"] = [float(v) for v in np.quantile(cmd, [tail, 1 - tail])]
    out["n_boot"] = int(ok.sum())
    return out


def mib_curve(model, task: Task, graph: E.EdgeGraph, scores: torch.Tensor,
              fractions=MIB_FRACTIONS, *, seed: int = 0) -> tuple[pd.DataFrame, float, float, dict]:
    """(table (fraction, k, metric, faithfulness), CPR, CMD, their bootstrap over examples (mib_bootstrap,
    seeded with `seed`)) of the top-k circuits at MIB's fractions, normalised by the empty and the full
    circuit measured in the same pass."""
    ks = mib_k_values(graph.n_edges, fractions)
    sizes = sorted({0, graph.n_edges, *ks})  # each circuit once, so f is exactly 0 and 1 at the ends
    keep, _ = keep_masks(graph, scores, sizes, seed=0, draws=0)
    per_example = circuit_metrics(model, task, graph, keep).double()  # [sizes, n]
    row = {k: i for i, k in enumerate(sizes)}
    by_k = dict(zip(sizes, per_example.mean(1).tolist()))
    empty, full = by_k[0], by_k[graph.n_edges]
    if full == empty:
        raise ConfigError("the empty and the full circuit give the same metric; MIB's faithfulness is undefined.")
    metric = torch.tensor([by_k[k] for k in ks], dtype=torch.float64)
    faith = (metric - empty) / (full - empty)
    frame = pd.DataFrame({"fraction": list(fractions), "k": list(ks), "metric": metric.numpy(),
                          "faithfulness": faith.numpy()})
    cpr, cmd = mib_areas(fractions, frame.faithfulness)
    rows = [row[0], row[graph.n_edges], *(row[k] for k in ks)]
    boot = mib_bootstrap(per_example[rows].numpy(), fractions, seed=seed)
    return frame, cpr, cmd, boot


def smallest_k(frame: pd.DataFrame, target: float = 0.8) -> int | None:
    """The smallest swept k whose top-k circuit reaches `target` faithfulness (None if none)."""
    top = frame[(frame.circuit == "top") & (frame.faithfulness >= target)]
    return None if top.empty else int(top.k.min())


def circuit_discovery(model, task: Task, *, ig_steps: int, k_values, seed: int = 0, n_listed: int = 200,
                      target: float = 0.8, method: str | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """Edge scores (edges.edge_scores: `method`, or by ig_steps when None) and the faithfulness
    sweep on `task`: ({"edges": top n_listed edges, "faithfulness": the sweep, "mib"}, summary keys); only
    the edges where the clean-corrupted gap is within noise (gap_noise)."""
    graph, scores, info = E.edge_scores(model, task, ig_steps=ig_steps, method=method)
    noise = gap_noise(info["metric_clean_rows"], info["metric_corrupt_rows"], task.wrong_answers is not None)
    top = E.top_edges(graph, scores, n_listed)
    summary = {
        "edge_method": info["method"], "ig_steps": info["ig_steps"],
        "edge_method_detail": E.method_label(info["method"], info["ig_steps"]),
        "n_edges": graph.n_edges,
        "edges_parallel_blocks": graph.parallel,  # each MLP reads its block's input: no same-layer head -> MLP edge
        "edge_metric": METRIC_NAMES[task.wrong_answers is not None],  # what m is: faithfulness's numerator
        "edge_metric_clean": info["metric_clean"], "edge_metric_corrupt": info["metric_corrupt"],
        "top_edges": [f"{s} -> {r}: {v:+.4g}" for s, r, v in zip(top.sender[:10], top.receiver[:10], top.score[:10])],
    }
    if noise is not None:  # every ratio below divides by noise (an exact 0 gap included, as in bfloat16): patching's
        # rule, one for both dtypes; neither computed, stored nor drawn (review 15a C4: CPR 1.009 over 1.4e-5 logits)
        summary["gap_within_noise"] = noise
        return {"edges": top}, summary
    ks = tuple(k_values) if k_values else default_k_values(graph.n_edges)
    sweep = faithfulness_sweep(model, task, graph, scores, ks, seed=seed, metric_clean=info["metric_clean"],
                               metric_corrupt=info["metric_corrupt"])
    mib, cpr, cmd, boot = mib_curve(model, task, graph, scores, seed=seed)
    at_k = sweep[sweep.circuit == "top"].set_index("k").faithfulness
    rand = sweep[sweep.circuit == "random"].groupby("k").faithfulness.mean()
    summary.update({
        "smallest_k_80": smallest_k(sweep, target),
        "faithfulness_at_k": {str(k): float(v) for k, v in at_k.items()},
        "random_faithfulness_at_k": {str(k): float(v) for k, v in rand.items()},
        "mib_cpr": cpr, "mib_cmd": cmd, "mib_cpr_ci": boot["cpr_ci"], "mib_cmd_ci": boot["cmd_ci"],
        "mib_n_examples": boot["n_examples"], "mib_n_boot": boot["n_boot"], "mib_ci_level": boot["level"],
        "mib_ci_method": MIB_CI_METHOD,
        "mib_faithfulness": {f"{p:g}": float(v) for p, v in zip(mib.fraction, mib.faithfulness)},
        "mib_convention": "MIB (Mueller et al. 2025) evaluate_area_under_curve: top int(p * edges) by |score|, "
                          "trapezoid over linear p in 0.001..1; no pruning of disconnected edges; m(full), m(empty) "
                          "from the same ablation pass",
    })
    return {"edges": top, "faithfulness": sweep, "mib": mib}, summary
