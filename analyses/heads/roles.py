"""Head roles from attention patterns: positional, sink, previous-token, induction, confidence.

Scores per head, averaged over every row's real query positions (padding excluded; decoders skip
each row's first real token, which can only attend to itself). Positions are each row's own: in a
left-padded batch the "first token" and query 0 are the row's first real token, so a padded row
scores as it would alone.
- positional: the share of queries whose most-attended key sits at the head's most common
  relative offset (Voita et al.: a positional head does so >= 90% of the time), and that offset
  (offset 0, the query's own token, is labelled "self", not "positional");
- sink: attention to the first token, averaged over the queries that can see it (on a sliding-window
  layer, models.layer_windows, a query more than window - 1 positions after the first token cannot:
  counting it would cap the score below 1 by construction);
- previous_token: attention from position q to q - 1;
- induction: on repeated random tokens x x (length n each), mean attention from position i of
  the second copy to i - n + 1, the token after the earlier occurrence (Olsson et al.), minus the
  same offset's mean attention on random tokens without a repeat at the same positions (the
  control, induction_control; review 17c A1: a head that attends to a fixed offset, such as the
  oldest key of a sliding window, scores as high there without any repeat). The probe reads n - 1
  positions back, so on a model with sliding windows n is at most half the narrowest window (the
  key is then never the window's oldest, w - 1 back) and a layer whose window the probe does not
  fit well inside (n >= window) scores NaN: not measurable, rather than 0 by the mask or the
  window's edge. A layer-0 head of a decoder is never labelled induction: its keys hold only their
  own token and position, so it cannot find the token after an earlier occurrence (no earlier
  previous-token head to compose with); its score is still reported;
- confidence: mean maximum attention weight (Voita et al.).
"""
from __future__ import annotations

import pandas as pd
import torch

from headscope.analyses.core.default_tasks import repeated_random_tokens
from headscope.hooks import capture, site
from headscope.models.hooked_model import first_real_positions, layer_windows, visible_keys

POSITIONAL_SHARE = 0.9
MIN_INDUCTION_LENGTH = 3  # repeats of 2 read 1 back: the previous token, not induction
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
    """Per head: positional, positional_offset, sink, previous_token, confidence (sink over the queries
    that can see the first token, the others over every counted query)."""
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
    windows = layer_windows(model)
    sees = torch.stack([visible_keys(q_idx[None, :], first[:, None], win).float() * w if win else w
                        for win in windows])[:, :, None, :]  # [L, b, 1, q]: the queries that see their first token
    sink = (pat.gather(-1, at_first)[..., 0] * sees).sum((1, 3)) / sees.sum((1, 3)).clamp_min(1.0)  # [L, H]
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


