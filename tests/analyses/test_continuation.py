"""Answers of several tokens (#19 item 5): scored by the log-probability of their whole continuation.

User data whose answers tokenize to several tokens (mixed prompt lengths, mixed answer lengths, the
user's own column names) becomes a Task whose prompts go on with all but the last answer token. The
references are plain Hugging Face on each row alone, unpadded, fed the prompt followed by the whole
answer: log p(answer) = sum_j log softmax(logits at the token before answer token j)[answer token j].
Analyses that read one next-token answer refuse such a task in one line and the report runs them on
their defaults; heads and patching score the continuation.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

import headscope as hs
from headscope.analyses.core import chance
from headscope.analyses.core.contract import check
from headscope.analyses.core.metrics import task_metric
from headscope.analyses.core.registry import ANALYSES, needs
from headscope.analyses.core.tasks import Task
from headscope.errors import HeadscopeWarning, TaskError, TaskFileError
from tests_support import MIXED_FIELDS, hf_out_proj, hf_z_edit, mixed_length_rows

ARCHS = ("gpt2", "llama3")
TOL = 1e-4
CONTINUATION_ANALYSES = {"heads", "patching"}


def _rows(model, n: int = 6) -> list[dict]:
    """mixed_length_rows with answers of 1, 2 and 3 words (one token each under the tokenizer)."""
    rows = mixed_length_rows(model, n)
    for i, row in enumerate(rows):
        row["label"] = row["label"] + row["other"] * (i % 3)
    return rows


def _answer_ids(model, row) -> list[int]:
    return model.tokenizer(row["label"], add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def continuation_task(arch_models):
    """arch -> (rows, the Task load_task makes of them)."""
    import functools

    def build(arch):
        model = arch_models(arch)
        rows = _rows(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HeadscopeWarning)
            return rows, hs.load_task(model, rows, MIXED_FIELDS)

    return functools.cache(build)


def _hf_logprob(hf, prompt_ids: list[int], answer: list[int], edit=None, own: bool = False) -> torch.Tensor:
    """Plain HF on prompt + whole answer, unpadded: the sum of each answer token's log-probability (own: of the
    mean log-probability over the vocabulary at each answer position)."""
    ids = torch.tensor([prompt_ids + answer])
    with torch.no_grad(), hf_z_edit(hf, edit) if edit else contextlib.nullcontext():
        logp = hf(ids).logits[0].double().log_softmax(-1)  # [pos, vocab]
    start = len(prompt_ids) - 1
    return sum(logp[start + j].mean() if own else logp[start + j, a] for j, a in enumerate(answer))


def _prompt_ids(model, text: str) -> list[int]:
    return model.to_tokens(text, warn_unknown=False)[0].tolist()


def test_the_task_carries_each_answer_as_a_continuation(arch_models):
    model = arch_models("gpt2")
    rows = _rows(model)
    with pytest.warns(HeadscopeWarning, match="wrong answers are not used"):
        task = hs.load_task(model, rows, MIXED_FIELDS)
    lengths = [len(_answer_ids(model, r)) for r in rows]
    assert sorted(set(lengths)) == [1, 2, 3] and task.n_answer_tokens == 3
    assert task.metric == "logprob" and task.wrong_answers is None
    for i, row in enumerate(rows):
        answer, real = _answer_ids(model, row), task.attention_mask[i].bool()
        assert task.tokens[i, real].tolist() == _prompt_ids(model, row["text"]) + answer[:-1]
        assert task.corrupted_tokens[i, real].tolist() == _prompt_ids(model, row["bad"]) + answer[:-1]
        assert task.continuation[i].tolist() == [-1] * (3 - len(answer)) + answer
        assert int(task.answers[i]) == answer[-1]
        assert task.example(i).continuation.tolist() == [answer]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_metric_is_the_whole_continuations_log_probability(arch, arch_models, hf_of, continuation_task):
    model, hf = arch_models(arch), hf_of(arch)
    rows, task = continuation_task(arch)
    with torch.no_grad():
        out = model(task.tokens, attention_mask=task.attention_mask)
    got = task_metric(task)(out)
    want = torch.stack([_hf_logprob(hf, _prompt_ids(model, r["text"]), _answer_ids(model, r)) for r in rows])
    assert (got.double() - want).abs().max() <= TOL * (1 + want.abs().max())
    # accuracy: every answer token the argmax (greedy decoding would write the answer)
    acc = task_metric(task, kind="accuracy")(out)
    for i, r in enumerate(rows):
        ids = torch.tensor([_prompt_ids(model, r["text"]) + _answer_ids(model, r)])
        k = len(_answer_ids(model, r))
        with torch.no_grad():
            greedy = hf(ids).logits[0, -k - 1:-1].argmax(-1)
        assert float(acc[i]) == float(torch.equal(greedy, ids[0, -k:]))


@pytest.mark.parametrize("arch", ARCHS)
def test_zero_ablation_importance_against_hf_per_example(arch, arch_models, hf_of, continuation_task):
    """Each head's zero-ablation importance = the mean over examples of plain HF's continuation
    log-probability minus the same with that head's z zeroed."""
    model, hf = arch_models(arch), hf_of(arch)
    rows, task = continuation_task(arch)
    got = hs.head_importance(model, task, methods=("zero",))
    prompts = [_prompt_ids(model, r["text"]) for r in rows]
    answers = [_answer_ids(model, r) for r in rows]
    clean = torch.stack([_hf_logprob(hf, p, a) for p, a in zip(prompts, answers)])
    assert got.summary["baseline_metric"] == pytest.approx(float(clean.mean()), abs=TOL * (1 + float(clean.abs().max())))
    for rec in got.df.itertuples():
        def zero(layer, z, rec=rec):
            if layer != rec.layer:
                return z
            z = z.clone()
            z[:, :, rec.head] = 0
            return z
        ablated = torch.stack([_hf_logprob(hf, p, a, zero) for p, a in zip(prompts, answers)])
        want = float((clean - ablated).mean())
        assert rec.importance == pytest.approx(want, abs=TOL * (1 + abs(want) + float(clean.abs().max())))
    assert got.df["importance"].abs().max() > 1e-3
    # review 11b A2: the rounding is sized by each answer's sum over its tokens of 1 - p (plain HF's p)
    sens = sum(float((1 - _hf_token_logprobs(hf, p, a).exp()).sum()) for p, a in zip(prompts, answers)) / len(rows)
    assert got.summary["rounding_sensitivity"] == pytest.approx(sens, rel=1e-4)
    step = 2.0 ** -23 * got.summary["readout_size"]  # one float32 step of the logits
    assert got.summary["noise_floor"] == pytest.approx(max(step * sens, step))


