"""What the probes analysis costs (analyses/core/budget.py), and its sweeps in the order they give way.

One captured pass over n examples gives every layer's features (n row passes). The scikit-learn
fits dominate: per layer, per fold (cv) and per regularisation strength (7, 4 when quick, 1
without the capacity sweep), for the labels and their control task, a logistic regression of
up to n x P samples (all-position labels) on d_model features, counted as 300 L-BFGS iterations
of 4 x samples x d_model x 10 classes flops, turned into row passes of as many flops (an upper
bound: answer labels use one sample per example). Knobs, in order: 3 folds, one strength (no
capacity sweep), the examples.
"""
from __future__ import annotations

import dataclasses

from headscope.analyses.core.budget import Cost, CostModel, examples_knob, flops_per_row, n_rows, task_length

FULL, QUICK = 256, 64
ITERATIONS, CLASSES = 300, 10  # L-BFGS iterations (the probes allow 1,000), classes


def estimate(model, task, config) -> Cost:
    f = model.facts
    n, n_pos = n_rows(task, config, FULL, QUICK), task_length(task, model)
    folds = config.cv or (3 if config.quick else 5)
    grid = {False: 1, "coarse": 4, True: 7}[config.grid()]
    samples = n * n_pos
    flops = f.n_layers * folds * grid * 2 * ITERATIONS * 4.0 * samples * f.d_model * CLASSES
    return Cost(parts={"features": n, "fits": flops / flops_per_row(model, n_pos)}, n_pos=n_pos)


def fewer_folds(config, model):
    return dataclasses.replace(config, cv=3) if (config.cv or (3 if config.quick else 5)) > 3 else None


def no_capacity_sweep(config, model):
    return dataclasses.replace(config, capacity=False) if config.capacity else None


COST = CostModel(estimate=estimate, knobs=(fewer_folds, no_capacity_sweep, examples_knob(FULL, QUICK)))
