"""`headscope report --model minilm` without --quick (#19): every analysis's full settings on the real
packaged MiniLM, on 4 examples per analysis so that it fits the test budget (the full data set takes
about 25 minutes on two busy cores; the code path is the same)."""
import json

import pytest

from headscope import cli

pytestmark = pytest.mark.slow
DONE = ("heads", "attribution", "position", "probes")
DECODER_ONLY = ("kv", "mlp", "patching", "circuits")


def test_full_minilm_report_is_complete(tmp_path):
    out = tmp_path / "out"
    assert cli._cmd_report(cli._parser().parse_args(["report", "-q", "--model", "minilm", "--n-examples", "4",
                                                     "--out", str(out)])) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["quick"] is False and manifest["config"]["n_examples"] == 4
    status = manifest["status"]
    assert {name: status[name] for name in DONE} == dict.fromkeys(DONE, "done")
    for name in DECODER_ONLY:
        assert status[name].startswith("skipped: minilm is an encoder and this analysis needs a decoder: it "), name
        assert not (out / name).exists()  # no folder, no 1-byte results.csv
    assert {name: manifest["task_used"][name] for name in DONE} == dict.fromkeys(DONE, "default task")
    full = manifest["config"]["settings"]["analysis_configs"]
    assert full["heads"]["methods"] == ["gradient", "zero", "mean", "resample"] and full["heads"]["l0"] is not None
    html = (out / "report.html").read_text()
    for name in DONE:
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary and "skipped" not in summary
        assert list((out / name).glob("*.png")), name  # its figures
        assert f'id="{name}"' in html, name
    assert html.count('<p class="skipped">skipped: minilm is an encoder') == len(DECODER_ONLY)
