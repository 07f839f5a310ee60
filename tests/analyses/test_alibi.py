"""ALiBi (BLOOM) against plain Hugging Face and closed forms: no invented context (review 16c A2), the sink
baseline ALiBi's bias alone gives (review 16c B1)."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.analyses.kv import analysis as kv
from headscope.analyses.position.sinks import sink_rows, uniform_baseline
from headscope.models.alibi import alibi_slopes, press_slopes
from tests_support import hf_model, random_tokens

SLOPES_4 = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]  # Press et al. for 4 heads: 2^(-8i/4), by hand


@pytest.fixture(scope="module")
def bloom_dir(bloom_model):
    return bloom_model[1]  # the session's tiny BLOOM (conftest.py)


@pytest.fixture(scope="module")
def bloom(bloom_model):
    assert bloom_model[0].dtype == torch.float32
    return bloom_model[0]


def hand_share(slopes, lengths, n_sink: int = 1, window: int | None = None, rows=None) -> float:
    """Mean over prompts, heads and query rows q >= n_sink (or `rows`) of the softmax of -m (q - k) over the keys q sees,
    summed over k < n_sink: an explicit softmax, no geometric sums."""
    means = []
    for n in lengths:
        for m in slopes:
            shares = []
            for q in (range(n_sink, n) if rows is None else rows):
                keys = torch.arange(q + 1, dtype=torch.float64)
                seen = keys > q - window if window else torch.ones(q + 1, dtype=torch.bool)
                p = torch.softmax(torch.where(seen, -m * (q - keys), torch.tensor(-torch.inf, dtype=torch.float64)), 0)
                shares.append(float(p[:n_sink].sum()))
            means.append(sum(shares) / len(shares))
    return sum(means) / len(means)


def test_an_alibi_model_has_no_fixed_context_and_runs_a_prompt_past_transformerlens_default(bloom, bloom_dir, tiny_models):
    """Review 16c A2: BLOOM's config names no maximum length; headscope had TransformerLens's n_ctx 2048 as its
    context and refused a 2,100-token prompt HF runs. Now it runs it, equal to HF; a GPT-2 still refuses past its own."""
    f = bloom.facts
    assert (f.positional, f.fixed_context, f.context_limit) == ("alibi", False, None)
    assert "n_ctx=none (ALiBi: no fixed context)" in repr(bloom)
    tokens = random_tokens(1, 2100)
    hf = hf_model(bloom_dir)
    with torch.no_grad():
        want = hf(tokens).logits[0, -1]
        got = bloom(tokens)[0, -1]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    gpt2 = tiny_models["gpt2"]
    assert gpt2.facts.fixed_context and gpt2.facts.context_limit == gpt2.facts.n_ctx
    with pytest.raises(hs.ContextLengthError):
        gpt2(random_tokens(1, gpt2.facts.n_ctx + 1))


def test_alibi_slopes_are_the_papers_and_the_models_own(bloom):
    assert alibi_slopes(bloom).tolist() == SLOPES_4
    # 6 heads (the review's BLOOM): 4 of 2^(-8i/4), then 2^(-4(2i+1)/4) for i = 0, 1
    assert press_slopes(6).tolist() == [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]


@pytest.mark.parametrize("window", [None, 5])
def test_the_alibi_sink_baseline_is_the_softmax_of_the_bias_alone(window):
    """Review 16c B1: the baseline under ALiBi is softmax(-m (q - k)) over the visible keys, per head and query
    row, averaged as the mass is; uniform attention (m = 0) is n_sink / (q + 1)."""
    slopes = torch.tensor(SLOPES_4 + [0.0], dtype=torch.float64)
    for n_sink in (1, 3):
        rows = sink_rows(20, n_sink, window)
        got = uniform_baseline(20, n_sink, window=window, rows=rows, slopes=slopes)
        assert got == pytest.approx(hand_share(slopes.tolist(), [20], n_sink, window, rows.tolist()), abs=1e-12)
    assert uniform_baseline(20, 1, slopes=torch.zeros(4)) == pytest.approx(
        sum(1 / (q + 1) for q in range(1, 20)) / 19, abs=1e-12)


def test_kv_sink_mass_equals_the_alibi_baseline_when_scores_are_equal(bloom_dir, tmp_path):
    """With q and k projections zeroed every score is 0, so HF's attention is ALiBi's bias alone: the measured
    first-token mass then equals the baseline (ratio 1), which is the explicit softmax of the bias; the uniform
    share it was judged against before (1 / (q + 1)) is recorded beside it as "uniform_share" (sinks.csv and the summary)."""
    hf = hf_model(bloom_dir)
    with torch.no_grad():
        for block in hf.transformer.h:
            qkv, n_heads = block.self_attention.query_key_value, block.self_attention.num_heads
            qkv.weight.view(n_heads, 3, -1, qkv.weight.shape[-1])[:, :2] = 0  # BLOOM fuses [head, (q, k, v), d_head]
            qkv.bias.view(n_heads, 3, -1)[:, :2] = 0
    hf.save_pretrained(tmp_path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (bloom_dir / name).exists():
            (tmp_path / name).write_bytes((bloom_dir / name).read_bytes())
    model = hs.load_model(str(tmp_path), dtype="float32")
    tokens = random_tokens(3, 12, seed=1)
    norms, _ = kv._kv_norms(model, tokens)
    table = kv.sink_stats(model, tokens, norms, n_sink=1)
    want = hand_share(SLOPES_4, [12])
    assert table.baseline_mass.tolist() == pytest.approx([want] * 2, abs=1e-12)
    assert table.baseline.tolist() == ["alibi"] * 2 and "uniform_mass" not in table  # mend 1: named for what it holds
    assert table.sink_mass.tolist() == pytest.approx([want] * 2, abs=1e-5)
    assert table.uniform_share.tolist() == pytest.approx([sum(1 / (q + 1) for q in range(1, 12)) / 11] * 2, abs=1e-12)
    assert not table.sink.any()
    records = kv._sink_records(table)  # review 16cv B2: the summary names each share for what it holds
    assert [r["baseline"] for r in records] == pytest.approx([want] * 2, abs=1e-12)
    assert [r["uniform_share"] for r in records] == pytest.approx([sum(1 / (q + 1) for q in range(1, 12)) / 11] * 2)
    assert not any("uniform" in r or "flat" in r for r in records)


def test_kv_sizes_the_cache_at_the_longest_prompt_not_an_invented_context(bloom):
    """Review 16c A2: "4.5 MiB at full context" rested on TransformerLens's n_ctx 2048. Without a fixed context the
    summary has none and the finding gives bytes per token and at the longest prompt run, counted by hand:
    K and V x d_model 64 x 4 bytes x 2 layers = 1,024 B a token, x 69 tokens."""
    from headscope.reports.kv_cache_words import _size_sentence

    sizes = kv._context_sizes(bloom, kv.cache_anatomy(bloom), 69)
    assert sizes == {"bytes_at_n_ctx": None, "bytes_at_n_ctx_all_global": None, "n_ctx": None,
                     "no_fixed_context": "alibi", "bytes_at_longest_prompt": 2 * 64 * 4 * 2 * 69}
    s = {"dtype": "float32", "prompt_tokens": 69, **sizes}
    assert _size_sentence(s, 1024, None) == (
        "The KV cache takes 1.0 KiB per token (float32), 69.0 KiB at the longest prompt run (69 tokens); the model "
        "has no fixed context (ALiBi positions, no maximum length in its config), so no full-context size.")


def test_the_kv_section_guide_sizes_a_model_without_a_fixed_context_at_the_longest_prompt():
    """Review 16cv C2: the kv section's intro said "bytes per token and at full context" on BLOOM, which has none."""
    from headscope.reports.html_report import _guide

    alibi = {"no_fixed_context": "alibi", "bytes_at_n_ctx": None, "n_ctx": None, "bytes_at_longest_prompt": 70656}
    assert _guide("kv", alibi).startswith("The KV cache: bytes per token and at the longest prompt run, what grouped-")
    assert "full context" not in _guide("kv", alibi)
    fixed = {"bytes_at_n_ctx": 4718592, "n_ctx": 2048}
    assert _guide("kv", fixed).startswith("The KV cache: bytes per token and at full context, what grouped-query")


