"""`headscope` end to end: the report on the default model, bad input, interrupt and resume.

Runs the real CLI in subprocesses (as a user would) where the process is what is tested: the
module entry point, the reports whose results other runs must reproduce, kill -9 and concurrent
runs. Elsewhere `cli(...)` calls main(argv) in this process (the same code without the ~10 s of
imports a fresh process pays) and returns its exit code and what it printed. The quick report is
the fast tier; the full-size report is the slow tier.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from headscope.analyses.core.registry import ANALYSES

XSS = "<script>alert(1)</script>"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}


def cli(*args: str, check: bool = True) -> SimpleNamespace:
    """`headscope ARGS` in this process: returncode, stdout and stderr as a subprocess would give."""
    from headscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse: --help, --version, usage errors
            code = exit_.code if isinstance(exit_.code, int) else 2
    proc = SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
    if check and code != 0:
        raise AssertionError(f"headscope {' '.join(args)} exited {code}\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


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
    # --budget inf: the tests below rerun it and compare summaries; a budget fits sweeps to the machine's speed timed
    # at the start, so under load two runs of one command may legitimately differ (analyses/core/budget.py)
    headscope("-q", "report", "--quick", "--budget", "inf", "--out", str(out))
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
    headscope("-q", "report", "--quick", "--budget", "inf", "--analyses", ",".join(names), "--out", str(out))
    assert summaries(out, names) == summaries(quick_report, names)


def test_interrupted_run_resumes_to_the_same_results(quick_report, tmp_path):
    names = ["heads", "mlp", "kv"]
    out = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [sys.executable, "-m", "headscope", "-q", "report", "--quick", "--budget", "inf", "--analyses", ",".join(names),
         "--out", str(out)],
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
    refused = cli("report", "--quick", "--budget", "inf", "--analyses", ",".join(names), "--out", str(out), check=False)
    assert refused.returncode == 2 and "--resume" in refused.stderr
    cli("-q", "report", "--quick", "--budget", "inf", "--analyses", ",".join(names), "--out", str(out), "--resume")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"][names[0]] == "done (resumed)"
    assert summaries(out, names) == summaries(quick_report, names)
    assert (out / "report.html").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--analyses", "heads,nope"], "Unknown analysis 'nope'"),
        (["--task", "{tmp}/missing.jsonl"], "does not exist"),
        (["--task", "{tmp}/no_answer.jsonl"], "no column 'answer'; its columns are ['prompt']; name yours with --task-fields"),
        (["--model", "{tmp}/not-a-model"], "Unknown model"),
        (["--resume", "--force"], "--resume and --force exclude each other"),
        (["--device", "cuda:99"], "Device 'cuda:99' is not available"),  # (no machine has 100 GPUs)
        (["--device", "gpu"], "Unknown device 'gpu'; this machine offers: cpu"),
        (["--dtype", "int8"], "Unknown dtype 'int8'; use one of float32, bfloat16, float16."),
        (["--task", "{tmp}/no_answer.jsonl", "--task-fields", "prompt=text,prompt=bad"], "'prompt' is mapped twice"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(args, message, tmp_path):
    (tmp_path / "no_answer.jsonl").write_text(json.dumps({"prompt": "k01 v02 ; k01"}) + "\n")
    out = tmp_path / "out"
    proc = cli("report", "--quick", "--out", str(out), *[a.format(tmp=tmp_path) for a in args], check=False)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not out.exists()


def test_existing_out_is_refused_without_force(quick_report):
    before = {p: p.stat().st_mtime_ns for p in quick_report.rglob("*") if p.is_file()}
    proc = cli("report", "--quick", "--out", str(quick_report), check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr and "--force" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in quick_report.rglob("*") if p.is_file()} == before


def test_single_analysis_subcommand(tmp_path):
    out = tmp_path / "kv-only"
    cli("-q", "kv", "--quick", "--out", str(out))
    assert json.loads((out / "manifest.json").read_text())["status"] == {"kv": "done"}
    assert (out / "kv" / "summary.json").exists()


@pytest.mark.slow
def test_full_report_on_the_default_model(tmp_path):
    """Every analysis in its full (not --quick) mode, in a budget of half a minute (the sweeps that
    do not fit shrink; a fast machine runs more of them whole): done, and the manifest records the budget."""
    out = tmp_path / "full"
    headscope("-q", "report", "--budget", "0.5", "--out", str(out), timeout=1800)
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(state == "done" for state in manifest["status"].values()), manifest["status"]
    assert manifest["config"]["quick"] is False
    assert manifest["config"]["budget_minutes"] == 0.5 and set(manifest["budget"]) == set(manifest["status"])


# ---- exit codes and output-folder safety (issue #20) ---------------------------------------------
def one_line_error(proc: SimpleNamespace) -> str:
    """A user mistake: exit 2, one line on stderr, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: error: "), proc.stderr
    return lines[0]


def test_every_subcommand_exits_0(tmp_path):
    from headscope import __version__

    assert cli("--version").stdout.strip() == f"headscope {__version__}"
    assert "report" in cli("--help").stdout
    listing = cli("zoo", "list")
    assert "zoo/synth-llama" in listing.stdout and listing.stderr == ""  # (it used to exit 1, its lines on stderr)
    assert "sites:" in cli("-q", "sites", "--model", "zoo/synth-llama").stdout
    cli("-q", "kv", "--quick", "--out", str(tmp_path / "kv"))
    assert (tmp_path / "kv" / "kv" / "summary.json").exists()


def test_user_mistakes_exit_2_with_one_line_and_write_nothing(tmp_path):
    out = tmp_path / "out"
    line = one_line_error(cli("-q", "kv", "--quick", "--task", "nope", "--out", str(out), check=False))
    assert "Unknown task 'nope'" in line and not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    line = one_line_error(cli("-q", "kv", "--quick", "--out", str(out), check=False))
    assert "already exists" in line and "--force" in line
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no lock or staging folder left


def test_force_refuses_a_folder_that_is_not_a_headscope_output(tmp_path):
    webapp = tmp_path / "webapp"
    (webapp / "src").mkdir(parents=True)
    (webapp / "manifest.json").write_text('{"name":"x"}')
    (webapp / "src" / "app.js").write_text("code")
    line = one_line_error(cli("-q", "kv", "--quick", "--out", str(webapp), "--force", check=False))
    assert "refusing" in line
    assert (webapp / "src" / "app.js").read_text() == "code" and (webapp / "manifest.json").read_text() == '{"name":"x"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["webapp"]


