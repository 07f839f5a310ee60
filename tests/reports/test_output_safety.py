"""Output folders: headscope deletes only files it wrote, --force swaps a staging folder in only
when the run succeeded, the lock keeps two runs apart, and folder errors are one-line OutputErrors.

The build_report tests run cheap fake analyses (monkeypatched get_analysis) on the zoo model; the
CLI cases are in tests/test_cli.py.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from headscope.errors import (
    ConfigError,
    HeadscopeError,
    OutputError,
    OutputExistsError,
    OutputLockedError,
    RunFailedError,
    TaskError,
)
from headscope.reports import io, outputs
from headscope.reports import report as report_mod
from headscope.reports.manifest import OUTPUT_FORMAT, read_output_manifest
from headscope.reports.output_lock import OutputLock, lock_path
from headscope.reports.outputs import OutputSession, finish_replace, recover, replace_folder
from headscope.reports.report import build_report, prepare_out


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every item under folder (symlinks by target, not followed) with its bytes."""
    items: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                items[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                items[rel] = path.read_bytes()
            else:
                items[rel + "/"] = "dir"
    return items


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)


def headscope_output(out: Path, files: dict[str, str]) -> Path:
    """A folder as a previous run left it: the files and a manifest that lists them."""
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    manifest = {"output_format": OUTPUT_FORMAT, "files": {rel: digest(out / rel) for rel in files}, "status": {}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


# ---- refusing what is not a headscope output ------------------------------------------------------
def test_force_refuses_a_folder_with_a_foreign_manifest_and_touches_nothing(tmp_path):
    webapp = tmp_path / "webapp"
    (webapp / "src").mkdir(parents=True)
    (webapp / "manifest.json").write_text('{"name":"x"}')
    (webapp / "src" / "app.js").write_text("code")
    before = snapshot(webapp)
    for force, resume in ((True, False), (False, True)):
        with pytest.raises(OutputExistsError, match="refusing to touch it") as err:
            OutputSession.open(webapp, force=force, resume=resume)
        assert "\n" not in str(err.value)
    assert snapshot(webapp) == before
    assert siblings(webapp) == []  # no lock, no staging folder left


@pytest.mark.parametrize("files", [
    {"../outside.txt": "0" * 64},
    {"/etc/passwd": "0" * 64},
    {"a/./b": "0" * 64},
    {"report.html": "not-a-hash"},
    [],
])
def test_a_manifest_with_unsafe_or_malformed_entries_is_not_a_headscope_manifest(tmp_path, files):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"output_format": OUTPUT_FORMAT, "files": files}))
    assert read_output_manifest(path) is None
    path.write_text(json.dumps({"output_format": OUTPUT_FORMAT, "files": {"kv/summary.json": "a" * 64}}))
    assert read_output_manifest(path) is not None


def test_symlinked_out_with_force_is_refused(tmp_path):
    real = headscope_output(tmp_path / "real", {"kv/summary.json": "{}"})
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    before = snapshot(real)
    with pytest.raises(OutputError, match="symbolic link"):
        OutputSession.open(link, force=True, resume=False)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputError, match="broken symbolic link"):
        OutputSession.open(dangling, force=False, resume=False)
    assert snapshot(real) == before and link.is_symlink()


def test_force_never_replaces_the_working_folder(tmp_path, monkeypatch):
    out = headscope_output(tmp_path / "run", {"kv/summary.json": "{}"})
    monkeypatch.chdir(out / "kv")
    for spec in (out, Path(".."), Path(".")):
        with pytest.raises(OutputError, match="folder you are working in"):
            OutputSession.open(spec, force=True, resume=False)
    assert (out / "kv" / "summary.json").exists() and siblings(out) == []


def test_prepare_out_checks_and_creates_but_deletes_nothing(tmp_path):
    out = tmp_path / "a" / "b" / "run"
    prepare_out(out, force=False, resume=False)
    assert out.is_dir()
    with pytest.raises(OutputExistsError, match="--force"):
        prepare_out(out, force=False, resume=False)
    headscope_output(out, {"kv/summary.json": "{}"})
    prepare_out(out, force=True, resume=False)
    assert (out / "kv" / "summary.json").exists()


