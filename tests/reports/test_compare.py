"""`headscope compare`: two hand-made output folders side by side, differences called out, strings escaped."""
from __future__ import annotations

import html
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from headscope.cli import main
from headscope.reports import io
from headscope.reports.compare import (
    NO_INTERVAL,
    NOT_COMPARED,
    SAME,
    Run,
    compare_html,
    importance_section,
    patching_section,
    position_section,
    pruning_section,
    settings_notes,
)
from headscope.reports.compare_headlines import headline_notes

XSS = "<img src=x onerror=alert(1)>"


def _folder(root, name: str, sign: float, top_layer: int, prunable: float, quick: bool = False, n: int = 4):
    """An output folder with heads (importance = sign x a fixed grid, a pruning curve), position and patching."""
    root.mkdir(parents=True)
    io.write_json(root / "manifest.json", {"model": {"name": name}, "config": {"analyses": ["heads", "position", "patching"],
                                                                               "task": XSS, "quick": quick}, "seed": int(quick),
                                           "versions": {"torch": "2.13.0" if quick else "2.12.1", "numpy": "2.4.6"}})
    grid = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]]
    rows = [{"layer": l, "head": h, "method": "gradient", "importance": sign * grid[l][h], "importance_layer_norm": 0.0}
            for l in range(2) for h in range(3)]  # the raw column is what the reports' findings rank by
    io.write_csv(root / "heads" / "results.csv", pd.DataFrame(rows))
    io.write_csv(root / "heads" / "curve.csv", pd.DataFrame({
        "ordering": "gradient", "recompute": False, "seed": 0, "fraction_pruned": [0.0, 0.5, 1.0], "metric": [3.0, 2.0, 0.0]}))
    io.write_json(root / "heads" / "summary.json", {"metric": "logit_diff", "baseline_metric": 3.0, "n_heads": 6,
                                                    "n_examples": n, "max_fraction_prunable_gradient": prunable})
    io.write_csv(root / "position" / "curve.csv", pd.DataFrame({
        "condition": "full", "metric": "accuracy", "position": [1, 2, 3], "mean": [0.9, 0.5 + sign * 0.1, 0.8]}))
    io.write_json(root / "position" / "summary.json", {"primary_metric": "accuracy",
                                                       "ratio_middle_to_ends": {"accuracy": (0.5 + sign * 0.1) / 0.9}})
    io.write_json(root / "patching" / "summary.json", {"top_sites": {"resid_pre": [
        {"layer": top_layer, "head": None, "pos": 2, "token": f"2: {XSS}", "effect": 1.5}]}})


def test_compare_page_sets_both_side_by_side_and_calls_out_differences(tmp_path):
    _folder(tmp_path / "a", "model-a", 1.0, 0, 0.5)
    _folder(tmp_path / "b", f"model-b {XSS}", -1.0, 1, 0.0, quick=True, n=16)
    page_path = tmp_path / "cmp.html"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(page_path)]) == 0
    page = page_path.read_text()
    assert XSS not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "model-a" in page and "model-b" in page
    settings = page[page.index("id='settings'"):page.index("id='differences'")]
    for line in ("--quick: A False, B True.", "seed: A 0, B 1.", "torch version: A 2.12.1, B 2.13.0.",
                 "heads examples: A 4, B 16.", "model: A model-a, B model-b &lt;img"):
        assert line in settings, line
    assert "numpy" not in settings and "task:" not in settings and "position examples" not in settings  # equal ones
    assert "Head importance (gradient importance): Pearson r = -1.00 between A and B" in page  # B's raw importance is -A's
    assert ("Top heads by gradient: 4 of the top 5 are shared (L1H1, L1H0, L0H2, L0H1): A L1H2, L1H1, L1H0, L0H2, L0H1; "
            "B L0H0, L0H1, L0H2, L1H0, L1H1 (n differs: 4 vs 16 examples, a setting, not the model: other example sets, "
            "intervals of other widths).") in page  # A leaves out L0H0, B L1H2 (results.csv's top 5: no top_heads_ key)
    # the runs ranked heads on different examples: the counts are not compared (re-ranking is outside any interval)
    refused = page[page.index("id='not-compared'"):]
    assert ("Prunable within 1% by gradient (the ordering both heads findings lead with): A 50%, B 0% (n differs: 4 vs 16 "
            "examples, a setting, not the model: other example sets, intervals of other widths): not compared: different "
            "models (model-a vs model-b &lt;img src=x onerror=alert(1)&gt;, 6 heads each), each ranking its own heads, and "
            "the runs ranked heads on different examples (examples 4 vs 16, seed 0 vs 1, model model-a vs model-b &lt;img"
            ) in refused
    assert "Prunable within 1%" not in page[page.index("id='differences'"):page.index("id='not-compared'")]
    assert ("<li>Position curves and middle/ends ratio: not compared: A and B swept different prompts (model model-a vs "
            "model-b &lt;img src=x onerror=alert(1)&gt;, seed 0 vs 1), and a slot is a place in each run&#x27;s own prompts, "
            "so the curves are of different prompts.</li>") in page  # the x axis is a slot of each run's own prompts
    assert 'alt="head importance of A and B on one sequential scale from 0 (|dL/d gate|), and B - A on its own' in page
    # seeds (and models) differ: the runs patched different prompts, so positions are not compared
    assert "Top resid_pre site differs" not in page
    assert ("Top resid_pre sites are not compared end-aligned: A and B patched different prompts (model model-a vs model-b "
            "&lt;img src=x onerror=alert(1)&gt;, seed 0 vs 1), and a position names a token of the prompts its own run patched."
            ) in page
    assert page.count("<em>blank: positions are not compared: A and B patched different prompts") == 2
    assert page.count("<img alt=") == 2  # importance, pruning curves (no position overlay of different prompts)
    assert "src=\"http" not in page and "<script" not in page


def test_compare_refuses_what_it_cannot_read_or_would_overwrite(tmp_path, capsys):
    _folder(tmp_path / "a", "m", 1.0, 0, 0.5)
    page = tmp_path / "cmp.html"
    page.write_text("mine")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--out", str(page)]) == 2
    assert page.read_text() == "mine" and "--force" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "nothing"), "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "not a headscope output folder" in err and len(err.strip().splitlines()) == 1
    # --force, in a fresh process whose logging the CLI sets up: its own INFO lines show, matplotlib's and datasets' do not
    code = ("import logging, sys; from headscope.cli import main\n"
            "code = main(['compare', sys.argv[1], sys.argv[1], '--out', sys.argv[2], '--force'])\n"
            "for name in ('headscope.reports', 'matplotlib.category', 'datasets.builder'):\n"
            "    logging.getLogger(name).info('line from %s', name)\n"
            "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a"), str(page)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "No difference above the thresholds." in page.read_text()
    assert "The runs share every recorded setting." in page.read_text()
    assert "line from headscope.reports" in proc.stderr
    assert "matplotlib" not in proc.stderr and "datasets" not in proc.stderr


def _run(root, *, task: str, n: int, baseline: float, ci: list[float], unevicted: float, kv_ci: list[float],
         status: dict | None = None):
    """A folder with heads and kv summaries carrying the chance guard's interval of their clean means, and the
    section provenance (task.json) each run writes; `status` marks analyses that did not finish."""
    status = status or {"heads": "done", "kv": "done"}
    io.write_json(root / "manifest.json", {"model": {"name": "m"}, "seed": 0, "status": status,
                                           "config": {"analyses": ["heads", "kv"], "task": None},
                                           "task_used": {"heads": "default task", "kv": "default task"}})
    summaries = {"heads": {"metric": "logit_diff", "baseline_metric": baseline, "n_examples": n, "task": task,
                           "chance": {"mean": baseline, "ci": ci}},
                 "kv": {"metric": "logit_diff", "metric_unevicted": unevicted, "n_examples": n, "task": task,
                        "chance": {"mean": unevicted, "ci": kv_ci}, "budget": {"changed": {"n_examples": [64, n]}}}}
    for name, summary in summaries.items():
        if status.get(name) != "done":
            continue
        io.write_json(root / name / "summary.json", summary)
        io.write_json(root / name / "task.json", {"task": task, "source": "its default task (no --task given)",
                                                  "n_examples": n, "sample": {"prompt": f"{XSS} k1 v2 ; k1", "answer": "v2"}})


def test_compare_flags_differences_within_noise_and_carries_both_provenances(tmp_path):
    # heads: 2.0 vs 2.3, half-widths 0.25 + 0.25 = 0.5 > 0.3: within noise; kv: 2.0 vs 3.0, 0.1 + 0.1 < 1.0: beyond
    _run(tmp_path / "a", task="kv", n=64, baseline=2.0, ci=[1.75, 2.25], unevicted=2.0, kv_ci=[1.9, 2.1])
    _run(tmp_path / "b", task="ioi", n=16, baseline=2.3, ci=[2.05, 2.55], unevicted=3.0, kv_ci=[2.9, 3.1])
    _run(tmp_path / "c", task="kv", n=64, baseline=2.0, ci=[1.75, 2.25], unevicted=2.0, kv_ci=[1.9, 2.1],
         status={"heads": "done", "kv": "skipped: m is an encoder"})
    _run(tmp_path / "d", task="kv", n=16, baseline=2.3, ci=[2.05, 2.55], unevicted=3.0, kv_ci=[2.9, 3.1])
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "ab.html")]) == 0
    page = (tmp_path / "ab.html").read_text()
    # A ran heads and kv on kv, B on ioi: another task, not compared (review 7b, A4), with the reason; with nothing
    # compared the page does not say "no difference" (review 11a A6: that read as agreement)
    differences = page[page.index("id='differences'"):page.index("id='not-compared'")]
    assert "No difference above the thresholds." not in differences
    assert ("<li>Nothing could be compared: every quantity is listed under Not compared, and why (no difference was "
            "tested).</li>") in differences
    refused = page[page.index("id='not-compared'"):page.index("id='findings'")]
    for name, label in (("heads", "heads unpruned logit difference"), ("kv", "kv full-cache logit difference")):
        assert f"<li>{label}: not compared: A ran {name} on the kv task, B on the ioi task.</li>" in refused
    # D ran them on A's task (other examples of it): compared, each against the interval its finding prints
    differences = headline_notes(Run(tmp_path / "a"), Run(tmp_path / "d"))
    n = "n differs: 64 vs 16 examples, a setting, not the model: other example sets, intervals of other widths"
    assert (SAME + f"heads unpruned logit difference: A 2, B 2.3 ({n}) (within noise: |B - A| = 0.3 is inside the combined "
            "half-widths 0.5; 95% CIs A [1.75, 2.25], B [2.05, 2.55]).") in differences  # the CI the heads finding prints
    # the kv finding prints no interval for its full-cache metric: compare uses none (not the chance guard's), and
    # a difference whose noise is not known is not listed as one (review 13c A3): not compared, and why
    assert (f"(not compared) kv full-cache logit difference: not compared: A 2, B 3 ({n}) (its finding states no "
            "interval for it: whether this is beyond noise is not known).") in differences
    settings = page[page.index("id='settings'"):page.index("id='differences'")]
    for line in ("heads task: A kv (its default task (no --task given)), B ioi (its default task (no --task given)).",
                 "heads examples: A 64, B 16.", "kv budget changes: A n_examples 64 -&gt; 64, B n_examples 64 -&gt; 16."):
        assert line in settings, line
    provenance = page[page.index("id='provenance'"):]
    assert provenance.count("task: kv, from its default task (no --task given)<br>examples: 64;") == 2  # A's heads, kv
    assert provenance.count("task: ioi, from its default task (no --task given)<br>examples: 16;") == 2  # B's
    assert provenance.count("sample: &#x27;&lt;img src=x onerror=alert(1)&gt; k1 v2 ; k1&#x27; -&gt; &#x27;v2&#x27;") == 4
    assert XSS not in page
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "c"), "--out", str(tmp_path / "ac.html")]) == 0
    page = (tmp_path / "ac.html").read_text()
    findings = page[page.index("id='findings'"):page.index("id='provenance'")]
    assert "<em>blank: skipped: m is an encoder</em>" in findings  # C's kv cell says why it is empty
    assert "kv task" not in page[page.index("id='settings'"):page.index("id='differences'")]  # nothing to set against


