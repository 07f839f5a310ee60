"""The report page: findings on top, a table of contents, figures with captions in a grid, CSVs in
<details>, provenance at the bottom; escaping in report.html and report.md; file modes; byte-identical figures."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from browser import chromium_path
from headscope.analyses.core.result import Result
from headscope.reports import io
from headscope.reports.html_report import write_report_files
from headscope.reports.plots import plot_result
from headscope.reports.render import figure_png, md_escape, result_html

XSS = "<img src=x onerror=alert(1)>"
SHA = "0123456789abcdef0123456789abcdef01234567"


def _output(root):
    """A hand-made output folder: a heads analysis (summary, a figure, two CSVs, one empty), a failed
    patching analysis whose error holds user text, and a manifest."""
    heads = root / "heads"
    heads.mkdir(parents=True)
    io.write_json(heads / "summary.json", {"metric": "logit_diff", "baseline_metric": 3.5, "n_heads": 8, "n_examples": 4,
                                           "max_fraction_prunable_ablation": 0.25, "heads_prunable_ablation": 2.0})
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    io.write_figure(heads / "pruning_curve.png", fig)
    plt.close(fig)
    io.write_csv(heads / "curve.csv", pd.DataFrame({"fraction_pruned": [0.0, 0.5], "metric": [3.5, 1.0]}))
    (heads / "empty.csv").write_text("")
    io.write_csv(heads / "long.csv", pd.DataFrame({"row": range(130)}))
    io.write_json(root / "manifest.json", {
        "command": ["headscope", "report", "--seed", "7"], "config": {"task": XSS, "quick": True, "device": "cpu"},
        "model": {"name": "zoo/synth-llama"}, "seed": 7, "git_sha": SHA,
        "versions": {"python": "3.12.0", "torch": "2.9.0"}})
    write_report_files(root, ["heads", "patching"], {"heads": "done", "patching": f"failed: TaskError: bad answer {XSS}"},
                       {"name": "zoo/synth-llama", "family": "llama", "n_layers": 2, "n_heads": 4, "d_model": 16})


def test_page_has_findings_toc_grid_details_and_provenance(tmp_path):
    _output(tmp_path)
    html = (tmp_path / "report.html").read_text()
    toc = re.search(r'<nav class="toc">(.*?)</nav>', html).group(1)
    for anchor in ("findings", "heads", "patching", "provenance"):
        assert f'href="#{anchor}"' in toc and (f'id="{anchor}"' in html or f"id='{anchor}'" in html)
    findings = html[html.index("id='findings'"):html.index('id="heads"')]
    assert "2 of 8 heads (25%)" in findings  # 0.25 x 8
    # alt text says what the figure shows (its caption), not only the file name
    assert '<div class="figs"><figure><img alt="pruning_curve: Metric (y, the task' in html
    assert "<figcaption><b>pruning_curve</b>: Metric" in html
    assert '<details><summary>curve.csv (2 rows) <a href="heads/curve.csv">curve.csv</a></summary>' in html
    assert "<details><summary>empty.csv (empty) <a href=\"heads/empty.csv\">" in html
    long = html[html.index("long.csv (130 rows)"):]
    long = long[:long.index("</details>")]  # the first 100 rows in a scrollable box, then a pointer to the CSV
    assert '<a href="heads/long.csv">' in long and '<div class="scroll">' in long
    assert "<td>99</td>" in long and "<td>100</td>" not in long and "30 more rows in the CSV" in long
    assert ".scroll{max-height:28em;overflow:auto" in html
    assert "<details><summary>summary.json (6 keys)</summary>" in html
    provenance = html[html.index("id='provenance'"):]
    assert SHA in provenance and "<td>7</td>" in provenance and "torch 2.9.0" in provenance
    assert "headscope report --seed 7" in provenance
    assert html.index("id='findings'") < html.index('id="heads"') < html.index("id='provenance'")


def test_user_strings_are_escaped_in_html_and_markdown(tmp_path):
    _output(tmp_path)
    html = (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    assert XSS not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert XSS not in md and "<img" not in md
    assert r"&lt;img src=x onerror=alert\(1\)>" in md  # the task (provenance) and the error (findings, section)
    assert md.count(r"onerror=alert\(1\)") >= 3
    assert md_escape("[a](javascript:x) *b* | c_d") == r"\[a\]\(javascript:x\) \*b\* \| c\_d"


def test_markdown_escape_keeps_plain_punctuation_and_renders_back_to_the_text():
    """Review 16a C3: report.md read "the block&#x27;s input", "p &lt; 0.001", "-&gt;". Only a '<' that opens a tag
    and an '&' that starts an entity are entities now; a CommonMark renderer (markdown-it, raw HTML on) gives back
    each string as typed, and no tag."""
    from html import unescape

    from markdown_it import MarkdownIt

    assert md_escape("the block's input: p < 0.001, A -> B") == "the block's input: p < 0.001, A -> B"
    assert md_escape(XSS) == r"&lt;img src=x onerror=alert\(1\)>" and md_escape("> no quote") == r"\> no quote"
    render = MarkdownIt("commonmark", {"html": True})
    for text in ("the block's input: p < 0.001, A -> B", XSS, "&lt;b&gt; & co", "> no quote", "[a](javascript:x) *b*",
                 "</p><script>x</script>", "<http://example.com>", "x<3 & y>2"):
        page = render.render(md_escape(text))
        assert "<img" not in page and "<script" not in page and "<a " not in page and "<blockquote" not in page
        assert unescape(page.strip().removeprefix("<p>").removesuffix("</p>")) == text, (text, page)


def test_files_honour_the_umask(tmp_path):
    """Atomic writes give 0666 & ~umask (mkstemp alone gives 0600), checked in a child with its own umask."""
    code = ("import os, sys; from pathlib import Path\n"
            "from headscope.reports import io\n"
            "for mask in sys.argv[2:]:\n"
            "    os.umask(int(mask, 8)); folder = Path(sys.argv[1]) / mask\n"
            "    io.write_text(folder / 'a.txt', 'x'); io.write_json(folder / 'b.json', {})\n")
    modes = {"022": 0o644, "077": 0o600, "002": 0o664}
    subprocess.run([sys.executable, "-c", code, str(tmp_path), *modes], check=True)
    for mask, mode in modes.items():
        assert {stat.S_IMODE(os.stat(tmp_path / mask / n).st_mode) for n in ("a.txt", "b.json")} == {mode}, mask
    _output(tmp_path / "report")  # this process's umask applies to the report files too
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(os.stat(tmp_path / "report" / "report.html").st_mode) == 0o666 & ~mask


def _kv_result(seed: int = 0) -> Result:
    """A kv Result with per-example metrics, so that the eviction plot draws a bootstrap band."""
    rng = np.random.default_rng(seed)
    rows = [{"policy": p, "budget": b, "example": e, "metric": float(rng.normal(b / 8, 1))}
            for p in ("window", "sink_window") for b in (4, 8, 16) for e in range(12)]
    rows += [{"policy": "full", "budget": 64, "example": e, "metric": 2.0} for e in range(12)]
    norms = pd.DataFrame({"layer": [0, 0, 1, 1], "kv_head": 0, "position": [0, 1, 0, 1], "kind": "key",
                          "norm": [3.0, 1.0, 2.5, 1.2]})
    sinks = pd.DataFrame({"layer": [0, 1], "sink_mass": [0.4, 0.7], "baseline_mass": [0.1, 0.1], "baseline": "uniform",
                          "sink_key_norm_ratio": 2.0})
    return Result(name="kv", df=pd.DataFrame(rows), summary={"metric_unevicted": 2.0},
                  tables={"norms": norms, "sinks": sinks}, config={"seed": seed})


def test_same_result_gives_byte_identical_figures():
    result = _kv_result()
    first = {stem: figure_png(fig) for stem, fig in plot_result(result).items()}
    np.random.seed(12345)  # global state must not matter
    second = {stem: figure_png(fig) for stem, fig in plot_result(result).items()}
    plt.close("all")
    assert set(first) == {"kv_eviction", "kv_norms", "kv_sinks"}
    assert first == second


def test_notebook_view_leads_with_the_finding():
    result = Result(name="heads", df=pd.DataFrame({"a": [1]}),
                    summary={"metric": "logit_diff", "baseline_metric": 0.01, "n_heads": 4, "n_examples": 2}, tables={},
                    config={})
    html = result_html(result, with_figures=False)
    assert "<p class='finding'>Unpruned logit difference is 0.01 over 2 examples. The model is at chance" in html


@pytest.mark.skipif(chromium_path() is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_page_in_chromium_folds_tables_and_links_the_contents(tmp_path):
    from browser import open_page

    _output(tmp_path)
    with open_page(tmp_path / "report.html") as page:
        assert page.evaluate("document.querySelectorAll('details[open]').length") == 0  # every preview folded
        assert page.evaluate("document.querySelector('details table').checkVisibility()") is False
        page.click("details summary")
        assert page.evaluate("document.querySelectorAll('details[open]').length") == 1
        assert page.evaluate("document.querySelector('details table').checkVisibility()") is True
        page.click("nav.toc a[href='#provenance']")
        page.settle()
        assert page.evaluate("location.hash") == "#provenance"
        assert page.evaluate("document.querySelector('figure img').naturalWidth") > 0  # the inline PNG decodes
        assert SHA in page.evaluate("document.getElementById('provenance').innerText")
        assert page.evaluate("document.querySelectorAll('img[onerror]').length") == 0
        page.settle()
        assert page.console_errors == [] and page.requests == []


def test_header_names_the_mixture_of_experts_and_dense_layers(tmp_path, mixed_moe_dir):
    """Review 11c A3: a Qwen2-MoE with a dense layer among its MoE layers had a header naming no experts; it names
    each kind of layer with its layout, read here from the Hugging Face config (mlp_only_layers, num_experts,
    moe_intermediate_size, num_experts_per_tok, shared_expert_intermediate_size, intermediate_size)."""
    import transformers

    import headscope as hs
    from headscope.reports.report import _experts_per_layer

    c = transformers.AutoConfig.from_pretrained(mixed_moe_dir)
    model = hs.load_model(mixed_moe_dir, device="cpu")
    dense = [l for l in range(c.num_hidden_layers) if l in c.mlp_only_layers]
    moe = [l for l in range(c.num_hidden_layers) if l not in c.mlp_only_layers]
    assert (dense, moe) == ([0], [1])
    info = {"name": "m", "family": "qwen2_moe", "n_layers": c.num_hidden_layers, "n_heads": c.num_attention_heads,
            "n_kv_heads": c.num_key_value_heads, "d_model": c.hidden_size, "d_mlp": c.intermediate_size,
            "experts_per_layer": _experts_per_layer(model)}
    io.write_json(tmp_path / "manifest.json", {"config": {}, "model": {"name": "m"}})
    write_report_files(tmp_path, [], {}, info)
    header = (f"qwen2_moe, 2 layers x 4 heads (2 KV heads: grouped-query attention), d_model 64, layer 0: dense MLP "
              f"({c.intermediate_size}); layer 1: mixture of experts ({c.num_experts} experts x {c.moe_intermediate_size}, "
              f"top-{c.num_experts_per_tok} whose weights are "
              + ("renormalised to sum to 1" if c.norm_topk_prob else
                 "not renormalised (each its softmax probability over all experts)")
              + f", + a shared expert of {c.shared_expert_intermediate_size})")
    assert f"<p>{header}." in (tmp_path / "report.html").read_text()
    assert f"\n\n{md_escape(header)}\n" in (tmp_path / "report.md").read_text()


def test_header_names_kv_heads_and_tied_embeddings(tmp_path, tiny_models):
    """Review 9b C2: a multi-query model with tied embeddings read 'llama, 3 layers x 4 heads, d_model 64'; k/v
    patching and the kv section count KV heads, and DLA and the lens read the embedding as the unembedding."""
    from headscope.reports.render import md_escape
    from headscope.reports.report import _tied_embeddings

    base = {"name": "m", "family": "llama", "n_layers": 3, "n_heads": 4, "d_model": 64}
    cases = [({"n_kv_heads": 1, "tied_embeddings": True},
              "llama, 3 layers x 4 heads (1 KV head: multi-query attention), d_model 64, tied embeddings"),
             ({"n_kv_heads": 2}, "llama, 3 layers x 4 heads (2 KV heads: grouped-query attention), d_model 64"),
             ({"n_kv_heads": 4, "tied_embeddings": False}, "llama, 3 layers x 4 heads, d_model 64")]
    for i, (extra, header) in enumerate(cases):
        root = tmp_path / str(i)
        root.mkdir()
        io.write_json(root / "manifest.json", {"config": {}, "model": {"name": "m"}})
        write_report_files(root, [], {}, {**base, **extra})
        html = (root / "report.html").read_text()
        assert f"<p>{header}." in html and f"\n\n{md_escape(header)}\n" in (root / "report.md").read_text()
    # the storage test agrees with each checkpoint's own config (GPT-2 ties by default; this Llama does not)
    for family in ("gpt2", "llama"):
        model = tiny_models[family]
        assert _tied_embeddings(model) is bool(model.bridge.original_model.config.tie_word_embeddings)
    assert [_tied_embeddings(tiny_models[f]) for f in ("gpt2", "llama")] == [True, False]


def test_header_names_the_sliding_window(tmp_path, arch_models):
    """Review 17c C3: StarCoder2 with every layer over 12 keys read "Starcoder2ForCausalLM, 3 layers x 6 heads (2 KV
    heads: grouped-query attention), d_model 96, tied embeddings, run in bfloat16 on cpu": nothing said that heads,
    position, kv and attribution change their method for the window. The manifest records the windows (Mistral's
    checkpoint: 8 on both layers, its config's sliding_window) and the header names them; a model without windows
    gets no clause."""
    from headscope.models.hooked_model import layer_windows
    from headscope.reports.render import md_escape
    from headscope.reports.report import model_record

    base = {"name": "m", "family": "mistral", "n_layers": 2, "n_heads": 4, "d_model": 64, "n_kv_heads": 2}
    windows = {str(l): w for l, w in enumerate(layer_windows(arch_models("mistral"))) if w}
    assert windows == {"0": 8, "1": 8} and not [w for w in layer_windows(arch_models("llama3")) if w]
    assert model_record(arch_models("mistral"))["attention_windows"] == windows
    cases = [({"attention_windows": windows}, "mistral, 2 layers x 4 heads (2 KV heads: grouped-query attention), "
              "d_model 64, every layer attends over a sliding window of 8 keys"),
             ({"attention_windows": {"0": 8}}, "mistral, 2 layers x 4 heads (2 KV heads: grouped-query attention), "
              "d_model 64, layer 0 attends over a sliding window of 8 keys (the others globally)"),
             ({"attention_windows": {}}, "mistral, 2 layers x 4 heads (2 KV heads: grouped-query attention), d_model 64")]
    for i, (extra, header) in enumerate(cases):
        root = tmp_path / str(i)
        root.mkdir()
        io.write_json(root / "manifest.json", {"config": {}, "model": {"name": "m"}})
        write_report_files(root, [], {}, {**base, **extra})
        assert f"<p>{header}." in (root / "report.html").read_text()
        assert f"\n\n{md_escape(header)}\n" in (root / "report.md").read_text()


def test_header_names_the_scalings_numbers_only_of_sections_that_ran(tmp_path):
    """Review 16a C2: "logits x0.125 (1/8) (the circuits and mlp numbers include them)" on a report whose circuits
    failed (KeyError). The clause names only the sections that produced results."""
    base = {"name": "m", "family": "cohere", "n_layers": 3, "n_heads": 6, "d_model": 96, "logit_scale": 0.125}
    cases = [({"circuits": "failed: KeyError: 'blocks.0.hook_mlp_in'", "mlp": "done"}, " (the mlp numbers include them)"),
             ({"circuits": "done (resumed)", "mlp": "done"}, " (the circuits and mlp numbers include them)"),
             ({"circuits": "failed: x", "mlp": "failed: y"}, "")]
    for i, (status, tail) in enumerate(cases):
        root = tmp_path / str(i)
        root.mkdir()
        io.write_json(root / "manifest.json", {"config": {}, "model": {"name": "m"}})
        write_report_files(root, list(status), status, base)
        header = f"cohere, 3 layers x 6 heads, d_model 96, scalings: logits x0.125 (1/8){tail}"
        assert f"<p>{header}." in (root / "report.html").read_text()
        assert f"\n\n{md_escape(header)}\n" in (root / "report.md").read_text()
