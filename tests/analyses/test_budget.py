"""Cost models and budgets (#22 item 2): estimates counted against the passes that run, the cheap
ranking against the exact recomputed ordering, fitting and sharing a budget, and `--budget` in the
report. Row passes are counted independently of headscope's engines: a forward pre-hook on the last
layer's Hugging Face MLP module adds up the rows every pass (full, stacked or resumed) sends through it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import html
import json
import re

import pytest
import torch

from headscope.analyses.core import budget as B
from headscope.analyses.core.tasks import Task
from headscope.analyses.heads import cost as heads_cost
from headscope.analyses.heads.analysis import HeadsConfig
from headscope.analyses.heads.importance import make_scorer
from headscope.analyses.heads.pruning import PruningConfig, pruning_curve, pruning_curves
from headscope.errors import ConfigError


@contextlib.contextmanager
def counted_rows(model):
    """Rows through the last layer's HF MLP module while the block runs (a list holding the count)."""
    mlp = model.bridge.blocks[-1].mlp
    raw = getattr(mlp, "original_component", None) or mlp
    count = [0]
    handle = raw.register_forward_pre_hook(lambda mod, args: count.__setitem__(0, count[0] + args[0].shape[0]))
    try:
        yield count
    finally:
        handle.remove()


def _heads_config(**pruning) -> HeadsConfig:
    return HeadsConfig(methods=(), l0=None, n_induction=0, pruning=PruningConfig(**pruning))


@pytest.mark.parametrize("pruning", [
    dict(orderings=("random",), n_random=2, recompute=(False,), step=0.25),
    dict(orderings=("ablation",), recompute=(True,), step=0.25),
    dict(orderings=("ablation",), recompute=(True,), step=0.25, exact_limit=4),  # the cheap ranking
], ids=["random", "ablation_recompute", "cheap_ranking"])
@pytest.mark.parametrize("resumed", [False, True], ids=["full_passes", "resumed"])
def test_the_pruning_estimate_counts_the_rows_that_run(pruning, resumed, arch_models, mixed_tasks, monkeypatch):
    """gpt2 of the matrix: 2 layers x 4 heads. With full passes the count is the estimate; resumed
    passes (which reuse the clean run where no gate is closed) stay under it, as an upper bound
    should. Forward rows only: the cheap ranking's gate gradients count 3 per row in the estimate
    (a backward pass is two more) and 1 here."""
    from headscope.execution import resume

    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    if not resumed:
        monkeypatch.setattr(resume, "supports", lambda model: resume.Support(False, False, False))
    config = _heads_config(**pruning)
    scorer = make_scorer(model, task)
    pruning_curves(model, scorer, config.pruning)  # first use: one-time checks of the resumed engine
    with counted_rows(model) as count:
        pruning_curves(model, scorer, config.pruning)
    n, steps = len(task), 4  # prune_counts(8, 0.25) = [0, 2, 4, 6, 8]
    estimate = heads_cost.estimate(model, task, config).parts["pruning"]
    if pruning.get("exact_limit"):  # each step: gradients (3n estimated, n forward rows), then the candidates
        estimate -= 2 * n * steps
    # by hand: random: 2 seeds x 5 points; exact: n (1 + remaining) per step + the last point;
    # cheap: n (1 + candidates + 1) per step, candidates = min(remaining, max(2k, k + 8)) = remaining here
    by_hand = {"random": 2 * 5 * n, "ablation": n * (9 + 7 + 5 + 3) + n, "cheap": n * (1 + 9 + 1 + 7 + 1 + 5 + 1 + 3) + n}
    assert estimate == by_hand["cheap" if pruning.get("exact_limit") else pruning["orderings"][0]]
    if resumed:
        assert 0 < count[0] <= estimate
    else:
        assert count[0] == estimate


def test_the_rounding_floor_estimate_counts_the_null_ablation_rows(arch_models, mixed_tasks, monkeypatch):
    """The measured rounding floor (analyses/heads/rounding.py) on gpt2 of the matrix (2 layers), full passes: one
    capture of every head's z, the sweep's pass of the unedited copy and 4 gates x 2 layers null runs, n rows each,
    by hand n (2 + 8). (Resumed runs send as many rows through the last MLP, the counter, while their share of a
    pass's work is smaller: budget.resumed_share.)"""
    from headscope.analyses.heads import rounding
    from headscope.execution import resume

    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    monkeypatch.setattr(resume, "supports", lambda model: resume.Support(False, False, False))
    scorer = make_scorer(model, task)
    rounding.null_effects(model, scorer)  # first use: one-time checks
    with counted_rows(model) as count:
        rounding.null_effects(model, scorer)
    config = HeadsConfig(methods=("zero",), l0=None, n_induction=0, pruning=PruningConfig(orderings=()))
    assert count[0] == heads_cost.estimate(model, task, config).parts["rounding_floor"] == len(task) * (2 + 8)
    assert "rounding_floor" not in heads_cost.estimate(model, task, _heads_config(orderings=())).parts  # no ablation