def test_heads_headline_is_read_against_the_metrics_own_interval_not_the_answer_lengths(tmp_path):
    """Review 11b A7: with answers of several lengths the heads headline was compared against "combined half-widths
    17.7", the per-row chance's spread. Now each side's interval is the t interval of its rows' log-probabilities
    (chance.assess_per_row); a summary written before (margins shifted, answers of 1.86 tokens on average) gives none."""
    from scipy import stats

    from headscope.analyses.core import chance

    tokens = np.array([7, 6, 8, 7] + [1] * 12)
    rows = {"a": -0.002 - 0.0003 * np.arange(16), "b": -0.004 - 0.0002 * np.arange(16)}  # log-probabilities near 0
    cis = {}
    for side, logp in rows.items():
        entry = chance.assess_per_row(logp, -tokens * np.log(454), "logprob", tokens=tokens)
        ci = stats.ttest_1samp(logp, 0.0).confidence_interval(0.95)
        cis[side] = (ci.low, ci.high)
        assert entry["at_chance"] is False and entry["ci"] == pytest.approx(cis[side], rel=1e-9)
        _heads_only(tmp_path / side, {"metric": "logprob", "baseline_metric": float(logp.mean()), "n_examples": 16,
                                      "task": "owners", "chance": entry})
    notes = " ".join(headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b")))
    half = (cis["a"][1] - cis["a"][0]) / 2 + (cis["b"][1] - cis["b"][0]) / 2
    diff = abs(rows["b"].mean() - rows["a"].mean())  # 0.00125, inside 0.00127: within noise, read on the metric's scale
    assert (f"(within noise: |B - A| = {diff:.3g} is inside the combined half-widths {half:.3g}; 95% CIs "
            f"A [{cis['a'][0]:.3g}, {cis['a'][1]:.3g}], B [{cis['b'][0]:.3g}, {cis['b'][1]:.3g}])") in notes, notes
    old = {"at_chance": False, "metric": "logprob", "mean": -0.00584, "ci": [-8.83, 8.82], "answer_tokens": 1.86}
    _heads_only(tmp_path / "c", {"metric": "logprob", "baseline_metric": -0.00584, "n_examples": 16, "task": "owners",
                                 "chance": old})
    notes = " ".join(headline_notes(Run(tmp_path / "a"), Run(tmp_path / "c")))
    assert "(the finding of B states no interval for it: whether this is beyond noise is not known)" in notes, notes


def _heads_only(root, summary):
    """An output folder with one heads summary (and its section provenance)."""
    io.write_json(root / "manifest.json", {"model": {"name": "m"}, "seed": 0, "status": {"heads": "done"},
                                           "config": {"analyses": ["heads"], "task": None},
                                           "task_used": {"heads": "your task (owners.jsonl)"}})
    io.write_json(root / "heads" / "summary.json", summary)
    io.write_json(root / "heads" / "task.json", {"task": "owners", "source": "your task (owners.jsonl)", "n_examples": 16})


def test_compare_ranks_no_heads_a_report_refuses_to_rank_and_positions_only_of_the_same_prompts(tmp_path):
    _folder(tmp_path / "a", "m", 1.0, 0, 0.5)
    _folder(tmp_path / "b", "m", 1.0, 1, 0.5)  # same model, seed, task and n: the same prompts
    heads = io.read_json(tmp_path / "b" / "heads" / "summary.json")
    io.write_json(tmp_path / "b" / "heads" / "summary.json", {**heads, "degenerate_gradient": "every head's |gradient "
                                                              "importance| is below 1e-07, under the numerical floor"})
    heads_a = io.read_json(tmp_path / "a" / "heads" / "summary.json")
    io.write_json(tmp_path / "a" / "heads" / "summary.json", {**heads_a, "chance": {"at_chance": True, "mean": 0.01}})
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c.html")]) == 0
    page = (tmp_path / "c.html").read_text()
    assert ("Head importance (gradient importance): the top heads cannot be compared, because A is at chance on its "
            "task; B has gradient importance whose predicted loss changes are under the rounding floor, so neither "
            "report ranks its heads; "
            "no shared top heads or correlation is computed.") in page
    assert "Top heads by" not in page and "Pearson r =" not in page
    differences = page[page.index("id='differences'"):page.index("id='not-compared'")]
    assert "cannot be compared" not in differences  # not a difference between the runs: said in its section
    not_compared = page[page.index("id='not-compared'"):page.index("id='findings'")]
    assert "top heads cannot be compared, because A is at chance" in not_compared
    assert "<li>Prunable within 1%: not compared: A at chance on its task.</li>" in not_compared
    assert "not compared" not in differences
    # one refusing side is enough: its ranking is noise, so an overlap with it means nothing
    io.write_json(tmp_path / "a" / "heads" / "summary.json", heads_a)
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    notes = importance_section(a, b)[1]
    assert notes[0] == (NOT_COMPARED + "Head importance (gradient importance): the top heads cannot be compared, because B has "
                     "gradient importance whose predicted loss changes are under the rounding floor, so that report does "
                     "not rank its heads; "
                     "no shared top heads or correlation is computed.")
    table, notes = patching_section(a, b)
    assert notes == [f"Top resid_pre site differs: A resid_pre L0 pos 2 ('{XSS}'), B resid_pre L1 pos 2 ('{XSS}')."]
    assert "positions are not compared" not in table  # the same prompts: positions compared


def _heads_summary(root, **keys) -> None:
    s = io.read_json(root / "heads" / "summary.json")
    io.write_json(root / "heads" / "summary.json", {**s, **keys})


TOP = ["L1H2", "L1H1", "L1H0", "L0H2", "L0H1"]


def test_compare_top_heads_of_every_method_with_ties_at_the_edge_and_inside_said_not_refused(tmp_path):
    """Review 8b A4: B's 5th gradient head ties with its 6th (tied_top_next): the top 5 are still the same 5 in the
    same order, and only B's 5th place is undecided; the zero-ablation top heads are compared too. A tie at the
    edge explains a 5th head that differs; heads tied inside the top 5 are compared as a tied group, not as an
    order; an order that differs outside any tie is a difference."""
    for side in ("a", "b"):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        _heads_summary(tmp_path / side, top_heads_gradient=TOP, top_heads_zero=["L0H0", "L1H2", "L0H1", "L1H1", "L0H2"])
    _heads_summary(tmp_path / "b", tied_top_heads_gradient=["L0H1"], tied_top_next_gradient="L0H0")
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    notes = importance_section(a, b)[1]
    top = [n for n in notes if "Top heads" in n or "cannot be compared" in n]
    assert top == [
        "(same) Top heads by gradient: the same 5 in the same order (L1H2, L1H1, L1H0, L0H2, L0H1). B's 5th, L0H1, ties "
        "with its 6th, L0H0, within rounding, so B's 5th place is not decided.",
        "(same) Top heads by zero-ablation: the same 5 in the same order (L0H0, L1H2, L0H1, L1H1, L0H2)."]
    from headscope.reports.compare_top import top_heads_notes  # the notes alone, without the figure

    # A lists L0H0 5th, B L0H1 (tied with its 6th, L0H0): the 5th place differs only by B's edge tie
    _heads_summary(tmp_path / "a", top_heads_gradient=[*TOP[:4], "L0H0"])
    notes = top_heads_notes(a, b)
    assert notes[0] == (
        "(same) Top heads by gradient: 4 of the top 5 are shared (L1H2, L1H1, L1H0, L0H2): A L1H2, L1H1, L1H0, L0H2, "
        "L0H0; B L1H2, L1H1, L1H0, L0H2, L0H1; the others differ only where a tie at the edge leaves a place "
        "undecided. B's 5th, L0H1, ties with its 6th, L0H0 (the other run's 5th), within rounding, so B's 5th place "
        "is not decided.")
    # B's 2nd and 3rd tie and come the other way round from A's: one tied group, the same top 5
    _heads_summary(tmp_path / "a", top_heads_gradient=TOP)
    _heads_summary(tmp_path / "b", top_heads_gradient=["L1H2", "L1H0", "L1H1", "L0H2", "L0H1"],
                   tied_top_heads_gradient=["L1H0", "L1H1"], tied_top_next_gradient=None)
    assert top_heads_notes(a, b)[0] == (
        "(same) Top heads by gradient: the same 5, in the same order but for heads that tie within rounding, compared "
        "as a tied group (A L1H2, L1H1, L1H0, L0H2, L0H1; B L1H2, L1H0, L1H1, L0H2, L0H1). B's 2nd and 3rd, L1H0 and "
        "L1H1, tie within rounding, so their order is arbitrary.")
    # no tie recorded: the swap is a difference (no prefix: the page lists it among the differences)
    _heads_summary(tmp_path / "b", tied_top_heads_gradient=[])
    assert top_heads_notes(a, b)[0] == ("Top heads by gradient: the same 5 in another order (A L1H2, L1H1, L1H0, L0H2, "
                                        "L0H1; B L1H2, L1H0, L1H1, L0H2, L0H1).")
    # a method whose importance is rounding in one run is not compared, the other methods are
    _heads_summary(tmp_path / "b", degenerate_zero="every head's |zero importance| is below the floor", top_heads_zero=[])
    assert top_heads_notes(a, b)[1] == (NOT_COMPARED + "Top heads by zero-ablation: not compared, because B has zero "
                                        "importance that is rounding, not a measurement, so that report does not rank "
                                        "its heads by it.")


def _importances(root, values: dict[str, tuple[float, float]]) -> None:
    """results.csv of gradient importance with its standard error per head: {name: (importance, se)}."""
    io.write_csv(root / "heads" / "results.csv", pd.DataFrame([
        {"layer": int(n[1]), "head": int(n[3]), "head_name": n, "method": "gradient", "importance": v, "importance_se": e}
        for n, (v, e) in values.items()]))


def test_compare_top_heads_that_swap_within_each_others_noise_are_not_a_reorder(tmp_path):
    """Reviews 10a C2 / 10b C5: two heads 0.003 apart with standard errors 0.05 that swap places are not another
    order. Hand-worked over n = 4 examples: t(0.975, 3) = 3.1824, so A's L1H0 (0.221, SE 0.05) and L0H2 (0.218,
    SE 0.05) are 0.003 apart, inside 3.1824 x (0.05 + 0.05) = 0.318: their 95% intervals overlap. With SEs of
    0.0004 the reach is 0.0025, under 0.003, in both runs: then the swap is a difference."""
    from headscope.reports.compare_top import top_heads_notes

    def values(l1h0: float, l0h2: float, se: float) -> dict[str, tuple[float, float]]:
        return {"L1H2": (0.9, se), "L1H1": (0.5, se), "L1H0": (l1h0, se), "L0H2": (l0h2, se), "L0H1": (0.1, se),
                "L0H0": (0.01, se)}

    for side in ("a", "b"):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
    swapped = ["L1H2", "L1H1", "L0H2", "L1H0", "L0H1"]
    _heads_summary(tmp_path / "a", top_heads_gradient=TOP)
    _heads_summary(tmp_path / "b", top_heads_gradient=swapped)
    _importances(tmp_path / "a", values(0.221, 0.218, 0.05))
    _importances(tmp_path / "b", values(0.2, 0.23, 0.05))
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    assert top_heads_notes(a, b)[0] == (
        "(same) Top heads by gradient: the same 5 (A L1H2, L1H1, L1H0, L0H2, L0H1; B L1H2, L1H1, L0H2, L1H0, L0H1); "
        "L1H0 and L0H2 swap places, within each other's noise (A: 0.003 apart, SEs 0.05 and 0.05; their 95% intervals "
        "overlap: marginal intervals, not a paired test, as the run keeps no per-example gradient values).")
    # A's order measured (SEs 0.0004: reach 0.0025 < 0.003), B's not: B's numbers are the ones that say so
    _importances(tmp_path / "a", values(0.221, 0.218, 0.0004))
    assert "within each other's noise (B: 0.03 apart, SEs 0.05 and 0.05;" in top_heads_notes(a, b)[0]
    # both orders measured: a reorder, said as a difference (no prefix)
    _importances(tmp_path / "b", values(0.2, 0.23, 0.0004))
    assert top_heads_notes(a, b)[0] == ("Top heads by gradient: the same 5 in another order (A L1H2, L1H1, L1H0, L0H2, "
                                        "L0H1; B L1H2, L1H1, L0H2, L1H0, L0H1).")
    # no standard errors in results.csv (an older report): no noise verdict, the order as it is
    _folder(tmp_path / "c", "m", 1.0, 0, 0.5)
    _heads_summary(tmp_path / "c", top_heads_gradient=swapped)
    assert "another order" in top_heads_notes(a, Run(tmp_path / "c"))[0]


def test_compare_swaps_within_a_run_are_judged_by_the_paired_difference_where_the_run_keeps_examples(tmp_path):
    """Review 12b C3: whether two heads of one run swap within noise is a paired question (the same examples). A's
    L1H0 (0.221, SE 0.05) and L0H2 (0.218, SE 0.05) have overlapping marginal intervals, but their per-example
    drops (importance_examples.csv) differ by d = 0.002-0.004 on every example: mean 0.003, 95% CI 0.003 -+
    t(0.975, 3) sd(d) / 2 (scipy), above 0, so A's order is measured. B without per-example values says its test
    is the marginal overlap; B with them says the paired interval (hand-built, reaching 0)."""
    from scipy import stats

    from headscope.reports.compare_top import top_heads_notes

    def tables(root, l1h0: float, l0h2: float, per: dict[str, list[float]] | None) -> None:
        vals = {"L1H2": 0.9, "L1H1": 0.5, "L1H0": l1h0, "L0H2": l0h2, "L0H1": 0.1, "L0H0": 0.01}
        io.write_csv(root / "heads" / "results.csv", pd.DataFrame([
            {"layer": int(n[1]), "head": int(n[3]), "head_name": n, "method": "zero", "importance": v,
             "importance_se": 0.05} for n, v in vals.items()]))
        if per:
            io.write_csv(root / "heads" / "importance_examples.csv", pd.DataFrame([
                {"layer": int(n[1]), "head": int(n[3]), "head_name": n, "method": "zero", "example": i, "effect": e}
                for n, es in per.items() for i, e in enumerate(es)]))

    for side in ("a", "b"):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
    _heads_summary(tmp_path / "a", top_heads_zero=TOP)
    _heads_summary(tmp_path / "b", top_heads_zero=["L1H2", "L1H1", "L0H2", "L1H0", "L0H1"])
    y, d = np.array([0.1, 0.3, 0.2, 0.272]), np.array([0.002, 0.004, 0.003, 0.003])
    tables(tmp_path / "a", 0.221, 0.218, {"L1H0": list(y + d), "L0H2": list(y)})
    tables(tmp_path / "b", 0.2, 0.23, None)
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    note = next(n for n in top_heads_notes(a, b) if "by zero" in n)
    assert ("L1H0 and L0H2 swap places, within each other's noise (B: 0.03 apart, SEs 0.05 and 0.05; their 95% "
            "intervals overlap: marginal intervals, not a paired test, as the run keeps no per-example zero values)"
            ) in note and "A:" not in note  # A's paired interval 0.003 -+ 0.0013 lies above 0
    assert stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2 < 0.003
    yb, db = np.array([0.1, 0.35, 0.2, 0.27]), np.array([-0.5, 0.4, -0.3, 0.28])
    tables(tmp_path / "b", 0.2, 0.23, {"L1H0": list(yb + db), "L0H2": list(yb)})
    b = Run(tmp_path / "b")
    half = stats.t.ppf(0.975, 3) * db.std(ddof=1) / 2  # 0.697
    note = next(n for n in top_heads_notes(a, b) if "by zero" in n)
    assert (f"(B: L1H0 - L0H2 = -0.03, paired 95% CI [{-0.03 - half:+.2g}, {-0.03 + half:+.2g}] over 4 examples, "
            "which reaches 0)") in note
    assert "marginal" not in note


def test_compare_gradient_swaps_are_judged_by_the_paired_difference_of_per_example_gradients(tmp_path):
    """#34 items 2/5: a run that keeps each example's |dL/d gate| (importance_examples.csv, method gradient) has its
    gradient swaps judged by the paired interval, not the marginal overlap ("marginal intervals, not a paired test").
    Hand-built over 4 examples: A's L1H0 - L0H2 per example is 0.002-0.004 (95% CI above 0: A's order is measured,
    although the marginal SEs of 0.05 overlap); B's differences spread around -0.03 (scipy's t interval reaches 0)."""
    from scipy import stats

    from headscope.reports.compare_top import top_heads_notes

    def tables(root, per: dict[str, list[float]]) -> None:
        means = {"L1H2": 0.9, "L1H1": 0.5, "L0H1": 0.1, "L0H0": 0.01, **{n: float(np.mean(v)) for n, v in per.items()}}
        _importances(root, {n: (v, 0.05) for n, v in means.items()})
        io.write_csv(root / "heads" / "importance_examples.csv", pd.DataFrame([
            {"layer": int(n[1]), "head": int(n[3]), "head_name": n, "method": "gradient", "example": i, "effect": e}
            for n, es in per.items() for i, e in enumerate(es)]))

    for side in ("a", "b"):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
    _heads_summary(tmp_path / "a", top_heads_gradient=TOP)
    _heads_summary(tmp_path / "b", top_heads_gradient=["L1H2", "L1H1", "L0H2", "L1H0", "L0H1"])
    y, d = np.array([0.1, 0.3, 0.2, 0.272]), np.array([0.002, 0.004, 0.003, 0.003])
    yb, db = np.array([0.1, 0.35, 0.2, 0.27]), np.array([-0.5, 0.4, -0.3, 0.28])
    tables(tmp_path / "a", {"L1H0": list(y + d), "L0H2": list(y)})
    tables(tmp_path / "b", {"L1H0": list(yb + db), "L0H2": list(yb)})
    note = top_heads_notes(Run(tmp_path / "a"), Run(tmp_path / "b"))[0]
    half = stats.t.ppf(0.975, 3) * db.std(ddof=1) / 2
    assert stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2 < d.mean()  # A's paired interval lies above 0
    assert note.startswith("(same) Top heads by gradient: the same 5") and "A:" not in note
    assert (f"L1H0 and L0H2 swap places, within each other's noise (B: L1H0 - L0H2 = {db.mean():+.2g}, paired 95% CI "
            f"[{db.mean() - half:+.2g}, {db.mean() + half:+.2g}] over 4 examples, which reaches 0)") in note
    assert "marginal" not in note


def _ablation_verdicts(root, interval, first, **keys) -> None:
    """A heads folder whose ablation order (leading, 3 of 6 heads prunable, far from the 1% line) removes `first`
    first, with prunable_ci_ablation's interval (in heads) and the same examples as its pair (_task)."""
    _folder(root, "m", 1.0, 0, 0.0)
    _task(root)
    io.write_csv(root / "heads" / "curve.csv", pd.DataFrame({
        "ordering": "ablation", "recompute": False, "seed": 0, "n_pruned": range(5), "fraction_pruned": [k / 6 for k in range(5)],
        "metric": [10.0, 10.5, 10.3, 10.2, 8.0], "pruned": ["", *first, "L0H2", "L1H1"]}))
    _heads_summary(root, n_heads=6, max_fraction_prunable_ablation=0.5, heads_prunable_ablation=3.0,
                   prunable_ci_ablation={"heads": 3.0, "interval_heads": interval, "n_examples": 4, "level": 0.95}, **keys)


def test_equal_prunable_counts_whose_verdicts_differ_are_a_difference_with_their_intervals_and_tie(tmp_path):
    """Review 8b A2/A4: both runs remove 3 of 6 heads, but B's interval reaches 0 heads (its finding: no evidence
    that any head is dispensable) and A's does not, because the first two heads of the ablation order tie and swap
    between the runs: the page says the verdicts differ and why, and does not list the counts as agreeing. A count
    on its 1% line in one run only is a differing verdict too."""
    from headscope.reports.compare import pruning_notes

    _ablation_verdicts(tmp_path / "a", [1, 5], ["L1H0", "L0H1"])
    _ablation_verdicts(tmp_path / "b", [0, 5], ["L0H1", "L1H0"], tied_first_pruned_zero=[["L0H1", "L1H0"]],
                       tied_first_pruned_at_zero=[1], tied_first_pruned_values_zero=[[-0.44, -0.45]])
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    said = ("Prunable within 1% by ablation (the ordering both heads findings lead with): A 50% (3 of 6 heads), B 50% "
            "(3 of 6 heads): the same count, but the verdicts differ: B's 95% bootstrap interval (0-5 heads) reaches none, "
            "so its finding sees no evidence that any head is dispensable, while A's (1-5 heads) does not: the first heads "
            "removed swap between the runs (A L1H0, L0H1; B L0H1, L1H0), and B's summary records that L0H1 and L1H0 tie "
            "within rounding at the start of its order; which goes first is not settled, and the interval's low end can "
            "depend on it.")
    assert pruning_notes(a, b) == [said]  # no (same) prefix: the page lists it among the differences
    # the same intervals, but only A's count sits on its 1% line (its deciding point's paired interval reaches it)
    line = {"on_the_line": True, "past": False, "n_pruned": 3, "metric": 9.91, "line": 9.9, "distance_rel": 0.001,
            "margin_rel": 0.02, "change": -0.09, "change_low": -0.29, "change_high": 0.11}
    for side, on in (("a", True), ("b", False)):
        _heads_summary(tmp_path / side, prunable_ci_ablation={"heads": 3.0, "interval_heads": [1, 5], "n_examples": 4,
                                                              "line": {**line, "on_the_line": on}})
    note = pruning_notes(a, b)[0]
    assert note.startswith("Prunable within 1% by ablation (the ordering both heads findings lead with): A 50% (3 of 6 "
                           "heads), B 50% (3 of 6 heads): the same count, but the verdicts differ: A's count sits on its "
                           "1% line and its 95% bootstrap interval (1-5 heads) spans more than one count (fragile: "
                           "another sample of examples could move it), B's does not sit on its 1% line. A's 50% sits on "
                           "its 1% line: the point at 3 heads removed is 9.91")
    # review 19v C5: B's deciding point reaches its line too, but its bootstrap interval is one count: not "B's does
    # not" (its own sentence then said "B's 50% sits close to its 1% line"), the interval that parts the verdicts
    _heads_summary(tmp_path / "b", prunable_ci_ablation={"heads": 3.0, "interval_heads": [3, 3], "n_examples": 4,
                                                         "line": line})
    note = pruning_notes(a, b)[0]
    assert ("the verdicts differ: A's count sits on its 1% line and its 95% bootstrap interval (1-5 heads) spans more "
            "than one count (fragile: another sample of examples could move it); B's deciding point reaches its 1% line "
            "too, but its 95% bootstrap interval is the single value 3 heads, so its count held in most resamples. "
            "A's 50% sits on its 1% line") in note, note
    assert "B's 50% sits close to its 1% line" in note and "B's does not" not in note
    # both on the line, both intervals clear of 0: one verdict, so the counts agree
    _heads_summary(tmp_path / "b", prunable_ci_ablation={"heads": 3.0, "interval_heads": [1, 5], "n_examples": 4,
                                                         "line": line})
    assert pruning_notes(a, b)[0].startswith("(same) Prunable within 1% by ablation")


def test_a_verdict_names_where_two_orders_first_part_not_the_first_heads(tmp_path):
    """Verification 17v A1: orders that agree on their first heads and swap later were said to "swap" from the first
    head; the page says how many heads they share first (here 2: L1H0, L0H1) and which places swap (the 3rd and 4th)."""
    from headscope.reports.compare import pruning_notes

    _ablation_verdicts(tmp_path / "a", [1, 5], ["L1H0", "L0H1"])
    _ablation_verdicts(tmp_path / "b", [0, 5], ["L1H0", "L0H1"])
    for side, last in (("a", ["L0H2", "L1H1"]), ("b", ["L1H1", "L0H2"])):  # the 3rd and 4th heads removed swap
        io.write_csv(tmp_path / side / "heads" / "curve.csv", pd.DataFrame({
            "ordering": "ablation", "recompute": False, "seed": 0, "n_pruned": range(5),
            "fraction_pruned": [k / 6 for k in range(5)], "metric": [10.0, 10.5, 10.3, 10.2, 8.0],
            "pruned": ["", "L1H0", "L0H1", *last]}))
    note = pruning_notes(Run(tmp_path / "a"), Run(tmp_path / "b"))[0]
    assert ("while A's (1-5 heads) does not: the orders agree on their first 2 heads, then the 3rd and 4th heads "
            "removed swap between the runs (A L0H2, L1H1; B L1H1, L0H2); which goes first is not settled") in note, note
    assert "the first heads removed swap" not in note


def test_a_verdict_says_a_single_value_interval_as_one_count(tmp_path):
    """Review 11c ("6-6 heads"): a bootstrap interval of one count is said as that count, not as a range."""
    from headscope.reports.compare import pruning_notes

    _ablation_verdicts(tmp_path / "a", [3, 3], ["L1H0", "L0H1"])
    _ablation_verdicts(tmp_path / "b", [0, 5], ["L1H0", "L0H1"])
    note = pruning_notes(Run(tmp_path / "a"), Run(tmp_path / "b"))[0]
    assert ("B's 95% bootstrap interval (0-5 heads) reaches none, so its finding sees no evidence that any head is "
            "dispensable, while A's (3 heads, a single value) does not") in note
    assert "3-3" not in note


def test_compare_says_not_compared_where_a_report_refuses_at_chance_and_patching_in_the_reports_unit(tmp_path):
    _folder(tmp_path / "a", "m", 1.0, 0, 0.92)
    _folder(tmp_path / "b", "m", 1.0, 1, 0.75)
    for side in ("a", "b"):  # the reports' patching summaries: a 24.6-logit gap, effects in logits
        _task(tmp_path / side)  # heads ranked on the same examples: the prunable counts are compared
        io.write_json(tmp_path / side / "patching" / "summary.json", {
            "metric": "logit_diff", "normalized": False, "clean_metric": 12.3, "corrupted_metric": -12.3,
            "top_sites": {"head_out": [{"layer": 0, "head": 2, "pos": None, "token": "", "effect": 24.1}]}})
        position = io.read_json(tmp_path / side / "position" / "summary.json")
        io.write_json(tmp_path / side / "position" / "summary.json", {  # a ratio of a metric not plotted is not said
            **position, "ratio_middle_to_ends": {"accuracy": position["ratio_middle_to_ends"]["accuracy"],
                                                 "probability": 0.81 if side == "a" else 0.69}})
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    table = patching_section(a, b)[0]
    assert table.count("head_out L0 H2: 0.98 of the gap (+24.1 logit difference)") == 2  # 24.1 / (12.3 - -12.3)
    assert pruning_section(a, b)[1] == ["Prunable within 1% by gradient (the ordering both heads findings lead with): "
                                        "A 92%, B 75%" + NO_INTERVAL]
    assert not any("probability" in n for n in position_section(a, b)[1])
    at = {"at_chance": True, "below_chance": False, "metric": "logit_diff", "mean": 0.05, "ci": [-0.2, 0.3]}
    below = {**at, "below_chance": True, "mean": -12.0, "ci": [-12.7, -11.4]}
    for name, entry, side in (("heads", at, "a"), ("position", at, "b"), ("patching", below, "b")):
        summary = io.read_json(tmp_path / side / name / "summary.json")
        io.write_json(tmp_path / side / name / "summary.json", {**summary, "chance": entry})
    assert pruning_section(a, b)[1] == [NOT_COMPARED + "Prunable within 1%: not compared: A at chance on its task."]
    body, notes = position_section(a, b)
    assert notes == [NOT_COMPARED + "Middle/ends ratio of accuracy (the metric plotted): not compared: B at chance on its "
                     "task."]
    assert "<img" not in body and "no overlay" in body  # not compared: no overlay that implies a comparison
    assert "<img" not in pruning_section(a, b)[0]
    table, notes = patching_section(a, b)
    assert notes == [NOT_COMPARED + "Top patching sites: not compared: B below chance on its task (its report ranks no "
                     "site)."]
    assert "24.1" not in table and "0.98" not in table
    summary = io.read_json(tmp_path / "a" / "position" / "summary.json")
    io.write_json(tmp_path / "a" / "position" / "summary.json", {**summary, "chance": at})
    assert position_section(a, b)[1] == [NOT_COMPARED + "Middle/ends ratio of accuracy (the metric plotted): not compared: "
                                         "A and B at chance on their tasks."]


def test_compare_position_says_which_side_has_no_result_not_a_metric_it_never_plotted(tmp_path):
    """Review 11a A6: B's position was skipped (its tokenizer cannot write the data), so B plots nothing; the page
    said "A plots cosine, B accuracy" (accuracy: the default of a missing summary). Now it names B's missing result
    and the manifest's reason; and two same-metric curves whose ratios agree within 0.05 are said as compared."""
    _folder(tmp_path / "a", "m", 1.0, 0, 0.5)
    _folder(tmp_path / "b", "m", 1.0, 0, 0.5)
    summary = io.read_json(tmp_path / "a" / "position" / "summary.json")
    io.write_json(tmp_path / "a" / "position" / "summary.json", {**summary, "primary_metric": "cosine"})
    why = "skipped: m's tokenizer maps 53 of the 493 distinct words of position's encoder data to its unknown token"
    manifest = io.read_json(tmp_path / "b" / "manifest.json")
    io.write_json(tmp_path / "b" / "manifest.json", {**manifest, "status": {"heads": "done", "position": why,
                                                                            "patching": "done"}})
    for name in ("summary.json", "curve.csv"):
        (tmp_path / "b" / "position" / name).unlink()
    body, notes = position_section(Run(tmp_path / "a"), Run(tmp_path / "b"))
    assert notes == [NOT_COMPARED + f"Position curves and middle/ends ratio: not compared: B has no position result ({why})."]
    assert "<img" not in body and "plots" not in body
    _folder(tmp_path / "c", "m", 1.0, 0, 0.5)  # the same curve as b had: ratio 0.6/0.9 on both sides
    _folder(tmp_path / "d", "m", 1.0, 0, 0.5)
    body, notes = position_section(Run(tmp_path / "c"), Run(tmp_path / "d"))
    assert "<img" in body and notes == [SAME + "Middle/ends ratio of accuracy (the metric plotted): A 0.67, B 0.67, within "
                                               "0.05 of each other."]


def test_compare_of_a_run_with_heads_against_one_without_names_what_b_lacks_and_does_not_crash(tmp_path):
    """Review 19v A1: A with a heads section against B without one crashed compare ("The truth value of a DataFrame is
    ambiguous": list.index(None) compared A's grid with ==); now A is drawn alone and the page says which sections B
    lacks, and why (B was run with --analyses position,patching)."""
    import shutil

    _folder(tmp_path / "a", "m", 1.0, 0, 0.5)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "heads")
    manifest = io.read_json(tmp_path / "b" / "manifest.json")
    io.write_json(tmp_path / "b" / "manifest.json", {**manifest, "config": {**manifest["config"],
                                                                            "analyses": ["position", "patching"]}})
    page = compare_html(Run(tmp_path / "a"), Run(tmp_path / "b"))
    not_compared = html.unescape(page[page.index("id='not-compared'"):page.index("id='findings'")])
    why = "not part of this run (not among its analyses)"
    assert f"<li>Only A has heads: B has no result there ({why}).</li>" in not_compared
    assert f"<li>Head importance: B has none ({why}); only the other run is drawn.</li>" in not_compared
    assert "<img" in page[page.index("id='importance'"):]  # A's map is still drawn
    settings = html.unescape(page[page.index("id='settings'"):page.index("id='differences'")])
    a_ran = io.read_json(tmp_path / "a" / "manifest.json")["config"].get("analyses")
    assert f"<li>analyses run: A {', '.join(a_ran) if a_ran else 'not set'}, B position, patching.</li>" in settings  # 19w C1
    page = compare_html(Run(tmp_path / "b"), Run(tmp_path / "a"))  # the other order, which worked before
    assert "<li>Only B has heads: A has no result there (" in html.unescape(page)


def test_compare_that_draws_both_runs_but_compares_nothing_says_so(tmp_path):
    """Review 11a A6 (cmp_minilm.html): every quantity under Not compared (each analysis ran on another task) while
    the importance and pruning panels still draw both runs side by side: "No difference above the thresholds" read
    as agreement. The Differences list now says nothing could be compared."""
    from headscope.reports.compare import compare_html

    for side, task in (("a", "kv"), ("b", "ioi")):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        for name in ("heads", "position", "patching"):
            io.write_json(tmp_path / side / name / "task.json", {"task": task, "source": "its default task (no --task given)"})
    page = compare_html(Run(tmp_path / "a"), Run(tmp_path / "b"))
    differences = page[page.index("id='differences'"):page.index("id='not-compared'")]
    assert "<img" in page[page.index("id='importance'"):]  # both runs drawn, on one scale
    assert "No difference above the thresholds." not in differences and "Nothing could be compared" in differences
    assert "A ran heads on the kv task, B on the ioi task" in page[page.index("id='not-compared'"):]


