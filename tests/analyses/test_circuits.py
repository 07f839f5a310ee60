"""The circuits analysis, part 1: the logit lens and direct logit attribution against
TransformerLens 4.3's own tools (transformer_lens.tools.analysis) on the same weights.

Besides the shared tiny models (unit LayerNorm weights, zero biases), each test family also
runs on a copy with random norm weights and biases (conftest's `biased_dirs`), so the final-norm scale, its weight and
bias, the value biases and the output biases all enter the numbers being compared.

TransformerLens 4.3's compatibility mode centres W_U over d_model (LayerNorm models: fold_ln)
and over the vocabulary (center_unembed). For an RMSNorm model with a square W_U (the shared
tiny Llama: d_model = d_vocab = 64) it centres over d_model instead of over the vocabulary, so
there its DLA reads the direction d - mean(d) (mean over d_model). Centring over d_model changes
nothing for LayerNorm models (every write is centred); centring over the vocabulary cancels in a
logit difference. The random-bias copies have d_model = 48 (W_U not square).
"""
from __future__ import annotations

import pytest
import torch
from scipy import stats

import headscope as hs
from headscope.analyses.circuits import analysis as circuits
from headscope.analyses.circuits import dla as dla_mod
from headscope.analyses.core.tasks import Task
from headscope.errors import ConfigError
from tests_support import random_tokens

FAMILIES = ("gpt2", "llama", "neox")


def _task(n: int = 3, pos: int = 8, seed: int = 5, wrong: bool = True) -> Task:
    tokens = random_tokens(n, pos + 1, seed=seed)
    answers, prompt = tokens[:, -1], tokens[:, :-1]
    return Task(name="rand", tokens=prompt, answers=answers,
                wrong_answers=prompt[:, 2].clone() if wrong else None, metric="logit_diff" if wrong else "logprob")


def _models(kind: str, family: str, tiny_dirs, tiny_models, biased_dirs):
    """(our model, a separately loaded copy for TransformerLens's compatibility mode)."""
    if kind == "tiny":
        return tiny_models[family], hs.load_model(tiny_dirs[family], device="cpu")
    path = biased_dirs[family]
    return hs.load_model(path, device="cpu"), hs.load_model(path, device="cpu")


