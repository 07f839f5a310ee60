"""headscope.analyses.core.tasks.zoo: Tasks over the zoo data, tokenized by a model's tokenizer."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from headscope.analyses.core import tasks
from headscope.models.zoo import data, vocab


@pytest.fixture(scope="module")
def model():
    return SimpleNamespace(tokenizer=vocab.build_tokenizer())


@pytest.mark.parametrize("task", data.TASKS)
def test_task_shapes_and_answers(model, task):
    t = tasks.zoo(model, task, n_examples=32, seed=1)
    assert t.name == task and t.metric == "logit_diff"
    assert t.tokens.dtype == torch.int64 and t.tokens.shape[0] == 32
    assert t.corrupted_tokens.shape == t.tokens.shape
    assert (t.tokens[:, 0] == model.tokenizer.bos_token_id).all()
    assert (t.answers != t.wrong_answers).all()
    for span in t.spans.values():
        assert span.shape == (32, 2) and span.dtype == torch.int64
        assert ((span[:, 0] < span[:, 1]) & (span[:, 1] <= t.tokens.shape[1])).all()
    # the ids are those of the word-level prompts
    ex = next(data.examples(task, 1, seed=1, **({"position": 12} if task == "induction" else {})))
    assert model.tokenizer.convert_ids_to_tokens(t.tokens[0].tolist()) == list(ex.prompt)


def test_kv_gold_span_holds_the_answer(model):
    t = tasks.zoo(model, "kv", n_examples=16, n_pairs=12)
    assert t.tokens.shape[1] == 1 + 3 * 12 + 1
    value_pos = t.spans["gold"][:, 1] - 1  # [batch]
    assert (t.tokens[torch.arange(16), value_pos] == t.answers).all()


def test_deterministic_for_a_seed(model):
    a, b = tasks.zoo(model, "ioi", seed=5), tasks.zoo(model, "ioi", seed=5)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.corrupted_tokens, b.corrupted_tokens)


def test_bad_input(model):
    with pytest.raises(ValueError, match="kv, induction, facts, ioi"):
        tasks.zoo(model, "sva")
    with pytest.raises(ValueError, match="n_examples"):
        tasks.zoo(model, "kv", n_examples=0)
    with pytest.raises(ValueError, match="tokenizer"):
        tasks.zoo(SimpleNamespace(), "kv")
