"""Faults (issue #20 item 10): kill -9 at random points of a report and --resume, a full disk while
writing, malformed task files and token tensors fed by hypothesis, large task files.

The kill test runs the real CLI in subprocesses, each killed with SIGKILL at a seeded random step
of its writes (the uninterrupted reference runs in process, on one thread as the CLI runs); the
disk test calls the CLI's main with an injected ENOSPC; the property-based tests call
hs.load_task and HookedModel.check_tokens on a tiny random model.
"""
from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headscope as hs
from headscope.errors import HeadscopeError

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
NAMES = ("kv", "probes")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "headscope", "-q", *args]


def results(out: Path) -> dict[str, bytes]:
    """Every summary and CSV of the analyses, as bytes."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for name in NAMES for p in sorted((out / name).iterdir())
            if p.suffix in (".json", ".csv")}


KILL_AT = """
import os, signal, sys
count = [0]
def step(real):
    def call(*args, **kwargs):
        count[0] += 1
        if count[0] == int(os.environ["HEADSCOPE_TEST_KILL_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return call
os.fsync, os.replace, os.rename = step(os.fsync), step(os.replace), step(os.rename)
from headscope.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_at_random_points_then_resume_gives_the_uninterrupted_results(zoo_model, tmp_path, monkeypatch):
    """Each run is killed (SIGKILL, no cleanup) at a seeded random step of its writes: a file
    complete but not renamed into place (fsync), or just before a rename (os.replace/os.rename),
    the states a kill at a random time can leave; the uninterrupted reference runs in process."""
    steps = []
    for name in ("fsync", "replace", "rename"):  # count the steps of an uninterrupted run
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _real=real, _name=name, **k: (steps.append(_name), _real(*a, **k))[1])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the CLI below runs (OMP_NUM_THREADS=1): the same float arithmetic
    try:
        hs.build_report(zoo_model, out=tmp_path / "clean", analyses=",".join(NAMES), quick=True, progress=False)
    finally:
        torch.set_num_threads(threads)
        monkeypatch.undo()
    expected = results(tmp_path / "clean")
    assert set(expected) >= {"kv/summary.json", "probes/summary.json", "probes/results.csv"} and len(steps) > 20

    report = ["-q", "report", "--analyses", ",".join(NAMES), "--quick"]
    out = tmp_path / "killed"
    rng = random.Random(20)
    points = [rng.randint(1, len(steps) - 10), rng.randint(1, 10), rng.randint(1, 10)]  # a resume writes >= 10 steps
    for i, point in enumerate(points):
        proc = subprocess.run([sys.executable, "-c", KILL_AT, *report, "--out", str(out), *(["--resume"] if i else [])],
                              env={**ENV, "HEADSCOPE_TEST_KILL_AT": str(point)}, capture_output=True, text=True)
        assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr[-2000:])
        assert not (out / "report.html").exists() or i  # the first kill comes before the report
    done = subprocess.run(cli(*report[1:], "--out", str(out), "--resume"), env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert results(out) == expected
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["status"]) == set(NAMES) and all(s.startswith("done") for s in manifest["status"].values())
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    assert on_disk == set(manifest["files"])  # no temporary or partial file left, every file listed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clean", "killed"]  # no lock or staging folder


@pytest.mark.parametrize("writer", ["write_json", "write_csv"])  # the first manifest (before the model loads), the results
def test_a_full_disk_while_writing_is_one_line_and_leaves_no_partial_folder(tmp_path, monkeypatch, capsys, writer):
    from types import SimpleNamespace

    import pandas as pd

    from headscope.cli import main
    from headscope.reports import io
    from headscope.reports import report as report_mod

    def full(path, *args):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(io, writer, full)
    monkeypatch.setattr(report_mod, "get_analysis", lambda name: lambda model, task, config: SimpleNamespace(
        df=pd.DataFrame({"x": [1]}), summary={"ok": 1}, tables={}, plot=lambda: {}))  # a cheap kv
    out = tmp_path / "a" / "run"
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: error: ") and "No space left on device" in lines[0], lines
    assert list(tmp_path.iterdir()) == []  # no OUT, no .kv.partial, no lock, not even the new parent folder