def test_logit_lens_and_dla_on_gemma2s_final_softcap(arch_dirs):
    """#34 review 6 (A10): Gemma 2 soft-caps its final logits (cap * tanh(logits / cap), cap 30); the lens's last
    row is the model's own output, against plain Hugging Face logits. DLA's rows sum to the logit difference
    before the cap (Hugging Face's lm_head on its final normed stream), the summary records it beside the capped
    output (HF's logits) and the finding names both. The final norm's weight is raised so the logits reach the
    cap's curved part (uncapped, the logit differences would be off by far more than rounding)."""
    from transformers import AutoModelForCausalLM

    from headscope.reports.findings import finding

    path = arch_dirs["gemma2"]
    model = hs.load_model(path, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager").eval()
    assert hf.config.final_logit_softcapping == 30.0
    store = {}
    hook = hf.model.norm.register_forward_hook(lambda m, a, out: store.__setitem__("normed", out[:, -1]))
    with torch.no_grad():
        for m in (model.bridge.original_model, hf):  # Gemma's RMSNorm scales by (1 + weight)
            m.model.norm.weight.fill_(5.0)
        task = _task(n=3, pos=6)
        logits = hf(task.tokens).logits[:, -1].float()  # [batch, vocab], capped by Hugging Face's head
        hook.remove()
        raw_hf = hf.lm_head(store["normed"]).float()  # [batch, vocab]: before the cap
    rows = torch.arange(len(task))
    before = raw_hf[rows, task.answers] - raw_hf[rows, task.wrong_answers]  # [batch]
    after = logits[rows, task.answers] - logits[rows, task.wrong_answers]
    assert (before - after).abs().min() > 0.1, (before, after)  # the cap bites on every example
    dla = circuits.direct_logit_attribution(model, task)
    s = dla.summary
    sums = torch.tensor(dla.tables["dla"].groupby("example").contribution.sum().sort_index().to_numpy()).float()
    assert torch.allclose(sums, before, atol=1e-3)
    assert s["dla_final_softcap"] == 30.0 and s["dla_max_reconstruction_error"] < 1e-3
    assert s["dla_logit_before_softcap"] == pytest.approx(float(before.mean()), abs=1e-3)
    assert s["dla_final_logit"] == pytest.approx(float(after.mean()), abs=1e-3)
    text = finding("circuits", s)
    assert (f"The components sum to the logit difference before the model's final logit soft-cap (30 tanh(logit / "
            f"30)): {before.mean():.2f}; the model's output, after the cap, is {after.mean():.2f}.") in text, text
    assert "of a final logit difference" not in text
    _dla_figures_say_before_the_cap(dla, before, after)
    res = circuits.logit_lens(model, task, circuits.CircuitsConfig(lens_target="answer"))
    lens = res.tables["lens"]
    last = lens[lens.is_answer & (lens.layer == model.facts.n_layers)].sort_values("example")
    lp = logits.log_softmax(-1)
    diff = (lp.gather(1, task.answers[:, None]) - lp.gather(1, task.wrong_answers[:, None]))[:, 0]
    assert torch.allclose(torch.tensor(last.logprob.to_numpy()).float(), lp.gather(1, task.answers[:, None])[:, 0], atol=1e-3)
    assert torch.allclose(torch.tensor(last.logit_diff.to_numpy()).float(), diff, atol=1e-3)
    assert res.summary["lens_final_output_error"] < 1e-3
    raw = 30.0 * torch.atanh(logits.double() / 30.0)  # the uncapped logits: the cap must matter for the test to bite
    raw_diff = (raw.gather(1, task.answers[:, None]) - raw.gather(1, task.wrong_answers[:, None]))[:, 0]
    assert (raw_diff - diff).abs().max() > 0.1, (raw_diff, diff)


def _dla_figures_say_before_the_cap(dla, before: torch.Tensor, after: torch.Tensor) -> None:
    """Review 18d C2: on a soft-capped model the DLA figures' axis and colour bar say their logits are before the
    final soft-cap (they were "direct logit attribution (logits)"), and their captions give what the bars add up to
    (HF's pre-cap mean) against the model's capped output (HF's logits)."""
    import matplotlib.pyplot as plt

    from headscope.reports import plots_circuits

    figs = plots_circuits.figures(dla)
    label = "direct logit attribution\n(logits before the final soft-cap 30 tanh(x / 30))"
    assert " ".join(figs["circuits_dla_heads"].axes[-1].get_ylabel().split()) == " ".join(label.split())  # re-wrapped
    assert figs["circuits_dla_components"].axes[0].get_ylabel() == label
    for fig in figs.values():
        plt.close(fig)
    sums = (f"(logits before the model's final soft-cap 30 tanh(x / 30); heads and components together add up to the "
            f"mean logit difference before the cap, {float(before.mean()):.3g}, not to the model's output after it, "
            f"{float(after.mean()):.3g})")
    for stem in ("circuits_dla_heads", "circuits_dla_components"):
        caption = plots_circuits.caption_for(stem, dla.summary)
        assert caption is not None and sums in caption and "where it has one" not in caption, caption


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("target,kind", [("next", "tiny"), ("answer", "tiny"), ("next", "biased")])
def test_logit_lens_equals_transformer_lens(family, target, kind, tiny_models, biased_models):
    from transformer_lens.tools.analysis import logit_lens as tl_lens

    model, task = (tiny_models if kind == "tiny" else biased_models)[family], _task()
    config = circuits.CircuitsConfig(lens_target=target)
    res = circuits.logit_lens(model, task, config)
    lens = res.tables["lens"]
    n_stack, (batch, pos) = model.facts.n_layers + 1, task.tokens.shape
    assert len(lens) == n_stack * batch * pos
    if target == "next":
        targets = torch.cat([task.tokens[:, 1:], task.answers[:, None]], dim=1)  # [batch, pos]
    else:
        targets = task.answers[:, None].expand(-1, pos)
    ref = tl_lens(model.bridge, task.tokens, positions=None, targets=targets, return_type="log_probs")
    assert ref.labels == [f"{l}_pre" for l in range(n_stack - 1)] + ["final_post"]
    ours = lens.sort_values(["layer", "example", "position"])
    assert torch.allclose(torch.tensor(ours.logprob.to_numpy()).reshape(n_stack, batch, pos),
                          ref.values[..., 0].float(), atol=1e-4)
    assert torch.equal(torch.tensor(ours["rank"].to_numpy()).reshape(n_stack, batch, pos), ref.readout.target_ranks[..., 0])
    # the last stack entry is the model's own output
    assert res.summary["lens_final_output_error"] < 1e-4
    at = lens[lens.is_answer & (lens.layer == n_stack - 1)].sort_values("example")
    with torch.no_grad():
        logits = model(task.tokens)[:, -1].float()
    lp = logits.log_softmax(-1).gather(1, task.answers[:, None])[:, 0]
    assert torch.allclose(torch.tensor(at.logprob.to_numpy()), lp, atol=1e-4)
    diff = lp - logits.log_softmax(-1).gather(1, task.wrong_answers[:, None])[:, 0]
    assert torch.allclose(torch.tensor(at.logit_diff.to_numpy()), diff, atol=1e-4)
    # the output row's 95% t interval over examples (what the lens figure and the finding draw), scipy's
    ref_ci = stats.ttest_1samp(diff.double().numpy(), 0).confidence_interval(0.95)
    assert res.summary["lens_logit_diff_ci_per_layer"][str(n_stack - 1)] == pytest.approx([ref_ci.low, ref_ci.high],
                                                                                          abs=1e-3)
    assert res.summary["lens_logit_diff_n"] == batch


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_logit_lens_in_blocks_equals_transformer_lens(family, tiny_models, monkeypatch):
    """Blocks of 3 positions (the last one short) and one stack entry at a time: no unembedding
    holds more than its block's [batch, 3, vocab] logits, and the values are TransformerLens's."""
    from transformer_lens.tools.analysis import logit_lens as tl_lens

    from headscope.analyses.circuits import lens as lens_mod

    model, task = tiny_models[family], _task(pos=8)
    batch, pos = task.tokens.shape
    vocab = model.facts.d_vocab
    monkeypatch.setattr(lens_mod, "BLOCK_BYTES", 4 * batch * vocab * 3)
    shapes, unembed = [], lens_mod.unembed

    def recording(m, states):
        out = unembed(m, states)
        shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(lens_mod, "unembed", recording)
    lens = circuits.logit_lens(model, task, circuits.CircuitsConfig()).tables["lens"]
    n_stack = model.facts.n_layers + 1
    assert sorted(set(shapes)) == [(batch, 2, vocab), (batch, 3, vocab)]  # 3 + 3 + 2 positions
    assert len(shapes) == 3 * n_stack
    targets = torch.cat([task.tokens[:, 1:], task.answers[:, None]], dim=1)
    ref = tl_lens(model.bridge, task.tokens, positions=None, targets=targets, return_type="log_probs")
    ours = lens.sort_values(["layer", "example", "position"])
    assert torch.allclose(torch.tensor(ours.logprob.to_numpy()).reshape(n_stack, batch, pos),
                          ref.values[..., 0].float(), atol=1e-4)
    assert torch.equal(torch.tensor(ours["rank"].to_numpy()).reshape(n_stack, batch, pos), ref.readout.target_ranks[..., 0])
    at = ours[ours.is_answer & (ours.layer == n_stack - 1)]
    with torch.no_grad():
        logits = model(task.tokens)[:, -1].float().log_softmax(-1)
    diff = logits.gather(1, task.answers[:, None])[:, 0] - logits.gather(1, task.wrong_answers[:, None])[:, 0]
    assert torch.allclose(torch.tensor(at.logit_diff.to_numpy()), diff, atol=1e-4)
    assert ours[~ours.is_answer].logit_diff.isna().all()


def _ours(model, task, directions=None):
    """Our per-example DLA [component, batch] with labels, from the kernel (optionally another direction)."""

    names = dla_mod.dla_sites(model, set(hs.available_sites(model)) | {"ln_final.hook_scale"})
    out, acts = hs.run_with_cache(model, task.tokens, names)
    if directions is None:
        directions = dla_mod.unembed_directions(model, task.answers, task.wrong_answers)
    return dla_mod.dla_stack(model, acts, task.answer_positions(), directions, task.answers, task.wrong_answers, out)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["tiny", "biased"])
