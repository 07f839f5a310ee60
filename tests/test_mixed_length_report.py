"""`headscope report --quick --model DIR --task FILE --task-fields ...` on the architecture matrix with
the user's own data (#19's "done when", the task-file side; tests/test_matrix_report.py is the side
without one): a JSONL file of English prompts of mixed token lengths in the user's own column names
(tests_support.mixed_length_rows, MIXED_FIELDS). Every analysis is done or skipped with a reason,
none failed, and manifest.json's task_used names the user's file exactly for the analyses whose
contract takes prompt/answer data on that kind of model, and every analysis done drew its figures (the only
run of each architecture's figures in float32: tests/test_matrix_report.py draws none). The real CLI's main() runs in-process (the
same argument parsing and exit status, without a second interpreter's start-up). GPT-2 and Llama run
in the fast tier, the rest in the slow tier."""
from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest

from headscope.analyses.core.registry import ANALYSES
from tests_support import ARCHITECTURES, MIXED_FIELDS, mixed_length_rows

FAST = ("gpt2", "llama3")
ARCHS = [pytest.param(arch, id=arch, marks=() if arch in FAST else pytest.mark.slow) for arch in ARCHITECTURES]
N_ROWS = 8

# Which analyses take prompt/answer data (the families' contracts, in words): on a decoder every one
# but position (its own retrieval sweeps); on an encoder heads, attribution and probes (heads and attribution
# score the prompts' pooled embedding; circuits, kv, mlp and patching need a decoder and are skipped).
USES_YOUR_TASK = {"decoder": {"heads", "attribution", "patching", "mlp", "kv", "probes", "circuits"},
                  "encoder": {"heads", "attribution", "probes"}}
SKIPPED_ON_ENCODERS = {"circuits", "kv", "mlp", "patching"}


@pytest.fixture
def mixed_report(arch, arch_dirs, arch_models, tmp_path):
    """(exit status, manifest, rows written, OUT) of the quick report on a mixed-length task file."""
    from headscope.cli import main

    model = arch_models(arch)
    encoder = model.facts.is_encoder
    rows = mixed_length_rows(model, N_ROWS, corrupt=not encoder)
    fields = {k: v for k, v in MIXED_FIELDS.items() if not (encoder and k == "corrupted_prompt")}
    lengths = {len(model.to_tokens(r["text"], warn_unknown=False)[0]) for r in rows}
    assert len(rows) == N_ROWS and len(lengths) == N_ROWS  # every prompt a different token length
    task = tmp_path / "my_prompts.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["-q", "report", "--quick", "--device", "cpu", "--model", str(arch_dirs[arch]), "--task", str(task),
                     "--task-fields", ",".join(f"{k}={v}" for k, v in fields.items()), "--out", str(out)])
    return code, json.loads((out / "manifest.json").read_text(encoding="utf-8")), rows, out


@pytest.mark.parametrize("arch", ARCHS)
def test_the_quick_report_on_a_mixed_length_task_file_fails_nothing(arch, mixed_report, arch_models):
    code, manifest, rows, out = mixed_report
    status, used = manifest["status"], manifest["task_used"]
    assert sorted(status) == sorted(ANALYSES)
    failed = {name: state for name, state in status.items() if not (state == "done" or state.startswith("skipped: "))}
    assert failed == {}
    assert code == 0
    encoder = arch_models(arch).facts.is_encoder
    skipped = {name for name, state in status.items() if state.startswith("skipped: ")}
    assert skipped == (SKIPPED_ON_ENCODERS if encoder else set()), status
    for name in skipped:
        assert len(status[name].removeprefix("skipped: ").split()) >= 3, (name, status[name])  # a reason in words
    ours = {name for name, line in used.items() if line == "your task (my_prompts.jsonl)"}
    assert ours == USES_YOUR_TASK["encoder" if encoder else "decoder"], used
    for name in set(ANALYSES) - ours - skipped:
        assert used[name].startswith("default task"), (name, used[name])
    for name in set(ANALYSES) - skipped:  # every analysis draws its figures here (test_matrix_report draws none)
        assert list((out / name).glob("*.png")), name
    shown = pd.read_csv(out / "task_examples.csv", keep_default_na=False)
    assert shown["prompt"].tolist() == [r["text"] for r in rows]  # the user's prompts, under headscope's names
    assert (out / "report.html").is_file()
