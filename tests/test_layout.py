"""The folders on disk and the package list in pyproject.toml agree; nothing installs bare names."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("models", "hooks", "execution", "analyses", "probes", "reports")


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_declared_and_vice_versa():
    cfg = _pyproject()
    declared = set(cfg["packages"])
    dirs = cfg["package-dir"]
    on_disk = {"headscope"}
    for top in TOP_LEVEL:
        assert dirs[f"headscope.{top}"] == top
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            on_disk.add(".".join(["headscope", top, *rel.parts]))
    assert dirs["headscope"] == "src/headscope"
    assert declared == on_disk


def test_top_level_folders_install_as_headscope_subpackages():
    for top in TOP_LEVEL:
        spec = importlib.util.find_spec(f"headscope.{top}")
        assert spec is not None and Path(spec.origin).resolve().parent == (ROOT / top).resolve()


def test_no_bare_top_level_modules_are_importable(tmp_path):
    # A fresh interpreter outside the repo, so the checkout itself is not on sys.path.
    code = "import importlib.util as u; print([n for n in %r if u.find_spec(n) and %r in (u.find_spec(n).origin or '')])"
    out = subprocess.run(
        [sys.executable, "-c", code % (TOP_LEVEL, str(ROOT))], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_no_headscope_folder_shadows_the_package_at_the_root():
    assert not (ROOT / "headscope").exists()
