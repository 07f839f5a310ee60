"""Attention sinks (Xiao et al. 2023, StreamingLLM): mass on the first tokens, and sink+window masks.

Sink mass of a layer: the mean over batch, heads and query positions q of
sum_{k < n_sink} A[q, k]. Under uniform causal attention it would be n_sink / (q + 1) (all keys
visible to an encoder: n_sink / n_keys); the ratio of the two says how much attention parks on
the first tokens. On an ALiBi model the baseline is what its position bias alone gives the sinks
(equal scores; uniform_baseline's slopes). Query positions q < n_sink are left out by default (there every key is a sink
and the mass is 1 by construction).

The StreamingLLM mask keeps, for query q, the keys k < n_sink and q - window < k <= q
(`keep_sinks=False`: the window alone). It is applied at `hook_attn_scores` by setting the
scores of dropped keys to the dtype's minimum, so the softmax renormalises over the kept keys:
exactly attention restricted to that key set (equivalent to zeroing the dropped weights of
hook_pattern and dividing each row by its new sum).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from headscope.analyses.core.chance import t_half_width
from headscope.errors import ConfigError
from headscope.hooks.edits import require_edits
from headscope.hooks.patterns import keep_scores
from headscope.hooks.sites import site
from headscope.models.alibi import first_key_share
from headscope.models.hooked_model import visible_keys


def query_rows(n_q: int, n_sink: int, *, causal: bool = True, q_start: int | None = None) -> torch.Tensor:
    """The query positions averaged over: q_start.. (default n_sink for causal, 0 for encoders)."""
    start = (n_sink if causal else 0) if q_start is None else q_start
    if not 0 <= start < n_q:
        raise ConfigError(f"no query positions to average: q_start={start} for {n_q} positions; lower n_sink.")
    return torch.arange(start, n_q)


def sink_rows(n_q: int, n_sink: int, window: int | None, *, causal: bool = True) -> torch.Tensor:
    """The query rows a layer's sink mass averages: query_rows, and on a sliding-window layer (`window`,
    models.layer_windows) only those whose window still holds the first token (kv's sink_stats; verify 11b N7:
    averaging every query mixed in the rows that cannot see it), all of them where none does."""
    from headscope.models.hooked_model import visible_keys

    rows = query_rows(n_q, n_sink, causal=causal)
    if not causal or window is None:
        return rows
    seen = visible_keys(rows, 0, window)
    return rows[seen] if bool(seen.any()) else rows


def sink_mass(
    pattern: torch.Tensor, n_sink: int, *, causal: bool = True, q_start: int | None = None
) -> torch.Tensor:
    """[batch, head, q, k] attention weights -> [batch, head]: mean over q of the mass on keys < n_sink."""
    if n_sink < 1:
        raise ConfigError(f"n_sink must be >= 1, got {n_sink}.")
    rows = query_rows(pattern.shape[-2], n_sink, causal=causal, q_start=q_start).to(pattern.device)
    mass = pattern[..., :n_sink].sum(-1)  # [batch, head, q]
    return mass.index_select(-1, rows).mean(-1)  # [batch, head]


def sink_mass_sum(pattern: torch.Tensor, queries: torch.Tensor, n_sink: int, rows: torch.Tensor) -> torch.Tensor:
    """sink_mass's numerator on a chunk of query rows: [batch, head, c, k] weights of the query
    positions `queries` [c] -> [batch, head], the sum over those among `rows` (the positions averaged:
    sink_rows) of the mass on keys < n_sink (divide the sum over every chunk by len(rows))."""
    keep = torch.isin(queries, rows.to(queries.device)).to(pattern.device)  # [c]
    return pattern[..., :n_sink].sum(-1)[:, :, keep].sum(-1)


def uniform_baseline(
    n_q: int, n_sink: int, *, causal: bool = True, q_start: int | None = None, n_keys: int | None = None,
    window: int | None = None, rows: torch.Tensor | None = None, slopes: torch.Tensor | None = None,
) -> float:
    """The sink mass uniform attention would give over the same query rows: the mean over them of the
    share of the keys query q sees that are sinks, n_sink / (q + 1). A sliding-window layer (`window`,
    models.layer_windows) sees only keys q - window < k <= q: the sinks still inside its window over
    the min(q + 1, window) keys it sees (0 once the sinks left the window). rows: the query positions
    averaged over, when not query_rows' (e.g. only those whose window holds the first token). slopes: an
    ALiBi model's [head] slopes (models.alibi_slopes; review 16c B1): the share ALiBi's bias alone gives the
    sinks with equal scores, each head's (models.alibi.first_key_share), averaged over heads as the mass is."""
    rows = (query_rows(n_q, n_sink, causal=causal, q_start=q_start) if rows is None else rows).double()
    if slopes is not None and causal:
        return float(first_key_share(slopes, rows, n_sink, window).mean())
    if not causal:
        return float(min(n_sink / float(n_keys or n_q), 1.0))
    return float(row_shares(rows, n_sink, window).mean())


