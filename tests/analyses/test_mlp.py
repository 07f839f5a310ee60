"""The mlp analysis: sub-updates, streamed trigger examples and value projections against plain
Hugging Face computations, agreement by hand, GELU (GPT-2) and gated (Llama) MLPs."""
from __future__ import annotations

import functools

import pandas as pd
import pytest
import torch

from headscope.analyses.core.tasks import Task
from headscope.analyses.mlp import analysis as mlp
from headscope.analyses.mlp.topk_stream import StreamingTopK
from tests_support import hf_model, random_tokens

HF_MLP = {"gpt2": lambda hf, l: (hf.transformer.h[l].mlp, hf.transformer.h[l].mlp.c_proj),
          "llama": lambda hf, l: (hf.model.layers[l].mlp, hf.model.layers[l].mlp.down_proj)}


@functools.cache
def _hf(path):
    return hf_model(path)


def _hf_mlp_run(family, path, tokens, layer):
    """HF's MLP output and its coefficients (the input of the output projection): [batch, pos, ...]."""
    hf = _hf(path)
    module, proj = HF_MLP[family](hf, layer)
    seen = {}
    h1 = module.register_forward_hook(lambda m, a, o: seen.setdefault("out", o))
    h2 = proj.register_forward_pre_hook(lambda m, a: seen.setdefault("coef", a[0]))
    with torch.no_grad():
        hf(tokens)
    h1.remove(), h2.remove()
    return seen["out"], seen["coef"]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_sum_of_sub_updates_reproduces_the_hf_mlp_output(family, tiny_dirs, tiny_models):
    model, tokens = tiny_models[family], random_tokens(3, 8, seed=2)
    out, coef = _hf_mlp_run(family, tiny_dirs[family], tokens, layer=1)
    m, updates = mlp.sub_updates_at(model, tokens, layer=1, position=-1)
    assert updates.shape == (3, model.facts.d_mlp, model.facts.d_model)
    assert (m - coef[:, -1]).abs().max().item() <= 1e-4
    rebuilt = updates.sum(1) + mlp.hooks.mlp_memories(model, 1).out_bias  # [batch, d_model]
    assert (rebuilt - out[:, -1]).abs().max().item() <= 1e-4


