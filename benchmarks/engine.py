"""Benchmark of headscope's engines per architecture and dtype (issue #31 item 7), in one process.

For GPT-2, GPT-NeoX, Llama 3, Qwen3, Gemma 3, OLMo 2, Phi-3 and Mixtral (random weights, each
architecture's switches as in tests/tests_support.py: GQA, q/k norms, post-norms, sliding
windows, fused projections, parallel blocks, experts), in float32 and bfloat16, prints one table:
(a) forward: `headscope model(tokens)` against Hugging Face SDPA (`AutoModelForCausalLM
    .from_pretrained(dir, attn_implementation="sdpa", torch_dtype=...)`) on the same checkpoint,
    one row of --tokens tokens (default 2,048), 6 layers x 768 (12 heads; 4 KV heads where the
    architecture has GQA), 32k vocabulary; time and peak memory; target <= 1.1x in both;
(b) pattern: `hs.attention_pattern` of the last layer, all heads, on the same row, against the
    same Hugging Face forward; time target <= 1.2x its time, memory target <= 1.2x (its memory +
    the pattern's bytes);
(c) patching: resid_pre (layer, position) and head_out (layer, head) sweeps of
    `activation_patching` against `transformer_lens.patching` (get_act_patch_resid_pre,
    get_act_patch_attn_head_out_all_pos) on the same bridge, 8 prompts x 32 tokens, 4 layers x
    256 (8 heads), corrupted copies differing from position 16 on (benchmarks/patching.py);
    target >= 10x;
(d) gradient head importance (one forward + one backward) against the one-head-per-forward loop
    (TransformerLens run_with_hooks zeroing hook_z, benchmarks/heads.py), same small model and
    prompts; target >= 8x.
Memory: on CUDA, torch.cuda.max_memory_allocated growth during the call; on the CPU, the growth
of the process's resident set during the call (polled every millisecond, after malloc_trim so
freed memory kept by an earlier call does not hide it). The two sides run in turn after a warm-up
call of headscope's (and of Hugging Face's, short inputs, for the forward cells), --repeats
alternating calls; the best time and the largest memory growth
are kept; each cell says how many runs it got (a round slower than --slow seconds ends its
repeats). One torch thread unless --threads. A cell that fails prints its error in the table.

    python benchmarks/engine.py [--device cpu|cuda] [--dtypes float32 bfloat16] [--archs gpt2 llama3 ...]
                                [--tokens 2048] [--repeats 3] [--quick] [--parts forward pattern patching gradient]
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests_support: the architectures' builders

ARCHS = {  # name -> (key in tests_support's tables, fields beside the size, whether it has GQA)
    "gpt2": ("gpt2", {}, False),
    "neox": ("neox", {}, False),
    "llama3": ("llama3", {}, True),
    "qwen3": ("qwen3", dict(head_dim=64), True),
    "gemma3": ("gemma3", dict(head_dim=64, query_pre_attn_scalar=64, sliding_window=512,
                              layer_types=["sliding_attention"] * 5 + ["full_attention"]), True),
    "olmo2": ("olmo2", {}, True),
    "phi3": ("phi3", {}, False),
    "mixtral": ("mixtral", {}, True),  # tests_support's 4 experts, 2 per token; half-width experts
}
BIG = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=6, num_attention_heads=12, num_key_value_heads=4,
           max_position_embeddings=4096)
SMALL = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
             max_position_embeddings=256)
QUICK_BIG = dict(BIG, num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2)
TARGETS = {"forward": 1.1, "pattern": 1.2, "patching": 10.0, "gradient": 8.0}


def shape_fields(arch: str, base: dict, small: bool) -> dict:
    """Config fields of `arch` at the size `base` (BIG, SMALL, QUICK_BIG), in its own field names."""
    key, extra, gqa = ARCHS[arch]
    fields = dict(base)
    if not gqa:
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    d_head = fields["hidden_size"] // fields["num_attention_heads"]
    extra = {k: (d_head if k in ("head_dim", "query_pre_attn_scalar") else v) for k, v in extra.items()}
    if arch == "gpt2":
        return dict(n_embd=fields["hidden_size"], n_layer=fields["num_hidden_layers"], n_head=fields["num_attention_heads"],
                    n_positions=fields["max_position_embeddings"])
    if arch == "gemma3":
        n = fields["num_hidden_layers"]
        extra["layer_types"] = ["sliding_attention"] * (n - 1) + ["full_attention"]
        extra["sliding_window"] = 16 if small else 512
    if arch == "mixtral":
        fields["intermediate_size"] //= 2
    return {**fields, **extra}


def build(arch: str, out: Path, fields: dict, vocab: int | None) -> Path:
    """A random-weight checkpoint of `arch` (tests_support's tokenizer, class and switches, with
    `fields` overriding the size; config vocabulary `vocab` or the tokenizer's) saved to `out`.
    Hugging Face's own initialisation (std 0.02), so bfloat16 activations stay finite."""
    import torch
    import transformers

    import tests_support as ts

    make_tok, model_class, config_class, base = {**ts.ARCHITECTURES, **ts.MORE_ARCHITECTURES}[ARCHS[arch][0]]
    tok = make_tok()
    ids = {name: tok.convert_tokens_to_ids(getattr(tok, name.replace("_id", ""))) for name in
           ("bos_token_id", "eos_token_id", "pad_token_id") if getattr(tok, name.replace("_id", ""), None) is not None}
    ids.setdefault("pad_token_id", ids.get("eos_token_id"))
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**base, **fields, "vocab_size": vocab or len(tok), **ids})
    model = getattr(transformers, model_class)(config)
    model.save_pretrained(out, safe_serialization=True)
    ts.save_tokenizer(tok, out)
    del model
    return out


