"""The public data API: hs.load_task over files (JSONL, CSV, TSV, Parquet), DataFrames, Datasets and
lists of dicts with the user's own column names; errors that name the file, row and field; the
analyses and the CLI taking such data.

Expected token ids come from the plain Hugging Face tokenizer of the tiny models (word level:
<unk>=0, <pad>=1, <bos>=2, <eos>=3, w<i>=4+i) and by hand."""
from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest

import headscope as hs
from headscope.analyses.core.task_files import read_task_rows, resolve_task
from headscope.errors import ConfigError, TaskFileError, TokenizationWarning

ROWS = [  # the user's own column names: text, label, other_text, other_label
    {"text": "w1 w2 w3 w4 w5 w1", "label": "w2", "other_text": "w1 w2 w3 w4 w5 w3", "other_label": "w4"},
    {"text": "w6 w7 w8 w9 w10 w8", "label": "w9", "other_text": "w6 w7 w8 w9 w10 w6", "other_label": "w7"},
    {"text": "w11 w12 w13 w14 w15 w15", "label": "w11", "other_text": "w11 w12 w13 w14 w15 w13", "other_label": "w14"},
    {"text": "w20 w21 w22 w23 w24 w22", "label": "w23", "other_text": "w20 w21 w22 w23 w24 w20", "other_label": "w21"},
]
FIELDS = {"prompt": "text", "answer": "label", "corrupted_prompt": "other_text", "wrong_answer": "other_label"}


