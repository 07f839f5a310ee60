"""MPT (review 19a): its clamp lives in attn_config.clip_qkv and clamps the fused Wqkv output; its MLP runs exact GELU;
ALiBi with a maximum length (max_seq_len); a tokenizer with no bos_token. Checked on a tiny random MPT against plain
Hugging Face: hook_q/k/v equal the clamped Wqkv slices HF's attention uses (A1), patching one head's q equals HF with
that head's slice replaced (A1), the kv key bound and its sentence (A1/B1), the MLP's activation (A2), the header's
context (A3), circuits' edges refused in one line (A4), the BOS sentence (C2), the scores site's words (C3)."""
from __future__ import annotations

import pytest
import torch
import transformers

import headscope as hs
from tests.tests_support import N_WORDS, SPECIALS, normal_matrices, random_tokens, save_random_checkpoint

CLIP = 0.5
D, HEADS, D_HEAD = 32, 4, 8


def _no_bos_tokenizer():
    """tests_support's word tokenizer without a bos_token (eos and pad only), as review 19a's BPE."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS + [f"w{i}" for i in range(N_WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                                eos_token="<eos>")


@pytest.fixture(scope="module")
def mpt(tmp_path_factory):
    """(HookedModel, plain HF model) of a 2-layer MPT: d 32, 4 heads, ALiBi, attn_config.clip_qkv 0.5, max_seq_len 64,
    matrices N(0, 0.2^2) so the clamp acts on q, k and v."""
    config = transformers.MptConfig(vocab_size=len(SPECIALS) + N_WORDS, d_model=D, n_heads=HEADS, n_layers=2,
                                    expansion_ratio=2, max_seq_len=64, no_bias=True, eos_token_id=3, pad_token_id=1,
                                    attn_config={"alibi": True, "clip_qkv": CLIP})
    folder = tmp_path_factory.mktemp("mpt") / "m"
    save_random_checkpoint(config, folder, _no_bos_tokenizer(), init=normal_matrices(0.2))
    hf = transformers.MptForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return hs.load_model(str(folder), device="cpu", dtype="float32"), hf


def _hf_qkv(hf, tokens, layer):
    """HF's fused Wqkv output [batch, pos, 3 * d_model] of `layer`, before its clamp (a clone), and the logits."""
    seen = {}
    hook = hf.transformer.blocks[layer].attn.Wqkv.register_forward_hook(lambda m, i, o: seen.__setitem__("x", o.clone()))
    with torch.no_grad():
        logits = hf(tokens).logits
    hook.remove()
    return seen["x"], logits


def test_q_k_v_sites_are_the_clamped_wqkv_slices(mpt):
    """Review 19a A1: hook_q/k/v held the unclamped projections (the clamp was read only from the config's top level)."""
    model, hf = mpt
    assert hf.config.attn_config.clip_qkv == CLIP and getattr(hf.config, "clip_qkv", None) is None  # nested only
    assert model.facts.clip_qkv == CLIP
    tokens = random_tokens(2, 9, seed=1)
    acts = hs.capture(model, tokens, [hs.site(k, layer) for k in "qkv" for layer in (0, 1)])
    for layer in (0, 1):
        raw, _ = _hf_qkv(hf, tokens, layer)
        assert (raw.abs() > CLIP).float().mean() > 0.2  # the clamp acts
        want = raw.clamp(-CLIP, CLIP).chunk(3, dim=-1)  # HF: clamp, then q, k, v
        for i, kind in enumerate("qkv"):
            got = acts[hs.site(kind, layer)]  # [batch, pos, head, d_head]
            torch.testing.assert_close(got.reshape(want[i].shape), want[i], atol=1e-5, rtol=0)


