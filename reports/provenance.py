"""Where each analysis's data came from: the per-section provenance of report.html, report.md and compare.

At run time `task_record` writes OUT/<analysis>/task.json: the task's name, where it came from (the
user's task, or a default and why: the manifest's task_used line), how many examples the analysis
used, which parts of the task it read and what it scored (its family's contract.Reads: "uses" names
the parts the task has that the analysis leaves unused and why, "metric" what it scores where the
task's metric does not say it, e.g. on encoders), and ONE sample row decoded by the model's tokenizer
with the parts it read only (prompt; answer; corrupted prompt and its answer), so a reader can see
what a section ran on; "bos_added" names a BOS headscope put in front of it that the tokenizer does not
add (the line reads "sample: '<|endoftext|>' + 'the prompt'"). At report time `section_provenance` reads it
(falling back to the summary's "task" and "n_examples" for folders written before task.json
existed) and `provenance_html` / `provenance_markdown` render it, every string escaped.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headscope.models.token_text import readable_text
from headscope.reports import io
from headscope.reports.findings import and_join, int_ranges
from headscope.reports.render import escape, md_escape

log = logging.getLogger(__name__)
TASK_FILE = "task.json"  # OUT/<analysis>/task.json
SAMPLE_CHARS = 400  # a sample string longer than this is cut (its full text is in the task's own files)


def task_source(used: str) -> str:
    """Where the task came from, in words, from the manifest's task_used line ("your task (x.jsonl)",
    "your task (x.jsonl): only the rows whose answer is one token ...", "default task", "default task (why your task
    could not be used)", "none")."""
    used = (used or "").strip()
    if used.startswith("your task"):
        return f"your task {used.removeprefix('your task').strip()}".strip()
    if used.startswith("default task ("):
        return f"its default task, because your task could not be used: {used.removeprefix('default task (')[:-1]}"
    if used == "default task":
        return "its default task (no --task given)"
    return used or "not recorded"


def subset_sentence(used: str) -> str:
    """'This section used only the rows whose answer is one token under this tokenizer, 20 of the task's 40 (...).'
    where the plan ran the analysis on the user's one-token rows (contract.one_token_plan: the manifest's task_used
    line "your task (x.jsonl): only the rows ..."); "" otherwise. The section's finding starts with it."""
    from headscope.analyses.core.contract import SUBSET_MARK

    used = (used or "").strip()
    if not used.startswith("your task (") or SUBSET_MARK not in used:
        return ""
    rest = used.split(SUBSET_MARK, 1)[1].replace(" of its ", " of the task's ", 1)
    return f"This section used only the rows {rest}."


def with_code(text: str, *, markdown: bool) -> str:
    """A sentence whose one code span lies between its first and last backtick (bos_sentence's `token`), escaped for
    HTML (the span as <code>) or Markdown (a code span fenced by more backticks than it holds, its text literal: an
    HTML entity there would show as typed; review 14a C3: "`&lt;bos&gt;`" in report.md, the backticks in report.html);
    without two backticks the whole sentence escaped."""
    head, tick, rest = text.partition("`")
    code, tick2, tail = rest.rpartition("`")
    if not (tick and tick2):
        return md_escape(text) if markdown else escape(text)

    def plain(part: str) -> str:  # escaped, its leading and trailing space kept (md_escape collapses them)
        if not markdown:
            return escape(part)
        inner = md_escape(part)
        return (" " if part[:1].isspace() else "") + inner + (" " if part[-1:].isspace() and inner else "")

    if not markdown:
        return plain(head) + f"<code>{escape(code)}</code>" + plain(tail)
    code = " ".join(code.split())
    fence = "`" * (max((len(s) for s in re.findall("`+", code)), default=0) + 1)
    pad = " " if code[:1] == "`" or code[-1:] == "`" else ""
    return plain(head) + f"{fence}{pad}{code}{pad}{fence}" + plain(tail)


