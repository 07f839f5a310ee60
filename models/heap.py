"""Keep freed CPU memory in the process, so repeated passes of a sweep do not page-fault it back.

glibc's malloc serves blocks above a threshold with mmap and hands the free top of its heap
back to the OS once more than a trim threshold sits there. A sweep allocates and frees the
same megabyte-sized activations on every pass (stacked copies make them large), so each pass
then takes a page fault per 4 KiB it touches: about 25,000 minor faults per ablation sweep of
32 examples on the zoo model, a quarter of its time (benchmarks/heads.py). Raising both
thresholds and keeping some slack at the heap top makes the freed memory serve the next pass.

Applied once per process when a model is on the CPU (HookedModel), on Linux with glibc only;
a process-wide setting. Each malloc arena then keeps up to TRIM_THRESHOLD bytes free at its
heap top instead of returning them (freed blocks below a live one were never returned
anyway). Set HEADSCOPE_KEEP_FREED_MEMORY=0 to leave malloc alone; settings the user made
through MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_ or
glibc.malloc tunables (GLIBC_TUNABLES) are left as they are. A preloaded allocator (jemalloc,
tcmalloc) ignores them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import sys

log = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20  # blocks below this size come from the heap (glibc's own dynamic cap)
TRIM_THRESHOLD = 128 << 20  # free bytes at the heap top kept before any go back to the OS
TOP_PAD = 64 << 20  # slack requested with each heap growth and kept when trimming
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_state: dict[str, bool] = {}


def keep_freed_memory() -> bool:
    """Apply the settings once per process; True when they are in force, False where skipped
    (not glibc, HEADSCOPE_KEEP_FREED_MEMORY=0, or the user's own malloc settings)."""
    if "applied" not in _state:
        _state["applied"] = _apply()
    return _state["applied"]


def _apply() -> bool:
    if os.environ.get("HEADSCOPE_KEEP_FREED_MEMORY", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if any(os.environ.get(name) for name in USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:  # a speed setting: whatever goes wrong here must not stop a model from loading
        if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
            return False
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        ok = all(mallopt(param, value) == 1 for param, value in
                 ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
    except Exception as err:  # noqa: BLE001
        log.debug("malloc settings not applied: %s", err)
        return False
    log.debug("malloc keeps freed memory: %s", ok)
    return ok
