"""No attached hook is ever skipped (#32): a permanent hook a user adds to the bridge
(`bridge.add_hook(name, fn, is_permanent=True)`) runs in every entry point and every fast path,
checked against the bridge's own pass (`model.bridge(tokens)`, TransformerLens's forward) with
the same hook attached."""
from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

import headscope as hs
from headscope.execution import hook_free, resume
from headscope.hooks.kv_states import prefill
from headscope.hooks.patterns import reduce_patterns

TOL = 1e-5


@contextmanager
def permanent_hook(model, name: str, fn):
    """fn attached to `name` as a permanent hook, removed (that hook only) on exit."""
    model.bridge.add_hook(name, fn, is_permanent=True)
    try:
        yield
    finally:
        point = model.bridge.hook_dict[name]
        for handle in [h for h in point.fwd_hooks if h.user_hook is fn]:
            handle.hook.remove()
            point.fwd_hooks.remove(handle)


def add_five(x, hook):
    return x + 5.0


@pytest.fixture
def hooked(tiny_models):
    """The tiny Llama (RMSNorm: a constant added to the stream changes the logits) with a permanent
    hook adding 5 to block 0's output, and tokens; the hook-free blocks apply to it unhooked, so
    each entry point below has a fast path that could skip the hook."""
    model = tiny_models["llama"]
    tokens = model.to_tokens("w1 w2 w3 w4 w5 w6")
    assert hook_free.applies(model) and resume.supports(model).fast_capture
    plain = model(tokens)
    with permanent_hook(model, "blocks.0.hook_resid_post", add_five):
        with torch.no_grad():
            want = model.bridge(tokens)  # [1, pos, d_vocab]: TransformerLens's pass runs the hook
        assert (want - plain).abs().max() > 1.0  # the hook changes the answer
        assert not model.hook_free() and not hook_free.applies(model)
        yield model, tokens, want
    assert model.hook_free() and model.n_active_hooks() == 0  # removed: the fast paths are back


def test_model_call_runs_a_permanent_hook(hooked):
    model, tokens, want = hooked
    assert model.n_active_hooks() == 1
    assert (model(tokens) - want).abs().max() <= TOL


def test_run_with_cache_runs_a_permanent_hook_with_and_without_names(hooked):
    model, tokens, want = hooked
    _, ref = model.bridge.run_with_cache(tokens)  # TransformerLens's cache, hook included
    out, cache = hs.run_with_cache(model, tokens)
    assert (out - want).abs().max() <= TOL
    assert (cache["resid_post", 0] - ref["blocks.0.hook_resid_post"]).abs().max() <= TOL
    # patterns only: the route that recomputes patterns from q and k in a hook-free pass
    pattern = hs.site("pattern", 1)
    out, cache = hs.run_with_cache(model, tokens, names=[pattern])
    assert (out - want).abs().max() <= TOL
    assert (cache[pattern] - ref[pattern]).abs().max() <= TOL


def test_capture_and_attention_pattern_run_a_permanent_hook(hooked):
    model, tokens, want = hooked
    _, ref = model.bridge.run_with_cache(tokens)
    pattern = hs.site("pattern", 1)
    got = hs.capture(model, tokens, [pattern, hs.site("scores", 1)])
    assert (got.output - want).abs().max() <= TOL
    assert (got[pattern] - ref[pattern]).abs().max() <= TOL
    assert (hs.attention_pattern(model, tokens, 1) - ref[pattern]).abs().max() <= TOL


def test_analysis_fast_paths_run_a_permanent_hook(hooked):
    """Resumed sweeps (heads, patching), the kv prefill and position's pattern reducer."""
    model, tokens, want = hooked
    assert resume.supports(model) == resume.Support(False, False, False)  # full passes while hooked
    assert (resume.capture(model, tokens).logits - want[:, -1]).abs().max() <= TOL
    logits, _ = prefill(model, tokens)
    assert (logits - want[:, -1:]).abs().max() <= TOL
    sums = {}
    out = reduce_patterns(model, tokens, lambda layer, q, p: sums.__setitem__(layer, p.sum()))
    assert (out - want).abs().max() <= TOL and sorted(sums) == [0, 1]


def test_a_torch_hook_on_a_hugging_face_module_turns_every_fast_path_off(tiny_models):
    """A user's torch hook on a Hugging Face submodule (which the hand-written blocks and the
    differentiable last-position pass would not fire): supports() says nothing is resumed or hook-free
    while it is attached, so heads, patching and attribution run full passes where it fires; the
    last-position logits then equal the bridge's with the hook."""
    model = tiny_models["llama"]
    tokens = torch.tensor([[1, 5, 9, 13, 17, 21]])
    assert resume.supports(model).fast_capture  # the model's own check, hook-free
    mlp = model.bridge.blocks[0].mlp.original_component
    handle = mlp.register_forward_hook(lambda module, args, out: out * 0)
    try:
        assert resume.supports(model) == resume.Support(False, False, False)
        assert not model.hook_free()
        want = model.bridge(tokens)[:, -1]
        torch.testing.assert_close(model(tokens)[:, -1], want, atol=TOL, rtol=TOL)
    finally:
        handle.remove()
    assert resume.supports(model).fast_capture and (want - model(tokens)[:, -1]).abs().max() > 1e-3  # the hook mattered
