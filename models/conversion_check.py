"""The load-time check that TransformerLens's conversion computes what Hugging Face computes.

The bridge re-implements parts of a model (attention from its own split q/k/v, its own norms, block sums); a
conversion that reads a weight in the wrong layout gives numbers that are silently wrong for every analysis
(grouped-query Falcon: TransformerLens splits the fused query_key_value as one [Q | K | V] block, Hugging Face
stores it per KV group [q x heads per group, k, v]; logits off by 5). `check_conversion` runs one short probe of a
few tokens twice: through the bridge with a no-op hook on every hook point (so TransformerLens's own components run,
as analyses run them), and through Hugging Face's own modules (the same model, each bridge component swapped back
for the module it wraps while the pass runs, so no copy of the weights is made); where the logits disagree beyond
rounding it refuses in one line (UnsupportedModelError), before any analysis runs or any file is written.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from headscope.errors import HeadscopeWarning, UnsupportedModelError

PROBE_TOKENS = 8
REL_TOL = 1e-4  # float32: relative to the logits' size (deep float32 models differ by ~1e-5 of it)
HALF_STEPS = 8  # half precision: 8 rounding steps of the dtype at the logits' size


def tolerance(dtype: torch.dtype, size: float) -> float:
    """The largest logit disagreement rounding explains: max(1e-4, 8 eps(dtype)) x (1 + size), size the
    largest |logit| of the reference (resume_check's rule for two passes of one model). float32: 1e-4 of
    the logits' size; bfloat16: 8 steps of 2^-7 (0.5 for logits of 7)."""
    return max(REL_TOL, HALF_STEPS * float(torch.finfo(dtype).eps)) * (1.0 + abs(float(size)))


def probe_tokens(bridge: Any, n: int = PROBE_TOKENS) -> torch.Tensor:
    """[1, n] token ids, none of them a special token (a pad id could be masked by one pass and not the
    other), seeded, at most the model's context; on the embedding's device."""
    n_ctx = int(getattr(bridge.cfg, "n_ctx", n) or n)
    vocab = int(bridge.cfg.d_vocab)
    special = [i for i in getattr(getattr(bridge, "tokenizer", None), "all_special_ids", None) or () if 0 <= i < vocab]
    keep = torch.ones(vocab, dtype=torch.bool)  # [vocab]: no Python loop over the vocabulary on every load
    keep[torch.tensor(special, dtype=torch.long)] = False
    allowed = keep.nonzero().squeeze(1) if keep.any() else torch.arange(vocab)  # ascending, as before
    pick = torch.randint(len(allowed), (min(n, n_ctx),), generator=torch.Generator().manual_seed(0))
    device = next(bridge.original_model.parameters()).device
    return allowed[pick][None].to(device)  # [1, n]


@contextmanager
def hugging_face_modules(hf_model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """While open, every bridge component inside `hf_model` (the bridge's original_model) is replaced by the
    Hugging Face module it wraps, so `hf_model(...)` runs Hugging Face's own code on the same weights; the
    components are put back on exit, even on an error."""
    from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent

    swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    seen: set[int] = set()

    def unwrap(module: torch.nn.Module) -> None:
        if id(module) in seen:
            return
        seen.add(id(module))
        for name, child in list(module._modules.items()):
            raw = child
            while isinstance(raw, GeneralizedComponent) and isinstance(getattr(raw, "original_component", None),
                                                                        torch.nn.Module):
                raw = raw.original_component
            if raw is not child:
                swapped.append((module, name, child))
                module._modules[name] = raw
            if raw is not None:
                unwrap(raw)

    try:
        unwrap(hf_model)
        yield hf_model
    finally:
        for module, name, child in reversed(swapped):
            module._modules[name] = child


def disagreement(bridge: Any, tokens: torch.Tensor | None = None) -> tuple[float, float]:
    """(max |bridge logit - Hugging Face logit|, max |Hugging Face logit|) on `tokens` [1, n] (probe_tokens by
    default): the bridge's pass with a no-op hook on every hook point against Hugging Face's own forward."""
    tokens = probe_tokens(bridge) if tokens is None else tokens
    with torch.no_grad():
        with warnings.catch_warnings():  # the bridge names the hook points it keeps switched off
            warnings.filterwarnings("ignore", message="hooks: skipped")
            with bridge.hooks(fwd_hooks=[(lambda name: True, lambda act, hook: None)]):
                ours = bridge(tokens, return_type="logits")  # [1, n, d_vocab]
        with hugging_face_modules(bridge.original_model) as hf:
            theirs = hf(input_ids=tokens).logits  # [1, n, d_vocab]
    ours, theirs = ours.float(), theirs.float().to(ours.device)
    finite = theirs.isfinite()  # a model that overflows in its dtype (Tracr in float16) does so in both passes
    size = theirs[finite].abs().max().item() if finite.any() else 0.0
    if ours.shape != theirs.shape or not torch.equal(ours.isfinite(), finite):
        return float("inf"), size
    return ((ours - theirs)[finite].abs().max().item() if finite.any() else 0.0), size


def check_conversion(bridge: Any, name: str) -> None:
    """Refuse (UnsupportedModelError, one line) a model whose bridge disagrees with Hugging Face's own forward
    beyond `tolerance` on the probe; pass silently otherwise; warn (HeadscopeWarning) where the probe cannot run."""
    dtype = next((p.dtype for p in bridge.parameters() if p.is_floating_point()), torch.float32)
    arch = type(bridge.original_model).__name__
    try:
        diff, size = disagreement(bridge)
    except Exception as err:  # noqa: BLE001 - a model the probe cannot run (extra inputs): said, not refused
        first = str(err).splitlines()[0] if str(err) else ""
        warnings.warn(f"headscope could not check TransformerLens's conversion of {arch} ({name}) against Hugging "
                      f"Face's own forward ({type(err).__name__}: {first}); its numbers are unchecked.",
                      HeadscopeWarning, stacklevel=3)
        return
    if diff <= tolerance(dtype, size):
        return
    raise UnsupportedModelError(
        f"TransformerLens's conversion of {arch} ({name}) disagrees with Hugging Face's own forward by {diff:.2g} "
        f"logits (largest logit {size:.2g}; rounding in {str(dtype).replace('torch.', '')} explains at most "
        f"{tolerance(dtype, size):.2g}): headscope refuses rather than report wrong numbers.")
