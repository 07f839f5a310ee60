"""GPT-J (parallel attention and MLP, a plain TransformerLens AttentionBridge; review 15b): edge attribution
and faithfulness through headscope's own head split, against plain Hugging Face GPTJForCausalLM."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.analyses.circuits import edges as E
from headscope.analyses.circuits import faithfulness as F
from headscope.analyses.core.tasks import Task
from tests_support import build_tiny_model, grad_and_ablated, pair_task


@pytest.fixture(scope="module")
def gptj_dir(tmp_path_factory):
    """A tiny random GPTJForCausalLM whose 1-D parameters (ln weights and biases, MLP and lm_head biases) are
    random too, saved in float32."""
    from transformers import GPTJForCausalLM

    path = build_tiny_model("gptj", tmp_path_factory.mktemp("gptj") / "gptj", seed=3)
    hf = GPTJForCausalLM.from_pretrained(path)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim == 1:
                base = 1.0 if "ln" in name and name.endswith("weight") else 0.0
                p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def gptj(gptj_dir):
    from transformers import GPTJForCausalLM

    hf = GPTJForCausalLM.from_pretrained(gptj_dir, attn_implementation="eager").eval()
    return hs.load_model(str(gptj_dir), device="cpu"), hf


def hf_edge(hf, task: Task, sender: tuple, receiver: tuple):
    """(d M / d eps at 0, M at eps = -1) from plain HF GPT-J and torch hooks: M the mean logit difference of
    the clean run in which the receiver (layer, head, "q"/"k"/"v") reads ln_1(x + eps * delta) through its
    own rows of {q,k,v}_proj ((layer, None, "mlp"): the MLP reads ln_1(x + eps * delta)), delta the sender's
    clean-minus-corrupted write (("input",) the token embedding, (layer, head) z_h @ out_proj's columns of head h)."""
    blocks, dh = hf.transformer.h, hf.config.n_embd // hf.config.n_head

    def write(tokens):
        got = {}
        if sender == ("input",):
            handle = hf.transformer.wte.register_forward_hook(lambda m, a, out: got.update(w=out))
        else:
            layer, head = sender
            proj = blocks[layer].attn.out_proj
            cols = slice(head * dh, (head + 1) * dh)
            handle = proj.register_forward_pre_hook(
                lambda m, a: got.update(w=a[0][..., cols] @ proj.weight[:, cols].T))
        with torch.no_grad():
            hf(tokens)
        handle.remove()
        return got["w"]

    delta = write(task.tokens) - write(task.corrupted_tokens)  # [b, pos, d]
    layer, head, kind = receiver
    block, rows = blocks[layer], slice((head or 0) * dh, ((head or 0) + 1) * dh)
    ln = block.ln_1

    def metric(eps):
        seen = {}
        h1 = ln.register_forward_pre_hook(lambda m, a: seen.update(x=a[0]))  # the block's input x

        def moved():
            return torch.nn.functional.layer_norm(seen["x"] + eps * delta, ln.normalized_shape, ln.weight, ln.bias, ln.eps)

        def swap(m, a, out):
            mine = torch.nn.functional.linear(moved(), m.weight, m.bias)
            out = out.clone()
            out[..., rows] = mine[..., rows]
            return out
        if kind == "mlp":  # GPT-J's MLP reads ln_1 of the block input
            h2 = block.mlp.register_forward_pre_hook(lambda m, a: (moved(),))
        else:
            h2 = getattr(block.attn, f"{kind}_proj").register_forward_hook(swap)
        logits = hf(task.tokens).logits[:, -1]
        h1.remove(), h2.remove()
        rows_ = torch.arange(len(task))
        return (logits[rows_, task.answers] - logits[rows_, task.wrong_answers]).mean()

    return grad_and_ablated(metric)


def test_gptj_edges_equal_hugging_face(gptj):
    """Review 15b A1: edge attribution crashed on GPT-J (TransformerLens refuses use_attn_result for its plain
    AttentionBridge). Each edge's clean-run EAP score is the directional derivative d M / d eps of HF's run with
    the receiver's own input moved by eps times the sender's write difference, and the circuit without that
    one edge is HF's run at eps = -1."""
    model, hf = gptj
    task = pair_task()
    graph, scores, info = E.edge_scores(model, task, method="eap-clean")
    assert graph.parallel  # GPT-J's MLP reads the block input: no same-layer head -> MLP edge
    assert not bool(graph.reach[graph.receivers.index("m1"), graph.sender_index(1, 0)])
    cases = [(("input",), (0, 0, "v")), ((0, 0), (1, 0, "k")), ((0, 3), (1, 0, "v")), ((0, 1), (1, 2, "q")),
             ((0, 3), (1, None, "mlp"))]
    keep = graph.reach[None].repeat(len(cases), 1, 1)
    def receiver(layer, head, kind):
        return graph.receivers.index(f"m{layer}" if kind == "mlp" else f"a{layer}.h{head}.{kind}")

    for i, (s, r) in enumerate(cases):
        keep[i, receiver(*r), 0 if s == ("input",) else graph.sender_index(*s)] = False
    ablated = F.circuit_metrics(model, task, graph, keep).mean(1)  # [cases]
    for i, (s, r) in enumerate(cases):
        want, want_ablated = hf_edge(hf, task, s, r)
        assert abs(want) > 1e-2
        got = float(scores[receiver(*r), 0 if s == ("input",) else graph.sender_index(*s)])
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6), (s, r)
        assert float(ablated[i]) == pytest.approx(want_ablated, rel=1e-4, abs=1e-6), (s, r)
    assert info["metric_clean"] != pytest.approx(float(ablated[2]), abs=1e-3)  # an ablation that moves M


