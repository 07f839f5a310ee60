"""The probes analysis: labels from Task spans by hand, per-layer scores against plain scikit-learn
on Hugging Face hidden states, selectivity on a decodable label, and the zoo model's kv task."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from headscope.analyses.core.tasks import Task
from headscope.analyses.probes import analysis as probes
from headscope.analyses.probes.scores import layer_scores
from tests_support import hf_model, random_tokens


def test_labels_from_task_spans_by_hand():
    tokens = torch.tensor([[2, 10, 11, 5, 12, 13, 5, 12],
                           [2, 14, 15, 5, 16, 17, 5, 14],
                           [2, 12, 15, 5, 10, 17, 5, 10]])
    spans = {"gold": torch.tensor([[4, 6], [1, 3], [4, 6]]), "query": torch.tensor([[7, 8], [7, 8], [7, 8]])}
    task = Task(name="kv", tokens=tokens, answers=torch.tensor([13, 15, 17]), spans=spans)
    pair = probes.task_labels(task, "query_pair")
    assert pair.labels.tolist() == [1, 0, 1] and pair.kind == "classification"  # second, first, second pair
    assert pair.types.tolist() == [12, 14, 10]  # control types: the token at the answer position
    assert probes.task_labels(task, "span:query").labels.tolist() == [1, 2, 0]  # keys 12, 14, 10 -> ids by value
    assert probes.task_labels(task, "span:gold").labels.tolist() == [1, 2, 0]  # (12,13), (14,15), (10,17)
    assert probes.task_labels(task, "answer").labels.tolist() == [13, 15, 17]
    pos = probes.task_labels(task, "position")
    assert pos.all_positions and pos.kind == "regression" and pos.labels[:9].tolist() == [*range(8), 0]
    with pytest.raises(ValueError, match="span of \\['gold', 'query'\\]"):
        probes.task_labels(task, "span:subject")


def test_position_probe_matches_sklearn_on_hf_hidden_states_and_beats_its_control(tiny_dirs, tiny_models):
    """GPT-2's learned positions are linearly decodable from the residual stream; the per-type control is not."""
    model, tokens = tiny_models["gpt2"], random_tokens(30, 10, seed=8)
    result = probes.probe_sweep(model, tokens, "resid_pre", labels="position", cv=3, seed=0)
    with torch.no_grad():
        hidden = hf_model(tiny_dirs["gpt2"])(tokens, output_hidden_states=True).hidden_states  # [0]: embeddings
    y = np.tile(np.arange(10), 30).astype(float)
    for layer in range(2):
        X = hidden[layer].reshape(-1, hidden[layer].shape[-1]).numpy()
        ref = cross_val_score(make_pipeline(StandardScaler(), Ridge(alpha=1.0)), X, y, cv=KFold(3, shuffle=True, random_state=0))
        rows = result.df[(result.df.task == "real") & (result.df.layer == layer)]
        np.testing.assert_allclose(rows.sort_values("fold").score.to_numpy(), ref, atol=1e-4)
    table = result.tables["per_layer"]
    assert table.r2.iloc[0] > 0.9  # token + position embeddings: positions are linearly independent
    # 60 word types in 64 dims: the embeddings determine the type linearly, so a per-type random
    # label is memorised there (Hewitt & Liang's point), and selectivity is what is left
    assert table.control.iloc[0] > 0.5 and table.control.iloc[1] < 0.1
    assert (table.selectivity > 0.2).all()
    assert result.summary["metric"] == "r2" and result.summary["best_layer"] == 0
    from headscope.reports.plots_probes import figures

    assert set(figures(result)) == {"probes"}


