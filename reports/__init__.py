"""Figures, the HTML report, manifests and output folders. Importing this package registers the
plot and HTML views of analysis Results (analyses never import reports)."""
from __future__ import annotations

from typing import Any

from headscope.analyses.core.result import register_view


def _plot(result: Any, **kwargs: Any) -> dict:
    from headscope.reports.plots import plot_result

    return plot_result(result, **kwargs)


def _html(result: Any) -> str:
    from headscope.reports.render import result_html

    return result_html(result)


register_view("plot", _plot)
register_view("html", _html)