def test_the_sink_sentence_names_alibis_baseline():
    """Review 16c B1: the multiple is of what ALiBi's bias alone gives, named, with the uniform share beside it."""
    from headscope.reports.findings import sink_sentence

    records = [{"layer": 0, "mass": 0.0376, "uniform": 0.0523, "ci": [0.0323, 0.0429], "ratio": 0.72, "n": 16,
                "sink": False, "flat": 0.0809},
               {"layer": 1, "mass": 0.17, "uniform": 0.0523, "ci": [0.16, 0.18], "ratio": 3.25, "n": 16, "sink": True,
                "flat": 0.0809}]
    assert sink_sentence(records, n_sink=1, task="tools", baseline="alibi") == (
        "On tools prompts, attention on the first 1 token(s) per layer (mean over 16 prompts, 95% CI, and its multiple "
        "of 0.05, the share ALiBi's position bias alone gives them with every score equal (each head's slope; uniform "
        "attention would give 0.08)): layer 0 0.04 [0.03, 0.04] (0.7x), layer 1 0.17 [0.16, 0.18] (3.2x). An "
        "attention sink in layer(s) 1 (at least 1.5x that share, with its excess over it 95%-CI above 0).")
    # review 16cv B2: records named for what they hold ("baseline", "uniform_share") read the same as old runs' names
    renamed = [{**{k: v for k, v in r.items() if k not in ("uniform", "flat")}, "baseline": r["uniform"],
                "uniform_share": r["flat"]} for r in records]
    assert sink_sentence(renamed, n_sink=1, task="tools", baseline="alibi") == sink_sentence(
        records, n_sink=1, task="tools", baseline="alibi")


