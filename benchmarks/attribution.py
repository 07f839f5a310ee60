"""Benchmark of the attribution analysis: batched leave-one-out and batched integrated gradients.

1. Leave-one-out on 64-token prompts against a loop with one forward pass per token:
   headscope's default for decoders (the clean KV cache cut at each position, only the suffix
   recomputed, variants stacked) and its stacked full-sequence strategy (chunks of
   `--batch-size` sequences, the encoders' path).
2. Integrated gradients throughput (examples/s): headscope (Captum LayerIntegratedGradients on
   hook_embed, several examples per call) against Captum's LLMGradientAttribution wrapping
   LayerIntegratedGradients on the Hugging Face model (one prompt per call), same steps, same
   prompts, the answer's log-probability as the target in both.

Runs on the zoo model (zoo/synth-llama) when it is shipped; otherwise on a randomly initialised
model of the same architecture and size (the speed does not depend on the weights).

    python benchmarks/attribution.py [--examples 16] [--length 64] [--steps 32] [--threads 1] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import headscope as hs
from headscope.analyses.attribution import methods as am


def zoo_sized_model(tmp: Path) -> tuple[str, Path]:
    """(description, directory): the shipped zoo model, or a random one of the same recipe."""
    from headscope.models.zoo import registry, vocab
    from headscope.models.zoo.recipes import RECIPES
    from headscope.models.zoo.train import build_model

    if "synth-llama" in registry.available():
        return "zoo/synth-llama", registry.checkpoint_dir("synth-llama")
    build_model(RECIPES["synth-llama"].model, seed=0).save_pretrained(tmp, safe_serialization=True)
    vocab.build_tokenizer().save_pretrained(tmp)
    return "random model with the synth-llama recipe (zoo checkpoint not shipped yet)", tmp


def prompts(model, n: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n prompts of `length` tokens (BOS + random non-special words) and random answers."""
    g = torch.Generator().manual_seed(seed)
    bos = model.tokenizer.bos_token_id
    words = torch.randint(4, model.facts.d_vocab, (n, length - 1), generator=g)
    tokens = torch.cat([torch.full((n, 1), bos), words], 1)  # [n, length]
    return tokens, torch.randint(4, model.facts.d_vocab, (n,), generator=g)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def median_timed(fn, repeats: int):
    """(median seconds over `repeats` calls, the last result), timings interleaved with nothing else."""
    times, out = [], None
    for _ in range(repeats):
        out, t = timed(fn)
        times.append(t)
    return statistics.median(times), out


@torch.no_grad()
def loo_loop(model, tokens: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """The baseline: one forward pass per left-out token."""
    out = torch.empty(tokens.shape[0], len(positions))
    for b in range(tokens.shape[0]):
        ref = model(tokens[b : b + 1])[0, -1].softmax(-1)
        for k, pos in enumerate(positions):
            other = torch.cat([tokens[b, :pos], tokens[b, pos + 1 :]])[None]
            out[b, k] = 0.5 * (model(other)[0, -1].softmax(-1) - ref).abs().sum()
    return out


def ig_headscope(model, tokens, answers, steps: int, batch_size: int, pad: int) -> None:
    forward = am.forward_metric(model, "logprob")
    chunk = max(1, batch_size // steps)
    for i in range(0, len(tokens), chunk):
        t = tokens[i : i + chunk]
        base = t.clone()
        base[:, 1:-1] = pad
        am.integrated_gradients(model, t, base, forward, (answers[i : i + chunk],), n_steps=steps)


def ig_captum_llm(hf, tokenizer, tokens, answers, steps: int, pad: int) -> None:
    from captum.attr import LayerIntegratedGradients, LLMGradientAttribution, TextTokenInput

    llm = LLMGradientAttribution(LayerIntegratedGradients(hf, hf.get_input_embeddings()), tokenizer)
    for t, a in zip(tokens, answers):
        text = " ".join(tokenizer.convert_ids_to_tokens(t.tolist()))
        inp = TextTokenInput(text, tokenizer, baselines=pad, skip_tokens=[tokenizer.bos_token_id])
        assert torch.equal(inp.to_model_input()[0], t), "the Captum prompt must be the same tokens"
        llm.attribute(inp, target=a.reshape(1), n_steps=steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=16)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        what, path = zoo_sized_model(Path(tmp))
        model = hs.load_model(path, device="cpu")
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    print(f"model: {what}: {model}")
    tokens, answers = prompts(model, args.examples, args.length)
    positions = list(range(1, args.length - 1))
    pad = model.tokenizer.pad_token_id
    model(tokens[:2])  # warm-up
    print(f"\nleave-one-out: {args.examples} prompts x {len(positions)} tokens, {args.length}-token prompts "
          f"(median of {args.repeats})")
    t_cached, cached = median_timed(lambda: am.leave_one_out(model, tokens, positions, batch_size=args.batch_size), args.repeats)
    t_stacked, stacked = median_timed(
        lambda: am.leave_one_out(model, tokens, positions, batch_size=args.batch_size, reuse_prefix=False), args.repeats)
    t_loop, looped = median_timed(lambda: loo_loop(model, tokens, positions), args.repeats)
    print(f"  headscope LOO, cached prefix (default) : {t_cached:8.2f} s   speed-up {t_loop / t_cached:5.1f}x (target >= 5x)")
    print(f"  headscope LOO, stacked full sequences  : {t_stacked:8.2f} s   speed-up {t_loop / t_stacked:5.1f}x")
    print(f"  loop, 1 forward/token                  : {t_loop:8.2f} s")
    diff = max(float((cached - looped).abs().max()), float((stacked - looped).abs().max()))
    print(f"  max |difference| to the loop: {diff:.2e}")
    print(f"\nintegrated gradients: {args.examples} prompts, {args.steps} steps, target log p(answer)")
    ig_headscope(model, tokens[:2], answers[:2], args.steps, args.batch_size, pad)  # warm-up
    _, t_ours = timed(lambda: ig_headscope(model, tokens, answers, args.steps, args.batch_size, pad))
    _, t_llm = timed(lambda: ig_captum_llm(hf, model.tokenizer, tokens, answers, args.steps, pad))
    print(f"  headscope (batched LayerIG on hook_embed): {args.examples / t_ours:8.2f} examples/s ({t_ours:.2f} s)")
    print(f"  Captum LLMGradientAttribution (HF model) : {args.examples / t_llm:8.2f} examples/s ({t_llm:.2f} s)")
    print(f"  ratio                                    : {t_llm / t_ours:8.2f}x")


if __name__ == "__main__":
    main()