def test_compare_out_must_end_in_html(tmp_path, capsys):
    target = tmp_path / "page.txt"
    assert main(["compare", str(tmp_path / "nothing"), str(tmp_path / "nothing"), "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not end in .html" in err and "page.html" in err
    assert not target.exists() and list(tmp_path.iterdir()) == []  # checked before the folders are even read


def _png(path, width: int, height: int, colour: tuple[int, int, int]) -> None:
    """A plain PNG of that size (a stand-in for a report's figure: compare only reads and downscales it)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (width, height), colour).save(path)


def _inline_images(page: str) -> dict[str, bytes]:
    """{alt text: PNG bytes} of every inline image on the page."""
    import base64
    import html
    import re

    return {html.unescape(alt): base64.b64decode(data)
            for alt, data in re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', page)}


def test_compare_sets_every_figure_side_by_side_and_says_why_one_is_missing(tmp_path, tiny_models):
    from io import BytesIO

    import torch
    from PIL import Image

    from headscope.reports.compare_figures import MAX_WIDTH
    from headscope.reports.explorer import attention_explorer_data
    from headscope.reports.findings import caption
    from headscope.reports.html_report import EXPLORER_FILE

    _folder(tmp_path / "a", "m", 1.0, 0, 0.5)
    _folder(tmp_path / "b", "m", 1.0, 0, 0.5, quick=True)
    for side in ("a", "b"):  # both drew importance (A's wider than a pair's column); only A drew l0 and kv_norms
        _png(tmp_path / side / "heads" / "importance.png", 1800 if side == "a" else 600, 400, (200, 30, 30))
    _png(tmp_path / "a" / "heads" / "l0.png", 500, 300, (30, 30, 200))
    _png(tmp_path / "a" / "kv" / "kv_norms.png", 500, 300, (30, 200, 30))
    manifest = io.read_json(tmp_path / "b" / "manifest.json")  # B did not run kv: its manifest says why
    manifest["config"]["analyses"].append("kv")
    io.write_json(tmp_path / "b" / "manifest.json", {**manifest, "status": {"kv": "skipped: m is an encoder"}})
    manifest = io.read_json(tmp_path / "a" / "manifest.json")
    manifest["config"]["analyses"].append("kv")
    io.write_json(tmp_path / "a" / "manifest.json", manifest)
    io.write_json(tmp_path / "a" / "kv" / "summary.json", {"metric": "logit_diff"})
    # the report page's own top_attention figure, drawn from explorer.json: A has the data, B none
    io.write_json(tmp_path / "a" / EXPLORER_FILE, attention_explorer_data(tiny_models["gpt2"], torch.tensor([[1, 5, 2, 7, 5]])))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c.html")]) == 0
    page = (tmp_path / "c.html").read_text()
    assert XSS not in page
    images = _inline_images(page)
    for side, seed, stem, size in (("A", 0, "importance", (MAX_WIDTH, 200)), ("B", 1, "importance", (600, 400)),
                                   ("A", 0, "l0", (500, 300))):
        alt = f"{side} (m ({XSS}, seed {seed})): heads figure {stem}: {caption(stem)}"  # escaped on the page
        assert caption(stem) and alt in images, alt  # says what it shows and which run
        assert Image.open(BytesIO(images[alt])).size == size  # 1800 x 400 downscaled to 900 x 200
    assert f"A (m ({XSS}, seed 0)): kv figure kv_norms: {caption('kv_norms')}" in images
    assert f"A (m ({XSS}, seed 0)): report figure top_attention: {caption('top_attention')}" in images
    assert len(images) == 2 + 5  # importance and pruning (seeds differ: no position overlay), A's four figures, B's one
    figures = page[page.index("id='figures'"):page.index("id='provenance'")]
    assert "<em>blank: B has no l0: its heads ran but did not draw this figure: it ran with --quick" in figures
    assert "<em>blank: B has no kv_norms: its kv analysis has no result (skipped: m is an encoder)</em>" in figures
    not_compared = page[page.index("id='not-compared'"):page.index("id='findings'")]
    assert ("<li>heads figure l0: only A has it; in B, its heads ran but did not draw it: it ran with --quick, which "
            "skips parts of the analysis.</li>") in not_compared
    assert "<li>kv figure kv_norms: only A has it; in B, its kv analysis has no result (skipped: m is an encoder).</li>" \
        in not_compared
    assert "<em>blank: B has no top_attention: no readable explorer data in its folder</em>" in figures
    assert "<li>report figure top_attention: only A has it; B has no readable explorer data in its folder.</li>" \
        in not_compared
    assert "figure" not in page[page.index("id='differences'"):page.index("id='same'")]


def test_compare_overlays_keep_both_runs_visible():
    from headscope.reports.compare import _overlay

    same = pd.DataFrame({"order": "gradient", "fraction_pruned": [0.0, 0.5, 1.0], "metric": [3.0, 2.0, 0.0]})
    fig = _overlay([same, same.copy()], "order", "fraction_pruned", "metric", "x", "y", "t")  # B exactly on A
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert set(lines) == {"A: gradient", "B: gradient"}
    a, b = lines["A: gradient"], lines["B: gradient"]
    assert list(a.get_ydata()) == list(b.get_ydata()) == [3.0, 2.0, 0.0]
    assert (a.get_linestyle(), a.get_marker()) == ("-", "o") and (b.get_linestyle(), b.get_marker()) == ("--", "s")
    assert b.get_zorder() > a.get_zorder() and b.get_linewidth() < a.get_linewidth()  # B thin on top of A's wide line
    assert a.get_alpha() < 1
    two = pd.concat([same, same.assign(order="gradient (recomputed)")])  # two equal curves of one side
    lines = {line.get_label(): line for line in _overlay([two, None], "order", "fraction_pruned", "metric", "x", "y",
                                                           "t").axes[0].get_lines()}
    first, second = lines["A: gradient"], lines["A: gradient (recomputed)"]
    assert first.get_color() != second.get_color() and first.get_linewidth() > second.get_linewidth()
    assert second.get_zorder() > first.get_zorder()  # the narrower on top


def _importance(root, values, se=None) -> None:
    rows = [{"layer": l, "head": h, "method": "gradient", "importance": values[l][h]} for l in range(2) for h in range(3)]
    if se is not None:
        rows = [{**r, "importance_se": se} for r in rows]
    io.write_csv(root / "heads" / "results.csv", pd.DataFrame(rows))


def test_compare_mutes_head_differences_under_the_floor_each_report_used(tmp_path):
    """#34: a report's ties use its measured rounding floor (rounding_floor_<method>); compare mutes by the same
    number, not the analytic noise_floor beside it (here 0.2 analytic, 0.09 measured in A, nothing in B)."""
    from headscope.reports.compare_heads import noise_band

    for side, extra in (("a", {"rounding_floor_zero": 0.09}), ("b", {})):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        s = io.read_json(tmp_path / side / "heads" / "summary.json")
        io.write_json(tmp_path / side / "heads" / "summary.json", {**s, "noise_floor": 0.05, **extra})
    band, rule = noise_band(Run(tmp_path / "a"), Run(tmp_path / "b"), "zero", raw=True)
    assert band == 0.09 and "grey where |B - A| < 0.09, the numerical noise floor" in rule  # max(0.09, B's 0.05)
    io.write_json(tmp_path / "a" / "heads" / "summary.json", {**s, "noise_floor": 0.2, "rounding_floor_zero": 0.03})
    assert noise_band(Run(tmp_path / "a"), Run(tmp_path / "b"), "zero", raw=True)[0] == 0.05  # not A's analytic 0.2


def test_compare_mutes_gradient_differences_by_each_gradients_own_rounding_not_an_absolute_floor(tmp_path):
    """#34 item 5: a bfloat16 gradient g rounds by a share of |g| (the analysis's ties: GRADIENT_TIE_STEPS x 2^-7,
    rounding_relative_gradient), so B - A of gradient importance is muted per head under rel |A| + rel |B|, not under
    the loss's absolute noise_floor_gradient (0.2 here). Hand-worked with rel = 4 x 2^-7 = 1/32: a change of 1 at 100
    is rounding (floor 201/32 = 6.3), one of 0.005 at 0.01 is not (floor 0.025/32 = 0.00078), 0.1 at 5 is (0.32),
    0.05 at 0.5 is not (0.033); an absolute 0.2 would have muted the opposite cells. In float32 (rel 4 x 2^-23)
    every non-zero change is beyond; an older report is read by its manifest's dtype."""
    from headscope.reports.compare import importance_figure
    from headscope.reports.compare_heads import noise_band

    base = [[100.0, 1.0, 0.01], [5.0, 0.5, 0.002]]
    diff = [[1.0, 0.0, 0.005], [0.1, 0.05, 0.0]]
    beyond = np.array([[False, False, True], [False, True, False]])
    for side, grid in (("a", base), ("b", [[x + d for x, d in zip(r, dr)] for r, dr in zip(base, diff)])):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        _importance(tmp_path / side, grid)
        _heads_summary(tmp_path / side, noise_floor_gradient=0.2, rounding_relative_gradient=4 * 2.0 ** -7)
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    band, rule = noise_band(a, b, "gradient", raw=True)
    want = (np.abs(base) + np.abs(np.add(base, diff))) / 32
    np.testing.assert_allclose(band, want)
    assert "each head's rounding" in rule and "A 0.031, B 0.031" in rule
    fig, notes, _ = importance_figure(a, b)
    coloured = fig.axes[2].collections[-1]  # B - A: the cells beyond noise
    assert (~coloured.get_array().mask.reshape(2, 3) == beyond).all()
    assert "each head's rounding" in " ".join(fig.axes[2].get_title().split())
    for side in ("a", "b"):  # float32: 4 x 2^-23 of each gradient, every non-zero change is beyond
        _heads_summary(tmp_path / side, rounding_relative_gradient=4 * 2.0 ** -23)
    band, _ = noise_band(Run(tmp_path / "a"), Run(tmp_path / "b"), "gradient", raw=True)
    assert (band < 1e-4).all() and (band > 0).all()
    for side in ("a", "b"):  # a report without the record: its manifest's dtype (bfloat16: 8 significand bits)
        s = io.read_json(tmp_path / side / "heads" / "summary.json")
        io.write_json(tmp_path / side / "heads" / "summary.json", {k: v for k, v in s.items()
                                                                  if k != "rounding_relative_gradient"})
        m = io.read_json(tmp_path / side / "manifest.json")
        io.write_json(tmp_path / side / "manifest.json", {**m, "config": {**m["config"], "dtype": "bfloat16"}})
    from headscope.analyses.heads.numerics import GRADIENT_TIE_STEPS

    np.testing.assert_allclose(noise_band(Run(tmp_path / "a"), Run(tmp_path / "b"), "gradient", raw=True)[0],
                               want * GRADIENT_TIE_STEPS / 4)  # the analysis's constant x 2^-7 of each |g|
    # review 13a C2: runs that record their examples' largest gradient E_x max_h |dL/d gate| (A 40, B 60) round each
    # head by rel x that scale: 1/32 x (40 + 60) = 3.125 for every head, so 1 at 100 and 0.1 at 5 stay muted and
    # 0.005 at 0.01 and 0.05 at 0.5 are muted too (they were beyond their own-size bands above)
    for side, top in (("a", 40.0), ("b", 60.0)):
        _heads_summary(tmp_path / side, rounding_relative_gradient=4 * 2.0 ** -7, rounding_gradient_scale=top)
    band, rule = noise_band(Run(tmp_path / "a"), Run(tmp_path / "b"), "gradient", raw=True)
    np.testing.assert_allclose(band, np.full((2, 3), 3.125))
    assert "E_x max_h |dL/d gate|" in rule and "A 1.2, B 1.9" in rule


def test_compare_gradient_band_is_the_runs_measured_rounding_not_the_analytic_bound(tmp_path):
    """Reviews 14b A2 / 14c A1: where runs record rounding_gradient (measured against float32: A 0.0014; B float32,
    analytic 1e-6), B - A of gradient importance is muted under their sum, 0.001401, not under GRADIENT_TIE_STEPS eps x
    E_x max_h |dL/d gate| (here 6 x 2^-7 x 0.94 = 0.044, which muted every cell): of the changes 0.0005, 0.001, 0.002,
    0.05, 0.0013, 0 (hand-worked) the 0.002 and 0.05 are beyond."""
    from headscope.reports.compare_heads import noise_band

    base = [[0.64, 0.58, 0.08], [0.03, 0.2, 0.1]]
    diff = [[0.0005, 0.001, 0.002], [0.05, 0.0013, 0.0]]
    for side, grid in (("a", base), ("b", [[x + d for x, d in zip(r, dr)] for r, dr in zip(base, diff)])):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        _importance(tmp_path / side, grid)
    _heads_summary(tmp_path / "a", rounding_relative_gradient=6 * 2.0 ** -7, rounding_gradient_scale=0.94,
                   rounding_gradient=0.0014, rounding_gradient_source="measured")
    _heads_summary(tmp_path / "b", rounding_relative_gradient=6 * 2.0 ** -23, rounding_gradient_scale=0.94,
                   rounding_gradient=1e-6, rounding_gradient_source="analytic")
    band, rule = noise_band(Run(tmp_path / "a"), Run(tmp_path / "b"), "gradient", raw=True)
    np.testing.assert_allclose(band, np.full((2, 3), 0.001401))
    assert (np.abs(diff) >= band).tolist() == [[False, False, True], [True, False, False]]
    assert "A 0.0014 (measured), B 1e-06 (analytic)" in rule


def test_compare_mutes_head_differences_within_the_runs_noise(tmp_path):
    from matplotlib.colors import to_hex

    from headscope.reports.compare import importance_figure

    _folder(tmp_path / "a", "m", 1.0, 0, 0.5)
    _folder(tmp_path / "b", "m", 1.0, 0, 0.5)
    base = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]]
    diff = [[0.1, -0.2, 0.0], [0.5, -0.3, 0.05]]
    _importance(tmp_path / "a", base)
    _importance(tmp_path / "b", [[x + d for x, d in zip(r, dr)] for r, dr in zip(base, diff)])
    for side, se in (("a", 0.05), ("b", 0.12)):  # 95% CIs of the mean metric: half-width 1.96 se
        s = io.read_json(tmp_path / side / "heads" / "summary.json")
        io.write_json(tmp_path / side / "heads" / "summary.json", {**s, "noise_floor": 1e-6, "chance": {
            "at_chance": False, "mean": 3.0, "ci": [3.0 - 1.96 * se, 3.0 + 1.96 * se], "ci_level": 0.95}})
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    fig, notes, alt = importance_figure(a, b)
    ax = fig.axes[2]  # A, B, B - A
    assert " ".join(ax.get_title().split()) == "B - A (grey: |B - A| < 0.255, within the runs' noise)"  # on the figure
    grey, coloured = ax.collections[0], ax.collections[1]
    # band 1.96 x sqrt(0.05^2 + 0.12^2) = 1.96 x 0.13 = 0.2548: 0.1, -0.2, 0.0, 0.05 within; 0.5 and -0.3 beyond
    within = [[True, True, True], [False, False, True]]
    assert [list(r) for r in coloured.get_array().mask.reshape(2, 3)] == within  # masked in the coloured layer
    assert [list(~r) for r in grey.get_array().mask.reshape(2, 3)] == within  # drawn in the grey one
    assert {to_hex(c) for c in grey.get_facecolors() if c[3] > 0} == {"#d9d9d9"}  # masked cells are transparent
    assert coloured.norm.vmin == -0.5 and coloured.norm.vmax == 0.5  # the largest difference beyond noise, not 1 of noise
    rule = next(n for n in notes if "B - A head importance" in n)
    assert "1.96 x sqrt(seA^2 + seB^2) = 0.255" in rule and "A 0.05, B 0.12" in rule and "0.255" in alt
    # per-head standard errors where results.csv has them: 1.96 x sqrt(2) x 0.01 = 0.0283, only the 0.0 cell within
    _importance(tmp_path / "a", base, se=0.01)
    _importance(tmp_path / "b", [[x + d for x, d in zip(r, dr)] for r, dr in zip(base, diff)], se=0.01)
    fig, notes, _ = importance_figure(a, b)
    coloured = fig.axes[2].collections[1]
    assert [list(r) for r in coloured.get_array().mask.reshape(2, 3)] == [[False, False, True], [False, False, False]]
    assert coloured.norm.vmax == 0.5 and any("each head's standard error in results.csv" in n for n in notes)
    # every difference within noise: all grey, and the scale is the band, not the largest noise
    _importance(tmp_path / "b", [[x + 0.001 * (h + 1) for h, x in enumerate(r)] for r in base], se=0.01)
    fig, notes, alt = importance_figure(a, b)
    coloured = fig.axes[2].collections[-1]
    assert coloured.get_array().mask.all() and abs(coloured.norm.vmax - 1.96 * 2 ** 0.5 * 0.01) < 1e-9
    # review 5 B10: an all-grey map says the test's reach, 1.96 sqrt(2) 0.01 = 0.0277, on the figure and in the note
    reach = "the smallest change\nthis pair of runs could detect is 0.0277 (largest |B - A| 0.003)"
    said = " ".join(reach.split())  # lines as plots.fit_title wraps them to clear the colour bar (N1)
    assert " ".join(fig.axes[2].get_title().split()).endswith("no head differs beyond noise; " + said)
    assert any(f"No head differs beyond noise; {said}" in n for n in notes) and said in alt
    # the metric's se as the bound (no per-head se), one difference beyond it: no such sentence
    _importance(tmp_path / "a", base)
    _importance(tmp_path / "b", [[x + d for x, d in zip(r, dr)] for r, dr in zip(base, diff)])
    fig, notes, _ = importance_figure(a, b)
    assert "could detect" not in fig.axes[2].get_title() and not any("could detect" in n for n in notes)


def test_compare_difference_title_never_runs_into_its_colour_bar_label(tmp_path):
    """Verification 11b N1: with importances of 1e-4 and per-head standard errors that differ, the B - A panel's last
    title line ('this pair of runs could detect is 0.00055 to 0.000615 by head (largest |B - A| 0.000191)') ran
    into the colour bar's label 'change in importance (B - A)'. Measured with the renderer: no overlap."""
    from headscope.reports.compare import importance_figure

    for side, shift in (("a", 0.0), ("b", 1.9e-4)):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        rows = [{"layer": l, "head": h, "method": "gradient", "importance": 1e-4 * (3 * l + h + 1) + shift * (h == 0),
                 "importance_se": 2.0e-4 + 1.0e-5 * (3 * l + h)} for l in range(2) for h in range(3)]
        io.write_csv(tmp_path / side / "heads" / "results.csv", pd.DataFrame(rows))
    fig, _, _ = importance_figure(Run(tmp_path / "a"), Run(tmp_path / "b"))
    ax, bar = fig.axes[2], fig.axes[-1]
    assert "by head (largest |B - A|" in ax.get_title().replace("\n", " ")
    assert bar.get_ylabel() == "change in importance (B - A)"
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = ax.title.get_window_extent(renderer)
    assert not title.overlaps(bar.yaxis.label.get_window_extent(renderer))
    assert not any(title.overlaps(t.get_window_extent(renderer)) for t in bar.get_yticklabels() if t.get_text())


def _task(root, rows=(0, 1, 2, 3), prompt="Ann has a red hat. The hat of Ann is") -> None:
    """heads/task.json as a report writes it (reports/provenance.py task_record): which examples heads ranked on."""
    io.write_json(root / "heads" / "task.json", {"task": "colours", "source": "your task (colours.csv)",
                                                 "n_examples": len(rows), "rows": list(rows),
                                                 "sample": {"prompt": prompt, "answer": " red"}})


def test_compare_leads_pruning_with_each_findings_ordering_and_flags_a_fraction_on_its_line(tmp_path):
    from headscope.reports.compare import pruning_notes

    _folder(tmp_path / "a", "m", 1.0, 0, 0.5)
    _folder(tmp_path / "b", "m", 1.0, 0, 0.5)
    _task(tmp_path / "a")
    _task(tmp_path / "b")  # the same examples: the counts are compared against their intervals
    for side, ablation, gradient in (("a", 0.5625, 1 / 6), ("b", 0.5, 0.0)):
        s = io.read_json(tmp_path / side / "heads" / "summary.json")
        io.write_json(tmp_path / side / "heads" / "summary.json", {
            **s, "n_heads": 12, "max_fraction_prunable_gradient": gradient, "heads_prunable_gradient": 12 * gradient,
            "max_fraction_prunable_ablation": ablation, "heads_prunable_ablation": 12 * ablation})
    # A's gradient curve: 10.0 unpruned, line 9.9; the last point kept (2 of 12 pruned) is 9.905, 0.05% above it
    io.write_csv(tmp_path / "a" / "heads" / "curve.csv", pd.DataFrame({
        "ordering": "gradient", "recompute": False, "seed": 0, "fraction_pruned": [0.0, 1 / 6, 1 / 3],
        "metric": [10.0, 9.905, 9.0]}))
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    assert pruning_notes(a, b) == [
        "Prunable within 1% by ablation (the ordering both heads findings lead with): A 56% (7 of 12 heads), B 50% "
        "(6 of 12 heads)" + NO_INTERVAL,
        "Prunable within 1% by gradient: A 17% (2 of 12 heads), B 0% (0 of 12 heads)" + NO_INTERVAL
        + " A's 17% sits on its 1% line: the last point kept is 9.905 against the line 9.9, 0.05% of the unpruned metric "
        "away."]
    # the intervals the heads findings print (prunable_ci_<ordering>, in heads of 12): the difference is judged against
    # them; a key the finding does not read (an interval compare would have to guess at) is not used
    ci = {"n_examples": 4, "method": "percentile bootstrap"}
    for side, extra in (("a", {"prunable_ci_ablation": {**ci, "interval_heads": [4.8, 8.4]},
                               "max_fraction_prunable_gradient_ci": [0.1, 0.2]}),
                        ("b", {"prunable_ci_ablation": {**ci, "interval_heads": [3.6, 7.2]},
                               "prunable_ci_gradient": {**ci, "interval_heads": [0.0, 1.2]}})):
        s = io.read_json(tmp_path / side / "heads" / "summary.json")
        io.write_json(tmp_path / side / "heads" / "summary.json", {**s, **extra})
    notes = pruning_notes(a, b)
    assert notes[0].endswith("(within noise: |B - A| = 0.0625 is inside the combined half-widths 0.3; 95% CIs A [0.4, "
                             "0.7], B [0.3, 0.6]).")
    assert "(no interval recorded for A: whether this is beyond noise is not known)." in notes[1]
    # B's gradient importance is rounding: its finding leads with ablation only, and gradient is not compared
    s = io.read_json(tmp_path / "b" / "heads" / "summary.json")
    io.write_json(tmp_path / "b" / "heads" / "summary.json", {**s, "degenerate_gradient": "below the floor",
                                                              "max_fraction_prunable_ablation": 0.25})
    notes = pruning_notes(a, b)
    assert len(notes) == 1 and notes[0].startswith("Prunable within 1% by ablation (the ordering both heads findings lead "
                                                   "with): A 56% (7 of 12 heads), B 25%")


def test_prunable_differences_are_judged_against_both_bootstrap_intervals(tmp_path):
    """#34: where both summaries carry prunable_ci_<ordering> (heads), compare judges the difference of the
    prunable fractions against those intervals (as fractions of the 6 heads) instead of saying none exist."""
    for side, frac, bounds in (("a", 0.5, [2, 4]), ("b", 0.0, [0, 1])):
        _folder(tmp_path / side, "m", 1.0, 0, frac)
        _task(tmp_path / side)  # one set of examples: a difference of the counts is not re-ranking
        summary = io.read_json(tmp_path / side / "heads" / "summary.json")
        io.write_json(tmp_path / side / "heads" / "summary.json", {**summary, "prunable_ci_gradient": {
            "heads": frac * 6, "interval_heads": bounds, "n_examples": 4, "method": "percentile bootstrap"}})
    # A [2/6, 4/6], B [0, 1/6]: half-widths 1/6 + 1/12 = 0.25 < |0 - 0.5|
    notes = pruning_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[1]
    assert len(notes) == 1 and notes[0].startswith("Prunable within 1% by gradient")
    assert ("A 50%" in notes[0] and "B 0%" in notes[0] and "(beyond noise: |B - A| = 0.5 exceeds the combined "
            "half-widths 0.25; 95% CIs A [0.333, 0.667], B [0, 0.167])" in notes[0])


def test_a_prunable_difference_equal_to_identical_intervals_is_within_noise(tmp_path):
    """Review 11a A3: A removes 3 of 6 heads, B 4, both with the bootstrap interval [3, 4] heads (each count on the
    other's edge): |B - A| = 1/6 equals the half-widths 1/12 + 1/12, which the summaries' 6-decimal fractions
    (0.666667 - 0.5 = 0.166667 > 0.1666...) had made "beyond noise"; equal is within."""
    for side, frac in (("a", 0.5), ("b", 0.666667)):
        _folder(tmp_path / side, "m", 1.0, 0, frac)
        _task(tmp_path / side)
        summary = io.read_json(tmp_path / side / "heads" / "summary.json")
        io.write_json(tmp_path / side / "heads" / "summary.json", {**summary, "n_heads": 6, "prunable_ci_gradient": {
            "heads": frac * 6, "interval_heads": [3.0, 4.0], "n_examples": 4, "method": "percentile bootstrap"}})
    (note,) = pruning_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[1]
    assert note.startswith("(same) Prunable within 1% by gradient") and "beyond noise" not in note  # 19e C2: not a difference
    assert ("(within noise: |B - A| = 0.167 equals the combined half-widths, not beyond them; the intervals coincide, "
            "95% CI [0.5, 0.667] in both)") in note
    # just past them (B's interval one hundredth of a head narrower): beyond
    from headscope.reports.compare_run import noise_verdict

    assert noise_verdict(0.5, 0.666667, (0.5, 4 / 6), (0.5 + 0.01 / 6, 4 / 6)).startswith(" (beyond noise")


def test_compare_mutes_with_the_importance_se_the_heads_analysis_writes(tmp_path, tiny_models):
    """#34 A8: results.csv from heads.importance_table carries importance_se per method; compare reads it per
    head: B = A + 3 se at L0H0 is beyond 1.96 sqrt(2) se, B = A + 1 se elsewhere is within."""
    import numpy as np
    import torch

    from headscope.analyses.core.tasks import Task
    from headscope.analyses.heads import analysis as heads
    from headscope.analyses.heads import importance as hi
    from headscope.reports.compare import importance_figure
    from tests_support import random_tokens

    model = tiny_models["gpt2"]
    g = torch.Generator().manual_seed(9)
    task = Task(name="t", tokens=random_tokens(6, 8, seed=9), answers=torch.randint(10, 40, (6,), generator=g),
                wrong_answers=torch.randint(10, 40, (6,), generator=g), metric="logit_diff")
    df, _, _, _, _ = heads.importance_table(model, hi.make_scorer(model, task), ("gradient", "zero"))
    assert df["importance_se"].gt(0).all()
    _folder(tmp_path / "a", "m", 1.0, 0, 0.5)
    _folder(tmp_path / "b", "m", 1.0, 0, 0.5)
    shift = df["importance_se"] * np.where((df["layer"] == 0) & (df["head"] == 0), 3.0, 1.0)
    io.write_csv(tmp_path / "a" / "heads" / "results.csv", df)
    io.write_csv(tmp_path / "b" / "heads" / "results.csv", df.assign(importance=df["importance"] + shift))
    fig, notes, _ = importance_figure(Run(tmp_path / "a"), Run(tmp_path / "b"))
    coloured = fig.axes[2].collections[-1]  # B - A of the gradient panel: beyond noise only at L0H0
    expected = np.ones((2, 4), dtype=bool)
    expected[0, 0] = False
    assert (coloured.get_array().mask.reshape(2, 4) == expected).all()
    assert any("each head's standard error in results.csv" in n for n in notes)


