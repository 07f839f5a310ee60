"""Automatic batch sizing: chunk sizes from a memory budget, and halving on out-of-memory.

Out-of-memory is injected by wrapping the model's forward so that it raises above a row count;
results are compared with plain loops written independently of the engines (one forward per
mask or per run, with the foundation's ablate or a plain bridge hook)."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.analyses.core.tasks import Task
from headscope.analyses.heads import importance as hi
from headscope.analyses.patching.engine import run_batched, runs_per_forward
from headscope.execution import batching, resume
from tests_support import N_WORDS, SPECIALS, random_tokens

N_EX, POS = 6, 7


def oom(rows: int) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(f"CUDA out of memory (injected at {rows} rows)")


@pytest.fixture
def limited(tiny_models, monkeypatch):
    """The tiny llama whose run_with_hooks and hook-free last-position passes (resume.last_logits)
    raise out-of-memory above `limit[0]` rows; `seen` records row counts."""
    model = tiny_models["llama"]
    limit, seen = [4], []

    def limited_to(real):
        def run(self, tokens, *args, **kwargs):
            seen.append(tokens.shape[0])
            if tokens.shape[0] > limit[0]:
                raise oom(tokens.shape[0])
            return real(self, tokens, *args, **kwargs)
        return run

    monkeypatch.setattr(type(model), "run_with_hooks", limited_to(type(model).run_with_hooks))
    monkeypatch.setattr(resume, "last_logits", limited_to(resume.last_logits))
    return model, limit, seen


def test_chunk_size_budget_override_and_too_small():
    assert batching.chunk_size(100, budget=1050) == 10
    assert batching.chunk_size(100, budget=1050, override=3) == 3
    with pytest.raises(batching.MemoryBudgetError, match="cannot hold one row"):
        batching.chunk_size(100, budget=99)
    with pytest.raises(ValueError, match="memory_budget"):
        batching.chunk_size(100, budget=0)
    with pytest.raises(ValueError, match="override"):
        batching.chunk_size(100, override=0)


def test_default_budget_is_half_the_free_ram_capped_on_cpu(monkeypatch):
    import psutil

    class Mem:
        available = 1000

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Mem)
    assert batching.default_budget("cpu") == 500
    assert batching.chunk_size(100, device="cpu") == 5
    Mem.available = 64 * 2**30
    assert batching.default_budget("cpu") == batching.CPU_BUDGET


def test_cpu_pass_cap_in_tokens_and_in_mlp_bytes():
    """4096 tokens a pass on CPU, fewer where one MLP hidden layer (float32) would pass 16 MiB;
    no cap on other devices."""
    assert batching.cpu_rows("cpu", 26, width=256) == 157  # 4096 // 26: the zoo model's 256-wide MLP fits
    assert batching.cpu_rows("cpu", 10, width=3072) == 136  # GPT-2: 16 MiB / (4 B x 3072) = 1365 tokens
    assert batching.cpu_rows("cpu", 5000) == 1  # at least one row
    assert batching.cpu_rows("meta", 26, width=256) is None


def test_is_oom_recognises_cuda_and_cpu_allocator_errors():
    assert batching.is_oom(oom(3))
    assert batching.is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: "
                                        "you tried to allocate 10 bytes."))
    assert not batching.is_oom(RuntimeError("shape mismatch"))
    assert not batching.is_oom(ValueError("out of memory"))


def test_run_chunks_halves_on_oom_and_keeps_every_item():
    sizes = []

    def fn(chunk: range) -> list[int]:
        sizes.append(len(chunk))
        if len(chunk) > 3:
            raise oom(len(chunk))
        return [i * i for i in chunk]

    out = batching.run_chunks(fn, 11, 8)
    assert [x for _, part in out for x in part] == [i * i for i in range(11)]
    assert sizes[:3] == [8, 4, 2] and max(len(c) for c, _ in out) == 2
    with pytest.raises(torch.OutOfMemoryError):
        batching.run_chunks(lambda c: (_ for _ in ()).throw(oom(1)), 3, 2)
    with pytest.raises(KeyError):  # other errors are not retried
        batching.run_chunks(lambda c: {}[0], 3, 2)


def _task() -> Task:
    g = torch.Generator().manual_seed(7)
    lo, hi_ = len(SPECIALS), len(SPECIALS) + N_WORDS
    return Task(name="t", tokens=random_tokens(N_EX, POS, seed=3), answers=torch.randint(lo, hi_, (N_EX,), generator=g),
                wrong_answers=torch.randint(lo, hi_, (N_EX,), generator=g), metric="logit_diff")


def _plain_mask_means(model, task: Task, masks: torch.Tensor) -> torch.Tensor:
    """Mean logit difference per mask: one unbatched forward per mask with the removed heads zero-ablated."""
    out = []
    idx = torch.arange(len(task))
    for m in masks:
        removed = [(l, h) for l in range(m.shape[0]) for h in range(m.shape[1]) if m[l, h] == 0]
        with torch.no_grad():
            if removed:
                with hs.ablate(model, heads=removed, method="zero"):
                    last = model.bridge(task.tokens, return_type="logits")[:, -1]
            else:
                last = model.bridge(task.tokens, return_type="logits")[:, -1]
        out.append(float((last[idx, task.answers] - last[idx, task.wrong_answers]).mean()))
    return torch.tensor(out, dtype=torch.float64)


def test_evaluate_masks_backs_off_on_oom_with_unchanged_results(limited, monkeypatch):
    model, limit, seen = limited
    monkeypatch.setattr(resume, "supports", lambda model: resume.Support(False, False, False))  # the stacked full passes
    task = _task()
    f = model.facts
    masks = torch.ones(5, f.n_layers, f.n_heads)
    masks[1, 0, 0] = masks[2, 1, 1] = masks[3, 0] = masks[4, :, 0] = 0.0
    expected = _plain_mask_means(model, task, masks)
    limit[0] = 3  # the first pass asks for all 6 examples x 5 masks
    got = hi.evaluate_masks(model, hi.make_scorer(model, task), masks)
    assert seen[:3] == [30, 12, 6] and max(seen[3:]) == 3  # 6 examples x 5, 2, 1 masks; then 3 examples
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)


def test_resumed_evaluate_masks_back_off_on_oom_with_unchanged_results(tiny_models, monkeypatch):
    model = tiny_models["llama"]
    assert resume.supports(model).ok
    task = _task()
    f = model.facts
    masks = torch.ones(5, f.n_layers, f.n_heads)
    masks[1, 0, 0] = masks[2, 1, 1] = masks[3, 0] = masks[4, :, 0] = 0.0  # masks 1, 3, 4 resume at block 0
    expected = _plain_mask_means(model, task, masks)
    real, seen = resume.resume, []

    def limited_resume(model, ckpt, start, rows, **kwargs):
        seen.append(rows.shape[0])
        if rows.shape[0] > N_EX:
            raise oom(rows.shape[0])
        return real(model, ckpt, start, rows, **kwargs)

    monkeypatch.setattr(resume, "resume", limited_resume)
    got = hi.evaluate_masks(model, hi.make_scorer(model, task), masks)
    assert seen[:2] == [3 * N_EX, N_EX] and max(seen[2:]) == N_EX  # block 0's 3 masks, then one per pass
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)


def test_evaluate_masks_inside_an_outer_intervention_equals_a_plain_loop(tiny_models):
    """Hooks the caller attached (here hs.ablate on layer 1's attention output) act in every mask's
    pass, so nothing may resume past them."""
    model = tiny_models["llama"]
    task = _task()
    f = model.facts
    masks = torch.ones(4, f.n_layers, f.n_heads)
    masks[1, 0, 0] = masks[2, 1, 1] = masks[3, 1] = 0.0
    with hs.ablate(model, sites=[hs.site("attn_out", 1)]):
        expected = _plain_mask_means(model, task, masks)
        got = hi.evaluate_masks(model, hi.make_scorer(model, task), masks)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)
    assert (expected - _plain_mask_means(model, task, masks)).abs().max() > 1e-3  # the outer ablation matters


def test_gate_gradients_back_off_on_oom(limited):
    model, limit, seen = limited
    task = _task()
    scorer = hi.make_scorer(model, task)
    limit[0] = 100
    reference, ref_metric = hi.gate_gradients(model, scorer, max_tokens=1 * POS)  # one example per pass
    limit[0] = 2
    got, metric = hi.gate_gradients(model, scorer)
    assert seen[-1] <= 2 and any(s > 2 for s in seen)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)
    assert metric == pytest.approx(ref_metric, abs=1e-5)
    assert metric == pytest.approx(float(_plain_mask_means(model, task, torch.ones(1, *got.shape))[0]), abs=1e-4)


def test_rows_per_pass_follows_a_small_budget(tiny_models):
    model = tiny_models["llama"]
    per_row = batching.row_bytes(model, POS, grad=True)
    assert batching.rows_per_pass(model, POS, grad=True, memory_budget=3 * per_row + 1, logits_cap=True) == 3
    with pytest.raises(batching.MemoryBudgetError, match="cannot hold one row"):
        hi.evaluate_masks(model, hi.make_scorer(model, _task()), torch.ones(1, model.facts.n_layers, model.facts.n_heads),
                          memory_budget=10)


def test_run_batched_small_budget_and_oom_match_a_plain_loop(limited):
    model, limit, seen = limited
    tokens = random_tokens(2, POS, seed=5)
    n_runs = 7

    def scale(factor: float):
        return lambda act, hook: act * factor

    def hooks_for(runs: range):
        factors = torch.tensor([1.0 + 0.1 * r for r in runs]).repeat_interleave(tokens.shape[0])  # [k * B]
        return [(hs.site("embed"), lambda act, hook: act * factors[:, None, None].to(act.dtype))]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, 5] - logits[:, -1, 6]

    with torch.no_grad():
        expected = torch.stack([metric(model.bridge.run_with_hooks(tokens, return_type="logits",
                                                                   fwd_hooks=[(hs.site("embed"), scale(1.0 + 0.1 * r))]))
                                for r in range(n_runs)])  # [run, B]
    per_row = batching.row_bytes(model, POS)
    assert runs_per_forward(model, 2, POS, memory_budget=per_row * 2 * 3) == 3
    with pytest.raises(batching.MemoryBudgetError):
        runs_per_forward(model, 2, POS, memory_budget=per_row - 1)
    limit[0] = 100
    small = run_batched(model, tokens, n_runs, hooks_for, metric, memory_budget=per_row * 2 * 3, progress=False)
    assert max(seen) == 6
    limit[0] = 4  # all 7 runs in one pass (14 rows) run out of memory
    seen.clear()
    backed_off = run_batched(model, tokens, n_runs, hooks_for, metric, batch_size=n_runs, progress=False)
    assert seen[:2] == [14, 6] and max(seen[2:]) <= 4  # 7 runs x 2 prompts, then 3 runs, then 1
    torch.testing.assert_close(small, expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(backed_off, expected, atol=1e-4, rtol=1e-5)


def test_stacked_leave_one_out_backs_off_on_oom(tiny_models, monkeypatch):
    from headscope.analyses.attribution.methods import leave_one_out

    model = tiny_models["llama"]
    tokens = random_tokens(3, POS, seed=9)
    positions = list(range(1, POS - 1))
    expected = leave_one_out(model, tokens, positions, reuse_prefix=True)  # the clean-cache strategy
    real, seen = type(model).__call__, []

    def call(self, tokens, *args, **kwargs):
        seen.append(tokens.shape[0])
        if tokens.shape[0] > 4:
            raise oom(tokens.shape[0])
        return real(self, tokens, *args, **kwargs)

    monkeypatch.setattr(type(model), "__call__", call)
    got = leave_one_out(model, tokens, positions, reuse_prefix=False, batch_size=64)
    assert seen[1:4] == [15, 7, 3] and max(seen[4:]) == 3  # seen[0]: the 3 clean rows; then 15 variants, halved
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["z", "resid_pre"])
def test_resumed_patching_sees_hooks_that_edit_in_place(kind, tiny_models):
    """TransformerLens-style hooks that edit the activation in place (and return it, or None):
    the resumed pass applies them to a copy of the captured activation, so the edit still counts."""
    model = tiny_models["llama"]
    tokens = random_tokens(2, 6, seed=3)

    def hooks_for(runs):
        def edit(act, hook):
            if kind == "z":
                act[:, 3:, 1] = 0.0
                return act
            act[:, 3:] += 1.0  # returns None
        return [(hs.site(kind, 1), edit)]

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 7]

    resumed = run_batched(model, tokens, 1, hooks_for, metric, batch_size=1, layer_of=lambda run: 1, progress=False)
    with torch.no_grad():
        want = metric(model.run_with_hooks(tokens, fwd=hooks_for(range(1))))
        base = metric(model(tokens))
    torch.testing.assert_close(resumed[0], want, atol=1e-5, rtol=1e-5)
    assert (want - base).abs().max() > 1e-4  # the edit mattered
