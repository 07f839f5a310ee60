"""What an encoder's analyses read of the data (review 7b, A2 and A5): a masked LM with its own small
WordPiece tokenizer, a cloze task file in the user's own columns. heads scores this masked LM at each
prompt's [MASK] through its MLM head (review 15c B1), and so does attribution: its section says it reads the
prompts and answers there, names the metric, and shows no corrupted prompt; on the shipped
sentences, which such a tokenizer splits into pieces and unknown words, the runs warn and say it."""
from __future__ import annotations

import json

import pytest
import torch

import headscope as hs
from tests_support import normal_matrices, save_random_checkpoint, wordpiece

COLOURS = {"red": "cherry", "yellow": "banana", "green": "lime", "purple": "grape"}
PLACES = ("table", "plate", "shelf")
FIELDS = {"prompt": "cloze", "answer": "fill", "corrupted_prompt": "swapped_colour", "wrong_answer": "swapped_fill"}


def cloze(colour: str, place: str, adj: str = "") -> str:
    return f"The {adj + ' ' if adj else ''}{colour} fruit on the {place} is a [MASK]."


@pytest.fixture(scope="module")
def fruit_bert(tmp_path_factory):
    """(model, task file) : a random-weight BertForMaskedLM (2 layers, d_model 32, 4 heads) whose WordPiece
    tokenizer (120 pieces) learnt only fruit sentences, and 8 cloze rows in the user's own column names."""
    from transformers import BertConfig, BertForMaskedLM

    root = tmp_path_factory.mktemp("fruit-bert")
    corpus = [cloze(c, p, a).replace("[MASK]", f) for c, f in COLOURS.items() for p in PLACES for a in ("", "small", "ripe")]
    tok = wordpiece(vocab_size=120, corpus=corpus)
    # larger random weights, so that heads change the embedding visibly
    save_random_checkpoint(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=64, pad_token_id=0),
                           root / "model", tok, model_class=BertForMaskedLM, init=normal_matrices())
    colours = list(COLOURS)
    rows = [{"cloze": cloze(c, PLACES[i % 3], "small" if i % 2 else ""), "fill": COLOURS[c],
             "swapped_colour": cloze(colours[(k + 1) % 4], PLACES[i % 3], "small" if i % 2 else ""),
             "swapped_fill": COLOURS[colours[(k + 1) % 4]]}
            for i in range(2) for k, c in enumerate(colours)]
    path = root / "fruit_cloze.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return hs.load_model(root / "model", device="cpu"), hs.TaskFile(path, FIELDS)


@pytest.fixture(scope="module")
def english_bert(tmp_path_factory):
    """A random-weight BERT like fruit_bert whose WordPiece tokenizer (2,000 pieces) learnt English, the
    shipped sentences included: a tokenizer that knows their words, as MiniLM's does."""
    from transformers import BertConfig, BertForMaskedLM

    path = tmp_path_factory.mktemp("english-bert")
    tok = wordpiece(vocab_size=2000)
    save_random_checkpoint(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=64, pad_token_id=0),
                           path, tok, model_class=BertForMaskedLM)
    return hs.load_model(path, device="cpu")


