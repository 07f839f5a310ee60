"""Benchmark of batched edge attribution and circuit faithfulness against TransformerLens 4.3's
attribution_patch(granularity="edge") and faithfulness, in one process.

On the zoo IOI task (mean logit difference answer - wrong answer), prints times, ratios and the
max abs difference of the results for:
1. EAP edge scores over --n-examples pairs: headscope's edge_scores (a few batched forward and
   backward passes over the whole task) vs TransformerLens's per-pair loop (attribution_patch on
   one pair at a time, averaged); target >= 10x;
2. faithfulness of the top-k circuits for 10 values of k: headscope's circuit_metrics (all
   circuits x examples stacked along the batch axis, forward only) vs TransformerLens's
   faithfulness per example and per circuit; target >= 10x. TransformerLens is timed on
   --tl-examples examples per circuit and its time scaled to all examples (its calls are
   independent, one pair each), as printed.
TransformerLens's edge graph refuses grouped-query attention, so both sides run on an
equivalent multi-head copy of the model (each key-value head repeated for its query heads; same
function); headscope's own run on the GQA original is timed too. TransformerLens's edges are per
position: its scores are summed over positions to compare. Each timing is the median of
--repeats runs after a warm-up.

    python benchmarks/circuits.py [--model zoo/synth-llama] [--n-examples 64] [--tl-examples 4] [--repeats 3]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from _common import timed
from transformer_lens.tools.analysis.attribution_patching import (
    EdgeAttributionConfig,
    attribution_patch,
    faithfulness,
)

import headscope as hs
from headscope.analyses.circuits import edges as E
from headscope.analyses.circuits import faithfulness as F
from headscope.analyses.core import tasks


def mha_copy(spec: str):
    """A multi-head copy of a GQA Llama-style zoo model (key/value heads repeated), or the model."""
    model = hs.load_model(spec, device="cpu")
    if model.facts.n_kv_heads in (None, model.facts.n_heads):
        return model, model
    import transformers

    from headscope.models import zoo

    path = Path(zoo.__file__).parent / "checkpoints" / spec.split("/", 1)[1] if spec.startswith("zoo/") else Path(spec)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path)
    cfg = hf.config.to_dict()
    rep = model.facts.n_heads // model.facts.n_kv_heads
    cfg["num_key_value_heads"] = model.facts.n_heads
    new = type(hf)(type(hf.config).from_dict(cfg))
    state = hf.state_dict()
    d_head = model.facts.d_head
    for key, value in state.items():
        if key.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
            state[key] = value.reshape(model.facts.n_kv_heads, d_head, *value.shape[1:]).repeat_interleave(rep, 0) \
                .reshape(model.facts.n_heads * d_head, *value.shape[1:])
    new.load_state_dict(state)
    out = Path(tempfile.mkdtemp()) / "mha"
    new.save_pretrained(out)
    model.tokenizer.save_pretrained(out)
    return model, hs.load_model(str(out), device="cpu")


def metric_fn(task, i):
    return lambda logits: logits[0, -1, task.answers[i]] - logits[0, -1, task.wrong_answers[i]]


def tl_edge_scores(model, task, graph) -> torch.Tensor:
    scores = torch.zeros(len(graph.receivers), len(graph.senders), dtype=torch.float64)
    for i in range(len(task)):
        res = attribution_patch(model.bridge, task.tokens[i:i + 1], task.corrupted_tokens[i:i + 1], metric_fn(task, i),
                                config=EdgeAttributionConfig(granularity="edge"))
        for (u, v), s in res.edge_scores.items():
            scores[graph.receivers.index(E.from_tl_node(v)), graph.senders.index(E.from_tl_node(u))] += s / len(task)
    return scores


def tl_faithfulness(model, task, graph, keep, n_examples) -> torch.Tensor:
    """[circuits, n_examples]: the ablated metric from TransformerLens's faithfulness, one call each."""
    n_pos = task.tokens.shape[1]
    out = torch.empty(keep.shape[0], n_examples)
    for c in range(keep.shape[0]):
        r_idx, s_idx = keep[c].nonzero(as_tuple=True)
        circuit = [(E.to_tl_node(graph.senders[s], p, graph.n_layers, False),
                    E.to_tl_node(graph.receivers[r], p, graph.n_layers, True))
                   for r, s in zip(r_idx.tolist(), s_idx.tolist()) for p in range(n_pos)]
        for i in range(n_examples):
            res = faithfulness(model.bridge, task.tokens[i:i + 1], task.corrupted_tokens[i:i + 1], metric_fn(task, i), circuit)
            out[c, i] = res.corrupt_metric + res.recovered * (res.full_metric - res.corrupt_metric)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="zoo/synth-llama")
    parser.add_argument("--task", default="ioi")
    parser.add_argument("--n-examples", type=int, default=64)
    parser.add_argument("--tl-examples", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    original, model = mha_copy(args.model)
    task = tasks.zoo(model, args.task, n_examples=args.n_examples)
    print(f"model {args.model} ({'multi-head copy' if model is not original else 'as shipped'}), task {args.task}, "
          f"{len(task)} pairs of {task.tokens.shape[1]} tokens, {args.threads} thread(s)")

    # 1. EAP edge scores
    t_ours, (graph, scores, _) = timed(lambda: E.edge_scores(model, task, ig_steps=1), args.repeats)
    t_tl, ref = timed(lambda: tl_edge_scores(model, task, graph), max(1, args.repeats - 2))
    print(f"EAP edge scores, {graph.n_edges} edges x {len(task)} pairs: headscope {t_ours:.3f} s, "
          f"TransformerLens per-pair loop {t_tl:.3f} s, ratio {t_tl / t_ours:.1f}x, "
          f"max |diff| {float((scores - ref).abs().max()):.2e} (scale {float(ref.abs().max()):.3g})")
    if original is not model:
        t_gqa, _ = timed(lambda: E.edge_scores(original, task, ig_steps=1), args.repeats)
        print(f"  headscope on the GQA original: {t_gqa:.3f} s")
    t_ig, _ = timed(lambda: E.edge_scores(model, task, ig_steps=5), 1)
    print(f"  headscope EAP-IG, 5 steps: {t_ig:.3f} s")

    # 2. faithfulness over 10 values of k
    ks = F.default_k_values(graph.n_edges, 10)
    keep, _ = F.keep_masks(graph, scores, ks, seed=0, draws=0)
    t_ours_f, metric = timed(lambda: F.circuit_metrics(model, task, graph, keep), args.repeats)
    n_tl = min(args.tl_examples, len(task))
    t0 = time.perf_counter()
    ref_f = tl_faithfulness(model, task, graph, keep, n_tl)
    t_tl_part = time.perf_counter() - t0
    t_tl_f = t_tl_part * len(task) / n_tl
    print(f"faithfulness, k = {list(ks)} x {len(task)} examples: headscope {t_ours_f:.3f} s, TransformerLens "
          f"{t_tl_part:.2f} s for {n_tl} examples per circuit -> {t_tl_f:.1f} s for {len(task)}, ratio "
          f"{t_tl_f / t_ours_f:.1f}x, max |diff| {float((metric[:, :n_tl] - ref_f).abs().max()):.2e} "
          f"(metric scale {float(ref_f.abs().max()):.3g})")


if __name__ == "__main__":
    main()
