"""The named analyses' one signature (model, task=None, config=None, **config_overrides), one seed per
run, one meaning of `quick` and one Metric type (analyses/core/config.py, core/metrics.py)."""
from __future__ import annotations

import dataclasses
import inspect
import json

import pandas as pd
import pytest
import torch

import headscope as hs
from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.metrics import Metric
from headscope.analyses.core.tasks import Task
from headscope.analyses.heads.importance import Scorer, make_scorer
from headscope.analyses.patching import PathPatchingConfig, TracingConfig
from headscope.analyses.patching.inputs import PatchMetric, resolve_metric
from headscope.errors import ConfigError, InputTypeError

# Every named function of the public API, its config class and small settings for the zoo model.
CASES = {
    "head_importance": (hs.HeadsConfig, dict(methods=("zero",), n_examples=4)),
    "prune_heads": (hs.HeadsConfig, dict(pruning=hs.PruningConfig(orderings=("random",), n_random=1, step=0.5),
                                         n_examples=4)),
    "attribution": (hs.AttributionConfig, dict(n_examples=2, n_steps=2, ig_max_steps=2, n_permutations=2,
                                               adversarial_steps=0)),
    "position_bias": (hs.PositionConfig, dict(n_examples=1, n_boot=10)),
    "activation_patching": (hs.PatchingConfig, dict(sites=("resid_pre",), n_examples=2)),
    "attribution_patching": (hs.PatchingConfig, dict(sites=("resid_pre",), n_examples=2)),
    "path_patching": (PathPatchingConfig, dict(senders=((0, 0), (1, 1)), n_examples=2)),
    "causal_tracing": (TracingConfig, dict(kinds=("resid",), n_samples=1, n_examples=2)),
    "mlp_memories_analysis": (hs.MLPConfig, dict(layers=(0,), top_k_triggers=2, n_examples=4)),
    "kv_analysis": (hs.KVConfig, dict(budgets=(4,), n_examples=2)),
    "probe_sweep": (hs.ProbesConfig, dict(n_examples=16, cv=2, capacity=False, layers=(0,))),
    "logit_lens": (hs.CircuitsConfig, dict(n_examples=2, edges=False)),
    "direct_logit_attribution": (hs.CircuitsConfig, dict(n_examples=2, top_k=3)),
}


def test_every_public_named_function_is_covered_and_has_the_one_signature():
    named = {n for n in hs._family_api() if n.islower()}
    assert named == set(CASES)
    for name in named:
        params = list(inspect.signature(getattr(hs, name)).parameters.values())
        assert [p.name for p in params[:3]] == ["model", "task", "config"], name
        assert params[1].default is None and params[2].default is None, name
        assert params[-1].kind is inspect.Parameter.VAR_KEYWORD, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_overrides_equal_the_same_config(name, zoo_model):
    """f(model, task, Config(**kw)) and f(model, task, **kw) are one run: equal frames and summaries."""
    cls, kw = CASES[name]
    fn = getattr(hs, name)
    by_config, by_keywords = fn(zoo_model, None, cls(**kw)), fn(zoo_model, **kw)
    pd.testing.assert_frame_equal(by_config.df, by_keywords.df)
    assert json.dumps(by_config.summary, sort_keys=True, default=str) == json.dumps(by_keywords.summary, sort_keys=True,
                                                                                     default=str)
    assert len(by_config.df) > 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_unknown_override_is_one_error_naming_the_close_field(name, zoo_model):
    with pytest.raises(ConfigError, match=r"no setting 'sead'; did you mean 'seed'") as err:
        getattr(hs, name)(zoo_model, sead=1)
    assert "\n" not in str(err.value)


def test_config_types_and_the_older_positional_forms(zoo_model):
    with pytest.raises(InputTypeError, match="pass a PruningConfig as pruning="):
        hs.prune_heads(zoo_model, None, hs.PruningConfig())
    with pytest.raises(InputTypeError, match="takes a KVConfig as config, got HeadsConfig"):
        hs.kv_analysis(zoo_model, None, hs.HeadsConfig())
    with pytest.raises(ConfigError, match="sites twice"):
        hs.activation_patching(zoo_model, None, "resid_pre", sites=("q",))
    # activation_patching(model, task, sites): the third argument is the sites field
    assert configure(hs.PatchingConfig, ["q"], {}, name="f", positional="sites").sites == ["q"]
    assert configure(PathPatchingConfig, [(1, 0)], {}, name="f", positional="receivers").receivers == [(1, 0)]


def test_one_seed_per_run(zoo_model):
    """Nested settings carry no seed; the run's seed orders the random pruning curve, as torch.randperm
    seeded with it would, and two seeds give two orders."""
    for nested in (hs.PruningConfig, hs.L0Config):
        assert "seed" not in {f.name for f in dataclasses.fields(nested)}
    cls, kw = CASES["prune_heads"]
    n = zoo_model.facts.n_layers * zoo_model.facts.n_heads
    orders = []
    for seed in (3, 4):
        curve = hs.prune_heads(zoo_model, "kv", seed=seed, **kw).df
        pruned = " ".join(p for p in curve.sort_values("n_pruned")["pruned"] if p).split()
        want = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        assert pruned == [f"L{i // zoo_model.facts.n_heads}H{i % zoo_model.facts.n_heads}" for i in want]
        assert set(curve["seed"]) == {seed}
        orders.append(pruned)
    assert orders[0] != orders[1]