def _wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score 95% interval, closed form (z = 1.959964)."""
    z = 1.959964
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def test_answer_promoting_updates_are_counted_and_the_finding_states_their_wilson_interval(tiny_dirs, tiny_models):
    """#34: the summary records how many top task updates the answer-promoting share is over and how many
    promote the answer; both recomputed from plain Hugging Face weights and activations (coefficients at the
    last position, ||m_i v_i||, the top 2 updates' 3 promoted tokens through lm_head), and the finding
    carries the Wilson 95% interval of that count in closed form. The answers of examples 0 and 1 are the
    tokens their largest layer-1 update promotes most, so the count is not 0. Review 8a A2: the updates holding
    the answer only, the wrong answer only and both, counted by hand from the same HF top tokens (example 1's
    wrong answer is its top update's second token, example 2's its first), are recorded and stated."""
    from headscope.reports.findings import finding

    family, n_top, top_k = "gpt2", 2, 3
    model, hf = tiny_models[family], _hf(tiny_dirs[family])
    tokens = random_tokens(4, 7, seed=11)
    w_u = hf.lm_head.weight.detach().T  # [d_model, d_vocab]
    promoted = {}  # (example, layer) -> [n_top, top_k] token ids, from HF alone
    for layer in range(model.facts.n_layers):
        _, proj = HF_MLP[family](hf, layer)
        values = proj.weight.detach()  # [d_mlp, d_model]
        coef = _hf_mlp_run(family, tiny_dirs[family], tokens, layer)[1][:, -1]  # [batch, d_mlp]
        order = (coef.abs() * values.norm(dim=-1)).topk(n_top, -1).indices  # [batch, n_top]
        for b in range(4):
            promoted[b, layer] = ((coef[b, order[b], None] * values[order[b]]) @ w_u).topk(top_k, -1).indices
    answers = tokens[:, 2].clone()
    answers[0], answers[1] = promoted[0, 1][0, 0], promoted[1, 1][0, 0]
    wrong = tokens[:, 3].clone()  # review 8a A2: example 1's wrong answer beside its answer, example 2's alone
    wrong[1], wrong[2] = promoted[1, 1][0, 1], promoted[2, 1][0, 0]
    task = Task(name="rand", tokens=tokens, answers=answers, wrong_answers=wrong)
    result = mlp.mlp_memories_analysis(model, task, mlp.MLPConfig(top_k_triggers=2, n_top_neurons=3, chunk_size=4,
                                                                  n_top_updates=n_top, top_k_tokens=top_k),
                                       corpus=[random_tokens(6, 8, seed=12)])
    s = result.summary
    n = 4 * model.facts.n_layers * n_top
    k = sum(int((row == answers[b]).any()) for (b, _), rows in promoted.items() for row in rows)  # updates promoting
    assert s["n_task_updates"] == n and s["n_task_updates_promoting"] == k >= 2 and s["n_task_examples"] == 4
    assert s["answer_promoted_fraction"] == pytest.approx(k / n)
    held = [(bool((row == answers[b]).any()), bool((row == wrong[b]).any()))  # (answer, wrong answer) in top_k
            for (b, _), rows in promoted.items() for row in rows]
    only, reverse, both = (sum(h == want for h in held) for want in ((True, False), (False, True), (True, True)))
    assert (s["n_task_updates_answer_only"], s["n_task_updates_wrong_only"], s["n_task_updates_both"]) == (
        only, reverse, both) and both >= 1 and reverse >= 1 and s["top_k_tokens"] == top_k
    d_mlp = model.facts.d_mlp  # a dense MLP: its memories are its d_mlp neurons (HF's c_fc width)
    assert s["experts_per_layer"] == {} and s["mixture_of_experts"] is False
    assert s["values_through_post_norm"] is False  # GPT-2's MLP writes into the residual as it is (review 8b C7)
    assert s["n_memories_per_layer"] == {str(l): d_mlp for l in range(model.facts.n_layers)} == {
        str(l): hf.transformer.h[l].mlp.c_fc.weight.shape[1] for l in range(model.facts.n_layers)}
    assert s["agreement_count_per_layer"] == {str(l): int(result.df[result.df.layer == l].agrees.sum())
                                              for l in range(model.facts.n_layers)}
    assert all(s["agreement_per_layer"][l] == pytest.approx(c / d_mlp) for l, c in s["agreement_count_per_layer"].items())
    from scipy.stats import fisher_exact  # each layer against its own control, on the recorded counts

    control = s["agreement_shuffled_count_per_layer"]
    assert s["agreement_tests"]["control_p_per_layer"] == pytest.approx(
        {l: fisher_exact([[c, d_mlp - c], [control[l], d_mlp - control[l]]])[1]
         for l, c in s["agreement_count_per_layer"].items()})
    lo, hi = _wilson(only, n)
    text = finding("mlp", s)
    best = max(s["agreement_count_per_layer"].items(), key=lambda kv: kv[1])
    assert f"({best[1]} of {d_mlp} neurons, Wilson 95% CI" in text and "expert" not in text and "post-MLP" not in text
    assert (f"Of the {n} largest task updates, {only} ({100 * only / n:.0f}%, Wilson 95% CI {100 * lo:.0f}%-"
            f"{100 * hi:.0f}%) put the answer and not the wrong answer among their top {top_k} promoted tokens") in text
    assert f"{reverse} ({100 * reverse / n:.0f}%, Wilson 95% CI" in text and f"the reverse, {both} both" in text
    assert f"top {n_top} per example and layer over 4 task examples" in text


def test_streaming_topk_equals_a_full_sort():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 103, generator=g)  # 6 rows, 103 items
    running = StreamingTopK(5, 6)
    for start in range(0, 103, 7):
        running.update(scores[:, start:start + 7], torch.arange(start, min(start + 7, 103)))
        assert running.values.shape[1] == running.ids.shape[1] == min(5, start + 7)  # never more than k kept
    expected, order = scores.sort(dim=1, descending=True)
    assert torch.equal(running.values, expected[:, :5]) and torch.equal(running.ids, order[:, :5])
    assert running.n_seen == 103
    with pytest.raises(ValueError, match="per column"):
        running.update(scores[:, :3], torch.arange(2))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_streamed_trigger_examples_equal_a_full_sort_of_hf_coefficients(family, tiny_dirs, tiny_models):
    model = tiny_models[family]
    corpus = [random_tokens(7, 9, seed=3), random_tokens(5, 6, seed=4)]  # two lengths
    trig = mlp.trigger_examples(model, corpus, k=4, chunk_size=3, min_position=1)
    streamed = mlp.trigger_examples(model, (b for b in corpus), k=4, chunk_size=5)  # a generator, other chunks
    for layer in range(2):
        coef = torch.zeros(12, 9, model.facts.d_mlp)  # HF coefficients of every (row, position)
        for offset, batch in ((0, corpus[0]), (7, corpus[1])):
            c = _hf_mlp_run(family, tiny_dirs[family], batch, layer)[1]  # [rows, pos, d_mlp]
            coef[offset:offset + batch.shape[0], :batch.shape[1]] = c
        prefixes = [(r, p) for r in range(12) for p in range(1, (9 if r < 7 else 6) - 1)]
        flat = torch.stack([coef[r, p] for r, p in prefixes], dim=1)  # [d_mlp, n_prefixes]
        assert trig.n_prefixes == len(prefixes) == 7 * 7 + 5 * 4
        # the streamed top-4 values are the full sort's first 4 ...
        assert (trig.coefficients[layer] - flat.sort(dim=1, descending=True).values[:, :4]).abs().max().item() <= 1e-4
        # ... and each returned prefix really has that coefficient (ties: identical prefixes may swap)
        neuron = torch.arange(model.facts.d_mlp)[:, None]
        for t in (trig, streamed):
            assert (coef[t.row[layer], t.position[layer], neuron] - t.coefficients[layer]).abs().max().item() <= 1e-4
        ids = trig.row[layer] * 9 + trig.position[layer]
        assert all(len(set(row.tolist())) == 4 for row in ids)
        assert set(trig.position[layer].flatten().tolist()) <= set(range(1, 8))
    rows = torch.cat([corpus[0], torch.nn.functional.pad(corpus[1], (0, 3))])
    for layer in range(2):
        assert torch.equal(trig.next_token[layer], rows[trig.row[layer], trig.position[layer] + 1])



@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_value_projection_is_unembedding_times_value(family, tiny_dirs, tiny_models):
    model = tiny_models[family]
    hf = _hf(tiny_dirs[family])
    _, proj = HF_MLP[family](hf, 0)
    values = proj.weight.detach() if family == "gpt2" else proj.weight.detach().T  # [d_mlp, d_model]
    w_u = hf.lm_head.weight.detach().T  # [d_model, d_vocab]
    assert torch.allclose(mlp.value_logits(model, 0), values @ w_u, atol=1e-5)
    norm = hf.transformer.ln_f if family == "gpt2" else hf.model.norm
    centred = values - values.mean(-1, keepdim=True) if family == "gpt2" else values
    assert torch.allclose(mlp.value_logits(model, 0, apply_final_norm=True), (centred * norm.weight.detach()) @ w_u, atol=1e-5)
    top = mlp.value_top_tokens(model, 0, top_k=3, block=50)  # blocks smaller than d_mlp
    assert torch.equal(top, (values @ w_u).topk(3, -1).indices)


def test_agreement_by_hand():
    next_token = torch.tensor([[[5, 1], [2, 7], [3, 3], [9, 4]]])  # [layer, d_mlp=4, k=2]
    trig = mlp.TriggerExamples(layers=(0,), coefficients=torch.zeros(1, 4, 2), row=torch.zeros(1, 4, 2, dtype=torch.long),
                               position=torch.zeros(1, 4, 2, dtype=torch.long), next_token=next_token, n_prefixes=8)
    table = mlp.agreement(trig, torch.tensor([[5, 7, 0, 9]]))
    assert table.agreement.item() == 0.5  # keys 0 and 3: value top token = top trigger's next token
    assert table.agreement_any.item() == 0.75  # key 1 matches its second trigger
    # the controls pair key i with the triggers of key perm[i]; torch.randperm(4) under seed 0 is [0, 1, 3, 2]:
    # key 0 gets [5, 1] (top 5: agrees), key 1 [2, 7] (7 among them), key 2 [9, 4], key 3 [3, 3]
    assert torch.equal(torch.randperm(4, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 3, 2]))
    assert table.agreement_shuffled.item() == 0.25 and table.agreement_any_shuffled.item() == 0.5


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_analysis_tables_and_figures(family, tiny_models):
    model = tiny_models[family]
    tokens = random_tokens(4, 7, seed=6)
    task = Task(name="rand", tokens=tokens, answers=tokens[:, 2], wrong_answers=tokens[:, 3])
    result = mlp.mlp_memories_analysis(model, task, mlp.MLPConfig(top_k_triggers=3, n_top_neurons=5, chunk_size=4),
                                       corpus=[random_tokens(10, 8, seed=7)])
    f = model.facts
    assert len(result.df) == f.n_layers * f.d_mlp
    by_layer = result.df.groupby("layer").agrees.mean()
    assert result.summary["agreement_per_layer"] == {str(i): pytest.approx(by_layer[i]) for i in range(f.n_layers)}
    assert result.summary["gated_mlp"] == (family == "llama")
    top = result.tables["top_neurons"]
    assert len(top) == 5 and top.task_update_norm.is_monotonic_decreasing
    assert all(t.count("[") == 3 for t in top.triggers)  # three trigger prefixes, trigger token bracketed
    updates = result.tables["task_updates"]
    assert len(updates) == 4 * f.n_layers * 5
    # the largest update per example and layer is the max over neurons of |m_i| ||v_i||
    m, _ = mlp.sub_updates_at(model, tokens, layer=1)
    norms = m.abs() * mlp.hooks.mlp_memories(model, 1).values.norm(dim=-1)
    first = updates[(updates.layer == 1) & (updates["rank"] == 0)].sort_values("example")
    assert first.neuron.tolist() == norms.argmax(1).tolist()
    assert first.update_norm.to_numpy() == pytest.approx(norms.max(1).values.numpy(), abs=1e-5)
    from headscope.reports.plots_mlp import figures, top_neurons_html

    assert set(figures(result)) == {"mlp_agreement", "mlp_top_neurons"}
    html = top_neurons_html(pd.DataFrame([{"layer": 0, "neuron": 1, "task_update_norm": 1.0, "value_tokens": "<script>",
                                           "triggers": "a & [<b>]", "trigger_next": "x", "agrees": True}]))
    assert "<script>" not in html and "&lt;script&gt;" in html and "&amp;" in html


@pytest.fixture(scope="module")
def mixed_moe(mixed_moe_dir):
    """(headscope model, plain HF model) of conftest's mixed_moe_dir: a dense layer 0, a mixture of experts layer 1."""
    import headscope as hs

    return hs.load_model(mixed_moe_dir, device="cpu"), hf_model(mixed_moe_dir)


def _hf_values(hf, layer: int) -> torch.Tensor:
    """[memories, d_model] the value vectors of HF's layer from its own weights: a dense MLP's down_proj columns; a
    mixture of experts' experts in order (each expert's down projection columns), then the shared expert's."""
    block = hf.model.layers[layer].mlp
    if not hasattr(block, "experts"):
        return block.down_proj.weight.T
    down = block.experts.down_proj  # [experts, d_model, expert width]
    return torch.cat([*(down[e].T for e in range(down.shape[0])), block.shared_expert.down_proj.weight.T])


def test_dense_and_expert_layers_are_analysed_together(mixed_moe):
    """#34 review 11c, A1: a dense layer among mixtures of experts has fewer memories (128 against 4 x 32 + a
    shared 64), and the analysis runs on both, each layer with its own. From plain Hugging Face modules: the mean
    coefficients times the value vectors (HF's down projections) sum to the mean of each layer's MLP output at the
    answer position; each value's top token is argmax of lm_head over it; and n_routed is the count of examples
    whose router (its logits from the gate's weight) puts the expert among its top 2 at the answer."""
    model, hf = mixed_moe
    tokens = random_tokens(6, 7, seed=31)
    task = Task(name="rand", tokens=tokens, answers=tokens[:, 2], wrong_answers=tokens[:, 3])
    result = mlp.mlp_memories_analysis(model, task, mlp.MLPConfig(top_k_triggers=2, n_top_neurons=6, chunk_size=8),
                                       corpus=[random_tokens(6, 8, seed=32)])
    seen = {}
    hooks = [hf.model.layers[l].mlp.register_forward_hook(lambda m, a, o, l=l: seen.__setitem__(("out", l), o))
             for l in (0, 1)]
    hooks.append(hf.model.layers[1].mlp.gate.register_forward_hook(lambda m, a, o: seen.__setitem__("gate", a[0])))
    with torch.no_grad():
        hf(tokens)
    for h in hooks:
        h.remove()
    df, s = result.df, result.summary
    assert s["n_memories_per_layer"] == {"0": 128, "1": 4 * 32 + 64} and s["n_neurons_per_layer"] is None
    assert s["experts_per_layer"] == {"1": {"n_experts": 4, "expert_width": 32, "top_k": 2, "shared_width": 64,
                                            "renormalised": hf.config.norm_topk_prob,
                                            "shared_gated": True}}  # Qwen2-MoE's shared_expert_gate
    for layer in (0, 1):
        rows = df[df.layer == layer].sort_values("neuron")
        values = _hf_values(hf, layer).detach()  # [memories, d_model]
        assert rows.neuron.tolist() == list(range(values.shape[0]))
        coef = torch.tensor(rows.task_coefficient.to_numpy())  # [memories] mean over the examples
        want = seen[("out", layer)][:, -1].mean(0)  # [d_model] HF's MLP output at the answer, mean over examples
        assert (coef.float() @ values - want).abs().max().item() <= 1e-4 * want.abs().max().item()
        tops = (values @ hf.lm_head.weight.detach().T).argmax(-1)  # [memories] each value's top token
        assert rows.value_top.tolist() == model.to_str_tokens(tops)
        assert s["agreement_count_per_layer"][str(layer)] == int(rows.agrees.sum())
    assert df[df.layer == 0].expert.isna().all()
    moe = df[df.layer == 1]
    assert moe.expert.tolist() == [e for e in range(4) for _ in range(32)] + [4] * 64
    x = seen["gate"].reshape(6, 7, -1)[:, -1]  # [batch, d_model] the router's input at the answer
    chosen = (x @ hf.model.layers[1].mlp.gate.weight.detach().T).topk(2, -1).indices  # [batch, 2]
    routed = {e: int((chosen == e).any(-1).sum()) for e in range(4)} | {4: 6}  # the shared expert: every example
    assert moe.groupby("expert").n_routed.first().to_dict() == routed
    # review 16b B1: the mean over the routed examples alone is the mean over all 6 times 6 / n_routed (the unrouted
    # examples write 0), NaN for an expert no example was routed to
    ok = moe.n_routed > 0
    want = moe.task_update_norm[ok] * 6 / moe.n_routed[ok].astype(float)
    assert (moe.task_update_norm_routed[ok] - want).abs().max() <= 1e-6 * want.max()
    assert moe.task_update_norm_routed[~ok].isna().all()
    # review 17v B1: only experts routed on at least MIN_ROUTED examples are ranked; the others are named
    best = moe[(moe.expert < 4) & (moe.n_routed >= mlp.MIN_ROUTED)].nlargest(3, "task_update_norm_routed")
    assert [(t["expert"], t["expert_neuron"], t["n_routed"]) for t in s["top_expert_neurons_routed"]] == list(
        zip(best.expert, best.expert_neuron, best.n_routed))
    assert s["experts_routed_too_few"] == [{"layer": 1, "expert": e, "n_routed": n} for e, n in sorted(routed.items())
                                           if e < 4 and 0 < n < mlp.MIN_ROUTED]
    for t, r in zip(s["top_expert_neurons_routed"], best.itertuples()):  # review 18v B4: a norm's interval stays >= 0
        from scipy import stats

        half = stats.t.ppf(0.975, r.n_routed - 1) * r.task_update_norm_routed_sd / r.n_routed ** 0.5
        assert t["ci"] == pytest.approx([max(0.0, r.task_update_norm_routed - half), r.task_update_norm_routed + half])
        assert t["ci_clipped"] == bool(r.task_update_norm_routed - half < 0)
    from headscope.reports.findings import finding
    from headscope.reports.plots_mlp import figures, neuron_labels

    text = finding("mlp", s)
    assert text.startswith("Layer 1 is a mixture of experts: its memories are 192 expert neurons (4 experts x 32 + a "
                           "shared expert of 64, top-2 routing)"), text
    assert "Layer 0 is a dense MLP (128 neurons)." in text
    # review 11c C3: the finding names its top neurons with their routing in words, counted by hand above
    assert [t["layer"] for t in s["top_neurons"]] == result.tables["top_neurons"].layer.head(3).tolist()
    for t in s["top_neurons"]:
        if t["layer"] == 0:
            assert f"layer 0 neuron {t['neuron']} ({t['task_update_norm']:.3g}, a dense MLP)" in text
        elif t["expert"] == 4:
            assert f"layer 1's shared expert's neuron {t['neuron'] - 128} ({t['task_update_norm']:.3g}, on every example)" in text
        else:
            assert (f"layer 1 expert {t['expert']}'s neuron {t['neuron'] - 32 * t['expert']} ({t['task_update_norm']:.3g}, "
                    f"routed on {routed[t['expert']]} of 6 examples)") in text
    assert "rounding" not in text  # float32: no routing precision sentence
    top = result.tables["top_neurons"]
    labels = neuron_labels(top, 6, {1: 4})
    assert all(label == f"L0 dense n{n}" for label, layer, n in zip(labels, top.layer, top.neuron) if layer == 0)
    assert set(figures(result)) == {"mlp_agreement", "mlp_top_neurons"}


def test_routed_means_carry_their_t_interval_and_rank_only_experts_routed_enough():
    """Review 17v B1: the routed mean of each neuron over the examples its expert was chosen on, its sample sd and
    95% t interval, against numpy and scipy per column; an expert routed on fewer than MIN_ROUTED examples is not
    ranked (its 2-example mean 9.0 is the largest), but listed."""
    import numpy as np
    from scipy import stats

    g = torch.Generator().manual_seed(7)
    norms = torch.rand(16, 6, generator=g, dtype=torch.float64)  # [batch, neuron]
    expert = torch.tensor([0, 0, 1, 1, 2, 2])
    chosen = torch.zeros(16, 3, dtype=torch.bool)
    chosen[:, 0] = True  # routed on every example
    chosen[:7, 1] = True  # on 7
    chosen[[3, 9], 2] = True  # on 2
    norms[[3, 9], 4] = 9.0
    on = chosen[:, expert]  # [batch, neuron]
    mean, sd = mlp.routed_mean_sd(norms, on)
    for j in range(6):
        x = norms[on[:, j], j].numpy()
        assert mean[j].item() == pytest.approx(x.mean()) and sd[j].item() == pytest.approx(x.std(ddof=1))
    df = pd.DataFrame({"layer": 1, "neuron": range(6), "expert": expert.numpy(), "expert_neuron": [0, 1] * 3,
                       "n_routed": on.sum(0).numpy(), "task_update_norm_routed": mean.numpy(),
                       "task_update_norm_routed_sd": sd.numpy()})
    layout = {"1": {"n_experts": 3, "expert_width": 2, "top_k": 1, "shared_width": 0}}
    top = mlp._routed_top(df, layout)
    want = [j for j in np.argsort(-mean.numpy(), kind="stable") if on[:, j].sum() >= mlp.MIN_ROUTED][:3]
    assert [t["neuron"] for t in top] == want and 4 not in want
    for t in top:
        x = norms[on[:, t["neuron"]], t["neuron"]].numpy()
        lo, hi = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=x.std(ddof=1) / len(x) ** 0.5)
        assert t["ci"] == pytest.approx([lo, hi]) and t["n_routed"] == len(x)
    assert mlp._too_few(df, layout) == [{"layer": 1, "expert": 2, "n_routed": 2}]


