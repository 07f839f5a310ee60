"""TransformerLens's direct-logit-attribution recipes on a headscope cache (#32 item 3).

headscope's bridge is unprocessed (no fold_ln), so the references are TransformerLens 4.3 on a
separately loaded bridge of the same checkpoint in compatibility mode (folded norms: the final
norm's weight inside W_U), the model's own logits, and hs.direct_logit_attribution. The models
have random norm weights and biases (conftest's `biased_dirs`), so a recipe that leaves out the
final norm's weight or bias gives other numbers. Also get_full_resid_decomposition,
stack_activation and remove_batch_dim against TransformerLens's ActivationCache on the same
(unprocessed) bridge.
"""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.analyses.core.tasks import Task
from headscope.errors import ConfigError
from tests_support import hf_model, random_tokens

FAMILIES = ("gpt2", "llama")  # LayerNorm with biases; RMSNorm
TOL = 1e-4


@pytest.fixture(scope="module")
def runs(biased_dirs, biased_models):
    """family -> (model, prompt [3, 8], answers [3], wrong [3], output, acts, TL folded cache)."""
    out = {}
    for family in FAMILIES:
        model = biased_models[family]
        folded = hs.load_model(biased_dirs[family], device="cpu").bridge
        folded.enable_compatibility_mode()
        tokens = random_tokens(3, 9, seed=5)
        prompt, answers, wrong = tokens[:, :-1], tokens[:, -1], tokens[:, 2].clone()
        with torch.no_grad():
            output, acts = hs.run_with_cache(model, prompt)
            _, tl = folded.run_with_cache(prompt)
        out[family] = model, prompt, answers, wrong, output, acts, tl
    return out


def close(a, b) -> bool:
    return a.shape == b.shape and (a - b).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_dla_recipes_equal_transformer_lens_on_a_folded_model(family, runs):
    model, _, answers, wrong, _, acts, tl = runs[family]
    with torch.no_grad():
        stack, labels = acts.decompose_resid(pos_slice=-1, return_labels=True)  # [components, batch, d_model]
        tl_stack, tl_labels = tl.decompose_resid(pos_slice=-1, return_labels=True)
        assert labels == tl_labels
        want = tl.logit_attrs(tl_stack, answers, wrong, pos_slice=-1)  # [components, batch]
        assert close(acts.logit_attrs(stack, answers, wrong, pos_slice=-1), want)
        # the plain recipe with this model's own W_U (the issue's): apply_ln applies the norm's weight
        w_u = model.bridge.W_U
        recipe = (acts.decompose_resid(apply_ln=True)[:, :, -1] * (w_u[:, answers] - w_u[:, wrong]).T).sum(-1)
        assert close(recipe, want)
        directions = model.tokens_to_residual_directions(answers) - model.tokens_to_residual_directions(wrong)
        assert close((acts.apply_ln_to_stack(stack, -1, pos_slice=-1) * directions).sum(-1), want)
        # every position: one token per example, broadcast over positions as TransformerLens does
        full = acts.logit_attrs(acts.decompose_resid(), answers, wrong)  # [components, batch, pos]
        assert close(full, tl.logit_attrs(tl.decompose_resid(), answers, wrong))
        # a token given as a string of one token, and a single answer (no incorrect token)
        word = model.tokenizer.decode([int(answers[0])])
        one = acts.logit_attrs(stack[:, :1], word, batch_slice=[0], pos_slice=-1)  # [components, 1]
        assert close(one, acts.logit_attrs(stack[:, :1], int(answers[0]), batch_slice=[0], pos_slice=-1))
        if family == "llama":  # no value biases: TransformerLens's folded heads are these heads
            heads = acts.logit_attrs(acts.stack_head_results(pos_slice=-1), answers, wrong, pos_slice=-1)
            assert close(heads, tl.logit_attrs(tl.stack_head_results(pos_slice=-1), answers, wrong, pos_slice=-1))