def cheap_analyses(monkeypatch):
    """Stand-ins for the analyses (a one-row result each), so a CLI run costs only its writes."""
    from types import SimpleNamespace

    import pandas as pd

    from headscope.reports import report as report_mod

    monkeypatch.setattr(report_mod, "get_analysis", lambda name: lambda model, task, config: SimpleNamespace(
        df=pd.DataFrame({"x": [1]}), summary={"ok": 1}, tables={}, plot=lambda: {}))


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: error: ") and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])  # a full disk, a full quota
def test_a_full_disk_at_the_lock_is_one_line_and_leaves_no_lock(tmp_path, monkeypatch, capsys, code):
    """The lock file is the run's first write (its pid): as on a full tmpfs, where os.pwrite fails."""
    from headscope.cli import main

    def full(*args):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "pwrite", full)
    assert main(["-q", "kv", "--quick", "--device", "cpu", "--out", str(tmp_path / "a" / "run")]) == 2
    line = one_error_line(capsys)
    assert "Cannot write the lock file" in line and os.strerror(code) in line, line
    assert list(tmp_path.iterdir()) == []  # no lock, no OUT, not even the new parent folder


def test_a_full_disk_mid_run_keeps_what_finished_for_resume_and_leaves_no_partial_folder(tmp_path, monkeypatch, capsys):
    """kv written, then mlp's results meet a full disk: one line saying how to finish, no .mlp.partial
    and no lock left, and --resume (space freed) finishes the run."""
    from headscope.cli import main
    from headscope.reports import io

    cheap_analyses(monkeypatch)
    real = io.write_csv

    def full_for_mlp(path, df):
        if ".mlp.partial" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, df)

    monkeypatch.setattr(io, "write_csv", full_for_mlp)
    out = tmp_path / "run"
    args = ["-q", "report", "--analyses", "kv,mlp", "--quick", "--device", "cpu", "--out", str(out)]
    assert main(args) == 2
    line = one_error_line(capsys)
    assert "Could not write the mlp results" in line and "No space left on device" in line, line
    assert line.endswith(f"rerun with --resume --out {out} to finish the run (its finished analyses are kept).")
    assert sorted(p.name for p in out.iterdir()) == ["kv", "manifest.json"] and [p.name for p in tmp_path.iterdir()] == ["run"]
    monkeypatch.setattr(io, "write_csv", real)
    assert main([*args, "--resume"]) == 0
    assert json.loads((out / "manifest.json").read_text())["status"] == {"kv": "done (resumed)", "mlp": "done"}


def test_a_full_disk_anywhere_else_is_one_line_and_exit_2(monkeypatch, capsys):
    """A disk-full OSError that no writer turned into an OutputError is still the user's situation, not a bug."""
    from headscope.cli import main
    from headscope.reports import report as report_mod

    def full(*args, **kwargs):
        raise OSError(errno.EDQUOT, "Disk quota exceeded", "/somewhere/file")

    monkeypatch.setattr(report_mod, "run_report", full)  # what the CLI calls
    assert main(["-q", "kv", "--quick", "--device", "cpu"]) == 2
    assert one_error_line(capsys) == "headscope: error: Disk quota exceeded (/somewhere/file); free some space and run again."


# ---- property-based: malformed task files and token tensors ---------------------------------------------
ROWS = st.lists(st.dictionaries(
    st.sampled_from(["prompt", "answer", "text", "wrong_answer", "corrupted_prompt", ""]),
    st.one_of(st.none(), st.integers(-10**30, 10**30), st.floats(allow_nan=True), st.booleans(), st.text(max_size=12),
              st.sampled_from(["w1 w2 w3", "w4", " w5", "w1 w2", "0"]), st.lists(st.integers(), max_size=2)),
    max_size=5), max_size=6)


@st.composite
def task_files(draw) -> tuple[str, bytes]:
    """(suffix, bytes) of a file that is usually malformed: random bytes, broken JSON, rows with
    missing fields or numbers, empty files, CSV with ragged rows."""
    suffix = draw(st.sampled_from([".jsonl", ".json", ".csv", ".parquet"]))
    kind = draw(st.sampled_from(["bytes", "rows", "broken", "empty", "csv"]))
    if kind == "bytes":
        return suffix, draw(st.binary(max_size=200))
    if kind == "empty":
        return suffix, draw(st.sampled_from([b"", b"\n", b"   \n\n", b"\xef\xbb\xbf", b"[]", b"{}", b"null"]))
    rows = draw(ROWS)
    if kind == "rows":
        body = "\n".join(json.dumps(r) for r in rows) if suffix != ".json" or draw(st.booleans()) else json.dumps(rows)
        return suffix, body.encode()
    if kind == "broken":
        text = "\n".join(json.dumps(r) for r in rows)
        cut = draw(st.integers(0, max(len(text), 1)))
        return suffix, (text[:cut] + draw(st.sampled_from(["{", "}", '"', ",", "\x00", "\ufffe"]))).encode("utf-8", "replace")
    header = draw(st.lists(st.sampled_from(["prompt", "answer", "label", ""]), max_size=3))
    cells = draw(st.lists(st.lists(st.sampled_from(["w1 w2", "0", "", '"', "w3,w4", "1.5"]), max_size=4), max_size=4))
    return suffix, ("\n".join([",".join(header)] + [",".join(c) for c in cells])).encode()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(task_files(), st.sampled_from([None, 2]))