def bos_sentence(config: Mapping[str, Any]) -> str:
    """What the report header says of the BOS (review 10b A1), from the manifest's config: where headscope put a
    BOS in front that the tokenizer does not add ("bos_added"), that it did and how to turn it off; under
    --no-prepend-bos that prompts ran as tokenized; "" otherwise (the tokenizer adds its own BOS, an encoder, or
    a manifest from before this was recorded)."""
    added = config.get("bos_added")
    if isinstance(added, str) and added and config.get("bos_is_eos"):  # review 19a C2: no bos_token of its own
        return (f"Prompts run as `{added}` + your prompt: the tokenizer defines no BOS, so headscope prepends its "
                "eos_token as the BOS, as TransformerLens does; --no-prepend-bos runs them as tokenized.")
    if isinstance(added, str) and added:
        return (f"Prompts run as `{added}` + your prompt: the tokenizer adds no BOS and headscope prepends its "
                "bos_token, as TransformerLens does; --no-prepend-bos runs them as tokenized.")
    if config.get("prepend_bos") is False:
        return "Prompts run as the tokenizer tokenizes them (--no-prepend-bos: headscope puts no BOS in front)."
    return ""


def bos_is_eos(tokenizer: Any) -> bool:
    """Whether the BOS headscope prepends is the tokenizer's eos_token standing in for a bos_token its files do not
    define (TransformerLens sets bos_token = eos_token then; review 19a C2), not a bos_token of its own (GPT-2's
    <|endoftext|> is both, by its files)."""
    own = (getattr(tokenizer, "init_kwargs", None) or {}).get("bos_token")
    bos, eos = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "eos_token", None)
    return own is None and bos is not None and bos == eos


def _decode(tokenizer: Any, ids: Any) -> str:
    """The row's text as the user wrote it: without the BOS token the task put in front (decoders), cut
    at SAMPLE_CHARS."""
    ids = [int(i) for i in ids]
    bos = getattr(tokenizer, "bos_token_id", None)
    if len(ids) > 1 and bos is not None and ids[0] == bos:
        ids = ids[1:]
    return _clip(readable_text(tokenizer, ids, skip_special_tokens=False))  # split bytes read <0xE2>, not U+FFFD


def _clip(text: str) -> str:
    """A sample string cut at SAMPLE_CHARS (an ellipsis marks the cut)."""
    return text if len(text) <= SAMPLE_CHARS else text[: SAMPLE_CHARS - 1] + "…"


def _starts_with_bos(model: Any, data: Any) -> bool:
    """Whether the first row the analysis ran on (padding removed) starts with the tokenizer's BOS."""
    bos = getattr(model.tokenizer, "bos_token_id", None)
    if bos is None or data is None or isinstance(data, Exception):
        return False
    ids = data[1].tokens[0] if isinstance(data, tuple) else data.example(0).tokens[0]
    return len(ids) > 0 and int(ids[0]) == bos


def _has_corrupted(task: Any) -> bool:
    return task.corrupted_tokens is not None and not bool((task.corrupted_tokens == task.tokens).all())


def _sample_of_task(tokenizer: Any, task: Any, reads: Any = None) -> dict[str, str]:
    """The first row of a Task (padding removed) as strings: the prompt, and the answer and corrupted
    prompt where the analysis reads them (`reads`: contract.Reads; None: the answers, no corrupted prompt)."""
    if reads is None:
        from headscope.analyses.core.contract import Reads

        reads = Reads()
    row = task.example(0)
    # answers of several tokens: the prompt runs on with all but the answer's last token (teacher forcing);
    # the sample shows the prompt as the user wrote it (review 11b C1)
    forced = 0 if row.continuation is None else int(row.continuation.shape[-1]) - 1
    cut = (lambda ids: ids[: len(ids) - forced]) if forced else (lambda ids: ids)
    sample = {"prompt": _decode(tokenizer, cut(row.tokens[0]))}
    if not reads.answers:
        pass
    elif row.continuation is not None:
        sample["answer"] = _decode(tokenizer, row.continuation[0])
    elif row.answers is not None:
        sample["answer"] = _decode(tokenizer, row.answers)
    if reads.corrupted and _has_corrupted(row):
        sample["corrupted_prompt"] = _decode(tokenizer, cut(row.corrupted_tokens[0]))
        if row.wrong_answers is not None:
            sample["corrupted_answer"] = _decode(tokenizer, row.wrong_answers)
    return sample


