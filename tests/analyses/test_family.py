"""Family records (#33 item 1): each analysis family declares one FAMILY, and the registry, the public
API and the report read it; a folder under analyses/ with a FAMILY is listed, and nothing else is."""
from __future__ import annotations

import ast
from pathlib import Path

import headscope as hs
from headscope.analyses.core import registry
from headscope.analyses.core.config import AnalysisConfig

ANALYSES_DIR = Path(__file__).resolve().parents[2] / "analyses"


def _declares_family(folder: Path) -> bool:
    init = folder / "__init__.py"
    tree = ast.parse(init.read_text()) if init.is_file() else ast.Module(body=[], type_ignores=[])
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FAMILY" for t in node.targets)
               for node in tree.body)


def test_every_family_folder_is_registered_by_its_record():
    on_disk = sorted(p.name for p in ANALYSES_DIR.iterdir() if p.is_dir() and _declares_family(p))
    assert on_disk == sorted(registry.FAMILIES)  # adding a family: its folder with FAMILY, and its line in FAMILIES
    for name in registry.FAMILIES:
        record = registry.family(name)
        assert record.name == name and issubclass(record.config, AnalysisConfig)
        assert record.run.__module__.startswith(f"headscope.analyses.{name}.")
        assert record.judges_model == (name not in ("position", "probes"))  # the two that build their own data
        for api in record.api:  # the public API's lazy names come from the record
            assert getattr(hs, api) is getattr(__import__(f"headscope.analyses.{name}", fromlist=[api]), api)

