"""Review 19b (GPT-OSS): learned attention sinks (a per-head sink logit in each row's softmax: rows over the keys sum to
less than 1), its mixture of experts (router `router`, transposed interleaved experts with biases and a clamped SwiGLU),
attention biases and YaRN rope scaling, on a random tiny GPT-OSS (2 layers, hidden 32, sinks set non-zero), checked
against Hugging Face's eager module by hand."""
import warnings

import pandas as pd
import pytest
import torch

import headscope as hs
from headscope.analyses.core import contract
from headscope.analyses.kv.analysis import _sink_records, sink_stats
from headscope.analyses.mlp.analysis import NEEDS as MLP_NEEDS
from headscope.hooks.memories import moe_routing
from headscope.models import particulars
from headscope.reports.findings import sink_sentence
from tests_support import N_WORDS, SPECIALS, save_random_checkpoint, word_tokenizer

SINKS = [-1.0, 0.0, 0.5, 1.5]  # per head, both layers


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory):
    from transformers import GptOssConfig

    config = GptOssConfig(vocab_size=len(SPECIALS) + N_WORDS, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                          num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                          max_position_embeddings=64, bos_token_id=2, eos_token_id=3, pad_token_id=1)

    def init(model):  # weights away from their init; the sinks non-zero (HF draws them N(0, 0.02^2))
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.tensor(SINKS))
            elif p.ndim >= 2:
                p.normal_(0, 0.2)
            elif "bias" in name:
                p.normal_(0, 0.1)

    folder = tmp_path_factory.mktemp("gpt_oss")
    hf = save_random_checkpoint(config, folder, word_tokenizer(), init=init)
    hf.config._attn_implementation = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' YaRN factor note on a tiny max_position_embeddings
        return hf.eval(), hs.load_model(folder, device="cpu", dtype="float32")


TOKENS = torch.tensor([[2, 10, 11, 12, 13, 14, 15, 16], [2, 20, 21, 22, 23, 24, 25, 26]])


def test_gpt_oss_particulars_named(tiny_gpt_oss):
    """A2, A3, C3: print(model) and the header name the learned sinks, the 4-expert top-2 MoE with its clamped SwiGLU
    (not "silu, gated"), the attention biases and YaRN rope scaling."""
    _, model = tiny_gpt_oss
    text = repr(model)
    assert "mlp=(4 experts x 16, top-2 renormalised, clamped SwiGLU (limit 7, alpha 1.702, up + 1))" in text
    assert "silu" not in text
    assert "learned_sinks=True (each row's weights over the keys sum to less than 1)" in text
    assert "attention_bias=True" in text and "rope_scaling=YaRN rope scaling (factor 32)" in text
    record = {**vars(model.facts), "learned_sink_share": 0.1234}
    assert particulars.header_words(record) == [
        "learned attention sinks: each row's weights over the keys sum to less than 1 (mean 0.123 of a row on this "
        "data)", "attention biases on q, k, v and the output", "YaRN rope scaling (factor 32)",
        "experts' activation clamped SwiGLU (limit 7, alpha 1.702, up + 1)"]


def test_gpt_oss_patterns_rows_sum_below_one(tiny_gpt_oss):
    """headscope's patterns are HF eager's (sink column dropped), so a row sums to 1 minus the learned sink's share:
    by hand, softmax over [scores, sink] of HF's own q, k."""
    hf, model = tiny_gpt_oss
    with torch.no_grad():
        want = hf(TOKENS, output_attentions=True).attentions
        _, cache = hs.run_with_cache(model, TOKENS)
    for layer in range(2):
        torch.testing.assert_close(cache["pattern", layer], want[layer], atol=1e-5, rtol=1e-5)
    assert bool((torch.cat(want).sum(-1) < 1 - 1e-6).all())  # every row gives the learned sink a share