def _hf_ids(tiny_dirs, text: str) -> list[int]:
    """<bos> + the plain Hugging Face tokenizer's ids (no special tokens of its own)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dirs["llama"])
    return [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _expect(task, tiny_dirs, rows=ROWS):
    assert task.tokens.tolist() == [_hf_ids(tiny_dirs, r["text"]) for r in rows]
    assert task.corrupted_tokens.tolist() == [_hf_ids(tiny_dirs, r["other_text"]) for r in rows]
    assert task.answers.tolist() == [_hf_ids(tiny_dirs, r["label"])[1] for r in rows]
    assert task.wrong_answers.tolist() == [_hf_ids(tiny_dirs, r["other_label"])[1] for r in rows]
    assert task.metric == "logit_diff"


def test_every_source_gives_the_same_task(tmp_path, tiny_models, tiny_dirs):
    import datasets

    model = tiny_models["llama"]
    assert _hf_ids(tiny_dirs, "w1 w2") == [2, 5, 6]  # the id scheme the hand-written ids below use
    frame = pd.DataFrame(ROWS)
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    frame.to_csv(tmp_path / "t.tsv", sep="\t", index=False)  # review 13a C1: tab-separated, by its suffix
    sources = [
        _write_jsonl(tmp_path / "t.jsonl", ROWS), tmp_path / "t.csv", tmp_path / "t.tsv", str(tmp_path / "t.parquet"), frame,
        datasets.Dataset.from_pandas(frame), ROWS,
    ]
    for source in sources:
        task = hs.load_task(model, source, FIELDS)
        _expect(task, tiny_dirs)
    assert hs.load_task(model, tmp_path / "t.jsonl", FIELDS).name == "t"
    as_text = hs.load_task(model, ROWS, "prompt=text, answer=label")  # the CLI's spelling; no wrong answers
    assert as_text.metric == "logprob" and as_text.corrupted_tokens is None
    assert as_text.tokens[0].tolist() == [2, 5, 6, 7, 8, 9, 5]
    few = hs.load_task(model, frame, FIELDS, n_examples=2, seed=3)
    assert len(few) == 2 and {tuple(t) for t in few.tokens.tolist()} < {tuple(t) for t in as_text.tokens.tolist()}
    assert few.tokens.tolist() == hs.load_task(model, frame, FIELDS, n_examples=2, seed=3).tokens.tolist()


def test_a_tsv_file_is_read_with_a_tab_delimiter(tmp_path):
    """Review 13a C1: a .tsv task file was refused ("unknown format '.tsv'"). Commas stay inside a tab-separated
    cell, values are text, and a row with more cells than the header is one line naming it."""
    (tmp_path / "t.tsv").write_text("prompt\tanswer\nw1, w2\t007\n\"w3\tw4\"\t0\n", encoding="utf-8")
    assert read_task_rows(tmp_path / "t.tsv") == [{"prompt": "w1, w2", "answer": "007"},
                                                  {"prompt": "w3\tw4", "answer": "0"}]
    (tmp_path / "bad.tsv").write_text("prompt\tanswer\nw1\tw2\tw3\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"bad\.tsv', line 2, row 0: 3 cells but the header has 2 columns; "
                                            r"quote cells that contain tabs\.$"):
        read_task_rows(tmp_path / "bad.tsv")
    with pytest.raises(TaskFileError, match=r"unknown format '\.txt'; use \.jsonl, \.csv, \.tsv or \.parquet"):
        read_task_rows(tmp_path / "t.txt")


def test_fields_are_read_as_text(tmp_path):
    (tmp_path / "n.csv").write_text("prompt,answer\nw1 w2,0\nw3 w4,007\n", encoding="utf-8")
    assert read_task_rows(tmp_path / "n.csv") == [{"prompt": "w1 w2", "answer": "0"}, {"prompt": "w3 w4", "answer": "007"}]
    numbers = [{"prompt": "w1", "answer": 5}, {"prompt": "w2", "answer": 1.5}, {"prompt": 7, "answer": 0}]
    _write_jsonl(tmp_path / "n.jsonl", numbers)
    assert read_task_rows(tmp_path / "n.jsonl") == [
        {"prompt": "w1", "answer": "5"}, {"prompt": "w2", "answer": "1.5"}, {"prompt": "7", "answer": "0"}]
    assert read_task_rows([{"p": "w1", "a": 0}], {"prompt": "p", "answer": "a"}) == [{"prompt": "w1", "answer": "0"}]
    (tmp_path / "array.json").write_text(json.dumps(numbers), encoding="utf-8")  # .json: one array also works
    assert read_task_rows(tmp_path / "array.json") == read_task_rows(tmp_path / "n.jsonl")


def test_json_numbers_keep_the_text_the_user_wrote(tmp_path):
    (tmp_path / "n.jsonl").write_text('{"prompt": "w1", "answer": 1.50}\n{"prompt": "w2", "answer": 1e3}\n', encoding="utf-8")
    assert [r["answer"] for r in read_task_rows(tmp_path / "n.jsonl")] == ["1.50", "1e3"]


@pytest.mark.parametrize("name, content, fields, message", [
    ("nan.jsonl", '{"prompt": "w1", "answer": "w2"}\n{"prompt": NaN, "answer": "w2"}\n', None,
     r"nan\.jsonl', line 2, row 1: field 'prompt' is the bare JSON constant NaN.*write \"NaN\" in quotes"),
    ("inf.json", '[{"prompt": "w1", "answer": -Infinity}]', None, r"row 0: field 'answer' is the bare JSON constant -Infinity"),
    ("key.jsonl", '{"prompt": "w1", "answer": "w2", "answer": "w3"}\n', None, r"line 1 .*key 'answer' appears twice"),
    ("header.csv", "text,label,label\nw1,w2,w3\n", "prompt=text,answer=label",
     r"header\.csv', line 1: column 'label' appears twice in the header \(columns 2 and 3\)"),
    ("fields.csv", "text,label\nw1,w2\n", "prompt=text,prompt=label,answer=label",
     r"'prompt' is mapped twice \('text' and 'label'\)"),
    ("column.csv", "text,label\nw1,w2\n", "prompt=text,answer=text", r"column 'text' is mapped to both 'prompt' and 'answer'"),
])
def test_ambiguous_input_is_refused_in_one_line_naming_the_row_or_column(tmp_path, name, content, fields, message):
    """What would be read one way silently (a JSON NaN as the text "NaN", the last of two columns or
    keys of one name, the last of two mappings) is refused instead."""
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises((TaskFileError, ConfigError), match=message) as err:
        read_task_rows(tmp_path / name, fields)
    assert "\n" not in str(err.value)


def test_a_bare_json_constant_outside_the_fields_and_unnamed_csv_columns_are_fine(tmp_path):
    (tmp_path / "extra.jsonl").write_text('{"prompt": "w1", "answer": "NaN", "score": NaN}\n', encoding="utf-8")
    assert read_task_rows(tmp_path / "extra.jsonl") == [{"prompt": "w1", "answer": "NaN"}]  # quoted: the text
    (tmp_path / "trailing.csv").write_text("prompt,answer,,\nw1,NaN,,\n", encoding="utf-8")
    assert read_task_rows(tmp_path / "trailing.csv") == [{"prompt": "w1", "answer": "NaN"}]  # CSV cells are text
    frame = pd.DataFrame([["w1", "w2", "w3"]], columns=["prompt", "answer", "answer"])
    with pytest.raises(TaskFileError, match=r"DataFrame\): column 'answer' appears twice"):
        read_task_rows(frame)


def test_prompts_longer_than_the_context_are_named_before_any_work(tmp_path, tiny_models):
    model = tiny_models["llama"]
    long = " ".join(["w1"] * (model.facts.n_ctx + 5))
    _write_jsonl(tmp_path / "long.jsonl", [{"prompt": "w1 w2", "answer": "w3"}, {"prompt": long, "answer": "w3"}])
    with pytest.raises(TaskFileError, match=rf"long\.jsonl.*longer than .*context of {model.facts.n_ctx} tokens.*row 1"):
        hs.load_task(model, tmp_path / "long.jsonl")


def test_errors_name_the_file_row_and_field(tmp_path, tiny_models):
    model = tiny_models["llama"]
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"prompt": "w1", "answer": "w2"}\n\n{"prompt": "w1", answer: "w2"}\n', encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"bad\.jsonl', line 3 could not be read as JSON"):
        read_task_rows(bad_json)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("prompt,answer\nw1,w2\ncaf\xe9,w3\n".encode("latin-1"))
    with pytest.raises(TaskFileError, match=r"latin\.csv', line 3: byte 0xe9 is not valid UTF-8"):
        read_task_rows(latin)
    for name, content in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n"), ("empty.csv", ""), ("header.csv", "prompt,answer\n")):
        (tmp_path / name).write_text(content, encoding="utf-8")
        with pytest.raises(TaskFileError, match=rf"{name}' is empty"):
            read_task_rows(tmp_path / name)
    with pytest.raises(TaskFileError, match=r"DataFrame\) is empty"):
        read_task_rows(pd.DataFrame({"prompt": []}))
    missing = _write_jsonl(tmp_path / "missing.jsonl", [{"text": "w1", "label": "w2"}, {"text": "w3"}])
    with pytest.raises(TaskFileError, match=r"missing\.jsonl', line 2, row 1: missing field\(s\) \['label \(answer\)'\]"):
        read_task_rows(missing, {"prompt": "text", "answer": "label"})
    with pytest.raises(TaskFileError, match=r"no column 'txt' \(for prompt\); its columns are \['label', 'text'\]"):
        read_task_rows(missing, {"prompt": "txt", "answer": "label"})
    own = tmp_path / "capitals.csv"  # the user's own column names and no --task-fields: say what they are, and how
    own.write_text("question,city\nThe capital of Avel is, Oru\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"no column 'prompt', 'answer'; its columns are \['city', 'question'\]; "
                                            r"name yours with --task-fields prompt=COLUMN,answer=COLUMN"):
        read_task_rows(own)
    with pytest.raises(TaskFileError, match=r"row 1: field 'prompt' is a list, not text"):
        read_task_rows([{"prompt": "w1", "answer": "w2"}, {"prompt": ["w1"], "answer": "w2"}])
    with pytest.raises(TaskFileError, match=r"'wrong_answer' is given in 1 of 2 rows but missing in row 1"):
        read_task_rows([{"prompt": "w1", "answer": "w2", "wrong_answer": "w3"}, {"prompt": "w1", "answer": "w2"}])
    with pytest.raises(ConfigError, match="not FIELD=COLUMN"):
        read_task_rows(missing, "prompt:text")
    with pytest.raises(ConfigError, match=r"\['question'\] are not headscope fields"):
        read_task_rows(missing, {"question": "text"})
    with pytest.raises(TaskFileError, match="Unsupported task data int"):
        hs.load_task(model, 3)
    # one line each
    for bad in (bad_json, latin):
        with pytest.raises(TaskFileError) as info:
            read_task_rows(bad)
        assert "\n" not in str(info.value)


def test_tokenization_problems_name_the_row(tiny_models):
    model = tiny_models["llama"]
    with pytest.raises(TaskFileError, match=r"row 1: wrong_answer 'w3 w4' is 2 tokens under this tokenizer \(\['w3', 'w4'\]\)"):
        hs.load_task(model, [{"prompt": "w1 w2", "answer": "w3", "wrong_answer": "w4"},
                             {"prompt": "w1 w2", "answer": "w3", "wrong_answer": "w3 w4"}])
    with pytest.raises(TaskFileError, match=r"1 corrupted prompt\(s\) have another token length than their prompt "
                                            r"\(row 0: 3 vs 4 tokens\).*strict mode refuses"):
        hs.load_task(model, [{"prompt": "w1 w2", "answer": "w3", "corrupted_prompt": "w1 w2 w3"}], strict=True)
    mixed = [{"prompt": "w1 w2", "answer": "w3", "corrupted_prompt": "w4 w2"},
             {"prompt": "w1 w2 w5 w6", "answer": "w3", "corrupted_prompt": "w1 w2 w5 w6 w7"}]  # row 1's pair differs
    with pytest.raises(TaskFileError, match=r"\(row 1: 5 vs 6 tokens\); patching needs each clean and"):
        hs.load_task(model, mixed, strict=True)
    with pytest.warns(TokenizationWarning, match=r"'hello' \(row 0 prompt, row 1 prompt\), 'bye' \(row 1 answer\)"):
        task = hs.load_task(model, [{"prompt": "w1 hello", "answer": "w3"}, {"prompt": "hello w1", "answer": "bye"}])
    assert task.tokens.tolist() == [[2, 5, 0], [2, 0, 5]] and task.answers.tolist() == [7, 0]


def test_mixed_length_prompts_are_left_padded_with_a_mask_and_pairs_share_their_padding(tiny_dirs, tiny_models):
    """Prompts of 3, 5 and 4 tokens (with <bos>): each row is the plain tokenizer's ids, left-padded with
    <pad>=1 to 5, the mask 1 exactly on them; each corrupted prompt (its own pair's length) padded alike."""
    model = tiny_models["llama"]
    rows = [{"prompt": "w1 w2", "answer": "w3", "corrupted_prompt": "w4 w2", "wrong_answer": "w5"},
            {"prompt": "w1 w2 w5 w6", "answer": "w3", "corrupted_prompt": "w1 w9 w5 w6", "wrong_answer": "w7"},
            {"prompt": "w7 w8 w9", "answer": "w1", "corrupted_prompt": "w7 w8 w2", "wrong_answer": "w2"}]
    task = hs.load_task(model, rows)
    pad = lambda ids: [1] * (5 - len(ids)) + ids  # noqa: E731
    assert task.tokens.tolist() == [pad(_hf_ids(tiny_dirs, r["prompt"])) for r in rows]
    assert task.corrupted_tokens.tolist() == [pad(_hf_ids(tiny_dirs, r["corrupted_prompt"])) for r in rows]
    assert task.attention_mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert task.answers.tolist() == [7, 7, 5] and task.metric == "logit_diff"
    assert task.tokens[:, -1].tolist() == [6, 10, 13]  # every row ends at the last position (w2, w6, w9)
    same = hs.load_task(model, [{k: v for k, v in r.items() if k == "prompt" or k == "answer"} for r in rows[:1] * 2])
    assert same.attention_mask is None  # equal lengths: no padding, no mask


def test_strict_mode_refuses_unknown_words_in_one_line(tmp_path, tiny_models):
    """strict=True (or a strict TaskFile, or to_tokens(strict=True)): a TokenizationError naming the
    words and rows instead of the warning; without it the same data loads with a warning."""
    model = tiny_models["llama"]
    rows = [{"prompt": "w1 hello", "answer": "w3"}, {"prompt": "w1 w2 w3", "answer": "bye"}]
    with pytest.raises(hs.TokenizationError) as info:
        hs.load_task(model, rows, strict=True)
    message = str(info.value)
    assert "\n" not in message and "'hello' (row 0 prompt)" in message and "'bye' (row 1 answer)" in message
    assert isinstance(info.value, hs.HeadscopeError) and isinstance(info.value, ValueError)
    path = _write_jsonl(tmp_path / "unk.jsonl", rows)
    with pytest.raises(hs.TokenizationError, match=r"unk\.jsonl'.*'hello' \(line 1, row 0 prompt\)"):
        hs.load_task(model, hs.TaskFile(path, strict=True))
    import pickle

    strict_file = pickle.loads(pickle.dumps(hs.TaskFile(path, strict=True)))  # torch.distributed broadcasts it
    with pytest.raises(hs.TokenizationError, match="'hello'"):
        resolve_task(model, strict_file, n_examples=2)
    with pytest.raises(hs.TokenizationError, match="'hello'"):
        model.to_tokens("w1 hello", strict=True)
    with pytest.warns(TokenizationWarning, match="'hello'"):
        assert hs.load_task(model, rows).tokens.tolist() == [[1, 2, 5, 0], [2, 5, 6, 7]]  # <unk>=0, left-padded
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hs.load_task(model, [{"prompt": "w1 w2 w3", "answer": "w4"}], strict=True).answers.tolist() == [8]


def test_resolve_task_takes_every_source_and_keeps_zoo_names(tmp_path, tiny_models, tiny_dirs):
    model = tiny_models["llama"]
    path = _write_jsonl(tmp_path / "mine.jsonl", ROWS)
    _expect(resolve_task(model, str(path), fields=FIELDS), tiny_dirs)
    _expect(resolve_task(model, hs.TaskFile(path, FIELDS)), tiny_dirs)
    _expect(resolve_task(model, pd.DataFrame(ROWS), fields=FIELDS), tiny_dirs)
    _expect(resolve_task(model, ROWS, fields=FIELDS), tiny_dirs)
    task = hs.load_task(model, ROWS, FIELDS)
    assert resolve_task(model, task) is task
    assert hs.load_task(model, task, n_examples=2, seed=0).tokens.shape == (2, task.tokens.shape[1])
    with pytest.raises(ConfigError, match="not to the zoo task 'kv'"):
        resolve_task(model, "kv", fields=FIELDS)
    with pytest.raises(TaskFileError, match="Unknown task 'nope'"):
        resolve_task(model, "nope")


def test_analyses_run_on_user_files_with_own_column_names(tmp_path, tiny_models, tiny_dirs):
    model = tiny_models["llama"]
    plain = _write_jsonl(tmp_path / "plain.jsonl", [
        {"prompt": r["text"], "answer": r["label"], "corrupted_prompt": r["other_text"], "wrong_answer": r["other_label"]}
        for r in ROWS])
    own = _write_jsonl(tmp_path / "own.jsonl", ROWS)
    by_path = hs.head_importance(model, str(plain), methods=("zero",))
    by_fields = hs.head_importance(model, hs.TaskFile(own, FIELDS), methods=("zero",))
    by_task = hs.head_importance(model, hs.load_task(model, own, FIELDS), methods=("zero",))
    assert len(by_path.df) == model.facts.n_layers * model.facts.n_heads
    pd.testing.assert_frame_equal(by_path.df, by_fields.df)
    pd.testing.assert_frame_equal(by_path.df, by_task.df)
    config = hs.KVConfig.preset(quick=True)
    frame = pd.DataFrame(ROWS).rename(columns={v: k for k, v in FIELDS.items()})
    kv_frame = hs.kv_analysis(model, frame, config)
    kv_own = hs.kv_analysis(model, hs.TaskFile(own, FIELDS), config)
    assert len(kv_frame.df) > 0
    pd.testing.assert_frame_equal(kv_frame.df, kv_own.df)


def test_cli_task_fields_reach_the_analysis(tmp_path, tiny_dirs):
    from headscope import cli
    from headscope.reports.io import read_json

    own = _write_jsonl(tmp_path / "own.jsonl", ROWS)
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = cli.main(["-q", "kv", "--model", str(tiny_dirs["llama"]), "--task", str(own), "--quick", "--out", str(out),
                       "--task-fields", "prompt=text,answer=label,corrupted_prompt=other_text,wrong_answer=other_label"])
    assert rc == 0
    assert read_json(out / "manifest.json")["status"] == {"kv": "done"}
    shown = pd.read_csv(out / "task_examples.csv")
    assert shown["prompt"].tolist() == [r["text"] for r in ROWS]
    # which rows each analysis ran on: the file's row numbers, in kv/task.json, its provenance line and the table
    assert shown["row"].tolist() == list(range(len(ROWS)))
    used = read_json(out / "kv" / "task.json")
    assert used["rows"] == list(range(used["n_examples"])) and used["n_examples"] == len(ROWS)
    html = (out / "report.html").read_text()
    assert f"examples: {len(ROWS)} (data rows 0-{len(ROWS) - 1}; 0-based, blank lines not counted)" in html
    assert "<th>used by</th>" in html
    bad = cli.main(["-q", "kv", "--model", str(tiny_dirs["llama"]), "--task", str(own), "--out", str(tmp_path / "o2"),
                    "--task-fields", "prompt=txt"])
    assert bad == 2  # one line on stderr, nothing run
    assert not (tmp_path / "o2").exists()


def test_task_rows_keeps_every_field_of_the_rows_it_selects():
    """Task.rows by slice, index list and bool mask: every per-row field holds those rows, in order."""
    import torch

    from headscope.analyses.core.tasks import Task

    n = 5
    tokens = torch.arange(n * 4).reshape(n, 4) + 10
    mask = torch.ones(n, 4, dtype=torch.int64)
    mask[1, 0] = 0  # left padding
    task = Task(name="t", tokens=tokens, corrupted_tokens=tokens + 100, answers=torch.arange(n) + 1,
                wrong_answers=torch.arange(n) + 50, spans={"s": torch.tensor([[1, 2]] * n) + torch.arange(n)[:, None] % 2},
                attention_mask=mask, metric="logit_diff")
    for index, rows in ((slice(1, 4), [1, 2, 3]), ([4, 0], [4, 0]), (torch.tensor([True, False, True, False, True]), [0, 2, 4])):
        part = task.rows(index)
        assert part.tokens.tolist() == [tokens[r].tolist() for r in rows]
        assert part.corrupted_tokens.tolist() == [(tokens[r] + 100).tolist() for r in rows]
        assert part.answers.tolist() == [r + 1 for r in rows] and part.wrong_answers.tolist() == [r + 50 for r in rows]
        assert part.spans["s"].tolist() == [[1 + r % 2, 2 + r % 2] for r in rows]
        assert part.attention_mask.tolist() == [mask[r].tolist() for r in rows]
        assert (part.name, part.metric, part.continuation) == ("t", "logit_diff", None)


def test_what_an_analysis_cannot_take_is_one_line(tiny_models):
    """A TaskFile of a DataFrame, anything an analysis cannot take: one line saying what is taken instead
    (token tensors and one prompt are taken: tests/analyses/test_one_prompt.py)."""
    import torch

    from headscope.errors import InputTypeError

    model = tiny_models["llama"]
    with pytest.raises(InputTypeError, match=r"TaskFile takes the path .* not a DataFrame; .*hs.load_task\(model, data"):
        hs.TaskFile(pd.DataFrame(ROWS), FIELDS)
    tokens = model.to_tokens("w1 w2 w3")
    for bad, what in ((3, "an? int"), ({"w1"}, "a set")):
        with pytest.raises(InputTypeError, match=rf"An analysis takes a Task .*; got {what}\.$") as err:
            resolve_task(model, bad)
        assert "\n" not in str(err.value)
    with pytest.raises(InputTypeError, match="An analysis takes a Task"):  # before any pass runs
        hs.run_analysis("patching", model, 3)
    with pytest.raises(InputTypeError, match="position takes 'kv', a sweep name"):
        hs.run_analysis("position", model, tokens)
    # a column called "fields" or "strict" is the user's data, not a setting
    frame = pd.DataFrame(ROWS).rename(columns={v: k for k, v in FIELDS.items()}).assign(fields="x", strict="y")
    assert torch.equal(hs.load_task(model, frame).tokens, hs.load_task(model, ROWS, FIELDS).tokens)


def test_run_analysis_takes_fields_for_the_users_columns(tiny_models):
    model = tiny_models["llama"]
    config = hs.HeadsConfig(quick=True, methods=("zero",), pruning=hs.PruningConfig(orderings=("ablation",)), l0=None,
                            best_head=False)  # a small run: the data is what is compared
    renamed = pd.DataFrame(ROWS).rename(columns={v: k for k, v in FIELDS.items()})
    own = hs.run_analysis("heads", model, pd.DataFrame(ROWS), config, fields=FIELDS)
    pd.testing.assert_frame_equal(own.df, hs.run_analysis("heads", model, renamed, config).df)
    assert own.summary["task"] == "dataframe" and own.summary["n_examples"] == len(ROWS)
    with pytest.raises(ConfigError, match="not to the zoo task 'kv'"):
        hs.run_analysis("heads", model, "kv", config, fields=FIELDS)


def test_a_pair_of_two_token_lengths_is_left_out_of_patching_only(tiny_models):
    """Six rows, row 2's corrupted prompt one token short (#32 item 8): one warning names the row, the
    Task keeps all six (kv, heads, ... use every row), and patching runs on the other five: the same
    numbers as patching a Task read from those five rows alone, with the count in its summary."""
    model = tiny_models["gpt2"]
    rows = [{"prompt": f"w{i} w{i + 1} w{i + 2}", "answer": f" w{i + 10}", "corrupted_prompt": f"w{i} w{i + 20} w{i + 2}",
             "wrong_answer": f" w{i + 11}"} for i in range(1, 7)]
    rows[2]["corrupted_prompt"] = "w3 w9"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = hs.load_task(model, rows)
    assert [str(w.message).split(" (row")[0] for w in caught] == [
        "Task data (list of dicts): 1 corrupted prompt(s) have another token length than their prompt"]
    assert "row 2: 4 vs 3 tokens" in str(caught[0].message)
    assert len(task) == 6 and task.unpaired == [2] and task.attention_mask is None
    five = hs.load_task(model, rows[:2] + rows[3:])
    got = hs.activation_patching(model, task, "resid_pre")
    want = hs.activation_patching(model, five, "resid_pre")
    assert got.summary["pairs_left_out"] == 1 and got.summary["pairs_left_out_rows"] == [2]
    assert got.summary["n_examples"] == 5 and got.df["effect"].tolist() == want.df["effect"].tolist()
    with pytest.warns(hs.HeadscopeWarning):
        none = hs.load_task(model, [dict(r, corrupted_prompt="w1") for r in rows])
    with pytest.raises(hs.TaskError, match="every corrupted prompt of task 'records' has another token length"):
        hs.activation_patching(model, none, "resid_pre")


def test_pairs_left_out_are_named_by_their_file_rows_in_patching_and_circuits(tmp_path, tiny_models):
    """#34: a ten-row file whose rows 3 and 7 have a corrupted prompt one token short, sampled down to
    eight rows: the warning, patching's and circuits' summaries all name those rows by their row in the
    file (not their index in the sample), and circuits' edges count the pairs they ran on, as patching does."""
    import torch

    from headscope.analyses.circuits import CircuitsConfig
    from headscope.analyses.circuits import run as circuits

    model = tiny_models["gpt2"]
    rows = [{"prompt": f"w{i} w{i + 1} w{i + 2}", "answer": f" w{i + 10}", "corrupted_prompt": f"w{i} w{i + 20} w{i + 2}",
             "wrong_answer": f" w{i + 11}"} for i in range(1, 11)]
    for bad in (3, 7):
        rows[bad]["corrupted_prompt"] = f"w{bad} w9"
    path = tmp_path / "ten.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seed = 0
    kept = torch.randperm(10, generator=torch.Generator().manual_seed(seed))[:8].sort().values.tolist()  # the documented sample
    assert {3, 7} <= set(kept) and kept.index(3) != 3  # both in it, numbered otherwise within the sample
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = hs.load_task(model, path, n_examples=8, seed=seed)
    said = [str(w.message) for w in caught if "another token length" in str(w.message)]
    assert len(said) == 1 and "line 4, row 3: 4 vs 3 tokens" in said[0] and "line 8, row 7: 4 vs 3 tokens" in said[0]
    assert task.unpaired == [kept.index(3), kept.index(7)] and task.unpaired_rows == [3, 7]
    patched = hs.activation_patching(model, task, "resid_pre").summary
    assert patched["pairs_left_out"] == 2 and patched["pairs_left_out_rows"] == [3, 7] and patched["n_examples"] == 6
    found = circuits(model, task, CircuitsConfig(quick=True, k_values=(0,))).summary
    assert found["pairs_left_out"] == 2 and found["pairs_left_out_rows"] == [3, 7]
    assert found["edges_n_examples"] == 6 and found["n_examples"] == 8  # edges on the pairs; lens and DLA on every row


def _big_file(path, n_rows: int):
    """n_rows task rows (plain writes, no pandas): row i is w(i%50) w(i%47) w(i%43) -> w(i%5)."""
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n_rows):
            fh.write(f'{{"prompt": "w{i % 50} w{i % 47} w{i % 43}", "answer": "w{i % 5}", '
                     f'"corrupted_prompt": "w{i % 41} w{i % 37} w{i % 31}", "wrong_answer": "w{(i + 1) % 5}"}}\n')
    return path