def test_dla_equals_transformer_lens_in_compatibility_mode(family, kind, tiny_dirs, tiny_models, biased_dirs):
    from transformer_lens.tools.analysis import direct_logit_attribution as tl_dla

    model, compat = _models(kind, family, tiny_dirs, tiny_models, biased_dirs)
    compat.bridge.enable_compatibility_mode()
    task = _task()
    w_u = model.bridge.W_U.detach()  # [d_model, vocab]
    square = w_u.shape[0] == w_u.shape[1] and model.bridge.cfg.normalization_type == "RMS"  # see the module doc
    assert w_u.shape[0] != w_u.shape[1] or kind == "tiny"
    diff = dla_mod.unembed_directions(model, task.answers, task.wrong_answers)  # [batch, d_model]
    ours = _ours(model, task, directions=diff - diff.mean(-1, keepdim=True) if square else diff)
    row = {label: ours.contributions[i] for i, label in enumerate(ours.labels)}
    # unit="head": each head (value biases folded into b_O there, removed from z here)
    ref = tl_dla(compat.bridge, task.tokens, answer_tokens=task.answers, incorrect_tokens=task.wrong_answers, unit="head")
    heads = [label for label in ref.labels if label != "remainder"]
    assert len(heads) == model.facts.n_layers * model.facts.n_heads
    for i, label in enumerate(heads):
        assert torch.allclose(row[label], ref.attribution[i].float(), atol=1e-4), label
    # unit="component": embeddings, "{l}_attn_out" = heads + attn_bias, "{l}_mlp_out"
    ref = tl_dla(compat.bridge, task.tokens, answer_tokens=task.answers, incorrect_tokens=task.wrong_answers,
                 unit="component")
    for i, label in enumerate(ref.labels):
        if label in ("embed", "pos_embed"):
            mine = row[label]
        elif label.endswith("_attn_out"):
            l = int(label.split("_")[0])
            mine = sum(row[f"L{l}H{h}"] for h in range(model.facts.n_heads)) + row[f"attn_bias{l}"]
        else:
            mine = row[f"mlp{int(label.split('_')[0])}"]
        assert torch.allclose(mine, ref.attribution[i].float(), atol=1e-4), label
    # with a wrong answer the unprocessed model's own direction gives the same numbers
    if not square:
        plain = _ours(model, task)
        assert torch.allclose(plain.contributions[:-2], ours.contributions[:-2], atol=1e-4)
        # and so does the public function's per-example table
        dla = circuits.direct_logit_attribution(model, task).tables["dla"]
        table = dla[dla.kind == "head"].pivot(index="component", columns="example", values="contribution")
        ref_heads = dict(zip(heads, tl_dla(compat.bridge, task.tokens, answer_tokens=task.answers,
                                            incorrect_tokens=task.wrong_answers, unit="head").attribution))
        for label, values in ref_heads.items():
            assert torch.allclose(torch.tensor(table.loc[label].to_numpy()).float(), values.float(), atol=1e-4), label
    # a single answer: center_unembed reads W_U[:, a] - mean_v W_U[:, v] (square RMS W_U: - mean over d_model)
    one = w_u[:, task.answers].T
    single = _ours(model, task, directions=one - (one.mean(-1, keepdim=True) if square else w_u.mean(1)))
    ref = tl_dla(compat.bridge, task.tokens, answer_tokens=task.answers, unit="head")
    for i, label in enumerate(ref.labels[:-1]):
        assert torch.allclose(single.contributions[single.labels.index(label)], ref.attribution[i].float(), atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("wrong", [True, False])
def test_dla_rows_sum_to_the_final_logit_difference(family, wrong, biased_models):
    model = biased_models[family]
    task = _task(wrong=wrong)
    res = circuits.direct_logit_attribution(model, task, circuits.CircuitsConfig(top_k=3))
    dla = res.tables["dla"]
    with torch.no_grad():
        last = model(task.tokens)[:, -1].float()
    final = last.gather(1, task.answers[:, None])[:, 0]
    if wrong:
        final = final - last.gather(1, task.wrong_answers[:, None])[:, 0]
    total = torch.tensor(dla.groupby("example").contribution.sum().sort_index().to_numpy())
    assert torch.allclose(total, final, atol=1e-4)
    # the documented terms: writers (embeddings, heads, attention biases, MLPs) + the final-norm bias and b_U
    writers = dla[~dla.kind.isin(["ln_final_bias", "unembed_bias"])]
    assert dla[dla.kind == "remainder"].contribution.abs().max() < 1e-4
    s = res.summary
    assert abs(s["dla_sum_components"] + s["dla_bias_terms"] - s["dla_final_logit"]) < 1e-4
    assert s["dla_max_reconstruction_error"] < 1e-4
    assert abs(s["dla_sum_components"] - writers.groupby("example").contribution.sum().mean()) < 1e-5
    # no final soft-cap: nothing recorded before one, and the finding keeps its "of a final logit difference"
    assert s["dla_final_softcap"] is None and s["dla_logit_before_softcap"] is None
    from headscope.reports.findings import finding

    text = finding("circuits", s)
    if wrong:
        assert f"of a final logit difference {s['dla_final_logit']:.3g}." in text and "soft-cap" not in text, text
    else:  # review 14b A3: no wrong answer, so the writers sum to the answer's logit (the forward's), not a difference
        assert f"of a final answer logit {float(final.mean()):.3g}." in text and "logit difference" not in text, text
    if family != "llama":  # a LayerNorm bias, random here, is a term of its own
        assert (dla.kind == "ln_final_bias").any() and dla[dla.kind == "ln_final_bias"].contribution.abs().max() > 1e-3
    assert s["dla_direction"] == ("answer - wrong_answer" if wrong else "answer")
    assert len(s["dla_top_components"]) == 3
    mean = res.tables["dla_mean"]
    assert set(mean.columns) >= {"component", "kind", "layer", "head", "contribution"}
    heads = mean[mean.kind == "head"]
    assert len(heads) == model.facts.n_layers * model.facts.n_heads and heads.layer.notna().all()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_right_padded_prompts_are_read_at_their_own_last_token(family, biased_models):
    """A Task with attention_mask: each row's answer position is its last real token, and the
    numbers equal those of the same prompt run alone."""
    model = biased_models[family]
    full = _task(n=2, pos=8)
    tokens = full.tokens.clone()
    mask = torch.ones_like(tokens)
    tokens[1, 5:], mask[1, 5:] = 1, 0  # row 1: 5 real tokens, then padding
    padded = Task(name="pad", tokens=tokens, answers=full.answers, wrong_answers=full.wrong_answers, attention_mask=mask)
    config = circuits.CircuitsConfig()
    res = circuits.run(model, padded, config)
    alone = Task(name="one", tokens=full.tokens[1:, :5], answers=full.answers[1:], wrong_answers=full.wrong_answers[1:])
    ref = circuits.run(model, alone, config)
    lens, ref_lens = res.tables["lens"], ref.tables["lens"]
    row = lens[lens.example == 1].sort_values(["layer", "position"])
    assert row.position.max() == 4 and len(row) == len(ref_lens)
    for col in ("logprob", "rank", "logit_diff"):
        a, b = row[col].to_numpy(), ref_lens.sort_values(["layer", "position"])[col].to_numpy()
        assert torch.allclose(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64),
                              atol=1e-4, equal_nan=True), col
    dla, ref_dla = res.tables["dla"], ref.tables["dla"]
    mine = dla[dla.example == 1].set_index("component").contribution
    assert torch.allclose(torch.tensor(mine.to_numpy()), torch.tensor(ref_dla.set_index("component").contribution
                                                                      .reindex(mine.index).to_numpy()), atol=1e-4)


