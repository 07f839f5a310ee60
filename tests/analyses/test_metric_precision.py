"""Review 17a B1: a logit difference of bfloat16 logits is subtracted in float32 (analyses/core/metrics.py), so the
heads, patching and circuits metrics equal a hand float32 subtraction of plain Hugging Face bfloat16 logits, not
that difference rounded to 8 bits again (which the heads' null ablations and patching's self-patch cannot see)."""
from __future__ import annotations

import pytest
import torch
import transformers

import headscope as hs
from headscope.analyses.circuits.edges import row_metric
from headscope.analyses.core import metrics
from headscope.analyses.core.tasks import Task
from headscope.analyses.heads import analysis as heads
from tests_support import N_WORDS, SPECIALS, random_tokens


def test_logit_diff_of_bfloat16_logits_is_the_float32_difference():
    """Review 17a's row 4 by hand: logits 8.9375 and 0.2158 (bfloat16 0.2158203125) differ by 8.7216796875 in
    float32; a bfloat16 subtraction gave 8.75."""
    logits = torch.zeros(1, 1, 4, dtype=torch.bfloat16)
    logits[0, 0, 1], logits[0, 0, 2] = 8.9375, 0.2158
    answers, wrong = torch.tensor([1]), torch.tensor([2])
    want = 8.9375 - 0.2158203125
    got = metrics.logit_diff(logits, answers, wrong)
    assert got.dtype == torch.float32 and float(got) == want != float((logits[0, 0, 1] - logits[0, 0, 2]).float())
    assert float(row_metric(logits, torch.tensor([0]), answers, wrong)) == want  # circuits' edges metric
    assert metrics.logit_diff(logits.double(), answers, wrong).dtype == torch.float64  # a float64 model keeps its own


@pytest.fixture(scope="module")
def bf16_run(tiny_dirs):
    """(task, the bfloat16 tiny llama, HF's bfloat16 last-position logits of the clean and corrupted prompts)."""
    g = torch.Generator().manual_seed(103)
    lo, hi = len(SPECIALS), len(SPECIALS) + N_WORDS
    task = Task(name="t", tokens=random_tokens(6, 8, seed=3), corrupted_tokens=random_tokens(6, 8, seed=4),
                answers=torch.randint(lo, hi, (6,), generator=g), wrong_answers=torch.randint(lo, hi, (6,), generator=g),
                metric="logit_diff")
    # SDPA: the attention headscope's own bfloat16 pass uses (eager attention rounds differently in bfloat16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs["llama"], dtype=torch.bfloat16,
                                                           attn_implementation="sdpa").eval()
    with torch.no_grad():
        clean, corrupt = (hf(t).logits[:, -1] for t in (task.tokens, task.corrupted_tokens))  # [n, vocab] bfloat16
    return task, hs.load_model(tiny_dirs["llama"], device="cpu", dtype=torch.bfloat16), clean, corrupt


def _hand(last: torch.Tensor, task: Task, *, wide: bool = True) -> float:
    rows = torch.arange(len(task))
    a, w = last[rows, task.answers], last[rows, task.wrong_answers]
    return float(((a.float() - w.float()) if wide else (a - w).float()).double().mean())


def test_heads_baseline_is_the_float32_difference_of_hf_bfloat16_logits(bf16_run):
    task, model, clean, _ = bf16_run
    assert _hand(clean, task) != _hand(clean, task, wide=False)  # the bfloat16 subtraction would differ here
    s = heads.head_importance(model, task, methods=("zero",)).summary
    assert s["baseline_metric"] == pytest.approx(_hand(clean, task), abs=1e-6)


def test_patching_clean_and_corrupted_are_the_float32_differences(bf16_run):
    task, model, clean, corrupt = bf16_run
    assert _hand(corrupt, task) != _hand(corrupt, task, wide=False)
    s = hs.activation_patching(model, task, sites=["resid_pre"], progress=False).summary
    assert s["clean_metric"] == pytest.approx(_hand(clean, task), abs=1e-6)
    assert s["corrupted_metric"] == pytest.approx(_hand(corrupt, task), abs=1e-6)
