"""Regenerate the README's figures in docs/img from the current plotting code.

    .venv/bin/python docs/make_figures.py [--out-dir docs/img] [--model zoo/synth-llama]

Runs `headscope report --quick` (hs.build_report) on the default model for the analyses whose
figures the README shows, into a temporary folder, and copies those PNGs to docs/img under the
names the README links (FIGURES). The screenshots of report.html (report_top.png, explorer.png)
need a browser and are not made here. Takes a few minutes on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

# docs/img name: (analysis, file in that analysis's report folder)
FIGURES = {
    "heads_pruning_curve.png": ("heads", "pruning_curve.png"),
    "attribution_tau.png": ("attribution", "tau.png"),
    "position_curve.png": ("position", "position_curve.png"),
    "patching_resid_pre.png": ("patching", "exact_resid_pre.png"),
    "mlp_agreement.png": ("mlp", "mlp_agreement.png"),
    "kv_eviction.png": ("kv", "kv_eviction.png"),
    "probes.png": ("probes", "probes.png"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "img"))
    parser.add_argument("--model", default="zoo/synth-llama")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")  # this script only writes files
    import headscope as hs

    analyses = sorted({analysis for analysis, _ in FIGURES.values()})
    with tempfile.TemporaryDirectory() as tmp:
        report = hs.build_report(args.model, out=Path(tmp) / "report", analyses=analyses, quick=True, seed=0,
                                 device="cpu")
        missing = []
        for name, (analysis, file) in FIGURES.items():
            source = report / analysis / file
            if not source.is_file():
                missing.append(f"{analysis}/{file}")
                continue
            shutil.copyfile(source, Path(args.out_dir) / name)
            print(f"{name} <- {analysis}/{file}")
    if missing:
        print("not drawn by this report: " + ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