def test_an_alibi_report_names_its_positions_in_the_header_and_roles_caption_and_records_no_n_ctx(
        bloom, tiny_models, tiny_dirs, tmp_path):
    """Mend 1: on BLOOM the report's header line named no ALiBi, the roles caption did not say that a head's fixed slope
    sets part of its positional preference, and the manifest kept TransformerLens's n_ctx 2048 beside
    fixed_context false. Now the header and caption say ALiBi on BLOOM and not on a rotary Llama; the manifest's n_ctx
    is null on BLOOM and the HF config's own maximum length on GPT-2 and Llama."""
    import json

    import transformers

    from headscope.analyses.heads.analysis import HeadsConfig
    from headscope.reports.findings import caption
    from headscope.reports.html_report import write_report_files
    from headscope.reports.report import model_record

    llama = tiny_models["llama"]
    assert llama.facts.positional == "rotary"
    config = HeadsConfig(quick=True, n_examples=2, methods=("zero",), l0=None, best_head=False)
    for model, alibi in ((bloom, True), (llama, False)):
        summary = hs.run_analysis("heads", model, None, config).summary
        said = caption("roles", summary)
        assert said.startswith("Role scores per head (0-1)")
        assert ("partly set by its slope" in said) is alibi and ("ALiBi" in said) is alibi, said
        record = model_record(model)
        out = tmp_path / model.facts.family
        out.mkdir()
        write_report_files(out, [], {}, record)
        header = (out / "report.html").read_text(encoding="utf-8").split("<p>", 1)[1].split("</p>", 1)[0]
        assert ("ALiBi positions (no position embedding: each head adds -slope x distance" in header) is alibi, header
        assert ("ALiBi positions" in (out / "report.md").read_text(encoding="utf-8")) is alibi
    assert model_record(bloom)["n_ctx"] is None and '"n_ctx": null' in json.dumps(model_record(bloom))
    for family, key in (("gpt2", "n_positions"), ("llama", "max_position_embeddings")):
        want = getattr(transformers.AutoConfig.from_pretrained(tiny_dirs[family]), key)
        assert model_record(tiny_models[family])["n_ctx"] == want
