"""Circuits, probes and kv on a left-padded Task of mixed-length prompts (#19 item 3): every
per-example number equals that of the example run alone, unpadded (`task.example(i)`), and every
mean over examples the mean of those. References are plain Hugging Face on each row alone
(logits, hidden states), scikit-learn on the per-example features, or the analysis's own
per-example runs, never the padded passes."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import headscope as hs
from headscope.analyses.circuits import analysis as circuits
from headscope.analyses.circuits import edges as E
from headscope.analyses.circuits import faithfulness as F
from headscope.analyses.kv import analysis as kv
from headscope.analyses.kv import eviction as kv_eviction
from headscope.analyses.probes import analysis as probes

ARCHS = ("gpt2", "llama3", "neox")
TOL = 1e-4





def _padded(mixed_tasks, arch):
    task = mixed_tasks(arch)
    lengths = task.attention_mask.sum(1)
    assert task.padded and len(set(lengths.tolist())) == len(task)  # mixed lengths, left-padded
    assert bool(task.attention_mask[:, -1].all()) and not bool(task.attention_mask[:, 0].all())
    return task, [task.example(i) for i in range(len(task))]


# ---- circuits ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_lens_and_dla_equal_each_example_alone(arch, arch_models, mixed_tasks, hf_of):
    model, cfg = arch_models(arch), circuits.CircuitsConfig.preset(quick=True)
    task, alone = _padded(mixed_tasks, arch)
    lens = hs.logit_lens(model, task, cfg).tables["lens"]
    dla = hs.direct_logit_attribution(model, task, cfg)
    table = dla.tables["dla"]
    hf, worst = hf_of(arch), {"lens": 0.0, "dla": 0.0}
    per_dla, answer_logprob = [], []
    for i, ex in enumerate(alone):
        n = ex.tokens.shape[1]
        ref = hs.logit_lens(model, ex, cfg).tables["lens"]
        got = lens[lens.example == i].reset_index(drop=True)
        # end-aligned: the padded row's last position is the example's last; no padded position is read
        assert len(got) == len(ref) == (model.facts.n_layers + 1) * n
        assert ((n - 1 - got.position).to_numpy() == (n - 1 - ref.position).to_numpy()).all()
        for col in ("layer", "target", "is_answer", "rank"):
            assert (got[col].to_numpy() == ref[col].to_numpy()).all(), col
        for col in ("logprob", "logit_diff"):
            worst["lens"] = max(worst["lens"], float(np.nanmax(np.abs(got[col].to_numpy() - ref[col].to_numpy()))))
        with torch.no_grad():  # the last stage at the answer is plain HF's log-probability of the row alone
            hf_lp = hf(ex.tokens).logits[0, -1].log_softmax(-1)[ex.answers[0]].item()
        final = got[(got.stage == "final_post") & got.is_answer].logprob.item()
        assert abs(final - hf_lp) <= TOL
        answer_logprob.append(final)
        ref_dla = hs.direct_logit_attribution(model, ex, cfg).tables["dla"]
        g = table[table.example == i]
        assert g.component.tolist() == ref_dla.component.tolist()
        worst["dla"] = max(worst["dla"], float(np.abs(g.contribution.to_numpy() - ref_dla.contribution.to_numpy()).max()))
        per_dla.append(ref_dla.contribution.to_numpy())
    assert max(worst.values()) <= TOL, worst
    np.testing.assert_allclose(dla.df.contribution.to_numpy(), np.mean(per_dla, 0), atol=TOL)  # mean of per-example
    top = max(circuits.lens_summary(lens, 0.0)["lens_mean_logprob_per_layer"].items(), key=lambda kv: int(kv[0]))
    assert abs(top[1] - np.mean(answer_logprob)) <= TOL
    assert dla.summary["dla_max_reconstruction_error"] <= TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_edges_and_faithfulness_equal_the_mean_of_each_example_alone(arch, arch_models, mixed_tasks, hf_of):
    model = arch_models(arch)
    task, alone = _padded(mixed_tasks, arch)
    result = circuits.run(model, task, circuits.CircuitsConfig.preset(quick=True))  # clean-run EAP, the sweep
    graph, scores, info = E.edge_scores(model, task, method="eap-clean")
    per = [E.edge_scores(model, ex, method="eap-clean")[1] for ex in alone]
    mean = torch.stack(per).mean(0)
    assert float((scores - mean).abs().max()) <= TOL and float(mean.abs().max()) > 1e-2
    edges = result.tables["edges"]
    np.testing.assert_allclose(edges.score.to_numpy(), mean[edges.receiver_index, edges.sender_index].numpy(), atol=TOL)
    hf = hf_of(arch)
    with torch.no_grad():  # the clean and corrupted metrics: plain HF on each pair alone
        ld = lambda ex, toks: (lambda z: z[ex.answers[0]] - z[ex.wrong_answers[0]])(hf(toks).logits[0, -1]).item()  # noqa: E731
        clean = np.mean([ld(ex, ex.tokens) for ex in alone])
        corrupt = np.mean([ld(ex, ex.corrupted_tokens) for ex in alone])
    assert abs(result.summary["edge_metric_clean"] - clean) <= TOL
    assert abs(result.summary["edge_metric_corrupt"] - corrupt) <= TOL
    # EAP-IG: the interpolated steps run the padded rows too
    _, ig, _ = E.edge_scores(model, task, ig_steps=2)
    ig_mean = torch.stack([E.edge_scores(model, ex, ig_steps=2)[1] for ex in alone]).mean(0)
    assert float((ig - ig_mean).abs().max()) <= TOL
    # what padding holds never reaches a score: other pad ids give the same scores
    other = task.tokens.masked_fill(~task.attention_mask.bool(), 5)
    swapped = dataclasses.replace(task, tokens=other,
                                  corrupted_tokens=task.corrupted_tokens.masked_fill(~task.attention_mask.bool(), 5))
    assert float((E.edge_scores(model, swapped, method="eap-clean")[1] - scores).abs().max()) <= TOL
    # faithfulness: each circuit's metric is the mean of its metric on each example alone
    # the sweep itself (the report withholds it where the gap is within noise, review 15a C4, as on these random models)
    sweep = result.tables.get("faithfulness")
    if sweep is None:
        sweep = F.faithfulness_sweep(model, task, graph, scores, F.default_k_values(graph.n_edges),
                                     metric_clean=info["metric_clean"], metric_corrupt=info["metric_corrupt"])
    ks = tuple(sorted(set(sweep.k.tolist())))
    keep, labels = F.keep_masks(graph, scores, ks, seed=0)
    per_circuit = torch.cat([F.circuit_metrics(model, ex, graph, keep) for ex in alone], 1).mean(1)  # [C]
    assert [tuple(x) for x in sweep[["k", "circuit", "draw"]].itertuples(index=False)] == labels
    np.testing.assert_allclose(sweep.metric.to_numpy(), per_circuit.double().numpy(), atol=TOL)
    np.testing.assert_allclose(sweep.faithfulness.to_numpy(), (per_circuit.double().numpy() - corrupt) / (clean - corrupt),
                               atol=1e-3)


# ---- probes --------------------------------------------------------------------------------
def test_probe_features_in_passes_of_two_rows_are_hf_hidden_states(arch_models, mixed_tasks, hf_of, monkeypatch):
    """Where memory holds two rows a pass (the sizing rule, stubbed), the features are captured two
    rows at a time and still equal plain HF's hidden states of each example alone."""
    from headscope.execution import batching

    arch = ARCHS[0]
    model = arch_models(arch)
    task, alone = _padded(mixed_tasks, arch)
    assert len(task) > 2
    calls = []
    monkeypatch.setattr(batching, "rows_per_pass", lambda model, n_pos, **kw: calls.append(n_pos) or 2)
    hf = hf_of(arch)
    with torch.no_grad():
        hidden = [hf(ex.tokens, output_hidden_states=True).hidden_states for ex in alone]
    layers = list(range(model.facts.n_layers))
    for labels, every in (("position", True), ("answer", False)):
        data = probes.task_labels(task, labels, -1, tokenizer=model.tokenizer)
        feats = probes.probe_features(model, task, "resid_pre", data, layers)
        for layer in layers:
            want = np.concatenate([(h[layer][0] if every else h[layer][0, -1:]).numpy() for h in hidden])
            assert np.abs(feats[layer] - want).max() <= TOL
    assert calls == [task.tokens.shape[1]] * 2


