"""Do edits to attention scores and patterns reach the model's output? (review 16d A1, A3, A6, C3)

TransformerLens's plain AttentionBridge hands attention to the Hugging Face module and fires
hook_attn_scores / hook_pattern afterwards on the weights that module returned: an edited tensor
is discarded (TL warns once, "The edit is discarded"), so a mask or a patched pattern changes
nothing. Bridges that compute attention themselves (GPT-2's, Llama's, NeoX's) apply the edit. In
TransformerLens 4.x the delegating ones include OPT, GPT-J, GPT-Neo, XGLM, BERT/RoBERTa, T5 and the
others whose adapter builds a plain AttentionBridge (or a subclass that calls its forward).

`edits_discarded` finds out with one probe pass per kind on four tokens: a hook hides every key
but the query's own (scores) or puts all weight there (pattern) in every layer; the edit is
discarded when TransformerLens warns so or the output is bit-identical to the unedited pass. The
answer is kept per bridge. Analyses that edit scores or patterns (kv eviction, position's
streaming masks, the pattern patching site) ask before any work and refuse in one line.
"""
from __future__ import annotations

import warnings
import weakref

import torch

from headscope.errors import UnsupportedModelError
from headscope.hooks.sites import site

KINDS = ("scores", "pattern")
_WARNING = "edit is discarded"
_DISCARDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> {kind: edits discarded}


def _probe_hook(kind: str):
    def hook(x: torch.Tensor, hook) -> torch.Tensor:  # [batch, head, q, k]
        n_q, n_k = x.shape[-2], x.shape[-1]
        self_key = torch.eye(n_q, n_k, dtype=torch.bool, device=x.device)  # [q, k]
        if kind == "scores":
            return x.masked_fill(~self_key, torch.finfo(x.dtype).min)
        return self_key.to(x.dtype).expand_as(x).clone()
    return hook


@torch.no_grad()
def _probe(model, kind: str) -> bool:
    """True when an edit at `kind` (scores or pattern) in every layer leaves the output unchanged."""
    tokens = torch.arange(4, device=model.device)[None] % model.facts.d_vocab  # [1, 4]
    fwd = [(site(kind, layer), _probe_hook(kind)) for layer in range(model.facts.n_layers)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with model.hooks(fwd=[(site(kind, layer), lambda x, hook: x) for layer in range(model.facts.n_layers)]):
            base = model(tokens)
        with model.hooks(fwd=fwd):
            edited = model(tokens)
    warned = any(_WARNING in str(w.message) for w in caught)
    return warned or torch.equal(base, edited)


def edits_discarded(model, kind: str = "scores") -> str | None:
    """One line saying that TransformerLens discards edits to `kind` ("scores" or "pattern") on this model,
    or None where they take effect (or the model has no bridge to probe)."""
    if kind not in KINDS:
        raise ValueError(kind)
    if getattr(model, "bridge", None) is None or getattr(model, "facts", None) is None:
        return None
    known = _DISCARDED.setdefault(model.bridge, {})
    if kind not in known:
        known[kind] = _probe(model, kind)
    if not known[kind]:
        return None
    what = "scores" if kind == "scores" else "patterns"
    return (f"TransformerLens hands {model.facts.architecture}'s attention to the Hugging Face module and discards "
            f"edits to attention {what}")


_SCORES_ARE_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> bool


@torch.no_grad()
def scores_hold_weights(model) -> bool:
    """Whether the bridge's hook_attn_scores holds the softmax weights, not the scores (review 17d A3): the plain
    AttentionBridge (GPT-Neo, OPT, GPT-J, ...) fires it on the weights the Hugging Face module returns, which has
    no scores to give. Found once per bridge: on four tokens, layer 0's hook_attn_scores equals its hook_pattern."""
    if getattr(model, "bridge", None) is None or getattr(model, "facts", None) is None or model.facts.n_layers < 1:
        return False
    if model.bridge not in _SCORES_ARE_WEIGHTS:
        got: dict[str, torch.Tensor] = {}

        def keep(kind: str):
            def hook(x: torch.Tensor, hook) -> None:
                got[kind] = x.detach().clone()
            return hook

        tokens = torch.arange(4, device=model.device)[None] % model.facts.d_vocab  # [1, 4]
        with model.hooks(fwd=[(site(kind, 0), keep(kind)) for kind in KINDS]):
            model(tokens)
        _SCORES_ARE_WEIGHTS[model.bridge] = len(got) == 2 and torch.equal(got["scores"], got["pattern"])
    return _SCORES_ARE_WEIGHTS[model.bridge]


def require_edits(model, what: str, kind: str = "scores") -> None:
    """Raise UnsupportedModelError in one line when `kind` edits are discarded: `what` cannot run."""
    why = edits_discarded(model, kind)
    if why:
        raise UnsupportedModelError(f"{why}, so {what} cannot run on this model (it would change nothing).")
