"""Multi-head latent attention (DeepSeek-V3, review 15d A1/A5/C1/C4): facts, per-head sites and head ablation
checked against plain Hugging Face (hooks on o_proj's input, expand_kv's outputs); what stays refused, in one line."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.analyses.core.contract import model_reasons
from tests_support import hf_model, random_tokens

N_HEADS, D_QK, D_V = 4, 20, 16  # tests_support's deepseek_v3: qk_nope 12 + qk_rope 8, v_head_dim 16


@pytest.fixture(scope="module")
def mla(deepseek_v3_dir):
    path = deepseek_v3_dir
    return path, hs.load_model(str(path), dtype="float32"), hf_model(path).float()


def _hf_last_logprobs(hf, tokens, zero: slice | None = None, layer: int = 1):
    """[batch, d_vocab] log-probabilities at the last position, o_proj's input columns `zero` set to 0 by hand."""
    def pre(module, args):
        x = args[0].clone()
        x[..., zero] = 0
        return (x,)

    handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre) if zero is not None else None
    try:
        with torch.no_grad():
            return hf(tokens).logits[:, -1].float().log_softmax(-1)
    finally:
        if handle is not None:
            handle.remove()


def test_mla_facts_and_header(mla):
    _, model, hf = mla
    cfg = hf.config
    assert model.facts.mla == {"d_head_qk": cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, "d_head_rope": 8,
                               "d_head_v": cfg.v_head_dim, "kv_lora_rank": 32, "q_lora_rank": 48}
    # a head's z is v_head_dim wide: n_heads x d_head fills o_proj's input (config.head_dim is the rotary part, 8)
    assert model.facts.d_head == D_V and N_HEADS * model.facts.d_head == hf.model.layers[0].self_attn.o_proj.in_features
    assert model.facts.attention_layout == "multi-head latent attention"
    hash(model.facts)  # facts stay hashable with the layout dict
    from headscope.models.hooked_model import mla_words

    assert mla_words(model.facts.mla) == ("multi-head latent attention (q/k heads 20 wide of which 8 rotary, v heads "
                                          "16, K/V from a latent of 32, q from one of 48)")


def test_mla_per_head_sites_match_hf(mla):
    """hook_q/k/v [batch, pos, head, d] (the sites table) and hook_z [batch, pos, head, v_head_dim] equal HF's: k's
    unrotated part and v worked by hand from HF's own modules (latent -> kv_a_layernorm -> kv_b_proj, split per head;
    the same on every transformers version), z as o_proj's input."""
    _, model, hf = mla
    tokens = random_tokens(2, 9)
    rec: dict[str, torch.Tensor] = {}
    attn = hf.model.layers[1].self_attn
    handles = [attn.o_proj.register_forward_pre_hook(lambda mod, args: rec.__setitem__("z", args[0].detach())),
               attn.register_forward_pre_hook(lambda mod, args, kwargs: rec.__setitem__(
                   "x", (args[0] if args else kwargs["hidden_states"]).detach()), with_kwargs=True)]
    try:
        with torch.no_grad():
            hf(tokens)
            cfg = hf.config
            kv_nope = attn.kv_a_proj_with_mqa(rec["x"])[..., :cfg.kv_lora_rank]  # [batch, pos, latent]
            kv = attn.kv_b_proj(attn.kv_a_layernorm(kv_nope)).view(2, 9, N_HEADS, -1)
            k_nope, v = kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)  # [batch, pos, head, d] each
    finally:
        for handle in handles:
            handle.remove()
    got = hs.capture(model, tokens, [hs.site(k, 1) for k in ("q", "k", "v", "z")])
    assert tuple(got["blocks.1.attn.hook_q"].shape) == (2, 9, N_HEADS, D_QK)
    assert tuple(got["blocks.1.attn.hook_k"].shape) == (2, 9, N_HEADS, D_QK)
    torch.testing.assert_close(got["blocks.1.attn.hook_k"][..., :cfg.qk_nope_head_dim], k_nope, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["blocks.1.attn.hook_v"], v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["blocks.1.attn.hook_z"], rec["z"].view(2, 9, N_HEADS, D_V), atol=1e-5, rtol=1e-5)