@pytest.mark.parametrize("arch", ARCHS)
def test_probe_features_and_labels_are_those_of_each_example_alone(arch, arch_models, mixed_tasks, hf_of):
    model = arch_models(arch)
    task, alone = _padded(mixed_tasks, arch)
    layers = list(range(model.facts.n_layers))
    hf = hf_of(arch)
    with torch.no_grad():  # resid_pre of block l: plain HF's hidden_states[l] of each row alone
        hidden = [hf(ex.tokens, output_hidden_states=True).hidden_states for ex in alone]
    worst = 0.0
    for labels in ("position", "prev_token", "position_bucket", "word_start", "answer"):
        data = probes.task_labels(task, labels, -1, tokenizer=model.tokenizer)
        feats = probes.probe_features(model, task, "resid_pre", data, layers)
        refs = [probes.task_labels(ex, labels, -1, tokenizer=model.tokenizer) for ex in alone]
        every = labels != "answer"
        assert data.all_positions == every
        if every:  # every real token once, labels counted from each row's first real token
            assert (data.labels == np.concatenate([r.labels for r in refs])).all(), labels
            assert len(data.labels) == int(task.attention_mask.sum())
        assert (data.types == np.concatenate([r.types for r in refs])).all(), labels
        for layer in layers:
            want = np.concatenate([(h[layer][0] if every else h[layer][0, -1:]).numpy() for h in hidden])
            worst = max(worst, float(np.abs(feats[layer] - want).max()))
    assert worst <= TOL, worst
    lengths = [ex.tokens.shape[1] for ex in alone]
    pos = probes.task_labels(task, "position", tokenizer=model.tokenizer).labels
    assert pos.tolist() == [float(p) for n in lengths for p in range(n)]
    # the summary is computed on real tokens only: R^2 per layer is scikit-learn's on the concatenated rows
    result = probes.probe_sweep(model, task, "resid_pre", labels="position", cv=3, seed=0)
    assert result.summary["n_examples"] == sum(lengths)
    for layer in layers:
        X = np.concatenate([h[layer][0].numpy() for h in hidden])
        ref = cross_val_score(make_pipeline(StandardScaler(), Ridge(alpha=1.0)), X, pos,
                              cv=KFold(3, shuffle=True, random_state=0))
        got = result.df[(result.df.task == "real") & (result.df.layer == layer)].sort_values("fold").score.to_numpy()
        np.testing.assert_allclose(got, ref, atol=1e-3)
    bucket = probes.probe_sweep(model, task, "resid_pre", labels="position_bucket", cv=3, seed=0).summary
    counts = np.unique(np.concatenate([probes.task_labels(ex, "position_bucket").labels for ex in alone]),
                       return_counts=True)[1]
    assert bucket["n_examples"] == sum(lengths) and bucket["majority_baseline"] == counts.max() / counts.sum()