def _probes(root, *, best: float, n: int, chance: dict, best_ci: list[float] | None = None) -> None:
    """A folder with a probes summary only: the best accuracy, the chance entry the registry adds and, in newer
    summaries, the interval the finding prints (best_ci)."""
    io.write_json(root / "manifest.json", {"model": {"name": "m"}, "seed": 0, "config": {"analyses": ["probes"]}})
    io.write_json(root / "probes" / "summary.json", {
        "metric": "accuracy", "best_accuracy": best, "best_layer": 0, "best_std": 0.3, "cv": 3, "n_examples": n,
        "majority_baseline": chance["chance_value"], "labels": "answer", "chance": {"metric": "probe accuracy", **chance},
        **({"best_ci": best_ci} if best_ci else {})})


def test_compare_probes_uses_each_findings_interval_and_respects_its_at_chance_verdict(tmp_path):
    from headscope.reports.compare_headlines import NOT_STATED, headline_notes
    from headscope.reports.findings import finding

    # the review's case: B's report withholds its probe at chance; compare's old Wilson interval [0.28, 0.787] of 7/12
    # was in neither report, and its "beyond noise" judged a number B refused to interpret
    _probes(tmp_path / "a", best=1.0, n=19, chance={"at_chance": False, "chance_value": 0.26, "mean": 1.0, "ci": [0.824, 1.0]})
    _probes(tmp_path / "b", best=0.583, n=11, chance={"at_chance": True, "below_chance": False, "chance_value": 0.5,
                                                       "mean": 0.52, "ci": [0.35, 0.7]})  # upper end under 0.75: at chance
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c.html")]) == 0
    page = (tmp_path / "c.html").read_text()
    not_compared = page[page.index("id='not-compared'"):page.index("id='findings'")]
    assert ("<li>probes best accuracy: not compared: B&#x27;s report calls the probe at chance (probe accuracy 0.52 "
            "against chance 0.5, 95% CI [0.35, 0.7], 11 examples) and withholds it (n differs: 19 vs 11 examples, a "
            "setting, not the model: other example sets, intervals of other widths).</li>") in not_compared
    differences = page[page.index("id='differences'"):page.index("id='not-compared'")]
    assert "probes" not in differences and "0.583" not in differences and "0.787" not in page
    # neither at chance, summaries with the interval the finding prints (best_ci): exactly those intervals are judged,
    # not the chance guard's; half-widths 0.075 + 0.175 = 0.25 >= |0.7 - 0.9| = 0.2: within noise
    guard = {"at_chance": False, "chance_value": 0.5, "mean": 0.8, "ci": [0.79, 0.81]}
    _probes(tmp_path / "c", best=0.9, n=40, chance=guard, best_ci=[0.8, 0.95])
    _probes(tmp_path / "d", best=0.7, n=40, chance=guard, best_ci=[0.5, 0.85])
    assert headline_notes(Run(tmp_path / "c"), Run(tmp_path / "d")) == [
        SAME + "probes best accuracy: A 0.9, B 0.7 (n 40 each) (within noise: |B - A| = 0.2 is inside the combined half-widths "
        "0.25; 95% CIs A [0.8, 0.95], B [0.5, 0.85])."]
    # older summaries: the finding prints the fold sd, no interval, so none is used (not the guard's, not a Wilson one)
    _probes(tmp_path / "e", best=1.0, n=19, chance={**guard, "mean": 1.0, "ci": [0.824, 1.0]})
    _probes(tmp_path / "f", best=0.7, n=19, chance={**guard, "mean": 0.7, "ci": [0.49, 0.85]})
    assert headline_notes(Run(tmp_path / "e"), Run(tmp_path / "f")) == [
        NOT_COMPARED + "probes best accuracy: not compared: A 1, B 0.7 (n 19 each)" + NOT_STATED]
    # a summary without a chance entry: its finding's own rule (best within 0.02 of the majority class) withholds it
    s = io.read_json(tmp_path / "f" / "probes" / "summary.json")
    io.write_json(tmp_path / "f" / "probes" / "summary.json", {k: v for k, v in s.items() if k != "chance"}
                  | {"best_accuracy": 0.51})
    assert "That is chance level" in finding("probes", io.read_json(tmp_path / "f" / "probes" / "summary.json"))
    assert headline_notes(Run(tmp_path / "e"), Run(tmp_path / "f")) == [
        NOT_COMPARED + "probes best accuracy: not compared: B's report calls the probe chance level (accuracy 0.51 "
        "against a majority baseline of 0.5) and withholds it (n 19 each)."]


def test_compare_counts_probes_on_the_shipped_sentences_in_token_positions(tmp_path):
    """Verification 11b N8: the probes' 2375 and 909 examples are token positions of 64 and 24 shipped sentences (the
    summary's example_unit and shipped_text; the report's provenance says so); compare called them examples."""
    from headscope.reports.findings import finding
    from headscope.reports.provenance import provenance_lines

    for side, n, sentences, chance in (
            ("a", 2375, 64, {"at_chance": False, "chance_value": 0.42, "mean": 0.447, "ci": [0.427, 0.467]}),
            ("b", 909, 24, {"at_chance": True, "below_chance": False, "chance_value": 0.418, "mean": 0.418,
                            "ci": [0.386, 0.451]})):
        _probes(tmp_path / side, best=chance["mean"], n=n, chance=chance, best_ci=chance["ci"])
        s = io.read_json(tmp_path / side / "probes" / "summary.json")
        s |= {"example_unit": "examples", "shipped_text": {"n_sentences": sentences}}
        io.write_json(tmp_path / side / "probes" / "summary.json", s)
        record = {"task": "sentences", "source": "its default task", "n_examples": n, "token_positions_of": sentences}
        io.write_json(tmp_path / side / "probes" / "task.json", record)  # as reports/provenance.py task_record writes it
        assert chance["at_chance"] or f"({n} token positions of {sentences} sentences)" in finding("probes", s)
        assert f"examples: {n} token positions of {sentences} sentences;" in " ".join(provenance_lines(record))
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    assert "probes examples: A 2375 token positions of 64 sentences, B 909 token positions of 24 sentences." in \
        settings_notes(a, b, ["probes"])
    assert headline_notes(a, b) == [
        NOT_COMPARED + "probes best accuracy: not compared: B's report calls the probe at chance (probe accuracy 0.418 "
        "against chance 0.418, 95% CI [0.386, 0.451], 909 token positions) and withholds it (n differs: 2375 vs 909 "
        "token positions, a setting, not the model: other example sets, intervals of other widths)."]


def test_compare_position_overlay_on_the_metrics_range_with_whole_slots_and_ratios_only_where_stated(tmp_path, monkeypatch):
    from headscope.reports import compare

    for side, sign in (("a", 1.0), ("b", -1.0)):  # one model, seed and task: the same prompts, so the curves are compared
        _folder(tmp_path / side, "m", sign, 0, 0.5)
        io.write_csv(tmp_path / side / "position" / "curve.csv", pd.DataFrame({  # flat at 0, four whole slots
            "condition": "full", "metric": "accuracy", "position": [1, 2, 3, 4], "mean": 0.0}))
    drawn = []
    monkeypatch.setattr(compare, "_img", lambda fig, alt: drawn.append(fig) or "<img>")
    body, notes = position_section(Run(tmp_path / "a"), Run(tmp_path / "b"))
    ax = drawn[0].axes[0]
    assert ax.get_ylim() == (0.0, 1.0)  # accuracy's whole range, not -0.04..0.04 around a flat 0
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)  # slots are whole numbers: no 1.5, 2.5
    assert ax.get_ylabel() == "accuracy (mean over examples)"
    # the ratios differ by 0.22 (0.67 vs 0.44), but A's own finding states none: its curve is flat
    summary = io.read_json(tmp_path / "a" / "position" / "summary.json")
    io.write_json(tmp_path / "a" / "position" / "summary.json", {
        **summary, "metric_per_position": {"accuracy": {"1": 0.5, "2": 0.505, "3": 0.51}}})
    notes = position_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[1]
    assert notes == [NOT_COMPARED + "Middle/ends ratio of accuracy (the metric plotted): not compared: A's curve is flat "
                     "(its values span less than 0.02), so its report states no ratio."]
    io.write_json(tmp_path / "a" / "position" / "summary.json", summary)  # both state theirs
    assert position_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[1] == [
        "Middle/ends ratio of accuracy (the metric plotted): A 0.67, B 0.44 (n not recorded)" + NO_INTERVAL]


def test_compare_names_patching_positions_from_the_end_with_the_token_quoted_once(tmp_path):
    for side, layer in (("a", 0), ("b", 1)):  # the same prompts: positions compared
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        io.write_json(tmp_path / side / "patching" / "summary.json", {"top_sites": {"resid_pre": [
            {"layer": layer, "head": None, "pos": 13, "from_end": -1, "token": "13:  is", "effect": 1.5},
            {"layer": 0, "head": None, "pos": 12, "from_end": -2, "token": "", "effect": 0.5}]}})
    table, notes = patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))
    assert notes == ["Top resid_pre site differs: A resid_pre L0 pos -1 from the end (' is'), B resid_pre L1 pos -1 from "
                     "the end (' is')."]  # the padded frame's 13 is not this axis; one space, the token's own
    assert table.count("resid_pre L0 pos -2 from the end (its token differs across prompts)") == 2
    assert "13:" not in table and "  is" not in table


def test_compare_attribution_and_mlp_use_the_intervals_their_findings_print(tmp_path):
    from scipy import stats

    from headscope.reports.compare_headlines import headline_notes
    from headscope.reports.findings import finding

    summaries = {"a": ({"n_examples": 12, "mean_tau_attention_gradient": 0.5, "std_tau_attention_gradient": 0.2,
                        "n_tau_attention_gradient": 10, "n_tied_scores_gradient": 2},
                       {"agreement_per_layer": {"0": 0.1, "1": 0.3}, "agreement_count_per_layer": {"1": 30},
                        "n_neurons_per_layer": 100, "n_prefixes": 50}),
                 "b": ({"n_examples": 12, "mean_tau_attention_gradient": 0.1, "std_tau_attention_gradient": 0.2,
                        "n_tau_attention_gradient": 12},
                       {"agreement_per_layer": {"0": 0.1, "1": 0.2}, "n_neurons_per_layer": 100, "n_prefixes": 50})}
    for side, (attribution, mlp) in summaries.items():
        io.write_json(tmp_path / side / "manifest.json", {"model": {"name": "m"}, "config": {"analyses": ["attribution", "mlp"]}})
        io.write_json(tmp_path / side / "attribution" / "summary.json", attribution)
        io.write_json(tmp_path / side / "mlp" / "summary.json", mlp)
    notes = headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b"))
    # A's tau over its 10 examples with a defined tau, B's over 12: t intervals from scipy
    ia = stats.t.interval(0.95, 9, loc=0.5, scale=0.2 / 10 ** 0.5)
    ib = stats.t.interval(0.95, 11, loc=0.1, scale=0.2 / 12 ** 0.5)
    # review 11a A3: one example set (12 each), A's tau undefined on 2 where its record says why: not "a setting"
    assert notes[0] == (f"attribution mean Kendall tau of attention and gradient x input: A 0.5, B 0.1 (n differs: 10 vs 12 "
                        "of the same 12 examples: A has a tau on 10 of 12 examples (gradient x input gives every token "
                        "the same score on 2); intervals of other widths) (beyond noise: "
                        f"|B - A| = 0.4 exceeds the combined half-widths {(ia[1] - ia[0]) / 2 + (ib[1] - ib[0]) / 2:.3g}; "
                        f"95% CIs A [{ia[0]:.3g}, {ia[1]:.3g}], B [{ib[0]:.3g}, {ib[1]:.3g}]).")
    assert f"95% CI [{ia[0]:.2f}, {ia[1]:.2f}]" in finding("attribution", summaries["a"][0])  # the one A's report prints
    # mlp: A's layer 1 (30 of 100 recorded), B's layer 1 (20 of 100): Wilson intervals from scipy
    wa = stats.binomtest(30, 100).proportion_ci(method="wilson")
    wb = stats.binomtest(20, 100).proportion_ci(method="wilson")
    assert notes[1] == (SAME + "mlp highest layer key-value agreement (layer 1 in both): A 0.3, B 0.2 (n 100 neurons "
                        "each) (within noise: |B - A| = "
                        f"0.1 is inside the combined half-widths {(wa.high - wa.low) / 2 + (wb.high - wb.low) / 2:.3g}; 95% CIs "
                        f"A [{wa.low:.3g}, {wa.high:.3g}], B [{wb.low:.3g}, {wb.high:.3g}]).")
    assert f"Wilson 95% CI {100 * wa.low:.0f}%-{100 * wa.high:.0f}%" in finding("mlp", summaries["a"][1])
    assert len(notes) == 2
    # review 7b A1: a mixture of experts' headline is over every expert neuron (40 of 384), not one expert's 96
    from headscope.reports.compare_headlines import _mlp

    moe = {"agreement_per_layer": {"0": 40 / 384, "1": 33 / 384}, "agreement_count_per_layer": {"0": 40, "1": 33},
           "n_memories_per_layer": {"0": 384, "1": 384}, "n_neurons_per_layer": 384,
           "experts_per_layer": {l: {"n_experts": 4, "expert_width": 96, "top_k": 2, "shared_width": 0} for l in "01"}}
    w = stats.binomtest(40, 384).proportion_ci(method="wilson")
    ((label, value, ci, n, unit),) = _mlp(moe)
    assert (value, n, unit) == (40 / 384, 384, "expert neurons") and abs(ci[0] - w.low) + abs(ci[1] - w.high) < 1e-9
    # different example counts: positions are not compared, and a head site's difference carries both n
    for side, head, n in (("a", 0, 8), ("b", 2, 12)):
        io.write_json(tmp_path / side / "patching" / "summary.json", {"n_examples": n, "top_sites": {"head_out": [
            {"layer": 0, "head": head, "pos": None, "token": "all", "effect": 1.5}]}})
    assert patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[1] == [
        "Top head_out site differs: A head_out L0 H0, B head_out L0 H2 (n differs: 8 vs 12 examples, a setting, not the "
        "model: other example sets, intervals of other widths)."]


def test_compare_does_not_set_taus_or_agreement_a_report_withholds_at_chance_against_each_other(tmp_path):
    """Verification 11b N2: both attribution findings at or below chance and both mlp findings below chance withhold
    their taus and agreement ('relative findings are not reported'); compare called an IG tau difference of 0.209
    'beyond noise' there. The same refusal as for probes: listed as not compared, with each report's reason."""
    from headscope.reports.findings import finding

    logit = {"metric": "logit_diff", "chance_value": 0.0, "task": "ioi_names", "at_chance": True}
    logprob = {"metric": "logprob", "chance_value": -6.118, "task": "sentences", "at_chance": True, "below_chance": True}
    summaries = {"a": ({"n_examples": 4, "mean_tau_attention_gradient": -0.1, "std_tau_attention_gradient": 0.01,
                        "chance": {**logit, "below_chance": True, "mean": -2.9, "ci": [-3.47, -2.32], "n_examples": 4}},
                       {"agreement_per_layer": {"0": 0.1, "1": 0.3}, "n_neurons_per_layer": 100,
                        "chance": {**logprob, "mean": -9.21, "ci": [-11.1, -7.35], "n_examples": 16}}),
                 "b": ({"n_examples": 24, "mean_tau_attention_gradient": 0.5, "std_tau_attention_gradient": 0.01,
                        "chance": {**logit, "below_chance": False, "mean": -0.0856, "ci": [-0.933, 0.762],
                                   "n_examples": 24}},
                       {"agreement_per_layer": {"0": 0.9, "1": 0.2}, "n_neurons_per_layer": 100,
                        "chance": {**logprob, "mean": -9.53, "ci": [-10.6, -8.41], "n_examples": 24}})}
    for side, (attribution, mlp) in summaries.items():
        io.write_json(tmp_path / side / "manifest.json", {"model": {"name": "m"}, "config": {"analyses": ["attribution", "mlp"]}})
        io.write_json(tmp_path / side / "attribution" / "summary.json", attribution)
        io.write_json(tmp_path / side / "mlp" / "summary.json", mlp)
        for name, s in zip(("attribution", "mlp"), (attribution, mlp)):  # each report withholds them itself
            assert "relative findings are not reported" in finding(name, s) and "-0.1" not in finding(name, s)
    assert headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b")) == [
        NOT_COMPARED + "attribution mean Kendall tau of attention and gradient x input: not compared: A's report calls "
        "the model below chance on task ioi_names (logit difference -2.9 against chance 0, 95% CI [-3.47, -2.32], 4 examples) "
        "and withholds its relative findings; B's report calls the model at chance on task ioi_names (logit difference "
        "-0.0856 against chance 0, 95% CI [-0.933, 0.762], 24 examples) and withholds its relative findings.",
        NOT_COMPARED + "mlp highest layer key-value agreement: not compared: A's report calls the model below chance on "
        "task sentences (answer log-probability -9.21 against chance -6.12, 95% CI [-11.1, -7.35], 16 examples) and withholds "
        "its relative findings; B's report calls the model below chance on task sentences (answer log-probability -9.53 "
        "against chance -6.12, 95% CI [-10.6, -8.41], 24 examples) and withholds its relative findings."]
    # one side above chance: still not compared (the other report states no number to set against it)
    io.write_json(tmp_path / "b" / "mlp" / "summary.json", {**summaries["b"][1], "chance": {
        **logprob, "at_chance": False, "below_chance": False, "mean": -1.0, "ci": [-1.2, -0.8], "n_examples": 24}})
    notes = headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b"))
    assert notes[1].startswith(NOT_COMPARED + "mlp highest layer key-value agreement: not compared: A's report calls "
                               "the model below chance") and "B's report" not in notes[1] and len(notes) == 2


def test_compare_does_not_set_a_kv_full_cache_metric_its_report_gives_at_chance_against_the_other(tmp_path):
    """Issue 34: the kv finding below chance gives its full-cache metric after 'relative findings are not reported';
    compare set A's -9.21 against B's -1.5 as a difference. Listed as not compared with A's reason, as attribution and
    mlp; with neither report at chance the two numbers are compared."""
    from headscope.reports.findings import finding

    below = {"metric": "logprob", "chance_value": -6.118, "task": "sentences", "at_chance": True, "below_chance": True,
             "mean": -9.21, "ci": [-11.1, -7.35], "n_examples": 16}
    above = {**below, "at_chance": False, "below_chance": False, "mean": -1.5, "ci": [-1.7, -1.3]}
    for side, entry in (("a", below), ("b", above)):
        io.write_json(tmp_path / side / "manifest.json", {"model": {"name": "m"}, "config": {"analyses": ["kv"]}})
        io.write_json(tmp_path / side / "kv" / "summary.json", {"n_examples": 16, "metric": "logprob",
                                                                "metric_unevicted": entry["mean"], "chance": entry})
    said = finding("kv", {"metric": "logprob", "metric_unevicted": -9.21, "chance": below})
    assert "relative findings are not reported" in said  # and its number once (issue 34, as heads)
    assert said.count("-9.21") == 1 and said.endswith("The full-cache metric is the answer log-probability above.")
    assert headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b")) == [
        NOT_COMPARED + "kv full-cache answer log-probability: not compared: A's report calls the model below chance on "
        "task sentences (answer log-probability -9.21 against chance -6.12, 95% CI [-11.1, -7.35], 16 examples) and "
        "withholds its relative findings."]
    io.write_json(tmp_path / "a" / "kv" / "summary.json", {"n_examples": 16, "metric": "logprob",
                                                           "metric_unevicted": -1.0, "chance": {**above, "mean": -1.0}})
    assert headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b")) == [
        NOT_COMPARED + "kv full-cache answer log-probability: not compared: A -1, B -1.5 (n 16 each) (its finding states "
        "no interval for it: whether this is beyond noise is not known)."]


def _pruned_folder(root, name, gradient, random, n_heads=6):
    """A heads folder whose gradient curve has per-example values (gradient: [points][examples], points at 0, 1, 2
    heads removed) and whose random curve has two seeds (random: {seed: [metric per point]})."""
    _folder(root, name, 1.0, 0, 0.0)
    means = [sum(p) / len(p) for p in gradient]
    curve = [{"ordering": "gradient", "recompute": False, "seed": 0, "n_pruned": k, "fraction_pruned": k / n_heads,
              "metric": m} for k, m in enumerate(means)]
    curve += [{"ordering": "random", "recompute": False, "seed": s, "n_pruned": k, "fraction_pruned": k / n_heads,
               "metric": m} for s, ms in random.items() for k, m in enumerate(ms)]
    io.write_csv(root / "heads" / "curve.csv", pd.DataFrame(curve))
    io.write_csv(root / "heads" / "curve_examples.csv", pd.DataFrame(
        [{"ordering": "gradient", "recompute": False, "seed": 0, "n_pruned": k, "example": e, "metric": v}
         for k, point in enumerate(gradient) for e, v in enumerate(point)]))