# ---- the swap: what goes, what stays --------------------------------------------------------------
def test_replace_keeps_the_users_items_and_deletes_only_unchanged_listed_files(tmp_path):
    old = headscope_output(tmp_path / "out", {
        "kv/summary.json": "old kv", "kv/results.csv": "old rows", "heads/summary.json": "old heads",
        "report.md": "old report", "report.html": "<html>old",
    })
    (old / "notes.txt").write_text("my notes")  # not listed: the user's
    (old / "report.md").write_text("old report, with my edits")  # listed but edited: the user's
    (old / "heads" / "mine.png").write_text("my figure")  # the user's, inside a headscope folder
    (old / "src").mkdir()
    (old / "src" / "app.js").write_text("code")  # a folder headscope did not make
    outside = tmp_path / "outside.txt"
    outside.write_text("elsewhere")
    (old / "kv" / "link").symlink_to(outside)  # a link: moved, never followed
    (old / ".kv.partial").mkdir()  # a killed run's staging: headscope's
    new = tmp_path / "new"
    (new / "kv").mkdir(parents=True)
    (new / "kv" / "summary.json").write_text("new kv")
    (new / "report.md").write_text("new report")

    moved = replace_folder(new, old, read_output_manifest(old / "manifest.json")["files"], transient=[".kv.partial"])

    assert sorted(moved) == ["heads/mine.png", "kv/link", "notes.txt", "report.user.md", "src"]
    assert (old / "kv" / "summary.json").read_text() == "new kv"
    assert (old / "report.md").read_text() == "new report"
    assert (old / "report.user.md").read_text() == "old report, with my edits"
    assert (old / "notes.txt").read_text() == "my notes" and (old / "src" / "app.js").read_text() == "code"
    assert (old / "heads" / "mine.png").read_text() == "my figure"
    assert not (old / "heads" / "summary.json").exists() and not (old / "kv" / "results.csv").exists()
    assert (old / "kv" / "link").is_symlink() and outside.read_text() == "elsewhere"
    assert not (old / "report.html").exists() and not (old / "manifest.json").exists()
    assert siblings(old) == ["outside.txt"]  # no .out.old-<pid> left


def test_an_empty_folder_headscope_made_goes_and_one_the_user_made_stays(tmp_path):
    aside = headscope_output(tmp_path / ".out.old-1", {"heads/summary.json": "x"})
    (aside / "empty-of-mine").mkdir()
    target = tmp_path / "out"
    target.mkdir()
    finish_replace(aside, target, read_output_manifest(aside / "manifest.json")["files"])
    assert (target / "empty-of-mine").is_dir() and not (target / "heads").exists()
    assert not aside.exists()


# ---- recovery of what a killed run left -------------------------------------------------------------
def test_recovery_removes_a_stale_staging_folder_and_restores_an_old_folder(tmp_path):
    out = tmp_path / "out"
    stage = tmp_path / ".out.staging-999999"
    stage.mkdir()
    (stage / outputs.STAGING_MARK).write_text("")
    (stage / "kv").mkdir()
    unmarked = tmp_path / ".out.staging-999998"  # not marked: not provably headscope's, kept
    unmarked.mkdir()
    aside = headscope_output(tmp_path / ".out.old-999999", {"kv/summary.json": "old"})
    (aside / "notes.txt").write_text("mine")
    recover(out)  # killed between the two renames: OUT is missing, the old folder comes back
    assert not stage.exists() and unmarked.exists()
    assert (out / "kv" / "summary.json").read_text() == "old" and (out / "notes.txt").read_text() == "mine"

    aside = headscope_output(tmp_path / ".out.old-999997", {"heads/summary.json": "older"})
    (aside / "more-notes.txt").write_text("mine too")
    recover(out)  # killed after the swap: the old folder's user files move in, its own files go
    assert not aside.exists() and (out / "more-notes.txt").read_text() == "mine too"
    assert not (out / "heads").exists()


