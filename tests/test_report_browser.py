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
