"""Thread count under load: torch's default against headscope's rule (models/threads.py).

Times one workload (gradient and zero-ablation head importance on the zoo model's kv task) in
fresh processes: idle with torch's default threads, then beside a busy job (one process
spinning on one core) with torch's default and with the rule's count. Prints each time and the
loaded/idle ratios; the rule should keep the loaded slowdown near what the lost core costs.

    python benchmarks/threads.py [--repeats 3] [--examples 32]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

WORK = """
import os, time, torch
import headscope as hs
from headscope.analyses.heads import importance as hi
threads = os.environ.get("BENCH_THREADS")
if threads:
    torch.set_num_threads(int(threads))
model = hs.load_model()
task = hs.tasks.zoo(model, "kv", n_examples=int(os.environ["BENCH_EXAMPLES"]), seed=0)
hi.gradient_importance(model, task); hi.ablation_importance(model, task, method="zero")  # warm-up
best = float("inf")
for _ in range(int(os.environ["BENCH_REPEATS"])):
    t = time.perf_counter()
    hi.gradient_importance(model, task); hi.ablation_importance(model, task, method="zero")
    best = min(best, time.perf_counter() - t)
print(torch.get_num_threads(), best)
"""


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _run(threads: int | None, args) -> tuple[int, float]:
    env = {**os.environ, "BENCH_EXAMPLES": str(args.examples), "BENCH_REPEATS": str(args.repeats),
           "HEADSCOPE_THREADS": "keep"}
    env.pop("OMP_NUM_THREADS", None)
    if threads:
        env["BENCH_THREADS"] = str(threads)
    out = subprocess.run([sys.executable, "-c", WORK], env=env, capture_output=True, text=True, check=True)
    n, secs = out.stdout.split()[-2:]
    return int(n), float(secs)


def main() -> None:
    from headscope.models.threads import choose_threads, machine_facts

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--examples", type=int, default=32)
    args = p.parse_args()
    n_default, idle = _run(None, args)
    stop = mp.Event()
    spinner = mp.Process(target=_spin, args=(stop,), daemon=True)
    spinner.start()
    time.sleep(45)  # the 1-minute load average reaches 0.5 of the busy job after about 42 s
    facts = machine_facts()
    chosen = choose_threads(**facts)
    try:
        _, loaded_default = _run(None, args)
        _, loaded_rule = _run(chosen, args)
    finally:
        stop.set()
        spinner.join()
    print(f"machine: {facts}; torch default {n_default} threads; the rule picks {chosen} under load")
    print(f"idle, default threads:      {idle:7.2f} s")
    print(f"loaded, default threads:    {loaded_default:7.2f} s  ({loaded_default / idle:.2f}x idle)")
    print(f"loaded, the rule's threads: {loaded_rule:7.2f} s  ({loaded_rule / idle:.2f}x idle)")


if __name__ == "__main__":
    main()