# ---- measuring -------------------------------------------------------------------------------

_LIBC = ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else None


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measured(fn, device: str) -> tuple[float, int, object]:
    """(seconds, peak memory growth in bytes, result) of one call of fn."""
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        return seconds, torch.cuda.max_memory_allocated() - before, result
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    before = _rss()
    peak = [before]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    done.set()
    poller.join()
    peak[0] = max(peak[0], _rss())
    return seconds, peak[0] - before, result


def compare(fns, warmups, repeats: int, device: str, slow: float) -> tuple[list[float], list[int], int]:
    """Best time and largest memory growth of each of `fns`, called in turn `repeats` times after
    the warm-up calls `warmups` (short inputs; headscope's first call on a model checks its
    hook-free blocks once); fewer repeats when a round takes more than `slow` seconds."""
    for w in warmups:
        w()
    times: list[list[float]] = [[] for _ in fns]
    mems: list[list[int]] = [[] for _ in fns]
    runs = 0
    for _ in range(repeats):
        t_round = time.perf_counter()
        for i, fn in enumerate(fns):
            s, m, _ = measured(fn, device)
            times[i].append(s)
            mems[i].append(m)
        runs += 1
        if time.perf_counter() - t_round > slow:
            break
    return [min(t) for t in times], [max(m) for m in mems], runs


def fmt_ratio(ratio: float, target: float, at_most: bool) -> str:
    ok = ratio <= target if at_most else ratio >= target
    return f"{ratio:.2f}x {'pass' if ok else 'FAIL'}"


def mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB"


# ---- cells -----------------------------------------------------------------------------------

def forward_cells(arch: str, path: Path, dtype, args) -> list[str]:
    """Rows for (a) and (b) on the big checkpoint at `path`."""
    import torch
    from transformers import AutoModelForCausalLM

    import headscope as hs

    device = args.device
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=dtype).to(device).eval()
    model = hs.load_model(path, device=device, dtype=dtype)
    f = model.facts
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, min(f.d_vocab, 500), (1, args.tokens), generator=g).to(device)
    short = tokens[:, :16]
    layer = f.n_layers - 1
    rows = []

    def hf_fwd(t=tokens):
        with torch.no_grad():
            return hf(t).logits

    def hs_fwd(t=tokens):
        with torch.no_grad():
            return model(t)

    def hs_pat(t=tokens):
        return hs.attention_pattern(model, t, layer)

    label = f"{arch} {str(dtype).removeprefix('torch.')}"
    shape = f"{f.n_layers}x{f.d_model}, {f.n_heads}/{f.n_kv_heads} heads"
    parts = set(args.parts)
    fns, warm = [hf_fwd], [lambda: hf_fwd(short)]
    if "forward" in parts:
        fns.append(hs_fwd)
        warm.append(lambda: hs_fwd(short))
    if "pattern" in parts:
        fns.append(hs_pat)
        warm.append(lambda: hs_pat(short))
    (t_hf, *t_ours), (m_hf, *m_ours), runs = compare(fns, warm, args.repeats, device, args.slow)
    note = f" ({runs} run{'s' if runs > 1 else ''})"
    i = 0
    if "forward" in parts:
        t, m = t_ours[i], m_ours[i]
        i += 1
        rows.append(f"| {label} | forward, {args.tokens} tokens, {shape} | HF SDPA {t_hf:.2f} s, {mb(m_hf)} | "
                    f"{t:.2f} s, {mb(m)}{note} | time {fmt_ratio(t / t_hf, 1.1, True)}; "
                    f"memory {fmt_ratio(m / max(m_hf, 1), 1.1, True)} | <= 1.1x |")
    if "pattern" in parts:
        t, m = t_ours[i], m_ours[i]
        pattern_bytes = f.n_heads * args.tokens ** 2 * 4  # float32 weights, as hs.attention_pattern returns
        rows.append(f"| {label} | layer {layer} pattern ({mb(pattern_bytes)}) | HF SDPA {t_hf:.2f} s, "
                    f"{mb(m_hf)} + pattern | {t:.2f} s, {mb(m)}{note} | time {fmt_ratio(t / t_hf, 1.2, True)}; "
                    f"memory {fmt_ratio(m / (m_hf + pattern_bytes), 1.2, True)} | <= 1.2x |")
    return rows


