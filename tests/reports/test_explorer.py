"""The attention explorer: captured data, escaping, report embedding, and the page in headless Chromium."""
from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest
import torch

from browser import chromium_path, open_page
from headscope.errors import ConfigError
from headscope.hooks import capture, site
from headscope.reports import io, prompt_box
from headscope.reports.explorer import (
    MAX_ATTENTION,
    SINK,
    AttentionExplorer,
    attention_explorer_data,
    explorer_data,
    pattern_from_data,
    show_attention,
    write_explorer_data,
)
from headscope.reports.explorer_view import caveat_scores, explorer_html, link_heads, muted_scores, undetermined_caveat
from headscope.reports.html_report import write_report_files
from tests_support import hf_model

XSS = "<script>alert(1)</script>"
PROMPTS = ["w1 w2 w3 w4 w5 w6 w1 w2 w3", "w7 w8 w9 w10 w7"]
needs_chromium = pytest.mark.skipif(chromium_path() is None, reason="needs Debian's chromium (.ci/run installs it)")


def reference(model, prompt: str) -> torch.Tensor:
    """Every layer's pattern [L, H, q, k] of one prompt, captured directly."""
    tokens = model.to_tokens(prompt)
    sites = [site("pattern", l) for l in range(model.facts.n_layers)]
    acts = capture(model, tokens, sites, to_cpu=True)
    return torch.stack([acts[s][0] for s in sites]).float()


@pytest.fixture(scope="module")
def llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def data(llama):
    return attention_explorer_data(llama, PROMPTS)


def test_data_holds_every_heads_pattern_to_the_rounding(llama, data):
    f = llama.facts
    assert (data["n_layers"], data["n_heads"], data["n_kv_heads"]) == (f.n_layers, f.n_heads, f.n_kv_heads) == (2, 4, 2)
    assert len(data["examples"]) == 2
    for i, prompt in enumerate(PROMPTS):
        ref = reference(llama, prompt)
        ex = data["examples"][i]
        assert ex["tokens"] == llama.to_str_tokens(llama.to_tokens(prompt)[0]) and ex["tokens"][0] == "<bos>"
        assert ex["text"] == prompt  # the prompt list's label: the prompt as typed, no <bos>
        stored = torch.tensor([[pattern_from_data(data, i, l, h) for h in range(f.n_heads)] for l in range(f.n_layers)])
        assert stored.shape == ref.shape
        assert torch.allclose(stored, ref, atol=0.5 / data["scale"] + 1e-7)
        rows = [(q, r) for layer in ex["patterns"] for head in layer for q, r in enumerate(head)]
        assert all(len(r) <= q + 1 for q, r in rows)  # causal rows: the zeros after the diagonal are left out
    sink = np.mean([reference(llama, p)[:, :, 1:, 0].mean(-1).numpy() for p in PROMPTS], axis=0)
    assert np.allclose(data["scores"][SINK], sink, atol=1e-5)
    assert data["default_score"] == MAX_ATTENTION


def test_inputs_truncation_and_scores(llama):
    tokens = llama.to_tokens(["w1 w2 w3 w4 w5 w6 w7 w8", "w9 w8 w7 w6 w5 w4 w3 w2"])
    data = attention_explorer_data(llama, tokens, max_examples=1, max_tokens=4)
    ex = data["examples"][0]
    assert len(data["examples"]) == 1 and len(ex["tokens"]) == 4 and ex["truncated"] and ex["n_tokens_total"] == 9
    full = reference(llama, "w1 w2 w3 w4 w5 w6 w7 w8")  # [L, H, q, k] of the whole prompt, plain Hugging Face
    kept = [0, 6, 7, 8]  # review 14c C5: the first token and the end (the query, the answer position), not the start
    assert ex["positions"] == kept and ex["cut"] == [1, 5] and ex["tokens"] == [ex_t for i, ex_t in enumerate(
        llama.to_str_tokens(tokens[0])) if i in kept]
    assert np.allclose(pattern_from_data(data, 0, 1, 3), full[1, 3][kept][:, kept], atol=1e-4)
    assert ex["text"] == "\u2026 w6 w7 w8"  # <bos> has no label; the cut shown

    from headscope.analyses.core.tasks import Task

    padded = torch.tensor([[2, 5, 6, 7, 1, 1], [2, 8, 9, 10, 11, 12]])  # right-padded (pad id 1)
    task = Task(name="padded", tokens=padded, answers=torch.tensor([5, 6]), metric="logprob",
                attention_mask=(padded != 1).long())
    from_task = attention_explorer_data(llama, task)
    assert [len(e["tokens"]) for e in from_task["examples"]] == [4, 6] and from_task["source"] == "padded"
    assert np.allclose(pattern_from_data(from_task, 0, 0, 1), reference(llama, "w1 w2 w3")[0, 1], atol=1e-4)

    table = pd.DataFrame([{"layer": l, "head": h, "head_name": f"L{l}H{h}", "method": m, "importance": l + h / 10 + (m == "zero"),
                           "sink": 0.5, "role": "induction" if h == 1 else "other"}
                          for m in ("gradient", "zero") for l in range(2) for h in range(4)])
    scored = attention_explorer_data(llama, "w1 w2 w3", head_scores=table, default_score="importance (zero)")
    assert scored["scores"]["importance (gradient)"][1][2] == pytest.approx(1.2)
    assert scored["scores"]["importance (zero)"][1][2] == pytest.approx(2.2)
    assert scored["labels"] == {"role": [["other", "induction", "other", "other"]] * 2}
    assert "head_name" not in scored["scores"] and "head_name" not in scored["labels"]
    mine = {"mine": np.arange(8.0).reshape(2, 4), "gaps": [[float("nan")] * 4] * 2}
    arrays = attention_explorer_data(llama, "w1 w2", head_scores=mine)
    assert arrays["default_score"] == "mine" and arrays["scores"]["gaps"][0][0] is None
    json.dumps(arrays, allow_nan=False)
    with pytest.raises(ConfigError, match="shape"):
        attention_explorer_data(llama, "w1 w2", head_scores=np.zeros((3, 4)))
    with pytest.raises(ConfigError, match="default_score"):
        attention_explorer_data(llama, "w1 w2", default_score="nope")