@pytest.mark.parametrize("family", FAMILIES)
def test_logit_attrs_sum_to_the_logit_difference_and_match_direct_logit_attribution(family, runs):
    model, prompt, answers, wrong, output, acts, _ = runs[family]
    last = output[:, -1]
    true = last.gather(1, answers[:, None])[:, 0] - last.gather(1, wrong[:, None])[:, 0]  # [batch]
    with torch.no_grad():
        stack, labels = acts.decompose_resid(pos_slice=-1, return_labels=True)
        attrs = acts.logit_attrs(stack, answers, wrong, pos_slice=-1, incl_bias=True)  # [components + 1, batch]
    assert attrs.shape == (len(labels) + 1, 3)
    assert (attrs.sum(0) - true).abs().max().item() <= TOL
    bias_free = family == "llama"
    assert (attrs[-1].abs().max().item() <= TOL) == bias_free  # GPT-2: the final norm's bias along the direction
    # hs.direct_logit_attribution: embeddings, per-layer attention (heads + attn_bias), MLPs, bias rows
    task = Task(name="rand", tokens=prompt, answers=answers, wrong_answers=wrong, metric="logit_diff")
    dla = hs.direct_logit_attribution(model, task).tables["dla"]
    row = dla.pivot(index="component", columns="example", values="contribution")
    got = lambda name: torch.tensor(row.loc[name].to_numpy()).float()  # noqa: E731 - [batch]
    for i, label in enumerate(labels):
        if label in ("embed", "pos_embed"):
            want = got(label)
        elif label.endswith("_attn_out"):
            layer = int(label.split("_")[0])
            want = sum(got(f"L{layer}H{h}") for h in range(model.facts.n_heads)) + got(f"attn_bias{layer}")
        else:
            want = got(f"mlp{int(label.split('_')[0])}")
        assert close(attrs[i].float(), want), label
    extra = [name for name in ("ln_final_bias", "b_U") if name in row.index]
    assert ("ln_final_bias" in extra) == (not bias_free)
    assert close(attrs[-1].float(), sum((got(name) for name in extra), torch.zeros(3)))
    if bias_free:  # per head too
        heads, head_labels = acts.stack_head_results(pos_slice=-1, return_labels=True)
        per_head = acts.logit_attrs(heads, answers, wrong, pos_slice=-1)
        for i, label in enumerate(head_labels):
            assert close(per_head[i].float(), got(label)), label


def test_a_position_sliced_stack_never_broadcasts_silently(runs):
    _, _, answers, wrong, _, acts, _ = runs["gpt2"]
    full = acts.decompose_resid(apply_ln=True)  # [components, batch, pos, d_model]
    plain = acts.decompose_resid()
    assert torch.equal(acts.decompose_resid(apply_ln=True, pos_slice=-1), full[:, :, -1])
    assert close(acts.decompose_resid(apply_ln=True, pos_slice=(2, 5)), full[:, :, 2:5])
    assert close(acts.accumulated_resid(layer=1, apply_ln=True, pos_slice=[0, -1]),
                 acts.accumulated_resid(layer=1, apply_ln=True)[:, :, [0, -1]])
    assert close(acts.stack_head_results(apply_ln=True, pos_slice=-1), acts.stack_head_results(apply_ln=True)[:, :, -1])
    assert torch.equal(acts.apply_ln_to_stack(plain[:, :, -1], pos_slice=-1), full[:, :, -1])
    assert torch.equal(acts.apply_ln_to_stack(plain, batch_slice=[0, 2]), full[:, [0, 2]])
    for sliced in (plain[:, :, -1], plain[:, :, -1:], plain[:, :, 2:5]):  # each used to broadcast (or fail) silently
        with pytest.raises(ConfigError, match="pos_slice"):
            acts.apply_ln_to_stack(sliced)
    with pytest.raises(ConfigError, match="pos_slice"):
        acts.logit_attrs(plain[:, :, -1], answers, wrong)
    with pytest.raises(ConfigError, match="same shape"):
        acts.logit_attrs(plain[:, :, -1], answers, wrong[:2], pos_slice=-1)
    with pytest.raises(ConfigError, match="tokens of shape"):
        acts.logit_attrs(plain[:, :, -1], answers[:2], wrong[:2], pos_slice=-1)


