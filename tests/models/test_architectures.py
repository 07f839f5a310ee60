"""The architecture matrix (#19 item 6): random-weight checkpoints from scaled-down real configs of
GPT-2, GPT-NeoX (Pythia), Llama 3, Qwen2, Mistral, Gemma 2, Phi-3 and BERT (tests_support.ARCHITECTURES),
each with a real-style tokenizer trained on English. On each, headscope loads the files with a
tokenizer that reproduces the trained one and no TokenizationWarning, its outputs equal plain
Hugging Face's (eager attention) on English prompts, and run_with_cache's patterns equal Hugging
Face's attention probabilities."""
from __future__ import annotations

import warnings

import pytest
import torch

import headscope as hs
from headscope.errors import TokenizationWarning
from tests_support import ARCHITECTURES, hf_reference

PROMPTS = [
    "The storm passed over the quiet hills before the morning light.",
    "She wrote a letter to her brother who lived in the city.",
    "When the bell rang, the children ran outside to play in the snow.",
    "A small boat drifted slowly down the river toward the sea.",
]
TOL = 1e-4
# Each architecture's own switches, one at a time turned off in the reference: its logits must move,
# so the equality below is not blind to them (the sliding windows are 8 tokens wide; the prompt is longer).
SWITCHES = [
    ("neox", {"partial_rotary_factor": 1.0}),
    ("llama3", {"rope_theta": 10000.0}),
    ("qwen2", {"rope_theta": 10000.0}),
    ("mistral", {"sliding_window": 256}),
    ("gemma2", {"sliding_window": 256}),
    ("gemma2", {"final_logit_softcapping": None}),
    ("gemma2", {"attn_logit_softcapping": None}),
]


ARCHS = list(ARCHITECTURES)


def _ids(tokenizer, text: str) -> torch.Tensor:
    """[1, pos]: the prompt as the tokenizer encodes it (specials included: BOS for Llama-style, CLS/SEP for BERT)."""
    return torch.tensor([tokenizer(text)["input_ids"]])


def _reference(hf, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None):
    out = hf(tokens, attention_mask=attention_mask, output_attentions=True)
    return (out.last_hidden_state if hf.config.model_type == "bert" else out.logits), out.attentions


@pytest.mark.parametrize("arch", ARCHS)
def test_loads_its_own_tokenizer_without_a_warning(arch, arch_dirs):
    """transformers picks a tokenizer that gives the trained tokenizer.json's ids on English, and
    load_model's round trip raises no TokenizationWarning; the facts are the config's."""
    from tokenizers import Tokenizer

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = hs.load_model(arch_dirs[arch], device="cpu")
    assert [str(w.message) for w in caught if issubclass(w.category, TokenizationWarning)] == []
    trained = Tokenizer.from_file(str(arch_dirs[arch] / "tokenizer.json"))
    for text in PROMPTS:
        assert model.tokenizer(text)["input_ids"] == trained.encode(text).ids
        assert model.tokenizer.decode(trained.encode(text).ids, skip_special_tokens=True).lower() == text.lower()
    fields = ARCHITECTURES[arch][3]
    assert (model.facts.n_layers, model.facts.n_heads, model.facts.d_model) == (2, 4, 64)
    assert model.facts.n_kv_heads == fields.get("num_key_value_heads", 4)
    assert model.facts.is_encoder == (arch == "bert")
    assert model.facts.d_vocab == len(model.tokenizer)


@pytest.mark.parametrize("arch", ARCHS)
def test_outputs_equal_plain_hugging_face(arch, arch_dirs, arch_models):
    """Logits (decoders) or last hidden states (BERT) equal Hugging Face's to 1e-4: each prompt
    alone, and the batch (decoders: cut to the shortest prompt; BERT: right-padded with its mask)."""
    model, hf = arch_models(arch), hf_reference(arch_dirs[arch])
    with torch.no_grad():
        for text in PROMPTS:
            tokens = _ids(model.tokenizer, text)  # [1, pos]
            want, _ = _reference(hf, tokens)
            assert (model(tokens) - want).abs().max().item() <= TOL, text
        if model.facts.is_encoder:
            enc = model.tokenizer(PROMPTS, return_tensors="pt", padding=True)
            want, _ = _reference(hf, enc["input_ids"], enc["attention_mask"])  # [batch, pos, d_model]
            got = model(enc["input_ids"], attention_mask=enc["attention_mask"])
            real = enc["attention_mask"].bool()
            assert (got[real] - want[real]).abs().max().item() <= TOL
        else:
            rows = [model.tokenizer(t)["input_ids"] for t in PROMPTS]
            tokens = torch.tensor([r[: min(map(len, rows))] for r in rows])  # [batch, pos]
            want, _ = _reference(hf, tokens)
            assert (model(tokens) - want).abs().max().item() <= TOL


