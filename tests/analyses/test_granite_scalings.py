"""Review 15a A1-A3, A5, A6, C3: Granite's scalings (embedding_multiplier, residual_multiplier,
attention_multiplier, logits_scaling) in every place headscope unembeds or decomposes by hand.

One random-init tiny GraniteForCausalLM in float32 (embedding x12, residual writes x0.22, attention
x1/128, logits /8). The references are plain Hugging Face: its logits, and a hand decomposition of
its residual stream from hooks on its own submodules, read through its final RMSNorm and lm_head.
"""
from __future__ import annotations

import warnings

import pandas as pd
import pytest
import torch

import headscope as hs
from headscope.analyses.circuits import analysis as circuits
from headscope.errors import HeadscopeWarning
from tests_support import build_tiny_model, random_tokens


@pytest.fixture(scope="module")
def granite(tmp_path_factory):
    """(HookedModel, plain HF GraniteForCausalLM) on the same random weights, float32."""
    from transformers import GraniteForCausalLM

    path = build_tiny_model("granite", tmp_path_factory.mktemp("granite") / "granite")
    hf = GraniteForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    assert (hf.config.logits_scaling, hf.config.residual_multiplier, hf.config.embedding_multiplier) == (8.0, 0.22, 12.0)
    return hs.load_model(path, device="cpu", dtype="float32"), hf


def _task(n: int = 3, pos: int = 7):
    tokens = random_tokens(n, pos + 1, seed=3)
    prompt = tokens[:, :-1]
    return hs.Task(name="rand", tokens=prompt, answers=tokens[:, -1], wrong_answers=prompt[:, 2].clone(),
                   metric="logit_diff")


