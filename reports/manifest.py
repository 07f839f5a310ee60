"""The run manifest: what produced a report — command, config, versions, git SHA, seed, timings."""
from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("headscope", "torch", "transformer-lens", "transformers", "captum", "scikit-learn", "pandas", "numpy", "seaborn")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_sha(start: Path | None = None) -> str | None:
    """The commit of the headscope checkout, where there is one (None for an installed wheel)."""
    here = start or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def build_manifest(*, command: list[str] | None, config: dict[str, Any], model: dict[str, Any], seed: int,
                   timings: dict[str, float], status: dict[str, str]) -> dict[str, Any]:
    return {
        "command": command if command is not None else sys.argv,
        "config": config,
        "model": model,
        "seed": seed,
        "versions": package_versions(),
        "git_sha": git_sha(),
        "timings_s": timings,
        "status": status,
    }
