"""The report's runner (analyses/core/runner.py): one Task per analysis, the task file read once."""
from __future__ import annotations

import builtins
import json

import pandas as pd
import pytest

import headscope as hs
from headscope.analyses.core import task_rows, task_sources


def _counting_opens(monkeypatch, path) -> list[str]:
    """The modes the task file readers (task_sources, task_rows) open `path` with, from now on."""
    opened: list[str] = []

    def counting(file, *args, **kwargs):
        if str(file) == str(path):
            opened.append(args[0] if args else kwargs.get("mode", "r"))
        return builtins.open(file, *args, **kwargs)

    for module in (task_sources, task_rows):
        monkeypatch.setattr(module, "open", counting, raising=False)
    return opened


def test_the_budget_shrinks_heads_on_a_100000_row_file(tiny_models, tmp_path, monkeypatch):
    """#33 item 2: on a held 100,000-row task file, the heads analysis's examples knob, cut by a tiny
    budget, gives the Task heads runs on exactly the budgeted rows (not the file's 100,000, not the
    preset's 16), which the run's summary records; the file is opened once, by TaskFile.held."""
    from headscope.analyses.core import runner

    path = tmp_path / "big.jsonl"
    with open(path, "w") as fh:
        fh.writelines(json.dumps({"prompt": f"w{i % 20} w{(i + 1) % 20} w{(i + 2) % 20}", "answer": f" w{(i + 3) % 20}"})
                      + "\n" for i in range(100_000))
    opened = _counting_opens(monkeypatch, path)
    model = tiny_models["gpt2"]
    held = hs.TaskFile(str(path)).held()
    plans = runner.plan_analyses(model, ["heads"], held)
    plans = runner.resolve_plans(model, plans, ["heads"], dict(quick=True))
    assert len(plans["heads"].resolved) == 16  # HeadsConfig's quick size
    fitted = runner.fit_to_budget(model, plans, ["heads"], 1e-6)  # below any machine's speed: every knob cut
    assert fitted["heads"].changed["n_examples"] == [None, 8]  # halved to the knob's floor (budget.MIN_EXAMPLES)
    plan = runner.apply_budget(model, plans, fitted)["heads"]
    assert plan.config.n_examples == 8 and len(plan.run_task) == 8
    assert runner.run_planned(model, "heads", plan, 0).result.summary["n_examples"] == 8
    assert opened == ["rb"]


def test_a_report_reads_its_task_file_once(tiny_models, tmp_path, monkeypatch):
    """#33 item 2: `headscope report --task FILE` opens the file once (its sha256, the checked rows, the
    contract and each analysis's sample all read the held bytes)."""
    from headscope.reports.report import build_report

    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"w{i % 9} w{i % 7} w{i % 5}", "answer": f" w{i % 4}"}) + "\n"
                            for i in range(12)))
    opened = _counting_opens(monkeypatch, path)
    out = build_report(tiny_models["gpt2"], out=tmp_path / "out", analyses="kv", task=str(path), quick=True)
    assert opened == ["rb"]
    assert json.loads((out / "kv" / "task.json").read_text())["n_examples"] == 12


def test_the_runner_hands_run_the_task_it_resolved(tiny_models, tmp_path):
    """The plan's Task is the one `run` gets: a held task file resolves to a seeded sample of the
    family's size, the same rows as reading the file itself (load_task)."""
    from headscope.analyses.core import runner

    model = tiny_models["gpt2"]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"w{i % 9} w{i % 7} w{i % 5}", "answer": f" w{i % 4}"}) + "\n"
                            for i in range(50)))
    held = hs.TaskFile(str(path)).held()
    plans = runner.plan_analyses(model, ["kv"], held)
    plans = runner.resolve_plans(model, plans, ["kv"], dict(seed=3, quick=True))
    task = plans["kv"].resolved
    direct = hs.load_task(model, str(path), n_examples=16, seed=3)  # kv's quick size, read from the disk
    assert len(task) == 16 and task.tokens.equal(direct.tokens) and task.answers.equal(direct.answers)
    assert plans["kv"].run_task is task