def uses_text(task: Any, reads: Any, yours: bool) -> str:
    """Which parts of `task` the analysis read (`reads`: contract.Reads), the parts it has and the analysis
    left unused and why: "your prompts only; answers and corrupted prompts are not used: headscope
    scores encoders by their pooled embedding; ..." (yours: the user's task, else "the")."""
    used, unused = ["prompts"], []
    if task.answers is not None or task.continuation is not None:
        (used if reads.answers else unused).append(f"answers {reads.answers_as}".strip() if reads.answers else "answers")
    if _has_corrupted(task):
        (used if reads.corrupted else unused).append("corrupted prompts")
    text = f"{'your' if yours else 'the'} {and_join(used) if len(used) > 1 else 'prompts only'}"
    if unused:
        text += f"; {and_join(unused)} are not used" + (f": {reads.why}" if reads.why else "")
    return text


def _sample(model: Any, data: Any, reads: Any) -> tuple[str | None, int | None, dict[str, str]]:
    """(task name, its rows, its first row) of the data an analysis ran on (runner.ran_on): a Task, or
    position's first sweep row (its kind, the row)."""
    if data is None:
        return None, None, {}
    if isinstance(data, tuple):  # position's own sweeps: (kind, first PositionSweep)
        kind, sweep = data
        return kind, None, sweep_sample(model.tokenizer, sweep)
    return data.name, len(data), _sample_of_task(model.tokenizer, data, reads)


def sweep_sample(tokenizer: Any, sweep: Any) -> dict[str, str]:
    """Position's sample (review 13c A4: a bare passage with "-> ''" hid what the cosine is with): the first row's
    prompt, the query (encoders: encoded on its own, the cosine's other side) or the answer (decoders), and the gold
    item with its slot ("gold_position": "1 of 6")."""
    sample = {"prompt": _decode(tokenizer, sweep.tokens[0])}
    if sweep.query_tokens is not None:
        sample["query"] = _decode(tokenizer, sweep.query_tokens[0])
    elif sweep.answers:
        sample["answer"] = " or ".join(sweep.answers[:3])
    start, end = (int(x) for x in sweep.gold_spans[0])
    sample["gold"] = _clip(readable_text(tokenizer, [int(i) for i in sweep.tokens[0, start:end]],
                                         skip_special_tokens=False))
    sample["gold_position"] = f"{int(sweep.positions[0])} of {int(sweep.n_items)}"
    return sample


def sweep_reads(sweep: Any, summary: Mapping[str, Any]) -> tuple[str, str]:
    """(uses, metric) of position's own sweeps, for encoders and decoders alike (review 13c A4, C2: the position
    sections had neither line, and "Cosine" never said it is taken with a query)."""
    n_items, n_pos = int(sweep.n_items), len(sweep.positions)
    baseline = (", and for the no-gold baseline each prompt without its gold item" if sweep.no_gold_tokens is not None
                else "")
    if sweep.query_tokens is not None:
        return (f"each record's query, its relevant sentence (the gold item) and {n_items - 1} distractors, the gold "
                f"placed at each of {n_pos} positions in turn{baseline}",
                "cosine of the mean-pooled passage embedding with the mean-pooled embedding of the query (encoded on "
                "its own); no answer is generated")
    primary = summary.get("primary_metric") or "accuracy"
    lead = ("accuracy: greedy decoding from the prompt contains an accepted answer (Liu et al.)" if primary == "accuracy"
            else f"{primary} of the answer")
    return (f"each example's context of {n_items} items, the gold item placed at each of {n_pos} positions in turn, "
            f"and its answer{baseline}",
            f"{lead}; also the answer's teacher-forced log-probability and the rank of its first token")


FILE_FIELDS = {"prompt": "prompt", "answer": "answer", "corrupted_prompt": "corrupted_prompt",
               "corrupted_answer": "wrong_answer"}  # a sample's part -> its field in the user's rows