# ---- kv ------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_kv_eviction_norms_and_sinks_equal_each_example_alone(arch, arch_models, mixed_tasks):
    model, cfg = arch_models(arch), kv.KVConfig.preset(quick=True)
    task, alone = _padded(mixed_tasks, arch)
    result = kv.kv_analysis(model, task, cfg)
    sweep, worst = result.df, 0.0
    refs = [kv.kv_analysis(model, ex, cfg) for ex in alone]
    for i, (ex, ref) in enumerate(zip(alone, refs)):
        ctx = ex.tokens.shape[1] - 1
        assert set(sweep[sweep.example == i].context) == {ctx}  # each prompt's own context, not the padded one
        ref_df = ref.df.set_index(["policy", "budget"])
        for row in sweep[sweep.example == i].itertuples():
            # a budget the row's context fits in evicts nothing: the example's own "full" run
            key = ("full", ctx) if row.policy == "full" or row.budget >= ctx else (row.policy, row.budget)
            want = ref_df.loc[key]
            worst = max(worst, abs(row.metric - float(want.metric)))
            assert row.correct == float(want.correct)
    assert worst <= TOL, worst
    full = np.mean([r.summary["metric_unevicted"] for r in refs])
    assert abs(result.summary["metric_unevicted"] - full) <= TOL
    # heavy hitters rank attention received from real queries by real keys only; padding gets none
    received = kv_eviction.attention_received(model, task.tokens, task.attention_mask)
    start = task.first_positions()
    for i, ex in enumerate(alone):
        own = kv_eviction.attention_received(model, ex.tokens)[:, 0]
        assert float((received[:, i, :, start[i]:] - own).abs().max()) <= TOL
        assert float(received[:, i, :, :start[i]].abs().sum()) == 0.0
    f = model.facts
    for policy in ("full", *kv_eviction.POLICIES):
        keep = kv_eviction.keep_mask(policy, n_layers=f.n_layers, batch=len(task), n_kv_heads=f.n_kv_heads,
                                     ctx=task.tokens.shape[1] - 1, budget=4, n_sink=2, received=received, start=start)
        assert not bool((keep & ~task.attention_mask[None, :, None, :-1].bool()).any())  # padding is never kept
    # norms: each position's mean over the prompts that have it; sinks: the mean over prompts
    norms = result.tables["norms"].set_index(["kind", "layer", "kv_head", "position"]).norm
    stacked = np.full((len(alone), len(norms)), np.nan)
    for j, ref in enumerate(refs):
        stacked[j] = ref.tables["norms"].set_index(["kind", "layer", "kv_head", "position"]).norm.reindex(norms.index)
    np.testing.assert_allclose(norms.to_numpy(), np.nanmean(stacked, 0), atol=TOL)
    reach = result.tables["norms"].set_index(["kind", "layer", "kv_head", "position"]).n_prompts  # prompts per position
    np.testing.assert_array_equal(reach.to_numpy(), (~np.isnan(stacked)).sum(0))
    for col in ("sink_mass", "baseline_mass"):
        want = np.mean([r.tables["sinks"][col].to_numpy() for r in refs], 0)
        np.testing.assert_allclose(result.tables["sinks"][col].to_numpy(), want, atol=TOL)
    # the first key's norm over the others', each prompt's own: the padded batch's mean is that of the prompts alone
    for layer, record in enumerate(result.summary["key_norm_ratios"]):
        own = [x for r in refs if (x := r.summary["key_norm_ratios"][layer]["ratio"]) is not None]
        assert record["n"] == len(own) and (not own or abs(record["ratio"] - np.mean(own)) <= TOL), (record, own)
