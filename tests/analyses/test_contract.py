"""The task contract (analyses/core/contract.py): each family's NEEDS against tasks built by hand."""
from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest
import torch

from headscope.analyses.core import contract
from headscope.analyses.core.contract import Needs, check, model_reasons, task_reasons
from headscope.analyses.core.registry import ANALYSES, needs
from headscope.analyses.core.tasks import Task
from headscope.errors import UnsupportedModelError

DECODER_ONLY = {"patching", "mlp", "kv", "circuits"}


def english_tokenizer():
    """A word-level tokenizer whose vocabulary holds every word of the contract's English probe and of the
    shipped retrieval passages (position's data on an encoder)."""
    from importlib.resources import files

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    passages = (files("headscope.analyses") / "data" / "retrieval.jsonl").read_text(encoding="utf-8")
    passages = " ".join(s for line in passages.splitlines() if line.strip()
                        for r in [json.loads(line)] for s in (r["query"], r["relevant"], *r["distractors"]))
    words = ["<unk>", "<pad>", "<bos>", *dict.fromkeys(contract.ENGLISH_PROBE.split() + passages.split())]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>")


def fake_model(encoder: bool, tokenizer=None):
    name = "an-encoder" if encoder else "a-decoder"
    tokenizer = tokenizer or english_tokenizer()
    return SimpleNamespace(name=name, facts=SimpleNamespace(is_encoder=encoder, name=name, n_ctx=128, d_vocab=len(tokenizer)),
                           tokenizer=tokenizer)


def task(n: int = 6, *, answers=None, corrupted: bool = False, wrong: bool = False, spans=None, metric=None) -> Task:
    tokens = torch.arange(n * 3).reshape(n, 3) % 50 + 4  # [n, 3]
    answers = torch.tensor(answers if answers is not None else [4 + i % 3 for i in range(n)])  # [n]
    return Task(
        name="hand", tokens=tokens, answers=None if metric == "cosine" else answers,
        corrupted_tokens=tokens.flip(0) if corrupted else None, wrong_answers=answers.flip(0) if wrong else None,
        spans=spans or {}, metric=metric or ("logit_diff" if wrong else "logprob"),
    )


DECODER = fake_model(encoder=False)
ENCODER = fake_model(encoder=True)


def test_the_registry_returns_each_familys_declaration():
    for name in ANALYSES:
        module = importlib.import_module(f"headscope.analyses.{name}.analysis")
        assert needs(name) is module.NEEDS and isinstance(module.NEEDS, Needs)


def test_decoder_only_families_cannot_run_on_an_encoder_at_all():
    for name in ANALYSES:
        on_encoder = model_reasons(needs(name), ENCODER)
        assert bool(on_encoder) == (name in DECODER_ONLY), name
        assert model_reasons(needs(name), DECODER) == []
        if on_encoder:
            assert on_encoder[0].startswith("an-encoder is an encoder and this analysis needs a decoder")
            # whatever the task: the model's reason comes first
            assert check(needs(name), task(corrupted=True, wrong=True), ENCODER)[0] == on_encoder[0]
    with pytest.raises(UnsupportedModelError, match="patching: an-encoder is an encoder"):
        contract.require(needs("patching"), ENCODER, "patching")
    contract.require(needs("patching"), DECODER, "patching")  # no error


def test_patching_runs_on_an_encoder_raise_instead_of_an_empty_result():
    from headscope.analyses.patching import analysis as patching

    with pytest.raises(UnsupportedModelError, match="encoder"):
        patching.run(ENCODER)


def test_a_prompt_answer_task_fits_what_needs_only_answers():
    plain = task()  # prompts and answers only, 3 distinct answers over 6 examples
    for name in ("heads", "attribution", "mlp", "kv", "circuits", "probes"):
        assert check(needs(name), plain, DECODER) == [], name


def test_patching_needs_corrupted_prompts():
    assert task_reasons(needs("patching"), task(), DECODER) == ["the task has no corrupted prompts"]
    assert task_reasons(needs("patching"), task(corrupted=True), DECODER) == []  # logprob without wrong answers


def test_a_logit_difference_need_fails_without_wrong_answers():
    logit_diff = Needs(answers=True, wrong_answers=True, corrupted=True)
    assert task_reasons(logit_diff, task(corrupted=True), DECODER) == [
        "the task has no wrong answers (needed for logit difference)"]
    assert task_reasons(logit_diff, task(corrupted=True, wrong=True), DECODER) == []