# ---- the lock ---------------------------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\\n".encode())
    print("locked", flush=True)
    time.sleep(60)
""")


@pytest.fixture
def lock_holder():
    """Start a process that holds a folder's lock (fcntl.flock) until the test ends."""
    procs = []

    def start(out: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock_path(out))], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_second_run_on_a_locked_folder_fails_at_once(tmp_path, lock_holder):
    pytest.importorskip("fcntl")
    out = tmp_path / "run"
    proc = lock_holder(out)
    start = time.perf_counter()
    with pytest.raises(OutputLockedError, match=f"in use by another headscope run \\(pid {proc.pid}\\)") as err:
        OutputSession.open(out, force=False, resume=False)
    assert time.perf_counter() - start < 5 and "\n" not in str(err.value)
    assert isinstance(err.value, HeadscopeError)
    assert not out.exists()  # nothing created
    proc.kill()
    proc.wait()  # the kernel drops a dead process's lock: the file stays, the next run takes it over
    assert lock_path(out).exists()
    session = OutputSession.open(out, force=False, resume=False)
    assert lock_path(out).read_text().strip() == str(os.getpid())
    session.close()
    assert not lock_path(out).exists()


def test_a_stale_lock_file_from_a_killed_run_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "run"
    lock_path(out).write_text(f"{dead.pid}\n")
    with OutputLock(out) as lock:
        assert lock.path.read_text().strip() == str(os.getpid())
    assert not lock_path(out).exists()


def test_a_lock_file_planted_as_a_link_or_a_fifo_is_refused_and_nothing_is_written_through_it(tmp_path):
    """The lock is opened without following links (O_NOFOLLOW) and must be a regular file: a link
    planted at `.OUT.lock` pointing to a file of yours leaves that file byte for byte as it was."""
    out = tmp_path / "run"
    victim = tmp_path / "victim.txt"
    victim.write_text("IMPORTANT DATA\n")
    lock_path(out).symlink_to(victim)
    with pytest.raises(OutputError, match="is a symbolic link; headscope writes no file through a link"):
        OutputLock(out).acquire()
    assert victim.read_text() == "IMPORTANT DATA\n" and lock_path(out).is_symlink()
    lock_path(out).unlink()
    os.mkfifo(lock_path(out))
    with pytest.raises(OutputError, match="is not a regular file"):
        OutputLock(out).acquire()


def test_the_loser_of_a_start_up_race_is_told_in_use_not_already_exists(tmp_path):
    """The winner has just created OUT and holds the lock: a run that checks OUT now finds it
    existing, and must say that another run is using it (not "pass --force")."""
    pytest.importorskip("fcntl")
    out = tmp_path / "run"
    winner = OutputSession.open(out, force=False, resume=False)  # OUT made, its first manifest written, lock held
    try:
        for force, resume in ((False, False), (True, False), (False, True)):
            with pytest.raises(OutputLockedError, match=f"in use by another headscope run \\(pid {os.getpid()}\\)"):
                OutputSession.open(out, force=force, resume=resume)
    finally:
        winner.close()
    with pytest.raises(OutputExistsError, match="already exists; pass --force"):  # no run holds it now: the true reason
        OutputSession.open(out, force=False, resume=False)


def test_resume_and_force_together_are_refused_before_anything_is_written(tmp_path, plan):
    out = headscope_output(tmp_path / "run", {"kv/summary.json": "{}"})
    before = snapshot(out)
    for call in (lambda: OutputSession.open(out, force=True, resume=True),
                 lambda: run("no-model-is-loaded", out, force=True, resume=True)):
        with pytest.raises(ConfigError, match="--resume and --force exclude each other") as err:
            call()
        assert "\n" not in str(err.value)
    assert snapshot(out) == before and siblings(out) == [] and plan.runs == []


