"""Report machinery: atomic writes, output-folder rules, task files, escaping, self-contained HTML."""
from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from headscope.analyses.core.task_files import load_task, load_task_file, read_task_rows
from headscope.errors import HeadscopeWarning, OutputExistsError, TaskFileError
from headscope.reports import io
from headscope.reports.html_report import write_report_files
from headscope.reports.report import prepare_out
from headscope.reports.report_settings import parse_analyses

XSS = "<script>alert(1)</script>"


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "summary.json"
    io.write_json(target, {"a": 1})

    class Boom:
        def tolist(self):
            raise RuntimeError("serialisation failed")

    with pytest.raises(RuntimeError):
        io.write_json(target, {"a": Boom()})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left behind


def test_json_is_deterministic_and_plain(tmp_path):
    import numpy as np
    import torch

    data = {"b": np.float32(0.5), "a": torch.tensor([1, 2]), "c": (1, float("nan"))}
    io.write_json(tmp_path / "x.json", data)
    first = (tmp_path / "x.json").read_text()
    io.write_json(tmp_path / "x.json", dict(reversed(list(data.items()))))
    assert (tmp_path / "x.json").read_text() == first
    assert json.loads(first) == {"a": [1, 2], "b": 0.5, "c": [1, None]}


def test_existing_output_folder_is_refused_without_force(tmp_path):
    out = tmp_path / "run"
    prepare_out(out, force=False, resume=False)
    (out / "manifest.json").write_text(json.dumps({"output_format": 1, "files": {}}))  # a headscope output
    with pytest.raises(OutputExistsError, match="--force"):
        prepare_out(out, force=False, resume=False)
    prepare_out(out, force=False, resume=True)  # resume keeps it
    assert (out / "manifest.json").exists()
    prepare_out(out, force=True, resume=False)  # force is allowed; the run replaces it only when it succeeds
    assert (out / "manifest.json").exists()  # (reports/outputs.py; tests/reports/test_output_safety.py)


def test_force_never_deletes_a_folder_that_is_not_a_headscope_output(tmp_path):
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("...")
    with pytest.raises(OutputExistsError, match="refusing"):
        prepare_out(precious, force=True, resume=False)
    assert (precious / "chapter1.tex").exists()


def test_unknown_analysis_names_the_valid_ones():
    with pytest.raises(ValueError, match="heads, attribution"):
        parse_analyses("heads,nope")
    assert parse_analyses("heads, patching") == ["heads", "patching"]


def test_task_file_errors_name_the_problem(tmp_path):
    with pytest.raises(TaskFileError, match="does not exist"):
        read_task_rows(tmp_path / "missing.jsonl")
    with pytest.raises(TaskFileError, match="unknown format"):
        read_task_rows(tmp_path / "task.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w1 w2", "answer": "w3"}\n{"prompt": "w1 w4"}\n')
    with pytest.raises(TaskFileError, match=r"row 1: missing field\(s\) \['answer'\]"):
        read_task_rows(bad)
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text("{not json\n")
    with pytest.raises(TaskFileError, match="could not be read"):
        read_task_rows(garbled)


def test_task_file_builds_a_task(tmp_path, tiny_models):
    path = tmp_path / "task.jsonl"
    rows = [
        {"prompt": "w1 w2 w3", "answer": "w4", "corrupted_prompt": "w1 w9 w3", "wrong_answer": "w5"},
        {"prompt": "w6 w7 w8", "answer": "w9", "corrupted_prompt": "w6 w1 w8", "wrong_answer": "w2"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = load_task_file(tiny_models["gpt2"], path)
    assert task.tokens.tolist() == [[2, 5, 6, 7], [2, 10, 11, 12]]
    assert task.corrupted_tokens.tolist() == [[2, 5, 13, 7], [2, 10, 5, 12]]
    assert task.answers.tolist() == [8, 13] and task.wrong_answers.tolist() == [9, 6]
    uneven = tmp_path / "uneven.jsonl"
    uneven.write_text(json.dumps({"prompt": "w1 w2", "answer": "w3", "corrupted_prompt": "w1 w2 w3"}))
    with pytest.warns(HeadscopeWarning, match="1 corrupted prompt\\(s\\) have another token length"):  # left out of patching
        assert load_task_file(tiny_models["gpt2"], uneven).unpaired == [0]
    with pytest.raises(TaskFileError, match="another token length.*strict mode refuses"):
        load_task(tiny_models["gpt2"], uneven, strict=True)


def test_report_html_escapes_every_string_and_fetches_nothing(tmp_path):
    folder = tmp_path / "attribution"
    folder.mkdir()
    io.write_json(folder / "summary.json", {"top_token": XSS, "mean_tau": 0.25})
    io.write_csv(folder / "results.csv", pd.DataFrame({"token": [XSS, "ok"], "score": [0.1, 0.2]}))
    write_report_files(tmp_path, ["attribution", "heads"], {"attribution": "done", "heads": f"failed: {XSS}"}, {"name": XSS})
    html = (tmp_path / "report.html").read_text()
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "mean_tau" in html and "failed" in html
    assert (tmp_path / "report.md").exists()