def _hf_token_logprobs(hf, prompt_ids: list[int], answer: list[int]) -> torch.Tensor:
    """[k] each answer token's log-probability in plain HF (prompt + whole answer, unpadded)."""
    with torch.no_grad():
        logp = hf(torch.tensor([prompt_ids + answer])).logits[0].double().log_softmax(-1)  # [pos, vocab]
    start = len(prompt_ids) - 1
    return torch.stack([logp[start + j, a] for j, a in enumerate(answer)])


def test_patching_a_head_restores_the_continuation_as_in_hf(arch_models, hf_of, continuation_task):
    """Denoising head_out: the corrupted run with one head's z taken from the clean run, scored by the
    clean answer's continuation log-probability, per example in plain HF and averaged."""
    model, hf = arch_models("gpt2"), hf_of("gpt2")
    rows, task = continuation_task("gpt2")
    got = hs.activation_patching(model, task, "head_out")
    assert got.summary["metric"] == "logprob"
    answers = [_answer_ids(model, r) for r in rows]
    clean_ids = [_prompt_ids(model, r["text"]) for r in rows]
    corrupt_ids = [_prompt_ids(model, r["bad"]) for r in rows]
    n_heads = hf.config.num_attention_heads
    captured = []  # per example: layer -> clean z [1, pos, head, d_head]
    for p, a in zip(clean_ids, answers):
        z_of: dict[int, torch.Tensor] = {}
        def keep(layer, z_of=z_of):
            return lambda mod, args: z_of.__setitem__(layer, args[0].view(*args[0].shape[:2], n_heads, -1).clone())

        handles = [hf_out_proj(hf, layer).register_forward_pre_hook(keep(layer))
                   for layer in range(hf.config.num_hidden_layers)]
        try:
            with torch.no_grad():
                hf(torch.tensor([p + a]))  # as _hf_logprob feeds it
        finally:
            for h in handles:
                h.remove()
        captured.append(z_of)
    corrupt = torch.stack([_hf_logprob(hf, c, a) for c, a in zip(corrupt_ids, answers)])
    assert got.summary["corrupted_metric"] == pytest.approx(float(corrupt.mean()), abs=TOL * (1 + float(corrupt.abs().max())))
    for rec in got.df.itertuples():
        values = []
        for c, a, z_of in zip(corrupt_ids, answers, captured):
            def restore(layer, z, rec=rec, z_of=z_of):
                if layer != rec.layer:
                    return z
                z = z.clone()
                z[:, :, rec.head] = z_of[layer][:, :, rec.head]
                return z
            values.append(_hf_logprob(hf, c, a, restore))
        want = float(torch.stack(values).mean())
        assert rec.value == pytest.approx(want, abs=TOL * (1 + abs(want)))


