"""Path patching (Wang et al. 2022, IOI): a sender head's effect along its direct paths only.

A sender head h (layer l) writes r_h = z_h @ W_O[h] into the residual stream. Path patching
changes that write from its base-run value to its source-run value (delta = r_h,src - r_h,base)
but lets only chosen receivers see the change:

- receivers = [(layer, head), ...] with component "q", "k" or "v": the receiver's q (or k, v)
  is recomputed from its own copy of the residual, ln1(resid_pre + delta) @ W + b, while every
  other head, MLP and the receiver's other inputs read the unchanged residual. Because q is
  affine in ln1's output, this is q + (ln1(resid + delta) - ln1(resid)) @ W[head], added at
  hook_q (hook_k / hook_v). Under grouped-query attention a k/v receiver is a KV head. Where a norm over all
  heads or a clamp (clip_qkv) follows W (OLMo 2, OLMoE; hook_q holds its output, models/qkv_sites.py), q is not
  affine: the receiver's q is recomputed whole, clamp(norm(ln1(resid_pre + delta) @ W + b))[head].
- receivers = "logits": delta is added to the final residual (last hook_resid_post) only, the
  sender's direct effect on the logits.
- post-LN blocks (OPT with do_layer_norm_before=False) are refused in one line (models.readout): there
  every write passes its own block's LayerNorms and all later ones, which adding delta skips.
- post-norm blocks (Gemma 2/3, OLMo 2: execution.block_shape's ln1_post): the sender's write
  reaches the residual only through the norm of the layer's whole attention output, so delta is
  that norm's change, N(o_base + dr_h) - N(o_base), with o_base the base run's whole attention
  output (other heads held at base): what the residual receives when only the sender changes.

Design choice: this is the delta-on-receiver-input method in one forward pass per run, not
Wang et al.'s two-pass freeze; everything between the sender and the receiver (other heads
and MLPs) is held at its base value, i.e. only the direct edge sender -> receiver is patched,
and everything downstream of the receivers is recomputed. It equals
transformer_lens.patching.get_act_patch_direct_path (which adds delta to a per-head fork of the
residual). Runs are batched by the engine: one run per sender (all receivers jointly) or, with
per_receiver=True, one per (sender, receiver) pair.

Padded tasks (left-padded, each clean/corrupted pair sharing its padding): every run goes under
the task's attention_mask, each row's metric reads its own last position, and a sender's delta
is zero at padded positions (padding is never patched); values are means over the prompts.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from headscope.analyses.core import chance
from headscope.analyses.core.config import configure
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task
from headscope.analyses.patching.configs import PathPatchingConfig
from headscope.analyses.patching.engine import run_batched
from headscope.analyses.patching.inputs import (
    check_direction,
    clean_and_corrupted,
    effect_intervals,
    paired_rows,
    resolve_metric,
    task_padding,
)
from headscope.errors import ConfigError, IndexOutOfRangeError
from headscope.execution.block_shape import post_attention_norm
from headscope.hooks.cache import head_result
from headscope.hooks.capture import capture
from headscope.hooks.sites import site
from headscope.models.readout import refuse_post_ln

COMPONENTS = ("q", "k", "v")
PATHS = "path patching"  # review 16d A2: why it cannot run on post-LN blocks, after models.readout.POST_LN
PATHS_WHY = (", and it would add a head's write to the final stream or a receiver's input past the LayerNorms every "
             "write passes through there, so its effects would not be the model's direct paths")
Head = tuple[int, int]


def _weights(attn, component: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = {"q": attn.W_Q, "k": attn.W_K, "v": attn.W_V}[component]  # [head or kv_head, d_model, d_head]
    b = {"q": attn.b_Q, "k": attn.b_K, "v": attn.b_V}[component]
    return w.detach(), b


def _after_projection(attn, component: str):
    """What a layer's attention does to x @ W + b before its q/k/v hooks (models/qkv_sites.py): the norm over all
    heads together (OLMo 2, OLMoE's q and k) and the clamp to +-clip_qkv (OLMo, OLMoE), as a function of
    [batch, pos, head, d_head]; None where the hook holds the projection itself."""
    from headscope.models.hooked_model import raw_module
    from headscope.models.qkv_sites import clip_qkv

    norm = getattr(attn, f"{component}_norm", None) if getattr(attn, "_qk_norm_phase", None) == "pre_reshape" else None
    clip = clip_qkv(attn)
    if norm is None and clip is None:
        return None
    norm = raw_module(norm) if norm is not None else None

    def after(y: torch.Tensor) -> torch.Tensor:
        if norm is not None:
            y = norm(y.flatten(-2)).view(y.shape)  # one norm over heads x d_head
        return y if clip is None else y.clamp(min=-clip, max=clip)

    return after


def _check_receivers(model, receivers, component: str) -> list[Head]:
    if component not in COMPONENTS:
        raise ConfigError(f"Unknown component {component!r}; path patching reaches a receiver's {COMPONENTS} input.")
    if getattr(model.facts, "mla", None):  # TransformerLens has no W_Q/W_K/W_V on MLA: one line, not its NotImplementedError
        raise ConfigError(f"Path patching into a receiver's {component} recomputes it from the receiver's input through "
                          f"W_Q/W_K/W_V, and {model.facts.name} uses multi-head latent attention (q, k and v from "
                          "latents through norms, no per-head matrices): patch paths to the logits instead "
                          "(receivers='logits').")
    n = model.facts.n_kv_heads if component in ("k", "v") else model.facts.n_heads
    out = []
    for layer, head in receivers:
        model.check_layer(layer)
        if not 0 <= head < n:
            raise IndexOutOfRangeError(f"receiver head {head} is out of range for component {component!r}: "
                                       f"layer {layer} has {n} {'KV ' if n != model.facts.n_heads else ''}heads.")
        out.append((layer, head))
    if not out:
        raise ConfigError("receivers is empty; pass (layer, head) pairs or 'logits'.")
    bare = sorted({layer for layer, _ in out if getattr(model.bridge.blocks[layer], "ln1", None) is None})
    if bare:  # review 8 A6: OLMo 2 (norms after attention, q/k normalised over all heads) crashed on `ln1`
        raise ConfigError(f"Path patching into a receiver's {component} needs the norm before attention to recompute "
                          f"the receiver's input, and layer(s) {', '.join(map(str, bare))} of {model.facts.name} have "
                          "none (their norms follow attention; q and k are normalised after the projection): patch "
                          "paths to the logits instead (receivers='logits').")
    return out


@takes_prompt
@names_source
def path_patching(
    model,
    task=None,
    config: PathPatchingConfig | None = None,
    *,
    corrupted_tokens: torch.Tensor | None = None,
    **config_overrides: Any,
) -> Result:
    """Patch each sender head's output along its direct paths into config.receivers.

    config: a PathPatchingConfig; config_overrides are its fields (receivers, senders, component,
    per_receiver, direction, metric, batch_size, memory_budget, progress). direction "noise" (Wang
    et al.): clean run, the sender's corrupted output on the paths; "denoise": corrupted run, the
    clean output. senders: default every head in a layer before the last receiver layer (every
    head for "logits"). A sender only reaches receivers in later layers. The older form
    path_patching(model, task, receivers) still works. task: a Task, zoo task name, task file or
    None (the patching default task); corrupted_tokens (data): corrupted prompts when the Task has none.
    Result df: sender_layer, sender_head, receiver ("logits", "L1H0" or "all"), value, effect (value
    minus the null run: the same hooks adding nothing, so the patched runs' own arithmetic; summary baseline),
    ci_low / ci_high (the 95% t interval of the mean per-prompt effect) and n_rows (the prompts); summary top_paths
    carry "ci" and "n", n_examples the prompts, clean_metric / corrupted_metric (with their CIs and metric_n), and
    gap_within_noise where the gap is (chance.gap_within_noise).
    """
    cfg = configure(PathPatchingConfig, config, config_overrides, name="path_patching", positional="receivers")
    refuse_post_ln(model, PATHS, PATHS_WHY)  # review 16d A2: a delta added after the blocks' own norms names the wrong head
    check_direction(cfg.direction)
    if not isinstance(task, Task):
        from headscope.analyses.patching.analysis import default_task

        task = default_task(model, task, cfg)
    task, left_out = paired_rows(task, corrupted_tokens, "path patching")
    clean, corrupted = clean_and_corrupted(model, task, corrupted_tokens)
    mask = task_padding(task, clean)  # [B, pos] or None
    pm = resolve_metric(task, cfg.metric)
    recv, runs = _runs(model, cfg)
    base, source_tokens = (clean, corrupted) if cfg.direction == "noise" else (corrupted, clean)
    # run 0: the null run, every run's hooks adding nothing, so each path's effect is against a pass of its own
    # arithmetic (review 19c B1: the hook-free unpatched pass rounded 0.005 logits away in bfloat16)
    hooks_for = _path_hooks(model, [None, *runs], recv, cfg.component,
                            _sender_deltas(model, runs, base, source_tokens, mask))
    values = run_batched(model, base, len(runs) + 1, hooks_for, pm.fn, batch_size=cfg.batch_size,
                         memory_budget=cfg.memory_budget, progress=cfg.progress, stacked_metric=pm.stacked,
                         desc="path patching", attention_mask=mask)
    null, values = values[0], values[1:]  # [B], [run, B]
    with torch.no_grad():
        clean_rows = pm.fn(model(clean, attention_mask=mask)).detach().float().cpu()  # [B]
        corrupt_rows = pm.fn(model(corrupted, attention_mask=mask)).detach().float().cpu()  # [B]
    clean_value, corrupt_value = float(clean_rows.double().mean()), float(corrupt_rows.double().mean())
    # review 12c B3: each path's effect with its 95% t interval over the prompts' own effects
    ci = effect_intervals(pm, values.cpu(), null.cpu(), clean_rows, corrupt_rows)
    baseline = float(pm.finish(float(null.double().mean()), clean_value, corrupt_value))  # the null run
    value = pm.finish(values.mean(1).double(), clean_value, corrupt_value).numpy()
    to_logits = recv is None
    df = pd.DataFrame({
        "sender_layer": [s[0] for s, _ in runs],
        "sender_head": [s[1] for s, _ in runs],
        # review 15b C3: "L1H0" as every other table names a head ("1.0" read as a float)
        "receiver": ["logits" if to_logits else (f"L{g[0][0]}H{g[0][1]}" if len(g) == 1 else "all") for _, g in runs],
        "component": "resid" if to_logits else cfg.component,
        "value": value,
        "effect": value - baseline,
        "ci_low": ci["low"], "ci_high": ci["high"], "n_rows": ci["n"],
    })
    top = df.reindex(df["effect"].abs().sort_values(ascending=False).index).head(10)
    summary = {
        "metric": pm.name, "normalized": pm.normalized, "direction": cfg.direction, "baseline": baseline,
        # review 15b B2: the clean-corrupted gap the effects come from, so the finding can say when it is within noise
        "clean_metric": float(pm.finish(clean_value, clean_value, corrupt_value)),
        "corrupted_metric": float(pm.finish(corrupt_value, clean_value, corrupt_value)),
        **({} if pm.normalized else {"clean_metric_ci": chance.mean_interval(clean_rows.double().numpy()),
                                     "corrupted_metric_ci": chance.mean_interval(corrupt_rows.double().numpy()),
                                     "metric_n": int(clean_rows.shape[0])}),
        "receivers": "logits" if to_logits else [list(r) for r in recv],
        "component": "resid" if to_logits else cfg.component,  # (a path to the logits enters no receiver's q/k/v)
        "top_paths": [{"sender": [int(r.sender_layer), int(r.sender_head)], "receiver": str(r.receiver),
                       "effect": float(r.effect), "n": int(r.n_rows),
                       "ci": [float(r.ci_low), float(r.ci_high)] if np.isfinite([r.ci_low, r.ci_high]).all() else None}
                      for r in top.itertuples()],
        "n_examples": int(clean.shape[0]),
        **left_out,
    }
    if (small := chance.gap_within_noise(clean_rows, corrupt_rows, pm.name)) is not None:
        summary["gap_within_noise"] = small
    return Result(name="patching", df=df, summary=summary, tables={"path_patching": df},
                  config={"component": "resid" if to_logits else cfg.component, "direction": cfg.direction,
                          "per_receiver": cfg.per_receiver})


Run = tuple[Head, list[Head]]  # (sender, the receivers it reaches jointly; [] for the logits)


def _runs(model, cfg: PathPatchingConfig) -> tuple[list[Head] | None, list[Run]]:
    """(the checked receivers, None for the logits; the patched runs: one per sender and receiver group)."""
    receivers = cfg.receivers
    to_logits = isinstance(receivers, str)
    if to_logits and receivers != "logits":
        raise ConfigError(f"receivers must be 'logits' or a list of (layer, head), got {receivers!r}.")
    recv = [] if to_logits else _check_receivers(model, receivers, cfg.component)
    last = model.facts.n_layers if to_logits else max(layer for layer, _ in recv)
    senders = cfg.senders
    if senders is None:
        senders = [(layer, h) for layer in range(last) for h in range(model.facts.n_heads)]
    for layer, head in senders:
        model.check_head(layer, head)
    groups: list[list[Head]] = [[]] if to_logits else ([[r] for r in recv] if cfg.per_receiver else [recv])
    runs = [(tuple(s), g) for s in senders for g in groups if to_logits or any(r[0] > s[0] for r in g)]
    if not runs:
        raise ConfigError("No sender comes before a receiver; senders must sit in earlier layers than receivers.")
    return (None if to_logits else recv), runs


def _sender_deltas(model, runs: list[Run], base: torch.Tensor, source: torch.Tensor, mask: torch.Tensor | None):
    """delta(layer, head) -> [B, pos, d_model]: the sender's residual write in the source run minus
    in the base run, after the layer's post-attention norm where it has one (zero at padded positions)."""
    senders = [s for s, _ in runs]
    z_names = [site("z", layer) for layer in sorted({s[0] for s in senders})]
    src = capture(model, source, z_names, attention_mask=mask)
    ref = capture(model, base, z_names, attention_mask=mask)
    real = None if mask is None else mask.bool()[:, :, None]  # [B, pos, 1]
    w_o = {layer: model.bridge.blocks[layer].attn.W_O.detach() for layer, _ in senders}  # [head, d_head, d_model]
    norms = {layer: post_attention_norm(model.bridge.blocks[layer]) for layer, _ in senders}
    whole = {layer: _attention_output(model, layer, ref[site("z", layer)]) for layer, n in norms.items() if n is not None}

    def delta(layer: int, head: int) -> torch.Tensor:  # [B, pos, d_model]
        dz = src[site("z", layer)][:, :, head] - ref[site("z", layer)][:, :, head]
        out = dz @ w_o[layer][head].to(dz.dtype)
        norm = norms[layer]
        if norm is not None:  # float32 (the RMSNorms upcast), so a small change is not lost to rounding
            with torch.no_grad():
                base = whole[layer]
                out = (norm(base + out.float()) - norm(base)).to(dz.dtype)
        return out if real is None else torch.where(real.to(out.device), out, torch.zeros((), dtype=out.dtype, device=out.device))

    return delta


def _attention_output(model, layer: int, z: torch.Tensor) -> torch.Tensor:
    """[B, pos, d_model] float32: the layer's whole attention output before its post-norm, o(z) + b_O."""
    with torch.no_grad():
        out = head_result(model, layer, z.float()).sum(-2)
        b_o = getattr(model.bridge.blocks[layer].attn, "b_O", None)
        return out + b_o.detach().float().to(out.device) if isinstance(b_o, torch.Tensor) else out


def _path_hooks(model, runs: list[Run], recv: list[Head] | None, component: str, delta):
    """hooks_for(chunk) for the batching engine: each run's sender delta added to the final residual
    (receivers None: the logits) or, through ln1, to its receivers' `component` input only."""
    n_layers = model.facts.n_layers
    recv_layers = sorted({r[0] for r in recv or ()})
    weights = {layer: _weights(model.bridge.blocks[layer].attn, component) for layer in recv_layers}

    zero = None

    def moved(r: int) -> torch.Tensor:  # [B, pos, d_model]: run r's delta; the null run (None) adds zeros
        nonlocal zero
        if runs[r] is not None:
            return delta(*runs[r][0])
        if zero is None:
            first = next(run for run in runs if run is not None)
            zero = torch.zeros_like(delta(*first[0]))
        return zero

    def hooks_for(chunk: range):
        k = len(chunk)
        deltas = torch.stack([moved(r) for r in chunk])  # [k, B, pos, d_model]
        if recv is None:
            def add(act: torch.Tensor, hook: Any) -> torch.Tensor:
                return (act.view(k, -1, *act.shape[1:]) + deltas.to(act.dtype)).reshape(act.shape)
            return [(site("resid_post", n_layers - 1), add)]
        hooks, resid = [], {}
        for layer in recv_layers:
            gate = torch.zeros(k, weights[layer][0].shape[0], device=deltas.device)  # [k, head]: 1 where run k patches it
            for i, r in enumerate(chunk):
                if runs[r] is None:  # the null run patches no receiver
                    continue
                sender, group = runs[r]
                for rl, rh in group:
                    if rl == layer and sender[0] < layer:
                        gate[i, rh] = 1.0

            def keep(act: torch.Tensor, hook: Any, layer: int = layer) -> None:
                resid[layer] = act

            def shift(act: torch.Tensor, hook: Any, layer: int = layer, gate: torch.Tensor = gate) -> torch.Tensor:
                x = resid[layer]  # [k * B, pos, d_model]
                ln1 = model.bridge.blocks[layer].ln1
                moved_in = ln1(x + deltas.reshape(x.shape).to(x.dtype))  # [k * B, pos, d_model]
                w, b = weights[layer]  # [head, d_model, d_head], [head, d_head] or None
                after = _after_projection(model.bridge.blocks[layer].attn, component)
                if after is None:  # q affine in ln1's output: add the change of ln1's output through W
                    change = torch.einsum("bpm,hmd->bphd", moved_in - ln1(x), w.to(x.dtype))  # [k * B, pos, head, d_head]
                else:  # review 18c A1: a norm over all heads or a clamp after W: the receiver's own q, recomputed whole
                    new = torch.einsum("bpm,hmd->bphd", moved_in, w.to(x.dtype)) + (0 if b is None else b.to(x.dtype))
                    change = after(new) - act.reshape(new.shape)  # [k * B, pos, head, d_head]
                change = change.view(k, -1, *change.shape[1:]) * gate.to(change.dtype)[:, None, None, :, None]
                return act + change.reshape(act.shape)

            hooks += [(site("resid_pre", layer), keep), (site(component, layer), shift)]
        return hooks

    return hooks_for
