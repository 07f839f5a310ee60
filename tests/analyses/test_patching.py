"""Patching: exact patching against transformer_lens.patching, attribution on a linear toy model,
path patching against TransformerLens's direct-path patching, causal tracing's closed forms,
batching invariance and clear errors."""
from __future__ import annotations

import dataclasses
import json
from functools import partial

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats
from transformer_lens import patching as tlp
from transformers import AutoConfig

import headscope as hs
from headscope.analyses.core.metrics import answer_logprob
from headscope.analyses.core.tasks import Task
from headscope.analyses.patching.analysis import PatchingConfig, activation_patching, run
from headscope.analyses.patching.attribution_patching import attribution_patching
from headscope.analyses.patching.causal_tracing import causal_tracing, subject_noise
from headscope.analyses.patching.engine import runs_per_forward
from headscope.analyses.patching.path_patching import path_patching
from headscope.execution import batching, resume
from tests_support import build_tiny_model, random_tokens

TL_SWEEPS = {  # our site type -> the TransformerLens sweep it must equal (its output axes)
    "resid_pre": tlp.get_act_patch_resid_pre,  # [layer, pos]
    # resid_mid restores resid_post at that (layer, pos): the MLP acts per position.
    "resid_mid": partial(tlp.generic_activation_patch, patch_setter=tlp.layer_pos_patch_setter,
                         activation_name="resid_post", index_axis_names=("layer", "pos")),
    "mlp_out": tlp.get_act_patch_mlp_out,  # [layer, pos]
    "attn_out": tlp.get_act_patch_attn_out,  # [layer, pos]
    "head_out": tlp.get_act_patch_attn_head_out_all_pos,  # [layer, head]
    "head_out_by_pos": tlp.get_act_patch_attn_head_out_by_pos,  # [layer, pos, head]
    "q": tlp.get_act_patch_attn_head_q_all_pos,
    "k": tlp.get_act_patch_attn_head_k_all_pos,  # [layer, kv_head] under GQA
    "v": tlp.get_act_patch_attn_head_v_all_pos,
    "pattern": tlp.get_act_patch_attn_head_pattern_all_pos,
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on a loaded 2-core machine two spinning threads make tiny forwards
    tens of times slower. Restored after this module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_task(batch: int = 2, pos: int = 3, seed: int = 1) -> Task:
    g = torch.Generator().manual_seed(seed)
    answers = torch.randint(4, 64, (batch,), generator=g)
    return Task(
        name="toy", tokens=random_tokens(batch, pos, seed=seed), corrupted_tokens=random_tokens(batch, pos, seed=seed + 1),
        answers=answers, wrong_answers=(answers + 7 - 4) % 60 + 4,
        spans={"subject": torch.tensor([[1, 3]] * batch)},
    )


def tl_logit_diff(task: Task):
    """The scalar metric TransformerLens patching expects: mean logit difference at the last position."""
    def metric(logits: torch.Tensor) -> torch.Tensor:
        last = logits[:, -1]
        return (last[torch.arange(len(task)), task.answers] - last[torch.arange(len(task)), task.wrong_answers]).mean()
    return metric


def ours_as_tensor(df, site_type: str, shape) -> torch.Tensor:
    """Our tidy rows (layer, then pos, then head) in TransformerLens's axis order."""
    return torch.tensor(df[df.site_type == site_type]["value"].to_numpy(), dtype=torch.float32).view(shape)


def check_against_transformer_lens(model, task: Task, site_types, direction: str = "denoise") -> None:
    clean, corrupt = task.tokens, task.corrupted_tokens
    base, source = (corrupt, clean) if direction == "denoise" else (clean, corrupt)
    got = activation_patching(model, task, site_types, direction=direction, progress=False).df
    _, cache = model.bridge.run_with_cache(source)
    for st in site_types:
        with torch.no_grad():
            ref = TL_SWEEPS[st](model.bridge, base, cache, tl_logit_diff(task))
        diff = (ours_as_tensor(got, st, ref.shape) - ref.cpu()).abs().max().item()
        assert diff <= 1e-4, (st, diff)
        assert ref.std() > 1e-3  # the sweep is not flat, so equality means something


# Each TransformerLens sweep is one forward pass per cell, so these stay small (3 positions).
@pytest.mark.parametrize("family,sites", [
    ("gpt2", ["resid_pre", "mlp_out", "head_out", "head_out_by_pos"]),
    ("llama", ["resid_pre", "head_out", "attn_out"]),
    ("neox", ["resid_pre", "mlp_out", "head_out"]),  # parallel blocks: their own z shortcut
])
def test_exact_patching_equals_transformer_lens(family, sites, tiny_models):
    check_against_transformer_lens(tiny_models[family], make_task(), sites)


@pytest.mark.parametrize("arch", ["olmo2", "gemma3"])
def test_exact_patching_on_post_norm_blocks_equals_transformer_lens(arch, more_arch_models):
    """OLMo 2 (norms after attention and MLP only, q/k norms) and Gemma 3 (norms before and
    after): the sweeps resume at the patched block, through the z shortcut in the block's own
    shape and the model's own hook-free layers (execution/hf_blocks), and equal TransformerLens's
    one forward pass per cell."""
    model = more_arch_models(arch)
    assert resume.supports(model).fast
    check_against_transformer_lens(model, make_task(pos=4), ["resid_pre", "head_out", "attn_out"])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cells_before_the_first_difference_equal_transformer_lens(family, tiny_models):
    """Clean and corrupted prompts agree up to a position that differs by row (3 and 4), as in
    IOI-style corruptions. Cells before it leave the run unchanged and are not recomputed; a row
    whose cell is unchanged takes the captured run; the rest start at the first change. The
    numbers are still TransformerLens's, one forward pass per cell."""
    task = make_task(pos=6, seed=9)
    corrupted = task.tokens.clone()
    other = random_tokens(2, 6, seed=99)
    corrupted[0, 3:], corrupted[1, 4:] = other[0, 3:], other[1, 4:]
    assert bool(corrupted[0, 3] != task.tokens[0, 3]) and bool(corrupted[1, 4] != task.tokens[1, 4])
    task = dataclasses.replace(task, corrupted_tokens=corrupted)
    check_against_transformer_lens(tiny_models[family], task, ["resid_pre", "head_out", "head_out_by_pos"])
    check_against_transformer_lens(tiny_models[family], task, ["resid_pre"], direction="noise")


def test_head_sweep_on_a_sliding_window_model_equals_transformer_lens(tmp_path):
    """Mistral with a window (4) shorter than the prompts (10): the captured cache lost the early
    positions, so merged head passes recompute every position instead of reusing it."""
    model = hs.load_model(build_tiny_model("mistral", tmp_path / "mistral", seed=6, sliding_window=4), device="cpu")
    check_against_transformer_lens(model, make_task(pos=10, seed=8), ["head_out", "resid_pre"])


def test_head_k_v_pattern_equal_transformer_lens_under_gqa(tiny_models, tiny_dirs):
    model = tiny_models["llama"]  # 4 query heads, 2 KV heads
    check_against_transformer_lens(model, make_task(seed=3), ["k", "v", "pattern"])
    res = activation_patching(model, make_task(seed=3), ["k", "q"], progress=False)
    df = res.df
    assert sorted(df[df.site_type == "k"]["head"].unique()) == [0, 1]
    cfg = AutoConfig.from_pretrained(tiny_dirs["llama"])  # the head counts the finding reads (review 9b A2)
    assert (res.summary["n_heads"], res.summary["n_kv_heads"]) == (cfg.num_attention_heads, cfg.num_key_value_heads)
    assert sorted(df[df.site_type == "q"]["head"].unique()) == [0, 1, 2, 3]


def test_noising_equals_transformer_lens_with_the_runs_swapped(tiny_models):
    check_against_transformer_lens(tiny_models["gpt2"], make_task(seed=5), ["resid_pre"], direction="noise")


def test_resid_mid_patches_the_residual_stream(tiny_models):
    """Restoring resid_mid at (layer, pos) restores resid_post there (the MLP acts per position),
    so our resid_mid sweep equals TransformerLens's resid_post sweep. TransformerLens 4.3's own
    resid_mid sweep on a bridge patches only the MLP input (see patching_sites)."""
    check_against_transformer_lens(tiny_models["llama"], make_task(seed=21), ["resid_mid"])


def test_batch_size_does_not_change_results(tiny_models):
    model, task = tiny_models["llama"], make_task(batch=3, seed=7)
    sites = ["resid_mid", "head_out_by_pos", "pattern", "head_out"]
    one = activation_patching(model, task, sites, batch_size=1, progress=False).df
    seven = activation_patching(model, task, sites, batch_size=7, progress=False, metric="logit_diff").df  # uneven chunks

    def plain_logit_diff(out):  # a callable metric: evaluated one run at a time
        rows = torch.arange(len(task))
        return out[rows, -1, task.answers] - out[rows, -1, task.wrong_answers]

    auto = activation_patching(model, task, sites, metric=plain_logit_diff, progress=False).df
    for other in (seven, auto):
        assert (one["value"] - other["value"]).abs().max() <= 1e-5
        assert one[["site_type", "layer", "head", "pos"]].equals(other[["site_type", "layer", "head", "pos"]])


def test_memory_budget_sets_runs_per_forward(tiny_models):
    model = tiny_models["gpt2"]
    per_row = batching.row_bytes(model, 5)
    assert runs_per_forward(model, 2, 5, memory_budget=per_row * 2 * 3) == 3
    assert runs_per_forward(model, 2, 5, memory_budget=per_row) == 1  # never less than one run
    with pytest.raises(ValueError, match="memory_budget"):
        runs_per_forward(model, 2, 5, memory_budget=0)


def test_normalized_logit_diff_and_summary(tiny_models):
    model, task = tiny_models["gpt2"], make_task(pos=5, seed=9)
    res = activation_patching(model, task, ["resid_pre"], metric="normalized_logit_diff", progress=False)
    _, cache = model.bridge.run_with_cache(task.tokens)
    metric = tl_logit_diff(task)
    with torch.no_grad():
        ref = tlp.get_act_patch_resid_pre(model.bridge, task.corrupted_tokens, cache, metric)
        ld_clean, ld_corrupt = metric(model(task.tokens)).item(), metric(model(task.corrupted_tokens)).item()
    expected = (ref - ld_corrupt) / (ld_clean - ld_corrupt)
    assert (ours_as_tensor(res.df, "resid_pre", ref.shape) - expected).abs().max().item() <= 1e-4
    assert res.summary["clean_metric"] == pytest.approx(1.0) and res.summary["corrupted_metric"] == pytest.approx(0.0)
    top = res.summary["top_sites"]["resid_pre"]
    assert len(top) == 10 and [abs(t["effect"]) for t in top] == sorted((abs(t["effect"]) for t in top), reverse=True)
    json.dumps(res.summary)
    # the gap it normalises by is flagged exactly when scipy's paired 95% interval of the per-row logit
    # differences (plain forwards) contains 0 or its mean is under 0.1 logits
    with torch.no_grad():
        rows = [model(t)[:, -1] for t in (task.tokens, task.corrupted_tokens)]  # [batch, vocab] each
    idx = torch.arange(len(task))
    diffs = [(r[idx, task.answers] - r[idx, task.wrong_answers]).double().numpy() for r in rows]
    ci = scipy_stats.ttest_rel(*diffs).confidence_interval(0.95)
    flagged = ci.low <= 0 <= ci.high or abs((diffs[0] - diffs[1]).mean()) < 0.1
    assert ("gap_within_noise" in res.summary) == flagged
    if flagged:
        assert res.summary["gap_within_noise"]["ci"] == pytest.approx([ci.low, ci.high], abs=1e-4)


def test_top_sites_carry_the_t_interval_of_their_per_example_effects(tiny_models):
    """Each top site's ci is scipy's t interval over the examples' own effects, each from a direct
    hooked pass of that example alone (clean resid_pre put into its corrupted run); normalised, the
    effects are divided by the mean clean-corrupted gap. A share of the gap (normalised: the effect; raw: share_ci)
    is a ratio of means: its interval is the delta method's with the covariance, by hand (review 16c B5)."""
    model, task = tiny_models["gpt2"], clear_gap_task(tiny_models["gpt2"])
    plain = activation_patching(model, task, ["resid_pre"], progress=False).summary
    shares = activation_patching(model, task, ["resid_pre"], metric="normalized_logit_diff", progress=False).summary
    assert "t interval" in plain["top_sites_ci_method"]

    def logit_diff(logits: torch.Tensor, i: int) -> float:
        return float(logits[0, -1, task.answers[i]] - logits[0, -1, task.wrong_answers[i]])

    for summary in (plain, shares):
        for top in summary["top_sites"]["resid_pre"][:2]:
            layer, pos = top["layer"], top["pos"]
            effects, gaps = [], []
            for i in range(len(task)):
                clean, corrupt = task.tokens[i:i + 1], task.corrupted_tokens[i:i + 1]
                with torch.no_grad():
                    clean_logits, cache = model.bridge.run_with_cache(clean)
                    source = cache[f"blocks.{layer}.hook_resid_pre"][:, pos]

                    def put(act, hook, pos=pos, source=source):
                        act = act.clone()
                        act[:, pos] = source
                        return act

                    patched = model.bridge.run_with_hooks(corrupt, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", put)])
                    base = model.bridge(corrupt)
                effects.append(logit_diff(patched, i) - logit_diff(base, i))
                gaps.append(logit_diff(clean_logits, i) - logit_diff(base, i))
            e, g = np.array(effects), np.array(gaps)
            ci = scipy_stats.t.interval(0.95, len(e) - 1, loc=e.mean(), scale=e.std(ddof=1) / np.sqrt(len(e)))
            share = ratio_interval(e, g)  # the share of the gap, a ratio of means: delta method with the covariance
            mean = e.mean() / (g.mean() if summary["normalized"] else 1)
            assert top["n"] == 4 and top["effect"] == pytest.approx(mean, abs=1e-4)
            if summary["normalized"]:
                assert top["ci"] == pytest.approx(share, abs=1e-4), (layer, pos)
                assert "share_ci" not in top
            else:
                assert top["ci"] == pytest.approx(list(ci), abs=1e-4), (layer, pos)
                assert top["share_ci"] == pytest.approx(share, abs=1e-4), (layer, pos)
                assert abs(share[1] - share[0] - (ci[1] - ci[0]) / g.mean()) > 1e-3  # not the raw interval over the gap
            assert e.std() > 1e-3  # the examples differ, so the interval's width means something


def clear_gap_task(model) -> Task:
    """make_task(4, 5, seed 9) with the answers its clean prompts favour most over least: a gap clear of noise."""
    task = make_task(batch=4, pos=5, seed=9)
    with torch.no_grad():
        logits = model.bridge(task.tokens)[:, -1]  # [batch, vocab]
    return dataclasses.replace(task, answers=logits.argmax(-1), wrong_answers=logits.argmin(-1))


def ratio_interval(e: np.ndarray, g: np.ndarray) -> list[float]:
    """By hand: the 95% interval of R = mean e / mean g (both over the same n rows), delta method with the
    covariance, R +- t(n - 1) sd(e - R g) / (sqrt(n) |mean g|)."""
    r = e.mean() / g.mean()
    half = scipy_stats.t.ppf(0.975, len(e) - 1) * (e - r * g).std(ddof=1) / np.sqrt(len(e)) / abs(g.mean())
    return [r - half, r + half]


def test_a_share_of_exactly_one_on_every_prompt_has_a_zero_width_interval(tiny_models):
    """Review 16c B5: resid_post of the last block at the last position restores each prompt's whole gap (the
    final norm and unembedding act per position), so its share is 1 on every prompt and its interval [1, 1]; the
    old interval (the effects' t interval over the mean gap) spread with how the prompts' gaps differ."""
    model, task = tiny_models["gpt2"], clear_gap_task(tiny_models["gpt2"])
    last = model.facts.n_layers - 1
    for metric in ("logit_diff", "normalized_logit_diff"):
        s = activation_patching(model, task, ["resid_post"], metric=metric, progress=False).summary
        top = next(c for c in s["top_sites"]["resid_post"] if c["layer"] == last and c["pos"] == 4)
        ci = top["ci"] if s["normalized"] else top["share_ci"]
        assert ci == pytest.approx([1.0, 1.0], abs=1e-5), metric
        if not s["normalized"]:  # the raw effect's own interval is wide: the gaps differ
            assert "gap_within_noise" not in s and top["ci"][1] - top["ci"][0] > 0.1


@pytest.fixture(scope="module")
def linear_tail_model(tmp_path_factory):
    """A 2-layer GPT-2 whose path from layer 1's attention output to the logits is linear.

    LayerNorm with epsilon 1e8 (and weights 1e4) is (x - mean(x)) up to a factor 1 + O(1e-8),
    i.e. linear; layer 1's MLP has zero input weights, so it adds a constant. Then the logit
    difference is linear in layer 1's head outputs, attn_out, resid_mid, mlp_out and resid_post,
    where attribution patching is exact; layer 0 still has softmax and GELU.
    """
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config

    path = build_tiny_model("gpt2", tmp_path_factory.mktemp("linear-tail") / "gpt2", seed=2)
    config = GPT2Config.from_pretrained(path)
    config.layer_norm_epsilon = 1e8
    config.save_pretrained(path)
    weights = load_file(path / "model.safetensors")
    for name in list(weights):
        if ".ln_" in name and name.endswith("weight"):
            weights[name] = torch.full_like(weights[name], 1e4)
    weights["transformer.h.1.mlp.c_fc.weight"].zero_()
    weights["transformer.h.1.mlp.c_fc.bias"].zero_()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return hs.load_model(path, device="cpu")


def test_attribution_equals_exact_where_the_model_is_linear(linear_tail_model):
    model, task = linear_tail_model, make_task(batch=3, pos=6, seed=11)
    sites = ["attn_out", "resid_mid", "mlp_out", "resid_post", "head_out", "head_out_by_pos", "resid_pre"]
    exact = activation_patching(model, task, sites, progress=False).df
    attr = attribution_patching(model, task, sites).df
    assert exact[["site_type", "layer", "head", "pos"]].equals(attr[["site_type", "layer", "head", "pos"]])
    linear = (exact["layer"] == 1) & (exact["site_type"] != "resid_pre")
    scale = exact.loc[linear, "effect"].abs().max()
    assert scale > 1e-2
    assert (exact.loc[linear, "effect"] - attr.loc[linear, "attribution"]).abs().max() <= 1e-4 * max(1.0, scale)
    early = exact["layer"] == 0  # softmax and GELU in between: first order is only approximate
    assert (exact.loc[early, "effect"] - attr.loc[early, "attribution"]).abs().max() > 1e-3


def test_attribution_correlation_is_reported(tiny_models):
    res = activation_patching(tiny_models["gpt2"], make_task(), ["head_out", "mlp_out"], attribution=True, progress=False)
    corr = res.summary["attribution_correlation"]
    assert set(corr) == {"head_out", "mlp_out"}
    for stats in corr.values():
        assert -1.0 <= stats["pearson"] <= 1.0 and -1.0 <= stats["spearman"] <= 1.0
    for name, group in res.df.groupby("site_type"):  # the slope of the figure's scatter: numpy's least squares
        x, y = group["effect"].to_numpy(dtype=float), group["attribution"].to_numpy(dtype=float)
        assert corr[name]["slope"] == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-6, abs=1e-9)
        assert corr[name]["slope_n"] == len(group) and corr[name]["slope_ci"][0] <= corr[name]["slope"]
    assert res.df["attribution"].notna().all()
    json.dumps(res.summary)


@pytest.mark.parametrize("family,components", [("gpt2", "kv"), ("llama", "q")])
def test_path_patching_equals_transformer_lens_direct_path(family, components, tiny_models):
    model, task = tiny_models[family], make_task(seed=13)
    _, clean_cache = model.bridge.run_with_cache(task.tokens)
    _, corrupt_cache = model.bridge.run_with_cache(task.corrupted_tokens)
    for component in components:
        res = path_patching(model, task, [(1, h) for h in range(4)], senders=[(0, 1)], component=component,
                            per_receiver=True, direction="denoise", progress=False)
        with torch.no_grad():
            ref = tlp.get_act_patch_direct_path(model.bridge, task.corrupted_tokens, clean_cache, corrupt_cache,
                                                tl_logit_diff(task), 0, 1, component=component, verbose=False)
        assert (torch.tensor(res.df["value"].to_numpy(), dtype=torch.float32) - ref[1]).abs().max().item() <= 1e-4


def test_path_to_logits_of_last_layer_heads_equals_exact_head_patching(linear_tail_model):
    """With a constant last MLP, a last-layer head reaches the logits only directly, so its path
    effect is its whole patching effect."""
    model, task = linear_tail_model, make_task(seed=15)
    paths = path_patching(model, task, "logits", senders=[(1, h) for h in range(4)], direction="noise", progress=False)
    _, cache = model.bridge.run_with_cache(task.corrupted_tokens)
    with torch.no_grad():
        ref = tlp.get_act_patch_attn_head_out_all_pos(model.bridge, task.tokens, cache, tl_logit_diff(task))
    assert (torch.tensor(paths.df["value"].to_numpy(), dtype=torch.float32) - ref[1]).abs().max().item() <= 1e-4
    # the setting it ran under: a path to the logits enters no receiver's q, k or v (the default component)
    assert paths.summary["component"] == paths.config["component"] == "resid" and set(paths.df["component"]) == {"resid"}


@pytest.mark.parametrize("arch", ["gemma2", "olmo2"])
def test_path_to_logits_through_post_attention_norms_by_hand(arch, arch_models, hf_of, more_arch_models, more_arch_dirs):
    """Post-norm blocks (Gemma 2, OLMo 2): a sender's write reaches the residual only through the
    norm of its layer's whole attention output. By hand with Hugging Face's modules: the base
    (corrupted) run's o_proj input with the sender's slice from the clean run, through
    post_attention_layernorm, minus the base run's, added to the final norm's input alone."""
    from tests_support import hf_reference

    model = arch_models(arch) if arch == "gemma2" else more_arch_models(arch)
    hf = hf_of(arch) if arch == "gemma2" else hf_reference(more_arch_dirs(arch))
    task = make_task(pos=5, seed=17)
    senders = [(layer, h) for layer in range(2) for h in range(4)]
    res = path_patching(model, task, "logits", senders=senders, direction="denoise", progress=False)
    zs = {}

    def run(tokens, edit=None):
        clean = tokens is task.tokens
        hooks = [layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a, i=i: zs.__setitem__((clean, i), a[0]))
                 for i, layer in enumerate(hf.model.layers)]
        if edit is not None:
            hooks.append(hf.model.norm.register_forward_pre_hook(lambda m, a: (a[0] + edit,)))
        try:
            with torch.no_grad():
                return tl_logit_diff(task)(hf(tokens).logits).item()
        finally:
            for hook in hooks:
                hook.remove()

    run(task.tokens)
    base = run(task.corrupted_tokens)
    d_head = model.facts.d_head
    hand = []
    for layer, h in senders:
        mod = hf.model.layers[layer]
        z_base, z_src = zs[(False, layer)], zs[(True, layer)]
        z_new = z_base.clone()
        z_new[..., h * d_head:(h + 1) * d_head] = z_src[..., h * d_head:(h + 1) * d_head]
        norm, o_proj = mod.post_attention_layernorm, mod.self_attn.o_proj
        with torch.no_grad():
            change = norm(o_proj(z_new)) - norm(o_proj(z_base))
        hand.append(run(task.corrupted_tokens, change))
    got = torch.tensor(res.df["value"].to_numpy(), dtype=torch.float32)
    assert (got - torch.tensor(hand)).abs().max().item() <= 1e-4
    assert (got - base).abs().max().item() > 1e-2  # the senders move the metric, so equality means something