def test_run_on_a_tiny_decoder_and_the_zoo_default(tiny_models):
    model = tiny_models["gpt2"]  # not a zoo vocabulary: the repeated-random-tokens task
    res = circuits.run(model, None, circuits.CircuitsConfig(n_examples=2, repeat_length=4))
    assert res.name == "circuits" and res.summary["task"] == "repeat"
    assert set(res.tables) == {"lens", "dla", "dla_mean"}
    lens = res.tables["lens"]
    assert set(lens.columns) >= {"example", "layer", "position", "logprob", "rank", "logit_diff"}
    assert lens.layer.max() == model.facts.n_layers and lens.example.nunique() == 2
    assert res.summary["first_top1_layer"] in (None, *range(model.facts.n_layers + 1))
    # answer-only lens: one row per example and layer
    only = circuits.logit_lens(model, "repeat", circuits.CircuitsConfig(n_examples=2, repeat_length=4,
                                                                         lens_positions="answer"))
    assert len(only.df) == 2 * (model.facts.n_layers + 1) and only.df.is_answer.all()
    with pytest.raises(ValueError, match="lens_positions"):
        circuits.CircuitsConfig(lens_positions="some")


def test_encoders_are_skipped_by_run_and_refused_by_the_named_functions():
    from types import SimpleNamespace

    encoder = SimpleNamespace(facts=SimpleNamespace(is_encoder=True, name="an-encoder"))
    res = circuits.run(encoder)
    assert res.name == "circuits" and "encoder" in res.summary["skipped"] and res.df.empty
    for fn in (circuits.logit_lens, circuits.direct_logit_attribution):
        with pytest.raises(ConfigError, match="encoder"):
            fn(encoder)