def test_malformed_task_files_give_a_headscope_error_and_change_nothing(tiny_models, file, n_examples):
    suffix, data = file
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"task{suffix}"
        path.write_bytes(data)
        before = snapshot(Path(tmp))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unknown-word warnings are expected on random text
            try:
                task = hs.load_task(tiny_models["gpt2"], path, n_examples=n_examples)
            except HeadscopeError as err:
                assert str(err) and "\n" not in str(err).strip()
            else:  # a well-formed file: a real task with one answer per row
                assert task.tokens.ndim == 2 and len(task.answers) == task.tokens.shape[0] >= 1
        assert snapshot(Path(tmp)) == before


# numbers, encodings and column layouts: files written with an independent writer (json/csv from the
# standard library, or JSON text assembled here), so what a reader must return is known in advance
TEXTS = ["w1 w2", "w3", " w5", "0", "NaN", "caf\u00e9 \u00fc", "a,b", 'say "hi"', "x\ty", ""]
LITERALS = ["0", "-0", "1.50", "1e400", "-2.5E-3", "12345678901234567890123", "NaN", "Infinity", "-Infinity"]
CONSTANTS = {"NaN", "Infinity", "-Infinity"}  # bare JSON constants: neither text nor a usable number


@st.composite
def layouts(draw) -> tuple[str, bytes, str | None, list[dict] | None, str | None]:
    """(suffix, bytes, --task-fields, the rows a reader must return or None, the error it must raise
    instead or None): JSON lines or CSV; prompt/answer under their own or the user's column names, in
    any order, with extra and repeated columns; JSON numbers as literals (NaN, 1e400, 23 digits);
    UTF-8, UTF-8 with BOM, UTF-16 or Latin-1; LF or CRLF."""
    suffix = draw(st.sampled_from([".jsonl", ".csv"]))
    cols = {"prompt": draw(st.sampled_from(["prompt", "text"])), "answer": draw(st.sampled_from(["answer", "label"]))}
    columns = [*cols.values(), *draw(st.lists(st.sampled_from(["id", "note", ""]), max_size=2, unique=True))]
    if draw(st.integers(0, 4)) == 0:  # a column named twice (an unnamed CSV column may repeat)
        columns.append(draw(st.sampled_from(columns)))
    columns = draw(st.permutations(columns))
    mapping = [f"{k}={v}" for k, v in cols.items() if k != v]
    twice = bool(mapping) and draw(st.integers(0, 7)) == 0
    if twice:  # a field mapped twice
        mapping.append(f"{draw(st.sampled_from([m.split('=')[0] for m in mapping]))}=other")
    cells = draw(st.lists(st.lists(st.one_of(st.tuples(st.just("text"), st.sampled_from(TEXTS)),
                                             st.tuples(st.just("number"), st.sampled_from(LITERALS))),
                                   min_size=len(columns), max_size=len(columns)), min_size=1, max_size=3))
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "latin-1"]))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    if suffix == ".csv":  # CSV cells are text, whatever they look like
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator=newline)
        writer.writerow(columns)
        writer.writerows([[value for _, value in row] for row in cells])
        lines = buf.getvalue().splitlines(keepends=True)[1:]  # (no cell holds a line break)
        header = buf.getvalue().splitlines(keepends=True)[0]
    else:
        ascii_only = draw(st.booleans())
        header, lines = "", ["{" + ", ".join(f"{json.dumps(c)}: {json.dumps(v, ensure_ascii=ascii_only) if kind == 'text' else v}"
                                             for c, (kind, v) in zip(columns, row)) + "}" + newline for row in cells]
    fields = ",".join(mapping) or None
    data = (header + "".join(lines)).encode(encoding)
    # what the reader must answer, in its order of checks: the mapping, then line by line (decoding, a
    # column named twice, a bare constant in a field), then a blank field (checked after every row)
    values = [{field: row[columns.index(col)] for field, col in cols.items()} for row in cells]
    named = [c for c in columns if c.strip() or suffix == ".jsonl"]  # CSV columns without a name may repeat
    undecodable = [encoding == "utf-16" or (encoding == "latin-1" and not line.isascii()) for line in lines]
    if twice:
        return suffix, data, fields, None, "mapped twice"
    if encoding == "utf-16" or (suffix == ".csv" and len(set(named)) == len(named) and any(undecodable)):
        return suffix, data, fields, None, "not valid UTF-8"
    if suffix == ".csv" and len(set(named)) < len(named):
        return suffix, data, fields, None, "appears twice"
    for bad, row in zip(undecodable, values):
        if bad:
            return suffix, data, fields, None, "not valid UTF-8"
        if len(set(named)) < len(named):
            return suffix, data, fields, None, "appears twice"
        if suffix == ".jsonl" and any(kind == "number" and v in CONSTANTS for kind, v in row.values()):
            return suffix, data, fields, None, "bare JSON constant"
    if any(not v.strip() for row in values for _, v in row.values()):
        return suffix, data, fields, None, "missing field"
    return suffix, data, fields, [{f: v for f, (_, v) in row.items()} for row in values], None


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(layouts())
def test_numbers_encodings_and_column_layouts_read_back_exactly_or_fail_in_one_line(layout):
    """Every well-formed file reads back as written (a JSON number as its literal text, a CSV cell as
    is); every ambiguous or undecodable one is the one-line error that says why."""
    from headscope.analyses.core.task_files import read_task_rows

    suffix, data, fields, expected, why = layout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"task{suffix}"
        path.write_bytes(data)
        if why is None:
            assert read_task_rows(path, fields) == expected
            return
        with pytest.raises(HeadscopeError, match=why) as err:
            read_task_rows(path, fields)
        assert "\n" not in str(err.value)