def test_force_keeps_the_users_files_and_a_failed_force_run_changes_nothing(tmp_path):
    out = tmp_path / "run"
    cli("-q", "kv", "--quick", "--out", str(out))
    (out / "notes.txt").write_text("my notes")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".run.lock").write_text(f"{dead.pid}\n")  # a stale lock from a killed run: taken over
    cli("-q", "kv", "--quick", "--out", str(out), "--force")
    assert (out / "notes.txt").read_text() == "my notes"
    assert json.loads((out / "manifest.json").read_text())["status"] == {"kv": "done"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    task = tmp_path / "multi.jsonl"
    task.write_text(json.dumps({"prompt": "k01 v02 ; k01", "answer": "v02", "wrong_answer": "v02 v03"}) + "\n")
    proc = cli("-q", "kv", "--quick", "--task", str(task), "--out", str(out), "--force", check=False)
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
        line = one_line_error(cli("-q", "kv", "--quick", "--out", str(out), check=False))
        assert f"in use by another headscope run (pid {holder.pid})" in line
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()


# ---- --trust-remote-code and internal errors (issue #20 items 2, 6) -------------------------------------
def test_trust_remote_code_is_an_option_of_every_model_command_and_warns(caplog):
    from headscope.cli import _parser, main

    for command in ("report", *ANALYSES, "sites"):
        assert _parser().parse_args([command, "--trust-remote-code"]).trust_remote_code is True
        assert _parser().parse_args([command]).trust_remote_code is False
    with caplog.at_level("WARNING", logger="headscope"):
        assert main(["-q", "sites", "--model", "zoo/synth-llama", "--device", "cpu", "--trust-remote-code"]) == 0
    assert any("--trust-remote-code" in r.getMessage() and "trusted" in r.getMessage() for r in caplog.records)


def fake_analyses(monkeypatch, failing: str | None = None):
    """Cheap stand-ins for the analyses (a one-row result; `failing` raises an unexpected error)."""
    from types import SimpleNamespace

    import pandas as pd

    from headscope.reports import report as report_mod

    def runner(name):
        def run(model, task, config):
            if name == failing:
                raise RuntimeError("boom inside " + name)
            return SimpleNamespace(df=pd.DataFrame({"x": [1]}), summary={"ok": 1}, tables={}, plot=lambda: {})
        return run

    monkeypatch.setattr(report_mod, "get_analysis", runner)


def test_an_internal_error_in_an_analysis_is_logged_in_out_and_exits_1(tmp_path, monkeypatch, capsys):
    from headscope.cli import ERROR_LOG, main

    fake_analyses(monkeypatch, failing="mlp")
    out = tmp_path / "run"
    assert main(["-q", "report", "--analyses", "kv,mlp", "--quick", "--device", "cpu", "--out", str(out)]) == 1
    log = (out / ERROR_LOG).read_text()
    assert "Traceback" in log and "RuntimeError: boom inside mlp" in log
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"tracebacks in {out / ERROR_LOG}" in err
    assert json.loads((out / "manifest.json").read_text())["status"]["kv"] == "done"


def test_a_failed_force_run_writes_its_error_log_outside_the_previous_output(tmp_path, monkeypatch, capsys):
    from headscope.cli import ERROR_LOG, main

    fake_analyses(monkeypatch)
    out = tmp_path / "run"
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--out", str(out)]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    fake_analyses(monkeypatch, failing="kv")
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--out", str(out), "--force"]) == 1
    after = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert after == before and not (out / ERROR_LOG).exists()  # the old output stays exactly as it was
    err = capsys.readouterr().err
    where = err.split("tracebacks in ")[-1].split(".log")[0] + ".log"
    assert "RuntimeError: boom inside kv" in Path(where).read_text()
    Path(where).unlink()
    Path(where).parent.rmdir()  # (its own private folder)


def test_an_internal_error_outside_the_analyses_is_one_line_pointing_at_the_log(tmp_path, monkeypatch, capsys):
    from headscope.cli import ERROR_LOG, main
    from headscope.reports import html_report

    fake_analyses(monkeypatch)

    def broken(*args, **kwargs):
        raise RuntimeError("the report writer broke")

    monkeypatch.setattr(html_report, "write_report_files", broken)
    out = tmp_path / "run"
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--out", str(out)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"headscope: internal error: RuntimeError: the report writer broke; traceback in {out / ERROR_LOG} "
                     f"(please report it)."]
    assert "Traceback" in (out / ERROR_LOG).read_text()
    assert (out / "kv" / "summary.json").exists()  # kept for --resume


def test_the_fallback_error_log_is_a_new_private_file_and_follows_no_planted_link(tmp_path, monkeypatch):
    """A failed --force run logs outside OUT: never at the old predictable /tmp/headscope-error-<pid>.log
    (a symbolic link planted there is not followed), but in a new 0700 folder as a new 0600 file."""
    import stat
    import tempfile

    from headscope.cli import ERROR_LOG, _write_error_log

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "tmp" / f"headscope-error-{os.getpid()}.log").symlink_to(victim)
    out = tmp_path / "out"
    out.mkdir()
    where = Path(_write_error_log(["Traceback: boom"], out, keep_out=True))
    assert victim.read_text() == "precious\n" and list(out.iterdir()) == []
    assert where.read_text() == "Traceback: boom\n" and where.parent.parent == tmp_path / "tmp"
    assert stat.S_IMODE(where.stat().st_mode) == 0o600 and stat.S_IMODE(where.parent.stat().st_mode) == 0o700
    (out / ERROR_LOG).symlink_to(victim)  # OUT's own log is never written through a link either
    assert _write_error_log(["Traceback: again"], out) is None and victim.read_text() == "precious\n"


