"""Entry points behind `headscope zoo train NAME` and `headscope zoo list`.

The root CLI (headscope.cli) parses arguments and calls these two functions; their return values
(the checkpoint folder, the printed lines) are for Python callers, never exit statuses: the CLI
exits 0 after either returns.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from headscope.errors import ConfigError
from headscope.models.zoo import registry
from headscope.models.zoo.recipes import RECIPES

log = logging.getLogger(__name__)


def train_main(
    name: str, out: str | Path | None = None, seed: int = 0, steps: int | None = None,
    quiet: bool = False, threads: int | None = None,
) -> Path:
    """Train zoo model `name` from its recipe and write the checkpoint; returns its directory.

    out defaults to the packaged checkpoints/<name>; steps defaults to the recipe's; threads
    to the recipe's (None: torch's default).
    """
    from headscope.models.zoo import card, train

    short = name.removeprefix("zoo/")
    if short not in RECIPES:
        raise registry.UnknownZooModelError(
            f"unknown zoo recipe {name!r}; available recipes: {', '.join(sorted(RECIPES))}"
        )
    recipe = RECIPES[short]
    cfg = recipe.train
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**32 - 1:  # numpy's seed range
        raise ConfigError(f"seed must be an integer from 0 to {2**32 - 1}, got {seed!r}")
    if steps is not None:
        if steps < 1:
            raise ConfigError(f"steps must be >= 1, got {steps}")
        cfg = replace(cfg, steps=steps)
    if threads is not None:
        cfg = replace(cfg, threads=threads)
    out_dir = Path(out) if out is not None else registry.ZOO_DIR / short
    command = f"headscope zoo train {short} --seed {seed}" + (f" --steps {steps}" if steps is not None else "")
    log.info("training %s (%s) for %d steps, seed %d -> %s", short, recipe.model.arch, cfg.steps, seed, out_dir)
    result = train.train(recipe.model, cfg, seed=seed, progress=not quiet)
    info = card.save_checkpoint(result, replace(recipe, train=cfg), out_dir, seed=seed, steps=cfg.steps,
                                command=command)
    log.info("saved %s: %s", out_dir, info["accuracy"])
    return out_dir


def list_main() -> list[str]:
    """Print one line per shipped zoo model and return the lines."""
    lines = registry.format_rows(registry.describe())
    if not lines:
        lines = ["no zoo models are shipped (train one with `headscope zoo train NAME`)"]
    for line in lines:
        print(line)
    return lines
