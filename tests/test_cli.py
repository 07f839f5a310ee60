"""`headscope` end to end: the report on the default model, bad input, interrupt and resume.

Runs the real CLI in subprocesses (as a user would). The quick report is the fast tier; the
full-size report is the slow tier.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headscope.analyses.core.registry import ANALYSES

XSS = "<script>alert(1)</script>"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}


def headscope(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "headscope", *args], capture_output=True, text=True, env=ENV, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"headscope {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


def summaries(out: Path, names) -> dict:
    return {name: (out / name / "summary.json").read_text() for name in names}


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "quick"
    headscope("-q", "report", "--quick", "--out", str(out))
    return out


def test_version_and_module_entry_point():
    from headscope import __version__

    assert headscope("--version").stdout.strip() == f"headscope {__version__}"


def test_quick_report_follows_the_output_contract(quick_report):
    manifest = json.loads((quick_report / "manifest.json").read_text())
    assert set(manifest["status"]) == set(ANALYSES)
    assert all(state == "done" for state in manifest["status"].values()), manifest["status"]
    for key in ("command", "config", "versions", "git_sha", "seed", "timings_s", "model"):
        assert key in manifest
    assert manifest["model"]["name"] == "zoo/synth-llama"
    for name in ANALYSES:
        folder = quick_report / name
        assert (folder / "results.csv").stat().st_size > 0
        assert isinstance(json.loads((folder / "summary.json").read_text()), dict)
        assert list(folder.glob("*.png")), f"{name} wrote no figure"
    assert (quick_report / "report.html").exists() and (quick_report / "report.md").exists()
    assert not list(quick_report.rglob("*.tmp")) and not list(quick_report.glob(".*.partial"))


def test_same_seed_gives_identical_summaries(quick_report, tmp_path):
    names = ["heads", "patching"]
    out = tmp_path / "again"
    headscope("-q", "report", "--quick", "--analyses", ",".join(names), "--out", str(out))
    assert summaries(out, names) == summaries(quick_report, names)


def test_interrupted_run_resumes_to_the_same_results(quick_report, tmp_path):
    names = ["heads", "mlp", "kv"]
    out = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [sys.executable, "-m", "headscope", "-q", "report", "--quick", "--analyses", ",".join(names), "--out", str(out)],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 600
    while not (out / names[0] / "summary.json").exists():
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "report.html").exists()  # no half-written report
    assert not (out / names[-1] / "summary.json").exists()
    refused = headscope("report", "--quick", "--analyses", ",".join(names), "--out", str(out), check=False)
    assert refused.returncode == 2 and "--resume" in refused.stderr
    headscope("-q", "report", "--quick", "--analyses", ",".join(names), "--out", str(out), "--resume")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"][names[0]] == "done (resumed)"
    assert summaries(out, names) == summaries(quick_report, names)
    assert (out / "report.html").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--analyses", "heads,nope"], "Unknown analysis 'nope'"),
        (["--task", "{tmp}/missing.jsonl"], "does not exist"),
        (["--task", "{tmp}/no_answer.jsonl"], "missing field(s) ['answer']"),
        (["--model", "{tmp}/not-a-model"], "Unknown model"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(args, message, tmp_path):
    (tmp_path / "no_answer.jsonl").write_text(json.dumps({"prompt": "k01 v02 ; k01"}) + "\n")
    out = tmp_path / "out"
    proc = headscope("report", "--quick", "--out", str(out), *[a.format(tmp=tmp_path) for a in args], check=False)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not out.exists()


def test_existing_out_is_refused_without_force(quick_report):
    before = {p: p.stat().st_mtime_ns for p in quick_report.rglob("*") if p.is_file()}
    proc = headscope("report", "--quick", "--out", str(quick_report), check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr and "--force" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in quick_report.rglob("*") if p.is_file()} == before


def test_single_analysis_subcommand(tmp_path):
    out = tmp_path / "kv-only"
    headscope("-q", "kv", "--quick", "--out", str(out))
    assert json.loads((out / "manifest.json").read_text())["status"] == {"kv": "done"}
    assert (out / "kv" / "summary.json").exists()


@pytest.mark.slow
def test_full_report_on_the_default_model(tmp_path):
    out = tmp_path / "full"
    headscope("-q", "report", "--out", str(out), timeout=1800)
    status = json.loads((out / "manifest.json").read_text())["status"]
    assert all(state == "done" for state in status.values()), status


# ---- exit codes and output-folder safety (issue #20) ---------------------------------------------
def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """A user mistake: exit 2, one line on stderr, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: error: "), proc.stderr
    return lines[0]


def test_every_subcommand_exits_0(tmp_path):
    from headscope import __version__

    assert headscope("--version").stdout.strip() == f"headscope {__version__}"
    assert "report" in headscope("--help").stdout
    listing = headscope("zoo", "list")
    assert "zoo/synth-llama" in listing.stdout and listing.stderr == ""  # (it used to exit 1, its lines on stderr)
    assert "sites:" in headscope("-q", "sites", "--model", "zoo/synth-llama").stdout
    headscope("-q", "kv", "--quick", "--out", str(tmp_path / "kv"))
    assert (tmp_path / "kv" / "kv" / "summary.json").exists()


def test_user_mistakes_exit_2_with_one_line_and_write_nothing(tmp_path):
    out = tmp_path / "out"
    line = one_line_error(headscope("-q", "kv", "--quick", "--task", "nope", "--out", str(out), check=False))
    assert "Unknown task 'nope'" in line and not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    line = one_line_error(headscope("-q", "kv", "--quick", "--out", str(out), check=False))
    assert "already exists" in line and "--force" in line
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no lock or staging folder left


def test_force_refuses_a_folder_that_is_not_a_headscope_output(tmp_path):
    webapp = tmp_path / "webapp"
    (webapp / "src").mkdir(parents=True)
    (webapp / "manifest.json").write_text('{"name":"x"}')
    (webapp / "src" / "app.js").write_text("code")
    line = one_line_error(headscope("-q", "kv", "--quick", "--out", str(webapp), "--force", check=False))
    assert "refusing" in line
    assert (webapp / "src" / "app.js").read_text() == "code" and (webapp / "manifest.json").read_text() == '{"name":"x"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["webapp"]


def test_force_keeps_the_users_files_and_a_failed_force_run_changes_nothing(tmp_path):
    out = tmp_path / "run"
    headscope("-q", "kv", "--quick", "--out", str(out))
    (out / "notes.txt").write_text("my notes")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".run.lock").write_text(f"{dead.pid}\n")  # a stale lock from a killed run: taken over
    headscope("-q", "kv", "--quick", "--out", str(out), "--force")
    assert (out / "notes.txt").read_text() == "my notes"
    assert json.loads((out / "manifest.json").read_text())["status"] == {"kv": "done"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    task = tmp_path / "multi.jsonl"
    task.write_text(json.dumps({"prompt": "k01 v02 ; k01", "answer": "v02 v03"}) + "\n")
    proc = headscope("-q", "kv", "--quick", "--task", str(task), "--out", str(out), "--force", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multi.jsonl", "run"]


def test_a_second_run_on_the_same_out_fails_at_once(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n"), str(tmp_path / ".run.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        line = one_line_error(headscope("-q", "kv", "--quick", "--out", str(out), check=False))
        assert f"in use by another headscope run (pid {holder.pid})" in line
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