def row_shares(rows: torch.Tensor, n_sink: int, window: int | None = None) -> torch.Tensor:
    """Each causal query row's uniform share of the sinks [rows] (float64): the sinks it sees over the
    min(q + 1, window) keys it sees (uniform_baseline's terms)."""
    rows = rows.double()
    visible, sinks_seen = rows + 1, torch.full_like(rows, float(n_sink))
    if window is not None:
        visible = visible.clamp(max=window)
        sinks_seen = (n_sink - (rows - window + 1).clamp(min=0)).clamp(min=0)  # keys k < n_sink with k > q - window
    return (sinks_seen / visible).clamp(max=1.0)


def keys_mass_sums(pattern: torch.Tensor, queries: torch.Tensor, rows: torch.Tensor, n_sink: int,
                   window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """For a model with learned sinks (review 19b B1: a per-head sink logit takes part of each row, so a row's
    weights over the keys sum to less than 1): on a chunk of query rows, [batch, head, c, k] weights of the query
    positions `queries` [c] -> ([batch, head] the sum over those among `rows` of each row's mass over the keys,
    [batch, head] the same sum of that mass x the row's uniform share, row_shares: the uniform baseline over the
    mass that reaches the keys). Divide each by len(rows), as sink_mass_sum."""
    keep = torch.isin(queries, rows.to(queries.device)).to(pattern.device)  # [c]
    reach = pattern.sum(-1)[:, :, keep].double()  # [batch, head, c']
    shares = row_shares(queries[keep.to(queries.device)].cpu(), n_sink, window).to(reach.device)  # [c']
    return reach.sum(-1), (reach * shares).sum(-1)


def streaming_keep(n_q: int, n_k: int, n_sink: int, window: int, *, keep_sinks: bool = True) -> torch.Tensor:
    """[q, k] bool: the keys query q keeps under a sink + recent-window (or window-only) cache.

    Queries are the last n_q of n_k positions (n_q == n_k for a full forward pass).
    """
    if window < 1:
        raise ConfigError(f"window must be >= 1 (the query itself), got {window}.")
    q = torch.arange(n_k - n_q, n_k)[:, None]  # [q, 1] absolute positions
    k = torch.arange(n_k)[None, :]  # [1, k]
    keep = visible_keys(q, k, window)  # [q, k]: the window's rule, as a sliding-window layer's
    if keep_sinks:
        keep |= (k < n_sink) & visible_keys(q, k, None)
    return keep


@contextmanager
def streaming_attention(model: Any, *, n_sink: int, window: int, keep_sinks: bool = True) -> Iterator[None]:
    """Every layer attends only to its sinks + recent window (or the window alone) inside the block. Refused in
    one line (UnsupportedModelError) where TransformerLens discards score edits (hooks/edits.py)."""
    require_edits(model, "streaming attention (a mask on hook_attn_scores)")

    def hook(scores: torch.Tensor, hook: Any) -> torch.Tensor:  # [batch, head, q, k]: its own q and k (cached decoding too)
        return keep_scores(scores, streaming_keep(scores.shape[-2], scores.shape[-1], n_sink, window, keep_sinks=keep_sinks))

    fwd = [(site("scores", layer), hook) for layer in range(model.facts.n_layers)]
    with model.hooks(fwd=fwd):
        yield


SINK_RATIO = 1.5  # a layer is a sink when its mass is at least this many times the uniform share ...


def distinct_inputs(tokens: list[torch.Tensor], rows: list[torch.Tensor]) -> tuple[list[int], int]:
    """(each example's group, the number of groups): examples whose measured query rows read the same tokens. tokens:
    each example's [n_pos, pos] prompts; rows: the query positions its mass averages (sink_rows). A query reads only
    the tokens up to itself, so two examples whose prompts agree up to their last measured row give the same mass: copies
    of one input, not independent samples (review 17c B1: on a window of 12 only queries 4-11 see the first token, and
    every default json_kv prompt opens with the same instruction)."""
    keys: dict[bytes, int] = {}
    groups = []
    for t, r in zip(tokens, rows):
        upto = int(r.max()) + 1 if len(r) else 0
        key = f"{t.shape[0]},{upto}:".encode() + t[:, :upto].contiguous().cpu().numpy().tobytes()
        groups.append(keys.setdefault(key, len(keys)))
    return groups, len(keys)


def layer_sinks(mass: torch.Tensor, uniform: torch.Tensor, flat: torch.Tensor | None = None,
                groups: torch.Tensor | None = None, read: list[int] | None = None,
                keys: torch.Tensor | None = None) -> list[dict[str, Any]]:
    """Per layer, the sink mass over examples against the uniform share, with the one sink criterion
    the kv and position findings share. mass [examples, layer]: each example's mean (over heads and
    query rows) mass on the sinks; uniform [examples] (every layer alike) or [examples, layer] (each
    layer's own mask, e.g. sliding windows): uniform_baseline of each example's length.

    Returns per layer {"layer", "mass", "baseline" (means), "ci" (95% t interval of the mean mass), "excess_ci"
    (of the paired mean mass - uniform), "ratio" (mass / uniform), "n", "sink"}: sink = ratio >=
    SINK_RATIO and the excess's interval above 0 (n >= 2; with one example, the ratio alone). flat: where
    `uniform` is ALiBi's baseline, the uniform share itself, shaped as uniform, recorded as "uniform_share" for the words
    (records before review 16cv B2 named the baseline "uniform" and the uniform share "flat": record_shares reads both).
    groups: [examples, layer] ints, examples that are copies of one input on that layer (distinct_inputs): the
    intervals are over the distinct inputs' means, "n_distinct" records how many, and with one there is no interval
    (the ratio alone decides, as with one example); read: each layer's tokens the measured queries read, recorded.
    keys: [examples, layer], on a model with learned sinks, each example's mean mass over the keys (a row's sum; the
    rest is the learned sink's): recorded as "keys_mass" with its interval "keys_ci" (review 19b B1); `uniform` is
    then the uniform share of that mass (keys_mass_sums) and `flat` the plain uniform share."""
    mass, uniform = mass.double(), uniform.double()
    if uniform.dim() == 1:
        uniform = uniform[:, None].expand_as(mass)  # [examples, layer]
    if flat is not None and flat.dim() == 1:
        flat = flat[:, None].expand_as(mass)
    n = mass.shape[0]

    def interval(x: torch.Tensor) -> list[float] | None:  # x [examples or distinct inputs]; torch's sd and mean
        if len(x) < 2:
            return None
        half = t_half_width(float(x.std()), len(x))
        return [float(x.mean()) - half, float(x.mean()) + half]

    def group_means(x: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:  # [examples] -> [distinct inputs]
        if g is None:
            return x
        return torch.stack([x[g == k].mean() for k in torch.unique(g)])

    out = []
    for layer in range(mass.shape[1]):
        g = None if groups is None else torch.as_tensor(groups)[:, layer]
        m, u = float(mass[:, layer].mean()), float(uniform[:, layer].mean())
        dm, du = group_means(mass[:, layer], g), group_means(uniform[:, layer], g)
        k = len(dm)
        excess = interval(dm - du) if k > 1 else None
        ratio = m / u if u > 0 else float("inf")
        out.append({"layer": layer, "mass": m, "baseline": u, "ci": interval(dm) if k > 1 else None, "excess_ci": excess,
                    "ratio": ratio, "n": n, "sink": bool(ratio >= SINK_RATIO and (excess is None or excess[0] > 0)),
                    **({} if g is None else {"n_distinct": k}), **({} if read is None else {"read_tokens": read[layer]}),
                    **({} if flat is None else {"uniform_share": float(flat[:, layer].double().mean())}),
                    **({} if keys is None else {"keys_mass": float(keys[:, layer].double().mean()),
                                                "keys_ci": interval(group_means(keys[:, layer].double(), g))})})
    return out


def record_shares(r: Mapping[str, Any]) -> tuple[Any, Any]:
    """(baseline, uniform share or None) of one sinks record, new names or old ("uniform", "flat")."""
    return r.get("baseline", r.get("uniform")), r.get("uniform_share", r.get("flat"))