def test_ctrl_c_is_one_line_exit_130_naming_how_to_finish(tmp_path, monkeypatch, capsys):
    from headscope.cli import main
    from headscope.reports import report as report_mod

    fake_analyses(monkeypatch)
    runner = report_mod.get_analysis

    def interrupted(name):
        if name == "mlp":
            def run(model, task, config):
                raise KeyboardInterrupt
            return run
        return runner(name)

    monkeypatch.setattr(report_mod, "get_analysis", interrupted)
    out = tmp_path / "run"
    args = ["-q", "report", "--analyses", "kv,mlp", "--quick", "--device", "cpu", "--out", str(out)]
    assert main(args) == 130
    assert capsys.readouterr().err.splitlines() == [
        f"headscope: interrupted; rerun with --resume --out {out} to finish the run (its finished analyses are kept)."]
    assert sorted(p.name for p in out.iterdir()) == ["kv", "manifest.json"] and [p.name for p in tmp_path.iterdir()] == ["run"]
    # (that --resume then finishes: tests/reports/test_output_safety.py, test_an_interrupted_fresh_run_stays_for_resume...)


def test_resume_with_another_seed_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from headscope.cli import main

    fake_analyses(monkeypatch)
    out = tmp_path / "run"
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--out", str(out)]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["-q", "kv", "--quick", "--seed", "5", "--device", "cpu", "--out", str(out), "--resume"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and "seed 0 (now 5)" in lines[0], lines
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_resume_refuses_a_model_whose_weights_changed_in_one_line(tmp_path, monkeypatch, capsys):
    """New weights saved over the model folder (same path, same shapes, other values) are another
    model: --resume refuses them, exit 2, one line, OUT unchanged (#36)."""
    from safetensors.torch import load_file, save_file

    from headscope.cli import main
    from tests_support import build_tiny_model

    fake_analyses(monkeypatch)
    monkeypatch.setattr("headscope.reports.explorer.write_explorer_data", lambda *a, **k: 1 / 0)  # (optional, slow)
    model = build_tiny_model("gpt2", tmp_path / "m")
    out = tmp_path / "run"
    assert main(["-q", "report", "--analyses", "kv", "--quick", "--device", "cpu", "--model", str(model), "--out", str(out)]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    weights = load_file(model / "model.safetensors")
    save_file({k: v + 0.01 for k, v in weights.items()}, model / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    assert main(["-q", "report", "--analyses", "kv,mlp", "--quick", "--device", "cpu", "--model", str(model),
                 "--out", str(out), "--resume"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and "model files (weights" in lines[0], lines
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


# ---- issue #20 review: two real runs at once, refused inputs, sampling, --resume, every subcommand ----------
GATED_CLI = """
import sys, time
from pathlib import Path
from headscope.reports import report
from headscope.cli import main

real, go = report.get_analysis, Path(sys.argv[1])

def gated(name):
    run = real(name)
    def wait_then_run(*args, **kwargs):  # the real analysis, once the test opens the gate
        while not go.exists():
            time.sleep(0.05)
        return run(*args, **kwargs)
    return wait_then_run

report.get_analysis = gated
sys.exit(main(sys.argv[2:]))
"""


def listed_files_match_the_disk(out: Path) -> None:
    """manifest.json lists exactly the files in OUT (itself aside), each with its sha256; nothing temporary."""
    import hashlib

    files = json.loads((out / "manifest.json").read_text())["files"]
    on_disk = {p.relative_to(out).as_posix(): p for p in out.rglob("*") if p.is_file()}
    assert set(files) == set(on_disk) - {"manifest.json"}
    assert all(hashlib.sha256(on_disk[rel].read_bytes()).hexdigest() == digest for rel, digest in files.items())
    assert not [p for p in out.rglob("*") if p.name.endswith((".tmp", ".partial")) or ".staging-" in p.name]


def test_two_concurrent_force_runs_one_waits_for_nothing_and_the_output_stays_whole(tmp_path, monkeypatch):
    """Two real `headscope report --analyses kv --quick --force` processes started together on one OUT:
    the one that takes the lock stages and holds it (its real kv analysis waits at a gate the test opens
    only after the other run ended), so the other must fail at once in one line."""
    from headscope.cli import main

    fake_analyses(monkeypatch)
    out = tmp_path / "run"
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--out", str(out)]) == 0  # an existing headscope output
    go = tmp_path / "go"
    args = ["-q", "report", "--analyses", "kv", "--quick", "--force", "--device", "cpu", "--out", str(out)]
    procs = [subprocess.Popen([sys.executable, "-c", GATED_CLI, str(go), *args], env=ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        deadline = time.time() + 120
        while all(p.poll() is None for p in procs):
            assert time.time() < deadline, "neither run ended while one held the gate"
            time.sleep(0.1)
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        assert winner.poll() is None  # still holding the lock, at the gate
        assert [p.name for p in tmp_path.glob(".run.staging-*")] == [f".run.staging-{winner.pid}"]
        _, err = loser.communicate()
        proc = subprocess.CompletedProcess(loser.args, loser.returncode, "", err)
        assert f"is in use by another headscope run (pid {winner.pid})" in one_line_error(proc)
        go.touch()
        _, err = winner.communicate(timeout=300)
        assert winner.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "run"]  # no lock, staging or old folder left
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == {"kv": "done"}
    assert "bytes_per_token" in json.loads((out / "kv" / "summary.json").read_text())  # the real kv result replaced the old
    listed_files_match_the_disk(out)


def in_process_error(capsys) -> str:
    """The one stderr line of a refused in-process run."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: error: ") and "Traceback" not in lines[0], lines
    return lines[0]


def test_refused_model_files_out_links_and_task_rows_are_one_line_and_leave_nothing(tmp_path, monkeypatch, capsys, tiny_dirs):
    import shutil

    from headscope.cli import main

    fake_analyses(monkeypatch)
    run = ["-q", "kv", "--quick", "--device", "cpu"]
    model = tmp_path / "model"
    shutil.copytree(tiny_dirs["gpt2"], model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    out = tmp_path / "out"
    assert main([*run, "--model", str(model), "--out", str(out)]) == 2
    assert f"Model file {str(weights)!r} is truncated or corrupt" in in_process_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]

    real = tmp_path / "real"
    assert main([*run, "--out", str(real)]) == 0
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    before = {p.relative_to(real): p.read_bytes() for p in real.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*run, "--out", str(link), "--force"]) == 2
    assert "is a symbolic link" in in_process_error(capsys)
    assert {p.relative_to(real): p.read_bytes() for p in real.rglob("*") if p.is_file()} == before
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["link", "model", "real"]

    good = json.dumps({"prompt": "k01 v02 ; k01", "answer": "v02", "wrong_answer": "v03"})
    rows = {"long": json.dumps({"prompt": " ".join(["k01"] * 300), "answer": "v02", "wrong_answer": "v03"}),  # context 128
            "multi": json.dumps({"prompt": "k01 v02 ; k01", "answer": "v02", "wrong_answer": "v02 v03"})}
    for name, bad in rows.items():
        task = tmp_path / f"{name}.jsonl"
        task.write_text(f"{good}\n{good}\n{bad}\n")
        out = tmp_path / f"out-{name}"
        assert main([*run, "--task", str(task), "--out", str(out)]) == 2
        line = in_process_error(capsys)
        assert f"{name}.jsonl" in line and "line 3, row 2" in line, line
        assert ("context of 128 tokens" if name == "long" else "it must be one token here") in line
        assert not out.exists() and not list(tmp_path.glob(".out-*"))


def test_force_where_the_staging_folder_is_not_permitted_is_one_line_even_as_root(tmp_path, monkeypatch, capsys):
    import errno

    from headscope.cli import main

    fake_analyses(monkeypatch)
    out = tmp_path / "run"
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--out", str(out)]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    real_mkdir = os.mkdir

    def denied(path, *args, **kwargs):  # what a read-only parent folder answers a non-root user
        if ".run.staging-" in os.fspath(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", denied)
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--out", str(out), "--force"]) == 2
    line = in_process_error(capsys)
    assert "Cannot create the staging folder" in line and os.strerror(errno.EACCES) in line
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_quick_and_n_examples_sample_a_large_task_file(tmp_path):
    """A 2,000-row task file: the real kv analysis runs on --n-examples 12 of its rows (not its quick
    default of 16); the report's task_examples.csv shows at most 200 of them."""
    import csv
    import random

    from headscope.cli import main

    rng = random.Random(0)
    keys, values = [f"k{i:02d}" for i in range(1, 10)], [f"v{i:02d}" for i in range(1, 10)]
    rows = []
    for _ in range(2000):
        k, v, j = rng.sample(keys, 3), rng.sample(values, 3), rng.randrange(3)
        rows.append({"prompt": " ".join(f"{a} {b}" for a, b in zip(k, v, strict=True)) + f" ; {k[j]}", "answer": v[j]})
    task = tmp_path / "big.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    assert main(["-q", "kv", "--quick", "--task", str(task), "--n-examples", "12", "--device", "cpu", "--out", str(out)]) == 0
    config = json.loads((out / "manifest.json").read_text())["config"]
    assert config["n_examples"] == 12 and config["settings"]["analysis_configs"]["kv"]["n_examples"] == 12
    with open(out / "kv" / "results.csv", newline="") as fh:
        results = list(csv.DictReader(fh))
    per_cell: dict[tuple[str, str], set[str]] = {}
    for r in results:
        per_cell.setdefault((r["policy"], r["budget"]), set()).add(r["example"])
    assert per_cell and all(examples == {str(i) for i in range(12)} for examples in per_cell.values())
    with open(out / "task_examples.csv", newline="") as fh:
        shown = list(csv.DictReader(fh))
    assert 12 <= len(shown) <= 200
    assert all({"prompt": r["prompt"], "answer": r["answer"]} in rows for r in shown)


def test_resume_is_refused_when_an_analysis_config_changed(tmp_path, monkeypatch, capsys):
    from headscope.analyses.core.registry import config_class
    from headscope.cli import main

    fake_analyses(monkeypatch)
    out = tmp_path / "run"
    assert main(["-q", "report", "--analyses", "kv,mlp", "--quick", "--device", "cpu", "--out", str(out)]) == 0
    (out / "report.html").unlink()  # as if killed before the report
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    kv = config_class("kv")
    assert kv.preset(quick=True).n_sink != 2
    monkeypatch.setattr(kv, "preset", classmethod(lambda cls, **common: cls(n_sink=2, **common)))
    assert main(["-q", "report", "--analyses", "kv,mlp", "--quick", "--device", "cpu", "--out", str(out), "--resume"]) == 2
    line = in_process_error(capsys)
    assert "--resume" in line and "kv config (n_sink)" in line and "mlp config" not in line
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_position_n_items_is_a_recorded_setting_that_resume_holds_to(tmp_path, monkeypatch, capsys):
    """--n-items goes into position's config (the manifest's analysis_configs): a --resume with another N is
    refused in one line naming it, and --n-items on a run without position is refused before anything is written."""
    from headscope.cli import main

    fake_analyses(monkeypatch)
    out = tmp_path / "run"
    assert main(["-q", "position", "--quick", "--device", "cpu", "--n-items", "4", "--out", str(out)]) == 0
    settings = json.loads((out / "manifest.json").read_text())["config"]["settings"]
    assert settings["analysis_configs"]["position"]["n_items"] == 4
    (out / "report.html").unlink()  # as if killed before the report
    capsys.readouterr()
    assert main(["-q", "position", "--quick", "--device", "cpu", "--n-items", "5", "--out", str(out), "--resume"]) == 2
    assert "position config (n_items)" in in_process_error(capsys)
    from headscope.reports.report import build_report

    with pytest.raises(ValueError, match=r"^--n-items sets position's items a prompt; this run has no position analysis "
                                         r"\(kv\)\.$"):
        build_report("zoo/synth-llama", analyses="kv", n_items=4, out=str(tmp_path / "kv"))
    assert not (tmp_path / "kv").exists()


def test_report_takes_n_items_to_positions_config_the_manifest_and_resume(tmp_path, monkeypatch, capsys):
    """`headscope report --n-items N` (as `headscope position --n-items N`): N reaches position's config (what its run
    receives) and the manifest's analysis_configs, and no other analysis's; a --resume with another N is refused
    naming it; without position in --analyses it is refused in one line before anything is written."""
    from headscope.cli import main
    from headscope.reports import report as report_mod

    fake_analyses(monkeypatch)
    fake, seen = report_mod.get_analysis, {}

    def recording(name):
        def run(model, task, config):
            seen[name] = config
            return fake(name)(model, task, config)
        return run

    monkeypatch.setattr(report_mod, "get_analysis", recording)
    out = tmp_path / "run"
    assert main(["-q", "report", "--analyses", "position,kv", "--quick", "--device", "cpu", "--n-items", "3",
                 "--out", str(out)]) == 0
    assert seen["position"].n_items == 3 and not hasattr(seen["kv"], "n_items")
    settings = json.loads((out / "manifest.json").read_text())["config"]["settings"]
    assert settings["analysis_configs"]["position"]["n_items"] == 3
    (out / "report.html").unlink()  # as if killed before the report
    capsys.readouterr()
    assert main(["-q", "report", "--analyses", "position,kv", "--quick", "--device", "cpu", "--n-items", "5",
                 "--out", str(out), "--resume"]) == 2
    assert "position config (n_items)" in in_process_error(capsys)
    assert main(["-q", "report", "--analyses", "kv", "--quick", "--device", "cpu", "--n-items", "3",
                 "--out", str(tmp_path / "kv")]) == 2
    assert "this run has no position analysis (kv)" in in_process_error(capsys)
    assert not (tmp_path / "kv").exists()


@pytest.mark.parametrize("name", list(ANALYSES))
def test_every_single_analysis_subcommand_exits_0(name, tmp_path, monkeypatch):
    from headscope.cli import main

    fake_analyses(monkeypatch)
    out = tmp_path / name
    assert main(["-q", name, "--quick", "--device", "cpu", "--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["status"] == {name: "done"}
    assert json.loads((out / name / "summary.json").read_text()) == {"ok": 1}


def test_zoo_train_one_step_exits_0(tmp_path):
    import csv

    from headscope.cli import main

    out = tmp_path / "zoo"
    assert main(["-q", "zoo", "train", "synth-llama", "--steps", "1", "--out", str(out)]) == 0
    with open(out / "history.csv", newline="") as fh:
        steps = [r for r in csv.DictReader(fh) if r["kind"] == "train"]
    assert len(steps) == 1 and json.loads((out / "card.json").read_text())["train"]["steps"] == 1
    assert (out / "model.safetensors").stat().st_size > 0 and (out / "tokenizer.json").exists()


# ---- --strict: words that become the unknown token stop the run (issue #19) ----------------------------
def test_strict_is_an_option_of_report_and_every_analysis_subcommand():
    from headscope.cli import _parser

    for command in ("report", *ANALYSES):
        assert _parser().parse_args([command, "--strict"]).strict is True
        assert _parser().parse_args([command]).strict is False


def test_the_bos_options_are_options_of_report_and_every_analysis_subcommand():
    from headscope.cli import _parser

    for command in ("report", *ANALYSES):
        assert [_parser().parse_args([command, *flag]).prepend_bos for flag in ([], ["--no-prepend-bos"], ["--prepend-bos"])] \
            == [None, False, True]
    with pytest.raises(SystemExit):
        _parser().parse_args(["kv", "--prepend-bos", "--no-prepend-bos"])  # one or the other


def test_strict_refuses_unknown_words_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, tiny_dirs):
    """A 40-row task file whose only unknown word ('zebra', not in the tiny word-level vocabulary) is in
    its last row, run on a 2-example sample: --strict checks every row, so `report` and `kv` exit 2
    with one line naming the word and its row, and leave nothing; without --strict the run goes on."""
    from headscope.cli import main
    from headscope.errors import TokenizationWarning

    fake_analyses(monkeypatch)
    rows = [{"prompt": f"w{i % 9 + 1} w{i % 7 + 2} w3", "answer": "w4"} for i in range(39)]
    rows.append({"prompt": "w1 zebra w2", "answer": "w5"})
    task = tmp_path / "mine.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = ["-q", "--quick", "--device", "cpu", "--model", str(tiny_dirs["llama"]), "--task", str(task), "--n-examples", "2"]
    for command in (["report", "--analyses", "kv,heads"], ["kv"]):
        out = tmp_path / "out"
        assert main([command[0], *run, *command[1:], "--strict", "--out", str(out)]) == 2
        line = in_process_error(capsys)
        assert "mine.jsonl" in line and "'zebra' (line 40, row 39 prompt)" in line and "strict" in line, line
        assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.jsonl"]  # no OUT, lock or staging folder
    out = tmp_path / "lenient"
    with pytest.warns(TokenizationWarning, match=r"'zebra' \(line 40, row 39 prompt\)"):
        assert main(["kv", *run, "--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["status"] == {"kv": "done"}


# ---- user data as it comes (#32 item 8) ---------------------------------------------------------------
def test_pairs_of_two_lengths_are_counted_once_from_the_rows_patched(tmp_path, tiny_dirs, recwarn, monkeypatch):
    """#34 item 6: a 70-row file, every other row's corrupted prompt one token short, patched on a
    seeded sample of 8: the task check's own 64-row sample (at least 29 such rows) warns nothing, so the
    one warning counts the rows the analysis patched (at most 8), as its summary does. No figures are drawn
    (Result.plot returns none): the warnings and the summary are what is checked."""
    from headscope.analyses.core.result import Result

    monkeypatch.setattr(Result, "plot", lambda self, **kwargs: {})
    rows = [{"prompt": f"w{i % 9 + 1} w{i % 7 + 2} w3", "answer": " w4", "wrong_answer": " w5",
             "corrupted_prompt": f"w{i % 9 + 1} w8 w3" if i % 2 else "w1 w2"} for i in range(70)]
    task = tmp_path / "seventy.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli("patching", "-q", "--quick", "--device", "cpu", "--model", str(tiny_dirs["gpt2"]), "--task", str(task),
        "--n-examples", "8", "--seed", "1", "--out", str(tmp_path / "out"))
    summary = json.loads((tmp_path / "out" / "patching" / "summary.json").read_text())
    said = {str(w.message) for w in recwarn if "have another token length" in str(w.message)}
    assert len(said) == 1, said
    assert said.pop().startswith(f"patching: Task file {str(task)!r}: {summary['pairs_left_out']} corrupted prompt(s) "
                                 "have")
    assert 0 < summary["pairs_left_out"] <= 8 and summary["n_examples"] == 8 - summary["pairs_left_out"]


def test_a_pair_of_two_lengths_warns_once_and_an_unusable_task_is_exit_2(tmp_path, tiny_dirs):
    """patching on six rows, row 2's corrupted prompt one token short: one warning line naming the row
    (no Python source line under it), the other five patched and the count in the summary; --strict
    refuses the file; `kv` given answers of two tokens (which it cannot score) is exit 2 with the reason
    and writes nothing, where it used to run on its own default task."""
    rows = [{"prompt": f"w{i} w{i + 1} w{i + 2}", "answer": f" w{i + 10}", "corrupted_prompt": f"w{i} w{i + 20} w{i + 2}",
             "wrong_answer": f" w{i + 11}"} for i in range(1, 7)]
    rows[2]["corrupted_prompt"] = "w3 w9"
    task = tmp_path / "six.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = ["-q", "--quick", "--device", "cpu", "--model", str(tiny_dirs["gpt2"]), "--task", str(task)]
    proc = headscope("patching", *run, "--out", str(tmp_path / "out"))  # a process: the warnings as a user sees them
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"WARNING HeadscopeWarning: patching: Task file {str(task)!r}: 1 corrupted prompt(s) have another "
                     f"token length than their prompt (line 3, row 2: 4 vs 3 tokens); patching patches pairs and leaves "
                     f"those rows out."], proc.stderr
    summary = json.loads((tmp_path / "out" / "patching" / "summary.json").read_text())
    assert summary["pairs_left_out"] == 1 and summary["pairs_left_out_rows"] == [2] and summary["n_examples"] == 5
    assert summary["chance"]["n_examples"] == 5  # the chance guard judges the rows patched
    line = one_line_error(cli("patching", *run, "--strict", "--out", str(tmp_path / "strict"), check=False))
    assert "(line 3, row 2: 4 vs 3 tokens)" in line and "strict mode refuses" in line
    two = tmp_path / "two.jsonl"
    two.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1}", "answer": f" w{i + 10} w{i + 11}"}) + "\n"
                           for i in range(1, 7)))
    out = tmp_path / "kv"
    line = one_line_error(cli("kv", *run[:-1], str(two), "--out", str(out), check=False))
    assert "kv cannot run on your task (two.jsonl): the task's answers are up to 2 tokens long" in line, line
    assert not out.exists() and not (tmp_path / "strict").exists()


def test_dtype_runs_the_report_in_that_precision_and_says_so(tmp_path, monkeypatch):
    from headscope.cli import main

    fake_analyses(monkeypatch)
    out = tmp_path / "bf16"
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--dtype", "bf16", "--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["config"]["dtype"] == "bfloat16"
    page = (out / "report.html").read_text()
    assert "<th>dtype</th><td>bfloat16</td>" in page
    assert "d_model " in page and ", run in bfloat16 on cpu." in page  # review 7 A6: in the header, not only at the end
    assert ", run in bfloat16 on cpu" in (out / "report.md").read_text()
    assert "parallel blocks" not in page  # the zoo Llama is sequential (review 8 C2: only parallel blocks say it)


def test_a_bfloat16_checkpoint_runs_in_bfloat16_by_default_and_resume_compares_the_dtype_run(tmp_path, tiny_dirs,
                                                                                               monkeypatch):
    """Review 15c A1: without --dtype a checkpoint saved in bfloat16 runs in bfloat16 (it ran in float32, TransformerLens's
    default): manifest, resume settings and header name it; --resume with another --dtype is refused in one line (the
    dtype run was recorded but never compared), and so is a manifest of the old code (settings dtype None, config
    dtype float32) resumed where the checkpoint's is now bfloat16."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from headscope.errors import ConfigError
    from headscope.reports.resume_settings import check_resume

    folder = tmp_path / "bf16"
    shutil.copytree(tiny_dirs["gpt2"], folder)
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(torch.bfloat16).save_pretrained(folder)
    fake_analyses(monkeypatch)
    out = tmp_path / "run"
    cli("-q", "kv", "--quick", "--device", "cpu", "--model", str(folder), "--out", str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["dtype"] == "bfloat16" and manifest["config"]["settings"]["dtype"] == "bfloat16"
    assert ", run in bfloat16 on cpu" in (out / "report.md").read_text()
    line = one_line_error(cli("-q", "kv", "--quick", "--device", "cpu", "--model", str(folder), "--out", str(out),
                              "--dtype", "float32", "--resume", check=False))
    assert "dtype 'bfloat16' (now 'float32')" in line, line
    cli("-q", "kv", "--quick", "--device", "cpu", "--model", str(folder), "--out", str(out), "--resume")
    settings = manifest["config"]["settings"]
    manifest["config"]["settings"], manifest["config"]["dtype"] = {**settings, "dtype": None}, "float32"
    (out / "manifest.json").write_text(json.dumps(manifest))  # as the old code wrote it for this run without --dtype
    with pytest.raises(ConfigError, match=r"dtype 'float32' \(now 'bfloat16'\)"):
        check_resume(out, settings)
    check_resume(out, {**settings, "dtype": "float32"})  # resumed with --dtype float32: the same precision, kept


def test_no_prepend_bos_runs_the_prompts_as_tokenized_and_every_page_says_which(tmp_path, tiny_dirs, monkeypatch, capsys):
    """Review 10b A1 / C3, 10a C1: the tiny word-level tokenizer adds no BOS (like GPT-2's). `kv --no-prepend-bos`
    records the choice (manifest, resume settings), its header says the prompts ran as tokenized and its sample shows
    no BOS; --resume without the option is refused in one line; the default run's header says headscope put `<bos>`
    in front; compare names the difference."""
    from headscope.cli import main
    from headscope.reports.compare import Run, settings_notes

    rows = [{"prompt": f"w{i} w{i + 1} w{i + 2}", "answer": f" w{i + 10}"} for i in range(1, 5)]
    task = tmp_path / "four.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = ["-q", "--quick", "--device", "cpu", "--model", str(tiny_dirs["gpt2"]), "--task", str(task)]
    fake_analyses(monkeypatch)  # the header and each section's sample (the task as loaded) need no analysis
    plain = tmp_path / "plain"
    cli("kv", *run, "--no-prepend-bos", "--out", str(plain))
    config = json.loads((plain / "manifest.json").read_text())["config"]
    assert config["prepend_bos"] is False and config["settings"]["prepend_bos"] is False and config["bos_added"] is None
    page = (plain / "report.html").read_text()
    assert ("on cpu. Prompts run as the tokenizer tokenizes them (--no-prepend-bos: headscope puts no BOS in front). "
            "Data:") in page
    # the sample is the file's row as written (review 11a C8): its answer " w11" keeps the file's leading space
    assert "sample: &#x27;w1 w2 w3&#x27; -&gt; &#x27; w11&#x27;" in page and "&lt;bos&gt;" not in page
    capsys.readouterr()
    assert main(["kv", *run, "--out", str(plain), "--resume"]) == 2
    line = in_process_error(capsys)
    assert "BOS --no-prepend-bos (now default (prepended on decoders))" in line, line
    default = tmp_path / "default"
    assert main(["kv", *run, "--out", str(default)]) == 0
    page = (default / "report.html").read_text()
    # review 14a C3: the BOS as code in each format, escaped once (not "`<bos>`" shown with its backticks in HTML, nor
    # "`&lt;bos&gt;`" in report.md, where an entity inside a code span shows as typed)
    assert ("on cpu. Prompts run as <code>&lt;bos&gt;</code> + your prompt: the tokenizer adds no BOS and headscope "
            "prepends its bos_token, as TransformerLens does; --no-prepend-bos runs them as tokenized. Data:") in page
    md = (default / "report.md").read_text()
    assert "Prompts run as `<bos>` \\+ your prompt: the tokenizer adds no BOS" in md and "`&lt;bos&gt;`" not in md
    assert "sample: &#x27;&lt;bos&gt;&#x27; + &#x27;w1 w2 w3&#x27; -&gt; &#x27; w11&#x27;" in page
    notes = settings_notes(Run(default), Run(plain), [])
    assert "BOS option: A default (prepended on decoders), B --no-prepend-bos." in notes
    assert "BOS headscope prepends (the tokenizer adds none): A <bos>, B none." in notes


def test_position_n_items_sets_the_documents_of_qa_records_and_is_checked_before_anything_is_written(
        tmp_path, capsys, arch_dirs, monkeypatch):
    """`headscope position --task QA.jsonl --n-items N` on a decoder (random GPT-2, byte-level BPE): 3 hand-built
    records whose pool leaves record 3 three answer-free distractors (test_position.SMALL_QA). N 4 runs with 4
    documents a prompt and the gold at each of the 4 slots (the sample prompt: Document [1] to [4], the gold in
    [1]); N 5, the default of 10 and N 1 are one line, exit 2, nothing written."""
    from headscope.cli import main
    from headscope.reports import html_report, report
    from tests_support import SMALL_QA

    monkeypatch.setattr(report.io, "write_figure", lambda path, fig: None)  # figures: test_figures' (and the cost)
    monkeypatch.setattr(html_report, "_top_heads_html", lambda out: "")
    task = tmp_path / "qa.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in SMALL_QA))
    run = ["position", "-q", "--quick", "--n-examples", "3", "--device", "cpu", "--model", str(arch_dirs["gpt2"]),
           "--task", str(task)]
    out = tmp_path / "out"
    cli(*run, "--n-items", "4", "--out", str(out))
    s = json.loads((out / "position" / "summary.json").read_text())
    assert (s["task"], s["n_examples"], s["n_items"], s["positions"]) == ("qa", 3, 4, [1, 2, 3, 4])
    prompt = json.loads((out / "position" / "task.json").read_text())["sample"]["prompt"]
    labels = [line.split("]")[0] + "]" for line in prompt.splitlines() if line.startswith("Document [")]
    assert labels == [f"Document [{i}]" for i in range(1, 5)]
    assert "Document [1](Title: Town) The Elbe river runs through the town." in prompt
    capsys.readouterr()
    for extra, said in ((["--n-items", "5"], "QA record 3 (question 'what runs past the bakery') has 3 answer-free "
                                             "distractor documents (its own and the other records'), and 5 documents a "
                                             "prompt (n_items, --n-items; the gold one included) need 4; add documents "
                                             "to the data or lower --n-items to 4 or less"),
                        ([], "QA record 1 (question 'which river runs through the town') has 5 answer-free "
                             "distractor documents"),
                        (["--n-items", "1"], "--n-items is position's items a prompt, the gold one included: an integer "
                                             "from 2 to 10000, got 1.")):
        refused = tmp_path / f"refused{len(extra)}{extra[-1:]}"
        assert main([*run, *extra, "--out", str(refused)]) == 2
        line = in_process_error(capsys)
        assert said in line and not refused.exists(), line
        if extra != ["--n-items", "1"]:
            assert line.startswith("headscope: error: position cannot run on your task (qa.jsonl): "), line
    # documents that fit the count but not the context (256): refused before the run, the record named
    long = [SMALL_QA[0], {**SMALL_QA[1], "documents": [{"title": "Garden", "text": "The garden has sunflowers. " * 30}]}]
    task.write_text("".join(json.dumps(r) + "\n" for r in long))
    assert main([*run, "--n-items", "3", "--out", str(tmp_path / "long")]) == 2
    line = in_process_error(capsys)
    assert re.search(r"\): record \d's 3 items take \d{3} tokens \(its prompt with the answer and greedy decoding's 8 "
                     r"more tokens\), more than .*gpt2's context of 256; lower --n-items or give shorter documents\.", line)
    assert not (tmp_path / "long").exists()


def test_position_takes_retrieval_records_on_an_encoder_and_refuses_records_that_do_not_fit(tmp_path, capsys, arch_dirs,
                                                                                            monkeypatch):
    """`headscope position --task FILE.jsonl` on an encoder reads retrieval records (query, relevant, distractors)
    with the loader `hs.position_bias(model, FILE)` uses: the run's sample prompt is the file's first record, and its
    no-gold cosine is plain HF's cosine of that query with that record's distractors. Records that do not fit (a
    missing field, multi-document QA records, --task-fields) are one line, exit 2, nothing written. (The PNGs are
    not rendered: the figures are test_figures' and cost most of the run here.)"""
    from transformers import AutoModel, AutoTokenizer

    from headscope.cli import main
    from headscope.reports import html_report, report

    monkeypatch.setattr(report.io, "write_figure", lambda path, fig: None)
    monkeypatch.setattr(html_report, "_top_heads_html", lambda out: "")

    records = [{"query": "Which river flows through Paris?", "relevant": "The Seine flows through the middle of Paris.",
                "distractors": ["The bakery opens at six in the morning.", "Her bicycle has a broken bell.",
                                "The train was late."]},
               {"query": "What colour is the sky on a clear day?", "relevant": "On a clear day the sky looks blue.",
                "distractors": ["The meeting was moved to the afternoon.", "He planted tomatoes in the garden."]}]
    task = tmp_path / "mine.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in records))
    bert = str(arch_dirs["bert"])
    run = ["position", "-q", "--quick", "--n-examples", "2", "--device", "cpu", "--model", bert]
    out = tmp_path / "out"
    cli(*run, "--task", str(task), "--n-items", "3", "--out", str(out))  # the first 2 distractors of each record
    s = json.loads((out / "position" / "summary.json").read_text())
    assert (s["task"], s["n_examples"], s["n_items"], s["positions"]) == ("retrieval", 2, 3, [1, 2, 3])
    provenance = json.loads((out / "position" / "task.json").read_text())
    assert provenance["source"] == "your task (mine.jsonl)"
    assert "the seine flows through the middle of paris." in provenance["sample"]["prompt"].lower()
    tok, hf = AutoTokenizer.from_pretrained(bert), AutoModel.from_pretrained(bert).eval()

    def embed(text):
        import torch

        with torch.no_grad():
            return hf(**tok(text, return_tensors="pt")).last_hidden_state.mean(1)  # [1, d_model]

    import torch

    expected = torch.nn.functional.cosine_similarity(embed(records[0]["query"]),
                                                     embed(" ".join(records[0]["distractors"][:2])))
    no_gold = (out / "position" / "no_gold.csv").read_text().splitlines()
    assert float(no_gold[1].split(",")[1]) == pytest.approx(expected.item(), abs=1e-5)
    capsys.readouterr()

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "relevant": "r"}) + "\n")
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "q", "answers": ["a"], "gold_document": {"title": "t", "text": "a"},
                              "documents": []}) + "\n")
    prompt_answer = tmp_path / "pa.jsonl"  # a prompt/answer task: the contract's usual reason, and the records' fields
    prompt_answer.write_text(json.dumps({"prompt": "the cat sat on the", "answer": " mat"}) + "\n")
    for path, said in ((bad, "a file of its own records holds one JSON object a line with query, relevant, distractors "
                             "(encoders) or question, answers, gold_document, documents (decoders); the first record of "
                             "bad.jsonl has query, relevant but not distractors"),
                       (qa, "(these are multi-document QA records, which position reads on a decoder)"),
                       (prompt_answer, "it runs on its own data (retrieval sweeps that move the gold item through the "
                                       "context), not on prompt/answer tasks; a file of its own records holds one JSON "
                                       "object a line with query, relevant, distractors (encoders)")):
        refused = tmp_path / f"refused-{path.stem}"
        assert main([*run, "--task", str(path), "--out", str(refused)]) == 2
        line = in_process_error(capsys)
        assert line.startswith(f"headscope: error: position cannot run on your task ({path.name}): ") and said in line, line
        assert not refused.exists()
    # --n-items 4: record 2 has 2 distractors, not 3 (it was given a shorter passage): one line, nothing written
    assert main([*run, "--task", str(task), "--n-items", "4", "--out", str(tmp_path / "n4")]) == 2
    assert in_process_error(capsys) == (
        "headscope: error: position cannot run on your task (mine.jsonl): retrieval record 2 (query 'What colour is the "
        "sky on a clear day?') has 2 distractor sentences, and 4 sentences a passage (n_items, --n-items; the relevant "
        "one included) need 3; add sentences to the record or lower --n-items to 3 or less. Give it a task it can use, "
        "or run `headscope report --analyses position`, which runs it on its own default task.")
    assert not (tmp_path / "n4").exists()
    assert main([*run, "--task", str(task), "--task-fields", "prompt=query", "--out", str(tmp_path / "f")]) == 2
    assert "--task-fields names a prompt/answer file's columns; position reads mine.jsonl as its own records" in (
        in_process_error(capsys))
    # a report whose other analyses read prompt/answer tasks: the file's error names the route that reads it
    assert main(["report", "-q", "--analyses", "position,heads", "--model", bert, "--task", str(task),
                 "--out", str(tmp_path / "r")]) == 2
    assert ("no column 'prompt', 'answer'" in (line := in_process_error(capsys)) and line.endswith(
        " This file holds position's own retrieval records, which only position reads: run `headscope position --task "
        "mine.jsonl` (heads need a prompt/answer task).")), line
    assert not (tmp_path / "r").exists()


