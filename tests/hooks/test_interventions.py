"""Interventions: hooks removed after errors, gate gradients, closed-form ablations, patching."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from tests_support import build_tiny_model, random_tokens


def logit_metric(logits: torch.Tensor) -> torch.Tensor:
    """A scalar metric: mean log-probability of token 5 at the last position."""
    return logits[:, -1].log_softmax(-1)[:, 5].mean()


def test_hooks_are_removed_after_an_exception(tiny_models):
    model = tiny_models["gpt2"]
    for manager in (
        lambda: hs.ablate(model, heads=[(0, 1)]),
        lambda: hs.head_gates(model),
        lambda: hs.patch(model, {hs.site("resid_pre", 0): torch.zeros(9, 9, 9)}, hs.site("resid_pre", 0)),
    ):
        with pytest.raises(RuntimeError, match="boom"):
            with manager():
                assert model.n_active_hooks() > 0
                raise RuntimeError("boom")
        assert model.n_active_hooks() == 0
    with pytest.raises(hs.ShapeMismatchError):  # an error raised inside a hook, mid-forward
        with hs.patch(model, {hs.site("resid_pre", 0): torch.zeros(1, 3, 64)}, hs.site("resid_pre", 0)):
            model(random_tokens(2, 5))
    assert model.n_active_hooks() == 0


def test_gates_at_one_leave_the_model_unchanged(tiny_models):
    model = tiny_models["llama"]
    tokens = random_tokens(2, 6)
    with torch.no_grad():
        plain = model(tokens)
    with hs.head_gates(model):
        gated = model(tokens)
    assert torch.allclose(plain, gated, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_gate_gradients_equal_finite_differences(family, tiny_models):
    model = tiny_models[family]
    tokens = random_tokens(3, 6)
    with hs.head_gates(model) as gates:
        (grad,) = torch.autograd.grad(logit_metric(model(tokens)), [gates])  # the shared model's .grad stays None
    eps = 1e-3
    for layer, head in [(0, 0), (0, 3), (1, 2)]:
        values = []
        for sign in (+1, -1):
            with torch.no_grad(), hs.head_gates(model) as g:
                g[layer, head] += sign * eps
                values.append(logit_metric(model(tokens)).item())
        numeric = (values[0] - values[1]) / (2 * eps)
        assert grad[layer, head].item() == pytest.approx(numeric, rel=2e-2, abs=2e-4)


@pytest.fixture(scope="module")
def one_head_model(tmp_path_factory):
    """A GPT-2 whose layer-0 attention output comes from head 1 alone (the other heads' W_O rows are zero)."""
    path = build_tiny_model("gpt2", tmp_path_factory.mktemp("one-head") / "gpt2", seed=1)
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    w = weights["transformer.h.0.attn.c_proj.weight"]  # Conv1D: [d_model (in = heads x d_head), d_model]
    keep = torch.zeros_like(w)
    keep[16:32] = w[16:32]  # head 1's rows
    weights["transformer.h.0.attn.c_proj.weight"] = keep
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return hs.load_model(path, device="cpu"), weights["transformer.h.0.attn.c_proj.bias"]


def test_zero_ablation_in_closed_form(one_head_model):
    model, bias = one_head_model
    tokens = random_tokens(2, 6)
    with hs.ablate(model, heads=[(0, 1)]):
        acts = hs.capture(model, tokens, [hs.site("attn_out", 0)])
    # With its only contributing head zeroed, the attention output is the bias alone.
    assert (acts[hs.site("attn_out", 0)] - bias).abs().max().item() <= 1e-6
    with hs.ablate(model, heads=[(0, 1)], positions=[2]):
        part = hs.capture(model, tokens, [hs.site("attn_out", 0)])[hs.site("attn_out", 0)]
    clean = hs.capture(model, tokens, [hs.site("attn_out", 0)])[hs.site("attn_out", 0)]
    assert (part[:, 2] - bias).abs().max().item() <= 1e-6
    assert torch.equal(part[:, [0, 1, 3, 4, 5]], clean[:, [0, 1, 3, 4, 5]])


def test_mean_and_resample_ablation_in_closed_form(one_head_model):
    """attn_out = z_1 W_O[1] + b is linear in the ablated head, so mean ablation gives the
    reference mean of attn_out, and resampling gives one reference row's attn_out."""
    model, _ = one_head_model
    tokens, reference = random_tokens(2, 6, seed=1), random_tokens(5, 6, seed=2)
    ref_out = hs.capture(model, reference, [hs.site("attn_out", 0)])[hs.site("attn_out", 0)]  # [5, 6, d]
    with hs.ablate(model, heads=[(0, 1)], method="mean", reference=reference):
        mean_out = hs.capture(model, tokens, [hs.site("attn_out", 0)])[hs.site("attn_out", 0)]
    assert (mean_out - ref_out.mean(0)).abs().max().item() <= 1e-5
    with hs.ablate(model, heads=[(0, 1)], method="resample", reference=reference, seed=0):
        res_out = hs.capture(model, tokens, [hs.site("attn_out", 0)])[hs.site("attn_out", 0)]
    for row in res_out:
        assert min((row - r).abs().max().item() for r in ref_out) <= 1e-5


def test_neuron_ablation_removes_exactly_its_sub_update(tiny_models):
    model = tiny_models["gpt2"]
    tokens = random_tokens(2, 5)
    names = [hs.site("mlp_post", 1), hs.site("mlp_out", 1)]
    clean = hs.capture(model, tokens, names)
    mem = hs.mlp_memories(model, 1)
    with hs.ablate(model, neurons=[(1, 7)]):
        ablated = hs.capture(model, tokens, [hs.site("mlp_out", 1)])[hs.site("mlp_out", 1)]
    expected = clean[names[1]] - clean[names[0]][..., 7:8] * mem.values[7]
    assert (ablated - expected).abs().max().item() <= 1e-5


def test_patching_every_position_of_resid_pre_reproduces_the_source_run(tiny_models):
    model = tiny_models["llama"]
    clean, corrupt = random_tokens(2, 7, seed=4), random_tokens(2, 7, seed=5)
    name = hs.site("resid_pre", 1)
    source = hs.capture(model, corrupt, [name])
    with torch.no_grad():
        corrupt_logits, clean_logits = model(corrupt), model(clean)
    with torch.no_grad(), hs.patch(model, source, name):
        patched = model(clean)
    assert (patched - corrupt_logits).abs().max().item() <= 1e-5
    with torch.no_grad(), hs.patch(model, source, name, positions=[3]):
        part = model(clean)
    assert torch.allclose(part[:, :3], clean_logits[:, :3], atol=1e-6)  # causal: earlier positions untouched
    assert not torch.allclose(part[:, 3:], clean_logits[:, 3:], atol=1e-4)


def test_patching_one_head_changes_only_that_head(tiny_models):
    model = tiny_models["gpt2"]
    clean, corrupt = random_tokens(2, 6, seed=6), random_tokens(2, 6, seed=7)
    z = hs.site("z", 1)
    source = hs.capture(model, corrupt, [z])
    with hs.patch(model, source, z, heads=[2]):
        got = hs.capture(model, clean, [z])[z]
    clean_z = hs.capture(model, clean, [z])[z]
    assert torch.equal(got[:, :, 2], source[z][:, :, 2])
    assert torch.equal(got[:, :, [0, 1, 3]], clean_z[:, :, [0, 1, 3]])


def test_clean_and_source_of_different_shapes_is_a_clear_error(tiny_models):
    model = tiny_models["gpt2"]
    source = hs.capture(model, random_tokens(2, 5), [hs.site("resid_pre", 0)])
    with pytest.raises(hs.ShapeMismatchError, match="same batch size and length"):
        with hs.patch(model, source, hs.site("resid_pre", 0)):
            model(random_tokens(2, 7))


def test_hooks_are_removed_after_a_keyboard_interrupt_inside_a_hook(tiny_models, monkeypatch):
    """Ctrl-C arrives mid-forward, inside a hook of hs.capture or hs.ablate: no hook stays attached."""
    import importlib

    capture_mod = importlib.import_module("headscope.hooks.capture")  # (the package re-exports a function of that name)
    interventions_mod = importlib.import_module("headscope.hooks.interventions")
    model = tiny_models["gpt2"]
    tokens = random_tokens(2, 5)
    calls = []

    def interrupt(*args, **kwargs):
        calls.append(model.n_active_hooks())
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(capture_mod, "select_positions", interrupt)
        with pytest.raises(KeyboardInterrupt):
            hs.capture(model, tokens, [hs.site("resid_pre", 0), hs.site("resid_post", 1)])
    assert len(calls) == 1 and calls[0] > 0 and model.n_active_hooks() == 0  # it ran hooked, and is unhooked now
    with monkeypatch.context() as m:
        m.setattr(interventions_mod, "position_index", interrupt)
        with pytest.raises(KeyboardInterrupt):
            with hs.ablate(model, heads=[(0, 1), (1, 0)]):
                model(tokens)
    assert len(calls) == 2 and calls[1] > 0 and model.n_active_hooks() == 0
    with torch.no_grad():  # and the model still runs unhooked, as plain as before
        assert torch.equal(model(tokens), model(tokens))
    assert hs.capture(model, tokens, hs.site("resid_pre", 0))[hs.site("resid_pre", 0)].shape == (2, 5, model.facts.d_model)


def test_a_query_head_index_on_grouped_kv_is_refused_on_entry_naming_its_kv_head(tiny_models):
    """Review 9b C3: heads=[2] on v of a model with 2 KV heads for 4 query heads failed at the first forward
    with 'out of range ... with 2 heads' and no word of why. Query heads 2-3 read KV head 1 (repeat_kv's
    grouping: query head h reads KV head h // (n_heads / n_kv_heads))."""
    model = tiny_models["llama"]
    assert (model.facts.n_heads, model.facts.n_kv_heads) == (4, 2)
    v = hs.site("v", 0)
    source = hs.capture(model, random_tokens(1, 5), [v])
    with pytest.raises(hs.IndexOutOfRangeError) as err:
        with hs.patch(model, source, v, heads=[2]):
            raise AssertionError("entered")  # refused before the body runs
    msg = str(err.value)
    assert "2 KV heads (0..1)" in msg and "KV head 1 (query heads 2-3)" in msg and "heads=[1]" in msg
    with pytest.raises(hs.IndexOutOfRangeError, match="has heads 0..3"):
        with hs.patch(model, hs.capture(model, random_tokens(1, 5), [hs.site("z", 0)]), hs.site("z", 0), heads=[4]):
            raise AssertionError("entered")