def test_gptj_circuits_report_lens_dla_and_edges(gptj):
    """The whole circuits analysis runs on GPT-J: lens, DLA and the edges (no edges_skipped)."""
    model, _ = gptj
    result = hs.run_analysis("circuits", model, pair_task(), quick=True)
    assert "edges_skipped" not in result.summary
    assert result.summary["edges_parallel_blocks"] is True
    assert len(result.tables["edges"]) and len(result.tables["lens"]) and len(result.tables["dla"])


def test_gptj_bfloat16_patterns_are_the_models_own(gptj_dir):
    """Review 15b A2: GPT-J's attention computes q k^T and the softmax in float32 from bfloat16 q and k; the
    recomputed patterns did it in bfloat16 (up to 0.031 off), and from layer 1 on the hook-free pass's fused
    kernel moved q and k. A pattern-only capture now equals HF eager's bfloat16 output_attentions exactly at
    every layer, and attention_pattern (memory-light) exactly at layer 0."""
    from transformers import GPTJForCausalLM

    model = hs.load_model(str(gptj_dir), device="cpu", dtype="bfloat16")
    hf = GPTJForCausalLM.from_pretrained(gptj_dir, attn_implementation="eager", dtype=torch.bfloat16).eval()
    tokens = torch.randint(10, 60, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(tokens, output_attentions=True).attentions  # per layer [batch, head, q, k] bfloat16
    names = [hs.site("pattern", layer) for layer in range(2)]
    acts = hs.capture(model, tokens, names)
    for layer, name in enumerate(names):
        assert acts[name].dtype == torch.bfloat16
        assert torch.equal(acts[name], want[layer]), layer
    assert torch.equal(hs.attention_pattern(model, tokens, 0), want[0])


def test_gptj_dla_heads_and_attn_bias_equal_a_plain_hf_decomposition(gptj):
    """Review 15b B1: on GPT-J (no attention biases) attn_bias{l} is ln_1's bias through W_V and W_O, moved out of
    the heads' rows as TransformerLens folds it. By hand from plain HF: ln_f's input x at the answer position,
    scale sqrt(var x + eps), direction ln_f.weight * (W_U[answer] - W_U[wrong]); a head's write z_h W_O,h and its
    constant c_h = (ln_1.bias W_V,h) W_O,h, each centred, over the scale, along the direction. The head's row is
    its write less c_h, attn_bias{l} the sum of the c_h; the finding says so in words."""
    from headscope.reports.circuits_words import finding

    model, hf = gptj
    task = pair_task()
    result = hs.direct_logit_attribution(model, task)
    got = result.tables["dla"].set_index(["example", "component"]).contribution
    blocks, dh = hf.transformer.h, hf.config.n_embd // hf.config.n_head
    seen = {}
    handles = [hf.transformer.ln_f.register_forward_pre_hook(lambda m, a: seen.update(x=a[0]))]
    for layer, block in enumerate(blocks):
        handles.append(block.attn.out_proj.register_forward_pre_hook(
            lambda m, a, layer=layer: seen.update({layer: a[0]})))
    with torch.no_grad():
        hf(task.tokens)
        for h in handles:
            h.remove()
        ln_f, w_u = hf.transformer.ln_f, hf.lm_head.weight
        x = seen["x"][:, -1]  # [b, d]
        scale = (x.var(-1, unbiased=False) + ln_f.eps).sqrt()  # [b]
        direction = ln_f.weight * (w_u[task.answers] - w_u[task.wrong_answers])  # [b, d]

        def dla(v):  # [b, d] -> [b]
            return ((v - v.mean(-1, keepdim=True)) / scale[:, None] * direction).sum(-1)

        for layer, block in enumerate(blocks):
            bias_row = 0.0
            for head in range(hf.config.n_head):
                cols = slice(head * dh, (head + 1) * dh)
                w_o = block.attn.out_proj.weight[:, cols]  # [d, dh]
                write = seen[layer][:, -1, cols] @ w_o.T  # [b, d]
                const = (block.ln_1.bias @ block.attn.v_proj.weight[cols].T) @ w_o.T  # [d]
                want = dla(write - const)
                bias_row = bias_row + dla(const.expand_as(write))
                for i in range(len(task)):
                    assert float(got[i, f"L{layer}H{head}"]) == pytest.approx(float(want[i]), rel=1e-4, abs=1e-5)
            assert float(bias_row.abs().max()) > 1e-2
            for i in range(len(task)):
                assert float(got[i, f"attn_bias{layer}"]) == pytest.approx(float(bias_row[i]), rel=1e-4, abs=1e-5)
    assert result.summary["dla_attn_bias_parts"] == {"value": ["ln1's bias through W_V"], "b_O": False}
    assert ("Each head's row leaves out its position-independent value term (ln1's bias through W_V, then W_O), which "
            "is in its layer's attn_bias row alone (the attention has no output bias: attn_bias is not a bias of the "
            "attention), as TransformerLens's fold_ln and fold_value_biases place it: a head's row is not its whole "
            "write z_h W_O (what zeroing the head removes).") in finding(result.summary)


def test_an_edge_failure_keeps_the_lens_and_dla(gptj, monkeypatch):
    """Review 15b A1: TransformerLens's NotImplementedError in the edges lost the whole circuits section; now the
    lens and DLA tables stay and edges_skipped gives the reason in one line."""
    from headscope.analyses.circuits import faithfulness

    def refuse(*args, **kwargs):
        raise NotImplementedError("use_attn_result: none of this model's attention bridges support the requested "
                                  "fine-grained attention hook. Found attention classes: ['AttentionBridge'].")

    monkeypatch.setattr(faithfulness, "circuit_discovery", refuse)
    result = hs.run_analysis("circuits", gptj[0], pair_task(), quick=True)
    assert len(result.tables["lens"]) and len(result.tables["dla"]) and "edges" not in result.tables
    reason = ("TransformerLens cannot give this model's edge hooks (use_attn_result: none of this model's attention "
              "bridges support the requested fine-grained attention hook); the logit lens and DLA above are unaffected.")
    assert result.summary["edges_skipped"] == reason


def test_gptj_bfloat16_memory_light_patterns_measured_against_hf_eager(gptj_dir):
    """Review 15b verify C1: the docstring said attention_pattern stays "within Hugging Face's own bfloat16 rounding";
    at layers 1-2 it was 0.0078 / 0.0156 off HF eager's bfloat16 pattern. What hooks/patterns.py now says, measured
    against HF eager at every layer: layer 0 equal (reduce_patterns' float32 softmax to half a bfloat16 step); each
    layer's distance from HF's float32 pattern at most 1.5 times HF's own bfloat16 pattern's distance from it (both
    bfloat16 roundings), for attention_pattern and reduce_patterns alike."""
    from transformers import GPTJForCausalLM

    from headscope.hooks.patterns import reduce_patterns

    model = hs.load_model(str(gptj_dir), device="cpu", dtype="bfloat16")
    tokens = torch.randint(10, 60, (2, 24), generator=torch.Generator().manual_seed(2))
    want = {}
    for dtype in (torch.bfloat16, torch.float32):
        hf = GPTJForCausalLM.from_pretrained(gptj_dir, attn_implementation="eager", dtype=dtype).eval()
        with torch.no_grad():
            want[dtype] = [a.float() for a in hf(tokens, output_attentions=True).attentions]  # [batch, head, q, k]
    reduced = {}
    reduce_patterns(model, tokens, lambda layer, rows, p: reduced.__setitem__(layer, p.float()))
    for layer in range(model.facts.n_layers):
        own = (want[torch.bfloat16][layer] - want[torch.float32][layer]).abs().max()
        light = hs.attention_pattern(model, tokens, layer).float()
        if layer == 0:  # reduce_patterns hands on the float32 softmax: HF's bfloat16 one to half a bfloat16 step
            assert torch.equal(light, want[torch.bfloat16][0])
            assert torch.allclose(reduced[0], want[torch.bfloat16][0], rtol=0, atol=2 ** -9)
        for got in (light, reduced[layer]):
            assert (got - want[torch.float32][layer]).abs().max() <= 1.5 * own, layer
