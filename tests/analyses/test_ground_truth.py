"""The ground-truth scoring of benchmarks/ground_truth.py (AUROC, precision at the circuit's size)
against hand-computed cases, and the Tracr task and exact patching on the shipped reverse program."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

import headscope as hs
from headscope.analyses.core.tracr_tasks import tracr_task


@pytest.fixture(scope="module")
def gt():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "ground_truth.py"
    spec = importlib.util.spec_from_file_location("ground_truth_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_auroc_and_precision_by_hand(gt):
    # positives 3 and 2, negatives 1 and 2: pairs won 1 + 1 + 1 + 1/2 (the tie) of 4
    assert gt.auroc([3, 1, 2, 2], [1, 0, 1, 0]) == 0.875
    assert gt.auroc([1, 2, 3], [1, 1, 0]) == 0.0 and gt.auroc([5, 4, 1], [1, 1, 0]) == 1.0
    assert math.isnan(gt.auroc([1, 2], [1, 1]))
    # top 2 of [3, 2, 2, 1]: the 3 (a hit), then one of the tied 2s (one hit, one miss): 1.5 / 2
    assert gt.precision_at_k([3, 2, 2, 1], [1, 0, 1, 0]) == 0.75
    assert gt.precision_at_k([3, 2, 2, 1], [1, 0, 1, 0], k=1) == 1.0
    # |score| ranks; a rounding-sized magnitude ties at zero: a beats b and d, c ties b, loses to d
    auc, prec = gt.score_set({"a": -2.0, "b": 1e-9, "c": 0.0, "d": 0.5}, {"a", "c"})
    assert (auc, prec) == (2.5 / 4, 0.5)


def test_reverse_task_and_exact_patching_find_the_reading_head(gt):
    model = hs.load_model("tracr/reverse", device="cpu")
    task = tracr_task(model, 8, seed=1)
    bos = model.tokenizer.bos_token_id
    words = model.tokenizer.convert_ids_to_tokens
    for row, bad, a, w in zip(task.tokens.tolist(), task.corrupted_tokens.tolist(), task.answers.tolist(),
                              task.wrong_answers.tolist()):
        assert row[0] == bos and sum(x != y for x, y in zip(row, bad)) == 1
        assert words(a) == words(row[1]) and words(w) == words(bad[1]) and a != w  # reverse(x)[-1] = x[0]
    patch = hs.activation_patching(model, task, sites=("head_out",)).df.set_index("layer").effect
    # a3.h0 reads x[0] into the output; a1.h0 and a2.h0 are Tracr's empty heads; a0.h0 counts the
    # length, which one changed token leaves unchanged: no patching effect
    assert patch[3] > 1.9 and patch.drop(3).abs().max() < 1e-5
    nodes = {f"a{l}.h0": v for l, v in patch.items()}
    truth = {"a0.h0", "a3.h0"}  # tracr.json's heads
    assert set(n for n in hs.models.tracr.metadata(model.source)["truth"]["nodes"] if n.startswith("a")) == truth
    # a3 beats a1 and a2, a0 ties them: 3 of 4 pairs; the top 2: a3, then one of the three tied at 0
    assert gt.score_set(nodes, truth) == (0.75, (1 + 1 / 3) / 2)


def test_a_tracr_model_defaults_to_its_program_task():
    from headscope.analyses.circuits import CircuitsConfig, run

    model = hs.load_model("tracr/induction", device="cpu")
    result = run(model, None, CircuitsConfig.preset(quick=True))
    s = result.summary
    assert s["task"] == "tracr-induction" and s["edge_method"] == "eap-clean"
    assert s["edge_metric_clean"] > 0.99 and s["edge_metric_corrupt"] < -0.99  # one-hot outputs: +1 and -1
    assert s["mib_faithfulness"]["1"] == 1.0 and 0.0 <= s["mib_cpr"] <= 0.999 + 1e-9
