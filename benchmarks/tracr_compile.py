"""Compile the shipped Tracr programs (models/tracr_checkpoints/<name>/) with their ground truth.

Needs Tracr (`pip install 'headscope[tracr]'`, which brings JAX and dm-haiku); the shipped files
load without it. Every program is compiled causal (headscope reads next-token logits of decoders)
with BOS "BOS", and is read at the last position, where a causal model sees the whole input:

- reverse: reverse(x)[-1] = x[0] (lib.make_reverse: length by selector width, opp_idx by two MLPs,
  then an attention whose query is the MLPs' output: attention -> MLP -> attention).
- hist: the number of times the last token occurs (lib.make_hist: one selector-width head and MLP).
- sort: input x (n distinct values), a copy of x, then a query token r: the r-th smallest of x
  (the make_sort_unique mechanism: each copy position counts the first copy's smaller values by
  selector width, and the query position attends to the copy position whose rank is r; the copy
  makes the ranks computable causally).
- induction: the token that followed the earlier occurrence of the last token (shift_by(1)
  attention writes the previous token; the second attention matches it in its key: K-composition
  across two attention layers, as an induction head).

Usage: python benchmarks/tracr_compile.py [--out models/tracr_checkpoints] [--site TRACR_SITE_PACKAGES]
(--site appends a site-packages directory holding tracr, e.g. a separate venv's.)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

SORT_N, SORT_VALUES, SORT_QUERY = 3, (1, 2, 3, 4), 10  # query tokens 10, 11, 12 ask for rank 0, 1, 2


def programs():
    """name -> (program, vocab, max_seq_len, meta)."""
    from tracr.compiler import lib
    from tracr.rasp import rasp

    out = {}
    out["reverse"] = (lib.make_reverse(rasp.tokens).named("reverse"), {1, 2, 3}, 5,
                      {"reads": "last", "semantics": "x[0] (the last output of reverse(x))", "input": "free"})
    out["hist"] = (lib.make_hist().named("hist"), {1, 2, 3}, 5,
                   {"reads": "last", "semantics": "count of x[-1] in x", "input": "free"})
    n = SORT_N
    key_first = rasp.SequenceMap(lambda t, i: t if i < n else 99, rasp.tokens, rasp.indices).named("first_copy")
    rank = rasp.SelectorWidth(rasp.Select(key_first, rasp.tokens, rasp.Comparison.LT)).named("rank")
    rank_key = rasp.SequenceMap(lambda r, i: r if n <= i < 2 * n else -1, rank, rasp.indices).named("copy_rank")
    target = rasp.Map(lambda t: t - SORT_QUERY if t >= SORT_QUERY else -2, rasp.tokens).named("query_rank")
    sort = rasp.categorical(rasp.Aggregate(rasp.Select(rank_key, target, rasp.Comparison.EQ), rasp.tokens)).named("sort")
    out["sort"] = (sort, set(SORT_VALUES) | {SORT_QUERY + r for r in range(n)}, 2 * n + 1,
                   {"reads": "last", "semantics": "sorted(x)[r] for input x (distinct), x again, query token 10 + r",
                    "input": "sort", "n": n, "values": list(SORT_VALUES), "query_offset": SORT_QUERY})
    prev = lib.shift_by(1, rasp.tokens).named("prev")
    induction = rasp.categorical(rasp.Aggregate(rasp.Select(prev, rasp.tokens, rasp.Comparison.EQ),
                                                rasp.tokens)).named("induction")
    out["induction"] = (induction, {1, 2, 3, 4}, 5,
                        {"reads": "last", "input": "free",
                         "semantics": "x[j] where x[j - 1] == x[-1] for exactly one j >= 1"})
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "models" / "tracr_checkpoints"))
    parser.add_argument("--site", default=None, help="a site-packages directory holding tracr (appended to sys.path)")
    args = parser.parse_args(argv)
    if args.site:
        sys.path.append(args.site)
    from headscope.models import tracr

    for name, (program, vocab, max_len, meta) in programs().items():
        folder, assembled = tracr.compile_program(program, vocab, max_len, Path(args.out) / name, {"name": name, **meta})
        truth = tracr.metadata(folder)["truth"]
        cfg = assembled.model_config
        print(f"{name}: {cfg.num_layers} layers x {cfg.num_heads} heads, d_model {len(assembled.residual_labels)}; "
              f"circuit {truth['nodes']} with {len(truth['edges'])} edges -> {folder}")


if __name__ == "__main__":
    main()
