"""`headscope report` checks every analysis against the model and the user's task before running any:
decoder-only analyses are skipped on encoders with their reason, analyses that cannot use the
user's task run on their defaults, the manifest and report.html say which data each one used."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from headscope import cli
from headscope.analyses.core.registry import ANALYSES
from headscope.reports import io


def report(*argv: str) -> int:
    """The CLI's report command in this process (its exit status), without the CLI's logging setup."""
    return cli._cmd_report(cli._parser().parse_args(["report", "-q", *argv]))


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


def test_a_prompt_answer_task_file_on_a_tiny_llama(tmp_path, tiny_dirs):
    path = tmp_path / "mine.jsonl"  # prompts and answers only: no corrupted prompts, no wrong answers
    rows = [{"prompt": f"w{i} w{i + 1} w{i + 2}", "answer": f"w{(7 * i) % 5}"} for i in range(10)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    assert report("--quick", "--model", str(tiny_dirs["llama"]), "--task", str(path), "--out", str(out)) == 0
    m = manifest(out)
    status, used = m["status"], m["task_used"]
    assert set(status) == set(used) == set(ANALYSES)
    assert not [name for name, state in status.items() if state.startswith("failed")], status
    # patching moves activations between clean and corrupted prompts: the file has none
    assert status["patching"] == "done" and used["patching"] == "default task (the task has no corrupted prompts)"
    # position runs its own retrieval prompts, which the w0..w59 word-level tokenizer cannot write
    assert status["position"].startswith("skipped: this tokenizer cannot write position's default data")
    assert used["position"] == "none" and not (out / "position").exists()
    for name in ("heads", "attribution", "mlp", "kv", "probes", "circuits"):
        assert status[name] == "done" and used[name] == "your task (mine.jsonl)", name
    assert json.loads((out / "heads" / "summary.json").read_text())["task"] == "mine"
    html = (out / "report.html").read_text()
    assert html.count("task: mine, from your task (mine.jsonl)") == 6  # each section's provenance line
    assert "from its default task, because your task could not be used: the task has no corrupted prompts" in html
    assert '<p class="skipped">skipped: ' in html and 'class="failed"' not in html


def test_report_files_tolerate_an_empty_csv_and_show_skipped_analyses(tmp_path):
    from headscope.reports.html_report import write_report_files

    (tmp_path / "kv").mkdir()
    io.write_json(tmp_path / "kv" / "summary.json", {"task": "kv"})
    (tmp_path / "kv" / "results.csv").write_text("\n")  # 1 byte: no columns
    with pytest.raises(pd.errors.EmptyDataError):
        pd.read_csv(tmp_path / "kv" / "results.csv")
    status = {"kv": "done", "patching": "skipped: m is an encoder and this analysis needs a decoder"}
    write_report_files(tmp_path, ["kv", "patching"], status, {"name": "m"},
                       task_used={"kv": "default task", "patching": "none"})
    html = (tmp_path / "report.html").read_text()
    assert '<p class="skipped">skipped: m is an encoder and this analysis needs a decoder</p>' in html
    assert "task: kv, from its default task (no --task given)" in html and "results.csv" in html


def test_a_failed_sections_failure_is_said_once_in_the_findings_list(tmp_path):
    """Review 15c C3: report.html's findings list printed a failure twice, "position (failed: X) failed: X"; the
    failure is the finding's text, said once in red (the section keeps its own red line)."""
    from headscope.reports.html_report import write_report_files

    why = "failed: ContextLengthError: The prompt has 184 tokens but m has a context of 64 <tokens>"
    write_report_files(tmp_path, ["position"], {"position": why}, {"name": "m"}, task_used={"position": "default task"})
    html = (tmp_path / "report.html").read_text()
    escaped = "failed: ContextLengthError: The prompt has 184 tokens but m has a context of 64 &lt;tokens&gt;"
    assert ('<p class="finding"><b><a href="#position">position</a></b>: '
            f"<span class='failed'>{escaped}</span></p>") in html
    assert html.count(escaped) == 2  # the findings list's line and the section's own, nothing more


@pytest.mark.slow
def test_minilm_plan_with_a_prompt_answer_file_keeps_the_decoder_only_analyses_off(tmp_path):
    """The report's plan on MiniLM with a prompt/answer file (the report itself, skips and all, is
    tests/reports/test_minilm_report.py)."""
    import headscope as hs
    from headscope.reports.report import plan_analyses

    # the plan with a prompt/answer file: position and the decoder-only analyses keep to their own data
    model = hs.load_model("minilm", device="cpu")
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": p, "answer": a}) for p, a in
                              [("the cat sat on the", "mat"), ("the dog ran in the", "park")] * 3))
    plans = plan_analyses(model, list(ANALYSES), str(path))
    assert plans["position"].task is None and plans["position"].used.startswith("default task (it runs on its own data")
    # heads, attribution and probes read the file's prompts (heads and attribution: by the pooled embedding)
    assert all(plans[name].task == str(path) for name in ("heads", "attribution", "probes"))
    assert all(plans[name].skip for name in ("kv", "mlp", "patching", "circuits"))


def test_a_task_without_one_pair_of_one_length_skips_patching_and_a_single_analysis_refuses(tiny_models):
    """#32 item 8: every corrupted prompt one token short of its prompt: patching is skipped with the
    reason and kv runs on the user's rows; asked for one analysis (substitute=False), an analysis that
    cannot use the task is a TaskError with the reason, not a silent default."""
    import headscope as hs
    from headscope.reports.report import plan_analyses

    model = tiny_models["gpt2"]
    rows = [{"prompt": f"w{i} w{i + 1} w{i + 2}", "answer": f" w{i + 10}", "corrupted_prompt": f"w{i} w{i + 1}"}
            for i in range(1, 5)]
    with pytest.warns(hs.HeadscopeWarning, match=r"4 corrupted prompt\(s\) have another token length"):
        task = hs.load_task(model, rows)
    plans = plan_analyses(model, ["patching", "kv"], task)
    assert plans["patching"].skip == ("every corrupted prompt of task 'records' has another token length than its "
                                      "prompt (4 of 4 rows), so no clean/corrupted pair is left")
    assert plans["kv"].task is task and plans["kv"].skip is None
    with pytest.raises(hs.TaskError, match=r"^patching cannot run on your task \(records\): every corrupted prompt") as err:
        plan_analyses(model, ["patching"], task, substitute=False)
    assert "headscope report" not in str(err.value)  # the report would skip it too: no pointer there
    several = hs.prompt_task(model, "w1 w2", " w3 w4")
    with pytest.raises(hs.TaskError, match=r"^kv cannot run on your task \(prompt\): the task's answers are up to 2"):
        plan_analyses(model, ["kv"], several, substitute=False)
    assert plan_analyses(model, ["kv"], several)["kv"].used.startswith("default task (the task's answers are up to 2")