def _hf_resid_patched(hf, corrupt: list[int], clean: list[int], answer: list[int], layer: int, at: int) -> torch.Tensor:
    """Plain HF on corrupted prompt + answer with block `layer`'s input at position `at` (counted in the unpadded
    sequence) taken from the same run on the clean prompt + answer: the answer's log-probability."""
    with torch.no_grad():
        source = hf(torch.tensor([clean + answer]), output_hidden_states=True).hidden_states[layer]  # [1, pos, d]
    block = hf.transformer.h[layer] if hf.config.model_type == "gpt2" else hf.model.layers[layer]

    def put(module, args, kwargs):
        hidden = (args[0] if args else kwargs["hidden_states"]).clone()
        hidden[:, at] = source[:, at]
        return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})

    handle = block.register_forward_pre_hook(put, with_kwargs=True)
    try:
        return _hf_logprob(hf, corrupt, answer)
    finally:
        handle.remove()


def test_patching_positions_count_from_each_prompts_last_token_on_answers_of_one_and_three_tokens(arch_models, hf_of):
    """Review 11b C1: counted from the end of the row, position -1 was the prompt's last token on one-token rows and
    the answer's last teacher-forced piece on three-token rows (an average of two roles). Every resid_pre cell at -1
    and -2 is plain HF's mean effect of restoring the clean residual at each prompt's own last (and second-last)
    token, scored by the whole answer; the answer pieces are no position, and the summary and finding say so."""
    from headscope.reports.findings import finding

    model, hf = arch_models("gpt2"), hf_of("gpt2")
    rows = mixed_length_rows(model, 6)
    for i, row in enumerate(rows):
        row["label"] = row["label"] + row["other"] * 2 * (i % 2)  # answers of 1 and 3 tokens
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HeadscopeWarning)
        task = hs.load_task(model, rows, MIXED_FIELDS)
    answers = [_answer_ids(model, r) for r in rows]
    assert sorted({len(a) for a in answers}) == [1, 3]
    got = hs.activation_patching(model, task, ["resid_pre", "attn_out"])
    clean_ids = [_prompt_ids(model, r["text"]) for r in rows]
    corrupt_ids = [_prompt_ids(model, r["bad"]) for r in rows]
    base = torch.stack([_hf_logprob(hf, c, a) for c, a in zip(corrupt_ids, answers)])
    cells = got.df[got.df.site_type == "resid_pre"].set_index(["layer", "position_from_end"])
    # review 12b A1: the last layer's attn_out before the prompt's last token is never read, pieces or not
    last = got.df[(got.df.site_type == "attn_out") & (got.df.layer == hf.config.num_hidden_layers - 1)]
    unread = last["position_from_end"] < -1
    assert (last["never_read"] == unread).all() and not got.df.loc[got.df.site_type == "resid_pre", "never_read"].any()
    assert last.loc[unread, "effect"].abs().max() < 1e-5 < abs(float(last.loc[~unread, "effect"].item()))
    assert got.summary["never_read"]["cells"] == int(unread.sum())
    for layer in range(hf.config.num_hidden_layers):
        for end in (-1, -2):
            effect = torch.stack([_hf_resid_patched(hf, c, p, a, layer, len(c) + end)
                                  for c, p, a in zip(corrupt_ids, clean_ids, answers)]) - base
            cell = cells.loc[(layer, end)]
            assert int(cell["n_rows"]) == len(rows)
            assert float(cell["effect"]) == pytest.approx(float(effect.mean()), abs=TOL * (1 + float(base.abs().max())))
    three = sum(len(a) == 3 for a in answers)
    pieces = sum(len(a) - 1 for a in answers)  # every answer token but the last is a forced piece at the row's end
    assert got.summary["answer_pieces"] == {"rows": three, "max": 2, "positions": "from the prompt's end",
                                            "left_out": pieces}
    assert got.df["position_from_end"].min() >= -max(len(c) for c in clean_ids)  # no cell past the longest prompt
    summary = got.summary
    assert (f"Positions count from each prompt's last token (-1, where the answer's first token is read): {three} of "
            f"{len(rows)} prompts run on with up to 2 tokens of their answer (teacher forcing), which no position "
            f"shows: the cells at those {pieces} answer positions are patched but not reported in any table or "
            "map.") in finding("patching", summary)
    from headscope.reports.provenance import provenance_lines, task_record

    record = task_record(model, "patching", task, summary, "your task (rows)")  # the section's provenance lines
    assert (f"answer pieces: {three} of {len(rows)} prompts have answers of several tokens, run on with up to 2 of "
            "their tokens (teacher forcing); positions count from each prompt's last token, and the cells at those "
            f"{pieces} answer positions are patched but not reported") in provenance_lines(record)
    ranked = {k: v for k, v in summary.items() if k != "gap_within_noise"}  # random weights: rank the cells anyway
    text = finding("patching", ranked)  # review 12c: the cells are named by their place from the prompt's end
    assert re.search(r"position -\d+ from the prompt's end", text) and " from the end" not in text.replace(
        "each column one place from the end", ""), text
    from headscope.reports.plots_patching import figures

    label = " ".join(figures(got)["exact_resid_pre"].axes[0].get_xlabel().split())  # the label's line breaks as spaces
    assert label.startswith("position from the prompt's end (the answer's teacher-forced pieces left out"), label
    assert "n = 0" not in label and got.df["n_rows"].min() >= 1  # no column that no prompt reaches


