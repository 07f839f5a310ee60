"""The `position` analysis: lost in the middle, attention sinks, and where attention goes.

Liu et al. 2023: move the gold item (key-value pair, document, sentence) over a grid of slots
while everything else stays fixed, and measure the answer at each slot: accuracy (greedy output
contains the gold value), answer log-probability and rank, each with a bootstrap 95% interval;
a U-shaped curve is the "lost in the middle" effect. Mechanism: per layer and head, the
attention mass from the answer position onto the gold span at each slot; heads whose mass
tracks the answer are named retrieval heads by Holm-corrected tests over examples (an example's rows
share its prompt, so the rows are not independent). Xiao et al. 2023: per layer, the
mass on the first n_sink tokens against the uniform baseline, and the metric when every layer
keeps only the sinks + a recent window versus the window alone. Encoders (MiniLM): the cosine
similarity of query and passage with the relevant sentence at each slot. Liu et al.'s no-gold
(closed-book) baseline: the same metric on each example's prompt with the gold item taken out (the
same distractors in the same order), with its 95% interval, so that a position counts as helped by
the gold item only where its interval lies above the baseline's.

Result tables: df (one row per example x position: the metrics), "curve" (metric, position,
mean, ci_low, ci_high, condition), "gold_attention" (layer, head, position, mass, visible: the share of the
gold span the answer query sees on that layer, 0 where a sliding window leaves it behind),
"sinks" (layer, sink_mass, baseline, ci_low, ci_high, ratio, sink: sinks.layer_sinks),
"heads" (layer, head, mean_mass, mass_above_others, corr_*, corr_ci_low, corr_ci_high,
n (examples), n_rows, p_corr, p_corr_holm, p_mass, p_mass_holm, retrieval; stats.head_tracking's tests,
over examples: the rows of one example are not independent), "no_gold" (one row per example: its
no-gold prompt's metrics), "baseline" (metric, mean, ci_low, ci_high, n, interval: the no-gold baseline).
summary.json: metric_per_position, ci_per_position, ratio_middle_to_ends (min of the middle
slots / max of the two ends), sink_mass_per_layer, sink_baseline_share (on a sliding-window layer, both over
the queries whose window holds the first token: sinks.sink_rows; on ALiBi what its bias alone gives, sink_baseline
"alibi", else the uniform share, "uniform"), sliding_windows ({layer: window}; decoders),
prompt_tokens (the longest prompt's tokens: a window binds, and the finding names its layer, only when shorter),
gold_masked (decoders with a sliding window: per layer the gold positions whose span the answer query does not see,
hidden, or sees only in part, partial: gold_masked), retrieval_heads (the heads
that pass retrieval_test, which has n examples and rows, and each head's r, cluster bootstrap CI over
examples, p and Holm-adjusted p), retrieval_test,
streaming (metric means under full / sinks+window / window attention; left out, with not_run saying why, where
TransformerLens discards score edits: hooks/edits.py), no_gold_baseline ({metric: mean, ci,
n, interval, and the positions above / overlapping / below it by their intervals}: no_gold_summary).
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch

from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.contract import Needs
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import describe
from headscope.analyses.position import prompts
from headscope.analyses.position import records as rec
from headscope.analyses.position.prompts import PositionSweep
from headscope.analyses.position.runs import SweepOutput, run_decoder_sweeps, run_encoder_sweeps
from headscope.analyses.position.sinks import distinct_inputs, layer_sinks, sink_rows, uniform_baseline
from headscope.analyses.position.stats import curve_table, head_tracking, middle_to_ends
from headscope.errors import ConfigError, InputTypeError
from headscope.hooks.edits import edits_discarded
from headscope.models.alibi import alibi_slopes
from headscope.models.hooked_model import layer_windows, visible_keys

TASKS = ("zoo_kv", "json_kv", "word_kv", "qa", "retrieval")
DECODER_METRICS = ("accuracy", "exact", "probability", "logprob", "rank")


# What the analysis needs from a task and a model (analyses/core/contract.py), checked before it runs.
NEEDS = Needs(answers=False, task_data=False, names=("kv", *TASKS), english=True,
              english_text=lambda model: encoder_text(model),  # defined below
              own_data=lambda model: default_data_gap(model),  # defined below
              own_records=lambda model, path, config=None: records_gap(model, path, config),  # defined below
              what="retrieval sweeps that move the gold item through the context")


@dataclass(frozen=True, kw_only=True)
class PositionConfig(AnalysisConfig):
    """Settings of the position sweep.

    sweep: "zoo_kv" (zoo models), "json_kv" (Liu et al.'s UUID key-value retrieval), "word_kv" (the
      same retrieval over words that are one token under the tokenizer), "qa" (multi-document QA over
      `data`, a JSONL file), "retrieval" (encoders; `data` or the shipped set); "auto" picks zoo_kv /
      json_kv / retrieval from the model, and word_kv where the tokenizer cannot write json_kv's
      pieces (digits and '-' of UUIDs become its unknown token).
    n_items: pairs, documents or sentences including the gold one (None: 20 for zoo_kv; for json_kv
      as many as fit the context, up to 20 (10 when quick), stated in the summary's n_items_note; 10
      for qa; for retrieval every record's distractors + 1, on the shipped passages as many of their 6 sentences
      as fit the context, in n_items_note, and skipped under 3). positions: 1-based gold slots (None: 1 and the quarters).
    context: json_kv without n_items: fill each prompt with as many pairs as fit this many tokens (at
      most the model's context, answer and greedy decoding included; long prompts, Liu et al.'s
      setting), instead of at most 20 pairs.
    n_sink: first tokens counted as sinks (None: 1, the <bos>, for zoo_kv, and the [CLS] on encoders, whose
      next tokens are the passage's words; 4 otherwise, as StreamingLLM).
    window: recent window of the StreamingLLM masks (None: half the prompt; 0: no masked runs).
    batch_size: rows per forward pass (None: all positions of an example together, examples of equal
      length packed up to 64 rows a pass).
    generate: greedy decoding for accuracy (None: only for multi-token answers).
    """

    sweep: str = "auto"
    n_items: int | None = None
    context: int | None = None
    positions: tuple[int, ...] | None = None
    query_aware: bool = False
    data: str | None = None
    n_sink: int | None = None
    window: int | None = None
    batch_size: int | None = None
    generate: bool | None = None
    n_boot: int = 1000

    QUICK: ClassVar[dict[str, Any]] = {"n_boot": 200}


def has_zoo_vocab(tokenizer: Any) -> bool:
    return all(w in tokenizer.get_vocab() for w in ("<bos>", "k00", "v00", ";"))


def sweep_kind(model: Any, task: str) -> str:
    """The sweep a PositionConfig.sweep name stands for on this model ("auto" picks one)."""
    if task == "auto":
        if model.facts.is_encoder:
            return "retrieval"
        if has_zoo_vocab(model.tokenizer):
            return "zoo_kv"
        return "json_kv" if json_kv_reason(model) is None else "word_kv"
    if task not in TASKS:
        raise ConfigError(f"unknown position task {task!r}; use one of {('auto', *TASKS)}.")
    if (task == "retrieval") != model.facts.is_encoder:
        kind = "an encoder" if model.facts.is_encoder else "a decoder"
        raise ConfigError(f"task {task!r} does not fit {model.facts.name}, {kind}; "
                          "use 'retrieval' for encoders and a kv or qa task for decoders.")
    return task


def json_kv_reason(model: Any) -> str | None:
    """Why the default json_kv prompt cannot be used on this decoder, in words, or None: the tokenizer cannot write
    it (prompts.json_kv_gap), or not even its smallest prompts fit the context (review 15c A3's decoder case: a
    tokenizer of long pieces and a context of 64 failed with ConfigError); word_kv then stands in for it."""
    gap = prompts.json_kv_gap(model.tokenizer)
    if gap is not None:
        return f"Liu et al.'s key-value prompt with UUID keys, which this tokenizer cannot write ({gap})"
    floor = prompts.kv_floor_tokens(model.tokenizer, getattr(model, "prepends_bos", True))
    if floor > int(model.facts.n_ctx):
        return (f"Liu et al.'s key-value prompt, which does not fit the context of {model.facts.n_ctx}: its smallest, 2 "
                f"pairs of 4 hex digits without the instruction, takes {floor} tokens with the answer and greedy "
                "decoding")
    return None


def encoder_text(model: Any) -> tuple[str, str, str] | None:
    """(what, text, how to run on other data) of the data position runs on an encoder, the shipped
    retrieval passages (queries, relevant and distractor sentences), for contract.model_reasons' check
    of unknown words; None on decoders, whose default data needs no English (review 17b C2: a tokenizer that maps
    "JSON" to its unknown token was skipped, though word_kv, over its own one-token words, stands in where it cannot
    write the key-value prompt; default_data_gap says where neither fits)."""
    if not model.facts.is_encoder:
        return None
    records = rec.load_retrieval_records()
    # joined by a space, as the passages are (a newline is no word of them, and a Metaspace tokenizer has no piece for
    # it: review 19d A2 found position skipped for a "\n" it never runs on)
    text = " ".join(s for r in records for s in (r["query"], r["relevant"], *r["distractors"]))
    return ("position's encoder data, the shipped retrieval passages (analyses/data/retrieval.jsonl),", text,
            "give it retrieval records it can encode (a JSONL file, one object a line with query, relevant and "
            "distractors) through `headscope position --model M --task FILE.jsonl` or "
            "`hs.position_bias(model, \"FILE.jsonl\")`; a prompt/answer task file cannot stand in, position reads only "
            "its own records")


RECORDS_CHECKED = 200  # a records file's first rows read by the check before a run (the report's task-file check's)


def records_gap(model: Any, path: str, config: PositionConfig | None = None) -> str | None:
    """Why the JSONL file `path` of position's own records does not fit this model, in one line (None when it
    does): an encoder reads retrieval records, a decoder multi-document QA records, each through the loader the run
    uses (records.load_retrieval_records / load_qa_records). A file whose first record lacks any of both kinds' fields
    (records.first_fields, json alone: no datasets cache, no Arrow types) is a prompt/answer task, which position does
    not read (the contract's usual reason; where that record has two or more of one kind's fields, the ones it lacks).
    The contract's Needs.own_records: `headscope position --task FILE.jsonl` stops here, before any work, on a file
    that does not fit. The records are then built into the run's sweeps at `config`'s n_items (None: the default;
    each record has enough distractors, text the tokenizer can encode), on the records the run reads (config's
    examples) or, without a config, on the first RECORDS_CHECKED."""
    from headscope.errors import HeadscopeError

    try:
        fields = rec.first_fields(path)
        if fields == set():
            return f"{Path(path).name} holds no records"
        if rec.records_kind(fields) is None:  # a prompt/answer task, not records
            return (f"it runs on its own data ({NEEDS.what}), not on prompt/answer tasks; a file of its own records "
                    f"holds one JSON object a line with {', '.join(rec.RETRIEVAL_FIELDS)} (encoders) or "
                    f"{', '.join(rec.QA_FIELDS)} (decoders)" + _partial_records(Path(path).name, fields, model))
        load = rec.load_retrieval_records if model.facts.is_encoder else rec.load_qa_records
        if not load(path, RECORDS_CHECKED):
            return f"{Path(path).name} holds no records"
        checked = PositionConfig(n_examples=RECORDS_CHECKED) if config is None else replace(
            config, n_examples=config.examples(32, 8), progress=False)  # build_sweeps' count: its distractor pool
        _, sweeps, _, _ = _sweeps(model, path, checked)
        longest = context_gap(model, sweeps)
        if longest:
            return longest
    except HeadscopeError as err:
        return str(err).rstrip(".")
    return None


def _partial_records(name: str, fields: set[str] | None, model: Any) -> str:
    """'; NAME's first record has query, relevant but not distractors' where it has two or more of one kind's fields
    (the model's own kind first), '' otherwise (one shared name, a "question" column say, is a prompt/answer task's)."""
    if fields is None:
        return f"; the first line of {name} is not a JSON object"
    kinds = (rec.RETRIEVAL_FIELDS, rec.QA_FIELDS) if model.facts.is_encoder else (rec.QA_FIELDS, rec.RETRIEVAL_FIELDS)
    for kind in kinds:
        has = [f for f in kind if f in fields]
        if len(has) >= 2:
            return f"; the first record of {name} has {', '.join(has)} but not {', '.join(f for f in kind if f not in fields)}"
    return ""


def context_gap(model: Any, sweeps: Sequence[PositionSweep]) -> str | None:
    """Why records' sweeps do not fit the model's context (None when they do): on a decoder a prompt with its answer
    and greedy decoding's extra tokens (prompts.sweep_tokens), on an encoder a passage; the longest record named."""
    n_ctx = int(model.facts.n_ctx)
    sizes = [sw.prompt_len if model.facts.is_encoder else prompts.sweep_tokens([sw]) for sw in sweeps]
    if max(sizes) <= n_ctx:
        return None
    i = sizes.index(max(sizes))
    what = "its passage" if model.facts.is_encoder else "its prompt with the answer and greedy decoding's 8 more tokens"
    return (f"record {i + 1}'s {sweeps[i].n_items} items take {max(sizes)} tokens ({what}), more than "
            f"{model.facts.name}'s context of {n_ctx}; lower --n-items or give shorter documents")


