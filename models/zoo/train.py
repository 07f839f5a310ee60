"""Train a zoo model from scratch on the mixture of the four synthetic tasks.

One step = one batch of each task (kv, induction, facts, ioi), each with its own length, and
the sum of their mean next-token losses over the supervised positions. Within a step all kv rows
have the same number of pairs and all induction rows the same length (no padding), and the
number of rows fills a token budget, so every step costs about the same. kv uses a curriculum
over the number of pairs (the largest n grows linearly to its maximum). AdamW with linear
warm-up and cosine decay. Deterministic for a seed (and a thread count): torch.manual_seed for
the initialisation, one numpy Generator per task for the data, torch's deterministic algorithms.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from headscope.errors import ConfigError
from headscope.models.zoo import batches, evaluate, vocab

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture. `arch` is "llama" (RoPE, RMSNorm, SwiGLU, GQA) or "gpt2" (learned
    positions, LayerNorm, GELU)."""

    arch: str = "llama"
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2  # llama only
    d_model: int = 128
    d_mlp: int = 512
    max_positions: int = 128
    position_init: str = "normal"  # gpt2 only: "normal" (HF default) or "sinusoidal" (still learned)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation and data mixture."""

    steps: int = 6000
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    kv_tokens: int = 1600  # tokens per kv batch: rows = kv_tokens // row length
    kv_pairs: tuple[int, int] = (2, 24)  # range of the number of pairs at the end of the curriculum
    kv_curriculum_start: int = 4  # largest n at step 0
    kv_curriculum_steps: int = 2000  # steps until the largest n reaches kv_pairs[1]
    kv_queries: int = 8
    induction_tokens: int = 1600  # tokens per induction batch
    induction_lengths: tuple[int, int] = (8, 40)
    facts_batch: int = 64
    ioi_batch: int = 32
    loss_weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)  # kv, induction, facts, ioi
    induction_warmup: int = 0  # first steps on the induction task alone (the kv curriculum starts after)
    eval_every: int = 250
    eval_examples: int = 200
    threads: int | None = None  # torch.set_num_threads; None leaves torch's default


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    model: torch.nn.Module
    history: list[dict] = field(default_factory=list)  # one row per step (losses) or eval
    wall_time_s: float = 0.0


def build_model(cfg: ModelConfig, *, seed: int) -> torch.nn.Module:
    """A freshly initialised Hugging Face causal LM over the zoo vocabulary."""
    torch.manual_seed(seed)
    special = dict(
        bos_token_id=vocab.WORD_TO_ID[vocab.BOS],
        eos_token_id=vocab.WORD_TO_ID[vocab.EOS],
        pad_token_id=vocab.WORD_TO_ID[vocab.PAD],
    )
    if cfg.arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        hf = LlamaConfig(
            vocab_size=vocab.VOCAB_SIZE, hidden_size=cfg.d_model, intermediate_size=cfg.d_mlp,
            num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
            num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.max_positions,
            rms_norm_eps=1e-5, tie_word_embeddings=False, **special,
        )
        return LlamaForCausalLM(hf)
    if cfg.arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        hf = GPT2Config(
            vocab_size=vocab.VOCAB_SIZE, n_positions=cfg.max_positions, n_embd=cfg.d_model,
            n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_mlp,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            **special,
        )
        model = GPT2LMHeadModel(hf)
        if cfg.position_init == "sinusoidal":
            with torch.no_grad():
                model.transformer.wpe.weight.copy_(sinusoidal_positions(cfg.max_positions, cfg.d_model))
        elif cfg.position_init != "normal":
            raise ConfigError(f"unknown position_init {cfg.position_init!r}; valid: 'normal', 'sinusoidal'")
        return model
    raise ConfigError(f"unknown arch {cfg.arch!r}; valid: 'llama', 'gpt2'")