def test_two_locks_in_one_process_exclude_each_other(tmp_path):
    out = tmp_path / "run"
    with OutputLock(out):
        with pytest.raises(OutputLockedError):
            OutputLock(out).acquire()
    with OutputLock(out):  # released: free again
        pass


# ---- OS errors: one line, nothing partial -------------------------------------------------------------
def test_an_uncreatable_out_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name == "run":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(OutputError, match="Permission denied; choose a writable --out") as err:
        OutputSession.open(tmp_path / "parent" / "run", force=False, resume=False)
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []  # the parent it made is gone, and so is the lock


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_location_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    old = headscope_output(ro / "old", {"kv/summary.json": "x"})
    ro.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="choose a writable --out"):
            OutputSession.open(ro / "new", force=False, resume=False)
        with pytest.raises(OutputError):
            OutputSession.open(old, force=True, resume=False)
        assert sorted(p.name for p in ro.iterdir()) == ["old"]
    finally:
        ro.chmod(0o755)


# ---- build_report with cheap fake analyses --------------------------------------------------------------
class Plan:
    """What each fake analysis does: return a small result, raise, or fail while writing."""

    def __init__(self):
        self.behaviour: dict[str, object] = {}
        self.runs: list[str] = []

    def runner(self, name: str):
        def run(model, task, config):
            self.runs.append(name)
            what = self.behaviour.get(name, "ok")
            if isinstance(what, BaseException):
                raise what
            return SimpleNamespace(
                name=name, df=pd.DataFrame({"x": [1, 2], "run": [str(what)] * 2}), summary={"analysis": name, "value": 1.5},
                tables={"extra": pd.DataFrame({"y": [3]})}, plot=lambda: {},
            )
        return run


@pytest.fixture
def plan(monkeypatch):
    plan = Plan()
    monkeypatch.setattr(report_mod, "get_analysis", plan.runner)
    return plan


def run(model, out, analyses="kv,mlp", **kw):
    return build_report(model, out=out, analyses=analyses, progress=False, command=["test"], **kw)


def listed(out: Path) -> dict[str, str]:
    return json.loads((out / "manifest.json").read_text())["files"]


def test_the_manifest_lists_every_file_the_run_wrote(zoo_model, tmp_path, plan):
    out = run(zoo_model, tmp_path / "run")
    files = listed(out)
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(files) == on_disk
    assert all(digest(out / rel) == sha for rel, sha in files.items())
    assert {"kv/summary.json", "mlp/extra.csv", "report.html", "report.md"} <= set(files)
    assert siblings(out) == []  # the lock is gone


def test_force_replaces_only_headscope_files_and_keeps_the_users(zoo_model, tmp_path, plan):
    out = run(zoo_model, tmp_path / "run", analyses="kv,heads")
    (out / "notes.txt").write_text("my notes")
    (out / "heads" / "my-plot.png").write_bytes(b"png")
    plan.behaviour["mlp"] = "second"
    run(zoo_model, out, analyses="kv,mlp", force=True)
    assert (out / "notes.txt").read_text() == "my notes"
    assert (out / "heads" / "my-plot.png").read_bytes() == b"png"
    assert not (out / "heads" / "summary.json").exists()  # the old run's file, unchanged: deleted
    assert "second" in (out / "mlp" / "results.csv").read_text()
    assert set(json.loads((out / "manifest.json").read_text())["status"]) == {"kv", "mlp"}
    assert "notes.txt" not in listed(out) and "heads/my-plot.png" not in listed(out)
    assert siblings(out) == []  # no staging, old or lock left beside


def test_a_failed_force_run_leaves_the_previous_output_exactly_as_it_was(zoo_model, tmp_path, plan):
    out = run(zoo_model, tmp_path / "run")
    (out / "notes.txt").write_text("my notes")
    before = snapshot(out)
    plan.behaviour["mlp"] = TaskError("answer 'v02 v03' is 2 tokens; answers must be one token")
    with pytest.raises(RunFailedError, match="mlp failed .*unchanged") as err:
        run(zoo_model, out, force=True)
    assert err.value.user_mistake and "\n" not in str(err.value)
    plan.behaviour["mlp"] = RuntimeError("internal")
    with pytest.raises(RunFailedError) as err:
        run(zoo_model, out, force=True)
    assert not err.value.user_mistake
    plan.behaviour["mlp"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt, match=r"^interrupted; '.*run' is unchanged \(--force replaces it only when"):
        run(zoo_model, out, force=True)
    assert snapshot(out) == before
    assert siblings(out) == []