def default_data_gap(model: Any) -> str | None:
    """Why no default sweep can be built for this model's tokenizer (contract.Needs.own_data: the analysis is then
    skipped with this reason, not failed), or None: zoo vocabularies have zoo_kv, a tokenizer that writes Liu et
    al.'s JSON prompt json_kv, any other word_kv when MIN_FIT_PAIRS pairs of its one-token words fit."""
    if model.facts.is_encoder:
        return shipped_retrieval_gap(model)
    if has_zoo_vocab(model.tokenizer):
        return None
    why = json_kv_reason(model)
    if why is None:
        return None
    words = prompts.vocab_words(model.tokenizer, model.facts.d_vocab)
    if prompts.fit_word_pairs(len(words), model.facts.n_ctx, 20) >= prompts.MIN_FIT_PAIRS:
        return None
    gap = prompts.json_kv_gap(model.tokenizer)
    route = ("; give it multi-document QA records it can encode, a JSONL file of one object a line with "
             f"{', '.join(rec.QA_FIELDS)}, through `headscope position --model M --task QA.jsonl` (a prompt/answer "
             "task file cannot stand in: position reads only its own records)")
    if gap is None:  # it writes the prompt, which does not fit the context
        floor = prompts.kv_floor_tokens(model.tokenizer, getattr(model, "prepends_bos", True))
        return (f"position's default data does not fit the context of {model.facts.n_ctx}: Liu et al.'s key-value "
                f"prompt takes {floor} tokens at its smallest (2 pairs of 4 hex digits without the instruction, with "
                f"the answer and greedy decoding), and {prompts.MIN_FIT_PAIRS} key-value pairs of this tokenizer's "
                f"{len(words)} one-token words do not fit either{route}")
    return (f"this tokenizer cannot write position's default data, Liu et al.'s key-value prompt with UUID keys "
            f"({gap}), and has {len(words)} words that are one token, too few for "
            f"{prompts.MIN_FIT_PAIRS} key-value pairs of its own words in its context of {model.facts.n_ctx}{route}")


