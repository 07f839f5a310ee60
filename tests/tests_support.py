"""Builders for the tests: tiny random Hugging Face models with a word-level tokenizer, and the
architecture matrix (#19): random-weight checkpoints from scaled-down real configs of GPT-2,
GPT-NeoX, Llama 3, Qwen2, Mistral, Gemma 2, Phi-3 and BERT, each saved with a real-style
tokenizer trained here on English (byte-level BPE, byte-fallback BPE or WordPiece)."""
from __future__ import annotations

import json
import random
import string
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


def build_tiny_model(family: str, out: Path, seed: int = 0, *, tokenizer: str | None = None, **config) -> Path:
    """Save a random model of the family to `out`: "gpt2", "neox", "gptj", "opt", "bloom" (ALiBi), or the Llama-style "llama"
    (GQA), "qwen2" (biases on q, k and v), "mistral" and "qwen3" (q/k norms), "deepseek_v3" (multi-head latent
    attention, dense MLPs unless first_k_dense_replace says otherwise; the MoE routers' e_score_correction_bias
    drawn N(0, 0.1^2) so the choice's bias counts); 2 layers unless `config`, which overrides fields of the Hugging
    Face config, says otherwise; "cohere" (parallel block, one norm); "falcon" (multi-query, parallel block);
    "granite" (Llama-style, embedding x12, residual writes x0.22, attention scores
    x1/128, logits /8); "gpt_neo" (layer 0 global, layer 1 local with window_size 4,
    unscaled scores). Matrices and stacked experts' weights are drawn N(0, 0.2^2).

    `tokenizer`: "word" (w0..w59, ids 4..63) or "qwen" (Qwen2's byte-level BPE, trained here).
    Default "word", except for qwen2: transformers always loads a Qwen2 checkpoint's tokenizer as
    Qwen2Tokenizer (Qwen's byte-level pipeline over tokenizer.json's vocabulary and merges), which
    garbles a word-level vocabulary whatever tokenizer_class says, so qwen2 gets the BPE it expects."""
    import transformers

    kind = tokenizer or ("qwen" if family == "qwen2" else "word")
    if kind == "word":
        tok = word_tokenizer()
        special = dict(vocab_size=len(SPECIALS) + N_WORDS, bos_token_id=2, eos_token_id=3, pad_token_id=1)
    elif kind == "qwen":
        tok = byte_level_bpe(qwen=True)
        eot = tok.convert_tokens_to_ids("<|endoftext|>")
        special = dict(vocab_size=len(tok), bos_token_id=eot, eos_token_id=eot, pad_token_id=eot)
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    if family == "gpt2":
        fields = dict(n_embd=64, n_layer=2, n_head=4, n_positions=N_CTX)
        make = transformers.GPT2LMHeadModel, transformers.GPT2Config
    elif family == "neox":
        fields = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=N_CTX)
        make = transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig
    elif family == "gptj":  # parallel attention and MLP, partial interleaved rotary, no attention biases
        fields = dict(n_embd=64, n_inner=128, n_layer=2, n_head=4, rotary_dim=8, n_positions=N_CTX)
        make = transformers.GPTJForCausalLM, transformers.GPTJConfig
    elif family == "bloom":  # ALiBi positions (no position table, no maximum length in its config), fused qkv
        fields = dict(hidden_size=64, n_layer=2, n_head=4)
        make = transformers.BloomForCausalLM, transformers.BloomConfig
    elif family in ("llama", "qwen2", "mistral", "qwen3"):
        fields = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=N_CTX, **({"head_dim": 16} if family == "qwen3" else {}))
        name = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "qwen3": "Qwen3"}[family]
        make = getattr(transformers, f"{name}ForCausalLM"), getattr(transformers, f"{name}Config")
    elif family == "granite":  # Llama-style with muP scalings; the multipliers far from 1 unless `config` says
        fields = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=N_CTX, embedding_multiplier=12.0,
                      residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=8.0)
        make = transformers.GraniteForCausalLM, transformers.GraniteConfig
    elif family == "gpt_neo":  # layer 0 global, layer 1 local (window 4), no 1/sqrt(d_head) on the scores
        fields = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, window_size=4,
                      attention_types=[[["global", "local"], 1]], max_position_embeddings=N_CTX)
        make = transformers.GPTNeoForCausalLM, transformers.GPTNeoConfig
    elif family == "opt":  # TransformerLens hands OPT's attention to Hugging Face (edits to scores/patterns discarded)
        fields = dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=N_CTX, word_embed_proj_dim=64)
        make = transformers.OPTForCausalLM, transformers.OPTConfig
    elif family == "deepseek_v3":  # multi-head latent attention (MLA): q/k heads 12 + 8 rotary, v heads 16
        # (first_k_dense_replace=1 makes layer 1 a mixture of 4 routed experts of 16, top-2, + a shared expert of 16)
        fields = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=16, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32,
                      qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4,
                      num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
                      first_k_dense_replace=2, max_position_embeddings=N_CTX, tie_word_embeddings=False)
        make = transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config
    elif family == "falcon":  # Falcon-7B's layout: multi-query (1 KV head), parallel attention and MLP on one
        # LayerNorm, rotary, no biases; new_decoder_architecture=True with num_kv_heads (Falcon-40B: GQA) by `config`
        fields = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=False,
                      multi_query=True, parallel_attn=True, alibi=False, bias=False, max_position_embeddings=N_CTX)
        make = transformers.FalconForCausalLM, transformers.FalconConfig
    elif family == "cohere":  # parallel attention and MLP reading one LayerNorm (no bias), GQA, logits x1/16
        fields = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=N_CTX)
        make = transformers.CohereForCausalLM, transformers.CohereConfig
    else:
        raise ValueError(family)
    base = len(SPECIALS) + N_WORDS
    if special["vocab_size"] > base:
        # Construction draws from the RNG as many numbers as the model has; building the word-level
        # model first and the real one on a forked RNG, then drawing rows of ids >= 64 last, gives
        # weights on ids < 64 that do not depend on the tokenizer (tests keep their numbers).
        make[0](make[1](**{**special, "vocab_size": base, **fields, **config}))
        with torch.random.fork_rng():
            model = make[0](make[1](**{**special, **fields, **config}))
    else:
        model = make[0](make[1](**{**special, **fields, **config}))
    with torch.no_grad():  # random but not tiny weights, so that heads differ visibly
        later = []
        for p in model.parameters():
            if p.ndim == 2 and p.shape[0] == special["vocab_size"] > base:
                p[:base].normal_(0.0, 0.2)
                later.append(p)
            elif p.ndim >= 2:
                p.normal_(0.0, 0.2)
        for p in later:
            p[base:].normal_(0.0, 0.2)
        for name, b in model.named_buffers():  # DeepSeek-V3's routers: the bias added for the choice only
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)
    return Path(out)


