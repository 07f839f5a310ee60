"""The training recipes of the shipped zoo models: name -> (architecture, training config).

`headscope zoo train NAME` runs exactly these, so a checkpoint can be rebuilt from its name and
seed. They train on one CPU thread (threads=1): matmul results can depend on the thread count,
so a fixed count is what makes a rerun bit-identical.
"""
from __future__ import annotations

from dataclasses import dataclass

from headscope.models.zoo.train import ModelConfig, TrainConfig


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    description: str
    model: ModelConfig
    train: TrainConfig
    seed: int = 0


RECIPES: dict[str, Recipe] = {
    "synth-llama": Recipe(
        name="synth-llama",
        description="Llama-style (RoPE, RMSNorm, SwiGLU, grouped-query attention with 2 KV heads); "
        "headscope's default model",
        model=ModelConfig(arch="llama", n_layers=4, n_heads=8, n_kv_heads=2, d_model=128, d_mlp=256),
        train=TrainConfig(steps=3000, lr=3e-3, warmup=150, kv_curriculum_steps=1000,
                          kv_tokens=1200, induction_tokens=1200, threads=1),
    ),
    "synth-gpt2": Recipe(
        name="synth-gpt2",
        description="GPT-2 style (learned positions, initialised sinusoidal; LayerNorm, GELU MLP)",
        model=ModelConfig(arch="gpt2", n_layers=4, n_heads=8, d_model=128, d_mlp=256,
                          position_init="sinusoidal"),
        train=TrainConfig(steps=4800, lr=1e-3, warmup=150, induction_warmup=1800, kv_curriculum_steps=1000,
                          kv_tokens=1200, induction_tokens=1200, threads=1),
    ),
}