def test_causal_tracing_restoring_a_whole_hidden_state_gives_the_clean_run(tiny_models):
    model, task = tiny_models["llama"], make_task(batch=3, pos=6, seed=17)
    res = causal_tracing(model, task, n_samples=2, seed=0, progress=False)
    with torch.no_grad():
        clean_prob = answer_logprob(model(task.tokens), task.answers).exp().mean().item()
    assert res.summary["clean_metric"] == pytest.approx(clean_prob, abs=1e-6)
    whole = res.df[(res.df.kind == "resid") & res.df.pos.isna()]
    assert len(whole) == model.facts.n_layers
    assert (whole["restored"] - clean_prob).abs().max() <= 1e-5
    assert abs(res.summary["corrupted_metric"] - clean_prob) > 1e-4  # the noise did something
    # Positions before the subject are untouched by the noise (causal attention): restoring them does nothing.
    before = res.df[res.df.pos == 0]
    assert before["ie"].abs().max() <= 1e-6


def test_causal_tracing_one_cell_by_hand(tiny_models):
    """One restored MLP cell recomputed with plain hooks, noise sample by noise sample."""
    model, task = tiny_models["gpt2"], make_task(batch=2, pos=6, seed=19)
    res = causal_tracing(model, task, kinds=["mlp"], n_samples=3, window=1, seed=4, progress=False)
    noise, _ = subject_noise(model, task.tokens, task.spans["subject"], 3, 3.0, 4)
    clean_mlp = hs.capture(model, task.tokens, [hs.site("mlp_out", 0)])[hs.site("mlp_out", 0)]
    effects, noised = [], []
    for s in range(3):
        add = [(hs.site("embed"), lambda act, hook, s=s: act + noise[s])]

        def restore(act, hook):
            act = act.clone()
            act[:, 2] = clean_mlp[:, 2]
            return act

        with torch.no_grad():
            corrupt = answer_logprob(model.run_with_hooks(task.tokens, fwd=add), task.answers).exp()
            restored = answer_logprob(model.run_with_hooks(task.tokens, fwd=add + [(hs.site("mlp_out", 0), restore)]),
                                      task.answers).exp()
        effects.append(restored - corrupt)
        noised.append(corrupt)
    cell = res.df[(res.df.layer == 0) & (res.df.pos == 2)]
    assert cell["ie"].item() == pytest.approx(torch.stack(effects).mean().item(), abs=1e-6)
    # review 20: the finding's clean and noised means carry 95% t intervals over prompts, the drop a paired one
    with torch.no_grad():
        clean = answer_logprob(model(task.tokens), task.answers).exp().double().numpy()  # [batch]
    rows = {"clean_metric_ci": clean, "corrupted_metric_ci": torch.stack(noised).double().mean(0).numpy()}
    rows["drop_ci"] = rows["clean_metric_ci"] - rows["corrupted_metric_ci"]
    for key, x in rows.items():
        low, high = scipy_stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=scipy_stats.sem(x))
        if key != "drop_ci":  # a probability's interval stops at 0 and 1 (here the clean one's reached -0.0098)
            low, high = max(low, 0.0), min(high, 1.0)
        assert res.summary[key] == pytest.approx([low, high], abs=1e-6), key