def pair_task(n: int = 3, n_pos: int = 8):
    """A Task of n random word-id prompts whose corrupted copy differs at position 2, with random answers and wrong
    answers (seeded): edge and patching tests on tiny models."""
    from headscope.analyses.core.tasks import Task

    g = torch.Generator().manual_seed(0)
    tok = torch.randint(10, 60, (n, n_pos), generator=g)
    cor = tok.clone()
    cor[:, 2] = torch.randint(10, 60, (n,), generator=g)
    ans, wrong = torch.randint(10, 60, (n,), generator=g), torch.randint(10, 60, (n,), generator=g)
    return Task(name="pairs", tokens=tok, corrupted_tokens=cor, answers=ans, wrong_answers=wrong)


def grad_and_ablated(metric) -> tuple[float, float]:
    """(d metric / d eps at 0, metric at eps = -1): an edge's EAP score and its exact ablation, for a hand metric(eps)
    that adds eps times the sender's write to the receiver's input."""
    eps = torch.zeros((), requires_grad=True)
    (grad,) = torch.autograd.grad(metric(eps), eps)
    with torch.no_grad():
        ablated = metric(torch.tensor(-1.0))
    return float(grad), float(ablated)


def hf_model(path: Path):
    """The same weights loaded by plain Hugging Face (eager attention), the independent reference."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def random_tokens(batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    """[batch, pos] ids: <bos> then random words."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(len(SPECIALS), len(SPECIALS) + N_WORDS, (batch, pos - 1), generator=g)
    return torch.cat([torch.full((batch, 1), 2), words], dim=1)


