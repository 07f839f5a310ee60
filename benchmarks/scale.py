"""Growth table: time and peak memory of every analysis as model size, sequence length and number
of examples grow, with the fitted growth exponent in each.

Three sweeps, one variable at a time around a base point (not a grid):
- model: zoo/synth-llama, the GPT-2-small shape and a Llama-3.2-1B-width shape with few layers
  (benchmarks/_scale_models.py: random weights, a byte-level BPE trained here), at the base length
  and examples; the variable fitted is the parameter count;
- length: prompts of 128 .. 1024 tokens (2048 and 4096 too for forward, position and kv) on the
  sweep model (GPT-2-small shape; --quick: its width with 2 layers, 128 .. 512, and 1024, 2048), base examples;
- examples: 8 .. 256 prompts of the base length on the sweep model (--quick: 8 .. 64).
Every analysis runs at its quick preset (`Config.preset(quick=True)`) through the registry
(`get_analysis(name)(model, task, config)`, chance guard included) on an induction-style copy task
of exactly that length and size (_scale_models.copy_task; zoo-free, so every model takes it);
position builds its own prompts, sized to the length (_scale_models.position_config); "forward" is
one plain forward pass of the task's prompts.

One measurement = one fresh subprocess: it loads the model, builds the task, resets the kernel's RSS
high-water mark (/proc/self/clear_refs) and runs the analysis once (--repeats: the median of more).
time: wall seconds of the run; mem: peak RSS during the run minus the RSS before it (MB), i.e. what
the analysis adds at its peak on top of the loaded model (the JSON lines also give the loaded RSS).
A cell past --timeout (the child's whole wall time, its 5-20 s of imports and model loading included)
prints ">T s", is left out of the fit, and the larger values of that variable are skipped for that
analysis ("skip"). Position's length is its longest prompt: Liu et al.'s UUID prompts need about 250
tokens for their 2 pairs, so its cells of 128 tokens use that. The exponent is the least-squares slope of log(time) and of
log(mem) against log(variable) over the finished cells.

Threads: every child runs with --threads torch threads (default 1: HEADSCOPE_THREADS, OMP_NUM_THREADS
and torch.set_num_threads), since the machine is shared and one thread gives steadier timings.

    python benchmarks/scale.py [--quick] [--analyses heads,kv,...] [--timeout S] [--threads N]
        [--repeats R] [--vocab tokenizer|real] [--device cpu] [--json FILE] [--sweeps model,length,examples]
        [--models zoo,gpt2-small,...] [--sweep-model M] [--lengths 128,256] [--long-lengths 2048] [--examples 8,32]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ANALYSES = ("forward", "heads", "attribution", "patching", "position", "mlp", "kv", "probes", "circuits")
LONG = ("forward", "position", "kv")  # the analyses also swept at 2048 and 4096 tokens


@dataclass(frozen=True)
class Plan:
    """The sweeps: models at (base_length, base_examples); lengths and examples on sweep_model."""

    models: tuple[str, ...]
    sweep_model: str
    base_length: int
    base_examples: int
    lengths: tuple[int, ...]
    long_lengths: tuple[int, ...]
    examples: tuple[int, ...]
    timeout: float


FULL = Plan(models=("zoo", "gpt2-small-2l", "gpt2-small", "llama-1b-width-2l", "llama-1b-width"),
            sweep_model="gpt2-small", base_length=128, base_examples=8, lengths=(128, 256, 512, 1024),
            long_lengths=(2048, 4096), examples=(8, 32, 128, 256), timeout=1800)
# Quick: the length and examples sweeps on GPT-2-small's width with 2 of its 12 layers (a sixth of the
# per-token cost), shorter ranges, and a short timeout; the model sweep keeps the full-depth shapes.
QUICK = Plan(models=("zoo", "gpt2-small-2l", "gpt2-small", "llama-1b-width-2l"), sweep_model="gpt2-small-2l",
             base_length=128, base_examples=8, lengths=(128, 256, 512), long_lengths=(1024, 2048),
             examples=(8, 32, 64), timeout=60)


# ---- the child: one measurement ------------------------------------------------------------
def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child(cell: dict) -> dict:
    """Load the model, build the input, run `cell["analysis"]` `repeats` times; time and peak memory."""
    import resource

    import torch

    torch.set_num_threads(cell["threads"])
    import _scale_models as sm

    import headscope as hs
    from headscope.analyses.core.registry import config_class, get_analysis

    model = hs.load_model(cell["model"], device=cell["device"])
    name, length, n = cell["analysis"], cell["length"], cell["examples"]
    out = {"n_params": sum(p.numel() for p in model.bridge.original_model.parameters()),
           "n_heads": model.facts.n_layers * model.facts.n_heads, "threads": torch.get_num_threads()}
    if name == "position":
        config, out["input"], out["length_actual"] = sm.position_config(model, length, n)
        task = None
    else:
        task = sm.copy_task(model, length, n)
        config = None if name == "forward" else config_class(name).preset(quick=True)
        out["input"] = f"copy task {n} x {length}"
        if name == "attribution":  # a random Llama's one special token (pad = bos = eos) has HF's zero pad embedding
            from headscope.analyses.attribution.inputs import default_baseline_token
            from headscope.errors import ConfigError
            try:
                default_baseline_token(model)
            except ConfigError:
                token = model.tokenizer.encode(" the", add_special_tokens=False)[0]
                config = replace(config, baseline_token=token)
                out["input"] += f", IG baseline token {token} (' the')"
    with torch.no_grad():  # page in the weights (safetensors are memory-mapped) and warm the kernels up
        for p in model.bridge.original_model.parameters():
            p.sum()
        model(torch.tensor([[model.tokenizer.bos_token_id or 0] * 8]))  # a tiny input: the allocator keeps little
    if name == "forward":
        def run():
            with torch.no_grad():
                return model(task.tokens)
    else:
        analysis = get_analysis(name)
        run = lambda: analysis(model, task, config)  # noqa: E731
    out["rss_loaded_mb"] = _status_kb("VmRSS") / 1024
    times = []
    for _ in range(cell["repeats"]):
        before = _status_kb("VmRSS")
        exact = _reset_peak()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        peak = _status_kb("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["mem_mb"] = max(out.get("mem_mb", 0.0), (peak - before) / 1024)
    out["time_s"] = statistics.median(times)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["peak_exact"] = exact
    return out


# ---- the parent: cells, fits, tables --------------------------------------------------------
def measure(cell: dict, timeout: float) -> dict:
    """Run one cell in a fresh process; its result, or {"timeout": True} / {"error": ...}."""
    threads = str(cell["threads"])
    env = {**os.environ, "HEADSCOPE_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cell)],
                              env=env, capture_output=True, text=True, timeout=timeout, cwd=HERE)
    except subprocess.TimeoutExpired:
        return {**cell, "timeout": True, "wall_s": time.perf_counter() - t0}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {**cell, "error": err[:200], "wall_s": time.perf_counter() - t0}
    return {**cell, **json.loads(lines[-1]), "wall_s": time.perf_counter() - t0}


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x); None under two distinct x."""
    pts = [(math.log(x), math.log(max(y, 1e-3))) for x, y in zip(xs, ys)]
    if len({p[0] for p in pts}) < 2:
        return None
    return float(np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)[0])


