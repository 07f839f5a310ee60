"""Resumed and hook-free passes on blocks the hand-written ones do not cover (execution/hf_blocks,
execution/block_shape): post-norm OLMo 2, q/k-normed Qwen3, Gemma 3's pre- and post-norms with
local and global layers, and Mixtral's mixture of experts, against plain Hugging Face on
mixed-length, left-padded batches."""
from __future__ import annotations

import pytest
import torch

from headscope.execution import fast_blocks, hf_blocks, resume, resume_check
from tests_support import hf_model, hf_z_edit, left_padded_tokens

ARCHS = ("olmo2", "qwen3", "gemma3", "mixtral")
LENGTHS = (9, 6, 4)  # real tokens per row, left-padded to 9
P = 6  # the patched position (real in every row)


def _padded(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [3, 9] with rows of LENGTHS real tokens, left-padded (pad id 1), and their mask."""
    return left_padded_tokens(LENGTHS, seed=seed)


def _hf_logits(hf, tokens, mask, **kwargs):
    return hf(tokens, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0), **kwargs)


def _replace_at(layer_module, value: torch.Tensor, pos: int):
    """A forward pre-hook on a Hugging Face decoder layer setting its input at `pos` to value [n, d_model]."""
    def hook(module, args):
        x = args[0].clone()
        x[:, pos] = value
        return (x,) + tuple(args[1:])
    return layer_module.register_forward_pre_hook(hook)


@pytest.mark.parametrize("arch", ARCHS)
def test_resumed_passes_with_a_patched_resid_pre_equal_hugging_face(arch, more_arch_models, more_arch_dirs):
    """resid_pre at (layer, position 6) patched from another prompt, resumed at that layer through
    the bridge's blocks and through the model's own hook-free layers, every position, the last
    one, and positions 6.. only (attending to the captured keys before 6), against Hugging Face
    with the same edit made by a hook on its decoder layer."""
    model = more_arch_models(arch)
    support = resume.supports(model)
    assert support.ok and support.shortcut and support.prefix and support.fast
    assert support.fast_capture  # Gemma 3's local and global layers: each its own mask and rotary tables
    assert fast_blocks.plan(model) is None and hf_blocks.plan(model) is not None
    # the check resumes from the last block, or from the earliest that leaves each kind after it
    assert resume_check._check_start(model) == (0 if arch == "gemma3" else model.facts.n_layers - 1)
    hf = hf_model(more_arch_dirs(arch))
    tokens, mask = _padded(seed=1)
    source, _ = _padded(seed=2)
    real = mask.bool()
    with torch.no_grad():
        src_hidden = _hf_logits(hf, source, mask, output_hidden_states=True).hidden_states  # layer l's input at [l]
    ckpt = resume.capture(model, tokens, attention_mask=mask)
    rows = torch.arange(len(LENGTHS))
    for layer in range(model.facts.n_layers):
        handle = _replace_at(hf.model.layers[layer], src_hidden[layer][:, P], P)
        try:
            with torch.no_grad():
                want = _hf_logits(hf, tokens, mask).logits  # [3, 9, vocab]
        finally:
            handle.remove()
        hidden = ckpt.resid[layer].clone()
        hidden[:, P] = src_hidden[layer][:, P]
        for fast in (False, True):
            every = resume.resume(model, ckpt, layer, rows, hidden=hidden, last_only=False, fast=fast)
            torch.testing.assert_close(every[real], want[real], atol=1e-5, rtol=1e-5)
            last = resume.resume(model, ckpt, layer, rows, hidden=hidden, fast=fast)
            torch.testing.assert_close(last[:, 0], want[:, -1], atol=1e-5, rtol=1e-5)
            tail = resume.resume(model, ckpt, layer, rows, hidden=hidden, from_pos=P, last_only=False, fast=fast)
            torch.testing.assert_close(tail, want[:, P:], atol=1e-5, rtol=1e-5)
        assert (want[:, -1] - ckpt.logits).abs().max() > 1e-3  # the patch mattered


@pytest.mark.parametrize("arch", ARCHS)
def test_z_shortcut_and_hook_free_gates_equal_hugging_face(arch, more_arch_models, more_arch_dirs):
    """Head 1 zeroed from position 6 at each layer, entering as the attention output o(z') (the z
    shortcut through the block's own post-norms or experts), and (where the whole pass runs
    hook-free) gates through the differentiable last_logits, value and gradient, against Hugging
    Face editing the input of its attention output projection."""
    model = more_arch_models(arch)
    hf = hf_model(more_arch_dirs(arch))
    tokens, mask = _padded(seed=3)
    ckpt = resume.capture(model, tokens, attention_mask=mask, z_layers=range(model.facts.n_layers))
    rows = torch.tensor([2, 0, 1, 0])
    for layer in range(model.facts.n_layers):
        def zero(at, z, layer=layer):
            if at != layer:
                return z
            z = z.clone()
            z[:, P:, 1] = 0.0
            return z
        with torch.no_grad(), hf_z_edit(hf, zero):
            want = _hf_logits(hf, tokens[rows], mask[rows]).logits[:, -1]
        z = zero(layer, ckpt.z[layer][rows])
        for fast in (False, True):
            got = resume.resume(model, ckpt, layer, rows, z=z, from_pos=P, fast=fast)
            torch.testing.assert_close(got[:, 0], want, atol=1e-5, rtol=1e-5)
        assert (want - ckpt.logits[rows]).abs().max() > 1e-4  # the edit mattered
    if not resume.supports(model).fast_capture:
        return
    gates = torch.linspace(0.2, 1.0, model.facts.n_layers * model.facts.n_heads).view(model.facts.n_layers, -1)

    def gate(layer, z):  # z [n, q, head, d_head]
        return z * gates[layer][None, None, :, None]

    g = gates.clone().requires_grad_(True)
    got = resume.last_logits(model, tokens, attention_mask=mask,
                             edit_z=lambda layer, z: z * g[layer][None, None, :, None])
    got[:, 5].sum().backward()
    g_hf = gates.clone().requires_grad_(True)
    with hf_z_edit(hf, lambda layer, z: z * g_hf[layer][None, None, :, None]):
        want = _hf_logits(hf, tokens, mask).logits[:, -1]
    want[:, 5].sum().backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g.grad, g_hf.grad, atol=1e-5, rtol=1e-4)
    assert g.grad.abs().min() > 0


@pytest.mark.parametrize("arch", ["qwen3", "mixtral", "olmo2"])
def test_bfloat16_passes_stay_within_hugging_faces_own_rounding(arch, more_arch_dirs):
    """bfloat16: the model's own layers run hook-free (SDPA) in the capture, resumed passes (a
    patched resid_pre, every layer) and a plain forward. SDPA rounds differently from Hugging
    Face's eager attention, so the rule is: max |ours - HF bfloat16| <= 2 max |HF bfloat16 - HF
    float32| on the same inputs and edit (two bfloat16 roundings of one float32 computation, each
    as far off as Hugging Face's own)."""
    from transformers import AutoModelForCausalLM

    import headscope as hs

    model = hs.load_model(more_arch_dirs(arch), device="cpu", dtype=torch.bfloat16)
    support = resume.supports(model)
    assert support.ok and support.shortcut and support.prefix and support.fast and support.fast_capture
    hf = {dtype: AutoModelForCausalLM.from_pretrained(more_arch_dirs(arch), attn_implementation="eager",
                                                      dtype=dtype).eval() for dtype in (torch.bfloat16, torch.float32)}
    tokens, mask = _padded(seed=4)
    source, _ = _padded(seed=5)
    real = mask.bool()
    with torch.no_grad():
        src = {d: _hf_logits(h, source, mask, output_hidden_states=True).hidden_states for d, h in hf.items()}
        plain = {d: _hf_logits(h, tokens, mask).logits.float() for d, h in hf.items()}
        ours = model(tokens, attention_mask=mask).float()
    gap = (plain[torch.bfloat16] - plain[torch.float32])[real].abs().max()
    assert (ours - plain[torch.bfloat16])[real].abs().max() <= 2 * gap
    ckpt = resume.capture(model, tokens, attention_mask=mask)
    rows = torch.arange(len(LENGTHS))
    for layer in range(model.facts.n_layers):
        want = {}
        for dtype, h in hf.items():
            handle = _replace_at(h.model.layers[layer], src[dtype][layer][:, P], P)
            try:
                with torch.no_grad():
                    want[dtype] = _hf_logits(h, tokens, mask).logits.float()
            finally:
                handle.remove()
        gap = (want[torch.bfloat16] - want[torch.float32])[real].abs().max()
        assert gap > 0
        hidden = ckpt.resid[layer].clone()
        hidden[:, P] = src[torch.bfloat16][layer][:, P]
        every = resume.resume(model, ckpt, layer, rows, hidden=hidden, last_only=False).float()
        assert (every - want[torch.bfloat16])[real].abs().max() <= 2 * gap
        tail = resume.resume(model, ckpt, layer, rows, hidden=hidden, from_pos=P, last_only=False).float()
        assert (tail - want[torch.bfloat16][:, P:]).abs().max() <= 2 * gap
        assert (want[torch.bfloat16][:, -1] - plain[torch.bfloat16][:, -1]).abs().max() > 4 * gap  # the patch mattered


def test_a_torch_hook_on_a_hugging_face_module_keeps_the_bridge(more_arch_models):
    """The hook-free copies share the Hugging Face modules' weights but not their torch hooks: a
    user's hook on one (here OLMo 2's MLP) sends resumed passes through the bridge, where it fires."""
    model = more_arch_models("olmo2")
    assert resume.supports(model).fast
    tokens, mask = _padded(seed=6)
    ckpt = resume.capture(model, tokens, attention_mask=mask)
    mlp = model.bridge.blocks[1].mlp.original_component
    seen = []
    handle = mlp.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    try:
        hooked = resume.resume(model, ckpt, 1, torch.arange(3))
    finally:
        handle.remove()
    assert len(seen) == 1
    torch.testing.assert_close(resume.resume(model, ckpt, 1, torch.arange(3)), hooked, atol=1e-5, rtol=1e-5)
    assert len(seen) == 1  # hook-free again once it is removed