DTYPES = [torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32, torch.float16, torch.bfloat16, torch.bool,
          torch.complex64]


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 3), max_size=4), st.integers(-5, 80), st.integers(0, 70))
def test_token_tensors_are_checked_for_shape_dtype_and_range(tiny_models, dtype, shape, low, span):
    model = tiny_models["gpt2"]
    tokens = (torch.arange(math.prod(shape)) % (span + 1) + low).reshape(shape).to(dtype)  # shape [] is a scalar
    integer = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    ok = (integer and tokens.ndim in (1, 2) and tokens.numel() > 0 and tokens.shape[-1] <= model.facts.n_ctx
          and int(tokens.min()) >= 0 and int(tokens.max()) < model.facts.d_vocab)
    if ok:
        checked = model.check_tokens(tokens)
        assert checked.ndim == 2 and checked.dtype == tokens.dtype and checked.shape[-1] == tokens.shape[-1]
        return
    with pytest.raises(HeadscopeError) as err:
        model.check_tokens(tokens)
    if not integer or tokens.ndim not in (1, 2) or tokens.numel() == 0:
        assert "[batch, pos]" in str(err.value) and "integer dtype" in str(err.value)


@pytest.mark.parametrize("tokens, what", [
    (torch.zeros(2, 5), "dtype torch.float32"), (torch.ones(2, 5, dtype=torch.bool), "dtype torch.bool"),
    (torch.zeros(0, 5, dtype=torch.long), "empty"), (torch.zeros(2, 0, dtype=torch.long), "empty"),
    (torch.zeros(2, 3, 4, dtype=torch.long), "3-d"),
])
def test_float_bool_empty_and_3d_tokens_name_the_expected_shape_and_dtype(tiny_models, tokens, what):
    with pytest.raises(HeadscopeError, match=r"shape \[batch, pos\].*integer dtype") as err:
        tiny_models["gpt2"].check_tokens(tokens)
    assert what in str(err.value)


# ---- numbers: every numeric option checked before anything is written (issue #36 item 4) ----------------
def _numpy_takes(seed: int) -> bool:
    """Whether numpy's legacy seeding, the narrowest of the generators headscope seeds, accepts `seed`."""
    import numpy as np

    try:
        np.random.RandomState(seed)
    except (ValueError, OverflowError):
        return False
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.one_of(st.integers(-3, 3), st.integers(2**32 - 3, 2**32 + 3), st.integers(-2**70, 2**70)),
       st.one_of(st.none(), st.integers(-3, 3), st.integers(99_998, 100_002), st.integers(-2**40, 2**40)))