def left_padded_tokens(lengths, seed: int = 0, pad_id: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [rows, max(lengths)], mask): row r has lengths[r] real tokens (random_tokens), left-padded
    with pad_id, and its attention mask (1 on real tokens)."""
    tokens = random_tokens(len(lengths), max(lengths), seed=seed)
    mask = torch.zeros_like(tokens)
    for r, n in enumerate(lengths):
        mask[r, -n:] = 1
        tokens[r, :-n] = pad_id
    return tokens, mask


def zero_head(head: int, from_pos: int = 0):
    """A TransformerLens hook_z hook zeroing `head` at positions from_pos.. (on a copy)."""
    def hook(z: torch.Tensor, hook) -> torch.Tensor:
        z = z.clone()
        z[:, from_pos:, head] = 0.0
        return z
    return hook


# ---- the architecture matrix (#19) -----------------------------------------------------------------
ARCH_VOCAB = 500
ARCH_CTX = 256
# Qwen2's pre-tokenizer split (transformers' Qwen2Tokenizer rebuilds exactly this pipeline).
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def english_corpus(n_words: int = 400, seed: int = 0) -> list[str]:
    """What the matrix's tokenizers learn from: the shipped English sentences plus lines of seeded
    pseudo-words built from English syllables (so merges go beyond the sentences' own words)."""
    from headscope.analyses.core.tasks import shipped_sentences

    rng = random.Random(seed)
    onsets, vowels, codas = "b c d f g h l m n p r s t v w".split(), "a e i o u ea ou".split(), ["n", "r", "s", "t", "nd", ""]
    words = ["".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
             for _ in range(n_words)]
    return shipped_sentences() + [" ".join(words[i:i + 10]) for i in range(0, n_words, 10)]


def byte_level_bpe(vocab_size: int = ARCH_VOCAB, *, qwen: bool = False):
    """GPT-2-style byte-level BPE with no unknown token, <|endoftext|> its one special token (BOS and
    EOS); qwen=True: Qwen2's variant (NFC, Qwen's split regex, then byte-level; no BOS, <|endoftext|>
    as EOS and pad)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if qwen:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(english_corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eot = "<|endoftext|>"
    if qwen:  # as Qwen2's tokenizer_config.json: no BOS token, <|endoftext|> ends and pads
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eot, pad_token=eot)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot)


def byte_fallback_bpe(vocab_size: int = ARCH_VOCAB):
    """Llama-style sentencepiece BPE: Metaspace ("▁"), <0x00>..<0xFF> byte fallback for unseen
    characters, <unk> <s> </s>, and <s> prepended by the post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(english_corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def wordpiece(vocab_size: int = ARCH_VOCAB, corpus: list[str] | None = None):
    """BERT-style WordPiece: lower-casing normalizer, [CLS] text [SEP], [UNK] for what it cannot split.
    corpus: what it learns from (None: english_corpus plus every ASCII letter, digit and punctuation
    mark, like BERT's vocabulary; given: those lines only, so other characters become [UNK])."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    # Like BERT's vocabulary, every ASCII letter and digit, alone and as a "##" continuation, and punctuation.
    ascii_lines = [" ".join(c + c for c in string.ascii_lowercase + string.digits), " ".join(string.punctuation)]
    lines = english_corpus() + ascii_lines if corpus is None else corpus
    tok.train_from_iterator(lines, trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def save_tokenizer(tokenizer, out: Path) -> None:
    """save_pretrained, with tokenizer_class PreTrainedTokenizerFast in tokenizer_config.json so
    transformers loads tokenizer.json as it is rather than a model-specific class that rebuilds it
    (Qwen2 and Phi-3 checkpoints get their registered class whatever this says)."""
    tokenizer.save_pretrained(out)
    path = Path(out) / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))


def save_random_checkpoint(config, folder: Path, tokenizer=None, dtype: torch.dtype | None = None, *, seed: int = 0,
                           model_class=None, init=None, plain: bool = False):
    """The one "config -> random model -> safetensors -> tokenizer" builder: torch.manual_seed(seed), then
    `model_class(config)` (default: the causal LM transformers maps the config's type to), `init(model)` under no_grad
    where given (weights away from their init), cast to `dtype` where given, saved to `folder` (safetensors) with
    `tokenizer`: a tokenizer, written by save_tokenizer (plain: by its own save_pretrained, transformers' own
    tokenizer_class), or a model folder whose tokenizer.json and tokenizer_config.json are copied as they are.
    Returns the Hugging Face model."""
    import shutil

    import transformers

    torch.manual_seed(seed)
    cls = model_class or transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    model = cls(config)
    if init is not None:
        with torch.no_grad():
            init(model)
    if dtype is not None:
        model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True)
    if isinstance(tokenizer, (str, Path)):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tokenizer) / name, Path(folder) / name)
    elif plain:
        tokenizer.save_pretrained(folder)
    elif tokenizer is not None:
        save_tokenizer(tokenizer, folder)
    return model


def normal_matrices(std: float = 0.2, ndim: int = 2):
    """An init for save_random_checkpoint: every parameter of `ndim` or more dimensions drawn N(0, std^2), in order."""
    def init(model) -> None:
        for p in model.parameters():
            if p.ndim >= ndim:
                p.normal_(0.0, std)
    return init


_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=ARCH_CTX)
# arch -> (tokenizer builder, HF model class, config class, config fields): each architecture's own
# switches as in its released checkpoints (GQA, q/k/v biases, sliding windows 8 tokens wide so the
# test prompts cross them, soft-capping, alternating local/global layers, fused projections, a
# quarter-rotary parallel block), at 2 layers, d_model 64, 4 heads, n_ctx 256, ~500 tokens.
ARCHITECTURES = {
    "gpt2": (byte_level_bpe, "GPT2LMHeadModel", "GPT2Config",
             dict(n_embd=64, n_layer=2, n_head=4, n_positions=ARCH_CTX, activation_function="gelu_new")),
    "neox": (byte_level_bpe, "GPTNeoXForCausalLM", "GPTNeoXConfig",  # Pythia
             dict(_SMALL, intermediate_size=256, rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False)),
    "llama3": (byte_fallback_bpe, "LlamaForCausalLM", "LlamaConfig",
               dict(_SMALL, num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=False)),
    "qwen2": (lambda: byte_level_bpe(qwen=True), "Qwen2ForCausalLM", "Qwen2Config",
              dict(_SMALL, num_key_value_heads=2, rope_theta=1000000.0, tie_word_embeddings=True)),
    "mistral": (byte_fallback_bpe, "MistralForCausalLM", "MistralConfig",
                dict(_SMALL, num_key_value_heads=2, sliding_window=8, tie_word_embeddings=False)),
    "gemma2": (byte_fallback_bpe, "Gemma2ForCausalLM", "Gemma2Config",
               dict(_SMALL, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
                    layer_types=["sliding_attention", "full_attention"])),
    "phi3": (byte_fallback_bpe, "Phi3ForCausalLM", "Phi3Config",  # fused qkv_proj and gate_up_proj, no GQA
             dict(_SMALL, num_key_value_heads=4, sliding_window=None, tie_word_embeddings=False)),
    "bert": (wordpiece, "BertForMaskedLM", "BertConfig",
             dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=ARCH_CTX)),
}


# Architectures whose blocks differ in shape from the matrix's (#31), kept out of ARCHITECTURES so
# the matrix-wide tests do not grow: post-norm (OLMo 2), q/k norms (Qwen3, OLMo 2), pre- and
# post-norms with local and global layers (Gemma 3), mixtures of experts (Mixtral, Qwen2-MoE; 4
# experts, 2 per token; Qwen2-MoE's shared expert). The word-level tokenizer (ids 4..63), as the
# tiny models: these test execution, not tokenization.
MORE_ARCHITECTURES = {
    "olmo2": (word_tokenizer, "Olmo2ForCausalLM", "Olmo2Config", dict(_SMALL, num_key_value_heads=2)),
    "qwen3": (word_tokenizer, "Qwen3ForCausalLM", "Qwen3Config", dict(_SMALL, num_key_value_heads=2, head_dim=16)),
    "gemma3": (word_tokenizer, "Gemma3ForCausalLM", "Gemma3TextConfig",
               dict(_SMALL, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"])),
    "mixtral": (word_tokenizer, "MixtralForCausalLM", "MixtralConfig",
                dict(_SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2moe": (word_tokenizer, "Qwen2MoeForCausalLM", "Qwen2MoeConfig",
                 dict(_SMALL, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64)),
    # review 20: hybrid sliding/global attention whose global layer applies no rotary (NoPE): Cohere2 (parallel
    # block, logit_scale) and Exaone4 (post-norm block, per-head q/k RMSNorm); layer 0 sliding (4 tokens), 1 global
    "cohere2": (word_tokenizer, "Cohere2ForCausalLM", "Cohere2Config",
                dict(_SMALL, num_key_value_heads=2, sliding_window=4, logit_scale=0.5,
                     layer_types=["sliding_attention", "full_attention"])),
    "exaone4": (word_tokenizer, "Exaone4ForCausalLM", "Exaone4Config",
                dict(_SMALL, num_key_value_heads=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
}


def build_architecture(arch: str, out: Path, seed: int = 0) -> Path:
    """Save a random-weight `arch` (a key of ARCHITECTURES or MORE_ARCHITECTURES) with its
    tokenizer to `out`. Matrices (and stacked experts' matrices) and biases are drawn
    N(0, 0.2^2) and N(0, 0.1^2) so heads differ and biases count; norms keep their initial weights."""
    import transformers

    make_tokenizer, model_class, config_class, fields = {**ARCHITECTURES, **MORE_ARCHITECTURES}[arch]
    tok = make_tokenizer()
    ids = {name: tok.convert_tokens_to_ids(getattr(tok, name.replace("_id", ""))) for name in
           ("bos_token_id", "eos_token_id", "pad_token_id") if getattr(tok, name.replace("_id", ""), None) is not None}
    ids.setdefault("pad_token_id", ids.get("eos_token_id"))  # configs like Phi-3's name a pad id of their own

    def init(model) -> None:
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)

    save_random_checkpoint(getattr(transformers, config_class)(vocab_size=len(tok), **ids, **fields), out, tok, seed=seed,
                           model_class=getattr(transformers, model_class), init=init)
    return Path(out)


def hf_reference(path: Path):
    """Plain Hugging Face (eager attention) on the same files: the causal LM for decoders, the bare
    encoder (AutoModel: last hidden state) for BERT, whose MLM head headscope does not run."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    encoder = AutoConfig.from_pretrained(path).model_type == "bert"
    return (AutoModel if encoder else AutoModelForCausalLM).from_pretrained(path, attn_implementation="eager").eval()


MIXED_FIELDS = {"prompt": "text", "answer": "label", "corrupted_prompt": "bad", "wrong_answer": "other"}


def mixed_length_rows(model, n: int = 6, *, corrupt: bool = True) -> list[dict]:
    """User-style data of mixed token lengths, in the user's own column names (MIXED_FIELDS): prefixes
    of the shipped English sentences (one token length each), an answer and a wrong answer among
    words that are one token under `model`'s tokenizer (with a leading space), and (corrupt) a
    corrupted prompt with its second word replaced so that the pair has one length."""
    from headscope.analyses.core.tasks import shipped_sentences

    tok = model.tokenizer
    one = lambda w: len(tok(w, add_special_tokens=False)["input_ids"]) == 1  # noqa: E731
    length = lambda text: len(model.to_tokens(text, warn_unknown=False)[0])  # noqa: E731
    sentences = shipped_sentences()
    words = (" " + w.strip(".,").lower() for s in sentences for w in s.split())
    pool = list(dict.fromkeys(w for w in words if one(w)))
    if len(pool) < 2:  # e.g. a small sentencepiece-style vocabulary: tokens whose text round-trips alone
        special = set(tok.all_special_ids)
        texts = (tok.decode([i]) for i in range(min(len(tok), model.facts.d_vocab)) if i not in special)
        pool = [t for t in texts if t.strip() and tok(t, add_special_tokens=False)["input_ids"].__len__() == 1][:50]
    if len(pool) < 2:
        raise AssertionError(f"{model.name}: fewer than 2 single-token words for answers")
    rows, seen = [], set()
    for k, sentence in enumerate(sentences):
        words = sentence.rstrip(".").split()
        cut = 3 + (k * 5) % max(1, len(words) - 3)  # prefixes of varied word counts
        prompt = " ".join(words[:cut])
        if length(prompt) in seen or length(prompt) > model.facts.n_ctx:
            continue
        n_labels = min(3, len(pool))  # a few answers, each repeated (as class labels are): probes can use them
        row = {"text": prompt, "label": pool[k % n_labels], "other": pool[(k + 1) % n_labels]}
        if corrupt:
            swaps = (" ".join([words[0], rep, *words[2:cut]]) for rep in ("the", "a", "one", "this", "and", "of", "to"))
            row["bad"] = next((c for c in swaps if c != prompt and length(c) == length(prompt)), None)
            if row["bad"] is None:
                continue
        seen.add(length(prompt))
        rows.append(row)
        if len(rows) == n:
            break
    return rows


def hf_out_proj(hf, layer: int):
    """Plain Hugging Face's attention output projection of `layer` (its input: the heads' z, merged)."""
    kind = hf.config.model_type
    if kind == "gpt2":
        return hf.transformer.h[layer].attn.c_proj
    if kind == "gpt_neox":
        return hf.gpt_neox.layers[layer].attention.dense
    if kind == "bert":  # the bare encoder (hf_reference: AutoModel)
        return hf.encoder.layer[layer].attention.output.dense
    return hf.model.layers[layer].self_attn.o_proj


def hf_z_edit(hf, edit):
    """A context manager: edit(layer, z [batch, pos, head, d_head]) -> z, applied to plain HF's z before
    every attention output projection (the reference for head ablations and gates)."""
    import contextlib

    n_heads = hf.config.num_attention_heads

    def pre(layer):
        def hook(module, args):
            z = args[0].view(*args[0].shape[:2], n_heads, -1)
            return (edit(layer, z).flatten(2),) + tuple(args[1:])
        return hook

    @contextlib.contextmanager
    def edited():
        handles = [hf_out_proj(hf, layer).register_forward_pre_hook(pre(layer)) for layer in range(hf.config.num_hidden_layers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    return edited()


def hand_eviction_sweep():
    """Hand-built kv eviction results (eviction_sweep's columns): 4 prompts, contexts 4, 4, 12, 12, full-cache
    metric 10 each; window +7.5% at budget 1 and within 1% from 2, sink_window (4 sinks) +0.2% at 8 with an
    interval over 2 prompts far wider than 1% (not shown), heavy
    hitters never (tests/analyses/test_kv.py, tests/reports/test_findings.py)."""
    import pandas as pd

    ctx, rows = [4, 4, 12, 12], []
    by_policy = {  # budget -> per-example metric where the budget evicts (a kept-whole prompt equals its full value)
        "window": {1: [11.0, 11.0, 10.5, 10.5], 2: [10.05] * 4, 4: [0, 0, 9.95, 9.95], 8: [0, 0, 10.0, 10.0]},
        "sink_window": {1: [5.0] * 4, 2: [5.0] * 4, 4: [0, 0, 5.0, 5.0], 8: [0, 0, 10.05, 9.99]},
        "heavy_hitters": {1: [9.0] * 4, 2: [9.0] * 4, 4: [0, 0, 9.0, 9.0], 8: [0, 0, 9.0, 9.0]},
    }
    for e in range(4):
        rows.append({"policy": "full", "budget": 12, "example": e, "context": ctx[e], "metric": 10.0})
        for policy, budgets in by_policy.items():
            for b, values in {**budgets, 12: [10.0] * 4}.items():
                rows.append({"policy": policy, "budget": b, "example": e, "context": ctx[e],
                             "metric": values[e] if ctx[e] > b else 10.0})
    return pd.DataFrame(rows)


def hand_heavy_hitters_sweep():
    """Hand-built kv eviction results in review 5's shape: 4 prompts of context 12, full-cache logit
    difference 10 and every answer correct; heavy hitters -1.2%, -2.7%, -4.6%, -1.9% at budgets 1, 2, 4, 8
    (non-monotone, never within 1%) with every answer correct; window -10% and sink_window -60% at 8, each
    losing answers (tests/analyses/test_kv.py, tests/reports/test_findings.py)."""
    import pandas as pd

    change = {"heavy_hitters": {1: -0.012, 2: -0.027, 4: -0.046, 8: -0.019},
              "window": {1: -0.9, 2: -0.7, 4: -0.4, 8: -0.1}, "sink_window": {1: -0.9, 2: -0.8, 4: -0.7, 8: -0.6}}
    spread = [-0.002, 0.001, 0.0, 0.001]  # per-example offsets: a non-zero interval, mean unchanged
    lost = {"window": 1, "sink_window": 3}  # answers lost at every budget
    rows = []
    for e in range(4):
        rows.append({"policy": "full", "budget": 12, "example": e, "context": 12, "metric": 10.0, "correct": True})
        for policy, by_budget in change.items():
            for b, c in {**by_budget, 12: 0.0}.items():
                wrong = b < 12 and e < lost.get(policy, 0)
                rows.append({"policy": policy, "budget": b, "example": e, "context": 12,
                             "metric": 10.0 * (1 + c + (spread[e] if b < 12 else 0.0)), "correct": not wrong})
    return pd.DataFrame(rows)


# Three hand-built QA records, one distractor each: the pool is 6 documents. Record 3's answer "river" is in record
# 1's gold and its distractor, so record 3 has 3 answer-free distractors (d3, g2, d2); records 1 and 2 have 5.
SMALL_QA = [  # position's --n-items tests (test_position, test_cli)
    {"question": "which river runs through the town", "answers": ["Elbe"],
     "gold_document": {"title": "Town", "text": "The Elbe river runs through the town."},
     "documents": [{"title": "Bakery", "text": "The bakery is by the river."}]},
    {"question": "what colour is the door", "answers": ["green"],
     "gold_document": {"title": "Door", "text": "The door is green."},
     "documents": [{"title": "Garden", "text": "The garden has sunflowers."}]},
    {"question": "what runs past the bakery", "answers": ["river"],
     "gold_document": {"title": "Walk", "text": "A river runs past the bakery."},
     "documents": [{"title": "Market", "text": "The market sells fish."}]},
]


def two_site_task(n: int, n_tok: int):
    """A Task of n random prompts of n_tok - 1 tokens whose corrupted copies differ at positions 2 and 5; the answer is
    the token after the prompt, the wrong answer the prompt's second token (seeded): patching tests checked against
    plain Hugging Face with hand hooks (hf_logit_diff)."""
    from headscope.analyses.core.tasks import Task

    tokens = random_tokens(n, n_tok, seed=1)
    corrupted = tokens.clone()
    corrupted[:, 2], corrupted[:, 5] = random_tokens(n, n_tok, seed=7)[:, 2], random_tokens(n, n_tok, seed=8)[:, 5]
    return Task(name="rand", tokens=tokens[:, :-1], answers=tokens[:, -1], wrong_answers=tokens[:, 1],
                corrupted_tokens=corrupted[:, :-1])


def hf_logit_diff(hf, tokens, task, hooks=()) -> torch.Tensor:
    """[batch]: a plain Hugging Face model's logit(answer) - logit(wrong) at the last position (in float32), with
    (module, pre?, fn) hooks attached for that one pass and removed after it, also on an error."""
    handles = [(m.register_forward_pre_hook(fn) if pre else m.register_forward_hook(fn)) for m, pre, fn in hooks]
    try:
        with torch.no_grad():
            logits = hf(tokens).logits[:, -1].float()
    finally:
        for h in handles:
            h.remove()
    rows = torch.arange(len(tokens))
    return logits[rows, task.answers] - logits[rows, task.wrong_answers]