def test_quick_means_quick_sizes_for_what_the_caller_left_unset():
    assert hs.HeadsConfig(quick=True).n_induction == 4 and hs.HeadsConfig().n_induction == 8
    assert hs.HeadsConfig(quick=True, n_induction=8).n_induction == 8  # given: kept
    assert hs.CircuitsConfig(quick=True).edge_method == "eap-clean"
    assert hs.CircuitsConfig(quick=True, edge_method="eap-ig").edge_method == "eap-ig"
    assert hs.AttributionConfig(quick=True).n_steps == 8 and hs.PositionConfig(quick=True).n_boot == 200
    on = configure(hs.HeadsConfig, hs.HeadsConfig(n_induction=6), {"quick": True}, name="f")  # quick as an override
    assert (on.quick, on.n_induction, on.methods, on.l0.steps) == (True, 6, ("gradient", "zero"), 10)
    both = configure(hs.HeadsConfig, hs.HeadsConfig(seed=1, n_induction=6), {"quick": True, "seed": 2}, name="f")
    assert (both.seed, both.n_induction, both.n_examples) == (2, 6, None)
    assert hs.ProbesConfig(quick=True).folds() == 3 and hs.ProbesConfig().folds() == 5
    assert all(issubclass(cls, AnalysisConfig) for cls, _ in CASES.values())


def test_one_metric_type(tiny_models):
    """PatchMetric and Scorer are Metrics; called on a model output each gives the logit difference
    read off the logits by hand."""
    model = tiny_models["gpt2"]
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 60, (3, 5), generator=g)
    answers, wrong = torch.tensor([5, 9, 11]), torch.tensor([6, 7, 8])
    task = Task(name="t", tokens=tokens, answers=answers, wrong_answers=wrong, corrupted_tokens=tokens.flip(0))
    with torch.no_grad():
        logits = model.bridge(tokens)  # [batch, pos, vocab]
    want = logits[:, -1].gather(1, answers[:, None])[:, 0] - logits[:, -1].gather(1, wrong[:, None])[:, 0]
    scorer, patch_metric = make_scorer(model, task), resolve_metric(task, "logit_diff")
    for metric in (scorer, patch_metric):
        assert isinstance(metric, Metric) and metric.name in ("t", "logit_diff")
        torch.testing.assert_close(metric(logits), want)
    assert isinstance(scorer, Scorer) and isinstance(patch_metric, PatchMetric) and scorer.last_position


def test_quick_turned_on_or_off_by_an_override_follows_what_the_caller_chose():
    """dataclasses.replace sets every field and a preset sets sizes of its own: neither pins a size when an
    override turns quick on or off (the review's three cases), while a size the caller chose is kept."""
    from headscope.analyses.core.config import with_overrides

    replaced = dataclasses.replace(hs.HeadsConfig(), n_examples=8)
    assert with_overrides(replaced, quick=True) == hs.HeadsConfig(quick=True, n_examples=8)
    assert with_overrides(hs.HeadsConfig(quick=True), quick=False) == hs.HeadsConfig()
    assert with_overrides(hs.AttributionConfig.preset(), quick=True) == hs.AttributionConfig.preset(quick=True)
    kept = with_overrides(hs.HeadsConfig(quick=True, n_induction=7), quick=False)
    assert kept.n_induction == 7 and kept == hs.HeadsConfig(n_induction=7)


def test_every_results_repr_and_html_name_its_model_and_task(tiny_dirs, tiny_models):
    """Review 12c C3: `repr` of a patching Result left out the model and the task (heads' named both). A task of 4
    records, patched by hs.activation_patching and by hs.run_analysis; the circuits lens on its default "repeat"."""
    model, where = tiny_models["gpt2"], str(tiny_dirs["gpt2"])
    task = hs.load_task(model, [{"prompt": "w1 w2 w3", "answer": "w4", "corrupted_prompt": "w5 w2 w3",
                                 "wrong_answer": "w6"}] * 4)
    from headscope.reports.render import result_html

    for result in (hs.activation_patching(model, task, sites=("resid_pre",), trace_samples=0),
                   hs.run_analysis("patching", model, task, hs.PatchingConfig(sites=("resid_pre",), trace_samples=0))):
        assert repr(result).startswith(f"Result('patching', model={where!r}, task='records', 8 rows; "), repr(result)
        assert f"<p class='source'>model {where}, run in float32; task records</p>" in result_html(result, with_figures=False)
    lens = hs.logit_lens(model)
    assert repr(lens).startswith(f"Result('circuits', model={where!r}, task='repeat', "), repr(lens)


def test_run_analysis_takes_config_fields_as_keywords_and_names_a_mistyped_one(monkeypatch):
    """Review 14a C6: hs.run_analysis("heads", model, quick=True) was a raw TypeError; a config's fields are keyword
    overrides as in the named functions (quick=True: HeadsConfig.preset(quick=True), the CLI's --quick), and a mistyped
    one is one ConfigError naming the close field, before any work."""
    from headscope.analyses.core import registry

    seen = []
    monkeypatch.setattr(registry, "get_analysis", lambda name: lambda model, task, config: seen.append(config))
    monkeypatch.setattr("headscope.analyses.core.runner.api_task", lambda model, name, task, seed: (task, None))
    monkeypatch.setattr("headscope.analyses.core.runner.with_task_used", lambda result, used: result)
    model = object()  # nothing reads it: the analysis is replaced, the config is what is checked
    hs.run_analysis("heads", model, quick=True, seed=3)
    assert seen == [hs.HeadsConfig.preset(quick=True, seed=3)] and seen[0].quick and seen[0].methods == ("gradient", "zero")
    with pytest.raises(ConfigError, match="run_analysis\\('heads'\\) has no setting 'qick'; did you mean 'quick'"):
        hs.run_analysis("heads", model, qick=True)
