"""Default tasks on non-zoo models (#19 item 1): every family runs out of the box on a random-weight
GPT-2 with a byte-level BPE tokenizer and a Llama-style model with a byte-fallback (SentencePiece-style)
BPE tokenizer, both trained here on a few hundred English sentences; the IOI task's names, prompts and
answers are checked against the plain Hugging Face tokenizer, position's prompts against the context,
and the generic probe labels against hand-worked values."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import headscope as hs
from headscope.analyses.core import default_tasks, tasks
from headscope.analyses.core.registry import ANALYSES, config_class, get_analysis
from headscope.analyses.position import prompts
from headscope.analyses.position.analysis import PositionConfig, build_sweeps
from headscope.analyses.probes.analysis import task_labels
from tests_support import save_random_checkpoint

N_CTX = 128
TRAINED_NAMES = default_tasks.NAMES[:30]  # the last ten names never occur in the training text


def _corpus() -> list[str]:
    """The shipped sentences plus sentences naming people, so that names become tokens."""
    out = list(tasks.shipped_sentences())
    for i, a in enumerate(TRAINED_NAMES):
        b = TRAINED_NAMES[(i + 7) % len(TRAINED_NAMES)]
        out += [f"{a} went to the store with {b}.", f"When {a} and {b} went home, {b} gave a book to {a}.",
                f"{a} said that {b} was late again.", f"Yesterday {b} met {a} at the station."]
    return out


def _byte_level_bpe():
    """GPT-2-style byte-level BPE, no unknown token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def _byte_fallback_bpe():
    """Llama-style BPE: Metaspace pre-tokenizer, byte fallback, <unk> <s> </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _build(kind: str, out: Path) -> Path:
    import transformers

    tok = _byte_level_bpe() if kind == "gpt2" else _byte_fallback_bpe()
    special = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=N_CTX, **special)
    else:
        config = transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=N_CTX, **special)
    save_random_checkpoint(config, out, tok, plain=True)
    return out


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def bpe_model(request, tmp_path_factory):
    """(HookedModel, plain HF tokenizer) of a random model with a trained real-style tokenizer."""
    from transformers import AutoTokenizer

    path = _build(request.param, tmp_path_factory.mktemp(f"default-{request.param}"))
    return hs.load_model(path, device="cpu"), AutoTokenizer.from_pretrained(path)


EXPECTED_TASK = {"heads": "ioi_names", "attribution": "ioi_names", "patching": "ioi_names", "circuits": "ioi_names",
                 "position": "json_kv", "mlp": "sentences", "kv": "sentences", "probes": "sentences"}


def test_every_family_runs_on_its_default(bpe_model):
    model, _ = bpe_model
    assert set(EXPECTED_TASK) == set(ANALYSES)
    results = {}
    for name in ANALYSES:
        results[name] = get_analysis(name)(model, config=config_class(name).preset(quick=True, n_examples=4))
        used = results[name].summary.get("task") or results[name].config.get("task")
        assert used == EXPECTED_TASK[name], name
    assert results["probes"].summary["labels"] == "position_bucket"
    for name in ("mlp", "kv", "probes"):  # the shipped sentences, checked on decoders too (review 11b A4)
        fit = results[name].summary["shipped_text"]
        assert fit["tokens_per_word"] < 2.5 and not fit["off_distribution"], name  # a tokenizer trained on them
    assert results["position"].summary["n_items_note"].startswith(f"n_pairs chosen to fit context {N_CTX}: ")
    assert results["patching"].summary["clean_metric"] != results["patching"].summary["corrupted_metric"]


def test_ioi_task_matches_the_plain_tokenizer(bpe_model):
    model, hf = bpe_model
    task = default_tasks.ioi_task(model, n_examples=12, seed=3)
    assert task.tokens.shape == task.corrupted_tokens.shape == (12, task.tokens.shape[1])
    by_id = {}
    for name in default_tasks.NAMES:  # a name is one token after a word, by the plain tokenizer
        lead, ids = hf("When", add_special_tokens=False)["input_ids"], hf(f"When {name}", add_special_tokens=False)["input_ids"]
        if ids[:-1] == lead:
            by_id[ids[-1]] = name
    assert set(by_id.values()) >= set(TRAINED_NAMES[:4])  # names the tokenizer learned are found
    assert not set(by_id.values()) & set(default_tasks.NAMES[30:])  # names it never saw are not single tokens
    for i in range(len(task)):
        io, s = by_id[int(task.answers[i])], by_id[int(task.wrong_answers[i])]
        a, b = (io, s) if int(task.spans["io"][i, 0]) < int(task.spans["s1"][i, 0]) else (s, io)
        clean = [hf.bos_token_id, *hf(default_tasks.IOI_TEMPLATE.format(a=a, b=b, s=s), add_special_tokens=False)["input_ids"]]
        bad = [hf.bos_token_id, *hf(default_tasks.IOI_TEMPLATE.format(a=a, b=b, s=io), add_special_tokens=False)["input_ids"]]
        assert task.tokens[i].tolist() == clean and task.corrupted_tokens[i].tolist() == bad
        s2 = int(task.spans["s2"][i, 0])
        assert clean[s2] == task.wrong_answers[i] and bad[s2] == task.answers[i]  # the repeated name is swapped
        assert sum(x != y for x, y in zip(clean, bad)) == 1


def test_tiny_vocabularies_fall_back_to_induction(tiny_models):
    """The word-level w0..w59 tokenizer has no names: induction, with corrupted prompts for patching."""
    model = tiny_models["gpt2"]
    assert default_tasks.single_token_names(model) == {}
    task = default_tasks.logit_diff_task(model, n_examples=3, seed=0, corrupt=True)
    assert task.name == "repeat"
    toks, n = task.tokens, 12
    assert torch.equal(toks[:, 1:1 + n // 2], toks[:, 1 + n:])  # the second copy repeats the first
    assert torch.equal(task.answers, toks[:, 1 + n // 2]) and torch.equal(task.wrong_answers, toks[:, 2 + n // 2])
    assert torch.equal(task.corrupted_tokens[:, 1 + n:], toks[:, 1 + n:])
    first, other = toks[:, 1:1 + n], task.corrupted_tokens[:, 1:1 + n]
    assert not any(set(first[i].tolist()) & set(other[i].tolist()) for i in range(3))  # nothing to copy
    # English is mostly <unk> to it, so the sentence-based defaults (mlp, kv, probes) use induction too
    words = " ".join(tasks.shipped_sentences()[:4]).split()
    assert sum(model.tokenizer.convert_tokens_to_ids(w) == model.tokenizer.unk_token_id for w in words) > len(words) / 2
    assert default_tasks.text_task(model, 4, 0).name == default_tasks.text_task(model, 4, 0, padded=True).name == "repeat"


def test_position_prompt_fits_the_context(bpe_model):
    model, hf = bpe_model
    result_cfg = PositionConfig.preset(quick=True, n_examples=2)
    sweeps = build_sweeps(model, result_cfg)
    for sw in sweeps:
        assert sw.prompt_len + sw.answer_ids.numel() + 8 <= N_CTX  # prompt, answer and greedy decoding
    n, value = sweeps[0].n_items, sweeps[0].answers[0]
    more = prompts.kv_sweeps(hf, n_pairs=n + 1, n_examples=2, key_chars=len(value), instruction=False)
    assert max(sw.prompt_len + sw.answer_ids.numel() + 8 for sw in more) > N_CTX  # one more pair would not fit
    # a usual context keeps Liu et al.'s UUID pairs and instruction, as many as fit (up to 20)
    wide = prompts.fit_kv_sweeps(hf, 2048, n_examples=2)
    assert len(wide[0].answers[0]) == 36 and wide[0].n_items == 20
    assert prompts.KV_INSTRUCTION in hf.decode(wide[0].tokens[0])
    note = prompts.kv_fit_note(hf, sweeps, N_CTX)
    assert note.startswith(f"n_pairs chosen to fit context {N_CTX}: {n} pairs")


def test_generic_probe_labels_by_hand(bpe_model):
    model, hf = bpe_model
    text = "When Mary and John went to the store, John gave a drink"
    enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = [hf.bos_token_id, *enc["input_ids"]]
    task = tasks.Task(name="t", tokens=torch.tensor([ids]), metric="cosine")
    n = len(ids)
    prev = task_labels(task, "prev_token").labels.tolist()
    assert prev == [-1, *ids[:-1]]
    buckets = task_labels(task, "position_bucket").labels.tolist()
    assert buckets == [[0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5][p] for p in range(n)]
    # a word starts where the token's text follows a space (or opens the text); BOS is not a word
    starts = [0] + [int(a == 0 or text[a] == " " or text[a - 1] == " ") for a, _ in enc["offset_mapping"]]
    assert task_labels(task, "word_start", tokenizer=model.tokenizer).labels.tolist() == starts
    assert sum(starts) == len(text.split())


def test_a_decoder_on_shipped_sentences_its_tokenizer_splits_says_so(tmp_path, caplog):
    """Review 11b A4: a decoder whose task does not fit ran mlp, kv and probes on the shipped sentences,
    which its tokenizer (trained on other text) spells about 4 tokens a word, and nothing said so (the
    check ran for encoders only). Now the summary records the counts the plain tokenizer gives for the
    sentences the rows came from, the log warns and the finding opens with the note."""
    import pandas as pd
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from headscope.analyses.core.registry import task_used, with_text_fit
    from headscope.analyses.core.result import Result
    from headscope.reports.findings import finding

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(["the owner has the key now"] * 20, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    save_random_checkpoint(transformers.GPT2Config(
        n_embd=16, n_layer=1, n_head=2, n_positions=N_CTX, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id), tmp_path, tok, plain=True)
    model, hf = hs.load_model(tmp_path, device="cpu"), AutoTokenizer.from_pretrained(tmp_path)
    config = config_class("mlp").preset(quick=True, n_examples=4)
    task = task_used("mlp", model, None, config)
    assert task.name == "sentences"
    every = [(hf(t)["input_ids"], t) for t in tasks.shipped_sentences()]
    rows = [task.tokens[i][task.attention_mask[i].bool()].tolist() if task.attention_mask is not None
            else task.tokens[i].tolist() for i in range(len(task))]
    texts = [next(t for ids, t in every if [hf.bos_token_id, *ids][:len(row)] == row) for row in rows]
    per_word = sum(len(hf.tokenize(t)) for t in texts) / sum(len(t.split()) for t in texts)
    assert per_word > 3  # the case: a tokenizer that learnt six words spells English nearly byte by byte
    with caplog.at_level("WARNING"):
        summary = with_text_fit("mlp", Result(name="mlp", df=pd.DataFrame(), summary={}), model, None, config).summary
    fit = summary["shipped_text"]
    assert fit["n_sentences"] == len(texts) and fit["tokens_per_word"] == pytest.approx(per_word, abs=1e-4)
    said = f"split into {per_word:.1f} tokens a word by this tokenizer"
    assert fit["off_distribution"] and any(said in r.getMessage() for r in caplog.records)
    assert finding("mlp", summary).startswith(f"The shipped sentences are {said}")