def test_mla_ablate_zeroes_the_true_head(mla):
    """hs.ablate(heads=[(1, h)]) = HF with o_proj's input columns [16h, 16h + 16) zeroed (not [8h, 8h + 8))."""
    _, model, hf = mla
    tokens = random_tokens(2, 9)
    for head in range(N_HEADS):
        expected = _hf_last_logprobs(hf, tokens, slice(D_V * head, D_V * head + D_V))
        with torch.no_grad(), hs.ablate(model, heads=[(1, head)]):
            got = model(tokens)[:, -1].float().log_softmax(-1)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    narrow = _hf_last_logprobs(hf, tokens, slice(16, 24))  # old code's "head 2": half of true head 1
    assert (narrow - _hf_last_logprobs(hf, tokens, slice(32, 48))).abs().max() > 1e-3


def test_mla_head_results_sum_to_o_proj(mla):
    """hook_result's head h = z_h @ o_proj.weight[:, 16h:16h+16].T, by hand from HF's weights."""
    _, model, hf = mla
    tokens = random_tokens(1, 7)
    got = hs.capture(model, tokens, [hs.site("z", 1), hs.site("result", 1)])
    z, result = got["blocks.1.attn.hook_z"], got["blocks.1.attn.hook_result"]
    w = hf.model.layers[1].self_attn.o_proj.weight.detach()  # [d_model, n_heads * v_head_dim]
    hand = torch.stack([z[..., h, :] @ w[:, D_V * h:D_V * h + D_V].T for h in range(N_HEADS)], dim=-2)
    torch.testing.assert_close(result, hand, atol=1e-5, rtol=1e-5)


def test_mla_runs_every_family_and_refuses_only_edges_in_one_line(mla):
    """attribution, patching and circuits run on MLA (no contract reason: tests/analyses/test_mla_circuits_patching.py
    checks their numbers against HF); what still needs per-head q/k/v weights is refused in one named line: path
    patching into a head's q/k/v, and circuits' edges (the lens and DLA kept)."""
    from headscope.analyses import attribution, circuits, patching
    from headscope.analyses.core.tasks import Task
    from headscope.errors import ConfigError

    _, model, _ = mla
    for family in (attribution, patching, circuits):
        assert model_reasons(family.FAMILY.needs, model) == []
    tokens = random_tokens(2, 7)
    corrupted = tokens.clone()
    corrupted[:, 2] = random_tokens(2, 7, seed=3)[:, 2]
    task = Task(name="rand", tokens=tokens[:, :-1], answers=tokens[:, -1], wrong_answers=tokens[:, 1],
                corrupted_tokens=corrupted[:, :-1])
    with pytest.raises(ConfigError, match="^Path patching into a receiver's k .* multi-head latent attention"):
        hs.path_patching(model, task, receivers=[(1, 0)], component="k")
    res = circuits.run(model, task, circuits.CircuitsConfig(quick=True))
    assert res.summary["edges_skipped"] == circuits.analysis.MLA_EDGES and "edges" not in res.tables
    assert {"lens", "dla"} <= set(res.tables) and res.summary["dla_reconstruction_ok"]


def test_mla_head_importance_zero_matches_hf(mla):
    """heads runs on MLA (it needs only z and o_proj): layer 1's zero-ablation importance = the drop of the mean
    next-token log-probability with o_proj's input columns [16h, 16h + 16) zeroed in HF."""
    _, model, hf = mla
    tokens = random_tokens(2, 9)

    def lm(zero: slice | None = None) -> float:
        handle = None
        if zero is not None:
            def pre(module, args):
                x = args[0].clone()
                x[..., zero] = 0
                return (x,)
            handle = hf.model.layers[1].self_attn.o_proj.register_forward_pre_hook(pre)
        try:
            with torch.no_grad():
                logp = hf(tokens).logits[:, :-1].float().log_softmax(-1)
        finally:
            if handle is not None:
                handle.remove()
        return float(logp.gather(-1, tokens[:, 1:, None]).mean())

    df = hs.head_importance(model, tokens, methods=("zero",)).df.set_index(["layer", "head"])
    base = lm()
    for head in range(N_HEADS):
        expected = base - lm(slice(D_V * head, D_V * head + D_V))
        assert df.loc[(1, head), "importance"] == pytest.approx(expected, abs=1e-5)


