"""Review 16d (OPT-350m style: post-LN blocks, no final norm, word embeddings 16 wide with project_in/project_out):
d_mlp from the MLP weights (A5), the unembedding through project_out (A4, A5), one-line refusals where no linear
read of the stream exists (A4, A2), and the header's and gradient x input's words (B3). Values against plain HF."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.errors import UnsupportedModelError

D_MODEL, D_EMBED, FFN = 32, 16, 48  # TransformerLens's bridge config says d_mlp = 4 x 32 = 128 for OPT


def _build(out, pre_ln: bool):
    import transformers

    from tests_support import N_WORDS, SPECIALS, save_random_checkpoint, word_tokenizer

    cfg = transformers.OPTConfig(
        vocab_size=len(SPECIALS) + N_WORDS, hidden_size=D_MODEL, num_hidden_layers=2, ffn_dim=FFN, num_attention_heads=4,
        max_position_embeddings=64, do_layer_norm_before=pre_ln, word_embed_proj_dim=D_EMBED, activation_function="relu",
        bos_token_id=2, eos_token_id=3, pad_token_id=1, dropout=0.0, tie_word_embeddings=True)

    def init(model) -> None:  # biases and LayerNorm gains away from their init, so each one counts
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "layer_norm" in name:
                p.normal_(1.0, 0.2)

    save_random_checkpoint(cfg, out, word_tokenizer(), init=init)
    return out


@pytest.fixture(scope="module")
def opt(tmp_path_factory):
    """{"post": (HookedModel, HF model), "pre": ...}: post-LN (the review's shape) and pre-LN, both projected."""
    from tests_support import hf_reference

    root = tmp_path_factory.mktemp("opt")
    out = {}
    for kind in ("post", "pre"):
        path = _build(root / kind, pre_ln=kind == "pre")
        out[kind] = (hs.load_model(path, device="cpu"), hf_reference(path))
    return out


TOKENS = torch.tensor([[2, 5, 9, 12, 7, 30, 8]])


def _last_block_output(hf, tokens):
    """[1, pos, d_model]: the last decoder layer's output in plain HF (a forward hook)."""
    got = {}
    layer = hf.model.decoder.layers[-1]
    handle = layer.register_forward_hook(lambda m, a, o: got.__setitem__("x", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        logits = hf(tokens).logits
    handle.remove()
    return got["x"], logits


def test_facts_read_d_mlp_from_the_weights_and_record_post_ln(opt):
    """A5: d_mlp is ffn_dim (fc1's width), not the bridge config's 4 x d_model; post_ln and d_embed from the model."""
    for kind, (model, hf) in opt.items():
        assert model.facts.d_mlp == FFN == hf.model.decoder.layers[0].fc1.out_features
        assert model.facts.post_ln is (kind == "post")
        assert model.facts.d_embed == D_EMBED == hf.model.decoder.project_in.in_features
        assert hs.mlp_memories(model, 0).values.shape == (FFN, D_MODEL)
        # review 16dv A1: model.cfg (TransformerLens habits) said 4 x d_model = 128; now fc1's width as facts
        assert model.cfg.d_mlp == FFN != 4 * D_MODEL


def test_unembedding_goes_through_project_out(opt):
    """A4: tokens_to_residual_directions is P^T W_U[:, t] (d_model wide) and the resumed passes' readout (final norm
    where there is one, project_out, unembedding) gives HF's logits from HF's last block output, on both shapes."""
    from headscope.execution.resume import logits_of

    for model, hf in opt.values():
        p, w = hf.model.decoder.project_out.weight, hf.lm_head.weight  # [d_embed, d_model], [vocab, d_embed]
        dirs = model.tokens_to_residual_directions(torch.tensor([5, 9]))  # [2, d_model]
        torch.testing.assert_close(dirs, (w[[5, 9]] @ p).detach())
        x, logits = _last_block_output(hf, TOKENS)
        with torch.no_grad():
            torch.testing.assert_close(logits_of(model, x), logits, atol=1e-5, rtol=1e-5)
    post, hf = opt["post"]
    x, logits = _last_block_output(hf, TOKENS)
    torch.testing.assert_close(x[0, -1] @ post.tokens_to_residual_directions(7), logits[0, -1, 7], atol=1e-5, rtol=1e-5)


def test_value_logits_through_the_blocks_norm_and_project_out(opt):
    """A5: on post-LN each value vector is read as the block's final_layer_norm passes it (centred, times its gain; the
    shared scale left out), then project_out and the tied unembedding: by hand from HF's weights."""
    from headscope.analyses.mlp.analysis import value_logits

    model, hf = opt["post"]
    for layer in range(2):
        block = hf.model.decoder.layers[layer]
        v = block.fc2.weight.T.detach()  # [ffn, d_model]
        v = (v - v.mean(-1, keepdim=True)) * block.final_layer_norm.weight.detach()
        hand = v @ hf.model.decoder.project_out.weight.detach().T @ hf.lm_head.weight.detach().T  # [ffn, vocab]
        torch.testing.assert_close(value_logits(model, layer), hand, atol=1e-5, rtol=1e-5)


def _task(model):
    rows = [{"prompt": f"w1 w{i} w3 w4", "answer": "w9", "corrupted_prompt": f"w7 w{i} w3 w4", "wrong_answer": "w11"}
            for i in (2, 5, 6, 8)]
    return hs.load_task(model, rows)


def test_post_ln_refusals_are_one_line_before_any_work(opt):
    """A4, A2: lens, DLA, circuits, path patching and the cache's decompositions refuse with one line naming post-LN
    (they raised SiteError / AttributeError / a stack size RuntimeError, or path patching named the wrong head)."""
    from headscope.analyses.circuits.analysis import NEEDS
    from headscope.analyses.core.contract import model_reasons

    model, _ = opt["post"]
    task = _task(model)
    _, cache = hs.run_with_cache(model, TOKENS)
    calls = {
        "the logit lens and direct logit attribution": [lambda: hs.logit_lens(model, task),
                                                        lambda: hs.direct_logit_attribution(model, task),
                                                        lambda: hs.run_analysis("circuits", model, task)],
        "path patching": [lambda: hs.path_patching(model, task, receivers="logits")],
        "decompose_resid": [lambda: cache.decompose_resid(pos_slice=-1)],
        "logit_attrs": [lambda: cache.logit_attrs(cache.accumulated_resid(pos_slice=-1), 5, pos_slice=-1)],
        "accumulated_resid(apply_ln=True) (the logit lens)": [lambda: cache.accumulated_resid(apply_ln=True)],
    }
    for what, fns in calls.items():
        for fn in fns:
            with pytest.raises(UnsupportedModelError) as err:
                fn()
            line = str(err.value)
            assert "\n" not in line and line.startswith(f"{what} cannot run on {model.facts.name}: its blocks are post-LN "
                                                        "(do_layer_norm_before=False"), line
    assert model_reasons(NEEDS, model) == [f"the logit lens and direct logit attribution cannot run on {model.facts.name}: "
                                           "its blocks are post-LN (do_layer_norm_before=False: each block's LayerNorm "
                                           "normalises the whole residual stream after every add, and no final norm "
                                           "follows), so a write reaches the logits only through every later LayerNorm "
                                           "and no sum of per-component terms equals the logits"]
    assert cache.accumulated_resid().shape == (3, 1, TOKENS.shape[1], D_MODEL)  # the streams themselves still read


def test_post_ln_blocks_have_no_resumable_shape(opt):
    """The resumed and hook-free passes' block shapes (pre-norm ln2 before the MLP) are not OPT's post-LN block:
    block_shape.parts is None there, so those shortcuts stay off by design (no failed check, no warning)."""
    from headscope.execution import block_shape

    assert all(block_shape.parts(b) is None for b in opt["post"][0].bridge.blocks)
    assert all(block_shape.parts(b) is not None for b in opt["pre"][0].bridge.blocks)


def test_pre_ln_projected_decomposition_and_hidden_final_norm(opt):
    """decompose_resid's "embed" row enters the stream through project_in, so the rows sum to HF's last block output;
    reads through the final norm, which the bridge does not hook on OPT, refuse in one line."""
    model, hf = opt["pre"]
    _, cache = hs.run_with_cache(model, TOKENS)
    stack, labels = cache.decompose_resid(return_labels=True)
    x, _ = _last_block_output(hf, TOKENS)
    assert labels[:2] == ["embed", "pos_embed"]
    torch.testing.assert_close(stack.sum(0), x, atol=1e-5, rtol=1e-5)
    with pytest.raises(UnsupportedModelError, match=r"^accumulated_resid\(apply_ln=True\) \(the logit lens\) cannot run "
                                                    r"on .*: TransformerLens's bridge exposes no hook for its final norm"):
        cache.accumulated_resid(apply_ln=True)


def test_header_and_gradient_input_name_post_ln_and_the_projection(opt):
    """B3: the header's architecture line says post-LN and the projected embedding; gradient x input says its width."""
    from headscope.analyses.attribution.methods import gradient_input
    from headscope.reports.html_report import readout_clause

    model, _ = opt["post"]
    assert readout_clause(dict(vars(model.facts))) == (
        ", post-LN blocks (each block's LayerNorms normalise the whole residual stream after its adds; no final norm), "
        "token embeddings 16 wide, projected into the 32-wide stream (project_in) and back to 16 before the "
        "unembedding (project_out)")
    assert readout_clause({"d_model": 64, "post_ln": False, "d_embed": None}) == ""
    assert gradient_input(model) == ("each token's embedding (the embedding module's output, 16 wide, before project_in "
                                     "maps it into the 32-wide residual stream, before the position embedding is added)")