def test_analyses_that_read_one_next_token_refuse_in_one_line(arch_models, continuation_task):
    model = arch_models("gpt2")
    _, task = continuation_task("gpt2")
    for name in ANALYSES:
        reasons = check(needs(name), task, model)
        several = [r for r in reasons if "tokens long" in r]
        if name in CONTINUATION_ANALYSES or name == "position":
            assert several == [], (name, reasons)
        else:
            assert len(several) == 1 and "one next-token answer" in several[0], (name, reasons)
    for call in (lambda: hs.direct_logit_attribution(model, task), lambda: hs.attribution(model, task),
                 lambda: hs.kv_analysis(model, task), lambda: hs.probe_sweep(model, task, labels="answer"),
                 lambda: hs.activation_patching(model, task, "head_out", metric="logit_diff")):
        with pytest.raises(TaskError) as err:
            call()
        assert "\n" not in str(err.value) and ("several tokens" in str(err.value) or "tokens long" in str(err.value))
    with pytest.raises(TaskError, match="one next token"):
        Task(name="t", tokens=task.tokens, answers=task.answers, wrong_answers=task.answers, metric="logit_diff",
             continuation=task.continuation)


def test_an_encoder_refuses_an_answer_of_several_tokens(arch_models):
    model = arch_models("bert")
    rows = [{"prompt": "the cat sat on the", "answer": " mat and the cat"}, {"prompt": "a dog", "answer": " ran"}]
    with pytest.raises(TaskFileError, match="must be one token here") as err:
        hs.load_task(model, rows)
    assert "\n" not in str(err.value)