def test_a_control_task_of_one_word_type_leaves_selectivity_undefined(tiny_models):
    """#34: every prompt ends in the same word, so the control task (one random label per word type at
    the read position) is one constant label: selectivity is None with the reason, not 0 read as
    memorising; the same prompts ending in several words keep a measured selectivity."""
    from headscope.reports.findings import probes_finding

    model, tokens = tiny_models["gpt2"], random_tokens(24, 6, seed=3)
    tokens[:, -1] = 7  # the read position (-1): one token id in every prompt
    answers = torch.tensor([10, 11, 12] * 8)  # three classes of eight
    assert len(set(tokens[:, -1].tolist())) == 1  # the word types at the read position, counted here
    got = probes.probe_sweep(model, Task(name="same_end", tokens=tokens, answers=answers), labels="answer",
                             layers=[0, 1], cv=3, capacity=(0.01, 1.0))
    s = got.summary
    # no selectivity to pick a strength by: no sweep, the default C, and the summary says why
    assert "capacity" not in got.tables and s["capacity"] is None and "not measurable" in s["capacity_skipped"]
    assert got.tables["per_layer"].strength.tolist() == [1.0, 1.0]
    # one quantity: out-of-fold accuracy pooled over the 24 examples, with its exact binomial interval
    from scipy import stats

    real = got.df[(got.df.task == "real") & (got.df.layer == s["best_layer"])]
    k = round(float((real.score * real.n_test).sum()))
    assert real.n_test.sum() == 24 and s["best_accuracy"] == pytest.approx(k / 24) and s["best_correct"] == k
    ci = stats.binomtest(k, 24).proportion_ci(0.95, method="exact")
    assert s["best_ci"] == pytest.approx([ci.low, ci.high])
    assert s["best_selectivity"] is None and s["first_selective_layer"] is None
    assert s["selectivity_per_layer"] == {"0": None, "1": None} and got.tables["per_layer"].selectivity.isna().all()
    assert "same word type" in s["control_degenerate"] and s["best_control"] == 1.0  # a constant is learnt
    # review 17b B2: the repr shows why the control is no measurement, not best_control=1.0 above the probe
    shown = repr(got)
    assert f"best_accuracy={s['best_accuracy']!r}, control_degenerate={s['control_degenerate']!r}" in shown
    assert "best_control" not in shown and "best_selectivity" not in shown
    sentence = probes_finding(s)
    assert "Selectivity cannot be measured on this task: every example's token" in sentence
    assert "memorises" not in sentence and "selectivity 0.5" not in sentence
    from headscope.reports.plots_probes import figures

    assert set(figures(got)) == {"probes"}  # the undefined selectivity draws as no bars
    varied = tokens.clone()
    varied[:, -1] = torch.arange(24) % 6 + 7  # six word types at the read position
    assert len(set(varied[:, -1].tolist())) == 6
    measured = probes.probe_sweep(model, Task(name="varied_end", tokens=varied, answers=answers), labels="answer",
                                  layers=[0, 1], cv=3)
    other = measured.summary
    assert other["control_degenerate"] is None and f"best_control={other['best_control']!r}" in repr(measured)
    assert other["best_selectivity"] == pytest.approx(other["best_accuracy"] - other["best_control"])
    two = tokens.clone()
    two[:, -1] = torch.tensor([7, 8] * 12)  # review 13b A1: two word types at the read position, three classes
    s2 = probes.probe_sweep(model, Task(name="two_ends", tokens=two, answers=answers), labels="answer",
                            layers=[0, 1], cv=3).summary
    assert s2["n_word_types"] == 2 and s2["n_classes"] == 3 and s2["best_selectivity"] is None
    assert "only 2 word types" in s2["control_degenerate"] and s2["first_selective_layer"] is None
    sentence = probes_finding(s2)
    assert "Selectivity cannot be measured on this task: the 24 examples' tokens at the read position are only 2 word " \
           "types" in sentence and "memorised" not in sentence and "Selectivity (score minus" not in sentence


