"""Result: what every analysis returns — tidy tables, headline numbers, nothing drawn yet.

`df` is the main tidy table (one observation a row, one variable a column, seaborn's long
form); `tables` holds further tidy tables by name; `summary` the headline numbers (JSON-
serialisable, named in the analysis's docs). Plotting and HTML live in headscope.reports, which
registers its views here when headscope is imported (`register_view`), so analyses never import
reports: `plot()` draws the figures, notebooks render `_repr_html_` (escaped table + main figure).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from headscope.errors import ConfigError

_VIEWS: dict[str, Callable[..., Any]] = {}  # "plot": result -> {name: Figure}; "html": result -> str


def register_view(kind: str, fn: Callable[..., Any]) -> None:
    """Install a view of Results ("plot" or "html"); headscope.reports registers both."""
    _VIEWS[kind] = fn


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
        """Draw this result's figures: {figure name: matplotlib Figure} (headscope.reports.plots)."""
        return _view("plot")(self, **kwargs)

    def _repr_html_(self) -> str:
        return _view("html")(self)

    def __repr__(self) -> str:
        heads = ", ".join(f"{k}={v!r}" for k, v in list(self.summary.items())[:6])
        return f"Result({self.name!r}, {len(self.df)} rows; {heads})"