def test_causal_tracing_without_noise_has_no_effect(tiny_models):
    res = causal_tracing(tiny_models["gpt2"], make_task(), n_samples=1, noise_scale=0.0, progress=False)
    assert res.df["ie"].abs().max() <= 1e-6
    assert res.summary["corrupted_metric"] == pytest.approx(res.summary["clean_metric"], abs=1e-6)


def test_bad_input_gets_clear_errors(tiny_models):
    model, task = tiny_models["gpt2"], make_task()
    with pytest.raises(hs.ShapeMismatchError, match="same length"):
        activation_patching(model, task, corrupted_tokens=random_tokens(2, 7), progress=False)
    no_answers = Task(name="sentences", tokens=task.tokens, corrupted_tokens=task.corrupted_tokens, metric="cosine")
    with pytest.raises(ValueError, match="answers"):
        activation_patching(model, no_answers, metric="logit_diff", progress=False)
    with pytest.raises(hs.SiteError, match="resid_pre"):
        activation_patching(model, task, ["resid_pree"], progress=False)
    with pytest.raises(ValueError, match="denoise"):
        activation_patching(model, task, direction="sideways", progress=False)
    with pytest.raises(ValueError, match="corrupted_tokens"):
        activation_patching(model, Task(name="c", tokens=task.tokens, answers=task.answers), progress=False)
    with pytest.raises(ValueError, match="subject"):
        causal_tracing(model, Task(name="c", tokens=task.tokens, answers=task.answers), progress=False)
    with pytest.raises(hs.IndexOutOfRangeError):
        path_patching(model, task, [(1, 9)], progress=False)
    assert model.n_active_hooks() == 0


