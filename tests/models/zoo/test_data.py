"""Properties of the zoo's data generators (words) and training batches (ids)."""
from __future__ import annotations

import numpy as np
import pytest

from headscope.models.zoo import batches, data, vocab

N = 200


def _all(task, seed=0, **kw):
    return list(data.examples(task, N, seed=seed, **kw))


@pytest.mark.parametrize("task", data.TASKS)
def test_prompts_start_with_bos_and_corruptions_have_same_length(task):
    for ex in _all(task):
        assert ex.prompt[0] == vocab.BOS and ex.corrupted[0] == vocab.BOS
        assert len(ex.prompt) == len(ex.corrupted)
        assert ex.answer != ex.corrupted_answer
        for start, end in ex.spans.values():
            assert 0 <= start < end <= len(ex.prompt)
        vocab.ids(ex.prompt + ex.corrupted + (ex.answer, ex.corrupted_answer))  # all in vocab


@pytest.mark.parametrize("task", data.TASKS)
def test_deterministic_for_a_seed(task):
    assert _all(task, seed=3) == _all(task, seed=3)
    assert _all(task, seed=3) != _all(task, seed=4)


@pytest.mark.parametrize("n_pairs", [4, 8, 24])
def test_kv_answer_in_context_right_after_queried_key(n_pairs):
    positions = []
    for ex in _all("kv", n_pairs=n_pairs):
        assert len(ex.prompt) == 1 + 3 * n_pairs + 1
        query = ex.prompt[-1]
        context = ex.prompt[:-1]
        assert context.count(query) == 1  # keys are distinct
        k = context.index(query)
        assert context[k + 1] == ex.answer
        assert ex.spans["gold"] == (k, k + 2)
        assert ex.corrupted_answer in context and ex.corrupted[-1] != query
        positions.append((k - 1) // 3)
    # the queried pair's position is spread over the context, not fixed
    assert len(set(positions)) == n_pairs


def test_facts_answer_never_in_context_and_table_is_fixed():
    table = data.fact_table()
    assert len(table.subjects) == data.N_SUBJECTS == len(set(table.subjects))
    assert all(len(objs) == len(vocab.RELATIONS) for objs in table.objects)
    for ex in _all("facts"):
        assert ex.answer not in ex.prompt
        assert ex.corrupted_answer not in ex.corrupted
        s = table.subjects.index(tuple(ex.prompt[1:3]))
        assert table.objects[s][ex.prompt[3]] == ex.answer
        assert ex.prompt[3] == ex.corrupted[3] and ex.prompt[1:3] != ex.corrupted[1:3]
    data.fact_table.cache_clear()
    assert data.fact_table() == table  # a function of FACTS_SEED only


def test_ioi_answer_is_the_io_name():
    orders = set()
    for ex in _all("ioi"):
        names = [w for w in ex.prompt if w in vocab.NAMES]
        assert len(names) == 3
        counts = {n: names.count(n) for n in names}
        assert counts[ex.answer] == 1  # IO occurs once
        (s,) = [n for n, c in counts.items() if c == 2]
        assert ex.corrupted_answer == s
        assert ex.prompt[ex.spans["io"][0]] == ex.answer
        assert ex.prompt[ex.spans["s2"][0]] == s and ex.corrupted[ex.spans["s2"][0]] == ex.answer
        orders.add(ex.spans["io"][0] < ex.spans["s1"][0])
    assert orders == {True, False}  # both name orders


def test_ioi_eval_name_pairs_are_held_out_of_training():
    pairs = data.ioi_name_pairs()
    assert not set(pairs["train"]) & set(pairs["eval"])
    for ex in _all("ioi", split="eval"):
        assert tuple(sorted((ex.answer, ex.corrupted_answer), key=vocab.NAMES.index)) in pairs["eval"]


def test_induction_answer_copies_first_half():
    for ex in _all("induction", length=10):
        j = ex.spans["source"][0]
        assert ex.prompt[j] == ex.answer and ex.corrupted[j] == ex.corrupted_answer
        assert ex.prompt[11:] == ex.prompt[1 : len(ex.prompt) - 10]


def test_unknown_task_lists_valid_ones():
    with pytest.raises(ValueError, match="kv, induction, facts, ioi"):
        list(data.examples("nope", 1, seed=0))


def test_kv_training_batch_targets_are_values_of_repeated_keys():
    b = batches.kv_batch(np.random.default_rng(0), batch=16, n_min=2, n_max=12, n_queries=4)
    tok, tgt = b.tokens.numpy(), b.targets.numpy()
    for row, trow in zip(tok, tgt):
        for p in np.flatnonzero(trow != batches.IGNORE):
            first = int(np.flatnonzero(row[:p] == row[p])[0])  # the key occurred before
            assert row[first + 1] == trow[p]


def test_induction_training_batch_supervises_second_half_only():
    b = batches.induction_batch(np.random.default_rng(0), batch=8, len_min=5, len_max=5)
    assert b.tokens.shape == (8, 11)
    assert (b.targets[:, :6] == batches.IGNORE).all() and (b.targets[:, 6:10] == b.tokens[:, 2:6]).all()
