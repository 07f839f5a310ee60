"""`python -m headscope ARGS` for torchrun, with rank 0 working in one folder and every other rank
in another, so a test can check that only rank 0 writes files.

    torchrun --nproc_per_node=2 tests/distributed_cli.py RANK0_DIR OTHERS_DIR report --out out ...
"""
import os
import runpy
import sys

if __name__ == "__main__":
    os.chdir(sys.argv[1] if os.environ.get("RANK", "0") == "0" else sys.argv[2])
    sys.argv = ["headscope", *sys.argv[3:]]
    runpy.run_module("headscope", run_name="__main__", alter_sys=True)
