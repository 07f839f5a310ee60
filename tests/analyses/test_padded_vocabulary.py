"""A model whose embedding has more rows than its tokenizer has tokens (Pythia: 50,304 rows for
50,277 tokens; many checkpoints pad to a multiple of 64): token labels of the extra ids read
"<id N>" instead of crashing the analyses that name promoted tokens (found on a GPT-2-small shape
with a small tokenizer: the mlp analysis stopped on `None` from convert_ids_to_tokens)."""
from __future__ import annotations

import torch

import headscope as hs


def test_ids_past_the_tokenizer_get_labels_and_mlp_runs(arch_dirs, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = arch_dirs["gpt2"]
    tok = AutoTokenizer.from_pretrained(source)
    config = AutoConfig.from_pretrained(source)
    config.vocab_size = len(tok) + 64
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = hs.load_model(tmp_path, device="cpu")
    assert model.facts.d_vocab == len(tok) + 64
    last = len(tok) + 63
    assert model.to_str_tokens(torch.tensor([0, last])) == [tok.convert_ids_to_tokens(0), f"<id {last}>"]
    result = hs.run_analysis("mlp", model, None, hs.MLPConfig.preset(quick=True, n_examples=4))
    labels = " ".join(result.df["promoted"].astype(str)) if "promoted" in result.df else ""
    assert "None" not in labels
