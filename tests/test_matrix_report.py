"""`headscope report --quick` on the architecture matrix (#19 item 6): on every architecture of
tests_support.ARCHITECTURES (random weights, a real-style tokenizer trained on English, no zoo
vocabulary) the report is written, every analysis has a status in manifest.json, a skipped one says
why, and none failed. build_report is called in-process (what the CLI calls) to save start-up time;
each architecture's report is built once per module and shared by the tests below. GPT-2 and Llama
run in the fast tier, the rest in the slow tier. The reports run on N_EXAMPLES examples per analysis
(`--n-examples`): what is checked is that each analysis runs on the architecture (and in bfloat16),
which the example count does not change: every analysis is still done on a decoder, and on BERT only
the decoder-only ones are skipped (checked below), for about 7 s less CPU per report (llama3 in
bfloat16: 17 s against 24 at the quick default). The fp32 reports here draw no figures (Result.plot
returns none while they run: 10 s of CPU against 27 for llama3); every architecture's figures are drawn,
and checked per analysis, by tests/test_mixed_length_report.py's report on the same checkpoint (the same
analyses, a superset of these figures: circuits' graph too), and the bfloat16 reports below draw theirs."""
from __future__ import annotations

import json
import time

import pytest

from headscope.analyses.core.registry import ANALYSES
from headscope.analyses.core.result import Result
from headscope.reports.report import build_report
from tests_support import ARCHITECTURES

FAST = ("gpt2", "llama3")
ARCHS = [pytest.param(arch, id=arch, marks=() if arch in FAST else pytest.mark.slow) for arch in ARCHITECTURES]
N_EXAMPLES = 4  # examples per analysis: every analysis is still done on them (asserted below)
_REPORTS: dict[str, tuple[dict, float]] = {}


@pytest.fixture
def report(arch, arch_models, tmp_path_factory):
    """(manifest, seconds) of `arch`'s quick report, built on first use."""
    if arch not in _REPORTS:
        out = tmp_path_factory.mktemp(f"report-{arch}") / "out"
        start = time.perf_counter()
        with pytest.MonkeyPatch.context() as patch:  # figures: test_mixed_length_report (module docstring)
            patch.setattr(Result, "plot", lambda self, **kwargs: {})
            build_report(arch_models(arch), out=out, quick=True, n_examples=N_EXAMPLES, progress=False)
        seconds = time.perf_counter() - start
        assert (out / "report.html").is_file() and (out / "report.md").is_file()
        assert not list(out.glob("*/*.png"))  # no figure drawn here (the CSVs, summaries and pages are)
        _REPORTS[arch] = json.loads((out / "manifest.json").read_text(encoding="utf-8")), seconds
    return _REPORTS[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_quick_report_is_written_with_a_status_per_analysis(arch, report, record_property):
    """Every analysis has a status: done, failed with its error, or skipped with a reason in words."""
    manifest, seconds = report
    status = manifest["status"]
    record_property("report_seconds", round(seconds, 1))
    record_property("status", json.dumps(status))
    assert sorted(status) == sorted(ANALYSES)
    for name, state in status.items():
        assert state == "done" or state.startswith(("failed: ", "skipped: ")), (name, state)
        if state.startswith("skipped: "):
            assert len(state.removeprefix("skipped: ").split()) >= 3, (name, state)  # a reason, not a bare word
    assert manifest["model"]["architecture"] == ARCHITECTURES[arch][1]
    assert manifest["config"]["n_examples"] == N_EXAMPLES
    skipped = {name for name, state in status.items() if state.startswith("skipped: ")}
    assert skipped == ({"circuits", "kv", "mlp", "patching"} if arch == "bert" else set()), status  # none lost to N_EXAMPLES


@pytest.mark.parametrize("arch", ARCHS)
def test_no_analysis_fails(arch, report):
    """The issue's target: every analysis done or skipped with a stated reason, none failed."""
    failed = {name: state for name, state in report[0]["status"].items() if state.startswith("failed")}
    assert failed == {}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_manifest_says_whether_blocks_are_parallel(arch, report, arch_dirs):
    """Review 8 C2: a parallel block's MLP reads the block's input, as its heads do (GPT-NeoX's
    use_parallel_residual, read here from the checkpoint's own config); the report says so."""
    config = json.loads((arch_dirs[arch] / "config.json").read_text(encoding="utf-8"))
    assert report[0]["model"]["parallel_blocks"] is bool(config.get("use_parallel_residual", False))


@pytest.mark.parametrize("arch", ["llama3", "qwen3"])
def test_every_analysis_runs_in_bfloat16(arch, arch_dirs, more_arch_dirs, tmp_path):
    """#31 item 3: the whole quick report with the model in bfloat16 (`--dtype bfloat16`): no analysis
    fails on half-precision values (numpy has no bfloat16: every table is converted first)."""
    import headscope as hs

    folder = arch_dirs[arch] if arch in arch_dirs else more_arch_dirs(arch)
    model = hs.load_model(folder, device="cpu", dtype="bfloat16")
    out = build_report(model, out=tmp_path / "out", quick=True, n_examples=N_EXAMPLES, progress=False)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["config"]["dtype"] == "bfloat16" and manifest["config"]["n_examples"] == N_EXAMPLES
    assert {n: s for n, s in manifest["status"].items() if s.startswith("failed")} == {}
    # none skipped on N_EXAMPLES: qwen3's word-level tokenizer maps English to its unknown token, so position
    # (English retrieval data of its own) is skipped at any example count
    skipped = {n for n, s in manifest["status"].items() if s != "done"}
    assert skipped == ({"position"} if arch == "qwen3" else set()), manifest["status"]
    if arch == "qwen3":
        assert "unknown token" in manifest["status"]["position"], manifest["status"]
