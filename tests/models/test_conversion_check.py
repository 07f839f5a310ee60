"""load_model's conversion probe (models/conversion_check.py): a model whose TransformerLens bridge disagrees
with Hugging Face's own forward is refused in one line; families that agree load, in half precision too. Grouped
Falcon (models/falcon_qkv.py) is the case that needed it, and now equals Hugging Face."""
from __future__ import annotations

import contextlib
import re

import pytest
import torch

import headscope as hs
from headscope.errors import UnsupportedModelError
from headscope.models import conversion_check
from tests_support import N_WORDS, SPECIALS, normal_matrices, save_random_checkpoint, word_tokenizer


def build_falcon_grouped(out, seed: int = 0, *, multi_query: bool = False):
    """A tiny random new-decoder-architecture Falcon ("falcon_grouped"): 4 query heads in 2 KV groups, fused
    query_key_value stored per group [q, q, k, v], parallel attention and MLP, rotary, no biases."""
    import transformers

    config = transformers.FalconConfig(
        vocab_size=len(SPECIALS) + N_WORDS, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        new_decoder_architecture=True, num_kv_heads=2, multi_query=multi_query, parallel_attn=True, alibi=False,
        bias=False, max_position_embeddings=64, bos_token_id=2, eos_token_id=3, pad_token_id=1)
    save_random_checkpoint(config, out, word_tokenizer(), seed=seed, init=normal_matrices())
    return out


@pytest.fixture(scope="module")
def falcon_grouped_dir(tmp_path_factory):
    return build_falcon_grouped(tmp_path_factory.mktemp("falcon-grouped") / "falcon_grouped")


def _plain_disagreement(path) -> float:
    """max |bridge logit - plain Hugging Face logit| on the probe's tokens: TransformerLens's bridge booted
    directly (its own adapter, no headscope) against a separate Hugging Face model (eager) loaded from the files."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM

    bridge = TransformerBridge.boot_transformers(str(path), device="cpu", dtype=torch.float32)
    tokens = conversion_check.probe_tokens(bridge)
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        return (bridge(tokens, return_type="logits") - hf(tokens).logits).abs().max().item()


@pytest.fixture
def transformer_lens_split(monkeypatch):
    """load_model without headscope's grouped Falcon split: TransformerLens's own conversion."""
    from headscope.models import loading

    monkeypatch.setattr(loading.falcon_qkv, "grouped_split", contextlib.nullcontext)


def test_a_wrong_conversion_is_refused_in_one_line(falcon_grouped_dir, transformer_lens_split):
    """TransformerLens splits grouped Falcon's fused qkv as one [Q | K | V] block; Hugging Face stores it per KV
    group. Left as it is, load_model refuses, naming the architecture and the disagreement measured independently."""
    expected = _plain_disagreement(falcon_grouped_dir)
    assert expected > 1.0  # the conversion is wrong by whole logits, not by rounding
    with pytest.raises(UnsupportedModelError) as caught:
        hs.load_model(str(falcon_grouped_dir), device="cpu")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("TransformerLens's conversion of FalconForCausalLM (")
    assert message.endswith("headscope refuses rather than report wrong numbers.")
    assert re.search(r"disagrees with Hugging Face's own forward by ([0-9.e+-]+) logits", message).group(1) == \
        f"{expected:.2g}"


def test_a_wrong_conversion_is_refused_in_bfloat16(falcon_grouped_dir, transformer_lens_split):
    """The half-precision tolerance (8 bfloat16 steps) still sees a conversion that is wrong by whole logits."""
    with pytest.raises(UnsupportedModelError, match="in bfloat16 explains at most"):
        hs.load_model(str(falcon_grouped_dir), device="cpu", dtype="bfloat16")


@pytest.mark.parametrize("multi_query", [False, True])
def test_grouped_falcon_equals_hugging_face(multi_query, tmp_path):
    """With the grouped split (models/falcon_qkv.py) the bridge computes Hugging Face's numbers: logits of
    model(tokens) and run_with_cache, every layer's pattern, and a head zeroed through hook_z against the same
    head zeroed at Hugging Face's dense input; multi_query=True (Falcon-40B's config), which TransformerLens
    cannot load, loads."""
    from transformers import AutoModelForCausalLM

    from tests_support import zero_head

    path = build_falcon_grouped(tmp_path / "falcon", multi_query=multi_query)
    model = hs.load_model(str(path), device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    tokens = torch.tensor([[2, 5, 9, 13, 20, 7, 33, 40, 11, 6]])
    with torch.no_grad():
        ref = hf(tokens, output_attentions=True)
        torch.testing.assert_close(model(tokens), ref.logits, atol=1e-4, rtol=0)
        logits, cache = model.run_with_cache(tokens)
        torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=0)
        for layer in range(2):
            torch.testing.assert_close(cache["pattern", layer], ref.attentions[layer], atol=1e-5, rtol=0)
        ablated = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head(2))])
        dense = hf.transformer.h[1].self_attention.dense

        def zero(module, args):
            z = args[0].clone()
            z[..., 32:48] = 0.0  # head 2 of 4, d_head 16
            return (z,)

        handle = dense.register_forward_pre_hook(zero)
        try:
            hand = hf(tokens).logits
        finally:
            handle.remove()
    assert (hand - ref.logits).abs().max() > 0.01  # the ablation moves the logits
    torch.testing.assert_close(ablated, hand, atol=1e-4, rtol=0)


def test_the_reference_is_hugging_face_and_the_bridge_is_put_back(falcon_grouped_dir):
    """hugging_face_modules runs the bridge's own HF model as a separately loaded Hugging Face model does, and
    leaves every bridge component in place afterwards (also after an error inside)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM

    bridge = TransformerBridge.boot_transformers(str(falcon_grouped_dir), device="cpu", dtype=torch.float32)
    before = [(id(m), dict(m._modules)) for m in bridge.original_model.modules()]
    hf = AutoModelForCausalLM.from_pretrained(falcon_grouped_dir, attn_implementation="eager").eval()
    tokens = torch.tensor([[5, 9, 13, 20, 7, 33, 40, 11]])
    with torch.no_grad(), conversion_check.hugging_face_modules(bridge.original_model) as own:
        torch.testing.assert_close(own(input_ids=tokens).logits, hf(tokens).logits, atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="inside"), conversion_check.hugging_face_modules(bridge.original_model):
        raise RuntimeError("inside")
    assert [(id(m), dict(m._modules)) for m in bridge.original_model.modules()] == before