def test_heads_scores_a_masked_lm_cloze_file_at_its_mask(fruit_bert):
    """A prompt/answer cloze file on a BertForMaskedLM, each prompt holding one [MASK] (review 15c B1): heads reads
    its prompts and answers and scores the logit difference of the answer against the wrong answer at the [MASK]
    through the checkpoint's MLM head (the pooled cosine before); zero ablation checked against plain HF's
    BertForMaskedLM, each text run alone, the head zeroed at its attention output projection's input."""
    from transformers import BertForMaskedLM

    model, path = fruit_bert
    result = hs.head_importance(model, path, methods=("zero",))
    s = result.summary
    assert (s["task"], s["metric"], s["n_examples"]) == ("fruit_cloze", "logit_diff", 8)
    assert s["mask_read"] == {"mask_token": "[MASK]", "n_prompts": 8, "head": "BertForMaskedLM.cls"}
    hf = BertForMaskedLM.from_pretrained(model.source, attn_implementation="eager").eval()
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    tok = model.tokenizer

    def diffs(zero=None) -> torch.Tensor:  # [8] logit(fill) - logit(swapped_fill) at each row's [MASK]
        handles = []
        if zero is not None:
            layer, head = zero
            d_head = hf.config.hidden_size // hf.config.num_attention_heads

            def pre(module, args):
                z = args[0].clone()
                z[..., head * d_head:(head + 1) * d_head] = 0
                return (z,)

            handles.append(hf.bert.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(pre))
        out = []
        with torch.no_grad():
            for r in rows:
                enc = tok(r["cloze"], return_tensors="pt")
                at = int((enc["input_ids"][0] == tok.mask_token_id).nonzero())
                logits = hf(**enc).logits[0, at]  # [vocab]
                good, bad = (tok(r[k], add_special_tokens=False)["input_ids"][0] for k in ("fill", "swapped_fill"))
                out.append(logits[good] - logits[bad])
        for h in handles:
            h.remove()
        return torch.stack(out)

    clean = diffs()
    assert s["baseline_metric"] == pytest.approx(float(clean.mean()), abs=1e-5)
    zero = result.df.set_index(["layer", "head"])["importance"]
    for layer, head in [(0, 1), (1, 3)]:
        assert zero[(layer, head)] == pytest.approx(float((clean - diffs((layer, head))).mean()), abs=1e-5)


def test_attribution_section_reads_a_masked_lm_cloze_file_at_its_mask(fruit_bert):
    """Review 7b A2 then 15c B1: the section says what attribution used, why, and the metric, which matches its own
    numbers. On this BertForMaskedLM, each prompt holding one [MASK], that is the prompts and answers, read at the
    [MASK] through the MLM head: IG's metric at the input is plain HF's logit(fill) - logit(swapped_fill) there,
    each text run alone (the pooled embedding's cosine with the next prompt's before). No corrupted prompt is shown.
    The report's own steps (plan, run, ran_on, task_record), without its pages."""
    import dataclasses

    from transformers import BertForMaskedLM

    from headscope.analyses.attribution import AttributionConfig
    from headscope.analyses.core import runner
    from headscope.reports.provenance import provenance_lines, task_record

    model, path = fruit_bert
    plan = runner.plan_analyses(model, ["attribution"], path)["attribution"]
    assert plan.used == "your task (fruit_cloze.jsonl)"
    config = AttributionConfig(quick=True, n_examples=4, n_permutations=2, adversarial_steps=0)
    plan = dataclasses.replace(plan, config=config, resolved=runner._resolve(model, "attribution", plan, config)[0])
    outcome = runner.run_planned(model, "attribution", plan, seed=0)
    s = outcome.result.summary
    assert s["metric"] == "logit_diff" and s["mask_read"]["mask_token"] == "[MASK]"
    record = task_record(model, "attribution", runner.ran_on(model, "attribution", plan), s, plan.used, config=config)
    assert record["uses"] == "your prompts and answers; corrupted prompts are not used: attribution scores each prompt alone"
    assert "at each prompt's [MASK]" in record["metric"] and "cosine" not in record["metric"]
    lines = provenance_lines(record)
    assert "corrupted: " not in lines[-1]
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    order = plan.resolved.source_rows.tolist()
    assert sorted(order) == record["rows"]
    hf = BertForMaskedLM.from_pretrained(model.source, attn_implementation="eager").eval()
    tok = model.tokenizer
    expected = []
    with torch.no_grad():
        for r in (rows[i] for i in order):
            enc = tok(r["cloze"], return_tensors="pt")
            at = int((enc["input_ids"][0] == tok.mask_token_id).nonzero())
            logits = hf(**enc).logits[0, at]  # [vocab]
            good, bad = (tok(r[k], add_special_tokens=False)["input_ids"][0] for k in ("fill", "swapped_fill"))
            expected.append(float(logits[good] - logits[bad]))
    ig = outcome.result.tables["ig"].sort_values("example")
    assert ig["metric_input"].tolist() == pytest.approx(expected, abs=1e-5)


