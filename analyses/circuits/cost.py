"""What the circuits analysis costs (analyses/core/budget.py), and its sweeps in the order they give way.

Row passes, for n examples: logit lens and DLA one captured pass each (2n), and every block's input
read through the unembedding at every position (counted as the row passes of three times as many
flops: the log-softmax and rank read those logits again); with edges (a task
with corrupted prompts): EAP-IG 3 ig_steps n + 2n, faithfulness n per circuit size (k_values;
about 10 by default) plus about 3n for MIB's curve (12 top-k circuits).
"""
from __future__ import annotations

import dataclasses

from headscope.analyses.core.budget import Cost, CostModel, examples_knob, flops_per_row, n_rows, task_length

FULL, QUICK = 64, 8


def estimate(model, task, config) -> Cost:
    f = model.facts
    n, n_pos = n_rows(task, config, FULL, QUICK), task_length(task, model)
    read = n_pos if config.lens_positions == "all" else 1  # positions the lens reads
    # every block's input unembedded, counted three times: the log-softmax, the rank and the gathers
    # read the [L + 1, rows, positions, vocabulary] logits again (memory-bound at a large vocabulary)
    unembed = 3 * (f.n_layers + 1) * n * read * 2.0 * f.d_model * f.d_vocab
    parts = {"lens_dla": 2 * n + unembed / flops_per_row(model, n_pos)}
    if config.edges and (task is None or getattr(task, "corrupted_tokens", None) is not None):
        steps = config.ig_steps if config.edge_method == "eap-ig" else 1
        parts["edges"] = 3 * steps * n + 2 * n
        # the sweep's sizes, plus MIB's 10 top-k circuits and the empty and full one (about 3 sizes' worth)
        parts["faithfulness"] = n * ((len(config.k_values) if config.k_values else 10) + 3)
    return Cost(parts=parts, n_pos=n_pos)


def plain_eap(config, model):
    """EAP-IG gives way to one-step EAP, the clean-run (papers') convention."""
    if config.edge_method == "eap-ig" and config.ig_steps > 1:
        return dataclasses.replace(config, edge_method="eap-clean", ig_steps=1)
    return None


COST = CostModel(estimate=estimate, knobs=(plain_eap, examples_knob(FULL, QUICK)))
