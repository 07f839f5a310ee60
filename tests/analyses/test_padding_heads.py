"""The heads analysis on a left-padded Task of mixed-length prompts (#19 item 3): every number
equals the same aggregate of each example run alone, unpadded. References are plain Hugging Face
on each row alone (heads edited before the attention output projection, attention weights) or
the analysis's own per-example runs (`task.example(i)`), never the padded engines."""
from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter

import pytest
import torch

import headscope as hs
from headscope.analyses.heads import analysis as heads
from headscope.analyses.heads import importance as hi
from headscope.analyses.heads import l0 as heads_l0
from headscope.analyses.heads.roles import pattern_scores
from headscope.errors import TaskError
from headscope.hooks.interventions import resample_partners
from tests_support import hf_z_edit

ARCHS = ("gpt2", "llama3", "neox")
TOL = 1e-4


def _hf_metric(hf, task, i: int, edit=None) -> torch.Tensor:
    """Row i alone, unpadded, through plain HF (with a z edit): logit(answer) - logit(wrong) at its last token."""
    with hf_z_edit(hf, edit) if edit else contextlib.nullcontext():
        last = hf(task.example(i).tokens).logits[0, -1]
    return last[task.answers[i]] - last[task.wrong_answers[i]]


def _gated(gates: torch.Tensor):
    """A z edit scaling head h of layer l by gates [L, H] (0: zeroed)."""
    return lambda layer, z: z * gates[layer].to(z.dtype)[None, None, :, None]


def _hf_mean_metric(hf, task, gates: torch.Tensor | None = None) -> float:
    with torch.no_grad():
        return float(torch.stack([_hf_metric(hf, task, i, None if gates is None else _gated(gates))
                                  for i in range(len(task))]).mean())


def _by_method(df) -> dict[str, torch.Tensor]:
    return {m: torch.tensor(g.sort_values(["layer", "head"])["importance"].to_numpy()) for m, g in df.groupby("method")}