def test_a_control_task_of_few_word_types_is_degenerate_whatever_the_seed():
    """Review 13b A1: 48 prompts ending in " is" (32) or " was" (16) with 11 answers. Hewitt & Liang's control
    (one random label per word type) is then 2 token identities, which any probe fits: degenerate at every seed,
    with the count of word types, where the old check caught it only when both types drew one label."""
    from headscope.probes import control_labels

    types = np.array([318] * 32 + [373] * 16)  # GPT-2 ids of " is" and " was"
    labels = np.arange(48) % 11  # 11 answer classes
    drew_two = [seed for seed in range(20) if len(np.unique(control_labels(types, labels, seed=seed))) == 2]
    assert drew_two  # the draws the old check let through: a 2-class control scored against an 11-class task
    why = {probes.control_degenerate(types, labels, seed) for seed in range(20)}
    assert len(why) == 1 and None not in why  # one verdict, whatever the seed
    reason = why.pop()
    assert "only 2 word types (token id 318 on 32, token id 373 on 16)" in reason
    assert "against the real task's 11 classes" in reason
    # as few types as classes but under the floor: 3 types, 3 classes; regression: 3 types, no classes
    assert "fewer than 5" in probes.control_degenerate(np.arange(30) % 3, np.arange(30) // 10, 0)
    # enough types but at most half the classes: 6 types against 12 classes; 11 types against 12 are a control
    assert "only 6 word types" in probes.control_degenerate(np.arange(48) % 6, np.arange(48) % 12, 0)
    assert probes.control_degenerate(np.arange(48) % 11, np.arange(48) % 12, 0) is None
    assert "only 3 word types" in probes.control_degenerate(np.arange(30) % 3, np.arange(30.0), 0, classify=False)
    # many word types (24, two rows each) over 3 classes: a control that measures memorisation, at every seed
    many, three = np.arange(48) % 24, np.arange(48) % 3
    assert all(probes.control_degenerate(many, three, seed) is None for seed in range(20))
    assert probes.control_degenerate(many, np.arange(48.0), 0, classify=False) is None


@pytest.mark.slow
def test_zoo_model_retrieves_the_queried_keys_value_at_the_answer(zoo_model):
    """At the answer position the queried key is the input token: decodable in layer 0 but exactly as
    well as its per-type control (selectivity 0). The value it retrieves is absent from the embedding
    and decodable after layer 1, far above its control."""
    from headscope.analyses.core import tasks

    model = zoo_model
    task = tasks.zoo(model, "kv", n_examples=256, seed=1)
    key = probes.probe_sweep(model, task, "resid_post", labels="span:query", cv=4, seed=0).tables["per_layer"]
    assert key.accuracy.iloc[0] > 0.8 and abs(key.selectivity.iloc[0]) < 0.05
    value = probes.probe_sweep(model, task, "resid_post", labels="answer", cv=4, seed=0).tables["per_layer"]
    assert value.accuracy.iloc[0] < 0.1  # 64 values: chance ~ 1/64
    assert value.accuracy.max() > 0.8 and value.selectivity.max() > 0.5


def test_regression_scores_carry_the_t_interval_over_folds():
    r2 = [0.42, 0.55, 0.31, 0.48]
    df = pd.DataFrame({"layer": 0, "task": "value", "score": r2 + [0.2], "n_test": 5, "fold": [0, 1, 2, 3, 0]})
    df.loc[4, "layer"] = 1  # layer 1: one fold, its score as a point (an old df; cross-validation gives two or more)
    rows = layer_scores(df, classify=False).set_index("layer")
    want = stats.t.interval(0.95, 3, loc=np.mean(r2), scale=np.std(r2, ddof=1) / 2)
    assert rows.loc[0, "score"] == pytest.approx(np.mean(r2))
    assert [rows.loc[0, "ci_low"], rows.loc[0, "ci_high"]] == pytest.approx(list(want), rel=1e-12)
    assert rows.loc[1, "ci_low"] == rows.loc[1, "ci_high"] == pytest.approx(0.2)


def _many_answer_task(singles: int = 3):
    """Review 9b A1's task shape on token ids: `singles` rows whose answer no other row has come first (the
    review's sample was one of them), then 14 answers of 2,2,2,2,2,2,3,3,3,3,3,3,4,5 rows (39); each row's
    last token, the read position, is its answer's own token: before block 0 (resid_pre 0: token and position
    embeddings) the rows of one answer have one feature vector, which a linear probe separates."""
    sizes = [1] * singles + [2] * 6 + [3] * 6 + [4, 5]
    cls = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))  # [rows]
    tokens = random_tokens(len(cls), 6, seed=5)
    tokens[:, -1] = 10 + cls
    return Task(name="many", tokens=tokens, answers=30 + cls), sizes


