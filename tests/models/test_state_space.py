"""State-space hybrids are refused at load in one line (models/state_space.py, review 18c A3/A4): a tiny random
Jamba (Mamba layers between attention layers) and FalconH1 (a Mamba2 branch beside every layer's attention) built
here; the CLI exits 2 with that line and writes nothing, load_model raises it; attention-only configs pass."""
from __future__ import annotations

import pytest
import torch
import transformers

from headscope.errors import UnsupportedModelError
from headscope.models import state_space
from tests.tests_support import N_WORDS, SPECIALS, save_random_checkpoint, word_tokenizer

WORDS = dict(vocab_size=len(SPECIALS) + N_WORDS, bos_token_id=2, eos_token_id=3, pad_token_id=1,
             tie_word_embeddings=False)


def _config(name: str, **fields):
    cls = getattr(transformers, name, None)
    if cls is None:  # both exist from transformers 5.9.0 (the floor) on; a later removal would skip, saying so
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    return cls(**WORDS, **fields)


def jamba_config():
    return _config("JambaConfig", hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1, num_experts=1, expert_layer_period=1,
                   expert_layer_offset=0, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4)


def falcon_h1_config():
    return _config("FalconH1Config", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8,
                   mamba_d_state=4, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=8, max_position_embeddings=64)


@pytest.fixture(scope="module", autouse=True)
def _local_mamba_kernels():
    """transformers 5.9.0 with `kernels` installed fetches causal-conv1d from the Hub when it builds a Mamba layer and
    does not catch offline mode (HF_HUB_OFFLINE=1; later versions fall back): build the hybrids on the local path."""
    from transformers.integrations import hub_kernels

    patch = pytest.MonkeyPatch()
    if hasattr(hub_kernels, "_kernels_available"):
        patch.setattr(hub_kernels, "_kernels_available", False)
    yield
    patch.undo()


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    """{"jamba": (folder, hf model), "falcon_h1": (folder, hf model)}, random, word-level tokenizer."""
    root = tmp_path_factory.mktemp("hybrids")
    out = {}
    for key, build in (("jamba", jamba_config), ("falcon_h1", falcon_h1_config)):
        hf = save_random_checkpoint(build(), root / key, word_tokenizer())
        out[key] = (root / key, hf)
    return out


def _mamba_layers(hf) -> list[int]:
    """The layers whose Hugging Face decoder layer holds a `mamba` module (read off the model, not the config)."""
    return [i for i, layer in enumerate(hf.model.layers) if isinstance(getattr(layer, "mamba", None), torch.nn.Module)]


TAIL = ("; headscope analyses attention-only transformers (heads, q/k/v sites, patterns, KV cache), and these mixers "
        "write to the residual stream outside every site it reads, so it does not load this model.")


def test_jamba_is_refused_in_one_line_by_the_cli_and_writes_nothing(hybrid_dirs, tmp_path, capsys):
    """Review 18c A3: Jamba ran as "4 layers x 4 heads", six analyses failed with SiteErrors and position with a
    traceback (exit 1). Now: exit 2, the one line naming its Mamba layers (0 and 2: the HF layers with a mamba
    module), and no output folder."""
    from headscope.cli import main

    folder, hf = hybrid_dirs["jamba"]
    assert _mamba_layers(hf) == [0, 2]
    out = tmp_path / "out"
    assert main(["report", "-q", "--quick", "--device", "cpu", "--model", str(folder), "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"headscope: error: {folder} (JambaForCausalLM) is not an attention-only transformer: layers 0, 2 "
                     f"of 4 run a Mamba (state-space) mixer (config layers_block_type: 'mamba')" + TAIL], lines
    assert list(tmp_path.iterdir()) == []  # no OUT, lock or staging folder


def test_falcon_h1_is_refused_by_load_model_naming_its_mamba_branch(hybrid_dirs, tmp_path, capsys):
    """Review 18c A4: FalconH1 (attention and Mamba2 side by side in each layer) ran silently as attention-only,
    its Mamba branch an unnamed remainder. load_model and the CLI refuse it, naming both layers."""
    from headscope.cli import main
    from headscope.models import load_model

    folder, hf = hybrid_dirs["falcon_h1"]
    assert _mamba_layers(hf) == [0, 1]
    expected = (f"{folder} (FalconH1ForCausalLM) is not an attention-only transformer: all 2 layers run a Mamba "
                f"(state-space) mixer beside or in place of attention (config layers_block_type: 'hybrid')" + TAIL)
    with pytest.raises(UnsupportedModelError) as err:
        load_model(str(folder), device="cpu")
    assert str(err.value) == expected
    out = tmp_path / "out"
    assert main(["heads", "-q", "--quick", "--device", "cpu", "--model", str(folder), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"headscope: error: {expected}"]
    assert list(tmp_path.iterdir()) == []


def test_the_module_tree_names_ssm_layers_a_config_does_not(hybrid_dirs):
    """A config that names nothing (a remote-code model, a model_type transformers does not know): the loaded
    module tree's state-space parameters (A_log, dt_proj, conv1d, dt_bias) name the layers, the same ones that hold
    a mamba module."""
    for key, (_, hf) in hybrid_dirs.items():
        layers = _mamba_layers(hf)
        with pytest.raises(UnsupportedModelError, match=r"^m \(") as err:
            state_space.refuse_state_space({"architectures": [type(hf).__name__]}, "m", model=hf)
        words = "layers 0, 2 of 4 hold" if key == "jamba" else "all 2 layers hold"
        assert f"is not an attention-only transformer: {words} a state-space mixer (its parameters " in str(err.value)
        assert layers == ([0, 2] if key == "jamba" else [0, 1])


@pytest.mark.parametrize("name", ["LlamaConfig", "GPT2Config", "OlmoeConfig", "Gemma3TextConfig", "Qwen3Config",
                                  "GPTNeoConfig", "BertConfig", "MixtralConfig", "DeepseekV3Config"])
def test_attention_only_configs_pass(name):
    """No false refusals: the attention-only families headscope loads (sliding/full layer_types included)."""
    assert state_space.config_reason(getattr(transformers, name)()) is None


def test_other_hybrids_are_named_from_their_configs():
    """Pure state-space models and the other hybrids, from their default configs: the layers their configs mark."""
    for name in ("MambaConfig", "Mamba2Config", "RwkvConfig", "Zamba2Config", "BambaConfig", "NemotronHConfig",
                 "GraniteMoeHybridConfig", "Qwen3NextConfig", "RecurrentGemmaConfig"):
        cls = getattr(transformers, name, None)
        if cls is not None:
            assert state_space.config_reason(cls()) is not None, name
    qwen = transformers.Qwen3NextConfig(num_hidden_layers=4)
    linear = [i for i, kind in enumerate(qwen.layer_types) if kind == "linear_attention"]
    assert state_space.config_reason(qwen).startswith(f"layers {linear[0]}-{linear[-1]} of 4 run a non-attention mixer")