def test_prunable_counts_of_runs_ranked_on_other_examples_are_not_compared_and_both_lines_are_judged_alike(tmp_path):
    """Review 5 A1: runs whose heads ranked on other examples (other file rows) re-rank the heads, which the
    bootstrap intervals (order fixed) do not cover: the counts go to the Not-compared list, whatever the intervals
    say. A's first step past its line by 0.6% and B's by 0.1% are both flagged on the line: the paired 95% t interval
    of each one's change from unpruned reaches the line (hand-worked below; review 10b A3), said as close to it
    where the count's bootstrap interval is one value, as the heads finding says. The
    random ordering is given seed by seed, with no noise verdict from 2 seeds."""
    from headscope.reports.compare import pruning_notes

    # A: unpruned mean 10, line 9.9; 1 head removed: mean 9.84, 0.06 (0.6%) past the line. Its change from unpruned
    # [-0.3, -0.2, -0.2, 0.06] has mean -0.16 and sd 0.15406, so the paired half-width is t(3) 3.1824 x 0.15406 / 2
    # = 0.245: -0.405 to +0.085, reaching -0.1
    a_grad = [[10.0, 10.2, 9.8, 10.0], [9.7, 10.0, 9.6, 10.06], [8.0, 8.0, 8.0, 8.0]]
    # B: unpruned 10, line 9.9; 1 head kept (10.0); 2 heads: 9.89, 0.01 (0.1%) past the line; change [-0.25, 0,
    # -0.12, -0.07], mean -0.11, sd 0.10551, half-width 0.1679: -0.278 to +0.058
    b_grad = [[10.1, 9.9, 10.0, 10.0], [10.0, 9.95, 9.98, 10.07], [9.85, 9.9, 9.88, 9.93]]
    _pruned_folder(tmp_path / "a", "m", a_grad, {0: [10.0, 9.95, 8.0], 1: [10.0, 9.5, 8.0]})  # seeds keep 1 and 0 heads
    _pruned_folder(tmp_path / "b", "m", b_grad, {0: [10.0, 9.0, 8.0], 1: [10.0, 9.5, 8.0]})
    ci = {"n_examples": 4, "level": 0.95, "method": "percentile bootstrap"}
    for side, grad, rand, rows in (("a", 0, 0.5, (0, 1, 2, 3)), ("b", 1, 0, (4, 5, 6, 7))):
        _task(tmp_path / side, rows)
        s = io.read_json(tmp_path / side / "heads" / "summary.json")
        io.write_json(tmp_path / side / "heads" / "summary.json", {
            **s, "baseline_metric": 10.0, "max_fraction_prunable_gradient": grad / 6, "heads_prunable_gradient": grad,
            "max_fraction_prunable_random": rand / 6, "heads_prunable_random": rand,
            "prunable_ci_gradient": {**ci, "interval_heads": [grad, grad]},  # zero-width: "beyond noise" by the intervals
            "prunable_ci_random": {**ci, "interval_heads": [rand / 2, rand]}})  # a bootstrap of the seeds' mean
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    notes = pruning_notes(a, b)
    assert len(notes) == 3 and not any("beyond noise" in n or "within noise" in n for n in notes)
    assert notes[0] == "The heads findings lead with different orderings: A random (8%), B gradient (17%)."
    random, gradient = notes[1:]
    assert gradient.startswith(NOT_COMPARED + "Prunable within 1% by gradient (the ordering B's heads finding leads "
                               "with): A 0% (0 of 6 heads), B 17% (1 of 6 heads): not compared: the runs ranked heads on "
                               "different examples, and the intervals do not cover re-ranking (other file rows).")
    # each bootstrap interval is one value (0-0, 1-1 heads): close to the line, as the heads findings say, not fragile
    assert ("A's 0% sits close to its 1% line: the point at 1 head removed is 9.84, past the line 9.9; its change from "
            "unpruned -0.16 has a paired 95% CI of -0.405 to +0.0851, reaching the line's -0.1: its 95% bootstrap "
            "interval is the single value 0 heads, so the count held in most resamples of the examples, though this "
            "point's interval does not rule out a move") in gradient
    assert ("B's 17% sits close to its 1% line: the point at 2 heads removed is 9.89, past the line 9.9; its change from "
            "unpruned -0.11 has a paired 95% CI of -0.278 to +0.0579, reaching the line's -0.1") in gradient
    assert "fragile" not in gradient
    assert random == (NOT_COMPARED + "Prunable within 1% by random (mean over random orders): A 8% (1 and 0 heads over "
                      "2 seeds), B 0% (0 and 0 heads over 2 seeds): not compared: too few seeds for a noise verdict "
                      "(fewer than 5 in both runs; the seed ranges overlap).")  # review 14a C5
    # the same examples (one task.json): the fixed ordering is judged against the intervals again, its lines still said
    _task(tmp_path / "b", (0, 1, 2, 3))
    gradient = pruning_notes(a, b)[2]
    assert not gradient.startswith(NOT_COMPARED) and "(beyond noise: |B - A| = 0.167" in gradient
    assert "A's 0% sits close to its 1% line" in gradient and "B's 17% sits close to its 1% line" in gradient


def _attribution(root, model, summary, task, source, rows=None, sample="Ann has a red hat.") -> None:
    """attribution's summary and task.json (reports/provenance.py task_record) under `root`, with a manifest."""
    io.write_json(root / "manifest.json", {"model": {"name": model}, "config": {"analyses": ["attribution"]}})
    io.write_json(root / "attribution" / "summary.json", summary)
    io.write_json(root / "attribution" / "task.json", {"task": task, "source": source, "n_examples": 4,
                                                       **({"rows": rows} if rows else {}), "sample": {"prompt": sample}})


TAUS = {"n_examples": 4, "mean_tau_attention_gradient": 0.1, "std_tau_attention_gradient": 0.2,
        "mean_tau_attention_loo": -0.2, "std_tau_attention_loo": 0.1, "mean_tau_attention_ig": 0.3,
        "std_tau_attention_ig": 0.05, "ig_converged": True, "ig_used": "all", "ig_n_not_converged": 0}


def test_compare_uses_integrated_gradients_by_the_reports_own_rule(tmp_path):
    """Review 6 and 7b, A3: compare listed IG's tau where its report left IG out, and over every example where 2 of
    4 missed completeness. Now it reads the reports' own rule (analyses/attribution/convergence.py): over the
    converged examples, n said in those, with the t interval over them (scipy); not compared, and why, where a report
    leaves IG out."""
    from scipy import stats

    half = {**TAUS, "ig_converged": False, "ig_used": "converged", "ig_n_converged": 2, "ig_n_not_converged": 2,
            "ig_examples_used": [0, 2], "n_tau_attention_ig": 2, "mean_tau_attention_ig": 0.6}
    left_out = {**TAUS, "ig_converged": False, "ig_used": "none", "ig_n_converged": 1, "ig_n_not_converged": 3,
                "ig_examples_used": []}
    left_out.pop("mean_tau_attention_ig")  # the analysis keeps no IG aggregate it leaves out
    for side, summary in (("a", TAUS), ("b", half), ("c", left_out)):
        _attribution(tmp_path / side, "m", summary, "colours", "your task (colours.jsonl)")
    a, b, c = (Run(tmp_path / side) for side in "abc")
    ia = stats.t.interval(0.95, 3, loc=0.3, scale=0.05 / 2)
    ib = stats.t.interval(0.95, 1, loc=0.6, scale=0.05 / 2 ** 0.5)
    ig = [n for n in headline_notes(a, b) if "integrated gradients" in n]
    assert ig == [(SAME + f"attribution mean Kendall tau of attention and integrated gradients: A 0.3, B 0.6 (n 4 examples vs 2 "
                  f"converged examples: intervals of other widths) (within noise: |B - A| = 0.3 is inside the combined "
                  f"half-widths {(ia[1] - ia[0]) / 2 + (1 - ib[0]) / 2:.3g}; 95% CIs A [{ia[0]:.3g}, "
                  f"{ia[1]:.3g}], B [{ib[0]:.3g}, 1]).")]
    ig = [n for n in headline_notes(a, c) if "integrated gradients" in n]
    assert ig == [NOT_COMPARED + "attribution mean Kendall tau of attention and integrated gradients: not compared: B's "
                  "report leaves integrated gradients out (it converged on 1 of 4 examples) (n 4 examples vs 1 converged "
                  "examples: intervals of other widths)."]
    ig = [n for n in headline_notes(c, c) if "integrated gradients" in n]  # both leave it out: both reasons said
    assert ig == [NOT_COMPARED + "attribution mean Kendall tau of attention and integrated gradients: not compared: A's "
                  "report leaves integrated gradients out (it converged on 1 of 4 examples); B's report leaves integrated "
                  "gradients out (it converged on 1 of 4 examples) (n 1 converged examples each)."]
    # a summary written before the rule, 2 of 4 not converged beside ig_converged True (review 7b's): left out too
    legacy = {k: v for k, v in half.items() if k not in ("ig_used", "ig_examples_used", "ig_n_converged")}
    _attribution(tmp_path / "d", "m", {**legacy, "ig_converged": True}, "colours", "your task (colours.jsonl)")
    ig = [n for n in headline_notes(a, Run(tmp_path / "d")) if "integrated gradients" in n]
    assert ig == [NOT_COMPARED + "attribution mean Kendall tau of attention and integrated gradients: not compared: B's "
                  "report leaves integrated gradients out (its IG taus include examples that missed completeness) (n 4 "
                  "examples vs 2 converged examples: intervals of other widths)."]


def test_compare_leaves_out_leave_one_out_where_its_report_does(tmp_path):
    """Review 10a A1: where most leave-one-out scores are within one bfloat16 rounding step (loo_rounding), its report
    states no leave-one-out tau; compare then sets no number of it against A's and says why."""
    rounded = {**TAUS, "loo_rounding": {"dtype": "bfloat16", "floor": [0.074, 0.076], "n_within": 69, "n_scores": 97,
                                        "ranks_rounding": True}}
    for side, summary in (("a", TAUS), ("b", rounded)):
        _attribution(tmp_path / side, "m", summary, "colours", "your task (colours.jsonl)")
    loo = [n for n in headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b")) if "leave-one-out" in n]
    assert loo == [NOT_COMPARED + "attribution mean Kendall tau of attention and leave-one-out: not compared: B's "
                   "report leaves leave-one-out out (69 of 97 of its scores are within one bfloat16 rounding step of the "
                   "logits) (n 4 each)."], loo


def test_compare_sets_no_number_of_one_task_against_another_and_names_different_models(tmp_path):
    """Review 7b, A4: attribution taus of A's fruit_cloze.jsonl and B's shipped sentences (and two models) were listed
    as differences "beyond noise"; the prunable counts of the same 16 sentences were refused as "ranked on different
    examples" because the two sources' wording differed. Now every family's numbers are compared only on one task,
    else not compared with the tasks named; the counts of two models are refused for the models."""
    from headscope.reports.compare import importance_figure, pruning_notes

    other = {**TAUS, "mean_tau_attention_loo": 0.785, "std_tau_attention_loo": 0.1}
    _attribution(tmp_path / "a", "./trained", TAUS, "fruit_cloze", "your task (fruit_cloze.jsonl)", rows=[4, 5, 13, 19])
    _attribution(tmp_path / "b", "minilm", other, "sentences", "its default task (no --task given)")
    for side, n_heads, grid in (("a", 6, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), ("b", 6, [[6.0, 5.0, 4.0], [3.0, 2.0, 1.0]])):
        root = tmp_path / side
        io.write_json(root / "heads" / "summary.json", {"metric": "cosine", "baseline_metric": 1.0, "n_heads": n_heads,
                                                        "n_examples": 16, "max_fraction_prunable_ablation": 0.5 - 0.25 * (
                                                            side == "b"), "heads_prunable_ablation": 3 - 1.5 * (side == "b"),
                                                        "max_fraction_prunable_random": 0.1 * (1 + (side == "b"))})
        io.write_json(root / "heads" / "task.json", {"task": "sentences", "n_examples": 16, "sample": {
            "prompt": "The cat slept."}, "source": "its default task, because your task could not be used: an encoder"
            if side == "a" else "its default task (no --task given)"})
        _importance(root, grid)
        io.write_json(root / "patching" / "summary.json", {"n_examples": 4, "top_sites": {"head_out": [
            {"layer": 0, "head": int(side == "b"), "pos": None, "token": "all", "effect": 1.5}]}})
        io.write_json(root / "patching" / "task.json", {"task": "ioi" if side == "a" else "kv", "n_examples": 4,
                                                        "source": "its default task (no --task given)"})
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    notes = headline_notes(a, b)
    assert notes == [SAME + "heads unpruned cosine similarity: A 1, B 1 (n 16 each): equal at the shown precision (3 "
                     "significant figures).",
                     NOT_COMPARED + "attribution mean Kendall tau of attention and gradient x input, leave-one-out and "
                     "integrated gradients: not compared: A ran attribution on fruit_cloze.jsonl, B on the shipped "
                     "sentences."]
    assert patching_section(a, b)[1] == [NOT_COMPARED + "Top patching sites: not compared: A ran patching on the ioi "
                                         "task, B on the kv task."]
    # heads: the same sentences (two wordings of why the default was used): the task is the same, the models are not
    random = (NOT_COMPARED + "Prunable within 1% by random (mean over random orders): A 10% (per-seed counts not "
              "recorded), B 20% (per-seed counts not recorded): not compared: no noise verdict without each seed's count.")
    assert pruning_notes(a, b) == [NOT_COMPARED + "Prunable within 1% by ablation (the ordering both heads findings lead "
                                   "with): A 50% (3 of 6 heads), B 25% (2 of 6 heads): not compared: different models "
                                   "(./trained vs minilm, 6 heads each), each ranking its own heads, and the intervals do "
                                   "not cover re-ranking.", random]  # random orders rank nothing: said, with no verdict
    _, importance, _ = importance_figure(a, b)
    assert importance[0].startswith("Head importance (gradient importance): Pearson r = -1.00")  # one task: compared
    # heads on another task: no importance cell or count is set against the other's
    io.write_json(tmp_path / "b" / "heads" / "task.json", {"task": "colours", "n_examples": 16,
                                                           "source": "your task (colours.csv)"})
    _, importance = importance_section(a, b)
    assert importance == [NOT_COMPARED + "Head importance: not compared: A ran heads on the shipped sentences, B on "
                          "colours.csv; no cell-by-cell difference or correlation.",
                          NOT_COMPARED + "Top heads: not compared: A ran heads on the shipped sentences, B on colours.csv."]
    notes = pruning_notes(a, b)
    assert notes[0].endswith("not compared: A ran heads on the shipped sentences, B on colours.csv; different models "
                             "(./trained vs minilm, 6 heads each), each ranking its own heads, and the intervals do not "
                             "cover re-ranking.")
    assert notes[1] == (random.split(": not compared:")[0] + ": not compared: A ran heads on the shipped sentences, "
                        "B on colours.csv.")
    # B's attribution on A's task (other rows of it) and one model: compared, each difference with its verdict
    _attribution(tmp_path / "b", "./trained", other, "fruit_cloze", "your task (fruit_cloze.jsonl)", rows=[0, 1, 2, 3])
    b = Run(tmp_path / "b")
    notes = [n for n in headline_notes(a, b) if not n.startswith(SAME)]  # agreements within 5% are said, not listed
    assert notes[0] == NOT_COMPARED + ("heads unpruned cosine similarity: not compared: A ran heads on the shipped "
                                       "sentences, B on colours.csv.")
    assert len(notes) == 2 and notes[1].startswith("attribution mean Kendall tau of attention and leave-one-out: A -0.2, "
                                                   "B 0.785 (n 4 each) (beyond noise")
    assert not pruning_notes(a, Run(tmp_path / "a"))[0].startswith(NOT_COMPARED)  # one model, one task: compared


def test_top_sites_that_differ_in_an_early_site_type_with_different_n_do_not_crash_compare(tmp_path):
    """Review 7 A0: a top head_out site that differs between runs of 8 and 12 examples, followed by another
    site type, crashed compare (the slice count reused as the note's text). Each type's note is its own."""
    for side, head, n in (("a", 0, 8), ("b", 2, 12)):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        io.write_json(tmp_path / side / "patching" / "summary.json", {"n_examples": n, "top_sites": {
            "head_out": [{"layer": 0, "head": head, "pos": None, "token": "", "effect": 0.15},
                         {"layer": 0, "head": 1, "pos": None, "token": "", "effect": 0.14}],
            "mlp_out": [{"layer": 1, "head": None, "pos": None, "token": "", "effect": 0.5 + head},
                        {"layer": 0, "head": None, "pos": None, "token": "", "effect": 0.1}]}})
    table, notes = patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))
    assert notes[0].startswith("Top head_out site differs: A ") and "(n " in notes[0]
    assert table.count("<td>mlp_out</td>") == 1 and table.count("<tr>") == 1 + 2 + 2  # header, two rows a type


def test_top_patching_sites_side_by_side_say_when_they_are_within_noise(tmp_path):
    """Review 9a C8: compare listed "head_out L0 H2: 0.48 of the gap" (A, 95% CI [0.12, 0.84]) against "0.37" (B) and
    A's 3rd L0H3 0.11 against B's 3rd L1H0 0.09 bare, though each lies inside the other's interval: a row says
    "within noise" as compare does for taus (each share of its own run's gap: A 20.1, B 20.0)."""
    gaps = {"a": 10.05 - -10.05, "b": 10.0 - -10.0}

    def head(side, layer, h, share, lo, hi):
        g = gaps[side]
        return {"layer": layer, "head": h, "pos": None, "token": "all", "effect": share * g, "ci": [lo * g, hi * g], "n": 8}

    rows = {"a": [head("a", 0, 2, 0.48, 0.12, 0.84), head("a", 0, 1, 0.27, 0.01, 0.53), head("a", 0, 3, 0.11, 0.02, 0.20)],
            "b": [head("b", 0, 2, 0.37, 0.20, 0.54), head("b", 0, 1, 0.17, 0.12, 0.22), head("b", 1, 0, 0.09, 0.05, 0.13)]}
    for side in ("a", "b"):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        io.write_json(tmp_path / side / "patching" / "summary.json", {
            "metric": "logit_diff", "normalized": False, "clean_metric": gaps[side] / 2, "corrupted_metric": -gaps[side] / 2,
            "n_examples": 8, "top_sites": {"head_out": rows[side]}})
    table = html.unescape(patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[0])
    assert ("<td>head_out L0 H2: 0.48 of the gap, 95% CI [0.12, 0.84] (+9.65 logit difference)</td><td>head_out L0 H2: "
            "0.37 of the gap, 95% CI [0.20, 0.54] (+7.4 logit difference)</td><td>within noise: each inside the other's "
            "95% interval</td>") in table
    # L0H1: B's 0.17 lies inside A's [0.01, 0.53], but A's 0.27 outside B's [0.12, 0.22]: not within noise
    assert "0.17 of the gap, 95% CI [0.12, 0.22] (+3.4 logit difference)</td><td>beyond noise" in table
    assert ("</td><td>different sites, their effects within noise: each inside the other's 95% interval</td></tr>"
            in table)  # L0H3 0.11 [0.02, 0.20] against L1H0 0.09 [0.05, 0.13]
    for side in ("a", "b"):  # a v cell's head is a KV head (review 9b A3), not query head 0
        summary = io.read_json(tmp_path / side / "patching" / "summary.json")
        io.write_json(tmp_path / side / "patching" / "summary.json", {**summary, "top_sites": {"v": rows[side][:1]}})
    table = html.unescape(patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[0])
    assert "<td>v L0 KV2: 0.48 of the gap" in table and "H2" not in table


def test_compare_does_not_list_a_swap_of_cells_tied_in_both_runs_as_a_difference(tmp_path):
    """Review 11c C1: float32 listed resid_pre L2 at the answer position first and bfloat16 L1, both 1.00 of the 17.48
    gap in both runs (equal by construction: the residual stream where the metric is read, from layer 1 on), and
    compare listed the swap under "Differences". A swap of two cells tied in both runs is said in its section as no
    difference, with the reason: by construction for whole-gap residual cells at the answer position, else the tie;
    a swap tied in one run only stays a difference."""
    gap = 17.48

    def cell(kind_layer, share, lo, hi, end=-1, head=None):
        return {"layer": kind_layer, "head": head, "pos": 35 + 1 + end if end is not None else None, "from_end": end,
                "token": "35:  was" if end == -1 else "", "effect": share * gap, "ci": [lo * gap, hi * gap], "n": 8}

    def write(kind, a, b):
        for side, cells in (("a", a), ("b", b)):
            io.write_json(tmp_path / side / "patching" / "summary.json", {
                "metric": "logit_diff", "normalized": False, "clean_metric": 8.79, "corrupted_metric": -8.69,
                "n_examples": 8, "top_sites": {kind: cells}})
        return patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[1]

    for side in ("a", "b"):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
    low = cell(0, 0.23, -0.41, 0.87, end=-19)
    a = [cell(2, 1.001, 0.89, 1.12), cell(1, 1.0, 0.88, 1.12), low]
    b = [cell(1, 1.001, 0.89, 1.12), cell(2, 1.0, 0.88, 1.12), low]
    assert write("resid_pre", a, b) == [SAME + (
        "Top resid_pre site: A lists resid_pre L2 pos -1 from the end (' was') first, B resid_pre L1 pos -1 from the end "
        "(' was'): not a difference, both cells carry the whole gap at the answer position in both runs, equal by "
        "construction (the residual stream where the metric is read, once the information has arrived there), so which "
        "is listed first is arbitrary (A: resid_pre L2 pos -1 from the end (' was') (1.00 of the gap, 95% CI [0.89, "
        "1.12]) and resid_pre L1 pos -1 from the end (' was') (1.00 of the gap, 95% CI [0.88, 1.12]); B: resid_pre L1 "
        "pos -1 from the end (' was') (1.00 of the gap, 95% CI [0.89, 1.12]) and resid_pre L2 pos -1 from the end "
        "(' was') (1.00 of the gap, 95% CI [0.88, 1.12])).")]
    page = compare_html(Run(tmp_path / "a"), Run(tmp_path / "b"))
    listed = page.split("<h2 id='differences'>")[1].split("<h2 id='same'>")[0]
    assert "resid_pre" not in listed and "not a difference, both cells carry the whole gap" in page
    heads = [cell(0, 0.30, 0.20, 0.40, end=None, head=1), cell(0, 0.28, 0.18, 0.38, end=None, head=3)]
    assert write("head_out", heads, heads[::-1]) == [SAME + (
        "Top head_out site: A lists head_out L0 H1 first, B head_out L0 H3: not a difference, the two cells are tied in "
        "both runs, each inside the other's 95% interval, so which is listed first is arbitrary (A: head_out L0 H1 (0.30 "
        "of the gap, 95% CI [0.20, 0.40]) and head_out L0 H3 (0.28 of the gap, 95% CI [0.18, 0.38]); B: head_out L0 H3 "
        "(0.28 of the gap, 95% CI [0.18, 0.38]) and head_out L0 H1 (0.30 of the gap, 95% CI [0.20, 0.40])).")]
    clear_b = [cell(0, 0.30, 0.29, 0.31, end=None, head=3), cell(0, 0.10, 0.09, 0.11, end=None, head=1)]
    assert write("head_out", heads, clear_b)[0].startswith("Top head_out site differs: A head_out L0 H1, B head_out L0 H3")


def test_settings_name_a_change_of_precision_and_device(tmp_path):
    """Review 7 A6: float32 against bfloat16 read "The runs share every recorded setting"."""
    for side, dtype in (("a", "float32"), ("b", "bfloat16")):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        manifest = io.read_json(tmp_path / side / "manifest.json")
        io.write_json(tmp_path / side / "manifest.json",
                      {**manifest, "config": {**manifest["config"], "dtype": dtype, "device": "cpu"}})
    notes = settings_notes(Run(tmp_path / "a"), Run(tmp_path / "b"), [])
    assert "dtype: A float32, B bfloat16." in notes and not any(n.startswith("device") for n in notes)


def test_settings_name_the_architecture_facts_that_differ(tmp_path):
    """Review 20c B2 (redone): a Llama run against a Cohere 2 run listed only the model's name; the facts of the two
    manifests' "model" that differ are each a settings line, those they share none, and a run that does not record
    them (an older manifest) adds nothing."""
    facts = {"llama": {"family": "LlamaForCausalLM", "n_layers": 2, "n_heads": 4, "nope_layers": [],
                       "norm_placement": None, "parallel_blocks": False, "attention_bias_on": []},
             "cohere2": {"family": "Cohere2ForCausalLM", "n_layers": 2, "n_heads": 4, "nope_layers": [1],
                         "norm_placement": None, "parallel_blocks": True, "attention_bias_on": []}}
    for side, name in (("a", "llama"), ("b", "cohere2")):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        manifest = io.read_json(tmp_path / side / "manifest.json")
        io.write_json(tmp_path / side / "manifest.json", {**manifest, "model": {"name": name, **facts[name]}})
    notes = settings_notes(Run(tmp_path / "a"), Run(tmp_path / "b"), [])
    assert "architecture: A LlamaForCausalLM, B Cohere2ForCausalLM." in notes
    assert "layers without rotary (NoPE): A none, B 1." in notes
    assert "parallel attention and MLP: A False, B True." in notes
    assert not any(n.startswith(("layers:", "heads per layer", "norm placement", "attention biases")) for n in notes)
    manifest = io.read_json(tmp_path / "a" / "manifest.json")
    io.write_json(tmp_path / "a" / "manifest.json", {**manifest, "model": {"name": "llama"}})  # an older run
    assert not any(n.startswith("architecture") for n in settings_notes(Run(tmp_path / "a"), Run(tmp_path / "b"), []))