def test_spans_examples_and_classes():
    subject = Needs(spans=("subject",))
    assert task_reasons(subject, task(), DECODER) == ["the task marks no 'subject' span"]
    marked = task(spans={"subject": torch.tensor([[1, 2]] * 6)})
    assert task_reasons(subject, marked, DECODER) == []
    # heads: resample ablation takes another example's activations
    assert task_reasons(needs("heads"), task(1), DECODER) == ["the task has 1 example(s); it needs at least 2"]
    assert task_reasons(needs("heads"), task(2), DECODER) == []
    # probes: cross-validated classifiers of the answer need examples and two classes at least
    probes = needs("probes")
    assert task_reasons(probes, task(4, answers=[7, 8] * 2), DECODER) == ["the task has 4 example(s); it needs at least 5"]
    assert task_reasons(probes, task(6, answers=[7, 8, 9, 10, 11, 11]), DECODER) == [
        "only 1 of the task's answers occur more than once; cross-validated probes need at least 2 answers seen twice "
        "or more"]
    assert task_reasons(probes, task(6, answers=[7] * 6), DECODER) == [
        "the task's answers take 1 distinct value(s); it needs at least 2 classes"]
    assert task_reasons(probes, task(6, answers=[7, 8] * 3), DECODER) == []


def test_position_runs_on_its_own_data_and_names():
    position = needs("position")
    reasons = task_reasons(position, task(corrupted=True, wrong=True), DECODER)
    # review 16c B3: why a prompt/answer file is not swept, even one that places its answers early / middle / late
    assert reasons == ["it runs on its own data (retrieval sweeps that move the gold item through the context), not on "
                       "prompt/answer tasks: each row of one is a fixed prompt with its answer where the row put it, "
                       "so placements the file varies itself (early, middle, late) are not read either; its --task "
                       "takes a JSONL file of its own records"]
    assert check(position, "kv", DECODER) == [] and check(position, "json_kv", DECODER) == []


def test_next_token_scoring_on_an_encoder_reads_any_tasks_prompts():
    """heads scores an encoder by its pooled embedding on a task's prompts (make_scorer's prompts_only), so a
    prompt/answer task is no reason to fall back to the shipped sentences (review 7b A5)."""
    heads = needs("heads")
    assert task_reasons(heads, task(), ENCODER) == []
    assert task_reasons(heads, task(metric="cosine"), ENCODER) == []
    assert task_reasons(heads, task(metric="cosine"), DECODER) == ["the task has no answers to score with next-token logits"]


def test_english_data_needs_a_tokenizer_that_encodes_english(tiny_models):
    from headscope.models.zoo.vocab import build_tokenizer

    position = needs("position")
    assert model_reasons(position, DECODER) == []  # every probe word is in the vocabulary
    assert model_reasons(position, fake_model(False, build_tokenizer())) == []  # zoo vocabulary: zoo data
    words = tiny_models["llama"]  # w0..w59 only: no key-value prompt and too few one-token words for word_kv
    reasons = model_reasons(position, words)
    assert len(reasons) == 1 and reasons[0].startswith("this tokenizer cannot write position's default data")
    # a family whose English data names no text of its own is checked on ENGLISH_PROBE, its unknown words counted
    probe = contract.Needs(english=True)
    lost = [w for w in contract.ENGLISH_PROBE.split() if words.tokenizer.unk_token_id in
            words.tokenizer(w, add_special_tokens=False)["input_ids"]]
    said = model_reasons(probe, words)
    assert len(said) == 1 and f"maps {len(set(lost))} of the {len(set(contract.ENGLISH_PROBE.split()))} distinct words of" \
        in said[0] and "(Extract, the, value, corresponding, ...)" in said[0]


