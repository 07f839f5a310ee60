"""Do edits to attention scores and patterns reach the model's output? (review 16d A1, A3, A6, C3)

TransformerLens's plain AttentionBridge hands attention to the Hugging Face module and fires
hook_attn_scores / hook_pattern afterwards on the weights that module returned: an edited tensor
is discarded (TL warns once, "The edit is discarded"), so a mask or a patched pattern changes
nothing. Bridges that compute attention themselves (GPT-2's, Llama's, NeoX's) apply the edit. In
TransformerLens 4.x the delegating ones include OPT, GPT-J, GPT-Neo, XGLM, BERT/RoBERTa, T5 and the
others whose adapter builds a plain AttentionBridge (or a subclass that calls its forward).

`edits_discarded` finds out with one probe pass per kind on four tokens: a hook hides every key
but the query's own (scores) or puts all weight there (pattern) in every layer; the edit is
discarded when TransformerLens warns so or the output is bit-identical to the unedited pass.
`scores_hold_weights` asks the same probe whether hook_attn_scores holds the weights. The
answers are kept per bridge. Analyses that edit scores or patterns (kv eviction, position's
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
_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> {question: answer}, _probe's


def _probe_hook(kind: str):
    def hook(x: torch.Tensor, hook) -> torch.Tensor:  # [batch, head, q, k]
        n_q, n_k = x.shape[-2], x.shape[-1]
        self_key = torch.eye(n_q, n_k, dtype=torch.bool, device=x.device)  # [q, k]
        if kind == "scores":
            return x.masked_fill(~self_key, torch.finfo(x.dtype).min)
        return self_key.to(x.dtype).expand_as(x).clone()
    return hook


@torch.no_grad()
def _probe(model, question: str) -> bool | None:
    """The one probe of the bridge, answered once per bridge and question on four tokens; None without a bridge.
    "scores" / "pattern": does an edit there in every layer leave the output unchanged (TransformerLens warns that it
    discards it, or the output is bit-identical to the pass with identity hooks)? "weights": does layer 0's
    hook_attn_scores equal its hook_pattern (the softmax weights, not the scores)?"""
    if getattr(model, "bridge", None) is None or getattr(model, "facts", None) is None:
        return None
    known = _PROBED.setdefault(model.bridge, {})
    if question in known:
        return known[question]
    tokens = torch.arange(4, device=model.device)[None] % model.facts.d_vocab  # [1, 4]

    def run(fwd: list) -> torch.Tensor:  # the output, [1, 4, d_vocab] (an encoder's: [1, 4, d_model])
        with model.hooks(fwd=fwd):
            return model(tokens)

    if question == "weights":
        got: dict[str, torch.Tensor] = {}

        def keep(kind: str):
            def hook(x: torch.Tensor, hook) -> None:
                got[kind] = x.detach().clone()
            return hook

        run([(site(kind, 0), keep(kind)) for kind in KINDS])
        known[question] = len(got) == 2 and torch.equal(got["scores"], got["pattern"])
        return known[question]
    layers = range(model.facts.n_layers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        base = run([(site(question, layer), lambda x, hook: x) for layer in layers])
        edited = run([(site(question, layer), _probe_hook(question)) for layer in layers])
    known[question] = any(_WARNING in str(w.message) for w in caught) or torch.equal(base, edited)
    return known[question]


def edits_discarded(model, kind: str = "scores") -> str | None:
    """One line saying that TransformerLens discards edits to `kind` ("scores" or "pattern") on this model,
    or None where they take effect (or the model has no bridge to probe)."""
    if kind not in KINDS:
        raise ValueError(kind)
    if not _probe(model, kind):
        return None
    what = "scores" if kind == "scores" else "patterns"
    return (f"TransformerLens hands {model.facts.architecture}'s attention to the Hugging Face module and discards "
            f"edits to attention {what}")


def scores_hold_weights(model) -> bool:
    """Whether the bridge's hook_attn_scores holds the softmax weights, not the scores (review 17d A3): the plain
    AttentionBridge (GPT-Neo, OPT, GPT-J, ...) fires it on the weights the Hugging Face module returns, which has
    no scores to give. Found once per bridge by _probe: on four tokens, layer 0's hook_attn_scores equals its
    hook_pattern."""
    facts = getattr(model, "facts", None)
    return facts is not None and facts.n_layers >= 1 and bool(_probe(model, "weights"))


def require_edits(model, what: str, kind: str = "scores") -> None:
    """Raise UnsupportedModelError in one line when `kind` edits are discarded: `what` cannot run."""
    why = edits_discarded(model, kind)
    if why:
        raise UnsupportedModelError(f"{why}, so {what} cannot run on this model (it would change nothing).")
