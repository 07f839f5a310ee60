"""Builders for the tests: tiny random Hugging Face models with a word-level tokenizer."""
from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<unk>", "<pad>", "<bos>", "<eos>"]
N_WORDS = 60
N_CTX = 64


def word_tokenizer():
    """A `tokenizers` WordLevel tokenizer wrapped as a PreTrainedTokenizerFast: w0..w59 plus specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + [f"w{i}" for i in range(N_WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )


def build_tiny_model(family: str, out: Path, seed: int = 0, **config) -> Path:
    """Save a random model of the family to `out`: "gpt2", "neox", or the Llama-style "llama"
    (GQA), "qwen2" (biases on q, k and v), "mistral" and "qwen3" (q/k norms); 2 layers unless `config`, which
    overrides fields of the Hugging Face config, says otherwise."""
    import transformers

    torch.manual_seed(seed)
    special = dict(vocab_size=len(SPECIALS) + N_WORDS, bos_token_id=2, eos_token_id=3, pad_token_id=1)
    if family == "gpt2":
        fields = dict(n_embd=64, n_layer=2, n_head=4, n_positions=N_CTX)
        make = transformers.GPT2LMHeadModel, transformers.GPT2Config
    elif family == "neox":
        fields = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=N_CTX)
        make = transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig
    elif family in ("llama", "qwen2", "mistral", "qwen3"):
        fields = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=N_CTX, **({"head_dim": 16} if family == "qwen3" else {}))
        name = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "qwen3": "Qwen3"}[family]
        make = getattr(transformers, f"{name}ForCausalLM"), getattr(transformers, f"{name}Config")
    else:
        raise ValueError(family)
    model = make[0](make[1](**{**special, **fields, **config}))
    with torch.no_grad():  # random but not tiny weights, so that heads differ visibly
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    word_tokenizer().save_pretrained(out)
    return Path(out)


def hf_model(path: Path):
    """The same weights loaded by plain Hugging Face (eager attention), the independent reference."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def random_tokens(batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    """[batch, pos] ids: <bos> then random words."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(len(SPECIALS), len(SPECIALS) + N_WORDS, (batch, pos - 1), generator=g)
    return torch.cat([torch.full((batch, 1), 2), words], dim=1)


def zero_head(head: int, from_pos: int = 0):
    """A TransformerLens hook_z hook zeroing `head` at positions from_pos.. (on a copy)."""
    def hook(z: torch.Tensor, hook) -> torch.Tensor:
        z = z.clone()
        z[:, from_pos:, head] = 0.0
        return z
    return hook