def _as_written(sample: Mapping[str, str], data: Any, user_rows: Any) -> dict[str, str]:
    """The sample's parts as the user's file writes them (review 11a C8: a tokenizer's decoding drops the
    spaces before punctuation and may lower-case), where the Task's first row is a row of `user_rows`
    (read_numbered_rows: {"row", "prompt", ...}); the decoded parts otherwise."""
    rows = getattr(data, "source_rows", None)
    if rows is None or not len(rows) or not user_rows:
        return dict(sample)
    first = int(rows[0])
    row = next((r for r in user_rows if isinstance(r, Mapping) and r.get("row") == first), None)
    if row is None:
        return dict(sample)
    out = dict(sample)
    for part, field in FILE_FIELDS.items():
        text = row.get(field)
        if part in out and isinstance(text, str):
            out[part] = _clip(text)
    return out


def task_record(model: Any, name: str, data: Any, summary: Mapping[str, Any], used: str,
                config: Any = None, user_rows: Any = None, source: Any = None) -> dict[str, Any]:
    """What OUT/<name>/task.json holds: {"task", "source", "n_examples", "sample": {prompt, answer,
    corrupted_prompt, corrupted_answer}} (the sample may be {} with "sample_note" saying why; it holds the
    parts the analysis reads only: registry.reads under `config`, its settings), "uses" (uses_text) and
    "metric" (what it scores, where its family says: encoders) for a prompt/answer Task, and
    "rows": the user's data rows it ran on (0-based, as errors and task_examples.csv's "row" number them), and
    "dropped" ({n, why, unit}) where the analysis left examples out (probes: classes of one example), "answer_pieces"
    ({rows, max, left_out}: patching's cells at answers' teacher-forced pieces, not reported). data:
    what the analysis ran on, as the runner resolved it (analyses/core/runner.py `ran_on`: a Task,
    position's (kind, first sweep), or an exception the runner met finding it). The analysis's own
    summary decides the name and count where it records them (what it actually used). user_rows: the user's
    file's rows (read_numbered_rows), whose text the sample shows as written where the Task's first row is one.
    source: the user's task file, whose row count a sample of it is said against ("file_rows", "sample_why")."""
    record: dict[str, Any] = {"task": summary.get("task"), "source": task_source(used),
                              "n_examples": summary.get("n_examples"), "sample": {}}
    try:
        if isinstance(data, Exception):
            raise data
        from headscope.analyses.core.registry import reads as family_reads

        reads = family_reads(name, model, config, summary)
        if hasattr(data, "tokens") and hasattr(data, "example"):  # a prompt/answer Task (not position's sweeps)
            record["uses"] = uses_text(data, reads, record["source"].startswith("your task"))
            if reads.metric:
                record["metric"] = reads.metric
        elif isinstance(data, tuple) and len(data) == 2 and hasattr(data[1], "gold_spans"):  # position's own sweeps
            record["uses"], record["metric"] = sweep_reads(data[1], summary)
        found, n, sample = _sample(model, data, reads)
        if record["source"].startswith("your task"):
            sample = _as_written(sample, data, user_rows)
    except Exception as err:  # noqa: BLE001 - the sample is a courtesy: it never costs the analysis its result
        log.warning("%s: no sample prompt for the report (%s: %s)", name, type(err).__name__, err)
        found, n, sample = None, None, {}
        record["sample_note"] = f"no sample: {type(err).__name__}: {err}"
    if not isinstance(record["task"], str):
        record["task"] = found
    if not isinstance(record["n_examples"], int):
        record["n_examples"] = n
    record["sample"] = sample
    added = model.added_bos() if hasattr(model, "added_bos") else None
    if added and sample.get("prompt") is not None and _starts_with_bos(model, data):
        record["bos_added"] = added  # review 10b A1: the sample shows the BOS headscope put in front
    fit = summary.get("shipped_text")
    if isinstance(fit, Mapping) and summary.get("example_unit") == "examples" and isinstance(fit.get("n_sentences"), int):
        record["token_positions_of"] = fit["n_sentences"]  # review 11a C9: 816 examples were token positions
    if isinstance(fit, Mapping) and isinstance(fit.get("note"), str):  # the shipped sentences, split or unknown
        record["note"] = fit["note"]
    elif isinstance(summary.get("data_note"), str):  # data built for this tokenizer (position's word_kv)
        record["note"] = summary["data_note"]
    if isinstance(summary.get("not_run"), str):  # review 16d C3: a part headscope could not do, in one line
        record["not_run"] = summary["not_run"]
    rows = getattr(data, "source_rows", None)  # a Task read from the user's data: which of its rows it holds
    if rows is not None and len(rows) == record["n_examples"]:
        record["rows"] = sorted(int(r) for r in rows)
        if isinstance(layout := getattr(data, "rows_layout", None), str):  # review 15b C2: how a .json was read
            record["rows_layout"] = layout
        record.update(_sample_of(name, used, source, config, summary, len(rows)))
    dropped = summary.get("n_dropped_single_examples")
    if isinstance(dropped, int) and dropped > 0:  # probes: examples of a class seen once were not used
        record["dropped"] = {"n": dropped, "why": summary.get("dropped_reason"), "unit": summary.get("example_unit")}
    pieces = summary.get("answer_pieces")
    if isinstance(pieces, Mapping) and isinstance(pieces.get("rows"), int) and pieces["rows"] > 0:
        record["answer_pieces"] = {k: pieces.get(k) for k in ("rows", "max", "left_out")}  # patching: cells not shown
    left = summary.get("pairs_left_out")
    if isinstance(left, int) and left > 0:  # pairs of two token lengths: the pairwise part ran without them
        record["pairs_left_out"] = left
        record["pairs_left_out_rows"] = summary.get("pairs_left_out_rows")
    if not sample and "sample_note" not in record:
        record["sample_note"] = "no sample: this analysis records no prompt of its own"
    return record