def test_seed_and_n_examples_are_refused_in_one_line_outside_their_range(seed, n_examples):
    """A seed is valid exactly when numpy takes it; n_examples is None or 1..100,000 (a memory cap:
    a zoo task of 10^8 examples exhausted memory before any output). Every family's config refuses
    the rest with one ConfigError line, as the report does before it writes anything; heads and probes
    also refuse fewer examples than they can run on (2: a resample partner; 3: cross-validation's folds)."""
    from headscope.analyses.core.registry import ANALYSES, config_class
    from headscope.errors import ConfigError

    floors = {"heads": 2, "probes": 3}
    for name in ANALYSES:
        valid = _numpy_takes(seed) and (n_examples is None or floors.get(name, 1) <= n_examples <= 100_000)
        if valid:
            assert config_class(name).preset(seed=seed, n_examples=n_examples).n_examples == n_examples
        else:
            with pytest.raises(ConfigError, match=r"^(seed \(--seed\)|n_examples \(--n-examples\)) (must be|\d+ is too few)"
                               ) as err:
                config_class(name).preset(seed=seed, n_examples=n_examples)
            assert "\n" not in str(err.value)


@pytest.mark.parametrize("option", [("--n-examples", "0"), ("--n-examples", "-5"), ("--n-examples", "100000000"),
                                    ("--budget", "nan"), ("--budget", "-1"), ("--seed", "4294967296"),
                                    ("--n-examples", "2"), ("--out", "")])  # 2: probes' fewest folds are 3
def test_bad_numbers_stop_the_cli_before_the_output_folder_or_the_model(tmp_path, option):
    """Checked before the model loads (its path does not even exist) and before OUT or its lock."""
    from test_cli import cli as in_process

    out = () if option[0] == "--out" else ("--out", str(tmp_path / "new" / "out"))
    proc = in_process("report", "--model", str(tmp_path / "no-model"), *option, *out, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and option[0] in proc.stderr
    if option == ("--n-examples", "2"):
        assert "probes at least 3" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_negative_seed_is_exit_2_and_writes_nothing(tmp_path):
    """The process as a user runs it: exit 2 (not an internal error), one line, no OUT and no lock."""
    proc = subprocess.run(cli("heads", "--seed", "-1", "--out", str(tmp_path / "out")), capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("headscope: error: seed (--seed) must be an integer from 0 to 4294967295, got -1.")
    assert list(tmp_path.iterdir()) == []


# ---- large task files: a seeded sample, read without holding the file (issue #20 item 5) ---------------
def word_rows(path: Path, rows: int) -> list[str]:
    prompts = [f"w{i % 50} w{(i * 7) % 50} w{(i * 13) % 50}" for i in range(rows)]
    path.write_text("".join(json.dumps({"prompt": p, "answer": f"w{i % 9}"}) + "\n" for i, p in enumerate(prompts)))
    return prompts


def test_n_examples_is_a_seeded_sample_of_a_task_file(tiny_models, tmp_path):
    from headscope.analyses.core.task_files import resolve_task

    model = tiny_models["gpt2"]
    prompts = word_rows(tmp_path / "big.jsonl", 2000)
    picked = sorted(torch.randperm(2000, generator=torch.Generator().manual_seed(7))[:8].tolist())  # the documented rule
    task = hs.load_task(model, tmp_path / "big.jsonl", n_examples=8, seed=7)
    assert torch.equal(task.tokens, model.to_tokens([prompts[i] for i in picked]))
    assert task.answers.tolist() == [model.tokenizer.convert_tokens_to_ids(f"w{i % 9}") for i in picked]
    assert len(resolve_task(model, str(tmp_path / "big.jsonl"), n_examples=5, seed=0)) == 5  # what --n-examples/--quick set


def test_sampling_a_task_file_keeps_memory_flat_in_its_row_count(tiny_models, tmp_path):
    import tracemalloc

    peaks = {}
    for rows in (1000, 10_000):
        word_rows(tmp_path / f"{rows}.jsonl", rows)
        tracemalloc.start()
        hs.load_task(tiny_models["gpt2"], tmp_path / f"{rows}.jsonl", n_examples=16)
        peaks[rows] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[10_000] < 1.5 * peaks[1000] + 256 * 1024, peaks  # ten times the rows, about the same memory
