"""Benchmark: load_task on large task files stays flat in memory when it samples.

Writes JSONL task files of 10,000 and 100,000 rows (random prompts of 12 words of the zoo
vocabulary, a one-word answer) and times `hs.load_task(model, FILE, n_examples=64)` on the
shipped zoo model's tokenizer. Each size runs in a fresh process, so its peak resident memory
(ru_maxrss) is its own; the figures are the time and the growth of the process's peak RSS over
one call, and the peak of Python allocations during a second call (tracemalloc). For contrast it also
reports reading every row (`read_task_rows` without n_examples), whose memory grows with the file.

    python benchmarks/data.py [--rows 10000 100000] [--n-examples 64]
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path


def write_task(path: Path, rows: int, seed: int = 0) -> None:
    """rows JSON lines of 12 random zoo words and a one-word answer."""
    from headscope.models.zoo import vocab

    rng = random.Random(seed)
    words = list(vocab.KEYS + vocab.VALUES)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(rows):
            fh.write(json.dumps({"prompt": " ".join(rng.choices(words, k=12)), "answer": rng.choice(vocab.VALUES)}) + "\n")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(path: Path, n_examples: int, mode: str) -> dict:
    """One measurement in this process (called in a fresh subprocess by main)."""
    import headscope as hs
    from headscope.analyses.core.task_files import read_task_rows

    model = hs.load_model("zoo/synth-llama", device="cpu")
    warm = path.with_name("warm.jsonl")
    write_task(warm, 100, seed=1)
    hs.load_task(model, warm, n_examples=8)  # imports and first-call costs out of the figures
    read_task_rows(warm)

    def call() -> int:
        return len(hs.load_task(model, path, n_examples=n_examples)) if mode == "sample" else len(read_task_rows(path))

    before = _peak_rss_mib()
    start = time.perf_counter()
    kept = call()
    seconds = time.perf_counter() - start  # (timed without tracemalloc, which slows allocation several-fold)
    rss_growth = _peak_rss_mib() - before
    tracemalloc.start()
    call()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"seconds": seconds, "py_peak_mib": peak / 2**20, "rss_growth_mib": rss_growth, "rows_kept": kept}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--n-examples", type=int, default=64)
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="sample", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(Path(args.measure), args.n_examples, args.mode)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'rows':>8} {'file MiB':>9} {'what':<28} {'seconds':>8} {'py peak MiB':>12} {'RSS growth MiB':>15}")
        for rows in args.rows:
            path = Path(tmp) / f"task-{rows}.jsonl"
            write_task(path, rows)
            size = path.stat().st_size / 2**20
            for mode, what in (("sample", f"load_task(n_examples={args.n_examples})"), ("all", "read_task_rows (every row)")):
                out = subprocess.run([sys.executable, __file__, "--measure", str(path), "--mode", mode,
                                      "--n-examples", str(args.n_examples)], capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                figures = f"{r['seconds']:>8.2f} {r['py_peak_mib']:>12.2f} {r['rss_growth_mib']:>15.1f}"
                print(f"{rows:>8} {size:>9.1f} {what:<28} {figures}")


if __name__ == "__main__":
    main()