def _starts(task) -> list[int]:
    return task.attention_mask.bool().int().argmax(1).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_importance_equals_the_mean_of_per_example_runs(arch, arch_models, mixed_tasks):
    """Gradient and zero-ablation importance and the baseline: the padded task against the mean
    of the analysis run on each example alone."""
    model, task = arch_models(arch), mixed_tasks(arch)
    assert task.padded and task.metric == "logit_diff"
    got = hs.head_importance(model, task, methods=("gradient", "zero"))
    alone = [hs.head_importance(model, task.example(i), methods=("gradient", "zero")) for i in range(len(task))]
    imp, per = _by_method(got.df), [_by_method(r.df) for r in alone]
    for method in ("gradient", "zero"):
        want = torch.stack([p[method] for p in per]).mean(0)
        assert (imp[method] - want).abs().max() <= TOL * (1 + want.abs().max())
        assert want.abs().max() > 1e-2
    baseline = sum(r.summary["baseline_metric"] for r in alone) / len(alone)
    assert got.summary["baseline_metric"] == pytest.approx(baseline, abs=TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_mean_ablation_averages_real_tokens_only(arch, arch_models, mixed_tasks, hf_of):
    """Mean ablation on the padded task: the replacement at each padded position is the mean of
    the z of the rows that have a token there (each row's z captured alone, aligned at its last
    token), and the importance is the mean over examples of plain HF with that head's z replaced
    by those means. Resampled rows take their partner's own z, or that mean where it has padding."""
    model, task, hf = arch_models(arch), mixed_tasks(arch), hf_of(arch)
    f, starts, n_pos = model.facts, _starts(task), task.tokens.shape[1]
    names = [hs.site("z", l) for l in range(f.n_layers)]
    alone = [hs.capture(model, task.example(i).tokens, names) for i in range(len(task))]  # unpadded captures
    means = []
    for name in names:
        total, count = torch.zeros(n_pos, f.n_heads, f.d_head), torch.zeros(n_pos, 1, 1)
        for i, acts in enumerate(alone):
            total[starts[i]:] += acts[name][0]
            count[starts[i]:] += 1
        means.append(total / count)  # [pos, head, d_head]; every position has a row (the longest)
    scorer = hi.make_scorer(model, task)
    rep = hi.ablation_values(model, scorer, "mean")
    for l in range(f.n_layers):
        assert (rep[l][0] - means[l]).abs().max() < TOL
    scores = hi.ablation_importance(model, task, method="mean")

    def replaced(i, layer_, head):
        def edit(layer, z):
            if layer != layer_:
                return z
            z = z.clone()
            z[0, :, head] = means[layer][starts[i]:, head]
            return z
        return edit

    with torch.no_grad():
        base = torch.stack([_hf_metric(hf, task, i) for i in range(len(task))]).mean()
        for l in range(f.n_layers):
            for h in range(f.n_heads):
                want = torch.stack([_hf_metric(hf, task, i, replaced(i, l, h)) for i in range(len(task))]).mean()
                assert float(scores.importance[l, h]) == pytest.approx(float(base - want), abs=TOL)
    assert float(scores.importance.abs().max()) > 1e-2
    resampled = hi.ablation_values(model, scorer, "resample", seed=3)
    partner = resample_partners(len(task), len(task), torch.Generator().manual_seed(3)).tolist()
    assert any(starts[j] > starts[i] for i, j in enumerate(partner))  # some partner is shorter than its row
    for i, j in enumerate(partner):
        own = max(starts[i], starts[j])  # from here on the partner has tokens
        for l, name in enumerate(names):
            got = resampled[l][i]  # [pos, head, d_head]
            assert (got[own:] - alone[j][name][0][own - starts[j]:]).abs().max() < TOL
            if own > starts[i]:
                assert (got[starts[i]:own] - means[l][starts[i]:own]).abs().max() < TOL


def _hf_pattern_reference(hf, task) -> dict[tuple[int, int], dict[str, float]]:
    """Role scores from plain HF attention weights of each row alone, over every row's queries 1.. (pooled)."""
    att = []
    with torch.no_grad():
        for i in range(len(task)):
            att.append([a[0] for a in hf(task.example(i).tokens, output_attentions=True).attentions])  # [H, q, k]
    out = {}
    for layer in range(len(att[0])):
        for head in range(att[0][0].shape[0]):
            qs = [(a[layer][head], q) for a in att for q in range(1, a[layer].shape[1])]
            offsets = Counter(int(a[q].argmax()) - q for a, q in qs)
            out[layer, head] = {
                "sink": sum(float(a[q, 0]) for a, q in qs) / len(qs),
                "previous_token": sum(float(a[q, q - 1]) for a, q in qs) / len(qs),
                "confidence": sum(float(a[q].max()) for a, q in qs) / len(qs),
                "positional": offsets.most_common(1)[0][1] / len(qs),
            }
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_head_roles_equal_hf_attention_of_each_row_alone(arch, arch_models, mixed_tasks, hf_of):
    model, task, hf = arch_models(arch), mixed_tasks(arch), hf_of(arch)
    got = pattern_scores(model, task.tokens, task.attention_mask)
    want = _hf_pattern_reference(hf, task)
    diffs = [abs(float(r[k]) - want[r["layer"], r["head"]][k]) for _, r in got.iterrows()
             for k in ("sink", "previous_token", "confidence", "positional")]
    assert max(diffs) < TOL
    assert got["sink"].min() > 1e-3  # each row's first real token, not its padding


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_pruning_curves_equal_hf_on_each_row_alone(arch, arch_models, mixed_tasks, hf_of):
    """prune_heads (quick config): each curve point's metric is the mean over examples of plain
    HF with that point's heads zeroed, on each row alone."""
    model, task, hf = arch_models(arch), mixed_tasks(arch), hf_of(arch)
    res = hs.prune_heads(model, task, heads.HeadsConfig.preset(quick=True))
    assert res.summary["baseline_metric"] == pytest.approx(_hf_mean_metric(hf, task), abs=TOL)
    f = model.facts
    for _, curve in res.df.groupby(["ordering", "recompute", "seed"]):
        gates = torch.ones(f.n_layers, f.n_heads)
        for _, point in curve.sort_values("n_pruned").iterrows():
            for name in point["pruned"].split():
                layer, head = map(int, name[1:].split("H"))
                gates[layer, head] = 0.0
            assert int((gates == 0).sum()) == point["n_pruned"]
            assert point["metric"] == pytest.approx(_hf_mean_metric(hf, task, gates), abs=TOL)


def _hf_run_gated(hf):
    """run_gated as plain HF on each row alone (padding stripped): last-position logits
    [n, 1, d_vocab], differentiable in the gates [n, L, H]."""
    def run(model, tokens, gates, *, attention_mask=None, replacement=None, last_only=False):
        assert replacement is None and last_only
        out = []
        for i in range(tokens.shape[0]):
            row = tokens[i][attention_mask[i].bool()][None]
            with hf_z_edit(hf, lambda layer, z, i=i: z * gates[i, layer][None, None, :, None]):
                out.append(hf(row).logits[:, -1:])
        return torch.cat(out)
    return run


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_l0_sweep_equals_training_on_each_row_alone(arch, arch_models, mixed_tasks, hf_of, monkeypatch):
    """The L0 sweep on the padded task (minibatches of mixed lengths) against the same sweep whose
    passes run plain HF on each row alone: trained log alpha and the evaluated metrics."""
    model, task, hf = arch_models(arch), mixed_tasks(arch), hf_of(arch)
    config = heads_l0.L0Config(lambdas=(0.03, 0.3), steps=6, batch_size=4)
    scorer = hi.make_scorer(model, task)
    sweep, gates = heads_l0.l0_sweep(model, scorer, config)

    def hf_masks(model_, scorer_, masks, per_example=False, **kwargs):  # [k, L, H] -> [k, n] metric per mask, rows alone
        with torch.no_grad():
            per = torch.tensor([[float(_hf_metric(hf, task, i, _gated(m))) for i in range(len(task))] for m in masks],
                               dtype=torch.float64)  # [k, n]
        return per if per_example else per.mean(1)

    monkeypatch.setattr(heads_l0, "run_gated", _hf_run_gated(hf))
    monkeypatch.setattr(heads_l0, "evaluate_masks", hf_masks)
    want_sweep, want_gates = heads_l0.l0_sweep(model, scorer, config)
    assert (torch.tensor(gates["log_alpha"].to_numpy()) - torch.tensor(want_gates["log_alpha"].to_numpy())).abs().max() < TOL
    assert (gates["log_alpha"] != config.init).any()  # training moved the gates
    for col in ("metric", "metric_binary", "heads_kept"):
        assert (torch.tensor(sweep[col].to_numpy(), dtype=torch.float64)
                - torch.tensor(want_sweep[col].to_numpy(), dtype=torch.float64)).abs().max() < TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_run_quick_equals_per_example_runs(arch, arch_models, mixed_tasks):
    """The whole analysis (quick preset) on the padded task: importance table and baseline equal
    the mean of per-example runs; best head per layer equals the mean of per-example metrics."""
    model, task = arch_models(arch), mixed_tasks(arch)
    config = dataclasses.replace(heads.HeadsConfig.preset(quick=True), l0=heads_l0.L0Config(lambdas=(0.1,), steps=2))
    res = heads.run(model, task, config)
    alone = [heads.head_importance(model, task.example(i), config) for i in range(len(task))]
    imp, per = _by_method(res.df.drop_duplicates(["layer", "head", "method"])), [_by_method(r.df) for r in alone]
    for method in imp:
        assert (imp[method] - torch.stack([p[method] for p in per]).mean(0)).abs().max() < TOL
    assert res.summary["baseline_metric"] == pytest.approx(
        sum(r.summary["baseline_metric"] for r in alone) / len(alone), abs=TOL)
    best = res.tables["best_head"]
    scorer_alone = [hi.make_scorer(model, task.example(i)) for i in range(len(task))]
    f = model.facts
    for _, row in best.iterrows():
        keep = torch.ones(1, f.n_layers, f.n_heads)
        keep[0, int(row["layer"])] = 0.0
        keep[0, int(row["layer"]), int(row["oracle_head"])] = 1.0
        want = sum(float(hi.evaluate_masks(model, s, keep)[0]) for s in scorer_alone) / len(task)
        assert row["oracle_metric"] == pytest.approx(want, abs=TOL)
    assert set(res.tables["roles"]["role"]) <= {"induction", "previous-token", "positional", "sink", "other"}


def test_right_padded_decoder_tasks_are_refused(arch_models, mixed_tasks):
    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    right = dataclasses.replace(task, attention_mask=task.attention_mask.flip(1))
    with pytest.raises(TaskError, match="left-padded"):
        hs.head_importance(model, right)


def test_the_shipped_sentences_task_scores_each_decoder_row_at_its_own_last_token(arch_models, hf_of):
    """`headscope heads --task sentences` on a decoder: the shipped sentences, left-padded; the baseline is
    the mean log-probability of each sentence's last token given the rest, from plain HF on each alone."""
    from headscope.analyses.core.tasks import sentence_task

    model = arch_models("gpt2")
    task = sentence_task(model, n_examples=5, seed=0)
    assert task.padded and bool(task.attention_mask[:, -1].all())  # left-padded: every row ends at -1
    result = hs.head_importance(model, "sentences", heads.HeadsConfig(methods=("zero",), n_examples=5))
    hf = hf_of("gpt2")
    with torch.no_grad():
        expected = torch.stack([hf(task.example(i).tokens).logits[0, -1].log_softmax(-1)[task.answers[i]]
                                for i in range(len(task))]).mean()
    assert result.summary["baseline_metric"] == pytest.approx(float(expected), abs=1e-4)
