"""Resuming a forward pass mid-model equals a full pass (plain HF, or TransformerLens with the same hooks)."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import headscope as hs
from headscope.errors import HeadscopeWarning
from headscope.execution import block_shape, resume
from tests_support import hf_model, random_tokens, zero_head

FAMILIES = ("gpt2", "llama", "neox")


def _shift_resid(delta: float, pos: int):
    def hook(x, hook):
        x = x.clone()
        x[:, pos] += delta
        return x
    return hook


@pytest.mark.parametrize("family", FAMILIES)
def test_capture_and_resume_reproduce_plain_hf(family, tiny_models, tiny_dirs):
    model = tiny_models[family]
    assert resume.supports(model)[0]
    tokens = random_tokens(3, 7, seed=1)
    with torch.no_grad():
        want = hf_model(tiny_dirs[family])(tokens).logits  # [3, 7, vocab]
    ckpt = resume.capture(model, tokens)
    torch.testing.assert_close(ckpt.logits, want[:, -1], atol=1e-5, rtol=1e-5)
    rows = torch.tensor([2, 0, 0, 1])  # any rows, repeated, in any order
    for start in range(model.facts.n_layers):
        torch.testing.assert_close(resume.resume(model, ckpt, start, rows)[:, 0], want[rows, -1], atol=1e-5, rtol=1e-5)
        full = resume.resume(model, ckpt, start, rows, last_only=False)  # [4, 7, vocab]
        torch.testing.assert_close(full, want[rows], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_resumed_hooks_match_a_full_pass_with_the_same_hooks(family, tiny_models):
    model = tiny_models[family]
    tokens = random_tokens(2, 6, seed=2)
    ckpt = resume.capture(model, tokens)
    rows = torch.tensor([1, 0, 1])
    hooks = [(hs.site("resid_pre", 1), _shift_resid(0.7, 2)), (hs.site("z", 1), zero_head(3))]
    with torch.no_grad():
        want = model.run_with_hooks(tokens[rows], fwd=hooks)  # TransformerLens, every block
    got = resume.resume(model, ckpt, 1, rows, fwd=hooks)
    torch.testing.assert_close(got[:, 0], want[:, -1], atol=1e-5, rtol=1e-5)
    assert (got[:, 0] - ckpt.logits[rows]).abs().max() > 1e-3  # the hooks did act
    assert model.n_active_hooks() == 0


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fast", [False, True])  # the bridge's MLP, or the hook-free rest of the block
def test_z_shortcut_equals_editing_hook_z(family, fast, tiny_models):
    model = tiny_models[family]
    assert resume.supports(model).shortcut
    tokens = random_tokens(2, 6, seed=3)
    ckpt = resume.capture(model, tokens, z_layers=[0, 1])
    rows = torch.tensor([0, 1, 1])
    for start in range(model.facts.n_layers):
        z = ckpt.z[start][rows].clone()
        z[:, :, 2] = 0.0
        with torch.no_grad():
            want = model.run_with_hooks(tokens[rows], fwd=[(hs.site("z", start), zero_head(2))])[:, -1]
        got = resume.resume(model, ckpt, start, rows, z=z, fast=fast)
        torch.testing.assert_close(got[:, 0], want, atol=1e-5, rtol=1e-5)
        assert (want - ckpt.logits[rows]).abs().max() > 1e-4  # the edit mattered


def test_parallel_shortcut_sums_in_hugging_faces_order_in_half_precision(tiny_dirs):
    """bfloat16 rounds each sum: the parallel shortcut adds MLP, attention and input in Hugging
    Face's order, so it equals TransformerLens zeroing a head (another order is off by ~2e-2).
    Through the bridge's blocks (the hook-free ones use SDPA, which rounds its own way)."""
    model = hs.load_model(tiny_dirs["neox"], device="cpu", dtype=torch.bfloat16)
    assert resume.supports(model).shortcut
    tokens = random_tokens(2, 6, seed=3)
    ckpt = resume.capture(model, tokens, z_layers=[0, 1], fast=False)
    rows = torch.tensor([0, 1])
    for start in range(model.facts.n_layers):
        z = ckpt.z[start][rows].clone()
        z[:, :, 2] = 0.0
        with torch.no_grad():
            want = model.run_with_hooks(tokens[rows], fwd=[(hs.site("z", start), zero_head(2))])[:, -1]
        got = resume.resume(model, ckpt, start, rows, z=z, fast=False)
        torch.testing.assert_close(got[:, 0], want, atol=1e-3, rtol=0)