def test_figures_draw(tiny_models):
    import matplotlib.pyplot as plt

    from headscope.reports import plots_circuits

    res = circuits.run(tiny_models["llama"], _task(n=2), circuits.CircuitsConfig())
    figs = plots_circuits.figures(res)
    assert set(figs) == {"circuits_lens", "circuits_dla_heads", "circuits_dla_components"}
    cbar = figs["circuits_dla_heads"].axes[-1].get_ylabel()
    assert cbar == "direct logit attribution (logits)"
    assert "nats" in figs["circuits_lens"].axes[-1].get_ylabel()
    for fig in figs.values():
        plt.close(fig)
    # review 20a C: Result.plot() under a headless backend (Agg here) leaves no figure open in pyplot, and what it
    # returns still saves
    import io

    import matplotlib

    assert matplotlib.get_backend().lower() == "agg"
    before = set(plt.get_fignums())
    drawn = res.plot()
    assert drawn and set(plt.get_fignums()) == before
    buf = io.BytesIO()
    next(iter(drawn.values())).savefig(buf, format="png")
    assert buf.getvalue().startswith(b"\x89PNG")


@pytest.mark.slow
def test_zoo_ioi_default(zoo_model):
    res = circuits.run(zoo_model, None, circuits.CircuitsConfig.preset(n_examples=16))
    s = res.summary
    assert s["task"] == "ioi" and s["dla_direction"] == "answer - wrong_answer"
    assert s["lens_final_output_error"] < 1e-3 and s["dla_max_reconstruction_error"] < 1e-3
    assert s["first_top1_layer"] is not None  # the trained model solves IOI
    assert s["dla_final_logit"] > 0


