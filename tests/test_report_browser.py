"""report.html as a person sees it: headless Chromium, no console errors, no requests, escaped prompts."""
from __future__ import annotations

import io
import json

import pytest
from test_cli import XSS, headscope

from browser import chromium_path, visit

pytestmark = pytest.mark.skipif(chromium_path() is None, reason="needs Debian's chromium (.ci/run installs it)")


@pytest.fixture(scope="module")
def xss_report(tmp_path_factory):
    """A quick report on a task file whose prompts contain a script tag."""
    root = tmp_path_factory.mktemp("browser")
    rows = [
        {"prompt": f"k01 v05 ; k02 v06 ; {XSS} ; k01", "answer": "v05",
         "corrupted_prompt": f"k01 v05 ; k02 v06 ; {XSS} ; k02", "wrong_answer": "v06"},
        {"prompt": f"k03 v07 ; k04 v08 ; {XSS} ; k04", "answer": "v08",
         "corrupted_prompt": f"k03 v07 ; k04 v08 ; {XSS} ; k03", "wrong_answer": "v07"},
    ]
    task = root / "xss.jsonl"
    task.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = root / "report"
    headscope("-q", "report", "--quick", "--analyses", "heads,patching", "--task", str(task), "--out", str(out))
    return out


def test_report_renders_with_no_errors_no_requests_and_escaped_prompts(xss_report):
    page = visit(xss_report / "report.html")
    assert page.console_errors == []
    assert page.requests == []
    assert XSS in page.text  # shown as text, never run
    import matplotlib.image as mpimg

    pixels = mpimg.imread(io.BytesIO(page.screenshot), format="png")
    assert pixels.std() > 0.05  # not a blank page


def test_report_has_the_explorer_within_8_mb_and_clicking_a_head_changes_the_view(xss_report):
    """The CLI's report on the default model (quick, heads and patching) embeds the attention explorer,
    stays within #21's 8 MB budget, and a real click on a head shows that head's stored pattern."""
    import numpy as np

    from browser import open_page
    from headscope.reports import io as report_io
    from headscope.reports.explorer import pattern_from_data

    html = xss_report / "report.html"
    assert html.stat().st_size <= 8 * 10**6
    assert html.read_text().count('id="hsx-report"') == 1
    data = report_io.read_json(xss_report / "explorer.json")
    assert [e["task"] for e in data["examples"]] == ["xss (heads, patching)"] * 2  # the task, and who used it
    n_layers, n_heads = data["n_layers"], data["n_heads"]
    shown = ("(function(){var t=document.querySelector('#hsx-report .hsx-heat');"
             "return [+t.dataset.example, +t.dataset.layer, +t.dataset.head];})()")
    values = ("Array.from(document.querySelectorAll('#hsx-report .hsx-heat tbody tr')).map("
              "function(r){return Array.from(r.querySelectorAll('td')).map(function(c){return +c.dataset.v;});})")
    tol = 0.5 / data["scale"] + 1e-6
    with open_page(html) as page:
        assert page.evaluate("document.querySelectorAll('#hsx-report .hsx-grid td').length") == n_layers * n_heads
        example, layer, head = page.evaluate(shown)
        before = np.array(page.evaluate(values))
        target = (n_layers - 1, n_heads - 1) if (layer, head) != (n_layers - 1, n_heads - 1) else (0, 0)
        page.click(f"#hsx-report td[data-layer='{target[0]}'][data-head='{target[1]}']")
        page.settle()
        assert page.evaluate(shown) == [example, *target]
        after = np.array(page.evaluate(values))
        expected = np.array(pattern_from_data(data, example, *target))  # [query, key]
        assert after.shape == expected.shape and np.allclose(after, expected, atol=tol)
        assert not np.allclose(after, before)  # the view really changed
        title = page.evaluate("document.querySelector('#hsx-report .hsx-title').textContent")
        assert title.startswith(f"Layer {target[0]}, head {target[1]}")
        assert page.console_errors == []
        assert page.requests == []


def test_a_patching_head_link_opens_that_head_on_patchings_prompt(xss_report, tmp_path):
    """#34 items 1-2: the CLI's explorer opens with the sample prompt the sections' provenance shows (the task
    file's first row, as the file writes it); a head that patching's finding names (its summary given a
    head_out site: at chance on this model it names none) links to #L1H3@patching, and a click opens that
    head on patching's prompt, whichever example was shown, with no console error or request."""
    import shutil

    import numpy as np

    from browser import open_page
    from headscope.reports import io as report_io
    from headscope.reports.explorer import pattern_from_data
    from headscope.reports.html_report import write_report_files

    data = report_io.read_json(xss_report / "explorer.json")
    sample = report_io.read_json(xss_report / "patching" / "task.json")["sample"]["prompt"]
    assert data["examples"][0]["sample_of"] == ["heads", "patching"] and data["examples"][1]["sample_of"] == []
    tokens = data["examples"][0]["tokens"]  # the model's tokens; the section's sample is the user's text, without BOS
    assert sample == f"k01 v05 ; k02 v06 ; {XSS} ; k01"  # the file's first row, as written (review 11a C8)
    decoded = sample.replace(XSS, "<unk>")  # the model's tokens: the tag is one unknown token
    assert " ".join(tokens[1:] if tokens[0] == "<bos>" else tokens) == decoded
    out = tmp_path / "report"
    shutil.copytree(xss_report, out)
    summary = {k: v for k, v in report_io.read_json(out / "patching" / "summary.json").items()
               if k not in ("chance", "gap_within_noise")}
    summary["top_sites"] = {"head_out": [{"layer": 1, "head": 3, "pos": None, "token": "", "effect": 20.0}]}
    report_io.write_json(out / "patching" / "summary.json", summary)
    manifest = report_io.read_json(out / "manifest.json")
    write_report_files(out, ["heads", "patching"], manifest["status"], manifest["model"], manifest["task_used"])
    html = (out / "report.html").read_text()
    assert 'href="#L1H3@patching">L1H3</a>' in html
    shown = ("(function(){var t=document.querySelector('#hsx-report .hsx-heat');"
             "return [+t.dataset.example, +t.dataset.layer, +t.dataset.head];})()")
    with open_page(out / "report.html") as page:
        page.evaluate("(function(){var s=document.querySelector('#hsx-report select'); s.value='1';"
                      "s.dispatchEvent(new Event('change'));})()")  # the task's other row
        assert page.evaluate(shown)[0] == 1
        page.click("#patching ~ p.finding a.head-link")
        page.settle(0.1)
        assert page.evaluate(shown) == [0, 1, 3]
        values = page.evaluate("Array.from(document.querySelectorAll('#hsx-report .hsx-heat tbody tr')).map(function(r){"
                               "return Array.from(r.querySelectorAll('td')).map(function(c){return +c.dataset.v;});})")
        assert np.allclose(values, pattern_from_data(data, 0, 1, 3), atol=0.5 / data["scale"] + 1e-6)
        tokens = page.evaluate("Array.from(document.querySelectorAll('#hsx-report .hsx-tok'))"
                               ".map(function(t){return t.textContent;})")
        assert " ".join(tokens[1:] if tokens[0] == "<bos>" else tokens) == decoded
        assert page.console_errors == [] and page.requests == []