def test_compare_says_when_a_differing_top_patching_site_is_tied_within_a_run(tmp_path):
    """#34 review 7 (C3): A's top head_out site L0H0 (0.146 of the gap) and its next, L0H1 (0.144), are each inside
    the other's 95% interval, and so are B's L0H2 and L0H0: "top site differs" is then a tie, said with the intervals
    (the effects and intervals divided by the 20.4 gap); clear tops are said to be tied in neither run."""
    gap = 20.4

    def head(h, share, lo, hi):
        return {"layer": 0, "head": h, "pos": None, "token": "all", "effect": share * gap, "ci": [lo * gap, hi * gap],
                "n": 8}

    def write(a, b):
        for side, heads in (("a", a), ("b", b)):
            io.write_json(tmp_path / side / "patching" / "summary.json", {
                "metric": "logit_diff", "normalized": False, "clean_metric": 10.2, "corrupted_metric": -10.2,
                "n_examples": 8, "top_sites": {"head_out": heads}})
        return patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[1]

    for side in ("a", "b"):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
    a = [head(0, 0.146, 0.065, 0.227), head(1, 0.144, 0.036, 0.252), head(2, 0.056, 0.010, 0.103)]
    b = [head(2, 0.170, -0.006, 0.345), head(0, 0.149, 0.090, 0.209), head(1, 0.130, 0.062, 0.199)]
    assert write(a, b) == [
        "Top head_out site differs: A head_out L0 H0, B head_out L0 H2 (tied in A: head_out L0 H0 (0.15 of the gap, 95% "
        "CI [0.07, 0.23]) and head_out L0 H1 (0.14 of the gap, 95% CI [0.04, 0.25]) are each inside the other's 95% "
        "interval; tied in B: head_out L0 H2 (0.17 of the gap, 95% CI [-0.01, 0.34]) and head_out L0 H0 (0.15 of the gap, "
        "95% CI [0.09, 0.21]) are each inside the other's 95% interval)."]
    clear_b = [head(2, 0.30, 0.25, 0.35), head(0, 0.10, 0.05, 0.15)]  # 0.10 outside [0.25, 0.35]: not tied
    note = write(a, clear_b)[0]
    assert "tied in A: head_out L0 H0 (0.15" in note and "tied in B" not in note
    clear_a = [head(0, 0.30, 0.25, 0.35), head(1, 0.10, 0.05, 0.15), head(2, 0.09, 0.04, 0.14)]
    assert write(clear_a, clear_b) == [
        "Top head_out site differs: A head_out L0 H0, B head_out L0 H2 (tied in neither run: in each, its top site and "
        "its next are not each inside the other's 95% interval)."]


def test_compare_does_not_set_a_copy_task_not_done_at_n_8_against_n_24(tmp_path):
    """Review 10b A2: one model, accuracy 0 on json_kv (it copies none of the context's values), 8 and 24 examples:
    compare called A "at chance" and B "below chance" as if the runs differed. Both entries are built by hand as the
    position analysis records them (chance.assess, then copy_task); the refusal now names one reason for both."""
    from headscope.analyses.core import chance
    from headscope.reports.compare_run import chance_refusal

    for side, n in (("a", 8), ("b", 24)):
        entry = chance.assess([0.0] * n, "accuracy", n_classes=4)
        entry = chance.copy_task({**entry, "task": "json_kv", "classes_from": "context"}, outputs=4 * n, gold=0, copied=0)
        io.write_json(tmp_path / side / "manifest.json", {"model": {"name": "m"}, "config": {"analyses": ["position"]}})
        io.write_json(tmp_path / side / "position" / "summary.json", {"n_examples": n, "chance": entry})
    said = chance_refusal(Run(tmp_path / "a"), Run(tmp_path / "b"), "position")
    assert said == "not compared: A and B do not do their tasks (accuracy 0 on a copy task)", said


def _precision_pair(root, curves: dict[str, list[float]], counts: dict[str, int], intervals: dict[str, list[int]]):
    """Review 11b A7's runs: one model on one task and seed at float32 (A) and bfloat16 (B), an ablation curve each
    (heads removed 0, 2, 4), the count of heads prunable and its interval; B's metric rounding step 0.0794."""
    runs = []
    for side, dtype in (("a", "float32"), ("b", "bfloat16")):
        _folder(root / side, "m", 1.0, 0, 0.0)
        _task(root / side)
        manifest = io.read_json(root / side / "manifest.json")
        manifest["config"]["dtype"] = dtype
        manifest["versions"] = {"torch": "2.13.0"}
        io.write_json(root / side / "manifest.json", manifest)
        io.write_csv(root / side / "heads" / "curve.csv", pd.DataFrame({
            "ordering": "ablation", "recompute": False, "seed": 0, "n_pruned": [0, 2, 4],
            "fraction_pruned": [0.0, 0.125, 0.25], "metric": curves[side], "pruned": ["", "L2H2 L2H0", "L1H0 L1H1"]}))
        _heads_summary(root / side, metric="logprob", n_heads=16, n_examples=16, baseline_metric=curves[side][0],
                       max_fraction_prunable_ablation=counts[side] / 16, heads_prunable_ablation=float(counts[side]),
                       prunable_ci_ablation={"heads": float(counts[side]), "interval_heads": intervals[side],
                                             "n_examples": 16},
                       noise_floor=1.2e-6 if side == "a" else 0.0794)
        runs.append(Run(root / side))
    return runs


def test_one_model_at_two_precisions_splits_a_count_by_rounding_not_by_a_verdict(tmp_path):
    """Review 11b A7: the 2-head step changes the metric by -0.00051 in float32 (-0.006968 -> -0.007478) and rounds
    to +0 in bfloat16; against the old 1% line (0.00007 nats) A keeps 0 heads, B 2. The change between the runs,
    0.00051, is under bfloat16's rounding step of the metric (0.0794): a rounding difference, said so, not "beyond
    noise" nor "the verdicts differ"; and A's 0-0 heads is none, not "does not [reach none]"."""
    from headscope.reports.compare import pruning_notes

    a, b = _precision_pair(tmp_path, {"a": [-0.006968, -0.007478, -0.0477], "b": [-0.005836, -0.005836, -0.05]},
                           {"a": 0, "b": 2}, {"a": [0, 0], "b": [0, 2]})
    [note] = pruning_notes(a, b)
    assert note == ("(same) Prunable within 1% by ablation (the ordering both heads findings lead with): A 0% (0 of 16 heads), "
                    "B 12% (2 of 16 heads): the runs differ only in precision (A float32, B bfloat16): at 2 heads "
                    "removed, the point that decides the counts, the change from unpruned is -0.00051 in A and +0 in B, "
                    "0.00051 apart, within bfloat16's rounding step of the metric (0.079): a rounding difference, not a "
                    "difference in the model.")
    # another seed as well: no longer one model at two precisions, the noise verdict as before and no rounding words
    manifest = io.read_json(tmp_path / "b" / "manifest.json")
    io.write_json(tmp_path / "b" / "manifest.json", {**manifest, "seed": 1})
    other = pruning_notes(a, Run(tmp_path / "b"))[0]
    assert "beyond noise" in other and "precision" not in other and "does not" not in other


def test_two_precisions_that_removed_other_heads_at_the_deciding_point_name_the_tie_not_the_computation(tmp_path):
    """Review 16b A1: at the point that decides the counts the two orders had removed different heads (bfloat16 broke
    a rounding tie the other way), and compare said the 0.22 gap meant "the precision changes the model's
    computation". Constructed: at 2 heads A (float32) has removed L2H2, L2H0 and B (bfloat16) L2H2, L1H0, which B's
    summary records as tied; at 4 and 6 both have removed the same heads. By hand: at 2 the changes are
    -0.0075 + 0.007 = -0.0005 and -0.25 + 0.006 = -0.244 (0.2435 apart); at 4, -0.0408 and -0.043 (0.0022 apart,
    under B's step 0.0794): the gap is the tie, and the same heads move within rounding."""
    from headscope.reports.compare import pruning_notes
    from headscope.reports.compare_prunable import precision_words

    a, b = _precision_pair(tmp_path, {"a": [-0.007, -0.0075, -0.0478], "b": [-0.006, -0.25, -0.049]},
                           {"a": 2, "b": 0}, {"a": [2, 2], "b": [0, 2]})
    for side, pruned in (("a", ["", "L2H2 L2H0", "L1H0 L1H1"]), ("b", ["", "L2H2 L1H0", "L2H0 L1H1"])):
        curve = pd.read_csv(tmp_path / side / "heads" / "curve.csv")
        io.write_csv(tmp_path / side / "heads" / "curve.csv", curve.assign(pruned=pruned))
    _heads_summary(tmp_path / "b", tied_first_pruned_zero=[["L2H0", "L1H0"]])
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    start = ("the runs differ only in precision (A float32, B bfloat16): at 2 heads removed, the point that decides the "
             "counts, the change from unpruned is -0.0005 in A and -0.244 in B, 0.24 apart, but over different heads: "
             "by then A has removed L2H0 where B has removed L1H0")
    same = ("; with the same heads removed (at 4 heads) the changes are 0.0022 apart, within bfloat16's rounding step "
            "of the metric (0.079)")
    said, within = precision_words(a, b, "ablation", [2.0, 0.0])
    assert (said, within) == (start + ", which B's heads finding records as tied within rounding: the gap is that tie "
                              "broken differently, not the precision changing the model's computation" + same, None)
    [note] = pruning_notes(a, b)
    assert "changes the model's computation here" not in note and said[1:] in note
    assert note.startswith("(same) Prunable within")  # review 19e C2: a rounding tie broken differently, no difference
    # no recorded tie: the heads that differ are named, not called a tie, and the same heads judge the precision
    _heads_summary(tmp_path / "b", tied_first_pruned_zero=[])
    assert precision_words(Run(tmp_path / "a"), Run(tmp_path / "b"), "ablation", [2.0, 0.0]) == (
        start + ", which neither heads finding records as tied within rounding" + same, None)


def test_a_zero_count_is_none_so_equal_verdicts_are_not_said_to_differ(tmp_path):
    """Review 11b A7: "B's interval (0-2 heads) reaches none ..., while A's (0-0 heads) does not" contradicted itself:
    a count of 0 with interval 0-0 is none, so neither finding sees a dispensable head and no verdicts differ."""
    from headscope.reports.compare_prunable import verdict_words

    a, b = _precision_pair(tmp_path, {"a": [-0.007, -0.0075, -0.05], "b": [-0.006, -0.006, -0.05]},
                           {"a": 0, "b": 2}, {"a": [0, 0], "b": [0, 2]})
    assert verdict_words(a, b, "ablation", (0.0, 0.125), (False, False)) == ""
    _heads_summary(tmp_path / "a", prunable_ci_ablation={"heads": 2.0, "interval_heads": [1, 2], "n_examples": 16})
    assert verdict_words(a, b, "ablation", (0.125, 0.125), (False, False)).startswith(
        "the verdicts differ: B's 95% bootstrap interval (0-2 heads) reaches none, so its finding sees no evidence that "
        "any head is dispensable, while A's (1-2 heads) does not")


def test_the_higher_precision_run_orders_the_lower_ones_rounding_ties_and_the_title_names_the_dtype(tmp_path):
    """Review 11b A7 / C6: bfloat16's 2nd-5th zero-ablation places tie with its 6th, L0H2; float32's importances
    (0.0338, 0.029, 0.00935, 0.00534, 0.00233) order them as B lists, so the page says A orders them and that the
    tie is bfloat16's rounding; the title line tells the two sides apart by their dtype."""
    from headscope.reports.compare import compare_html
    from headscope.reports.compare_top import top_heads_notes

    a, b = _precision_pair(tmp_path, {"a": [-0.007, -0.0075, -0.05], "b": [-0.006, -0.006, -0.05]},
                           {"a": 0, "b": 0}, {"a": [0, 0], "b": [0, 0]})
    top = ["L0H3", "L0H0", "L3H1", "L3H0", "L0H1"]
    values = {"L0H3": 2.21, "L0H0": 0.0338, "L3H1": 0.029, "L3H0": 0.00935, "L0H1": 0.00534, "L0H2": 0.00233}
    for side in ("a", "b"):
        _heads_summary(tmp_path / side, top_heads_zero=top, top_heads_gradient=[])
        io.write_csv(tmp_path / side / "heads" / "results.csv", pd.DataFrame([
            {"layer": int(n[1]), "head": int(n[3]), "head_name": n, "method": "zero", "importance": v,
             "importance_se": 0.01} for n, v in values.items()]))
    _heads_summary(tmp_path / "b", tied_top_heads_zero=top[1:], tied_top_next_zero="L0H2")
    [note] = [n for n in top_heads_notes(a, b) if "zero-ablation" in n]
    assert note.endswith(
        "B's 2nd, 3rd, 4th and 5th, L0H0, L3H1, L3H0 and L0H1, tie with its 6th, L0H2, within rounding, so B's 2nd, "
        "3rd, 4th and 5th places are not decided; A, at float32, orders B's tied 2nd, 3rd, 4th and 5th and L0H2: "
        "L0H0 (0.0338), L3H1 (0.029), L3H0 (0.00935), L0H1 (0.00534), L0H2 (0.00233), the order B lists; the tie is "
        "bfloat16's rounding, not the model's.")
    page = compare_html(a, b)
    task = html.escape(XSS)
    assert f"<p>A: m ({task}, seed 0, float32) &nbsp; B: m ({task}, seed 0, bfloat16)</p>" in page


def test_a_run_on_the_one_token_rows_of_a_file_is_another_task_than_the_whole_file():
    """compare's task identity: a section run on the user's one-token rows (contract.one_token_plan) names the file
    and that subset, so it is not compared as if it ran on the whole file, nor on a default task."""
    from headscope.reports.compare_run import task_identity, task_words

    whole = {"task": "capitals", "source": "your task (capitals.jsonl)"}
    subset = {"task": "capitals", "source": "your task (capitals.jsonl): only the rows whose answer is one token under "
                                            "this tokenizer, 20 of its 40 (the other 20 have answers of 2-3 tokens; ...)"}
    assert task_identity(whole) == ("capitals", "capitals.jsonl")
    assert task_identity(subset) == ("capitals", "capitals.jsonl (its one-token rows)")
    assert task_words(subset) == "capitals.jsonl (its one-token rows)"


def _dtype_run(root, dtype: str, hold: dict, counts: dict) -> None:
    """A run with kv and mlp summaries only (review 12b's float32 and bfloat16 numbers), each on task gifts."""
    io.write_json(root / "manifest.json", {"model": {"name": "m"}, "seed": 0, "status": {"kv": "done", "mlp": "done"},
                                           "config": {"analyses": ["kv", "mlp"], "task": None, "dtype": dtype}})
    kv = {"metric": "logit_diff", "metric_unevicted": 7.6, "n_examples": 16, "task": "gifts", "dtype": dtype,
          "holding_budgets": hold}
    mlp = {"agreement_per_layer": {k: v / 128 for k, v in counts.items()}, "agreement_count_per_layer": counts,
           "agreement_shuffled_count_per_layer": {"0": 0, "1": 1, "2": 1},
           "agreement_shuffled_per_layer": {"0": 0.0, "1": 1 / 128, "2": 1 / 128}, "n_neurons_per_layer": 128,
           "n_prefixes": 160, "task": "gifts"}
    for name, s in (("kv", kv), ("mlp", mlp)):
        io.write_json(root / name / "summary.json", s)


def test_compare_lists_every_headline_of_either_report(tmp_path):
    """Review 12b A8: float32 against bfloat16, the kv holding budget moved (8 -> 32 positions) and the mlp
    between-layer verdict flipped, and compare listed neither. Every headline a report states now lands in
    Differences, agreement or Not compared: here, each label the two reports' findings state is in some note."""
    from scipy.stats import fisher_exact

    from headscope.reports.compare_headlines import QUANTITIES
    from headscope.reports.compare_verdicts import VERDICTS
    from headscope.reports.findings import finding
    from headscope.reports.plots_mlp import ALPHA

    def hold(budget, share, verdicts):
        row = {"budget": budget, "share": share, "change": 0.0, "ci_low": -0.005, "ci_high": 0.005, "n_evicting": 14,
               "n_examples": 16, "verdict": "holds"}
        return {"tolerance": 0.01, "grid": [4, 8, 16, 32], "n_examples": 16, "policies": {"heavy_hitters": {
            "budget": budget, "below": 16 if budget == 32 else 4, "at": row, "verdicts": verdicts}}}

    a_counts, b_counts = {"0": 1, "1": 3, "2": 1}, {"0": 0, "1": 6, "2": 1}  # B: 6 of 128 against 1 of 256
    p_a, p_b = fisher_exact([[3, 125], [2, 254]])[1], fisher_exact([[6, 122], [1, 255]])[1]
    assert 3 * p_a > ALPHA > 3 * p_b  # the premise: A's layers cannot be told apart, B's differ after Bonferroni
    _dtype_run(tmp_path / "a", "float32", hold(8, 0.3, {"4": "below", "8": "holds", "16": "holds", "32": "holds"}),
               a_counts)
    _dtype_run(tmp_path / "b", "bfloat16", hold(32, 0.8, {"4": "below", "8": "holds", "16": "not shown", "32": "holds"}),
               b_counts)
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    notes = headline_notes(a, b)
    assert ("kv heavy hitters within 1% of the full cache: A from 8 positions (a median 30% of the cache), B from 32 "
            "positions (a median 80% of the cache) (budget verdicts that differ: 16: holds in A, not shown in B).") in notes
    assert (f"mlp between-layer agreement: A layer 1 against the others pooled: the layers cannot be told apart "
            f"(p = {p_a:.2g}, p_Bonferroni = {min(1, 3 * p_a):.2g} over 3 layers), B layer 1 against the others pooled: "
            f"the layers differ, marginally (p = {p_b:.2g}, p_Bonferroni = {3 * p_b:.2g} over 3 layers).") in notes, notes
    assert "so the layers differ, marginally" in finding("mlp", b.summary("mlp"))  # B's own report (16a B1: 0.019)
    for name in ("kv", "mlp"):  # no headline of either report is silently missing
        labels = {q[0] for s in (a.summary(name), b.summary(name)) for q in QUANTITIES[name](s)
                  if isinstance(q[1], (int, float))} | {v[0] for s in (a.summary(name), b.summary(name))
                                                       for v in VERDICTS[name](s)}
        assert labels and all(any(label in note for note in notes) for label in labels), (labels, notes)
    # review 14b-v C2: attribution's saliency and rollout taus, patching's clean and corrupted metrics, kv's bytes per
    # token and its attention on the first token were in no list. Hand-made numbers, intervals by scipy's t.
    from scipy import stats

    from headscope.reports.compare_headlines import SINK_LABEL, SINK_VERDICT
    from headscope.reports.compare_notes import SIZE_LABEL

    def sink(layer, mass, half, is_sink):
        return {"layer": layer, "mass": mass, "ci": [mass - half, mass + half], "n": 16, "uniform": 0.11,
                "ratio": mass / 0.11, "sink": is_sink}

    for side, size, roll, clean, sinks in (
            ("a", 1536, 0.56, -1.0, [sink(0, 0.13, 0.01, False), sink(1, 0.10, 0.01, False)]),
            ("b", 768, 0.57, -1.2, [sink(0, 0.30, 0.02, True), sink(1, 0.10, 0.01, False)])):
        kv = Run(tmp_path / side).summary("kv")
        io.write_json(tmp_path / side / "kv" / "summary.json", {**kv, "bytes_per_token": size, "sinks": sinks})
        taus = {f"{k}_tau_{kind}_{m}": v for kind in ("attention", "rollout") for m in ("saliency", "gradient", "loo")
                for k, v in (("mean", roll if kind == "rollout" else 0.19 if m == "saliency" else 0.25), ("std", 0.173),
                             ("n", 4))}  # raw taus of 0.25 against the references: rollout's stated with intervals
        io.write_json(tmp_path / side / "attribution" / "summary.json", {"n_examples": 4, "task": "gifts", **taus})
        io.write_json(tmp_path / side / "patching" / "summary.json", {
            "metric": "logprob", "task": "gifts", "n_examples": 8, "metric_n": 8, "clean_metric": clean,
            "clean_metric_ci": [clean - 0.45, clean + 0.45], "corrupted_metric": -3.0, "corrupted_metric_ci": [-3.4, -2.6]})
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    notes = headline_notes(a, b)
    for name in ("attribution", "patching", "kv"):
        labels = {q[0] for s in (a.summary(name), b.summary(name)) for q in QUANTITIES[name](s)
                  if isinstance(q[1], (int, float))}
        assert len(labels) == {"attribution": 6, "patching": 2, "kv": 1}[name], labels
        assert all(any(note.removeprefix(SAME).removeprefix(NOT_COMPARED).startswith(label + ":") for note in notes)
                   for label in labels), (labels, notes)
    half = stats.t.ppf(0.975, 3) * 0.173 / 2  # saliency's tau, the attribution finding's first number
    [tau] = [n for n in notes if "of attention and saliency:" in n]
    assert tau == (SAME + "attribution mean Kendall tau of attention and saliency: A 0.19, B 0.19 (n 4 each) (within "
                   f"noise: |B - A| = 0 is inside the combined half-widths {2 * half:.3g}; 95% CIs A [{0.19 - half:.3g}, "
                   f"{0.19 + half:.3g}], B [{0.19 - half:.3g}, {0.19 + half:.3g}])."), tau
    assert any(n.startswith(SAME + "attribution mean Kendall tau of attention rollout and saliency: A 0.56, B 0.57 (n 4 "
                            f"each) (within noise: |B - A| = 0.01 is inside the combined half-widths {2 * half:.3g}")
               for n in notes), notes
    assert (SAME + "patching clean prompts' answer log-probability: A -1, B -1.2 (n 8 each) (within noise: |B - A| = 0.2 "
            "is inside the combined half-widths 0.9; 95% CIs A [-1.45, -0.55], B [-1.65, -0.75]).") in notes
    assert (f"{SIZE_LABEL}: A 1.5 KiB per token (float32), B 768 B per token (bfloat16): an exact count (no sampling "
            "noise): the dtypes differ (float32, 4 bytes a number, against bfloat16, 2): a setting, not the model.") in notes
    assert (f"{SINK_LABEL}: beyond noise (|B - A| past the two 95% CIs' combined half-widths) in layer 0 A 0.13 [0.12, "
            "0.14], B 0.30 [0.28, 0.32]; within noise: layer 1 A 0.10 [0.09, 0.11], B 0.10 [0.09, 0.11] (n 16 prompts "
            "each).") in notes  # |0.30 - 0.13| = 0.17 > 0.01 + 0.02, by hand
    assert any(n.startswith(f"{SINK_VERDICT} (") and n.endswith("A none (layer 0 1.2x, layer 1 0.9x), B layer 0 (layer 0 "
                                                                 "2.7x, layer 1 0.9x).") for n in notes), notes
    # a headline only one report states is said, not dropped
    io.write_json(tmp_path / "b" / "kv" / "summary.json", {**b.summary("kv"), "metric_unevicted": None,
                                                          "holding_budgets": {"tolerance": 0.01, "policies": {}}})
    notes = headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b"))
    assert "(not compared) kv full-cache logit difference: not compared: only A's report states it (n 16 each)." in notes
    assert ("(not compared) kv heavy hitters within 1% of the full cache: not compared: only A's report states "
            "it.") in notes