def test_gpt_oss_kv_sink_baseline_over_the_keys(tiny_gpt_oss):
    """B1: the first token's baseline is the uniform share of the mass that reaches the keys (each row's sum x its
    uniform share, mean over heads and queries), the learned sink's share recorded; by hand from HF eager's
    attentions; and the words name the learned sink apart from the first token."""
    hf, model = tiny_gpt_oss
    norms = pd.DataFrame({"kind": ["key"] * 4, "layer": [0, 0, 1, 1], "position": [0, 1, 0, 1], "norm": [1.0] * 4})
    table = sink_stats(model, TOKENS, norms, n_sink=1)
    with torch.no_grad():
        att = hf(TOKENS, output_attentions=True).attentions
    for layer, window in enumerate([4, None]):
        qs = [q for q in range(1, 8) if window is None or q < window]  # queries that see token 0
        p = att[layer]  # [batch, head, q, k]
        mass = torch.stack([p[:, :, q, 0] for q in qs], -1).mean((1, 2))  # [batch]
        reach = torch.stack([p[:, :, q].sum(-1) for q in qs], -1)  # [batch, head, q]
        share = torch.tensor([1 / min(q + 1, window or 99) for q in qs], dtype=torch.float64)
        base = (reach.double() * share).mean((1, 2))  # [batch]
        row = table.iloc[layer]
        assert row.sink_mass == pytest.approx(float(mass.mean()), abs=1e-5)
        assert row.baseline_mass == pytest.approx(float(base.mean()), abs=1e-5)
        assert row.keys_mass == pytest.approx(float(reach.mean()), abs=1e-5)
        assert row.uniform_share == pytest.approx(float(share.mean()), abs=1e-9)
        assert row.baseline == "keys"
    text = sink_sentence(_sink_records(table), n_sink=1, baseline="keys", windowed=[0])
    k = table.keys_mass.to_numpy()
    assert text.startswith("The model has learned attention sinks (a sink logit per head, not a token), which take "
                           f"part of every row (mean share per layer over the same queries, 95% CI): layer 0 "
                           f"{1 - k[0]:.2f} [")
    assert "its multiple of the uniform share of the mass that reaches the keys" in text


def test_gpt_oss_moe_recognised_and_its_memories_exact_by_hand(tiny_gpt_oss):
    """A1: every layer is a mixture of experts (heads' mixture_of_experts reads moe_layers); its router's choice is
    HF's (top-2 of router logits, softmax over the two: by hand). The memories read GPT-OSS's layout exactly: each
    neuron's coefficient is the router's weight times the clamped SwiGLU of its interleaved (gate, up) pair with
    their biases (written out here, not HF's _apply_gate), and the neurons' writes plus the routed output biases are
    Hugging Face's MoE block output on the same input."""
    hf, model = tiny_gpt_oss
    assert hs.hooks.moe_layers(model) == [0, 1]
    assert hs.hooks.memories_gap(model) is None and contract.model_reasons(MLP_NEEDS, model) == []
    layout = hs.hooks.expert_layout(model, 0)
    assert (layout.n_experts, layout.expert_width, layout.top_k, layout.renormalised) == (4, 16, 2, True)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(0))
    block = hf.model.layers[0].mlp
    router, experts = block.router, block.experts
    with torch.no_grad():
        logits = x @ router.weight.T + router.bias  # [5, 4]
        top, idx = logits.topk(2, dim=-1)
        weights = torch.zeros(5, 4).scatter_(1, idx, torch.softmax(top, -1))
        got = moe_routing(model, 0, x)
        by_hand = []
        for e in range(4):
            gate = x @ experts.gate_up_proj[e][:, 0::2] + experts.gate_up_proj_bias[e][0::2]  # [5, 16]
            up = x @ experts.gate_up_proj[e][:, 1::2] + experts.gate_up_proj_bias[e][1::2]
            g, u = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
            by_hand.append(weights[:, e:e + 1] * (u + 1) * g * torch.sigmoid(1.702 * g))
        by_hand = torch.cat(by_hand, -1)  # [5, 64] expert by expert
        coefficients = hs.hooks.moe_coefficients(model, 0, x)
        memories = hs.hooks.mlp_memories(model, 0)
        out = block(x[None])  # GptOssMLP: (output, router scores)
        hf_out = (out[0] if isinstance(out, tuple) else out)[0]  # [5, 32]
    assert torch.equal(got["expert_indices"].sort(-1).values, idx.sort(-1).values)
    torch.testing.assert_close(got["expert_weights"], weights)
    torch.testing.assert_close(coefficients, by_hand, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(x @ memories.gate_keys.T + memories.gate_key_bias, torch.cat(
        [x @ experts.gate_up_proj[e][:, 0::2] + experts.gate_up_proj_bias[e][0::2] for e in range(4)], -1))
    assert memories.expert.tolist() == [e for e in range(4) for _ in range(16)]
    torch.testing.assert_close(memories.output(coefficients) + memories.routed_bias(weights), hf_out, atol=1e-5, rtol=1e-5)
    res = hs.mlp_memories_analysis(model, layers=(0,))
    assert len(res.df) > 0 and res.summary["mlp_act"] == "clamped SwiGLU (limit 7, alpha 1.702, up + 1)"


def test_gpt_oss_resumed_passes_check_quietly(tiny_gpt_oss):
    """C1: the z shortcut (GPT-OSS's MLP returns (hidden, router_scores)) and the hook-free blocks (eager attention
    with the sink logit) reproduce the full pass, with no warning; patterns on demand come from the bridge (no q/k
    path that would drop the sink)."""
    from headscope.execution import resume
    from headscope.execution.resume_check import _check

    _, model = tiny_gpt_oss
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        support = _check(model)
    assert support.shortcut and support.fast and support.fast_capture
    assert all(block.qk is None for block in resume._fast_plan(model))


def test_scale_note_says_rows_sum_below_one_only_with_learned_sinks():
    """A2: the explorer's and the pattern view's sentence is true per model: "sum to 1" only where rows do."""
    from headscope.reports.explorer_view import SCALE_NOTE, SINKS_SCALE_NOTE, explorer_html, json_for_script
    from headscope.reports.tokens_view import pattern_view

    base = {"format": 1, "n_layers": 1, "n_heads": 1, "examples": [], "scores": {}, "labels": {}}
    assert json_for_script(SINKS_SCALE_NOTE) in explorer_html({**base, "learned_sinks": True}, uid="a")
    assert json_for_script(SCALE_NOTE) in explorer_html(base, uid="b")
    assert json_for_script(SINKS_SCALE_NOTE) not in explorer_html(base, uid="c")
    full = torch.tensor([[1.0, 0.0], [0.25, 0.75]])  # [query, key]: rows sum to 1
    assert "sum to 1)" in pattern_view(full, ["a", "b"]).html and "less than 1" not in pattern_view(full, ["a", "b"]).html
    assert "sum to less than 1" in pattern_view(full * 0.7, ["a", "b"]).html
    # diff read B2: a bfloat16 softmax's rows miss 1 by its rounding (0.998 here), which is no learned sink
    rows = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])  # [query, key]
    rounded = rows.to(torch.bfloat16) * torch.tensor(0.998, dtype=torch.bfloat16)  # 0.99609375 in bfloat16
    assert float(rounded.float().sum(-1).min()) < 1 - 1e-3
    assert "less than 1" not in pattern_view(rounded, ["a", "b", "c"]).html
    assert "sum to less than 1" in pattern_view(rounded * 0.8, ["a", "b", "c"]).html
    # a model's own fact decides where one is given (show_attention(model, prompt, layer=...))
    assert "sum to less than 1" in pattern_view(full, ["a", "b"], sinks=True).html