def test_hooks_are_removed_when_the_metric_fails(tiny_models):
    model = tiny_models["gpt2"]

    def broken(out):
        raise RuntimeError("metric boom")

    with pytest.raises(RuntimeError, match="metric boom"):
        activation_patching(model, make_task(), ["resid_pre"], metric=broken, progress=False)
    assert model.n_active_hooks() == 0


def test_run_on_a_task_file_and_figures(tiny_models, tmp_path):
    model = tiny_models["gpt2"]
    lines = [
        {"prompt": "w1 w2 w3 w4", "answer": "w5", "corrupted_prompt": "w1 w9 w3 w4", "wrong_answer": "w6"},
        {"prompt": "w7 w2 w8 w4", "answer": "w10", "corrupted_prompt": "w7 w11 w8 w4", "wrong_answer": "w12"},
    ]
    path = tmp_path / "task.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    res = run(model, str(path), PatchingConfig.preset(quick=True))
    assert res.name == "patching" and {"exact", "attribution", "path_patching"} <= set(res.tables)
    # no subject span and no zoo tokenizer: not run, and why (review 17a A2), so the section's guide says so
    from headscope.reports.plots_patching import GUIDE, guide_for

    assert res.summary["causal_tracing"] == {"not_run": (
        "the task marks no subject span to noise, and the model's tokenizer does not cover the zoo vocabulary for the "
        "zoo facts task, the one traced instead (causal tracing runs only on prompts with a subject span)")}
    assert "Causal tracing restores states" in GUIDE
    assert guide_for(res.summary) == GUIDE.replace(
        "Causal tracing restores states after noising the subject; ",
        "Causal tracing (restoring states after noising the subject) was not run: the task marks no subject span to "
        "noise, and the model's tokenizer does not cover the zoo vocabulary for the zoo facts task, the one traced "
        "instead (causal tracing runs only on prompts with a subject span); ")
    json.dumps(res.summary)
    # the cost model charges no tracing for it, so a budget records no cut of trace_samples (review 17a A2: "the budget
    # changed trace_samples None -> 0" for a part that never runs)
    from headscope.analyses.core import budget as B
    from headscope.analyses.core.task_files import resolve_task
    from headscope.analyses.patching import cost as patching_cost

    task = resolve_task(model, str(path), default="ioi", n_examples=8, seed=0)
    config = PatchingConfig.preset(quick=True)
    assert "causal_tracing" not in patching_cost.estimate(model, task, config).parts
    spans = {**task.spans, "subject": torch.tensor([[1, 2]] * len(task))}  # a subject span: charged
    marked = dataclasses.replace(task, spans=spans)
    assert patching_cost.estimate(model, marked, config).parts["causal_tracing"] > 0
    full = patching_cost.estimate(model, task, config)
    # half the estimate in fit's own seconds (the rate timed at its pass length, cached per model and length): the
    # machine's load between two timings at different lengths no longer decides whether anything is cut
    half = 0.5 * (full.total * B.seconds_per_pass(model, full.n_pos) + full.extra_s)
    fitted = B.fit(model, patching_cost.COST, task, config, half)
    assert "trace_samples" not in fitted.changed and fitted.changed  # the budget cut something else
    assert "trace_samples" in B.fit(model, patching_cost.COST, marked, config, half).changed
    from headscope.reports.plots_patching import figures

    figs = figures(res)
    assert {"exact_resid_pre", "exact_head_out", "attribution_vs_exact", "path_patching"} <= set(figs)
    labels = [t.get_text() for t in figs["exact_resid_pre"].axes[0].get_xticklabels()]
    n = max(model.to_tokens(x["prompt"]).shape[1] for x in lines)  # two prompts, other tokens: places from the end
    assert labels == [str(p - n) for p in range(n - 1)] + ["-1 (last)"]


