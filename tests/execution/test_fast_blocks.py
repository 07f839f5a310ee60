"""Hook-free blocks (execution/fast_blocks.py) inside resumed passes equal plain Hugging Face and TransformerLens passes."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.execution import fast_blocks, hf_blocks, resume
from tests_support import build_tiny_model, hf_model, random_tokens, zero_head


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    """A tiny random Qwen2 (biases on q, k and v; grouped KV heads), 3 layers."""
    return build_tiny_model("qwen2", tmp_path_factory.mktemp("tiny-qwen2"), seed=3, num_hidden_layers=3)


@pytest.fixture(scope="module")
def neox_seq_dir(tmp_path_factory):
    """A tiny random GPT-NeoX with sequential (not parallel) residual blocks, full rotary."""
    return build_tiny_model("neox", tmp_path_factory.mktemp("tiny-neox-seq"), seed=4, use_parallel_residual=False,
                            rotary_pct=1.0)


@pytest.fixture(scope="module")
def models(tiny_models, qwen2_dir, neox_seq_dir):
    return {"llama": tiny_models["llama"], "gpt2": tiny_models["gpt2"], "qwen2": hs.load_model(qwen2_dir, device="cpu"),
            "neox": tiny_models["neox"], "neox_seq": hs.load_model(neox_seq_dir, device="cpu")}


def _dirs(tiny_dirs, qwen2_dir, neox_seq_dir):
    return {"llama": tiny_dirs["llama"], "gpt2": tiny_dirs["gpt2"], "qwen2": qwen2_dir, "neox": tiny_dirs["neox"],
            "neox_seq": neox_seq_dir}


@pytest.mark.parametrize("family,pos,attention", [
    ("llama", 7, "eager"), ("qwen2", 7, "eager"), ("gpt2", 7, "eager"), ("neox", 7, "eager"), ("neox_seq", 7, "eager"),
    ("llama", 25, "sdpa"), ("gpt2", 25, "sdpa"), ("neox", 25, "sdpa"), ("llama", 25, "eager")])
def test_fast_resume_equals_plain_hf(family, pos, attention, models, tiny_dirs, qwen2_dir, neox_seq_dir, monkeypatch):
    model = models[family]
    assert resume.supports(model).fast
    tokens = random_tokens(3, pos, seed=11)
    limit = 10**9 if attention == "eager" else 0  # every query length through one attention path
    monkeypatch.setattr(fast_blocks, "EAGER_SCORES", limit)
    monkeypatch.setattr(fast_blocks, "EAGER_SCORES_THREADED", limit)
    used = []
    monkeypatch.setattr(fast_blocks, "_eager_attention", lambda *a, f=fast_blocks._eager_attention: used.append(1) or f(*a))
    with torch.no_grad():
        want = hf_model(_dirs(tiny_dirs, qwen2_dir, neox_seq_dir)[family])(tokens).logits  # [3, 7, vocab]
    ckpt = resume.capture(model, tokens)
    rows = torch.tensor([2, 0, 0, 1])
    for start in range(model.facts.n_layers):
        got = resume.resume(model, ckpt, start, rows, fast=True)  # last block: the last query only
        torch.testing.assert_close(got[:, 0], want[rows, -1], atol=1e-5, rtol=1e-5)
        full = resume.resume(model, ckpt, start, rows, fast=True, last_only=False)
        torch.testing.assert_close(full, want[rows], atol=1e-5, rtol=1e-5)
    assert bool(used) == (attention == "eager")


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "neox"])
def test_fast_resume_from_a_position_with_an_edit(family, models):
    """Positions before p from the captured keys and values; checked against TransformerLens
    running every block and position with the same input into block `start`."""
    model = models[family]
    tokens = random_tokens(2, 7, seed=12)
    ckpt = resume.capture(model, tokens, z_layers=range(model.facts.n_layers))
    rows = torch.tensor([1, 0, 1])
    for start in range(model.facts.n_layers):
        for p in (1, 5):
            hidden = ckpt.resid[start][rows].clone()
            hidden[:, p:] += 0.5 * torch.randn(hidden[:, p:].shape, generator=torch.Generator().manual_seed(p))
            with torch.no_grad():
                want = model.run_with_hooks(tokens[rows],
                                            fwd=[(hs.site("resid_pre", start), lambda x, hook, hidden=hidden: hidden)])
            got = resume.resume(model, ckpt, start, rows, hidden=hidden, from_pos=p, fast=True)
            torch.testing.assert_close(got[:, 0], want[:, -1], atol=1e-5, rtol=1e-5)
            assert (got[:, 0] - ckpt.logits[rows]).abs().max() > 1e-4  # the edit mattered


def test_hooked_blocks_keep_the_bridge(models):
    """A block a hook looks at runs through the bridge (the hook fires); the others run hook-free."""
    model = models["qwen2"]
    tokens = random_tokens(2, 6, seed=14)
    ckpt = resume.capture(model, tokens)
    seen = []

    def shift(x, hook):
        seen.append(tuple(x.shape))
        return x + 0.3

    hooks = [(hs.site("resid_pre", 1), shift)]
    with torch.no_grad():
        want = model.run_with_hooks(tokens, fwd=hooks)[:, -1]
    seen.clear()
    got = resume.resume(model, ckpt, 0, torch.arange(2), fwd=hooks, fast=True)
    torch.testing.assert_close(got[:, 0], want, atol=1e-5, rtol=1e-5)
    assert seen == [(2, 6, model.facts.d_model)]


def test_fast_blocks_read_the_live_weights(models):
    """An in-place weight edit after the plan was made is seen (nothing is copied)."""
    model = models["qwen2"]
    assert resume.supports(model).fast
    tokens = random_tokens(2, 6, seed=15)
    o_proj = fast_blocks._raw(fast_blocks._raw(model.bridge.blocks[1]).self_attn.o_proj)
    try:
        with torch.no_grad():
            o_proj.weight.mul_(2.0)
            want = model(tokens)[:, -1]
        got = resume.resume(model, resume.capture(model, tokens), 0, torch.arange(2), fast=True)
    finally:
        with torch.no_grad():
            o_proj.weight.div_(2.0)
    torch.testing.assert_close(got[:, 0], want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert (model(tokens)[:, -1] - want).abs().max() > 1e-3  # the edit mattered


def test_parallel_and_sequential_neox_blocks_take_every_saving(models):
    """GPT-NeoX's parallel blocks (the MLP reads the block's input, not x + attention) and the
    sequential variant: hook-free resumes, capture, last_logits and the z shortcut."""
    assert resume.supports(models["neox"]) == (True, True, True, True, True)
    assert resume.supports(models["neox_seq"]) == (True, True, True, True, True)
    assert models["neox"].bridge.original_model.config.rope_parameters["partial_rotary_factor"] < 1  # partial rotary


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "neox", "neox_seq"])
def test_fast_z_shortcut_equals_editing_hook_z(family, models):
    """A head's z edit entering as o(z'), then the hook-free MLP and blocks (and the last block's
    last query), against TransformerLens zeroing that head in a full pass."""
    model = models[family]
    tokens = random_tokens(2, 6, seed=16)
    ckpt = resume.capture(model, tokens, z_layers=range(model.facts.n_layers))
    rows = torch.tensor([1, 0, 1])

    for start in range(model.facts.n_layers):
        for p in (0, 2):  # head 1 from position p on (from_pos=p: earlier positions unchanged)
            z = zero_head(1, p)(ckpt.z[start][rows], None)
            with torch.no_grad():
                want = model.run_with_hooks(tokens[rows], fwd=[(hs.site("z", start), zero_head(1, p))])[:, -1]
            got = resume.resume(model, ckpt, start, rows, z=z, from_pos=p, fast=True)
            torch.testing.assert_close(got[:, 0], want, atol=1e-5, rtol=1e-5)
            assert (got[:, 0] - ckpt.logits[rows]).abs().max() > 1e-4  # the edit mattered


def test_hooks_attached_outside_switch_the_fast_blocks_off(models):
    """resume(fast=None) decides as supports() would: hooks attached around the call still fire."""
    model = models["llama"]
    assert resume.supports(model).fast
    tokens = random_tokens(2, 6, seed=17)
    ckpt = resume.capture(model, tokens)
    hooks = [(hs.site("resid_pre", 1), lambda x, hook: x + 1.0)]
    with torch.no_grad():
        want = model.run_with_hooks(tokens, fwd=hooks)[:, -1]
    with model.hooks(fwd=hooks):
        got = resume.resume(model, ckpt, 0, torch.arange(2))
    torch.testing.assert_close(got[:, 0], want, atol=1e-5, rtol=1e-5)


def test_half_precision_runs_the_models_own_layers(tiny_dirs):
    """Hugging Face's eager attention does its softmax in float32 between half-precision steps; the
    hand-written blocks would round differently, so they stay off and the model's own layers run
    hook-free instead (hf_blocks; their SDPA rounds within Hugging Face's own bfloat16 error,
    tests/execution/test_hf_blocks.py)."""
    model = hs.load_model(tiny_dirs["llama"], device="cpu", dtype=torch.bfloat16)
    assert fast_blocks.plan(model) is None and hf_blocks.plan(model) is not None


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory):
    """A tiny random Mistral whose sliding window (4) is shorter than the prompts below."""
    return build_tiny_model("mistral", tmp_path_factory.mktemp("tiny-mistral"), seed=4, sliding_window=4)


def test_sliding_window_caches_are_not_reused_past_the_window(mistral_dir):
    """Once a prompt outgrows the window the cache keeps only recent positions: resuming from a
    position recomputes every position instead, and leave-one-out runs full sequences."""
    from headscope.analyses.attribution.methods import leave_one_out
    from headscope.hooks.kv_states import prefix_cache

    model = hs.load_model(mistral_dir, device="cpu")
    tokens = random_tokens(2, 10, seed=18)
    ckpt = resume.capture(model, tokens)
    with pytest.raises(ValueError, match="sliding-window"):
        prefix_cache(model, ckpt.kv, 6)
    rows = torch.tensor([1, 0])
    for fast in (False, True):
        hidden = ckpt.resid[0][rows].clone()
        hidden[:, 6:] += 0.5
        with torch.no_grad():
            want = model.run_with_hooks(tokens[rows], fwd=[(hs.site("resid_pre", 0), lambda x, hook, hidden=hidden: hidden)])
        got = resume.resume(model, ckpt, 0, rows, hidden=hidden, from_pos=6, fast=fast, last_only=False)
        torch.testing.assert_close(got, want[:, 6:], atol=1e-5, rtol=1e-5)
    loo = leave_one_out(model, tokens, [1, 5, 8])
    torch.testing.assert_close(loo, leave_one_out(model, tokens, [1, 5, 8], reuse_prefix=False), atol=1e-5, rtol=1e-5)
    assert loo.abs().max() > 1e-4


@pytest.mark.parametrize("family,pos", [("llama", 7), ("qwen2", 7), ("qwen2", 25), ("gpt2", 7), ("gpt2", 25),
                                        ("neox", 7)])
def test_fast_capture_equals_the_bridge_capture(family, pos, models):
    """The hook-free capture records what the bridge's pass records: block inputs, z, keys and
    values, last-position logits (left-padded rows included)."""
    model = models[family]
    tokens = random_tokens(3, pos, seed=19)
    mask = torch.ones(3, pos, dtype=torch.long)
    mask[1, :2] = 0
    layers = range(model.facts.n_layers)
    slow = resume.capture(model, tokens, z_layers=layers, attention_mask=mask, fast=False)
    quick = resume.capture(model, tokens, z_layers=layers, attention_mask=mask, fast=True)
    assert quick.calls[1] is quick.calls[0] and slow.calls[1] is not slow.calls[0]  # the hook-free path ran
    close = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(quick.logits, slow.logits, **close)
    for i in layers:
        torch.testing.assert_close(quick.resid[i], slow.resid[i], **close)
        torch.testing.assert_close(quick.z[i], slow.z[i], **close)
        torch.testing.assert_close(quick.kv.layers[i].keys, slow.kv.layers[i].keys, **close)
        torch.testing.assert_close(quick.kv.layers[i].values, slow.kv.layers[i].values, **close)


@pytest.mark.parametrize("family,pos", [("llama", 7), ("qwen2", 7), ("gpt2", 7), ("gpt2", 25), ("neox", 7)])
def test_last_logits_with_gated_z_and_gradients_equal_transformer_lens(family, pos, models):
    """The differentiable hook-free pass: z edits per block (gates, and a replacement in one
    layer) against TransformerLens run_with_hooks editing hook_z, values and the gates'
    gradients, with a left-padded row."""
    model = models[family]
    n_layers, n_heads = model.facts.n_layers, model.facts.n_heads
    tokens = random_tokens(3, pos, seed=23)
    mask = torch.ones(3, pos, dtype=torch.long)
    mask[2, :2] = 0
    g = torch.Generator().manual_seed(5)
    gates = torch.rand(3, n_layers, n_heads, generator=g).requires_grad_(True)  # [n, L, H]
    swap = torch.randn(1, pos, n_heads, model.facts.d_head, generator=g)  # layer 0's replacement

    def edited(layer, z):  # gate every head; in layer 0, gate 0 means "swap"
        g_l = gates[:, layer, None, :, None]
        return z * g_l + (1 - g_l) * swap[:, pos - z.shape[1]:] if layer == 0 else z * g_l

    hooks = [(hs.site("z", l), lambda z, hook, l=l: edited(l, z)) for l in range(n_layers)]
    want = model.run_with_hooks(tokens, fwd=hooks, attention_mask=mask)[:, -1]  # [n, d_vocab]
    (want_grad,) = torch.autograd.grad(want[:, 3].sum() - want[:, 5].sum(), [gates])
    got = resume.last_logits(model, tokens, attention_mask=mask, edit_z=edited)
    (grad,) = torch.autograd.grad(got[:, 3].sum() - got[:, 5].sum(), [gates])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, want_grad, atol=1e-5, rtol=1e-4)
    assert grad[:, -1].abs().min() > 0  # the last block's gates reach the output too
    with torch.no_grad():
        plain = model(tokens, attention_mask=mask)[:, -1]
    assert (got - plain).abs().max() > 1e-2  # the edits mattered


def test_mixed_attention_layers_keep_the_bridge_capture(tmp_path):
    """Qwen2 with full attention in layer 0 and sliding windows above: each kind of layer gets its
    own mask, so the hook-free capture (one mask for all) must not run, even though the
    6-token check cannot tell; a 12-token capture equals plain Hugging Face."""
    path = build_tiny_model("qwen2", tmp_path / "qwen2-mixed", seed=5, num_hidden_layers=3, sliding_window=8,
                            max_window_layers=1, use_sliding_window=True)
    model = hs.load_model(path, device="cpu")
    assert len(set(model.bridge.original_model.config.layer_types)) == 2
    resume.supports(model)
    tokens = random_tokens(2, 12, seed=20)
    with torch.no_grad():
        want = hf_model(path)(tokens).logits[:, -1]
    ckpt = resume.capture(model, tokens, fast=True)
    torch.testing.assert_close(ckpt.logits, want, atol=1e-5, rtol=1e-5)
    for start in range(3):
        got = resume.resume(model, ckpt, start, torch.arange(2), fast=True)
        torch.testing.assert_close(got[:, 0], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["qwen2", "gpt2", "neox", "neox_seq"])
def test_resume_mixed_equals_transformer_lens_per_group(family, models):
    """Groups entering at different blocks (one at the last) share one pass; each group's logits
    equal TransformerLens with that group's z edit, from position p on, in a full pass."""
    model = models[family]
    last = model.facts.n_layers - 1
    tokens = random_tokens(2, 7, seed=21)
    ckpt = resume.capture(model, tokens, z_layers=range(last + 1))
    p = 3

    plan = [(last, torch.tensor([1]), 0), (0, torch.tensor([1, 0, 1]), 2), (1, torch.tensor([0]), 3)]
    groups = [(block, rows, zero_head(head, p)(ckpt.z[block][rows], None)) for block, rows, head in plan]
    got = resume.resume_mixed(model, ckpt, groups, from_pos=p)  # [5, 1, vocab], in group order
    at = 0
    for block, rows, head in plan:
        with torch.no_grad():
            want = model.run_with_hooks(tokens[rows], fwd=[(hs.site("z", block), zero_head(head, p))])[:, -1]
        torch.testing.assert_close(got[at:at + len(rows), 0], want, atol=1e-5, rtol=1e-5)
        assert (want - ckpt.logits[rows]).abs().max() > 1e-4  # the edit mattered
        at += len(rows)


