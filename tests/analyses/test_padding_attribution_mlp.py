"""Padded Tasks (#19 item 3) in the attribution and mlp analyses: a batch of mixed-length prompts
(decoders left-padded, BERT right-padded) gives every example the scores, taus, permutation and
IG results, sub-updates and trigger prefixes of that example run alone (`task.example(i)`), and
padding gets no score, no tau and no trigger prefix."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

import headscope as hs
from headscope.analyses.attribution.analysis import AttributionConfig
from headscope.analyses.attribution.analysis import run as attribution_run
from headscope.analyses.mlp import analysis as mlp

DECODERS = ("gpt2", "llama3", "neox")
TOL = 1e-4


def _max_diff(got: pd.DataFrame, want: pd.DataFrame, keys: list[str], values: list[str]) -> float:
    """Largest |got - want| over `values` after aligning the rows on `keys` (same rows required)."""
    got, want = got.sort_values(keys).reset_index(drop=True), want.sort_values(keys).reset_index(drop=True)
    assert len(got) == len(want) > 0
    pd.testing.assert_frame_equal(got[keys].astype(str), want[keys].astype(str))
    diffs = [(got[v].astype(float) - want[v].astype(float)).abs() for v in values]
    nan_same = [got[v].isna().eq(want[v].isna()).all() for v in values]
    assert all(nan_same), "NaN in one run but not the other"
    return max(float(d.max(skipna=True)) if d.notna().any() else 0.0 for d in diffs)


def _example(df: pd.DataFrame, i: int, shift: int = 0) -> pd.DataFrame:
    """Example i's rows renamed as example 0 (the index it has when run alone), positions moved back by shift."""
    out = df[df.example == i].assign(example=0)
    return out.assign(position=out.position - shift) if shift else out


def _references(model, task) -> torch.Tensor:
    """[batch, d_model]: each sentence's partner (the next one) embedded alone and mean-pooled."""
    with torch.no_grad():
        pooled = torch.stack([model(task.example(i).tokens)[0].mean(0) for i in range(len(task))])  # [batch, d]
    return pooled.roll(-1, dims=0)


@pytest.mark.parametrize("arch", (*DECODERS, "bert"))
def test_attribution_on_a_padded_task_equals_each_example_alone(arch, arch_models, mixed_tasks):
    model, task = arch_models(arch), mixed_tasks(arch)
    assert task.padded
    cfg = AttributionConfig.preset(quick=True)
    res = attribution_run(model, task, cfg)
    refs = _references(model, task) if model.facts.is_encoder else None
    mask = task.attention_mask.bool()
    worst = {}
    for i in range(len(task)):
        start = int(mask[i].int().argmax())
        real = task.tokens[i, mask[i]]  # [n]
        extra = {} if refs is None else {"reference": refs[i : i + 1]}
        alone = hs.attribution(model, task.example(i), cfg, **extra)
        # scores: only real tokens, first and last left out, at the Task's (padded) positions
        got = _example(res.tables["scores"], i, shift=start)
        assert set(got.position) == set(range(1, len(real) - 1))
        assert list(got.drop_duplicates("position").sort_values("position").token) == model.to_str_tokens(real[1:-1])
        keys = ["method", "layer", "head", "position"]
        worst["scores"] = max(worst.get("scores", 0), _max_diff(got, alone.tables["scores"], keys, ["score"]))
        tau = _example(res.df, i)
        assert set(tau.n_tokens) == {len(real) - 2}  # padding takes no part in the ranking
        worst["tau"] = max(worst.get("tau", 0), _max_diff(tau, alone.df, ["attention", "layer", "head", "method"],
                                                          ["tau", "p_value"]))
        pairs = _example(res.tables["tau_methods"], i)
        worst["tau"] = max(worst["tau"], _max_diff(pairs, alone.tables["tau_methods"], ["method_a", "method_b"], ["tau"]))
        perm = _example(res.tables["permutation"], i)
        cols = ["max_attention", "median_change", "mean_change", "adversarial_jsd", "adversarial_change",
                *(c for c in ("top_prob", "metric_change", "abs_metric_change", "adversarial_metric_change") if c in perm)]
        worst["permutation"] = max(worst.get("permutation", 0), _max_diff(perm, alone.tables["permutation"], ["example"], cols))
        ig = _example(res.tables["ig"], i)
        assert int(ig.n_steps.iloc[0]) == int(alone.tables["ig"].n_steps.iloc[0])
        cols = ["attribution_sum", "delta", "metric_input", "metric_baseline"]
        worst["ig"] = max(worst.get("ig", 0), _max_diff(ig, alone.tables["ig"], ["example"], cols))
    print(arch, {k: f"{v:.2e}" for k, v in worst.items()})
    assert max(worst.values()) <= TOL, worst
    assert model.n_active_hooks() == 0