_ROW_COUNTS: dict[tuple[str, str | None], int] = {}  # (path, sha256) of a held task file -> its row count


def _sample_of(name: str, used: str, source: Any, config: Any, summary: Mapping[str, Any], n: int) -> dict[str, Any]:
    """Review 18a B1: where a section ran on some of the user's file's rows, {"file_rows": how many the file has,
    "sample_why": the setting that chose n ("patching's default sample", "--quick's sample", "--n-examples 12"), or
    none where another step chose them (the budget's cut says itself; rows an analysis can use)}; {} otherwise."""
    from headscope.analyses.core.task_rows import count_task_rows

    if source is None or not task_source(used).startswith("your task"):
        return {}
    key = (str(source), getattr(source, "sha256", None))  # a held file's bytes: counted once per report
    try:
        total = _ROW_COUNTS[key] if key[1] and key in _ROW_COUNTS else count_task_rows(source)
    except Exception:  # noqa: BLE001 - a courtesy: the count never costs the section its record
        return {}
    if key[1]:
        _ROW_COUNTS[key] = total
    if not isinstance(total, int) or total <= n:
        return {}
    out: dict[str, Any] = {"file_rows": total}
    budget = summary.get("budget") if isinstance(summary.get("budget"), Mapping) else {}
    if "n_examples" in (budget.get("changed") or {}):
        return out  # the budget line says the cut
    try:
        from headscope.analyses.core.registry import cost_model

        knob = next((k for k in cost_model(name).knobs if hasattr(k, "counts")), None)
        wanted = knob.counts(config, config, None)[0] if knob is not None and config is not None else None
    except Exception:  # noqa: BLE001 - a family without an examples knob: no reason given
        wanted = None
    if wanted == n:
        out["sample_why"] = (f"--n-examples {n}" if getattr(config, "n_examples", None) else
                             "--quick's sample" if getattr(config, "quick", False) else f"{name}'s default sample")
    return out


