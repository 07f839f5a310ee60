"""The shipped zoo models: which exist, where they are, and a one-line description of each.

A model is shipped when checkpoints/<name>/ holds a config.json and a card.json.
"""
from __future__ import annotations

import json
from pathlib import Path

from headscope.errors import UnknownZooModelError

ZOO_DIR = Path(__file__).parent / "checkpoints"



def available() -> list[str]:
    """Names of the shipped zoo models, sorted."""
    if not ZOO_DIR.is_dir():
        return []
    return sorted(
        p.name for p in ZOO_DIR.iterdir()
        if p.is_dir() and (p / "config.json").is_file() and (p / "card.json").is_file()
    )


def checkpoint_dir(name: str) -> Path:
    """Directory of zoo model `name` ("synth-llama" or "zoo/synth-llama")."""
    short = name.removeprefix("zoo/")
    names = available()
    if short not in names:
        listed = ", ".join(names) if names else "none (no checkpoints are shipped)"
        raise UnknownZooModelError(f"unknown zoo model {name!r}; available zoo models: {listed}")
    return ZOO_DIR / short


def card(name: str) -> dict:
    """The model's card.json as a dict."""
    return json.loads((checkpoint_dir(name) / "card.json").read_text())


def describe() -> list[dict]:
    """One row per shipped model: name, architecture, layers x heads, params, accuracies."""
    rows = []
    for name in available():
        c = card(name)
        m = c["model"]
        rows.append({
            "name": f"zoo/{name}",
            "architecture": c["hf_class"],
            "layers_x_heads": f"{m['n_layers']}x{m['n_heads']}",
            "params": c["params"],
            **{f"acc_{t}": a for t, a in c["accuracy"].items()},
        })
    return rows


def format_rows(rows: list[dict]) -> list[str]:
    """Plain-text lines for `headscope zoo list`, one per model."""
    lines = []
    for r in rows:
        accs = " ".join(f"{k.removeprefix('acc_')}={v:.1%}" for k, v in r.items() if k.startswith("acc_"))
        lines.append(
            f"{r['name']:<18} {r['architecture']:<18} {r['layers_x_heads']:>5}  "
            f"{r['params'] / 1e6:5.2f}M params  {accs}"
        )
    return lines
