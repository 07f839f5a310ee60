"""Family: the one record an analysis family declares (analyses/<name>/__init__.py's FAMILY).

Everything headscope needs to know about a family, in one place: its report name, `run(model,
task=None, config=None) -> Result`, its config class (an AnalysisConfig), what it needs from a task
and a model (contract.Needs), its cost model (budget.CostModel, from its cost.py), how it resolves
its Task (`default_task(model, task, config) -> Task`: the user's task or, for None, its default
for this kind of model; None where the family builds its own data, position's sweeps and probes'
labelled rows, and so is handed the user's task as given), which parts of a task it reads (`reads`:
its section's provenance names the parts it leaves unused and the metric it scores, e.g. on
encoders) and the names `headscope` exports from it.
The registry (analyses/core/registry.py) lists the families by name and reads their records; the
presentation (figures, finding, captions, guide) is the reports layer's module of the same name,
reports/plots_<name>.py (found by reports/families.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Family:
    name: str
    run: Callable[..., Any]
    config: type
    needs: Any  # contract.Needs
    cost: Any  # budget.CostModel
    default_task: Callable[..., Any] | None = None
    reads: Callable[..., Any] | None = None  # (model, config, summary) -> contract.Reads; None: Reads(corrupted=needs.corrupted)
    api: tuple[str, ...] = ()  # the public names `import headscope` offers (lazily) from this family

    @property
    def judges_model(self) -> bool:
        """Whether the family judges the model on a Task it resolves (default_task) rather than on data it
        builds itself (position, probes: a probe, not the model, is judged)."""
        return self.default_task is not None


__all__ = ["Family"]