def test_parallel_residual_blocks_take_the_z_shortcut_their_own_way(tiny_models, monkeypatch):
    """GPT-NeoX adds attention and MLP to the same input: its shortcut is x + o(z) + MLP(x), and
    the sequential form o(z) + MLP(resid_mid) must fail the check."""
    model = tiny_models["neox"]
    assert model.bridge.original_model.config.use_parallel_residual
    assert resume.supports(model) == (True, True, True, True, True)
    monkeypatch.setattr(block_shape, "is_parallel", lambda block: False)
    monkeypatch.setattr(resume, "_fast_plan", lambda model: None)  # the bridge's blocks, the sequential form
    monkeypatch.setattr(resume, "_SUPPORT", type(resume._SUPPORT)())
    with pytest.warns(HeadscopeWarning, match="the z shortcut"):
        assert resume.supports(model) == (True, False, True, False, False)


def test_a_failed_check_warns_once_per_model_with_what_falls_back(tiny_models, monkeypatch):
    """A check that fails is a HeadscopeWarning naming the model and what runs instead, said once
    per model (supports remembers its answer); a model whose checks pass, or where a saving does
    not apply, says nothing."""
    model = tiny_models["llama"]
    monkeypatch.setattr(resume, "_SUPPORT", type(resume._SUPPORT)())
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        assert resume.supports(model).fast_capture
    real = resume.resume

    def broken(model, ckpt, start, rows, **kwargs):  # resuming from a position is off by a lot
        out = real(model, ckpt, start, rows, **kwargs)
        return out + 1.0 if kwargs.get("from_pos") else out

    monkeypatch.setattr(resume, "resume", broken)
    monkeypatch.setattr(resume, "_SUPPORT", type(resume._SUPPORT)())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        support = resume.supports(model)
        resume.supports(model)
        resume.supports(model)
    said = [w for w in caught if issubclass(w.category, HeadscopeWarning)]
    assert len(said) == 1
    text = str(said[0].message)
    assert model.facts.name in text and "resuming from a position" in text and "compute every position" in text
    assert said[0].filename == __file__  # pointed at the caller of supports
    assert support.ok and support.shortcut and not support.prefix
    monkeypatch.setattr(resume, "capture", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no capture")))
    monkeypatch.setattr(resume, "_SUPPORT", type(resume._SUPPORT)())
    with pytest.warns(HeadscopeWarning, match="capturing a pass.*no capture.*full forward passes"):
        assert resume.supports(model) == (False, False, False, False, False)


def test_encoders_are_refused(tiny_models, monkeypatch):
    model = tiny_models["llama"]
    monkeypatch.setattr(model, "facts", dataclasses.replace(model.facts, is_encoder=True))
    with pytest.raises(ValueError, match="decoders only"):
        resume.capture(model, random_tokens(1, 4))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fast", [False, True])  # True: hook-free capture and blocks where the family has them
def test_left_padded_prompts_resume_with_their_own_masks(family, fast, tiny_models):
    """Per-row arguments (the padding mask) follow the rows they are gathered to."""
    model = tiny_models[family]
    tokens = random_tokens(3, 6, seed=4)
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[0, :2] = 0  # row 0 left-padded by 2, row 2 by 1
    mask[2, :1] = 0
    with torch.no_grad():
        want = model(tokens, attention_mask=mask)[:, -1]
    ckpt = resume.capture(model, tokens, attention_mask=mask, fast=fast)
    rows = torch.tensor([2, 0, 1, 0])
    for start in range(model.facts.n_layers):
        got = resume.resume(model, ckpt, start, rows, fast=fast)
        torch.testing.assert_close(got[:, 0], want[rows], atol=1e-5, rtol=1e-5)
    assert (want[0] - model(tokens[:1])[:, -1]).abs().max() > 1e-3  # the mask matters


@pytest.mark.parametrize("family", FAMILIES)
def test_resuming_from_a_position_reuses_the_captured_keys_and_values(family, tiny_models):
    """An edit from position p on: positions before p come from the captured cache."""
    model = tiny_models[family]
    assert resume.supports(model).prefix
    tokens = random_tokens(2, 7, seed=5)
    ckpt = resume.capture(model, tokens)
    rows = torch.tensor([1, 0, 1])
    for start in range(model.facts.n_layers):
        for p in (1, 4, 6):
            hidden = ckpt.resid[start][rows].clone()
            hidden[:, p:] += 0.5 * torch.randn(hidden[:, p:].shape, generator=torch.Generator().manual_seed(p))
            with torch.no_grad():  # TransformerLens, every block and position, the same input into block start
                want = model.run_with_hooks(tokens[rows],
                                            fwd=[(hs.site("resid_pre", start), lambda x, hook, hidden=hidden: hidden)])
            got = resume.resume(model, ckpt, start, rows, hidden=hidden, from_pos=p)
            torch.testing.assert_close(got[:, 0], want[:, -1], atol=1e-5, rtol=1e-5)


def test_nothing_resumes_while_other_hooks_are_attached(tiny_models):
    model = tiny_models["llama"]
    assert resume.supports(model).ok
    with hs.ablate(model, heads=[(1, 0)]):
        assert resume.supports(model) == (False, False, False, False, False)
    assert resume.supports(model).ok
