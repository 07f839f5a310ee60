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