def test_bfloat16_routing_margins_at_the_answer_are_counted_in_rounding_steps(mixed_moe_dir):
    """Review 11c C2: in bfloat16 the mlp summary says, per MoE layer, on how many examples the router's top-2 choice
    at the answer is within one bfloat16 step of its logits, and the least margin in steps. From plain HF in
    bfloat16: the router logits (the gate's own linear on its input) at the answer, the 2nd minus the 3rd, over
    the spacing of bfloat16 at the larger (2^(floor(log2 |x|) - 7): 8 significant bits)."""
    import math

    import headscope as hs

    model = hs.load_model(mixed_moe_dir, device="cpu", dtype=torch.bfloat16)
    hf = hf_model(mixed_moe_dir).to(torch.bfloat16)
    tokens = random_tokens(8, 7, seed=33)
    task = Task(name="rand", tokens=tokens, answers=tokens[:, 2], wrong_answers=tokens[:, 3])
    s = mlp.routing_margins(model, task, layers=(0, 1))
    seen = {}
    h = hf.model.layers[1].mlp.gate.register_forward_hook(lambda m, a, o: seen.__setitem__("logits", o[0]))
    with torch.no_grad():
        hf(tokens)
    h.remove()
    logits = seen["logits"].reshape(8, 7, -1)[:, -1].float().sort(-1, descending=True).values  # [batch, experts]
    steps = [(a - b) / 2.0 ** (math.floor(math.log2(max(abs(a), abs(b)))) - 7)
             for a, b in zip(logits[:, 1].tolist(), logits[:, 2].tolist())]
    assert s["routing_dtype"] == "bfloat16" and set(s["routing_within_rounding"]) == {"1"}  # layer 0 is dense
    assert s["routing_within_rounding"]["1"] == sum(m <= 1 for m in steps)
    assert s["routing_margin_steps_min"]["1"] == pytest.approx(min(steps), abs=2)  # bridge and HF may round apart
    # review 18c B1: each near tie names the two experts it could swap, HF's 2nd and 3rd at that example
    order = seen["logits"].reshape(8, 7, -1)[:, -1].float().sort(-1, descending=True).indices  # [batch, experts]
    ties = s["routing_near_ties"]["1"]
    assert len(ties) == s["routing_within_rounding"]["1"]
    for tie in ties:
        assert {tie["chosen"], tie["next"]} <= set(order[tie["example"], :3].tolist()), (tie, order[tie["example"]])
    assert mlp.routing_margins(hs.load_model(mixed_moe_dir, device="cpu"), task, layers=(0, 1)) == {}  # float32