def test_a_full_disk_during_force_is_one_line_and_changes_nothing(zoo_model, tmp_path, plan, monkeypatch):
    out = run(zoo_model, tmp_path / "run")
    before = snapshot(out)
    real = io.write_csv

    def full(path, df):
        if Path(path).name == "extra.csv":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, df)

    monkeypatch.setattr(io, "write_csv", full)
    with pytest.raises(OutputError, match="No space left on device") as err:
        run(zoo_model, out, force=True)
    assert "\n" not in str(err.value)
    assert snapshot(out) == before and siblings(out) == []


def test_a_fresh_run_that_fails_before_any_analysis_is_written_leaves_nothing(zoo_model, tmp_path, plan, monkeypatch):
    def full(path, df):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(io, "write_csv", full)
    with pytest.raises(OutputError, match="No space left"):
        run(zoo_model, tmp_path / "a" / "run")
    assert list(tmp_path.iterdir()) == []
    plan.behaviour["kv"] = KeyboardInterrupt()  # Ctrl-C in the first analysis: the same
    with pytest.raises(KeyboardInterrupt, match=r"^interrupted; no analysis had finished, so '.*run' was removed\.$"):
        run(zoo_model, tmp_path / "a" / "run")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_fresh_run_stays_for_resume_and_resume_lists_every_file(zoo_model, tmp_path, plan):
    out = tmp_path / "run"
    plan.behaviour["mlp"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt, match=f"^interrupted; rerun with --resume --out {out} to finish the run"):
        run(zoo_model, out)
    assert (out / "kv" / "summary.json").exists() and not (out / "report.html").exists()
    assert sorted(p.name for p in out.iterdir()) == ["kv", "manifest.json"] and siblings(out) == []  # no .mlp.partial, lock
    with pytest.raises(OutputExistsError, match="--resume"):
        run(zoo_model, out)
    del plan.behaviour["mlp"]
    plan.runs.clear()
    (out / "kv" / "notes.txt").write_text("mine")
    run(zoo_model, out, resume=True)
    assert plan.runs == ["mlp"]
    assert json.loads((out / "manifest.json").read_text())["status"] == {"kv": "done (resumed)", "mlp": "done"}
    files = listed(out)
    assert "kv/summary.json" in files and "mlp/summary.json" in files and "kv/notes.txt" not in files


def test_a_locked_out_stops_build_report_before_the_model_loads(tmp_path, lock_holder, plan, monkeypatch):
    pytest.importorskip("fcntl")
    out = tmp_path / "run"
    lock_holder(out)

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("headscope.models.load_model", no_load)
    with pytest.raises(OutputLockedError):
        run("zoo/synth-llama", out)
    assert not out.exists() and plan.runs == []