@pytest.mark.parametrize(("arch", "switch"), [pytest.param(a, o, id=f"{a}-{next(iter(o))}") for a, o in SWITCHES])
def test_the_architectures_switches_change_the_reference(arch, switch, arch_dirs):
    """Guard for the equality above: Hugging Face's own logits move when the architecture's
    switch (rotary fraction, rope base, sliding window, soft-capping) is turned off."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokens = _ids(AutoTokenizer.from_pretrained(arch_dirs[arch]), PROMPTS[2])  # [1, pos], pos > the 8-token windows
    assert tokens.shape[1] > 8
    with torch.no_grad():
        want = hf_reference(arch_dirs[arch])(tokens).logits
        config = AutoConfig.from_pretrained(arch_dirs[arch])
        for key, value in switch.items():  # rotary settings live in rope_parameters (transformers 5)
            if key in config.rope_parameters:
                config.rope_parameters[key] = value
            else:
                setattr(config, key, value)
        off = AutoModelForCausalLM.from_pretrained(arch_dirs[arch], config=config, attn_implementation="eager").eval()
        assert (off(tokens).logits - want).abs().max().item() > 1e-2


@pytest.mark.parametrize("arch", ARCHS)
def test_run_with_cache(arch, arch_dirs, arch_models):
    """hs.run_with_cache returns the model's output and every layer's pattern, equal to Hugging
    Face's attention probabilities (GQA, windows and soft-capping included)."""
    model, hf = arch_models(arch), hf_reference(arch_dirs[arch])
    tokens = _ids(model.tokenizer, PROMPTS[0])  # [1, pos]
    with torch.no_grad():
        out, acts = hs.run_with_cache(model, tokens)
        want, attentions = _reference(hf, tokens)
    assert (out - want).abs().max().item() <= TOL
    pos = tokens.shape[1]
    for layer in range(model.facts.n_layers):
        pattern = acts["pattern", layer]  # [1, n_heads, pos, pos]
        assert pattern.shape == (1, model.facts.n_heads, pos, pos)
        assert (pattern - attentions[layer]).abs().max().item() <= TOL
    assert acts["resid_post", -1].shape == (1, pos, model.facts.d_model)


@pytest.mark.parametrize("arch", ARCHS)
def test_to_tokens_equals_the_tokenizer_on_english_text(arch, arch_models, arch_dirs):
    """Most decoders' tokenizers have no pad token: to_tokens must not ask them to pad."""
    from transformers import AutoTokenizer

    model = arch_models(arch)
    tok = AutoTokenizer.from_pretrained(arch_dirs[arch])
    texts = ["The cat sat on the mat.", "A dog ran in the park."]
    rows = [tok(t)["input_ids"] for t in texts]
    if len({len(r) for r in rows}) > 1:  # equal lengths are what to_tokens batches
        texts, rows = texts[:1], rows[:1]
    bos = model.tokenizer.bos_token_id  # decoders get a BOS prepended, TransformerLens-style (Qwen2: its eos)
    if not model.facts.is_encoder and bos is not None:
        rows = [r if r[0] == bos else [bos, *r] for r in rows]
    assert model.to_tokens(texts).tolist() == rows
    with pytest.raises(hs.ConfigError, match="different token lengths"):
        model.to_tokens(["Hi.", "The cat sat on the mat and the dog ran in the park."])


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "bert"])
def test_loss_and_greedy_generate_equal_plain_hugging_face(arch, arch_dirs, arch_models, hf_of):
    """The TransformerLens habits on every decoder of the matrix (models/tl_habits.py): model(text,
    return_type="loss") is Hugging Face's labels= loss, and greedy generate is Hugging Face's greedy
    generate token for token (through the bridge's KV cache: GQA, windows, soft-capping included)."""
    import copy

    model, hf = arch_models(arch), hf_of(arch)
    tokens = model.to_tokens(PROMPTS[1])  # [1, pos]
    config = copy.deepcopy(hf.generation_config)
    config.eos_token_id = None  # the full length, as stop_at_eos=False
    with torch.no_grad():
        assert abs(model(PROMPTS[1], return_type="loss").item() - hf(tokens, labels=tokens).loss.item()) <= TOL
        want = hf.generate(tokens, attention_mask=torch.ones_like(tokens), generation_config=config, max_new_tokens=5,
                           do_sample=False)
    got = model.generate(PROMPTS[1], max_new_tokens=5, do_sample=False, stop_at_eos=False, return_type="tokens")
    assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gemma3"])
