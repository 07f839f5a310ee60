"""The first call's cost on a new model: resume.supports, the once-per-model check of resumed and
hook-free passes, against one plain forward pass of the same prompts through the bridge.

A random-weight model of GPT-2 small's shape (12 layers x 768, 12 heads, the zoo's vocabulary),
so it needs no download. The check runs once per model, so the model is loaded --repeats times
(default 3), each load timing the median of five plain passes (after a warm-up) and then its
check; prints each load's seconds and the check's cost in plain passes, and the median ratio
(a loaded machine moves single timings by 2x).

    python benchmarks/first_call.py [--threads N] [--repeats K]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import headscope as hs
from headscope.execution import resume
from headscope.models.zoo import vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    tok = vocab.build_tokenizer()
    out = Path(tempfile.mkdtemp()) / "gpt2-small-random"
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(tok), n_embd=768, n_layer=12, n_head=12, n_positions=256,
                                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    transformers.GPT2LMHeadModel(config).save_pretrained(out)
    tok.save_pretrained(out)
    ratios = []
    for _ in range(args.repeats):
        model = hs.load_model(str(out), device="cpu")  # a fresh model: its check not yet done
        tokens = torch.randint(0, model.facts.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
        times = []
        with torch.no_grad():
            model.bridge(tokens)  # warm-up (the bridge itself: a plain model(...) would run the check)
            for _ in range(5):
                t0 = time.perf_counter()
                model.bridge(tokens)
                times.append(time.perf_counter() - t0)
        one_pass = statistics.median(times)
        t0 = time.perf_counter()
        support = resume.supports(model)
        check = time.perf_counter() - t0
        ratios.append(check / one_pass)
        print(f"one bridge forward of the check's prompts (2 x 6 tokens, median of 5): {one_pass:.3f} s; "
              f"resume.supports: {check:.3f} s = {check / one_pass:.2f} passes; {support}")
    print(f"model: random GPT-2 small shape ({model.facts.n_layers} layers x {model.facts.d_model}); "
          f"torch threads {torch.get_num_threads()}; the check: median {statistics.median(ratios):.2f} passes")


if __name__ == "__main__":
    main()