def test_the_chance_guard_counts_each_token_of_a_continuation(arch_models, hf_of, continuation_task):
    """Chance for a k-token continuation is the model's own mean log-probability over the vocabulary at its k
    positions, summed (review 13a A2: not k log(1/V), under which every token of an uneven model falls); the
    reported mean is HF's mean."""
    model, hf = arch_models("gpt2"), hf_of("gpt2")
    rows, task = continuation_task("gpt2")
    found = chance.model_on_task(model, dataclasses.replace(task, wrong_continuation=None))  # no wrong answers
    lengths = [len(_answer_ids(model, r)) for r in rows]
    vocab = hf.config.vocab_size
    own = [float(_hf_logprob(hf, _prompt_ids(model, r["text"]), _answer_ids(model, r), own=True)) for r in rows]
    assert found["chance_from"] == "vocabulary_mean" and found["chance_value"] == pytest.approx(np.mean(own), abs=1e-3)
    assert found["uniform_chance"] == pytest.approx(-sum(lengths) / len(lengths) * math.log(vocab))
    # what the findings' chance sentence names: the task, its mean answer length and the vocabulary
    assert found["task"] == task.name and found["vocab_size"] == vocab
    assert found["answer_tokens"] == pytest.approx(sum(lengths) / len(lengths))
    # review 11b A6: the heads pruning tolerance's scale is the uniform guess, the chance record's uniform_chance
    from headscope.analyses.heads.importance import make_scorer

    assert make_scorer(model, task).chance == pytest.approx(-sum(lengths) / len(lengths) * math.log(vocab))
    want = torch.stack([_hf_logprob(hf, _prompt_ids(model, r["text"]), _answer_ids(model, r)) for r in rows])
    assert found["mean"] == pytest.approx(float(want.mean()), abs=1e-3)
    # review 11b A1: the interval is the metric's own (scipy's t interval of HF's per-row values), and each row is
    # set against its own chance, per answer token
    ci = stats.ttest_1samp(want.double().numpy(), 0.0).confidence_interval(0.95)
    assert found["ci"] == pytest.approx([ci.low, ci.high], abs=1e-3)
    assert found["chance_range"] == pytest.approx([min(own), max(own)], abs=1e-3)
    per_token = (want.double().numpy() - np.array(own)) / np.array(lengths)
    assert found["margin"]["mean"] == pytest.approx(per_token.mean(), abs=1e-3)
    assert found["margin"]["n"] == len(rows) and found["answer_tokens_range"] == [min(lengths), max(lengths)]


def test_the_report_runs_heads_and_patching_on_a_file_with_answers_of_several_tokens(arch_dirs, arch_models, tmp_path):
    from headscope.cli import main

    model = arch_models("gpt2")
    task = tmp_path / "answers.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in _rows(model, 8)), encoding="utf-8")
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["-q", "report", "--quick", "--device", "cpu", "--model", str(arch_dirs["gpt2"]), "--task", str(task),
                     "--task-fields", ",".join(f"{k}={v}" for k, v in MIXED_FIELDS.items()), "--out", str(out)])
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert code == 0 and all(s == "done" for s in manifest["status"].values()), manifest["status"]
    ours = {name for name, line in manifest["task_used"].items() if line == "your task (answers.jsonl)"}
    assert ours == CONTINUATION_ANALYSES, manifest["task_used"]
    for name in set(ANALYSES) - ours - {"position"}:
        assert "tokens long" in manifest["task_used"][name], (name, manifest["task_used"][name])