def _hand_dla(hf, tokens: torch.Tensor, answers: torch.Tensor, wrong: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-component DLA at the last position from HF's own modules: embed x embedding_multiplier, each
    attention and MLP output x residual_multiplier, through the final RMSNorm's frozen scale and weight,
    onto (W_U[a] - W_U[w]) / logits_scaling. {name: [batch]}."""
    cfg, got, handles = hf.config, {}, []
    handles.append(hf.model.embed_tokens.register_forward_hook(lambda m, a, o: got.__setitem__("embed", o[:, -1])))
    for l, layer in enumerate(hf.model.layers):
        handles.append(layer.self_attn.register_forward_hook(lambda m, a, o, l=l: got.__setitem__(f"attn{l}", o[0][:, -1])))
        handles.append(layer.mlp.register_forward_hook(lambda m, a, o, l=l: got.__setitem__(f"mlp{l}", o[:, -1])))
    with torch.no_grad():
        hf(tokens)
    for h in handles:
        h.remove()
    comps = {"embed": got["embed"] * cfg.embedding_multiplier}
    comps.update({k: v * cfg.residual_multiplier for k, v in got.items() if k != "embed"})
    resid = sum(comps.values())  # [batch, d_model]
    norm = hf.model.norm
    scale = torch.rsqrt(resid.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)  # [batch, 1]
    w_u = hf.lm_head.weight  # [vocab, d_model]
    d = (w_u[answers] - w_u[wrong]) * norm.weight / cfg.logits_scaling  # [batch, d_model]
    return {k: (v * scale * d).sum(-1) for k, v in comps.items()}


def test_granite_facts_and_header(granite):
    """The facts carry the scalings (read from the bridge's adapter and blocks, as HF's config sets them) and the
    report header names them (C3); a model without scalings gets no clause."""
    from headscope.reports.html_report import scalings_clause

    model, _ = granite
    f = model.facts
    assert (f.logit_scale, f.residual_scale, f.embed_scale, f.attention_scale) == (0.125, 0.22, 12.0, 0.0078125)
    assert scalings_clause(vars(f)) == (
        ", scalings: embedding x12, residual writes x0.22, attention scores x0.0078125 (not 1/sqrt(d_head)), "
        "logits x0.125 (1/8) (the circuits and mlp numbers include them)")
    assert scalings_clause({"embed_scale": 1.0, "residual_scale": 1.0, "logit_scale": 1.0, "attention_scale": 0.25,
                            "d_head": 16}) == ""


def test_granite_dla_sums_to_hf_logit_difference(granite):
    """A1: DLA's rows sum to HF's own logit difference (it was 8x), and embed and each mlpN equal the hand
    decomposition from HF's modules; the summary's reconstruction check passes."""
    model, hf = granite
    task = _task()
    with torch.no_grad():
        logits = hf(task.tokens).logits[:, -1]
    rows = torch.arange(len(task))
    ld = logits[rows, task.answers] - logits[rows, task.wrong_answers]  # [batch]
    res = circuits.direct_logit_attribution(model, task)
    dla = res.tables["dla"]
    sums = torch.tensor(dla.groupby("example").contribution.sum().sort_index().to_numpy()).float()
    assert torch.allclose(sums, ld, atol=1e-5), (sums, ld)
    hand = _hand_dla(hf, task.tokens, task.answers, task.wrong_answers)
    for name in ("embed", "mlp0", "mlp1"):
        ours = torch.tensor(dla[dla.component == name].sort_values("example").contribution.to_numpy()).float()
        assert torch.allclose(ours, hand[name], atol=1e-5), (name, ours, hand[name])
    heads = dla[dla.kind.isin(["head", "attn_bias"]) & (dla.layer == 1)].groupby("example").contribution.sum()
    assert torch.allclose(torch.tensor(heads.sort_index().to_numpy()).float(), hand["attn1"], atol=1e-5)
    s = res.summary
    assert s["dla_reconstruction_ok"] and s["dla_max_reconstruction_error"] < 1e-5


def test_granite_lens_final_row_is_hf_output(granite):
    """A2: the lens's final_post row is HF's output (log-probabilities and logit differences), with
    hs.logit_lens's per-layer summary's last entry HF's mean log-probability."""
    model, hf = granite
    task = _task()
    with torch.no_grad():
        lp = hf(task.tokens).logits[:, -1].log_softmax(-1)  # [batch, vocab]
    res = hs.logit_lens(model, task, lens_target="answer")
    lens = res.tables["lens"]
    last = lens[lens.is_answer & (lens.stage == "final_post")].sort_values("example")
    want = lp.gather(1, task.answers[:, None])[:, 0]
    assert torch.allclose(torch.tensor(last.logprob.to_numpy()).float(), want, atol=1e-5)
    diff = want - lp.gather(1, task.wrong_answers[:, None])[:, 0]
    assert torch.allclose(torch.tensor(last.logit_diff.to_numpy()).float(), diff, atol=1e-5)
    assert res.summary["lens_final_output_error"] < 1e-5


def test_granite_logit_attrs_sum_to_hf_logit_difference(granite):
    """A3: the README's recipe, decompose_resid then logit_attrs(incl_bias=True), sums to HF's logit
    difference (it was 8x); tokens_to_residual_directions is W_U's column / logits_scaling."""
    model, hf = granite
    tokens = random_tokens(1, 8, seed=4)
    a, w = int(tokens[0, 3]), int(tokens[0, 5])
    with torch.no_grad():
        ref = hf(tokens).logits[0, -1]
    _, cache = hs.run_with_cache(model, tokens)
    parts = cache.decompose_resid(pos_slice=-1)
    attrs = cache.logit_attrs(parts, a, w, pos_slice=-1, incl_bias=True)
    assert float(attrs.detach().sum()) == pytest.approx(float(ref[a] - ref[w]), abs=1e-5)
    assert torch.allclose(model.tokens_to_residual_directions(a), hf.lm_head.weight[a] / 8.0)


def test_granite_mlp_values_as_written_and_in_logits(granite):
    """A5: the mlp section's value vectors are what the block writes (down_proj's column x residual_multiplier)
    and their logits are the model's (x W_U / logits_scaling), by hand from HF's weights."""
    from headscope.analyses.mlp.analysis import value_logits, written_values

    model, hf = granite
    v = hf.model.layers[1].mlp.down_proj.weight.T * 0.22  # [d_mlp, d_model]
    assert torch.allclose(written_values(model, 1), v, atol=1e-6)
    assert torch.allclose(value_logits(model, 1, neurons=torch.arange(5)), v[:5] @ hf.lm_head.weight.T / 8.0, atol=1e-5)


def test_granite_resume_check_passes_without_warning(granite):
    """A6: resuming reproduces the full pass (its logits took no / logits_scaling: a 58-logit gap and a warning on
    every Granite run); the z shortcut, off by design on scaled blocks, is not warned as a failure."""
    from headscope.execution import resume

    model, hf = granite
    tokens = random_tokens(2, 6, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        support = resume.supports(model)
    assert support.ok and support.prefix
    with torch.no_grad():
        ref = hf(tokens).logits
        x = hf.model.norm.register_forward_pre_hook(lambda m, a: store.__setitem__("x", a[0]))
        store: dict = {}
        hf(tokens)
        x.remove()
        got = resume.logits_of(model, store["x"])
    assert torch.allclose(got, ref, atol=1e-5)


def test_dla_reconstruction_beyond_tolerance_warns():
    """The reconstruction error is checked: rows summing to 8x the model's logit difference (A1's bug) warn and
    record dla_reconstruction_ok False; rows within rounding do not."""
    def frames(total: float):
        dla = pd.DataFrame({"example": [0, 0], "component": ["embed", "mlp0"], "kind": ["embed", "mlp"],
                            "layer": [pd.NA, 0], "head": [pd.NA, pd.NA], "contribution": [total / 2, total / 2]})
        logits = pd.DataFrame({"example": [0], "final_logit": [0.5], "logit_before_softcap": [0.5]})
        return dla, logits

    with pytest.warns(HeadscopeWarning, match="miss the model's own logit"):
        s = circuits.dla_summary(*frames(4.0), "answer - wrong_answer", 2)
    assert s["dla_reconstruction_ok"] is False and s["dla_max_reconstruction_error"] == pytest.approx(3.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        s = circuits.dla_summary(*frames(0.5 + 1e-7), "answer - wrong_answer", 2)
    assert s["dla_reconstruction_ok"] is True


def test_granite_moe_dla_sums_to_hf_logit_difference(tmp_path):
    """The scalings are read from the bridge (adapter and blocks), not per architecture: GraniteMoe's DLA rows
    sum to its plain HF logit difference too."""
    import transformers

    from tests_support import N_WORDS, SPECIALS, normal_matrices, save_random_checkpoint, word_tokenizer

    cfg = transformers.GraniteMoeConfig(
        vocab_size=len(SPECIALS) + N_WORDS, bos_token_id=2, eos_token_id=3, pad_token_id=1, hidden_size=32,
        intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, num_local_experts=2,
        num_experts_per_tok=1, max_position_embeddings=32, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=0.0078125, logits_scaling=8.0)
    hf = save_random_checkpoint(cfg, tmp_path, word_tokenizer(), init=normal_matrices()).eval()
    model = hs.load_model(tmp_path, device="cpu", dtype="float32")
    assert (model.facts.logit_scale, model.facts.residual_scale) == (0.125, 0.22)
    task = _task(n=2, pos=6)
    with torch.no_grad():
        logits = hf(task.tokens).logits[:, -1]
    rows = torch.arange(len(task))
    ld = logits[rows, task.answers] - logits[rows, task.wrong_answers]
    dla = circuits.direct_logit_attribution(model, task).tables["dla"]
    sums = torch.tensor(dla.groupby("example").contribution.sum().sort_index().to_numpy()).float()
    assert torch.allclose(sums, ld, atol=1e-5), (sums, ld)


def test_dla_reconstruction_tolerance_sized_on_the_logits():
    """Review 15av A1: float32 rows of about 1 logit that miss logits of 4.8 each (|a| + |w| = 9.6) by 2.2e-6 are
    rounding, not an error (the old tolerance, 16 eps x sum |rows| = 1.9e-6, warned). By hand the tolerance is
    4 eps x (sqrt(2) x sum |rows| + 9.6), plus the model's own rounding, eps x (sum |rows| + 9.6) (review 16c B4)."""
    dla = pd.DataFrame({"example": [0, 0], "component": ["embed", "mlp0"], "kind": ["embed", "mlp"],
                        "layer": [pd.NA, 0], "head": [pd.NA, pd.NA], "contribution": [0.6, 0.4 + 2.2e-6]})
    logits = pd.DataFrame({"example": [0], "final_logit": [1.0], "logit_before_softcap": [1.0],
                           "logit_size": [9.6]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        s = circuits.dla_summary(dla, logits, "answer - wrong_answer", 2)
    eps = torch.finfo(torch.float32).eps
    assert s["dla_reconstruction_ok"] is True
    assert s["dla_reconstruction_tolerance"] == pytest.approx(4 * eps * (2 ** 0.5 * (1.0 + 2.2e-6) + 9.6)
                                                              + eps * (1.0 + 2.2e-6 + 9.6))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dla_reconstruction_correct_rows_pass_scaled_rows_warn(granite, dtype):
    """15av A1: the tiny Granite's own rows pass the check in float32 and bfloat16; the same rows x8 (the
    logits_scaling left out) warn. logit_size is HF's |logit(answer)| + |logit(wrong)|."""
    model, hf = granite
    if dtype == "bfloat16":
        model = hs.load_model(hf.config._name_or_path, device="cpu", dtype="bfloat16")
    task = _task()
    _, dla, logits, _, direction, _ = circuits._collect(model, task, circuits.CircuitsConfig(), lens=False, dla=True)
    if dtype == "float32":
        with torch.no_grad():
            out = hf(task.tokens).logits[:, -1]
        rows = torch.arange(len(task))
        hand = out[rows, task.answers].abs() + out[rows, task.wrong_answers].abs()
        assert torch.allclose(torch.tensor(logits.logit_size.to_numpy()).float(), hand, rtol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        assert circuits.dla_summary(dla, logits, direction, 2, dtype=model.dtype)["dla_reconstruction_ok"]
    scaled = dla.assign(contribution=dla.contribution * 8)
    with pytest.warns(HeadscopeWarning, match="miss the model's own logit"):
        assert not circuits.dla_summary(scaled, logits, direction, 2, dtype=model.dtype)["dla_reconstruction_ok"]


def _bloom_like(error: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Review 16c B4's bfloat16 BLOOM by its sizes: 28 rows (sum |rows| 39.0) summing to a logit difference of 10,
    logits of |a| + |w| = 18, the rows off the model's logit difference by `error`."""
    values = [24.5 / 14] * 14 + [-14.5 / 14] * 14  # 28 rows: sum 24.5 - 14.5 = 10, sum |rows| 24.5 + 14.5 = 39
    dla = pd.DataFrame({"example": [0] * 28, "component": [f"c{i}" for i in range(28)], "kind": ["mlp"] * 28,
                        "layer": [pd.NA] * 28, "head": [pd.NA] * 28, "contribution": values})
    logits = pd.DataFrame({"example": [0], "final_logit": [10.0 + error], "logit_before_softcap": [10.0 + error],
                           "logit_size": [18.0]})
    return dla, logits


def test_bfloat16_dla_tolerance_from_the_rounding_steps_catches_five_percent():
    """Review 16c B4: on BLOOM's sizes the old bfloat16 tolerance, 4 eps x (sqrt(28) x 39 + 18) = 6.9, passed any
    error below 69% of a logit difference of 10. Now, by hand, eps_bf16 x (39 + 18) = 0.445 plus the float32
    arithmetic's 4 eps_32 x (sqrt(28) x 39 + 18): the measured 0.049 passes, 5% of the logit difference (0.5) warns."""
    dla, logits = _bloom_like(0.049)
    assert abs(dla.contribution.sum() - 10.0) < 1e-12 and dla.contribution.abs().sum() == pytest.approx(39.0)
    eps16, eps32 = torch.finfo(torch.bfloat16).eps, torch.finfo(torch.float32).eps
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        s = circuits.dla_summary(dla, logits, "answer - wrong_answer", 2, dtype=torch.bfloat16)
    assert s["dla_reconstruction_ok"] is True
    assert s["dla_reconstruction_tolerance"] == pytest.approx(eps16 * (39 + 18) + 4 * eps32 * (28 ** 0.5 * 39 + 18))
    dla, logits = _bloom_like(0.5)
    with pytest.warns(HeadscopeWarning, match="miss the model's own logit"):
        assert not circuits.dla_summary(dla, logits, "answer - wrong_answer", 2, dtype=torch.bfloat16)["dla_reconstruction_ok"]


def test_granite_neuron_rows_are_the_writes_as_added(granite):
    """Each layer's neuron rows of get_full_resid_decomposition sum to HF's MLP output x residual_multiplier
    (the write the block adds; they missed the x0.22), and the bias row of the bias-free model is ~0."""
    model, hf = granite
    tokens = random_tokens(1, 8, seed=5)
    got, handles = {}, []
    for l, layer in enumerate(hf.model.layers):
        handles.append(layer.mlp.register_forward_hook(lambda m, a, o, l=l: got.__setitem__(l, o[0, -1])))
    with torch.no_grad():
        hf(tokens)
    for h in handles:
        h.remove()
    _, cache = hs.run_with_cache(model, tokens)
    stack, labels = cache.get_full_resid_decomposition(pos_slice=-1, return_labels=True)
    for l in got:
        rows = [i for i, name in enumerate(labels) if name.startswith(f"L{l}N")]
        assert rows, labels[:5]
        assert torch.allclose(stack[rows, 0].sum(0), got[l] * hf.config.residual_multiplier, atol=1e-5)
    assert float(stack[labels.index("bias"), 0].abs().max()) < 1e-4
