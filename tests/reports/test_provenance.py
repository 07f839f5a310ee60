"""Per-section provenance (#34 item 1): each section of report.html and report.md names its task, where it
came from (the user's file, or a default and why), its example count, one sample prompt with its answer
and what the budget changed, every string escaped; written at run time as OUT/<analysis>/task.json."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest

import headscope as hs
from headscope.reports import report as report_mod
from headscope.reports.report import build_report

PROMPT = "w1 <script>alert(1)</script> w2"


def _fake(name, model, task, config):
    """A cheap stand-in for an analysis: the report machinery around it is what is tested."""
    summary = {"value": 1.5} if name == "kv" else {"task": "its-own", "n_examples": 3}
    return SimpleNamespace(name=name, df=pd.DataFrame({"x": [1]}), summary=summary, tables={}, plot=lambda: {})


def test_each_section_names_its_task_source_count_and_an_escaped_sample(arch_models, tmp_path, monkeypatch):
    monkeypatch.setattr(report_mod, "get_analysis", lambda name: lambda m, t, c: _fake(name, m, t, c))
    path = tmp_path / "mine.jsonl"  # prompts and answers only: patching needs corrupted prompts, so it takes its default
    rows = [{"prompt": PROMPT if i == 0 else f"the cat {i} sat", "answer": " the"} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    out = build_report(arch_models("qwen2"),  # byte-level BPE: "<script>" decodes as written
                        out=tmp_path / "out", analyses="kv,patching", task=str(path), budget=float("inf"))
    record = json.loads((out / "kv" / "task.json").read_text())
    # kv's summary records neither task nor count: both come from the Task it used, the user's 6 rows
    assert record["task"] == "mine" and record["n_examples"] == 6 and record["source"] == "your task (mine.jsonl)"
    assert record["sample"]["prompt"] == PROMPT and record["sample"]["answer"] == " the"  # as written: no BOS in front
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    kv = html[html.index('<h2 id="kv">'):html.index("id='provenance'")]  # sections in the registry's order
    assert ("task: mine, from your task (mine.jsonl)<br>examples: 6 (data rows 0-5; 0-based, blank lines not counted); the "
            "budget changed no setting<br>") in kv
    assert "w1 &lt;script&gt;alert(1)&lt;/script&gt; w2&#x27; -&gt; &#x27; the&#x27;" in kv
    patching = html[html.index('<h2 id="patching">'):html.index('<h2 id="kv">')]
    # patching's summary names its own task and count; the source says why the user's file was not used
    assert ("task: its-own, from its default task, because your task could not be used: the task has no corrupted "
            "prompts<br>examples: 3; ") in patching
    assert "corrupted: " in patching  # its default task has corrupted prompts: the sample shows one
    assert "<script>alert" not in html and "alert(1)</script>" not in html and "<script>" not in md
    assert "- task: mine, from your task \\(mine.jsonl\\)" in md
    assert "- examples: 6 \\(data rows 0-5; 0-based, blank lines not counted\\); the budget changed no setting" in md
    assert "w1 &lt;script>alert\\(1\\)&lt;/script> w2" in md  # review 16a C3: only a tag-opening < is an entity


def test_pairs_left_out_are_named_with_their_file_rows_in_the_section_line():
    """The reviewer's case: patching ran on 6 of 8 rows without saying why; the line names the 2 pairs left out
    by the data rows the CLI warning names, and says nothing when no pair was left out."""
    from headscope.reports.provenance import provenance_lines

    record = {"task": "colours.csv", "source": "your task file", "n_examples": 6, "sample": {},
              "pairs_left_out": 2, "pairs_left_out_rows": [3, 7]}
    assert provenance_lines(record)[1].startswith(
        "examples: 6 (2 left out of the clean-corrupted pairs: data rows 3, 7, whose corrupted prompt has another "
        "token length); ")
    assert provenance_lines({**record, "pairs_left_out": 0})[1].startswith("examples: 6; ")


def test_the_sample_prompt_is_the_users_text_without_the_bos_the_task_put_in_front(tiny_models):
    """A reviewer read "<bos>the cat sat" for a row written "the cat sat": the BOS a decoder's task
    adds is not part of the user's prompt."""
    from headscope.reports.provenance import _sample_of_task

    model = tiny_models["llama"]
    task = hs.load_task(model, [{"prompt": "the cat sat on", "answer": " the"}, {"prompt": "a dog", "answer": " the"}])
    assert int(task.example(0).tokens[0, 0]) == model.tokenizer.bos_token_id  # the task did put one there
    assert _sample_of_task(model.tokenizer, task)["prompt"] == model.tokenizer.decode(
        model.tokenizer("the cat sat on", add_special_tokens=False)["input_ids"])


