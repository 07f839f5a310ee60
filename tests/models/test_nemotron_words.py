"""Review 18e C1: Nemotron's LayerNorm1P (weight applied as 1 + w) and its squared-ReLU MLP without a gate are named in
print(model), the report header and the mlp section, from the HF config and modules of a random tiny Nemotron."""
import pytest
import torch

import headscope as hs
from headscope.models.config_facts import header_words
from headscope.reports.plots_mlp import finding as mlp_finding
from tests_support import save_random_checkpoint, word_tokenizer


@pytest.fixture(scope="module")
def tiny_nemotron(tmp_path_factory):
    from transformers import NemotronConfig

    config = NemotronConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_act="relu2",
                            partial_rotary_factor=0.5, max_position_embeddings=64, bos_token_id=2, eos_token_id=3,
                            pad_token_id=1, tie_word_embeddings=False)

    def init(model):  # norm weights and biases away from 0, so 1 + w and w differ
        for m in model.modules():
            if type(m).__name__ == "NemotronLayerNorm1P":
                m.weight.normal_(0.2, 0.3)
                m.bias.normal_(0.0, 0.3)

    folder = tmp_path_factory.mktemp("nemotron")
    hf = save_random_checkpoint(config, folder, word_tokenizer(), init=init)
    return hf, hs.load_model(folder, device="cpu")


def test_nemotron_names_its_layernorm1p_and_squared_relu_mlp(tiny_nemotron):
    hf, model = tiny_nemotron
    c = hf.config
    norm, mlp = hf.model.layers[0].input_layernorm, hf.model.layers[0].mlp
    x = torch.randn(3, c.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # by hand: the norm applies (1 + w), the MLP is down(relu(up x)^2) with no gate
        by_hand = torch.nn.functional.layer_norm(x, (c.hidden_size,), eps=norm.eps) * (1 + norm.weight) + norm.bias
        assert torch.allclose(norm(x), by_hand, atol=1e-5)
        assert torch.allclose(mlp(x), mlp.down_proj(torch.relu(mlp.up_proj(x)) ** 2), atol=1e-5)
        assert not hasattr(mlp, "gate_proj")
    text = repr(model)
    assert f"d_mlp={c.intermediate_size} (relu2 = relu(x)^2, no gate)" in text, text
    assert "norms=LayerNorm1P (weight applied as 1 + w)" in text, text
    facts = vars(model.facts)  # what the manifest's "model" holds (reports/report.py)
    assert facts["mlp_act"] == c.hidden_act and facts["norm_one_plus"] is True and facts["gated_mlp"] is False
    assert header_words(facts)[-2:] == ["relu2 MLP (relu(x)^2) without a gate",
                                        "norms LayerNorm1P (weight applied as 1 + w)"]
    said = ("This MLP's activation is relu2 without a gate: each neuron's coefficient is m_i = relu(k_i . x)^2, so its "
            "triggers are ranked and its updates m_i v_i weighted by that square, not by Geva et al.'s k_i . x (a "
            "pre-activation of 3 gives 9).")
    assert said in mlp_finding({"mlp_act": facts["mlp_act"], "gated_mlp": False})
    assert said not in mlp_finding({"mlp_act": "silu", "gated_mlp": True})


def test_a_gated_mlp_names_its_activation_and_gate(tiny_models, tiny_dirs):
    """A Llama's MLP: its config's hidden_act and a gate, in print(model); no LayerNorm1P words, no header words."""
    import json

    act = json.loads((tiny_dirs["llama"] / "config.json").read_text())["hidden_act"]
    model = tiny_models["llama"]
    assert f"d_mlp={model.facts.d_mlp} ({act}, gated)" in repr(model) and "LayerNorm1P" not in repr(model)
    assert not any("MLP" in w or "norms" in w for w in header_words(vars(model.facts)))
