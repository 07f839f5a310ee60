"""How each analysis family is presented: the reports layer's record of a family, keyed by its name.

An analysis family's record (analyses/core/family.py, analyses/<name>/__init__.py FAMILY) holds
what it computes; this one holds how the report shows it: its figures (reports/plots_<name>.py's
`figures(result)`), its headline finding (reports/findings.py) and the paragraph on how to read
its section (reports/guides.py). Figure captions are keyed by figure stem (findings.CAPTIONS).
The analyses layer never imports this (tests/test_layout.py): a family's presentation is found
from its name, and `presentation(name)` fails loudly for a registered family without one.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from headscope.reports import findings
from headscope.reports.guides import GUIDES


@dataclass(frozen=True, kw_only=True)
class Presentation:
    name: str
    finding: Callable[[Mapping[str, Any]], str]
    guide: str

    def figures(self, result: Any, **kwargs: Any) -> dict:
        """{figure stem: Figure} of a Result of this family (its plots_<name> module's `figures`)."""
        return importlib.import_module(f"headscope.reports.plots_{self.name}").figures(result, **kwargs)


PRESENTATIONS: dict[str, Presentation] = {p.name: p for p in (  # one line per family, as registry.FAMILIES
    Presentation(name="heads", finding=findings.heads_finding, guide=GUIDES["heads"]),
    Presentation(name="attribution", finding=findings.attribution_finding, guide=GUIDES["attribution"]),
    Presentation(name="position", finding=findings.position_finding, guide=GUIDES["position"]),
    Presentation(name="patching", finding=findings.patching_finding, guide=GUIDES["patching"]),
    Presentation(name="mlp", finding=findings.mlp_finding, guide=GUIDES["mlp"]),
    Presentation(name="kv", finding=findings.kv_finding, guide=GUIDES["kv"]),
    Presentation(name="probes", finding=findings.probes_finding, guide=GUIDES["probes"]),
    Presentation(name="circuits", finding=findings.circuits_finding, guide=GUIDES["circuits"]),
)}


def presentation(name: str) -> Presentation | None:
    """The presentation of analysis `name` (None for a name no family has, e.g. an old report's folder)."""
    return PRESENTATIONS.get(name)


__all__ = ["PRESENTATIONS", "Presentation", "presentation"]
