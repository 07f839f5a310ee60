"""Long context: time and peak memory of the position and kv analyses at 1k-4k-token prompts on
the GPT-2-small shape, through the hook-free blocks (no layer's attention pattern held) and,
for comparison, through the TransformerBridge (every layer's [batch, head, q, k] pattern held).

Measured, at each prompt length (default about 1,024, 2,048 and 4,096 tokens):
- position: hs.position_bias with PositionConfig(sweep="json_kv", n_items=<the most of Liu et
  al.'s UUID key-value pairs whose prompt stays within the length, and whose prompt, answer and
  greedy decoding fit the 4,096-token context>, n_examples=--examples, positions=(middle slot,)
  (--rows 2: first and last, 3: all three; rows of an example share a pass), window None (the
  StreamingLLM masked runs), n_boot 50): the teacher-forced pass with the gold and sink mass
  reduced from chunks of query rows, greedy decoding of the UUID answer, two masked passes;
- kv: hs.kv_analysis on a Task of --examples English-ish prompts of exactly that length (BOS + the
  shuffled lines of _scale_models.english_corpus, answer the next token, metric logprob) with the
  default KVConfig: K/V norms, sink statistics, heavy hitters' received attention, one prefill
  and every policy x budget (powers of two below the context, and the whole of it) decoding the
  answer token alone on the cached context.
Paths: "hook-free" (no hook attached: execution/hook_free where it applies, as here) and "bridge"
(the same call inside `model.hooks(fwd=[(site("resid_pre", 0), no-op)])`: any attached hook sends
every pass through the bridge, the old path). Each row says how many hook-free passes ran and how
many bridge passes the no-op hook saw, so the path is checked, not assumed. The bridge at 4k holds
several 800 MB [batch, 12, 4096, 4096] tensors per layer; --bridge-lengths leaves it out by default.

The checkpoint is benchmarks/_scale_models.py's "gpt2-small" (GPT2Config n_layer=12, n_head=12,
n_embd=768, n_positions=4096, random weights, its ~4k-token byte-level BPE vocabulary).

Memory: one fresh subprocess per cell (analysis x path x length), with headscope's malloc
settings (models/heap), as benchmarks/pattern_memory.py: load, warm up with the same analysis on a
short prompt (lazy initialisation, the once-per-model check of the hook-free blocks), reset the
kernel's RSS high-water mark (/proc/self/clear_refs) and run once: mem = peak RSS minus the RSS
before the run (MB); time = that run's wall time (s). exp = log(mem / mem before) / log(len / len
before) between successive lengths of one analysis and path: ~1 linear, ~2 quadratic. The
hook-free figures still hold linear terms (the KV cache, MLP activations, q/k/v, one 256-query chunk
of scores per layer, the logits at the answer positions), so their exponent is ~1, not 0.

    OMP_NUM_THREADS=1 python benchmarks/long_context.py [--lengths 1024,2048,4096]
        [--bridge-lengths 1024,2048] [--what position,kv] [--examples 1] [--rows 1] [--threads 1] [--no-grad]
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHAT = ("position", "kv")


def fit_pairs(tokenizer, length: int, n_ctx: int, rows: int, n_examples: int) -> int:
    """The most json_kv pairs whose prompts are at most `length` tokens and whose prompt, answer and
    greedy decoding fit n_ctx (prompts.sweep_tokens), measured on this tokenizer."""
    from headscope.analyses.position import prompts

    def fits(n: int) -> bool:
        sweeps = prompts.kv_sweeps(tokenizer, n_pairs=n, n_examples=n_examples, positions=positions(n, rows))
        return max(s.prompt_len for s in sweeps) <= length and prompts.sweep_tokens(sweeps) <= n_ctx

    lo = prompts.kv_sweeps(tokenizer, n_pairs=2, n_examples=1, positions=(1,))[0].prompt_len
    hi = prompts.kv_sweeps(tokenizer, n_pairs=12, n_examples=1, positions=(1,))[0].prompt_len
    n = max(2, 2 + int((length - lo) / ((hi - lo) / 10)))  # the linear estimate, then step to the edge
    while n > 2 and not fits(n):
        n -= 1
    while fits(n + 1):
        n += 1
    return n


def positions(n_items: int, rows: int) -> tuple[int, ...]:
    """Gold slots: the middle (rows 1), the first and last (rows 2), all three (rows 3)."""
    return {1: ((n_items + 1) // 2,), 2: (1, n_items)}.get(rows, (1, (n_items + 1) // 2, n_items))


def text_task(model, length: int, n_examples: int, seed: int = 0):
    """n_examples prompts of exactly `length` tokens: BOS + shuffled english_corpus lines, answer
    the next token (metric logprob)."""
    import _scale_models as sm
    import torch

    from headscope.analyses.core.tasks import Task

    tok, lines = model.tokenizer, sm.english_corpus()
    rng, ids = random.Random(seed), []
    while len(ids) < n_examples * length:
        rng.shuffle(lines)
        ids += tok(" ".join(lines), add_special_tokens=False)["input_ids"]
    rows = torch.tensor(ids[:n_examples * length]).reshape(n_examples, length)  # [batch, length]
    bos = torch.full((n_examples, 1), tok.bos_token_id, dtype=torch.int64)
    tokens = torch.cat([bos, rows[:, :length - 1]], 1)  # [batch, length]
    return Task(name="text", tokens=tokens, answers=rows[:, length - 1], metric="logprob")


def analysis_call(model, what: str, length: int, cell: dict):
    """(run: () -> Result, warm-up: () -> Result, facts about the prompts)."""
    import headscope as hs
    from headscope.analyses.position.analysis import build_sweeps

    if what == "position":
        n = fit_pairs(model.tokenizer, length, model.facts.n_ctx, cell["rows"], cell["examples"])
        cfg = hs.PositionConfig(sweep="json_kv", n_items=n, n_examples=cell["examples"],
                                positions=positions(n, cell["rows"]), n_boot=50, progress=False)
        warm = hs.PositionConfig(sweep="json_kv", n_items=2, n_examples=1, positions=(1, 2), n_boot=10, progress=False)
        sweeps = build_sweeps(model, cfg)
        facts = {"prompt_len": max(s.prompt_len for s in sweeps), "n_items": n,
                 "rows": sum(len(s.positions) for s in sweeps), "answer_tokens": sweeps[0].answer_ids.numel()}
        return (lambda: hs.position_bias(model, config=cfg)), (lambda: hs.position_bias(model, config=warm)), facts
    task = text_task(model, length, cell["examples"])
    warm_task = text_task(model, 16, 1)
    facts = {"prompt_len": task.tokens.shape[1], "rows": task.tokens.shape[0]}
    return (lambda: hs.kv_analysis(model, task, hs.KVConfig(progress=False))), \
        (lambda: hs.kv_analysis(model, warm_task, hs.KVConfig(budgets=(4,), progress=False))), facts


def child(cell: dict) -> dict:
    """One cell: load, warm up, one measured run of the analysis on the chosen path."""
    import torch

    torch.set_num_threads(cell["threads"])
    from headscope.models import heap

    heap.keep_freed_memory()  # the malloc settings of any headscope process, for every cell alike
    from pattern_memory import _status_kb

    import headscope as hs
    from headscope.models import hooked_model

    model = hs.load_model(cell["path"], device="cpu")
    counts = {"hook_free": 0, "bridge": 0}
    hook_free_pass = hooked_model._HOOK_FREE_PASS[0]

    def counted(*args, **kwargs):  # the registered hook-free pass; None where it does not apply
        out = hook_free_pass(*args, **kwargs)
        counts["hook_free"] += out is not None
        return out

    def no_op(x, hook):  # sees every pass through the bridge
        counts["bridge"] += 1

    hooked_model._HOOK_FREE_PASS[0] = counted
    run, warm, facts = analysis_call(model, cell["what"], cell["length"], cell)
    bridge = cell["path_kind"] == "bridge"
    with model.hooks(fwd=[(hs.site("resid_pre", 0), no_op)]) if bridge else nullcontext():
        warm()
        counts.update(hook_free=0, bridge=0)
        gc.collect()
        before = _status_kb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
        t0 = time.perf_counter()
        with torch.no_grad() if cell["no_grad"] else nullcontext():
            result = run()
        elapsed = time.perf_counter() - t0
        mem = (_status_kb("VmHWM") - before) / 1024
        still_hooked = not model.hook_free()
    if cell["what"] == "position":
        facts["masked_runs"] = "streaming" in result.summary
    else:
        facts["cache_mb"] = result.summary["bytes_per_token"] * facts["prompt_len"] * facts["rows"] / 2**20
        facts["eviction_runs"] = len(result.df)
    return {"time_s": elapsed, "mem_mb": mem, "rss_loaded_mb": before / 1024, "hook_free_passes": counts["hook_free"],
            "bridge_passes": counts["bridge"] if bridge else None, "hooked_to_the_end": still_hooked, **facts}


def measure(cell: dict, timeout: float) -> dict:
    threads = str(cell["threads"])
    env = {**os.environ, "HEADSCOPE_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cell)],
                              env=env, capture_output=True, text=True, cwd=HERE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over the {timeout:.0f} s timeout"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or [f"no output (exit {proc.returncode})"])[-1][:300]}
    return json.loads(lines[-1])


def row_text(what: str, path: str, r: dict, prev: dict | None) -> str:
    if "error" in r:
        return f"  {what:9s} {path:9s} {r.get('target', ''):>6}  error: {r['error']}"
    exp = "     -"
    if prev and "mem_mb" in prev and prev["mem_mb"] > 0 and r["mem_mb"] > 0 and r["prompt_len"] != prev["prompt_len"]:
        exp = f"{math.log(r['mem_mb'] / prev['mem_mb']) / math.log(r['prompt_len'] / prev['prompt_len']):6.2f}"
    passes = f"{r['hook_free_passes']:3d} hook-free, " + ("  - bridge" if r["bridge_passes"] is None
                                                         else f"{r['bridge_passes']:3d} bridge")
    if what == "position":
        extra = f"{r['n_items']} pairs, {r['rows']} rows, answer {r['answer_tokens']} tok, masked runs {r['masked_runs']}"
    else:
        extra = f"{r['rows']} prompt(s), KV cache {r['cache_mb']:.0f} MB, {r['eviction_runs']} eviction runs"
    flag = "" if r["hooked_to_the_end"] == (path == "bridge") else "  (PATH CHECK FAILED)"
    return (f"  {what:9s} {path:9s} {r['prompt_len']:6d} {r['time_s']:8.1f} {r['mem_mb']:8.0f} {exp}  "
            f"{passes}; {extra}{flag}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="1024,2048,4096", help="target prompt lengths, hook-free path")
    p.add_argument("--bridge-lengths", default="1024,2048",
                   help="target prompt lengths through the bridge ('' for none; 4096 needs several GB and minutes)")
    p.add_argument("--what", default=",".join(WHAT), help=f"comma-separated, from {','.join(WHAT)}")
    p.add_argument("--examples", type=int, default=1, help="examples (position) or prompts (kv)")
    p.add_argument("--rows", type=int, default=1, choices=(1, 2, 3),
                   help="gold slots per example: 1 the middle, 2 first and last, 3 all three")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-grad", action="store_true",
                   help="run each analysis inside torch.no_grad() (as a caller may; the default calls it as it is)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per cell")
    p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "headscope-scale-models"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    import _scale_models as sm

    path = sm.checkpoint("gpt2-small", Path(args.cache))
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    paths = {"hook-free": ints(args.lengths), "bridge": ints(args.bridge_lengths)}
    print(f"GPT-2-small shape (12 layers x 12 heads, d_model 768, n_ctx 4096, ~4k-token vocabulary), "
          f"{args.threads} thread(s), {args.examples} example(s){', inside torch.no_grad()' if args.no_grad else ''}; "
          f"len = prompt tokens reached, time = one run (s), "
          f"mem = added peak RSS (MB), exp = memory growth exponent vs the previous length")
    print(f"  {'analysis':9s} {'path':9s} {'len':>6s} {'time_s':>8s} {'mem_mb':>8s} {'exp':>6s}  passes; prompts")
    got: dict[tuple[str, str, int], dict] = {}
    for what in (w for w in args.what.split(",") if w):
        for kind, lengths in paths.items():
            prev = None
            for length in lengths:
                cell = {"path": path, "what": what, "path_kind": kind, "length": length, "threads": args.threads,
                        "examples": args.examples, "rows": args.rows, "no_grad": args.no_grad}
                r = {"target": length, **measure(cell, args.timeout)}
                print(row_text(what, kind, r, prev), flush=True)
                got[(what, kind, length)] = prev = r
    for what, kind in {(w, k): None for w, k, _ in got}:  # first to last length: the allocator's steps average out
        done = [r for (w, k, _), r in got.items() if (w, k) == (what, kind) and r.get("mem_mb", 0) > 0]
        if len(done) > 1 and done[-1]["prompt_len"] != done[0]["prompt_len"]:
            exp = math.log(done[-1]["mem_mb"] / done[0]["mem_mb"]) / math.log(done[-1]["prompt_len"] / done[0]["prompt_len"])
            print(f"  {what} {kind}: memory exponent {done[0]['prompt_len']} -> {done[-1]['prompt_len']} tokens {exp:.2f}")
    for (what, kind, length), r in got.items():
        free = got.get((what, "hook-free", length), {})
        if kind == "bridge" and "mem_mb" in r and "mem_mb" in free:
            print(f"  {what} at {r['prompt_len']} tokens: bridge / hook-free memory {r['mem_mb'] / free['mem_mb']:.1f}x, "
                  f"time {r['time_s'] / free['time_s']:.2f}x")


if __name__ == "__main__":
    main()
