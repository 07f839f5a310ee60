"""What the probes analysis costs (analyses/core/budget.py), and its sweeps in the order they give way.

One captured pass over n examples gives every layer's features (n row passes). The scikit-learn
fits dominate: per layer, per fold (cv) and per regularisation strength (7, 4 when quick, 1
without the capacity sweep), for the labels and their control task, a logistic regression on
d_model features of the samples the labels give (every real token for all-position labels, one
per prompt otherwise; counted on the data `run` will probe). An L-BFGS iteration takes about
a + b x samples x features x classes seconds, a and b from two small fits timed on this machine
(`Cost.extra_s`: scikit-learn runs far below a forward pass's flop rate); a fit is counted as
ITERATIONS iterations' data term and MIN_ITERATIONS iterations' fixed part. Knobs, in order: 3
folds, one strength (no capacity sweep), the examples.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from headscope.analyses.core.budget import Cost, CostModel, examples_knob, n_rows, task_length

log = logging.getLogger(__name__)

FULL, QUICK = 256, 64
# A fit counted as ITERATIONS iterations' data term (b x samples x features x classes) plus
# MIN_ITERATIONS iterations' fixed part (a): on GPT-2 small's default data (6 classes) a fit took
# about 200 x b x samples x features x classes, from 80 to 630 training samples (smaller data
# converges in fewer iterations, each one costing more than a timed random-data iteration of its
# size); in benchmarks/report_budget.py's runs the estimate came out 1-3x the time taken (the two
# timed fits vary with the machine's load). CLASSES: counted when the labels cannot be read beforehand.
ITERATIONS, MIN_ITERATIONS, CLASSES = 200, 10, 10
_ITERATION: list[tuple[float, float]] = []  # (a, b), timed once per process


def iteration_seconds() -> tuple[float, float]:
    """(a, b): one L-BFGS iteration of the probes' logistic regression takes about a + b x samples x
    features x classes seconds here, from two timed fits of 5 iterations (256 x 64 and 2,048 x 512
    samples x features, 10 classes, after a warm-up fit), once per process."""
    if not _ITERATION:
        import warnings

        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression

        rng = np.random.default_rng(0)
        per_iteration = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            for n, d, iters in ((64, 16, 2), (256, 64, 5), (2048, 512, 5)):  # the first: a warm-up
                x, y = rng.standard_normal((n, d)), np.arange(n) % CLASSES
                start = time.perf_counter()
                lr = LogisticRegression(max_iter=iters, tol=0.0).fit(x, y)
                per_iteration.append(((time.perf_counter() - start) / max(1, int(lr.n_iter_.max())), n * d * CLASSES))
        (t_small, s_small), (t_large, s_large) = per_iteration[1:]
        b = max(0.0, (t_large - t_small) / (s_large - s_small))
        _ITERATION.append((max(0.0, t_small - b * s_small), b))
    return _ITERATION[0]


_DATA: dict[tuple, tuple[int, int, int | None]] = {}  # the last few tasks' (samples, classes, length)


def _data(model, task, config) -> tuple[int, int, int | None]:
    """(samples, classes, prompt length) of the data `run` will probe, read once per model, task,
    example count and labels (`fit` asks at every knob step); the upper bound n x P samples and
    CLASSES classes (length None) where the labels cannot be read beforehand."""
    from headscope.analyses.probes.analysis import probe_data, task_labels

    tokens = getattr(task, "tokens", None)  # a Task; else None, a zoo task's name or a file
    ident = (id(task), tuple(tokens.shape)) if tokens is not None else None if task is None else str(task)
    key = (id(model), ident, config.examples(FULL, QUICK), config.seed, config.labels)
    if key in _DATA:
        return _DATA[key]
    try:
        data, labels = probe_data(model, task, config)
        found = task_labels(data, labels, tokenizer=model.tokenizer)
    except Exception as err:  # noqa: BLE001 - the analysis reports its own errors; the estimate stays an upper bound
        log.debug("probes estimate without the labels (%s: %s)", type(err).__name__, err)
        return n_rows(task, config, FULL, QUICK) * task_length(task, model), CLASSES, None
    classes = len(np.unique(found.labels)) if found.kind == "classification" else 1
    if len(_DATA) >= 8:
        _DATA.pop(next(iter(_DATA)))
    _DATA[key] = (len(found.labels), max(2, classes), int(data.tokens.shape[1]))
    return _DATA[key]


def estimate(model, task, config) -> Cost:
    f = model.facts
    n = n_rows(task, config, FULL, QUICK)
    folds = config.cv or (3 if config.quick else 5)
    grid = {False: 1, "coarse": 4, True: 7}[config.grid()]
    fits = f.n_layers * folds * grid * 2  # labels and control task
    samples, classes, length = _data(model, task, config)
    a, b = iteration_seconds()
    train = samples * (folds - 1) / folds  # each fit's training split
    per_fit = ITERATIONS * b * train * f.d_model * classes + MIN_ITERATIONS * a
    return Cost(parts={"features": n}, n_pos=length or task_length(task, model), extra_s=fits * per_fit)


def fewer_folds(config, model):
    return dataclasses.replace(config, cv=3) if (config.cv or (3 if config.quick else 5)) > 3 else None


def no_capacity_sweep(config, model):
    return dataclasses.replace(config, capacity=False) if config.capacity else None


COST = CostModel(estimate=estimate, knobs=(fewer_folds, no_capacity_sweep, examples_knob(FULL, QUICK)))
