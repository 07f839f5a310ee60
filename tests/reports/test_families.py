"""Each family's presentation in the reports layer: one module per family, reports/plots_<name>.py, found
from the registry's names (reports/families.py, #33 item 1)."""
from __future__ import annotations

import sys
import types

import pytest

from headscope.analyses.core import registry
from headscope.reports import families, findings


def test_every_registered_family_is_presented_by_its_own_plots_module():
    """The report's order is the registry's, and each family's finding, guide, captions and figures are
    its plots_<name> module's own: a registered family without them would give a section with no
    headline, guide or figure."""
    import importlib

    shown = families.presentations()
    assert list(shown) == list(registry.FAMILIES)
    for name, p in shown.items():
        module = importlib.import_module(f"headscope.reports.plots_{name}")
        assert p.finding is module.finding and p.figures is module.figures
        assert p.guide == module.GUIDE and p.guide.strip() and p.captions is module.CAPTIONS and module.CAPTIONS
    assert families.presentation("not_a_family") is None  # an old report's folder: no section text, no error


def test_every_caption_lives_in_exactly_one_module():
    """findings.caption reads each stem from the module that draws it; no two modules caption one stem."""
    per_module = [p.captions for p in families.presentations().values()]
    from headscope.reports import plots_attention

    per_module.append(plots_attention.CAPTIONS)
    assert sum(len(c) for c in per_module) == len(families.captions()) == len(findings.CAPTIONS)
    assert findings.caption("top_attention") == plots_attention.CAPTIONS["top_attention"]
    from headscope.reports import plots_patching

    assert findings.caption("exact_head_out") == plots_patching.PREFIX_CAPTIONS["exact_"] + "Site: head out."


def test_the_old_finding_names_still_import_from_findings():
    from headscope.reports import plots_heads, plots_probes
    from headscope.reports.findings import heads_finding, probes_finding

    assert heads_finding is plots_heads.finding and probes_finding is plots_probes.finding
    with pytest.raises(AttributeError, match="nosuch_finding"):
        findings.nosuch_finding  # noqa: B018


def test_a_registered_family_without_a_complete_plots_module_is_a_clear_error(monkeypatch):
    """Adding a family to FAMILIES without its presentation fails loudly, naming the file and what is missing."""
    monkeypatch.setattr(registry, "FAMILIES", (*registry.FAMILIES, "zz_missing", "zz_partial"))
    partial = types.ModuleType("headscope.reports.plots_zz_partial")
    partial.figures, partial.finding = (lambda result: {}), (lambda s: "")
    monkeypatch.setitem(sys.modules, partial.__name__, partial)
    with pytest.raises(families.PresentationError, match=r"'zz_missing' is registered but has no presentation "
                                                          r"module reports/plots_zz_missing\.py"):
        families.presentation("zz_missing")
    with pytest.raises(families.PresentationError, match=r"plots_zz_partial\.py.* does not define CAPTIONS, GUIDE\.$"):
        families.presentation("zz_partial")
