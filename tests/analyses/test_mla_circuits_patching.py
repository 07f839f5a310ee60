"""Circuits (logit lens, DLA), activation patching and attribution on multi-head latent attention (DeepSeek-V3),
each checked against plain Hugging Face with hooks written here (o_proj's input split per head by v_head_dim,
kv_b_proj's and q_b_proj's outputs split per head), never against headscope's own code."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from tests_support import hf_logit_diff, hf_model, two_site_task

N_HEADS, D_V, D_NOPE, D_QK = 4, 16, 12, 20  # tests_support's deepseek_v3: q/k heads 12 + 8 rotary, v heads 16


@pytest.fixture(scope="module")
def mla(deepseek_v3_dir):
    path = deepseek_v3_dir  # the session's one DeepSeek-V3 checkpoint (tests/conftest.py)
    return hs.load_model(str(path), dtype="float32"), hf_model(path).float()


@pytest.fixture(scope="module")
def task():
    return two_site_task(3, 9)  # corrupted at positions 2 and 5


def test_mla_dla_per_head_and_mlp_match_hf(mla, task):
    """Each head's row = its z (o_proj's input columns [16h, 16h + 16)) @ o_proj.weight[:, 16h:16h + 16].T, each
    MLP's = HF's MLP output, the embedding's = embed_tokens, all at the answer position through HF's final RMSNorm
    frozen at its scale there, onto lm_head[answer] - lm_head[wrong]; they sum to HF's logit difference."""
    model, hf = mla
    rec: dict[str, torch.Tensor] = {}
    layers = hf.model.layers

    def keep(name, pre):
        return (lambda mod, args: rec.__setitem__(name, args[0].detach())) if pre else \
            (lambda mod, args, out: rec.__setitem__(name, out.detach()))
    hooks = [(hf.model.embed_tokens, False, keep("embed", False)), (hf.model.norm, True, keep("final", True))]
    for l, layer in enumerate(layers):
        hooks += [(layer.self_attn.o_proj, True, keep(f"z{l}", True)), (layer.mlp, False, keep(f"mlp{l}", False))]
    hf_diff = hf_logit_diff(hf, task.tokens, task, hooks)
    x = rec["final"][:, -1]  # [batch, d_model]: the stream the final norm reads at the answer position
    scale = (x.pow(2).mean(-1, keepdim=True) + hf.model.norm.variance_epsilon).sqrt()  # [batch, 1]
    w_u = hf.lm_head.weight.detach()
    d = (w_u[task.answers] - w_u[task.wrong_answers]) * hf.model.norm.weight.detach()  # [batch, d_model]

    def along(write):  # [batch, d_model] -> [batch]
        return (write / scale * d).sum(-1)

    hand = {"embed": along(rec["embed"][:, -1])}
    for l, layer in enumerate(layers):
        z, w_o = rec[f"z{l}"][:, -1], layer.self_attn.o_proj.weight.detach()  # [batch, 64], [d_model, 64]
        for h in range(N_HEADS):
            cols = slice(D_V * h, D_V * h + D_V)
            hand[f"L{l}H{h}"] = along(z[:, cols] @ w_o[:, cols].T)
        hand[f"mlp{l}"] = along(rec[f"mlp{l}"][:, -1])
    res = hs.direct_logit_attribution(model, task)
    got = res.tables["dla"].pivot(index="example", columns="component", values="contribution")
    for name, value in hand.items():
        torch.testing.assert_close(torch.tensor(got[name].to_numpy()), value, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sum(hand.values()), hf_diff, atol=1e-4, rtol=1e-5)  # nothing else writes (no biases)
    assert res.summary["dla_reconstruction_ok"] and res.summary["dla_final_logit"] == pytest.approx(
        float(hf_diff.mean()), abs=1e-5)


def test_mla_lens_rows_are_hf_states_unembedded(mla, task):
    """The lens at block 1's input is lm_head(norm(HF's layer-1 input)); its final row is HF's own logits."""
    model, hf = mla
    rec = {}
    handle = hf.model.layers[1].register_forward_pre_hook(lambda mod, args: rec.__setitem__("x", args[0].detach()))
    try:
        with torch.no_grad():
            final = hf(task.tokens).logits.float().log_softmax(-1)  # [batch, pos, vocab]
            mid = hf.lm_head(hf.model.norm(rec["x"])).float().log_softmax(-1)
    finally:
        handle.remove()
    lens = hs.logit_lens(model, task).df
    for stage, ref in (("1_pre", mid), ("final_post", final)):
        rows = lens[lens.stage == stage]
        want = ref[torch.tensor(rows.example.to_numpy()), torch.tensor(rows.position.to_numpy()),
                   torch.tensor(rows.target.to_numpy())]
        torch.testing.assert_close(torch.tensor(rows.logprob.to_numpy()), want, atol=1e-5, rtol=1e-5)
    assert len(lens[lens.stage == "final_post"]) == 3 * 8


