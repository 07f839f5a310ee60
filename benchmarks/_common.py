"""Helpers shared by the benchmark scripts: the benchmark model and a median timer."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import headscope as hs


def load(spec: str | None, device: str | None = None):
    """(model, description): `spec`, else the shipped zoo/synth-llama, else a random model of its recipe."""
    from headscope.models.zoo import registry

    if spec:
        return hs.load_model(spec, device=device), spec
    if "synth-llama" in registry.available():
        return hs.load_model("zoo/synth-llama", device=device), "zoo/synth-llama (trained)"
    from headscope.models.zoo import recipes, train, vocab

    out = Path(tempfile.mkdtemp()) / "synth-llama-random"
    train.build_model(recipes.RECIPES["synth-llama"].model, seed=0).save_pretrained(out)
    vocab.build_tokenizer().save_pretrained(out)
    return hs.load_model(out, device=device), "synth-llama recipe, random weights (no checkpoint shipped yet)"


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median wall time of `repeats` calls after one warm-up call, and the last result."""
    fn()
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def timed_pair(baseline, ours, repeats: int) -> tuple[float, float, object, object]:
    """Median wall times of `baseline` and `ours` (see timed_alternately), and their last results."""
    (t_base, t_ours), (r_base, r_ours) = timed_alternately([baseline, ours], repeats)
    return t_base, t_ours, r_base, r_ours


def timed_alternately(fns, repeats: int) -> tuple[list[float], list[object]]:
    """Median wall times of `fns`, called in turn `repeats` times each after one warm-up call of
    each (so a shared machine's drifting speed hits them alike), and their last results."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    results: list[object] = [None] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            results[i] = fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times], results