def test_print_model_names_its_dtype_and_each_kind_of_mlp(mixed_moe_dir):
    """Review 16b C2: print(model) showed "d_mlp=..." (only the dense layer's width) and no dtype on a bfloat16
    mixture of experts. From the HF config: layer 0 (mlp_only_layers) is dense of intermediate_size, layer 1
    num_experts x moe_intermediate_size, top num_experts_per_tok, + a shared expert of
    shared_expert_intermediate_size; the dtype the one asked for."""
    import transformers

    import headscope as hs

    c = transformers.AutoConfig.from_pretrained(mixed_moe_dir)
    model = hs.load_model(mixed_moe_dir, device="cpu", dtype=torch.bfloat16)
    assert (f"d_model={c.hidden_size}, mlp=(layer 0: dense {c.intermediate_size}; layer 1: {c.num_experts} experts x "
            f"{c.moe_intermediate_size}, top-{c.num_experts_per_tok}{'' if c.norm_topk_prob else ' not'} renormalised"
            f" + shared {c.shared_expert_intermediate_size}), "
            f"n_ctx=") in repr(model), repr(model)
    assert repr(model).endswith("dtype=bfloat16, device=cpu)") and "d_mlp" not in repr(model)


def test_mixture_of_experts_counts_tests_and_finding_are_over_every_expert_neuron(more_arch_models, more_arch_dirs):
    """#34 review 7b, A1 and A6: on a Mixtral each layer's memories are its experts' neurons (num_local_experts x
    intermediate_size from the HF config), so the agreement counts are the fractions times that, the Fisher
    tests (scipy) and Wilson intervals (closed form) run on it, and the finding and figures name the experts
    and those denominators, not one expert's width (d_mlp). Each top neuron says on how many examples its
    expert was routed, from Hugging Face's own router logits at the answer position."""
    from scipy.stats import fisher_exact

    from headscope.reports.findings import finding
    from headscope.reports.plots_mlp import figures, neuron_labels

    model, hf = more_arch_models("mixtral"), _hf(more_arch_dirs("mixtral"))
    config = hf.config
    n = config.num_local_experts * config.intermediate_size  # 4 x 128 memories per layer
    assert model.facts.d_mlp == config.intermediate_size != n
    tokens = random_tokens(4, 7, seed=21)
    task = Task(name="rand", tokens=tokens, answers=tokens[:, 2], wrong_answers=tokens[:, 3])
    result = mlp.mlp_memories_analysis(model, task, mlp.MLPConfig(top_k_triggers=2, n_top_neurons=4, chunk_size=8),
                                       corpus=[random_tokens(8, 8, seed=22)])
    s, layers = result.summary, [str(l) for l in range(config.num_hidden_layers)]
    assert s["n_memories_per_layer"] == {l: n for l in layers} and s["n_neurons_per_layer"] == n
    assert s["experts_per_layer"] == {l: {"n_experts": config.num_local_experts, "expert_width": config.intermediate_size,
                                          "top_k": config.num_experts_per_tok, "shared_width": 0,
                                          "renormalised": True} for l in layers}  # Mixtral's router always renormalises
    for key in ("agreement", "agreement_any", "agreement_shuffled", "agreement_any_shuffled"):
        assert s[f"{key}_count_per_layer"] == {l: round(result.tables["agreement"].set_index("layer")[key][int(l)] * n)
                                               for l in layers}
    counts, control = s["agreement_count_per_layer"], s["agreement_shuffled_count_per_layer"]
    assert counts == {l: int(result.df[result.df.layer == int(l)].agrees.sum()) for l in layers} and sum(counts.values()) > 0
    assert s["agreement_tests"]["control_p_per_layer"] == pytest.approx(
        {l: fisher_exact([[counts[l], n - counts[l]], [control[l], n - control[l]]])[1] for l in layers})
    best = max(layers, key=lambda l: counts[l])
    lo, hi = _wilson(counts[best], n)
    text = finding("mlp", s)
    assert text.startswith(f"Layers 0 and 1 are mixtures of experts: each layer's memories are its {n} expert neurons "
                           f"(4 experts x {config.intermediate_size}, top-2 routing), a neuron's coefficient being its "
                           "expert's router weight times its activation, 0 on tokens not routed to that expert (the "
                           "router's top-k weights are renormalised to sum to 1)."), text  # Mixtral's always are
    assert f"({counts[best]} of {n} expert neurons, Wilson 95% CI {100 * lo:.0f}%-{100 * hi:.0f}%)" in text
    assert f"Against its own shuffled control ({control[best]} of {n} expert neurons" in text
    assert f"of {model.facts.d_mlp} " not in text
    # routing at the answer position (the last) from HF's router, per layer and expert: examples sent to it
    with torch.no_grad():
        logits = hf(tokens, output_router_logits=True).router_logits  # per layer [batch * pos, expert]
    top = result.tables["top_neurons"]
    for row in top.itertuples():
        chosen = logits[row.layer].reshape(4, 7, -1)[:, -1].topk(config.num_experts_per_tok, -1).indices  # [batch, top_k]
        assert row.n_routed == int((chosen == row.expert).any(-1).sum())
    assert neuron_labels(top, 4)[0] == f"L{top.layer[0]} E{top.expert[0]} n{top.expert_neuron[0]} (routed {top.n_routed[0]}/4)"
    figs = figures(result)
    assert " ".join(figs["mlp_agreement"].axes[0].get_title().split()).endswith(  # wrapped to the axes' width
        f"bars: Wilson 95% CI over {n} expert neurons (4 experts x {config.intermediate_size}, top-2 routing)")
    assert [t.get_text() for t in figs["mlp_top_neurons"].axes[0].get_yticklabels()] == neuron_labels(top, 4)


