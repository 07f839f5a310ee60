"""Tasks for Tracr-compiled programs (headscope.models.tracr): clean inputs, corrupted inputs, and
the answers the compiled program gives at the position read (the last one).

The answers are the model's own outputs (a compiled model computes its program exactly; the
tests check that against the programs' Python semantics), so any compiled program, shipped or
not, gets a task without code of its own. A pair is kept when both outputs are decisive (the
top logit ahead of the next by at least `margin`; an ill-defined categorical aggregate, such as
induction with two matches, averages one-hot outputs and is dropped) and differ.

Inputs ("input" in tracr.json): "free": max_seq_len tokens drawn from the program's vocabulary,
the corruption changes one of them; "sort": n distinct values, the same values again, then a
query token (query_offset + r); the corruption changes the query, or one value in both copies
(two tokens: one value, kept consistent across the copy the program needs).
"""
from __future__ import annotations

import torch

from headscope.analyses.core.tasks import Task
from headscope.errors import TaskError


def _free_pairs(meta: dict, gen: torch.Generator, n: int) -> tuple[list[list[str]], list[list[str]]]:
    vocab, length = meta["vocab"], meta["max_seq_len"]
    clean, corrupt = [], []
    for _ in range(n):
        row = [vocab[int(i)] for i in torch.randint(len(vocab), (length,), generator=gen)]
        pos = int(torch.randint(length, (1,), generator=gen))
        others = [v for v in vocab if v != row[pos]]
        bad = list(row)
        bad[pos] = others[int(torch.randint(len(others), (1,), generator=gen))]
        clean.append(row)
        corrupt.append(bad)
    return clean, corrupt


def _sort_pairs(meta: dict, gen: torch.Generator, n: int) -> tuple[list[list[str]], list[list[str]]]:
    k, values, offset = meta["n"], list(meta["values"]), meta["query_offset"]
    clean, corrupt = [], []
    for i in range(n):
        x = [values[int(j)] for j in torch.randperm(len(values), generator=gen)[:k]]
        r = int(torch.randint(k, (1,), generator=gen))
        bad_x, bad_r = list(x), r
        if i % 2:  # another rank
            bad_r = (r + 1 + int(torch.randint(k - 1, (1,), generator=gen))) % k
        else:  # one value replaced (in both copies) by an unused one
            unused = [v for v in values if v not in x]
            bad_x[int(torch.randint(k, (1,), generator=gen))] = unused[int(torch.randint(len(unused), (1,), generator=gen))]
        clean.append([str(v) for v in (*x, *x, offset + r)])
        corrupt.append([str(v) for v in (*bad_x, *bad_x, offset + bad_r)])
    return clean, corrupt


PAIRS = {"free": _free_pairs, "sort": _sort_pairs}


def tracr_task(model, n: int = 32, seed: int = 0, *, margin: float = 0.5, meta: dict | None = None) -> Task:
    """n (clean, corrupted) pairs for a Tracr model (module doc); answers = the clean output at the
    last position, wrong_answers = the corrupted one. meta: the model's tracr.json (read from
    model.source when None)."""
    from headscope.models import tracr

    meta = meta if meta is not None else tracr.metadata(model.source)
    kind = meta.get("input", "free")
    if kind not in PAIRS:
        raise TaskError(f"unknown Tracr input kind {kind!r}; known: {sorted(PAIRS)}.")
    gen = torch.Generator().manual_seed(seed)
    keep_c, keep_x, ans, wrong = [], [], [], []
    for _ in range(20):  # rounds of candidates until n decisive pairs with different answers
        clean, corrupt = PAIRS[kind](meta, gen, 4 * n)
        tok_c = model.to_tokens([" ".join(r) for r in clean])
        tok_x = model.to_tokens([" ".join(r) for r in corrupt])
        with torch.no_grad():
            top_c, top_x = model(tok_c)[:, -1].float().topk(2), model(tok_x)[:, -1].float().topk(2)
        ok = ((top_c.values[:, 0] - top_c.values[:, 1]) >= margin) & ((top_x.values[:, 0] - top_x.values[:, 1]) >= margin)
        ok &= top_c.indices[:, 0] != top_x.indices[:, 0]
        for i in ok.nonzero().flatten().tolist()[: n - len(ans)]:
            keep_c.append(tok_c[i])
            keep_x.append(tok_x[i])
            ans.append(int(top_c.indices[i, 0]))
            wrong.append(int(top_x.indices[i, 0]))
        if len(ans) == n:
            break
    if not ans:
        raise TaskError(f"no input of {meta.get('name', 'this program')} gives decisive, different outputs "
                        f"on its clean and corrupted prompts.")
    return Task(name=f"tracr-{meta.get('name', 'program')}", tokens=torch.stack(keep_c),
                corrupted_tokens=torch.stack(keep_x), answers=torch.tensor(ans), wrong_answers=torch.tensor(wrong))
