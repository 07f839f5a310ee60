"""The kv finding's cache words (reports/kv_words.py): bytes per token and at full context, the grouped-query or
latent attention saving, and the first key's norm against the other keys' (what a k_norm allows). `_span2` is the
figures' too; compare reads `reported_norm_layers`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.reports.findings import _num, attention_kind


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _gqa(s: Mapping[str, Any]) -> str:
    """The grouped-query sentence whenever the model has fewer KV heads than query heads (from the
    head counts, else from the MHA-equivalent bytes; multi-query with one KV head); gqa_saving is the share of the
    MHA cache saved."""
    per_token, mha = _num(s.get("bytes_per_token")), _num(s.get("mha_bytes_per_token"))
    heads, kv_heads = _num(s.get("n_heads")), _num(s.get("n_kv_heads"))
    latent = s.get("latent")
    if latent and per_token is not None and mha:  # review 15d A2: MLA caches one latent for all heads
        return (f"Multi-head latent attention caches one latent per layer and position for all {heads:.0f} heads "
                f"({latent[0]} + {latent[1]} roped numbers), {100 * (1 - per_token / mha):.0f}% less than the "
                f"{_bytes(mha)} per token of the per-head keys and values it expands to.")
    fewer = heads is not None and kv_heads is not None and kv_heads < heads
    if not fewer and not (per_token is not None and mha is not None and per_token < mha):
        return ""
    saving = _num(s.get("gqa_saving"))
    if saving is None and per_token is not None and mha:
        saving = 1 - per_token / mha
    kind = (attention_kind(heads, kv_heads) or "grouped-query").capitalize()  # from the bytes where no head counts
    who = ""
    if fewer:
        who = (f" (1 KV head shared by {heads:.0f} query heads)" if kv_heads == 1 else
               f" ({kv_heads:.0f} KV heads, each shared by {heads / kv_heads:g} query heads)")
    size = f": {_bytes(per_token)} against {_bytes(mha)} per token" if per_token is not None and mha is not None else ""
    share = f" saves {100 * saving:.0f}% of the cache" if saving is not None else " shrinks the cache"
    return f"{kind} attention{who}{share} against full multi-head attention{size}."


def _size_sentence(s: Mapping[str, Any], per_token: float, full_ctx: float | None) -> str:
    """Bytes per token and at full context; with sliding-window layers, which ones stop growing and the
    all-global size for comparison."""
    text = f"The KV cache takes {_bytes(per_token)} per token ({s.get('dtype', '')})"
    if s.get("no_fixed_context") and full_ctx is None:  # review 16c A2: no full context to size it at
        longest, at = _num(s.get("prompt_tokens")), _num(s.get("bytes_at_longest_prompt"))
        alibi = "ALiBi positions, " if s["no_fixed_context"] == "alibi" else ""
        return (text + (f", {_bytes(at)} at the longest prompt run ({int(longest)} tokens)" if at and longest else "")
                + f"; the model has no fixed context ({alibi}no maximum length in its config), so no full-context size.")
    windows = {k: v for k, v in (s.get("sliding_windows") or {}).items() if _num(v) is not None}
    if not windows:
        return text + (f", {_bytes(full_ctx)} at full context." if full_ctx is not None else ".")
    sizes = sorted({int(v) for v in windows.values()})
    size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    kept = str(sizes[0] - 1) if len(sizes) == 1 else f"{sizes[0] - 1}-{sizes[-1] - 1}"
    ctx = _num(s.get("n_ctx"))
    if s.get("cache_keeps_all"):  # GPT-Neo (review 17d C3): its local layers' cache keeps every position anyway
        windowed = _num(s.get("bytes_at_n_ctx_windowed"))
        return (text + f"; layer(s) {', '.join(windows)} attend over a sliding window of {size} keys, but Hugging "
                "Face's cache for this model keeps every position on every layer"
                + (f": {_bytes(full_ctx)} at full context" + (f" ({int(ctx)} positions)" if ctx else "") if full_ctx
                   is not None else "")
                + (f"; a cache that kept only each window (its last {kept} positions, as Hugging Face's sliding "
                   f"cache does) would take {_bytes(windowed)}" if windowed is not None else "") + ".")
    text += (f" while the context fits the window; layer(s) {', '.join(windows)} attend over a sliding window of "
             f"{size} keys, so their cache keeps at most {kept} past positions")
    everyone = _num(s.get("bytes_at_n_ctx_all_global"))
    if full_ctx is not None:
        text += (f": {_bytes(full_ctx)} at full context" + (f" ({int(ctx)} positions)" if ctx else "")
                 + (f", against {_bytes(everyone)} if every layer were global" if everyone is not None else ""))
    return text + "."


def _span2(lo: float, hi: float) -> str:
    return f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}"


def _normalised_sentence(key_norm: Mapping[str, Any]) -> str:
    """Why the first key's norm is not reported on a model that normalises its keys before caching them
    (the summary's key_norm, analyses/kv/analysis.key_norm_record) per head: their norms are set by the norm's weight."""
    how = "RMS-normalised" if key_norm.get("rms", True) else "normalised"
    name = key_norm.get("module", "k_norm")
    dim, gain, bounds = _num(key_norm.get("dim")), key_norm.get("gain") or [], key_norm.get("bounds") or []
    here = []
    if len(bounds) == 2:
        here.append(f"here {_span2(*bounds)}")
        if dim and len(gain) == 2:
            one_plus = "gemma" in str(key_norm.get("kind", "")).lower()  # review 11b C4: stored weights near 0
            here[-1] += f": sqrt({dim:.0f}) x its {'gain |1 + weight|' if one_plus else '|weight|'} {_span2(*gain)}"
            bias = _num(key_norm.get("bias")) or 0.0
            if bias >= 0.005:  # review 17a A1: a bias moves the output by up to its norm either way
                here[-1] += f", give or take its bias's norm (up to {bias:.2f})"
    measured, keys = key_norm.get("measured") or [], key_norm.get("keys") or []
    if len(keys) == 2:  # review 18v B1: the keys' own range against the bounds, the means' beside it, each named
        here.append(f"the cached keys {_span2(*keys)}"
                    + (f" (their means over prompts per head and position {_span2(*measured)})" if len(measured) == 2
                       else ""))
    elif len(measured) == 2:  # an older summary: only the means were recorded
        here.append(f"mean norms over prompts per head and position {_span2(*measured)}")
    eps = "; smaller only for a key near zero against the norm's epsilon" if here else ""
    where = f" ({'; '.join(here)}{eps})" if here else ""
    return (f"Keys are {how} per head ({name}) before caching, so their norms are set by the norm's weight, not by "
            f"the key's input{where}, and the first key's norm cannot mark a sink: not reported.")


def _all_heads_note(key_norm: Mapping[str, Any]) -> str:
    """Review 8 A1 (OLMo 2): a norm over all KV heads together bounds a key's norm over its heads, not one
    head's share of it, so the per-head ratio stays meaningful and is reported, with this note."""
    name, dim = key_norm.get("module", "k_norm"), _num(key_norm.get("dim"))
    return (f" Keys are normalised over all KV heads together ({name}{f', {dim:.0f} entries' if dim else ''}) before "
            "caching: that bounds a key's norm over its heads, not one head's share of it, so the per-head ratio above "
            "can still show a sink." + _clip_clause(key_norm))


def _clip_clause(key_norm: Mapping[str, Any]) -> str:
    """Review 18c A5 (OLMoE): every key entry is then clamped to +-clip_qkv, which caps one head's key norm at
    clip x sqrt(d_head); '' without a clamp."""
    clip, bound = _num(key_norm.get("clip_qkv")), _num(key_norm.get("head_bound"))
    if clip is None or bound is None:
        return ""
    return (f" Every key entry is then clamped to +-{clip:g} (clip_qkv), so one head's key norm is at most "
            f"{clip:g} x sqrt({round((bound / clip) ** 2)}) = {bound:.3g}.")


def _clamp_note(s: Mapping[str, Any]) -> str:
    """Review 19a B1 (MPT, OLMo 1: a clamp and no key norm): ' Every key entry is clamped to +-1.5 (clip_qkv) before
    caching, so one head's key norm is at most 1.5 x sqrt(16) = 6 (the largest cached: 5.92): the ratio compares
    clamped keys.'; '' without the summary's key_clamp."""
    clamp = s.get("key_clamp") if isinstance(s.get("key_clamp"), Mapping) else {}
    clip, bound, largest = (_num(clamp.get(k)) for k in ("clip_qkv", "head_bound", "largest"))
    if clip is None or bound is None:
        return ""
    seen = f" (the largest cached: {largest:.3g})" if largest is not None else ""
    return (f" Every key entry is clamped to +-{clip:g} (clip_qkv) before caching, so one head's key norm is at most "
            f"{clip:g} x sqrt({round((bound / clip) ** 2)}) = {bound:.3g}{seen}: the ratio compares clamped keys.")


def reported_norm_layers(s: Mapping[str, Any]) -> set[str]:
    """The layers whose first-key norm ratio the kv finding reports: every layer but those whose per-head key norms
    a k_norm sets (none on a model that normalises every layer's keys per head); compare reads the same ones."""
    key_norm = s.get("key_norm") if isinstance(s.get("key_norm"), Mapping) else None
    all_heads = key_norm is not None and key_norm.get("per_head", True) is False
    if s.get("keys_normalised") and key_norm is not None and not all_heads:
        return set()
    skip = set() if all_heads else {str(v) for v in (key_norm or {}).get("layers") or []}
    records = s.get("key_norm_ratios")
    layers = ([str(r.get("layer")) for r in records if isinstance(r, Mapping)] if isinstance(records, list)
              else [str(k) for k in s.get("sink_key_norm_ratio_per_layer") or {}])
    return {k for k in layers if k not in skip}


def _norm_records(s: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """{layer: its key_norm_ratios record} (each prompt's ratio: mean, 95% t interval, n prompts); {} in an older
    summary, whose ratios (sink_key_norm_ratio_per_layer) carry no interval."""
    records = s.get("key_norm_ratios")
    return {str(r.get("layer")): r for r in records if isinstance(r, Mapping)} if isinstance(records, list) else {}


def _norm_sentence(s: Mapping[str, Any]) -> str:
    """Whether the first key stands out, from the per-layer ratio of its norm to the other keys' (each prompt's ratio,
    the mean over prompts with its 95% t interval and n where the summary records them, key_norm_ratios: a layer
    stands out where its interval lies above STANDS_OUT, not where it lies below, else it cannot be told); on a model
    that normalises its keys before caching (keys_normalised: a k_norm), why that ratio is not reported."""
    key_norm = s.get("key_norm") if isinstance(s.get("key_norm"), Mapping) else None
    all_heads = key_norm is not None and key_norm.get("per_head", True) is False
    if s.get("keys_normalised") and key_norm is not None and not all_heads:
        return _normalised_sentence(key_norm)
    # layers whose per-head key norms are set by a norm: their ratio is not reported (a norm over all heads sets none)
    skip = set() if all_heads else {str(v) for v in (key_norm or {}).get("layers") or []}
    if records := _norm_records(s):
        sentence = _norm_interval_sentence(records, skip, key_norm, all_heads)
        return sentence + _clamp_note(s) if sentence else ""
    given = {k: v for k, v in (s.get("sink_key_norm_ratio_per_layer") or {}).items() if str(k) not in skip}
    ratios = {k: _num(v) for k, v in given.items()}
    ratios = {k: v for k, v in ratios.items() if v is not None}
    missing = sorted(k for k, v in given.items() if _num(v) is None)
    if not ratios:
        return ""
    which = "per layer" if not missing and not skip else f"layer(s) {', '.join(ratios)}"
    if missing:
        which += f"; layer(s) {', '.join(missing)} no longer cache the first key (sliding window)"
    if skip:
        which += (f"; layer(s) {', '.join(sorted(skip, key=int))} normalise their keys ({key_norm.get('module', 'k_norm')}) "
                  "before caching, so their norms are fixed: not reported")
    lo, hi = min(ratios.values()), max(ratios.values())
    span = f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f} to {hi:.2f}"
    if lo > 1.5:
        verdict = f"the first key's norm stands out in {_every(list(ratios), bool(missing or skip))} (a sink key)"
    elif hi > 1.5:
        verdict = f"the first key's norm stands out in layer(s) {', '.join(k for k, v in ratios.items() if v > 1.5)} only"
    else:
        verdict = "the first key's norm does not stand out" + (" (it is smaller)" if hi < 1 else "")
    return (f"The first key's norm is {span} times the other keys' ({which}): {verdict}."
            + (_all_heads_note(key_norm) if all_heads else "") + _clamp_note(s))


def _every(layers: list[str], some: bool) -> str:
    """'every layer', or where some layers are not measured (a sliding window past the first key, a k_norm), the ones
    that are (review 18d B2: "stands out in every layer" where only the 2 global layers of 4 were measured): 'both
    layers measured (1, 3)', 'every layer measured (1, 3, 5)'."""
    if not some:
        return "every layer"
    return f"{'both layers' if len(layers) == 2 else 'every layer'} measured ({', '.join(layers)})"


STANDS_OUT = 1.5  # a first key whose norm is more than this multiple of the other keys' stands out (a sink key)


def _norm_interval_sentence(records: Mapping[str, Mapping[str, Any]], skip: set[str], key_norm: Any,
                            all_heads: bool) -> str:
    """'The first key's norm over the other keys' per layer (each prompt's ratio, mean over 16 prompts, 95% CI): layer
    0 1.20 [1.10, 1.30], layer 1 2.40 [2.10, 2.70]: ...': the layers' means with their intervals (more than 6 layers:
    the lowest and highest), and the verdict by the intervals against STANDS_OUT."""
    rows = {k: r for k, r in records.items() if k not in skip and _num(r.get("ratio")) is not None}
    missing = sorted((k for k, r in records.items() if k not in skip and _num(r.get("ratio")) is None), key=int)
    if not rows:
        return ""

    def one(k: str) -> str:
        ci = r["ci"] if isinstance((r := rows[k]).get("ci"), (list, tuple)) and len(r["ci"]) == 2 else None
        return f"{r['ratio']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

    order = sorted(rows, key=int)
    lo, hi = (pick(order, key=lambda k: rows[k]["ratio"]) for pick in (min, max))
    listed = (", ".join(f"layer {k} {one(k)}" for k in order) if len(order) <= 6 else
              f"from layer {lo} {one(lo)} to layer {hi} {one(hi)}")
    ns = sorted({int(r.get("n") or 0) for r in rows.values()})
    n = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
    which = [f"layer(s) {', '.join(missing)} no longer cache the first key (sliding window)"] if missing else []
    if skip:
        which.append(f"layer(s) {', '.join(sorted(skip, key=int))} normalise their keys "
                     f"({(key_norm or {}).get('module', 'k_norm')}) before caching, so their norms are fixed: not reported")
    lows = {k: (r["ci"][0] if isinstance(r.get("ci"), (list, tuple)) else r["ratio"]) for k, r in rows.items()}
    highs = {k: (r["ci"][1] if isinstance(r.get("ci"), (list, tuple)) else r["ratio"]) for k, r in rows.items()}
    out = [k for k in order if lows[k] > STANDS_OUT]
    unsure = [k for k in order if lows[k] <= STANDS_OUT < highs[k]]
    rule = f"more than {STANDS_OUT:g}x, its 95% CI above {STANDS_OUT:g}"
    if out and len(out) == len(order):
        verdict = f"the first key's norm stands out in {_every(order, bool(missing or skip))} ({rule}: a sink key)"
    elif out:
        verdict = f"the first key's norm stands out in layer(s) {', '.join(out)} only ({rule})"
    elif unsure:
        verdict = f"the first key's norm stands out clearly in no layer ({rule})"
    else:
        verdict = "the first key's norm does not stand out" + (" (it is smaller)" if max(highs.values()) < 1 else "")
    if unsure:
        verdict += f"; in layer(s) {', '.join(unsure)} its 95% CI reaches across {STANDS_OUT:g}: cannot tell"
    return (f"The first key's norm over the other keys' per layer (each prompt's ratio, mean over {n} prompts, 95% CI"
            f"{'; ' + '; '.join(which) if which else ''}): {listed}: {verdict}."
            + (_all_heads_note(key_norm) if all_heads else ""))


def distance_sentence(s: Mapping[str, Any]) -> str:
    """Review 16c B2 (BLOOM): which query-key distances the eviction runs keep on a model with a position bias on its
    scores (the summary's position_bias): those of the full prompt (the evicted keys are hidden from the last query),
    not the re-counted distances of a cache that drops them (Hugging Face's mask-based eviction rebuilds ALiBi from the
    kept keys: -12.066 against -12.0757 on review 16c's prompt); '' elsewhere."""
    if s.get("position_bias") != "alibi":
        return ""
    return ("Evicted runs keep each kept key's ALiBi distance in the full prompt (evicted keys hidden, not removed; a "
            "cache that re-counts the kept keys' positions gives slightly different numbers).")

