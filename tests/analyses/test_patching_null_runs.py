"""Review 19c B1: each exact-patching cell subtracts its layer's null run (the same site's hook at that layer,
patching nothing), so the unpatched value comes from the patched runs' own arithmetic path. In bfloat16 a resumed
pass through a hooked block rounds otherwise than the captured pass (0.004 logits on every q/k cell of the review's
SmolLM3); a patch that changes nothing now gives exactly 0, and effects within the dtype's rounding floor are said
to be, not given an interval that excludes 0."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

import headscope as hs
from headscope.analyses.core import metrics
from headscope.analyses.core.tasks import Task
from headscope.analyses.patching.analysis import FULL_SITES
from headscope.reports.findings import finding
from tests_support import N_WORDS, SPECIALS, left_padded_tokens, random_tokens


def _task(padded: bool) -> Task:
    g = torch.Generator().manual_seed(7)
    lo, hi = len(SPECIALS), len(SPECIALS) + N_WORDS
    if padded:  # two rows shorter by 2 and 1 tokens, left-padded
        tokens, mask = left_padded_tokens([8, 6, 7, 8], seed=5)
    else:
        tokens, mask = random_tokens(4, 8, seed=5), None
    corrupted = tokens.clone()
    corrupted[:, -3] = torch.randint(lo, hi, (4,), generator=g)  # one swapped word, 3 from the end
    return Task(name="t", tokens=tokens, corrupted_tokens=corrupted, attention_mask=mask,
                answers=torch.randint(lo, hi, (4,), generator=g), wrong_answers=torch.randint(lo, hi, (4,), generator=g),
                metric="logit_diff")


@pytest.fixture(scope="module")
def bf16_llama(tiny_dirs):
    return hs.load_model(tiny_dirs["llama"], device="cpu", dtype=torch.bfloat16)


@pytest.mark.parametrize("padded", [False, True])
def test_patching_an_activation_with_itself_is_exactly_zero_in_bfloat16(bf16_llama, padded):
    """Clean = corrupted: every cell of every site type (the hooked q/k/v/pattern/attn_out/mlp_out/resid passes, the z
    and resid_pre shortcuts) copies an activation onto itself; its effect is exactly 0 (before the fix the q, k, v,
    pattern, attn_out, mlp_out, resid_mid and resid_post cells read the hooked pass's rounding against the captured
    pass's)."""
    task = _task(padded)
    same = dataclasses.replace(task, corrupted_tokens=task.tokens.clone())
    df = hs.activation_patching(bf16_llama, same, sites=FULL_SITES).df
    assert set(df["site_type"]) == set(FULL_SITES)
    real = df[df["effect"].notna()]
    assert len(real) and (real["effect"] == 0).all(), real.loc[real["effect"] != 0, ["site_type", "layer", "effect"]]


@pytest.mark.parametrize("receivers", ["logits", [(1, 0)]])
def test_path_patching_an_output_with_itself_is_exactly_zero_in_bfloat16(bf16_llama, receivers):
    """Path patching's effects are against its null run (the same hooks adding nothing): clean = corrupted gives
    exactly 0 on every path, to the logits and into a receiver's q (before: the hook-free unpatched pass's rounding)."""
    task = _task(True)
    same = dataclasses.replace(task, corrupted_tokens=task.tokens.clone())
    df = hs.path_patching(bf16_llama, same, receivers=receivers).df
    assert len(df) and (df["effect"] == 0).all(), df[["sender_layer", "sender_head", "effect"]]


def _hf_q_patch(path, dtype, task: Task, layer: int, head: int, impl: str = "eager") -> tuple[float, float]:
    """(unpatched, patched) mean logit difference of plain Hugging Face on the corrupted prompts, the clean run's
    q_proj output of `head` (every position) written into the corrupted run at `layer`; float32 subtraction. impl:
    Hugging Face's attention kernel (eager, as TransformerLens boots the hooked passes; sdpa, as the hook-free ones
    run)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=impl).eval()
    proj = hf.model.layers[layer].self_attn.q_proj
    d = hf.config.head_dim if getattr(hf.config, "head_dim", None) else hf.config.hidden_size // hf.config.num_attention_heads
    got = {}

    def metric() -> float:
        with torch.no_grad():
            last = hf(task.corrupted_tokens).logits[:, -1].float()
        rows = torch.arange(len(task))
        return float((last[rows, task.answers] - last[rows, task.wrong_answers]).double().mean())

    keep = proj.register_forward_hook(lambda m, a, out: got.__setitem__("q", out.detach().clone()))
    with torch.no_grad():
        hf(task.tokens)
    keep.remove()
    base = metric()

    def put(m, a, out):
        out = out.clone()
        out[..., head * d:(head + 1) * d] = got["q"][..., head * d:(head + 1) * d]
        return out

    handle = proj.register_forward_hook(put)
    try:
        return base, metric()
    finally:
        handle.remove()


def test_a_q_cell_equals_hugging_face_by_hand(bf16_llama, tiny_dirs):
    """q at L1H2 against plain HF (clean q_proj slice written into the corrupted run): in bfloat16 within one rounding
    step of the metric (two for the patched value) plus the amount Hugging Face's own eager and SDPA kernels disagree
    by (headscope's passes mix both: hooked blocks eager, resumed hook-free ones SDPA; under transformers 5.25 the
    two kernels' patched values differ by 0.024 logits, 2.6 steps, on this task); to 1e-5 in float32 (the null runs
    change nothing there)."""
    task = _task(False)
    for model, dtype, tol in ((bf16_llama, torch.bfloat16, None),
                              (hs.load_model(tiny_dirs["llama"], device="cpu"), torch.float32, 1e-5)):
        res = hs.activation_patching(model, task, sites=["q"])
        cell = res.df[(res.df["layer"] == 1) & (res.df["head"] == 2)].iloc[0]
        base, patched = _hf_q_patch(tiny_dirs["llama"], dtype, task, 1, 2)
        other = _hf_q_patch(tiny_dirs["llama"], dtype, task, 1, 2, impl="sdpa")
        step = metrics.noise_floor(dtype, max(abs(base), abs(patched)))
        kernels = (abs((other[1] - other[0]) - (patched - base)), abs(other[1] - patched))  # HF's own disagreement
        assert cell["effect"] == pytest.approx(patched - base, abs=tol or step + kernels[0]), \
            (dtype, cell["effect"], patched - base, other)
        assert cell["value"] == pytest.approx(patched, abs=tol or 2 * step + kernels[1]), (dtype, cell["value"], patched, other)
        floor = res.summary["rounding_floor"]
        size = max(abs(res.summary["clean_metric"]), abs(res.summary["corrupted_metric"]))
        assert floor["floor"] == pytest.approx(metrics.noise_floor(dtype, size))  # no identity cell: one step
        for r in res.summary["top_sites"]["q"]:
            assert r["within_rounding"] == (abs(r["effect"]) <= floor["floor"])


def test_finding_says_an_effect_within_the_rounding_floor_instead_of_its_interval():
    """The review's k L2H0 (0.0108, 95% CI [0.0026, 0.019], floor 0.075 logits): 'within the rounding floor of 0',
    no interval clear of 0."""
    cell = {"layer": 2, "head": 0, "pos": None, "token": "all", "effect": 0.0108, "ci": [0.0026, 0.019], "n": 40,
            "within_rounding": True}
    top = {"layer": 1, "head": 1, "pos": None, "token": "all", "effect": 2.5, "ci": [2.0, 3.0], "n": 40,
           "within_rounding": False}
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 40, "clean_metric": 9.55,
         "corrupted_metric": -9.56, "n_heads": 4, "n_kv_heads": 2, "top_sites": {"q": [top], "k": [cell]},
         "rounding_floor": {"floor": 0.0747, "basis": "one rounding step", "n_cells": 0}}
    said = finding("patching", s)
    assert ("(0.00, within the rounding floor of 0 (+0.011 logit difference against 0.075, 40 examples): not told "
            "apart from 0)") in said, said
    assert "[0.00, 0.00]" not in said and "95% CI [0.10, 0.16] over 40 examples" in said


def test_a_top_cell_within_the_rounding_floor_lists_no_ties_and_names_its_effect_apart_from_the_floor():
    """Review 19w B2: the top k cell within rounding of 0 listed six KV heads 'not told apart' from it (ties with a
    cell that is itself no evidence say nothing), and the floor's clause '..., 0.075 (+0.0891 logit difference)' read
    as the floor in logits: the floor carries its unit, the effect is named as such."""
    top = {"layer": 0, "head": 0, "pos": None, "token": "all", "effect": 0.0108, "ci": [0.0026, 0.019], "n": 40,
           "within_rounding": True}
    other = {"layer": 0, "head": 1, "pos": None, "token": "all", "effect": 0.0101, "ci": [0.002, 0.018], "n": 40,
             "within_rounding": True, "vs_top": [-0.002, 0.003]}
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 40, "clean_metric": 9.55,
         "corrupted_metric": -9.56, "n_heads": 4, "n_kv_heads": 2, "top_sites": {"k": [top, other]},
         "rounding_floor": {"floor": 0.0747, "basis": "one rounding step", "n_cells": 0}}
    said = finding("patching", s)
    assert "not told apart from 0" in said and "not told apart from layer" not in said and "tied with" not in said, said
    wide = {**top, "effect": 0.5, "ci": [0.05, 0.95], "within_rounding": False}
    said = finding("patching", {**s, "top_sites": {"k": [wide]}})
    assert ("its end nearest 0, +0.05 logit difference, lies within the rounding floor (0.075 logit difference); the "
            "effect itself +0.5 logit difference") in said, said