@pytest.mark.parametrize("arch", DECODERS)
def test_padded_attention_scores_equal_hf_on_the_padded_batch(arch, arch_models, arch_dirs, mixed_tasks):
    """Independent of headscope's forward: HF eager on the whole left-padded batch (mask, position ids
    from it) gives the last query's attention over each row's scored tokens, renormalised."""
    from tests_support import hf_model

    model, task = arch_models(arch), mixed_tasks(arch)
    res = hs.attribution(model, task, AttributionConfig.preset(quick=True), adversarial_steps=0, n_permutations=1)
    mask = task.attention_mask.long()
    with torch.no_grad():
        atts = hf_model(arch_dirs[arch])(task.tokens, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0),
                                         output_attentions=True).attentions  # layers x [batch, head, q, k]
    scores = res.tables["scores"]
    scores = scores[scores.method == "attention"]
    worst = 0.0
    for i in range(len(task)):
        start = int(mask[i].argmax())
        for layer, att in enumerate(atts):
            want = att[i, :, -1, start + 1 : -1]  # [head, scored keys]
            want = want / want.sum(-1, keepdim=True)
            got = scores[(scores.example == i) & (scores.layer == layer)].sort_values(["head", "position"])
            assert set(got.position) == set(range(start + 1, task.tokens.shape[1] - 1))
            got = torch.tensor(got.score.to_numpy(), dtype=torch.float32).reshape(want.shape)
            worst = max(worst, (got - want).abs().max().item())
    print(arch, f"attention vs HF {worst:.2e}")
    assert worst <= TOL


def test_equal_length_examples_batched_together_equal_each_alone(arch_models, mixed_tasks):
    """Clean and corrupted prompts share a length, so they are scored in one batch: each still gets its
    own IG step count and random draws (seeded by its tokens), hence the scores of the example alone."""
    from headscope.analyses.core.tasks import Task

    model, mixed = arch_models("llama3"), mixed_tasks("llama3")
    rows = [0, 1, 2]
    task = Task(name="pairs", tokens=torch.cat([mixed.tokens[rows], mixed.corrupted_tokens[rows]]),
                attention_mask=torch.cat([mixed.attention_mask[rows]] * 2), metric=mixed.metric,
                answers=torch.cat([mixed.answers[rows], mixed.wrong_answers[rows]]),
                wrong_answers=torch.cat([mixed.wrong_answers[rows], mixed.answers[rows]]))
    cfg = AttributionConfig.preset(quick=True)
    res = hs.attribution(model, task, cfg)
    worst = 0.0
    for i in range(len(task)):
        start = int(task.attention_mask[i].bool().int().argmax())
        alone = hs.attribution(model, task.example(i), cfg)
        got = _example(res.tables["scores"], i, shift=start)
        worst = max(worst, _max_diff(got, alone.tables["scores"], ["method", "layer", "head", "position"], ["score"]))
        for name, cols in (("permutation", ["median_change", "adversarial_jsd"]), ("ig", ["n_steps", "delta"])):
            got = _example(res.tables[name], i)
            worst = max(worst, _max_diff(got, alone.tables[name], ["example"], cols))
    print(f"equal-length batches {worst:.2e}")
    assert worst <= TOL


# ---- mlp ---------------------------------------------------------------------------------------------------
HF_DOWN = {"gpt2": lambda hf, l: hf.transformer.h[l].mlp.c_proj, "llama3": lambda hf, l: hf.model.layers[l].mlp.down_proj,
           "neox": lambda hf, l: hf.gpt_neox.layers[l].mlp.dense_4h_to_h}


