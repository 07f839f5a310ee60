"""Edge attribution where the bridge fires no hook_mlp_in (reviews 16a/16c A1): BLOOM (its block bridge never
wires the hook) and Cohere (a parallel block, the MLP reading ln1's output). The MLP receivers' scores and
ablations against plain Hugging Face; any failure of the edges keeps the lens and DLA."""
from __future__ import annotations

import copy

import pytest
import torch

import headscope as hs
from headscope.analyses.circuits import edges as E
from headscope.analyses.circuits import faithfulness as F
from headscope.analyses.core.tasks import Task
from tests_support import build_tiny_model, grad_and_ablated, pair_task


@pytest.fixture(scope="module", params=["bloom", "cohere"])
def family(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    if request.param == "bloom":  # the session's BLOOM checkpoint (conftest.py), loaded afresh here
        path = request.getfixturevalue("bloom_model")[1]
    else:
        path = build_tiny_model(request.param, tmp_path_factory.mktemp(request.param) / "m", seed=5)
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return request.param, hs.load_model(str(path), device="cpu"), hf


def _parts(name: str, hf, layer: int):
    """(the attention's output projection, the MLP's output projection, the MLP's norm, the MLP) of HF's `layer`."""
    if name == "bloom":
        b = hf.transformer.h[layer]
        return b.self_attention.dense, b.mlp.dense_4h_to_h, b.post_attention_layernorm, b.mlp
    b = hf.model.layers[layer]
    return b.self_attn.o_proj, b.mlp.down_proj, b.input_layernorm, b.mlp


def hf_mlp_edge(name: str, hf, task: Task, sender: tuple, layer: int) -> tuple[float, float]:
    """(dM/d eps at 0, M at eps = -1) from plain HF: M the mean logit difference of the clean run in which
    `layer`'s MLP alone reads its norm of (x + eps * delta), x the norm's input (BLOOM: post_attention_layernorm's,
    the residual after attention; Cohere: input_layernorm's, the block input), delta the sender's clean-minus-corrupted
    write ((layer, head): the head's slice of the output projection's input times its columns; (layer, None): the
    MLP's output projection's output)."""
    n_heads = hf.config.num_attention_heads if name == "cohere" else hf.config.n_head
    d_head = hf.config.hidden_size // n_heads

    def write(tokens):
        got = {}
        s_layer, head = sender
        attn_out, mlp_out, _, _ = _parts(name, hf, s_layer)
        if head is None:
            handle = mlp_out.register_forward_hook(lambda m, a, out: got.update(w=out))
        else:
            cols = slice(head * d_head, (head + 1) * d_head)
            handle = attn_out.register_forward_pre_hook(lambda m, a: got.update(w=a[0][..., cols] @ m.weight[:, cols].T))
        with torch.no_grad():
            hf(tokens)
        handle.remove()
        return got["w"]

    delta = write(task.tokens) - write(task.corrupted_tokens)  # [b, pos, d]
    _, _, norm, mlp = _parts(name, hf, layer)
    own = copy.deepcopy(norm)  # the MLP's own copy of the norm (on Cohere the heads keep reading the real one)

    def metric(eps):
        seen = {}
        h1 = norm.register_forward_pre_hook(lambda m, a: seen.update(x=a[0]))
        h2 = mlp.register_forward_pre_hook(lambda m, a: (own(seen["x"] + eps * delta), *a[1:]))
        logits = hf(task.tokens).logits[:, -1]
        h1.remove(), h2.remove()
        rows = torch.arange(len(task))
        return (logits[rows, task.answers] - logits[rows, task.wrong_answers]).mean()

    return grad_and_ablated(metric)


def test_mlp_receivers_equal_hugging_face_without_hook_mlp_in(family):
    """The MLP receivers' EAP scores (corrupted-run gradient: the clean run's here, method eap-clean) and the
    clean run with one MLP edge fed its corrupted write, against plain HF (the old code: KeyError
    'blocks.0.hook_mlp_in')."""
    name, model, hf = family
    task = pair_task()
    graph, scores, info = E.edge_scores(model, task, method="eap-clean")
    # a sequential block's heads reach its own MLP; on the parallel block m0 differs only at the corrupted
    # position, which the last layer's MLP there does not pass on to the answer position (gradient 0)
    extra = [((0, 1), 1)] if graph.parallel else [((0, 1), 0), ((0, None), 1)]
    cases = extra + [((0, 2), 1), ((0, 0), 1)]
    keep = torch.ones(len(cases), *graph.reach.shape, dtype=torch.bool) & graph.reach
    for i, ((s_layer, head), layer) in enumerate(cases):
        keep[i, graph.receiver_slices(layer)["mlp"].start, graph.sender_index(s_layer, head)] = False
    ablated = F.circuit_metrics(model, task, graph, keep).mean(1)  # [cases]
    for i, (sender, layer) in enumerate(cases):
        want, want_ablated = hf_mlp_edge(name, hf, task, sender, layer)
        assert abs(want) > 1e-4, (name, sender, layer)
        got = float(scores[graph.receiver_slices(layer)["mlp"].start, graph.sender_index(*sender)])
        assert got == pytest.approx(want, rel=1e-4, abs=1e-7), (name, sender, layer)
        assert float(ablated[i]) == pytest.approx(want_ablated, rel=1e-4, abs=1e-6), (name, sender, layer)


def test_any_edge_failure_keeps_the_lens_and_dla(family, monkeypatch):
    """An unforeseen error in the edges (the old KeyError escaped and lost the whole section): the lens and DLA
    tables stay, and edges_skipped names the failure in one line."""
    def fail(*args, **kwargs):
        raise KeyError("blocks.0.hook_mlp_in")

    monkeypatch.setattr(F, "circuit_discovery", fail)
    result = hs.run_analysis("circuits", family[1], pair_task(), quick=True)
    assert len(result.tables["lens"]) and len(result.tables["dla"]) and "edges" not in result.tables
    assert result.summary["edges_skipped"] == ("edge attribution failed (KeyError: 'blocks.0.hook_mlp_in'); the logit "
                                               "lens and DLA above are unaffected.")
    if family[0] == "cohere":  # the tiny Cohere is at chance on this task, where the finding is one sentence
        return
    from headscope.reports.findings import finding

    assert ("Edge attribution, the circuit's faithfulness and MIB's CPR/CMD were not run: edge attribution failed "
            "(KeyError: 'blocks.0.hook_mlp_in'); the logit lens and DLA above are unaffected.") in finding("circuits",
                                                                                                  result.summary)