def test_position_refuses_a_prompt_answer_file_before_loading_whatever_its_fields(tmp_path, capsys):
    """Review 14c C3: `headscope position --task dates.tsv` was told to add --task-fields; doing so loaded the model
    and then refused the task. Now both refuse before loading (the model path does not exist, so a load would fail
    with another line), with one line that says what position's --task takes, and nothing is written."""
    from headscope.cli import main

    task = tmp_path / "dates.tsv"
    task.write_text("sentence\tgold_day\nso the meeting is now on\t Friday\n")
    expected = ("headscope: error: position runs on its own data (retrieval sweeps that move the gold item through the "
                "context), not on prompt/answer tasks, so dates.tsv is not read, whatever --task-fields says; its --task "
                "takes a JSONL file of its own records, one JSON object a line: multi-document QA records (question, "
                "answers, gold_document, documents) on a decoder, retrieval records (query, relevant, distractors) on an "
                "encoder. Leave --task out for its default data or run `headscope report --task dates.tsv --task-fields "
                "...` for the analyses that read prompt/answer tasks.")
    for fields in ([], ["--task-fields", "prompt=sentence,answer=gold_day"]):
        out = tmp_path / f"out{len(fields)}"
        assert main(["-q", "position", "--model", str(tmp_path / "no-model"), "--task", str(task), *fields,
                     "--out", str(out)]) == 2
        assert in_process_error(capsys) == expected
        assert not out.exists()
