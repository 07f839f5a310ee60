"""Every circuit method scored against circuits known by construction: the Tracr programs.

For each shipped program (models/tracr_checkpoints; or --model DIR for any headscope Tracr
directory, e.g. one written by headscope.models.tracr.compile_program) and its task
(analyses/core/tracr_tasks.py: clean inputs, one input changed, the answers the program gives),
each method scores nodes (heads "a{l}.h{h}", MLPs "m{l}") and, where it can, edges (the edge
graph of analyses/circuits/edges.py). Against the program's ground truth (tracr.json, from
Tracr's craft blocks): AUROC (ties count one half) and precision at the true circuit's size (ties
at the cut counted at their expected share) for nodes and edges; the circuits analysis's chosen
circuit (the smallest top-k reaching 80% faithfulness) is a set, scored by precision and recall.
MIB's CPR and CMD of each EAP convention's circuits are printed too.

Methods (absolute values rank): head importance by zero and mean ablation and by the gate
gradient (Michel et al.); the attention-pattern heuristic "attention away from BOS" (1 - the
head's sink score; Tracr heads park on BOS when they select nothing); exact activation patching
(denoising; heads' outputs, MLPs' outputs at their strongest position); path patching of each head
into the logits; DLA; EAP with the gradient on the clean run, on the corrupted run, and EAP-IG
(nodes: the sum of a sender's |edge scores|); exact edge patching (each edge alone fed its
corrupted value, the metric's drop).

Usage: python benchmarks/ground_truth.py [--n-examples 32] [--model DIR ...]
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata

import headscope as hs
from headscope.analyses.circuits import edges as E
from headscope.analyses.circuits import faithfulness as F
from headscope.analyses.core.tracr_tasks import tracr_task
from headscope.analyses.heads import roles
from headscope.analyses.patching.path_patching import path_patching
from headscope.models import tracr

EAP = {"EAP (clean-run gradient)": "eap-clean", "EAP (corrupted-run gradient)": "eap-denoising", "EAP-IG (5 steps)": "eap-ig"}


# ---- scoring -------------------------------------------------------------------------------
def auroc(scores, labels) -> float:
    """Area under the ROC curve of scores for binary labels (Mann-Whitney U, ties = 1/2); NaN
    without both classes."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(s)  # average ranks over ties
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def precision_at_k(scores, labels, k: int | None = None) -> float:
    """Precision of the k highest scores (k = the number of positives), the items tied at the cut
    counted at their expected share (any order among them equally likely)."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    k = int(y.sum()) if k is None else k
    if k == 0:
        return float("nan")
    cut = np.sort(s)[::-1][k - 1]
    above, tied = s > cut, s == cut
    need = k - int(above.sum())
    return float((y[above].sum() + need * y[tied].mean()) / k)


def score_set(scores: dict, truth: set, rtol: float = 1e-6) -> tuple[float, float]:
    """(AUROC, precision at |truth|) of {item: |score|} against the true items. Magnitudes below
    rtol x the largest are float32 rounding (a saturated gradient is 1e-9, not a ranking): they
    tie at 0."""
    items = list(scores)
    labels = [i in truth for i in items]
    values = np.abs(np.array([scores[i] for i in items], dtype=float))
    values[values < rtol * (values.max() if len(values) else 0.0)] = 0.0
    return auroc(values, labels), precision_at_k(values, labels)


# ---- methods -------------------------------------------------------------------------------
def head_name(layer: int, head: int) -> str:
    return f"a{int(layer)}.h{int(head)}"


def node_methods(model, task) -> dict[str, dict[str, float]]:
    """method -> {node: score} for the methods that score heads (and MLPs)."""
    out: dict[str, dict[str, float]] = {}
    imp = hs.head_importance(model, task, methods=("zero", "mean", "gradient")).df
    for method, label in (("zero", "zero ablation"), ("mean", "mean ablation"), ("gradient", "gradient (Michel)")):
        rows = imp[imp.method == method]
        out[label] = {head_name(r.layer, r.head): float(r.importance) for r in rows.itertuples()}
    pat = roles.pattern_scores(model, task.tokens)
    out["attention away from BOS"] = {head_name(r.layer, r.head): 1.0 - float(r.sink) for r in pat.itertuples()}
    patch = hs.activation_patching(model, task, sites=("head_out", "mlp_out")).df
    heads = patch[patch.site_type == "head_out"]
    mlps = patch[patch.site_type == "mlp_out"].assign(a=lambda d: d.effect.abs()).groupby("layer").a.max()
    out["activation patching (exact)"] = {**{head_name(r.layer, r.head): float(r.effect) for r in heads.itertuples()},
                                         **{f"m{int(l)}": float(v) for l, v in mlps.items()}}
    pp = path_patching(model, task).df
    out["path patching to logits"] = {head_name(r.sender_layer, r.sender_head): float(r.effect) for r in pp.itertuples()}
    dla = hs.direct_logit_attribution(model, task).df
    out["DLA"] = {(head_name(r.layer, r.head) if r.kind == "head" else f"m{int(r.layer)}"): float(r.contribution)
                  for r in dla[dla.kind.isin(["head", "mlp"])].itertuples()}
    return out


def exact_edge_effects(model, task, graph: E.EdgeGraph) -> torch.Tensor:
    """[R, S]: the mean metric drop when one edge alone carries its corrupted value (noising)."""
    r_idx, s_idx = graph.reach.nonzero(as_tuple=True)
    keep = graph.reach[None].repeat(len(r_idx), 1, 1)
    keep[torch.arange(len(r_idx)), r_idx, s_idx] = False
    full = F.circuit_metrics(model, task, graph, graph.reach[None]).mean()
    drop = full - F.circuit_metrics(model, task, graph, keep).mean(1)
    out = torch.zeros(graph.reach.shape, dtype=torch.float64)
    out[r_idx, s_idx] = drop.double()
    return out


def edge_dict(graph: E.EdgeGraph, scores: torch.Tensor) -> dict[tuple[str, str], float]:
    r_idx, s_idx = graph.reach.nonzero(as_tuple=True)
    return {(graph.senders[s], graph.receivers[r]): float(scores[r, s]) for r, s in zip(r_idx.tolist(), s_idx.tolist())}


def sender_totals(edges: dict[tuple[str, str], float]) -> dict[str, float]:
    """Node score from edges: the sum of |score| over the node's outgoing edges."""
    out: dict[str, float] = {}
    for (s, _), v in edges.items():
        if s != "input":
            out[s] = out.get(s, 0.0) + abs(v)
    return out