def test_the_cheap_ranking_verifying_every_head_is_the_exact_ordering(arch_models, mixed_tasks):
    """With as many candidates as heads remain, the cheap ranking's exact verification is the exact
    recomputed zero-ablation ordering: the same heads removed at every step, the same curve."""
    model, task = arch_models("llama3"), mixed_tasks("llama3")
    scorer = make_scorer(model, task)
    exact = pruning_curve(model, scorer, ordering="ablation", recompute=True, config=PruningConfig(step=0.25))
    cheap = pruning_curve(model, scorer, ordering="ablation", recompute=True,
                          config=PruningConfig(step=0.25, exact_limit=4))
    assert cheap["pruned"].tolist() == exact["pruned"].tolist()
    assert cheap["metric"].to_numpy() == pytest.approx(exact["metric"].to_numpy(), abs=1e-4)


def test_fitting_applies_the_knobs_in_order_and_records_what_changed(arch_models, mixed_tasks, monkeypatch):
    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    per_flop = 1.0 / B.flops_per_row(model, task.tokens.shape[1])
    monkeypatch.setattr(B, "_rate", lambda model, length: per_flop)  # about one second a row pass
    config = HeadsConfig.preset()
    free = B.fit(model, heads_cost.COST, task, config, None)
    assert free.config == config and free.changed == {} and free.seconds == pytest.approx(free.cost.total)
    budget = free.seconds / 3
    fitted = B.fit(model, heads_cost.COST, task, config, budget)
    assert fitted.seconds <= budget < free.seconds
    assert set(fitted.changed) == {"pruning.n_random", "l0.steps"}, fitted.changed  # the first two knobs, in order:
    assert fitted.changed["pruning.n_random"] == [5, 1]  # the first gives all it has first
    assert heads_cost.fewer_random(fitted.config, model) is None
    steps = fitted.config.l0.steps
    assert fitted.changed["l0.steps"] == [200, steps] and steps < 200
    undone = dataclasses.replace(fitted.config, l0=dataclasses.replace(fitted.config.l0, steps=steps * 2))
    assert heads_cost.estimate(model, task, undone).total > budget  # no more than the budget needs
    # the estimate itself, by hand for the L0 part: lambdas x (steps x 3 x min(batch, n) + n)
    n = len(task)
    assert fitted.cost.parts["l0"] == 5 * (steps * 3 * min(32, n) + n)


def test_the_examples_knob_records_nothing_when_the_task_has_fewer_rows(arch_models, mixed_tasks, monkeypatch):
    """A user's task of 6 rows: halving kv's 128 examples changes nothing until the count falls below
    6, and the floor (8) stops it first, so no n_examples change is recorded; a task of 40 rows
    records the count that first cut it, and its estimate counts that many rows."""
    from headscope.analyses.kv import cost as kv_cost
    from headscope.analyses.kv.analysis import KVConfig

    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    monkeypatch.setattr(B, "_rate", lambda model, length: 1.0 / B.flops_per_row(model, task.tokens.shape[1]))
    assert len(task) < B.MIN_EXAMPLES
    fitted = B.fit(model, kv_cost.COST, task, KVConfig(), 1e-3)
    assert fitted.changed == {} and fitted.config == KVConfig()
    tokens = torch.randint(0, int(model.facts.d_vocab), (40, 12), generator=torch.Generator().manual_seed(0))
    big = Task(name="big", tokens=tokens, answers=tokens[:, 3], wrong_answers=tokens[:, 4])
    fitted = B.fit(model, kv_cost.COST, big, KVConfig(), 1e-3)
    assert fitted.changed == {"n_examples": [None, B.MIN_EXAMPLES]}
    assert fitted.cost.parts["states"] == 4 * B.MIN_EXAMPLES


class _GPT2SmallShape:
    """GPT-2 small's facts (12 x 12 heads, 124M parameters on the meta device), for estimates only."""

    def __init__(self) -> None:
        import types

        self.facts = types.SimpleNamespace(n_layers=12, n_heads=12, d_model=768, n_ctx=1024, is_encoder=False)
        params = [torch.empty(124_000_000, device="meta")]
        self.bridge = types.SimpleNamespace(parameters=lambda: params)

    def n_active_hooks(self) -> int:
        return 0

    def hook_free(self) -> bool:
        return True