def test_the_sample_of_a_several_token_answer_shows_the_prompt_without_the_forced_answer_pieces(tiny_models):
    """Review 11b C1: a row answered by several tokens runs as the prompt plus all but the answer's last
    token (teacher forcing), and the sample read "... it is with Ptolem -> Ptolemy"."""
    from headscope.analyses.core.contract import Reads
    from headscope.reports.provenance import _sample_of_task

    model = tiny_models["llama"]
    tok = model.tokenizer
    with pytest.warns(hs.HeadscopeWarning, match="answers of several tokens"):
        task = hs.load_task(model, [{"prompt": "w1 w2 w3", "answer": " w4 w5 w6", "corrupted_prompt": "w1 w7 w3",
                                     "wrong_answer": " w8"}])
    assert task.continuation.shape[1] == 3  # the case: the prompt ran on with w4 w5
    sample = _sample_of_task(tok, task, Reads(corrupted=True))
    words = lambda text: tok.decode(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert sample["prompt"] == words("w1 w2 w3") and sample["corrupted_prompt"] == words("w1 w7 w3")
    assert sample["answer"] == words(" w4 w5 w6")


def test_section_rows_are_numbered_as_the_task_file_errors_number_them(tiny_models, tmp_path):
    """A section line's "data rows" count from 0 at the first row under the header, as the errors' "row N" do:
    file line 4 of a CSV (line 1 is the header) is data row 2 in both."""
    from headscope.errors import TaskFileError
    from headscope.reports.provenance import provenance_lines

    path = tmp_path / "t.csv"
    path.write_text("prompt,answer\nw1 w2,w3\nw2 w3,w4\nw3 w4,w5,extra\nw4 w5,w6\n")
    with pytest.raises(TaskFileError, match=r"t\.csv', line 4, row 2: 3 cells but the header has 2 columns"):
        hs.load_task(tiny_models["llama"], str(path))
    line = provenance_lines({"task": "t", "source": "your task (t.csv)", "n_examples": 1, "rows": [2]})[1]
    assert line.startswith("examples: 1 (data rows 2; 0-based, header not counted); ")


def test_section_rows_say_how_each_file_type_counts_them(tiny_models, tmp_path):
    """Review 15b C2: a JSON list's section line said "header not counted" (a JSON list has none). The note follows the
    file type, and the row it names is the one the errors name: a JSON list's item 2, the JSON line after a blank
    line counted without it (file line 4 is row 2), a CSV's row under the header."""
    from headscope.errors import TaskFileError
    from headscope.reports.provenance import provenance_lines

    good = [{"prompt": "w1 w2", "answer": " w3"}, {"prompt": "w2 w3", "answer": " w4"}]
    files = {"t.json": json.dumps([*good, {"prompt": "w3 w4"}]),
             "t.jsonl": "\n".join([json.dumps(good[0]), "", json.dumps(good[1]), json.dumps({"prompt": "w3 w4"})])}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(TaskFileError, match=r"row 2\b"):
            hs.load_task(tiny_models["llama"], str(tmp_path / name))
    notes = {"t.json": "0-based, the JSON list's index or, for JSON lines, blank lines not counted",
             "t.jsonl": "0-based, blank lines not counted", "t.tsv": "0-based, header not counted",
             "t.parquet": "0-based, the table's row index", "rows": "0-based"}
    for name, note in notes.items():
        line = provenance_lines({"task": "t", "source": f"your task ({name})", "n_examples": 1, "rows": [2]})[1]
        assert line.startswith(f"examples: 1 (data rows 2; {note}); "), line


def test_a_json_files_rows_note_says_the_layout_it_was_read_as(tiny_models, tmp_path):
    """Review 15b C2 leftover: a .json's note gave both readings ("the JSON list's index or, for JSON lines, blank lines
    not counted"), by suffix alone. The loader records which it read (Task.rows_layout, task.json rows_layout) and the
    note says that one, for a file name with parentheses too ("my (v2).json" fell back to a bare "0-based")."""
    from headscope.reports.provenance import provenance_lines, task_record

    rows = [{"prompt": "w1 w2", "answer": " w3"}, {"prompt": "w2 w3", "answer": " w4"}]
    files = {"my (v2).json": (json.dumps(rows), "json list", "0-based, the JSON list's index"),
             "t.json": ("\n".join([json.dumps(rows[0]), "", json.dumps(rows[1])]), "json lines",
                        "0-based, blank lines not counted")}
    for name, (text, layout, note) in files.items():
        (tmp_path / name).write_text(text)
        task = hs.load_task(tiny_models["llama"], str(tmp_path / name))
        assert task.rows_layout == layout and task.source_rows.tolist() == [0, 1]
        record = task_record(tiny_models["llama"], "heads", task, {"n_examples": 2}, f"your task ({name})")
        assert record["rows_layout"] == layout and record["rows"] == [0, 1]
        assert provenance_lines(record)[1].startswith(f"examples: 2 (data rows 0-1; {note}); ")
    assert hs.load_task(tiny_models["llama"], rows).rows_layout is None  # in-memory rows: no file layout


def test_each_family_shows_the_parts_of_the_task_it_reads(tiny_models):
    """A decoder task with corrupted prompts: patching and circuits (edges on) read them and their sample shows
    one; attribution, heads, kv and probes do not, and their line says so instead of showing it (#34 item 1;
    review 7b A2 for the encoder side: tests/analyses/test_encoder_data.py)."""
    from headscope.analyses.circuits import CircuitsConfig
    from headscope.reports.provenance import provenance_lines, task_record

    model = tiny_models["gpt2"]
    task = hs.load_task(model, [{"prompt": f"w{i} w{i + 1} w{i + 2}", "answer": f" w{i + 3}",
                                 "corrupted_prompt": f"w{i + 9} w{i + 1} w{i + 2}", "wrong_answer": f" w{i + 12}"}
                                for i in range(1, 5)])
    used = "your task (mine.jsonl)"
    for name in ("patching", "circuits"):
        record = task_record(model, name, task, {}, used)
        assert record["uses"] == "your prompts, answers and corrupted prompts", name
        assert set(record["sample"]) == {"prompt", "answer", "corrupted_prompt", "corrupted_answer"}, name
    unused = {"attribution": "attribution scores each prompt alone",
              "heads": "heads ablates heads on each prompt, not between clean and corrupted prompts",
              "kv": "", "probes": "probes decode the answer from each prompt alone"}
    for name, why in unused.items():
        record = task_record(model, name, task, {}, used)
        answers = "answers as class labels" if name == "probes" else "answers"
        assert record["uses"] == f"your prompts and {answers}; corrupted prompts are not used" + (f": {why}" if why else "")
        assert set(record["sample"]) == {"prompt", "answer"}, name
        assert "corrupted: " not in provenance_lines(record)[-1]
    off = task_record(model, "circuits", task, {}, used, config=CircuitsConfig(edges=False))
    assert off["uses"].startswith("your prompts and answers; corrupted prompts are not used: edge attribution")
    assert "metric" not in off and "metric" not in task_record(model, "attribution", task, {}, used)  # decoders: the task's


def test_budget_lines_name_the_speed_they_rest_on_and_older_runs_still_say_it_can_differ(tmp_path):
    """Review 10a A2: a section the budget changed says it was fitted to the speed timed at the start of the run
    (with that speed where the manifest records it, budget.speed_record), that another run may fit differently
    and how to run the preset in full; a run without a budget (--budget inf) says so in its Provenance."""
    from headscope.reports import io
    from headscope.reports.compare import _budget_text
    from headscope.reports.provenance import budget_line, provenance_lines, section_provenance

    speed = {"seconds_per_flop": 3e-11, "length": 64, "rows": 4, "pass_s": 0.012, "device": "cpu", "threads": 2}
    manifest = {"config": {"budget_minutes": 3.0}, "budget": {"patching": {"budget_s": 47.5, "speed": speed}}}
    io.write_json(tmp_path / "manifest.json", manifest)
    io.write_json(tmp_path / "patching" / "summary.json", {"budget": {"changed": {"trace_samples": [None, 0]}}})
    record = section_provenance(tmp_path / "patching")
    measured = "3e-11 s per flop (a forward pass of 4 x 64 random tokens in 0.012 s on cpu, 2 threads)"
    assert (f"the budget (fitted to this machine's speed measured at the start of the run: {measured}) changed "
            "trace_samples None -> 0; another run may fit differently; --budget inf runs the preset in full"
            ) in provenance_lines(record)[1]
    assert _budget_text(record) == f"trace_samples None -> 0 (fitted to the speed measured at the start of the run: {measured})"
    assert budget_line(manifest) == (f"3 minutes, fitted to this machine's speed measured at the start of the run: "
                                     f"{measured}; another run may fit differently (--budget inf runs every preset in full)")
    assert budget_line({"config": {"budget_minutes": None}}) == "none (--budget inf): every analysis ran its preset in full"
    (tmp_path / "manifest.json").unlink()  # an older run: no speed recorded, the caveat stays
    older = provenance_lines(section_provenance(tmp_path / "patching"))[1]
    assert older.endswith("the budget (fitted to this machine's speed measured at the start of the run) changed "
                          "trace_samples None -> 0; another run may fit differently; --budget inf runs the preset in full")


def test_a_run_the_budget_cut_below_the_quick_preset_says_so_in_its_header(tmp_path):
    """Review 11b C3: the default run on a slow machine ran heads on 8 examples and patching on 7 where --quick runs
    16 and 8; the header of report.html and report.md says so in one line, and nothing where no section was cut."""
    from headscope.reports import io
    from headscope.reports.html_report import write_report_files
    from headscope.reports.provenance import below_quick_line
    from headscope.reports.render import md_escape

    model = {"name": "m", "family": "gemma3", "n_layers": 4, "n_heads": 4, "d_model": 64}
    io.write_json(tmp_path / "heads" / "summary.json", {"budget": {"changed": {"n_examples": [None, 8]},
                                                                  "below_quick": {"n_examples": [8, 16]}}})
    io.write_json(tmp_path / "patching" / "summary.json", {"budget": {"changed": {"n_examples": [None, 8]},
                                                                     "below_quick": {"n_examples": [7, 8]}}})
    io.write_json(tmp_path / "kv" / "summary.json", {"budget": {"changed": {}}})
    write_report_files(tmp_path, ["heads", "patching", "kv"], {}, model)
    line = ("This run's budget was cut below the --quick preset by this machine's speed timed at the start of the run "
            "(heads 8 examples against --quick's 16; patching 7 against 8): rerun with --budget inf.")
    md = (tmp_path / "report.md").read_text()
    assert md.index("rerun with --budget inf") < md.index("## Findings")
    assert f"**{md_escape(line)}**" in md
    assert line.replace("'", "&#x27;") in (tmp_path / "report.html").read_text()
    assert below_quick_line(tmp_path, ["kv"]) == ""  # no section cut below --quick: no line


def test_probes_on_the_shipped_sentences_count_token_positions_of_sentences():
    """Review 11a C9: MiniLM's probes section said 'examples: 816', the token positions of 64 sentences, while the
    heads section's examples are sentences; the line says which (the summary's shipped_text and example_unit)."""
    from headscope.reports.provenance import provenance_lines, task_record

    model = SimpleNamespace(facts=SimpleNamespace(is_encoder=True), tokenizer=None)
    summary = {"task": "sentences", "n_examples": 816, "example_unit": "examples", "labels": "position",
               "shipped_text": {"n_sentences": 64, "n_tokens": 688}}
    record = task_record(model, "probes", None, summary, "default task")
    assert "examples: 816 token positions of 64 sentences; the budget changed no setting" in provenance_lines(record)
    per_row = task_record(model, "probes", None, {**summary, "example_unit": "rows"}, "default task")
    assert "examples: 816; the budget changed no setting" in provenance_lines(per_row)


def test_position_sections_name_the_query_the_gold_item_and_what_the_metric_measures(tiny_models):
    """Review 13c A4, C2: MiniLM's position sample read "'[CLS] at sea level ...' -> ''" with no query, no "uses:" and
    no "metric:" line, though its cosine is taken with a query. Hand-built sweeps, encoder and decoder: the lines show
    the query (or the answer), the gold item and its slot, what was read and what was scored."""
    from headscope.analyses.position.prompts import item_sweep
    from headscope.reports.plots_position import finding
    from headscope.reports.provenance import provenance_lines, task_record

    model = tiny_models["gpt2"]
    tok, used = model.tokenizer, "default task"
    enc = item_sweep(tok, items=["w3 w4", "w5 w6"], gold="w7 w8", positions=None, encoder=True, query="w1 w2")
    lines = provenance_lines(task_record(model, "position", ("retrieval", enc), {"n_examples": 8}, used))
    assert lines[2] == ("uses: each record's query, its relevant sentence (the gold item) and 2 distractors, the gold "
                        "placed at each of 3 positions in turn, and for the no-gold baseline each prompt without its "
                        "gold item")
    assert lines[3].startswith("metric: cosine of the mean-pooled passage embedding with the mean-pooled embedding of "
                               "the query")
    assert lines[4] == "sample: query 'w1 w2'; passage 'w7 w8 w3 w4 w5 w6'; gold item 'w7 w8' at position 1 of 3"
    dec = item_sweep(tok, items=["w3 w4", "w5 w6"], gold="w7 w8", positions=[2, 3], answer=" w9", tail=" w7")
    lines = provenance_lines(task_record(model, "position", ("kv", dec), {"primary_metric": "accuracy"}, used))
    assert lines[3].startswith("metric: accuracy: greedy decoding from the prompt contains an accepted answer")
    assert lines[4].endswith("'w3 w4 w7 w8 w5 w6 w7' -> 'w9'; gold item 'w7 w8' at position 2 of 3")
    said = finding({"primary_metric": "cosine", "n_examples": 8, "metric_per_position": {"cosine": {"1": 0.67, "2": 0.52}}})
    assert said.startswith("Cosine with the query ranges from 0.52 (gold at position 2) to 0.67")


def test_the_footer_lists_the_tasks_the_sections_ran_on(tmp_path):
    """Review 13c C1: the bottom Provenance said "task: default" while the sections ran on four tasks; it lists each
    task with its sections, in the run's order, and the --task given where there was one."""
    from headscope.reports.html_report import _provenance, _provenance_markdown

    tasks = {"heads": "kv", "position": "zoo_kv", "patching": "ioi", "kv": "kv", "mlp": "facts"}
    for name, task in tasks.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "task.json").write_text(json.dumps({"task": task, "n_examples": 3}))
    config = {"analyses": list(tasks), "task": None}
    (tmp_path / "manifest.json").write_text(json.dumps({"config": config, "model": {"name": "m"}}))
    assert _provenance(tmp_path)["task"] == "per section: kv (heads, kv), zoo_kv (position), ioi (patching), facts (mlp)"
    config["task"] = "<mine>.jsonl"
    (tmp_path / "manifest.json").write_text(json.dumps({"config": config, "model": {"name": "m"}}))
    assert "- task: per section: kv \\(heads, kv\\), zoo\\_kv \\(position\\), ioi \\(patching\\), facts \\(mlp\\); your task: " \
        "&lt;mine>.jsonl" in _provenance_markdown(_provenance(tmp_path))