def test_logit_attrs_refuses_a_stack_the_norm_already_scaled(runs):
    """Review 17b B3: logit_attrs on decompose_resid(apply_ln=True) applied the final norm twice (7.352 for a logit
    difference of 12.494 on the Falcon; TransformerLens does the same silently). Every apply_ln output, and a view of
    one, is refused; the unscaled stack still sums to the model's own logit difference (incl_bias)."""
    _, _, answers, wrong, output, acts, _ = runs["gpt2"]
    with torch.no_grad():
        full = acts.decompose_resid(apply_ln=True)  # [components, batch, pos, d_model]
        scaled = [acts.decompose_resid(apply_ln=True, pos_slice=-1), full[:, :, -1],
                  acts.apply_ln_to_stack(acts.decompose_resid(pos_slice=-1), pos_slice=-1),
                  acts.stack_head_results(apply_ln=True, pos_slice=-1), acts.accumulated_resid(apply_ln=True, pos_slice=-1)]
        for stack in scaled:
            with pytest.raises(ConfigError, match="already scaled by a norm"):
                acts.logit_attrs(stack, answers, wrong, pos_slice=-1)
        with pytest.raises(ConfigError, match="already scaled by a norm"):
            acts.logit_attrs(full, answers, wrong)
        attrs = acts.logit_attrs(acts.decompose_resid(pos_slice=-1), answers, wrong, pos_slice=-1, incl_bias=True)
    last = output[:, -1]
    true = last.gather(1, answers[:, None])[:, 0] - last.gather(1, wrong[:, None])[:, 0]  # [batch]
    assert (attrs.sum(0) - true).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_full_decomposition_stack_activation_and_remove_batch_dim_match_transformer_lens(family, runs, biased_dirs):
    model, prompt, _, _, _, acts, _ = runs[family]
    with torch.no_grad():
        _, tl = model.bridge.run_with_cache(prompt)  # TransformerLens's cache on the same unprocessed bridge
    for kwargs in ({}, {"expand_neurons": False}, {"layer": 1, "mlp_input": True}, {"pos_slice": -1}):
        ours, labels = acts.get_full_resid_decomposition(return_labels=True, **kwargs)
        theirs, tl_labels = tl.get_full_resid_decomposition(return_labels=True, **kwargs)
        assert labels == tl_labels and close(ours, theirs), kwargs
    full = acts.get_full_resid_decomposition()
    assert close(full.sum(0), acts["resid_post", -1])
    # apply_ln: TransformerLens's unprocessed cache leaves the final norm's weight out; ours applies it
    hf = hf_model(biased_dirs[family])
    weight = (hf.transformer.ln_f if family == "gpt2" else hf.model.norm).weight.detach()
    assert close(acts.get_full_resid_decomposition(apply_ln=True), tl.get_full_resid_decomposition(apply_ln=True) * weight)
    block = hf.transformer.h[1] if family == "gpt2" else hf.model.layers[1]  # and a block's ln1 / ln2 weight
    ln1, ln2 = (block.ln_1, block.ln_2) if family == "gpt2" else (block.input_layernorm, block.post_attention_layernorm)
    assert close(acts.decompose_resid(layer=1, apply_ln=True), tl.decompose_resid(layer=1, apply_ln=True) * ln1.weight.detach())
    assert close(acts.accumulated_resid(layer=1, mlp_input=True, apply_ln=True),
                 tl.accumulated_resid(layer=1, mlp_input=True, apply_ln=True) * ln2.weight.detach())
    assert close(acts.stack_activation("pattern"), tl.stack_activation("pattern"))
    assert close(acts.stack_activation("scale", 1, "ln1"), tl.stack_activation("scale", 1, "ln1"))
    # one example without its batch axis: every entry as TransformerLens's, and the helpers still work
    with torch.no_grad():
        _, one = hs.run_with_cache(model, prompt[:1])
        _, tl_one = model.bridge.run_with_cache(prompt[:1])
    assert one.remove_batch_dim() is one and not one.has_batch_dim
    tl_one.remove_batch_dim()
    for name, value in one.items():
        assert close(value, tl_one[name]), name
    assert one.output.shape == (prompt.shape[1], model.facts.d_vocab)
    assert close(one.decompose_resid(apply_ln=True), acts.decompose_resid(apply_ln=True)[:, 0])
    assert close(one.stack_head_results(apply_ln=True, pos_slice=-1), acts.stack_head_results(apply_ln=True)[:, 0, -1])
    with pytest.raises(ConfigError, match="one example"):
        acts.remove_batch_dim()


def test_logit_attrs_in_bfloat16_warn_once_that_rows_are_rounded(biased_dirs):
    """Review 20a C (redone): on a bfloat16 model the cached writes and the model's own logits are bfloat16, so the
    rows (bias row included) sum to the model's logit difference only up to that rounding: a warning says so once per
    model, and the gap is within a few bfloat16 steps of the logits' size (none in float32: no warning there)."""
    import warnings

    from headscope.analyses.core import metrics
    from headscope.errors import HeadscopeWarning

    model = hs.load_model(biased_dirs["llama"], device="cpu", dtype=torch.bfloat16)
    tokens = random_tokens(3, 9, seed=5)
    prompt, answers, wrong = tokens[:, :-1], tokens[:, -1], tokens[:, 2].clone()
    with torch.no_grad():
        output, acts = hs.run_with_cache(model, prompt)
    stack = acts.decompose_resid(pos_slice=-1)  # [components, batch, d_model] bfloat16
    with pytest.warns(HeadscopeWarning, match="in bfloat16: the cached writes are bfloat16"):
        rows = acts.logit_attrs(stack, answers, wrong, pos_slice=-1, incl_bias=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeadscopeWarning)
        acts.logit_attrs(stack, answers, wrong, pos_slice=-1, incl_bias=True)  # said once per model
    last = output[:, -1].float()
    rows3 = torch.arange(3)
    want = last[rows3, answers] - last[rows3, wrong]  # [3] the model's own logit difference
    size = float((last[rows3, answers].abs() + last[rows3, wrong].abs()).max())
    gap = float((rows.detach().float().sum(0) - want).abs().max())
    assert gap <= 8 * metrics.noise_floor(torch.bfloat16, size), (gap, size)
