"""Benchmark of the heads analysis against the one-head-per-forward-pass loop, in one process.

Prints, per number of examples:
1. gradient importance of all heads (one forward + one backward per batch) vs the per-head
   ablation loop of the paper code (one forward per head, TransformerLens run_with_hooks with a
   hook zeroing that head's z); target >= n_heads / 4 (8x on 32 heads);
2. batched ablation importance (copies of the batch stacked along the batch axis, one head
   each, every copy resuming at its head's block from one captured pass: execution/resume.py; blocks
   after the ablated one run hook-free, execution/fast_blocks.py) vs the same unbatched loop; target
   >= 4x. Also headscope's own code path forced to one head per
   pass (the gain from stacking) and with resuming turned off (full stacked passes: the gain
   from resuming);
3. the L0 sweep's gate training (Voita et al.; --l0-steps steps for each of the default
   lambdas): headscope's (every lambda's copy of the minibatch in one stacked pass, blocks
   hook-free, the last block at the last query only) vs a plain loop (one lambda at a time,
   TransformerLens run_with_hooks scaling hook_z by the gates); same draws, same result.
Each timing is the median of --repeats runs after a warm-up; the loop, batched ablation and
gradient importance run in turn. Both sides share the process and its settings: torch's
thread count (its default, the machine's cores, unless --threads) and the CPU malloc settings
of models/heap. The model is zoo/synth-llama when shipped, else a randomly initialised model
of the same recipe (said in the output).

    python benchmarks/heads.py [--n-examples 8 32] [--repeats 5] [--model SPEC] [--threads 1] [--l0-steps 20]
"""
from __future__ import annotations

import argparse
import sys

import torch
from _common import load, timed, timed_alternately, timed_pair

from headscope.analyses.core import tasks
from headscope.analyses.heads import importance as hi
from headscope.analyses.heads import l0 as heads_l0
from headscope.execution import resume


def loop_importance(model, task) -> torch.Tensor:
    """The paper code's loop: one forward per head, TransformerLens run_with_hooks zeroing it."""
    f = model.facts
    idx = torch.arange(len(task))

    def ld(hooks) -> float:
        with torch.no_grad():
            last = model.bridge.run_with_hooks(task.tokens, return_type="logits", fwd_hooks=hooks)[:, -1]
        return (last[idx, task.answers] - last[idx, task.wrong_answers]).mean().item()

    def zero(head: int):
        def hook(z, hook):
            z = z.clone()
            z[:, :, head] = 0.0
            return z
        return hook

    base = ld([])
    out = torch.zeros(f.n_layers, f.n_heads)
    for layer in range(f.n_layers):
        for head in range(f.n_heads):
            out[layer, head] = base - ld([(f"blocks.{layer}.attn.hook_z", zero(head))])
    return out


def l0_loop(model, task, config: heads_l0.L0Config) -> torch.Tensor:
    """Gate training written plainly, one lambda at a time: TransformerLens run_with_hooks
    scaling hook_z by Hard Concrete gates, Adam on log alpha. -> [k, L, H]"""
    f = model.facts
    out = []
    for lam in config.lambdas:
        gen = torch.Generator().manual_seed(config.seed)
        log_alpha = torch.full((f.n_layers, f.n_heads), config.init, requires_grad=True)
        opt = torch.optim.Adam([log_alpha], lr=config.lr)
        batch = min(len(task), config.batch_size)
        for _ in range(config.steps):
            rows = torch.randperm(len(task), generator=gen)[:batch]
            u = torch.rand((batch, f.n_layers, f.n_heads), generator=gen).clamp(1e-6, 1 - 1e-6)
            gates = heads_l0.sample_gates(log_alpha, u)  # [b, L, H]
            hooks = [(f"blocks.{l}.attn.hook_z", lambda z, hook, l=l, gates=gates: z * gates[:, l, None, :, None])
                     for l in range(f.n_layers)]
            last = model.bridge.run_with_hooks(task.tokens[rows], return_type="logits", fwd_hooks=hooks)[:, -1]
            ce = -torch.log_softmax(last, -1)[torch.arange(batch), task.answers[rows]]
            loss = ce.sum() / batch + lam * heads_l0.expected_open(log_alpha)
            opt.zero_grad()
            loss.backward()
            opt.step()
        out.append(log_alpha.detach())
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-examples", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--l0-steps", type=int, default=20, help="gate-training steps per lambda (the analysis: 200)")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, label = load(args.model)
    n_heads = model.facts.n_layers * model.facts.n_heads
    print(f"model: {label}; {model.facts.n_layers} layers x {model.facts.n_heads} heads = {n_heads} heads; "
          f"torch threads: {torch.get_num_threads()}")
    for n in args.n_examples:
        task = tasks.zoo(model, "kv", n_examples=n, seed=0)
        scorer = hi.make_scorer(model, task)
        pos = task.tokens.shape[1]
        (t_loop, t_batch, t_grad), (ref, got, _) = timed_alternately(
            [lambda task=task: loop_importance(model, task), lambda scorer=scorer: hi.ablation_importance(model, scorer),
             lambda scorer=scorer: hi.gradient_importance(model, scorer)], args.repeats)
        t_single, _ = timed(lambda scorer=scorer, n=n, pos=pos: hi.ablation_importance(model, scorer, max_tokens=n * pos),
                            args.repeats)
        supports = resume.supports
        resume.supports = lambda model: resume.Support(False, False, False)  # full stacked passes, as before resuming
        try:
            t_full, _ = timed(lambda scorer=scorer: hi.ablation_importance(model, scorer), args.repeats)
        finally:
            resume.supports = supports
        err = (got.importance.float() - ref).abs().max().item()
        print(f"\n{n} examples x {pos} tokens (kv task)")
        print(f"  per-head ablation loop (TL run_with_hooks, {n_heads + 1} forwards): {t_loop:8.3f} s")
        print(f"  gradient importance (1 forward + 1 backward):          {t_grad:8.3f} s  "
              f"ratio {t_loop / t_grad:5.1f}x (target >= {n_heads / 4:.0f}x)")
        print(f"  batched ablation importance (stacked copies):           {t_batch:8.3f} s  "
              f"ratio {t_loop / t_batch:5.1f}x (target >= 4x)")
        print(f"  headscope ablation forced to one head per pass:         {t_single:8.3f} s  "
              f"stacking gain {t_single / t_batch:5.1f}x")
        print(f"  headscope ablation without resuming (full passes):      {t_full:8.3f} s  "
              f"resuming gain {t_full / t_batch:5.1f}x")
        print(f"  max |batched - loop| importance: {err:.2e}")

    task = tasks.zoo(model, "kv", n_examples=64, seed=0)
    config = heads_l0.L0Config(steps=args.l0_steps)
    scorer = hi.make_scorer(model, task)
    t_plain, t_ours, ref, got = timed_pair(lambda: l0_loop(model, task, config),
                                           lambda: heads_l0.train_gate_sweep(model, scorer, config.lambdas, config), 1)
    print(f"\nL0 gate training: {len(config.lambdas)} lambdas x {config.steps} steps, batch {config.batch_size} "
          f"(kv task, {task.tokens.shape[1]} tokens)")
    print(f"  plain loop (one lambda at a time, TL run_with_hooks):   {t_plain:8.3f} s")
    print(f"  headscope (lambdas stacked, hook-free blocks):          {t_ours:8.3f} s  ratio {t_plain / t_ours:5.1f}x")
    print(f"  max |headscope - loop| log alpha: {(got - ref).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
