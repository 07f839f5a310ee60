"""Benchmark of batched activation patching against transformer_lens.patching, in one process.

On the same model, prompts and metric (mean logit difference on the zoo IOI task), prints
times, ratios and the max abs difference of the results, per number of prompts, for:
1. resid_pre by (layer, position): headscope's activation_patching vs
   transformer_lens.patching.get_act_patch_resid_pre (one forward pass per cell); target >= 10x;
2. head outputs by (layer, head): vs get_act_patch_attn_head_out_all_pos; target >= 10x;
3. head outputs by (layer, head, position): attribution patching (two forwards, one backward)
   vs exact patching (headscope's batched sweep, and get_act_patch_attn_head_out_by_pos).
headscope's passes resume at the patched block from one captured pass (execution/resume.py), with
many patched runs stacked per pass; blocks no hook looks at run hook-free (execution/fast_blocks.py);
a patch that leaves a row's activation bitwise unchanged (IOI's clean and corrupted prompts
agree before the changed name, printed below) is not recomputed, and the others start at the
first position they change. Both sides include getting the clean activations (run_with_cache /
capture). Each timing is the median of --repeats runs after a warm-up; the two sides of a
ratio run alternately. The model is zoo/synth-llama when shipped, else a randomly initialised
model of the same recipe (said in the output). --threads sets torch's intra-op threads for both
sides (1 is much faster on a loaded shared CPU).

    python benchmarks/patching.py [--n-examples 1 8] [--repeats 5] [--model SPEC] [--threads N]
    python benchmarks/patching.py --arch olmo2 [--n-examples 8] [--repeats 3]

--arch (olmo2, qwen3, gemma3, llama, mixtral) instead runs a random-weight model of that
architecture (4 layers x 256, 8 heads, 4 KV heads, the zoo's vocabulary) on random 32-token
prompts whose corrupted copies differ from position 16 on, with random answers: sweeps 1 and 2.
"""
from __future__ import annotations

import argparse
import contextlib
import io

import torch
from _common import load, timed, timed_pair
from transformer_lens import patching as tlp

from headscope.analyses.core import tasks
from headscope.analyses.patching.analysis import activation_patching
from headscope.analyses.patching.attribution_patching import attribution_patching

ARCHS = {  # --arch: HF model class, config class, fields (4 layers x 256, 8 heads)
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", {}),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", {"head_dim": 32}),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", {"head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 16}),
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}


def random_arch(arch: str):
    """(model, label): a random-weight `arch` (ARCHS) with the zoo's tokenizer, saved to a temporary folder."""
    import tempfile
    from pathlib import Path

    import transformers

    from headscope.models.zoo import vocab

    model_class, config_class, extra = ARCHS[arch]
    tok = vocab.build_tokenizer()
    fields = dict(vocab_size=len(tok), hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **extra)
    torch.manual_seed(0)
    hf = getattr(transformers, model_class)(getattr(transformers, config_class)(**fields))
    out = Path(tempfile.mkdtemp()) / arch
    hf.save_pretrained(out)
    tok.save_pretrained(out)
    return load(str(out))[0], f"random {model_class}"


def random_task(model, n: int, pos: int = 32, first: int = 16):
    """n random prompts of `pos` tokens, corrupted copies that differ from position `first` on, random answers."""
    g = torch.Generator().manual_seed(0)
    vocab = model.facts.d_vocab
    tokens = torch.randint(0, vocab, (n, pos), generator=g)
    corrupted = tokens.clone()
    corrupted[:, first:] = torch.randint(0, vocab, (n, pos - first), generator=g)
    answers = torch.randint(0, vocab, (n,), generator=g)
    return tasks.Task(name="random", tokens=tokens, corrupted_tokens=corrupted, answers=answers,
                      wrong_answers=(answers + 1) % vocab)


def tl_sweep(model, task, sweep):
    """TransformerLens: clean cache, then its one-forward-per-cell sweep (tqdm silenced)."""
    idx = torch.arange(len(task))
    answers, wrong = task.answers.to(model.device), task.wrong_answers.to(model.device)

    def metric(logits):
        last = logits[:, -1]
        return (last[idx, answers] - last[idx, wrong]).mean()

    with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
        _, cache = model.bridge.run_with_cache(task.tokens.to(model.device))
        return sweep(model.bridge, task.corrupted_tokens.to(model.device), cache, metric).cpu()


def ours(model, task, site: str) -> torch.Tensor:
    df = activation_patching(model, task, [site], metric="logit_diff", progress=False).df
    return torch.tensor(df["value"].to_numpy(), dtype=torch.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-examples", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--arch", choices=sorted(ARCHS), default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, label = random_arch(args.arch) if args.arch else load(args.model)
    f = model.facts
    print(f"model: {label}; {f.n_layers} layers x {f.n_heads} heads ({f.n_kv_heads} KV), d_model {f.d_model}; "
          f"device {model.device}; torch threads {torch.get_num_threads()}")
    for n in args.n_examples:
        if args.arch:
            sweep_all(model, random_task(model, n), args.repeats, by_pos=False)
        else:
            sweep_all(model, tasks.zoo(model, "ioi", n_examples=n, seed=0), args.repeats)


def sweep_all(model, task, repeats: int, by_pos: bool = True) -> None:
    first = int((task.tokens != task.corrupted_tokens).any(0).float().argmax())
    print(f"\ntask: {task.name}, {len(task)} prompts x {task.tokens.shape[1]} tokens (clean and corrupted first differ "
          f"at position {first}); metric: mean logit difference")
    for site, sweep in [("resid_pre", tlp.get_act_patch_resid_pre),
                        ("head_out", tlp.get_act_patch_attn_head_out_all_pos)]:
        t_tl, t_hs, ref, got = timed_pair(lambda sweep=sweep: tl_sweep(model, task, sweep),
                                          lambda site=site: ours(model, task, site), repeats)
        diff = (got.view(ref.shape) - ref).abs().max().item()
        print(f"{site:<16} cells {ref.numel():>4}: transformer_lens {t_tl:8.3f} s   headscope {t_hs:7.3f} s   "
              f"ratio {t_tl / t_hs:6.1f}x   max abs diff {diff:.2e}")
    if not by_pos:
        return
    by_pos = "head_out_by_pos"
    t_exact, exact = timed(lambda: ours(model, task, by_pos), repeats)
    t_attr, _ = timed(lambda: attribution_patching(model, task, [by_pos], metric="logit_diff"), repeats)
    t_tl, ref = timed(lambda: tl_sweep(model, task, tlp.get_act_patch_attn_head_out_by_pos), 1)
    diff = (exact.view(ref.shape) - ref).abs().max().item()
    print(f"{by_pos} cells {ref.numel()}: attribution {t_attr:.3f} s; exact headscope {t_exact:.3f} s "
          f"(ratio exact/attribution {t_exact / t_attr:.1f}x); exact transformer_lens {t_tl:.3f} s "
          f"(ratio {t_tl / t_attr:.1f}x; headscope vs transformer_lens {t_tl / t_exact:.1f}x, max abs diff {diff:.2e})")


if __name__ == "__main__":
    main()
