"""Atomic writes: every output file appears whole or not at all.

Each writer writes to a temporary file in the destination folder, flushes and fsyncs it, then
renames it over the destination (os.replace is atomic on POSIX and Windows). mkstemp creates the
temporary file 0600; it is given the mode a plain open() would (0666 less the umask) before the rename.
"""
from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (/proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic(path: Path, write: Callable[[Path], None]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    return _atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: Path, data: Any) -> Path:
    """Deterministic JSON (sorted keys, fixed float repr) so that equal runs give equal files."""
    return write_text(path, json.dumps(to_jsonable(data), indent=2, sort_keys=True, allow_nan=True) + "\n")


def write_csv(path: Path, df: pd.DataFrame) -> Path:
    """df as CSV, every field read back as written (pandas, the csv module). A string holding a bare carriage return
    (a token '\r', review 20b A2) is not quoted by the csv module's minimal quoting under a '\n' line end, so a
    reader split its row: a table with one is written with every non-numeric field quoted."""
    cr = any(df[c].map(lambda v: isinstance(v, str) and "\r" in v).any()
             for c in df.columns if df[c].dtype == object or pd.api.types.is_string_dtype(df[c]))
    quoting = csv.QUOTE_NONNUMERIC if cr else csv.QUOTE_MINIMAL
    return _atomic(path, lambda tmp: df.to_csv(tmp, index=False, quoting=quoting))


def write_figure(path: Path, fig: Any) -> Path:
    """Save a matplotlib figure as PNG (fixed metadata so the bytes do not depend on the time)."""
    return _atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", pad_inches=0.2,
                                                 metadata={"Software": None}))  # review 12c B1: a margin at the edges


def to_jsonable(value: Any) -> Any:
    """Convert numpy / torch scalars and arrays, tuples and paths into plain JSON types."""
    import numpy as np

    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and value != value:  # NaN: JSON has none; keep null
        return None
    return value


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