def test_compare_lists_the_policy_each_kv_finding_ends_on_with_its_tie_and_noise():
    """Review 13c A3: no policy within 1% in either run; A's finding ends on window, tied with heavy hitters at 66.9%
    (changes -0.3306 and -0.3314 at budget 16, n 128), B's on heavy hitters, 92.1% (n 16). compare said neither; now the
    choice is listed, the same up to A's tie. Against a B whose heavy hitters clears its window (intervals apart) and an
    A without the tie: a difference, judged within each run's own intervals (hand-picked numbers)."""
    from headscope.reports.compare_verdicts import _verdict_notes
    from headscope.reports.findings import finding

    def row(budget, change, lo, hi, n):
        return {"budget": budget, "change": change, "ci_low": lo, "ci_high": hi, "n_evicting": n, "n_examples": n}

    def summary(rows, n):
        return {"metric": "logit_diff", "metric_unevicted": 24.3, "n_examples": n, "holding_budgets": {
            "tolerance": 0.01, "grid": [8, 16, 32], "policies": {
                p: {"budget": None, "closest": r, "worst_evicting": r, "misses": [abs(r["change"])] * 2,
                    "missed": [16], "every_evicting_missed": True} for p, r in rows.items()}}}

    a = summary({"window": row(16, -0.33059, -0.4267, -0.2345, 128), "heavy_hitters": row(16, -0.33139, -0.4179, -0.2449, 128),
                 "sink_window": row(16, -0.4525, -0.5599, -0.3450, 128)}, 128)
    b = summary({"window": row(16, -0.2801, -0.585, 0.0248, 16), "heavy_hitters": row(16, -0.0790, -0.176, 0.018, 16),
                 "sink_window": row(16, -0.4292, -0.7437, -0.1146, 16)}, 16)
    assert ("window comes closest: at budget 16 it keeps 66.9% of the logit difference" in finding("kv", a)
            and "Heavy hitters keeps the same 66.9% at budget 16: tied with window at this precision." in finding("kv", a))
    n = "n differs: 128 vs 16 examples, a setting, not the model: other example sets, intervals of other widths"
    label = "kv policy closest to the full cache (no policy within the band in either run)"
    notes = _verdict_notes("kv", a, b)
    assert notes[-1] == (
        f"(same) {label}: the same choice up to a tie at the finding's precision: A window at budget 16: keeps 66.9% of "
        "the full-cache logit difference (95% CI of the change [-42.7%, -23.4%], n = 128; tied with heavy hitters), B "
        "heavy hitters at budget 16: keeps 92.1% of the full-cache logit difference (95% CI of the change [-17.6%, +1.8%], "
        f"n = 16) ({n})."), notes
    untied = summary({**{p: r["closest"] for p, r in a["holding_budgets"]["policies"].items()},
                      "heavy_hitters": row(16, -0.40, -0.45, -0.35, 128)}, 128)
    assert _verdict_notes("kv", untied, b)[-1] == (  # review 20: within noise, with the agreements (it was a difference)
        f"(same) {label}: A window at budget 16: keeps 66.9% of the full-cache logit difference (95% CI of the change [-42.7%, "
        "-23.4%], n = 128), B heavy hitters at budget 16: keeps 92.1% of the full-cache logit difference (95% CI of the "
        f"change [-17.6%, +1.8%], n = 16) ({n}); in A, heavy hitters at budget 16: keeps 60.0% of the full-cache logit "
        "difference; in B, window at budget 16: keeps 72.0% of the full-cache logit difference: within noise: in each "
        "run the other run's choice's 95% interval overlaps its own choice's.")
    clear = summary({"window": row(16, -0.30, -0.35, -0.25, 16), "heavy_hitters": row(16, -0.05, -0.08, -0.02, 16)}, 16)
    assert _verdict_notes("kv", untied, clear)[-1].endswith(
        "beyond noise: B's choice clears the other run's choice in its own run."), _verdict_notes("kv", untied, clear)
    assert _verdict_notes("kv", untied, clear)[-1].startswith(label)  # a difference: no prefix
    bare = summary({"window": row(16, -0.30, None, None, 1), "heavy_hitters": row(16, -0.05, None, None, 1)}, 1)
    assert _verdict_notes("kv", untied, bare)[-1].startswith(f"(not compared) {label}: ")  # no interval: not compared


def test_compare_links_both_reports_relative_to_the_page_escaped(tmp_path):
    from headscope.reports.compare import compare_reports

    _folder(tmp_path / "a b", "m", 1.0, 0, 0.5)
    _folder(tmp_path / "b'x", "m", -1.0, 1, 0.5, quick=True)
    (tmp_path / "a b" / "report.html").write_text("<html></html>", encoding="utf-8")  # B has none
    page = compare_reports(tmp_path / "a b", tmp_path / "b'x", tmp_path / "pages" / "cmp.html").read_text(encoding="utf-8")
    assert "<a href='../a%20b/report.html'>A's report (" in page  # review 13c C: relative, percent-encoded
    where = html.escape(str(tmp_path / "b'x"), quote=True)
    assert f"B has no report.html in {where}" in page
    assert "b'x" not in page  # every path escaped


@pytest.mark.skipif(__import__("browser").chromium_path() is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_compare_page_fits_a_1200_px_window_in_chromium(tmp_path):
    """Review 13a B: a run's unbroken --task-fields value in the provenance made the page 1,521 px wide."""
    from browser import open_page
    from headscope.reports.compare import compare_reports

    for side, sign in (("a", 1.0), ("b", -1.0)):
        _folder(tmp_path / side, "m", sign, 0, 0.5)
        manifest = io.read_json(tmp_path / side / "manifest.json")
        manifest["command"] = ["headscope", "report", "--task-fields", ",".join(f"field{i}=column_{i}" for i in range(12))]
        io.write_json(tmp_path / side / "manifest.json", manifest)
        (tmp_path / side / "report.html").write_text("<html></html>", encoding="utf-8")
    target = compare_reports(tmp_path / "a", tmp_path / "b", tmp_path / "cmp.html")
    with open_page(target) as page:
        width, window = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        links = page.evaluate("[...document.querySelectorAll('p.reports a')].map(a => a.href)")
    assert window == 1200 and width <= window
    assert links == [(tmp_path / side / "report.html").as_uri() for side in "ab"]


def test_compare_does_not_rank_patching_cells_under_the_coarser_runs_rounding_floor(tmp_path):
    """Review 13a A4 (f32 vs bf16, one model and prompts): third attn_out cells of +0.022 and -0.029 answer
    log-probability, under bf16's rounding floor 0.077, were ranked as "different sites"."""
    def cell(pos, effect, ci):
        return {"layer": 0, "head": None, "pos": pos, "from_end": pos - 35, "token": "", "effect": effect, "ci": ci, "n": 8}

    for side, floor, third in (("a", 1.17e-6, cell(31, 0.0218, [-0.0247, 0.0683])),
                               ("b", 0.0766, cell(30, -0.0293, [-0.0584, -0.0001]))):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        io.write_json(tmp_path / side / "patching" / "summary.json", {
            "metric": "logprob", "clean_metric": -0.001, "corrupted_metric": -9.81, "n_examples": 8,
            "rounding_floor": {"basis": "one rounding step", "floor": floor, "n_cells": 252},
            "top_sites": {"attn_out": [cell(34, 9.8065, [9.45, 10.16]), cell(34, 0.1365, [-0.1, 0.37]), third]}})
    table, notes = patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))
    rows = table.split("</tr>")
    assert "different sites" not in table
    assert ("within noise: both cells are under the rounding floor of the coarser run (B), 0.077 answer log-probability: "
            "no site in either run, not ranked") in rows[3]
    assert rows[3].count("rounding, not ranked") == 2 and "rounding" not in rows[1] + rows[2]  # 0.137 > 0.077: a cell
    assert notes == []  # the first sites agree


def _mlp_run(root, counts: dict, prefixes: int, examples: int, n: int = 256) -> Run:
    """An output folder with an mlp summary only: agreeing neurons per layer (k of n each), its prefix count."""
    io.write_json(root / "manifest.json", {"model": {"name": "m"}, "config": {"analyses": ["mlp"]}})
    io.write_json(root / "mlp" / "summary.json", {
        "agreement_per_layer": {k: v / n for k, v in counts.items()}, "agreement_count_per_layer": counts,
        "n_memories_per_layer": {k: n for k in counts}, "n_neurons_per_layer": n, "n_prefixes": prefixes,
        "n_task_examples": examples})
    return Run(root)


def test_compare_mlp_agreement_at_different_layers_or_prefix_counts_is_not_compared(tmp_path):
    """Review 13c A2 (one checkpoint, default vs --quick): "highest layer" set A's layer 2 (41 of 256) against B's
    layer 1 (19 of 256) and called it beyond noise with "n 256 neurons each", while B saw 1,248 prefixes to A's 9,984.
    Agreement of another layer's neurons, or counted over other prefixes, is not the same quantity: the line is under
    Not compared with its reason (each alone and both), never under Differences."""
    from headscope.reports.render import escape

    a = _mlp_run(tmp_path / "a", {"0": 20, "1": 33, "2": 41, "3": 32}, 9984, 128)
    layers = ("the highest layers differ (A's is layer 2, B's layer 1), so each finding's agreement is of other neurons")
    prefixes = ("the runs looked at 9,984 vs 1,248 prefixes of 128 vs 16 task examples, a setting, not the model: the "
                "agreement counts neurons whose triggers lie among the prefixes, so fewer prefixes find fewer")
    cases = {"both": ({"0": 4, "1": 19, "2": 17, "3": 18}, 1248, 16, "", f"{layers}; {prefixes}", 19),
             "layer": ({"0": 4, "1": 50, "2": 17, "3": 18}, 9984, 128, "", layers, 50),
             "prefixes": ({"0": 4, "1": 10, "2": 19, "3": 18}, 1248, 16, " (layer 2 in both)", prefixes, 19)}
    for name, (counts, n_prefixes, examples, where, why, k) in cases.items():
        b = _mlp_run(tmp_path / name, counts, n_prefixes, examples)
        notes = headline_notes(a, b)
        expected = (f"mlp highest layer key-value agreement{where}: not compared, not the same quantity: {why} "
                    f"(A {41 / 256:.3g}, B {k / 256:.3g}; n 256 neurons each).")
        assert NOT_COMPARED + expected in notes, notes
        page = compare_html(a, b)
        differences = page[page.index("id='differences'"):page.index("id='not-compared'")]
        not_compared = page[page.index("id='not-compared'"):page.index("id='findings'")]
        assert f"<li>{escape(expected)}</li>" in not_compared
        assert "key-value agreement" not in differences
    # an mlp summary without agreement on one side: the line says which report states it (it was dropped)
    io.write_json(tmp_path / "none" / "manifest.json", {"model": {"name": "m"}, "config": {"analyses": ["mlp"]}})
    io.write_json(tmp_path / "none" / "mlp" / "summary.json", {"n_prefixes": 9984})
    assert any(n.startswith(NOT_COMPARED + "mlp highest layer key-value agreement: not compared: only A's report states "
                            "it") for n in headline_notes(a, Run(tmp_path / "none")))


def test_compare_mlp_agreement_at_the_best_layer_on_both_sides(tmp_path):
    """The layer compared is the one each finding leads with (plots_mlp.best_layer, one rule): here layer 1 in both,
    neither the first nor the last (B's first and last layers come within one neuron of it), at the same prefixes."""
    from scipy import stats

    from headscope.reports.findings import finding

    a = _mlp_run(tmp_path / "a", {"0": 10, "1": 40, "2": 20, "3": 30}, 9984, 128)
    b = _mlp_run(tmp_path / "b", {"0": 34, "1": 35, "2": 5, "3": 34}, 9984, 128)
    assert all(" in layer 1" in finding("mlp", r.summary("mlp")) for r in (a, b))  # what each report leads with
    wa = stats.binomtest(40, 256).proportion_ci(method="wilson")
    wb = stats.binomtest(35, 256).proportion_ci(method="wilson")
    note = next(n for n in headline_notes(a, b) if "key-value agreement" in n)
    assert note == (SAME + f"mlp highest layer key-value agreement (layer 1 in both): A {40 / 256:.3g}, B {35 / 256:.3g} (n 256 "
                    f"neurons each) (within noise: |B - A| = {5 / 256:.3g} is inside the combined half-widths "
                    f"{(wa.high - wa.low) / 2 + (wb.high - wb.low) / 2:.3g}; 95% CIs A [{wa.low:.3g}, {wa.high:.3g}], "
                    f"B [{wb.low:.3g}, {wb.high:.3g}]).")


def test_compare_lists_the_mlp_control_and_probes_selectivity_verdicts_that_differ(tmp_path):
    """Reviews 13b A3 and A1: the mlp layers above their own control ("layer 3" in float32, "none" in bfloat16) and the
    probes selectivity verdict (-0.33 against "cannot be measured" across seeds) flipped and compare listed neither."""
    from scipy import stats

    counts = {"a": {"0": 6, "1": 18, "2": 8, "3": 16}, "b": {"0": 6, "1": 18, "2": 8, "3": 7}}
    shuffled = {"0": 4, "1": 10, "2": 5, "3": 2}
    probes = {"a": {"best_selectivity": -0.333, "control_degenerate": None},
              "b": {"best_selectivity": None, "control_degenerate": "the control task's random labels for the 2 word "
                                                                    "types at the read positions all came out as one class"}}
    for side in "ab":
        io.write_json(tmp_path / side / "manifest.json", {"model": {"name": "m"}, "config": {"analyses": ["mlp", "probes"]}})
        io.write_json(tmp_path / side / "mlp" / "summary.json", {
            "agreement_per_layer": {k: v / 128 for k, v in counts[side].items()}, "agreement_count_per_layer": counts[side],
            "agreement_shuffled_count_per_layer": shuffled, "n_memories_per_layer": {k: 128 for k in shuffled},
            "n_neurons_per_layer": 128, "n_prefixes": 400})
        io.write_json(tmp_path / side / "probes" / "summary.json", {"metric": "accuracy", "best_accuracy": 0.7,
                                                                   "n_examples": 40, **probes[side]})
    # Fisher's exact test per layer against its control, by scipy, Bonferroni over the 4 layers: only A's layer 3 is above
    above = {side: [l for l in shuffled if counts[side][l] > shuffled[l] and 4 * stats.fisher_exact(
        [[counts[side][l], 128 - counts[side][l]], [shuffled[l], 128 - shuffled[l]]])[1] < 0.05] for side in "ab"}
    assert above == {"a": ["3"], "b": []}
    notes = headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b"))
    assert "mlp layers above their own shuffled control at p_Bonferroni < 0.05: A layer 3, B none." in notes
    assert ("probes selectivity: A -0.33 (below 0: no evidence that the property is read rather than memorised), B cannot "
            "be measured (the control task's random labels for the 2 word types at the read positions all came out as "
            "one class).") in notes


def test_compare_sets_patching_sites_aligned_on_the_same_differing_word_against_each_other_across_seeds(tmp_path):
    """Review 13a C4: seed 0 (8 prompts) and seed 1 (24) of one task differ from their corrupted prompts at -6 and -4
    from the end in every prompt; both restore 1.00 of the gap at resid_pre L0 on the second (the job word), yet
    compare refused every positional site."""
    def aligned(n, job_effect, job_ci, layer=0):
        return {"n": n, "differ_from_end": {"-4": n, "-6": n}, "from_end": {"-6": n}, "orders": [
            {"order": 1, "n": n, "from_end": {"-6": n}, "sites": {"resid_pre": [
                {"layer": 0, "effect": -0.025, "ci": [-0.055, 0.004], "n": n}]}},
            {"order": 2, "n": n, "from_end": {"-4": n}, "sites": {"resid_pre": [
                {"layer": layer, "effect": job_effect, "ci": job_ci, "n": n},
                {"layer": 1 - layer, "effect": -0.01, "ci": [-0.03, 0.01], "n": n}]}}]}

    runs = {"a": (0, 8, aligned(8, 9.8067, [9.4503, 10.163]), "Mara the baker works with a"),
            "b": (1, 24, aligned(24, 10.0085, [9.7508, 10.266]), "Tom the painter works with a")}
    for side, (seed, n, entry, sample) in runs.items():
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        manifest = io.read_json(tmp_path / side / "manifest.json")
        io.write_json(tmp_path / side / "manifest.json", {**manifest, "seed": seed})
        io.write_json(tmp_path / side / "patching" / "summary.json", {
            "metric": "logprob", "clean_metric": -0.0011, "corrupted_metric": -9.81 if side == "a" else -10.01,
            "n_examples": n, "rounding_floor": {"floor": 0.077}, "at_corrupted_token": entry, "top_sites": {"resid_pre": [
                {"layer": 0, "head": None, "pos": 31, "from_end": -4, "token": "", "effect": entry["orders"][1]["sites"][
                    "resid_pre"][0]["effect"], "ci": [9.45, 10.16], "n": n}]}})
        io.write_json(tmp_path / side / "patching" / "provenance.json", {"task": "tools", "n_examples": n,
                                                                        "sample": {"prompt": sample}})
    table, notes = patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))
    # shares of each run's own gap, by hand: 9.8067 / 9.8089 and 10.0085 / 10.0089
    assert ("Top resid_pre layer aligned on the 2nd differing position (-4 from the end in every prompt of both): layer 0 "
            "in both (A L0: 1.00 of the gap, 95% CI [0.96, 1.04] (+9.81 answer log-probability); B L0: 1.00 of the gap, "
            "95% CI [0.97, 1.03] (+10 answer log-probability)).") in [n.removeprefix(SAME) for n in notes]
    assert "within noise: each inside the other&#x27;s 95% interval" in table.split("2nd differing position")[1]
    assert any(n.startswith(NOT_COMPARED + "Top resid_pre sites are not compared end-aligned") and "compared instead" in n
               for n in notes)
    # the job word at another place from the end in B's prompts: not the same slot, refused with the reason
    entry = aligned(24, 10.0085, [9.7508, 10.266])
    entry["differ_from_end"] = {"-5": 24, "-7": 24}
    s = io.read_json(tmp_path / "b" / "patching" / "summary.json")
    io.write_json(tmp_path / "b" / "patching" / "summary.json", {**s, "at_corrupted_token": entry})
    table, notes = patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))
    assert "aligned on" not in table and any("nor aligned on the differing positions: the differing positions sit at "
                                             "other places from the end (A -6, -4, B -7, -5)" in n for n in notes)


def test_compare_top_heads_sets_that_differ_say_whether_the_edge_heads_lie_within_noise(tmp_path):
    """Review 13c C5: "4 of the top 5 are shared" carried no uncertainty, though A's 5th and B's 5th sat within each
    other's noise. Hand-worked over n = 4: t(0.975, 3) = 3.1824; in B, L0H1 (0.12) and its 5th L0H0 (0.13), SEs 0.02:
    0.01 apart, inside 3.1824 x 0.04 = 0.127; in A, L0H0 (0.09) and its 5th L0H1 (0.1) likewise. With SEs of 0.001 the
    reach is 0.0064, under 0.01: then the edge is not within noise."""
    from headscope.reports.compare_top import top_heads_notes

    def values(l0h1: float, l0h0: float, se: float) -> dict[str, tuple[float, float]]:
        return {"L1H2": (0.9, se), "L1H1": (0.5, se), "L1H0": (0.3, se), "L0H2": (0.2, se), "L0H1": (l0h1, se),
                "L0H0": (l0h0, se)}

    for side in ("a", "b"):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
    _heads_summary(tmp_path / "a", top_heads_gradient=TOP)
    _heads_summary(tmp_path / "b", top_heads_gradient=[*TOP[:4], "L0H0"])
    _importances(tmp_path / "a", values(0.1, 0.09, 0.02))
    _importances(tmp_path / "b", values(0.12, 0.13, 0.02))
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    (note,) = top_heads_notes(a, b)
    assert note.startswith(SAME + "Top heads by gradient: 4 of the top 5 are shared (L1H2, L1H1, L1H0, L0H2): ")
    assert ("the others differ only within the runs' noise: in A, L0H0 (outside A's top 5, 0.09) and its 5th, L0H1 (0.1) "
            "are within each other's noise (0.01 apart, SEs 0.02 and 0.02;") in note
    assert "in B, L0H1 (outside B's top 5, 0.12) and its 5th, L0H0 (0.13) are within each other's noise" in note
    _importances(tmp_path / "a", values(0.1, 0.09, 0.001))
    _importances(tmp_path / "b", values(0.12, 0.13, 0.001))
    (note,) = top_heads_notes(a, b)
    assert not note.startswith(SAME) and ("at the edge of the top 5: in A, L0H0 (outside A's top 5, 0.09) and its 5th, "
                                          "L0H1 (0.1) are not within each other's noise") in note


def test_compare_top_reads_the_summarys_unchained_tie_runs():
    """Review 14c A1: ties do not chain, so B's summary records two runs sharing L1H1 ({L1H2, L1H1}, {L1H1, L1H0}),
    L1H2 and L1H0 apart. A lists L1H0, L1H1, L1H2 where B lists L1H2, L1H1, L1H0: by hand the swaps L1H0/L1H1 and
    L1H1/L1H2 lie inside one of B's runs (rounding), L1H0/L1H2 in none (a difference); merging B's tied heads into one
    group, as before, hid it."""
    from headscope.reports.compare_top import _untied_swaps, ties

    a, b = ["L1H0", "L1H1", "L1H2", "L0H2", "L0H1"], ["L1H2", "L1H1", "L1H0", "L0H2", "L0H1"]
    sb = {"tied_top_heads_gradient": ["L1H2", "L1H1", "L1H0"],
          "tied_top_groups_gradient": [["L1H2", "L1H1"], ["L1H1", "L1H0"]]}
    tb = ties(sb, "gradient", b)
    assert tb.groups == ((0, 1), (1, 2)) and tb.edge is None
    assert _untied_swaps([a, b], [ties({}, "gradient", a), tb]) == (False, [("L1H0", "L1H2")])


def _one(root, name: str, summary: dict) -> Run:
    """An output folder with one analysis's summary only."""
    io.write_json(root / "manifest.json", {"model": {"name": "m"}, "seed": 0, "config": {"analyses": [name]}})
    io.write_json(root / name / "summary.json", summary)
    return Run(root)


def test_compare_lists_a_small_headline_difference_as_within_noise_never_drops_it(tmp_path):
    """Review 14b C1: probes 0.476 (95% CI [0.32, 0.64]) vs 0.452 ([0.298, 0.613]), 5.0% apart, and heads -0.971 vs
    -0.976 were in neither list ("within 5%" was said nowhere on the page). Now the intervals judge them: within noise
    (half-widths 0.16 + 0.1575 = 0.3175 > 0.024, by hand), listed under "Within noise or the same"."""
    guard = {"at_chance": False, "chance_value": 0.25, "mean": 0.45, "ci": [0.3, 0.6]}
    _probes(tmp_path / "a", best=0.476, n=42, chance=guard, best_ci=[0.32, 0.64])
    _probes(tmp_path / "b", best=0.452, n=42, chance=guard, best_ci=[0.298, 0.613])
    a, b = Run(tmp_path / "a"), Run(tmp_path / "b")
    note = ("probes best accuracy: A 0.476, B 0.452 (n 42 each) (within noise: |B - A| = 0.024 is inside the combined "
            "half-widths 0.318; 95% CIs A [0.32, 0.64], B [0.298, 0.613]).")
    assert headline_notes(a, b) == [SAME + note]
    page = compare_html(a, b)
    assert f"<li>{html.escape(note)}</li>" in page[page.index("id='same'"):page.index("id='not-compared'")]
    # no interval on either side: equal at the printed precision is the same; otherwise not compared (not "within 5%")
    kv = {"metric": "logit_diff", "n_examples": 16}
    x, y, z = (_one(tmp_path / k, "kv", {**kv, "metric_unevicted": v}) for k, v in (("x", 2.0004), ("y", 2.0001),
                                                                                   ("z", 2.04)))
    assert headline_notes(x, y) == [SAME + "kv full-cache logit difference: A 2, B 2 (n 16 each): equal at the shown "
                                    "precision (3 significant figures)."]
    assert headline_notes(x, z)[0].startswith(NOT_COMPARED + "kv full-cache logit difference: not compared: A 2, B 2.04")


def _circuits(cpr, cpr_ci, top: dict, tied: bool) -> dict:
    names = sorted(top, key=lambda k: -abs(top[k]["mean"]))
    return {"n_examples": 8, "mib_n_examples": 8, "mib_cpr": cpr, "mib_cpr_ci": cpr_ci, "mib_cmd": 1 - cpr,
            "mib_cmd_ci": [0.1, 0.2], "dla_total_heads": {"mean": 6.0, "ci": [5.0, 7.0], "n": 8},
            "dla_top_components": {k: v["mean"] for k, v in top.items()}, "dla_top_intervals": top,
            "dla_top_differences": [{"a": names[0], "b": names[1], "tied": tied, "difference": 1.0, "ci": [-1, 2]}]}


