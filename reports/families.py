"""How each analysis family is presented: the reports layer's record of a family, found from its name.

An analysis family's record (analyses/core/family.py, analyses/<name>/__init__.py FAMILY) holds
what it computes; its presentation lives in ONE module of this layer, reports/plots_<name>.py:
`figures(result) -> {stem: Figure}`, `finding(summary) -> str` (its headline in words, built from
reports/findings.py's shared helpers), `CAPTIONS` ({figure stem: caption}, optionally
`PREFIX_CAPTIONS` for figures named <prefix><site>, and `caption_for(stem, summary)` for a caption that
depends on the run's summary) and `GUIDE` (how to read its section). Nothing
here lists the families: they are the registry's (analyses/core/registry.py FAMILIES), so adding
one is its analyses folder, its plots module and its line in FAMILIES. The analyses layer never
imports this (tests/test_layout.py); a registered family whose plots module is missing or lacks
one of those names fails loudly (PresentationError), never as a section without a headline.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

REQUIRED = ("figures", "finding", "CAPTIONS", "GUIDE")  # what a family's plots module must define
EXTRA_CAPTIONS = ("headscope.reports.plots_attention",)  # figures of the report that no family draws


class PresentationError(ImportError):
    """A registered family whose presentation module (reports/plots_<name>.py) is missing or incomplete:
    a developer's error in adding a family, not a user's input."""


@dataclass(frozen=True, kw_only=True)
class Presentation:
    name: str
    finding: Callable[[Mapping[str, Any]], str]
    guide: str
    captions: Mapping[str, str]
    prefix_captions: Mapping[str, str] = field(default_factory=dict)
    figures: Callable[..., dict]  # figures(result, **kwargs) -> {figure stem: Figure}
    chance_sentence: Callable[..., str] | None = None  # (chance entry, summary) -> the opening at chance, if its own
    caption_for: Callable[[str, Mapping[str, Any] | None], str | None] | None = None  # a summary's own caption of a stem
    guide_for: Callable[[Mapping[str, Any]], str] | None = None  # a summary's own guide, where the run changes it


def names() -> tuple[str, ...]:
    """The registered families, in the report's order (analyses/core/registry.py FAMILIES)."""
    from headscope.analyses.core.registry import FAMILIES

    return FAMILIES


def module_name(name: str) -> str:
    return f"headscope.reports.plots_{name}"


def _module(name: str) -> ModuleType:
    try:
        module = importlib.import_module(module_name(name))
    except ModuleNotFoundError as err:
        if err.name != module_name(name):  # a broken import inside the module: its own error
            raise
        raise PresentationError(f"Analysis family {name!r} is registered but has no presentation module "
                                f"reports/plots_{name}.py (defining {', '.join(REQUIRED)}).") from err
    missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
    if missing:
        raise PresentationError(f"reports/plots_{name}.py, the presentation of analysis family {name!r}, "
                                f"does not define {', '.join(missing)}.")
    return module


@functools.cache
def presentation(name: str) -> Presentation | None:
    """The presentation of analysis `name`, read from reports/plots_<name>.py (None for a name no family
    has, e.g. an old report's folder); PresentationError for a registered family without a complete one."""
    if name not in names():
        return None
    module = _module(name)
    return Presentation(name=name, finding=module.finding, guide=module.GUIDE, captions=module.CAPTIONS,
                        prefix_captions=getattr(module, "PREFIX_CAPTIONS", {}), figures=module.figures,
                        chance_sentence=getattr(module, "chance_sentence", None),
                        caption_for=getattr(module, "caption_for", None), guide_for=getattr(module, "guide_for", None))


def presentations() -> dict[str, Presentation]:
    """{name: Presentation} of every registered family, in the report's order."""
    return {name: presentation(name) for name in names()}


@functools.cache
def captions() -> dict[str, str]:
    """{figure stem: caption} over every family's CAPTIONS and the report's own figures (the top heads'
    patterns); a stem two modules both caption is an error, as one of them would be shown wrongly."""
    out: dict[str, str] = {}
    sources = [(f"reports/plots_{n}.py", p.captions) for n, p in presentations().items()]
    sources += [(m.split(".")[-1], importlib.import_module(m).CAPTIONS) for m in EXTRA_CAPTIONS]
    for where, found in sources:
        clash = set(out) & set(found)
        if clash:
            raise PresentationError(f"{where} captions figure stem(s) {sorted(clash)} that another module captions.")
        out.update(found)
    return out


@functools.cache
def prefix_captions() -> dict[str, str]:
    """{figure-stem prefix: caption} over every family's PREFIX_CAPTIONS (patching's exact_<site>, ...)."""
    return {prefix: text for p in presentations().values() for prefix, text in p.prefix_captions.items()}


__all__ = ["Presentation", "PresentationError", "captions", "names", "prefix_captions", "presentation", "presentations"]
