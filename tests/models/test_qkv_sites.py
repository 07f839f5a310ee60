"""hook_q/k/v on OLMoE hold what attention uses per head: after the whole-projection q/k RMSNorm and clip_qkv
(models/qkv_sites.py, review 18c A1/A6). Checked against plain Hugging Face on a tiny random OLMoE whose clamp acts:
the sites equal HF's clamp(q_norm(q_proj(x))), clamp(k_norm(k_proj(x))), clamp(v_proj(x)); patching one head's q
(one KV head's k) equals HF's forward with only that head's slice of the normed, clamped tensor replaced;
attribution's permutation rebuilds the layer's z from the clamped values."""
from __future__ import annotations

import pytest
import torch
import transformers

import headscope as hs
from tests.tests_support import N_WORDS, SPECIALS, normal_matrices, random_tokens, save_random_checkpoint, word_tokenizer

CLIP = 0.6
D_HEAD = 8


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory):
    """(HookedModel, plain HF eager model) of a 2-layer OLMoE: d 32, 4 heads / 2 KV heads, q_norm over 32, k_norm
    over 16, 4 experts x 16 top-2, clip_qkv 0.6, matrices N(0, 0.2^2) so the clamp acts on q, k and v."""
    config = transformers.OlmoeConfig(
        vocab_size=len(SPECIALS) + N_WORDS, bos_token_id=2, eos_token_id=3, pad_token_id=1, tie_word_embeddings=False,
        hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, clip_qkv=CLIP, max_position_embeddings=64)
    folder = tmp_path_factory.mktemp("olmoe") / "m"
    save_random_checkpoint(config, folder, word_tokenizer(), init=normal_matrices(0.2))
    hf = transformers.OlmoeForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    return hs.load_model(str(folder), device="cpu", dtype="float32"), hf


def _hf_qkv(hf, tokens, layer):
    """{q, k, v}: [batch, pos, heads * d_head] as HF's attention uses them (normed, clamped), and the raw q_proj."""
    attn, seen = hf.model.layers[layer].self_attn, {}
    hooks = [attn.q_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("q", o.clamp(-CLIP, CLIP))),
             attn.k_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("k", o.clamp(-CLIP, CLIP))),
             attn.v_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("v", o.clamp(-CLIP, CLIP))),
             attn.q_proj.register_forward_hook(lambda m, i, o: seen.__setitem__("q_raw", o.clone())),
             attn.o_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0].clone()))]
    with torch.no_grad():
        logits = hf(tokens).logits
    for h in hooks:
        h.remove()
    return seen, logits