def test_position_stats_learned_sinks_by_hand():
    """B1 (position): AttentionStats' mass over the keys and its uniform share, on a hand pattern whose rows sum to
    0.8 and 0.5: queries 1, 2 of 3 (n_sink 1): keys (0.8 + 0.5) / 2, baseline (0.8 / 2 + 0.5 / 3) / 2."""
    from headscope.analyses.position.runs import AttentionStats

    pattern = torch.tensor([[0.6, 0.0, 0.0], [0.3, 0.5, 0.0], [0.1, 0.2, 0.2]])[None, None]  # [1, 1, q, k]
    stats = AttentionStats(torch.tensor([[1, 2]]), 3, 1, causal=True, windows=[None], learned_sinks=True)
    stats(0, torch.arange(3), pattern)
    got = stats.tables(1)
    assert float(got["keys"][0, 0, 0]) == pytest.approx((0.8 + 0.5) / 2)
    assert float(got["weighted"][0, 0, 0]) == pytest.approx((0.8 / 2 + 0.5 / 3) / 2)
    assert float(got["sink"][0, 0, 0]) == pytest.approx((0.3 + 0.1) / 2)
    plain = AttentionStats(torch.tensor([[1, 2]]), 3, 1, causal=True, windows=[None])
    plain(0, torch.arange(3), pattern)
    assert "keys" not in plain.tables(1)


def test_budget_dropped_streaming_sweep_said():
    """C2: "window None -> 0" in the provenance, compare and position finding says the streaming sweep did not run."""
    from headscope.reports.compare import _budget_text
    from headscope.reports.plots_position import finding
    from headscope.reports.provenance import STREAMING_DROPPED, _changed_text

    assert _changed_text({"window": [None, 0]}).startswith(
        f"the budget (fitted to this machine's speed measured at the start of the run) changed window default -> 0 "
        f"({STREAMING_DROPPED}); ")
    assert _budget_text({"budget_changed": {"window": [None, 0]}}) == f"window default -> 0 ({STREAMING_DROPPED})"
    assert _budget_text({"budget_changed": {"n_examples": [16, 8]}}) == "n_examples 16 -> 8"
    said = "The streaming sweep (sinks + window against the window alone and the full context) was not run"
    assert said in finding({"budget": {"changed": {"window": [None, 0]}}})
    assert said not in finding({"budget": {"changed": {}}})


