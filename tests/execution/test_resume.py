"""Resuming a forward pass mid-model equals a full pass (plain HF, or TransformerLens with the same hooks)."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode

import headscope as hs
from headscope.errors import HeadscopeWarning
from headscope.execution import block_shape, resume, resume_check
from tests_support import build_tiny_model, hf_model, random_tokens, zero_head

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


class _BlockRuns(TorchFunctionMode):
    """Runs of each block, however it runs (the bridge's block, a hook-free one, whole, resumed or
    from its attention output on): each multiplies by the block's MLP output weight once. Counts
    torch calls taking that weight (attribute reads aside). A function mode, not a module hook, so
    the model still takes its hook-free paths."""

    def __init__(self, model):
        super().__init__()
        self.block_of = {id(_mlp_out(block)): i for i, block in enumerate(model.bridge.blocks)}
        self.runs = [0] * len(self.block_of)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") != "__get__":
            for arg in (*args, *kwargs.values()):
                if id(arg) in self.block_of:
                    self.runs[self.block_of[id(arg)]] += 1
        return func(*args, **kwargs)


def _mlp_out(block) -> torch.nn.Parameter:
    return block_shape.raw(block_shape.raw(block).mlp.c_proj).weight  # GPT-2's MLP output projection


def test_the_first_call_checks_for_at_most_one_pass_of_block_runs(tmp_path):
    """#31 item 6 on GPT-2 small's depth (12 layers, tiny width): the first model(tokens) pays
    the once-per-model check, which runs at most as many blocks as one plain pass of its prompts
    (a reference through the blocks from its start block on, a few one-block resumes, the hook-free
    replay): 7 of 12 here, 18 when the reference was a whole bridge pass."""
    model = hs.load_model(build_tiny_model("gpt2", tmp_path / "gpt2-12", n_layer=12), device="cpu")
    tokens = random_tokens(2, 6, seed=6)
    with torch.no_grad():
        with _BlockRuns(model) as plain:
            model.bridge_forward(tokens)  # the bridge, no check
        assert plain.runs == [1] * 12  # every block once: the counter sees each run
        with _BlockRuns(model) as first:
            got = model(tokens)  # the check, then the hook-free pass
        with _BlockRuns(model) as second:
            model(tokens)
    assert resume.supports(model).fast_capture  # the check passed and the pass ran hook-free
    assert second.runs == [1] * 12
    check = sum(first.runs) - sum(second.runs)
    assert 0 < check <= sum(plain.runs)
    with torch.no_grad():
        torch.testing.assert_close(got, hf_model(tmp_path / "gpt2-12")(tokens).logits, atol=1e-4, rtol=1e-4)


def test_half_precision_confirms_a_failure_on_other_prompts_and_nan_fails(tiny_dirs, monkeypatch):
    """In bfloat16 a check that fails on the first pair of prompts runs again on a second pair
    before it turns a saving off (rounding can flip a near-tie, such as a mixture of experts'
    choice of expert, by chance): a saving that fails on the first pair only stays on, silently;
    one that fails on both is named once. Its logits here are NaN, which no tolerance accepts."""
    model = hs.load_model(tiny_dirs["llama"], device="cpu", dtype=torch.bfloat16)
    real_reference, real_resume, references = resume_check._reference, resume.resume, []

    def reference(*args):
        references.append(args[1])
        return real_reference(*args)

    def nan_when_hook_free(broken):
        def run(model, ckpt, start, rows, **kwargs):
            out = real_resume(model, ckpt, start, rows, **kwargs)
            return out * float("nan") if kwargs.get("fast") and broken() else out
        return run

    monkeypatch.setattr(resume_check, "_reference", reference)
    monkeypatch.setattr(resume, "resume", nan_when_hook_free(lambda: len(references) == 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        assert resume.supports(model) == (True, True, True, True, True)
    assert len(references) == 2 and not torch.equal(references[0], references[1])  # a second pair of prompts
    monkeypatch.setattr(resume, "resume", nan_when_hook_free(lambda: True))
    monkeypatch.setattr(resume, "_SUPPORT", type(resume._SUPPORT)())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        support = resume.supports(model)
    said = [str(w.message) for w in caught if issubclass(w.category, HeadscopeWarning)]
    assert len(said) == 1 and "hook-free blocks (max |logit difference| nan" in said[0]
    assert support == (True, True, True, False, False)


def test_the_reference_runs_the_whole_pass_where_skipping_blocks_fails(tiny_models, monkeypatch):
    """A model whose loop cannot take a skipped block's input handed on as its output (here: the
    stand-in raises) is checked against the whole pass instead, and every saving still holds."""
    model = tiny_models["llama"]

    def refuse(*args, **kwargs):
        raise RuntimeError("this loop wants more than the hidden states")

    monkeypatch.setattr(resume, "_passed_on", refuse)
    monkeypatch.setattr(resume, "_SUPPORT", type(resume._SUPPORT)())
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        assert resume.supports(model) == (True, True, True, True, True)


@pytest.fixture(scope="module")
def bloom(bloom_model):
    return bloom_model  # the session's tiny BLOOM (conftest.py)


def test_alibi_resumes_for_another_batch_exactly(bloom, monkeypatch):
    """Review 16c C2: BLOOM's alibi [batch x heads, 1, keys] was passed whole to a resumed batch of other rows
    (RuntimeError: [12, 1, 6] against [18, 6, 6]), so the resumed-pass check failed and warned on every run. Now it
    follows its rows: the check passes without a warning, and resumed left-padded rows equal plain HF's logits;
    the z shortcut, whose MLP call lacked BLOOM's `residual` argument, equals HF with head 2 zeroed before dense."""
    model, path = bloom
    monkeypatch.setattr(resume, "_SUPPORT", type(resume._SUPPORT)())  # the shared model's check runs here, not cached
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        assert resume.supports(model)[:3] == (True, True, True)  # resume, z shortcut, from a position (no hook-free blocks)
    hf = hf_model(path)
    tokens = random_tokens(2, 6, seed=6)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # row 0 left-padded: its ALiBi positions differ from row 1's
    with torch.no_grad():
        want = hf(tokens, attention_mask=mask).logits[:, -1]  # [2, vocab]
    ckpt = resume.capture(model, tokens, attention_mask=mask, z_layers=[0, 1])
    rows = torch.tensor([1, 0, 1])
    d_head = hf.config.hidden_size // hf.config.n_head
    for start in range(model.facts.n_layers):
        torch.testing.assert_close(resume.resume(model, ckpt, start, rows)[:, 0], want[rows], atol=1e-5, rtol=1e-5)
        z = ckpt.z[start][rows].clone()
        z[:, :, 2] = 0.0
        dense = hf.transformer.h[start].self_attention.dense
        handle = dense.register_forward_pre_hook(
            lambda m, a: (torch.cat([a[0][..., :2 * d_head], 0 * a[0][..., 2 * d_head:3 * d_head], a[0][..., 3 * d_head:]], -1),))
        with torch.no_grad():
            zeroed = hf(tokens[rows], attention_mask=mask[rows]).logits[:, -1]
        handle.remove()
        got = resume.resume(model, ckpt, start, rows, z=z)[:, 0]
        torch.testing.assert_close(got, zeroed, atol=1e-5, rtol=1e-5)
        assert (zeroed - want[rows]).abs().max() > 1e-4  # the edit mattered