@pytest.mark.filterwarnings("ignore:The number of unique classes is greater than 50%")
def test_many_answers_of_few_rows_score_every_row_at_3_and_5_folds_and_say_which_rows_were_kept(tiny_models):
    """Review 9b A1: plain KFold left rows whose answer no training part held, so the report (3 folds) said 0.62
    and the API (5 folds) 0.90 on the same rows, each its folds' ceiling. Stratified folds keep every answer of
    two rows or more in training: both score all 39 kept rows, and agree. The 3 rows of an answer no other row
    has are dropped, and the finding and the section's provenance say so; its sample is a kept row."""
    from headscope.reports.findings import probes_finding
    from headscope.reports.provenance import provenance_lines, task_record

    model = tiny_models["gpt2"]
    task, sizes = _many_answer_task()
    got = {cv: probes.probe_sweep(model, task, "resid_pre", labels="answer", layers=[0], cv=cv, capacity=False).summary
           for cv in (3, 5)}
    for cv, s in got.items():
        assert s["best_correct"] == 39 and s["best_accuracy"] == 1.0 and s["cv"] == cv  # the report and the API agree
        assert (s["n_examples"], s["n_dropped_single_examples"], s["n_scored"], s["n_unscored"]) == (39, 3, 39, 0), cv
        assert s["majority_baseline"] == 5 / 39  # the largest answer's share of the scored rows, counted by hand
        assert "39 of 39 correct out of fold" in probes_finding(s)
        assert "39 of 42 rows kept: 3 have an answer no other row has" in probes_finding(s)
    config = probes.ProbesConfig(site="resid_pre", layers=[0], cv=3, capacity=False)
    kept = probes.probed_task(model, task, config)
    assert kept.tokens.tolist() == task.tokens[3:].tolist()  # the rows it fitted: not the 3 one-row answers
    record = task_record(model, "probes", kept, got[3], "your task (many.jsonl)")
    lines = provenance_lines(record)
    assert lines[1].startswith("examples: 39 of 42 rows kept: 3 have an answer no other row has; ")
    first = model.tokenizer.decode(task.tokens[3, 1:].tolist())  # the first kept row, without its BOS
    bos = model.tokenizer.decode(task.tokens[3, :1].tolist())  # headscope's BOS, shown apart (load_model's prepend_bos)
    assert record["sample"]["prompt"] == first and lines[-1].startswith(f"sample: {bos!r} + {first!r}")


@pytest.mark.filterwarnings("ignore:The number of unique classes is greater than 50%")
def test_rows_of_an_answer_no_training_part_holds_are_counted_not_scored(tiny_models):
    """When one-row answers cannot be dropped (only one answer would remain), no fold can train on them: they are
    not scored, the summary and finding count them (2 of 6, by hand), and a probe right on every scored row is
    said to be at the folds' ceiling, not reported as 4 of 6."""
    from headscope.reports.findings import probes_finding

    model = tiny_models["gpt2"]
    tokens = random_tokens(6, 6, seed=2)
    answers = torch.tensor([30, 30, 30, 30, 31, 32])  # one answer of 4 rows, two of one row each
    tokens[:, -1] = 10 + answers - 30
    s = probes.probe_sweep(model, Task(name="few", tokens=tokens, answers=answers), "resid_pre", labels="answer",
                           layers=[0], cv=3, capacity=False).summary  # one feature vector per answer, as above
    assert (s["n_examples"], s["n_dropped_single_examples"], s["n_scored"], s["n_unscored"]) == (6, 0, 4, 2)
    assert s["best_correct"] == 4 and s["best_accuracy"] == 1.0 and s["majority_baseline"] == 1.0
    text = probes_finding(s)
    assert "4 of the 6 rows scored: 2 have an answer absent from the training part of the fold that tests them" in text
    assert "equals the folds' ceiling (4 of 6 rows have their class in training)" in text


