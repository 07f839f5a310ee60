"""Falcon-7B's layout (review 17b A1, A2): multi-query attention (1 KV head), attention and MLP in parallel on one
LayerNorm, rotary, and `mlp_output += attention_output` in place. Resumed passes, the hook-free blocks, the heads'
ablation sweep and exact patching, each against plain Hugging Face with hooks written here."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.execution import hf_blocks, resume
from tests_support import build_tiny_model, hf_logit_diff, hf_model, random_tokens, two_site_task

N_HEADS, D_HEAD = 4, 16  # tests_support's "falcon": d_model 64, 4 query heads, 1 KV head


@pytest.fixture(scope="module")
def falcon(tmp_path_factory):
    path = build_tiny_model("falcon", tmp_path_factory.mktemp("falcon") / "falcon", seed=1)
    return hs.load_model(str(path), device="cpu"), hf_model(path)


@pytest.fixture(scope="module")
def task():
    return two_site_task(4, 8)  # corrupted at positions 2 and 5


def test_falcon_resumed_and_hook_free_passes_equal_hugging_face(falcon):
    """Resumed from each block, through the bridge's blocks and the model's own hook-free layers, every position
    and the last one only (the last block's MLP and attention output cut to the last position), against plain HF;
    the hook-free copy of each layer runs its own output projection (TransformerLens patches the layer's forward
    on the instance, which a shallow copy kept bound to the bridge's layer: its z never reached the copy, A1)."""
    model, hf = falcon
    assert resume.supports(model).fast
    tokens = random_tokens(2, 7, seed=3)
    with torch.no_grad():
        want = hf(tokens).logits  # [2, 7, vocab]
    ckpt = resume.capture(model, tokens, z_layers=[0, 1])
    rows = torch.arange(2)
    for start in range(model.facts.n_layers):
        for fast in (False, True):
            torch.testing.assert_close(resume.resume(model, ckpt, start, rows, fast=fast)[:, 0], want[:, -1],
                                       atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(resume.resume(model, ckpt, start, rows, fast=fast, last_only=False), want,
                                       atol=1e-5, rtol=1e-5)
    plans = hf_blocks.plan(model)
    args, kwargs = ckpt.calls[1]
    got = plans[1].record(ckpt.resid[1], *resume._with_cache(args, kwargs, None))
    assert got is not None  # the copy's own output projection saw z
    torch.testing.assert_close(got[1], ckpt.z[1], atol=1e-5, rtol=1e-5)  # [2, 7, head, d_head]


def test_falcon_hook_free_pass_equals_hugging_face(falcon):
    """The whole pass through the hook-free layers (model(tokens) with no hook attached: attribution's and kv's
    passes), which the bridge calls with output_attentions=True: the copy must not take Falcon's eager branch
    (it adds the attention mask, None where only causal), against plain HF."""
    from headscope.execution import hook_free

    model, hf = falcon
    tokens = random_tokens(2, 7, seed=5)
    with torch.no_grad():
        want = hf(tokens).logits
        got = hook_free.hook_free_pass(model, tokens, None)
        assert got is not None
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(tokens), want, atol=1e-5, rtol=1e-5)


def test_falcon_head_ablation_sweep_equals_hugging_face(falcon, task):
    """head_importance's zero-ablation sweep (the resumed, hook-free sweep: resume_mixed) against HF with head h's
    16 input columns of self_attention.dense zeroed: effect = clean mean logit difference - ablated one."""
    model, hf = falcon
    assert resume.supports(model).fast and resume.supports(model).shortcut  # the fast sweep, not a fallback
    base = hf_logit_diff(hf, task.tokens, task).mean()
    df = hs.head_importance(model, task, methods=("zero",)).df
    for layer in range(2):
        for head in range(N_HEADS):
            def zero(mod, args, head=head):
                z = args[0].clone()
                z[..., head * D_HEAD:(head + 1) * D_HEAD] = 0.0
                return (z,)
            dense = hf.transformer.h[layer].self_attention.dense
            want = float(base - hf_logit_diff(hf, task.tokens, task, [(dense, True, zero)]).mean())
            got = df[(df.layer == layer) & (df["head"] == head) & (df.method == "zero")].importance
            assert len(got) == 1 and got.iloc[0] == pytest.approx(want, abs=1e-5), (layer, head)


def test_falcon_patching_cells_equal_hugging_face(falcon, task):
    """Denoising (the corrupted run with one clean activation restored), by hand in HF: head_out LlHh (dense's input
    columns of head h), attn_out and mlp_out at the last position and at position 2 (self_attention's and mlp's
    outputs; the clean mlp output cloned before Falcon's in-place add changes it), resid_pre at position 2."""
    model, hf = falcon
    layers = hf.transformer.h
    clean: dict = {}

    def keep(name, pre):
        if pre:
            return lambda m, a: clean.__setitem__(name, a[0].detach().clone())
        return lambda m, a, o: clean.__setitem__(name, (o[0] if isinstance(o, tuple) else o).detach().clone())

    cap = [(layers[1].self_attention.dense, True, keep("z1", True)), (layers[0].self_attention.dense, True, keep("z0", True)),
           (layers[1].self_attention, False, keep("attn1", False)), (layers[1].mlp, False, keep("mlp1", False)),
           (layers[0].mlp, False, keep("mlp0", False)), (layers[1], True, keep("resid1", True))]
    hf_logit_diff(hf, task.tokens, task, cap)

    def restore(name, index, pre):
        def fn(mod, args, out=None):
            x = (args[0] if pre else (out[0] if isinstance(out, tuple) else out)).clone()
            x[index] = clean[name][index]
            if pre:
                return (x,) + tuple(args[1:])
            return (x,) + tuple(out[1:]) if isinstance(out, tuple) else x
        return fn

    def cols(head):
        return (..., slice(head * D_HEAD, (head + 1) * D_HEAD))

    hand = {("head_out", 1, h, None): (layers[1].self_attention.dense, True, restore("z1", cols(h), True))
            for h in range(N_HEADS)}
    hand[("head_out", 0, 2, None)] = (layers[0].self_attention.dense, True, restore("z0", cols(2), True))
    for pos in (2, 6):
        hand[("attn_out", 1, None, pos)] = (layers[1].self_attention, False, restore("attn1", (slice(None), pos), False))
        hand[("mlp_out", 1, None, pos)] = (layers[1].mlp, False, restore("mlp1", (slice(None), pos), False))
        hand[("mlp_out", 0, None, pos)] = (layers[0].mlp, False, restore("mlp0", (slice(None), pos), False))
    hand[("resid_pre", 1, None, 2)] = (layers[1], True, restore("resid1", (slice(None), 2), True))
    df = hs.activation_patching(model, task, sites=("head_out", "attn_out", "mlp_out", "resid_pre")).df
    for (kind, layer, head, pos), hook in hand.items():
        row = df[(df.site_type == kind) & (df.layer == layer) & (df["head"].fillna(-1) == (-1 if head is None else head))
                 & (df["pos"].fillna(-1) == (-1 if pos is None else pos))]
        assert len(row) == 1
        want = float(hf_logit_diff(hf, task.corrupted_tokens, task, [hook]).mean())
        assert row.value.iloc[0] == pytest.approx(want, abs=1e-5), (kind, layer, head, pos)


def test_resume_mixed_runs_the_bridge_block_where_a_hook_free_one_declines(falcon, monkeypatch):
    """A hook-free block that declines its arguments (full -> None) is run by the bridge's block instead (was a
    ConfigError, the user-error class, exit 2: review 17b A1); the logits equal plain HF with the edit by hand."""
    model, hf = falcon
    assert resume.supports(model).fast
    tokens = random_tokens(2, 7, seed=4)
    ckpt = resume.capture(model, tokens, z_layers=[0])
    plans = resume._fast_plan(model)
    monkeypatch.setitem(resume._FAST, model, [plans[0], plans[1]._replace(full=lambda *args, **kwargs: None)])
    z = ckpt.z[0].clone()
    z[:, :, 3] = 0.0  # head 3 of layer 0 zeroed at every position
    got = resume.resume_mixed(model, ckpt, [(0, torch.arange(2), z)])  # [2, 1, vocab]

    def zero(mod, args):
        x = args[0].clone()
        x[..., 3 * D_HEAD:4 * D_HEAD] = 0.0
        return (x,)
    handle = hf.transformer.h[0].self_attention.dense.register_forward_pre_hook(zero)
    try:
        with torch.no_grad():
            want = hf(tokens).logits[:, -1]
    finally:
        handle.remove()
    torch.testing.assert_close(got[:, 0], want, atol=1e-5, rtol=1e-5)


def test_the_explorer_says_all_query_heads_share_the_one_kv_head(falcon):
    """Review 17b C4: "4 query heads share each of 1 KV heads" under multi-query attention; the note now reads as
    below, grouped-query gets its own sentence, and multi-head attention none."""
    from headscope.reports.explorer import attention_explorer_data, kv_note

    data = attention_explorer_data(falcon[0], ["w1 w2 w3"])
    assert data["n_kv_heads"] == 1
    assert data["kv_note"] == "Grouped by KV head: all 4 query heads share one K/V head (multi-query)."
    assert kv_note(6, 2) == "Grouped by KV head: each of the 2 K/V heads is shared by 3 query heads (grouped-query)."
    assert kv_note(4, 4) is None