def small_cells(arch: str, path: Path, dtype, args) -> list[str]:
    """Rows for (c) and (d) on the small checkpoint at `path`."""
    from heads import loop_importance
    from patching import ours, random_task, tl_sweep
    from transformer_lens import patching as tlp

    import headscope as hs
    from headscope.analyses.heads import importance as hi

    model = hs.load_model(path, device=args.device, dtype=dtype)
    f = model.facts
    task = random_task(model, 8)
    if args.device != "cpu":  # the loop indexes the bridge's logits with the task's tensors
        task = dataclasses.replace(task, **{k: getattr(task, k).to(args.device) for k in
                                            ("tokens", "corrupted_tokens", "answers", "wrong_answers")})
    label = f"{arch} {str(dtype).removeprefix('torch.')}"
    shape = f"8 x 32 tokens, {f.n_layers}x{f.d_model}, {f.n_heads} heads"
    rows = []
    if "patching" in args.parts:
        for site, sweep in [("resid_pre", tlp.get_act_patch_resid_pre),
                            ("head_out", tlp.get_act_patch_attn_head_out_all_pos)]:
            def tl(sweep=sweep):
                return tl_sweep(model, task, sweep)

            def hs_(site=site):
                return ours(model, task, site)

            (t_tl, t_hs), _, runs = compare([tl, hs_], [hs_], args.repeats, args.device, args.slow)
            rows.append(f"| {label} | patching {site}, {shape} | transformer_lens.patching {t_tl:.2f} s | "
                        f"{t_hs:.3f} s ({runs} run{'s' if runs > 1 else ''}) | speed-up "
                        f"{fmt_ratio(t_tl / t_hs, 10.0, False)} | >= 10x |")
    if "gradient" in args.parts:
        scorer = hi.make_scorer(model, task)

        def loop():
            return loop_importance(model, task)

        def grad():
            return hi.gradient_importance(model, scorer)

        (t_loop, t_grad), _, runs = compare([loop, grad], [grad], args.repeats, args.device, args.slow)
        rows.append(f"| {label} | gradient importance, {shape} | one-head-per-forward loop ({f.n_layers * f.n_heads + 1} "
                    f"forwards) {t_loop:.2f} s | {t_grad:.3f} s ({runs} run{'s' if runs > 1 else ''}) | speed-up "
                    f"{fmt_ratio(t_loop / t_grad, 8.0, False)} | >= 8x |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--archs", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    parser.add_argument("--parts", nargs="+", default=["forward", "pattern", "patching", "gradient"],
                        choices=["forward", "pattern", "patching", "gradient"])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slow", type=float, default=60.0, help="seconds: a slower first round is measured once")
    parser.add_argument("--quick", action="store_true", help="smaller shapes (2 layers x 256, 256 tokens): a smoke run")
    args = parser.parse_args()
    os.environ["HEADSCOPE_THREADS"] = str(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.stdout.reconfigure(line_buffering=True)
    import torch

    torch.set_num_threads(args.threads)
    if args.quick:
        args.tokens = min(args.tokens, 256)
    big = QUICK_BIG if args.quick else BIG
    dtypes = [getattr(torch, d) for d in args.dtypes]
    tmp = Path(tempfile.mkdtemp(prefix="headscope-engine-"))
    print(f"device {args.device}; torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"{args.repeats} repeats (best time, largest memory growth); checkpoints in {tmp}")
    print()
    header = ["| model | cell | reference | headscope | ratio | target |", "|---|---|---|---|---|---|"]
    print("\n".join(header))
    rows = []
    for arch in args.archs:
        paths = {}
        try:
            if {"forward", "pattern"} & set(args.parts):
                paths["big"] = build(arch, tmp / f"{arch}-big", shape_fields(arch, big, False), 32000)
            if {"patching", "gradient"} & set(args.parts):
                paths["small"] = build(arch, tmp / f"{arch}-small", shape_fields(arch, SMALL, True), None)
        except Exception as e:  # noqa: BLE001 - the table says which architecture could not be built
            rows.append(f"| {arch} | build | error: {type(e).__name__}: {str(e)[:120]} | | | |")
            print(rows[-1])
            continue
        for dtype in dtypes:
            for kind, cells in (("big", forward_cells), ("small", small_cells)):
                if kind not in paths:
                    continue
                t0 = time.perf_counter()
                try:
                    got = cells(arch, paths[kind], dtype, args)
                except Exception as e:  # noqa: BLE001 - said in the table, the other cells go on
                    traceback.print_exc(file=sys.stderr)
                    got = [f"| {arch} {str(dtype).removeprefix('torch.')} | {kind} cells | error: "
                           f"{type(e).__name__}: {str(e)[:120]} | | | |"]
                for row in got:
                    print(row)
                rows.extend(got)
                print(f"<!-- {arch} {dtype} {kind}: {time.perf_counter() - t0:.0f} s -->", file=sys.stderr)
    print()
    print("\n".join(header + rows))
    fails = sum("FAIL" in r for r in rows)
    print(f"\n{fails} of {len(rows)} rows miss a target "
          f"(forward <= 1.1x HF SDPA time and memory; pattern <= 1.2x HF time and HF memory + the pattern; "
          f"patching >= 10x transformer_lens.patching; gradient importance >= 8x the one-head loop)")


if __name__ == "__main__":
    main()
