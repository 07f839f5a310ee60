"""Slow tier: each shipped zoo checkpoint loads with Hugging Face and meets its card.

Accuracies are recomputed here on fresh seeds, independently of the code that wrote the card:
prompts are built from `data` examples and scored by argmax of the HF logits.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headscope.models.zoo import data, registry, vocab

pytestmark = pytest.mark.slow

NAMES = registry.available()
N = 600
SEEDS = (101, 202)
TOLERANCE = 0.03  # sampling error of N examples at ~90% accuracy is ~1.2 points


@pytest.fixture(scope="module", params=NAMES)
def shipped(request):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = registry.checkpoint_dir(request.param)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    card = json.loads((path / "card.json").read_text())
    return model, tokenizer, card


def _accuracy(model, tokenizer, task: str, seed: int) -> float:
    """Fraction of prompts whose argmax next token is the answer (tokenized by the checkpoint)."""
    if task == "induction":  # per token over the second half of repeated 24-token sequences
        rng = np.random.default_rng([seed, 99])
        pool = np.array(tokenizer.convert_tokens_to_ids(list(vocab.INDUCTION_POOL)))
        seqs = np.stack([rng.choice(pool, size=24, replace=False) for _ in range(N // 2)])  # [batch, 24]
        bos = np.full((len(seqs), 1), tokenizer.bos_token_id)
        tokens = torch.from_numpy(np.concatenate([bos, seqs, seqs], axis=1))  # [batch, 49]
        with torch.no_grad():
            pred = model(input_ids=tokens).logits.argmax(-1)  # [batch, 49]
        # position 25 + i holds seq[i]; it predicts seq[i + 1]
        return float((pred[:, 25:48] == tokens[:, 26:49]).float().mean())
    kw = {"kv": {"n_pairs": 8}, "ioi": {"split": "eval"}}.get(task, {})
    exs = list(data.examples(task, N, seed=seed, **kw))
    enc = tokenizer([" ".join(e.prompt) for e in exs], return_tensors="pt", add_special_tokens=False)
    answers = torch.tensor(tokenizer.convert_tokens_to_ids([e.answer for e in exs]))  # [batch]
    with torch.no_grad():
        pred = model(input_ids=enc["input_ids"]).logits[:, -1].argmax(-1)  # [batch]
    return float((pred == answers).float().mean())


def test_checkpoint_files(shipped):
    model, tokenizer, card = shipped
    path = registry.checkpoint_dir(card["name"])
    for f in ("model.safetensors", "config.json", "tokenizer.json", "card.json", "MODEL_CARD.md", "loss_curve.png"):
        assert (path / f).is_file(), f
    assert not list(path.glob("*.bin"))
    assert tokenizer.convert_ids_to_tokens(tokenizer("<bos> k03 v17 ;", add_special_tokens=False)["input_ids"]) == [
        "<bos>", "k03", "v17", ";"
    ]
    assert sum(p.numel() for p in model.parameters()) == card["params"]


def test_shipped_size_within_budget():
    total = sum(f.stat().st_size for f in registry.ZOO_DIR.rglob("*") if f.is_file())
    assert total <= 25 * 1024 * 1024


@pytest.mark.parametrize("task", data.TASKS)
def test_accuracy_matches_card(shipped, task):
    model, tokenizer, card = shipped
    acc = np.mean([_accuracy(model, tokenizer, task, seed) for seed in SEEDS])
    assert acc == pytest.approx(card["accuracy"][task], abs=TOLERANCE)
    if card["meets_target"][task]:
        assert acc >= card["targets"][task] - 0.01
