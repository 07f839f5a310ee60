"""The folders on disk and the package list in pyproject.toml agree; nothing installs bare names;
the install is an editable one of this checkout that sees new modules; imports only go one way."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

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


# ---- the editable install ----------------------------------------------------------------------
def test_install_is_an_editable_install_of_this_checkout(tmp_path):
    """The README installs with `pip install -e`; the tests below rely on it, so anything else fails.
    Read from outside the repo: at its root, setuptools' headscope.egg-info would answer instead."""
    code = "import importlib.metadata as m; print(m.distribution('headscope').read_text('direct_url.json') or '{}')"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    direct = json.loads(out.stdout)
    assert direct.get("dir_info", {}).get("editable"), (
        f"headscope is not installed editable (direct_url.json: {direct}); run the README's "
        f'`pip install -e ".[test,minilm]"` in this checkout.'
    )
    url = urlparse(direct["url"])
    assert url.scheme == "file" and Path(unquote(url.path)).resolve() == ROOT, (
        f"headscope is an editable install of {direct['url']}, not of this checkout {ROOT}."
    )


def test_a_new_module_is_importable_without_reinstalling(tmp_path):
    """Lenient (default) editable mode maps each package to its folder, so a module written into an
    existing package folder imports at once; strict mode would need a reinstall."""
    name = f"_probe_{uuid.uuid4().hex[:12]}"
    probe = ROOT / "analyses" / "core" / f"{name}.py"
    code = (
        f"import headscope.analyses.core.{name} as m, headscope; "
        "print(m.TOKEN); print(m.__file__); print(headscope.__file__)"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # leave no .pyc of the probe behind
    try:
        probe.write_text(f"TOKEN = {name!r}\n")
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
        )
    finally:
        probe.unlink(missing_ok=True)
    assert out.returncode == 0, f"a new module under analyses/core/ is not importable without a reinstall:\n{out.stderr}"
    token, module_file, package_file = out.stdout.split()
    assert token == name
    assert Path(module_file).resolve() == probe.resolve()
    assert Path(package_file).resolve() == (ROOT / "src" / "headscope" / "__init__.py").resolve()


# ---- imports go one way: models -> hooks -> execution -> analyses -> reports -------------------------
# A module of layer i may import headscope modules of layers <= i only. headscope.errors and
# headscope.version are the bottom; probes sits at the analyses level but below it (analyses may
# import probes, probes nothing of analyses); the root package (__init__, cli, __main__) is the top.
LAYERS = {"errors": 0, "version": 0, "models": 1, "hooks": 2, "execution": 3, "probes": 4, "analyses": 5, "reports": 6}
TOP_LAYER = 7


def _layer(module: str) -> int | None:
    """The layer of a dotted headscope module name (None outside headscope)."""
    parts = module.split(".")
    if parts[0] != "headscope":
        return None
    return LAYERS.get(parts[1], TOP_LAYER) if len(parts) > 1 else TOP_LAYER


def _source_modules():
    """(path, dotted module name, package parts) of every module of the installed packages."""
    roots = [(ROOT / top, ["headscope", top]) for top in TOP_LEVEL] + [(ROOT / "src" / "headscope", ["headscope"])]
    for folder, prefix in roots:
        for path in sorted(folder.rglob("*.py")):
            parts = [*prefix, *path.relative_to(folder).with_suffix("").parts]
            package = parts[:-1]
            if parts[-1] == "__init__":
                parts = package
            yield path, ".".join(parts), package


def _imported(node: ast.AST, package: list[str]) -> list[str]:
    """Dotted names one node imports: import statements at any depth (function-level, lazy ones too)
    and importlib.import_module calls whose name is a literal or an f-string with a literal prefix."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: resolved against the importing module's package
            base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
        # `from headscope import errors` imports the module headscope.errors; other names come from __init__
        return [f"{base}.{alias.name}" if base == "headscope" else base for alias in node.names]
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        arg = node.args[0]
        if called == "import_module":
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                return [arg.value]
            if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                prefix = str(arg.values[0].value).rsplit(".", 1)[0]  # the complete dotted part
                return [prefix] if "." in prefix else []
    return []


def _import_violations() -> list[str]:
    """One line, `path:line: module (layer a) imports target (layer b)`, per upward import."""
    found = []
    for path, module, package in _source_modules():
        own = _layer(module)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, package):
                layer = _layer(target)
                if layer is not None and layer > own:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.append(f"{where}: {module} (layer {own}) imports {target} (layer {layer})")
    return found


def test_the_layer_table_covers_every_package_folder():
    assert set(TOP_LEVEL) <= set(LAYERS)
    names = {path.stem for path in (ROOT / "src" / "headscope").glob("*.py")}
    assert names - {"__init__", "__main__", "cli"} <= {"errors", "version"}, "a new root module needs a layer"


def test_the_import_scan_sees_lazy_relative_and_dynamic_imports():
    code = """
import headscope.hooks
def f(name):
    from headscope.reports import plots
    from ..core import tasks
    from headscope import errors, Task
    importlib.import_module(f"headscope.reports.plots_{name}")
"""
    package = ["headscope", "analyses", "heads"]
    found = [t for node in ast.walk(ast.parse(code)) for t in _imported(node, package)]
    assert sorted(found) == sorted([
        "headscope.hooks", "headscope.reports", "headscope.analyses.core", "headscope.errors", "headscope.Task",
        "headscope.reports",
    ])
    assert [_layer(t) for t in ("headscope.errors", "headscope.Task", "headscope", "numpy")] == [0, TOP_LAYER, TOP_LAYER, None]


def test_imports_only_go_one_way():
    """Every upward import, lazy ones included, is listed at once."""
    violations = _import_violations()
    assert not violations, "imports against the layering:\n" + "\n".join(violations)


def test_the_long_files_that_run_first_exist():
    """conftest.LONG_FILES orders pytest-xdist's work; a renamed file would silently drop out of it."""
    from conftest import LONG_FILES

    assert [p for p in LONG_FILES if not (ROOT / p).is_file()] == []
