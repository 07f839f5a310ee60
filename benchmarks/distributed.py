"""Benchmark of data parallelism: the same sweeps with 1 process and with 2 (torchrun, gloo on CPU).

Sweeps on the zoo model: single-head zero-ablation importance (every head, --n-heads examples of
the kv task) and exact activation patching (resid_pre, attn_out, mlp_out, head_out on
--n-patching examples of the ioi task). Each configuration runs as its own torchrun job:
1 process x 1 thread, 2 processes x 1 thread, and 1 process x 2 threads (what one process gets
from the same 2 cores). Prints per configuration the wall time of the whole job (start-up and
model loading included), the in-sweep time measured inside the ranks (after a barrier, the
slowest rank), the peak resident memory per rank, the ratio to 1 x 1, and the largest
difference of the results from the 1 x 1 run.

    python benchmarks/distributed.py [--n-heads 256] [--n-patching 64] [--nproc 2]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def worker(args: argparse.Namespace) -> None:
    """One rank: load, sweep, gather timings, rank 0 writes the JSON."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import load

    from headscope.analyses.core import tasks
    from headscope.analyses.heads.importance import ablation_importance
    from headscope.analyses.patching.analysis import activation_patching
    from headscope.execution import distributed

    distributed.init_from_env("cpu")
    model, label = load(args.model, device="cpu")
    kv = tasks.zoo(model, "kv", n_examples=args.n_heads, seed=0)
    ioi = tasks.zoo(model, "ioi", n_examples=args.n_patching, seed=0)
    sweeps = {
        "heads (zero ablation)": lambda: ablation_importance(model, kv, method="zero").importance.flatten().tolist(),
        "patching (4 site types)": lambda: activation_patching(
            model, ioi, ("resid_pre", "attn_out", "mlp_out", "head_out"), progress=False).df["value"].tolist(),
    }
    out = {"model": label, "world": distributed.world_size(), "threads": torch.get_num_threads(), "sweeps": {}}
    for name, fn in sweeps.items():
        distributed.barrier()
        t0 = time.perf_counter()
        values = fn()
        seconds = max(distributed.gather_objects(time.perf_counter() - t0))
        out["sweeps"][name] = {"seconds": seconds, "values": values}
    rss = distributed.gather_objects(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # MiB
    out["peak_rss_mib"] = rss
    if distributed.is_main():
        Path(args.json).write_text(json.dumps(out))
    distributed.shutdown()


def launch(args: argparse.Namespace, nproc: int, threads: int, folder: Path) -> tuple[float, dict]:
    path = folder / f"{nproc}x{threads}.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", __file__,
           "--worker", "--json", str(path), "--n-heads", str(args.n_heads), "--n-patching", str(args.n_patching)]
    if args.model:
        cmd += ["--model", args.model]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-heads", type=int, default=256)
    parser.add_argument("--n-patching", type=int, default=64)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    folder = Path(tempfile.mkdtemp())
    load_before = os.getloadavg()[0]  # other jobs on the same cores skew every ratio
    configs = [(1, 1), (args.nproc, 1), (1, args.nproc)]
    runs = {c: launch(args, *c, folder) for c in configs}
    _, base = runs[(1, 1)]
    print(f"model: {base['model']}; {os.cpu_count()} CPUs visible; load average before the runs {load_before:.2f}; "
          f"torch {torch.__version__}; gloo on CPU")
    print(f"{'processes x threads':<20} {'sweep':<26} {'in-sweep s':>10} {'speed-up':>12} {'max |diff|':>10}")
    for (nproc, threads), (wall, res) in runs.items():
        for name, sweep in res["sweeps"].items():
            ref = base["sweeps"][name]
            diff = max(abs(a - b) for a, b in zip(sweep["values"], ref["values"]))
            print(f"{f'{nproc} x {threads}':<20} {name:<26} {sweep['seconds']:>10.2f} "
                  f"{ref['seconds'] / sweep['seconds']:>11.2f}x {diff:>10.1e}")
        print(f"{f'{nproc} x {threads}':<20} {'whole job (wall)':<26} {wall:>10.2f} {runs[(1, 1)][0] / wall:>11.2f}x"
              f"   peak RSS per rank: {', '.join(f'{m:.0f} MiB' for m in res['peak_rss_mib'])}")


if __name__ == "__main__":
    main()
