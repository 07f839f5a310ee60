"""How many CPU threads torch uses: the cores that are free now, never more than exist.

torch starts one intra-op thread per core. On a machine that other jobs share, a parallel
region ends when its slowest thread does, so a thread queued behind another job's work stalls
every matmul: `headscope heads --quick` ran 6.8x longer with torch's default than with one
thread on a loaded 2-core VM. The rule, applied once per process by the CLI and load_model:

    usable  = CPUs in this process's affinity mask, at most the physical cores
    threads = max(1, usable - round(1-minute load average))     (load measured before our work)

The same count caps the BLAS and OpenMP pools that numpy, scipy and scikit-learn use (the
probes' logistic regressions; threadpoolctl): OpenBLAS's own default of one thread per core made
the default report's probes 7.6x slower (62 s against 8.2 s) on the same machine.

Overrides: HEADSCOPE_THREADS=N uses N threads; HEADSCOPE_THREADS=keep (or OMP_NUM_THREADS set
in the environment) leaves torch's and the BLAS libraries' settings alone.
"""
from __future__ import annotations

import os

ENV = "HEADSCOPE_THREADS"
_state: dict[str, int] = {}  # "threads": what configure_threads applied in this process


def choose_threads(*, cpus: int, physical: int | None, load: float) -> int:
    """The rule above for given machine facts (pure, for tests and docs)."""
    usable = max(1, min(cpus, physical or cpus))
    return max(1, usable - round(max(0.0, load)))


def machine_facts() -> dict[str, float | int | None]:
    """cpus (affinity), physical cores (psutil; None if unknown) and the 1-minute load average."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except Exception:  # psutil missing or unable to read the topology
        physical = None
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on this platform
        load = 0.0
    return {"cpus": cpus, "physical": physical, "load": load}


def configure_threads() -> int | None:
    """Set torch's intra-op threads by the rule (once per process); returns the count applied, or
    None when the environment asks to keep torch's own setting."""
    import torch

    if "threads" in _state:
        return _state["threads"]
    wanted = os.environ.get(ENV, "").strip().lower()
    if wanted == "keep" or (not wanted and os.environ.get("OMP_NUM_THREADS")):
        return None
    threads = int(wanted) if wanted.isdigit() and int(wanted) > 0 else choose_threads(**machine_facts())
    torch.set_num_threads(threads)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads)  # numpy/scipy BLAS and OpenMP, for this process
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        pass
    _state["threads"] = threads
    return threads