def test_mla_patching_matches_hf_hooks(mla, task):
    """Denoising: the corrupted run with one clean activation restored, by hand in HF: head_out L1Hh (o_proj's input
    columns [16h, 16h + 16)), v L1H2 (kv_b_proj's output, head 2's v part), q L0H1 (q_b_proj's output, head 1; RoPE
    rotates clean and corrupted alike at one position), resid_pre L1 at position 2 (layer 1's input)."""
    model, hf = mla
    layers = hf.model.layers
    clean = {}
    cap = [(layers[1].self_attn.o_proj, True, lambda m, a: clean.__setitem__("z", a[0].detach())),
           (layers[1].self_attn.kv_b_proj, False, lambda m, a, o: clean.__setitem__("kv", o.detach())),
           (layers[0].self_attn.q_b_proj, False, lambda m, a, o: clean.__setitem__("q", o.detach())),
           (layers[1], True, lambda m, a: clean.__setitem__("resid", a[0].detach()))]
    hf_logit_diff(hf, task.tokens, task, cap)

    def restore(name, view, index):
        def fn(mod, args, out=None):
            x = (args[0] if out is None else out).clone()
            # [batch, pos, ...]: kv_b_proj reads the latent as [batch, 1, pos, rank] on newer transformers
            x.view(x.shape[0], -1, *view)[index] = clean[name].view(x.shape[0], -1, *view)[index]
            return (x,) if out is None else x
        return fn

    hand = {("head_out", 1, h, None): (layers[1].self_attn.o_proj, True, restore("z", (N_HEADS, D_V), (..., h, slice(None))))
            for h in range(N_HEADS)}
    hand[("v", 1, 2, None)] = (layers[1].self_attn.kv_b_proj, False,
                               restore("kv", (N_HEADS, D_NOPE + D_V), (..., 2, slice(D_NOPE, None))))
    hand[("q", 0, 1, None)] = (layers[0].self_attn.q_b_proj, False, restore("q", (N_HEADS, D_QK), (..., 1, slice(None))))
    hand[("resid_pre", 1, None, 2)] = (layers[1], True, restore("resid", (hf.config.hidden_size,), (slice(None), 2)))
    df = hs.activation_patching(model, task, sites=("head_out", "v", "q", "resid_pre")).df
    for (kind, layer, head, pos), hook in hand.items():
        row = df[(df.site_type == kind) & (df.layer == layer) & (df["head"].fillna(-1) == (-1 if head is None else head))
                 & (df["pos"].fillna(-1) == (-1 if pos is None else pos))]
        assert len(row) == 1
        assert row.value.iloc[0] == pytest.approx(float(hf_logit_diff(hf, task.corrupted_tokens, task, [hook]).mean()),
                                                  abs=1e-5), (kind, layer, head, pos)


def test_mla_attribution_gradients_match_hf(mla, task):
    """attribution runs on MLA (review 15d's refusal lifted): gradient x input and saliency at each token = plain
    autograd on HF's inputs_embeds; the attention patterns it reads are HF's own attention weights."""
    model, hf = mla
    res = hs.attribution(model, task, n_steps=2, ig_max_steps=2, n_permutations=2, adversarial_steps=0)
    emb = hf.model.embed_tokens(task.tokens).detach().requires_grad_(True)  # [batch, pos, d_model]
    logits = hf(inputs_embeds=emb, output_attentions=True)
    rows = torch.arange(3)
    diff = logits.logits[rows, -1, task.answers] - logits.logits[rows, -1, task.wrong_answers]
    (grad,) = torch.autograd.grad(diff.sum(), [emb])
    names = [hs.site("pattern", layer) for layer in range(2)]  # what attention, rollout and the permutations read
    patterns = hs.capture(model, task.tokens, names)
    for name, want in zip(names, logits.attentions):
        torch.testing.assert_close(patterns[name], want.detach(), atol=1e-6, rtol=1e-5)
    tok = res.tables["token_scores"]
    for method, want in (("grad_x_input", (grad * emb).sum(-1).abs()), ("saliency", grad.norm(dim=-1))):
        got = tok[tok.method == method].pivot(index="example", columns="position", values="score")
        torch.testing.assert_close(torch.tensor(got.to_numpy(), dtype=torch.float32), want.detach(), atol=1e-5, rtol=1e-4)