def test_the_chance_guard_of_a_continuation_with_wrong_answers_is_against_them(arch_models, hf_of):
    """Review 14a A1: with wrong answers, an answer log-probability's chance is no preference between the answer and
    the wrong answer, not the vocabulary mean. (1) Each row's log-odds log P(answer) - log P(wrong answer) of the whole
    continuations is plain HF's on the prompt alone, wrong answers of one and several tokens. (2) Answers the model itself
    predicts (its greedy two tokens: far above its vocabulary mean, what the old guard called above chance) with the
    same text as wrong answer: it cannot tell them apart, log-odds exactly 0, at chance."""
    from headscope.models.hooked_model import pad_token_rows

    model, hf = arch_models("gpt2"), hf_of("gpt2")
    rows = _rows(model)
    for i, row in enumerate(rows):  # wrong answers of one to three tokens, beside answers of one to three
        row["other"] = row["other"] + row["label"] * (i % 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HeadscopeWarning)
        task = hs.load_task(model, rows, MIXED_FIELDS)
    wrong_ids = [model.tokenizer(r["other"], add_special_tokens=False)["input_ids"] for r in rows]
    assert min(map(len, wrong_ids)) == 1 < max(map(len, wrong_ids)) and task.wrong_continuation is not None
    answer = np.array([float(_hf_logprob(hf, _prompt_ids(model, r["text"]), _answer_ids(model, r))) for r in rows])
    wrong = np.array([float(_hf_logprob(hf, _prompt_ids(model, r["text"]), w)) for r, w in zip(rows, wrong_ids)])
    odds = answer - wrong  # [rows]
    found = chance.model_on_task(model, task)
    ci = stats.ttest_1samp(odds, 0.0).confidence_interval(0.95)
    assert found["chance_from"] == "wrong_answers" and found["metric"] == "logprob"
    assert found["mean"] == pytest.approx(answer.mean(), abs=1e-3)
    assert found["chance_value"] == pytest.approx(wrong.mean(), abs=1e-3)
    assert found["margin"]["mean"] == pytest.approx(odds.mean(), abs=1e-3)
    assert found["margin"]["ci"] == pytest.approx([ci.low, ci.high], abs=1e-3)
    assert found["margin"]["n_above"] == int((odds > 0).sum()) and found["margin"]["n"] == len(rows)

    prompts = [_prompt_ids(model, r["text"]) for r in rows]
    greedy = []
    with torch.no_grad():
        for p in prompts:
            first = int(hf(torch.tensor([p])).logits[0, -1].argmax())
            greedy.append([first, int(hf(torch.tensor([p + [first]])).logits[0, -1].argmax())])
    tokens, mask = pad_token_rows([p + g[:1] for p, g in zip(prompts, greedy)], 0, left=True)
    cont = torch.tensor(greedy)
    same = Task(name="greedy", tokens=tokens, answers=cont[:, -1], attention_mask=mask, continuation=cont,
                metric="logprob", wrong_continuation=cont.clone())
    found = chance.model_on_task(model, same)
    assert found["margin"]["mean"] == pytest.approx(0.0, abs=1e-6) and found["margin"]["n_above"] == 0
    assert found["at_chance"] is True and found["below_chance"] is False
    assert found["vocabulary"]["at_chance"] is False  # the old guard alone: above chance
    old = chance.model_on_task(model, dataclasses.replace(same, wrong_continuation=None))
    assert old["chance_from"] == "vocabulary_mean" and old["at_chance"] is False