def test_visible_keys_are_the_keys_hugging_face_eager_attends_to(arch, arch_dirs, arch_models, more_arch_dirs,
                                                                 more_arch_models, hf_of):
    """models.visible_keys with layer_windows (8-key windows; every Mistral layer slides, Gemma's first)
    is exactly where plain Hugging Face's eager attention weights are nonzero, on 14 positions with a
    left-padded row: the padding mask on top, every real query row."""
    from headscope.models.hooked_model import layer_windows, visible_keys

    more = arch == "gemma3"
    model = more_arch_models(arch) if more else arch_models(arch)
    hf = hf_reference(more_arch_dirs(arch)) if more else hf_of(arch)
    windows = layer_windows(model)
    assert windows == ((8, 8) if arch == "mistral" else (8, None))
    tokens = torch.randint(4, 60, (2, 14), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[1, :3] = 0  # row 1 left-padded by 3
    with torch.no_grad():
        out = hf(tokens, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0), output_attentions=True)
    pos = torch.arange(14)
    for layer, w in enumerate(windows):
        want = visible_keys(pos[:, None], pos[None, :], w)[None] & mask.bool()[:, None, :]  # [b, q, k]
        got = out.attentions[layer] > 0  # [b, H, q, k]
        real = mask.bool()
        assert torch.equal(got[0], want[0].expand_as(got[0]))
        assert torch.equal(got[1][:, real[1]], want[1][real[1]].expand_as(got[1][:, real[1]]))


def test_layer_windows_read_gpt_neos_local_layers_as_its_own_mask_does(gpt_neo_model):
    """GPT-Neo keeps its window in config.window_size and config.attention_layers ("local"), not sliding_window
    (review 17d): layer_windows gives (None, 4) on the tiny GPT-Neo (layer 1 local, window 4), and visible_keys
    with it is exactly where plain Hugging Face's eager attention weights are nonzero, 12 positions, a left-padded
    row included. The old reader gave (None, None): layer 1 read as global."""
    from headscope.models.hooked_model import layer_windows, visible_keys

    model, path = gpt_neo_model
    assert layer_windows(model) == (None, 4)
    hf = hf_reference(path)
    tokens = torch.randint(4, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        out = hf(tokens, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0), output_attentions=True)
    pos, real = torch.arange(12), mask.bool()
    assert (out.attentions[1][0, :, -1, :-4] == 0).all() and (out.attentions[1][0, :, -1, -4:] > 0).all()
    for layer, w in enumerate(layer_windows(model)):
        want = visible_keys(pos[:, None], pos[None, :], w)[None] & real[:, None, :]  # [b, q, k]
        got = out.attentions[layer] > 0  # [b, H, q, k]
        assert torch.equal(got[0], want[0].expand_as(got[0]))
        assert torch.equal(got[1][:, real[1]], want[1][real[1]].expand_as(got[1][:, real[1]]))


def test_layer_windows_follow_qwen2s_use_sliding_window_and_max_window_layers():
    """Qwen2 slides only with use_sliding_window, and then only layers >= max_window_layers (its config's
    layer_types, which its mask reads); sliding_window alone (use_sliding_window False) is no window."""
    from types import SimpleNamespace

    import transformers

    from headscope.models.hooked_model import layer_windows

    def windows(**kw):
        config = transformers.Qwen2Config(num_hidden_layers=3, sliding_window=8, **kw)
        facts = SimpleNamespace(n_layers=3, is_encoder=False)
        return layer_windows(SimpleNamespace(facts=facts, bridge=SimpleNamespace(original_model=SimpleNamespace(config=config))))

    assert windows(use_sliding_window=False) == (None, None, None)
    assert windows(use_sliding_window=True, max_window_layers=1) == (None, 8, 8)
