"""Rules the engines share: one meaning of resample ablation (hs.ablate and the heads analysis),
one rows-per-pass sizing (head masks and patched runs)."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.analyses.heads import importance as hi
from headscope.analyses.patching.engine import runs_per_forward
from headscope.errors import ConfigError
from headscope.execution import batching
from headscope.hooks.interventions import METHODS, resample_partners
from tests_support import random_tokens


@pytest.mark.parametrize("n_rows,n_ref", [(2, 2), (3, 3), (7, 7), (5, 3), (2, 6)])
def test_resample_partners_never_pick_a_rows_own_reference_row(n_rows, n_ref):
    """Row i takes reference row (i + r) % n_ref, r in 1..n_ref-1: never row i (mod n_ref), and
    over many seeds every other row."""
    own = torch.arange(n_rows) % n_ref
    seen = torch.zeros(n_rows, n_ref, dtype=torch.bool)
    for seed in range(200):
        partner = resample_partners(n_rows, n_ref, torch.Generator().manual_seed(seed))
        assert partner.shape == (n_rows,) and partner.dtype == torch.long
        assert not bool((partner == own).any())
        assert bool(((partner >= 0) & (partner < n_ref)).all())
        seen[torch.arange(n_rows), partner] = True
    assert torch.equal(seen, torch.arange(n_ref)[None] != own[:, None])  # every other row, never its own
    with pytest.raises(ConfigError, match="at least 2"):
        resample_partners(3, 1, torch.Generator().manual_seed(0))


def test_a_resample_ablated_row_never_gets_its_own_activation(tiny_models):
    """With the input batch as its own reference, every row's ablated z is another row's clean z,
    at every ablated site the same partner (a random draw that may pick the row itself fails)."""
    model = tiny_models["gpt2"]
    tokens = random_tokens(4, 6, seed=3)
    names = [hs.site("z", 0), hs.site("z", 1)]
    clean = hs.capture(model, tokens, names)
    every_head = [(layer, h) for layer in range(2) for h in range(model.facts.n_heads)]
    for seed in range(12):
        with hs.ablate(model, heads=every_head, method="resample", reference=tokens, seed=seed):
            got = hs.capture(model, tokens, names)
        partner = resample_partners(4, 4, torch.Generator().manual_seed(seed))
        for name in names:
            for i in range(4):
                own = torch.equal(got[name][i], clean[name][i])
                assert not own, f"seed {seed}: row {i} got its own activation at {name}"
            assert torch.equal(got[name], clean[name][partner])
    with pytest.raises(ConfigError, match="at least 2 reference prompts"):
        with hs.ablate(model, heads=[(0, 0)], method="resample", reference=tokens[:1]):
            pass


def test_heads_analysis_and_ablate_resample_the_same_way(tiny_models):
    """One list of methods, one pairing: the heads analysis's replacement values are hs.ablate's
    resampled z for the same seed."""
    assert hi.ABLATIONS is METHODS
    model = tiny_models["llama"]
    tokens = random_tokens(5, 6, seed=8)
    scorer = hi.make_scorer(model, tokens)
    names = [hs.site("z", layer) for layer in range(model.facts.n_layers)]
    every_head = [(layer, h) for layer in range(model.facts.n_layers) for h in range(model.facts.n_heads)]
    for seed in (0, 7):
        values = hi.ablation_values(model, scorer, "resample", seed=seed)
        with hs.ablate(model, heads=every_head, method="resample", reference=tokens, seed=seed):
            got = hs.capture(model, tokens, names)
        for layer, name in enumerate(names):
            torch.testing.assert_close(values[layer], got[name], atol=0, rtol=0)


def test_one_rows_per_pass_rule_sizes_masks_and_patched_runs(tiny_models):
    model = tiny_models["llama"]
    pos = 7
    per_row = batching.row_bytes(model, pos)
    budget = per_row * 10 + 1
    assert batching.rows_per_pass(model, pos, memory_budget=budget) == 10
    assert runs_per_forward(model, 3, pos, memory_budget=budget) == 3  # whole runs of 3 rows
    assert runs_per_forward(model, 20, pos, memory_budget=budget) == 1  # at least one run
    assert batching.rows_per_pass(model, pos, max_tokens=70) == 10  # a token budget overrides the rest
    huge = per_row * 10**6
    capped = batching.MAX_PASS_TOKENS // pos  # the tiny vocabulary's logits stay far below MAX_PASS_LOGITS
    assert batching.rows_per_pass(model, pos, memory_budget=huge, logits_cap=True) == capped
    assert batching.rows_per_pass(model, pos, memory_budget=huge) == 10**6
    if model.device.type == "cpu":  # the default budget: at most CPU_PASS_TOKENS tokens per no-grad pass
        assert batching.rows_per_pass(model, pos) <= batching.cpu_rows("cpu", pos, batching.widest(model))
