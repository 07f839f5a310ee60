"""Review 16c B2: the kv finding says which query-key distances its eviction runs keep on an ALiBi model."""
from __future__ import annotations

from headscope.reports.findings import finding

SENTENCE = ("Evicted runs keep each kept key's ALiBi distance in the full prompt (evicted keys hidden, not removed; a "
            "cache that re-counts the kept keys' positions gives slightly different numbers).")
KV = {"metric": "logit_diff", "metric_unevicted": 9.2, "n_examples": 4, "context_positions": 16,
      "metric_per_policy_budget": {"window": {"8": 9.2, "16": 9.2}}}


def test_the_eviction_finding_names_the_alibi_distances_it_keeps_only_on_alibi_and_where_eviction_is_reported():
    text = finding("kv", {**KV, "position_bias": "alibi"})
    assert "window from 8 positions" in text and text.endswith(SENTENCE), text
    assert SENTENCE not in finding("kv", KV)  # no position bias (rotary keys carry their positions in the cache)
    at_chance = {**KV, "position_bias": "alibi", "chance": {"at_chance": True, "mean": 0.01, "ci": [-0.1, 0.12],
                                                            "n_examples": 4, "chance_value": 0.0, "metric": "logit_diff"}}
    assert SENTENCE not in finding("kv", at_chance)  # no eviction finding at chance: nothing to qualify
