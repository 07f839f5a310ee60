"""Each family's presentation record in the reports layer (reports/families.py, #33 item 1)."""
from __future__ import annotations

from headscope.analyses.core import registry


def test_every_family_has_its_presentation_in_reports():
    """The reports layer's record of each family (reports/families.py): its finding, guide and figures
    module; a registered family without one would give a section with no headline, guide or figure."""
    import importlib

    from headscope.reports.families import PRESENTATIONS

    assert list(PRESENTATIONS) == list(registry.FAMILIES)  # the report's order
    for name, shown in PRESENTATIONS.items():
        assert shown.guide.strip() and callable(shown.finding)
        assert callable(importlib.import_module(f"headscope.reports.plots_{name}").figures)