@pytest.mark.parametrize("q_len", [1, 4, 7])
def test_blocks_without_a_mask_are_causal(q_len, models):
    """With no attention mask in the call (other attention set-ups) a block attends causally,
    the queries being the last q_len of the keys: as with the explicit 4-d causal mask."""
    model = models["qwen2"]  # 4 query heads on 2 KV heads
    tokens = random_tokens(2, 7, seed=22)
    ckpt = resume.capture(model, tokens, fast=False)
    block = fast_blocks.plan(model)[1]
    kwargs = {k: resume._suffix(v, 7 - q_len, 7, k) for k, v in ckpt.calls[1][1].items()}
    assert kwargs["attention_mask"].shape[-2:] == (q_len, 7)
    past = fast_blocks.past_kv(ckpt.kv, 1, torch.arange(2), 7 - q_len)
    x = ckpt.resid[1][:, 7 - q_len:]
    with torch.no_grad():
        want = block.full(x, (), kwargs, past, False)
        got = block.full(x, (), {**kwargs, "attention_mask": None}, past, False)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_eager_attention_limit_follows_cpu_threads(monkeypatch):
    """One CPU thread: the fused kernel from 400 scores on; with more threads matmul-softmax up to
    2304 (the fused CPU kernel hardly uses the second thread); other devices: the one-thread limit."""
    cpu, meta = torch.device("cpu"), torch.device("meta")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert fast_blocks._eager_limit(cpu) == fast_blocks.EAGER_SCORES == 400
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert fast_blocks._eager_limit(cpu) == fast_blocks.EAGER_SCORES_THREADED == 2304
    assert fast_blocks._eager_limit(meta) == 400
