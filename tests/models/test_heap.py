"""models/heap: freed CPU memory stays in the process, so a repeated pass does not page-fault.

The behaviour is measured in fresh processes (malloc settings are per process): the same torch
allocation pattern as a sweep's passes (a few multi-megabyte activations, all freed at the end
of the pass) counts its minor page faults with and without the settings.
"""
import os
import platform
import subprocess
import sys

import pytest

CHURN = """
import os, resource, sys
import torch
if os.environ.get("APPLY") == "1":
    from headscope.models import heap
    assert heap.keep_freed_memory()
torch.set_num_threads(1)

def one_pass():  # five 4 MiB activations, then all freed: 20 MiB free at the heap top
    acts = [torch.ones(1 << 20) for _ in range(5)]
    return sum(float(a[0]) for a in acts)

one_pass(); one_pass()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    one_pass()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(apply: bool) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.update(APPLY="1" if apply else "0", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHURN], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")
def test_repeated_passes_stop_page_faulting():
    default, kept = _faults(False), _faults(True)
    # glibc's defaults give the free heap top back and fault it in again: 3,000-13,000 pages
    # over the 20 passes in runs here; kept: 0
    assert default > 20 * 64
    assert kept <= default / 4


def test_opt_out_and_user_settings_leave_malloc_alone(monkeypatch):
    from headscope.models import heap

    for name, value in (("HEADSCOPE_KEEP_FREED_MEMORY", "0"), ("MALLOC_TOP_PAD_", "1048576")):
        with monkeypatch.context() as m:
            m.setattr(heap, "_state", {})
            m.setenv(name, value)
            called = []
            m.setattr(heap.ctypes, "CDLL", lambda *a, **k: called.append(a))
            assert heap.keep_freed_memory() is False
            assert not called
