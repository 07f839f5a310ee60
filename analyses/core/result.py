"""Result: what every analysis returns — tidy tables, headline numbers, nothing drawn yet.

`df` is the main tidy table (one observation a row, one variable a column, seaborn's long
form); `tables` holds further tidy tables by name; `summary` the headline numbers (JSON-
serialisable, named in the analysis's docs). Plotting and HTML live in headscope.reports, which
registers its views here when headscope is imported (`register_view`), so analyses never import
reports: `plot()` draws the figures, notebooks render `_repr_html_` (escaped table + main figure).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from headscope.errors import ConfigError, ResultFileError

AXES = ("layer", "head", "pos")  # the axes `Result.tensor` lays a column out on, in this order
FORMAT = 1  # result.json's "format"

_VIEWS: dict[str, Callable[..., Any]] = {}  # "plot": result -> {name: Figure}; "html": result -> str


def register_view(kind: str, fn: Callable[..., Any]) -> None:
    """Install a view of Results ("plot" or "html"); headscope.reports registers both."""
    _VIEWS[kind] = fn


HEADLESS = ("agg", "cairo", "pdf", "pgf", "ps", "svg", "template")  # matplotlib backends that show nothing themselves


def _release(figures: Mapping[str, Any]) -> None:
    """Close `figures` in pyplot's registry under a headless backend (HEADLESS); in a notebook (inline) or a GUI
    backend they stay open for display."""
    import matplotlib

    if str(matplotlib.get_backend()).lower() not in HEADLESS:
        return
    import matplotlib.pyplot as plt

    for fig in figures.values() if isinstance(figures, Mapping) else ():
        if hasattr(fig, "savefig"):
            plt.close(fig)


def _view(kind: str) -> Callable[..., Any]:
    if kind not in _VIEWS:
        raise ConfigError(f"No {kind} view of results is registered; `import headscope.reports` installs them.")
    return _VIEWS[kind]


@dataclass(frozen=True, kw_only=True)
class Result:
    name: str  # the analysis: "heads", "attribution", "position", "patching", "mlp", "kv", "probes"
    df: pd.DataFrame
    summary: Mapping[str, Any]
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    def plot(self, **kwargs: Any) -> dict:
        """Draw this result's figures: {figure name: matplotlib Figure} (headscope.reports.plots). Under a backend
        that shows nothing by itself (a script's Agg, PDF, SVG...) pyplot lets go of them once drawn, so a loop of
        plot() calls does not pile up open figures (review 20a C); each returned Figure still saves (fig.savefig)."""
        figures = _view("plot")(self, **kwargs)
        _release(figures)
        return figures

    def _repr_html_(self) -> str:
        return _view("html")(self)

    def tensor(self, column: str, *, table: str | None = None, **where: Any) -> torch.Tensor:
        """`column` of the main table (or `table`) as a dense tensor over its layer, head and pos axes,
        those of the rows `where` keeps (column=value) that have values there, in that order; a cell no
        row fills is NaN. E.g. heads: tensor("importance", method="zero") -> [layer, head]; patching:
        tensor("effect", site_type="resid_pre") -> [layer, pos], site_type="head_out" -> [layer, head],
        "head_out_by_pos" -> [layer, head, pos]. A ConfigError names the columns to filter by when
        rows repeat a cell (several methods, examples, site types)."""
        df = self.df if table is None else self.tables.get(table)
        if df is None:
            raise ConfigError(f"{self.name} result has no table {table!r}; its tables: {sorted(self.tables)}.")
        if column not in df.columns:
            raise ConfigError(f"no column {column!r}; this table's columns: {list(df.columns)}.")
        if not pd.api.types.is_numeric_dtype(df[column]):
            raise ConfigError(f"column {column!r} holds {df[column].dtype} values, not numbers; pick a numeric column.")
        for key, value in where.items():
            if key not in df.columns:
                raise ConfigError(f"cannot filter by {key!r}: no such column; columns: {list(df.columns)}.")
            df = df[df[key] == value]
        if df.empty:
            raise ConfigError(f"no rows with {where}; pick values that occur in the table.")
        axes = [a for a in AXES if a in df.columns and df[a].notna().all()]
        if not axes:
            raise ConfigError(f"the rows kept have no complete {'/'.join(AXES)} axis to lay {column!r} out on.")
        index = df[axes].astype("int64")
        if index.duplicated().any():
            groups = df.groupby(axes, dropna=False)
            varying = [c for c in df.columns if c not in (*axes, column) and groups[c].nunique(dropna=False).max() > 1]
            varying = [c for c in varying if c == "example" or not pd.api.types.is_numeric_dtype(df[c])]  # labels
            choices = ", ".join(f"{c}=one of {pd.unique(df[c]).tolist()[:6]}" for c in varying if c not in AXES)
            raise ConfigError(f"rows repeat {axes} cells; filter them, e.g. {choices or 'by another column'}.")
        shape = tuple(int(index[a].max()) + 1 for a in axes)
        out = torch.full(shape, float("nan"), dtype=torch.float64)
        out[tuple(torch.tensor(index[a].to_numpy()) for a in axes)] = torch.tensor(
            df[column].to_numpy(dtype=float, na_value=np.nan))
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write this Result to the folder `path` (made if needed; an earlier saved Result there is
        replaced) in safe formats, no pickle: result.json (name, summary, config, the tables' names)
        and one Parquet file per table (df.parquet, table_<i>.parquet). `Result.load(path)` reads it back."""
        folder = Path(path)
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"{str(folder)!r} is a file; Result.save writes a folder.")
        if folder.is_dir() and any(folder.iterdir()) and not (folder / "result.json").is_file():
            raise ConfigError(f"{str(folder)!r} holds other files; save the Result to a new or empty folder.")
        folder.mkdir(parents=True, exist_ok=True)
        names = list(self.tables)
        meta = {"format": FORMAT, "name": self.name, "summary": self.summary, "config": self.config, "tables": names}
        text = json.dumps(meta, default=_json_default, indent=1)  # before any file: an unsaveable summary writes nothing
        for file, frame in [("df.parquet", self.df), *((f"table_{i}.parquet", self.tables[n]) for i, n in enumerate(names))]:
            _atomic(folder / file, lambda tmp, frame=frame: frame.to_parquet(tmp))
        for old in folder.glob("table_*.parquet"):  # a previous save's extra tables
            if old.name not in {f"table_{i}.parquet" for i in range(len(names))}:
                old.unlink()
        _atomic(folder / "result.json", lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
        return folder

    @classmethod
    def load(cls, path: str | os.PathLike) -> Result:
        """The Result `save` wrote to the folder `path` (tables exactly as saved; the summary and
        config as JSON gives them back: tuples become lists)."""
        folder = Path(path)
        try:
            meta = json.loads((folder / "result.json").read_text(encoding="utf-8"))
            tables = {n: pd.read_parquet(folder / f"table_{i}.parquet") for i, n in enumerate(meta["tables"])}
            return cls(name=meta["name"], df=pd.read_parquet(folder / "df.parquet"), summary=meta["summary"],
                       tables=tables, config=meta["config"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ResultFileError(f"{str(folder)!r} is not a saved Result ({type(err).__name__}: {err}); "
                                  f"write one with result.save(path).") from None

    def source(self, key: str) -> Any:
        """The summary's `key` ("model", "dtype", "task"), else the config's: what the analysis ran on (names_source)."""
        return self.summary.get(key, (self.config or {}).get(key))

    def __repr__(self) -> str:
        """The first six summary entries; where a flag of REPR_UNMEASURED is set, the flag stands in place of the keys
        it says are not measurements (review 17b B2: a probes repr gave best_control=1.0 above best_accuracy=0.975
        with no word that its control task is degenerate)."""
        flags = [f for f in REPR_UNMEASURED if self.summary.get(f)]
        hidden = {k: f for f in flags for k in REPR_UNMEASURED[f]}
        items: list[tuple[str, Any]] = []
        for k, v in self.summary.items():
            if k in ("model", "task") or k in flags:
                continue
            if k in hidden:
                flag = (hidden[k], self.summary[hidden[k]])
                items += [flag] if flag not in items else []
                continue
            items.append((k, v))
        heads = ", ".join(f"{k}={v!r}" for k, v in items[:6])
        return (f"Result({self.name!r}, model={self.source('model')!r}, task={self.source('task')!r}, "
                f"{len(self.df)} rows; {heads})")


# summary flag -> the keys it says are not measurements, which a repr leaves out for the flag (probes: a control task
# the probe learns as a constant gives a control accuracy of 1 and no selectivity)
REPR_UNMEASURED = {"control_degenerate": ("best_control", "best_selectivity")}


def with_source(result: Any, model: Any, task: Any = None) -> Any:
    """`result` with the model's name, its compute dtype ("bfloat16": HookedModel.dtype) and the task's name in its
    config where neither its summary nor its config says them (review 12c C3: a patching Result's repr named neither;
    14c C4: its notebook view named no precision), so every repr names what it ran on."""
    if not isinstance(result, Result):
        return result
    add = {}
    if result.source("model") is None and getattr(getattr(model, "facts", None), "name", None) is not None:
        add["model"] = model.facts.name
    dtype = getattr(model, "dtype", None)  # review 14c C4: the precision it ran in, named with the model
    if result.source("dtype") is None and isinstance(dtype, torch.dtype):
        add["dtype"] = str(dtype).removeprefix("torch.")
    if result.source("task") is None:
        add["task"] = task_label(task)
    return dataclasses.replace(result, config={**(result.config or {}), **add}) if add else result


def task_label(task: Any) -> str:
    """The name a Result gives the task it ran on: a Task's own name; a task file's stem, as load_task names the Task it
    reads (review 19c C1: hs.TaskFile("tools.json", ...) read 'tools.json' where head_importance said 'tools'); a
    zoo task's name; 'default' for None; else the input's type."""
    from headscope.analyses.core.task_sources import FORMATS

    name = getattr(task, "name", task)
    if isinstance(name, os.PathLike) or (isinstance(name, str) and Path(name).suffix.lower() in FORMATS):
        return Path(os.fspath(name)).stem
    return name if isinstance(name, str) else ("default" if task is None else type(task).__name__)


def names_source(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A public analysis function whose Result names its model and task (with_source)."""
    @functools.wraps(fn)
    def run(model: Any, *args: Any, **kwargs: Any) -> Any:
        return with_source(fn(model, *args, **kwargs), model, args[0] if args else kwargs.get("task"))
    return run


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise ConfigError(f"Result.save: a {type(value).__name__} in the summary or config has no JSON form.")


def _atomic(path: Path, write: Callable[[str], Any]) -> None:
    """write(tmp) then rename over `path`: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