def test_tolerance_is_a_few_steps_of_the_dtype_at_the_logits_size():
    """max(1e-4, 8 eps) x (1 + largest |logit|): bfloat16 8 x 2^-7, float16 8 x 2^-10, float32 1e-4."""
    assert conversion_check.tolerance(torch.bfloat16, 7.0) == 8 * 2.0 ** -7 * 8
    assert conversion_check.tolerance(torch.float16, -3.0) == 8 * 2.0 ** -10 * 4
    assert conversion_check.tolerance(torch.float32, 9.0) == pytest.approx(1e-3)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_family_that_agrees_loads_in_half_precision(dtype, tiny_dirs):
    """A Llama-style model loads in half precision: its disagreement is within the dtype's tolerance."""
    model = hs.load_model(tiny_dirs["llama"], device="cpu", dtype=dtype)
    diff, size = conversion_check.disagreement(model.bridge)
    assert diff <= conversion_check.tolerance(model.dtype, size)


def test_a_model_that_overflows_in_its_dtype_is_not_called_a_conversion_error():
    """Tracr's 2^40 LayerNorm epsilon overflows float16 in Hugging Face's own forward as in the bridge's: the
    same non-finite logits in both passes are no disagreement, so the model loads as before."""
    model = hs.load_model("tracr/sort", device="cpu", dtype="float16")
    assert conversion_check.disagreement(model.bridge)[0] == 0.0


def test_a_probe_that_cannot_run_warns_and_loads(tiny_dirs, monkeypatch):
    """A model the probe cannot run (a forward that needs more than token ids) is loaded with one warning that its
    conversion is unchecked, not refused."""
    from headscope.errors import HeadscopeWarning

    def fails(bridge, tokens=None):
        raise TypeError("forward() missing 1 required argument: 'decoder_input_ids'")

    monkeypatch.setattr(conversion_check, "disagreement", fails)
    with pytest.warns(HeadscopeWarning, match=r"could not check TransformerLens's conversion of GPT2LMHeadModel .*"
                                              r"TypeError: forward\(\) missing.*its numbers are unchecked\.$"):
        model = hs.load_model(tiny_dirs["gpt2"], device="cpu")
    assert model.facts.n_layers == 2