@pytest.mark.parametrize("arch", ["olmo2", "gemma2"])
def test_post_norm_values_go_through_the_post_mlp_norm_gain(arch, arch_dirs, more_arch_dirs, tmp_path):
    """Review 8b C7: on post-norm blocks (OLMo 2, no norm before the MLP; Gemma 2, norms before and after) a neuron
    writes post_feedforward_layernorm's gain times its down_proj column. With the post-MLP and final norms set to a
    trained-like spread of gains, the value tokens are those of plain Hugging Face's lm_head(post_norm(v_i)) (the
    module itself applied to v_i: its per-neuron scale 1/rms(v_i) leaves each neuron's ranking as it is), with
    apply_final_norm lm_head(norm(post_norm(v_i))); the task updates are ranked by |m_i| ||g v_i||, g the gain as
    transformers computes it (Olmo2RMSNorm: weight * x, Gemma2RMSNorm: (1 + weight) * x), m_i read at HF's down_proj
    input (the key side needs no pre-MLP norm); their promoted tokens and answer logits are those of m_i lm_head(g v_i).
    The finding says the values went through the gain."""
    import shutil

    import headscope as hs
    from headscope.reports.findings import finding

    source = arch_dirs[arch] if arch == "gemma2" else more_arch_dirs(arch)
    hf = hf_model(source)  # a private copy: its norms are changed below
    offset = 1.0 if arch == "gemma2" else 0.0  # the stored weight of a unit gain
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for norm in [hf.model.norm] + [block.post_feedforward_layernorm for block in hf.model.layers]:
            norm.weight.copy_(torch.rand(norm.weight.shape, generator=g) * 1.5 + 0.25 - offset)  # gains 0.25-1.75
    hf.save_pretrained(tmp_path / arch)
    for path in source.glob("*token*"):
        shutil.copy(path, tmp_path / arch / path.name)
    model = hs.load_model(tmp_path / arch, device="cpu")
    w_u = hf.lm_head.weight.detach().T  # [d_model, d_vocab]
    top_k, moved = 3, 0
    for layer, block in enumerate(hf.model.layers):
        values = block.mlp.down_proj.weight.detach().T  # [d_mlp, d_model]
        with torch.no_grad():
            want = (block.post_feedforward_layernorm(values) @ w_u).topk(top_k, -1).indices
            final = (hf.model.norm(block.post_feedforward_layernorm(values)) @ w_u).topk(top_k, -1).indices
        assert torch.equal(mlp.value_top_tokens(model, layer, top_k=top_k, block=50), want)
        assert torch.equal(mlp.value_top_tokens(model, layer, top_k=top_k, apply_final_norm=True), final)
        moved += int((want[:, 0] != (values @ w_u).argmax(-1)).sum())  # the gain changes some neurons' top token
    assert moved >= 5
    tokens = random_tokens(3, 6, seed=31)
    task = Task(name="rand", tokens=tokens, answers=tokens[:, 2], wrong_answers=tokens[:, 3])
    result = mlp.mlp_memories_analysis(model, task, mlp.MLPConfig(top_k_triggers=2, n_top_neurons=3, chunk_size=8,
                                                                  n_top_updates=2, top_k_tokens=top_k),
                                       corpus=[random_tokens(4, 6, seed=32)])
    updates, seen = result.tables["task_updates"], {}
    hooks = [block.mlp.down_proj.register_forward_pre_hook(functools.partial(lambda l, _, a: seen.update({l: a[0][:, -1]}), l))
             for l, block in enumerate(hf.model.layers)]
    with torch.no_grad():
        hf(tokens)
    for hook in hooks:
        hook.remove()
    for layer, block in enumerate(hf.model.layers):
        m = seen[layer]  # [batch, d_mlp] at the answer position (the last)
        gain = block.post_feedforward_layernorm.weight.detach() + offset  # [d_model]
        written = block.mlp.down_proj.weight.detach().T * gain  # [d_mlp, d_model]
        norms = m.abs() * written.norm(dim=-1)  # [batch, d_mlp]
        order = norms.topk(2, -1).indices  # [batch, 2]
        got = updates[updates.layer == layer].sort_values(["example", "rank"])
        assert got.neuron.tolist() == order.reshape(-1).tolist()
        assert got.coefficient.to_numpy() == pytest.approx(m.gather(1, order).reshape(-1).numpy(), rel=1e-4, abs=1e-6)
        assert got.update_norm.to_numpy() == pytest.approx(norms.gather(1, order).reshape(-1).numpy(), rel=1e-4)
        logits = m.gather(1, order)[..., None] * (written[order] @ w_u)  # [batch, 2, d_vocab]
        assert got.answer_logit.to_numpy() == pytest.approx(
            logits[torch.arange(3), :, task.answers].reshape(-1).numpy(), rel=1e-4, abs=1e-5)
        promoted = logits.topk(top_k, -1).indices.reshape(-1, top_k)  # [batch * 2, top_k]
        assert got.promoted.tolist() == [" ".join(model.to_str_tokens(t)) for t in promoted]
    assert result.summary["values_through_post_norm"] is True
    assert "Value vectors taken through the post-MLP norm's gain (the norm's shared scale is left out: it does not " \
           "change rankings)." in finding("mlp", result.summary)