def test_patching_one_heads_q_is_hf_with_that_slice_replaced(mpt):
    """A1: patching L1H2's q from a clean run equals HF's forward with only that head's slice of the clamped q from
    the clean run (HF clamps the patched value again, a no-op)."""
    model, hf = mpt
    clean, corrupt = random_tokens(1, 8, seed=2), random_tokens(1, 8, seed=3)
    layer, head = 1, 2
    acts = hs.capture(model, clean, [hs.site("q", layer)])
    raw, _ = _hf_qkv(hf, clean, layer)
    source = raw.clamp(-CLIP, CLIP)
    lo, hi = head * D_HEAD, (head + 1) * D_HEAD

    def put(m, i, o):
        o = o.clone()
        o[..., lo:hi] = source[..., lo:hi]
        return o

    hook = hf.transformer.blocks[layer].attn.Wqkv.register_forward_hook(put)
    with torch.no_grad():
        want = hf(corrupt).logits
    hook.remove()
    with hs.patch(model, acts, hs.site("q", layer), heads=[head]):
        got = model(corrupt)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_words_name_the_clamp_the_gelu_and_alibi(mpt):
    """A1: header, repr, sites name the clamp; A2: MptMLP runs exact GELU (TransformerLens's cfg said relu; model.cfg
    now says what the HF module runs, review 20b C); C3: the scores site holds ALiBi's bias."""
    from headscope.hooks.sites import describe_site

    model, hf = mpt
    act = hf.transformer.blocks[0].ffn.act
    assert isinstance(act, torch.nn.GELU) and act.approximate == "none"
    assert model.bridge.cfg.act_fn == "gelu" and model.facts.mlp_act == "gelu"
    assert "q, k, v clamped to +-0.5 (clip_qkv), " in repr(model) and "d_mlp=128 (gelu, no gate)" in repr(model)
    assert describe_site("q", facts=model.facts)[1] == "queries (after the clamp to +-0.5 (clip_qkv): what attention " \
                                                       "uses, per head)"
    scores = ("scaled attention scores plus ALiBi's position bias (each head's slope x the key's position: in each "
              "query's row -slope x the query-key distance up to a constant, which the softmax ignores), masked "
              "(masked entries hold the dtype's minimum, as Hugging Face's additive mask gives, not -inf)")
    assert describe_site("scores", facts=model.facts, post_norms=())[1] == scores
    assert describe_site("scores", facts=model.facts)[1] == scores


def test_scores_site_holds_the_alibi_bias(mpt):
    """C3, by hand: hook_attn_scores = clamp(q) clamp(k)^T / sqrt(d_head) + slope x (key - last key), HF's MPT bias."""
    model, hf = mpt
    tokens = random_tokens(1, 7, seed=4)
    got = hs.capture(model, tokens, [hs.site("scores", 0)])[hs.site("scores", 0)][0]  # [head, q, k]
    q, k, _ = (t.reshape(7, HEADS, D_HEAD).transpose(0, 1) for t in _hf_qkv(hf, tokens, 0)[0][0].clamp(-CLIP, CLIP)
               .chunk(3, dim=-1))  # [head, pos, d_head]
    slopes = torch.tensor([2.0 ** -(8 * (i + 1) / HEADS) for i in range(HEADS)])  # 4 heads: 1/4, 1/16, 1/64, 1/256
    bias = slopes[:, None, None] * (torch.arange(7) - 6.0)[None, None, :]  # [head, 1, key]
    want = q @ k.transpose(1, 2) / D_HEAD ** 0.5 + bias
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    torch.testing.assert_close(got[:, causal], want[:, causal], atol=1e-5, rtol=0)