def test_compare_sets_circuits_headlines_against_each_other(tmp_path):
    """Review 14b C1: circuits was not in QUANTITIES, so CPR 0.828 vs 0.174 and the DLA top writers were compared
    nowhere. Now CPR, CMD and the DLA totals are judged by the intervals the finding prints, and the top writers by
    theirs: A's L0H0 [2, 4] clears B's top L1H1 in A ([0, 1]), so the writers differ beyond noise."""
    top_a = {"L0H0": {"mean": 3.0, "ci": [2.0, 4.0], "n": 8}, "L1H1": {"mean": 0.5, "ci": [0.0, 1.0], "n": 8}}
    top_b = {"L0H0": {"mean": 0.4, "ci": [0.1, 0.7], "n": 8}, "L1H1": {"mean": 2.5, "ci": [1.5, 3.5], "n": 8}}
    a = _one(tmp_path / "a", "circuits", _circuits(0.828, [-4.0, 2.94], top_a, False))
    b = _one(tmp_path / "b", "circuits", _circuits(0.174, [0.10, 0.30], top_b, False))
    notes = headline_notes(a, b)
    assert notes[0] == (SAME + "circuits MIB CPR: A 0.828, B 0.174 (n 8 each) (within noise: |B - A| = 0.654 is inside "
                        "the combined half-widths 3.57; 95% CIs A [-4, 2.94], B [0.1, 0.3]).")  # 3.47 + 0.1
    assert notes[2].startswith(SAME + "circuits DLA total of the heads: A 6, B 6 (n 8 each) (within noise")
    assert notes[-1] == ("circuits DLA top writer: A L0H0 (+3, 95% CI [2, 4]); B L1H1 (+2.5, 95% CI [1.5, 3.5]) (n 8 each):"
                         " beyond noise: A and B's top writer's 95% interval clears the other run's top writer's in its "
                         "own run.")
    tied_b = _one(tmp_path / "c", "circuits", _circuits(0.174, [0.10, 0.30], {**top_b, "L0H0": top_a["L0H0"]}, True))
    assert headline_notes(a, tied_b)[-1].startswith(SAME + "circuits DLA top writer: a shared top writer, L0H0")



def test_compare_does_not_set_cpr_over_a_gap_within_noise_against_another(tmp_path):
    """Review 14b A4: a circuits report whose clean-corrupted gap is within noise withholds MIB's CPR and CMD (ratios
    over that gap); compare must not set A's 0.828 against B's 0.174 then: not compared, with the report's reason."""
    from headscope.analyses.core.chance import gap_within_noise

    top = {"L0H0": {"mean": 3.0, "ci": [2.0, 4.0], "n": 8}, "L1H1": {"mean": 0.5, "ci": [0.0, 1.0], "n": 8}}
    noise = gap_within_noise(torch.tensor([1.0, 1.2, 0.9, 1.1]), torch.tensor([1.1, 1.0, 1.0, 1.05]), "logit_diff")
    assert noise is not None  # mean gap 0.0125 under the 0.1-logit floor and its CI contains 0
    a = _one(tmp_path / "a", "circuits", {**_circuits(0.828, [0.7, 0.9], top, False), "gap_within_noise": noise})
    b = _one(tmp_path / "b", "circuits", _circuits(0.174, [0.10, 0.30], top, False))
    notes = headline_notes(a, b)
    for label in ("circuits MIB CPR", "circuits MIB CMD"):
        [note] = [n for n in notes if label + ":" in n]
        assert note.startswith(NOT_COMPARED + label + ": not compared: A's report withholds MIB's CPR and CMD, ratios "
                               "over a clean-corrupted gap within noise (" + noise["reason"] + ")")
    assert any(n.startswith(SAME + "circuits DLA total of the heads") for n in notes)  # DLA is no ratio over the gap


def _kv_hold(grid_verdicts: dict, rows: list[dict], consistent_from=None) -> dict:
    return {"metric": "logit_diff", "metric_unevicted": 2.0, "n_examples": 16, "holding_budgets": {
        "tolerance": 0.01, "policies": {"window": {"verdicts": grid_verdicts, "not_shown": rows, "above": [],
                                                   "consistent_from": consistent_from, "worst_evicting": {"budget": 1}}}}}


def test_compare_kv_verdicts_apart_only_by_the_grid_or_one_prompt_are_not_compared(tmp_path):
    """Review 14b C2: "32: not shown in A, not run in B" (B's prompts too short for budget 32) and "32: not shown in A,
    above in B" (both on the one prompt long enough) were listed as differences. Now not compared, with why. Review
    17b A3: A's consistent_from 32 rests on one prompt (an older summary's rule): "not shown either way", not "its
    means within"; over 16 prompts "within 1% from budget 32 on"."""
    row = {"budget": 32, "n_evicting": 1, "ci_low": None, "ci_high": None}
    a = _one(tmp_path / "a", "kv", _kv_hold({"16": "below", "32": "not shown"}, [row], consistent_from=32))
    b = _one(tmp_path / "b", "kv", _kv_hold({"16": "below"}, []))
    c = _one(tmp_path / "c", "kv", {**_kv_hold({"16": "below", "32": "above"}, []), "holding_budgets": {
        "tolerance": 0.01, "policies": {"window": {"verdicts": {"16": "below", "32": "above"}, "above": [row],
                                                   "worst_evicting": {"budget": 1}}}}})
    grid = [n for n in headline_notes(a, b) if "kv window within" in n]
    assert grid == [NOT_COMPARED + "kv window within 1% of the full cache: not compared: A not shown either way, B never "
                    "within; the verdicts differ only at budgets one run did not run (32: not "
                    "shown in A, not run in B): the runs' budget grids differ (each runs the budgets its prompts' "
                    "lengths allow), a setting, not the model."]
    single = [n for n in headline_notes(a, c) if "kv window within" in n]
    assert single == [NOT_COMPARED + "kv window within 1% of the full cache: not compared: A not shown either way, B "
                      "never within; the budget verdicts that differ rest on one evicting prompt (32: "
                      "not shown in A (n = 1), above in B (n = 1)), with no interval: whether they differ beyond noise is "
                      "not known."]
    many = {**row, "n_evicting": 16, "ci_low": 0.02, "ci_high": 0.1}  # review 14bv B1: "never" needs the band cleared
    d = _one(tmp_path / "d", "kv", {**_kv_hold({"16": "below", "32": "above"}, []), "holding_budgets": {
        "tolerance": 0.01, "policies": {"window": {"verdicts": {"16": "below", "32": "above"}, "above": [many],
                                                   "worst_evicting": {"budget": 1}}}}})
    e = _one(tmp_path / "e", "kv", _kv_hold({"16": "below", "32": "not shown"}, [many], consistent_from=32))
    assert [n for n in headline_notes(e, d) if "kv window within" in n] == [
        "kv window within 1% of the full cache: A not shown to hold (its means within 1% from budget 32 on), B never "
        "within (budget verdicts that differ: 32: not shown in A, above in B)."]  # 16 prompts each: still a difference


def test_importance_correlation_states_its_n_and_fisher_interval():
    """Review 14b B5: "Pearson r = 0.81 between A and B" under Differences with no n or interval. Now its n (heads)
    and its 95% Fisher z interval, checked against scipy's pearsonr (which uses the same transform)."""
    from scipy import stats

    from headscope.reports.compare_heads import pearson_words

    x = np.array([2.86, 1.0, 0.31, 1.27, 0.26, 0.01, 0.35, 0.17])
    y = np.array([3.27, 1.41, 0.2, 0.5, 0.9, 0.3, 0.1, 0.4])
    res = stats.pearsonr(x, y)
    ci = res.confidence_interval(0.95)
    text, kind = pearson_words(float(res.statistic), 8, "gradient importance")
    assert text.startswith(f"Head importance (gradient importance): Pearson r = {res.statistic:.2f} between A and B "
                           f"over 8 heads (95% CI [{ci.low:.2f}, {ci.high:.2f}], Fisher z")
    assert kind == ("same" if ci.high >= 0.95 else "differ")
    assert pearson_words(0.1, 20, "g")[1] == "differ" and pearson_words(0.99, 3, "g")[1] == "not"


def test_random_order_counts_are_judged_by_their_seed_spread(tmp_path):
    """Review 14a C5: a random order's counts over 1-2 seeds were the page's only "difference". Now fewer than 5 seeds
    are not compared; from 5 on, overlapping seed ranges are within the spread and disjoint ones a difference."""
    from headscope.reports.compare_pruning import _random_note

    def run(side, seeds):
        return _one(tmp_path / side, "heads", {"n_heads": 8, "prunable_ci_random": {"per_seed_heads": seeds}})

    few = _random_note(run("a", [2, 8]), run("b", [8]), "random", ["28%", "44%"])
    assert few.startswith(NOT_COMPARED) and few.endswith("not compared: too few seeds for a noise verdict (fewer than 5 "
                                                         "in both runs; the seed ranges overlap).")
    five = [1, 2, 2, 3, 2]
    assert _random_note(run("c", five), run("d", [3, 4, 5, 4, 4]), "random", ["a", "b"]).startswith(SAME)
    apart = _random_note(run("e", five), run("f", [4, 5, 5, 6, 4]), "random", ["a", "b"])
    assert apart.endswith("beyond the seeds' spread: the seed ranges do not overlap.") and not apart.startswith("(")


def test_settings_list_a_budget_change_only_where_the_changes_differ(tmp_path):
    """Review 14c-v C2: both runs' patching budgets changed trace_samples None -> 1, fitted to speeds 2e-10 and 2.6e-10
    s per flop, and "patching budget changes" was listed under "Settings that differ". The same change is no setting
    that differs; another change still is."""
    for side, samples in (("a", 1), ("b", 1), ("c", 2)):
        _one(tmp_path / side, "patching", {"budget": {"changed": {"trace_samples": [None, samples]}},
                                           "causal_tracing": {"n_examples": 8}})  # traced: the cut is a setting
    notes = settings_notes(Run(tmp_path / "a"), Run(tmp_path / "b"), ["patching"])
    assert not any("budget changes" in n for n in notes), notes
    notes = settings_notes(Run(tmp_path / "a"), Run(tmp_path / "c"), ["patching"])
    assert "patching budget changes: A trace_samples None -> 1, B trace_samples None -> 2." in notes, notes


def test_compare_kv_closest_policy_says_what_its_change_is_a_share_of_and_the_answers_it_loses():
    """Review 14b-v C4: compare said "A window keeps 87.4% at budget 16" where the kv finding says "-12.6% of the span"
    (from chance to the full cache, a log-probability) and "loses 2 of the 5 answer(s)". Hand-made row: now both."""
    from headscope.reports.compare_verdicts import _verdict_notes
    from headscope.reports.findings import finding

    row = {"budget": 16, "change": -0.126, "ci_low": -0.348, "ci_high": 0.096, "n_evicting": 16, "n_examples": 16,
           "correct": 8, "full_correct": 5, "lost": 2, "per_example_diff_low": -5.41, "per_example_diff_high": 1.45}
    s = {"metric": "logprob", "metric_unevicted": -1.03, "n_examples": 16, "holding_budgets": {
        "tolerance": 0.01, "basis": "span", "chance": -6.21, "band": 0.052, "grid": [8, 16], "policies": {
            "window": {"budget": None, "closest": row, "worst_evicting": row, "misses": [0.126, 0.126], "missed": [16],
                       "every_evicting_missed": True, "verdicts": {"16": "below"}}}}}
    said = finding("kv", s)
    assert "-12.6% of the span (95% CI [-34.8%, +9.6%]" in said and "loses 2 of the 5 answer(s)" in said, said
    assert _verdict_notes("kv", s, s)[-1] == (
        SAME + "kv policy closest to the full cache (no policy within the band in either run): the same choice: A window "
        "at budget 16: -12.6% of the span from chance to the full cache (95% CI of the change [-34.8%, +9.6%], n = 16; "
        "8/16 answers correct (full cache 5/16); it loses 2 of the 5 answer(s) the full cache gets), B window at budget "
        "16: -12.6% of the span from chance to the full cache (95% CI of the change [-34.8%, +9.6%], n = 16; 8/16 answers "
        "correct (full cache 5/16); it loses 2 of the 5 answer(s) the full cache gets) (n 16 each).")


def test_analyses_that_failed_in_both_runs_are_listed_under_not_compared(tmp_path):
    """Review 15d C2: heads, attribution and circuits failed in both runs (no summary, the manifest's status
    "failed: ..."); compare.html named them only in the findings table, so its summary read as if the runs agreed.
    Each is now under "Not compared, and why" with its reason: once where both runs give the same one, A's and B's
    where they differ, and an analysis that failed in one run and was not part of the other says both."""
    from headscope.reports.compare import compare_html

    boom = "RuntimeError: The size of tensor a (8) must match the size of tensor b (4) at non-singleton dimension 2"
    status = {"a": {"heads": f"failed: {boom}", "attribution": "failed: NotImplementedError: b_V <MLA>",
                    "circuits": "failed: ValueError: x"},
              "b": {"heads": f"failed: {boom}", "attribution": "failed: NotImplementedError: b_V <MLA>",
                    "circuits": "failed: ValueError: y"}}
    for side in ("a", "b"):
        root = tmp_path / side
        _folder(root, "m", 1.0, 0, 0.5)
        (root / "heads" / "summary.json").unlink()
        analyses = ["heads", "position", "patching", "attribution"] + (["circuits"] if side == "a" else [])
        io.write_json(root / "manifest.json", {"model": {"name": "m"}, "config": {"analyses": analyses, "task": "t"},
                                               "status": {k: v for k, v in status[side].items() if k in analyses}})
    page = compare_html(Run(tmp_path / "a"), Run(tmp_path / "b"))
    refused = page[page.index("id='not-compared'"):page.index("id='findings'")]
    assert f"<li>heads: failed in both: {html.escape(boom)}.</li>" in refused
    assert "<li>attribution: failed in both: NotImplementedError: b_V &lt;MLA&gt;.</li>" in refused
    assert ("<li>circuits: no result in either run: A: failed: ValueError: x; B: not part of this run (not among its "
            "analyses).</li>") in refused
    assert "position:" not in refused and "patching:" not in refused  # both ran them


def test_an_identical_skip_reason_is_said_once(tmp_path):
    """Review 16v C3: an analysis skipped in both runs for the same reason (MLA) printed the ~45-word reason twice
    ("no result in either run: A: skipped: ...; B: skipped: ..."); only identical failures were merged. Now once;
    different skip reasons keep A's and B's; a skip in one run and a failure in the other keep both."""
    from headscope.reports.compare import compare_html

    mla = "./dsv3 uses multi-head latent attention (MLA: <q/k> 20 wide), which this analysis does not support"
    status = {"a": {"attribution": f"skipped: {mla}", "kv": "skipped: no corrupted prompts",
                    "circuits": "skipped: x"},
              "b": {"attribution": f"skipped: {mla}", "kv": "skipped: no answers", "circuits": "failed: E: y"}}
    for side in ("a", "b"):
        root = tmp_path / side
        _folder(root, "m", 1.0, 0, 0.5)
        analyses = ["heads", "position", "patching", "attribution", "circuits", "kv"]
        io.write_json(root / "manifest.json", {"model": {"name": "m"}, "config": {"analyses": analyses, "task": "t"},
                                               "status": status[side]})
    page = compare_html(Run(tmp_path / "a"), Run(tmp_path / "b"))
    refused = page[page.index("id='not-compared'"):page.index("id='findings'")]
    assert f"<li>attribution: skipped in both: {html.escape(mla)}.</li>" in refused
    assert refused.count("multi-head latent attention") == 1
    assert "<li>kv: skipped in both: A: no corrupted prompts; B: no answers.</li>" in refused
    assert "<li>circuits: no result in either run: A: skipped: x; B: failed: E: y.</li>" in refused


def test_compare_and_finding_state_a_bonferroni_interval_at_its_own_level(tmp_path):
    """Review 15av C1: a probe at chance over the best of 3 layers carries the exact (Clopper-Pearson) interval at
    1 - 0.05/3 = 98.3% (scipy: [0.0764, 0.3995] for 8 of 39); compare called it "95% CI" and the finding "98% CI"."""
    from scipy.stats import beta

    from headscope.reports.compare_headlines import headline_notes
    from headscope.reports.findings import finding

    alpha = 0.05 / 3
    lo, hi = beta.ppf(alpha / 2, 8, 32), beta.ppf(1 - alpha / 2, 9, 31)
    assert (round(lo, 4), round(hi, 4)) == (0.0764, 0.3995)
    chance = {"at_chance": True, "below_chance": False, "chance_value": 0.128, "mean": 8 / 39, "ci": [lo, hi],
              "ci_level": 1 - alpha, "correction": "bonferroni", "alpha": 0.05, "n_tests": 3}
    _probes(tmp_path / "a", best=8 / 39, n=39, chance=chance)
    _probes(tmp_path / "b", best=8 / 39, n=39, chance=chance)
    notes = " ".join(headline_notes(Run(tmp_path / "a"), Run(tmp_path / "b")))
    assert "probe accuracy 0.205 against chance 0.128, 98.3% CI [0.0764, 0.4], 39 examples" in notes
    said = finding("probes", io.read_json(tmp_path / "a" / "probes" / "summary.json"))
    assert "98.3% CI [0.0764, 0.4]" in said and "98% CI" not in said and "95% CI [0.0764" not in said


def test_compare_sets_patchings_position_free_headlines_against_each_other_across_seeds(tmp_path):
    """Review 18d C4 (Gemma 2, seeds 0 and 1): the patching finding leads with the resid_pre at each prompt's corrupted
    token layer by layer, with intervals, and names path patching's largest path with its interval; neither names a
    position counted from the end, yet compare left both out (only "Top ... sites are not compared end-aligned").
    Shares by hand: A's gap 6 - (-6) = 12, B's 6.5 - (-6.5) = 13; layer 1: A 0.012 / 12 = 0.001, B 0.0039 / 13 = 0.0003,
    |B - A| = 0.0007 inside the half-widths 0.0009 + 0.00075; path L0H1: A 0.72 / 12 = 0.06 [0.36 / 12, 1.08 / 12],
    B 0.91 / 13 = 0.07 [0.52 / 13, 1.3 / 13], |B - A| = 0.01 inside 0.03 + 0.03."""
    def write(side, seed, gap_half, layer1, paths):
        _folder(tmp_path / side, "m", 1.0, 0, 0.5)
        manifest = io.read_json(tmp_path / side / "manifest.json")
        io.write_json(tmp_path / side / "manifest.json", {**manifest, "seed": seed})
        s = io.read_json(tmp_path / side / "patching" / "summary.json")
        sites = {"resid_pre": [{"layer": 0, "effect": 2 * gap_half, "ci": [1.8 * gap_half, 2.2 * gap_half],
                                "share_ci": [1.0, 1.0], "n": 8}, {"layer": 1, "n": 8, **layer1}]}
        io.write_json(tmp_path / side / "patching" / "summary.json", {
            **s, "metric": "logit_diff", "clean_metric": gap_half, "corrupted_metric": -gap_half, "n_examples": 8,
            "at_corrupted_token": {"n": 8, "positions_differ": [1, 1], "from_end": {"-7": 7, "-5": 1}, "sites": sites},
            "path_patching": {"direction": "denoise", "top_paths": [
                {"sender": list(h), "receiver": "logits", "effect": e, "ci": ci, "n": 8} for h, e, ci in paths]}})
        io.write_json(tmp_path / side / "patching" / "provenance.json", {"task": "season", "n_examples": 8,
                                                                        "sample": {"prompt": f"prompt {seed}"}})

    write("a", 0, 6.0, {"effect": 0.012, "share_ci": [0.0002, 0.002]}, [((0, 1), 0.72, [0.36, 1.08])])
    write("b", 1, 6.5, {"effect": 0.0039, "share_ci": [-0.0005, 0.001]}, [((0, 1), 0.91, [0.52, 1.3])])
    notes = patching_section(Run(tmp_path / "a"), Run(tmp_path / "b"))[1]
    assert any(n.startswith(NOT_COMPARED + "Top resid_pre sites are not compared end-aligned") for n in notes)
    assert SAME + (
        "patching resid_pre at the corrupted token (aligned on each prompt's own, not counted from the end), per layer, "
        "as a share of each run's clean-corrupted gap with its 95% CI: within noise in every layer (|B - A| inside the "
        "two 95% CIs' combined half-widths): layer 0 A 1.00 [1.00, 1.00], B 1.00 [1.00, 1.00]; layer 1 A 0.001 "
        "[0.0002, 0.002], B 0.0003 [-0.0005, 0.001] (n 8 prompts each).") in notes, notes
    assert SAME + (
        "path patching's largest path in size: L0H1 in both (A 0.06 [0.03, 0.09], B 0.07 [0.04, 0.1] of its run's "
        "gap; n 8 prompts each) (within noise: |B - A| = 0.01 is inside the combined half-widths 0.06; 95% CIs A "
        "[0.03, 0.09], B [0.04, 0.1]).") in notes, notes
    # B's layer 1 at 0.065 / 13 = 0.005 [0.004, 0.006]: |B - A| = 0.004 past 0.0009 + 0.001; its top path another head
    write("c", 1, 6.5, {"effect": 0.065, "share_ci": [0.004, 0.006]},
          [((0, 0), 0.91, [0.52, 1.3]), ((0, 1), 0.2, [0.1, 0.3])])
    notes = patching_section(Run(tmp_path / "a"), Run(tmp_path / "c"))[1]
    assert ("patching resid_pre at the corrupted token (aligned on each prompt's own, not counted from the end), per "
            "layer, as a share of each run's clean-corrupted gap with its 95% CI: beyond noise (|B - A| past the two 95% "
            "CIs' combined half-widths) in layer 1 A 0.001 [0.0002, 0.002], B 0.005 [0.004, 0.006]; within noise: layer "
            "0 A 1.00 [1.00, 1.00], B 1.00 [1.00, 1.00] (n 8 prompts each).") in notes, notes
    assert ("path patching's largest path in size differs: A L0H1 0.06 [0.03, 0.09], B L0H0 0.07 [0.04, 0.1] of its "
            "run's gap (n 8 prompts each); A's summary does not list the other run's top path among its kept paths."
            ) in notes, notes
    # each run lists the other's top path inside its own top path's interval, and the reverse: tied, no difference
    write("d", 0, 6.0, {"effect": 0.012, "share_ci": [0.0002, 0.002]},
          [((0, 1), 0.72, [0.36, 1.08]), ((0, 0), 0.6, [0.3, 0.9])])
    write("e", 1, 6.5, {"effect": 0.0039, "share_ci": [-0.0005, 0.001]},
          [((0, 0), 0.91, [0.52, 1.3]), ((0, 1), 0.8, [0.5, 1.1])])
    notes = patching_section(Run(tmp_path / "d"), Run(tmp_path / "e"))[1]
    assert SAME + ("path patching's largest path in size: A L0H1 0.06 [0.03, 0.09], B L0H0 0.07 [0.04, 0.1] of its "
                   "run's gap (n 8 prompts each): not a difference: in each run the two heads' paths are tied, each "
                   "inside the other's 95% interval, so which is the largest is not settled.") in notes, notes
    # review 19v C4 (g2_compare_pk): shares 0.0549 and 0.0570 printed "A 0.05, B 0.06" beside |B - A| = 0.00211; by
    # hand 0.6588 / 12 = 0.0549 [0.3948 / 12, 0.9228 / 12], 0.741 / 13 = 0.057 [0.5811 / 13, 0.9009 / 13]
    write("f", 0, 6.0, {"effect": 0.012, "share_ci": [0.0002, 0.002]}, [((0, 1), 0.6588, [0.3948, 0.9228])])
    write("g", 1, 6.5, {"effect": 0.0039, "share_ci": [-0.0005, 0.001]}, [((0, 1), 0.741, [0.5811, 0.9009])])
    [path] = [n for n in patching_section(Run(tmp_path / "f"), Run(tmp_path / "g"))[1] if "largest path" in n]
    assert path.startswith(SAME + "path patching's largest path in size: L0H1 in both (A 0.0549 [0.0329, 0.0769], B 0.057 "
                           "[0.0447, 0.0693] of its run's gap; n 8 prompts each) (within noise: |B - A| = 0.0021 "), path
