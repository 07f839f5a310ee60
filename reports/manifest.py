"""The run manifest: what produced a report — command, config, versions, git SHA, seed, timings —
and which files of the output folder headscope wrote ("files": relative path -> sha256, with
"output_format"), the list that decides what --force may delete (see reports/outputs.py)."""
from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

OUTPUT_FORMAT = 1  # the "output_format" of a manifest that lists its files
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
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


def read_output_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest at `path` when it is a headscope output manifest (a regular file, JSON, the
    output_format, a file list of safe relative paths and sha256 hex digests); None otherwise."""
    from headscope.reports.outputs import safe_relpath

    path = Path(path)
    try:
        if path.is_symlink() or not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("output_format") != OUTPUT_FORMAT:
        return None
    files = data.get("files")
    if not isinstance(files, dict):
        return None
    for rel, digest in files.items():
        if not (isinstance(rel, str) and safe_relpath(rel) and rel != "manifest.json"
                and isinstance(digest, str) and _SHA256.match(digest)):
            return None
    return data