def test_an_encoders_position_skip_names_the_retrieval_datas_words_not_the_decoder_prompt():
    """Review 11a C3: on an encoder position runs on the shipped retrieval passages, not the decoder key-value
    instruction; a tokenizer that learnt only fruit words is checked on those passages: the reason counts their
    distinct words holding [UNK] (each word tokenized alone here) and says how to give it data it can encode."""
    from importlib.resources import files

    from tests_support import wordpiece

    tok = wordpiece(vocab_size=120, corpus=["the red fruit on the plate is a cherry ."] * 4)
    lines = (files("headscope.analyses") / "data" / "retrieval.jsonl").read_text(encoding="utf-8").splitlines()
    words = {w for r in map(json.loads, filter(str.strip, lines)) for s in (r["query"], r["relevant"], *r["distractors"])
             for w in s.split()}
    lost = [w for w in words if tok.unk_token in tok.tokenize(w)]
    assert 0 < len(lost) < len(words)
    reasons = model_reasons(needs("position"), fake_model(True, tok))
    assert len(reasons) == 1
    assert reasons[0].startswith(f"an-encoder's tokenizer maps {len(lost)} of the {len(words)} distinct words of "
                                 "position's encoder data, the shipped retrieval passages (analyses/data/retrieval.jsonl)")
    assert "Extract" not in reasons[0] and 'hs.position_bias(model, "FILE.jsonl")' in reasons[0]
    assert model_reasons(needs("position"), fake_model(True)) == []  # an English tokenizer writes them


def _retrieval_words() -> set[str]:
    from importlib.resources import files

    lines = (files("headscope.analyses") / "data" / "retrieval.jsonl").read_text(encoding="utf-8").splitlines()
    return {w for r in map(json.loads, filter(str.strip, lines)) for s in (r["query"], r["relevant"], *r["distractors"])
            for w in s.split()}


def metaspace_tokenizer(words, *, chars: bool = True):
    """A SentencePiece-style (Metaspace) Unigram tokenizer, as XLM-R's and Llama's, over these words: no piece for a
    newline, which it maps to <unk>."""
    import string

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = [(t, 0.0) for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")]
    vocab += [("\u2581" + w, -1.0) for w in sorted(words)]
    vocab += [(c, -12.0) for c in [*string.ascii_letters, *".,?'", "\u2581"] if chars]
    tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")


def test_a_metaspace_encoder_that_writes_every_retrieval_word_is_not_skipped_for_a_newline():
    """Review 19d A2: position's check joined the passages' sentences with a newline, which a Metaspace tokenizer
    maps to <unk>, and skipped position for "1 of the 493 distinct words ... ( )": the blank was the newline, no word
    of the passages (which the prompts join by a space). Now: no reason; and a word the tokenizer lacks is named."""
    from headscope.models.token_text import unknown_words

    words = _retrieval_words()
    tok = metaspace_tokenizer(words)
    assert unknown_words(tok, "the cat\nthe dog") == ["\n"]  # the tokenizer indeed has no newline
    assert model_reasons(needs("position"), fake_model(True, tok)) == []
    missing = sorted(words)[len(words) // 2]  # without single-character pieces, a word left out is <unk> whole
    reasons = model_reasons(needs("position"), fake_model(True, metaspace_tokenizer(words - {missing}, chars=False)))
    assert len(reasons) == 1 and reasons[0].startswith(
        f"an-encoder's tokenizer maps 1 of the {len(words)} distinct words of position's encoder data, the shipped "
        f"retrieval passages (analyses/data/retrieval.jsonl), to its unknown token ({missing}); "), reasons


def test_whitespace_that_becomes_unknown_is_named_visibly():
    """Review 19d C1: a reason naming a newline that became the unknown token printed a blank "( )"; it reads \\n."""
    from headscope.models.token_text import visible_word

    assert [visible_word(w) for w in ("\n", " ", "\t\r", "cat", "na\u00efve")] == ["\\n", "\\x20", "\\t\\r", "cat", "na\u00efve"]
    probe = Needs(english=True, english_text=lambda m: ("its text,", "cat\ndog", "give it other text"))
    said = model_reasons(probe, fake_model(True, metaspace_tokenizer({"cat", "dog"})))
    assert said == ["an-encoder's tokenizer maps 1 of the 2 distinct words of its text, to its unknown token (\\n); "
                    "give it other text"]


def test_check_reads_a_task_file(tmp_path, tiny_models):
    model = tiny_models["llama"]
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": f"w{i} w{i + 1}", "answer": f"w{i % 2}"} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    resolved = contract.resolve(str(path), model)
    assert resolved.tokens.tolist() == [[2, 4 + i, 5 + i] for i in range(6)]  # <bos>=2, w_i = 4 + i
    assert check(needs("patching"), str(path), model) == ["the task has no corrupted prompts"]
    assert check(needs("probes"), str(path), model) == []