def shipped_retrieval_fit(model: Any) -> tuple[int, dict[int, int]]:
    """(the most sentences a passage, the relevant one included, at which every shipped retrieval passage fits the
    encoder's context, 0 where not even 2 do; records.retrieval_lengths over all shipped records, so that a quick
    and a full run read passages of one length). Cached per tokenizer."""
    lengths = prompts._memo(model.tokenizer, ("retrieval_lengths",),
                            lambda: rec.retrieval_lengths(model.tokenizer, rec.load_retrieval_records()))
    return max((n for n, size in lengths.items() if size <= int(model.facts.n_ctx)), default=0), lengths


def shipped_retrieval_gap(model: Any) -> str | None:
    """Why the shipped retrieval passages do not fit this encoder's context (review 15c A3: the run failed with
    ContextLengthError), or None: not even prompts.MIN_FIT_PAIRS sentences a passage (a middle slot) fit."""
    from headscope.errors import HeadscopeError

    try:
        n, lengths = shipped_retrieval_fit(model)
    except HeadscopeError as err:  # a sentence the tokenizer cannot encode (the contract's word check says which)
        return str(err).rstrip(".")
    if n >= prompts.MIN_FIT_PAIRS:
        return None
    fewest = prompts.MIN_FIT_PAIRS
    return (f"the shipped retrieval passages do not fit {model.facts.name}'s context of {model.facts.n_ctx} tokens: "
            f"{fewest} sentences a passage (the fewest with a middle slot) take up to {lengths[fewest]} tokens under "
            "this tokenizer; give it retrieval records of shorter sentences (a JSONL file, one object a line with "
            "query, relevant and distractors) through `headscope position --model M --task FILE.jsonl`")