def section_provenance(folder: Path, used: str = "", speeds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The provenance of one analysis folder: its task.json, else what its summary says (older runs). speeds:
    manifest_speeds of the run, where the caller has read them once for every section (None: read here)."""
    try:
        record = io.read_json(folder / TASK_FILE)
    except (OSError, ValueError):
        record = None
    try:
        summary = io.read_json(folder / "summary.json")
    except (OSError, ValueError):
        summary = {}
    summary = summary if isinstance(summary, dict) else {}
    if not isinstance(record, dict):
        record = {"task": summary.get("task"), "source": task_source(used), "n_examples": summary.get("n_examples"),
                  "sample": {}, "sample_note": f"no sample: this run wrote no {TASK_FILE}"}
    budget = summary.get("budget") or {}
    changed = budget.get("changed") if isinstance(budget, dict) else None
    record["budget_changed"] = changed if isinstance(changed, dict) else {}
    speed = (manifest_speeds(folder.parent) if speeds is None else speeds).get(folder.name)
    if speed is not None:
        record["budget_speed"] = speed
    return record


def manifest_speeds(out: Path) -> dict[str, dict[str, Any]]:
    """{analysis: the timed pass its budget rests on} from OUT/manifest.json's "budget" (budget.speed_record;
    {} for runs written before it was recorded, or no manifest)."""
    try:
        budget = io.read_json(out / "manifest.json").get("budget") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(k): v["speed"] for k, v in budget.items() if isinstance(v, Mapping) and isinstance(v.get("speed"), Mapping)}


def speed_text(speed: Mapping[str, Any]) -> str:
    """'2.1e-11 s per flop (a forward pass of 4 x 64 random tokens in 0.012 s on cpu, 1 thread)' from a
    budget.speed_record."""
    rate = speed.get("seconds_per_flop")
    text = f"{rate:.2g} s per flop" if isinstance(rate, (int, float)) else "not recorded"
    rows, length, secs = speed.get("rows"), speed.get("length"), speed.get("pass_s")
    if isinstance(rows, int) and isinstance(length, int) and isinstance(secs, (int, float)):
        threads = speed.get("threads")
        where = f" on {speed.get('device') or 'this machine'}" + (
            f", {threads} thread{'s' if threads != 1 else ''}" if isinstance(threads, int) else "")
        text += f" (a forward pass of {rows} x {length} random tokens in {secs:.2g} s{where})"
    return text


def budget_line(manifest: Mapping[str, Any]) -> str:
    """The Provenance table's budget row: 'none (--budget inf): every analysis ran its preset in full', or '3
    minutes, fitted to this machine's speed measured at the start of the run: <speed_text, per timed length>;
    another run may fit differently (--budget inf runs every preset in full)'."""
    minutes = (manifest.get("config") or {}).get("budget_minutes")
    if not isinstance(minutes, (int, float)):
        return "none (--budget inf): every analysis ran its preset in full"
    speeds = {}
    for entry in (manifest.get("budget") or {}).values():
        speed = entry.get("speed") if isinstance(entry, Mapping) else None
        if isinstance(speed, Mapping):
            speeds.setdefault(speed.get("length"), speed_text(speed))
    measured = "; ".join(speeds[k] for k in sorted(speeds, key=lambda k: k if isinstance(k, int) else 0)) or "not recorded"
    return (f"{minutes:g} minutes, fitted to this machine's speed measured at the start of the run: {measured}; "
            "another run may fit differently (--budget inf runs every preset in full)")


def below_quick_line(out: Path, names: Any) -> str:
    """One line for the report's header where the budget cut a run without --quick to fewer examples than --quick
    runs (summary["budget"]["below_quick"], budget.fit; review 11b C3: a slow machine timed at the start left the
    default report smaller than the quick one): "This run's budget was cut below the --quick preset by this
    machine's speed timed at the start of the run (heads 8 examples against --quick's 16; ...): rerun with --budget
    inf." '' where no section was."""
    said = []
    for name in names:
        try:
            budget = io.read_json(Path(out) / name / "summary.json").get("budget") or {}
        except (OSError, ValueError, AttributeError):
            continue
        below = budget.get("below_quick") if isinstance(budget, Mapping) else None
        pair = below.get("n_examples") if isinstance(below, Mapping) else None
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, int) for x in pair):
            said.append(f"{name} {pair[0]} examples against --quick's {pair[1]}" if not said
                        else f"{name} {pair[0]} against {pair[1]}")
    if not said:
        return ""
    return ("This run's budget was cut below the --quick preset by this machine's speed timed at the start of the run "
            f"({'; '.join(said)}): rerun with --budget inf.")


STREAMING_DROPPED = ("the streaming sweep (sinks + window against the window alone and the full context) not run: "
                     "its result and figure are missing")