def test_the_python_api_refuses_the_examples_the_cli_refuses():
    """#33 item 6: heads needs 2 examples (a resample partner), probes 3 (cross-validation's folds): the
    configs refuse fewer as the CLI's --n-examples does, one ConfigError line."""
    import pytest

    from headscope.analyses.heads import HeadsConfig
    from headscope.analyses.probes import ProbesConfig

    with pytest.raises(hs.ConfigError, match=r"^n_examples \(--n-examples\) 1 is too few for HeadsConfig: it needs at least 2"):
        HeadsConfig(n_examples=1)
    with pytest.raises(hs.ConfigError, match=r"too few for ProbesConfig: it needs at least 3\.$"):
        ProbesConfig.preset(n_examples=2)
    assert HeadsConfig(n_examples=2).n_examples == 2 and ProbesConfig(n_examples=3).n_examples == 3


def test_a_failure_is_an_object_with_its_type_message_and_traceback():
    """#33 item 3: a failed analysis travels as a runner.Failure, not a status string to parse."""
    from headscope.analyses.core.runner import Failure

    try:
        raise hs.TaskError("no pairs: bad")
    except hs.TaskError as err:
        mistake = Failure.of("patching", err)
    try:
        {}["x"]
    except KeyError as err:
        bug = Failure.of("kv", err)
    assert (mistake.error_type, mistake.message, mistake.mistake) == ("TaskError", "no pairs: bad", True)
    assert mistake.status == "failed: TaskError: no pairs: bad" and "raise hs.TaskError" in mistake.traceback
    assert (bug.error_type, bug.mistake) == ("KeyError", False) and "Traceback" in bug.traceback


def test_a_bugs_status_names_the_analysis_and_the_architecture_and_says_it_is_headscopes():
    """Review 17b C3: compare and the report showed a bug as its raw exception text ("RuntimeError: output with
    shape [2, 1, 96] ..."), which reads as if the settings or the dtype were at fault; the status line now names
    the analysis and the model's architecture, in one line."""
    from types import SimpleNamespace

    from headscope.analyses.core.runner import Failure

    model = SimpleNamespace(facts=SimpleNamespace(architecture="FalconForCausalLM"))
    try:
        raise RuntimeError("output with shape [2, 1, 96] doesn't match the broadcast shape [2, 10, 96]\nsecond line")
    except RuntimeError as err:
        bug = Failure.of("patching", err, model)
    assert bug.status == ("failed: patching does not run on FalconForCausalLM yet, an internal error rather than a "
                          "setting (RuntimeError: output with shape [2, 1, 96] doesn't match the broadcast shape "
                          "[2, 10, 96]); please report it")
    assert Failure.of("kv", KeyError("x")).status == ("failed: kv does not run yet, an internal error rather than a "
                                                      "setting (KeyError: 'x'); please report it")