def test_after_the_gradient_only_resort_the_examples_come_back_while_they_fit(monkeypatch):
    """The heads knobs cut the examples to 8 before the last resort (gradient importance only),
    which frees most of the estimate; fit then doubles the examples back while the estimate fits."""
    from headscope.analyses.heads.cost import gradient_only

    model, task = _GPT2SmallShape(), None
    monkeypatch.setattr(B, "_rate", lambda model, length: 1.0 / B.flops_per_row(model, 64))  # one second a row pass
    config = HeadsConfig.preset()
    lean = gradient_only(dataclasses.replace(config, n_examples=B.MIN_EXAMPLES), model)
    lean = dataclasses.replace(lean, pruning=dataclasses.replace(lean.pruning, n_random=1, recompute=(False,)),
                               l0=None, best_head=False)
    at = {n: heads_cost.estimate(model, task, dataclasses.replace(lean, n_examples=n)).total for n in (8, 16, 32, 64)}
    budget = (at[16] + at[32]) / 2  # room for 16 examples, not 32
    with_zero = dataclasses.replace(lean, methods=("gradient", "zero"))
    assert heads_cost.estimate(model, task, with_zero).total > budget  # so the last resort is needed
    fitted = B.fit(model, heads_cost.COST, task, config, budget)
    assert fitted.config.methods == ("gradient",) and fitted.config.n_examples == 16
    assert fitted.changed["n_examples"] == [None, 16]
    assert fitted.seconds <= budget


def test_a_default_run_cut_below_the_quick_presets_examples_records_it(monkeypatch):
    """Review 11b C3: on a slow machine the default heads run was cut to 8 examples where --quick runs 16 (the
    heads presets: 64 full, 16 quick); summary["budget"] records both counts, and not when the cut stays above 16
    or the run is --quick itself."""
    model = _GPT2SmallShape()
    monkeypatch.setattr(B, "_rate", lambda model, length: 1.0 / B.flops_per_row(model, 64))  # one second a row pass
    config = HeadsConfig.preset()
    tiny = B.fit(model, heads_cost.COST, None, config, 1.0)  # nothing fits: every knob at its smallest
    assert tiny.config.n_examples == 8 and tiny.summary()["below_quick"] == {"n_examples": [8, 16]}
    roomy = B.fit(model, heads_cost.COST, None, config, heads_cost.estimate(model, None, config).total * 0.9)
    assert roomy.changed and roomy.config.examples(64, 16) > 16 and "below_quick" not in roomy.summary()
    quick = B.fit(model, heads_cost.COST, None, HeadsConfig.preset(quick=True), 1.0)
    assert quick.config.n_examples == 8 and "below_quick" not in quick.summary()


def test_allocate_gives_cheap_analyses_what_they_need_and_shares_the_rest():
    assert B.allocate({"a": 10, "b": 20}, 100) == {"a": 10, "b": 20}
    assert B.allocate({"a": 10, "b": 200, "c": 300}, 100) == {"a": 10, "b": 45, "c": 45}
    assert B.allocate({"a": 60, "b": 60}, 100) == {"a": 50, "b": 50}
    # weights: a costly analysis of weight 2 gets twice the share of one of weight 1
    assert B.allocate({"a": 10, "b": 200, "c": 300}, 100, {"c": 2}) == pytest.approx({"a": 10, "b": 30, "c": 60})
    assert B.allocate({"a": 10, "b": 20, "c": 300}, 100, {"c": 2}) == {"a": 10, "b": 20, "c": 70}
    with pytest.raises(ConfigError):
        B.allocate({"a": 1}, 0)


