"""The KV cache: its size, its contents and what evicting from it costs (the `kv` analysis).

- Anatomy: bytes = batch x positions x layers x (K and V) x kv_heads x d_head x bytes per number
  (REFERENCES.md: 5,000 positions x 50 layers x 20 maps (K and V of 10 heads) x 1,000 dims x
  2 bytes = 10 GB), and the saving of grouped-query attention against full multi-head attention
  (the ratio of query heads to KV heads).
- States: K and V norms per layer, KV head and position (what the cache stores, read with
  `hooks.kv_states`), and attention sinks: the attention mass on the first positions against
  the uniform baseline, and how the first keys' norms compare with the rest. Where the model normalises
  its keys before caching them (a k_norm: Qwen3, Gemma 3 per head, OLMo 2 over all KV heads;
  models.key_norm), every cached key's norm is fixed by the norm's weight, so that comparison cannot
  see a sink: the summary says so (`keys_normalised`, `key_norm`) and the finding does not report it.
- Eviction what-if (kv_eviction.py): the Task's metric when the answer query sees only part of
  the cache, per policy and budget.

Padded tasks (mixed lengths): positions count from each prompt's first real token and padding is
never a cached entry. Norms and sink statistics run the prompts unpadded, one batch per length
(`hooks.kv_states` reads a cache filled without a mask), and average over the prompts that have
each position; the eviction sweep runs the padded batch with its mask (kv_eviction.py).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

import headscope.hooks as hooks
from headscope.analyses.core.chance import mean_interval
from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.contract import Needs
from headscope.analyses.core.metrics import noise_floor
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task
from headscope.analyses.kv import eviction as kv_eviction
from headscope.analyses.kv.holding import holding_budgets
from headscope.analyses.position import sinks
from headscope.errors import ConfigError
from headscope.models.alibi import alibi_slopes
from headscope.models.hooked_model import cache_windows, layer_windows
from headscope.models.key_norm import key_norms


def cache_bytes(*, positions: int, n_layers: int, n_kv_heads: int, d_head: int, bytes_per_number: int,
                batch: int = 1) -> int:
    """Bytes of a KV cache: batch x positions x layers x 2 (K and V) x kv_heads x d_head x bytes."""
    for name, v in dict(positions=positions, n_layers=n_layers, n_kv_heads=n_kv_heads, d_head=d_head,
                        bytes_per_number=bytes_per_number, batch=batch).items():
        if not isinstance(v, int) or v < 0:
            raise ConfigError(f"{name} must be a non-negative int, got {v!r}.")
    return batch * positions * n_layers * 2 * n_kv_heads * d_head * bytes_per_number


@dataclass(frozen=True, kw_only=True)
class CacheAnatomy:
    """The KV cache layout of a model; `total(positions, batch)` gives its size in bytes."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    dtype: str
    bytes_per_number: int
    windows: tuple[int | None, ...] = ()  # per layer its sliding window (models.layer_windows); () or None: global
    latent: tuple[int, int] | None = None  # MLA (review 15d A2): (kv_lora_rank, qk_rope_head_dim) cached per layer
    mha_width: int | None = None  # MLA: numbers per layer and token of a per-head cache, n_heads x (d_qk + d_v)

    def cached_positions(self, positions: int) -> list[int]:
        """Per layer, the positions its cache holds at this context: all of them for a global layer; for a
        sliding-window layer min(window - 1, positions), as Hugging Face's DynamicSlidingWindowLayer keeps
        between steps (the next token's own key and value make the window's `window` keys)."""
        windows = self.windows or (None,) * self.n_layers
        return [positions if w is None else min(w - 1, positions) for w in windows]

    @property
    def sliding_layers(self) -> dict[int, int]:
        """{layer: window} of the sliding-window layers."""
        return {i: w for i, w in enumerate(self.windows) if w is not None}

    @property
    def bytes_per_token_per_layer(self) -> int:
        """Per layer and token: 2 x kv_heads x d_head numbers, or on MLA its one latent (kv_nope + k_rot) for all heads."""
        if self.latent is not None:
            return sum(self.latent) * self.bytes_per_number
        return cache_bytes(positions=1, n_layers=1, n_kv_heads=self.n_kv_heads, d_head=self.d_head,
                           bytes_per_number=self.bytes_per_number)

    @property
    def bytes_per_token(self) -> int:
        """Bytes each new token adds while the context fits every window (beyond a window, that layer adds none)."""
        return self.n_layers * self.bytes_per_token_per_layer

    @property
    def mha_bytes_per_token(self) -> int:
        """The same model with one KV head per query head (full multi-head attention); on MLA the per-head
        K and V its latent expands to (mha_width numbers a layer)."""
        if self.latent is not None:
            return self.n_layers * (self.mha_width or 0) * self.bytes_per_number
        return self.bytes_per_token * self.n_heads // self.n_kv_heads

    @property
    def gqa_saving(self) -> float:
        """Fraction of the MHA cache saved: 1 - n_kv_heads / n_heads (sharing KV heads), or on MLA
        1 - latent / per-head K and V."""
        if self.latent is not None:
            return 1.0 - self.bytes_per_token / self.mha_bytes_per_token
        return 1.0 - self.n_kv_heads / self.n_heads

    def total(self, positions: int, batch: int = 1) -> int:
        """Bytes of the cache at `positions` of context, each layer holding its cached_positions."""
        return sum(batch * p * self.bytes_per_token_per_layer for p in self.cached_positions(positions))

    def mha_total(self, positions: int, batch: int = 1) -> int:
        """total() for the MHA equivalent (mha_bytes_per_token)."""
        return self.total(positions, batch) * self.mha_bytes_per_token // self.bytes_per_token


