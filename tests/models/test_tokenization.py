"""Tokenization guards: words that become <unk>, a tokenizer class that does not fit its files
(the load-time round trip), and the zoo vocabulary probe on a tokenizer without an unknown token.

Real-style tokenizers are trained here with `tokenizers` on the shipped English sentences
(byte-level BPE like GPT-2's, without an unknown token; WordPiece like BERT's, lower-casing) and
saved next to a random-weight GPT-2 config."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import headscope as hs
from headscope.analyses.core import tasks
from headscope.errors import TaskError, TokenizationWarning
from headscope.models.token_text import round_trip_problem, unknown_words
from tests_support import build_tiny_model, save_random_checkpoint


def _sentences() -> list[str]:
    return tasks.shipped_sentences()


def byte_level_bpe(vocab_size: int = 300):
    """GPT-2-style byte-level BPE with no unknown token (as Llama 3's and Qwen's have none)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_sentences(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def wordpiece(vocab_size: int = 300):
    """BERT-style WordPiece: lower-casing normalizer, [UNK] for what it cannot split."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(_sentences(), trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]", "[PAD]", "[CLS]", "[SEP]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]")


def gpt2_dir(tokenizer, out: Path) -> Path:
    """A random-weight 2-layer GPT-2 sized to the tokenizer, saved with it."""
    import transformers

    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    save_random_checkpoint(config, out, tokenizer, plain=True)
    return out


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return gpt2_dir(byte_level_bpe(), tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def wordpiece_dir(tmp_path_factory):
    return gpt2_dir(wordpiece(), tmp_path_factory.mktemp("wordpiece"))


def _load_quietly(path, **kw):
    """load_model, with every TokenizationWarning it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = hs.load_model(path, device="cpu", **kw)
    return model, [w for w in caught if issubclass(w.category, TokenizationWarning)]


# ---- the round trip at load ---------------------------------------------------------------------------
def test_normal_tokenizers_load_without_a_warning(bpe_dir, wordpiece_dir, tiny_dirs):
    for path in (bpe_dir, wordpiece_dir, tiny_dirs["llama"], "zoo/synth-llama"):
        model, caught = _load_quietly(path)
        assert caught == [], (path, [str(w.message) for w in caught])
    # the zoo model still covers its own vocabulary: the zoo tasks build (kv: "k05 v11 ; ..." words)
    task = tasks.zoo(model, "kv", n_examples=2)
    assert model.tokenizer.unk_token_id not in task.tokens.tolist()[0]


def test_sentencepiece_style_leading_space_passes():
    """A Llama-style (Metaspace, byte-fallback BPE) tokenizer decodes with or without the leading
    space; the comparison strips it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.train_from_iterator(_sentences(), trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    ids = fast("the storm", add_special_tokens=False)["input_ids"]
    assert fast.decode(ids) != "the storm" and fast.decode(ids).strip() == "the storm"  # the leading space
    assert round_trip_problem(fast) is None


def test_a_tokenizer_class_that_does_not_fit_its_files_warns(tmp_path):
    """A Qwen2 config with a word-level tokenizer.json: transformers picks Qwen2Tokenizer, which
    loses every word; load_model says which class and how to override it."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = build_tiny_model("qwen2", tmp_path / "qwen2", tokenizer="word")
    picked = AutoTokenizer.from_pretrained(path)
    assert picked("w5 w11 w5", add_special_tokens=False)["input_ids"] != [9, 15, 9]  # the bug being caught
    _, caught = _load_quietly(path)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert type(picked).__name__ in message and "tokenizer=" in message and "\n" not in message
    assert _load_quietly(path, check_tokenizer=False)[1] == []
    # the override the message names fixes it, with no warning
    model, caught = _load_quietly(path, tokenizer=PreTrainedTokenizerFast.from_pretrained(path))
    assert caught == []
    assert model.to_tokens("w5 w11 w5").tolist() == [[2, 9, 15, 9]]  # <bos>=2, w<i> = 4 + i


# ---- <unk> words ------------------------------------------------------------------------------------
def test_to_tokens_warns_naming_the_words_that_became_unk(tiny_models):
    model = tiny_models["gpt2"]
    with pytest.warns(TokenizationWarning, match=r"2 word\(s\).*'hello', 'world'"):
        tokens = model.to_tokens("w1 hello w2 world")
    assert tokens.tolist() == [[2, 5, 0, 6, 0]]  # <unk> = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model.to_tokens(["w1 w2", "w3 w4"]).tolist() == [[2, 5, 6], [2, 7, 8]]  # no warning
        model.to_tokens("w1 hello", warn_unknown=False)


def test_unknown_words_on_wordpiece_and_bpe():
    wp = wordpiece()
    assert wp.unk_token_id in wp("the 猫 sat", add_special_tokens=False)["input_ids"]
    assert unknown_words(wp, "the 猫 sat") == ["猫"]
    assert unknown_words(wp, "The storm") == []  # lower-cased, known
    assert unknown_words(byte_level_bpe(), "anything 猫 at all") == []  # bytes: nothing is unknown


# ---- the zoo vocabulary probe ----------------------------------------------------------------------------
def test_zoo_task_on_a_tokenizer_without_unk_raises_the_clear_error(bpe_dir):
    model, _ = _load_quietly(bpe_dir)
    assert model.tokenizer.unk_token_id is None
    assert None in model.tokenizer.convert_tokens_to_ids(["k05", "v11"])  # what used to crash
    for name in tasks.ZOO_TASKS:
        with pytest.raises(TaskError, match="does not cover the zoo vocabulary"):
            tasks.zoo(model, name, n_examples=2)
    # callers' fallbacks work: the heads default becomes repeated random tokens
    from headscope.analyses.heads.analysis import default_task

    assert default_task(model, None).name != "kv"


PROMPT = "When Mary and John went to the store, John gave a drink to"


def test_str_tokens_read_as_people_read_them(arch_models, tiny_models):
    """Each token decoded alone (#32 item 4): byte-level BPE's "ĠMary" reads " Mary" (as
    TransformerLens's to_str_tokens), SentencePiece's "▁Mary" too; WordPiece and word-level
    vocabularies are unchanged."""
    gpt2 = arch_models("gpt2")  # byte-level BPE trained in this session
    ids = gpt2.to_tokens(PROMPT)[0]
    got = gpt2.to_str_tokens(ids)
    assert got == [gpt2.tokenizer.decode([i]) for i in ids.tolist()]
    assert "".join(got[1:]) == PROMPT and got[0] == "<|endoftext|>"  # the pieces are the text
    assert not any("\u0120" in t for t in got) and any(t.startswith(" ") for t in got)
    llama = arch_models("llama3")  # SentencePiece-style BPE with byte fallback
    ids = llama.to_tokens(PROMPT)[0]
    pieces = llama.tokenizer.convert_ids_to_tokens(ids.tolist())
    got = llama.to_str_tokens(ids)
    for piece, text in zip(pieces, got):
        assert text == (chr(int(piece[3:5], 16)) if piece.startswith("<0x") else piece.replace("\u2581", " "))
    for model in (arch_models("bert"), tiny_models["gpt2"]):  # WordPiece, word-level: the tokens themselves
        ids = model.to_tokens(PROMPT if model.facts.is_encoder else "w1 w2 w3")[0]
        assert model.to_str_tokens(ids) == model.tokenizer.convert_ids_to_tokens(ids.tolist())


def test_results_and_the_explorer_label_tokens_as_text(arch_models):
    """The explorer's labels, patching's token column and attribution's table carry the decoded
    tokens, never byte-level BPE's raw "Ġ" strings."""
    from headscope.analyses.core.tasks import Task
    from headscope.reports.explorer import attention_explorer_data

    model = arch_models("gpt2")
    ids = model.to_tokens(PROMPT)  # [1, pos]
    want = [model.tokenizer.decode([i]) for i in ids[0].tolist()]
    assert attention_explorer_data(model, ids)["examples"][0]["tokens"] == want
    the, to = (model.tokenizer(w, add_special_tokens=False)["input_ids"] for w in (" the", " to"))
    assert len(the) == len(to) == 1  # whole words of the trained vocabulary
    corrupted = ids.clone()
    corrupted[0, 2] = the[0]
    task = Task(name="t", tokens=ids, corrupted_tokens=corrupted, answers=torch.tensor(the),
                wrong_answers=torch.tensor(to))
    patched = hs.activation_patching(model, task, sites=["resid_pre"]).df
    assert set(patched.token) == {f"{i}: {t}" for i, t in enumerate(want)}
    config = hs.AttributionConfig(n_steps=2, ig_max_steps=2, n_permutations=2, adversarial_steps=0)
    scores = hs.attribution(model, task, config).tables["scores"]
    assert set(scores.token) <= set(want) and {" and", " the", " to"} <= set(scores.token)


def test_prepend_bos_false_runs_prompts_as_the_tokenizer_tokenizes_them(tiny_dirs, tiny_models):
    """Review 10b A1: a decoder whose tokenizer adds no BOS (the word-level one here, like GPT-2's) gets the
    tokenizer's own ids from to_tokens, hs.load_task and the default task builders under
    load_model(..., prepend_bos=False); the default keeps TransformerLens's habit (the BOS in front), and a
    tokenizer that adds its own BOS keeps it either way."""
    from transformers import AutoTokenizer

    from headscope.analyses.core import default_tasks
    from headscope.analyses.position.analysis import PositionConfig, build_sweeps
    from headscope.errors import ConfigError
    from headscope.models import HookedModel
    from headscope.models.zoo.vocab import build_tokenizer as zoo_tokenizer
    from tests_support import byte_fallback_bpe

    plain = AutoTokenizer.from_pretrained(tiny_dirs["gpt2"])  # the checkpoint's tokenizer, straight from HF
    own, bos = plain("w1 w2 w3 w4")["input_ids"], plain.bos_token_id
    assert bos is not None and own[0] != bos  # it adds no BOS
    model = hs.load_model(tiny_dirs["gpt2"], device="cpu", prepend_bos=False)
    assert model.to_tokens("w1 w2 w3 w4")[0].tolist() == own
    assert model.to_tokens("w1 w2 w3 w4", prepend_bos=True)[0].tolist() == [bos, *own]  # the call's own choice wins
    assert tiny_models["gpt2"].to_tokens("w1 w2 w3 w4")[0].tolist() == [bos, *own]  # the default, as TransformerLens
    assert model.added_bos() is None and tiny_models["gpt2"].added_bos() == "<bos>"
    task = hs.load_task(model, [{"prompt": "w1 w2 w3 w4", "answer": " w5"}, {"prompt": "w6 w7", "answer": " w8"}])
    assert task.example(0).tokens[0].tolist() == own
    assert tasks.sentence_task(model, ["w1 w2 w3 w4 w9"]).tokens[0].tolist() == own  # the last word is the answer
    repeat = default_tasks.repeated_tokens_task(model, n_examples=2, length=4).tokens  # [2, 4 + 2]: x x[:2], no BOS
    assert repeat.shape == (2, 6) and (repeat[:, :2] == repeat[:, 4:]).all() and (repeat != bos).all()
    config = PositionConfig.preset(quick=True, n_examples=1, sweep="zoo_kv", n_items=3)  # its words: tokenized pieces
    zoo = HookedModel(model.bridge, zoo_tokenizer(), model.facts, "test", prepend_bos=False)
    assert int(build_sweeps(zoo, config)[0].tokens[0, 0]) != zoo.tokenizer.bos_token_id
    zoo.prepend_bos = None
    assert int(build_sweeps(zoo, config)[0].tokens[0, 0]) == zoo.tokenizer.bos_token_id
    with pytest.raises(ConfigError, match="prepend_bos must be None, True or False"):
        hs.load_model(tiny_dirs["gpt2"], device="cpu", prepend_bos="no")
    adds = byte_fallback_bpe()  # Llama-style: its post-processor puts <s> first itself
    llama = HookedModel(tiny_models["llama"].bridge, adds, tiny_models["llama"].facts, "test", prepend_bos=False)
    assert llama.to_tokens("the cat sat")[0].tolist() == adds("the cat sat")["input_ids"]
    assert llama.added_bos() is None and llama.bos_prefix() == [adds.bos_token_id]