@pytest.mark.parametrize("arch", ["gemma2", "olmo2"])
def test_dla_through_post_attention_norms_equals_hand_hugging_face(arch, arch_models, hf_of, more_arch_models,
                                                                   more_arch_dirs):
    """Post-norm blocks (Gemma 2, OLMo 2): a head writes o_proj's slice of z through the layer's
    post-attention RMSNorm, whose scale is that of the whole attention output (frozen here), then
    the final norm (frozen); by hand from Hugging Face's own modules. No bias term is left over
    (neither model has attention biases) and the rows sum to the pre-softcap logit difference."""
    from tests_support import hf_reference

    model = arch_models(arch) if arch == "gemma2" else more_arch_models(arch)
    hf = hf_of(arch) if arch == "gemma2" else hf_reference(more_arch_dirs(arch))
    task = _task()
    ours = _ours(model, task)
    layers, store = hf.model.layers, {}
    hooks = [hf.model.norm.register_forward_pre_hook(lambda m, a: store.__setitem__("final", a[0]))]
    for i, layer in enumerate(layers):
        hooks.append(layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a, i=i: store.__setitem__(("z", i), a[0])))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(
            lambda m, a, i=i: store.__setitem__(("a", i), a[0])))
    try:
        with torch.no_grad():
            hf(task.tokens)
    finally:
        for h in hooks:
            h.remove()
    gemma = arch == "gemma2"

    def frozen(norm, x):  # [batch, d_model] -> (w_eff / rms(x)) [batch, d_model]
        eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
        w = norm.weight.detach() + (1.0 if gemma else 0.0)
        return w / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()

    last, rows = task.answer_positions(), torch.arange(len(task))
    w_u = hf.lm_head.weight.detach()
    d = w_u[task.answers] - w_u[task.wrong_answers]  # [batch, d_model]
    fin = frozen(hf.model.norm, store["final"][rows, last])
    n_heads, d_head = model.facts.n_heads, model.facts.d_head
    contrib = dict(zip(ours.labels, ours.contributions))
    for i, layer in enumerate(layers):
        z = store[("z", i)][rows, last].view(len(task), n_heads, d_head)
        post = frozen(layer.post_attention_layernorm, store[("a", i)][rows, last])
        w_o = layer.self_attn.o_proj.weight.detach()  # [d_model, n_heads * d_head]
        for h in range(n_heads):
            write = z[:, h] @ w_o[:, h * d_head:(h + 1) * d_head].T  # [batch, d_model]
            hand = (write * post * fin * d).sum(-1)
            assert torch.allclose(contrib[f"L{i}H{h}"], hand, atol=1e-4), (i, h)
        assert contrib[f"attn_bias{i}"].abs().max() < 1e-4
    assert contrib["remainder"].abs().max() < 1e-4
    normed = hf.model.norm(store["final"][rows, last])
    assert torch.allclose(ours.contributions.sum(0), (normed * d).sum(-1), atol=1e-4)



def test_dla_finding_says_post_norm_writes_are_read_through_their_norms(arch_models, hf_of):
    """Review 8 (C3): on post-norm blocks each head's DLA is taken through its layer's post-attention norm at its
    actual scale (the test above), but the finding said only "final norm frozen". Gemma 2's Hugging Face layers norm
    both writes (post_attention_layernorm after attention, post_feedforward_layernorm after the MLP): the summary
    records both and the finding says so once; Llama's post_attention_layernorm is its pre-MLP norm (no
    post_feedforward_layernorm): nothing is said."""
    from headscope.reports.findings import finding

    said = "write is taken through its layer's post-attention/post-MLP norm, frozen at its actual scale"
    for arch, norms in (("gemma2", ["post-attention", "post-MLP"]), ("llama3", [])):
        layer = hf_of(arch).model.layers[0]
        assert hasattr(layer, "post_feedforward_layernorm") == bool(norms)  # the premise, from Hugging Face's modules
        s = circuits.direct_logit_attribution(arch_models(arch), _task()).summary
        assert s["dla_post_norms"] == norms
        text = finding("circuits", s)
        assert text.count(said) == (1 if norms else 0), text
        if norms:
            assert f"Each head's and MLP's {said} (as the final norm is)." in text

def test_lens_constant_guess_is_the_commonest_answers_share(tiny_models):
    """Two fixed answers, three of five prompts answered 11: a constant guess of 11 is top-1 on 3 / 5,
    the baseline the finding holds each layer's top-1 count against (review 8a A1)."""
    task = Task(name="two", tokens=random_tokens(5, 6, seed=3), answers=torch.tensor([11, 12, 11, 12, 11]))
    s = circuits.logit_lens(tiny_models["gpt2"], task).summary
    assert s["lens_constant_guess"] == 3 / 5 and s["lens_n_answers"] == 2


def _hf_expert_writes(hf, task: Task, arch: str):
    """From plain Hugging Face modules, at each row's last position: ({(layer, expert): its weighted write [batch,
    d_model]}, {(layer, expert): rows the router sent to it}, the final RMSNorm's scale [batch, 1], the direction
    norm.weight * (W_U[answer] - W_U[wrong]) [batch, d_model]). The block's input (a hook on HF's MoE block), the
    router's top-k of softmax(x W_gate^T) (Mixtral renormalises the k weights, Qwen2-MoE does not), each chosen
    expert's down(silu(gate x) * up x) times its weight, Qwen2-MoE's shared expert times sigmoid(its gate); the scale
    sqrt(mean(resid^2) + eps) of HF's input to model.norm."""
    cfg = hf.config
    seen = {}
    handles = [hf.model.norm.register_forward_hook(lambda m, a, o: seen.__setitem__("resid", a[0]))]
    handles += [hf.model.layers[l].mlp.register_forward_hook(lambda m, a, o, l=l: seen.__setitem__(l, a[0]))
                for l in range(cfg.num_hidden_layers)]
    with torch.no_grad():
        hf(task.tokens)
        for h in handles:
            h.remove()
        resid = seen["resid"][:, -1]  # [batch, d_model]
        scale = (resid.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps).sqrt()  # [batch, 1]
        d = hf.model.norm.weight * (hf.lm_head.weight[task.answers] - hf.lm_head.weight[task.wrong_answers])
        k, n_experts = cfg.num_experts_per_tok, getattr(cfg, "num_local_experts", None) or cfg.num_experts
        writes, routed = {}, {}
        for l in range(cfg.num_hidden_layers):
            block, x = hf.model.layers[l].mlp, seen[l][:, -1]  # [batch, d_model] the block's input at the answer
            probs = torch.softmax(x @ block.gate.weight.T, -1)  # [batch, experts]
            top, chosen = probs.topk(k, -1)
            if arch == "mixtral":
                top = top / top.sum(-1, keepdim=True)
            for e in range(n_experts):
                gate, up = (x @ block.experts.gate_up_proj[e].T).chunk(2, -1)
                y = (torch.nn.functional.silu(gate) * up) @ block.experts.down_proj[e].T  # [batch, d_model]
                w = (top * (chosen == e)).sum(-1, keepdim=True)  # [batch, 1]: 0 where not chosen
                writes[(l, e)] = w * y
                routed[(l, e)] = int((chosen == e).any(-1).sum())
            if arch == "qwen2moe":
                s = block.shared_expert
                y = s.down_proj(torch.nn.functional.silu(s.gate_proj(x)) * s.up_proj(x))
                writes[(l, n_experts)] = torch.sigmoid(block.shared_expert_gate(x)) * y
                routed[(l, n_experts)] = len(task)
    return writes, routed, scale, d


