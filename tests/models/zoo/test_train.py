"""A short training run on a tiny config lowers the loss and is deterministic for a seed."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from headscope.models.zoo import train

TINY_MODEL = {
    "llama": train.ModelConfig(arch="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, d_mlp=64, max_positions=64),
    "gpt2": train.ModelConfig(arch="gpt2", n_layers=2, n_heads=4, d_model=32, d_mlp=64, max_positions=64),
}
TINY_TRAIN = train.TrainConfig(
    steps=150, lr=3e-3, warmup=20, kv_tokens=96, kv_pairs=(2, 4), kv_curriculum_start=2,
    kv_curriculum_steps=50, kv_queries=2, induction_tokens=96, induction_lengths=(4, 8),
    facts_batch=16, ioi_batch=8, eval_every=1000, eval_examples=16, threads=1,
)


def _losses(result: train.TrainResult) -> np.ndarray:
    return np.array([r["loss"] for r in result.history if r["kind"] == "train"])


@pytest.fixture(scope="module")
def runs():
    return {arch: train.train(cfg, TINY_TRAIN, seed=0, progress=False) for arch, cfg in TINY_MODEL.items()}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_short_run_lowers_the_loss(runs, arch):
    losses = _losses(runs[arch])
    assert len(losses) == TINY_TRAIN.steps
    assert losses[-20:].mean() < 0.8 * losses[:20].mean()


def test_deterministic_for_a_seed(runs):
    again = train.train(TINY_MODEL["llama"], TINY_TRAIN, seed=0, progress=False)
    np.testing.assert_array_equal(_losses(again), _losses(runs["llama"]))
    for p, q in zip(again.model.parameters(), runs["llama"].model.parameters()):
        assert torch.equal(p, q)


def test_different_seed_gives_a_different_model(runs):
    short = replace(TINY_TRAIN, steps=5)
    a = train.train(TINY_MODEL["llama"], short, seed=1, progress=False)
    assert not np.array_equal(_losses(a), _losses(runs["llama"])[:5])


def test_learning_rate_schedule_warms_up_and_decays():
    cfg = train.TrainConfig(steps=1000, lr=1e-3, warmup=100, min_lr_ratio=0.1)
    assert train.lr_at(0, cfg) == pytest.approx(1e-5)
    assert train.lr_at(99, cfg) == pytest.approx(1e-3)
    assert train.lr_at(999, cfg) == pytest.approx(1e-4, rel=1e-2)


def test_unknown_arch_is_rejected():
    with pytest.raises(ValueError, match="llama"):
        train.build_model(train.ModelConfig(arch="bert"), seed=0)


def test_induction_warmup_trains_induction_alone_then_the_mixture():
    """During the warm-up only the induction loss is optimised, and its total is that loss; the
    kv curriculum starts at its first size when the mixture begins."""
    cfg = replace(TINY_TRAIN, steps=8, induction_warmup=5, kv_curriculum_steps=3)
    rows = [r for r in train.train(TINY_MODEL["gpt2"], cfg, seed=0, progress=False).history if r["kind"] == "train"]
    for r in rows[:5]:
        assert set(k for k in r if k.startswith("loss_")) == {"loss_induction"}
        assert r["loss"] == pytest.approx(r["loss_induction"])
    for r in rows[5:]:
        assert {"loss_kv", "loss_induction", "loss_facts", "loss_ioi"} <= set(r)
    assert rows[5]["kv_max_pairs"] == cfg.kv_curriculum_start
