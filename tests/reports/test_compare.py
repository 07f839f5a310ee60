"""`headscope compare`: two hand-made output folders side by side, differences called out, strings escaped."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd

from headscope.cli import main
from headscope.reports import io

XSS = "<img src=x onerror=alert(1)>"


def _folder(root, name: str, sign: float, top_layer: int, prunable: float, quick: bool = False, n: int = 4):
    """An output folder with heads (importance = sign x a fixed grid, a pruning curve), position and patching."""
    root.mkdir(parents=True)
    io.write_json(root / "manifest.json", {"model": {"name": name}, "config": {"analyses": ["heads", "position", "patching"],
                                                                               "task": XSS, "quick": quick}, "seed": int(quick),
                                           "versions": {"torch": "2.13.0" if quick else "2.12.1", "numpy": "2.4.6"}})
    grid = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]]
    rows = [{"layer": l, "head": h, "method": "gradient", "importance": sign * grid[l][h], "importance_layer_norm": 0.0}
            for l in range(2) for h in range(3)]  # the raw column is what the reports' findings rank by
    io.write_csv(root / "heads" / "results.csv", pd.DataFrame(rows))
    io.write_csv(root / "heads" / "curve.csv", pd.DataFrame({
        "ordering": "gradient", "recompute": False, "seed": 0, "fraction_pruned": [0.0, 0.5, 1.0], "metric": [3.0, 2.0, 0.0]}))
    io.write_json(root / "heads" / "summary.json", {"metric": "logit_diff", "baseline_metric": 3.0, "n_heads": 6,
                                                    "n_examples": n, "max_fraction_prunable_gradient": prunable})
    io.write_csv(root / "position" / "curve.csv", pd.DataFrame({
        "condition": "full", "metric": "accuracy", "position": [1, 2, 3], "mean": [0.9, 0.5 + sign * 0.1, 0.8]}))
    io.write_json(root / "position" / "summary.json", {"primary_metric": "accuracy",
                                                       "ratio_middle_to_ends": {"accuracy": (0.5 + sign * 0.1) / 0.9}})
    io.write_json(root / "patching" / "summary.json", {"top_sites": {"resid_pre": [
        {"layer": top_layer, "head": None, "pos": 2, "token": f"2: {XSS}", "effect": 1.5}]}})


def test_compare_page_sets_both_side_by_side_and_calls_out_differences(tmp_path):
    _folder(tmp_path / "a", "model-a", 1.0, 0, 0.5)
    _folder(tmp_path / "b", f"model-b {XSS}", -1.0, 1, 0.0, quick=True, n=16)
    page_path = tmp_path / "cmp.html"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(page_path)]) == 0
    page = page_path.read_text()
    assert XSS not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "model-a" in page and "model-b" in page
    settings = page[page.index("id='settings'"):page.index("id='differences'")]
    for line in ("--quick: A False, B True.", "seed: A 0, B 1.", "torch version: A 2.12.1, B 2.13.0.",
                 "heads examples: A 4, B 16.", "model: A model-a, B model-b &lt;img"):
        assert line in settings, line
    assert "numpy" not in settings and "task:" not in settings and "position examples" not in settings  # equal ones
    assert "Head importance (gradient importance): Pearson r = -1.00 between A and B" in page  # B's raw importance is -A's
    assert "4 of the top 5 heads are shared (L0H1, L0H2, L1H0, L1H1)" in page  # A leaves out L0H0, B L1H2
    assert "Prunable within 1% by gradient: A 50%, B 0%." in page
    assert "Middle/ends ratio of accuracy: A 0.67, B 0.44." in page  # 0.6 / 0.9 and 0.4 / 0.9
    assert "Top resid_pre site differs: A resid_pre L0 pos 2: &lt;img" in page
    assert page.count("<img alt=") == 3  # importance, pruning curves, position curves
    assert "src=\"http" not in page and "<script" not in page


def test_compare_refuses_what_it_cannot_read_or_would_overwrite(tmp_path, capsys):
    _folder(tmp_path / "a", "m", 1.0, 0, 0.5)
    page = tmp_path / "cmp.html"
    page.write_text("mine")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--out", str(page)]) == 2
    assert page.read_text() == "mine" and "--force" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "nothing"), "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "not a headscope output folder" in err and len(err.strip().splitlines()) == 1
    # --force, in a fresh process whose logging the CLI sets up: its own INFO lines show, matplotlib's and datasets' do not
    code = ("import logging, sys; from headscope.cli import main\n"
            "code = main(['compare', sys.argv[1], sys.argv[1], '--out', sys.argv[2], '--force'])\n"
            "for name in ('headscope.reports', 'matplotlib.category', 'datasets.builder'):\n"
            "    logging.getLogger(name).info('line from %s', name)\n"
            "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a"), str(page)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "No difference above the thresholds." in page.read_text()
    assert "The runs share every recorded setting." in page.read_text()
    assert "line from headscope.reports" in proc.stderr
    assert "matplotlib" not in proc.stderr and "datasets" not in proc.stderr
