"""Review 18w C1: the top_attention gallery ranked heads by |importance| (a head whose removal helps shown second) and
called heads whose 95% intervals include 0, or that tie within rounding, "top heads"."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pandas as pd
from scipy import stats


def _data(grid):
    """The explorer's dict (scale 100) for 2 layers x 2 heads, uniform causal patterns on 3 tokens."""
    rows = [[100 // (q + 1)] * (q + 1) for q in range(3)]  # [query][key]
    ex = {"tokens": ["t0", "t1", "t2"], "patterns": [[rows, rows], [rows, rows]]}
    return {"scale": 100, "examples": [ex], "default_score": "importance (zero)", "scores": {"importance (zero)": grid}}


def test_top_attention_follows_the_heads_findings_signed_order_and_says_its_intervals_and_ties(tmp_path):
    """Gemma 2's numbers: L0H0 1.36 (se 0.38), L0H1 -0.229 (removing it helps), L1H0 0.0848 (se 0.0925), L1H1 0.0785
    (se 0.052), 16 examples, L1H0 and L1H1 tied within rounding in the heads summary. By hand (scipy's t, 15 df):
    L0H0's interval excludes 0, L1H0's and L1H1's include it. The panels are L0H0, L1H0, L1H1 (not L0H1), and the
    title says which intervals include 0 and which heads tie, calling them the largest scores, not the top heads."""
    from headscope.reports.plots_attention import heads_facts, top_heads, top_heads_figure

    imp = {"L0H0": (1.36, 0.38), "L0H1": (-0.229, 0.11), "L1H0": (0.0848, 0.0925), "L1H1": (0.0785, 0.052)}
    (tmp_path / "heads").mkdir()
    (tmp_path / "heads" / "summary.json").write_text(json.dumps({"n_examples": 16,
                                                                "tied_top_groups_zero": [["L1H0", "L1H1"]]}))
    pd.DataFrame([{"method": "zero", "head_name": h, "importance": m, "importance_se": se}
                  for h, (m, se) in imp.items()]).to_csv(tmp_path / "heads" / "results.csv", index=False)
    t = stats.t.ppf(0.975, 15)
    by_hand = {h: (m - t * se, m + t * se) for h, (m, se) in imp.items()}
    assert by_hand["L0H0"][0] > 0 and by_hand["L1H0"][0] < 0 < by_hand["L1H0"][1] and by_hand["L1H1"][0] < 0
    facts = heads_facts(tmp_path)
    for h, (lo, hi) in by_hand.items():
        assert abs(facts["intervals"]["zero"][h][0] - lo) < 1e-9 and abs(facts["intervals"]["zero"][h][1] - hi) < 1e-9
    data = _data([[1.36, -0.229], [0.0848, 0.0785]])
    assert top_heads(data, k=3) == [(0, 0, 1.36), (1, 0, 0.0848), (1, 1, 0.0785)]
    fig = top_heads_figure(data, k=3, facts=facts)
    plain = top_heads_figure(_data([[1.36, 0.5], [0.0848, 0.0785]]), k=3)  # no facts: the title as before
    try:
        assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
            "L0H0 (importance (zero) 1.36)", "L1H0 (importance (zero) 0.0848)", "L1H1 (importance (zero) 0.0785)"]
        assert fig._suptitle.get_text().replace("\n", " ") == (
            "the 3 largest importance (zero) scores (only L0H0's 95% interval excludes 0: L1H0 and L1H1 are not "
            "distinguishable from 0 at 95%; L1H0 and L1H1 tied within rounding (their order is arbitrary)): attention "
            "on example 1")
        assert plain._suptitle.get_text() == "top 3 heads by importance (zero): attention on example 1"
    finally:
        plt.close("all")