# ------------------------------------------------------------------------------ zoo model
@pytest.mark.slow
def test_zoo_exact_patching_equals_transformer_lens(zoo_model):
    from headscope.analyses.core.tasks import zoo

    task = zoo(zoo_model, "ioi", n_examples=4, seed=0)
    check_against_transformer_lens(zoo_model, task, ["resid_pre", "mlp_out", "head_out", "head_out_by_pos"])


@pytest.mark.slow
def test_zoo_causal_tracing_on_facts(zoo_model):
    from headscope.analyses.core.tasks import zoo

    task = zoo(zoo_model, "facts", n_examples=16, seed=0)
    res = causal_tracing(zoo_model, task, n_samples=5, progress=False)
    whole = res.df[(res.df.kind == "resid") & res.df.pos.isna()]
    assert (whole["restored"] - res.summary["clean_metric"]).abs().max() <= 1e-5
    assert res.summary["clean_metric"] > res.summary["corrupted_metric"]
    print("zoo facts causal tracing peaks:", json.dumps(res.summary["peaks"], indent=1))


@pytest.mark.slow
def test_zoo_run_quick(zoo_model):
    res = run(zoo_model, config=PatchingConfig.preset(quick=True))
    assert {"exact", "attribution", "path_patching", "causal_tracing"} <= set(res.tables)
    assert "gap_within_noise" not in res.summary  # the trained model's IOI gap is clear: its summary is unchanged
    json.dumps(res.summary)


def test_correlation_with_exact_ranks_over_non_zero_cells_and_finds_reversals_and_misses():
    """#34 review 5 (A6), by hand: 8 cells, 4 with an exact effect; Spearman over those 4 only (the 4 tied zeros
    inflate the one over all 8); the top exact cell (14.25) has the 2nd largest |attribution|; a cell of 5.0
    (>= 1/4 of the largest) with attribution 0.5 is under 1/5 of it."""
    import pandas as pd
    from scipy import stats as sp

    from headscope.analyses.patching.attribution_patching import correlation_with_exact

    effect = [14.25, 6.41, 5.0, 0.3, 0.0, 0.0, 0.0, 0.0]
    attribution = [1.03, 3.08, 0.5, 0.2, 0.0, 0.0, 0.0, 0.0]
    exact = pd.DataFrame({"site_type": "attn_out", "layer": [0, 1, 2, 3, 0, 1, 2, 3], "head": None,
                          "pos": [7, 7, 7, 7, 1, 1, 1, 1], "position_from_end": [-1] * 4 + [-7] * 4, "effect": effect})
    attr = exact.drop(columns=["effect", "position_from_end"]).assign(attribution=attribution)
    got = correlation_with_exact(exact, attr)[1]["attn_out"]
    assert got["spearman_nonzero"] == pytest.approx(sp.spearmanr(effect[:4], attribution[:4]).statistic)  # 0.4
    assert got["spearman"] == pytest.approx(sp.spearmanr(effect, attribution).statistic)
    assert got["top_exact"] == {"layer": 0, "head": None, "pos": 7, "from_end": -1, "effect": 14.25,
                                "attribution": pytest.approx(1.03), "attribution_rank": 2, "tied": 0}
    # misses: 14.25 (1.03 < 14.25 / 5) is the largest such cell; 5.0 (0.5) is one too, 6.41 (3.08) is not
    assert got["missed"]["effect"] == 14.25
    exact.loc[0, "effect"], attr.loc[0, "attribution"] = 14.25, 4.0  # now first by |attribution| and within 5x
    got = correlation_with_exact(exact, attr)[1]["attn_out"]
    assert got["top_exact"]["attribution_rank"] == 1 and got["missed"]["effect"] == 5.0
    assert got["missed"]["attribution"] == pytest.approx(0.5)


def test_a_missed_cell_is_one_whose_interval_excludes_zero():
    """Review 13c A1, by hand from its default zoo run (q, logit difference, gap 52.43): L1H2's exact -0.140 with
    95% CI [-0.325, +0.047] (plain transformers, p = 0.13) against attribution +0.059 was named "missed"; an
    effect not distinguishable from 0 is not missed. The same cell with a half-width of 0.10 (CI [-0.24, -0.04])
    is."""
    import pandas as pd

    from headscope.analyses.patching.attribution_patching import correlation_with_exact

    effect = [-0.169, -0.140, 0.012, -0.008]
    exact = pd.DataFrame({"site_type": "q", "layer": [3, 1, 0, 2], "head": [7, 2, 0, 5], "pos": None,
                          "position_from_end": None, "effect": effect})
    attr = exact.drop(columns=["effect", "position_from_end"]).assign(attribution=[-0.172, 0.0586, 0.01, -0.007])
    got = correlation_with_exact(exact, attr, ci_half=[0.06, 0.186, 0.05, 0.05])[1]["q"]
    assert got["top_exact"]["attribution_rank"] == 1 and got["missed"] is None
    got = correlation_with_exact(exact, attr, ci_half=[0.06, 0.10, 0.05, 0.05])[1]["q"]
    assert (got["missed"]["layer"], got["missed"]["head"], got["missed"]["effect"]) == (1, 2, -0.140)