def _hf_coefficients(hf, arch: str, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the memory coefficients [pos, d_mlp] of one unpadded row: the input of HF's MLP
    output projection."""
    seen: list[torch.Tensor] = []
    handles = [HF_DOWN[arch](hf, l).register_forward_pre_hook(lambda m, a: seen.append(a[0][0]))
               for l in range(hf.config.num_hidden_layers)]
    with torch.no_grad():
        hf(tokens[None])
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("arch", DECODERS)
def test_trigger_prefixes_of_a_padded_corpus_equal_hf_on_each_row_alone(arch, arch_models, arch_dirs, mixed_tasks):
    from tests_support import hf_model

    model, task = arch_models(arch), mixed_tasks(arch)
    corpus = mlp.task_corpus(task)  # left-padded prompts + answers, with the mask
    tokens, mask = corpus
    rows = [tokens[i, mask[i].bool()] for i in range(len(task))]  # real tokens of each row
    assert all(torch.equal(r[:-1], task.example(i).tokens[0]) and r[-1] == task.answers[i] for i, r in enumerate(rows))
    k = 10
    trig = mlp.trigger_examples(model, corpus, k=k, chunk_size=4)  # chunks of 4 and 2 rows
    hf = hf_model(arch_dirs[arch])
    coef = [_hf_coefficients(hf, arch, r) for r in rows]  # row -> layer -> [n, d_mlp]
    prefixes = [(r, p) for r in range(len(rows)) for p in range(1, len(rows[r]) - 1)]  # real prefixes with a next token
    assert trig.n_prefixes == len(prefixes)
    worst = 0.0
    neuron = torch.arange(model.facts.d_mlp)[:, None]
    for layer in range(model.facts.n_layers):
        flat = torch.stack([coef[r][layer][p] for r, p in prefixes], dim=1)  # [d_mlp, n_prefixes]
        worst = max(worst, (trig.coefficients[layer] - flat.topk(k, dim=1).values).abs().max().item())
        got = torch.stack([torch.stack([coef[r][layer][p] for r, p in zip(rr, pp)]) for rr, pp in
                           zip(trig.row[layer].tolist(), trig.position[layer].tolist())])  # [d_mlp, k, d_mlp]
        worst = max(worst, (got[neuron, torch.arange(k), neuron] - trig.coefficients[layer]).abs().max().item())
        assert bool((trig.position[layer] >= 1).all())
        assert all(trig.next_token[layer][n, j] == rows[r][p + 1] for n in (0, 7) for j, (r, p) in
                   enumerate(zip(trig.row[layer][n].tolist(), trig.position[layer][n].tolist())))
    print(arch, f"trigger coefficients vs HF {worst:.2e}")
    assert worst <= TOL


def test_mlp_task_updates_in_passes_of_two_rows_equal_each_example_alone(arch_models, mixed_tasks, monkeypatch):
    """Where memory holds two rows a pass (the sizing rule, stubbed), the sub-updates at each row's
    answer position are captured two rows at a time and equal each example run alone."""
    from headscope.execution import batching

    arch = DECODERS[0]
    model, task = arch_models(arch), mixed_tasks(arch)
    layers = list(range(model.facts.n_layers))
    alone = [mlp.task_sub_updates(model, task.example(i), layers=layers)[0] for i in range(len(task))]
    calls = []
    monkeypatch.setattr(batching, "rows_per_pass", lambda model, n_pos, **kw: calls.append(n_pos) or 2)
    top, _ = mlp.task_sub_updates(model, task, layers=layers)
    assert calls == [task.tokens.shape[1]] and len(task) > 2
    worst = 0.0
    for i, want in enumerate(alone):
        got = _example(top, i)
        assert list(got.promoted) == list(want.promoted)
        worst = max(worst, _max_diff(got, want, ["layer", "rank", "neuron"], ["coefficient", "update_norm", "answer_logit"]))
    assert worst <= TOL, worst


@pytest.mark.parametrize("arch", DECODERS)
def test_mlp_on_a_padded_task_equals_each_example_alone(arch, arch_models, mixed_tasks):
    model, task = arch_models(arch), mixed_tasks(arch)
    cfg = mlp.MLPConfig.preset(quick=True)
    res = mlp.run(model, task, cfg)
    alone = [mlp.mlp_memories_analysis(model, task.example(i), cfg) for i in range(len(task))]
    worst = {}
    # sub-updates at each example's answer position
    for i, one in enumerate(alone):
        got = _example(res.tables["task_updates"], i)
        want = one.tables["task_updates"]
        assert list(got.promoted) == list(want.promoted) and list(got.promotes_answer) == list(want.promotes_answer)
        cols = ["coefficient", "update_norm", "answer_logit"]
        worst["sub_updates"] = max(worst.get("sub_updates", 0), _max_diff(got, want, ["layer", "rank", "neuron"], cols))
    # sub_updates_at on the left-padded batch: each row's last token, as alone
    m, updates = mlp.sub_updates_at(model, task.tokens, 1, attention_mask=task.attention_mask)
    for i in range(len(task)):
        m_i, updates_i = mlp.sub_updates_at(model, task.example(i).tokens, 1)
        worst["sub_updates"] = max(worst["sub_updates"], (m[i] - m_i[0]).abs().max().item(),
                                   (updates[i] - updates_i[0]).abs().max().item())
    # per-neuron means over examples = the mean of the per-example values
    for col in ("task_update_norm", "task_coefficient"):
        want = sum(torch.tensor(one.df[col].to_numpy()) for one in alone) / len(alone)
        worst[col] = (torch.tensor(res.df[col].to_numpy()) - want).abs().max().item()
    # each key's top trigger coefficient over the Task's corpus = the largest of the examples' own
    want = torch.stack([torch.tensor(one.df.top_coefficient.to_numpy()) for one in alone]).max(0).values
    worst["top_trigger"] = (torch.tensor(res.df.top_coefficient.to_numpy()) - want).abs().max().item()
    assert res.summary["n_prefixes"] == sum(one.summary["n_prefixes"] for one in alone)
    assert res.summary["answer_promoted_fraction"] == pytest.approx(
        sum(one.summary["answer_promoted_fraction"] for one in alone) / len(alone))
    print(arch, {k: f"{v:.2e}" for k, v in worst.items()})
    assert max(worst.values()) <= TOL, worst
