"""What the kv analysis costs (analyses/core/budget.py), and its one sweep that gives way (the examples).

States, norms, sinks and the context's prefill: about 4n row passes (each a pass of every prompt,
hook-free where it applies). The eviction what-if decodes the answer query alone on the cached
context for the full cache and each policy and budget (kv/eviction.answer_step): a one-token pass,
counted as STEP_POSITIONS positions' worth of a row pass for its fixed cost. Where a sliding window
shorter than the prompt drops early positions from the cache, each run is a whole pass instead.
"""
from __future__ import annotations

from headscope.analyses.core.budget import STEP_POSITIONS, Cost, CostModel, examples_knob, n_rows, task_length

FULL, QUICK = 128, 16


def decodes_alone(model, n_pos: int) -> bool:
    """Does the eviction sweep decode the answer alone (no sliding window shorter than the prompt)?"""
    window = getattr(model.bridge.original_model.config, "sliding_window", None)
    return not (isinstance(window, int) and window < n_pos)


def estimate(model, task, config) -> Cost:
    from headscope.analyses.kv.eviction import default_budgets, eviction_skipped

    n, n_pos = n_rows(task, config, FULL, QUICK), task_length(task, model)
    if eviction_skipped(model):  # review 16dv B1: no sweep where score edits are discarded
        return Cost(parts={"states": 4 * n}, n_pos=n_pos)
    budgets = config.budgets or default_budgets(max(1, n_pos - 1))
    runs = 1 + len(config.policies) * len(budgets)
    per_run = min(1.0, STEP_POSITIONS / max(1, n_pos)) if decodes_alone(model, n_pos) else 1.0
    return Cost(parts={"states": 4 * n, "eviction": n * runs * per_run}, n_pos=n_pos)


COST = CostModel(estimate=estimate, knobs=(examples_knob(FULL, QUICK),))
