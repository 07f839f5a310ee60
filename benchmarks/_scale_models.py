"""What benchmarks/scale.py measures on: random-weight checkpoints of real shapes, a copy task of
any length and size, and position settings sized by prompt length. Nothing here is shipped.

Checkpoints (built once into a cache folder, random weights, seed 0):
- "zoo": the shipped zoo/synth-llama (4 layers x 8 heads, d_model 128, its word-level tokenizer);
- "gpt2-small": GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=4096) ("gpt2-small-2l": 2 layers,
  the quick sweep's model);
- "llama-1b-width": LlamaConfig(hidden 2048, 32 heads, 8 KV heads, intermediate 8192, RoPE, 4 layers;
  "llama-1b-width-2l": 2 layers).
The two random shapes share one byte-level BPE (GPT-2's scheme, no unknown token) trained here on the
shipped English sentences plus seeded pseudo-words; the model's vocabulary is the tokenizer's, so
the unembedding is far smaller than GPT-2's 50,257 or Llama 3's 128,256 rows (vocab="real" pads the
embedding matrices to those sizes; tokens still come from the small tokenizer).
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

BPE_VOCAB = 4096  # the trainer's target; a small corpus may stop with fewer merges
REAL_VOCAB = {"gpt2-small-2l": 50257, "gpt2-small": 50257, "llama-1b-width-2l": 128256, "llama-1b-width": 128256}
MODELS = ("zoo", *REAL_VOCAB)


def english_corpus(n_words: int = 4000, seed: int = 0) -> list[str]:
    """The shipped sentences plus lines of seeded pseudo-words from English syllables (as tests_support)."""
    from headscope.analyses.core.tasks import shipped_sentences

    rng = random.Random(seed)
    onsets, vowels, codas = "b c d f g h l m n p r s t v w".split(), "a e i o u ea ou".split(), ["n", "r", "s", "t", "nd", ""]
    words = ["".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
             for _ in range(n_words)]
    hexes = ["".join(rng.choice("0123456789abcdef") for _ in range(8)) for _ in range(n_words // 10)]
    return shipped_sentences() + [" ".join(words[i:i + 10]) for i in range(0, n_words, 10)] + hexes


def byte_level_bpe(vocab_size: int = BPE_VOCAB):
    """GPT-2-style byte-level BPE, <|endoftext|> its BOS, EOS and pad token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(english_corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eot = "<|endoftext|>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot, pad_token=eot)


def hf_model(name: str, vocab_size: int):
    """A random-weight Hugging Face model of the named shape."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if name.startswith("gpt2-small"):
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_layer=2 if name.endswith("-2l") else 12, n_head=12,
                                          n_embd=768, n_positions=4096, bos_token_id=0, eos_token_id=0))
    if name.startswith("llama-1b-width"):
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab_size, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
            num_key_value_heads=8, num_hidden_layers=2 if name.endswith("-2l") else 4, max_position_embeddings=4096,
            rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0))
    raise ValueError(f"unknown scale model {name!r}; choose from {MODELS}")


def checkpoint(name: str, cache: Path, vocab: str = "tokenizer") -> str:
    """A spec hs.load_model takes: "zoo/synth-llama", or the folder of the named random checkpoint
    (built on first use under `cache`)."""
    if name == "zoo":
        return "zoo/synth-llama"
    out = cache / f"{name}-{vocab}-vocab"
    if (out / "config.json").exists():
        return str(out)
    tok = byte_level_bpe()
    size = REAL_VOCAB[name] if vocab == "real" else len(tok)
    hf_model(name, size).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def copy_task(model, length: int, n_examples: int, seed: int = 0):
    """An induction-style Task of `n_examples` prompts of exactly `length` tokens, for any tokenizer:
    <bos> x_1..x_h x_1..x_s, answer x_{s+1} (h = length // 2, s = length - 1 - h), x random tokens.
    x_{s+1} alternates between two answer tokens A and B (two balanced classes, so probes can
    cross-validate); the corrupted prompt swaps it for the other, whose answer is wrong_answers.
    Spans: "source" (x_{s+1} in the first half), "first", "repeat"."""
    from headscope.analyses.core.tasks import Task

    if length < 4:
        raise ValueError(f"length must be >= 4, got {length}")
    tok = model.tokenizer
    specials = set(tok.all_special_ids)
    ids = [i for i in range(len(tok)) if i not in specials]
    pool, rest = torch.tensor(ids[:2]), torch.tensor(ids[2:])
    bos = tok.bos_token_id if tok.bos_token_id is not None else ids[2]
    h = length // 2
    s = length - 1 - h  # tokens of the repeat; x_{s+1} (index s) is the answer
    gen = torch.Generator().manual_seed(seed)
    x = rest[torch.randint(len(rest), (n_examples, h), generator=gen)]  # [batch, h]
    answers = pool[torch.arange(n_examples) % 2]  # [batch]
    wrong = pool[(torch.arange(n_examples) + 1) % 2]  # [batch]
    x[:, s] = answers
    head = torch.full((n_examples, 1), bos, dtype=torch.int64)  # [batch, 1]
    tokens = torch.cat([head, x, x[:, :s]], dim=1)  # [batch, length]
    corrupted = tokens.clone()
    corrupted[:, 1 + s] = wrong
    span = lambda a, b: torch.tensor([[a, b]] * n_examples, dtype=torch.int64)  # noqa: E731  # [batch, 2]
    return Task(name="copy", tokens=tokens, answers=answers, corrupted_tokens=corrupted, wrong_answers=wrong,
                spans={"source": span(1 + s, 2 + s), "first": span(1, 1 + h), "repeat": span(1 + h, length)},
                metric="logit_diff")


def position_config(model, length: int, n_examples: int, quick: bool = True):
    """A PositionConfig whose prompts are about `length` tokens: the zoo kv sweep on zoo-vocabulary
    models ((length - 2) // 3 pairs, at most the zoo's 64 keys), else Liu et al.'s UUID kv sweep with
    as many pairs as fit `length` (tokens per pair measured on this tokenizer). -> (config, note, the
    longest prompt in tokens)"""
    from headscope.analyses.position import prompts
    from headscope.analyses.position.analysis import PositionConfig, build_sweeps, has_zoo_vocab
    from headscope.models.zoo import vocab

    common = dict(quick=quick, n_boot=200 if quick else 1000, n_examples=n_examples)
    if has_zoo_vocab(model.tokenizer):
        kind, n = "zoo_kv", max(2, min(vocab.N_KEYS, (length - 2) // 3))
    else:
        need = lambda n: prompts.sweep_tokens(prompts.kv_sweeps(model.tokenizer, n_pairs=n, n_examples=1))  # noqa: E731
        lo, hi = need(2), need(12)
        kind, n = "json_kv", max(2, 2 + int((length - lo) / ((hi - lo) / 10)))
    config = PositionConfig(sweep=kind, n_items=n, **common)
    longest = max(s.prompt_len for s in build_sweeps(model, config))
    return config, f"{kind}, {n} pairs, prompts up to {longest} tokens", longest