def test_bfloat16_rounding_counts_no_cell_and_no_verdict_rests_on_it():
    """#34 review 7 A3, by hand from its trained Qwen3 in bfloat16 (logit difference, gap 20.4): the rounding floor
    is measured on cells that patch an activation with itself (before every prompt's first corrupted token), two
    steps of 0.0078 there; mlp_out's one- and two-step cells then count as zero (6 non-zero, as in float32, not 8);
    head_out's top exact cell (2.969, 95% CI [1.304, 4.633]) is tied with 2.934, and attribution's 1.0944 against
    1.0912 (0.0032 apart) is within the floor: no "ranks only 2nd" and no "Do not rank". A real reversal still is."""
    import numpy as np
    import pandas as pd

    from headscope.analyses.patching.attribution_patching import correlation_with_exact, rounding_floor
    from headscope.reports.findings import finding
    from headscope.reports.plots_patching import site_slopes

    step = 2.0 ** -7  # one bfloat16 step of a mean of numbers in [1, 2): the cells' rounding
    exact = pd.DataFrame({"site_type": "resid_pre", "layer": 0, "head": [None] * 4 + [0], "pos": [0, 1, 2, 3, None],
                          "effect": [step, -2 * step, 5.0, 3.0, 9.0]})
    assert rounding_floor(exact, np.array([2, 3, -1]), torch.bfloat16, 10.3) == {"floor": 4 * step, "basis": "measured",
                                                                                  "n_cells": 2}  # pos 0, 1 < 2
    assert rounding_floor(exact, np.array([0, 3]), torch.bfloat16, 10.3, gap=20.4) == {
        "floor": pytest.approx(step * 10.3 / 20.4), "basis": "one rounding step", "n_cells": 0}  # no identity cell

    floor = 2 * 2 * step  # the review's measured floor: twice its largest identity cell, 0.0156
    mlp = [10.2, 4.26, 2.32, 0.86, 0.148, 0.0547, 2 * step, -2 * step, step] + [0.0] * 3
    exact = pd.DataFrame({"site_type": "mlp_out", "layer": 0, "head": None, "pos": range(12), "effect": mlp})
    attr = exact.drop(columns="effect").assign(attribution=[0.5 * e for e in mlp])
    assert correlation_with_exact(exact, attr)[1]["mlp_out"]["n_nonzero"] == 8  # 1e-3 x 10.2 = 0.0102 alone
    assert correlation_with_exact(exact, attr, floor=floor)[1]["mlp_out"]["n_nonzero"] == 6
    # review 10a C5: the two cells of +-2 steps are real effects the floor alone keeps out (one step is under 1e-3 of
    # the peak anyway): the finding says they are within rounding, not that they have no exact effect
    stats = correlation_with_exact(exact, attr, floor=floor)[1]["mlp_out"]
    assert stats["n_within_rounding"] == 2 and correlation_with_exact(exact, attr)[1]["mlp_out"]["n_within_rounding"] == 0
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "clean_metric": 12.0,
               "corrupted_metric": -1.0, "attribution_correlation": {"mlp_out": stats},
               "rounding_floor": {"floor": floor, "basis": "measured", "n_cells": 2}}
    said = finding("patching", summary)
    assert ("no interval for r or the slope: the other 6 cells have no exact effect beyond this precision's rounding "
            "(2 of them non-zero but within its floor, 0.031: measured on cells that patch an activation with itself)"
            ) in said, said
    plain = finding("patching", {**summary, "attribution_correlation": {
        "mlp_out": correlation_with_exact(exact, attr)[1]["mlp_out"]}})
    assert "the other 4 cells have no exact effect)" in plain or "the other 4 cells have no exact effect;" in plain, plain
    joined = exact.assign(attribution=attr["attribution"])  # the figure's legend counts alike
    assert site_slopes(joined, floor)["mlp_out"]["n_nonzero"] == 6 and site_slopes(joined)["mlp_out"]["n_nonzero"] == 8

    def head_out(effect, attribution, half):
        ex = pd.DataFrame({"site_type": "head_out", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "pos": None,
                           "effect": effect})
        at = ex.drop(columns="effect").assign(attribution=attribution)
        stats = correlation_with_exact(ex, at, floor=floor, ci_half=np.array(half))[1]
        cell = {"layer": 0, "head": 0, "pos": None, "token": "all", "effect": effect[0], "n": 8,
                "ci": [effect[0] - half[0], effect[0] + half[0]]}
        s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
             "clean_metric": 10.3, "corrupted_metric": -10.1, "top_sites": {"head_out": [cell]},
             "attribution_correlation": stats}
        return stats["head_out"]["top_exact"], finding("patching", s)

    review = [2.9688, 2.9336, 2.2695, 0.5]
    top, text = head_out(review, [1.0912, 1.0539, 1.0944, 0.2], [1.6643, 2.2, 1.0, 0.3])
    assert top["attribution_rank"] == 1 and top["tied"] == 2  # 2.9336 and 2.2695 lie within 2.9688 -+ 1.6643
    assert "ranks only" not in text and "Do not rank" not in text
    top, text = head_out(review, [1.0912, 1.0539, 1.0912 + step, 0.2], [0.01, 0.01, 0.01, 0.01])  # one step apart
    assert top["attribution_rank"] == 1 and top["tied"] == 0 and "Do not rank" not in text
    top, text = head_out(review, [1.0912, 1.2, 0.9, 0.2], [1.6643, 2.2, 1.0, 0.3])  # 2nd by attribution, but tied
    assert top["attribution_rank"] == 2 and top["tied"] == 2 and "ranks only" not in text
    top, text = head_out([3.0, 1.0, 0.5, 0.1], [0.5, 1.2, 0.4, 0.1], [0.5, 0.4, 0.3, 0.1])  # a real reversal
    assert top["attribution_rank"] == 2 and top["tied"] == 0
    assert ("at head_out, the top exact site (L0H0: exact 0.15 of the gap) ranks only 2nd, at 0.02 of the gap, under "
            "1/5 of it. Do not rank sites by it on this model at head_out.") in text


def test_correlation_with_exact_counts_the_non_zero_cells_it_rests_on():
    """attn_out on the zoo: one non-zero exact effect among 60 cells gives r = 1 whatever the rest."""
    import numpy as np
    import pandas as pd

    from headscope.analyses.patching.attribution_patching import correlation_with_exact

    effect = [0.0] * 59 + [0.8]
    exact = pd.DataFrame({"site_type": "attn_out", "layer": 0, "head": None, "pos": range(60), "effect": effect})
    attr = exact.assign(attribution=[1e-4 * (i % 3) for i in range(59)] + [0.7]).drop(columns="effect")
    _, stats = correlation_with_exact(exact, attr)
    assert stats["attn_out"]["n"] == 60 and stats["attn_out"]["n_nonzero"] == 1
    assert stats["attn_out"]["pearson"] > 0.999  # the single point fixes r
    rest = attr["attribution"].to_numpy()[:59]  # without it: effects all 0, r undefined
    assert stats["attn_out"]["pearson_without_top"] is None and np.ptp(rest) > 0
    exact.loc[:2, "effect"] = [0.5, 7e-4, 9e-4]  # 7e-4 < 1e-3 x 0.8 counts as zero, 9e-4 does not
    stats = correlation_with_exact(exact, attr)[1]["attn_out"]
    assert stats["n_nonzero"] == 3
    keep = np.arange(59)  # every cell but the largest (0.8 at position 59)
    expected = np.corrcoef(exact["effect"].to_numpy()[keep], attr["attribution"].to_numpy()[keep])[0, 1]
    assert stats["pearson_without_top"] == pytest.approx(expected)