def build_sweeps(model: Any, config: PositionConfig) -> list[PositionSweep]:
    """The default sweeps of `config.sweep` for this model's tokenizer."""
    task, tok, cfg = sweep_kind(model, config.sweep), model.tokenizer, config
    n_examples = cfg.examples(32, 8)
    common = dict(positions=cfg.positions, seed=cfg.seed, query_aware=cfg.query_aware,
                  prepend_bos=model.prepends_bos)  # the BOS as to_tokens would put it
    if task == "zoo_kv":
        return prompts.zoo_kv_sweeps(tok, n_pairs=cfg.n_items or 20, n_examples=n_examples, **common)
    if task == "json_kv":
        if cfg.context is not None and cfg.context < 16:
            raise ConfigError(f"context must be at least 16 tokens, got {cfg.context}.")
        n_ctx = min(cfg.context or model.facts.n_ctx, model.facts.n_ctx)
        if cfg.n_items is not None:  # the pairs as set, in the longest format that fits (a budget's cut keeps the fit's)
            return prompts.kv_sweeps_in_context(tok, n_ctx, n_pairs=cfg.n_items, n_examples=n_examples, **common)
        if cfg.context is not None:
            return prompts.fit_kv_sweeps(tok, n_ctx, max_pairs=max(20, n_ctx // 12), n_examples=n_examples, **common)
        return prompts.fit_kv_sweeps(tok, model.facts.n_ctx, max_pairs=10 if cfg.quick else 20, n_examples=n_examples,
                                     **common)
    if task == "word_kv":
        words = prompts.vocab_words(tok, model.facts.d_vocab)
        n_pairs = cfg.n_items or prompts.fit_word_pairs(len(words), model.facts.n_ctx, 10 if cfg.quick else 20)
        if n_pairs < prompts.MIN_FIT_PAIRS:
            raise ConfigError(default_data_gap(model) or f"word_kv needs {prompts.MIN_FIT_PAIRS} pairs or more, got {n_pairs}.")
        return prompts.word_kv_sweeps(tok, words, n_pairs=n_pairs, n_examples=n_examples, **common)
    if task == "qa":
        if cfg.data is None:
            raise ConfigError("task 'qa' needs data= a JSONL file of multi-document QA records (see load_qa_records).")
        records = rec.load_qa_records(cfg.data, n_examples)
        return rec.qa_sweeps(tok, records, n_docs=cfg.n_items or 10, **common)
    records = rec.load_retrieval_records(cfg.data, n_examples)
    n_distractors = None if cfg.n_items is None else cfg.n_items - 1
    if cfg.data is None and cfg.n_items is None:  # the shipped passages: as many sentences as fit the context
        n, _ = shipped_retrieval_fit(model)
        if n < prompts.MIN_FIT_PAIRS:
            raise ConfigError(f"{shipped_retrieval_gap(model)}.")
        n_distractors = n - 1
    return rec.retrieval_sweeps(tok, records, n_distractors=n_distractors, positions=cfg.positions)


def gold_visible(span: Sequence[int], prompt_len: int, window: int | None) -> float:
    """The share of the gold span [a, b) that the answer query (the prompt's last token) sees on a layer with sliding
    window `window` (models.visible_keys; None: a global layer, every earlier key): 0 where the window leaves the whole
    span behind, so the layer's gold mass there is 0 by the mask, not measured (review 14c B1)."""
    a, b = int(span[0]), int(span[1])
    if b <= a:
        return float("nan")
    return float(visible_keys(prompt_len - 1, torch.arange(a, b), window).double().mean())


def _frames(sweeps: Sequence[PositionSweep], outs: Sequence[SweepOutput],
            windows: Sequence[int | None] = ()) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Tidy observations (example, position, metrics), masked observations and gold-mass rows (with `visible`, the
    share of the gold span the answer query sees on that layer, gold_visible; `windows`: models.layer_windows, none
    on an encoder, whose every query sees every key)."""
    obs, masked, gold = [], [], []
    for ex, (sw, out) in enumerate(zip(sweeps, outs)):
        for i, pos in enumerate(sw.positions):
            obs.append({"example": ex, "position": pos, **{k: float(v[i]) for k, v in out.metrics.items()}})
            for cond, metrics in out.masked.items():
                masked.append({"condition": cond, "example": ex, "position": pos, **{k: float(v[i]) for k, v in metrics.items()}})
            n_layers, n_heads = out.gold_mass.shape[1:]
            seen = [gold_visible(sw.gold_spans[i].tolist(), sw.prompt_len, windows[layer] if layer < len(windows) else None)
                    for layer in range(n_layers)]  # [layer]
            gold += [{"example": ex, "position": pos, "layer": layer, "head": head, "mass": float(out.gold_mass[i, layer, head]),
                      "visible": seen[layer]} for layer in range(n_layers) for head in range(n_heads)]
    obs_df, masked_df = pd.DataFrame(obs), pd.DataFrame(masked)
    for df in (obs_df, masked_df):
        if "logprob" in df:
            df.insert(df.columns.get_loc("logprob"), "probability", df["logprob"].map(math.exp))
    return obs_df, masked_df, pd.DataFrame(gold)


def _no_gold_frame(outs: Sequence[SweepOutput]) -> pd.DataFrame:
    """One row per example with a no-gold prompt: example and its metrics (probability from logprob)."""
    df = pd.DataFrame([{"example": ex, **{k: float(v.reshape(-1)[0]) for k, v in out.no_gold.items()}}
                       for ex, out in enumerate(outs) if out.no_gold], columns=None if any(o.no_gold for o in outs)
                      else ["example"])  # a CSV with its header even when no sweep had a no-gold prompt
    if "logprob" in df:
        df.insert(df.columns.get_loc("logprob"), "probability", df["logprob"].map(math.exp))
    return df


def no_gold_table(no_gold: pd.DataFrame, metrics: Sequence[str], *, n_boot: int, seed: int) -> pd.DataFrame:
    """The no-gold baseline per metric: [metric, mean, ci_low, ci_high, n, interval], over examples with the
    curve's own intervals (stats.curve_table: exact for 0/1 metrics, bootstrap otherwise); empty without rows."""
    columns = ["metric", "mean", "ci_low", "ci_high", "n", "interval"]
    if no_gold.empty:
        return pd.DataFrame(columns=columns)
    table = curve_table(no_gold.assign(position=0), [m for m in metrics if m in no_gold], n_boot=n_boot, seed=seed)
    return table[columns].reset_index(drop=True)


def no_gold_summary(baseline: pd.DataFrame, curve: pd.DataFrame) -> dict[str, Any]:
    """summary["no_gold_baseline"]: per metric the no-gold mean, its 95% interval, n and the interval's kind, and
    the gold positions whose full-context interval lies above it ("above": ci_low > the baseline's ci_high), below
    it ("below") or overlaps it ("overlap"): a position beats the no-gold prompt only when the intervals separate
    (REFERENCES "Claims a reviewer accepts"). {} when no sweep had a no-gold prompt."""
    out: dict[str, Any] = {}
    full = curve[curve["condition"] == "full"]
    for r in baseline.itertuples():
        lo, hi = float(r.ci_low), float(r.ci_high)
        sides: dict[str, list[int]] = {"above": [], "overlap": [], "below": []}
        for c in full[full["metric"] == r.metric].sort_values("position").itertuples():
            side = "above" if c.ci_low > hi else "below" if c.ci_high < lo else "overlap"
            sides[side].append(int(c.position))
        out[str(r.metric)] = {"mean": _clean(float(r.mean)), "ci": [_clean(lo), _clean(hi)], "n": int(r.n),
                              "interval": str(r.interval), **sides}
    return {"no_gold_baseline": out} if out else {}


def _window(cfg: PositionConfig, prompt_len: int) -> int | None:
    """The StreamingLLM window for a prompt length: cfg.window, half the prompt when None, no masks when 0."""
    return prompt_len // 2 if cfg.window is None else (cfg.window or None)


def _streaming_idle(model: Any, cfg: PositionConfig, sweeps: Sequence[PositionSweep]) -> str | None:
    """Review 17c C6: why the StreamingLLM masks would change nothing, or None. Where every layer already slides over
    at most as many keys as the streaming window, the window keeps every key the model sees and the sinks it adds lie
    outside the model's own window: full, sinks + window and window alone are one computation."""
    windows = layer_windows(model)
    stream = sorted({w for w in (_window(cfg, sw.prompt_len) for sw in sweeps) if w})
    if not stream or not windows or not all(windows) or stream[0] < max(windows):
        return None
    said = f"{stream[0]}" if len(stream) == 1 else f"{stream[0]}-{stream[-1]}"
    return (f"the streaming (sinks + window) masks: every layer already slides over {max(windows)} keys, no more than "
            f"the streaming window ({said} keys), which keeps every key the model sees, and the sinks it adds lie "
            "outside the model's own window, so masking would change nothing by construction")


def _clean(x: Any) -> Any:
    """NaN -> None so that summary.json stays valid JSON."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _config_for_task(model: Any, task: str, cfg: PositionConfig) -> PositionConfig:
    """cfg with the sweep a task name stands for: "kv", a sweep name, or a JSONL file (qa/retrieval)."""
    if task == "kv":
        return replace(cfg, sweep=sweep_kind(model, "auto") if not model.facts.is_encoder else "json_kv")
    if task in TASKS:
        return replace(cfg, sweep=task)
    if Path(task).suffix in (".jsonl", ".json"):
        return replace(cfg, sweep="retrieval" if model.facts.is_encoder else "qa", data=task)
    raise ConfigError(f"the position analysis runs on 'kv', one of {TASKS} or a JSONL file, not {task!r}.")


@names_source
def position_bias(model: Any, task: str | Sequence[PositionSweep] | None = None, config: PositionConfig | None = None,
                  **config_overrides: Any) -> Result:
    """Run the sweep and return the position Result (module docstring). task: None (the sweep of
    config.sweep), "kv", a sweep name, a JSONL file (multi-document QA; retrieval for encoders),
    or a list of PositionSweep. config_overrides are fields of PositionConfig (seed=1, n_boot=200)."""
    cfg = configure(PositionConfig, config, config_overrides, name="position_bias")
    cfg, sweeps, task, fitted = _sweeps(model, task, cfg)
    encoder = model.facts.is_encoder
    not_run = None if encoder or cfg.window == 0 else edits_discarded(model, "scores")
    if not_run:  # review 16d A6: the StreamingLLM masks would mask nothing; the sweep runs without them
        cfg = replace(cfg, window=0)
        not_run = f"the streaming (sinks + window) masks: {not_run}, so masking would change nothing"
    if not not_run and not encoder:
        not_run = _streaming_idle(model, cfg, sweeps)
        cfg = replace(cfg, window=0) if not_run else cfg
    n_sink = cfg.n_sink or (1 if task == "zoo_kv" or encoder else 4)  # an encoder's sink is its [CLS], the first token
    if encoder:
        outs = run_encoder_sweeps(model, sweeps, n_sink=n_sink, batch_size=cfg.batch_size, progress=cfg.progress)
    else:
        outs = run_decoder_sweeps(model, sweeps, n_sink=n_sink, window=lambda n: _window(cfg, n), batch_size=cfg.batch_size,
                                  generate=cfg.generate, progress=cfg.progress)
    windows = layer_windows(model)  # a sliding-window layer sees only its last keys: gold spans behind it, sink shares
    obs, masked, gold = _frames(sweeps, outs, () if encoder else windows)
    metrics = ("cosine",) if encoder else DECODER_METRICS
    curve = [curve_table(obs, metrics, n_boot=cfg.n_boot, seed=cfg.seed)]
    for cond, group in (masked.groupby("condition", sort=False) if len(masked) else ()):
        curve.append(curve_table(group, [m for m in metrics if m in group], n_boot=cfg.n_boot, seed=cfg.seed, condition=cond))
    curve_df = pd.concat(curve, ignore_index=True)
    no_gold = _no_gold_frame(outs)
    no_gold_base = no_gold_table(no_gold, metrics, n_boot=cfg.n_boot, seed=cfg.seed)  # Liu et al.'s closed book

    gold_attention = gold.groupby(["layer", "head", "position"], as_index=False)[["mass", "visible"]].mean()
    sink_by_layer = [float(x) for x in _layer_means([o.sink_mass for o in outs])]
    # over the rows each layer's mass averages (on a sliding-window layer those that see the first token)
    slopes = alibi_slopes(model)  # ALiBi: the baseline is what its bias alone gives the sinks (review 16c B1)
    uniform = torch.tensor([[uniform_baseline(sw.prompt_len, n_sink, causal=not encoder, window=w,
                                              rows=sink_rows(sw.prompt_len, n_sink, w, causal=not encoder), slopes=slopes)
                             for w in windows] for sw in sweeps], dtype=torch.float64)  # [examples, layer]
    baseline = float(uniform.mean())
    flat = None if slopes is None or encoder else torch.tensor(  # the uniform share beside ALiBi's, for the words
        [[uniform_baseline(sw.prompt_len, n_sink, window=w, rows=sink_rows(sw.prompt_len, n_sink, w)) for w in windows]
         for sw in sweeps], dtype=torch.float64)
    # review 17c B1: examples whose measured queries read the same tokens are copies of one input, not samples
    read = [sink_rows(sw.prompt_len, n_sink, w, causal=not encoder) for sw in sweeps for w in windows]
    rows_of = [[read[i * len(windows) + j] for i in range(len(sweeps))] for j in range(len(windows))]  # [layer][example]
    grouped = [distinct_inputs([sw.tokens for sw in sweeps], r) for r in rows_of]
    groups = torch.tensor([g for g, _ in grouped]).T  # [examples, layer]
    reads = [max(int(r.max()) + 1 for r in rs) for rs in rows_of]
    learned = not encoder and all(o.keys_mass is not None for o in outs)  # review 19b B1: learned sinks (GPT-OSS)
    if learned:  # the baseline: the uniform share of the mass that reaches the keys; the plain share beside it
        flat = uniform
        uniform = torch.stack([o.keys_baseline.double().mean((0, 2)) for o in outs])  # [examples, layer]
        baseline = float(uniform.mean())
    per_layer = layer_sinks(torch.stack([o.sink_mass.double().mean((0, 2)) for o in outs]),  # [examples, layer]
                            uniform, flat, None if encoder else groups, None if encoder else reads,  # kv's sink criterion
                            keys=torch.stack([o.keys_mass.double().mean((0, 2)) for o in outs]) if learned else None)
    sinks = pd.DataFrame({"layer": range(len(sink_by_layer)), "sink_mass": sink_by_layer,
                          "baseline": [e["baseline"] for e in per_layer],
                          "ci_low": [(e["ci"] or [math.nan])[0] for e in per_layer],
                          "ci_high": [(e["ci"] or [math.nan, math.nan])[1] for e in per_layer],
                          "ratio": [e["ratio"] for e in per_layer], "sink": [e["sink"] for e in per_layer],
                          **({} if encoder else {"n_distinct": [e["n_distinct"] for e in per_layer]})})
    span_share = float(sum(float((sw.gold_spans[:, 1] - sw.gold_spans[:, 0]).float().mean()) / sw.prompt_len
                           for sw in sweeps) / len(sweeps))
    heads, tracked = head_tracking(gold, obs, metrics=("cosine",) if encoder else ("accuracy", "logprob"),
                                   span_share=span_share, n_boot=cfg.n_boot, seed=cfg.seed)
    summary = {
        "task": task,
        "n_examples": len(sweeps),
        "n_items": sweeps[0].n_items,
        "positions": list(sweeps[0].positions),
        **_curve_summary(curve_df, encoder),
        **no_gold_summary(no_gold_base, curve_df),
        "sink_mass_per_layer": sink_by_layer,
        "sink_baseline_share": baseline,
        "sink_baseline": ("keys" if learned else  # review 19b B1: uniform over the mass that reaches the keys
                          "alibi" if slopes is not None and not encoder else "uniform"),  # what that baseline is
        "sinks": per_layer,
        "n_sink": n_sink,
        # review 19c B2: the layers without rotary (NoPE), which the sink and retrieval-head sentences name
        **({"nope_layers": list(model.facts.nope_layers)} if getattr(model.facts, "nope_layers", ()) else {}),
        # {layer: window} of the sliding-window layers, whose sink mass averages the queries that see the first token
        **({} if encoder else {"sliding_windows": {str(k): w for k, w in enumerate(windows) if w is not None}}),
        "prompt_tokens": max(sw.prompt_len for sw in sweeps),  # the longest prompt: a window binds only below it
        **({"gold_masked": gold_masked(gold_attention)} if not encoder and windows and any(windows) else {}),
        **({"sink_label": sink_label(model, sweeps, n_sink)} if encoder else {}),
        "retrieval_heads": [[int(r.layer), int(r.head)]
                            for r in heads[heads["retrieval"]].sort_values(f"corr_{tracked}", ascending=False).itertuples()],
        "retrieval_tracked_metric": tracked,
        "retrieval_test": _retrieval_test(heads, tracked),
        "query_aware": cfg.query_aware,
    }
    summary.update(_extras(model, cfg, sweeps, obs, masked, task=task, fitted=fitted))
    if not_run:
        summary["not_run"] = not_run
    return Result(
        name="position", df=obs, summary=summary,
        tables={"curve": curve_df, "gold_attention": gold_attention, "sinks": sinks, "heads": heads, "masked": masked,
                "no_gold": no_gold, "baseline": no_gold_base},
        config={**{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}, "task": task, "n_sink": n_sink},
    )


def gold_masked(gold_attention: pd.DataFrame) -> dict[str, Any]:
    """summary["gold_masked"] (review 14c B1): per sliding-window layer where the answer query misses gold spans,
    {layer: {"hidden": gold positions where it sees none of the span in any example (the mass there is 0 by the
    mask), "partial": positions where it sees only part of it in some}}; {} where every span is in view."""
    out: dict[str, Any] = {}
    per = gold_attention.groupby(["layer", "position"])["visible"].mean()  # [layer x position] share seen
    for layer, shares in per.groupby(level="layer"):
        shares = shares.droplevel("layer")
        hidden = [int(p) for p, v in shares.items() if v == 0]
        partial = [int(p) for p, v in shares.items() if 0 < v < 1]
        if hidden or partial:
            out[str(int(layer))] = {"hidden": hidden, "partial": partial}
    return out


def sink_label(model: Any, sweeps: Sequence[PositionSweep], n_sink: int) -> str:
    """What an encoder's sink counts, in words: "[CLS] (the first token)", or with n_sink > 1 "the first 4 tokens
    ([CLS] and the passage's first 3)", where every prompt starts with the same token (else "the first token")."""
    firsts = {int(sw.tokens[i, 0]) for sw in sweeps for i in range(sw.tokens.shape[0])}
    first = model.tokenizer.convert_ids_to_tokens(firsts.pop()) if len(firsts) == 1 else None
    if n_sink == 1:
        return f"{first} (the first token)" if first else "the first token"
    return f"the first {n_sink} tokens" + (f" ({first} and the passage's first {n_sink - 1})" if first else "")


def _retrieval_test(heads: pd.DataFrame, tracked: str) -> dict[str, Any]:
    """The retrieval-head test for the summary (stats.head_tracking): n examples (the unit of every test
    and interval) and n rows, the correction, how many heads were tested, and r, its cluster bootstrap 95%
    CI, p and Holm-adjusted p of each head that passes."""
    def ci(r: Any) -> list[float] | None:
        low, high = float(r.corr_ci_low), float(r.corr_ci_high)
        return [low, high] if math.isfinite(low) and math.isfinite(high) else None

    passed = heads[heads["retrieval"]].sort_values(f"corr_{tracked}", ascending=False)
    return {
        "n_examples": int(heads["n"].max()) if len(heads) else 0,
        "n_rows": int(heads["n_rows"].max()) if len(heads) else 0, "n_heads": int(len(heads)), "alpha": 0.05,
        "correction": "holm", "unit": "example",
        "tests": "Pearson r > 0 (two-sided test of the metric's slope on the mass with the CR2 cluster-robust "
                 "variance over examples and Imbens-Kolesar degrees of freedom) and gold-span mass above the other "
                 "heads' mean (one-sided t test across examples of each example's mean difference), each "
                 "Holm-corrected across heads",
        "interval": "percentile bootstrap over examples (each with all its rows)",
        "heads": [{"layer": int(r.layer), "head": int(r.head), "r": float(getattr(r, f"corr_{tracked}")),
                   "ci": ci(r), "n": int(r.n), "n_rows": int(r.n_rows),
                   "p": float(r.p_corr), "p_holm": float(r.p_corr_holm), "p_mass": float(r.p_mass),
                   "p_mass_holm": float(r.p_mass_holm)}
                  for r in passed.itertuples()],
    }


def _sweeps(model: Any, task: Any, cfg: PositionConfig) -> tuple[PositionConfig, list[PositionSweep], str, bool]:
    """(the config for `task`, its sweeps, the task kind reported, whether the pairs were fitted to the context)."""
    sweeps = None
    if isinstance(task, os.PathLike):
        task = os.fspath(task)
    if isinstance(task, str):
        cfg = _config_for_task(model, task, cfg)
    elif task is not None:
        if not isinstance(task, (list, tuple)) or not all(isinstance(s, PositionSweep) for s in task):
            raise InputTypeError(f"position takes 'kv', a sweep name ({', '.join(TASKS)}), a JSONL file or a list of "
                                 f"PositionSweep (analyses.position.prompts); got {describe(task)}.")
        sweeps = list(task)
    kind = sweep_kind(model, cfg.sweep) if sweeps is None else ("retrieval" if model.facts.is_encoder else "custom")
    fitted = sweeps is None and cfg.n_items is None and (  # pairs (shipped passages' sentences) chosen to fit
        kind == "json_kv" or (kind == "retrieval" and cfg.data is None))
    sweeps = build_sweeps(model, cfg) if sweeps is None else list(sweeps)
    if not sweeps:
        raise ConfigError("position_bias got no sweeps; pass n_examples >= 1 or a non-empty list of PositionSweep.")
    return cfg, sweeps, kind, fitted


def _curve_summary(curve_df: pd.DataFrame, encoder: bool) -> dict[str, Any]:
    """The full-context curve per metric and position (means, 95% intervals) and its middle-to-ends ratios."""
    full = curve_df[curve_df["condition"] == "full"]
    per_pos = {m: {str(p): _clean(v) for p, v in zip(g["position"], g["mean"])} for m, g in full.groupby("metric", sort=False)}
    ci = {m: {str(p): [_clean(lo), _clean(hi)] for p, lo, hi in zip(g["position"], g["ci_low"], g["ci_high"])}
          for m, g in full.groupby("metric", sort=False)}
    ratio_metrics = ("cosine",) if encoder else ("accuracy", "probability")
    ratios = {m: middle_to_ends({int(p): v for p, v in per_pos[m].items()}) for m in ratio_metrics}
    return {"primary_metric": ratio_metrics[0], "metric_per_position": per_pos, "ci_per_position": ci,
            "ratio_middle_to_ends": {k: _clean(v) for k, v in ratios.items()}}


def _extras(model: Any, cfg: PositionConfig, sweeps: Sequence[PositionSweep], obs: pd.DataFrame, masked: pd.DataFrame,
            *, task: str, fitted: bool) -> dict[str, Any]:
    """The summary's optional parts: chance (decoders), the fitted-context note, streaming windows."""
    out: dict[str, Any] = {}
    if not model.facts.is_encoder and "accuracy" in obs:  # chance: copying one of the context's n_items values
        from headscope.analyses.core import chance

        per_example = obs.groupby("example")["accuracy"].mean().to_numpy()  # [examples], over positions
        entry = chance.assess(per_example, "accuracy", n_classes=sweeps[0].n_items, bounds=(0.0, 1.0))  # shares
        out["chance"] = chance.with_basis(entry, task=task, n_classes=sweeps[0].n_items)
        if out["chance"] is not None:  # greedy output scored by containing the value: chance is copying one of them
            out["chance"]["classes_from"] = "context"
            copied = obs["copied"].dropna() if "copied" in obs else obs["accuracy"].iloc[:0]
            out["chance"] = chance.copy_task(  # does it copy any value at all? (review 10b A2)
                out["chance"], outputs=len(obs), gold=int(obs["accuracy"].sum()),
                copied=int(copied.sum()) if len(copied) == len(obs) else None)
    if task == "word_kv":
        out["data_note"] = word_kv_note(model, sweeps)
    fill = model.facts.n_ctx if cfg.context is None else min(cfg.context, model.facts.n_ctx)
    if fitted and model.facts.is_encoder:
        note = retrieval_fit_note(model, sweeps)
        out.update({"n_items_note": note, "data_note": note} if note else {})  # data_note: the provenance's note line
    elif fitted:
        out["n_items_note"] = prompts.kv_fit_note(model.tokenizer, sweeps, fill)
    elif task == "json_kv" and cfg.n_items is not None and not prompts.is_liu_format(model.tokenizer, sweeps):
        out["n_items_note"] = prompts.kv_fit_note(model.tokenizer, sweeps, fill, asked=True)
    if len(masked):
        windows = sorted({_window(cfg, sw.prompt_len) for sw in sweeps})
        out["streaming"] = {
            "window": windows[0] if len(windows) == 1 else windows,
            **{m: {"full": _clean(float(obs[m].mean())),
                   **{c: _clean(float(g[m].mean())) for c, g in masked.groupby("condition")}}
               for m in ("logprob", "exact")},
        }
    return out


def retrieval_fit_note(model: Any, sweeps: Sequence[PositionSweep]) -> str | None:
    """The summary's n_items_note where the shipped passages were cut to fit the context ("4 of the shipped 6
    sentences a passage ..."), None where every sentence fits."""
    n, lengths = shipped_retrieval_fit(model)
    most = max(lengths)
    if sweeps[0].n_items >= most:
        return None
    return (f"n_items chosen to fit context {model.facts.n_ctx}: {sweeps[0].n_items} of the shipped {most} sentences "
            f"a passage (the relevant one and each record's first {sweeps[0].n_items - 1} distractors); all {most} "
            f"take up to {lengths[most]} tokens under this tokenizer")


def word_kv_note(model: Any, sweeps: Sequence[PositionSweep]) -> str:
    """The section's account of a word_kv sweep: what it is and, where it stood in for the default, why."""
    gap, reason = prompts.json_kv_gap(model.tokenizer), json_kv_reason(model)
    why = (f", instead of Liu et al.'s JSON prompt with UUID keys, which this tokenizer cannot write ({gap})" if gap
           else f", instead of {reason}" if reason else "")
    sep = model.tokenizer.decode([int(sweeps[0].tokens[0, -2])]).strip()  # the tail is [separator, key]
    return (f"key-value retrieval over {sweeps[0].n_items} pairs of words that are one token under this tokenizer "
            f"(the zoo's kv format: key value {sep} ... {sep} key -> value){why}; `headscope position --model M --task "
            "QA.jsonl` runs multi-document QA over your own text")


def _layer_means(parts: Sequence[Any]) -> list[float]:
    """Mean over rows and heads of [n_pos, layer, head] tensors from every sweep -> per layer."""
    return torch.cat(list(parts)).mean((0, 2)).tolist()


def run(model: Any, task: str | Sequence[PositionSweep] | None = None, config: PositionConfig | None = None) -> Result:
    """The whole analysis: the model's default sweep (zoo kv, Liu kv or encoder retrieval) or `task`."""
    return position_bias(model, task, config or PositionConfig.preset())