def setting_change(key: str, old: Any, new: Any) -> str:
    """One setting the budget changed, in words: 'n_examples 16 -> 8'; position's window to 0 (review 19b C2: "window
    None -> 0" hid that the streaming sweep was dropped) 'window default -> 0 (the streaming sweep ... not run: ...)'."""
    if key == "window" and new == 0:
        return f"window {'default' if old is None else old} -> 0 ({STREAMING_DROPPED})"
    return f"{key} {old} -> {new}"


def _changed_text(changed: Mapping[str, Any], speed: Mapping[str, Any] | None = None) -> str:
    """'the budget changed no setting', or (review 10a A2: the settings depend on a speed timed at the start of the
    run, so the same command can give another section) 'the budget (fitted to this machine's speed measured at the
    start of the run: <speed_text>) changed <setting old -> new, ...>; another run may fit differently; --budget
    inf runs the preset in full'."""
    if not changed:
        return "the budget changed no setting"
    parts = []
    for key, value in changed.items():
        old, new = value if isinstance(value, (list, tuple)) and len(value) == 2 else ("?", value)
        parts.append(setting_change(key, old, new))
    measured = f": {speed_text(speed)}" if isinstance(speed, Mapping) else ""
    return (f"the budget (fitted to this machine's speed measured at the start of the run{measured}) changed "
            + ", ".join(parts) + "; another run may fit differently; --budget inf runs the preset in full")


def _pairs_text(record: Mapping[str, Any]) -> str:
    """' (2 left out of the clean-corrupted pairs: data rows 3, 7, whose corrupted prompt has another token length)'
    (numbered as _rows_text's)."""
    left = record.get("pairs_left_out")
    if not isinstance(left, int) or left <= 0:
        return ""
    rows = record.get("pairs_left_out_rows")
    where = f": data rows {', '.join(map(str, rows))}" if isinstance(rows, list) and rows else ""
    return (f" ({left} left out of the clean-corrupted pairs{where}, whose corrupted prompt has another token "
            "length)")


# how the section lines number the user's rows, as the errors do, per file type (review 15b C2: a JSON list has no header)
ROWS_NOTES = {".csv": "0-based, header not counted", ".tsv": "0-based, header not counted",
              ".jsonl": "0-based, blank lines not counted",
              ".json": "0-based, the JSON list's index or, for JSON lines, blank lines not counted",
              ".parquet": "0-based, the table's row index"}
# a .json file as the loader read it (task.json rows_layout, Task.rows_layout): the one reading that applies
LAYOUT_NOTES = {"json list": "0-based, the JSON list's index", "json lines": "0-based, blank lines not counted"}


def rows_note(source: Any, layout: Any = None) -> str:
    """How a section's 'data rows' count for the file named in its source ("your task (boxes.json)"): as the loader
    read it (layout: task.json's rows_layout, "json list" or "json lines"), else per file type (ROWS_NOTES; runs
    written before rows_layout), '0-based' where the data is no file of a known type (a DataFrame, in-memory rows)."""
    if layout in LAYOUT_NOTES:
        return LAYOUT_NOTES[layout]
    named = re.match(r"your task \((.*?)\)(?::|$)", str(source or ""))  # "my (v2).json" too
    suffix = Path(named.group(1)).suffix.lower() if named else ""
    return ROWS_NOTES.get(suffix, "0-based")


def _count_text(record: Mapping[str, Any]) -> str:
    """'14' or, where the analysis left examples out (task.json "dropped": probes' classes of one example),
    '5 of 14 rows kept: 9 have an answer no other row has'."""
    n, dropped = record.get("n_examples"), record.get("dropped")
    if not isinstance(n, int):
        return "not recorded"
    if not isinstance(dropped, Mapping) or not isinstance(dropped.get("n"), int) or dropped["n"] <= 0:
        of = record.get("token_positions_of")  # probes on the shipped sentences: an example is a token position
        return f"{n} token positions of {of} sentences" if isinstance(of, int) else str(n)
    why = dropped.get("why") or f"{dropped['n']} left out"
    return f"{n} of {n + dropped['n']} {dropped.get('unit') or 'examples'} kept: {why}"