def test_receivers_on_blocks_without_a_norm_before_attention_are_refused_in_one_line(more_arch_models):
    """Review 8 A6: q/k/v receivers on OLMo 2 (no norm before attention: its norms follow attention, q and k are
    normalised over all heads after the projection) crashed with AttributeError on `ln1`; one ConfigError line
    now says why and what runs instead, and a path to the logits still runs."""
    model = more_arch_models("olmo2")
    assert not hasattr(model.bridge.blocks[1], "ln1")  # the premise, from the bridge itself
    task = make_task(pos=5, seed=17)
    for component in ("q", "k", "v"):
        with pytest.raises(hs.ConfigError, match=r"layer\(s\) 1 of .* have none .*receivers='logits'") as err:
            path_patching(model, task, [(1, 0)], senders=[(0, 3)], component=component, progress=False)
        assert "\n" not in str(err.value)
    assert np.isfinite(path_patching(model, task, "logits", senders=[(0, 3)], progress=False).df["value"]).all()


def test_resid_mid_on_parallel_blocks_is_said_absent_and_refused_when_asked_for(arch_models):
    """Review 8 (C1): on GPT-NeoX (use_parallel_residual: attention and MLP both read the block's input, so there is no
    state between them) `run` left resid_mid out of its sites silently, from its defaults or from config.sites (which
    the report's budget sets too). Now summary["sites_absent"] says why, once in the finding; activation_patching,
    asked for it, raises the reason in one line."""
    from headscope.errors import SiteError
    from headscope.reports.findings import finding

    neox = arch_models("neox")
    assert neox.bridge.original_model.config.use_parallel_residual  # the premise, from Hugging Face's config
    cfg = PatchingConfig(n_examples=2, path_patching=False, trace_samples=0)
    result = run(neox, None, cfg)
    why = "none on this model; its blocks are parallel (attention and MLP both read the block's input)"
    assert result.summary["sites_absent"] == {"resid_mid": why}
    assert "resid_mid" not in result.config["sites"] and "resid_post" in result.config["sites"]
    text = finding("patching", result.summary)
    assert text.count("resid_mid") == 1 and text.endswith(f"resid_mid: {why}.")
    parallel = r"block 0 of .* has no resid_mid: attention and MLP run in parallel"
    asked = run(neox, None, dataclasses.replace(cfg, sites=("resid_pre", "resid_mid"), n_examples=1))
    assert asked.summary["sites_absent"] == {"resid_mid": why} and asked.config["sites"] == ["resid_pre"]
    with pytest.raises(SiteError, match=parallel):
        hs.activation_patching(neox, None, sites=("resid_pre", "resid_mid"), n_examples=2)


def test_sliding_window_cells_out_of_reach_of_the_answer_are_marked_and_are_zero(arch_models):
    """Review 9a B2 on Mistral (2 layers, each sliding over 8 keys), 20-token prompts whose every token is
    corrupted: resid_pre of layer 1 reaches the answer from 7 back at most (one window), of layer 0 from 14
    (two); resid_post of layer 0 from 7. The model itself decides: every cell marked is 0, and the cells at
    the edge of reach are not, so the mark is neither too wide nor too narrow. Review 12b A1: resid_post of the
    last layer before the answer is never read on any decoder (no attention follows it), marked as such and not
    blamed on the windows."""
    from headscope.reports.patching_words import finding

    task = make_task(batch=2, pos=20, seed=5)
    res = activation_patching(arch_models("mistral"), task, ["resid_pre", "resid_post"], progress=False)
    df = res.df
    back = -1 - df["position_from_end"]  # positions before the answer
    for site, layer, reach in (("resid_pre", 1, 7), ("resid_pre", 0, 14), ("resid_post", 0, 7)):
        cells = df[(df.site_type == site) & (df.layer == layer)]
        marked = cells[cells.unreachable]
        assert sorted(back[marked.index]) == list(range(reach + 1, 20)), (site, layer)
        assert marked.effect.abs().max() < 1e-6 and not cells.never_read.any()
        edge = cells[back[cells.index] == reach]
        assert edge.effect.abs().item() > 1e-4, (site, layer)  # one position nearer, the answer moves
    last = df[(df.site_type == "resid_post") & (df.layer == 1)]
    assert sorted(back[last[last.never_read].index]) == list(range(1, 20)) and not last.unreachable.any()
    assert last[last.never_read].effect.abs().max() < 1e-6 and last[back[last.index] == 0].effect.abs().item() > 1e-4
    assert res.summary["sliding_windows"] == {"windows": [8, 8], "unreachable": 12 + 5 + 12, "cells": 80}
    assert res.summary["never_read"] == {"cells": 19, "of": 80, "site_types": ["resid_post"]}
    text = finding(res.summary)
    assert "Sliding windows (every layer over 8 keys): 29 of the 80 position cells lie further before the answer" in text
    assert "19 of the 80 position cells are the last layer's writes (resid_post) before the answer position" in text


def test_only_cells_a_window_cuts_are_blamed_on_it(arch_models):
    """Review 12b A1 (a Mistral whose window 48 exceeds every prompt got its last layer hatched as "beyond the sliding
    windows' reach"): reach by hand. Gemma 2 (layer 0 slides over 8 keys, layer 1 is global) on 20 tokens: every
    cell of layer 0 reaches the answer through the global layer, so the window cuts none; Mistral (windows 8, 8) on
    8-token prompts: the longest distance, 7, is one window's reach, so none again. Either way the last layer's
    attn_out before the answer is never read (0, measured by the model), and the finding says so without a
    window sentence."""
    from headscope.reports.patching_words import finding

    for arch, pos in (("gemma2", 20), ("mistral", 8)):
        res = activation_patching(arch_models(arch), make_task(batch=2, pos=pos, seed=5), ["resid_pre", "attn_out"],
                                  progress=False)
        df, back = res.df, -1 - res.df["position_from_end"]
        assert not df.unreachable.any() and res.summary["sliding_windows"]["unreachable"] == 0, arch
        unread = df[df.never_read]
        assert set(unread.site_type) == {"attn_out"} and set(unread.layer) == {1}
        assert sorted(back[unread.index]) == list(range(1, pos)) and unread.effect.abs().max() < 1e-5, arch
        early = df[(df.site_type == "attn_out") & (df.layer == 0) & (back == pos - 2)]  # far back, it still moves it
        assert early.effect.abs().item() > 1e-4, arch
        text = finding(res.summary)
        assert "Sliding windows" not in text and "windows carry" not in text, arch
        assert f"{pos - 1} of the {2 * pos * 2} position cells are the last layer's writes (attn_out)" in text, arch


def test_exact_table_says_why_a_positions_token_is_blank_and_where_clean_and_corrupted_differ(tiny_models):
    """Review 14b C5: exact.csv's token was blank at -4, the swapped word that carried the whole effect, with no reason.
    Three prompts of 5 tokens, by hand: their clean tokens differ at position 2 only (blank label); the corrupted
    prompt swaps position 2 in all three and position 3 in two. token_note says so at exactly those positions."""
    model = tiny_models["gpt2"]
    clean = torch.tensor([[5, 6, 10, 7, 8], [5, 6, 11, 7, 8], [5, 6, 12, 7, 8]])
    corrupted = clean.clone()
    corrupted[:, 2] = torch.tensor([20, 21, 22])
    corrupted[:2, 3] = 30
    task = Task(name="toy", tokens=clean, corrupted_tokens=corrupted, answers=torch.tensor([9, 9, 9]),
                wrong_answers=torch.tensor([13, 13, 13]))
    df = activation_patching(model, task, ["resid_pre"], progress=False).tables["exact"]
    rows = df[df["layer"] == 0].set_index("pos")
    assert rows.loc[2, "token"] == "" and all(rows.loc[p, "token"].startswith(f"{p}: ") for p in (0, 1, 3, 4))
    assert list(rows["token_note"]) == ["", "", "varies across the 3 prompts that reach it; clean and corrupted differ "
                                        "here in 3 of 3", "clean and corrupted differ here in 2 of 3", ""]


