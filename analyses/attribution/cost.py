"""What the attribution analysis costs (analyses/core/budget.py), and its sweeps in the order they give way.

Row passes, for n examples of P positions: attention capture n; saliency and gradient x input 3n
each; integrated gradients 3 n n_steps, plus the first doubling for half the examples (on GPT-2
small's random-weight shape every example converged at the first count; examples that need more
doublings take longer than estimated); leave-one-out n P, on decoders n (P + 1) / 2 (the clean
cache serves each removed token's prefix: only the suffix runs); attention permutation n
n_permutations (the last layer's pattern replaced, a whole pass counted); adversarial attention
3 n adversarial_steps.
"""
from __future__ import annotations

import dataclasses

from headscope.analyses.core.budget import Cost, CostModel, examples_knob, n_rows, task_length

FULL, QUICK = 64, 4


def estimate(model, task, config) -> Cost:
    n, n_pos = n_rows(task, config, FULL, QUICK), task_length(task, model)
    doubling = config.n_steps * 2 if config.n_steps * 2 <= config.ig_max_steps else 0  # its first doubling
    parts = {"attention": n, "gradients": 6 * n, "integrated_gradients": 3 * n * (config.n_steps + doubling / 2),
             "leave_one_out": n * n_pos if model.facts.is_encoder else n * (n_pos + 1) / 2,
             "permutation": n * config.n_permutations,
             "adversarial": 3 * n * config.adversarial_steps}
    return Cost(parts=parts, n_pos=n_pos)


def _halve(name: str, floor: int):
    def knob(config, model):
        value = getattr(config, name)
        return dataclasses.replace(config, **{name: max(floor, value // 2)}) if value > floor else None
    knob.__name__ = f"fewer_{name}"
    return knob


def _ig_steps(config, model):
    if config.n_steps <= 8:
        return None
    steps = max(8, config.n_steps // 2)
    return dataclasses.replace(config, n_steps=steps, ig_max_steps=max(steps, config.ig_max_steps // 2))


COST = CostModel(estimate=estimate, knobs=(_halve("n_permutations", 10), _halve("adversarial_steps", 10), _ig_steps,
                                           examples_knob(FULL, QUICK), _halve("adversarial_steps", 0)))