def test_kv_sinks_figure_marks_the_learned_sink():
    """B1: kv's sink figure on a learned-sink model: the baseline bar named as over the keys' mass, the learned sink's
    share (1 - keys_mass) marked per layer and inside the y range."""
    import matplotlib

    matplotlib.use("Agg")
    from headscope.reports.plots_kv import plot_sinks

    table = pd.DataFrame({"layer": [0, 1], "sink_mass": [0.19, 0.11], "baseline_mass": [0.2, 0.1],
                          "baseline": ["keys", "keys"], "keys_mass": [0.8, 0.6]})
    ax = plot_sinks(table)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "if uniform over the\nmass reaching the keys" in labels and "learned sink\n(share of a row)" in labels
    line = next(l for l in ax.get_lines() if l.get_label().startswith("learned sink"))
    assert list(line.get_ydata()) == pytest.approx([0.2, 0.4])
    assert ax.get_ylim()[1] >= 0.4


def test_heads_finding_keeps_the_sink_role_apart_from_learned_sinks():
    """A2: on a learned-sink model the heads finding says its sink role is first-token attention, not the learned
    sink; on other models nothing is added."""
    from headscope.reports.heads_words import finding

    said = ("The sink role scores attention on the first token; the model's learned attention sinks (a sink logit per "
            "head, not a token) are apart from it and take part of every row.")
    assert said in finding({"roles": {"sink": []}, "learned_sinks": True, "n_layers": 2})
    assert "learned" not in finding({"roles": {"sink": []}, "n_layers": 2})


def test_explorer_data_names_first_token_and_learned_sink_apart(tiny_gpt_oss):
    """A2: the explorer's grid on a learned-sink model: "first token" (not "sink") and the learned sink's share of a
    row per head, by hand 1 - HF eager's row sums, mean over the queries (to the stored 4 decimals)."""
    from headscope.reports.explorer import FIRST, LEARNED, SINK, attention_explorer_data

    hf, model = tiny_gpt_oss
    data = attention_explorer_data(model, TOKENS[:1])
    assert data["learned_sinks"] is True and SINK not in data["scores"] and FIRST in data["scores"]
    with torch.no_grad():
        att = hf(TOKENS[:1], output_attentions=True).attentions
    for layer in range(2):
        want = (1 - att[layer][0].sum(-1)).mean(-1)  # [head]
        assert data["scores"][LEARNED][layer] == pytest.approx(want.tolist(), abs=1e-3)


def test_gpt_oss_dla_splits_each_moe_block_by_expert_with_its_biases(tiny_gpt_oss):
    """Each example's DLA rows sum to Hugging Face's logit difference (no soft-cap, float32, by hand), and the
    per-expert rows of each block (neurons' writes plus the router's weight times the expert's output bias) sum to its
    mlpN row, which reads the block's own output: without the routed biases they would not. Two experts are routed
    per example and layer (top-2)."""
    from headscope.analyses import circuits
    from headscope.analyses.core.tasks import Task

    hf, model = tiny_gpt_oss
    answers, wrong = torch.tensor([30, 31]), torch.tensor([32, 33])
    task = Task(name="toy", tokens=TOKENS, corrupted_tokens=TOKENS.flip(0), answers=answers, wrong_answers=wrong)
    res = circuits.direct_logit_attribution(model, task)
    dla, experts = res.tables["dla"], res.tables["dla_experts"]
    assert {"mlp0", "mlp1"} <= set(dla.component)
    mlp = dla[dla.kind == "mlp"].set_index(["example", "layer"]).contribution.sort_index()
    split = experts.groupby(["example", "layer"]).contribution.sum().sort_index()
    assert split.to_numpy() == pytest.approx(mlp.to_numpy(), abs=1e-5)
    assert experts.groupby(["example", "layer"]).routed.sum().tolist() == [2] * 4
    with torch.no_grad():
        last = hf(TOKENS).logits[:, -1].double()  # [2, vocab]
    by_hand = (last[[0, 1], answers] - last[[0, 1], wrong]).tolist()
    sums = dla.groupby("example").contribution.sum().sort_index().tolist()
    assert sums == pytest.approx(by_hand, abs=1e-4)