def test_q_k_v_sites_are_the_normed_clamped_tensors_attention_uses(olmoe):
    model, hf = olmoe
    tokens = random_tokens(2, 9, seed=1)
    acts = hs.capture(model, tokens, [hs.site(k, layer) for k in ("q", "k", "v") for layer in (0, 1)])
    for layer in (0, 1):
        want, _ = _hf_qkv(hf, tokens, layer)
        assert (want["v"].abs() == CLIP).any() and (want["q_raw"].abs() > CLIP).any()  # the clamp acts here
        for kind in ("q", "k", "v"):
            got = acts[hs.site(kind, layer)]  # [batch, pos, head, d_head]
            torch.testing.assert_close(got.reshape(*want[kind].shape), want[kind], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind,n", [("q", 4), ("k", 2)])
def test_patching_one_head_is_that_head_alone(olmoe, kind, n):
    """Review 18c A1: patching one head's q moved every head's query (the norm ran after the hook). Now it equals
    plain HF with only that head's slice of the normed, clamped q (k: KV head) taken from the clean run."""
    model, hf = olmoe
    clean, corrupt = random_tokens(1, 8, seed=2), random_tokens(1, 8, seed=3)
    layer = 1
    acts = hs.capture(model, clean, [hs.site(kind, layer)])
    attn = hf.model.layers[layer].self_attn
    norm = attn.q_norm if kind == "q" else attn.k_norm
    with torch.no_grad():
        source = {}
        grab = norm.register_forward_hook(lambda m, i, o: source.__setitem__("x", o.clone()))
        hf(clean)
        grab.remove()
        for head in range(n):
            lo, hi = head * D_HEAD, (head + 1) * D_HEAD

            def put(m, i, o, lo=lo, hi=hi):
                o = o.clone()
                o[..., lo:hi] = source["x"][..., lo:hi]
                return o

            hook = norm.register_forward_hook(put)
            want = hf(corrupt).logits  # [1, pos, vocab]
            hook.remove()
            with hs.patch(model, acts, hs.site(kind, layer), heads=[head]):
                got = model(corrupt)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_permutation_rebuilds_z_from_the_clamped_values(olmoe):
    """Review 18c A6: the permutation test writes pattern @ v at hook_z; with the identity permutation that is the
    layer's own o_proj input (HF), which needs the clamped v."""
    from headscope.analyses.attribution.permutation import permuted_z, prediction_rows

    model, hf = olmoe
    tokens = random_tokens(2, 7, seed=4)
    for layer in (0, 1):
        _, rows, v, _ = prediction_rows(model, tokens, layer)
        identity = torch.arange(tokens.shape[1]).repeat(2, model.facts.n_heads, 1)  # [batch, head, key]
        z = permuted_z(rows, v, identity)  # [batch, 1, head, d_head]
        want, _ = _hf_qkv(hf, tokens, layer)
        torch.testing.assert_close(z.reshape(2, -1), want["z"][:, -1], atol=1e-6, rtol=0)


def test_path_patching_into_one_head_q_is_that_head_alone(olmoe):
    """Path patching into a receiver's q recomputes that head's query from its own copy of the residual: on OLMoE
    the whole-projection norm and the clamp follow W_Q, so the receiver's query is norm(ln1(resid + delta) @ W_Q)
    [head], clamped, and no other head's query moves (plain HF below: sender L0H1's write changed from the corrupted
    run's to the clean run's, seen by receiver L1Hh's q only)."""
    from headscope.analyses.core.tasks import Task
    from headscope.analyses.patching.path_patching import path_patching

    model, hf = olmoe
    clean, corrupt = random_tokens(2, 6, seed=5), random_tokens(2, 6, seed=6)
    answers, wrong = torch.tensor([10, 20]), torch.tensor([30, 40])
    task = Task(name="toy", tokens=clean, corrupted_tokens=corrupt, answers=answers, wrong_answers=wrong)
    res = path_patching(model, task, [(1, h) for h in range(4)], senders=[(0, 1)], component="q", per_receiver=True,
                        direction="denoise", metric="logit_diff", progress=False)
    a0, layer1 = hf.model.layers[0].self_attn, hf.model.layers[1]
    z = {}
    with torch.no_grad():
        for name, tokens in (("clean", clean), ("corrupt", corrupt)):
            hook = a0.o_proj.register_forward_pre_hook(lambda m, a, name=name: z.__setitem__(name, a[0].clone()))
            hf(tokens)
            hook.remove()
        s = slice(1 * D_HEAD, 2 * D_HEAD)
        delta = (z["clean"][..., s] - z["corrupt"][..., s]) @ a0.o_proj.weight[:, s].T  # [batch, pos, d_model]
        resid = {}
        for head in range(4):
            pre = layer1.register_forward_pre_hook(lambda m, a, kw: resid.__setitem__("x", kw.get("hidden_states",
                                                                                                   a[0] if a else None)),
                                                   with_kwargs=True)

            def put(m, i, o, head=head):
                x = layer1.self_attn.q_proj(layer1.input_layernorm(resid["x"] + delta))
                mine = layer1.self_attn.q_norm.forward(x)  # forward: not through this hook again
                o = o.clone()
                o[..., head * D_HEAD:(head + 1) * D_HEAD] = mine[..., head * D_HEAD:(head + 1) * D_HEAD]
                return o

            hook = layer1.self_attn.q_norm.register_forward_hook(put)
            last = hf(corrupt).logits[:, -1]
            hook.remove()
            pre.remove()
            want = (last[torch.arange(2), answers] - last[torch.arange(2), wrong]).mean().item()
            got = res.df[res.df["receiver"] == f"L1H{head}"]["value"].item()
            assert got == pytest.approx(want, abs=2e-5), head


def test_clip_qkv_is_a_fact_the_header_repr_and_sites_name(olmoe):
    """Review 18c A5/C2: clip_qkv was named nowhere (header, repr, sites, captions)."""
    from headscope.hooks.sites import describe_site
    from headscope.models.attention_layout import attention_words
    from headscope.reports.plots_patching import caption_for

    model, hf = olmoe
    assert model.facts.clip_qkv == hf.config.clip_qkv == CLIP
    assert model.facts.qk_norm == "RMSNorm over all heads"  # q_norm's weight: 32 = 4 heads x 8
    assert "q/k RMSNorm over all heads, q, k, v clamped to +-0.6 (clip_qkv), " in repr(model)
    assert attention_words(None, 8, None, 0.6) == ["q, k, v clamped to +-0.6 (clip_qkv)"]
    after = "after the q/k RMSNorm over all heads and the clamp to +-0.6 (clip_qkv): what attention uses, per head"
    assert describe_site("q", facts=model.facts)[1] == f"queries ({after})"
    assert describe_site("v", facts=model.facts)[1].endswith(
        "(after the clamp to +-0.6 (clip_qkv): what attention uses, per head)")
    assert describe_site("q")[1] == "queries"  # no model: the plain words
    caption = caption_for("exact_q", {"normalized": True, "qkv_sites": {"q": after}})
    assert caption.endswith(f"Site: q. The q site holds each head's tensor {after}, so a cell patches that head alone.")


def test_kv_says_the_clamp_bounds_one_heads_key_norm(olmoe):
    """Review 18c A5: a norm over all KV heads bounds a key's total, and the clamp caps each entry, so one head's
    cached key has norm <= clip x sqrt(d_head) (0.6 x sqrt(8) = 1.70); the cached keys of a plain HF pass obey it,
    and the finding's note says it."""
    import pandas as pd

    from headscope.analyses.kv.analysis import key_norm_record
    from headscope.reports.kv_cache_words import _all_heads_note

    model, hf = olmoe
    record = key_norm_record(model, pd.DataFrame({"kind": [], "layer": [], "norm": []}))
    assert record["per_head"] is False and record["clip_qkv"] == CLIP
    assert record["head_bound"] == pytest.approx(CLIP * D_HEAD ** 0.5)
    with torch.no_grad():
        cache = hf(random_tokens(2, 9, seed=7), use_cache=True).past_key_values
    for layer in range(2):
        keys = cache.layers[layer].keys  # [batch, kv_head, pos, d_head]
        assert float(keys.norm(dim=-1).max()) <= record["head_bound"] + 1e-6
    assert _all_heads_note(record).endswith(
        "can still show a sink. Every key entry is then clamped to +-0.6 (clip_qkv), so one head's key norm is at most "
        "0.6 x sqrt(8) = 1.7.")