def default_probe_length(model) -> int:
    """The probe's repeat length before any sliding window: 24, or what n_ctx allows."""
    return max(2, min(24, (model.facts.n_ctx - 1) // 2))


def probe_length(model, length: int | None = None) -> int:
    """The probe's repeat length: `length`, else default_probe_length cut to half the narrowest
    sliding window (models.layer_windows; the probe reads length - 1 back, a window w shows w - 1 back:
    at length w the key would be the window's oldest, which a fixed-offset head attends to anyway)."""
    if length:
        return length
    narrowest = min((w for w in layer_windows(model) if w), default=None)
    default = default_probe_length(model)
    return default if narrowest is None else max(MIN_INDUCTION_LENGTH, min(default, narrowest // 2))


def unmeasurable_layers(model, length: int) -> torch.Tensor:
    """[L] bool: layers whose sliding window does not hold the probe's key well inside it (length >= window: the key,
    length - 1 back, is the window's oldest or hidden)."""
    return torch.tensor([w is not None and length >= w for w in layer_windows(model)])


def control_tokens(model, length: int, n: int, seed: int = 0) -> torch.Tensor:
    """[n, 2 * length (+ prefix)]: the probe's shape and prefix, random non-special tokens with no repeat (distinct in
    a row where the vocabulary allows; else the second half drawn anew, so no row repeats its first half)."""
    from headscope.analyses.core.default_tasks import _token_pool

    pool = _token_pool(model)
    probe = repeated_random_tokens(model, length, n, seed)  # the prefix, as the probe has it
    gen = torch.Generator().manual_seed(seed + 7919)
    if len(pool) >= 2 * length:
        body = torch.stack([pool[torch.randperm(len(pool), generator=gen)[:2 * length]] for _ in range(n)])
    else:
        body = torch.cat([torch.stack([pool[torch.randperm(len(pool), generator=gen)[:length]] for _ in range(n)])
                          for _ in range(2)], dim=1)
    return torch.cat([probe[:, :probe.shape[1] - 2 * length], body], dim=1)


def induction_probe(model, *, length: int | None = None, n: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """([L, H] repeat, [L, H] control): mean attention from each second-copy position i to i - length + 1 on
    repeated random tokens and, at the same positions, on random tokens without a repeat (control_tokens); NaN on a
    layer whose window does not hold that key well inside it (unmeasurable_layers)."""
    length = probe_length(model, length)
    out = []
    for tokens in (repeated_random_tokens(model, length, n, seed), control_tokens(model, length, n, seed)):
        start = tokens.shape[1] - 2 * length  # 1 with a prefix token
        pat = attention_patterns(model, tokens)  # [L, b, H, q, k]
        q = torch.arange(start + length, start + 2 * length)  # second copy
        out.append(pat[..., q, q - length + 1].mean((1, 3)))  # [L, H]
    hidden = unmeasurable_layers(model, length)[:, None]  # [L, 1]
    return out[0].masked_fill(hidden, float("nan")), out[1].masked_fill(hidden, float("nan"))


def induction_scores(model, *, length: int | None = None, n: int = 8, seed: int = 0) -> torch.Tensor:
    """[L, H] induction_probe's repeat minus its control: attention to the token after the earlier occurrence beyond
    what the same offset gets without a repeat (NaN where unmeasurable)."""
    repeat, control = induction_probe(model, length=length, n=n, seed=seed)
    return repeat - control


def label(row: pd.Series, *, decoder: bool = True) -> str:
    """One role name per head: induction (its excess over the control; never on a decoder's layer 0, module
    docstring), previous-token, self (positional at offset 0: each query's most-attended key is itself), positional
    (another fixed offset), sink, or other (first that applies)."""
    if row["induction"] >= ROLE_THRESHOLDS["induction"] and not (decoder and int(row["layer"]) == 0):
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
    induction (repeat minus control; NaN: the layer's window does not hold the probe's key well inside it),
    induction_repeat, induction_control (induction_probe), role, window (the layer's sliding
    window, NaN for a global layer), induction_length (the probe's repeat length), induction_cut (True
    where the windows shortened the default probe), longest_prompt (the longest row's real tokens: a
    window at least that long hides no key from any query of these prompts).
    """
    df = pattern_scores(model, tokens, attention_mask)
    length = probe_length(model, induction_length)
    repeat, control = induction_probe(model, length=length, n=n_induction, seed=seed)
    ind = repeat - control
    df["induction"] = [float(ind[l, h]) for l, h in zip(df["layer"], df["head"])]
    df["induction_repeat"] = [float(repeat[l, h]) for l, h in zip(df["layer"], df["head"])]
    df["induction_control"] = [float(control[l, h]) for l, h in zip(df["layer"], df["head"])]
    df["role"] = df.apply(label, axis=1, decoder=not model.facts.is_encoder)
    windows = layer_windows(model)
    df["window"] = [float(windows[l]) if windows[l] else float("nan") for l in df["layer"]]
    df["induction_length"] = length
    df["induction_cut"] = induction_length is None and length < default_probe_length(model)
    df["longest_prompt"] = int(tokens.shape[1] if attention_mask is None else attention_mask.sum(1).max())
    return df


def sink_token(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict | None:
    """What the sink score's "first token" is on these prompts (review 13b C2: on Gemma it is always <bos>, which
    "the first token" does not say): {"token": its text, "special": a special token of the tokenizer} where every
    prompt's first real token is the same id; None where they differ or the model has no tokenizer."""
    tok = getattr(model, "tokenizer", None)
    if tok is None or not len(tokens):
        return None
    first = first_real_positions(attention_mask, tokens.shape[0])  # [batch]
    ids = tokens[torch.arange(tokens.shape[0]), first.to(tokens.device)]  # [batch]
    if not bool((ids == ids[0]).all()):
        return None
    i = int(ids[0])
    text = tok.convert_ids_to_tokens([i])[0] if hasattr(tok, "convert_ids_to_tokens") else tok.decode([i])
    return {"token": str(text), "special": i in set(getattr(tok, "all_special_ids", None) or ())}


def sink_uniform(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[float]:
    """[layer] the sink score of a head that attends uniformly over the keys it sees, on these prompts: the mean of
    1 / (q - first + 1) over the queries pattern_scores averages the sink over (review 18v B1b). A sliding-window
    layer counts only the queries within window - 1 of the first token, so its share is larger: 0.245 = mean of
    1/(q + 1), q = 1..7, for a window of 8 on prompts of 8 tokens or more."""
    w = _query_weights(model, tokens, attention_mask)  # [b, q]
    q_idx = torch.arange(tokens.shape[1])
    first = first_real_positions(attention_mask, tokens.shape[0])  # [b]
    share = 1.0 / (q_idx[None, :] - first[:, None] + 1).clamp_min(1).float()  # [b, q] a uniform head's weight on it
    out = []
    for win in layer_windows(model):
        sees = visible_keys(q_idx[None, :], first[:, None], win).float() * w if win else w  # [b, q]
        out.append(float((share * sees).sum() / sees.sum().clamp_min(1.0)))
    return out


def role_windows(roles: pd.DataFrame, uniform: list[float] | None = None) -> dict:
    """{"role_windows": ...} for the summary when a layer slides (else {}): each windowed layer's
    window, the induction probe's repeat length, whether the windows cut it (induction_cut), the layers it
    cannot be measured on, the longest prompt (a window at least that long changes no sink score) and, given
    `uniform` (sink_uniform), each layer's sink score of a uniform head (sink_uniform, {layer: share})."""
    windowed = roles.dropna(subset=["window"]).drop_duplicates("layer")
    if windowed.empty:
        return {}
    blind = sorted(int(l) for l in roles.loc[roles["induction"].isna(), "layer"].unique())
    return {"role_windows": {"windows": {str(int(l)): int(w) for l, w in zip(windowed["layer"], windowed["window"])},
                             "induction_length": int(roles["induction_length"].iloc[0]),
                             "induction_unmeasurable": blind,
                             "induction_cut": bool(roles["induction_cut"].iloc[0]),
                             "longest_prompt": int(roles["longest_prompt"].iloc[0]),
                             **({"sink_uniform": {str(l): round(v, 4) for l, v in enumerate(uniform)}}
                                if uniform is not None else {})}}