def test_an_encoders_answer_probe_reads_each_prompts_mask_token_as_plain_hf(tmp_path):
    """Review 15c B2: where every prompt of a masked LM holds its mask token (where the answer goes), the answer probe
    reads that position, not the last real token: positions by hand, features equal to plain Hugging Face hidden states
    there; a task where one prompt lacks it keeps the last real token and says how many prompts hold it."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    import headscope as hs
    from tests_support import N_WORDS, SPECIALS, save_random_checkpoint, word_tokenizer

    cfg = BertConfig(vocab_size=len(SPECIALS) + N_WORDS, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, pad_token_id=1)
    tok = word_tokenizer()
    tok.mask_token = "w59"  # id 63, the mask token
    save_random_checkpoint(cfg, tmp_path, tok, model_class=BertForMaskedLM, plain=True)
    model = hs.load_model(tmp_path, device="cpu")
    mask_id = probes.encoder_mask(model)
    assert mask_id == 63 and probes.mask_text(model) == "w59"
    rows = [[4, 5, mask_id, 6], [7, mask_id, 8, 9, 10], [mask_id, 11, 12], [13, 14, 15, mask_id, 16, 17]]
    width = max(map(len, rows))
    tokens = torch.tensor([r + [1] * (width - len(r)) for r in rows])
    am = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    task = Task(name="fill", tokens=tokens, attention_mask=am, answers=torch.tensor([20, 21, 20, 21]), metric="logprob")
    data = probes.task_labels(task, "answer", tokenizer=model.tokenizer, mask_token=mask_id)
    assert data.at_mask and data.positions.tolist() == [2, 1, 0, 3] and data.types.tolist() == [mask_id] * 4
    feats = probes.probe_features(model, task, "resid_post", data, [0, 1])  # [4, d] per layer
    with torch.no_grad():
        hidden = BertModel.from_pretrained(tmp_path)(tokens, attention_mask=am, output_hidden_states=True).hidden_states
    for layer in range(2):
        want = hidden[layer + 1][torch.arange(4), torch.tensor([2, 1, 0, 3])].numpy()  # [4, d]
        np.testing.assert_allclose(feats[layer], want, atol=1e-4)
    rows[1][1] = 22  # one prompt without its mask: each prompt's last real token, as before
    part = Task(name="fill", tokens=torch.tensor([r + [1] * (width - len(r)) for r in rows]), attention_mask=am,
                answers=task.answers, metric="logprob")
    last = probes.task_labels(part, "answer", tokenizer=model.tokenizer, mask_token=mask_id)
    assert not last.at_mask and last.n_mask_prompts == 3 and last.positions.tolist() == [3, 4, 2, 5]
    from headscope.reports.plots_probes import read_words

    assert read_words({"read_at": "mask", "mask_token": "<mask>", "n_mask_prompts": 40}) == (
        "Each prompt is read at its <mask> token, where its answer goes.")
    assert read_words({"read_at": "last", "mask_token": "<mask>", "n_mask_prompts": 3, "n_examples": 4}) == (
        "3 of 4 prompts hold <mask>, but not every prompt exactly one, so each prompt is read at its last real token, "
        "not at <mask>: this is not the decodability of the answer where the model fills it.")
    assert read_words({"read_at": "last", "n_mask_prompts": 0}) == ""
