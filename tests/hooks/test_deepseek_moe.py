"""DeepSeek-V3's mixture of experts (review 15d A3, A4, C5): the ungated shared_experts among the memories, the router
described as Hugging Face computes it, and the router sites computed where the bridge has no hook point. tests_support's
"deepseek_v3" in float32 with layer 1 a mixture of experts (first_k_dense_replace=1; 4 routed experts of 16 in 2
groups, 1 group chosen, top-2, routed_scaling_factor 2.5, one shared expert of 16, the choice's bias drawn)."""

import pytest
import torch

import headscope as hs
from tests_support import build_tiny_model, hf_reference, random_tokens

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DeepseekV3ForCausalLM"):
    pytest.skip("transformers without DeepSeek-V3", allow_module_level=True)

MOE = dict(first_k_dense_replace=1, n_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)  # on the family's fields


@pytest.fixture(scope="module")
def dsv3_dir(tmp_path_factory):
    return build_tiny_model("deepseek_v3", tmp_path_factory.mktemp("dsv3") / "dsv3", **MOE)


@pytest.fixture(scope="module")
def dsv3(dsv3_dir):
    return hs.load_model(dsv3_dir, device="cpu"), hf_reference(dsv3_dir)


def _moe_input_output(hf, tokens):
    seen = {}
    handle = hf.model.layers[1].mlp.register_forward_hook(lambda m, a, o: seen.update(x=a[0], out=o))
    with torch.no_grad():
        hf(tokens)
    handle.remove()
    return seen["x"], seen["out"]  # [batch, pos, d_model] each