def test_kv_bounds_a_heads_key_norm_by_the_clamp(mpt):
    """A1/B1: the cached keys of a plain HF pass stay within clip x sqrt(d_head) = 0.5 x sqrt(8); kv's key_clamp
    record says so and the first-key sentence names it."""
    import pandas as pd

    from headscope.analyses.kv.analysis import key_clamp_record, key_norm_record
    from headscope.reports.kv_cache_words import _norm_sentence

    model, hf = mpt
    with torch.no_grad():
        cache = hf(random_tokens(2, 9, seed=7), use_cache=True).past_key_values
    norms = pd.DataFrame({"kind": ["key", "key", "value"], "layer": [0, 1, 0], "norm": [1.0, 1.2, 9.0],
                          "norm_max": [1.3, 1.4, 9.0]})
    assert key_norm_record(model, norms) is None  # no key norm
    record = key_clamp_record(model, norms)
    assert record == {"clip_qkv": CLIP, "head_bound": pytest.approx(CLIP * 8 ** 0.5), "largest": 1.4}
    for layer in range(2):
        assert float(cache.layers[layer].keys.norm(dim=-1).max()) <= record["head_bound"] + 1e-6
    s = {"key_norm_ratios": [{"layer": 0, "ratio": 0.8, "ci": [0.79, 0.82], "n": 16}], "key_clamp": record}
    assert _norm_sentence(s) == (
        "The first key's norm over the other keys' per layer (each prompt's ratio, mean over 16 prompts, 95% CI): "
        "layer 0 0.80 [0.79, 0.82]: the first key's norm does not stand out (it is smaller). Every key entry is "
        "clamped to +-0.5 (clip_qkv) before caching, so one head's key norm is at most 0.5 x sqrt(8) = 1.41 (the "
        "largest cached: 1.4): the ratio compares clamped keys.")
    assert "clamped" not in _norm_sentence({k: v for k, v in s.items() if k != "key_clamp"})


def test_header_gives_the_configs_context_on_alibi():
    """A3: 'no fixed context' on every ALiBi model; MPT's max_seq_len bounds it (BLOOM, none named, unchanged)."""
    from headscope.reports.html_report import positions_clause

    head = ", ALiBi positions (no position embedding: each head adds -slope x distance to its attention scores, its slope fixed; "
    assert positions_clause({"positional": "alibi", "fixed_context": True, "n_ctx": 128}) == (
        head + "prompts of at most 128 tokens (the config's maximum length))")
    assert positions_clause({"positional": "alibi", "fixed_context": False, "n_ctx": None}) == head + "no fixed context)"
    assert positions_clause({"positional": "rotary", "n_ctx": 128}) == ""


def test_circuits_refuses_edges_in_one_line(mpt):
    """A4: edge attribution raised KeyError 'blocks.0.attn.hook_q_input' (MPT's bridge takes use_split_qkv_input and
    never fires it); now one line naming why, the lens and DLA kept."""
    from headscope.analyses.circuits.analysis import run
    from headscope.analyses.core.tasks import Task

    model, _ = mpt
    task = Task(name="toy", tokens=random_tokens(2, 6, seed=5), corrupted_tokens=random_tokens(2, 6, seed=6),
                answers=torch.tensor([10, 20]), wrong_answers=torch.tensor([30, 40]))
    res = run(model, task)
    assert res.summary["edges_skipped"] == (
        f"{model.facts.name}: edge attribution needs each head's own q/k/v input; TransformerLens's bridge does not "
        "fire this model's split q/k/v inputs (its MPTALiBiAttentionBridge takes use_split_qkv_input and ignores "
        "it), and q, k and v are clamped to +-0.5 (clip_qkv) after the projection, which headscope's split from the "
        "weights does not model, so edges are not computed; the logit lens and DLA stand.")
    assert len(res.tables["dla"]) and len(res.tables["lens"])


def test_bos_sentence_names_the_eos_standing_in(mpt):
    """C2: the tokenizer defines no bos_token; headscope prepends its eos_token, which the header now says."""
    from headscope.reports.provenance import bos_is_eos, bos_sentence

    model, _ = mpt
    assert model.added_bos() == "<eos>" and bos_is_eos(model.tokenizer)
    assert bos_sentence({"bos_added": "<eos>", "bos_is_eos": True}) == (
        "Prompts run as `<eos>` + your prompt: the tokenizer defines no BOS, so headscope prepends its eos_token as "
        "the BOS, as TransformerLens does; --no-prepend-bos runs them as tokenized.")
    gpt2_like = transformers.PreTrainedTokenizerFast(tokenizer_object=model.tokenizer.backend_tokenizer,
                                                     bos_token="<eos>", eos_token="<eos>")
    assert not bos_is_eos(gpt2_like)  # its own files name the bos_token (GPT-2's <|endoftext|>): "its bos_token"