def test_the_explorer_shows_every_task_the_sections_used_each_sample_first(zoo_model, monkeypatch):
    """#34 item 1: the explorer holds one group per task the report's sections used (position's own sweeps
    and probes' data included), each starting with the sample prompt that section's provenance line shows
    (task.json's, decoded by the tokenizer: a path apart from the explorer's string tokens), then at most 2
    other rows of that task; a pattern is the one a plain capture of that row gives. Past MAX_VALUES every
    sample is still shown, and nothing else."""
    import numpy as np

    from headscope.analyses.core import attention_capture, runner
    from headscope.hooks import capture, site
    from headscope.reports.explorer import explorer_data, pattern_from_data
    from headscope.reports.provenance import task_record

    model, names = zoo_model, ["heads", "attribution", "position", "patching", "mlp", "kv", "probes", "circuits"]
    plans = runner.resolve_plans(model, runner.plan_analyses(model, names, None), names, dict(quick=True))
    ran = {name: runner.ran_on(model, name, plans[name]) for name in names}
    captured = runner.explorer_capture(model, None, plans, names, ran=ran)
    examples = captured.examples
    tasks = list(dict.fromkeys(e["task_name"] for e in examples))
    assert tasks == ["kv", "zoo_kv", "ioi", "facts"]  # in report order of first use; position's sweep and probes' kv count
    assert examples[0]["task"] == "kv (heads, attribution, kv, probes)"
    for name in names:
        record = task_record(model, name, ran[name], {}, plans[name].used)
        (i,) = [i for i, e in enumerate(examples) if name in e["sample_of"]]
        group = [e for e in examples if e["task_name"] == examples[i]["task_name"]]
        assert group[0] is examples[i] and name in group[0]["sections"]  # the section's sample opens its task's group
        tokens = examples[i]["tokens"]  # the model's tokens; the section's sample is the user's text, without BOS
        tokens = tokens[1:] if tokens[0] == model.tokenizer.bos_token else tokens
        assert " ".join(tokens) == record["sample"]["prompt"]  # the zoo's word-level decode
    for task in tasks:
        group = [e for e in examples if e["task_name"] == task]
        assert 2 <= len(group) <= 3 and all(not e["sample_of"] for e in group[1:])
        assert len({tuple(e["tokens"]) for e in group}) == len(group)  # no row twice
    data = explorer_data(model.facts, captured)
    (pos,) = [i for i, e in enumerate(examples) if e["sample_of"] == ["position"]]
    row = ran["position"][1].tokens[:1]  # [1, pos]: the sweep's first row, the provenance's sample
    acts = capture(model, row, [site("pattern", 3)], to_cpu=True)
    assert np.allclose(pattern_from_data(data, pos, 3, 5), acts[site("pattern", 3)][0, 5].numpy(),
                       atol=0.5 / data["scale"] + 1e-6)

    monkeypatch.setattr(attention_capture, "MAX_VALUES", 1)  # the budget spent: the samples only, every one
    shown = runner.explorer_capture(model, None, plans, names, ran=ran).examples
    assert [e["task_name"] for e in shown] == tasks
    assert [(e["tokens"], e["sample_of"]) for e in shown] == [(e["tokens"], e["sample_of"]) for e in examples if e["sample_of"]]


ONE_TOKEN_SECTIONS = ("attribution", "mlp", "kv", "probes", "circuits")


