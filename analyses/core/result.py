"""Result: what every analysis returns — tidy tables, headline numbers, nothing drawn yet.

`df` is the main tidy table (one observation a row, one variable a column, seaborn's long
form); `tables` holds further tidy tables by name; `summary` the headline numbers (JSON-
serialisable, named in the analysis's docs). Plotting lives in headscope.reports.plots and is
reached through `plot()`; notebooks render `_repr_html_` (escaped table + the main figure).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Mapping

import pandas as pd


@dataclass(frozen=True, kw_only=True)
class Result:
    name: str  # the analysis: "heads", "attribution", "position", "patching", "mlp", "kv", "probes"
    df: pd.DataFrame
    summary: Mapping[str, Any]
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    def plot(self, **kwargs: Any) -> dict:
        """Draw this result's figures: {figure name: matplotlib Figure} (headscope.reports.plots)."""
        from headscope.reports.plots import plot_result

        return plot_result(self, **kwargs)

    def _repr_html_(self) -> str:
        from headscope.reports.render import result_html

        return result_html(self)

    def __repr__(self) -> str:
        heads = ", ".join(f"{k}={v!r}" for k, v in list(self.summary.items())[:6])
        return f"Result({self.name!r}, {len(self.df)} rows; {heads})"


def escape(text: Any) -> str:
    """HTML-escape anything shown in a report or notebook (token strings may hold <script>)."""
    return html.escape(str(text), quote=True)