def cell_text(r: dict | None, timeout: float) -> str:
    if r is None:
        return "–"
    if r.get("skipped"):
        return "skip"
    if r.get("timeout"):
        return f">{timeout:.0f} s"
    if "error" in r:
        return "error"
    return f"{r['time_s']:.2g} s / {r['mem_mb']:.0f} MB" if r["time_s"] < 10 else f"{r['time_s']:.0f} s / {r['mem_mb']:.0f} MB"


def fmt_exp(e: float | None) -> str:
    return "–" if e is None else f"{e:.2f}"


def table(title: str, variable: str, columns: list[str], rows: dict[str, list[dict | None]], xs_of, timeout: float) -> list[str]:
    """A markdown table: one row per analysis, one column per swept value, the two exponents last."""
    lines = [f"\n**{title}** (time / added peak memory; exponents: slope of log time and log memory on log {variable})\n",
             "| analysis | " + " | ".join(columns) + " | time exp. | mem exp. |",
             "|---" * (len(columns) + 3) + "|"]
    for name, cells in rows.items():
        done = [r for r in cells if r is not None and "time_s" in r]
        xs = [xs_of(r) for r in done]
        e_t = slope(xs, [r["time_s"] for r in done])
        e_m = slope(xs, [r["mem_mb"] for r in done])
        lines.append(f"| {name} | " + " | ".join(cell_text(r, timeout) for r in cells) + f" | {fmt_exp(e_t)} | {fmt_exp(e_m)} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the reduced sweep (about 15-25 min on 2 busy cores)")
    p.add_argument("--analyses", default=",".join(ANALYSES), help=f"comma-separated, from {','.join(ANALYSES)}")
    p.add_argument("--sweeps", default="model,length,examples", help="which sweeps to run")
    p.add_argument("--sweep-model", default=None, help="model of the length and examples sweeps (default: the plan's)")
    p.add_argument("--models", default=None, help="comma-separated models of the model sweep (default: the plan's)")
    p.add_argument("--lengths", default=None, help="comma-separated lengths for every analysis (default: the plan's)")
    p.add_argument("--long-lengths", default=None, help=f"comma-separated further lengths for {', '.join(LONG)} only")
    p.add_argument("--examples", default=None, help="comma-separated example counts (default: the plan's)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per cell (default: 90 quick, 1800 full)")
    p.add_argument("--threads", type=int, default=1, help="torch threads in every child (default 1)")
    p.add_argument("--device", default="cpu", help="device of every child's model (default cpu)")
    p.add_argument("--repeats", type=int, default=1, help="runs per cell, median reported")
    p.add_argument("--vocab", choices=("tokenizer", "real"), default="tokenizer",
                   help="random models' vocabulary: the BPE's 4,096 tokens, or padded to GPT-2's / Llama 3's size")
    p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "headscope-scale"),
                   help="folder of the built checkpoints (kept between runs)")
    p.add_argument("--json", default=None, help="also write every cell's result as JSON lines here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    sys.stdout.reconfigure(line_buffering=True)
    sys.path.insert(0, str(HERE))
    import _scale_models as sm

    plan = QUICK if args.quick else FULL
    ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
    if args.models:
        plan = replace(plan, models=tuple(args.models.split(",")))
    if args.sweep_model:
        plan = replace(plan, sweep_model=args.sweep_model)
    if args.lengths:
        plan = replace(plan, lengths=ints(args.lengths), long_lengths=ints(args.long_lengths) if args.long_lengths else ())
    elif args.long_lengths:
        plan = replace(plan, long_lengths=ints(args.long_lengths))
    if args.examples:
        plan = replace(plan, examples=ints(args.examples))
    timeout = args.timeout or plan.timeout
    names = [a.strip() for a in args.analyses.split(",") if a.strip()]
    unknown = set(names) - set(ANALYSES)
    if unknown:
        p.error(f"unknown analyses {sorted(unknown)}; choose from {ANALYSES}")
    sweeps = set(args.sweeps.split(","))
    cache = Path(args.cache)
    specs = {m: sm.checkpoint(m, cache, args.vocab) for m in (*plan.models, plan.sweep_model)}
    print(f"plan: {plan}; timeout {timeout:.0f} s; {args.threads} thread(s) per child; vocab {args.vocab}; "
          f"checkpoints under {cache}")
    print(f"load: {os.getloadavg()}")
    log = open(args.json, "a") if args.json else None  # noqa: SIM115
    done: dict[tuple, dict] = {}
    timed_out: set[tuple] = set()  # (analysis, variable) pairs past the timeout: larger values skipped

    def get(name: str, model: str, length: int, n: int, variable: str) -> dict:
        key = (name, model, length, n)
        if key in done:
            if done[key].get("timeout"):
                timed_out.add((name, variable))
            return done[key]
        if (name, variable) in timed_out:
            return {"skipped": True}
        cell = {"analysis": name, "model": specs[model], "length": length, "examples": n,
                "threads": args.threads, "repeats": args.repeats, "device": args.device}
        r = {**measure(cell, timeout), "model_name": model, "load": os.getloadavg()[0]}
        done[key] = r
        if r.get("timeout"):
            timed_out.add((name, variable))
        status = ("timeout" if r.get("timeout") else r.get("error") or
                  f"{r['time_s']:.2f} s, +{r['mem_mb']:.0f} MB (loaded {r['rss_loaded_mb']:.0f} MB)")
        print(f"  {name:11s} {model:18s} L={length:<5d} N={n:<4d} {status}  [wall {r['wall_s']:.0f} s, load {r['load']:.2f}]")
        if log:
            log.write(json.dumps(r) + "\n")
            log.flush()
        return r

    out: list[str] = []
    t_start = time.perf_counter()
    if "model" in sweeps:
        rows = {n: [get(n, m, plan.base_length, plan.base_examples, "model") for m in plan.models] for n in names}
        params = {m: next((r["n_params"] for rs in rows.values() for r in rs if "n_params" in r and r["model_name"] == m), None)
                  for m in plan.models}
        cols = [f"{m} ({params[m] / 1e6:.1f}M)" if params[m] else m for m in plan.models]
        out += table(f"Model size ({plan.base_examples} examples x {plan.base_length} tokens)", "parameters",
                     cols, rows, lambda r: r["n_params"], timeout)
    if "length" in sweeps:
        lengths = (*plan.lengths, *plan.long_lengths)
        rows = {n: [get(n, plan.sweep_model, L, plan.base_examples, "length") if n in LONG or L in plan.lengths else None
                    for L in lengths] for n in names}
        out += table(f"Sequence length ({plan.sweep_model}, {plan.base_examples} examples)", "length",
                     [f"L={L}" for L in lengths], rows, lambda r: r.get("length_actual", r["length"]), timeout)
    if "examples" in sweeps:
        rows = {n: [get(n, plan.sweep_model, plan.base_length, k, "examples") for k in plan.examples] for n in names}
        out += table(f"Examples ({plan.sweep_model}, {plan.base_length} tokens)", "examples",
                     [f"N={k}" for k in plan.examples], rows, lambda r: r["examples"], timeout)
    print("\n".join(out))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; load now {os.getloadavg()}")
    if log:
        log.close()


if __name__ == "__main__":
    main()