def _mixed_file(path, lengths) -> list[dict]:
    """A task file whose row i has an answer of lengths[i] tokens under the tiny word-level tokenizer (w0..w59),
    one-token wrong answers, corrupted prompts of the prompt's length; one-token answers repeat (probes' classes)."""
    rows = [{"prompt": f"w{i % 9} w{i % 9 + 1} w{i % 9 + 2}", "answer": "".join(f" w{20 + i % 3 + k}" for k in range(n)),
             "corrupted_prompt": f"w{i % 9} w{i % 9 + 30} w{i % 9 + 2}", "wrong_answer": f" w{40 + i % 4}"}
            for i, n in enumerate(lengths)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_sections_reading_one_next_token_run_on_the_one_token_rows_of_a_mixed_task(tiny_models, tmp_path):
    """Reviews 12a A2 / 12c C1: a task whose answers have 1 or 2 tokens. The five sections that read one next-token
    answer run on exactly the rows whose answer is one token (counted here with the tokenizer itself), not on their
    defaults; each plan line and provenance says so with the counts, the sample is one of those rows, and the
    finding starts with the same sentence. heads (which scores the continuation) keeps every row."""
    from headscope.analyses.core import runner
    from headscope.analyses.core.task_sources import RowSubset
    from headscope.reports.provenance import provenance_lines, subset_sentence, task_record

    model = tiny_models["llama"]
    lengths = [1, 2, 1, 1, 2, 2, 1, 1, 2, 1, 1, 2, 1, 2, 1]  # 9 one-token rows, 6 two-token
    rows = _mixed_file(tmp_path / "mixed.jsonl", lengths)
    n_ids = [len(model.tokenizer(r["answer"], add_special_tokens=False)["input_ids"]) for r in rows]
    assert n_ids == lengths  # the fixture's tokenizer counts as the test means
    one = [i for i, n in enumerate(n_ids) if n == 1]
    held = hs.TaskFile(str(tmp_path / "mixed.jsonl")).held()
    names = [*ONE_TOKEN_SECTIONS, "heads"]
    with pytest.warns(hs.HeadscopeWarning, match="wrong answers are not used"):
        plans = runner.plan_analyses(model, names, held)
    line = ("your task (mixed.jsonl): only the rows whose answer is one token under this tokenizer, 9 of its 15 (the "
            "other 6 have answers of 2 tokens; this analysis reads one next-token answer)")
    for name in ONE_TOKEN_SECTIONS:
        assert isinstance(plans[name].task, RowSubset) and plans[name].used == line, name
    assert plans["heads"].used == "your task (mixed.jsonl)"
    with pytest.warns(hs.HeadscopeWarning, match="wrong answers are not used"):  # heads reads every row
        plans = runner.resolve_plans(model, plans, names, dict(seed=0))
    for name in ONE_TOKEN_SECTIONS:
        data = runner.ran_on(model, name, plans[name])
        assert data.source_rows.tolist() == one, name  # exactly the one-token rows, numbered as the file's
        assert data.continuation is None and data.metric == "logit_diff", name  # one next token, wrong answers read
        for k, r in enumerate(one):  # each row by hand: its prompt ends where its answer is read
            ex = data.example(k)
            prompt = model.tokenizer(rows[r]["prompt"], add_special_tokens=False)["input_ids"]
            assert ex.tokens[0, -len(prompt):].tolist() == prompt
            assert int(ex.answers[0]) == model.tokenizer(rows[r]["answer"], add_special_tokens=False)["input_ids"][0]
        record = task_record(model, name, data, {}, plans[name].used, user_rows=task_rows.read_numbered_rows(held))
        assert record["rows"] == one and record["n_examples"] == 9
        lines = provenance_lines(record)
        assert lines[0] == "task: mixed, from " + line, name
        assert f" + {rows[one[0]]['prompt']!r} -> {rows[one[0]]['answer']!r}" in lines[-1], lines  # a row it used
    assert runner.ran_on(model, "heads", plans["heads"]).source_rows.tolist() == list(range(15))
    assert subset_sentence(line) == ("This section used only the rows whose answer is one token under this tokenizer, "
                                     "9 of the task's 15 (the other 6 have answers of 2 tokens; this analysis reads one "
                                     "next-token answer).")
    assert subset_sentence("your task (mixed.jsonl)") == ""


def _mixed_task(model, lengths):
    """A ready-made Task (hs.prompt_task) whose row i has an answer of lengths[i] tokens under the tiny word-level
    tokenizer, and the prompts and answers of its one-token rows."""
    prompts = [f"w{i % 9} w{i % 9 + 1} w{i % 9 + 2}" for i in range(len(lengths))]
    answers = ["".join(f" w{20 + i % 3 + k}" for k in range(n)) for i, n in enumerate(lengths)]
    counted = [len(model.tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers]
    assert counted == list(lengths)  # the tokenizer counts as the test means
    one = [i for i, n in enumerate(lengths) if n == 1]
    return hs.prompt_task(model, prompts, answers), [prompts[i] for i in one], [answers[i] for i in one]


def test_run_analysis_on_a_ready_made_task_of_mixed_answers_runs_on_its_one_token_rows(tiny_models, tmp_path):
    """Issue #34: hs.run_analysis and the report's plan treat a Task of 1- and 2-token answers as the report treats
    a task file: an analysis reading one next-token answer runs on the 9 one-token rows (its result equals the same
    analysis on a Task built from those rows alone), the summary's task_used, repr and finding say so first; the
    report's plan hands it the same rows instead of its default task. Fewer than 8 such rows: one TaskError line."""
    from headscope.analyses.core import runner
    from headscope.reports.findings import finding

    model = tiny_models["llama"]
    task, prompts, answers = _mixed_task(model, [1, 2, 1, 1, 2, 1, 1, 2, 1, 1, 2, 1, 2])  # 8 one-token rows of 13
    config = hs.MLPConfig.preset(quick=True)
    got = hs.run_analysis("mlp", model, task, config)
    alone = hs.run_analysis("mlp", model, hs.prompt_task(model, prompts, answers), config)
    pd.testing.assert_frame_equal(got.df, alone.df)
    assert got.summary["n_task_examples"] == alone.summary["n_task_examples"] == 8
    line = ("your task (prompt): only the rows whose answer is one token under this tokenizer, 8 of its 13 (the other 5 "
            "have answers of 2 tokens; this analysis reads one next-token answer)")
    assert got.summary["task_used"] == line and "task_used" not in alone.summary
    assert f"task_used={line!r}" in repr(got)
    said = ("This section used only the rows whose answer is one token under this tokenizer, 8 of the task's 13 (the "
            "other 5 have answers of 2 tokens; this analysis reads one next-token answer). ")
    assert finding("mlp", got.summary) == said + finding("mlp", alone.summary)
    plan = runner.plan_analyses(model, ["mlp", "heads"], task)  # the report, handed the same Task object
    assert plan["mlp"].used == line and plan["mlp"].task.tokens.tolist() == alone_tokens(model, prompts)
    assert plan["heads"].task is task  # heads scores the whole continuation: every row

    _mixed_file(tmp_path / "mixed.jsonl", [1, 2, 1, 1, 2, 1, 1, 2, 1, 1, 2, 1, 2])  # the same rule on a task file
    with pytest.warns(hs.HeadscopeWarning, match="wrong answers are not used"):
        from_file = hs.run_analysis("mlp", model, str(tmp_path / "mixed.jsonl"), config)
    assert from_file.summary["task_used"] == ("your task (mixed.jsonl): only the rows whose answer is one token under this "
                                              "tokenizer, 8 of its 13 (the other 5 have answers of 2 tokens; this "
                                              "analysis reads one next-token answer)")
    assert from_file.summary["n_task_examples"] == 8

    few, _, _ = _mixed_task(model, [1, 2, 1, 1, 2, 1, 1, 2, 1, 1, 2])  # 7 one-token rows
    with pytest.raises(hs.TaskError, match=r"^mlp cannot run on your task \(prompt\): the task's answers are up to 2 "
                       r"tokens long .*; only 7 of its 11 rows have a one-token answer, fewer than the 8 it needs to run "
                       r"on those rows alone\.$"):
        hs.run_analysis("mlp", model, few, config)


def alone_tokens(model, prompts) -> list[list[int]]:
    """The prompts as the model runs them: BOS (the tiny tokenizer adds none; headscope prepends it) + the words."""
    bos = model.tokenizer.bos_token_id
    return [[bos, *model.tokenizer(p, add_special_tokens=False)["input_ids"]] for p in prompts]


def test_below_the_minimum_of_one_token_rows_a_section_falls_back_and_says_how_many(tiny_models, tmp_path):
    """Fewer one-token rows than contract.MIN_ONE_TOKEN_ROWS (8): the default task, its reason counting them and
    naming the minimum; asked for one analysis, the same reason as one TaskError line. An empty or unknown row
    subset is one clear error."""
    from headscope.analyses.core import runner
    from headscope.analyses.core.contract import MIN_ONE_TOKEN_ROWS
    from headscope.analyses.core.task_sources import RowSubset

    model = tiny_models["llama"]
    assert MIN_ONE_TOKEN_ROWS == 8
    _mixed_file(tmp_path / "few.jsonl", [1, 2, 2, 1, 2, 1, 1, 2, 1, 1, 2, 1])  # 7 one-token rows of 12
    held = hs.TaskFile(str(tmp_path / "few.jsonl")).held()
    with pytest.warns(hs.HeadscopeWarning):
        plans = runner.plan_analyses(model, list(ONE_TOKEN_SECTIONS), held)
    why = ("default task (the task's answers are up to 2 tokens long and this analysis reads one next-token answer at "
           "the last position (heads and patching score the whole continuation); only 7 of its 12 rows have a "
           "one-token answer, fewer than the 8 it needs to run on those rows alone)")
    assert all(plans[name].task is None and plans[name].used == why for name in ONE_TOKEN_SECTIONS), plans
    with pytest.warns(hs.HeadscopeWarning), pytest.raises(hs.TaskError, match=r"^mlp cannot run on your task \(few.jsonl\):"
                                                          r" .*only 7 of its 12 rows have a one-token answer, fewer than the 8"):
        runner.plan_analyses(model, ["mlp"], held, substitute=False)
    with pytest.raises(hs.TaskError, match="needs at least one row number"):
        RowSubset(held, [])
    with pytest.raises(hs.TaskFileError, match=r"few.jsonl' has no row 40, 41; a row subset names rows"):
        hs.load_task(model, RowSubset(held, [0, 40, 41]))


def test_the_explorer_falls_back_to_the_users_prompt_answer_file_not_the_default(tiny_models, tiny_dirs, tmp_path):
    """Review diff5 item 1: with position in the plan, any .jsonl task counted as position's own records (by its
    suffix), so where no section's data was found the explorer showed the heads default instead of the user's task.
    A prompt/answer file (heads runs on it, position on its default): the explorer's rows are the file's prompts as
    the Hugging Face tokenizer writes them. A file of position's QA records (the shipped example) that position did
    not take (its records did not fit) is no prompt/answer task either: the explorer keeps the default there."""
    from importlib.resources import files

    from transformers import AutoTokenizer

    from headscope.analyses.core import runner

    model = tiny_models["gpt2"]
    prompts = [f"w{i} w{i + 1} w{i + 2}" for i in range(1, 9)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": f" w{i + 20}"}) + "\n" for i, p in enumerate(prompts)))
    held = hs.TaskFile(str(path)).held()
    plans = runner.plan_analyses(model, ["heads", "position"], held)
    assert plans["position"].task is None and plans["heads"].task == held  # the premise: position on its default
    shown = runner.explorer_capture(model, held, plans, []).examples
    tok = AutoTokenizer.from_pretrained(tiny_dirs["gpt2"])
    written = {tuple(tok.convert_ids_to_tokens(tok(p, add_special_tokens=False)["input_ids"])) for p in prompts}
    bos = model.tokenizer.bos_token
    assert shown and all(tuple(t for t in e["tokens"] if t != bos) in written for e in shown), [e["tokens"] for e in shown]
    records = str(files("headscope.analyses") / "data" / "multidoc_example.jsonl")
    fallback = {"position": runner.Plan(task=None, used="default task (its records do not fit)")}
    kept = runner.explorer_capture(model, records, fallback, []).examples  # read as prompts, the file is an error
    assert [e["tokens"] for e in kept] == [e["tokens"] for e in runner.explorer_capture(model, None, fallback, []).examples]


def test_each_analysis_says_its_unequal_pairs_once_by_name_after_the_budget(tiny_models, tmp_path, caplog):
    """Reviews 18b C3, 18w C2: the CLI printed the unequal-token-length warning once per analysis, five of seven for
    analyses that patch no pairs (nothing changes for them), and probes' own load of the whole file warned a seventh
    time with a count no analysis had. A 20-row file whose rows 1, 4 and 12 have a corrupted prompt one token short:
    patching (quick: 8 rows) and circuits (its edges patch pairs) each warn once, after the budget, naming themselves,
    with the count of their own sampled rows; heads (quick: 16 of the 20) warns nothing and is one INFO line with its
    count; probes (two answer classes to probe), run on all 20 rows (a load of its own), warns nothing."""
    import logging
    import warnings

    from headscope.analyses.core import runner

    model, path = tiny_models["gpt2"], tmp_path / "t.jsonl"
    rows = [{"prompt": f"w{i} w{i + 1} w{i + 2}", "answer": f" w{i % 2 + 3}", "wrong_answer": f" w{i % 2 + 5}",
             "corrupted_prompt": f"w{i + 9} w{i + 1} w{i + 2}"}
            for i in range(20)]
    for i in (1, 4, 12):
        rows[i]["corrupted_prompt"] = f"w{i + 9} w{i + 1}"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = hs.TaskFile(str(path)).held()
    names = ["heads", "patching", "circuits", "probes"]
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger=runner.log.name):
        warnings.simplefilter("always")
        plans = runner.plan_analyses(model, names, held)
        plans = runner.resolve_plans(model, plans, names, dict(quick=True))
        before = [str(w.message) for w in caught if "another token length" in str(w.message)]
        runner.apply_budget(model, plans, {})
        said = [str(w.message) for w in caught if "another token length" in str(w.message)]
        probes = runner.run_planned(model, "probes", plans["probes"], seed=0)
    assert probes.failure is None and probes.result.summary["n_examples"] == 20  # it loaded all 20 rows itself
    assert before == [] and len(said) == 2, said
    assert [str(w.message) for w in caught if "another token length" in str(w.message)] == said  # probes: none
    short = {}
    for name in ("heads", "patching", "circuits"):  # the sampled rows whose corrupted prompt is short
        short[name] = [r for r in plans[name].resolved.source_rows.tolist() if r in (1, 4, 12)]
        assert short[name]  # seed 0's sample holds at least one of them (else it would not warn)
    assert len(plans["patching"].resolved.source_rows) == 8
    assert said[0].startswith(f"patching: Task file {str(path)!r}: {len(short['patching'])} corrupted prompt(s) have "
                              f"another token length than their prompt (line {short['patching'][0] + 1}, row "
                              f"{short['patching'][0]}: ")
    assert said[0].endswith("; patching patches pairs and leaves those rows out.")
    assert said[1].startswith(f"circuits: Task file {str(path)!r}: {len(short['circuits'])} corrupted prompt(s) have")
    assert said[1].endswith("; circuits leaves those rows out of the parts that patch pairs and uses every row elsewhere.")
    info = [r.getMessage() for r in caplog.records if "another token length" in r.getMessage()]
    assert len(plans["heads"].resolved) == 16
    assert info == [f"Task file {str(path)!r}: heads ({len(short['heads'])} rows) has corrupted prompts of another "
                    "token length than their prompt; this analysis patches no pairs and uses every row."]


def test_other_warnings_of_each_resolution_are_reissued_once():
    """A warning every analysis's task resolution raises (not a sample warning) is shown once, not once per analysis."""
    import warnings

    from headscope.analyses.core import runner as hs_runner

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        for name in ("heads", "patching", "kv"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                warnings.warn("a column was read as text: review 18 diff-read", UserWarning, stacklevel=1)
            hs_runner._named_warnings(name, caught)
    assert [str(w.message) for w in shown] == ["a column was read as text: review 18 diff-read"]


def test_each_run_shows_its_own_reissued_warnings_once(monkeypatch):
    """A warning every analysis's task resolution raises is shown once per run, and again by a second run in the same
    process (a notebook's second report), as the first run showed it: resolve_plans starts the re-issued set afresh."""
    import warnings

    from headscope.analyses.core import runner as hs_runner

    def warning_task(name, model, task, config):
        warnings.warn("a column was read as text: one per run", UserWarning, stacklevel=1)

    monkeypatch.setattr(hs_runner.registry, "family_task", warning_task)
    names = ["heads", "patching", "kv"]
    for _ in range(2):
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("default")
            plans = {n: hs_runner.Plan(task=None, used="default task") for n in names}
            hs_runner.resolve_plans(None, plans, names, dict(quick=True))
        assert [str(w.message) for w in shown] == ["a column was read as text: one per run"]
