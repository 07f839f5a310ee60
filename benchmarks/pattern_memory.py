"""Pattern memory: peak memory and time of a plain forward and of one head's attention pattern,
against plain Hugging Face with its fused attention (SDPA), on the GPT-2-small shape.

Measured, batch 1, at each length (default 1,024, 2,048 and 4,096 tokens):
- hf_sdpa:     Hugging Face GPT2LMHeadModel, attn_implementation="sdpa", model(tokens).logits
- hs_plain:    headscope model(tokens) with no hook attached (the hook-free blocks, execution/hook_free)
- hs_bridge:   headscope's pass through the TransformerBridge (every layer's pattern materialised;
               what hs_plain was before)
- hs_pattern:  hs.attention_pattern(model, tokens, layer=L/2, heads=[0]): one head of one layer
- hs_capture:  hs.capture(model, tokens, [site("pattern", L/2)]): every head of one layer, plus logits
Targets (issue #22): hs_plain <= 1.1x hf_sdpa in time and memory; hs_pattern <= 1.2x (hf_sdpa's
memory + the pattern's own bytes).

The checkpoint is benchmarks/_scale_models.py's "gpt2-small" (GPT2Config n_layer=12, n_head=12,
n_embd=768, n_positions=4096, random weights); --vocab tokenizer gives its ~4k-token byte-level BPE
vocabulary, --vocab real pads the embedding to GPT-2's 50,257 rows (logits then dominate a plain
pass's memory, as in a real GPT-2).

Memory: one fresh subprocess per measurement, each with the same malloc settings (headscope's
models/heap, which a headscope process applies): load, warm up on a 16-token prompt (lazy
initialisation, the once-per-model check of the hook-free blocks), reset the kernel's RSS high-water
mark (/proc/self/clear_refs) and run once: mem = peak RSS minus the RSS before the run (MB), the
median over --mem-runs such processes (the first long pass's heap growth varies by ~100 MB).
Time: one more subprocess loads both models and calls every measured pass in turn, --repeats times
after a warm-up (benchmarks/_common.timed_alternately), so a shared machine's drifting speed hits
them alike; time = the median (s).

    OMP_NUM_THREADS=1 python benchmarks/pattern_memory.py [--lengths 1024,2048,4096] [--vocab tokenizer|real]
        [--repeats 3] [--mem-runs 1] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHAT = ("hf_sdpa", "hs_plain", "hs_bridge", "hs_pattern", "hs_capture")


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def passes(whats: list[str], path: str) -> tuple[dict, int]:
    """({what: tokens -> output} for the measured passes, the vocabulary size); loads what they need."""
    import headscope as hs

    runs, vocab = {}, None
    if "hf_sdpa" in whats:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
        runs["hf_sdpa"], vocab = (lambda tokens: hf(tokens).logits), hf.config.vocab_size
    if any(w.startswith("hs_") for w in whats):
        model = hs.load_model(path, device="cpu")
        vocab, layer = model.facts.d_vocab, model.facts.n_layers // 2
        runs.update({
            "hs_plain": lambda tokens: model(tokens),
            "hs_bridge": lambda tokens: model.bridge_forward(tokens),
            "hs_pattern": lambda tokens: hs.attention_pattern(model, tokens, layer, heads=[0]),
            "hs_capture": lambda tokens: hs.capture(model, tokens, [hs.site("pattern", layer)]),
        })
    return {w: runs[w] for w in whats}, vocab


def child(cell: dict) -> dict:
    """Memory (one "what"): load, warm up, one measured run. Time (several): every pass in turn."""
    import torch

    torch.set_num_threads(cell["threads"])
    from headscope.models import heap

    heap.keep_freed_memory()  # the malloc settings of any headscope process, for every measurement alike
    from _common import timed_alternately

    runs, vocab = passes(cell["whats"], cell["path"])
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (1, cell["length"]), generator=gen)  # [1, pos]
    with torch.no_grad():
        if cell["timing"]:
            times, _ = timed_alternately([lambda run=run: run(tokens) for run in runs.values()], cell["repeats"])
            return {"time_s": dict(zip(runs, times))}
        (run,) = runs.values()
        run(tokens[:, :16])
        before = _status_kb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
        run(tokens)
        mem = (_status_kb("VmHWM") - before) / 1024
    return {"mem_mb": mem, "rss_loaded_mb": before / 1024,
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(cell: dict) -> dict:
    threads = str(cell["threads"])
    env = {**os.environ, "HEADSCOPE_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cell)],
                          env=env, capture_output=True, text=True, cwd=HERE)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(lines[-1])


def median_memory(runs: list[dict]) -> dict:
    """The run of median memory among `runs` (an error where none finished)."""
    done = sorted((r for r in runs if "mem_mb" in r), key=lambda r: r["mem_mb"])
    return done[len(done) // 2] if done else runs[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="1024,2048,4096")
    p.add_argument("--vocab", choices=("tokenizer", "real"), default="tokenizer")
    p.add_argument("--what", default=",".join(WHAT), help=f"comma-separated, from {','.join(WHAT)}")
    p.add_argument("--repeats", type=int, default=3, help="timed calls of each pass")
    p.add_argument("--mem-runs", type=int, default=1, help="fresh processes per memory figure (the median)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "headscope-scale-models"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    sys.path.insert(0, str(HERE))
    import _scale_models as sm

    path = sm.checkpoint("gpt2-small", Path(args.cache), args.vocab)
    whats = [w for w in args.what.split(",") if w]
    print(f"GPT-2-small shape (12 layers x 12 heads, d_model 768), vocab={args.vocab}, batch 1, "
          f"{args.threads} thread(s); mem = added peak RSS (MB), time = median of {args.repeats} (s)")
    for length in (int(x) for x in args.lengths.split(",")):
        cell = {"path": path, "length": length, "threads": args.threads, "repeats": args.repeats}
        mem = {w: median_memory([measure({**cell, "whats": [w], "timing": False}) for _ in range(args.mem_runs)])
               for w in whats}
        timing = measure({**cell, "whats": whats, "timing": True})
        times = timing.get("time_s", {})
        for w, r in mem.items():
            shown = r.get("error") or f"{r['mem_mb']:8.0f} MB"
            t = f"{times[w]:7.2f} s" if w in times else f"time: {timing.get('error', 'none')}"
            print(f"  {length:5d} tokens  {w:11s} {shown}  {t}")
        hf, plain, pattern = (mem.get(w, {}) for w in ("hf_sdpa", "hs_plain", "hs_pattern"))
        if "mem_mb" not in hf:
            continue
        pattern_mb = length * length * 4 / 2**20  # one head, float32
        if "mem_mb" in plain and "hs_plain" in times:
            print(f"  {length:5d} tokens  plain forward vs HF SDPA: memory {plain['mem_mb'] / hf['mem_mb']:.2f}x, "
                  f"time {times['hs_plain'] / times['hf_sdpa']:.2f}x (target <= 1.1x each)")
        if "mem_mb" in pattern:
            budget = hf["mem_mb"] + pattern_mb
            print(f"  {length:5d} tokens  one head's pattern: {pattern['mem_mb']:.0f} MB vs HF SDPA + pattern "
                  f"({hf['mem_mb']:.0f} + {pattern_mb:.0f} MB): {pattern['mem_mb'] / budget:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