def test_deepseek_memories_rebuild_the_hf_moe_output_with_the_shared_experts(dsv3):
    """15d A3: DeepSeek's `shared_experts` (plural, no sigmoid gate in HF's DeepseekV3MoE.forward) were left out: 64
    memories, not 80, and the sum of sub-updates missed the shared MLP. Now 4 x 16 routed + 16 shared, the shared ones'
    sub-updates sum to HF's shared_experts(x), and all of them to the MoE block's output, to 1e-5."""
    model, hf = dsv3
    tokens = random_tokens(2, 7, seed=5)
    x, out = _moe_input_output(hf, tokens)
    mem = hs.mlp_memories(model, 1)
    m = hs.capture(model, tokens, [hs.site("mlp_post", 1)])[hs.site("mlp_post", 1)]  # [batch, pos, 80]
    assert m.shape == (2, 7, 80) and mem.expert.tolist() == [e for e in range(5) for _ in range(16)]
    assert hs.hooks.n_memories(model, 1) == 80
    parts = mem.sub_updates(m)  # [batch, pos, 80, d_model]
    with torch.no_grad():
        shared = hf.model.layers[1].mlp.shared_experts(x)
    torch.testing.assert_close(parts[..., mem.expert == 4, :].sum(-2), shared, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(parts.sum(-2), out, atol=1e-5, rtol=1e-5)
    layout = hs.hooks.expert_layout(model, 1)
    assert (layout.shared_width, layout.shared_gated) == (16, False)


def _by_hand(gate, x):
    """DeepSeek-V3's routing from the config and the gate's weights, written out: sigmoid scores; the choice on the
    scores plus the correction bias, within the 1 group (of 2, 2 experts each) whose two biased scores sum highest;
    weights the unbiased scores of the two chosen, renormalised, times 2.5. -> indices [N, 2] (sorted), dense [N, 4]."""
    s = torch.sigmoid(x.reshape(-1, x.shape[-1]).double() @ gate.weight.double().T)  # [N, 4]
    biased = s + gate.e_score_correction_bias.double()
    group = (biased[:, :2].sum(-1) < biased[:, 2:].sum(-1)).long()  # [N]: each group has exactly 2 experts
    chosen = torch.stack([2 * group, 2 * group + 1], -1)  # [N, 2]: top-2 of a 2-expert group is the group
    w = s.gather(1, chosen)
    w = w / w.sum(-1, keepdim=True) * 2.5
    return chosen, torch.zeros_like(s).scatter_(1, chosen, w)


def test_deepseek_router_sites_are_the_routing_hf_computes(dsv3):
    """15d C5: expert_indices and expert_weights were unknown sites on DeepSeek-V3 (README lists them); they are now
    computed from the MLP's input; checked against the routing written out by hand (not HF's router)."""
    model, hf = dsv3
    tokens = random_tokens(2, 7, seed=5)
    x, _ = _moe_input_output(hf, tokens)
    names = [hs.site("expert_indices", 1), hs.site("expert_weights", 1)]
    assert set(names) <= set(hs.available_sites(model))
    acts = hs.capture(model, tokens, names)
    chosen, dense = _by_hand(hf.model.layers[1].mlp.gate, x)
    assert acts[names[0]].shape == (2, 7, 2) and acts[names[1]].shape == (2, 7, 4)
    assert acts[names[0]].reshape(14, 2).sort(-1).values.tolist() == chosen.tolist()
    assert len(set(chosen[:, 0].tolist())) == 2  # the premise: both groups are chosen somewhere
    torch.testing.assert_close(acts[names[1]].reshape(14, 4).double(), dense, atol=1e-5, rtol=1e-5)
    assert torch.allclose(acts[names[1]].sum(-1), torch.full((2, 7), 2.5), atol=1e-5)  # not 1


def test_deepseek_routing_is_described_as_hf_computes_it(dsv3):
    """15d A4: the header said "top-2 whose weights are renormalised to sum to 1"; DeepSeek's weights sum to
    routed_scaling_factor (2.5 here), the scores are sigmoids, the bias decides the choice only, the choice is limited
    to the best topk_group of n_group groups. The layout reads those from the router; the words are checked whole."""
    from headscope.reports.moe_words import layout_clause
    from headscope.reports.plots_mlp import _shared_words, _weights

    model, _ = dsv3
    layout = hs.hooks.expert_layout(model, 1)
    assert (layout.scoring, layout.routed_scaling_factor, layout.n_group, layout.topk_group, layout.choice_bias,
            layout.renormalised) == ("sigmoid", 2.5, 2, 1, True, True)
    experts = {"1": layout.as_dict()}
    routing = ("by sigmoid score plus e_score_correction_bias (for the choice only), within the best 1 of 2 expert "
               "groups; weights: the chosen experts' sigmoid scores renormalised to sum to 1, times "
               "routed_scaling_factor 2.5 (so they sum to 2.5)")
    d_mlp = 128  # layer 0's dense MLP: the family's intermediate_size
    assert layout_clause(experts, 2, d_mlp) == (f"layer 0: dense MLP (128); layer 1: mixture of experts (4 experts x "
                                                f"16, top-2 {routing}, + a shared expert of 16 (ungated))")
    assert _weights(experts) == f" (the router picks its top-k experts {routing})"
    assert _shared_words(experts) == " (the shared expert's: its activation, ungated, on every token)."
    assert "sum to 1)" not in layout_clause(experts, 2, d_mlp)


def test_full_resid_decomposition_expands_the_experts_neurons_as_hf_computes_them(dsv3):
    """16v-C1: cache.get_full_resid_decomposition() raised "'MoEBridge' object has no attribute 'W_out'" on a mixture
    of experts. Now layer 1's neurons are every routed expert's ("L1E{e}N{i}") then the shared expert's ("L1SN{i}"):
    each row checked against the closed form from HF's weights (router weight from the hand routing x silu(x.g_i)
    (x.u_i) x down[:, i]), their sum against HF's MoE output, and the remainder row "bias" is 0 (no biases)."""
    model, hf = dsv3
    tokens = random_tokens(1, 7, seed=11)
    x, out = _moe_input_output(hf, tokens)
    x, out = x[0, -1].double(), out[0, -1].double()  # [d_model] at the last position
    _, cache = hs.run_with_cache(model, tokens)
    stack, labels = cache.get_full_resid_decomposition(pos_slice=-1, return_labels=True)  # [components, 1, d_model]
    moe = hf.model.layers[1].mlp
    _, weights = _by_hand(moe.gate, x[None])  # [1, 4]
    up, down = moe.experts.gate_up_proj.double(), moe.experts.down_proj.double()  # [4, 32, d], [4, d, 16]
    expected = {}
    for e in range(4):
        gate, lin = up[e, :16] @ x, up[e, 16:] @ x  # [16] each
        coef = weights[0, e] * torch.nn.functional.silu(gate) * lin
        expected.update({f"L1E{e}N{i}": coef[i] * down[e, :, i] for i in range(16)})
    sh = moe.shared_experts
    coef = torch.nn.functional.silu(sh.gate_proj.weight.double() @ x) * (sh.up_proj.weight.double() @ x)
    expected.update({f"L1SN{i}": coef[i] * sh.down_proj.weight.double()[:, i] for i in range(16)})
    rows = {label: stack[k, 0].double() for k, label in enumerate(labels)}
    assert [lab for lab in labels if lab.startswith(("L1E", "L1S"))] == list(expected)  # 4 x 16 routed, then 16 shared
    assert sum(lab.startswith("L0N") for lab in labels) == 128  # layer 0: dense, TransformerLens's labels
    torch.testing.assert_close(torch.stack([rows[k] for k in expected]), torch.stack(list(expected.values())),
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(sum(rows[k] for k in expected), out, atol=1e-5, rtol=1e-4)
    assert rows["bias"].abs().max() < 1e-4