def _rows_text(record: Mapping[str, Any]) -> str:
    """' (data rows 0-7, 12; 0-based, header not counted)': which rows of the user's data the analysis ran on
    (task.json "rows"), numbered as the task-file errors' "row N" and task_examples.csv's "row" number them: row 0
    is the first example (the first row under a CSV header, a JSON list's item 0, the first JSON line with a record);
    the note says which of these the source's file type has (rows_note)."""
    rows = record.get("rows")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, int) for r in rows):
        return ""
    total, why = record.get("file_rows"), record.get("sample_why")
    plain = not record.get("dropped") and not record.get("token_positions_of")  # _count_text said a plain count
    of = f" of the file's {total}" if plain and isinstance(total, int) and total > len(rows) else ""  # review 18a B1
    said = f"{why}, seeded; --n-examples N for another count; " if of and isinstance(why, str) and why else ""
    return f"{of} ({said}data rows {int_ranges(rows)}; {rows_note(record.get('source'), record.get('rows_layout'))})"


def _pieces_text(record: Mapping[str, Any]) -> str:
    """'answer pieces: 3 of 8 prompts have answers of several tokens, run on with up to 2 of their tokens (teacher
    forcing); the cells at those 5 answer positions are patched but not reported' (task.json "answer_pieces",
    patching's summary answer_pieces); '' where none."""
    info, n = record.get("answer_pieces"), record.get("n_examples")
    if not isinstance(info, Mapping) or not isinstance(info.get("rows"), int):
        return ""
    most, left = info.get("max"), info.get("left_out")
    upto = f"up to {most}" if isinstance(most, int) and most > 1 else "1"
    places = f"those {left} answer positions" if isinstance(left, int) else "those answer positions"
    return (f"answer pieces: {info['rows']} of {n if isinstance(n, int) else '?'} prompts have answers of several "
            f"tokens, run on with {upto} of their tokens (teacher forcing); positions count from each prompt's last "
            f"token, and the cells at {places} are patched but not reported")


def provenance_lines(record: Mapping[str, Any]) -> list[str]:
    """Plain-text lines (unescaped): task and source, n and budget, the parts used and the metric (where
    recorded), the sample (prompt -> answer; corrupted -> its answer, where the analysis reads them)."""
    task = record.get("task") or "not recorded"
    lines = [f"task: {task}, from {record.get('source') or 'not recorded'}",
             f"examples: {_count_text(record)}{_rows_text(record)}{_pairs_text(record)}; "
             f"{_changed_text(record.get('budget_changed') or {}, record.get('budget_speed'))}"]
    for key in ("uses", "metric", "note", "not_run"):
        if isinstance(record.get(key), str) and record[key]:
            lines.append(f"{key.replace('_', ' ')}: {record[key]}")
    if pieces := _pieces_text(record):
        lines.append(pieces)
    sample = record.get("sample") or {}
    if sample.get("prompt") is not None:
        bos = record.get("bos_added")  # a BOS headscope put in front (the tokenizer adds none): shown, not hidden
        text = f"sample: {bos!r} + {sample['prompt']!r}" if isinstance(bos, str) and bos else f"sample: {sample['prompt']!r}"
        if sample.get("query") is not None:  # position on an encoder: the passage is scored against the query
            text = f"sample: query {sample['query']!r}; passage " + text.removeprefix("sample: ")
        if sample.get("answer") is not None:
            text += f" -> {sample['answer']!r}"
        if sample.get("gold") is not None:  # position: the gold item and its slot in this row
            where = f" at position {sample['gold_position']}" if sample.get("gold_position") else ""
            text += f"; gold item {sample['gold']!r}{where}"
        if sample.get("corrupted_prompt") is not None:
            text += f"; corrupted: {sample['corrupted_prompt']!r}"
            if sample.get("corrupted_answer") is not None:
                text += f" -> {sample['corrupted_answer']!r}"
        lines.append(text)
    else:
        lines.append(str(record.get("sample_note") or "no sample recorded"))
    return lines


def provenance_html(record: Mapping[str, Any]) -> str:
    return '<div class="task-used">' + "<br>".join(escape(line) for line in provenance_lines(record)) + "</div>"


def provenance_markdown(record: Mapping[str, Any]) -> str:
    return "\n".join(f"- {md_escape(line)}" for line in provenance_lines(record)) + "\n"