def test_every_family_runs_a_seeded_sample_of_a_large_task_file(tmp_path, tiny_models, tiny_dirs):
    """--n-examples and --quick sizes hold for task files in every family (#36): the Task each one
    runs on has the sample's rows (the seeded draw of torch.randperm, computed here), not the file's,
    and heads, which read the whole file before, runs that many examples. (A report with
    --n-examples 4 on 100,000 rows was checked by hand: every family ran 4.)"""
    import torch

    from headscope.analyses.core.registry import ANALYSES, config_class, get_analysis, task_used
    from headscope.analyses.position import records
    from headscope.analyses.probes.analysis import probe_data

    model = tiny_models["llama"]
    path = _big_file(tmp_path / "big.jsonl", 10_000)
    seed, n = 3, 4
    chosen = torch.randperm(10_000, generator=torch.Generator().manual_seed(seed))[:n].sort().values.tolist()
    expected = [_hf_ids(tiny_dirs, f"w{i % 50} w{i % 47} w{i % 43}") for i in chosen]
    for name in ANALYSES:
        if name == "position":  # runs on its own sweeps (its QA records are read up to n below)
            continue
        config = config_class(name).preset(quick=True, n_examples=n, seed=seed)
        task = probe_data(model, hs.TaskFile(path), config)[0] if name == "probes" else \
            task_used(name, model, hs.TaskFile(path), config)
        assert task.tokens.tolist() == expected, name
    result = get_analysis("heads")(model, hs.TaskFile(path), config_class("heads").preset(quick=True, n_examples=n))
    assert result.summary["n_examples"] == n
    assert len(task_used("heads", model, hs.TaskFile(path), config_class("heads").preset(quick=True))) == 16  # --quick alone
    qa = {"question": "q", "answers": ["a"], "gold_document": {"title": "t", "text": "a"}, "documents": []}
    _write_jsonl(tmp_path / "qa.jsonl", [qa] * 2_000)
    assert len(records.load_qa_records(str(tmp_path / "qa.jsonl"), n)) == n


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet", ".json"])
def test_a_sample_of_any_file_format_holds_only_the_chosen_rows(tmp_path, suffix):
    """--n-examples on a CSV, Parquet or JSON-array file keeps the seeded sample (torch.randperm, drawn
    here), as on JSON lines: the second pass reads row by row and keeps only the chosen rows."""
    import torch

    rows = [{"text": f"w{i} w{i + 1}", "label": f"w{i % 7}"} for i in range(40)]
    path = tmp_path / f"rows{suffix}"
    if suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    elif suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    elif suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    else:
        _write_jsonl(path, rows)
    chosen = torch.randperm(40, generator=torch.Generator().manual_seed(5))[:6].sort().values.tolist()
    got = read_task_rows(path, {"prompt": "text", "answer": "label"}, n_examples=6, seed=5)
    assert got == [{"prompt": rows[i]["text"], "answer": rows[i]["label"]} for i in chosen]