def _metric_floor(model, metric: str, sweep) -> float:
    """One rounding step of the metric in the model's dtype, at its largest full-cache value (metrics.noise_floor;
    0 for accuracy, which is not rounded): a holding interval past the band by no more is rounding (holding.py)."""
    if metric == "accuracy":
        return 0.0
    size = float(sweep[sweep.policy == "full"].metric.abs().max())
    return float(noise_floor(model.dtype, size)) if math.isfinite(size) else 0.0


def cache_anatomy(model, dtype: torch.dtype | None = None) -> CacheAnatomy:
    """The model's cache layout; dtype defaults to the model's parameter dtype (what the cache holds)."""
    f = model.facts
    dtype = dtype or model.dtype
    return CacheAnatomy(n_layers=f.n_layers, n_heads=f.n_heads, n_kv_heads=f.n_kv_heads, d_head=f.d_head,
                        dtype=str(dtype).removeprefix("torch."),
                        bytes_per_number=torch.empty((), dtype=dtype).element_size(), windows=cache_windows(model),
                        **latent_layout(model.bridge.original_model.config))


def latent_layout(config) -> dict[str, Any]:
    """Multi-head latent attention (DeepSeek-V2/V3, review 15d A2): Hugging Face's cache holds per layer and
    token the normalised latent kv_nope (kv_lora_rank) and the roped shared key k_rot (qk_rope_head_dim), one
    for all heads, not per-head K and V; {} for any other model. mha_width: the per-head K and V it expands to,
    n_heads x (qk_nope + qk_rope + v_head_dim)."""
    rank, rope = getattr(config, "kv_lora_rank", None), getattr(config, "qk_rope_head_dim", None)
    if not isinstance(rank, int) or not isinstance(rope, int):
        return {}
    d_qk = getattr(config, "qk_head_dim", None) or rope + int(getattr(config, "qk_nope_head_dim", 0))
    d_v = int(getattr(config, "v_head_dim", d_qk))
    return {"latent": (rank, rope), "mha_width": int(config.num_attention_heads) * (int(d_qk) + d_v)}


def anatomy_table(anatomy: CacheAnatomy, contexts: Sequence[int] = (1024, 8192, 32768),
                  batches: Sequence[int] = (1, 8), n_ctx: int | None = None) -> pd.DataFrame:
    """Cache size at several context lengths and batch sizes, with the MHA equivalent and the share of
    it grouped-query attention saves (gqa_saving, as in the summary: 0.5 = half). n_ctx (the model's
    context): lengths past it are left out and n_ctx itself is a row (review 13a C5: a cache of 32,768
    positions for a model of 128 is one it cannot have)."""
    if n_ctx is not None:
        contexts = sorted({int(n) for n in contexts if n <= n_ctx} | {int(n_ctx)})
    rows = [{"positions": n, "batch": b, "bytes": anatomy.total(n, b),
             "mha_bytes": anatomy.mha_total(n, b), "gqa_saving": anatomy.gqa_saving}
            for n in contexts for b in batches]
    return pd.DataFrame(rows)


