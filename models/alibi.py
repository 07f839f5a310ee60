"""ALiBi (Press et al. 2022): each head adds slope_h x (k - q) to its scores, no position table.

`alibi_slopes` reads each head's slope from the model's own Hugging Face code (BLOOM's and Falcon's
`build_alibi_tensor`, MPT's `build_mpt_alibi_tensor`) on a two-token probe, so a family's own formula
(MPT's alibi_bias_max, the interleaving for head counts that are not powers of two) needs no copy here.
"""
from __future__ import annotations

import math
import sys
from typing import Any

import torch


def press_slopes(n_heads: int) -> torch.Tensor:
    """[n_heads] Press et al.'s geometric slopes: 2^(-8i/n) for the closest power of two n <= n_heads,
    then every other slope of 2n for the heads left (BLOOM's and Falcon's rule)."""
    closest = 2 ** math.floor(math.log2(n_heads))
    base = [2.0 ** (-8.0 * (i + 1) / closest) for i in range(closest)]
    extra = [2.0 ** (-4.0 * (2 * i + 1) / closest) for i in range(n_heads - closest)]
    return torch.tensor(base + extra, dtype=torch.float64)


def alibi_slopes(model: Any) -> torch.Tensor | None:
    """[n_heads] float64: each head's ALiBi slope (scores get -slope x distance), None where the model's
    positions are not ALiBi. From the model's own module's alibi builder where it has one, else press_slopes."""
    if getattr(model.facts, "positional", None) != "alibi":
        return None
    n_heads = int(model.facts.n_heads)
    hf = getattr(getattr(model, "bridge", None), "original_model", None)
    module = sys.modules.get(type(hf).__module__) if hf is not None else None
    try:
        if hasattr(module, "build_alibi_tensor"):  # BLOOM, Falcon: [heads, 1, keys] = slope x key position
            bias = module.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n_heads, torch.float32)
            return bias.reshape(n_heads, -1)[:, 1].double()
        if hasattr(module, "build_mpt_alibi_tensor"):  # MPT: [heads, 1, keys] = slope x (k - (keys - 1))
            bias = module.build_mpt_alibi_tensor(n_heads, 2, getattr(hf.config.attn_config, "alibi_bias_max", 8))
            return (bias.reshape(n_heads, -1)[:, 1] - bias.reshape(n_heads, -1)[:, 0]).double()
    except Exception:  # noqa: BLE001 - a builder of another signature: the paper's rule
        pass
    return press_slopes(n_heads)


def first_key_share(slopes: torch.Tensor, rows: torch.Tensor, n_sink: int, window: int | None = None) -> torch.Tensor:
    """[heads, rows] float64: the share of attention the first n_sink keys get from query q (`rows`, positions
    from the first real token) when every score is equal and only ALiBi's bias -slope x (q - k) differs: a
    softmax over the keys q sees (a sliding window: q - window < k <= q), in closed form (geometric sums
    sum_{d=a}^{b} r^d = (r^a - r^(b+1)) / (1 - r), r = exp(-slope); n keys each where slope = 0)."""
    q = rows.double()[None, :]  # [1, rows]
    m = slopes.double()[:, None]  # [heads, 1]
    seen = q + 1 if window is None else (q + 1).clamp(max=window)  # keys visible: distances 0 .. seen - 1
    d_lo = (q - n_sink + 1).clamp(min=0)  # the sinks' distances d_lo .. d_hi (k = q - d < n_sink)
    d_hi = torch.minimum(q, seen - 1)  # a window drops sinks at distance >= window
    n_sinks = (d_hi - d_lo + 1).clamp(min=0)

    def geometric(a: torch.Tensor, n: torch.Tensor) -> torch.Tensor:  # sum_{d=a}^{a+n-1} exp(-m d), [heads, rows]
        flat = m.abs() < 1e-12
        ratio = torch.where(flat, torch.ones_like(m), -torch.expm1(-n * m) / -torch.expm1(-m).where(~flat, torch.ones_like(m)))
        return torch.where(flat, n.expand_as(ratio), torch.exp(-m * a) * ratio)

    return geometric(d_lo, n_sinks) / geometric(torch.zeros_like(q), seen)
