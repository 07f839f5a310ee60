"""GPT-Neo's local layers (review 17d): its window lives in config.window_size and config.attention_layers, not
sliding_window, so every window-aware analysis read its local layers as global. On the tiny GPT-Neo (layer 0
global, layer 1 local over 4 keys; conftest gpt_neo_model) each analysis is checked against plain Hugging Face
eager attention (whose mask is GPT-Neo's own) or a closed form."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.analyses.core.tasks import Task
from tests_support import hf_reference, random_tokens

N = 10  # prompt tokens: the local layer's last query sees keys 6..9, queries 4.. no longer see key 0


@pytest.fixture(scope="module")
def neo(gpt_neo_model):
    model, path = gpt_neo_model
    return model, hf_reference(path)


def _task(n: int = 2, seed: int = 5) -> Task:
    g = torch.Generator().manual_seed(seed)
    answers = torch.randint(4, 64, (n,), generator=g)
    return Task(name="toy", tokens=random_tokens(n, N, seed=seed), corrupted_tokens=random_tokens(n, N, seed=seed + 1),
                answers=answers, wrong_answers=(answers + 7 - 4) % 60 + 4)


def test_kv_sink_share_counts_only_the_queries_whose_window_holds_the_first_token(neo):
    """17d A1: on the local layer the uniform share averages 1/(q+1) over queries 1..3 (the window of 4 holds key 0
    only there), and the sink mass averages Hugging Face's attention on key 0 over the same queries; the global layer
    over queries 1..9. The old baseline averaged layer 1 over queries 1..9 too (0.202 against 0.361 here)."""
    from headscope.analyses.kv import analysis as kv

    model, hf = neo
    tokens = random_tokens(2, N, seed=3)
    table = kv.sink_stats(model, tokens, kv.kv_norms(model, tokens), n_sink=1)
    by_hand = [np.mean([1 / (q + 1) for q in range(1, N)]), np.mean([1 / (q + 1) for q in range(1, 4)])]
    assert table.baseline.tolist() == ["uniform"] * 2 and table.baseline_mass.tolist() == pytest.approx(by_hand)
    with torch.no_grad():
        att = hf(tokens, output_attentions=True).attentions  # [b, H, q, k] per layer
    assert float(att[1][:, :, 4:, 0].abs().max()) == 0.0  # the premise: HF's mask hides key 0 from queries 4..
    hand = [att[0][:, :, 1:N, 0].mean().item(), att[1][:, :, 1:4, 0].mean().item()]
    assert table.sink_mass.tolist() == pytest.approx(hand, abs=1e-5)


def test_kv_cache_size_is_hugging_faces_cache_and_the_windowed_one_beside_it(neo):
    """17d C3: GPT-Neo's Hugging Face cache keeps every position on its local layer too (measured: the tensors a real
    cache holds after N positions), so bytes_at_n_ctx is the all-global size; bytes_at_n_ctx_windowed is the cache
    cut to each window (window - 1 = 3 positions on layer 1), by hand, and the finding says both."""
    from headscope.analyses.kv import analysis as kv
    from headscope.reports.kv_cache_words import _size_sentence

    model, hf = neo
    with torch.no_grad():
        cache = hf(random_tokens(1, N, seed=1), use_cache=True).past_key_values
    held = [sum(t.numel() * t.element_size() for t in (lay.keys, lay.values)) for lay in cache.layers]
    per = 2 * 64 * 4  # (K, V) x d_model x float32, per layer and token
    assert held == [N * per, N * per]
    anatomy = kv.cache_anatomy(model)
    assert anatomy.total(N) == sum(held)
    sizes = kv._context_sizes(model, anatomy, N)
    assert sizes == {"bytes_at_n_ctx": 2 * 64 * per, "bytes_at_n_ctx_all_global": 2 * 64 * per, "n_ctx": 64,
                     "bytes_at_n_ctx_windowed": (64 + 3) * per}
    s = {**sizes, "dtype": "float32", "sliding_windows": {"1": 4}, "cache_keeps_all": True}
    assert _size_sentence(s, 2 * per, sizes["bytes_at_n_ctx"]) == (
        "The KV cache takes 1.0 KiB per token (float32); layer(s) 1 attend over a sliding window of 4 keys, but "
        "Hugging Face's cache for this model keeps every position on every layer: 64.0 KiB at full context (64 "
        "positions); a cache that kept only each window (its last 3 positions, as Hugging Face's sliding cache does) "
        "would take 33.5 KiB.")


def test_permutation_and_adversarial_attention_stay_inside_the_local_window(neo):
    """17d A2: on the local layer each permutation moves weight only among the last 4 keys (HF's own support of the
    last row), and the adversarial search keeps exactly 0 on the keys the window masks. The old support was every
    key: most permuted weight landed where the model can never attend."""
    from headscope.analyses.attribution.adversarial import adversarial_attention
    from headscope.analyses.attribution.permutation import permute_attention

    model, hf = neo
    tokens = random_tokens(2, N, seed=3)
    with torch.no_grad():
        row = hf(tokens, output_attentions=True).attentions[1][:, :, -1]  # [b, H, k]
    inside = row > 0
    assert inside.sum(-1).eq(4).all() and inside[..., -4:].all()
    got = permute_attention(model, tokens, layer=1, n_permutations=5, generator=torch.Generator().manual_seed(2))
    for b in range(2):
        for d in range(5):
            permuted = row[b].gather(-1, got.perms[b, d])  # [H, k]
            assert float(permuted[~inside[b]].abs().max()) == 0.0
    adv = adversarial_attention(model, tokens, layer=1, steps=3)
    assert float(adv.attention[..., : N - 4].abs().max()) == 0.0
    assert float((adv.attention.sum(-1) - 1).abs().max()) < 1e-5


def test_attribution_ranks_last_layer_attention_only_inside_the_local_window(neo):
    """17d B1: the last layer is local, so its attention is 0 by the mask on ranked positions 1..5 of a 10-token
    prompt (answer query 9 sees 6..9): the taus rank positions 6-8 only and the summary records the window."""
    from headscope.analyses.attribution.analysis import attribution

    model, hf = neo
    task = Task(name="random", tokens=random_tokens(2, N, seed=5), answers=torch.arange(2) + 10,
                wrong_answers=torch.arange(2) + 30)
    res = attribution(model, task, progress=False, n_steps=4, ig_max_steps=4, n_permutations=2, adversarial_steps=0)
    assert res.summary["attention_window"] == {"window": 4, "ranked": [3, 3], "of": [8, 8], "n_examples_cut": 2}
    scores = res.tables["scores"]
    ll = scores[(scores.example == 0) & (scores.method == "last_layer")].sort_values("position")
    assert ll.loc[ll.masked, "position"].tolist() == [1, 2, 3, 4, 5]


def test_head_roles_score_the_local_layers_sink_over_the_queries_that_see_it(neo):
    """17d A4: heads' sink score on the local layer is HF's attention on the first token averaged over queries 1..3
    (those whose window of 4 holds it), on the global layer over 1..9; the roles table records the window."""
    from headscope.analyses.heads.roles import head_roles, role_windows
    from headscope.reports.heads_words import finding

    model, hf = neo
    tokens = random_tokens(2, N, seed=4)
    roles = head_roles(model, tokens, n_induction=2, seed=1)
    with torch.no_grad():
        att = [a.numpy() for a in hf(tokens, output_attentions=True).attentions]
    for layer, last_seeing in ((0, N - 1), (1, 3)):
        for head in range(4):
            row = roles.loc[(roles["layer"] == layer) & (roles["head"] == head)].iloc[0]
            sink = np.mean([att[layer][b, head, q, 0] for b in range(2) for q in range(1, last_seeing + 1)])
            assert row["sink"] == pytest.approx(sink, abs=1e-5)
    assert roles["window"].iloc[:4].isna().all() and roles["window"].tolist()[4:] == [4.0] * 4
    assert ("Sliding windows (layer 1 over 4 keys): sink is scored over the queries that can see the first token "
            "(within window - 1 positions of it)") in finding({"n_layers": 2, "roles": {}, **role_windows(roles)})


def test_patching_marks_the_cells_the_local_window_keeps_from_the_answer(neo):
    """17d C1: resid_pre of the local layer 1 reaches the answer (position 9) only from at most 3 back: the cells 4-9
    back are marked unreachable and measure 0, the cell 3 back does not (the mark is not too wide); layer 0's
    resid_pre reaches it through the global layer 0 from anywhere."""
    from headscope.analyses.patching.analysis import activation_patching
    from headscope.reports.patching_words import finding

    model, _ = neo
    res = activation_patching(model, _task(), ["resid_pre"], progress=False)
    df = res.df
    back = -1 - df["position_from_end"]
    cells = df[df.layer == 1]
    marked = cells[cells.unreachable]
    assert sorted(back[marked.index]) == list(range(4, N))
    assert marked.effect.abs().max() < 1e-6 and cells[back[cells.index] == 3].effect.abs().item() > 1e-4
    assert not df[df.layer == 0].unreachable.any()
    assert res.summary["sliding_windows"] == {"windows": [None, 4], "unreachable": 6, "cells": 2 * N}
    assert ("Sliding windows (layer 1 over 4 keys): 6 of the 20 position cells lie further before the answer position "
            "than the windows carry a change") in finding(res.summary)


def test_header_and_repr_name_the_local_layers(neo):
    """17d C2: print(model) and the report header say which layers are local and their window; the findings' short
    form comes from the same window_words (mend18)."""
    from headscope.models.hooked_model import window_words

    model, _ = neo
    assert "n_ctx=64, sliding_window=4 on layer 1, attention_scale=1 (not 1/sqrt(16)), dtype=float32" in repr(model)
    assert window_words({"1": 4}, 2) == "layer 1 attends over a sliding window of 4 keys (the others globally)"
    assert window_words((None, 8, None, 8)) == "layers 1, 3 attend over a sliding window of 8 keys (the others globally)"
    assert window_words((4096, 4096)) == "every layer attends over a sliding window of 4096 keys"
    # the findings' short form (heads' roles, patching's reach): by layer, "every layer" where one window covers all
    assert window_words({"2": 8, "0": 8, "1": 4}, 3, short=True) == "layers 0 and 2 over 8 keys and layer 1 over 4 keys"
    assert window_words({0: 6, 1: 6}, 2, short=True) == "every layer over 6 keys"


def test_attn_scores_site_says_it_holds_the_weights_on_a_delegating_bridge(neo, arch_models):
    """17d A3: on GPT-Neo TransformerLens fires hook_attn_scores on the weights Hugging Face returns: the captured
    last row equals HF's attention weights (not q.k, which is unscaled here and far from them), so `headscope sites`
    says so for this model, and capture by name warns; on GPT-2 (scores computed by the bridge) neither."""
    import headscope as hs
    from headscope.hooks.edits import scores_hold_weights
    from headscope.hooks.sites import describe_site

    model, hf = neo
    tokens = random_tokens(1, 6, seed=2)
    with pytest.warns(UserWarning, match="attention weights after softmax, equal to pattern"):
        got = hs.capture(model, tokens, [hs.site("scores", 1)])[hs.site("scores", 1)]
    with torch.no_grad():
        weights = hf(tokens, output_attentions=True).attentions[1]
    assert torch.allclose(got, weights, atol=1e-4)  # the weights, not q.k
    assert scores_hold_weights(model) and not scores_hold_weights(arch_models("gpt2"))
    assert "equal to pattern" in describe_site("scores", None, scores_hold_weights=True)[1]
    assert describe_site("scores")[1].startswith("scaled, masked attention scores")


def test_report_header_names_the_local_layers_from_the_manifest(tmp_path):
    """17d C2: the report header (from the manifest's attention_windows) says which layers are local, exactly."""
    from headscope.reports import io
    from headscope.reports.html_report import write_report_files

    io.write_json(tmp_path / "manifest.json", {"config": {}, "model": {"name": "m"}})
    model = {"name": "m", "family": "GPTNeoForCausalLM", "n_layers": 4, "n_heads": 6, "d_model": 96,
             "attention_windows": {"1": 8, "3": 8}}
    write_report_files(tmp_path, [], {}, model)
    assert ("<p>GPTNeoForCausalLM, 4 layers x 6 heads, d_model 96, layers 1, 3 attend over a sliding window of 8 keys "
            "(the others globally).") in (tmp_path / "report.html").read_text()


def test_attention_scale_is_gpt_neos_unscaled_scores_in_facts_cfg_and_repr(neo):
    """GPT-Neo multiplies q k^T by nothing, where every other family scales by 1/sqrt(d_head): facts.attention_scale was
    None (read as 1/sqrt(16)) and model.cfg said use_attn_scale with attn_scale -1. By hand on layer 0 (global): softmax of
    the unscaled q k^T under the causal mask equals Hugging Face's attention weights, and the 1/4 scale does not; so
    facts say 1, cfg says use_attn_scale False (TransformerLens's own GPT-Neo config), print(model) names it."""
    model, hf = neo
    tokens = random_tokens(1, N, seed=4)
    with torch.no_grad():
        out = hf(tokens, output_attentions=True, output_hidden_states=True)
        block = hf.transformer.h[0]
        x = block.ln_1(out.hidden_states[0])  # [1, N, 64]
        attn = block.attn.attention
        q, k = (t.view(1, N, 4, 16).transpose(1, 2) for t in (attn.q_proj(x), attn.k_proj(x)))  # [1, H, N, 16]
        scores = q @ k.transpose(-1, -2)  # [1, H, N, N], unscaled
        causal = torch.ones(N, N, dtype=torch.bool).tril()

    def by_hand(s):
        return s.masked_fill(~causal, float("-inf")).softmax(-1)
    torch.testing.assert_close(by_hand(scores), out.attentions[0], atol=1e-6, rtol=0)
    assert (by_hand(scores / 4) - out.attentions[0]).abs().max() > 1e-3  # the scale matters on this model
    assert model.facts.attention_scale == 1.0
    assert (model.cfg.use_attn_scale, model.cfg.attn_scale) == (False, 1.0)
    assert "attention_scale=1 (not 1/sqrt(16))" in repr(model)