def test_path_patching_records_its_gap_and_says_why_no_path_is_ranked(tiny_models, tiny_dirs):
    """Review 15b B2/C3: hs.path_patching's notebook view had no finding and 8 zero effects; its receiver read "1.0".
    Corrupted prompts identical to the clean ones: the clean and corrupted logit differences (plain Hugging Face) are
    equal, every pair's gap is 0 and every path's delta is 0. Then prompts that differ: both metrics as HF gives them."""
    from headscope.reports.render import escape, result_html
    from tests_support import hf_reference

    model, hf = tiny_models["gpt2"], hf_reference(tiny_dirs["gpt2"])
    clean = torch.tensor([[5, 6, 10, 7, 8], [5, 6, 11, 7, 8], [5, 6, 12, 7, 8]])
    other = clean.clone()
    other[:, 2] = torch.tensor([20, 21, 22])
    answers, wrong = torch.tensor([9, 9, 9]), torch.tensor([13, 13, 13])
    with torch.no_grad():
        hf_ld = {name: (lambda last: (last[:, 9] - last[:, 13]).double())(hf(t).logits[:, -1]) for name, t in
                 (("clean", clean), ("other", other))}  # [batch] each
    same = Task(name="toy", tokens=clean, corrupted_tokens=clean.clone(), answers=answers, wrong_answers=wrong)
    res = path_patching(model, same, [(1, 0)], progress=False)
    assert set(res.df["receiver"]) == {"L1H0"} and (res.df["effect"].abs() < 1e-5).all()  # float rounding only
    s = res.summary
    assert s["clean_metric"] == s["corrupted_metric"] == pytest.approx(float(hf_ld["clean"].mean()), abs=1e-4)
    assert s["gap_within_noise"]["gap"] == 0 and s["gap_within_noise"]["ci"] == [0.0, 0.0]
    said = (f"Clean and corrupted prompts give the same logit difference, {s['clean_metric']:.3g} (95% CI [")
    tail = ("on all 3 pairs (clean minus corrupted exactly 0): the corruption does not move the metric, so there is no "
            "difference for any patch to restore. No path is ranked; ")
    page = result_html(res, with_figures=False)
    assert escape(said) in page and escape(tail) in page
    differ = Task(name="toy", tokens=clean, corrupted_tokens=other, answers=answers, wrong_answers=wrong)
    s = path_patching(model, differ, "logits", senders=[(1, 0)], progress=False).summary
    assert s["clean_metric"] == pytest.approx(float(hf_ld["clean"].mean()), abs=1e-4)
    assert s["corrupted_metric"] == pytest.approx(float(hf_ld["other"].mean()), abs=1e-4)
    t = scipy_stats.t.interval(0.95, 2, loc=float(hf_ld["other"].mean()), scale=scipy_stats.sem(hf_ld["other"].numpy()))
    assert s["corrupted_metric_ci"] == pytest.approx(list(t), abs=1e-4) and s["metric_n"] == 3


def test_notebook_view_says_a_note_shared_by_every_row_once_above_the_table(tiny_models):
    """Review 15b C4: activation_patching's notebook table repeated the long share_note on every row. The same three
    prompts as below (a gap within noise): the note once, above the table, and no share_note column in it."""
    from headscope.reports.render import escape, result_html

    clean = torch.tensor([[5, 6, 10, 7, 8], [5, 6, 11, 7, 8], [5, 6, 12, 7, 8]])
    corrupted = clean.clone()
    corrupted[:, 0] = torch.tensor([20, 21, 22])
    task = Task(name="toy", tokens=clean, corrupted_tokens=corrupted, answers=torch.tensor([9, 9, 9]),
                wrong_answers=torch.tensor([13, 13, 13]))
    result = activation_patching(tiny_models["gpt2"], task, ["resid_pre"], progress=False)
    note = result.df["share_note"].iloc[0]
    page = result_html(result, with_figures=False)
    assert page.count(escape(note)) == 1 and "<th>share_note</th>" not in page
    assert page.index(escape(note)) < page.index("<th>share_of_gap</th>")


def test_exact_table_gives_no_share_of_a_gap_within_noise(tiny_models):
    """Review 14b-v C5: exact.csv gave share_of_gap 1.0 over a clean-corrupted gap within noise, the ranking the report
    refuses. Three prompts whose corrupted twin differs at the first token only, so the clean and corrupted logit
    differences (plain forwards) barely differ: scipy's paired 95% interval contains 0 or the mean gap is under 0.1
    logits. share_of_gap is then NaN in every row and share_note says why."""
    model = tiny_models["gpt2"]
    clean = torch.tensor([[5, 6, 10, 7, 8], [5, 6, 11, 7, 8], [5, 6, 12, 7, 8]])
    corrupted = clean.clone()
    corrupted[:, 0] = torch.tensor([20, 21, 22])
    task = Task(name="toy", tokens=clean, corrupted_tokens=corrupted, answers=torch.tensor([9, 9, 9]),
                wrong_answers=torch.tensor([13, 13, 13]))
    with torch.no_grad():
        rows = [model(t)[:, -1] for t in (clean, corrupted)]  # [batch, vocab] each
    diffs = [(r[:, 9] - r[:, 13]).double().numpy() for r in rows]
    ci = scipy_stats.ttest_rel(*diffs).confidence_interval(0.95)
    assert ci.low <= 0 <= ci.high or abs((diffs[0] - diffs[1]).mean()) < 0.1  # the premise: a gap within noise
    result = activation_patching(model, task, ["resid_pre"], progress=False)
    df = result.tables["exact"]
    assert "gap_within_noise" in result.summary and df["share_of_gap"].isna().all()
    assert df["effect"].abs().max() > 0  # the effects themselves are kept
    assert set(df["share_note"]) == {"share_of_gap not given: the clean-corrupted gap is within noise ("
                                     + result.summary["gap_within_noise"]["reason"] + "), so shares of it are not "
                                     "meaningful (the report ranks no site)"}


def test_top_sites_carry_each_cells_paired_interval_against_the_top_cell():
    """Review 19e B1: top_sites' vs_top is the 95% paired t interval of the top cell's per-example effect minus each
    other cell's over the examples both are real in (scipy by hand; a padded example left out of its pair only)."""
    import math

    import pandas as pd
    from scipy import stats

    from headscope.analyses.patching.analysis import top_sites

    eff = np.array([[3.0, 1.0, 2.5, 4.0, 2.0], [1.0, 1.5, 0.5, 2.0, np.nan], [0.5, -0.5, 1.0, 0.2, 0.1]])  # [cell, batch]
    df = pd.DataFrame({"site_type": ["head_out"] * 3, "layer": [0, 1, 1], "head": [0, 0, 1], "pos": [np.nan] * 3,
                       "token": ["all"] * 3, "effect": np.nanmean(eff, 1)})
    arrays = {"low": np.zeros(3), "high": np.ones(3), "n": np.array([5, 4, 5]), "effects": eff}
    rows = top_sites(df, intervals={"head_out": arrays})["head_out"]
    assert "vs_top" not in rows[0]
    for rec, cell in zip(rows[1:], (1, 2)):
        d = eff[0] - eff[cell]
        d = d[np.isfinite(d)]
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        assert np.allclose(rec["vs_top"], [d.mean() - half, d.mean() + half]), cell
