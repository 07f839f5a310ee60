"""What --resume keeps and refuses: the settings a run records in its manifest (`run_settings`), the
check that a resumed OUT ran with the same ones (`check_resume`), and which finished analyses a changed
or missing file makes run again (`damaged_analyses`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from headscope.analyses.core.registry import ANALYSES, config_class
from headscope.errors import ConfigError
from headscope.reports import io
from headscope.reports.outputs import hash_or_none, sha256

DONE = "summary.json"  # written last in an analysis folder: its presence marks the analysis complete


def damaged_analyses(root: Path, files: Mapping[str, str]) -> dict[str, str]:
    """name -> why, for each finished analysis folder in `root` (its summary.json there or listed) that
    --resume cannot keep: a file the manifest lists under it (`files`: relative path -> sha256) is missing, not
    a regular file, or unreadable or changed (its sha256), or the manifest lists its files but not its summary.json.
    A folder the manifest lists nothing for (a run killed between the folder's rename and the manifest
    write) is kept: it appeared whole."""
    damaged = {}
    for name in ANALYSES:
        listed = {rel: h for rel, h in files.items() if rel.startswith(f"{name}/")}
        if not listed or not ((root / name / DONE).is_file() or f"{name}/{DONE}" in listed):
            continue  # never finished (or not listed yet): it runs when named, as before
        if f"{name}/{DONE}" not in listed:
            damaged[name] = f"manifest.json does not list {name}/{DONE}"
            continue
        for rel, digest in sorted(listed.items()):
            path = root / rel
            if path.is_symlink() or not path.is_file():
                damaged[name] = f"{rel} is missing"
            elif hash_or_none(path) != digest:
                damaged[name] = f"{rel} does not match its sha256 in manifest.json (changed since it was written)"
            else:
                continue
            break
    return damaged


def run_settings(model: Any, names: Sequence[str], task: Any, *, seed: int, quick: bool, n_examples: int | None,
                 budget: float | None = None, dtype: str | None = None, prepend_bos: bool | None = None,
                 overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
    """What a --resume must match (the manifest's config "settings"): the model's source and files
    (models/fingerprint.py: new weights saved over the same folder are another model), the task
    (a task file by its bytes, field mapping and strictness, not its path), seed, quick, n_examples, the
    dtype it runs in (`dtype`: --dtype's, else the checkpoint's; loading.run_dtype_name), load_model's
    prepend_bos (None: TransformerLens's habit), the headscope version and each analysis's config (with its
    `overrides`: RunSettings.overrides). `model` is a HookedModel or a load_model spec."""
    import json

    from headscope.models.fingerprint import model_fingerprint
    from headscope.models.loading import resolve_spec
    from headscope.version import __version__

    source = getattr(model, "source", None) if hasattr(model, "facts") else resolve_spec(model)[1]
    is_file = isinstance(task, str) and bool(Path(task).suffix)
    configs = {}
    for name in names:
        config = config_class(name).preset(seed=seed, quick=quick, n_examples=n_examples,
                                           **(overrides or {}).get(name, {})).as_dict()
        config.pop("progress", None)
        configs[name] = json.loads(json.dumps(config, default=str))  # as the manifest stores it
    return {
        "model_source": str(source), "model_files": model_fingerprint(source),
        "task": None if task is None else (Path(task).name if is_file else str(task)),
        "task_fields": dict(getattr(task, "fields", None) or {}),
        "task_sha256": (getattr(task, "sha256", None) or sha256(Path(task))) if is_file else None,
        "strict": bool(getattr(task, "strict", False)), "seed": seed, "quick": quick, "n_examples": n_examples,
        "budget_minutes": budget_minutes(budget, quick), "dtype": dtype, "prepend_bos": prepend_bos,
        "headscope": __version__,
        "analysis_configs": configs,
    }


def budget_minutes(budget: float | None, quick: bool) -> float | None:
    """The run's budget in minutes: `budget`, else the default (budget.REPORT_MINUTES, QUICK_MINUTES
    with quick); None for no budget (inf)."""
    import math

    from headscope.analyses.core import budget as B

    if budget is None:
        return B.QUICK_MINUTES if quick else B.REPORT_MINUTES
    if not budget > 0:
        raise ConfigError(f"--budget is in minutes and must be positive (inf: no budget), got {budget:g}.")
    return None if math.isinf(budget) else float(budget)


def bos_option(value: Any) -> str:
    """load_model's prepend_bos as the command-line option that asks for it."""
    return {False: "--no-prepend-bos", True: "--prepend-bos"}.get(value, "default (prepended on decoders)")


def check_resume(out: Path, settings: dict) -> None:
    """Refuse (one line, ConfigError) to --resume OUT with settings other than those its finished
    analyses ran with, so that one report never mixes two configurations."""
    previous = io.read_json(out / "manifest.json") if (out / "manifest.json").is_file() else {}
    recorded = (previous.get("config") or {}).get("settings")
    if not isinstance(recorded, dict):
        finished = [n for n in ANALYSES if (out / n / DONE).is_file()]
        if finished:
            raise ConfigError(
                f"--resume: {str(out)!r} holds finished analyses ({', '.join(finished)}) but its manifest does not record "
                f"the settings they ran with; rerun with --force or choose another --out."
            )
        return
    differ = []
    for key, label in (("model_source", "model"), ("model_files", "model files (weights, config or tokenizer changed)"),
                       ("task", "task"), ("task_sha256", "task file contents"), ("task_fields", "task fields"),
                       ("seed", "seed"), ("quick", "--quick"), ("n_examples", "--n-examples"),
                       ("budget_minutes", "--budget"), ("dtype", "dtype"), ("prepend_bos", "--prepend-bos/--no-prepend-bos"),
                       ("headscope", "headscope version")):
        if key == "task" and recorded.get("task_sha256") and settings.get("task_sha256"):
            continue  # a task file is its bytes (compared next), wherever it lies now
        if key == "model_files" and differ:
            continue  # another model altogether (said already)
        if key == "dtype" and recorded.get(key) is None:  # before review 15c A1: the requested dtype; the one run
            recorded = {**recorded, "dtype": (previous.get("config") or {}).get("dtype")}
        if recorded.get(key) != settings.get(key):
            if key == "prepend_bos":  # None / True / False read as the options that set them
                differ.append(f"BOS {bos_option(recorded.get(key))} (now {bos_option(settings.get(key))})")
                continue
            differ.append(label if key in ("task_sha256", "model_files") else
                          f"{label} {recorded.get(key)!r} (now {settings.get(key)!r})")
    old_configs = recorded.get("analysis_configs") or {}
    for name, config in settings["analysis_configs"].items():
        if name in old_configs and old_configs[name] != config and "headscope version" not in " ".join(differ):
            changed = sorted(k for k in set(config) | set(old_configs[name]) if config.get(k) != old_configs[name].get(k))
            differ.append(f"{name} config ({', '.join(changed)})")
    if differ:
        shown = "; ".join(differ[:4]) + (f"; and {len(differ) - 4} more" if len(differ) > 4 else "")
        raise ConfigError(
            f"--resume: {str(out)!r} was run with other settings: {shown}; resume with the settings in its manifest.json, "
            f"or use --force or another --out for a new run."
        )