def test_write_result_over_an_existing_analysis_folder_keeps_the_users_files(tmp_path):
    folder = tmp_path / "kv"
    folder.mkdir()
    (folder / "results.csv").write_text("old rows")
    (folder / "notes.txt").write_text("mine")
    result = SimpleNamespace(df=pd.DataFrame({"x": [1]}), tables={}, summary={"a": 1}, plot=lambda: {})
    hashes = report_mod.write_result(result, folder, {"results.csv": digest(folder / "results.csv")})
    assert sorted(hashes) == ["results.csv", "summary.json"]
    assert (folder / "notes.txt").read_text() == "mine" and "old rows" not in (folder / "results.csv").read_text()
    assert all(digest(folder / name) == sha for name, sha in hashes.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kv"]


def test_write_result_leaves_out_tables_without_rows(tmp_path):
    """Review 16dv C1: position's masked.csv was written as one blank line (1 byte) when the masks were not run, and
    the section linked it; a table with no rows (or none at all) is now neither written nor listed (results.csv,
    the output contract's, is always written)."""
    folder = tmp_path / "position"
    result = SimpleNamespace(df=pd.DataFrame(columns=["x"]), tables={"masked": pd.DataFrame(), "curve": pd.DataFrame(
        {"x": [2]}), "none": pd.DataFrame(columns=["a", "b"])}, summary={"a": 1}, plot=lambda: {})
    hashes = report_mod.write_result(result, folder)
    assert sorted(hashes) == ["curve.csv", "results.csv", "summary.json"]
    assert sorted(p.name for p in folder.iterdir()) == ["curve.csv", "results.csv", "summary.json"]
    assert (folder / "results.csv").read_text() == "x\n"  # results.csv always, with its header (the output contract)


# ---- --resume: the same settings, and every finished analysis in the report (issue #20 item 3) ------------
def kv_task(path: Path, rows: int = 3) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"k0{i} v0{i} ; k0{i}", "answer": f"v0{i}"}) + "\n" for i in range(rows)))
    return path


def test_resume_refuses_other_settings_in_one_line_and_changes_nothing(zoo_model, tmp_path, plan, monkeypatch):
    task = kv_task(tmp_path / "task.jsonl")
    out = run(zoo_model, tmp_path / "run", task=str(task), seed=3)
    (out / "kv" / "summary.json").unlink()  # as if killed before kv finished
    before = snapshot(out)
    plan.runs.clear()
    refused = {
        "seed 3 (now 4)": dict(task=str(task), seed=4),
        "--quick False (now True)": dict(task=str(task), seed=3, quick=True),
        "--n-examples None (now 8)": dict(task=str(task), seed=3, n_examples=8),
        "task 'task.jsonl' (now 'induction')": dict(task="induction", seed=3),
        "task fields {} (now {'prompt': 'prompt'})": dict(task=str(task), task_fields="prompt=prompt", seed=3),
    }
    for why, kw in refused.items():
        with pytest.raises(ConfigError, match="--resume: .* was run with other settings") as err:
            run(zoo_model, out, resume=True, **kw)
        assert why in str(err.value) and "\n" not in str(err.value)
    kv_task(tmp_path / "task.jsonl", rows=4)  # the same path, other rows
    with pytest.raises(ConfigError, match="task file contents"):
        run(zoo_model, out, resume=True, task=str(task), seed=3)
    monkeypatch.setattr("headscope.version.__version__", "0.0.0+other")
    with pytest.raises(ConfigError, match=r"headscope version '.*' \(now '0.0.0\+other'\)"):
        run(zoo_model, out, resume=True, task=str(task), seed=3)
    monkeypatch.undo()
    monkeypatch.setattr(report_mod, "get_analysis", plan.runner)

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("headscope.models.load_model", no_load)
    with pytest.raises(ConfigError, match="model .*synth-llama.* \\(now .*synth-gpt2"):
        run("zoo/synth-gpt2", out, resume=True, task=str(task), seed=3)  # refused before it loads
    assert snapshot(out) == before and siblings(out) == ["task.jsonl"] and plan.runs == []
    kv_task(tmp_path / "task.jsonl")  # the original rows again (another path with these bytes would do too)
    moved = kv_task(tmp_path / "elsewhere.jsonl")
    run(zoo_model, out, resume=True, task=str(moved), seed=3)
    assert plan.runs == ["kv"]