def test_word_tail_cuts_at_word_boundaries_with_an_ellipsis():
    from headscope.analyses.core.task_files import word_tail

    assert word_tail("Omar put the map in the") == "…map in the"  # 10 characters; "the map in the" is 14
    assert word_tail("in the") == "in the" and word_tail("Supercalifragilistic") == "Supercalifragilistic"
    assert word_tail("a Supercalifragilistic") == "…Supercalifragilistic"  # the last word whole, however long


def test_an_answer_glued_to_its_prompts_last_word_warns_once(arch_models, tiny_models):
    """Byte-level BPE writes a word's space into its token: "on the" + "mat" would be scored as
    "on themat" (the same ids as the text written together), so one warning says so and names the fix;
    " mat" (or a prompt ending in a space) does not warn, nor does a word-level tokenizer."""
    model = arch_models("gpt2")
    enc = lambda text: model.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert enc(" mat") != enc("mat")  # the premise: this tokenizer writes the space into the token
    rows = [{"prompt": "The cat sat on the", "answer": "mat"}, {"prompt": "A dog ran to the", "answer": " park"}]
    with pytest.warns(hs.HeadscopeWarning, match=r"1 of 2 answer\(s\) start without a space .*row 0.*' mat'") as got:
        hs.load_task(model, rows)
    # review 12c C7: the excerpts end in whole words, the same ones on both sides ("The cat sat on the" is 18 characters:
    # "sat on the" is the most that fits in 12), not "t on the" + "mat" -> "sat on themat"
    assert "so '…sat on the' + 'mat' is scored as one word ('…sat on themat')" in str(got[0].message), got[0].message
    for fine, m in (([dict(rows[0], answer=" mat"), rows[1]], model), ([dict(rows[0], prompt="The cat sat on the ")], model),
                    ([{"prompt": "w1 w2", "answer": "w3"}], tiny_models["gpt2"])):
        with warnings.catch_warnings():
            warnings.simplefilter("error", hs.HeadscopeWarning)
            hs.load_task(m, fine)


def test_one_task_file_one_name_in_every_result(tmp_path, tiny_models):
    """Review 19c C1: head_importance named a task file 'tools' (its Task's name, the file's stem, as load_task gives
    it) and activation_patching named the same hs.TaskFile 'tools.json': the stem in both."""
    model = tiny_models["llama"]
    own = _write_jsonl(tmp_path / "tools.json", ROWS)
    assert hs.load_task(model, own, FIELDS).name == "tools"
    heads = hs.head_importance(model, hs.TaskFile(own, FIELDS), methods=("zero",))
    patching = hs.activation_patching(model, hs.TaskFile(own, FIELDS), sites=["mlp_out"])
    assert heads.source("task") == patching.source("task") == "tools", (heads, patching)
    assert "task='tools'," in repr(patching)
