"""`headscope report` within its time budget on a GPT-2-small-shaped checkpoint (#22 item 2).

Builds a random-weight GPT-2 small (GPT2Config defaults: 12 layers x 12 heads, d_model 768, 1,024
positions, 50,257-row vocabulary, 124M parameters) with a byte-level BPE trained here on English
text (benchmarks/_scale_models.py; its tokens index the first rows of the vocabulary), then runs the
report with --quick (budget 3 minutes) and without (10 minutes), or with --budget, and prints per
analysis the estimate made before it ran against the time it took, and the settings the budget
changed. Targets: the analyses within the budget, the whole report (loading, figures, HTML) within
1.2x of it.

    python benchmarks/report_budget.py [--only quick|full] [--budget MINUTES] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def build(folder: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    sys.path.insert(0, str(Path(__file__).parent))
    from _scale_models import byte_level_bpe

    if (folder / "config.json").is_file():
        return folder
    import torch

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    byte_level_bpe().save_pretrained(folder)
    return folder


def run(model, mode: str, budget: float | None) -> dict:
    from headscope.reports.report import build_report

    out = Path(tempfile.mkdtemp()) / f"report-{mode}"
    start = time.perf_counter()
    build_report(model, out=out, quick=mode == "quick", budget=budget)
    wall = time.perf_counter() - start
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    rows = []
    for name, seconds in manifest["timings_s"].items():
        summary_file = out / name / "summary.json"
        summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else {}
        b, t = summary.get("budget", {}), manifest.get("budget", {}).get(name, {})
        rows.append((name, manifest["status"][name], t.get("budget_s"), t.get("estimated_s"), seconds, b.get("changed", {})))
    return {"wall": wall, "analyses": sum(r[4] for r in rows), "minutes": manifest["config"]["budget_minutes"], "rows": rows}


def show(mode: str, got: dict) -> None:
    print(f"\n## {mode}: budget {got['minutes']} min; analyses {got['analyses']:.0f} s, whole report {got['wall']:.0f} s")
    print("| analysis | status | share s | estimated s | actual s | settings the budget changed |")
    print("|---|---|---|---|---|---|")
    for name, status, share, est, actual, changed in got["rows"]:
        what = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()) or "none"
        print(f"| {name} | {status[:30]} | {share} | {est} | {actual:.0f} | {what} |")
    limit = got["minutes"] * 60
    print(f"analyses within the budget: {got['analyses'] <= limit} ({got['analyses']:.0f} s of {limit:.0f} s); "
          f"whole report within 1.2x: {got['wall'] <= 1.2 * limit}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["quick", "full"], default=None)
    p.add_argument("--budget", type=float, default=None, help="minutes (default: the report's own, 3 quick / 10 full)")
    p.add_argument("--threads", type=int, default=None, help="HEADSCOPE_THREADS (default: headscope's rule)")
    p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "headscope-bench-gpt2-small"))
    args = p.parse_args()
    if args.threads:
        os.environ["HEADSCOPE_THREADS"] = str(args.threads)
    import logging

    import headscope as hs
    from headscope.models.threads import configure_threads

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("headscope").setLevel(logging.INFO)  # the estimates and what the budget changed

    print(f"torch threads: {configure_threads() or 'torch default'}; load average {os.getloadavg()}")
    model = hs.load_model(build(Path(args.cache)), device="cpu")
    print(model)
    for mode in (args.only,) if args.only else ("quick", "full"):
        show(mode, run(model, mode, args.budget))
        print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
