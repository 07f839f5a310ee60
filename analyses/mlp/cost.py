"""What the mlp analysis costs (analyses/core/budget.py), and its sweeps in the order they give way
(the examples, then every other layer).

Row passes, for n examples: the trigger corpus (about 4n rows: the zoo's four tasks, or the
sentences) and the sub-updates of the task (n), each one captured pass; and, whatever the
examples, every value vector read through the unembedding (memories x d_model x d_vocab multiply-adds,
memories summed over the analysed layers: d_mlp each, every expert's neurons on a mixture of experts;
counted as the row passes of twice as many flops, since the top-k then reads the [memories, vocabulary]
logits again: on GPT-2 small about as much as 24 passes of 1,000 tokens).
Sub-updates project the top neurons of each example the same way (n x layers x n_top_updates x
d_model x d_vocab).
"""
from __future__ import annotations

import dataclasses

import headscope.hooks as hooks
from headscope.analyses.core.budget import Cost, CostModel, examples_knob, flops_per_row, n_rows, task_length

FULL, QUICK = 128, 16


def estimate(model, task, config) -> Cost:
    f = model.facts
    n, n_pos = n_rows(task, config, FULL, QUICK), task_length(task, model)
    per_row = flops_per_row(model, n_pos)
    layers = range(f.n_layers) if config.layers is None else config.layers
    memories = sum(hooks.n_memories(model, layer) for layer in layers)  # d_mlp each, every expert's neurons on MoE
    values = 2 * 2.0 * memories * f.d_model * f.d_vocab / per_row  # twice: top-k reads the logits again
    sub_updates = 2.0 * n * len(layers) * config.n_top_updates * f.d_model * f.d_vocab / per_row
    return Cost(parts={"triggers": 4 * n, "values": values, "sub_updates": n + sub_updates}, n_pos=n_pos)


def fewer_layers(config, model):
    """Every other analysed layer (the last one kept), down to two."""
    layers = tuple(range(model.facts.n_layers)) if config.layers is None else config.layers
    return dataclasses.replace(config, layers=layers[::-1][::2][::-1]) if len(layers) > 2 else None


COST = CostModel(estimate=estimate, knobs=(examples_knob(FULL, QUICK), fewer_layers))
