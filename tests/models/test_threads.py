"""models/threads: the thread rule, worked by hand, and its overrides."""
import torch

from headscope.models import threads


def test_rule_leaves_the_busy_cores_to_the_other_jobs():
    assert threads.choose_threads(cpus=2, physical=2, load=0.1) == 2  # idle 2-core machine
    assert threads.choose_threads(cpus=2, physical=2, load=1.2) == 1  # one core busy elsewhere
    assert threads.choose_threads(cpus=2, physical=2, load=3.0) == 1  # never below one
    assert threads.choose_threads(cpus=16, physical=8, load=2.4) == 6  # hyper-threads do not count
    assert threads.choose_threads(cpus=4, physical=8, load=0.0) == 4  # an affinity mask of 4 CPUs
    assert threads.choose_threads(cpus=4, physical=None, load=0.6) == 3  # topology unknown


def test_overrides(monkeypatch):
    before = torch.get_num_threads()
    try:
        for env, expected in (({"HEADSCOPE_THREADS": "keep"}, None), ({"OMP_NUM_THREADS": "1"}, None),
                              ({"HEADSCOPE_THREADS": "1"}, 1)):
            with monkeypatch.context() as m:
                m.setattr(threads, "_state", {})
                m.delenv("HEADSCOPE_THREADS", raising=False)
                m.delenv("OMP_NUM_THREADS", raising=False)
                for k, v in env.items():
                    m.setenv(k, v)
                assert threads.configure_threads() == expected
                if expected is not None:
                    assert torch.get_num_threads() == expected
        with monkeypatch.context() as m:  # the rule, from this machine's facts
            m.setattr(threads, "_state", {})
            m.delenv("HEADSCOPE_THREADS", raising=False)
            m.delenv("OMP_NUM_THREADS", raising=False)
            facts = {"cpus": 2, "physical": 2, "load": 1.0}
            m.setattr(threads, "machine_facts", lambda: facts)
            assert threads.configure_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_blas_pools_get_the_same_count(monkeypatch):
    """numpy's BLAS (what scikit-learn's probes run on) is capped with torch, read back through threadpoolctl."""
    import numpy  # noqa: F401 - loads the BLAS library threadpoolctl reports
    from threadpoolctl import threadpool_info, threadpool_limits

    before = torch.get_num_threads()
    with threadpool_limits(limits=2, user_api="blas"):  # 2 to start with; every pool's count restored on exit
        assert {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"} == {2}
        try:
            with monkeypatch.context() as m:
                m.setattr(threads, "_state", {})
                m.delenv("OMP_NUM_THREADS", raising=False)
                m.setenv("HEADSCOPE_THREADS", "1")
                assert threads.configure_threads() == 1
            blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
            assert blas and set(blas) == {1}
        finally:
            torch.set_num_threads(before)