def sinusoidal_positions(n_positions: int, d_model: int, *, std: float = 0.02) -> torch.Tensor:
    """Sin/cos position table (Vaswani et al.) scaled to the norm of N(0, std) token embeddings.

    Used to initialise GPT-2's learned position embeddings: "one position back" is then a fixed
    rotation, so a previous-token head (half of the induction circuit) is easy to find early.
    """
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]  # [pos, 1]
    freq = torch.exp(-math.log(10_000.0) * torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)  # [d/2]
    table = torch.zeros(n_positions, d_model)  # [pos, d_model]
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table * std * math.sqrt(2.0)  # each row has norm std * sqrt(d_model)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr * cfg.min_lr_ratio."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def kv_max_pairs(step: int, cfg: TrainConfig) -> int:
    """Curriculum: the largest number of kv pairs grows linearly to cfg.kv_pairs[1]."""
    lo, hi = cfg.kv_curriculum_start, cfg.kv_pairs[1]
    if cfg.kv_curriculum_steps <= 0:
        return hi
    return min(hi, lo + (hi - lo) * step // cfg.kv_curriculum_steps)


def _loss(model: torch.nn.Module, b: batches.Batch) -> torch.Tensor:
    logits = model(input_ids=b.tokens).logits  # [batch, pos, vocab]
    return F.cross_entropy(logits.flatten(0, 1), b.targets.flatten(), ignore_index=batches.IGNORE)


def train(
    model_cfg: ModelConfig, cfg: TrainConfig, *, seed: int = 0, progress: bool = True
) -> TrainResult:
    """Train a model from scratch; returns it with its loss / accuracy history."""
    from tqdm.auto import tqdm

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    model = build_model(model_cfg, seed=seed)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.98),
    )
    rngs = {t: np.random.default_rng([seed, 100 + i]) for i, t in enumerate(("kv", "induction", "facts", "ioi"))}
    history: list[dict] = []
    start = time.perf_counter()
    bar = tqdm(range(cfg.steps), disable=not progress, desc=f"train {model_cfg.arch}", mininterval=5)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        warm = step < cfg.induction_warmup  # induction alone: the circuit kv retrieval builds on
        n_max = max(kv_max_pairs(step - cfg.induction_warmup, cfg), cfg.kv_pairs[0])
        # one length per batch and step (no padding), rows to a token budget (constant cost)
        n_pairs = int(rngs["kv"].integers(cfg.kv_pairs[0], n_max + 1))
        length = int(rngs["induction"].integers(cfg.induction_lengths[0], cfg.induction_lengths[1] + 1))
        induction = batches.induction_batch(rngs["induction"], batch=max(1, cfg.induction_tokens // (2 * length + 1)),
                                            len_min=length, len_max=length)
        task_batches = {"induction": induction} if warm else {
            "kv": batches.kv_batch(rngs["kv"], batch=max(1, cfg.kv_tokens // (3 * (n_pairs + min(n_pairs, cfg.kv_queries)))),
                                   n_min=n_pairs, n_max=n_pairs, n_queries=cfg.kv_queries),
            "induction": induction,
            "facts": batches.example_batch(rngs["facts"], "facts", batch=cfg.facts_batch),
            "ioi": batches.example_batch(rngs["ioi"], "ioi", batch=cfg.ioi_batch, split="train"),
        }
        weights = dict(zip(("kv", "induction", "facts", "ioi"), cfg.loss_weights))
        losses = {t: _loss(model, b) for t, b in task_batches.items()}
        total = sum(weights[t] * loss for t, loss in losses.items())
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        row = {"step": step, "kind": "train", "lr": lr_at(step, cfg), "kv_max_pairs": n_max,
               "loss": float(total.detach()), **{f"loss_{t}": float(v.detach()) for t, v in losses.items()}}
        history.append(row)
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            acc = evaluate.evaluate(model, n=cfg.eval_examples, seed=evaluate.EVAL_SEED + 7)
            history.append({"step": step + 1, "kind": "eval", **{f"acc_{t}": a for t, a in acc.items()}})
            elapsed = time.perf_counter() - start
            log.info("step %d  loss %.3f  %s  (%.0fs)", step + 1, row["loss"],
                     "  ".join(f"{t} {a:.2f}" for t, a in acc.items()), elapsed)
            bar.set_postfix({t: f"{a:.2f}" for t, a in acc.items()})
    model.eval()
    return TrainResult(model=model, history=history, wall_time_s=time.perf_counter() - start)