def test_a_sections_rows_are_said_as_a_sample_of_the_file_and_why(tiny_models, tmp_path):
    """Review 18a B1: "examples: 32 (data rows 0-2, 4-11, ...)" did not say the rows were 32 of the file's 40, nor that
    patching's default sample chose them. A 40-row file: patching's default (32) and --quick (8), heads with
    --n-examples 12, each drawn by the loader's seeded sample; all 40 rows say no more than before."""
    from headscope.analyses.core.task_files import TaskFile
    from headscope.analyses.heads.analysis import HeadsConfig
    from headscope.analyses.patching.analysis import PatchingConfig
    from headscope.reports.provenance import provenance_lines, task_record

    model, path = tiny_models["llama"], tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"w{i % 7} w{i % 5}", "answer": " w1"}) for i in range(40)))
    source, used = TaskFile(str(path)).held(), "your task (t.jsonl)"
    cases = [("patching", PatchingConfig(), 32, "patching's default sample"),
             ("patching", PatchingConfig(quick=True), 8, "--quick's sample"),
             ("heads", HeadsConfig(n_examples=12), 12, "--n-examples 12")]
    for name, config, n, why in cases:
        task = hs.load_task(model, source, n_examples=n)
        rows = sorted(task.source_rows.tolist())
        assert len(rows) == n and len(set(rows)) == n and max(rows) < 40
        record = task_record(model, name, task, {"n_examples": n}, used, config=config, source=source)
        assert record["file_rows"] == 40 and record["sample_why"] == why
        line = provenance_lines(record)[1]
        assert line.startswith(f"examples: {n} of the file's 40 ({why}, seeded; --n-examples N for another count; "
                               "data rows "), line
    cut = task_record(model, "patching", hs.load_task(model, source, n_examples=16), {
        "n_examples": 16, "budget": {"changed": {"n_examples": [None, 16]}}}, used, config=PatchingConfig(), source=source)
    assert "sample_why" not in cut and provenance_lines(cut)[1].startswith("examples: 16 of the file's 40 (data rows ")
    whole = task_record(model, "patching", hs.load_task(model, source), {"n_examples": 40}, used,
                        config=PatchingConfig(n_examples=64), source=source)
    assert "file_rows" not in whole and provenance_lines(whole)[1].startswith("examples: 40 (data rows 0-39; ")