def length_groups(tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The prompts without their padding, one [rows, length] batch per real length (longest first;
    the whole batch when unpadded)."""
    if attention_mask is None:
        return [tokens]
    real = attention_mask.cpu().bool()  # [batch, pos]
    lengths = real.sum(1)
    return [torch.stack([tokens[i][real[i]] for i in (lengths == n).nonzero()[:, 0].tolist()])
            for n in sorted(set(lengths.tolist()), reverse=True)]


@torch.no_grad()
def kv_norms(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> pd.DataFrame:
    """Mean L2 norm (over the prompts that have the position cached) of each cached key and value:
    layer, kv_head, position (0 = the first real token), kind, norm, n_prompts (how many prompts
    reach the position: far positions average only the longest prompts), norm_min / norm_max (the least and
    largest of those prompts' norms). Padding is never a cached entry;
    a sliding-window layer caches only its last window of positions, so earlier positions have no row."""
    return _kv_norms(model, tokens, attention_mask)[0]


@torch.no_grad()
def _kv_norms(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
              n_sink: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """kv_norms' table and, from the same pass, each prompt's first-key norm ratio per layer (layer, prompt, ratio:
    its first n_sink keys' mean norm over its other keys', means over KV heads; NaN where the layer's cache no longer
    holds the first key, a sliding window past it, or holds no other key)."""
    sums: dict[tuple[str, int], torch.Tensor] = {}
    counts: dict[tuple[str, int], torch.Tensor] = {}
    lows: dict[tuple[str, int], torch.Tensor] = {}  # [kv_head, pos] the least and largest norm over the prompts
    highs: dict[tuple[str, int], torch.Tensor] = {}
    ratios: list[dict[str, Any]] = []
    prompt = 0
    for group in length_groups(tokens, attention_mask):
        states = hooks.kv_states(model, group)
        n_pos = group.shape[1]
        for layer, k in enumerate(states.keys):  # k [prompts, kv_head, cached, d_head]
            each = k.float().norm(dim=-1).cpu()  # [prompts, kv_head, cached]
            whole = each.shape[2] == n_pos and n_pos > n_sink  # the first key still cached, and another one
            ratio = (each[:, :, :n_sink].mean((1, 2)) / each[:, :, n_sink:].mean((1, 2)) if whole
                     else torch.full((group.shape[0],), float("nan")))  # [prompts]
            ratios += [{"layer": layer, "prompt": prompt + i, "ratio": float(r)} for i, r in enumerate(ratio.tolist())]
        prompt += group.shape[0]
        for kind, per_layer in (("key", states.keys), ("value", states.values)):
            for layer, t in enumerate(per_layer):
                each = t.float().norm(dim=-1).cpu()  # [prompts, kv_head, cached]: the last `cached` positions
                norm = each.sum(0)  # [kv_head, cached]
                first = n_pos - norm.shape[1]
                key = (kind, layer)
                acc, cnt, lo, hi = sums.get(key), counts.get(key), lows.get(key), highs.get(key)
                if acc is None or acc.shape[1] < n_pos:
                    grown, grown_cnt = torch.zeros(norm.shape[0], n_pos), torch.zeros(n_pos)
                    grown_lo, grown_hi = (torch.full((norm.shape[0], n_pos), v) for v in (math.inf, -math.inf))
                    if acc is not None:
                        grown[:, :acc.shape[1]], grown_cnt[:cnt.shape[0]] = acc, cnt
                        grown_lo[:, :lo.shape[1]], grown_hi[:, :hi.shape[1]] = lo, hi
                    acc, cnt, lo, hi = grown, grown_cnt, grown_lo, grown_hi
                acc[:, first:n_pos] += norm
                cnt[first:n_pos] += group.shape[0]
                lo[:, first:n_pos] = torch.minimum(lo[:, first:n_pos], each.amin(0))
                hi[:, first:n_pos] = torch.maximum(hi[:, first:n_pos], each.amax(0))
                sums[key], counts[key], lows[key], highs[key] = acc, cnt, lo, hi
    frames = []
    for (kind, layer), acc in sums.items():
        cached = counts[(kind, layer)] > 0  # [pos]
        norm = acc[:, cached] / counts[(kind, layer)][cached]  # [kv_head, cached positions]
        positions = cached.nonzero().reshape(-1)
        h, p = torch.meshgrid(torch.arange(norm.shape[0]), positions, indexing="ij")
        n_prompts = counts[(kind, layer)][positions][None, :].expand_as(norm)  # [kv_head, cached positions]
        frames.append(pd.DataFrame({"layer": layer, "kv_head": h.reshape(-1).numpy(), "position": p.reshape(-1).numpy(),
                                    "kind": kind, "norm": norm.reshape(-1).numpy(),
                                    "n_prompts": n_prompts.reshape(-1).numpy().astype(int),
                                    # review 18v B1: the prompts' own least and largest norm beside their mean
                                    "norm_min": lows[(kind, layer)][:, cached].reshape(-1).numpy(),
                                    "norm_max": highs[(kind, layer)][:, cached].reshape(-1).numpy()}))
    return pd.concat(frames, ignore_index=True), pd.DataFrame(ratios, columns=["layer", "prompt", "ratio"])


def key_norm_ratios(per_prompt: pd.DataFrame) -> list[dict[str, Any]]:
    """The summary's `key_norm_ratios`: per layer the mean over prompts of each prompt's first-key norm ratio
    (_kv_norms), its 95% t interval over those prompts (chance.mean_interval; None under two) and their count n;
    a layer where no prompt's cache holds the first key has ratio None and n 0."""
    out = []
    for layer, rows in per_prompt.groupby("layer", sort=True):
        x = rows.ratio.to_numpy(dtype=float)  # [prompts]
        x = x[np.isfinite(x)]
        out.append({"layer": int(layer), "ratio": float(x.mean()) if len(x) else None, "ci": mean_interval(x),
                    "n": int(len(x))})
    return out


@torch.no_grad()
def sink_stats(model, tokens: torch.Tensor, norms: pd.DataFrame, n_sink: int = 1,
               attention_mask: torch.Tensor | None = None) -> pd.DataFrame:
    """Per layer: attention mass on the first n_sink keys against its baseline (analyses.sinks, Xiao et al.):
    `baseline_mass`, the share uniform attention gives them, or on ALiBi what its bias alone gives (`baseline`
    "uniform" or "alibi"; on ALiBi `uniform_share` beside it), both means over the prompts (each over its own real
    tokens), with 95% t intervals over
    the prompts of the mass and of its excess over uniform and the shared sink verdict (sinks.layer_sinks),
    and the first keys' mean norm over the other keys' (from `norms`). The patterns are reduced a chunk of queries at
    a time (hooks.reduce_patterns): no layer's whole pattern is held where the hook-free blocks run."""
    n_layers = model.facts.n_layers
    windows = layer_windows(model)  # a sliding-window layer averages only the queries its window lets see key 0
    slopes = alibi_slopes(model)  # ALiBi: the baseline is what its bias alone gives the first key (review 16c B1)
    masses, uniforms, flats = [], [], []  # per length group: [prompts, layer] sink mass, [prompts, layer] uniform share
    learned = bool(getattr(model.facts, "learned_sinks", False))  # review 19b B1: rows over the keys sum to < 1
    reached: list[torch.Tensor] = []  # per length group: [prompts, layer] mean mass over the keys (learned sinks)
    for group in length_groups(tokens, attention_mask):
        rows = sinks.query_rows(group.shape[1], n_sink)  # the query rows sinks.sink_mass averages
        # per layer, the rows averaged: on a sliding-window layer those that see the first token (review 11b C7,
        # as heads' roles, the explorer and position average the sink); [layer] of [rows'] positions
        seen = [sinks.sink_rows(group.shape[1], n_sink, w) for w in windows]
        mass = torch.zeros(group.shape[0], n_layers, dtype=torch.float64)  # [prompts, layer]
        keys, weighted = torch.zeros_like(mass), torch.zeros_like(mass)  # learned sinks: mass over the keys, x share

        def reduce(layer: int, queries: torch.Tensor, pattern: torch.Tensor, mass: torch.Tensor = mass,
                   seen: list = seen, keys: torch.Tensor = keys, weighted: torch.Tensor = weighted) -> None:
            # pattern [prompts, head, c, keys] -> each prompt's mean over the layer's rows and heads of the mass
            # on the sinks (sinks.sink_mass)
            per = len(seen[layer]) * pattern.shape[1]
            got = sinks.sink_mass_sum(pattern, queries, n_sink, seen[layer])  # [prompts, head]
            mass[:, layer] += got.double().sum(1).cpu() / per
            if learned:
                reach, share = sinks.keys_mass_sums(pattern, queries, seen[layer], n_sink, windows[layer])
                keys[:, layer] += reach.sum(1).cpu() / per
                weighted[:, layer] += share.sum(1).cpu() / per

        hooks.reduce_patterns(model, group, reduce, query_positions=rows, logits_from=group.shape[1] - 1)
        masses.append(mass)
        share = [sinks.uniform_baseline(group.shape[1], n_sink, window=w, rows=seen[layer], slopes=slopes)
                 for layer, w in enumerate(windows)]  # [layer]
        plain = torch.tensor(share, dtype=torch.float64)[None, :].expand(group.shape[0], n_layers)
        if learned:  # the uniform share of the mass that reaches the keys; the plain one beside it, for the words
            uniforms.append(weighted)
            flats.append(plain)
            reached.append(keys)
            continue
        uniforms.append(plain)
        if slopes is not None:  # the uniform share beside ALiBi's, for the words
            flat = [sinks.uniform_baseline(group.shape[1], n_sink, window=w, rows=seen[layer])
                    for layer, w in enumerate(windows)]
            flats.append(torch.tensor(flat, dtype=torch.float64)[None, :].expand(group.shape[0], n_layers))
    per_layer = sinks.layer_sinks(torch.cat(masses), torch.cat(uniforms),  # over the prompts, with intervals
                                  torch.cat(flats) if flats else None, keys=torch.cat(reached) if learned else None)
    keys = norms[norms.kind == "key"]
    rows, kind = [], "keys" if learned else "uniform" if slopes is None else "alibi"
    for layer, entry in zip(range(n_layers), per_layer):
        k = keys[keys.layer == layer]
        first, rest = k[k.position < n_sink].norm.mean(), k[k.position >= n_sink].norm.mean()
        ci, excess = entry["ci"] or [float("nan")] * 2, entry["excess_ci"] or [float("nan")] * 2
        rows.append({"layer": layer, "sink_mass": entry["mass"], "baseline_mass": entry["baseline"], "baseline": kind,
                     "ci_low": ci[0], "ci_high": ci[1], "excess_ci_low": excess[0], "excess_ci_high": excess[1],
                     "ratio": entry["ratio"], "n_prompts": entry["n"], "sink": entry["sink"],
                     "sink_key_norm_ratio": first / rest,
                     **({"uniform_share": entry["uniform_share"]} if "uniform_share" in entry else {}),
                     **({"keys_mass": entry["keys_mass"], "keys_ci_low": (entry["keys_ci"] or [float("nan")] * 2)[0],
                         "keys_ci_high": (entry["keys_ci"] or [float("nan")] * 2)[1]} if "keys_mass" in entry else {})})
    return pd.DataFrame(rows)


def sink_shares(table: pd.DataFrame) -> tuple[pd.Series, str, pd.Series | None]:
    """(baseline mass per layer, "uniform" or "alibi", the uniform share per layer or None) of a sinks table, its
    columns named as now (baseline_mass, baseline, uniform_share) or as before mend 1 (uniform_mass held the
    baseline, ALiBi's where flat_mass, the uniform share, was present), so an older run's table still reads."""
    if "baseline_mass" in table:
        kind = str(table["baseline"].iloc[0]) if "baseline" in table and len(table) else "uniform"
        return table["baseline_mass"], kind, table["uniform_share"] if "uniform_share" in table else None
    old = "flat_mass" in table
    return table["uniform_mass"], "alibi" if old else "uniform", table["flat_mass"] if old else None


def key_norm_record(model, norms: pd.DataFrame) -> dict[str, Any] | None:
    """The summary's `key_norm`: how the model normalises its keys before caching (models.key_norm) with
    the range of cached key norms that allows over its normalised layers (`bounds`, per KV head where the
    norm runs per head, else over all KV heads together; `bias`: the largest bias norm, which widens them)
    and, per head, the range the norms table measured (`measured`: its per-position means over the prompts;
    `keys`: the cached keys' own least and largest norm, review 18v B1); None where no layer normalises its keys."""
    found = {layer: k for layer, k in enumerate(key_norms(model)) if k is not None}
    if not found:
        return None
    first = next(iter(found.values()))
    record: dict[str, Any] = {
        "module": first.module, "kind": first.kind, "rms": first.rms, "per_head": first.per_head, "dim": first.dim,
        "layers": sorted(found), "gain": [min(k.gain[0] for k in found.values()), max(k.gain[1] for k in found.values())],
        "bounds": [min(k.bounds[0] for k in found.values()), max(k.bounds[1] for k in found.values())],
        "bias": max(k.bias for k in found.values())}
    clip = getattr(model.facts, "clip_qkv", None)
    if clip is not None:  # review 18c A5: every cached key entry clamped to +-clip after the norm: a head's key norm
        record["clip_qkv"] = clip  # is at most clip x sqrt(d_head), the whole key's clip x sqrt(dim)
        record["head_bound"] = clip * model.facts.d_head ** 0.5
    keys = norms[(norms.kind == "key") & norms.layer.isin(sorted(found))]
    if first.per_head and len(keys):
        record["measured"] = [float(keys.norm.min()), float(keys.norm.max())]
        if {"norm_min", "norm_max"} <= set(keys):
            record["keys"] = [float(keys.norm_min.min()), float(keys.norm_max.max())]
    return record


def key_clamp_record(model, norms: pd.DataFrame) -> dict[str, Any] | None:
    """The summary's `key_clamp` (review 19a A1/B1: MPT's attn_config.clip_qkv, OLMo 1's clip_qkv): every cached key
    entry clamped to +-clip with no key norm before it (key_norm_record names the clamp where there is one), so one
    head's key norm is at most clip x sqrt(d_head) (`head_bound`), with the largest cached key norm the norms table
    measured (`largest`: one prompt's, norm_max, where recorded); None without a clamp."""
    clip = getattr(model.facts, "clip_qkv", None)
    if clip is None:
        return None
    keys = norms[norms.kind == "key"] if "kind" in norms else norms.iloc[:0]
    column = "norm_max" if "norm_max" in keys else "norm"
    return {"clip_qkv": float(clip), "head_bound": float(clip) * model.facts.d_head ** 0.5,
            "largest": float(keys[column].max()) if len(keys) else None}


def _context_sizes(model, anatomy: CacheAnatomy, longest: int) -> dict[str, Any]:
    """The cache at full context (bytes_at_n_ctx; sliding-window layers hold only their window where Hugging
    Face's cache keeps only it, models.cache_windows), were every layer global, and (bytes_at_n_ctx_windowed,
    GPT-Neo) were each local layer's cache cut to its window, with n_ctx; on a model with no fixed context (ALiBi,
    review 16c A2) those are None and no_fixed_context names its positions, with the cache at the longest prompt
    run (`longest` tokens)."""
    limit = model.facts.context_limit
    if limit is None:
        return {"bytes_at_n_ctx": None, "bytes_at_n_ctx_all_global": None, "n_ctx": None,
                "no_fixed_context": model.facts.positional, "bytes_at_longest_prompt": anatomy.total(longest)}
    sizes = {"bytes_at_n_ctx": anatomy.total(limit),
             "bytes_at_n_ctx_all_global": anatomy.n_layers * anatomy.bytes_per_token_per_layer * limit, "n_ctx": limit}
    windows = layer_windows(model)
    if windows != anatomy.windows and any(windows):  # GPT-Neo (review 17d C3): its cache keeps what its windows hide
        sizes["bytes_at_n_ctx_windowed"] = replace(anatomy, windows=windows).total(limit)
    return sizes


def _sink_records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The sinks table as the summary's per-layer records (sinks.layer_sinks' keys; NaN intervals as None)."""
    def pair(lo: float, hi: float) -> list[float] | None:
        return None if pd.isna(lo) or pd.isna(hi) else [float(lo), float(hi)]

    return [{"layer": int(r.layer), "mass": float(r.sink_mass), "baseline": float(r.baseline_mass),
             "ci": pair(r.ci_low, r.ci_high), "excess_ci": pair(r.excess_ci_low, r.excess_ci_high),
             "ratio": float(r.ratio), "n": int(r.n_prompts), "sink": bool(r.sink),
             **({"uniform_share": float(r.uniform_share)} if "uniform_share" in table else {}),
             **({"keys_mass": float(r.keys_mass), "keys_ci": pair(r.keys_ci_low, r.keys_ci_high)}
                if "keys_mass" in table else {})}
            for r in table.itertuples()]


# What the analysis needs from a task and a model (analyses/core/contract.py), checked before it runs.
# Review 16dv B1: where TransformerLens discards score edits only the eviction sweep is skipped (eviction_skipped).
NEEDS = Needs(answers=True, decoder=True, what="evicts entries of a decoder's KV cache")


@dataclass(frozen=True, kw_only=True)
class KVConfig(AnalysisConfig):
    n_sink: int = 4  # StreamingLLM keeps 4 sink tokens
    budgets: tuple[int, ...] | None = None  # None: powers of two below the context, and the full context
    policies: tuple[str, ...] = kv_eviction.POLICIES
    recent_share: float = kv_eviction.RECENT_SHARE  # heavy hitters' recent window, a share of the budget (H2O: half)
    contexts: tuple[int, ...] = (1024, 8192, 32768)  # for the anatomy table, up to the model's context

    def __post_init__(self) -> None:
        super().__post_init__()
        share = self.recent_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise ConfigError(f"recent_share must be a share between 0 and 1 (heavy hitters' recent window, H2O: 0.5), "
                              f"got {share!r}.")


def _added_bos_first(model, task: Task) -> str | None:
    """The BOS headscope put in front of every row where the tokenizer adds none (model.added_bos), else None:
    the sink's "first token" is then a token the user's prompts do not have. None on zoo models, whose data
    starts with <bos> as they were trained (their tasks write it; it is no token headscope adds)."""
    from headscope.analyses.position.analysis import has_zoo_vocab

    added = model.added_bos() if hasattr(model, "added_bos") else None
    if added is None or has_zoo_vocab(model.tokenizer):
        return None
    first = task.first_positions()  # [batch]
    ids = task.tokens[torch.arange(len(task)), first.to(task.tokens.device)]  # [batch]
    return added if bool((ids == model.tokenizer.bos_token_id).all()) else None


def default_task(model, task=None, config: KVConfig | None = None) -> Task:
    """The Task kv_analysis runs on: `task` resolved (a Task, zoo task name or the user's data), else
    the zoo "kv" task, else (other models) the shipped sentences cut to one length."""
    from headscope.analyses.core import default_tasks
    from headscope.analyses.core.task_files import resolve_task

    config = config or KVConfig()
    n = config.examples(128, 16)
    if task is None:
        task = default_tasks.zoo_or(model, "kv", lambda: default_tasks.text_task(model, n, config.seed), n, config.seed)
    return resolve_task(model, task, default="kv", n_examples=n, seed=config.seed)


@takes_prompt
@names_source
def kv_analysis(model, task: Task | str | None = None, config: KVConfig | None = None, **config_overrides: Any) -> Result:
    """Anatomy, states and the eviction what-if on one Task (see the module doc). task: a Task, a
    zoo task name or task file (None: the zoo "kv" retrieval task; other models: the shipped
    sentences cut to one length, default_tasks.text_task). config_overrides are fields of KVConfig (budgets=(4, 8)).

    df (results.csv): the metric per policy, budget and example. tables: "anatomy", "norms",
    "sinks". summary: bytes per token (per layer and total), GQA saving, metric per policy and budget,
    whether the keys are normalised before caching (keys_normalised, key_norm_record). Where TransformerLens
    discards attention-score edits (OPT: hooks/edits.py) the eviction sweep alone is skipped: df has no rows and
    summary["eviction_skipped"] says why in one line (review 16dv B1).
    """
    config = configure(KVConfig, config, config_overrides, name="kv_analysis")
    if model.facts.is_encoder:
        raise ConfigError(f"the kv analysis needs a decoder with a KV cache; {model.facts.name} is an encoder.")
    skipped = kv_eviction.eviction_skipped(model)  # before any work (review 16d A1; 16dv B1: the rest still runs)
    task = default_task(model, task, config)
    anatomy = cache_anatomy(model)
    norms, per_prompt = _kv_norms(model, task.tokens, task.attention_mask)
    key_norm = key_norm_record(model, norms)
    sink_table = sink_stats(model, task.tokens, norms, n_sink=1, attention_mask=task.attention_mask)
    lengths = (task.attention_mask.sum(1) if task.attention_mask is not None
               else torch.full((len(task),), task.tokens.shape[1]))  # [batch] each prompt's real tokens
    summary = {
        "bytes_per_token": anatomy.bytes_per_token,
        "bytes_per_token_per_layer": anatomy.bytes_per_token_per_layer,
        "mha_bytes_per_token": anatomy.mha_bytes_per_token,
        "gqa_saving": anatomy.gqa_saving,  # the share of the MHA cache saved (0.5: half), as anatomy.csv's
        "n_heads": anatomy.n_heads, "n_kv_heads": anatomy.n_kv_heads,
        "latent": list(anatomy.latent) if anatomy.latent else None,  # MLA: [kv_lora_rank, qk_rope] cached per layer
        "dtype": anatomy.dtype,
        **_context_sizes(model, anatomy, int(lengths.max())),
        # {layer: window} the attention sees; on GPT-Neo the cache still keeps every position (cache_keeps_all)
        "sliding_windows": {str(k): v for k, v in enumerate(layer_windows(model)) if v is not None},
        **({"cache_keeps_all": True} if layer_windows(model) != anatomy.windows and any(layer_windows(model)) else {}),
        "metric": task.metric, "n_examples": len(task),
        # the longest prompt's real tokens (position's too): a sliding window binds, and the finding names it, only below
        "prompt_tokens": int(lengths.max()),
        "n_sink": config.n_sink,
        "recent_share": config.recent_share,  # heavy hitters keep ceil(share x budget) most recent positions (H2O)
        "context_range": [int(lengths.min()) - 1, int(lengths.max()) - 1],
    }
    if skipped:
        sweep = pd.DataFrame(columns=["policy", "budget", "example", "context", "cached", "kept", "metric", "correct"])
        summary["eviction_skipped"] = skipped
    else:
        sweep = kv_eviction.eviction_sweep(model, task, budgets=config.budgets, policies=config.policies,
                                           n_sink=config.n_sink, recent_share=config.recent_share,
                                           progress=config.progress)
        summary.update(_eviction_summary(model, task, config, sweep))
    summary.update(_state_summary(model, task, sink_table, per_prompt, key_norm))
    if key_norm is None and (clamp := key_clamp_record(model, norms)) is not None:
        summary["key_clamp"] = clamp  # review 19a B1: the ratio compares clamped keys; the finding says so
    return Result(name="kv", df=sweep, summary=summary,
                  tables={"anatomy": anatomy_table(anatomy, config.contexts, n_ctx=model.facts.context_limit), "norms": norms,
                          "sinks": sink_table},
                  config={**asdict(config), "anatomy": asdict(anatomy)})


def _eviction_summary(model, task: Task, config: KVConfig, sweep: pd.DataFrame) -> dict[str, Any]:
    """The summary's eviction what-if keys, from the sweep (eviction.eviction_sweep)."""
    means = sweep.groupby(["policy", "budget"]).metric.mean()
    full = sweep[sweep.policy == "full"].metric.to_numpy(dtype=float)  # [example] the full cache's metric
    # a log-probability's uniform guess, -log V per one-token answer (eviction_sweep reads one token): its band's far end
    chance = -math.log(model.facts.d_vocab) if task.metric == "logprob" else None
    accs = sweep.groupby(["policy", "budget"]).correct.mean()
    return {
        "metric_unevicted": float(full.mean()),
        # its 95% t interval over the examples (review 14b C4: compare compares it; None for one example)
        "metric_unevicted_ci": mean_interval(full),
        "context_positions": int(sweep[sweep.policy == "full"].budget.max()),  # the whole prompt: no saving there
        "metric_per_policy_budget": {p: {str(b): float(v) for (pp, b), v in means.items() if pp == p}
                                     for p in config.policies},
        "accuracy_per_policy_budget": {p: {str(b): float(v) for (pp, b), v in accs.items() if pp == p}
                                       for p in config.policies},
        "holding_budgets": holding_budgets(sweep, n_sink=config.n_sink,
                                           answers=None if task.answers is None else task.answers.tolist(),
                                           floor=_metric_floor(model, task.metric, sweep), chance=chance),
        # per policy and grid budget what it keeps of a longer prompt (eviction.kept_split), and the prompts' context
        # lengths [fewest, most] (context_range): the finding says what each policy keeps and evicts in this run's numbers
        "kept_split": {p: {str(b): kv_eviction.kept_split(p, int(b), n_sink=config.n_sink,
                                                          recent_share=config.recent_share)
                           for b in sorted(sweep[sweep.policy == p].budget.unique())} for p in config.policies},
        # review 16c B2: a position bias on the scores (ALiBi): the eviction runs keep each kept key's distance in
        # the full prompt (keys hidden from the last query), where a deployed cache may re-count the kept keys
        **({"position_bias": "alibi"} if model.facts.positional == "alibi" else {}),
    }


def _state_summary(model, task: Task, sink_table: pd.DataFrame, per_prompt: pd.DataFrame,
                   key_norm: dict[str, Any] | None) -> dict[str, Any]:
    """The summary's keys on what the cache holds: sinks, first-key norm ratios, key normalisation."""
    return {
        "sink_mass_per_layer": {str(r.layer): r.sink_mass for r in sink_table.itertuples()},
        "sinks": _sink_records(sink_table),
        # what "baseline" records hold; "keys": the uniform share of the mass that reaches the keys (learned sinks)
        "sink_baseline": ("keys" if getattr(model.facts, "learned_sinks", False) else
                          "alibi" if alibi_slopes(model) is not None else "uniform"),
        # review 19c B2: the layers without rotary (NoPE), which the sink sentence names
        **({"nope_layers": list(model.facts.nope_layers)} if model.facts.nope_layers else {}),
        # NaN (null) where the layer's cache no longer holds the first key (a sliding window past it)
        "sink_key_norm_ratio_per_layer": {str(r.layer): float(r.sink_key_norm_ratio) for r in sink_table.itertuples()},
        # each prompt's ratio, per layer its mean over the prompts with a 95% t interval and n (what the finding states)
        "key_norm_ratios": key_norm_ratios(per_prompt),
        # keys normalised before caching (a k_norm in every layer): their norms are fixed, the ratio above shows no sink
        "keys_normalised": key_norm is not None and len(key_norm["layers"]) == model.facts.n_layers,
        "key_norm": key_norm,
        "task": task.name,
        # review 10b A1: the first key is a BOS headscope put in front (the tokenizer adds none), on every row
        "first_token_added_bos": _added_bos_first(model, task),
    }


def run(model, task: Task | str | None = None, config: KVConfig | None = None) -> Result:
    """`headscope kv`: kv_analysis on `task` (a Task, zoo task or task file; the zoo "kv" task by default)."""
    return kv_analysis(model, task, config or KVConfig.preset())