def test_resume_with_other_analyses_keeps_every_finished_one_in_the_report(zoo_model, tmp_path, plan):
    out = run(zoo_model, tmp_path / "run", analyses="kv,mlp")
    plan.runs.clear()
    run(zoo_model, out, analyses="heads", resume=True)
    assert plan.runs == ["heads"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == {"heads": "done", "kv": "done", "mlp": "done"}
    assert set(manifest["config"]["analyses"]) == {"heads", "kv", "mlp"}
    assert set(manifest["config"]["settings"]["analysis_configs"]) == {"heads", "kv", "mlp"}
    html = (out / "report.html").read_text()
    for name in ("heads", "kv", "mlp"):
        assert f'href="#{name}"' in html, name
    assert {"kv/summary.json", "mlp/summary.json", "heads/summary.json"} <= set(manifest["files"])


def test_resume_resolves_no_task_of_a_finished_analysis_before_the_explorer(tiny_models, tmp_path, plan, monkeypatch):
    """--resume resolves the Task of a finished analysis (kv) nowhere up front: nothing runs it, the budget
    does not price it, and the explorer, its Task's one reader, resolves it when it builds (ran_on), so
    explorer.json is the fresh run's byte for byte. mlp, unfinished, is resolved before it runs."""
    from headscope.analyses.core import registry, runner

    model = tiny_models["gpt2"]
    out = run(model, tmp_path / "run")
    fresh = (out / "explorer.json").read_bytes()
    (out / "mlp" / "summary.json").unlink()  # as if killed before mlp finished
    plan.runs.clear()
    calls: list[str] = []
    family_task, explorer_capture, before_explorer = registry.family_task, runner.explorer_capture, []

    def counted(name, *args, **kwargs):
        calls.append(name)
        return family_task(name, *args, **kwargs)

    def explorer(*args, **kwargs):
        before_explorer.extend(calls)
        return explorer_capture(*args, **kwargs)

    monkeypatch.setattr(registry, "family_task", counted)
    monkeypatch.setattr(runner, "explorer_capture", explorer)
    run(model, out, resume=True)
    assert plan.runs == ["mlp"]
    assert before_explorer == ["mlp"]  # kv's Task: not resolved before the explorer
    assert calls == ["mlp", "kv"]  # the explorer's one resolution of kv's Task (mlp's it was handed)
    assert (out / "explorer.json").read_bytes() == fresh


def no_explorer(*args, **kwargs):
    raise RuntimeError("no explorer in this test")  # (optional in a report: its figure alone takes seconds)


def test_resume_recomputes_an_analysis_whose_listed_files_are_missing_or_changed(zoo_model, tmp_path, plan, caplog,
                                                                                  monkeypatch):
    """--resume checks every file manifest.json lists by its sha256 (#36): a deleted results.csv or
    an edited summary.json value means that analysis runs again (named or not), the edit is kept as
    the user's file, and report.md shows the recomputed value, not the edited one."""
    monkeypatch.setattr("headscope.reports.explorer.write_explorer_data", no_explorer)
    out = run(zoo_model, tmp_path / "run", analyses="kv,mlp,probes,circuits")
    (out / "kv" / "results.csv").unlink()
    (out / "circuits" / "summary.json").unlink()
    edited = (out / "mlp" / "summary.json").read_text().replace("1.5", "98765.4321")
    assert edited != (out / "mlp" / "summary.json").read_text()
    (out / "mlp" / "summary.json").write_text(edited)
    plan.runs.clear()
    run(zoo_model, out, analyses="kv", resume=True)
    assert plan.runs == ["kv", "mlp", "circuits"]  # probes, untouched, is kept; mlp and circuits (not named) run again
    assert "kv/results.csv is missing" in caplog.text and "mlp/summary.json does not match its sha256" in caplog.text
    assert "circuits/summary.json is missing" in caplog.text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == {"probes": "done", "kv": "done", "mlp": "done", "circuits": "done"}
    assert all(digest(out / rel) == sha for rel, sha in manifest["files"].items())
    assert (out / "mlp" / "summary.user.json").read_text() == edited  # nothing of the user's lost
    assert "98765" not in (out / "report.md").read_text() and "1.5" in (out / "report.md").read_text()
    plan.runs.clear()
    run(zoo_model, out, analyses="kv", resume=True)  # every listed file matches now: nothing runs
    assert plan.runs == []


def test_a_folder_with_finished_analyses_but_no_recorded_settings_is_not_resumed(zoo_model, tmp_path, plan):
    out = headscope_output(tmp_path / "run", {"kv/summary.json": "{}"})
    before = snapshot(out)
    with pytest.raises(ConfigError, match="does not record the settings"):
        run(zoo_model, out, resume=True)
    assert snapshot(out) == before and plan.runs == []


def test_temporary_files_of_a_killed_write_are_removed_on_resume(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".manifest.json.ab12cd_9.tmp").write_text("{")  # killed while writing its first manifest
    OutputSession.open(out, force=False, resume=True).close()
    assert list(out.iterdir()) == []
    headscope_output(out, {"kv/summary.json": "{}"})
    (out / ".report.html.zz99yy00.tmp").write_text("<html")
    (out / ".notes.txt.ab12cd_9.tmp").write_text("mine")  # not a name headscope writes: the user's
    OutputSession.open(out, force=False, resume=True).close()
    assert sorted(p.name for p in out.iterdir()) == [".notes.txt.ab12cd_9.tmp", "kv", "manifest.json"]


# ---- permission errors injected, so the read-only paths run as root too (issue #20 review) ----------------
def denied_for(call, marker: str):
    """`call` (os.mkdir or os.rename) failing with EACCES when its first path contains `marker`."""
    def denied(path, *args, **kwargs):
        if marker in os.fspath(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return call(path, *args, **kwargs)
    return denied


def test_force_into_a_location_where_the_staging_folder_cannot_be_made_is_one_line(zoo_model, tmp_path, plan, monkeypatch):
    out = run(zoo_model, tmp_path / "run")
    before = snapshot(out)
    plan.runs.clear()
    monkeypatch.setattr(os, "mkdir", denied_for(os.mkdir, ".run.staging-"))
    with pytest.raises(OutputError) as err:
        run(zoo_model, out, force=True)
    text = str(err.value)
    stage = tmp_path / f".run.staging-{os.getpid()}"
    assert "\n" not in text and text.startswith(f"Cannot create the staging folder {str(stage)!r}")
    assert f": {os.strerror(errno.EACCES)}; choose a writable --out" in text
    assert plan.runs == [] and snapshot(out) == before and siblings(out) == []  # no lock, no staging folder


def test_a_swap_refused_by_the_file_system_leaves_the_previous_output_as_it_was(zoo_model, tmp_path, plan, monkeypatch):
    out = run(zoo_model, tmp_path / "run")
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    plan.behaviour["kv"] = "second"
    monkeypatch.setattr(os, "rename", denied_for(os.rename, str(out)))  # step (1): OUT cannot move aside
    with pytest.raises(OutputError) as err:
        run(zoo_model, out, force=True)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"Could not finish replacing {str(out)!r}: {os.strerror(errno.EACCES)}")
    assert plan.runs[-2:] == ["kv", "mlp"]  # both ran, in the staging folder that is gone now
    assert snapshot(out) == before and siblings(out) == []


def test_csv_fields_with_carriage_returns_read_back_whole(tmp_path):
    """Review 20b A2 (redone): a token '\\r' (Starcoder2's and byte-level vocabularies hold one) left unquoted split its
    row for every reader; each field now reads back as written, with pandas and with the csv module, and a table
    without one keeps its minimal quoting."""
    import csv

    tokens = ["a\rb", "\r", "c\nd", 'e"f', "g,h", "\x0b", "plain"]
    df = pd.DataFrame({"token": tokens, "n": range(len(tokens)), "x": [0.5 * i for i in range(len(tokens))]})
    path = io.write_csv(tmp_path / "t.csv", df)
    back = pd.read_csv(path, keep_default_na=False)
    assert back.token.tolist() == tokens and back.n.tolist() == list(range(len(tokens)))
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert [r[0] for r in rows[1:]] == tokens and len(rows) == len(tokens) + 1
    plain = io.write_csv(tmp_path / "p.csv", df.assign(token=["t"] * len(tokens)))
    assert plain.read_text().splitlines()[:2] == ["token,n,x", "t,0,0.0"]
