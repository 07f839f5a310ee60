"""build_report: run analyses on a model and write the output contract of DESIGN.md.

    OUT/manifest.json, OUT/<analysis>/{results.csv, summary.json, *.png, <table>.csv},
    OUT/report.html (self-contained, every string escaped), OUT/report.md

Every file is written atomically; each analysis's folder appears whole (staged, then renamed),
and the report files are written last, from what is on disk, so an interrupted run leaves no
report, and `resume=True` skips finished analyses and gives the same report.

Under torchrun every rank runs every analysis on its shard of the examples (see
analyses/distributed.py) and ends with the same results; rank 0 alone prepares OUT and writes
files, and the ranks agree on each analysis's status.
"""
from __future__ import annotations

from headscope.errors import ConfigError, OutputExistsError

import logging
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from headscope.execution import distributed
from headscope.analyses.core.registry import ANALYSES, RunConfig, get_analysis
from headscope.reports import io
from headscope.reports.manifest import build_manifest

log = logging.getLogger(__name__)
DONE = "summary.json"  # written last in an analysis folder: its presence marks the analysis complete



def default_out(model_name: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-") or "model"
    return Path("headscope-out") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def parse_analyses(names: str | Sequence[str] | None) -> list[str]:
    if names is None:
        return list(ANALYSES)
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    unknown = [n for n in items if n not in ANALYSES]
    if unknown or not items:
        raise ConfigError(f"Unknown analysis {', '.join(map(repr, unknown)) or '(none given)'}; choose from: {', '.join(ANALYSES)}.")
    return items


def prepare_out(out: Path, *, force: bool, resume: bool) -> None:
    """Refuse an existing folder unless resuming, or forcing over a previous headscope output."""
    if not out.exists():
        out.mkdir(parents=True)
        return
    if not out.is_dir():
        raise OutputExistsError(f"{str(out)!r} exists and is not a folder; choose another --out.")
    if resume:
        return
    if not force:
        raise OutputExistsError(f"Output folder {str(out)!r} already exists; pass --force to overwrite it, --resume to finish it, or choose another --out.")
    if any(out.iterdir()) and not (out / "manifest.json").exists():
        raise OutputExistsError(f"{str(out)!r} is not empty and holds no headscope manifest.json; refusing to delete it even with --force.")
    shutil.rmtree(out)
    out.mkdir(parents=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def write_result(result: Any, folder: Path) -> None:
    """Stage the analysis's files in a hidden folder, then rename it into place."""
    import matplotlib.pyplot as plt

    stage = folder.parent / f".{folder.name}.partial"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    io.write_csv(stage / "results.csv", result.df)
    for name, table in result.tables.items():
        io.write_csv(stage / f"{name}.csv", table)
    for stem, fig in result.plot().items():
        io.write_figure(stage / f"{stem}.png", fig)
        plt.close(fig)
    io.write_json(stage / DONE, result.summary)
    shutil.rmtree(folder, ignore_errors=True)
    stage.rename(folder)


def build_report(
    model: Any = None,
    *,
    out: str | Path | None = None,
    analyses: str | Sequence[str] | None = None,
    task: str | None = None,
    seed: int = 0,
    quick: bool = False,
    n_examples: int | None = None,
    device: str | None = None,
    force: bool = False,
    resume: bool = False,
    progress: bool = True,
    command: list[str] | None = None,
) -> Path:
    """Run the analyses and write OUT; returns OUT. `model` is a HookedModel or a spec for load_model.

    Under torchrun (WORLD_SIZE > 1) the process group is opened here if needed; only rank 0 writes.
    """
    from headscope.models import HookedModel, load_model

    distributed.init_from_env(model.device if isinstance(model, HookedModel) else device)
    main = distributed.is_main()
    names = parse_analyses(analyses)
    task_rows = None
    if task is not None and Path(task).suffix:
        from headscope.analyses.core.task_files import read_task_rows

        task_rows = read_task_rows(task)  # bad task files fail before anything is written
    if not isinstance(model, HookedModel):
        model = load_model(model, device=device)
    out = distributed.broadcast_object(Path(out) if out is not None else default_out(model.name))
    error = None
    if main:
        try:
            prepare_out(out, force=force, resume=resume)
        except OutputExistsError as err:
            error = err
    error = distributed.broadcast_object(error)  # every rank stops when rank 0 cannot write
    if error is not None:
        raise error
    if task_rows is not None and main:  # the user's prompts, shown (escaped) in the report
        import pandas as pd

        io.write_csv(out / "task_examples.csv", pd.DataFrame(task_rows))
    config = RunConfig(seed=seed, quick=quick, n_examples=n_examples, task=task, progress=progress and main)
    manifest_path = out / "manifest.json"
    previous = io.read_json(manifest_path) if main and resume and manifest_path.exists() else {}
    finished = distributed.broadcast_object({n for n in names if main and resume and (out / n / DONE).exists()})
    timings: dict[str, float] = dict(previous.get("timings_s", {}))
    status: dict[str, str] = {}
    model_info = {"name": model.name, "source": model.source, **{k: v for k, v in vars(model.facts).items()}}
    config_info = {"analyses": names, "task": task, "quick": quick, "n_examples": n_examples, "device": str(model.device)}

    def save_manifest() -> None:
        if not main:
            return
        io.write_json(manifest_path, build_manifest(command=command, config=config_info, model=model_info,
                                                    seed=seed, timings=timings, status=status))

    for name in names:
        folder = out / name
        if name in finished:
            status[name] = "done (resumed)"
            log.info("%s: already complete, skipped (--resume)", name)
            continue
        log.info("%s: running", name)
        seed_everything(seed)
        start = time.perf_counter()
        try:
            result = get_analysis(name)(model, config)
            if main:
                write_result(result, folder)
            state = "done"
        except Exception as err:  # one failing analysis must not lose the others
            log.exception("%s failed", name)
            state = f"failed: {type(err).__name__}: {err}"
        states = distributed.gather_objects(state)  # a failure on any rank fails the analysis
        status[name] = next((s for s in states if s != "done"), "done")
        timings[name] = round(time.perf_counter() - start, 3)
        save_manifest()
    save_manifest()
    if main:
        from headscope.reports.html_report import write_report_files

        write_report_files(out, names, status, model_info)
    distributed.barrier()  # no rank returns before the report exists
    return out