def test_fragment_escapes_every_string_and_keeps_explorers_apart(data):
    hostile = json.loads(json.dumps(data))
    hostile["examples"][0]["tokens"][1] = XSS
    hostile["model"] = "</script><img src=x onerror=alert(2)>"
    hostile["labels"] = {"<b>role</b>": [["<i>x</i>"] * 4] * 2}
    page = explorer_html(hostile)
    assert XSS not in page and "<img" not in page and "<b>" not in page and "<i>" not in page
    assert page.count("</script>") == 2  # the data block's end and the code's end, nothing inside
    block = re.search(r'<script type="application/json" class="hsx-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(block) == hostile
    ids = re.findall(r'<div class="hsx" id="([^"]+)"', explorer_html(data) + explorer_html(data))
    assert len(set(ids)) == 2
    with pytest.raises(ValueError):
        explorer_html(data, uid='x" onclick="alert(1)')


def test_show_attention_displays_itself_in_notebooks(llama, tmp_path):
    view = show_attention(llama, "w1 w2 w3 w4")
    assert isinstance(view, AttentionExplorer) and "2 layers x 4 heads" in repr(view)
    html = view._repr_html_()
    assert html.startswith('<div class="hsx"') and "hsx-data" in html
    assert "http" not in html.replace("http://www.w3.org/2000/svg", "")  # nothing to fetch
    assert view.save(tmp_path / "x.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.skipif(prompt_box.ipywidgets() is None, reason="needs ipywidgets (the test extra installs it)")
@pytest.mark.filterwarnings("ignore:1 word:UserWarning")
def test_show_attention_in_a_kernel_has_a_prompt_box_that_rerenders_on_a_typed_prompt(llama, tiny_dirs, monkeypatch):
    """Outside a kernel the explorer is plain HTML; in one it is a prompt box (a widget, its HTML the
    fallback): typing a prompt (the Text's value, which Enter sends) puts in the Output an explorer on
    that prompt's tokens whose patterns are plain Hugging Face's attentions. Without ipywidgets: the
    HTML under one sentence; prompt_box=False: plain HTML."""
    view = show_attention(llama, "w1 w2 w3 w4")
    assert set(view._repr_mimebundle_()) == {"text/html", "text/plain"}  # no kernel: as before
    monkeypatch.setattr(prompt_box, "live_kernel", lambda: True)
    bundle = view._repr_mimebundle_()
    assert bundle[prompt_box.WIDGET_MIME]["model_id"] and bundle["text/html"].startswith('<div class="hsx"')
    assert set(show_attention(llama, "w1 w2", prompt_box=False)._repr_mimebundle_()) == {"text/html", "text/plain"}

    box = view.prompt_box()
    prompt = "w5 w6 w7 w5 w6 w9 w5"
    box.text.value = prompt  # what pressing Enter does (continuous_update=False)
    (shown,) = box.output.outputs
    block = re.search(r'class="hsx-data">(.*?)</script>', shown["data"]["text/html"], re.S).group(1)
    data = json.loads(block)
    tokens = llama.to_tokens(prompt)  # [1, pos]
    assert [e["tokens"] for e in data["examples"]] == [llama.to_str_tokens(tokens[0])] and box.status.value == ""
    with torch.no_grad():
        ref = hf_model(tiny_dirs["llama"])(tokens, output_attentions=True).attentions  # per layer [1, head, q, k]
    got = torch.tensor([[pattern_from_data(data, 0, l, h) for h in range(4)] for l in range(2)])  # [L, H, q, k]
    assert torch.allclose(got, torch.stack([a[0] for a in ref]).float(), atol=1e-4)
    box.text.value = "ioi"  # typed text is a prompt (here <bos> <unk>), never the zoo task of that name
    assert box.explorer.data["source"] == "prompts" and len(box.explorer.data["examples"]) == 1
    assert box.explorer.data["examples"][0]["tokens"] == llama.to_str_tokens(llama.to_tokens("ioi")[0])
    before = box.output.outputs
    box.text.value = "  "  # nothing typed: a hint, the explorer stays
    assert "Type a prompt" in box.status.value and box.output.outputs == before

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # not installed: the explorer under one sentence
    bundle = view._repr_mimebundle_()
    assert prompt_box.WIDGET_MIME not in bundle and bundle["text/html"].startswith(prompt_box.NO_WIDGETS + '<div class="hsx"')


def test_the_grid_opens_on_a_measured_importance_when_the_gradient_is_under_its_floor(llama, tmp_path):
    """Review 11b B2: the report called the gradient "rounding, not a measurement" and the explorer still opened on
    it; it opens on zero-ablation then (and on the gradient while it is a measurement)."""
    heads = tmp_path / "heads"
    heads.mkdir()
    io.write_csv(heads / "results.csv", pd.DataFrame([{"layer": l, "head": h, "method": m, "importance": float(h)}
                                                       for m in ("gradient", "zero") for l in range(2) for h in range(4)]))
    tokens = llama.to_tokens(["w1 w2 w3 w4"])
    io.write_json(heads / "summary.json", {"degenerate_gradient": "every head's |gradient importance| is below 0.0017"})
    assert io.read_json(write_explorer_data(llama, tmp_path, tokens))["default_score"] == "importance (zero)"
    io.write_json(heads / "summary.json", {"n_heads": 8})  # the gradient measures: it stays the opening score
    assert io.read_json(write_explorer_data(llama, tmp_path, tokens))["default_score"] == "importance (gradient)"
    # review 15a C2: at chance every importance is muted, and the gradient is also under its floor: zero-ablation
    io.write_json(heads / "summary.json", {"degenerate_gradient": "every head's |gradient importance| is below 0.0057",
                                           "chance": {"at_chance": True, "reason": "its CI contains 0"}})
    assert io.read_json(write_explorer_data(llama, tmp_path, tokens))["default_score"] == "importance (zero)"


def test_report_embeds_the_explorer_from_its_file(llama, tmp_path):
    model_info = {"name": "tiny", "family": "llama", "n_layers": 2, "n_heads": 4, "d_model": 64}
    write_report_files(tmp_path, [], {}, model_info)
    assert "hsx" not in (tmp_path / "report.html").read_text()  # no explorer.json: no section, no script
    heads = tmp_path / "heads"
    heads.mkdir()
    io.write_csv(heads / "results.csv", pd.DataFrame([{"layer": l, "head": h, "method": "gradient", "importance": float(h),
                                                       "role": "other"} for l in range(2) for h in range(4)]))
    tokens = llama.to_tokens(["w1 w2 w3 w4 w5 w1 w2 w3", "w6 w7 w8 w9 w6 w7 w8 w9"])
    path = write_explorer_data(llama, tmp_path, tokens)
    stored = io.read_json(path)
    assert stored["default_score"] == "importance (gradient)" and stored["labels"]["role"][0][0] == "other"
    write_report_files(tmp_path, [], {}, model_info)
    page = (tmp_path / "report.html").read_text()
    assert page.count('id="hsx-report"') == 1 and "<h2 id='explorer'>" in page
    assert "explorer.json" in (tmp_path / "report.md").read_text()


# ---- headless Chromium ---------------------------------------------------------------------
def _heatmap(page, uid: str) -> tuple[list[int], np.ndarray]:
    """([example, layer, head] shown, the displayed values [q, k]) of one explorer's heatmap."""
    shown = page.evaluate(f"(function(){{var t=document.querySelector('#{uid} .hsx-heat');"
                          "return [+t.dataset.example, +t.dataset.layer, +t.dataset.head];})()")
    rows = page.evaluate(f"Array.from(document.querySelectorAll('#{uid} .hsx-heat tbody tr')).map("
                         "function(r){return Array.from(r.querySelectorAll('td')).map(function(c){return +c.dataset.v;});})")
    return shown, np.array(rows)


@contextmanager
def _explorer_page(tmp_path, **explorers):
    """Headless Chromium on a bare page of explorer_html(data, uid=uid) for each uid=data given, in order."""
    page_file = tmp_path / f"{'-'.join(explorers)}.html"
    page_file.write_text("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>x</title></head><body>"
                         + "".join(explorer_html(data, uid=uid) for uid, data in explorers.items()) + "</body></html>")
    with open_page(page_file) as page:
        yield page


def _masked_cells(page, uid: str) -> list[tuple[int, int]]:
    """The sorted (query, key) of every hatched (masked) cell in one explorer's heatmap."""
    cells = page.evaluate(f"Array.from(document.querySelectorAll('#{uid} .hsx-heat td.hsx-masked'))"
                          ".map(function(c){return [+c.dataset.q, +c.dataset.k];})")
    return sorted(map(tuple, cells))


GEMMA_PROMPT = "the cat sat on the mat and the dog ran to the park with a ball"


def _gemma2(arch_dirs, arch_models) -> tuple[object, int, list[torch.Tensor]]:
    """The Gemma 2 fixture (layer 0 slides over 8 keys, layer 1 global), GEMMA_PROMPT's token count n and plain
    Hugging Face's attentions on it, per layer [head, q, k]."""
    model = arch_models("gemma2")
    tokens = model.to_tokens(GEMMA_PROMPT)  # [1, n]
    with torch.no_grad():
        att = [a[0].float() for a in hf_model(arch_dirs["gemma2"])(tokens, output_attentions=True).attentions]
    return model, tokens.shape[1], att


def choose(page, uid: str, index: int, value: str) -> None:
    """Pick `value` in the explorer's index-th <select> (0 example, 1 colour, 2 view), as a change event."""
    page.evaluate(f"(function(){{var s=document.querySelectorAll('#{uid} select')[{index}]; s.value={json.dumps(value)};"
                  "s.dispatchEvent(new Event('change'));})()")


def test_more_tasks_add_their_examples_within_the_budget(llama, monkeypatch):
    """A report's other tasks: their examples follow the first task's, each labelled, patterns as captured
    directly; none is added once the stored values reach MAX_VALUES."""
    from headscope.analyses.core import attention_capture

    both = attention_explorer_data(llama, PROMPTS[:1], more_tasks={"b (patching)": [PROMPTS[1], PROMPTS[0]]},
                                   more_examples=1)
    assert [e["task"] for e in both["examples"]] == ["prompts", "b (patching)"]
    got = np.array(pattern_from_data(both, 1, 1, 3))
    assert np.allclose(got, reference(llama, PROMPTS[1]).numpy()[1, 3], atol=0.5 / both["scale"] + 1e-6)
    monkeypatch.setattr(attention_capture, "MAX_VALUES", 1)
    assert len(attention_explorer_data(llama, PROMPTS[:1], more_tasks={"b": [PROMPTS[1]]})["examples"]) == 1


def test_a_sample_prompt_is_kept_whole_when_it_fits_and_every_sample_past_the_budget(llama, monkeypatch):
    """capture_shown: a section's 60-token sample keeps every token (its patterns are the whole prompt's)
    where the task's other rows keep their first max_tokens (32 here); with the budget spent the sample is
    still shown, cut to max_tokens."""
    from headscope.analyses.core import attention_capture
    from headscope.analyses.core.attention_capture import Shown, capture_shown

    long = " ".join(f"w{i % 9 + 1}" for i in range(59))
    row, other = llama.to_tokens(long)[0], llama.to_tokens(long.replace("w1 ", "w2 "))[0]
    shown = [Shown(task="t", sections=("position",), samples=((row, ("position",)),), rows=(other,))]
    captured = capture_shown(llama, shown, max_tokens=32)
    assert [(len(e["tokens"]), e["truncated"], e["sample_of"]) for e in captured.examples] == [
        (60, False, ["position"]), (32, True, [])]
    data = explorer_data(llama.facts, captured)
    assert np.allclose(pattern_from_data(data, 0, 1, 3), reference(llama, long).numpy()[1, 3], atol=0.5 / data["scale"] + 1e-6)
    monkeypatch.setattr(attention_capture, "MAX_VALUES", 1)
    assert [(len(e["tokens"]), e["sample_of"]) for e in capture_shown(llama, shown, max_tokens=32).examples] == [
        (32, ["position"])]


def _forced_shown(llama):
    """The explorer's Shown task of a Task whose row 0 answers 'w6 w7 w8' (3 tokens: the prompt runs on with 'w6 w7',
    teacher-forced) and row 1 'w9' (one token), as a report's runner hands it over (runner.explorer_shown)."""
    from types import SimpleNamespace

    from headscope.analyses.core.runner import explorer_shown
    from headscope.analyses.core.tasks import Task

    rows = [llama.to_tokens("w1 w2 w3 w4 w5 w6 w7")[0], llama.to_tokens("w1 w2 w3 w4 w5 w6 w8")[0]]
    ids = [llama.to_single_token(f" w{i}") for i in (6, 7, 8, 9)]
    task = Task(name="t", tokens=torch.stack(rows), answers=torch.tensor([ids[2], ids[3]]), metric="logprob",
                continuation=torch.tensor([[ids[0], ids[1], ids[2]], [-1, -1, ids[3]]]))
    return rows, explorer_shown(llama, {"patching": SimpleNamespace(skip=None)}, ["patching"], {"patching": task}), task


def test_the_explorer_data_marks_where_a_several_token_answers_forced_pieces_start(llama):
    """Review 11b C1: '... is with Ptolem' read as the prompt. A row that runs on with its answer's first 2 tokens
    has answer_from = its length - 2 and its prompt and pieces as text; a one-token answer's row has none. In a
    report (the runner's Shown) and in show_attention's data of the Task alike."""
    from headscope.analyses.core.attention_capture import capture_shown

    rows, shown, task = _forced_shown(llama)
    n = len(rows[0])
    for first, other in (capture_shown(llama, shown).examples, attention_explorer_data(llama, task)["examples"]):
        assert first["answer_from"] == n - 2 and first["tokens"][n - 2:] == ["w6", "w7"]  # this word tokenizer's pieces
        assert first["prompt_text"].endswith("w4 w5") and first["answer_text"] == "w6 w7"
        assert "answer_from" not in other and "prompt_text" not in other


@needs_chromium
def test_the_explorer_marks_an_answers_teacher_forced_pieces_in_chromium(llama, tmp_path):
    """The token strip, the heat map's key and query labels and the lines view style the forced pieces (class
    hsx-forced, a tooltip line 'answer, teacher-forced'), the first one with a separator; a line says where the
    prompt ends, and the prompt list shows its end, a separator and the pieces; the one-token row has no mark."""
    from headscope.analyses.core.attention_capture import capture_shown

    rows, shown, _ = _forced_shown(llama)
    data = explorer_data(llama.facts, capture_shown(llama, shown))
    n = len(rows[0])
    marked = ("function(q){return Array.from(document.querySelectorAll(q)).map(function(t){return "
              "[t.classList.contains('hsx-forced'), t.classList.contains('hsx-forced-first'), "
              "/answer, teacher-forced/.test(t.title)];});}")
    want = [[i >= n - 2, i == n - 2, i >= n - 2] for i in range(n)]
    with _explorer_page(tmp_path, fo=data) as page:
        assert page.console_errors == []
        assert page.evaluate(f"({marked})('#fo .hsx-tokens .hsx-tok')") == want
        assert page.evaluate(f"({marked})('#fo .hsx-heat th[data-k]')") == want
        assert page.evaluate(f"({marked})('#fo .hsx-heat th[data-q]')") == want
        line = page.evaluate("document.querySelector('#fo .hsx-forcedline').textContent")
        assert f"answer, teacher-forced: the prompt ends before position {n - 2}" in line
        assert page.evaluate("document.querySelector('#fo select').options[0].textContent").endswith(
            "w4 w5 \u2016 w6 w7 (answer, teacher-forced)")
        choose(page, "fo", 2, "lines")
        lines = page.evaluate("Array.from(document.querySelectorAll('#fo .hsx-lines text.hsx-forced')).length")
        assert lines == 2 * 2  # each forced piece as query and as key
        choose(page, "fo", 0, "1")
        assert page.evaluate("document.querySelectorAll('#fo .hsx-forced').length") == 0
        assert page.evaluate("getComputedStyle(document.querySelector('#fo .hsx-forcedline')).display") == "none"


def test_link_heads_links_head_names_in_text_only():
    html = ('<p class="finding"><b><a href="#heads">L0H1</a></b>: L1H3 and L2H0, L1H30, L10H1; '
            '<img alt="L0H2">xL1H1</p>')
    assert link_heads(html, 2, 4) == (
        '<p class="finding"><b><a href="#heads">L0H1</a></b>: <a class="head-link" href="#L1H3">L1H3</a> and L2H0, '
        'L1H30, L10H1; <img alt="L0H2">xL1H1</p>')
    assert link_heads("L1H3 L0H0", 2, 4, "patching") == ('<a class="head-link" href="#L1H3@patching">L1H3</a> '
                                                        '<a class="head-link" href="#L0H0@patching">L0H0</a>')
    assert link_heads("L1H3", 2, 4, '"><b>') == '<a class="head-link" href="#L1H3">L1H3</a>'  # not a section name


@pytest.fixture(scope="module")
def shown_report(llama, tmp_path_factory):
    """A report folder on two tasks: heads ran on task a (sample PROMPTS[0]), patching on task b (sample
    PROMPTS[1], one more row); position's finding names a head but the explorer holds no prompt of its."""
    from headscope.analyses.core.attention_capture import Shown, capture_shown

    tmp_path = tmp_path_factory.mktemp("shown")
    rows = [llama.to_tokens(p)[0] for p in PROMPTS]
    captured = capture_shown(llama, [Shown(task="a", sections=("heads",), samples=((rows[0], ("heads",)),)),
                                     Shown(task="b", sections=("patching",), samples=((rows[1], ("patching",)),),
                                           rows=(rows[1], rows[0]))])
    write_explorer_data(llama, tmp_path, captured=captured)
    io.write_json(tmp_path / "heads" / "summary.json", {"roles": {"induction": ["L1H2"]}})
    io.write_json(tmp_path / "patching" / "summary.json", {
        "metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 2, "clean_metric": 2.0,
        "corrupted_metric": -2.0, "top_sites": {"head_out": [{"layer": 1, "head": 3, "pos": None, "token": "", "effect": 1.5}]}})
    io.write_json(tmp_path / "position" / "summary.json", {"retrieval_heads": [[0, 1]]})
    names = ["heads", "patching", "position"]
    write_report_files(tmp_path, names, dict.fromkeys(names, "done"), {"name": "tiny", "family": "llama"})
    return tmp_path


def test_head_names_link_to_the_explorer_on_their_sections_prompt(shown_report):
    """#34 item 2: each section's head names (patching's head_out site, heads' roles) link to #L1H3@<section>
    (the section whose sample prompt the explorer holds), in the findings list and in the section; a
    section without a prompt there links to the head alone."""
    data = io.read_json(shown_report / "explorer.json")
    assert [(e["task"], e["sample_of"]) for e in data["examples"]] == [
        ("a (heads)", ["heads"]), ("b (patching)", ["patching"]), ("b (patching)", [])]  # b's second row: PROMPTS[0]
    page = (shown_report / "report.html").read_text()
    rows = re.findall(r'<p class="finding"><b><a href="#(\w+)">.*?</p>', page, re.S)
    assert rows == ["heads", "patching", "position"]
    links = {name: re.findall(r'class="head-link" href="([^"]+)"', part)
             for name, part in re.findall(r'<p class="finding"><b><a href="#(\w+)">(.*?)</p>', page, re.S)}
    assert links == {"heads": ["#L1H2@heads"], "patching": ["#L1H3@patching"], "position": ["#L0H1"]}
    sections = re.findall(r'<h2 id="(\w+)">.*?<p class="finding">(.*?)</p>', page, re.S)
    assert [(n, re.findall(r'href="(#L[^"]+)"', t)) for n, t in sections] == [
        ("heads", ["#L1H2@heads"]), ("patching", ["#L1H3@patching"]), ("position", ["#L0H1"])]


@needs_chromium
def test_a_head_link_opens_that_head_on_its_sections_prompt_in_chromium(llama, shown_report):
    """Clicking patching's L1H3 (its section's finding) opens layer 1 head 3 on patching's sample prompt
    (task b, PROMPTS[1]), from whatever example was shown; heads' L1H2 (the findings list) on heads' (PROMPTS[0])."""
    refs = [reference(llama, p).numpy() for p in PROMPTS]  # [L, H, q, k] each
    tol = 0.5 / io.read_json(shown_report / "explorer.json")["scale"] + 1e-6
    title = "document.querySelector('#hsx-report .hsx-title').textContent"
    with open_page(shown_report / "report.html") as page:
        choose(page, "hsx-report", 0, "2")  # task b's other row, PROMPTS[0]
        page.click("#patching ~ p.finding a.head-link")
        page.settle(0.1)
        shown, values = _heatmap(page, "hsx-report")
        assert shown == [1, 1, 3] and np.allclose(values, refs[1][1, 3], atol=tol)
        assert page.evaluate("document.querySelector('#hsx-report select').value") == "1"
        assert "example 2 of b (patching), the sample prompt of patching" in page.evaluate(title)
        assert page.evaluate("document.querySelector('#hsx-report .hsx-title a').getAttribute('href')") == "#L1H3@patching"
        page.click("#findings + p a.head-link")
        page.settle(0.1)
        shown, values = _heatmap(page, "hsx-report")
        assert shown == [0, 1, 2] and np.allclose(values, refs[0][1, 2], atol=tol)
        choose(page, "hsx-report", 0, "2")
        page.click("#heads ~ p.finding a.head-link")  # the same link again (no hashchange): back on its prompt
        page.settle(0.1)
        assert _heatmap(page, "hsx-report")[0] == [0, 1, 2]
        page.settle()
        assert page.console_errors == [] and page.requests == []


@needs_chromium
def test_explorer_in_chromium_shows_the_captured_patterns(llama, data, tmp_path):
    hostile = json.loads(json.dumps(data))
    hostile["examples"][1]["tokens"][2] = XSS
    refs = [reference(llama, p).numpy() for p in PROMPTS]
    tol = 0.5 / data["scale"] + 1e-6
    with _explorer_page(tmp_path, one=hostile, two=data) as page:
        assert page.console_errors == [] and page.requests == []
        shown, values = _heatmap(page, "two")
        assert shown == [0, 0, 0] and np.allclose(values, refs[0][0, 0], atol=tol)

        page.click("#two td[data-layer='1'][data-head='3']")  # click a head: the view changes to it
        shown, values = _heatmap(page, "two")
        assert shown == [0, 1, 3] and np.allclose(values, refs[0][1, 3], atol=tol)
        assert _heatmap(page, "one")[0] == [0, 0, 0]  # the other explorer is untouched
        assert page.evaluate("document.querySelector('#two .hsx-title').textContent").startswith("Layer 1, head 3 · KV head 1")

        page.press("ArrowLeft")  # keyboard: the focused grid moves the selection
        page.press("ArrowUp")
        shown, values = _heatmap(page, "two")
        assert shown == [0, 0, 2] and np.allclose(values, refs[0][0, 2], atol=tol)
        assert page.evaluate("document.activeElement.dataset.layer + ',' + document.activeElement.dataset.head") == "0,2"
        assert page.evaluate("document.querySelectorAll('#two .hsx-grid td.hsx-sel').length") == 1

        choose(page, "two", 0, "1")  # the second example
        shown, values = _heatmap(page, "two")
        assert shown == [1, 0, 2] and np.allclose(values, refs[1][0, 2], atol=tol)

        page.hover("#two .hsx-heat td[data-q='4'][data-k='1']")  # row 4 and column 1 light up
        lit = page.evaluate("Array.from(document.querySelectorAll('#two .hsx-heat td.hsx-hl'))"
                            ".map(function(c){return c.dataset.q+','+c.dataset.k;})")
        n = values.shape[0]
        assert set(lit) == {f"4,{k}" for k in range(n)} | {f"{q},1" for q in range(n)}
        assert page.evaluate("document.querySelector('#two .hsx-info').textContent").startswith("“w10” (4) attends most to")

        choose(page, "two", 2, "lines")
        lines = page.evaluate("Array.from(document.querySelectorAll('#two .hsx-lines line'))"
                              ".map(function(l){return [+l.dataset.q,+l.dataset.k,+l.dataset.v];})")
        assert lines and all(abs(v - refs[1][0, 2][q, k]) <= tol for q, k, v in lines)

        choose(page, "one", 0, "1")
        assert XSS in page.evaluate("document.querySelector('#one .hsx-tokens').textContent")  # shown as text
        # every key and query label whole, the 25-character token too (it was cut to 6em before)
        cut = page.evaluate("Array.from(document.querySelectorAll('#one .hsx-heat th')).filter(function(t){"
                            "var r=t.getBoundingClientRect(),c=(t.firstElementChild||t).getBoundingClientRect();"
                            "return t.scrollWidth>t.clientWidth||t.scrollHeight>t.clientHeight||c.top<r.top-0.5"
                            "||c.bottom>r.bottom+0.5||c.left<r.left-0.5||c.right>r.right+0.5;})"
                            ".map(function(t){return t.textContent;})")
        assert cut == [] and page.evaluate("document.querySelector('#one .hsx-heat th[data-k=\"2\"]').textContent") == XSS
        choose(page, "one", 2, "lines")
        outside = page.evaluate("Array.from(document.querySelectorAll('#one .hsx-lines text')).filter(function(t){"
                                "var b=t.getBBox();return b.x<0||b.x+b.width>+t.ownerSVGElement.getAttribute('width');})"
                                ".map(function(t){return t.textContent;})")
        assert outside == []
        choose(page, "one", 2, "heatmap")
        assert page.evaluate("document.querySelectorAll('#one .hsx-tokens script, #one .hsx-heat script').length") == 0
        page.settle()
        assert page.console_errors == [] and page.requests == []


# a byte-level BPE's pieces, a lone space; review 20: a carriage return and a zero-width space were blank labels
SPACED = ["<s>", " Sever", "al", " ", "N", "o", " the\n", "\tx", "\r", "\u200b"]
SHOWN = ["<s>", "\u2423Sever", "al", "\u2423", "N", "o", "\u2423the\u21b5", "\u21e5x", "\\r", "\\u200b"]


def test_token_labels_show_spaces_in_pattern_views_and_figures():
    """Review 10a B2: " Sever" lost its space in the labels (read as a word beside "al") and a lone space token
    " " had an empty label. The notebook pattern view and the figures' token ticks show spaces as "␣"."""
    from headscope.reports.plots import token_label
    from headscope.reports.tokens_view import pattern_view

    n = len(SPACED)
    html = pattern_view(np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None], SPACED).html
    rows = re.findall(r"<th style='text-align: right; font-weight: normal'>([^<]*)</th>", html)
    keys = re.findall(r"<th style='writing-mode: vertical-rl; font-weight: normal'>([^<]*)</th>", html)
    assert rows == keys == ["&lt;s&gt;", *SHOWN[1:]]
    assert [token_label(t) for t in SPACED] == SHOWN and token_label("$ x") == "\\$\u2423x"
    from headscope.reports.plots_patching import position_labels

    rows = pd.DataFrame({"pos": [0, 1, 2], "token": ["0: <s>", "1:  Sever", "2:  "]})  # patching's "i: token"
    assert position_labels(rows, [0, 1, 2], 1) == ["0: <s>", "1: \u2423Sever", "2: \u2423"]


@needs_chromium
def test_explorer_labels_show_spaces_in_chromium(data, tmp_path):
    """Review 10a B2 in the explorer: the heatmap's row and column labels, the token strip, the lines view and the
    info line show " Sever" as "␣Sever" and a lone space as "␣" (it was a blank row and column)."""
    spaced = json.loads(json.dumps(data))
    n = len(spaced["examples"][0]["tokens"])
    assert n >= len(SPACED)  # the premise: the first prompt has room for the hand-made tokens
    spaced["examples"][0]["tokens"] = SPACED + [f"w{i}" for i in range(n - len(SPACED))]
    spaced["examples"][0]["text"] = "A Sever  prompt <as> typed"
    want = SHOWN + [f"w{i}" for i in range(n - len(SPACED))]
    texts = "function(q){return Array.from(document.querySelectorAll(q)).map(function(t){return t.textContent;});}"
    with _explorer_page(tmp_path, sp=spaced) as page:
        assert page.console_errors == []
        assert page.evaluate(f"({texts})('#sp .hsx-heat th[data-q]')") == want
        assert page.evaluate(f"({texts})('#sp .hsx-heat th[data-k]')") == want
        assert page.evaluate(f"({texts})('#sp .hsx-tokens .hsx-tok')") == want
        page.hover("#sp .hsx-heat th[data-q='3']")
        assert page.evaluate("document.querySelector('#sp .hsx-info').textContent").startswith("\u201c\u2423\u201d (3)")
        # the prompt list shows the example's text, not its pieces joined by spaces (" Sever" read "  Sever")
        assert page.evaluate("document.querySelector('#sp select').options[0].textContent").endswith(
            spaced["examples"][0]["text"][:60] + ("\u2026" if len(spaced["examples"][0]["text"]) > 60 else ""))
        choose(page, "sp", 2, "lines")
        lines = page.evaluate(f"({texts})('#sp .hsx-lines text')")
        assert lines == ["query", "key"] + [t for t in want for _ in "qk"]  # each token left (query) and right (key)


@needs_chromium
def test_report_with_explorer_loads_in_chromium(llama, tmp_path):
    roles = [{"layer": l, "head": h, "method": "zero", "importance": h - 1.5, "role": XSS if h == 2 else "other"}
             for l in range(2) for h in range(4)]
    io.write_csv(tmp_path / "heads" / "results.csv", pd.DataFrame(roles))
    tokens = llama.to_tokens(["w1 w2 w3 w4 w1 w2 w3", "w5 w6 w7 w8 w5 w6 w7"])
    strs = [str(t) for t in llama.to_str_tokens(tokens[0])]
    ig = [0.0, 2.0, -1.0] + [0.5] * (len(strs) - 3)  # the attribution analysis's scores of example 0's tokens
    io.write_csv(tmp_path / "attribution" / "token_scores.csv", pd.DataFrame(
        [{"example": 0, "position": i, "token": t, "method": "integrated_gradients", "score": v}
         for i, (t, v) in enumerate(zip(strs, ig))]
        + [{"example": 1, "position": i, "token": t + "x", "method": "integrated_gradients", "score": 1.0}
           for i, t in enumerate(strs)]))  # tokens no example has: attached to none
    write_explorer_data(llama, tmp_path, tokens)
    stored = io.read_json(tmp_path / "explorer.json")["examples"]
    assert stored[0]["attribution"] == {"integrated_gradients": ig} and "attribution" not in stored[1]
    io.write_json(tmp_path / "position" / "summary.json", {"retrieval_heads": [[1, 2], [7, 0]]})  # L7H0: no such head
    write_report_files(tmp_path, ["position"], {"position": "done"}, {"name": XSS, "family": "llama"})
    with open_page(tmp_path / "report.html") as page:
        links = "Array.from(document.querySelectorAll('#findings + p a.head-link')).map(function(a){return a.hash;})"
        assert page.evaluate(links) == ["#L1H2"]  # the findings link to a head the explorer has
        assert page.evaluate("document.querySelectorAll('#position ~ p.finding a.head-link').length") == 1
        page.click("#findings + p a.head-link")
        page.settle(0.1)
        assert page.evaluate("[document.querySelector('#hsx-report .hsx-heat').dataset.layer,"
                             "document.querySelector('#hsx-report .hsx-heat').dataset.head]") == ["1", "2"]
        assert page.evaluate("document.querySelectorAll('#hsx-report .hsx-grid td').length") == 8
        background = "document.querySelector('#hsx-report td[data-layer=\\'0\\'][data-head=\\'2\\']').style.background"
        signed = page.evaluate(background)  # importance (zero), signed: a diverging scale
        # h - 1.5 on RdBu_r's ends about 0: L0H2's +0.5 a third of the way to red, L0H0's -1.5 full blue
        assert np.allclose(_rgb(signed), 255 + (np.array([178, 24, 43]) - 255) / 3, atol=0.6)
        assert _rgb(page.evaluate(background.replace("\\'2\\'", "\\'0\\'"))).tolist() == [33, 102, 172]
        choose(page, "hsx-report", 1, "label:role")
        assert page.evaluate(background) != signed
        assert XSS in page.evaluate("document.querySelector('#hsx-report .hsx-legend').textContent")
        assert page.evaluate("document.querySelectorAll('#hsx-report .hsx-legend script').length") == 0
        page.click("#hsx-report td[data-layer='1'][data-head='1']")
        assert page.evaluate("document.querySelector('#hsx-report .hsx-heat').dataset.head") == "1"
        choose(page, "hsx-report", 4, "integrated_gradients")  # tokens shaded by attribution: red +, blue -
        shaded = page.evaluate("Array.from(document.querySelectorAll('#hsx-report .hsx-tok')).map("
                               "function(t){return [+t.dataset.a, getComputedStyle(t).backgroundColor];})")
        assert [a for a, _ in shaded] == ig
        assert shaded[1][1] == "rgb(178, 24, 43)" and shaded[0][1] == "rgb(255, 255, 255)"
        assert np.allclose(_rgb(shaded[2][1]), 255 + (np.array([33, 102, 172]) - 255) * 0.5, atol=0.6)
        assert XSS in page.evaluate("document.body.innerText")
        page.settle()
        assert page.console_errors == [] and page.requests == []


def _rgb(css: str) -> np.ndarray:
    return np.array([float(x) for x in re.findall(r"[\d.]+", css)[:3]])


@needs_chromium
def test_explorer_thumbnails_scale_overlay_pinned_query_and_links_in_chromium(llama, data, tmp_path):
    """A thumbnail per head drawn from its pattern (click opens it, hover previews it), the colour scale
    (attention weight 0..1, white to rgb(103,0,13), the figures' red, the cells on it), heads overlaid (mean, then max), a
    pinned query shading the tokens by its weights, and #L1H3 opening layer 1 head 3; no requests."""
    ref = reference(llama, PROMPTS[0]).numpy()  # [L, H, q, k]
    n_layers, n_heads, n = ref.shape[0], ref.shape[1], ref.shape[-1]
    tol = 0.5 / data["scale"] + 1e-6
    with _explorer_page(tmp_path, x=data) as page:
        thumbs = page.evaluate("Array.from(document.querySelectorAll('#x canvas.hsx-thumb'))"
                               ".map(function(c){return [+c.dataset.layer,+c.dataset.head,c.width,c.height];})")
        assert sorted((l, h) for l, h, _, _ in thumbs) == [(l, h) for l in range(n_layers) for h in range(n_heads)]
        assert all(w == n and hgt == n for _, _, w, hgt in thumbs)  # one pixel per query x key
        red = page.evaluate("(function(){var c=document.querySelector('#x canvas[data-layer=\"1\"][data-head=\"2\"]');"
                            "var d=c.getContext('2d').getImageData(0,0,c.width,c.height).data,o=[];"
                            "for(var i=0;i<d.length;i+=4)o.push(d[i+1]);return o;})()")
        assert np.allclose((255 - np.array(red).reshape(n, n)) / 255, ref[1, 2], atol=0.5 / 255 + tol)  # green: 255 -> 0

        page.hover("#x canvas[data-layer='1'][data-head='2']")  # hover: a preview in the main view
        shown, values = _heatmap(page, "x")
        assert shown == [0, 1, 2] and np.allclose(values, ref[1, 2], atol=tol)
        assert page.evaluate("document.querySelector('#x .hsx-title').textContent").startswith("Preview: Layer 1, head 2")
        page.hover("#x .hsx-help")  # leaving the thumbnails restores the selected head
        assert _heatmap(page, "x")[0] == [0, 0, 0]
        page.click("#x canvas[data-layer='1'][data-head='3']")  # click: opens that head
        shown, values = _heatmap(page, "x")
        assert shown == [0, 1, 3] and np.allclose(values, ref[1, 3], atol=tol)
        assert page.evaluate("document.querySelector('#x .hsx-grid td.hsx-sel').dataset.head") == "3"

        scale = page.evaluate("(function(){var s=document.querySelector('#x .hsx-scale');return [s.textContent,"
                              "s.dataset.min,s.dataset.max,getComputedStyle(s.querySelector('.hsx-ramp')).backgroundImage];})()")
        assert "attention weight" in scale[0] and scale[1:3] == ["0", "1"]
        corner = page.evaluate("(function(){var c=document.querySelector('#x .hsx-corner');"
                               "return [c.textContent,c.scrollWidth<=c.clientWidth&&c.scrollHeight<=c.clientHeight];})()")
        assert corner == ["keys \u2192queries \u2193", True]  # the corner label whole, not cut
        assert "rgb(255, 255, 255)" in scale[3] and "rgb(103, 0, 13)" in scale[3]
        cell = page.evaluate("(function(){var c=document.querySelector('#x .hsx-heat td[data-q=\"3\"][data-k=\"1\"]');"
                             "return getComputedStyle(c).backgroundColor;})()")
        assert np.allclose((255 - _rgb(cell)) / (255 - np.array([103, 0, 13])), ref[1, 3, 3, 1], atol=0.01)

        page.click("#x td[data-layer='0'][data-head='1']", shift=True)  # shift+click: overlay a second head
        shown, values = _heatmap(page, "x")
        assert page.evaluate("document.getElementById('x').dataset.shown") == "L1H3,L0H1"
        assert np.allclose(values, (ref[1, 3] + ref[0, 1]) / 2, atol=2 * tol)
        assert page.evaluate("document.querySelector('#x .hsx-title').textContent").startswith("Mean of 2 heads")
        choose(page, "x", 3, "max")
        assert np.allclose(_heatmap(page, "x")[1], np.maximum(ref[1, 3], ref[0, 1]), atol=2 * tol)
        page.click("#x button.hsx-clear")  # back to one head, the last clicked
        shown, values = _heatmap(page, "x")
        assert shown == [0, 0, 1] and np.allclose(values, ref[0, 1], atol=tol)

        page.click("#x .hsx-tokens .hsx-tok:nth-child(5)")  # pin query 4
        page.hover("#x .hsx-help")  # the shading stays after the pointer leaves
        weights = page.evaluate("Array.from(document.querySelectorAll('#x .hsx-tokens .hsx-tok'))"
                                ".map(function(t){return [+t.dataset.w, getComputedStyle(t).backgroundColor];})")
        assert np.allclose([w for w, _ in weights], ref[0, 1, 4], atol=tol)
        shade = np.array([(255 - _rgb(c)) / (255 - np.array([103, 0, 13])) for _, c in weights])  # [key, rgb]
        assert np.allclose(shade, ref[0, 1, 4][:, None], atol=0.01)

        assert page.evaluate("document.querySelector('#x .hsx-title a').getAttribute('href')") == "#L0H1"
        page.evaluate("location.hash = '#L1H3'")  # a link to a head opens it
        page.settle(0.1)
        shown, values = _heatmap(page, "x")
        assert shown == [0, 1, 3] and np.allclose(values, ref[1, 3], atol=tol)
        page.settle()
        assert page.console_errors == [] and page.requests == []


def test_muted_scores_are_importance_at_chance_or_under_the_noise_floor():
    names = ["importance (gradient)", "importance (zero)", "induction", MAX_ATTENTION, SINK]
    chance = {"at_chance": True, "reason": "the 95% CI [-0.2, 0.3] of the mean logit difference contains chance (0)"}
    muted = muted_scores(names, {"task": "zoo_kv", "chance": chance})
    assert sorted(muted) == ["importance (gradient)", "importance (zero)"]  # patterns' own statistics stay
    assert muted["importance (zero)"].startswith("the model is at chance on the heads task zoo_kv (the 95% CI")
    floor = {"chance": {"at_chance": False}, "degenerate_gradient": "every head's |gradient importance| is below 1e-08"}
    assert list(muted_scores(names, floor)) == ["importance (gradient)"]
    assert muted_scores(names, floor)["importance (gradient)"] == (  # review 15a B2: the gradients are measured
        "the loss changes these gradients predict are under the numerical floor: every head's |gradient importance| "
        "is below 1e-08.")
    both = muted_scores(names, {**floor, "task": "zoo_kv", "chance": chance})  # review 15a C2: at chance, said too
    assert both["importance (gradient)"] == (
        f"the model is at chance on the heads task zoo_kv ({chance['reason']}), so these importances measure noise, "
        "not a mechanism. Also, the loss changes these gradients predict are under the numerical floor: every head's "
        "|gradient importance| is below 1e-08.")
    assert both["importance (zero)"] == muted["importance (zero)"]
    assert muted_scores(names, {"chance": {"at_chance": False}}) == muted_scores(names, None) == {}


@needs_chromium
def test_report_explorer_mutes_importance_at_chance_in_chromium(llama, tmp_path):
    """A heads summary at chance: the importance grid is drawn faint and grey under a note giving the
    reason, the thumbnails keep the patterns' colours; a pattern score (max attention) is in full colour."""
    io.write_csv(tmp_path / "heads" / "results.csv", pd.DataFrame(
        [{"layer": l, "head": h, "method": m, "importance": (h - 1.5) * (l + 1)} for l in range(2) for h in range(4)
         for m in ("gradient", "zero")]))
    reason = "the 95% CI [-0.2, 0.3] of the mean logit difference contains chance (0)"
    io.write_json(tmp_path / "heads" / "summary.json", {"task": "kv", "chance": {"at_chance": True, "reason": reason}})
    write_explorer_data(llama, tmp_path, PROMPTS[0])
    write_report_files(tmp_path, [], {}, {"name": "tiny", "family": "llama"})
    ref = reference(llama, PROMPTS[0]).numpy()  # [L, H, q, k]
    n = ref.shape[-1]
    cells = ("Array.from(document.querySelectorAll('#hsx-report .hsx-grid td')).map("
             "function(c){return getComputedStyle(c).backgroundColor;})")
    note = "(function(){var d=document.querySelector('#hsx-report .hsx-mutednote');return [d.hidden,d.textContent];})()"
    muted = "document.querySelector('#hsx-report .hsx-grid').classList.contains('hsx-muted')"
    with open_page(tmp_path / "report.html") as page:
        hidden, text = page.evaluate(note)
        assert page.evaluate(muted) and not hidden and reason in text and "heads task kv" in text
        colours = np.array([_rgb(c) for c in page.evaluate(cells)])  # [head, rgb]
        assert len(colours) == 8 and (colours.max(1) - colours.min(1)).max() < 40 and colours.min() > 140  # grey, faint
        red = page.evaluate("(function(){var c=document.querySelector('#hsx-report canvas[data-layer=\"1\"][data-head=\"2\"]');"
                            "var d=c.getContext('2d').getImageData(0,0,c.width,c.height).data,o=[];"
                            "for(var i=0;i<d.length;i+=4)o.push(d[i+1]);return o;})()")
        assert np.allclose((255 - np.array(red).reshape(n, n)) / 255, ref[1, 2], atol=0.5 / 255 + 1e-4)  # patterns stay

        choose(page, "hsx-report", 1, "score:" + MAX_ATTENTION)  # the patterns' own score: full colour, no note
        hidden, text = page.evaluate(note)
        assert not page.evaluate(muted) and hidden and text == ""
        colours = np.array([_rgb(c) for c in page.evaluate(cells)])
        peak = ref[:, :, 1:].max(-1).mean(-1).reshape(-1)  # mean over queries (the first left out) of the largest weight
        # unsigned: white at 0 to red at the max, like the figures' Reds (not a blue ramp stretched min..max)
        expected = 255 + (np.array([178, 24, 43]) - 255) * (peak / peak.max())[:, None]  # [head, rgb]
        assert np.allclose(colours, expected, atol=1.5), (colours, expected)
        low = page.evaluate("document.querySelector('#hsx-report .hsx-legend .hsx-lo').textContent")
        assert float(low) == 0.0  # the legend starts at 0, not at the smallest head
        page.settle()
        assert page.console_errors == [] and page.requests == []


UNDETERMINED = {"at_chance": False, "undetermined": True, "metric": "logit_diff", "mean": 1.3, "ci": [-0.735, 3.34],
                "ci_level": 0.95, "n_examples": 4, "task": "kv<b>"}


def test_importance_from_a_section_whose_chance_is_undetermined_carries_its_caveat():
    """Mends: chance undetermined (too wide to tell) in the heads summary: every importance score, and no pattern
    statistic, carries one short line, hand-written here; at chance (muted) or clearly above, none."""
    names = ["importance (gradient)", "importance (zero)", "induction", MAX_ATTENTION, SINK]
    line = ("Read with a caveat: on its 4 examples the heads section cannot tell the model from chance on task kv<b> "
            "(logit difference 1.3, 95% CI [-0.735, 3.34]; too wide to tell either way), as its finding says of these "
            "importances.")
    assert caveat_scores(names, {"chance": UNDETERMINED}) == {"importance (gradient)": line, "importance (zero)": line}
    assert caveat_scores(names, {"chance": {**UNDETERMINED, "undetermined": False}}) == {}
    assert caveat_scores(names, {"chance": {**UNDETERMINED, "at_chance": True}}) == caveat_scores(names, None) == {}
    assert undetermined_caveat({"chance": UNDETERMINED}, "attribution", "these scores").endswith(
        "the attribution section cannot tell the model from chance on task kv<b> (logit difference 1.3, 95% CI "
        "[-0.735, 3.34]; too wide to tell either way), as its finding says of these scores.")


@needs_chromium
def test_report_explorer_shows_the_undetermined_caveat_by_its_importance_grid_in_chromium(llama, tmp_path):
    """The heads section's chance undetermined: the importance grid keeps its colours (not muted) under one line with
    the section's caveat, as text (the task's "<b>" shows as typed, no element); a pattern score shows no caveat; the
    attribution section undetermined too: its line follows the attribution-shaded tokens' legend."""
    io.write_csv(tmp_path / "heads" / "results.csv", pd.DataFrame(
        [{"layer": l, "head": h, "method": "zero", "importance": (h - 1.5) * (l + 1)} for l in range(2) for h in range(4)]))
    io.write_json(tmp_path / "heads" / "summary.json", {"task": "kv<b>", "chance": UNDETERMINED})
    tokens = [t for t in llama.to_str_tokens(PROMPTS[0])]
    io.write_csv(tmp_path / "attribution" / "token_scores.csv", pd.DataFrame(
        [{"example": 0, "position": i, "token": t, "method": "gradient", "score": (-1.0) ** i * (i + 1)}
         for i, t in enumerate(tokens)]))
    io.write_json(tmp_path / "attribution" / "summary.json", {"task": "kv<b>", "chance": UNDETERMINED})
    write_explorer_data(llama, tmp_path, PROMPTS[0])
    write_report_files(tmp_path, [], {}, {"name": "tiny", "family": "llama"})
    line = caveat_scores(["importance (zero)"], {"chance": UNDETERMINED})["importance (zero)"]
    note = "(function(){var d=document.querySelector('#hsx-report .hsx-caveat');return [d.hidden,d.textContent];})()"
    muted = "document.querySelector('#hsx-report .hsx-grid').classList.contains('hsx-muted')"
    with open_page(tmp_path / "report.html") as page:
        hidden, text = page.evaluate(note)
        assert not hidden and text == line and not page.evaluate(muted)
        assert page.evaluate("document.querySelectorAll('#hsx-report .hsx-caveat b').length") == 0
        assert page.evaluate("document.querySelector('#hsx-report .hsx-mutednote').hidden")
        choose(page, "hsx-report", 1, "score:" + MAX_ATTENTION)  # the patterns' own score: no caveat
        assert page.evaluate(note) == [True, ""]
        choose(page, "hsx-report", 1, "score:importance (zero)")
        assert page.evaluate(note) == [False, line]
        shade = page.evaluate("Array.from(document.querySelectorAll('#hsx-report select')).map(function(s){"
                              "return Array.from(s.options).map(function(o){return o.value;});})")
        which = next(i for i, opts in enumerate(shade) if "gradient" in opts)
        choose(page, "hsx-report", which, "gradient")
        info = page.evaluate("document.querySelector('#hsx-report').textContent")
        assert undetermined_caveat({"chance": UNDETERMINED}, "attribution", "these scores") in info
        page.settle()
        assert page.console_errors == [] and page.requests == []


def test_a_report_writes_the_patterns_the_runner_captured_without_computing(llama, tmp_path, monkeypatch):
    """#33 item 3: write_explorer_data(captured=...) draws and writes what the runner captured; nothing is
    captured again (a capture now would fail the write)."""
    from headscope.analyses.core import attention_capture

    captured = attention_capture.capture_examples(llama, PROMPTS[:1])
    monkeypatch.setattr(attention_capture, "capture_example", lambda *a, **k: 1 / 0)
    data = json.loads(write_explorer_data(llama, tmp_path, PROMPTS[:1], captured=captured).read_text())
    assert [e["tokens"] for e in data["examples"]] == [e["tokens"] for e in captured.examples]
    got = np.array(pattern_from_data(data, 0, 1, 3))
    assert np.allclose(got, reference(llama, PROMPTS[0]).numpy()[1, 3], atol=0.5 / data["scale"] + 1e-6)


def test_explorer_leaves_out_integrated_gradients_that_did_not_converge(tmp_path):
    """Review 6, A3: where the attribution summary says IG did not converge, its scores colour no token; the
    other methods' still do."""
    from headscope.reports.explorer import _attach_attribution

    rows = [{"example": 0, "position": i, "token": t, "method": m, "score": v}
            for m, v in (("integrated_gradients", -3.0), ("saliency", 0.5)) for i, t in enumerate(["a", "b"])]
    io.write_csv(tmp_path / "attribution" / "token_scores.csv", pd.DataFrame(rows))
    for converged, methods in ((True, {"integrated_gradients", "saliency"}), (False, {"saliency"})):
        io.write_json(tmp_path / "attribution" / "summary.json", {"ig_converged": converged})
        data = {"examples": [{"tokens": ["a", "b"]}]}
        _attach_attribution(data, tmp_path)
        assert set(data["examples"][0]["attribution"]) == methods
    # review 7b, A3: IG used on its converged examples only (analyses/attribution/convergence.py): example 1 missed
    # completeness, so only example 0's tokens are coloured by IG
    rows += [{**r, "example": 1, "token": r["token"].upper()} for r in rows]
    io.write_csv(tmp_path / "attribution" / "token_scores.csv", pd.DataFrame(rows))
    io.write_json(tmp_path / "attribution" / "summary.json", {
        "n_examples": 3, "ig_converged": False, "ig_n_not_converged": 1, "ig_n_converged": 2, "ig_used": "converged",
        "ig_examples_used": [0, 2]})
    data = {"examples": [{"tokens": ["a", "b"]}, {"tokens": ["A", "B"]}]}
    _attach_attribution(data, tmp_path)
    assert set(data["examples"][0]["attribution"]) == {"integrated_gradients", "saliency"}
    assert set(data["examples"][1]["attribution"]) == {"saliency"}


@needs_chromium
def test_sliding_window_keys_are_hatched_and_the_sink_counts_the_queries_that_see_it(arch_dirs, arch_models, tmp_path):
    """Review 9a B3/B4 on Gemma 2 (layer 0 slides over 8 keys, layer 1 global): the data carries the windows;
    the sink score averages over the queries that can see the first token (plain Hugging Face's attentions);
    in Chromium layer 0's heatmap hatches exactly the keys k <= q - 8 and says the window, layer 1's none."""
    model, n, att = _gemma2(arch_dirs, arch_models)
    data = attention_explorer_data(model, [GEMMA_PROMPT], max_examples=1)
    assert data["windows"] == [8, None] and "windows" not in attention_explorer_data(arch_models("llama3"), ["a b"])
    assert n > 10
    for layer, last in ((0, 7), (1, n - 1)):
        expect = [float(np.mean(att[layer][h, 1:last + 1, 0].numpy())) for h in range(4)]
        assert data["scores"]["sink (examples shown)"][layer] == pytest.approx(expect, abs=1e-4)
    with _explorer_page(tmp_path, w=data) as page:
        assert _masked_cells(page, "w") == [(q, k) for q in range(n) for k in range(n) if k <= q - 8]
        line = page.evaluate("document.querySelector('#w .hsx-windowline').textContent")
        assert "layer 0 attends over a sliding window of 8 keys" in line and "masked" in line
        sink = page.evaluate("document.querySelector('#w .hsx-sinkvalue').textContent")
        assert float(sink) == pytest.approx(data["scores"]["sink (examples shown)"][0][0], abs=1e-3)
        page.click("#w td[data-layer='1'][data-head='0']")
        assert _masked_cells(page, "w") == [] and page.evaluate("document.querySelector('#w .hsx-windowline').textContent") == ""
        assert page.console_errors == [] and page.requests == []


def test_split_utf8_bytes_of_random_byte_level_tokens_read_as_hex_never_replacement_characters(arch_models):
    """Review 12a / 12c C5: the circuits default task "repeat" draws random token ids; under byte-level BPE a
    token can be part of a character's UTF-8 bytes, which decoding alone shows as U+FFFD. On the GPT-2-style
    byte-level fixture: the bytes of "é" (C3 A9) and of "€" (E2 82 AC), each one base-alphabet token."""
    from headscope.analyses.core.attention_capture import capture_example
    from headscope.models.token_text import readable_text, token_strings

    model = arch_models("gpt2")
    tok = model.tokenizer
    vocab = tok.get_vocab()
    c3, a9, e2, x82, ac, a = (vocab[p] for p in ("\u00c3", "\u00a9", "\u00e2", "\u0124", "\u00ac", "a"))
    assert tok.decode([c3]) == "\ufffd" and tok.decode([e2, x82]) == "\ufffd"  # the defect's premise
    assert readable_text(tok, [c3, a9]) == "\u00e9"  # one character across two tokens reads whole
    assert readable_text(tok, [a, c3, a]) == "a<0xC3>a"
    assert readable_text(tok, [e2, x82, a, e2, x82, ac]) == "<0xE2><0x82>a\u20ac"
    assert token_strings(tok, [c3, a9, a, e2]) == ["<0xC3>", "<0xA9>", "a", "<0xE2>"]
    example, _, _ = capture_example(model, torch.tensor([a, c3, a, e2, x82]), 16)
    assert example["text"] == "a<0xC3>a<0xE2><0x82>" and example["tokens"] == ["a", "<0xC3>", "a", "<0xE2>", "<0x82>"]
    assert not any("\ufffd" in t for t in [example["text"], *example["tokens"]])


def test_the_grid_opens_on_the_ablation_the_heads_finding_leads_with(llama, tmp_path):
    """Review 13c B2: MiniLM's finding led with zero-ablation (L5H11, L5H7) while the grid opened on the contrastive
    gradient; it opens on the ablation the finding leads with (its first top_head_<method> record)."""
    heads = tmp_path / "heads"
    heads.mkdir()
    io.write_csv(heads / "results.csv", pd.DataFrame([{"layer": l, "head": h, "method": m, "importance": float(h)}
                                                       for m in ("gradient", "zero", "mean") for l in range(2)
                                                       for h in range(4)]))
    tokens = llama.to_tokens(["w1 w2 w3 w4"])
    top = {"head": "L1H3", "importance": 3.0, "ci": [2.0, 4.0], "n_examples": 8}
    io.write_json(heads / "summary.json", {"n_heads": 8, "top_head_zero": top, "top_heads_gradient": ["L1H3"]})
    assert io.read_json(write_explorer_data(llama, tmp_path, tokens))["default_score"] == "importance (zero)"
    io.write_json(heads / "summary.json", {"top_head_mean": top, "top_head_zero": top})
    assert io.read_json(write_explorer_data(llama, tmp_path, tokens))["default_score"] == "importance (mean)"


@needs_chromium
def test_grid_labels_tell_heads_apart_in_one_unit_in_chromium(llama, tmp_path):
    """Review 13c B2: one significant digit wrote 41 of 72 MiniLM cells as "1e-3" or "2e-3". The cells share one
    unit (x 1e-3, named in the legend) with the largest to 3 significant digits, one digit more where two values
    would still read alike; a 1e-7 score keeps its digits."""
    grid = np.array([[1.2e-3, 1.24e-3, 4.8e-3, 2.0e-3], [1.201e-3, -0.5e-3, 3.1e-3, 1.204e-3]])
    tiny = grid * 1e-4  # [L, H] a bfloat16 gradient's size
    data = attention_explorer_data(llama, "w1 w2", head_scores={"ms": grid, "tiny": tiny}, default_score="ms")
    assert data["scores"]["tiny"][0][1] == pytest.approx(1.24e-7)
    cells = "Array.from(document.querySelectorAll('#g .hsx-grid td .hsx-v')).map(function(c){return c.textContent;})"
    legend = "document.querySelector('#g .hsx-legend').textContent"
    with _explorer_page(tmp_path, g=data) as page:
        assert page.evaluate(cells) == ["1.200", "1.240", "4.800", "2.000", "1.201", "-0.500", "3.100", "1.204"]
        assert "ms (\u00d7 1e-3):" in page.evaluate(legend)
        choose(page, "g", 1, "score:tiny")
        assert page.evaluate(cells) == ["1.200", "1.240", "4.800", "2.000", "1.201", "-0.500", "3.100", "1.204"]
        assert "tiny (\u00d7 1e-7):" in page.evaluate(legend)
        assert page.console_errors == [] and page.requests == []


def test_a_prompt_label_keeps_an_unknown_word_as_unk_escaped(llama):
    """Review 13c C4: show_attention's prompt list read "Mary and John went to the . later" for a prompt whose
    "store" became <unk>: the label shows <unk> where the token strip does, escaped in the page."""
    with pytest.warns(Warning, match="zzz"):
        view = show_attention(llama, "w1 zzz w2", prompt_box=False)
    example = view.data["examples"][0]
    assert example["tokens"][-3:] == ["w1", "<unk>", "w2"] and example["text"] == "w1 <unk> w2"
    page = view._repr_html_()
    assert "<unk>" not in page and "w1 \\u003cunk\\u003e w2" in page


def test_byte_fallback_pieces_registered_as_special_tokens_keep_their_characters_in_a_label():
    """Review 13b C5: a BPE with byte fallback whose 256 byte pieces were registered as special tokens (as a trainer's
    special_tokens) labelled "Extract the value" as "tract the value": decode(skip_special_tokens=True) drops the
    byte pieces. The label keeps them (and drops the BOS, which the token strip shows)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from headscope.models.token_text import prompt_label

    raw = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    raw.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)]
    raw.train_from_iterator(["the value tract", "a tract of the value"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    raw.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                  unk_token="<unk>")
    ids = tok("Extract the value")["input_ids"]
    assert ids[0] == 2 and "<0x45>" in tok.convert_ids_to_tokens(ids)  # the case: <bos>, then 'E' as a byte piece
    assert tok.decode(ids, skip_special_tokens=True) == "tract the value"  # the defect's premise
    assert prompt_label(tok, ids) == "Extract the value"


def test_show_attention_of_a_sliding_layer_hatches_masked_keys_says_the_window_and_draws_its_scale(arch_dirs, arch_models):
    """Review 14c C2: show_attention(model, prompt, layer=, heads=) drew keys outside a sliding window as plain white (zero
    weight), with no colour scale and no word of the window. On Gemma 2 (layer 0 slides over 8 keys, layer 1 global):
    layer 0 hatches exactly the keys k <= q - 8 and says the window in the explorer's sentence; every other cell is
    plain Hugging Face's weight on the explorer's sequential colours (white 0 to rgb(103, 0, 13) at 1, worked by
    hand), under the explorer's colour scale; layer 1 hatches nothing and says no window."""
    model, n, att = _gemma2(arch_dirs, arch_models)
    page = show_attention(model, GEMMA_PROMPT, layer=0, heads=[0, 2])._repr_html_()
    cells = re.findall(r"<td (class='hsx-masked' )?style='[^']*?(?:; background: rgb\((\d+),(\d+),(\d+)\))?' title='([^']*)'>",
                       page)
    assert len(cells) == 2 * n * n
    for i, (masked, r, g, b, title) in enumerate(cells):
        h, q, k = [0, 2][i // (n * n)], i // n % n, i % n
        assert bool(masked) == (k <= q - 8), (h, q, k)
        if masked:
            assert title.endswith(": masked (outside the sliding window)") and not r
            continue
        v = float(title.rsplit(": ", 1)[1])
        assert v == pytest.approx(float(att[0][h, q, k]), abs=1e-4)
        expect = [round(255 + (x - 255) * min(max(v, 0.0), 1.0)) for x in (103, 0, 13)]
        assert abs(int(r) - expect[0]) <= 1 and abs(int(g) - expect[1]) <= 1 and abs(int(b) - expect[2]) <= 1
    assert ("<div class='hsx-windowline'>layer 0 attends over a sliding window of 8 keys: hatched cells are keys outside "
            "it (masked, not zero attention)</div>") in page
    assert ("<span>attention weight:</span><span>0</span>" in page and "rgb(255,255,255),rgb(103,0,13)" in page
            and "(each query&#x27;s weights over the keys sum to 1)" in page and "hsx-masked{background:repeating" in page)
    cut = show_attention(model, GEMMA_PROMPT, layer=0, heads=[1], max_tokens=10)._repr_html_()  # review 14c C5 too
    kept = [0] + list(range(n - 9, n))  # the first token and the end
    cells = re.findall(r"<td (class='hsx-masked' )?style='[^']*' title='([^']*)'>", cut)
    assert [bool(m) for m, _ in cells] == [kept[k] <= kept[q] - 8 for q in range(10) for k in range(10)]
    got = [float(t.rsplit(": ", 1)[1]) for m, t in cells if not m]
    want = [float(att[0][1, kept[q], kept[k]]) for q in range(10) for k in range(10) if not kept[k] <= kept[q] - 8]
    assert got == pytest.approx(want, abs=1e-4) and f"10 of {n} tokens: the first and the last 9, positions 1–{n - 10} cut" in cut
    global_layer = show_attention(model, GEMMA_PROMPT, layer=1, heads=[1])._repr_html_()
    assert "class='hsx-masked'" not in global_layer and "<div class='hsx-windowline'>" not in global_layer
    assert "attention weight:" in global_layer


@needs_chromium
def test_a_cut_example_keeps_its_first_token_and_its_end_in_chromium(arch_dirs, arch_models, tmp_path):
    """Review 14c C5: a prompt longer than max_tokens kept its first 64 tokens, leaving out the query and the answer
    position. It keeps its first token and its last max_tokens - 1, their patterns those of the whole prompt (plain
    Hugging Face, Gemma 2 with layer 0's window of 8); the page says which positions were cut, hatches by the
    positions in the prompt (k <= q - 8) and takes the sink over the shown queries that see the first token."""
    model, n, att = _gemma2(arch_dirs, arch_models)
    data = attention_explorer_data(model, [GEMMA_PROMPT], max_examples=1, max_tokens=10)
    ex = data["examples"][0]
    kept = [0] + list(range(n - 9, n))
    assert ex["positions"] == kept and ex["cut"] == [1, n - 10] and ex["truncated"] and ex["n_tokens_total"] == n
    assert np.allclose(pattern_from_data(data, 0, 0, 1), att[0][1][kept][:, kept], atol=1e-4)
    sees = [i for i, p in enumerate(kept) if 1 <= p < 8]  # layer 0: the shown queries within the window of token 0
    assert data["scores"][SINK][0][1] == pytest.approx(float(att[0][1][kept][sees, 0].mean()) if sees else 0.0, abs=1e-4)
    with _explorer_page(tmp_path, c=data) as page:
        assert _masked_cells(page, "c") == [(q, k) for q in range(10) for k in range(10) if kept[k] <= kept[q] - 8]
        title = page.evaluate("document.querySelector('#c .hsx-title').textContent")
        assert f"(10 of {n} tokens: the first and the last 9; positions 1\u2013{n - 10} cut" in title
        assert page.evaluate("document.querySelector('#c .hsx-gap').title") == f"positions 1\u2013{n - 10} cut"
        assert page.console_errors == [] and page.requests == []


@needs_chromium
def test_the_grid_legends_maximum_sits_beside_its_bar_in_chromium(llama, tmp_path):
    """Review 14c C6: in a notebook the grid's legend "max attention (examples shown): 0.000 [bar]" put its maximum on
    the line below the bar. Measured in Chromium with a long score name: the maximum's label sits to the right of the
    bar, its vertical middle within the bar's line."""
    data = attention_explorer_data(llama, PROMPTS, head_scores={"a long score name that fills the legend": np.ones((2, 4))})
    where = ("(function(){var g=document.querySelector('#m .hsx-legend'),r=g.querySelector('.hsx-ramp'),"
             "s=Array.from(g.querySelectorAll('span')).filter(function(e){return !e.children.length&&e.textContent==='1.00';});"
             "var a=r.getBoundingClientRect(),b=s[s.length-1].getBoundingClientRect();"
             "return [a.left,a.right,a.top,a.bottom,b.left,(b.top+b.bottom)/2];})()")
    with _explorer_page(tmp_path, m=data) as page:
        left, right, top, bottom, label_left, label_mid = page.evaluate(where)
        assert label_left >= right and top - 2 <= label_mid <= bottom + 2, page.evaluate(where)
        for name in (MAX_ATTENTION, SINK):
            choose(page, "m", 1, "score:" + name)
            hi = page.evaluate("document.querySelector('#m .hsx-legend .hsx-hi').getBoundingClientRect().top")
            ramp = page.evaluate("document.querySelector('#m .hsx-legend .hsx-ramp').getBoundingClientRect().bottom")
            assert hi < ramp
        assert page.console_errors == []


@needs_chromium
def test_a_cut_example_whose_shown_queries_cannot_see_the_first_token_measures_no_sink_in_chromium(
        arch_dirs, arch_models, tmp_path):
    """Review 14cv C1: on a cut example whose kept queries all lie beyond a layer's window, the explorer printed "sink
    ... 0.000" with empty bars, a 0 by construction drawn as a measurement. Gemma 2, layer 0's window 8, the first
    token and the last 4 kept: layer 0's cells say no shown query can see the first token and draw no sink bar, as
    does the sink line of a layer-0 head; layer 1 (global) keeps its sink, plain Hugging Face's mean over queries."""
    model, n, att = _gemma2(arch_dirs, arch_models)
    att = att[1]  # [head, q, k]
    data = attention_explorer_data(model, [GEMMA_PROMPT], max_examples=1, max_tokens=5)
    kept = data["examples"][0]["positions"]
    assert kept == [0, *range(n - 4, n)] and n - 4 >= 8  # every kept query but token 0 lies beyond layer 0's window
    cell = "document.querySelector('#s .hsx-grid td[data-layer=\"%d\"][data-head=\"%d\"]')"
    with _explorer_page(tmp_path, s=data) as page:
        zero = page.evaluate(f"[{cell % (0, 1)}.title, getComputedStyle({cell % (0, 1)}.lastChild).display]")
        assert zero[0].endswith("sink (attention on the first token): no shown query can see the first token")
        assert zero[1] == "none"
        one = page.evaluate(f"[{cell % (1, 1)}.title, getComputedStyle({cell % (1, 1)}.lastChild).display]")
        said = float(one[0].rsplit(": ", 1)[1])
        assert said == pytest.approx(float(att[1][kept[1:], 0].mean()), abs=1.5e-3) and one[1] != "none"
        page.evaluate(f"{cell % (0, 1)}.click()")
        line = page.evaluate("document.querySelector('#s .hsx-sinkline').textContent")
        assert line == ("sink: attention on the first token: no shown query can see the first token (every shown query "
                        "lies beyond the window), so none is measured")
        assert page.evaluate("document.querySelectorAll('#s .hsx-sinkline .hsx-bar').length") == 0
        assert page.console_errors == []


def test_rounding_floors_are_the_ablations_figure_floor_not_the_gradients():
    """15av C2: the grid reads the heads summary's rounding_floor_<method>, as the heads figure does; the gradient's
    floor (of its predicted loss change) is not per cell."""
    from headscope.reports.explorer_view import rounding_floors

    names = ["importance (gradient)", "importance (zero)", "induction"]
    s = {"rounding_floor_zero": 0.00390625, "rounding_floor_gradient": 0.044}
    assert rounding_floors(names, s) == {"importance (zero)": 0.00390625}
    assert rounding_floors(names, {"rounding_floor_zero": 0.0}) == rounding_floors(names, None) == {}


@needs_chromium
def test_report_explorer_greys_importance_within_the_rounding_floor_in_chromium(llama, tmp_path):
    """15av C2: zero-ablation importances of one bf16 step (1.95e-3) under the floor 2^-8 read "≈0" on grey, as the heads
    figure's cells; the others keep their colours and values; the legend names the floor."""
    values = [0.00195, 0.0, -0.00195, -0.00586, 0.5, 0.0039, -0.25, 0.00390625]  # [layer x head], 2 x 4
    io.write_csv(tmp_path / "heads" / "results.csv", pd.DataFrame(
        [{"layer": i // 4, "head": i % 4, "method": "zero", "importance": v} for i, v in enumerate(values)]))
    io.write_json(tmp_path / "heads" / "summary.json", {"task": "kv", "chance": {"at_chance": False},
                                                        "rounding_floor_zero": 0.00390625})
    write_explorer_data(llama, tmp_path, PROMPTS[0])
    write_report_files(tmp_path, [], {}, {"name": "tiny", "family": "llama"})
    within = [abs(v) < 2 ** -8 for v in values]  # by hand: the first three and 0.0039 (under 0.00390625)
    assert within == [True, True, True, False, False, True, False, False]
    cells = ("Array.from(document.querySelectorAll('#hsx-report .hsx-grid td')).map(function(c){return "
             "[c.querySelector('.hsx-v').textContent, getComputedStyle(c).backgroundColor];})")
    with open_page(tmp_path / "report.html") as page:
        choose(page, "hsx-report", 1, "score:importance (zero)")
        shown = page.evaluate(cells)
        legend = page.evaluate("document.querySelector('#hsx-report .hsx-legend').textContent")
    assert [t == "\u22480" for t, _ in shown] == within
    assert all(_rgb(c).tolist() == [230, 230, 230] for (_, c), w in zip(shown, within) if w)
    assert all(_rgb(c).tolist() != [230, 230, 230] for (_, c), w in zip(shown, within) if not w)
    assert "within the rounding floor 0.0039" in legend
