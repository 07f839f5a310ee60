"""What the kv analysis costs (analyses/core/budget.py): the states, norms and sinks about 4n row passes, the eviction
what-if n per policy and budget (plus the full cache); its one sweep that gives way is the examples."""
from __future__ import annotations

from headscope.analyses.core.budget import Cost, CostModel, examples_knob, n_rows, task_length

FULL, QUICK = 128, 16


def estimate(model, task, config) -> Cost:
    from headscope.analyses.kv.eviction import default_budgets

    n, n_pos = n_rows(task, config, FULL, QUICK), task_length(task, model)
    budgets = config.budgets or default_budgets(max(1, n_pos - 1))
    # states: the KV capture, norms and sink statistics (each length group its own pass), about 4n
    return Cost(parts={"states": 4 * n, "eviction": n * (1 + len(config.policies) * len(budgets))}, n_pos=n_pos)


COST = CostModel(estimate=estimate, knobs=(examples_knob(FULL, QUICK),))
