"""Review 16d B2: an eviction that changes no prompt's metric by one bit is flagged, not reported as "within 1%"."""
from __future__ import annotations

import pandas as pd

from headscope.analyses.kv.holding import holding_budgets
from headscope.reports.kv_words import finding


def sweep(shift: float) -> pd.DataFrame:
    """4 prompts of context 20; every policy at budgets 1 and 8 gives the full cache's metric plus `shift` on
    prompt 0 (0: exactly unchanged everywhere, as a discarded mask gives)."""
    full = [17.9, 7.76, 9.5, 11.2]
    rows = [dict(policy="full", budget=20, example=i, context=20, cached=60.0, kept=60.0, metric=m, correct=1.0)
            for i, m in enumerate(full)]
    for policy in ("window", "sink_window", "heavy_hitters"):
        for budget in (1, 8):
            rows += [dict(policy=policy, budget=budget, example=i, context=20, cached=60.0, kept=3.0 * budget,
                          metric=m + (shift if i == 0 else 0.0), correct=1.0) for i, m in enumerate(full)]
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> dict:
    full = df[df.policy == "full"].metric
    return {"metric": "logit_diff", "metric_unevicted": float(full.mean()), "n_examples": len(full),
            "context_range": [int(df.context.min()), int(df.context.max())],
            "holding_budgets": holding_budgets(df, n_sink=4)}


def test_an_exactly_unchanged_eviction_is_said_to_have_had_no_effect():
    s = summary(sweep(0.0))
    assert s["holding_budgets"]["no_effect"] == [{"policy": p, "budget": 1, "n_evicting": 4}
                                                 for p in ("heavy_hitters", "sink_window", "window")]
    text = finding(s)
    assert text == ("The eviction had no effect: heavy hitters at budget 1 of up to 20 context positions (4 prompts "
                    "evicted from); sink window at budget 1 of up to 20 context positions (4 prompts evicted from); "
                    "window at budget 1 of up to 20 context positions (4 prompts evicted from) left every prompt's "
                    "metric exactly at its full-cache value, to the last digit, which evicting most of a context does "
                    "not do; the eviction mask did not reach the model, so no eviction result is reported here.")
    assert "within 1%" not in text.lower()


def test_a_real_eviction_is_not_flagged():
    s = summary(sweep(-0.5))
    assert "no_effect" not in s["holding_budgets"]
    assert "no effect" not in finding(s)