@pytest.mark.parametrize("arch", ["mixtral", "qwen2moe"])
def test_dla_split_by_expert_equals_hand_hugging_face(arch, more_arch_models, more_arch_dirs):
    """#34 review 11c C4: each mixture-of-experts block's DLA split by expert. From plain Hugging Face modules
    (_hf_expert_writes): each expert's weighted write divided by the final RMSNorm's scale and dotted with
    norm.weight * (W_U[answer] - W_U[wrong]). The experts of a layer sum to its mlpN row per example (float
    rounding only), and n_routed counts the router's choices."""
    from headscope.reports.circuits_words import finding
    from tests_support import hf_model

    model, hf = more_arch_models(arch), hf_model(more_arch_dirs(arch))
    cfg = hf.config
    n_experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    task = _task(n=6, pos=7, seed=41)
    res = circuits.direct_logit_attribution(model, task, top_k=3)
    writes, routed, scale, d = _hf_expert_writes(hf, task, arch)
    want = {key: ((out / scale) * d).sum(-1) for key, out in writes.items()}  # [batch] each
    outs = [e for (l, e) in writes if l == 0]
    rows = res.tables["dla_experts"]
    assert sorted(set(zip(rows.layer, rows.expert))) == sorted(want)
    for (l, e), value in want.items():
        got = rows[(rows.layer == l) & (rows.expert == e)].sort_values("example")
        assert got.shared.tolist() == [e == n_experts] * len(task)
        torch.testing.assert_close(torch.tensor(got.contribution.to_numpy()).float(), value, atol=2e-5, rtol=1e-4)
    dla = res.tables["dla"]
    for l in range(cfg.num_hidden_layers):  # the experts' rows sum to the layer's DLA, up to float rounding
        per = rows[rows.layer == l].groupby("example").contribution.sum().sort_index()
        whole = dla[dla.component == f"mlp{l}"].set_index("example").contribution.sort_index()
        assert (per - whole).abs().max() <= 1e-5 * max(1.0, whole.abs().max())
    mean = res.tables["dla_experts_mean"]
    assert {(r.layer, r.expert): r.n_routed for r in mean.itertuples()} == routed
    assert (mean.n == len(task)).all()
    # the finding's sentence on the top MoE layer's top expert, numbers from the hand values above
    layer = max(range(cfg.num_hidden_layers), key=lambda l: abs(sum(want[(l, e)] for e in range(len(outs))).mean()))
    ranked = sorted(range(len(outs)), key=lambda e: -abs(want[(layer, e)].mean()))
    a, b = (want[(layer, e)].double() for e in ranked[:2])
    diff = torch.sign(a.mean()) * a - torch.sign(b.mean()) * b  # paired |a| - |b| in the direction of the means
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std() / len(diff) ** 0.5
    tied = bool(diff.mean() - half <= 0 <= diff.mean() + half)
    top = res.summary["dla_top_expert"]
    assert (top["layer"], top["top"]["expert"], top["next"]["expert"], top["tied"]) == (layer, *ranked[:2], tied)
    assert top["top"]["mean"] == pytest.approx(a.mean().item(), abs=1e-4)
    assert top["difference_ci"] == pytest.approx([(diff.mean() - half).item(), (diff.mean() + half).item()], abs=1e-4)
    name = lambda e: "the shared expert" if e == n_experts else f"expert {e}"  # noqa: E731
    text = finding({**res.summary, "chance": {"at_chance": False}})  # random weights: no chance guard to pass here
    routing = "on every example" if ranked[0] == n_experts else f"routed on {routed[(layer, ranked[0])]} of 6 examples"
    assert f"mlp{layer}'s {top['layer_mean']:+.2f}" in text and f"{name(ranked[0])} ({a.mean():+.2f}, 95% CI" in text
    assert routing in text and (" tie (" in text) == tied and ("clear of " + name(ranked[1]) in text) == (not tied), text


