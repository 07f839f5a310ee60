"""models/heap: freed CPU memory stays in the process, so a repeated pass does not page-fault.

Measured in fresh processes (malloc settings are per process) on a pass-like churn: five 4 MiB
activations allocated, then all freed, 20 times; the median pass's faults are compared (a single
pass can fault once more, e.g. 2048 pages when a new malloc arena is set up). Each process first fixes glibc's mmap
threshold at its 128 KiB default (turning off the dynamic threshold, which otherwise settles
by itself after a few passes at a point that varies from run to run), so without the settings
every pass maps its activations afresh and faults them in; keep_freed_memory must override it.
"""
import os
import platform
import subprocess
import sys

import pytest

CHURN = """
import ctypes, os, resource
import torch
assert ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10) == 1  # M_MMAP_THRESHOLD: glibc's starting value, fixed
if os.environ["APPLY"] == "1":
    from headscope.models import heap
    assert heap.keep_freed_memory()
torch.set_num_threads(1)

def one_pass():
    acts = [torch.ones(1 << 20) for _ in range(5)]  # 4 MiB each
    return sum(float(a[0]) for a in acts)

one_pass(); one_pass()
faults = []
for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    one_pass()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(faults)[len(faults) // 2])  # the median pass: a one-off burst (a thread's arena, 8 MiB) does not count
"""


def _faults(apply: bool) -> int:
    """Minor page faults of the median pass of the churn, in a fresh process."""
    drop = ("LD_PRELOAD", "GLIBC_TUNABLES", "HEADSCOPE_KEEP_FREED_MEMORY")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in drop}
    env.update(APPLY="1" if apply else "0", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHURN], env=env, capture_output=True, text=True, check=True,
                         timeout=300)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="the settings are glibc's")
def test_repeated_passes_stop_page_faulting():
    default, kept = _faults(False), _faults(True)
    assert default > 4096  # every pass faults its 20 MiB (5120 pages) in again
    assert kept < 64  # the heap keeps the freed activations: (next to) no faults


def test_opt_out_and_user_settings_leave_malloc_alone(monkeypatch):
    from headscope.models import heap

    for name, value in (("HEADSCOPE_KEEP_FREED_MEMORY", "0"), ("MALLOC_TOP_PAD_", "1048576"),
                        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")):
        with monkeypatch.context() as m:
            m.setattr(heap, "_state", {})
            m.setenv(name, value)
            called = []
            m.setattr(heap.ctypes, "CDLL", lambda *a, called=called, **k: called.append(a))
            assert heap.keep_freed_memory() is False
            assert not called
