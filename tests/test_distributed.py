"""Data parallelism: the sharding helpers, device_map pass-through, and a real 2-process torchrun
(gloo, CPU) of `headscope report --analyses heads,patching` on the zoo model, compared file by
file with a single-process run of the same command (main() in the test's process)."""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import headscope as hs
from headscope.execution import distributed
from tests_support import random_tokens

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["report", "--quick", "--analyses", "heads,patching", "--n-examples", "8", "-q", "--out", "out"]
ATOL = 1e-5
# Forward passes over 4 instead of 8 examples round differently in float32 (~1e-7 relative).
# Two outputs amplify that: importance divided by its layer's norm, and the L0 gates, whose
# Adam steps divide by the root of the squared gradients; they are held to 1e-4.
LOOSER = {"importance_layer_norm": 1e-4, "l0.csv": 1e-4, "l0_gates.csv": 1e-4}


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_blocks_cover_every_index_once_in_rank_order(world):
    for n in range(13):
        blocks = [distributed.block(n, r, world) for r in range(world)]
        assert [i for b in blocks for i in b] == list(range(n))
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def test_without_a_process_group_every_helper_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.init_from_env() is False
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
    assert distributed.shard(7) == range(7)
    t = torch.tensor([1.5, -2.0], dtype=torch.float32)
    assert distributed.all_reduce_sum(t) is t
    assert distributed.gather_objects({"a": 1}) == [{"a": 1}]
    assert distributed.broadcast_object("x") == "x"
    assert distributed.map_sharded(lambda x: x * x, [1, 2, 3]) == [1, 4, 9]
    distributed.barrier()
    distributed.shutdown()


def test_device_map_auto_passes_through_to_hugging_face(tiny_dirs):
    pytest.importorskip("accelerate")
    tokens = random_tokens(3, 6, seed=1)
    plain = hs.load_model(tiny_dirs["llama"], device="cpu")
    mapped = hs.load_model(tiny_dirs["llama"], device_map="auto")
    assert mapped.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with torch.no_grad():
        torch.testing.assert_close(mapped(tokens).cpu(), plain(tokens), atol=1e-5, rtol=1e-5)


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(single-process OUT, 2-process OUT, the other rank's working folder) of the same command."""
    root = tmp_path_factory.mktemp("distributed")
    (root / "single").mkdir()
    (root / "rank0").mkdir()
    (root / "others").mkdir()
    # The single-process reference runs the same command in this process (main(), in its own folder, as
    # `python -m headscope` would there), sparing a fresh interpreter's imports; the ranks run in their own.
    # It draws no figures (Result.plot returns none): only its CSVs and summaries are compared; rank 0 draws its own.
    from headscope.analyses.core.result import Result
    from headscope.cli import main

    with contextlib.chdir(root / "single"), warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore")
        patch.setattr(Result, "plot", lambda self, **kwargs: {})
        assert main(list(ARGS)) == 0
    multi = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(ROOT / "tests" / "distributed_cli.py"), str(root / "rank0"), str(root / "others"), *ARGS],
        cwd=root, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert multi.returncode == 0, multi.stderr[-3000:]
    return root / "single" / "out", root / "rank0" / "out", root / "others"


def _close(a, b, path: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, str):
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= ATOL, (path, a, b)
    else:
        assert a == b, (path, a, b)


@pytest.mark.parametrize("analysis", ["heads", "patching"])
def test_two_ranks_equal_one_process(runs, analysis):
    single, multi, _ = runs
    files = sorted(p.name for p in (single / analysis).glob("*.csv"))
    assert "results.csv" in files and files == sorted(p.name for p in (multi / analysis).glob("*.csv"))
    for name in files:
        a, b = pd.read_csv(single / analysis / name), pd.read_csv(multi / analysis / name)
        assert list(a.columns) == list(b.columns) and a.shape == b.shape, name
        for col in a.columns:
            if pd.api.types.is_numeric_dtype(a[col]) and pd.api.types.is_numeric_dtype(b[col]):
                np.testing.assert_allclose(b[col].to_numpy(float), a[col].to_numpy(float), rtol=0,
                                           atol=LOOSER.get(name, LOOSER.get(col, ATOL)), err_msg=f"{analysis}/{name}:{col}")
            else:
                assert a[col].fillna("").astype(str).tolist() == b[col].fillna("").astype(str).tolist(), (name, col)
    _close(json.loads((single / analysis / "summary.json").read_text()),
           json.loads((multi / analysis / "summary.json").read_text()), analysis)


def test_only_rank_zero_writes(runs):
    single, multi, others = runs
    assert (multi / "report.html").exists() and (multi / "manifest.json").exists()
    assert list((multi / "heads").glob("*.png")) and not list(single.glob("*/*.png"))  # rank 0 drew; the reference not
    status = json.loads((multi / "manifest.json").read_text())["status"]
    assert status == {"heads": "done", "patching": "done"}
    assert list(others.iterdir()) == []