def test_the_seconds_a_coarse_knob_leaves_go_to_the_other_cut_analyses(monkeypatch):
    """Counted by hand, one second a row pass: two analyses of 100 passes, a 2.4-minute budget
    keeps back 21.6 s (15%), so each gets 61.2 s. "halves" can only halve (50 passes: 11.2 s
    unused), "fives" steps by 5 (60). The unused 12.4 s go half to each: "halves" still cannot
    use 56.2 s, "fives" takes 65 of its 66.2; the next round's 7.4 s buys nothing more."""
    @dataclasses.dataclass(frozen=True)
    class Config:
        n: int = 100

    def costing(step):
        return B.CostModel(estimate=lambda model, task, c: B.Cost(parts={"passes": c.n}, n_pos=16),
                           knobs=(lambda c, model: dataclasses.replace(c, n=step(c.n)) if c.n > 1 else None,))

    monkeypatch.setattr(B, "seconds_per_pass", lambda model, n_pos: 1.0)
    entries = {"halves": (costing(lambda n: n // 2), None, Config()), "fives": (costing(lambda n: n - 5), None, Config())}
    assert B.kept_back(144, 2) == pytest.approx(21.6)
    fitted = B.plan(object(), entries, 2.4)
    assert {name: f.config.n for name, f in fitted.items()} == {"halves": 50, "fives": 65}
    assert fitted["fives"].changed == {"n": [100, 65]}
    assert sum(f.seconds for f in fitted.values()) <= 144 - 21.6
    monkeypatch.setattr(B, "SPARE_ROUNDS", 0)
    assert B.plan(object(), entries, 2.4)["fives"].config.n == 60  # the equal shares alone


def test_a_report_budget_shrinks_the_sweeps_and_says_so(tmp_path, capsys, monkeypatch):
    """The budget's settings rest on a speed timed at the start of the run (review 10a A2): with a fake timing
    of 2.5e-9 s per flop the manifest records it and the report says, in the section and its Provenance, that
    the budget was fitted to it, that another run may fit differently and how to run the preset in full."""
    from headscope.cli import main

    monkeypatch.setattr(B, "_rate", lambda model, length: 2.5e-9)
    out = tmp_path / "out"
    code = main(["-q", "heads", "--quick", "--device", "cpu", "--budget", "0.02", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "heads" / "summary.json").read_text(encoding="utf-8"))
    budget = summary["budget"]
    assert budget["changed"], budget
    changed = budget["changed"]
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["config"]["budget_minutes"] == 0.02
    # 1.2 s: 5 s per analysis would be kept back for figures and files, at most half the budget
    assert manifest["budget"]["heads"]["budget_s"] == pytest.approx(0.6, abs=0.1)
    speed = manifest["budget"]["heads"]["speed"]
    assert speed["seconds_per_flop"] == 2.5e-9 and speed["rows"] * speed["length"] == 256 and speed["threads"] >= 1
    measured = (f"2.5e-09 s per flop (a forward pass of {speed['rows']} x {speed['length']} random tokens in "
                f"{speed['pass_s']:.2g} s on {speed['device']}, {speed['threads']} thread")
    md = (out / "report.md").read_text(encoding="utf-8")
    md = html.unescape(re.sub(r"\\(.)", r"\1", md))  # report.md's escapes undone
    first = next(iter(changed))
    assert (f"the budget (fitted to this machine's speed measured at the start of the run: {measured}") in md
    assert (f") changed {first} {changed[first][0]} -> {changed[first][1]}") in md
    assert "; another run may fit differently; --budget inf runs the preset in full" in md
    assert (f"- budget: 0.02 minutes, fitted to this machine's speed measured at the start of the run: {measured}") in md
    if "pruning.n_random" in changed:  # the random band has as many seeds as the budget left
        import pandas as pd

        curve = pd.read_csv(out / "heads" / "curve.csv")
        assert curve.loc[curve["ordering"] == "random", "seed"].nunique() == changed["pruning.n_random"][1]
    with pytest.raises(SystemExit):
        main(["heads", "--budget", "soon"])
    assert main(["-q", "heads", "--quick", "--budget", "-1", "--out", str(tmp_path / "neg")]) == 2
    assert "must be positive" in capsys.readouterr().err


def test_mlp_on_a_subset_of_layers_gives_those_layers_rows_of_the_full_run(arch_models):
    """The mlp knob analyses fewer layers: what it keeps equals the full run's rows for those layers."""
    import headscope as hs

    model = arch_models("llama3")
    config = hs.MLPConfig.preset(quick=True, n_examples=4)
    full = hs.run_analysis("mlp", model, None, config)
    last = model.facts.n_layers - 1
    part = hs.run_analysis("mlp", model, None, dataclasses.replace(config, layers=(last,)))
    keep = full.df[full.df["layer"] == last].reset_index(drop=True)
    assert part.df.reset_index(drop=True).equals(keep)
    assert part.tables["agreement"]["layer"].tolist() == [last]
    assert set(part.tables["top_neurons"]["layer"]) == {last}
    mine = part.tables["top_neurons"][["neuron", "value_tokens", "triggers"]].reset_index(drop=True)
    theirs = full.tables["top_neurons"].query("layer == @last")[["neuron", "value_tokens", "triggers"]]
    assert mine.head(len(theirs)).equals(theirs.reset_index(drop=True).head(len(mine)))


def test_a_knob_that_only_shortens_the_prompts_is_kept(monkeypatch):
    """Position's pairs knob halves the prompt length, not the row passes: fit weighs seconds (row
    passes x the seconds of a pass at that length), so the shorter prompts are kept and the examples
    stay. Counted by hand on GPT-2 small's shape: 8 examples x 5 gold slots, each a plain run and two
    StreamingLLM runs, + each example's no-gold prompt once (128 passes of 1,024 tokens); without the
    masked runs 48; with 5 pairs instead of 10 the prompts are 512 tokens."""
    from headscope.analyses.position import cost as position_cost
    from headscope.analyses.position.analysis import PositionConfig

    model = _GPT2SmallShape()
    monkeypatch.setattr(B, "_rate", lambda model, length: 1.0 / B.flops_per_row(model, 1024))  # 1 s a 1,024-token pass
    params, d, layers = 124_000_000, 768, 12
    flops = lambda n_pos: n_pos * (2.0 * params + 4.0 * layers * n_pos * d)  # noqa: E731
    config = dataclasses.replace(PositionConfig.preset(quick=True), generate=False)
    assert B.fit(model, position_cost.COST, None, config, None).seconds == pytest.approx(8 * (5 * 3 + 1))
    fitted = B.fit(model, position_cost.COST, None, config, 30)
    assert fitted.changed == {"window": [None, 0], "n_items": [None, 5]}, fitted.changed
    assert (fitted.cost.total, fitted.cost.n_pos) == (8 * (5 + 1), 512)
    assert fitted.seconds == pytest.approx(48 * flops(512) / flops(1024))


def test_the_probes_estimate_counts_the_fits_and_samples_that_run(arch_models, mixed_tasks, monkeypatch):
    """The fits, their training samples and classes the probes estimate counts equal those
    scikit-learn receives in the run (a recorder on LogisticRegression.fit): every layer x fold x
    strength, for the labels and the control task, each on (folds - 1) / folds of the real tokens
    (position buckets on a left-padded mixed-length task: the attention mask's sum)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from headscope.analyses.probes import cost as probes_cost
    from headscope.analyses.probes.analysis import ProbesConfig, run

    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    real = int(task.attention_mask.sum())
    seen, fit = [], LogisticRegression.fit

    def recorded(self, x, y, *args, **kwargs):
        seen.append((len(x), len(np.unique(y))))
        return fit(self, x, y, *args, **kwargs)

    monkeypatch.setattr(LogisticRegression, "fit", recorded)
    config = ProbesConfig(labels="position_bucket", cv=3, capacity=False)
    run(model, task, config)
    monkeypatch.setattr(LogisticRegression, "fit", fit)  # the estimate's own timed fits are not the run's
    assert len(seen) == model.facts.n_layers * 3 * 2
    assert sum(n for n, _ in seen) == pytest.approx(len(seen) * real * 2 / 3, abs=len(seen))  # 3-fold training splits
    from headscope.analyses.probes import analysis as probes_analysis

    reads, probe_data = [], probes_analysis.probe_data
    monkeypatch.setattr(probes_analysis, "probe_data", lambda *a: reads.append(1) or probe_data(*a))
    probes_cost._DATA.clear()
    assert probes_cost._data(model, task, config) == (real, max(c for _, c in seen), task.tokens.shape[1])
    assert probes_cost.estimate(model, task, config).n_pos == task.tokens.shape[1]
    assert len(reads) == 1  # read once; `fit` asks at every knob step
    monkeypatch.setattr(probes_cost, "iteration_seconds", lambda: (1.0, 0.0))  # the fixed part only
    assert probes_cost.estimate(model, task, config).extra_s == pytest.approx(len(seen) * probes_cost.MIN_ITERATIONS)
    monkeypatch.setattr(probes_cost, "iteration_seconds", lambda: (0.0, 1.0))  # the data part only
    classes = max(c for _, c in seen)
    want = probes_cost.ITERATIONS * model.facts.d_model * classes * sum(n for n, _ in seen)
    assert probes_cost.estimate(model, task, config).extra_s == pytest.approx(want, rel=0.02)


@pytest.mark.parametrize("n,n_pos,first,sites,per_forward", [
    (4, 24, 7, ("resid_pre",), None),  # one pass per sub-segment
    (3, 40, 0, ("resid_pre",), 3),  # passes of 3 runs: each starts at its own first position
    (2, 12, 5, ("resid_pre", "head_out", "head_out_by_pos"), 5),
])
def test_the_patching_estimate_counts_the_positions_that_run(n, n_pos, first, sites, per_forward, tiny_dirs,
                                                             monkeypatch):
    """On a 3-layer GPT-2 whose clean and corrupted prompts differ from `first` on, the positions
    the exact sweep computes (each block's Hugging Face q/k/v projection's forward, wrapped to add up
    rows x positions, less the captured pass; a wrapper, not a torch hook, since any hook sends
    resumed sweeps through full passes) equal the estimate: resid_pre cells exactly (L blocks a
    pass for a run at layer 0, fewer later); head cells skip their block's attention (the z
    shortcut), so they add up to the estimate's whole blocks x (L - 1) / (L + 1)."""
    import headscope as hs
    from headscope.analyses.patching import cost as patching_cost
    from headscope.analyses.patching import engine
    from headscope.analyses.patching.analysis import PatchingConfig, activation_patching
    from tests_support import build_tiny_model, random_tokens

    if per_forward:
        monkeypatch.setattr(engine, "runs_per_forward", lambda *a, **k: per_forward)
    model = hs.load_model(build_tiny_model("gpt2", tiny_dirs["gpt2"].parent / "gpt2-3l", seed=2, n_layer=3))
    L, vocab = model.facts.n_layers, model.facts.d_vocab
    clean = random_tokens(n, n_pos, seed=3)
    corrupted = clean.clone()
    corrupted[:, first:] = 4 + (clean[:, first:] - 4 + 1 + torch.arange(n_pos - first) % 50) % (vocab - 4)
    assert (corrupted[:, first:] != clean[:, first:]).all()
    answers = torch.arange(n) + 5
    task = Task(name="t", tokens=clean, corrupted_tokens=corrupted, answers=answers, wrong_answers=answers + 3)
    raw = lambda m: getattr(m, "original_component", None) or m  # noqa: E731
    qkv = [raw(raw(raw(block).attn).c_attn) for block in model.bridge.blocks]
    counted = [0]

    def counting(forward):
        def wrapped(x, *args, **kwargs):  # rows x positions
            counted[0] += x.shape[0] * x.shape[1]
            return forward(x, *args, **kwargs)
        return wrapped

    for site in sites:
        activation_patching(model, task, [site])  # first use: resume's one-time checks
        counted[0] = 0
        for m in qkv:
            m.forward = counting(m.forward)  # an instance attribute: nn.Module.__call__ finds it first
        try:
            activation_patching(model, task, [site])
        finally:
            for m in qkv:
                del m.forward
        positions = counted[0] - L * 2 * n * n_pos  # less the captured clean + corrupted pass
        config = PatchingConfig(sites=(site,), trace_samples=0, path_patching=False)
        blocks = patching_cost.estimate(model, task, config).parts[f"exact_{site}"] * n_pos * L
        if site == "resid_pre":
            assert positions == pytest.approx(blocks, rel=1e-9)
        else:
            assert positions == pytest.approx(blocks * (L - 1) / (L + 1), rel=1e-9)
    assert patching_cost.first_difference(task, n) == first


def test_patching_drops_its_head_sweep_only_after_the_examples(arch_models, mixed_tasks, monkeypatch):
    """Patching's knobs end with resid_pre alone: a budget its smallest two-site run (4 examples,
    resid_pre and head_out) fits keeps head_out; a smaller one drops it, at 4 examples."""
    from headscope.analyses.patching import cost as patching_cost
    from headscope.analyses.patching.analysis import PatchingConfig

    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    monkeypatch.setattr(B, "_rate", lambda model, length: 1.0 / B.flops_per_row(model, task.tokens.shape[1]))
    config = PatchingConfig.preset(quick=True)
    floor = dataclasses.replace(config, n_examples=4, sites=("resid_pre", "head_out"), trace_samples=0, path_patching=False)
    floor_s = patching_cost.estimate(model, task, floor).total  # 1 s a row pass
    kept = B.fit(model, patching_cost.COST, task, config, floor_s * 1.01)
    assert kept.config.sites == ("resid_pre", "head_out") and kept.config.n_examples == 4
    cut = B.fit(model, patching_cost.COST, task, config, floor_s * 0.5)
    assert cut.config.sites == ("resid_pre",) and cut.config.n_examples == 4
    assert cut.changed["sites"] == [None, ["resid_pre"]]


def test_a_pass_is_priced_at_the_rate_of_a_pass_about_its_length(monkeypatch):
    """seconds_per_pass uses the rate timed at the largest power of two up to min(n_pos, 64) tokens
    (short passes' fixed costs weigh more), times the pass's own flops; past the context, the context."""
    model = _GPT2SmallShape()
    asked = []
    monkeypatch.setattr(B, "_rate", lambda model, length: asked.append(length) or 1e-12 * length)
    for n_pos, length in ((1, 1), (9, 8), (19, 16), (64, 64), (1000, 64), (5000, 64)):
        got = B.seconds_per_pass(model, n_pos)
        assert asked[-1] == length
        assert got == pytest.approx(1e-12 * length * B.flops_per_row(model, min(n_pos, 1024)))


def test_one_estimate_that_fails_leaves_the_others_fitted_and_names_its_analysis(monkeypatch, caplog):
    """Review 9a C7: position's estimate raised on its default data and every analysis lost its estimate, with a
    warning quoting a UUID and no analysis. Now the failing one runs at its preset, named; the other is fitted
    as if alone (100 passes at one second each, by hand)."""
    @dataclasses.dataclass(frozen=True)
    class Config:
        n: int = 100

    def broken(model, task, config):
        raise ConfigError("the tokenizer maps part of 'd9a38245' to its unknown token")

    monkeypatch.setattr(B, "seconds_per_pass", lambda model, n_pos: 1.0)
    ok = B.CostModel(estimate=lambda model, task, c: B.Cost(parts={"passes": c.n}, n_pos=16))
    with caplog.at_level("WARNING"):
        fitted = B.plan(object(), {"position": (B.CostModel(estimate=broken), None, Config()),
                                   "heads": (ok, None, Config())}, None)
    assert set(fitted) == {"heads"} and fitted["heads"].seconds == 100.0
    assert "position: no cost estimate (ConfigError: the tokenizer maps part of 'd9a38245'" in caplog.text


def test_a_cut_that_fails_the_cost_models_check_is_not_taken(caplog):
    """A knob's cut that its family's check says cannot run (position: prompts past the context) is not taken:
    fit stops at the last cut that runs, even with the estimate still over the budget (review 11c A2: a budget
    must never fail an analysis the uncut preset runs). Hand-built: 1 s per unit of x, x halved from 16; the
    check refuses x < 4, so a budget of 1 s ends at x = 4 (4 s), not 1."""
    @dataclasses.dataclass(frozen=True)
    class Config:
        x: int = 16

    def halve(config, model):
        return dataclasses.replace(config, x=config.x // 2) if config.x > 1 else None

    estimate = lambda model, task, config: B.Cost(parts={"x": config.x}, n_pos=1)  # noqa: E731
    cm = B.CostModel(estimate=estimate, knobs=(halve,), check=lambda model, task, config: config.x >= 4)
    with caplog.at_level("INFO", logger="headscope.analyses.core.budget"), \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(B, "seconds_per_pass", lambda model, n_pos: 1.0)
        mp.setattr(B, "speed_record", lambda model, n_pos: None)
        fitted = B.fit(object(), cm, None, Config(), 1.0)
    assert fitted.config == Config(x=4) and fitted.changed == {"x": [16, 4]} and fitted.seconds == 4.0
    assert "a cut of halve would not run (x 4 -> 2); kept at the last cut that runs" in caplog.text


def test_a_budget_cut_of_a_fitted_json_kv_run_keeps_its_format_and_fits(arch_models):
    """Review 11c A2 on a 256-token GPT-2 with a byte-level BPE: the fitted json_kv run has keys of 8 hex digits
    under Liu et al.'s instruction; the budget's pairs cut (n_items None -> 3) used to switch to UUID pairs of
    about 400 tokens and fail the run. Now the cut keeps the 8-hex format, its prompts fit (counted by the
    tokenizer from the decoded text), the estimate prices the tokens they have, and the cut config runs."""
    from headscope.analyses.position import cost as position_cost
    from headscope.analyses.position import prompts as pp
    from headscope.analyses.position.analysis import PositionConfig, build_sweeps, position_bias

    model = arch_models("gpt2")
    tok, n_ctx = model.tokenizer, model.facts.n_ctx
    assert n_ctx == 256
    def keys(config):  # (hex digits of each key in the decoded prompt, has the instruction, tokens by the tokenizer)
        sweeps = build_sweeps(model, config)
        text = tok.decode(sweeps[0].tokens[0], skip_special_tokens=True)
        found = re.findall(r'"([0-9a-f-]+)": "[0-9a-f-]+"', text)
        longest = max(len(tok(tok.decode(sw.tokens[0]))["input_ids"]) + sw.answer_ids.numel() + 8 for sw in sweeps)
        return {len(k) for k in found}, "JSON object" in text, len(found), longest

    preset = dataclasses.replace(PositionConfig.preset(quick=True), generate=False)
    fitted_keys, fitted_instr, fitted_pairs, _ = keys(preset)
    assert fitted_keys == {8} and fitted_instr and fitted_pairs > 3
    uuids = pp.kv_sweeps(tok, n_pairs=3, n_examples=1)[0]  # the old cut's prompts: 3 UUID pairs, past the context
    assert len(tok(tok.decode(uuids.tokens[0]))["input_ids"]) > n_ctx
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(B, "_rate", lambda model, length: 1e-12)
        free = B.fit(model, position_cost.COST, None, preset, None)
        cut = B.fit(model, position_cost.COST, None, preset, free.seconds * 0.1)
    assert cut.changed["n_items"] == [None, fitted_pairs // 2 if fitted_pairs // 2 >= 3 else 3], cut.changed
    cut_keys, cut_instr, cut_pairs, cut_tokens = keys(cut.config)
    assert (cut_keys, cut_instr, cut_pairs) == ({8}, True, cut.config.n_items) and cut_tokens <= n_ctx
    assert cut.cost.n_pos == max(sw.prompt_len for sw in build_sweeps(model, cut.config)) < free.cost.n_pos
    result = position_bias(model, config=dataclasses.replace(cut.config, n_examples=2, n_boot=20, progress=False))
    assert result.summary["n_items"] == cut_pairs
    assert result.summary["n_items_note"] == (f"{cut_pairs} pairs as set, keys and values of 8 hex digits, with Liu "
                                              "et al.'s instruction: the longest format whose prompts fit context 256")
    too_many = dataclasses.replace(preset, n_items=60)  # 60 pairs fit no format in 256 tokens: the check refuses
    assert position_cost.prompts_fit(model, None, cut.config) and not position_cost.prompts_fit(model, None, too_many)


def test_patching_gives_back_what_fits_after_a_larger_cut_cheapest_first(monkeypatch):
    """Review 18d C5: fit cut path patching first, then site groups until dropping attn_out/mlp_out made the plan fit,
    and never gave path patching back, so a full run had less patching than --quick. A hand plan, 1 s a row pass,
    per example: clean 2, resid_pre 3, head_out 3, resid_mid 9, resid_post 9, attn_out 20, mlp_out 20,
    head_out_by_pos 40, q/k/v/pattern 5 each, path patching 11 (137 in all); 32 examples, budget 40 x 32 = 1280 s.
    The cuts: no path patching 126, no head_out_by_pos 86, no q/k/v/pattern 66, no resid_mid/post 48 (1536 s, over),
    no attn_out/mlp_out 8 (256 s: fits; the old plan stopped here). Given back, cheapest first: path patching
    (19 x 32 = 608 s; resid_mid/post 896, q/k/v/pattern 896), then resid_mid/post (37 x 32 = 1184 s; q/k/v/pattern
    would be 39 x 32 = 1248), then nothing (q/k/v/pattern 57 x 32, attn_out/mlp_out 77 x 32: over)."""
    from headscope.analyses.patching import cost as patching_cost
    from headscope.analyses.patching.analysis import PatchingConfig

    per_site = {"resid_pre": 3, "head_out": 3, "resid_mid": 9, "resid_post": 9, "attn_out": 20, "mlp_out": 20,
                "head_out_by_pos": 40, "q": 5, "k": 5, "v": 5, "pattern": 5}

    def estimate(model, task, config):
        n = config.examples(patching_cost.FULL, patching_cost.QUICK)
        parts = {"clean_corrupted": 2 * n, **{s: per_site[s] * n for s in patching_cost._sites(config)}}
        return B.Cost(parts={**parts, **({"path_patching": 11 * n} if config.path_patching else {})}, n_pos=16)

    monkeypatch.setattr(B, "seconds_per_pass", lambda model, n_pos: 1.0)
    monkeypatch.setattr(B, "speed_record", lambda model, n_pos: None)
    config = dataclasses.replace(PatchingConfig.preset(), trace_samples=0)
    assert estimate(None, None, config).total == 137 * 32
    cost = B.CostModel(estimate=estimate, knobs=patching_cost.COST.knobs)
    fitted = B.fit(None, cost, None, config, 1280.0)
    assert fitted.config.path_patching is True and fitted.seconds == 37 * 32
    assert fitted.config.sites == ("resid_pre", "resid_mid", "resid_post", "head_out")
    assert fitted.changed == {"sites": [None, ["resid_pre", "resid_mid", "resid_post", "head_out"]]}
    roomy = B.fit(None, cost, None, config, 137 * 32)  # the preset fits: nothing cut, nothing to give back
    assert roomy.config == config and roomy.changed == {}
    floor = B.fit(None, cost, None, config, 5 * 4 + 1)  # resid_pre alone at 4 examples (5 x 4 = 20 s); head_out no
    assert floor.config.sites == ("resid_pre",) and floor.config.n_examples == 4 and not floor.config.path_patching