def test_mla_sites_command_names_the_widths(mla, capsys):
    """`headscope sites` says which d_head each per-head site has on MLA (HF: q/k 12 + 8, rot_k shared, v 16)."""
    from headscope.cli import main

    path, _, hf = mla
    assert main(["-q", "sites", "--model", str(path), "--device", "cpu"]) == 0
    cfg = hf.config
    assert (f"multi-head latent attention: d_head is {cfg.qk_nope_head_dim + cfg.qk_rope_head_dim} for q and k "
            f"({cfg.qk_rope_head_dim} of it rotary; rot_q, rot_k: that rotary part, rot_k one key shared by all heads) "
            f"and {cfg.v_head_dim} for v and z") in capsys.readouterr().out


def test_mla_attention_scale_is_hf_scaling(mla):
    """16v-A1: the manifest said attention_scale null next to d_head 16 (v's width), which reads as 1/4; HF scales
    MLA's scores by qk_head_dim^-0.5 = 20^-0.5 (times DeepSeek's YaRN mscale^2 where the rope sets mscale_all_dim).
    Both against HF's own DeepseekV3Attention.scaling; the header's scalings clause stays silent on the plain case
    and names the q/k width where the scale differs from it."""
    import types

    import transformers
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    from headscope.models.hooked_model import _attention_multiplier
    from headscope.reports.html_report import scalings_clause

    _, model, hf = mla
    assert model.facts.attention_scale == pytest.approx(hf.model.layers[0].self_attn.scaling, rel=1e-12)
    assert model.facts.attention_scale == pytest.approx(0.2236068, abs=1e-7)  # 20^-0.5, not 16^-0.5 = 0.25
    assert scalings_clause(vars(model.facts)) == ""
    cfg = transformers.DeepseekV3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32,
        qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=16, num_hidden_layers=1, max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                         "original_max_position_embeddings": 64, "rope_theta": 10000.0})
    yarn = _attention_multiplier(types.SimpleNamespace(original_model=types.SimpleNamespace(config=cfg)))
    hf_scaling = DeepseekV3Attention(cfg, 0).scaling
    assert yarn == pytest.approx(hf_scaling, rel=1e-12)
    assert hf_scaling == pytest.approx(0.2899011, abs=1e-7)  # (0.1 ln 4 + 1)^2 / sqrt(20)
    facts = {**vars(model.facts), "attention_scale": yarn}
    assert scalings_clause(facts) == (", scalings: attention scores x0.289901 (not 1/sqrt(20), the q/k head width) "
                                      "(the circuits and mlp numbers include them)")


def test_mla_sites_rows_say_what_the_cache_holds(mla, capsys):
    """16v-C2: `headscope sites` called hook_rot_k "what the KV cache stores", [batch, pos, kv_head, d_head]; on MLA it
    is one rotary key of qk_rope_head_dim (8) shared by all heads, and HF's cache holds it beside the normed latent
    of kv_lora_rank (32). The rows are checked whole; the printed rot_k shape against a capture."""
    from headscope.cli import main

    path, model, hf = mla
    assert main(["-q", "sites", "--model", str(path), "--device", "cpu"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  blocks.1.attn")}
    cfg = hf.config
    rope, latent, qk = cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    assert rows["blocks.1.attn.hook_rot_k"] == (
        f"  {'blocks.1.attn.hook_rot_k':<40} {f'[batch, pos, 1, {rope}]':<36} the rotary key after RoPE, one shared "
        f"by all heads; the KV cache stores it and the normed latent ({latent} wide), not per-head keys")
    assert rows["blocks.1.attn.hook_k"] == (
        f"  {'blocks.1.attn.hook_k':<40} {f'[batch, pos, head, {qk}]':<36} per-head keys: 12 numbers expanded from "
        f"the cached latent, then the {rope} of the shared rotary key; not cached")
    assert "what the KV cache stores" not in "".join(rows.values())
    got = hs.capture(model, random_tokens(2, 5), [hs.site("rot_k", 1), hs.site("k", 1)])
    assert tuple(got[hs.site("rot_k", 1)].shape) == (2, 5, 1, rope)
    assert tuple(got[hs.site("k", 1)].shape) == (2, 5, N_HEADS, qk)