def evaluate(model, task, truth: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(method table: method, node/edge AUROC and precision at |truth|, what it scores;
    MIB table: EAP convention, CPR, CMD, smallest k reaching 80%)."""
    true_nodes, true_edges = set(truth["nodes"]), {tuple(e) for e in truth["edges"]}
    graph = E.build_graph(model)
    all_nodes = [head_name(l, h) for l in range(graph.n_layers) for h in range(graph.n_heads)]
    all_nodes += [f"m{l}" for l in range(graph.n_layers)]
    edge_names = set(edge_dict(graph, graph.reach.double()))
    missing = true_edges - edge_names
    if missing:
        raise ValueError(f"true edges outside the model's edge graph: {sorted(missing)}")
    rows, mib = [], []

    def add(method, nodes, edges=None, chosen=None):
        nodes = {n: v for n, v in nodes.items() if n in all_nodes}
        scored = "heads+MLPs" if any(n.startswith("m") for n in nodes) else "heads"
        universe = all_nodes if scored == "heads+MLPs" else [n for n in all_nodes if n.startswith("a")]
        full = {n: nodes.get(n, 0.0) for n in universe}
        n_auc, n_p = score_set(full, true_nodes)
        e_auc, e_p = score_set(edges, true_edges) if edges is not None else (math.nan, math.nan)
        row = {"method": method, "scores": scored + (" + edges" if edges is not None else ""), "node_auroc": n_auc,
               "node_precision": n_p, "edge_auroc": e_auc, "edge_precision": e_p}
        if chosen is not None:
            hit = len(chosen & true_edges)
            row.update(edge_precision=hit / max(len(chosen), 1), edge_recall=hit / len(true_edges), chosen=len(chosen))
        rows.append(row)

    for method, nodes in node_methods(model, task).items():
        add(method, nodes)
    for label, method in EAP.items():
        found, summary = F.circuit_discovery(model, task, ig_steps=5, method=method, k_values=None, n_listed=10**6)
        g, scores, _ = E.edge_scores(model, task, ig_steps=5, method=method)
        edges = edge_dict(g, scores)
        add(label, sender_totals(edges), edges)
        mib.append({"method": label, "cpr": summary["mib_cpr"], "cmd": summary["mib_cmd"],
                    "smallest_k_80": summary["smallest_k_80"], "n_edges": summary["n_edges"]})
        if method == "eap-ig":  # the circuits analysis's default: its chosen circuit
            k = summary["smallest_k_80"] or summary["n_edges"]
            top = found["edges"].head(k)
            chosen = set(zip(top.sender, top.receiver))
            nodes = {x.rsplit(".", 1)[0] if x.count(".") == 2 else x for e in chosen for x in e}
            add("circuits analysis: chosen circuit (EAP-IG, 80%)", {n: 1.0 for n in nodes},
                {e: float(e in chosen) for e in edges}, chosen)
    exact = edge_dict(graph, exact_edge_effects(model, task, graph))
    add("exact edge patching", sender_totals(exact), exact)
    return pd.DataFrame(rows), pd.DataFrame(mib)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-examples", type=int, default=32)
    parser.add_argument("--model", nargs="*", default=None, help="headscope Tracr directories (default: the shipped ones)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    specs = args.model or [f"tracr/{n}" for n in tracr.names()]
    tables, mibs = [], []
    for spec in specs:
        t0 = time.perf_counter()
        model = hs.load_model(spec, device="cpu")
        meta = tracr.metadata(model.source)
        task = tracr_task(model, args.n_examples, args.seed, meta=meta)
        table, mib = evaluate(model, task, meta["truth"])
        name = meta.get("name", spec)
        tables.append(table.assign(program=name))
        mibs.append(mib.assign(program=name))
        print(f"{name}: {len(task)} pairs, {len(meta['truth']['nodes'])} true nodes, {len(meta['truth']['edges'])} "
              f"true edges of {E.build_graph(model).n_edges}; {time.perf_counter() - t0:.1f} s")
    table, mib = pd.concat(tables), pd.concat(mibs)
    pd.set_option("display.width", 200)
    for col in ("node_auroc", "edge_auroc", "node_precision", "edge_precision"):
        wide = table.pivot_table(index="method", columns="program", values=col, sort=False, dropna=False)
        print(f"\n{col}\n{wide.round(2).to_string()}")
    chosen = table.dropna(subset=["chosen"]) if "chosen" in table else table.iloc[:0]
    if len(chosen):
        print("\ncircuits analysis's chosen circuit (edges):")
        print(chosen[["program", "chosen", "edge_precision", "edge_recall"]].round(2).to_string(index=False))
    print("\nMIB metrics of each EAP convention's circuits:")
    print(mib.pivot_table(index="method", columns="program", values=["cpr", "cmd"], sort=False).round(3).to_string())


if __name__ == "__main__":
    main()