def heads_on_shipped_sentences(model, n: int = 8):
    """(Result, the sentences it ran on): heads' cheapest full run on its default data (the shipped
    sentences, a seeded order's first n: tasks.sentence_task's documented sample), through the registry."""
    from headscope.analyses.core.registry import get_analysis
    from headscope.analyses.core.tasks import shipped_sentences
    from headscope.analyses.heads import HeadsConfig, PruningConfig

    config = HeadsConfig(methods=("zero",), l0=None, best_head=False, n_induction=2, n_examples=n,
                         pruning=PruningConfig(n_random=1, recompute=(False,)))
    every = shipped_sentences()
    order = torch.randperm(len(every), generator=torch.Generator().manual_seed(config.seed)).tolist()
    return get_analysis("heads")(model, None, config), [every[i] for i in order[:n]]


def tokenizer_counts(tok, texts) -> tuple[float, int]:
    """(tokens a whitespace word, words holding the unknown token, each counted once a sentence), by the
    tokenizer itself."""
    words = [w for t in texts for w in t.split()]
    tokens = sum(len(tok.tokenize(t)) for t in texts)
    unknown = sum(len({w for w in t.split() if tok.unk_token in tok.tokenize(w)}) for t in texts)
    return tokens / len(words), unknown


def test_heads_on_shipped_sentences_the_tokenizer_splits_warns_and_says_so(fruit_bert, caplog):
    """Review 7b A5: heads fell back to the shipped English sentences, which this tokenizer spells nearly
    letter by letter with unknown words, and said nothing; position refused the same text. Now the log
    warns, the summary records the counts (the tokenizer's own, here), and the section and finding say it."""
    from headscope.reports.findings import finding
    from headscope.reports.provenance import task_record

    model, _ = fruit_bert
    with caplog.at_level("WARNING"):
        result, texts = heads_on_shipped_sentences(model)
    per_word, unknown = tokenizer_counts(model.tokenizer, texts)
    assert per_word > 2.5 and unknown > 0  # the case: words in pieces, and [UNK]s
    fit = result.summary["shipped_text"]
    assert fit["tokens_per_word"] == pytest.approx(per_word, abs=1e-4) and fit["unknown_words"] == unknown
    assert fit["off_distribution"] and fit["n_sentences"] == len(texts)
    said = f"split into {per_word:.1f} tokens a word with {unknown} unknown words"
    assert any(r.levelname == "WARNING" and said in r.getMessage() and r.getMessage().startswith("heads: ")
               for r in caplog.records)
    assert finding("heads", result.summary).startswith(f"The shipped sentences are {said}")
    record = task_record(model, "heads", None, result.summary, "default task")
    assert said in record["note"] and "off its training distribution" in record["note"]


def test_heads_on_shipped_sentences_a_tokenizer_knows_records_the_counts_without_a_warning(english_bert, caplog):
    with caplog.at_level("WARNING"):
        result, texts = heads_on_shipped_sentences(english_bert)
    per_word, unknown = tokenizer_counts(english_bert.tokenizer, texts)
    fit = result.summary["shipped_text"]
    assert fit["tokens_per_word"] == pytest.approx(per_word, abs=1e-4) and unknown == fit["unknown_words"] == 0
    assert per_word < 1.5 and not fit["off_distribution"] and "note" not in fit
    assert not [r for r in caplog.records if "shipped sentences" in r.getMessage()]


def test_the_sample_line_shows_the_users_prompt_as_the_file_writes_it(fruit_bert):
    """Review 11a C8: the sample was the tokenizer's decoding ('[CLS] the red fruit on the table is a [MASK]. [SEP]':
    lower-cased, the space before '.' dropped, specials added); from the user's file it is now the row as written
    (the file's own text, read here with json), prompt and answer, where the Task's first row is one of its rows."""
    from headscope.analyses.core import contract
    from headscope.analyses.core.task_files import read_numbered_rows
    from headscope.reports.provenance import task_record

    model, path = fruit_bert
    task = contract.resolve(path, model)
    lines = [json.loads(line) for line in open(path, encoding="utf-8")]
    first = lines[int(task.source_rows[0])]
    record = task_record(model, "probes", task, {}, "your task (fruit_cloze.jsonl)", user_rows=read_numbered_rows(path))
    assert record["sample"] == {"prompt": first["cloze"], "answer": first["fill"]}
    decoded = task_record(model, "probes", task, {}, "your task (fruit_cloze.jsonl)")["sample"]["prompt"]
    assert decoded != first["cloze"] and decoded.startswith("[CLS] the")  # without the rows: the decoding, as before
