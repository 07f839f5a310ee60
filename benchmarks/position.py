"""Benchmark: the position sweep with all gold positions of an example in one batch, against one
prompt per forward pass (the same analysis with batch_size=1), in one process.

Model: the shipped zoo model "zoo/synth-llama" when present, else a random model of the same
shape (Llama, 4 layers x 8 heads, 2 KV heads, d_model 128) over the zoo vocabulary. Prints both
times and their ratio, and checks that the two give the same numbers.

    python benchmarks/position.py [--examples 16] [--pairs 20] [--threads 1] [--repeats 3] [--model SPEC]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace

import torch

import headscope as hs
from headscope.analyses.position.analysis import PositionConfig, position_bias


def zoo_sized_model(out: str):
    """The synth-llama recipe's architecture with random weights and the zoo tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from headscope.models.zoo import vocab

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab.VOCAB_SIZE, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=2, eos_token_id=3, pad_token_id=1)
    LlamaForCausalLM(cfg).save_pretrained(out)
    vocab.build_tokenizer().save_pretrained(out)
    return hs.load_model(out, device="cpu")


def best_time(fn, repeats: int) -> tuple[float, float, object]:
    """Best wall-clock and best process CPU time over repeats (CPU time is steadier on a shared machine)."""
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier timings on a shared CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None,
                        help="a zoo-vocabulary model spec or directory (default: zoo/synth-llama if shipped)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from headscope.models.zoo import registry

    with tempfile.TemporaryDirectory() as tmp:
        if args.model is not None:
            model, label = hs.load_model(args.model, device="cpu"), args.model
        elif "synth-llama" in registry.available():
            model, label = hs.load_model("zoo/synth-llama", device="cpu"), "zoo/synth-llama"
        else:
            model, label = zoo_sized_model(tmp), "random model of synth-llama's shape (zoo checkpoint not shipped yet)"
        cfg = PositionConfig(sweep="zoo_kv", n_items=args.pairs, n_examples=args.examples, n_boot=200, progress=False)
        position_bias(model, config=replace(cfg, n_examples=1))  # warm-up
        w_batched, c_batched, batched = best_time(lambda: position_bias(model, config=cfg), args.repeats)
        n_pos = len(batched.summary["positions"])
        w_example, c_example, _ = best_time(lambda: position_bias(model, config=replace(cfg, batch_size=n_pos)), args.repeats)
        w_single, c_single, single = best_time(lambda: position_bias(model, config=replace(cfg, batch_size=1)), args.repeats)
    same = bool(((batched.df["logprob"] - single.df["logprob"]).abs() < 1e-4).all())
    rows = len(batched.df)
    print(f"model: {label}; {args.examples} examples x {len(batched.summary['positions'])} gold positions "
          f"({args.pairs} pairs, prompt {args.pairs * 3 + 2} tokens), 3 forward passes a row (full, sinks+window, window); "
          f"torch threads {args.threads}; best of {args.repeats}")
    print(f"batched (whole examples, up to 64 rows a pass): wall {w_batched:.3f} s, CPU {c_batched:.3f} s "
          f"({rows / w_batched:.1f} rows/s)")
    print(f"one example (its {n_pos} positions) per pass:     wall {w_example:.3f} s, CPU {c_example:.3f} s "
          f"({rows / w_example:.1f} rows/s)")
    print(f"one prompt per forward pass:                   wall {w_single:.3f} s, CPU {c_single:.3f} s "
          f"({rows / w_single:.1f} rows/s)")
    print(f"speed-up vs one prompt per pass: packed wall {w_single / w_batched:.2f}x, CPU {c_single / c_batched:.2f}x; "
          f"one example per pass wall {w_single / w_example:.2f}x, CPU {c_single / c_example:.2f}x; identical results: {same}")


if __name__ == "__main__":
    main()