def test_expert_rows_read_a_post_mlp_norm_without_an_mlp_out_hook(more_arch_models, more_arch_dirs, monkeypatch):
    """Review diff5 item 4: with a post-MLP norm, expert_rows read the norm's output at site mlp_out, which dla_sites
    leaves out where the model computes no such hook (a KeyError). Mixtral given a post-MLP RMSNorm of random gains
    and no mlp_out among the captured sites: each expert's row is, by hand from Hugging Face (_hf_expert_writes),
    gain * write / s, s = sqrt(mean(block^2) + eps) of the block's whole output (the experts' writes summed: the norm
    frozen at its scale there), then through the final norm onto W_U[answer] - W_U[wrong]."""
    from headscope.analyses.circuits import experts as experts_mod
    from headscope.hooks import run_with_cache
    from tests_support import hf_model

    model, hf = more_arch_models("mixtral"), hf_model(more_arch_dirs("mixtral"))
    post = torch.nn.RMSNorm(hf.config.hidden_size, eps=1e-6)
    with torch.no_grad():
        post.weight.copy_(1 + 0.5 * torch.randn(hf.config.hidden_size, generator=torch.Generator().manual_seed(7)))
    monkeypatch.setattr(experts_mod, "post_mlp_norm", lambda block: post)
    task = _task(n=4, pos=6, seed=43)
    pos = task.answer_positions()
    read, slots = pos.unique(return_inverse=True)
    sites = experts_mod.expert_sites(model)
    with torch.no_grad():
        _, acts = run_with_cache(model, task.tokens, ["ln_final.hook_scale", *sites],
                                 site_positions={name: read.tolist() for name in sites})
    assert not any(name.endswith("hook_mlp_out") for name in acts)
    rows = experts_mod.expert_rows(model, acts, pos, slots, dla_mod.unembed_directions(model, task.answers,
                                                                                        task.wrong_answers),
                                   torch.arange(len(task)))
    writes, _, scale, d = _hf_expert_writes(hf, task, "mixtral")
    with torch.no_grad():
        for l in range(hf.config.num_hidden_layers):
            block = sum(w for (layer, _), w in writes.items() if layer == l)  # [batch, d_model]
            s = (block.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()  # [batch, 1]
            for (layer, e), w in writes.items():
                if layer == l:
                    want = ((post.weight * w / s / scale) * d).sum(-1)  # [batch]
                    got = rows[(rows.layer == l) & (rows.expert == e)].sort_values("example").contribution
                    torch.testing.assert_close(torch.tensor(got.to_numpy()).float(), want, atol=2e-5, rtol=1e-4)


def test_lens_counts_top1_answers_tied_within_rounding(tiny_dirs, tiny_models):
    """Review 20a B1 (redone): in bfloat16 the lens's top-1 can be a tie. A llama loaded in bfloat16 whose unembedding
    row of a second token is set to the answer's own (their output logits then equal, by construction) has, at the
    output row, every example's answer top-1 (rank counts strictly larger logits) and tied: the lens counts it
    within rounding, and the words say so; the unedited model in float32 counts none."""
    model = hs.load_model(tiny_dirs["llama"], device="cpu", dtype="bfloat16")
    tokens = random_tokens(4, 7, seed=11)
    with torch.no_grad():
        top = model(tokens)[:, -1].float().argmax(-1)  # [4] each prompt's top token at the output
    task = Task(name="tie", tokens=tokens, answers=top)
    twin = next(t for t in range(4, 64) if t not in set(top.tolist()))
    lm_head = model.bridge.original_model.lm_head
    before = lm_head.weight[twin].clone()
    try:
        with torch.no_grad():
            lm_head.weight[twin] = lm_head.weight[top[0]]  # token `twin`'s logit equals the answer's on example 0
        res = circuits.logit_lens(model, task)
    finally:
        with torch.no_grad():
            lm_head.weight[twin] = before
    last = model.facts.n_layers
    s = res.summary
    assert s["lens_top1_count_per_layer"][str(last)] == 4  # ties are not strictly larger: rank 0 for all four
    assert s["lens_top1_within_rounding_per_layer"][str(last)] >= 1
    rows = res.tables["lens"]
    tied = rows[(rows.layer == last) & rows.is_answer & (rows.example == 0)]
    assert tied.top1_within_rounding.tolist() == [True]
    from headscope.reports.circuits_words import _top1_share

    words = _top1_share({**s, "n_examples": 4}, last, s["lens_top1_fraction_per_layer"])
    assert "another token's logit is within one rounding step of the answer's, so rounding could put either first" in words
    plain = circuits.logit_lens(tiny_models["llama"], task).summary
    assert not any(plain["lens_top1_within_rounding_per_layer"].values())
