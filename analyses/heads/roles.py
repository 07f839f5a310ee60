"""Head roles from attention patterns: positional, sink, previous-token, induction, confidence.

Scores per head, averaged over every row's real query positions (padding excluded; decoders skip
each row's first real token, which can only attend to itself). Positions are each row's own: in a
left-padded batch the "first token" and query 0 are the row's first real token, so a padded row
scores as it would alone.
- positional: the share of queries whose most-attended key sits at the head's most common
  relative offset (Voita et al.: a positional head does so >= 90% of the time), and that offset
  (offset 0, the query's own token, is labelled "self", not "positional");
- sink: attention to the first token;
- previous_token: attention from position q to q - 1;
- induction: on repeated random tokens x x (length n each), mean attention from position i of
  the second copy to i - n + 1, the token after the earlier occurrence (Olsson et al.);
- confidence: mean maximum attention weight (Voita et al.).
"""
from __future__ import annotations

import pandas as pd
import torch

from headscope.analyses.core.default_tasks import repeated_random_tokens
from headscope.hooks import capture, site
from headscope.models.hooked_model import first_real_positions

POSITIONAL_SHARE = 0.9
ROLE_THRESHOLDS = {"induction": 0.3, "previous_token": 0.5, "sink": 0.5}  # score above which a label is given


def attention_patterns(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """hook_pattern of every layer: [layer, batch, head, q, k] (on CPU)."""
    names = [site("pattern", l) for l in range(model.facts.n_layers)]
    acts = capture(model, tokens, names, to_cpu=True, attention_mask=attention_mask)
    return torch.stack([acts[name] for name in names]).float()


def _query_weights(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """[batch, q] 1.0 for queries that count: real tokens, except each row's first for decoders."""
    w = torch.ones(tokens.shape, dtype=torch.float32) if attention_mask is None else attention_mask.float().cpu()
    if not model.facts.is_encoder:
        w[torch.arange(w.shape[0]), first_real_positions(attention_mask, tokens.shape[0])] = 0.0
    return w


def pattern_scores(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> pd.DataFrame:
    """Per head: positional, positional_offset, sink, previous_token, confidence."""
    pat = attention_patterns(model, tokens, attention_mask)  # [L, b, H, q, k]
    w = _query_weights(model, tokens, attention_mask)  # [b, q]
    n_q = pat.shape[-2]
    wq = w[None, :, None, :]  # [1, b, 1, q]
    total = w.sum().clamp_min(1.0)
    pat.masked_fill_(wq[..., None] == 0, 0.0)  # uncounted queries' rows dropped (a NaN there must not leak: NaN * 0)

    def mean_over_queries(x: torch.Tensor) -> torch.Tensor:  # [L, b, H, q] -> [L, H]
        return (x * wq).sum((1, 3)) / total

    q_idx = torch.arange(n_q)
    first = first_real_positions(attention_mask, tokens.shape[0])  # [b] the key each row's "first token" is
    at_first = first.view(1, -1, 1, 1, 1).expand(*pat.shape[:-1], 1)  # [L, b, H, q, 1]
    sink = mean_over_queries(pat.gather(-1, at_first)[..., 0])
    prev = torch.zeros_like(pat[..., 0])  # [L, b, H, q]
    prev[..., 1:] = pat[..., q_idx[1:], q_idx[1:] - 1]
    previous = mean_over_queries(prev)  # [L, H]
    confidence = mean_over_queries(pat.max(-1).values)
    offset = pat.argmax(-1) - q_idx  # [L, b, H, q] relative offset of the most-attended key
    n_off = 2 * n_q - 1
    onehot = torch.nn.functional.one_hot(offset + n_q - 1, n_off).float()  # [L, b, H, q, offsets]
    counts = (onehot * w[None, :, None, :, None]).sum((1, 3))  # [L, H, offsets]
    share, best = counts.max(-1)
    rows = []
    for l in range(pat.shape[0]):
        for h in range(pat.shape[2]):
            rows.append({
                "layer": l, "head": h, "positional": float(share[l, h] / total),
                "positional_offset": int(best[l, h]) - (n_q - 1), "sink": float(sink[l, h]),
                "previous_token": float(previous[l, h]), "confidence": float(confidence[l, h]),
            })
    return pd.DataFrame(rows)


def induction_scores(model, *, length: int | None = None, n: int = 8, seed: int = 0) -> torch.Tensor:
    """[L, H] mean attention from each second-copy position i to i - length + 1."""
    length = length or max(2, min(24, (model.facts.n_ctx - 1) // 2))
    tokens = repeated_random_tokens(model, length, n, seed)
    start = tokens.shape[1] - 2 * length  # 1 with a prefix token
    pat = attention_patterns(model, tokens)  # [L, b, H, q, k]
    q = torch.arange(start + length, start + 2 * length)  # second copy
    return pat[..., q, q - length + 1].mean((1, 3))  # [L, H]


def label(row: pd.Series) -> str:
    """One role name per head: induction, previous-token, self (positional at offset 0: each query's
    most-attended key is itself), positional (another fixed offset), sink, or other (first that applies)."""
    if row["induction"] >= ROLE_THRESHOLDS["induction"]:
        return "induction"
    if row["previous_token"] >= ROLE_THRESHOLDS["previous_token"]:
        return "previous-token"
    if row["positional"] >= POSITIONAL_SHARE:
        return "self" if int(row["positional_offset"]) == 0 else "positional"
    if row["sink"] >= ROLE_THRESHOLDS["sink"]:
        return "sink"
    return "other"


def head_roles(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
               induction_length: int | None = None, n_induction: int = 8, seed: int = 0) -> pd.DataFrame:
    """Role scores of every head on `tokens` (plus induction on repeated random tokens) and a label.

    Columns: layer, head, positional, positional_offset, sink, previous_token, confidence,
    induction, role.
    """
    df = pattern_scores(model, tokens, attention_mask)
    ind = induction_scores(model, length=induction_length, n=n_induction, seed=seed)
    df["induction"] = [float(ind[l, h]) for l, h in zip(df["layer"], df["head"])]
    df["role"] = df.apply(label, axis=1)
    return df
