"""The report's figures as matplotlib objects (#21 item 3): units and names on every axis, the plotted
values against the Results' tables, legends off the data, captions, byte-identical PNGs for a seed,
and progress bars (off in the Python API, on in the CLI, no ipywidgets warning)."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.lines import Line2D

import headscope as hs
from headscope.analyses.core.registry import ANALYSES
from headscope.hooks import capture, site
from headscope.reports.explorer import attention_explorer_data
from headscope.reports.findings import caption
from headscope.reports.plots import plot_result
from headscope.reports.plots_attention import top_heads_figure

REPO = Path(__file__).resolve().parents[2]
PATCH_SITES = ("resid_pre", "head_out", "head_out_by_pos", "k", "v")
PROMPTS = ["k01 v05 ; k02 v06 ; k03 v07 ; k01", "k04 v08 ; k05 v09 ; k05"]

# Builds the random 2-layer GQA Llama over the zoo vocabulary (every default task, position's zoo_kv
# included, fits it) and computes each analysis's quick Result; shared by the fixture and the
# byte-identity subprocesses.
BUILD = textwrap.dedent("""
    import torch
    import headscope as hs
    from headscope.analyses.core.registry import ANALYSES, family

    def build(path):
        from transformers import LlamaConfig, LlamaForCausalLM
        from headscope.models.zoo import vocab
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab.VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            bos_token_id=2, eos_token_id=3, pad_token_id=1))
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 2:
                    p.normal_(0.0, 0.2)
        model.save_pretrained(path)
        vocab.build_tokenizer().save_pretrained(path)

    def results(model, sites):
        out = {}
        for name in ANALYSES:
            cls = family(name).config
            extra = {"sites": sites} if name == "patching" else {}
            try:
                cfg = cls.preset(quick=True, n_examples=4, seed=0, **extra)
            except TypeError:  # a preset without `quick`
                cfg = cls.preset(n_examples=4, seed=0, **extra)
            out[name] = hs.run_analysis(name, model, config=cfg)
        return out
""")


def _namespace() -> dict:
    ns: dict = {}
    exec(BUILD, ns)  # noqa: S102 - the module's own helper text, shared with the subprocesses
    return ns


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("figures") / "zoo-vocab-llama"
    _namespace()["build"](path)
    return path


@pytest.fixture(scope="module")
def model(model_dir):
    return hs.load_model(model_dir, device="cpu")


@pytest.fixture(scope="module")
def results(model):
    return _namespace()["results"](model, PATCH_SITES)


@pytest.fixture(scope="module")
def figures(results):
    """{analysis: {stem: Figure}} as plot_result draws them (closed after the module)."""
    with plt.rc_context({"figure.max_open_warning": 0}):  # every figure of every analysis, open at once
        figs = {name: plot_result(r) for name, r in results.items()}
    yield figs
    plt.close("all")


def heat(ax) -> np.ndarray:
    """The values a seaborn heat map drew, [rows, columns] as on screen."""
    mesh = ax.collections[0]
    rows, cols = len(ax.get_yticklabels()), len(ax.get_xticklabels())
    return np.asarray(mesh.get_array(), dtype=float).reshape(rows, cols)


def colorbar_label(ax) -> str:
    """The colour bar's label, its lines joined (a label taller than its bar is re-wrapped, review 16c C4)."""
    return " ".join(ax.collections[0].colorbar.ax.get_ylabel().split())


def test_every_analysis_draws_figures_and_every_stem_has_a_caption(figures):
    assert set(figures) == set(ANALYSES)
    for name, figs in figures.items():
        assert figs, f"{name} drew no figure"
        missing = [stem for stem in figs if not caption(stem)]
        assert missing == [], f"{name}: figures without a caption: {missing}"


def test_patching_heatmaps_show_the_share_of_the_gap_or_the_raw_effect_within_noise(results, figures):
    r, figs = results["patching"], figures["patching"]
    s, exact = r.summary, r.tables["exact"]
    clean, corrupt = s["clean_metric"], s["corrupted_metric"]
    assert not s["normalized"] and clean != corrupt
    # a gap within noise (this random model's, usually) is drawn raw: the patched metric minus the corrupted one
    noise = bool(s.get("gap_within_noise"))
    unit = "raw effect (logit_diff), gap within noise" if noise else "1 = fully restored"

    def shown(value, low, high):  # from the patched metric itself
        return value - low if noise else (value - low) / (high - low)

    share = exact.assign(n=shown(exact["value"], corrupt, clean))
    for st in ("resid_pre", "head_out", "k", "v", "head_out_by_pos"):
        ax = figs[f"exact_{st}"].axes[0]
        assert unit in colorbar_label(ax)
        rows = share[share["site_type"] == st]
        if st == "resid_pre":
            expected = rows.pivot_table(index="layer", columns="pos", values="n")
        elif st == "head_out_by_pos":
            expected = rows.pivot_table(index=["layer", "head"], columns="pos", values="n")
        else:
            expected = rows[rows["pos"].isna()].pivot_table(index="layer", columns="head", values="n")
        np.testing.assert_allclose(heat(ax), expected.to_numpy(dtype=float), rtol=1e-5, atol=1e-6)
    paths = r.tables["path_patching"]
    gap = s.get("path_patching", {})
    p_clean, p_corrupt = gap.get("clean_metric", clean), gap.get("corrupted_metric", corrupt)
    ax = figs["path_patching"].axes[0]
    assert unit in colorbar_label(ax)
    expected = paths.assign(n=shown(paths["value"], p_corrupt, p_clean)).pivot_table(
        index="sender_layer", columns="sender_head", values="n")
    np.testing.assert_allclose(heat(ax), expected.to_numpy(dtype=float), rtol=1e-5, atol=1e-6)


def test_kv_heads_are_named_and_every_head_is_ticked(model, figures):
    f = model.facts
    for st in ("k", "v"):
        ax = figures["patching"][f"exact_{st}"].axes[0]
        assert "KV head" in ax.get_xlabel() and "KV head" in ax.get_title()
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(h) for h in range(f.n_kv_heads)]
    ax = figures["patching"]["exact_head_out"].axes[0]
    assert ax.get_xlabel() == "head" and len(ax.get_xticklabels()) == f.n_heads
    ax = figures["patching"]["exact_head_out_by_pos"].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        f"L{layer}H{head}" for layer in range(f.n_layers) for head in range(f.n_heads)]


def test_importance_figure_draws_both_methods(results, figures):
    df = results["heads"].df
    methods = list(dict.fromkeys(df["method"]))
    assert methods == ["gradient", "zero"]
    panels = [ax for ax in figures["heads"]["importance"].axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_title().split("\n")[0] for ax in panels] == ["head importance: gradient |dL/d gate|",
                                                                "head importance: zero ablation"]
    at_chance = results["heads"].summary["chance"]["at_chance"]  # this random model: at chance, muted and said so
    assert all(("AT CHANCE" in ax.get_title()) == at_chance for ax in panels)
    for ax, method in zip(panels, methods):  # raw units by default (the per-layer normalised view is an option)
        grid = df[df["method"] == method].pivot(index="layer", columns="head", values="importance")
        np.testing.assert_allclose(heat(ax), grid.to_numpy(dtype=float), rtol=1e-6)


def test_attribution_vs_exact_has_the_identity_line_and_each_site_types_slope(results, figures):
    r = results["patching"]
    exact = r.tables["exact"]
    ax = figures["patching"]["attribution_vs_exact"].axes[0]
    identity = [line for line in ax.lines if isinstance(line, Line2D) and len(line.get_xdata()) == 2
                and np.allclose(line.get_xdata(), line.get_ydata())]
    assert len(identity) == 1 and np.ptp(identity[0].get_xdata()) > 0
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    for st, group in exact.groupby("site_type"):
        x, y = group["effect"].to_numpy(dtype=float), group["attribution"].to_numpy(dtype=float)
        if np.ptp(x) > 0:  # the slope is unchanged by the common division into the share of the gap
            assert f"{st} (slope {np.polyfit(x, y, 1)[0]:.2f}" in [re.split("[,;]", t)[0].rstrip(")") for t in legend], legend
    assert "y = x (exact)" in legend


def _raw_columns(result) -> set[str]:
    frames = [result.df, *result.tables.values()]
    return {c for f in frames for c in getattr(f, "columns", []) if "_" in str(c)}


def test_no_axis_is_labelled_with_a_raw_column_name_and_colour_bars_name_their_unit(results, figures):
    for name, figs in figures.items():
        raw = _raw_columns(results[name])
        for stem, fig in figs.items():
            for ax in fig.axes:
                for label in (ax.get_xlabel(), ax.get_ylabel()):
                    assert label not in raw, f"{name}/{stem}: axis labelled {label!r}"
                for mesh in ax.collections:
                    bar = getattr(mesh, "colorbar", None)
                    if bar is not None:
                        assert bar.ax.get_ylabel() or bar.ax.get_xlabel(), f"{name}/{stem}: unlabelled colour bar"


def test_legends_are_outside_the_data_area(figures):
    for name, figs in figures.items():
        for stem, fig in figs.items():
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            for ax in fig.axes:
                legend = ax.get_legend()
                if legend is None:
                    continue
                box, frame = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
                outside = box.x0 >= frame.x1 - 1 or box.x1 <= frame.x0 + 1 or box.y0 >= frame.y1 - 1 or box.y1 <= frame.y0 + 1
                assert outside, f"{name}/{stem}: legend over the data ({ax.get_title()!r})"


def test_streaming_figure_has_its_own_title(figures):
    figs = figures["position"]
    assert figs["position_streaming"].axes[0].get_title() != figs["position_curve"].axes[0].get_title()


def test_top_heads_figure_draws_the_models_patterns(model, model_dir):
    """Each panel equals the head's attention weights from Hugging Face's eager attention (and hs.capture)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    data = attention_explorer_data(model, PROMPTS)
    fig = top_heads_figure(data, k=3)
    try:
        panels = [ax for ax in fig.axes if ax.get_title().startswith("L")]
        assert len(panels) == 3
        tokens = model.to_tokens(PROMPTS[0])
        sites = [site("pattern", layer) for layer in range(model.facts.n_layers)]
        acts = capture(model, tokens, sites, to_cpu=True)
        drawn = set()
        for ax in panels:
            layer, head = map(int, re.match(r"L(\d+)H(\d+)", ax.get_title()).groups())
            drawn.add((layer, head))
            ref = acts[sites[layer]][0, head].float().numpy()  # [query, key]
            with torch.no_grad():
                eager = hf(tokens, output_attentions=True).attentions[layer][0, head].numpy()  # [query, key]
            drawn_pattern = np.asarray(ax.images[0].get_array(), dtype=float)  # [query, key] as on screen
            assert drawn_pattern.shape == ref.shape == eager.shape
            np.testing.assert_allclose(drawn_pattern, ref, atol=0.5 / data["scale"] + 1e-7)
            np.testing.assert_allclose(drawn_pattern, eager, atol=0.5 / data["scale"] + 1e-5)
        assert len(drawn) == 3
    finally:
        plt.close(fig)


PNG_SCRIPT = BUILD + textwrap.dedent("""
    import hashlib, json, sys
    import torch
    from headscope.reports.explorer import attention_explorer_data
    from headscope.reports.plots import plot_result
    from headscope.reports.plots_attention import top_heads_figure
    from headscope.reports.render import figure_png
    torch.manual_seed(int(sys.argv[3]))  # a different global RNG state: the figures must not depend on it
    model = hs.load_model(sys.argv[1], device="cpu")
    digests = {}
    for name, result in results(model, tuple(sys.argv[2].split(","))).items():
        for stem, fig in plot_result(result).items():
            digests[f"{name}/{stem}"] = hashlib.sha256(figure_png(fig)).hexdigest()
    fig = top_heads_figure(attention_explorer_data(model, ["k01 v05 ; k02 v06 ; k01"]))
    digests["top_attention"] = hashlib.sha256(figure_png(fig)).hexdigest()
    print(json.dumps(digests))
""")


def test_same_seed_gives_byte_identical_pngs_across_processes(model_dir, figures):
    env = {**os.environ, "HEADSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1",
           "PYTHONHASHSEED": "random"}
    procs = [subprocess.Popen([sys.executable, "-c", PNG_SCRIPT, str(model_dir), ",".join(PATCH_SITES), seed],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
             for seed in ("1", "2")]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)  # a hang guard, not a speed test: two full runs on shared cores
        assert proc.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    first, second = outs
    expected = {f"{name}/{stem}" for name, figs in figures.items() for stem in figs} | {"top_attention"}
    assert set(first) == expected
    assert {k for k in first if first[k] != second.get(k)} == set()
    assert len(set(first.values())) == len(first)  # distinct figures, not one blank image


def _bar(text: str) -> bool:
    """A tqdm bar line: "desc: 100%|####| n/n [...]"."""
    return re.search(r"\d+%\|", text) is not None


def test_python_api_has_no_progress_bars_by_default(model, tmp_path, capsys):
    capsys.readouterr()
    hs.build_report(model, out=tmp_path / "quiet", analyses="probes", quick=True, n_examples=4)
    quiet = capsys.readouterr()
    assert not _bar(quiet.err) and not _bar(quiet.out), quiet.err[-500:]
    hs.build_report(model, out=tmp_path / "loud", analyses="probes", quick=True, n_examples=4, progress=True)
    assert re.search(r"probes: +\d+%\|", capsys.readouterr().err)  # the capture does see bars when asked for


def test_cli_shows_progress_bars_unless_quiet(model_dir, tmp_path):
    env = {**os.environ, "HEADSCOPE_THREADS": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "headscope", "report", "--quick", "--analyses", "probes", "--n-examples", "4",
                           "--model", str(model_dir), "--out", str(tmp_path / "cli")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"probes: +\d+%\|", proc.stderr), proc.stderr[-2000:]


NOTEBOOK = textwrap.dedent("""
    import sys, types, warnings
    shell = type("ZMQInteractiveShell", (), {"config": {"IPKernelApp": {}}})()
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: shell
    sys.modules["IPython"] = ipython                                            # a Jupyter kernel, as tqdm.autonotebook
    sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")  # detects one
    sys.modules["ipywidgets"] = None                                            # ipywidgets absent
    warnings.simplefilter("always")
    if sys.argv[1] == "headscope":
        import headscope  # noqa: F401
    import tqdm.auto
    import tqdm.std
    assert issubclass(tqdm.auto.tqdm, tqdm.std.tqdm) and "notebook" not in tqdm.auto.tqdm.__module__  # the plain bar
    list(tqdm.auto.tqdm(range(3), desc="bar"))
""")


def test_import_in_a_notebook_without_ipywidgets_warns_nothing():
    """In a simulated Jupyter kernel with ipywidgets absent, tqdm.auto alone warns "IProgress not found"
    (the control: the simulation is one tqdm recognises); after `import headscope` it is silent and
    the bar is the plain one."""
    def run(which: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", NOTEBOOK, which], capture_output=True, text=True, timeout=120, cwd=REPO)

    control, real = run("control"), run("headscope")
    assert control.returncode == 0 and "IProgress not found" in control.stderr
    assert real.returncode == 0, real.stderr[-2000:]
    assert "IProgress not found" not in real.stderr and "Warning" not in real.stderr, real.stderr[-2000:]


# ---- honest scales and legible figures, on hand-made tables (#34 items 3 and 7) --------------------
def _norm(ax):
    """("diverging", vmin, vmax) when the map is the convention's (white at 0, red above, blue below,
    limits symmetric about 0), else (the colour map's name, vmin, vmax)."""
    mesh = ax.collections[0]
    vmin, vmax = float(mesh.norm.vmin), float(mesh.norm.vmax)
    zero, top, bottom = (np.asarray(mesh.cmap(mesh.norm(v)))[:3] for v in (0.0, vmax, vmin))
    red_up = top[0] > top[2] + 0.2 and bottom[2] > bottom[0] + 0.2
    centred = np.isclose(vmin, -vmax) and bool((zero > 0.9).all())
    return ("diverging" if red_up and centred else mesh.cmap.name), vmin, vmax


def _result(name, df=None, summary=None, **tables):
    from headscope.analyses.core.result import Result

    return Result(name=name, df=pd.DataFrame() if df is None else df, summary=summary or {}, tables=tables)


def test_head_importance_is_raw_and_diverging_about_zero_normalised_only_when_asked():
    from headscope.reports.plots_heads import plot_importance

    raw = np.array([[0.02, -0.05, 0.01], [0.3, 0.0, -0.1]])  # [layer, head]: a signed ablation effect
    rows = [{"layer": l, "head": h, "method": "zero", "importance": raw[l, h],
             "importance_layer_norm": raw[l, h] / np.linalg.norm(raw[l])} for l in range(2) for h in range(3)]
    ax = plot_importance(pd.DataFrame(rows), metric="logit_diff")
    try:
        np.testing.assert_allclose(heat(ax), raw)  # rows are layers, columns heads, values in metric units
        assert ax.get_ylabel() == "layer" and ax.get_xlabel() == "head"
        assert _norm(ax) == ("diverging", -0.3, 0.3)  # diverging, centred on 0
        assert colorbar_label(ax) == "drop in logit difference (answer - wrong)"
        normalised = plot_importance(pd.DataFrame(rows), metric="logit_diff", normalized=True, ax=plt.subplots()[1])
        np.testing.assert_allclose(heat(normalised), raw / np.linalg.norm(raw, axis=1, keepdims=True))
        assert "normalised" in colorbar_label(normalised) and "normalised" in normalised.get_title()
        rounding = plot_importance(pd.DataFrame(rows), metric="logit_diff", degenerate="below the floor", ax=plt.subplots()[1])
        assert "ROUNDING ONLY" in rounding.get_title()  # an ablation's changes within rounding
        grads = pd.DataFrame(rows).assign(method="gradient")
        grad = plot_importance(grads, metric="logit_diff", degenerate="below the floor", ax=plt.subplots()[1])
        assert "UNDER THE FLOOR: the loss changes these gradients predict" in " ".join(grad.get_title().split())
        assert "ROUNDING ONLY" not in grad.get_title()  # review 15a B2: gradients are measured, not rounding
    finally:
        plt.close("all")


def test_ablation_cells_within_the_rounding_floor_read_approximately_zero_not_a_signed_cost():
    """Review 13a C3 (out_t's bfloat16 zero-ablation drops; floor 1.57e-5 with four null gates): importance.png printed
    "9.9e-06" for L2H3, a cost, where float32 says removing it helps (-1.86e-6). Cells within the summary's
    rounding_floor_zero read "≈0" and the title says why; the others keep their values; gradients keep theirs."""
    from headscope.analyses.core.result import Result
    from headscope.reports.plots_heads import figures

    zero = np.array([[9.5e-4, 1.57e-3, 6.86e-3], [1.0e-4, 1.87e-5, 9.93e-6]])  # [layer, head]
    rows = [{"layer": l, "head": h, "method": m, "importance": v}
            for m, grid in (("zero", zero), ("gradient", zero / 10)) for l in range(2) for h in range(3)
            for v in [grid[l, h]]]
    summary = {"metric": "logit_diff", "baseline_metric": -0.001, "rounding_floor_zero": 1.57e-5,
               "rounding_floor_gradient": 1e-3}
    try:
        fig = figures(Result(name="heads", df=pd.DataFrame(rows), summary=summary, tables={}))["importance"]
        grad, ablation = fig.axes[:2]  # the two heat maps (their colour bars follow)
        assert [t.get_text() for t in ablation.texts] == ["0.00095", "0.0016", "0.0069", "0.0001", "1.9e-05", "≈0"]
        assert "(≈0: within the rounding floor 1.6e-05)" in ablation.get_title()
        assert "≈0" not in [t.get_text() for t in grad.texts] and "≈0" not in grad.get_title()
    finally:
        plt.close("all")


def test_patching_sites_share_one_scale_and_say_their_own_max():
    from headscope.reports.plots_patching import figures as patching_figures

    def cells(site, effects):
        return [{"site_type": site, "layer": l, "head": h, "pos": None, "token": "", "effect": e}
                for (l, h), e in effects.items()]

    exact = pd.DataFrame(cells("head_out", {(0, 0): 0.32, (0, 1): -0.1, (1, 0): 0.05, (1, 1): 0.0})
                         + cells("q", {(0, 0): 0.003, (0, 1): -0.002, (1, 0): 0.0, (1, 1): 0.001}))
    exact["effect"] *= 4.0  # raw logit differences; the figures show the share of a gap of 4
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "clean_metric": 3.0,
               "corrupted_metric": -1.0}
    figs = patching_figures(_result("patching", exact, summary, exact=exact))
    try:
        head_out, q = figs["exact_head_out"].axes[0], figs["exact_q"].axes[0]
        assert _norm(head_out)[0] == _norm(q)[0] == "diverging"
        np.testing.assert_allclose(_norm(head_out)[1:], (-0.32, 0.32))
        np.testing.assert_allclose(_norm(q)[1:], (-0.32, 0.32))  # q's 0.003 is pale next to head_out, as it should be
        np.testing.assert_allclose(heat(q), [[0.003, -0.002], [0.0, 0.001]], atol=1e-12)
        assert "this panel's max |value| 0.003; scale shared with every site: ±0.32" in q.get_title().replace("\n", " ")
        assert "this panel" not in head_out.get_title()
    finally:
        plt.close("all")


def test_patching_maps_and_attribution_boxes_raise_no_warning_in_the_users_notebook():
    """Review 12c C4: one patching call gave 13 "The set_bad function will be deprecated" warnings (seaborn's
    `center` rebuilds the map), attribution two "vert: bool was deprecated"; with warnings as errors both draw,
    and the maps stay centred on 0 (white at 0, red above, blue below, limits ±0.32)."""
    import warnings

    from headscope.reports.plots_attribution import plot_tau
    from headscope.reports.plots_patching import figures as patching_figures

    rows = [{"site_type": "head_out", "layer": l, "head": h, "pos": None, "token": "", "effect": e}
            for (l, h), e in {(0, 0): 1.28, (0, 1): -0.4, (1, 0): 0.2, (1, 1): 0.0}.items()]
    rows += [{"site_type": "resid_pre", "layer": l, "head": None, "pos": p, "token": "t", "effect": 0.1 * (l - p)}
             for l in range(2) for p in range(3)]
    exact = pd.DataFrame(rows)
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "clean_metric": 3.0,
               "corrupted_metric": -1.0}
    tau = pd.DataFrame({"method": ["saliency"] * 20 + ["leave_one_out"] * 20, "tau": np.linspace(-0.9, 0.9, 40),
                        "attention": ["last_layer", "rollout"] * 20})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            figs = patching_figures(_result("patching", exact, summary, exact=exact))
            plot_tau(tau)
        head_out = figs["exact_head_out"].axes[0]
        assert _norm(head_out)[0] == "diverging"
        np.testing.assert_allclose(_norm(head_out)[1:], (-0.32, 0.32))
    finally:
        plt.close("all")


def test_causal_traces_of_many_prompts_are_drawn_by_role_on_one_diverging_scale():
    from headscope.reports.plots_patching import figures as patching_figures

    trace = pd.DataFrame([{"kind": k, "layer": l, "pos": p, "token": f"{p}: tok", "role": "x", "ie": 0.0}
                          for k in ("mlp", "attn") for l in range(2) for p in range(3)])
    roles = pd.DataFrame([{"kind": k, "layer": l, "role": r, "ie": v}
                          for k, scale in (("mlp", 1.0), ("attn", 0.1)) for l in range(2)
                          for r, v in (("first subject", -0.2 * scale), ("last subject", 0.8 * scale),
                                       ("last token", 0.1 * scale))])
    summary = {"causal_tracing": {"metric": "answer probability", "n_examples": 32}}
    figs = patching_figures(_result("patching", trace, summary, causal_tracing=trace, causal_tracing_roles=roles))
    try:
        mlp, attn = figs["causal_tracing_mlp"].axes[0], figs["causal_tracing_attn"].axes[0]
        assert [t.get_text() for t in mlp.get_yticklabels()] == ["first subject", "last subject", "last token"]
        assert "token role" in mlp.get_ylabel() and "first prompt" not in mlp.get_ylabel()
        np.testing.assert_allclose(heat(mlp), [[-0.2, -0.2], [0.8, 0.8], [0.1, 0.1]])
        assert _norm(mlp) == _norm(attn) == ("diverging", -0.8, 0.8)  # negative effects visible, one scale for both kinds
    finally:
        plt.close("all")


def test_dla_per_head_is_layers_by_heads_like_every_head_grid():
    from headscope.reports.plots_circuits import plot_dla_heads

    dla = pd.DataFrame([{"kind": "head", "layer": l, "head": h, "component": f"L{l}H{h}", "contribution": 10 * l + h - 5}
                        for l in range(2) for h in range(3)])
    ax = plot_dla_heads(dla, ax=plt.subplots()[1])
    try:
        np.testing.assert_allclose(heat(ax), [[-5, -4, -3], [5, 6, 7]])  # [layer, head]
        assert (ax.get_ylabel(), ax.get_xlabel()) == ("layer", "head") and _norm(ax) == ("diverging", -7, 7)
    finally:
        plt.close("all")


def _styles(ax):
    return [(line.get_marker(), line.get_linestyle()) for line in ax.get_lines() if len(line.get_xdata()) > 2]


def test_equal_curves_stay_visible_by_marker_and_dash():
    from headscope.reports.plots_heads import plot_pruning_curve
    from headscope.reports.plots_position import plot_curve

    curve = pd.DataFrame([{"condition": c, "metric": "logprob", "position": p, "mean": -1.0, "ci_low": -1.1, "ci_high": -0.9}
                          for c in ("full", "window", "sinks+window") for p in (1, 2, 3)])
    ax = plot_curve(curve, n_items=3, metric="logprob",
                    conditions=("full", "window", "sinks+window"), ax=plt.subplots()[1])
    prune = pd.DataFrame([{"ordering": o, "recompute": r, "fraction_pruned": f, "metric": 1.0 - f, "seed": 0}
                          for o, r in (("gradient", False), ("gradient", True)) for f in (0.0, 0.25, 0.5)])
    ax2 = plot_pruning_curve(prune, metric="logit_diff", ax=plt.subplots()[1])
    try:
        for styles in (_styles(ax), _styles(ax2)):  # the lines lie on one another: each needs its own look
            assert len(styles) >= 2 and len(set(styles)) == len(styles), styles
    finally:
        plt.close("all")


def test_pruning_curve_shades_each_fixed_ordering_with_its_interval_over_examples():
    """#34: each fixed ordering's points carry their 95% interval (ci_low / ci_high: the paired change from
    unpruned, around the point) as a band in the line's colour; random orderings keep their band over seeds only."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgb

    from headscope.reports.plots_heads import plot_pruning_curve

    rows = [{"ordering": o, "recompute": False, "seed": s, "fraction_pruned": f, "metric": m - f,
             "ci_low": m - f - 0.1 * (1 + f), "ci_high": m - f + 0.1 * (1 + f)}
            for o, m, seeds in (("ablation", 2.0, (0,)), ("random", 1.0, (0, 1))) for s in seeds for f in (0.0, 0.5, 1.0)]
    ax = plot_pruning_curve(pd.DataFrame(rows), metric="logit_diff", baseline=2.0, ax=plt.subplots()[1])
    try:
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        ablation = [b for b in bands if b.get_paths()
                    and {round(float(y), 6) for y in b.get_paths()[0].vertices[:, 1]} == {1.9, 2.1, 1.35, 1.65, 0.8, 1.2}]
        assert len(ablation) == 1  # its band spans exactly ci_low..ci_high at each point
        line = next(l for l in ax.get_lines() if list(l.get_ydata()) == [2.0, 1.5, 1.0])
        assert np.allclose(ablation[0].get_facecolor()[0][:3], to_rgb(line.get_color()))
        assert "paired over examples" in ax.get_title()
    finally:
        plt.close("all")


def _span_ys(patch) -> np.ndarray:
    """The data y of an axhspan's corners."""
    return patch.get_path().transformed(patch.get_patch_transform()).vertices[:, 1] \
        if hasattr(patch, "get_patch_transform") else patch.get_xy()[:, 1]


def test_a_logprob_pruning_figure_draws_the_band_from_the_span_from_chance():
    """Review 11b B1: unpruned -0.007, chance -11.4: the floor is 1% of the span (0.114 nats) below unpruned, not
    0.00007; the zoom spans 5 bands either side, so a step to -0.0075 sits by the unpruned line, inside the band."""
    from headscope.reports.plots_heads import figures as heads_figures

    band = 0.01 * 11.393
    tol = {"tolerance": 0.01, "basis": "span", "chance": -11.4, "unpruned": -0.007, "band": band}
    curve = pd.DataFrame([{"ordering": "ablation", "recompute": False, "seed": 0, "fraction_pruned": f, "metric": m}
                          for f, m in ((0.0, -0.007), (0.125, -0.0075), (0.5, -0.25), (1.0, -17.5))])
    fig = heads_figures(_result("heads", curve, {"metric": "logprob", "baseline_metric": -0.007,
                                                 "pruning_tolerance": tol}))["pruning_curve"]
    try:
        full, near = fig.axes
        floor = -0.007 - band
        for ax in (full, near):
            lines = {l.get_label(): float(l.get_ydata()[0]) for l in ax.get_lines() if "floor" in l.get_label()}
            assert lines == pytest.approx({"floor: 0.114 below unpruned": floor})
        [shade] = [p for p in near.patches if "one-sided" in str(p.get_label())]
        assert np.isclose(_span_ys(shade).max(), floor) and "more than 0.114 below" in shade.get_label()
        # review 11b N4: a log-probability cannot exceed 0, so the zoom stops there (a 3% margin keeps points whole)
        low = -0.007 - 5 * band
        assert near.get_ylim() == pytest.approx((low, 0.03 * -low))
        labels = {t.get_text() for t in near.get_yticklabels()}
        assert f"{floor:.4g}" in labels
        assert "-0.007 (max. 0 above)" in labels and not [t for t in labels if t.startswith("+")]
        title = near.get_title().replace("\n", " ")
        assert f"floor {floor:.4g} = 0.114 below unpruned (1% of the span from chance (-11.4) to unpruned)" in title
        assert "y from 0.57 below unpruned (-0.5766) up to 0, the log-probability's maximum" in title
    finally:
        plt.close("all")
    far = {**tol, "chance": -52.0, "unpruned": -2.0, "band": 0.5}  # 0 is 2 nats above: a tick of its own
    fig = heads_figures(_result("heads", curve.assign(metric=curve["metric"] - 2.0),
                                {"metric": "logprob", "baseline_metric": -2.0, "pruning_tolerance": far}))["pruning_curve"]
    try:
        near = fig.axes[1]
        assert near.get_ylim() == pytest.approx((-4.5, 0.03 * 4.5))
        labels = {t.get_text() for t in near.get_yticklabels()}
        assert "0 (maximum)" in labels and "-2" in labels
    finally:
        plt.close("all")


def test_pruning_zoom_takes_a_fair_share_of_the_width_with_one_number_a_tick_and_marks_a_hidden_curve():
    """Review 12a B2 / 12c B2: the zoom panel was squeezed to a tenth of the figure by two-part tick labels
    ("-0.49: -0.5125") and titled "unpruned -0.49 to 0". Review 12b B4: ablation's curve equal to ablation
    recomputed's at every point was drawn exactly under it. Hand-built (out_t's numbers: unpruned -0.0229, band
    0.0979 = 1% of the span from chance -9.82): after layout the zoom is as wide as the full panel's 0.8 at least and
    a fifth of the figure; each tick is one number (-0.0229 - 5 x 0.0979 = -0.5124, the floor -0.1208); the
    hidden curve's legend entry says which it lies under, the one on top does not."""
    from headscope.reports.plots_heads import figures as heads_figures

    b, band = -0.0229, 0.0979
    tol = {"tolerance": 0.01, "basis": "span", "chance": -9.82, "unpruned": b, "band": band}
    ms = (b, -0.03, -0.04, -5.6)
    curve = pd.DataFrame([{"ordering": o, "recompute": r, "seed": 0, "fraction_pruned": f, "metric": m + shift}
                          for o, r, shift in (("gradient", False, -0.01), ("ablation", False, 0.0), ("ablation", True, 0.0))
                          for f, m in zip((0.0, 0.25, 0.5, 1.0), ms)])
    fig = heads_figures(_result("heads", curve, {"metric": "logprob", "baseline_metric": b, "pruning_tolerance": tol,
                                                 "ordering_basis": {"ablation": "raw zero-ablation drop"}}))["pruning_curve"]
    try:
        full, near = fig.axes
        wide = near.get_position().width
        assert wide >= 0.8 * full.get_position().width and wide >= 0.2
        labels = [t.get_text() for t in near.get_yticklabels()]
        assert labels[:2] == ["-0.5124", "-0.1208"] and labels[2].startswith("-0.0229")
        assert not [t for t in labels if ": " in t]
        title = near.get_title().replace("\n", " ")
        assert "unpruned -0.49 to 0" not in title and "y from 0.489 below unpruned (-0.5124) up to 0" in title
        legend = [t.get_text() for t in near.get_legend().get_texts()]
        assert "ablation (raw zero-ablation drop):\nidentical to ablation recomputed, drawn under it" in legend
        assert "ablation recomputed (raw zero-ablation drop)" in legend and "gradient" in legend
    finally:
        plt.close("all")


def test_pruning_curve_shades_only_the_region_below_the_1_percent_floor():
    """#34 review 6: on a -7..15 axis the unpruned line (13.19) and the -1% floor (13.06) coincided, so the floor is
    drawn in its own colour and dash. Review 8 B2: the rule is one-sided (a point counts when it is no more than 1%
    below unpruned, however far above), so no strip above unpruned: only the region below the floor (13.19 - 0.1319)
    is shaded, labelled as the one-sided rule, and the y limits still end at the data (-7..15), not the span's."""
    from matplotlib.colors import to_rgba

    from headscope.reports.plots_heads import plot_pruning_curve

    rows = [{"ordering": "ablation", "recompute": False, "seed": 0, "fraction_pruned": f, "metric": m}
            for f, m in ((0.0, 13.19), (0.5, 15.0), (1.0, -7.0))]
    ax = plot_pruning_curve(pd.DataFrame(rows), metric="logit_diff", baseline=13.19, ax=plt.subplots()[1])
    try:
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        [band] = [p for p in ax.patches if "excluded" in str(p.get_label())]
        ys = _span_ys(band)
        floor = 13.19 - 0.1319
        assert np.isclose(ys.max(), floor) and ys.min() < -7.0  # from the floor down, nothing above it
        assert "one-sided" in band.get_label() and band.get_label() in legend
        assert not any("within 1%" in t for t in legend)
        assert band.get_facecolor()[3] > 0  # filled, not an outline
        y0, y1 = ax.get_ylim()
        assert -8.5 < y0 < -7.0 and 15.0 < y1 < 16.5  # the data's limits with matplotlib's margins
        lines = {l.get_label(): l for l in ax.get_lines()}
        unpruned, floor_line = lines["unpruned"], lines["-1% floor"]
        assert np.allclose(floor_line.get_ydata(), floor) and np.allclose(unpruned.get_ydata(), 13.19)
        assert to_rgba(floor_line.get_color()) != to_rgba(unpruned.get_color())
        assert floor_line.get_linestyle() != unpruned.get_linestyle()
        assert to_rgba(band.get_facecolor())[:3] not in (to_rgba(floor_line.get_color())[:3],
                                                         to_rgba(unpruned.get_color())[:3])
    finally:
        plt.close("all")


@pytest.mark.parametrize("baseline, low, high", [(13.19, -7.0, 15.0), (1.0, -0.5, 1.0), (-2.0, -9.0, -1.9)])
def test_pruning_figure_zooms_on_the_1_percent_band_at_any_scale(baseline, low, high):
    """Review 7 B2: on -7..15 (MoE) or -0.5..1 (BERT cosine) axes the unpruned line and the 1% floor were a pixel
    apart. The figure's second panel spans the unpruned value +- 5% of it: both lines inside, a tenth of its height
    apart (0.01 |b| / 0.1 |b|), the floor's tick labelled "1% below unpruned", the band filled; the first panel keeps
    the whole curve. A negative baseline's floor is still below it."""
    from headscope.reports.plots_heads import figures as heads_figures

    curve = pd.DataFrame([{"ordering": "ablation", "recompute": False, "seed": 0, "fraction_pruned": f, "metric": m}
                          for f, m in ((0.0, baseline), (0.25, 0.996 * baseline if baseline > 0 else 1.004 * baseline),
                                       (0.5, high), (1.0, low))])
    fig = heads_figures(_result("heads", curve, {"metric": "logit_diff", "baseline_metric": baseline}))["pruning_curve"]
    try:
        full, near = fig.axes
        assert full.get_ylim()[0] <= low and full.get_ylim()[1] >= high  # the whole curve
        lines = {l.get_label(): float(l.get_ydata()[0]) for l in near.get_lines() if l.get_label() in ("unpruned", "-1% floor")}
        floor = baseline - 0.01 * abs(baseline)
        assert lines == pytest.approx({"unpruned": baseline, "-1% floor": floor})
        y0, y1 = near.get_ylim()
        assert y0 < floor < baseline < y1
        assert (baseline - floor) / (y1 - y0) >= 0.09  # a tenth of the panel's height, not a pixel
        labels = {t.get_text() for t in near.get_yticklabels()}
        assert f"{floor:.4g}" in labels and f"{baseline:.4g}" in labels
        assert f"unpruned {baseline:.4g}, floor {floor:.4g}\n= 1% below unpruned" in near.get_title()
        [band] = [p for p in near.patches if "one-sided" in str(p.get_label())]  # below the floor only (review 8 B2)
        assert band.get_facecolor()[3] > 0 and np.isclose(_span_ys(band).max(), floor) and _span_ys(band).min() < y0
        assert full.get_legend() is None and near.get_legend() is not None  # one legend, beside the zoom
    finally:
        plt.close("all")


@pytest.mark.parametrize("baseline", [1.0, 0.97])
def test_pruning_zoom_on_a_cosine_stops_at_its_maximum(baseline):
    """Review 11a B6: on the encoder's cosine (unpruned 1 by construction) the zoom spanned 0.95-1.05, half of it
    values a cosine cannot take. It now stops just above 1 (3% of the panel as margin, so a point at 1 stays whole),
    with no '+5%' tick; the floor keeps its place and a point at 1 is inside."""
    from headscope.reports.plots_heads import figures as heads_figures

    curve = pd.DataFrame([{"ordering": "ablation", "recompute": False, "seed": 0, "fraction_pruned": f, "metric": m}
                          for f, m in ((0.0, baseline), (0.5, 0.995 * baseline), (1.0, 0.2))])
    fig = heads_figures(_result("heads", curve, {"metric": "cosine", "baseline_metric": baseline}))["pruning_curve"]
    try:
        near = fig.axes[1]
        y0, y1 = near.get_ylim()
        low = 0.95 * baseline
        assert y0 == pytest.approx(low) and y1 == pytest.approx(1.0 + 0.03 * (1.0 - low))
        labels = [t.get_text() for t in near.get_yticklabels()]
        assert f"{baseline * 1.05:.4g}" not in labels
        assert (f"{baseline:.4g} (maximum)" in labels) if baseline == 1.0 else ("1 (maximum)" in labels)
        assert "up to 1, the cosine's maximum" in near.get_title().replace("\n", " ")
        fig.canvas.draw()  # the longer zoom title stays clear of the full panel's
        renderer = fig.canvas.get_renderer()
        assert not _overlap(fig.axes[0].title.get_window_extent(renderer), near.title.get_window_extent(renderer))
    finally:
        plt.close("all")


def test_mlp_agreement_draws_each_fraction_with_its_wilson_interval():
    """#34 / the fourth review's A10: each layer's agreement share carries its Wilson 95% interval over
    the layer's neurons as an error bar (closed form here: (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n))."""
    from headscope.reports.plots_mlp import plot_agreement

    n, z = 256, 1.959964
    table = pd.DataFrame({"layer": [0, 1], "agreement": [18 / n, 0.0], "agreement_any": [40 / n, 3 / n],
                          "agreement_shuffled": [1 / n, 2 / n], "agreement_any_shuffled": [9 / n, 4 / n]})
    ax = plot_agreement(table, n=n, ax=plt.subplots()[1])
    try:
        bars = {c.get_label(): c for c in ax.containers}
        # the fifth review: "any of top k" (0.41) was read against the top-trigger control (0.08): it has its own
        assert set(bars) == {"top trigger", "any of top k triggers", "shuffled (control)",
                             "any of top k, shuffled (its control)"}
        line = {name: bars[name].lines[0] for name in bars}
        assert line["any of top k triggers"].get_color() == line["any of top k, shuffled (its control)"].get_color()
        colour = {name: line[name].get_color() for name in line}
        assert colour["top trigger"] == colour["shuffled (control)"] != colour["any of top k triggers"]
        style = {name: line[name].get_linestyle() for name in line}
        assert style["any of top k, shuffled (its control)"] == ":" != style["any of top k triggers"]
        for column, name in (("agreement", "top trigger"), ("agreement_any", "any of top k triggers"),
                             ("agreement_shuffled", "shuffled (control)"),
                             ("agreement_any_shuffled", "any of top k, shuffled (its control)")):
            segments = bars[name].lines[2][0].get_segments()  # one vertical bar per layer: [[x, lo], [x, hi]]
            for k, seg in zip((round(v * n) for v in table[column]), segments):
                p = k / n
                centre, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
                lo, hi = (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)
                assert (seg[0][1], seg[1][1]) == pytest.approx((max(lo, 0.0), hi), abs=1e-9), (name, k)
        assert "Wilson 95% CI over 256 neurons" in ax.get_title()
        assert plot_agreement(table, ax=plt.subplots()[1]).containers[0].has_yerr is False  # no n: no bars
        # review 7b A1: each layer's bar over its own memories (layer 1 of 128: 0.0 is 0 of 128, hi 3.84/(128+3.84))
        mixed = plot_agreement(table, n={0: 256, 1: 128}, ax=plt.subplots()[1])
        top = [c for c in mixed.containers if c.get_label() == "top trigger"][0].lines[2][0].get_segments()
        assert top[1][1][1] == pytest.approx(z * z / (128 + z * z), abs=1e-9)
        assert "Wilson 95% CI over each layer's neurons (L0: 256, L1: 128)" in mixed.get_title()
    finally:
        plt.close("all")


def test_mlp_figures_of_dense_and_expert_layers_fit_and_join_adjacent_layers_only():
    """#34 review 11c B1, B2: on a Qwen2-MoE with a dense layer 1 between MoE layers 0 and 2, the top-neuron figure's
    x label (with "0 where not routed") and the agreement figure's two-line title lie inside the figure, the title
    clear of the y label and without a doubled ")"; run on layers 0 and 2 only, the lines do not join layer 0 to
    layer 2 across the missing layer 1 (each point stands alone), while adjacent layers stay joined; with every layer
    the ticks say which layer is dense and which a mixture of experts."""
    from headscope.analyses.core.result import Result
    from headscope.reports.plots_mlp import figures

    moe = {"n_experts": 4, "expert_width": 64, "top_k": 2, "shared_width": 96}

    def result(layers):
        agree = pd.DataFrame({"layer": layers, "agreement": [0.19, 0.13, 0.11][:len(layers)],
                              "agreement_any": [0.35, 0.21, 0.21][:len(layers)],
                              "agreement_shuffled": [0.04, 0.01, 0.03][:len(layers)],
                              "agreement_any_shuffled": [0.13, 0.08, 0.11][:len(layers)]})
        sizes = {str(l): 128 if l == 1 else 352 for l in layers}
        top = pd.DataFrame({"layer": [0, 2, 0], "neuron": [220, 24, 306], "task_update_norm": [3.0, 1.1, 2.2],
                            "expert": pd.array([3, 2, 4], dtype="Int64"), "expert_neuron": [28, 24, 50],
                            "n_routed": [12, 16, 16]})
        summary = {"n_memories_per_layer": sizes, "experts_per_layer": {"0": moe, "2": moe}, "task": "colours",
                   "n_task_examples": 16, "mixture_of_experts": True}
        return Result(name="mlp", df=pd.DataFrame(), summary=summary, tables={"agreement": agree, "top_neurons": top})

    try:
        for layers in ([0, 2], [0, 1, 2]):
            figs = figures(result(layers))
            for fig in figs.values():
                fig.draw_without_rendering()
                renderer, frame = fig.canvas.get_renderer(), fig.bbox
                ax = fig.axes[0]
                for text in (ax.title, ax.xaxis.label, ax.yaxis.label):
                    box = text.get_window_extent(renderer)
                    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, \
                        (text.get_text(), box, frame)
            ax = figs["mlp_agreement"].axes[0]
            title = ax.title.get_window_extent(renderer)
            assert not _overlap(title, ax.yaxis.label.get_window_extent(renderer))
            assert "))" not in ax.get_title() and "95% CI" in ax.get_title()
            assert "0 where not routed" in " ".join(figs["mlp_top_neurons"].axes[0].get_xlabel().split())
            line = next(c for c in ax.containers if c.get_label() == "top trigger").lines[0]
            x = np.asarray(line.get_xdata(), dtype=float)
            joined = [(a, b) for a, b in zip(x, x[1:]) if np.isfinite(a) and np.isfinite(b)]  # drawn segments
            assert [(round(a), round(b)) for a, b in joined] == [(l, l + 1) for l in layers if l + 1 in layers]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0\nMoE", "1\ndense", "2\nMoE"]
    finally:
        plt.close("all")


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _shown_xticks_apart(fig, ax) -> list:
    """The x tick labels with text, drawn at the figure's layout, after asserting no two of them overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    shown = [t for t in ax.get_xticklabels() if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in shown]
    assert not [(a.get_text(), b.get_text()) for i, (a, ba) in enumerate(zip(shown, boxes))
                for b, bb in zip(shown[i + 1:], boxes[i + 1:]) if _overlap(ba, bb)]
    return shown


def test_circuit_graph_labels_of_a_kv_head_and_a_query_head_do_not_collide():
    from headscope.reports.plots_circuits import plot_circuit_graph

    edges = pd.DataFrame({"sender": ["input", "input", "a0.h1", "a0.kv1"],
                          "receiver": ["a0.kv1.v", "a0.h1.q", "logits", "logits"], "score": [0.5, -0.4, 0.3, 0.2]})
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        plot_circuit_graph(edges, ax=ax)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts if t.get_text()}
        assert {"L0H1", "L0KV1"} <= set(boxes)  # the report's names, not the edge graph's a0.h1 / a0.kv1
        names = sorted(boxes)
        assert not [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if _overlap(boxes[a], boxes[b])]
    finally:
        plt.close(fig)


def test_mib_curve_tick_labels_stand_apart_with_its_legend_under_them():
    """Review 13a B2: circuits_mib.png's 0.1%, 0.2%, 0.5%, 1% touched ("0.1%0.2%0.5%1%"), rotated on an axes narrowed
    by the legend at its right. Its MIB curve (out_t/circuits/mib.csv) laid out as `figures` stores it: every one of
    the 10 fractions is labelled, no two labels overlap, and the legend (CPR and CMD with their intervals) overlaps
    neither the tick labels nor the axis label."""
    from headscope.reports.plots import laid_out
    from headscope.reports.plots_circuits import plot_mib

    fractions = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    f = [0.0, 0.0, -9.9e-5, 0.2658, 0.5075, 0.9024, 0.9825, 0.9924, 0.9991, 1.0]
    fig = laid_out(plot_mib(pd.DataFrame({"fraction": fractions, "faithfulness": f}), cpr=0.970, cmd=0.029,
                            cpr_ci=[0.967, 0.973], cmd_ci=[0.026, 0.032]))
    try:
        ax = fig.axes[0]
        shown = _shown_xticks_apart(fig, ax)
        assert [t.get_text() for t in shown] == ["0.1%", "0.2%", "0.5%", "1%", "2%", "5%", "10%", "20%", "50%", "100%"]
        renderer = fig.canvas.get_renderer()
        legend = ax.get_legend().get_window_extent(renderer)
        assert not [t.get_text() for t in shown if _overlap(t.get_window_extent(renderer), legend)]
        assert not _overlap(ax.xaxis.label.get_window_extent(renderer), legend)
    finally:
        plt.close(fig)


def test_l0_lambdas_on_one_point_share_a_label_and_all_zero_kinds_leave_the_legend():
    from headscope.reports.plots_circuits import plot_dla_components
    from headscope.reports.plots_heads import plot_l0
    from headscope.reports.plots_kv import plot_eviction

    sweep = pd.DataFrame({"lambda": [0.01, 0.03, 0.1], "heads_kept": [8, 8, 3], "metric_binary": [2.0, 2.0, 1.0],
                          "metric": [2.0, 2.0, 1.1]})
    ax = plot_l0(sweep, metric="logit_diff", baseline=2.0, ax=plt.subplots()[1])
    dla = pd.DataFrame([{"kind": k, "component": f"{k}{i}", "contribution": v, "example": e}
                        for k, i, v in (("embed", 0, 1.0), ("mlp", 0, 0.5), ("attn_bias", 0, 8e-7), ("unembed_bias", 0, 0.0),
                                        ("remainder", 0, 2e-5))  # 8e-7 of 1.0 is rounding; 2e-5 is kept
                        for e in range(3)])
    bars = plot_dla_components(dla, ax=plt.subplots()[1])
    kv = pd.DataFrame([{"policy": p, "budget": b, "example": e, "metric": 1.0} for p, b in (("full", 8), ("window", 4))
                       for e in range(3)])
    try:
        assert sorted(t.get_text() for t in ax.texts) == ["λ=0.01, 0.03", "λ=0.1"]
        assert [t.get_text() for t in bars.get_legend().get_texts()] == ["embed", "mlp", "remainder"]
        assert "left out: attn_bias, unembed_bias" in bars.get_title()
        evicted = plot_eviction(kv, metric="logit_diff", ax=plt.subplots()[1])
        assert evicted.get_ylabel() == "policy - full cache,\nlogit difference (logits)"  # units: the metric's (16dv-C2)
        whole = [line for line in evicted.get_lines() if line.get_label() == "longest context (8)"]
        assert len(whole) == 1 and list(whole[0].get_xdata()) == [8, 8]  # the budget that saves nothing, marked
        # prompts of contexts 2, 6, 8: budget 4 evicts from two of them, budget 1 from all three
        ctx = pd.DataFrame([{"policy": p, "budget": b, "example": e, "context": c, "metric": 1.0}
                            for p, b in (("full", 8), ("window", 1), ("window", 4)) for e, c in enumerate((2, 6, 8))])
        ticks = plot_eviction(ctx, metric="logit_diff", ax=plt.subplots()[1])
        assert [t.get_text() for t in ticks.get_xticklabels()] == ["1\n3/3", "4\n2/3"]
        assert ticks.get_xlabel().endswith("under it: evicted / all prompts")
    finally:
        plt.close("all")


def test_kv_eviction_plots_the_evicted_prompts_against_their_own_full_cache():
    """Review 10a B3: the finding measures each budget over the prompts it evicts from; the figure drew the mean
    over all prompts (the unevicted ones at their full value) against the all-prompt full-cache line. By hand:
    contexts 4, 4, 12, 12 with full-cache metrics 10, 6, 8, 4; window at 8 evicts from the two 12s only, which
    drop to 7 and 2: -1 and -2 against their own full-cache mean 6, -25% (the all-prompt means, 6.5 against 7,
    read -7%); at 2 it evicts from all four (-1 each: -1 / 7 = -14.3%); at 12 from none, so no point there. Review 14a
    C1: drawn in the metric's units (-1 at 2, -1.5 at 8), never as a % of a mean that may be 0."""
    from headscope.reports.plots_kv import plot_eviction

    ctx, full = (4, 4, 12, 12), (10.0, 6.0, 8.0, 4.0)
    at = {2: (9.0, 5.0, 7.0, 3.0), 8: (10.0, 6.0, 7.0, 2.0), 12: full}
    rows = [{"policy": "full", "budget": 12, "example": e, "context": c, "metric": full[e]} for e, c in enumerate(ctx)]
    rows += [{"policy": "window", "budget": b, "example": e, "context": c, "metric": v[e]}
             for b, v in at.items() for e, c in enumerate(ctx)]
    ax = plot_eviction(pd.DataFrame(rows), metric="logit_diff", ax=plt.subplots()[1])
    try:
        [line] = [li for li in ax.get_lines() if li.get_label() == "window"]
        assert list(line.get_xdata()) == [2, 8]
        assert list(line.get_ydata()) == pytest.approx([-1.0, -1.5])  # logits: policy - full
        from scipy import stats

        ci = stats.ttest_1samp([-1.0, -2.0], 0.0).confidence_interval(0.95)  # at 8, in logits over the 2 prompts
        [band] = ax.collections[:1]
        ys = band.get_paths()[0].vertices[:, 1]
        assert min(ys) == pytest.approx(ci.low) and max(ys) == pytest.approx(ci.high)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["2\n4/4", "8\n2/4", "12\n0/4"]
        assert "evicted / all prompts" in ax.get_xlabel() and "policy - full cache" in ax.get_ylabel()
        zero = [li for li in ax.get_lines() if li.get_label() == "full cache (the same prompts)"]
        assert len(zero) == 1 and list(zero[0].get_ydata()) == [0, 0]
    finally:
        plt.close("all")


def test_kv_eviction_marks_a_sliding_caches_cap_not_the_longest_context():
    """Review 17c C2 (StarCoder2, every layer over 12 keys, contexts up to 59): the dotted "saves nothing" line stood at
    the longest context (59), while each layer's cache holds at most 11 positions (window - 1), so budgets 16, 32 and
    59 all evicted nothing. With every layer sliding the line is at 11; with a global layer (or no windows recorded)
    it stays at the longest context."""
    from headscope.reports.plots_kv import eviction_cap, plot_eviction

    rows = [{"policy": "full", "budget": 59, "example": e, "context": c, "cached": 33.0, "kept": 33.0, "metric": m}
            for e, (c, m) in enumerate(((43, 0.6), (11, -1.4)))]
    rows += [{"policy": "window", "budget": 4, "example": e, "context": c, "cached": 33.0, "kept": 12.0, "metric": m}
             for e, (c, m) in enumerate(((43, 0.1), (11, -1.0)))]
    norms = pd.DataFrame({"layer": [0, 1, 2], "position": 0, "norm": 1.0})
    every = {"metric": "logit_diff", "sliding_windows": {"0": 12, "1": 12, "2": 12}, "sink_mass_per_layer": [0.1] * 3}
    mixed = {**every, "sliding_windows": {"0": 12, "2": 12}}
    assert eviction_cap(_result("kv", pd.DataFrame(rows), every)) == 11
    assert eviction_cap(_result("kv", pd.DataFrame(rows), mixed)) is None
    try:
        for summary, x, label in ((every, 11, "the cache's cap (11:\nsliding window - 1)"),
                                  (mixed, 59, "longest context (59)")):
            result = _result("kv", pd.DataFrame(rows), summary, norms=norms)
            ax = plot_eviction(result.df, metric="logit_diff", ax=plt.subplots()[1], cap=eviction_cap(result))
            [dotted] = [li for li in ax.get_lines() if li.get_linestyle() == ":"]
            assert list(dotted.get_xdata()) == [x, x] and dotted.get_label() == label
    finally:
        plt.close("all")


def test_kv_eviction_draws_a_policy_within_one_rounding_step_of_a_later_one_visibly():
    """Review 15a C5: heavy hitters' mean change was within one bfloat16 step (2^-7 = 0.0078 for metrics under 1) of
    the window's at every budget, its circles hidden under the window's diamonds. By hand: two prompts of context 8,
    full-cache metric 0.25 (step eps(bf16) x max(1, 0.25) = 2^-7); heavy hitters' changes -0.0625 and 0 at budgets 2
    and 4, the window's -0.0625 + 2^-8 and 0: within one step at both, so heavy hitters is drawn over it, dashed with
    open markers, and its legend says so; 2^-6 apart at one budget, it is not."""
    import torch

    from headscope.analyses.core.result import Result

    assert float(torch.finfo(torch.bfloat16).eps) == 2 ** -7

    def result(gap):
        rows = [{"policy": "full", "budget": 8, "example": e, "context": 8, "metric": 0.25} for e in range(2)]
        for policy, shift in (("heavy_hitters", 0.0), ("window", gap)):
            rows += [{"policy": policy, "budget": b, "example": e, "context": 8, "metric": 0.25 + d + shift}
                     for b, d in ((2, -0.0625), (4, 0.0)) for e in range(2)]
        return Result(name="kv", df=pd.DataFrame(rows), tables={"norms": pd.DataFrame(), "sinks": pd.DataFrame()},
                      summary={"metric": "logit_diff", "dtype": "bfloat16", "recent_share": 0.5})

    for gap, hidden in ((2 ** -8, True), (2 ** -6, False)):
        from headscope.reports import plots_kv

        ax = plots_kv.plot_eviction(result(gap).df, metric="logit_diff", recent_share=0.5,
                                    step=plots_kv._rounding_step(result(gap)), ax=plt.subplots()[1])
        try:
            heavy = next(li for li in ax.get_lines() if li.get_label().startswith("heavy hitters"))
            window = next(li for li in ax.get_lines() if li.get_label() == "window")
            note = "(drawn dashed: within one rounding\nstep, 0.0078, of window\nat every budget)"
            assert (note in heavy.get_label()) is hidden and (heavy.get_linestyle() == "--") is hidden
            assert (heavy.get_zorder() > window.get_zorder()) is hidden and window.get_linestyle() == "-"
        finally:
            plt.close("all")


def test_kv_eviction_tick_labels_never_collide_for_close_budgets():
    """Review 7 B3: budgets 16 and 19 on the log axis printed "16 / 6/16" and "19 / 0/16" into each other. With
    budgets 16, 17, 19 and 20 as close neighbours, the saved figure's drawn tick labels do not overlap; every
    unlabelled tick is named in the x label with its count (contexts 12, 16, 18, 20: budget b evicts from the
    prompts longer than b), and the first budget of a close group keeps its label."""
    from headscope.reports.plots import laid_out
    from headscope.reports.plots_kv import plot_eviction

    contexts = (12, 16, 18, 20)
    budgets = (1, 2, 4, 8, 16, 17, 19, 20)
    rows = [{"policy": p, "budget": b, "example": e, "context": c, "metric": float(e)}
            for p, bs in (("full", (20,)), ("window", budgets)) for b in bs for e, c in enumerate(contexts)]
    fig = laid_out(plot_eviction(pd.DataFrame(rows), metric="logit_diff"))  # as kv's figures() saves it
    try:
        [ax] = fig.axes
        shown = _shown_xticks_apart(fig, ax)
        texts = {int(t.get_text().split()[0]): t.get_text() for t in shown}
        counts = {b: f"{sum(c > b for c in contexts)}/4" for b in budgets}  # 16: 2/4, 17: 2/4, 19: 1/4, 20: 0/4
        assert {1, 2, 4, 8, 16} <= set(texts) and all(texts[b] == f"{b}\n{counts[b]}" for b in texts)
        hidden = [b for b in budgets if b not in texts]
        assert hidden and len(ax.get_xticks()) == len(budgets)  # the ticks stay, only their labels go
        assert ax.get_xlabel().replace("\n", " ").endswith(
            "unlabelled ticks: " + ", ".join(f"{b} ({counts[b]})" for b in hidden))
    finally:
        plt.close("all")


def test_kv_eviction_ticks_and_legend_stay_clear_at_the_reports_layout(monkeypatch):
    """Review 16d C1: on OPT's sweep (16 prompts of contexts 8..44, budgets 1..32 and 45) the report's figure ran
    "14/16" (budget 16) into "2/16" (budget 32), and the legend covered the end of the x label: plot_result's final
    layout (fit_labels' wrapped y label) narrowed the axes after the ticks were thinned. Through plot_result, the
    drawn tick labels are at least 4 px apart and the legend's box does not meet the x label's."""
    from headscope.analyses.core.result import Result
    from headscope.reports.plots import plot_result

    contexts = [8 + (36 * e) // 15 for e in range(16)]  # 8..44: budget 32 evicts from the two longest
    contexts[-2], contexts[-1] = 40, 44
    budgets = (1, 2, 4, 8, 16, 32)
    rows = [{"policy": "full", "budget": 45, "example": e, "context": c, "metric": 10.0 + e} for e, c in enumerate(contexts)]
    rows += [{"policy": p, "budget": b, "example": e, "context": c, "metric": 10.0 + e}
             for p in ("heavy_hitters", "sink_window", "window") for b in budgets + (45,) for e, c in enumerate(contexts)]
    result = Result(name="kv", df=pd.DataFrame(rows), tables={"norms": pd.DataFrame(), "sinks": pd.DataFrame()},
                    summary={"metric": "logit_diff", "dtype": "float32", "recent_share": 0.5})
    from headscope.reports import plots_kv

    monkeypatch.setattr(plots_kv, "plot_norms", lambda *a, **k: plt.subplots()[1])  # (these need real tables)
    monkeypatch.setattr(plots_kv, "plot_sinks", lambda *a, **k: plt.subplots()[1])
    try:
        fig = plot_result(result)["kv_eviction"]
        [ax] = fig.axes
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        shown = [t for t in ax.get_xticklabels() if t.get_text()]
        boxes = sorted((t.get_window_extent(renderer) for t in shown), key=lambda b: b.x0)
        assert len(shown) >= 3 and all(b.x0 - a.x1 >= 4.0 for a, b in zip(boxes, boxes[1:]))
        legend, xlabel = ax.get_legend().get_window_extent(renderer), ax.xaxis.label.get_window_extent(renderer)
        assert not legend.overlaps(xlabel)
        assert xlabel.x1 <= ax.get_window_extent(renderer).x1 + 0.5  # every x label line within the axes' width
    finally:
        plt.close("all")


def test_kv_eviction_labels_leave_no_word_alone_and_the_x_label_two_lines(monkeypatch):
    """Review 16dv C2: at the report's layout (plot_result; the legend outside narrows the axes) the x label wrapped
    to five lines with "log2)" and "all" alone on theirs, the title's last line was "interval)". On OPT's sweep shape
    (16 prompts of contexts 8..44, budgets 1..32 and 45) every line of the title and both axis labels holds two words
    or more and the x label is two lines, plus one naming the blanked tick."""
    from headscope.analyses.core.result import Result
    from headscope.reports import plots_kv
    from headscope.reports.plots import plot_result

    contexts = [8 + (36 * e) // 15 for e in range(16)]
    budgets = (1, 2, 4, 8, 16, 32)
    rows = [{"policy": "full", "budget": 45, "example": e, "context": c, "metric": 10.0 + e} for e, c in enumerate(contexts)]
    rows += [{"policy": p, "budget": b, "example": e, "context": c, "metric": 10.0 - b / 8 + e}
             for p in ("heavy_hitters", "sink_window", "window") for b in budgets + (45,) for e, c in enumerate(contexts)]
    result = Result(name="kv", df=pd.DataFrame(rows), tables={"norms": pd.DataFrame(), "sinks": pd.DataFrame()},
                    summary={"metric": "logit_diff", "dtype": "float32", "recent_share": 0.5})
    monkeypatch.setattr(plots_kv, "plot_norms", lambda *a, **k: plt.subplots()[1])
    monkeypatch.setattr(plots_kv, "plot_sinks", lambda *a, **k: plt.subplots()[1])
    try:
        [ax] = plot_result(result)["kv_eviction"].axes
        assert ax.get_xlabel() == ("cache budget (positions per layer)\nunder it: evicted / all prompts\n"
                                   "unlabelled ticks: 45 (0/16)")  # the blanked tick's own line (too close to 32)
        for text in (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()):
            assert all(len(line.split()) >= 2 for line in text.split("\n")), text
    finally:
        plt.close("all")


def _kv_result(rows, dtype="float32"):
    from headscope.analyses.core.result import Result

    return Result(name="kv", df=pd.DataFrame(rows), tables={"norms": pd.DataFrame(), "sinks": pd.DataFrame()},
                  summary={"metric": "logit_diff", "dtype": dtype, "recent_share": 0.5})


def test_kv_eviction_cuts_a_two_prompt_interval_at_the_axis_and_zooms_on_the_band(monkeypatch):
    """Reviews 17a C2 / 17b C1: a sink-window interval over 2 prompts ([-26.2, +22.9]) set the y range to +-25 logits and
    the grey +-1% band (+-0.037) was a pixel high. By hand: 16 prompts, 14 of context 12 and 2 of context 40, full
    cache 10 on each (band 0.1); window at 4 and 8 loses 6 and 1 logits on every prompt (+-0.1 per prompt, alternating),
    at 32 (the two long prompts) +10 and -12. The y range is set by the means and the intervals over 3 prompts or more;
    budget 32's interval (scipy's t over its 2 prompts) is cut at the axis, a triangle at each end, its ends in the
    legend; a second panel zoomed on the band (+-5 bands at the least, +-10 at most: the closest mean, -1, x 1.25 is
    past that) carries the budget ticks."""
    from scipy import stats

    from headscope.reports import plots_kv
    from headscope.reports.plots import plot_result

    ctx = [12] * 14 + [40] * 2
    rows = [{"policy": "full", "budget": 41, "example": e, "context": c, "metric": 10.0} for e, c in enumerate(ctx)]
    for b, loss in ((4, -6.0), (8, -1.0)):
        rows += [{"policy": "window", "budget": b, "example": e, "context": c, "metric": 10.0 + loss + (-1) ** e * 0.1}
                 for e, c in enumerate(ctx)]
    rows += [{"policy": "window", "budget": 32, "example": e, "context": c,
              "metric": 10.0 + (0.0 if c < 32 else (10.0 if e == 14 else -12.0))} for e, c in enumerate(ctx)]
    monkeypatch.setattr(plots_kv, "plot_norms", lambda *a, **k: plt.subplots()[1])
    monkeypatch.setattr(plots_kv, "plot_sinks", lambda *a, **k: plt.subplots()[1])
    ci = stats.ttest_1samp([10.0, -12.0], 0.0).confidence_interval(0.95)  # [-141, +139] at 3 digits
    wide4 = stats.ttest_1samp([-6.0 + (-1) ** e * 0.1 for e in range(16)], 0.0).confidence_interval(0.95)
    try:
        fig = plot_result(_kv_result(rows))["kv_eviction"]
        ax, zoom = fig.axes
        low, high = ax.get_ylim()
        pad = 0.08 * (0.1 - wide4.low)  # the range: budget 4's interval's low end to the band's top (+0.1), 8% padded
        assert (low, high) == pytest.approx((wide4.low - pad, 0.1 + pad))
        marks = [li for li in ax.get_lines() if li.get_marker() in ("^", "v") and list(li.get_xdata()) == [32]]
        assert sorted((li.get_marker(), li.get_ydata()[0]) for li in marks) == [("^", high), ("v", low)]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert (f"interval cut at the axis\n(fewer than 3 prompts):\nwindow at 32: [{ci.low:+.0f}, {ci.high:+.0f}] (n = 2)"
                in legend), legend
        assert zoom.get_ylim() == pytest.approx((-1.0, 1.0))  # 10 bands of 0.1 (1.25 x the closest mean, 1, is more)
        band = [c for c in zoom.collections if abs(c.get_paths()[0].vertices[:, 1].max() - 0.1) < 1e-9]
        assert band and "zoomed on the grey band" in zoom.get_title()
        assert [t.get_text() for t in zoom.get_xticklabels() if t.get_text()][:2] == ["4\n16/16", "8\n16/16"]
        assert not any(t.get_text() for t in ax.get_xticklabels()) and ax.get_xlabel() == ""
        assert zoom.get_xlabel().startswith("cache budget (positions per layer)")
    finally:
        plt.close("all")


def test_kv_eviction_x_label_keeps_each_unlabelled_budget_with_its_count(monkeypatch):
    """Review 16dv C2: the x label's wrap split "8" from its "(16/16)". Budgets 16 to 23, one apart on the log axis,
    leave most labels blank; the line naming them wraps only between entries: every "budget (count)" on one line."""
    import re

    from headscope.reports import plots_kv
    from headscope.reports.plots import plot_result

    budgets = (1, 2, 4, 8, *range(16, 24))
    rows = [{"policy": "full", "budget": 30, "example": e, "context": 30, "metric": 10.0 + e} for e in range(16)]
    rows += [{"policy": p, "budget": b, "example": e, "context": 30, "metric": 10.0 + e - 30 / b}
             for p in ("heavy_hitters", "sink_window", "window") for b in budgets for e in range(16)]
    monkeypatch.setattr(plots_kv, "plot_norms", lambda *a, **k: plt.subplots()[1])
    monkeypatch.setattr(plots_kv, "plot_sinks", lambda *a, **k: plt.subplots()[1])
    try:
        fig = plot_result(_kv_result(rows))["kv_eviction"]
        ticked = next(a for a in fig.axes if a.get_xlabel())
        lines = ticked.get_xlabel().split("\n")
        start = next(i for i, line in enumerate(lines) if line.startswith("unlabelled ticks:"))
        named = " ".join(lines[start:])
        assert len(re.findall(r"\d+ \(16/16\)", named)) >= 4 and len(lines) > start + 1  # several, over two lines
        for line in lines[start:]:
            entries = line.removeprefix("unlabelled ticks:").strip().rstrip(",").split(", ")
            assert all(re.fullmatch(r"\d+ \(16/16\)", e) for e in entries), line
        assert "\u00a0" not in ticked.get_xlabel()
    finally:
        plt.close("all")


def test_best_head_bars_carry_their_95_percent_intervals_and_n():
    """Review 5 B5: best_head.png drew its bars as exact. Each bar now carries t(15) x se (t(15, 0.975) =
    2.13145, from tables) around its change, and the title says n = 16; a table without se says so."""
    from headscope.reports.plots_heads import plot_best_head

    table = pd.DataFrame({"layer": [0, 1], "head": [3, 0], "change": [-0.79, -0.5], "oracle_change": [-0.79, -0.14],
                          "layer_removed_change": [-8.9, 0.66], "change_se": [0.1, 0.2], "oracle_change_se": [0.1, 0.05],
                          "layer_removed_change_se": [1.0, 0.3], "n_examples": [16, 16]})
    try:
        ax = plot_best_head(table, metric="logit_diff", ax=plt.subplots()[1])
        assert "n = 16 examples" in ax.get_title() and "95% t-interval" in ax.get_title()
        from matplotlib.container import BarContainer

        groups = [c for c in ax.containers if isinstance(c, BarContainer)]
        assert len(groups) == 3
        for bars, kind in zip(groups, ("change", "oracle_change", "layer_removed_change")):
            assert [round(b.get_height(), 6) for b in bars] == list(table[kind])
            segments = bars.errorbar.lines[2][0].get_segments()  # one vertical segment per layer
            for (low, high), value, se in zip(([seg[0][1], seg[1][1]] for seg in segments), table[kind],
                                              table[f"{kind}_se"]):
                assert low == pytest.approx(value - 2.13145 * se, abs=1e-4)
                assert high == pytest.approx(value + 2.13145 * se, abs=1e-4)
        old = plot_best_head(table.drop(columns=["change_se", "n_examples"]), ax=plt.subplots()[1])
        assert old.get_title() == "keep one head in one layer (no interval recorded)"
        assert all(b.errorbar is None for b in old.containers if isinstance(b, BarContainer))
    finally:
        plt.close("all")


def test_best_head_marks_a_zero_bar_so_it_differs_from_a_missing_one():
    """Review 11a C10 (out_t/heads/best_head.csv, layer 0): keeping L0H0 alone changes the cosine by -0.00026 next to
    a -0.50 'no head' bar: bars of no visible height. Each bar under half a percent of the largest |change| (here
    0.0025) gets a diamond at 0 in its colour; a missing value (NaN) gets none; bars of visible height none."""
    from headscope.reports.plots_heads import plot_best_head

    table = pd.DataFrame({"layer": [0, 1], "head": [0, 1], "change": [-0.00026, np.nan], "oracle_change": [-0.00026, -0.3],
                          "layer_removed_change": [-0.5012, -0.002]})
    try:
        ax = plot_best_head(table, metric="cosine", ax=plt.subplots()[1])
        diamonds = [line for line in ax.get_lines() if line.get_marker() == "D" and len(line.get_xdata())]
        width = 0.8 / 3  # three kinds a layer, centred on the layer
        got = sorted((round(float(x), 6), float(y)) for line in diamonds for x, y in zip(line.get_xdata(), line.get_ydata()))
        assert got == [(round(-width, 6), 0.0), (0.0, 0.0), (round(1 + width, 6), 0.0)]  # L0 kept, L0 best, L1 none
        assert "bar too short to see" in " ".join(t.get_text() for t in ax.get_legend().get_texts())
        assert all(not line.get_clip_on() for line in diamonds)  # 0 is the top edge here: the markers stay whole
    finally:
        plt.close("all")


def test_top_heads_are_not_a_ranking_of_ties_or_zeros():
    from headscope.reports.plots_attention import top_heads

    def data(grid):
        return {"scores": {"importance (gradient)": grid}, "default_score": "importance (gradient)"}

    # MiniLM's gradient importance rounds to 0 in the explorer: no head is top, not L0H0-L0H3
    assert top_heads(data([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])) == []
    # signed (review 18w C1): -0.9, a head whose removal helps, is no top head
    assert top_heads(data([[0.5, -0.9, 0.0], [0.2, 0.2, 0.2]]), k=3) == [(0, 0, 0.5)]  # 0.2 ties at the cut
    assert top_heads(data([[0.5, -0.9, 0.0], [0.2, 0.1, 0.3]]), k=3) == [(0, 0, 0.5), (1, 2, 0.3), (1, 0, 0.2)]


def test_position_curve_title_claims_a_u_shape_only_when_the_bands_separate():
    from headscope.reports.plots_position import plot_curve

    def curve(bands):
        return pd.DataFrame([{"condition": "full", "metric": "accuracy", "position": p, "mean": m, "ci_low": lo,
                              "ci_high": hi} for p, (m, lo, hi) in enumerate(bands, 1)])

    where = {"n_items": 3, "ratio": 0.52 / 0.67}
    overlap = curve([(0.67, 0.4, 0.9), (0.52, 0.25, 0.8), (0.55, 0.3, 0.8)])  # MiniLM's 8 examples
    separate = curve([(0.9, 0.85, 0.95), (0.4, 0.3, 0.5), (0.8, 0.7, 0.9)])
    try:
        title = plot_curve(overlap, **where, ax=plt.subplots()[1]).get_title()
        assert title == "min(middle) / max(ends) = 0.78\n95% bands of the middle and an end overlap: no U-shape shown"
        title = plot_curve(separate, **where, ax=plt.subplots()[1]).get_title()
        assert title.endswith("U-shape: the middle's 95% band lies below both ends'")
    finally:
        plt.close("all")


def test_position_curve_draws_the_no_gold_baseline_as_a_grey_line_and_band():
    """Review 11a C6: the curve carries Liu et al.'s no-gold baseline (the summary's no_gold_baseline entry) as a
    horizontal line at its mean with its 95% band, in the legend; a curve without one draws neither."""
    from headscope.reports.plots_position import plot_curve

    curve = pd.DataFrame([{"condition": "full", "metric": "cosine", "position": p, "mean": m, "ci_low": m - 0.05,
                           "ci_high": m + 0.05} for p, m in ((1, 0.67), (2, 0.52), (3, 0.55))])
    try:
        ax = plot_curve(curve, n_items=3, no_gold={"mean": 0.31, "ci": [0.28, 0.35]}, ax=plt.subplots()[1])
        [line] = [ln for ln in ax.get_lines() if ln.get_label().startswith("no gold")]
        assert set(np.round(line.get_ydata(), 6)) == {0.31}
        [band] = ax.patches  # axhspan: the curve's own bands are fill_between collections
        assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((0.28, 0.35))
        assert ax.get_ylim()[0] < 0.28 and "no gold item (95% band)" in [t.get_text() for t in ax.get_legend().get_texts()]
        bare = plot_curve(curve, n_items=3, ax=plt.subplots()[1])
        assert not [ln for ln in bare.get_lines() if ln.get_label().startswith("no gold")] and not bare.patches
    finally:
        plt.close("all")


def test_position_streaming_draws_the_no_gold_log_probability_as_its_labelled_reference_band():
    """#34 item 7: the streaming figure (full vs window vs sinks + window) carries the same honest reference as the
    curve: the answer's log-probability without the gold item (the summary's no_gold_baseline["logprob"], full
    attention) as a grey line at its mean and a band at its 95% interval, inside the axis and named in the legend;
    the curve figure keeps the primary metric's baseline, and a run without a baseline draws none."""
    from types import SimpleNamespace

    from headscope.reports.plots_position import STREAMING_BASELINE, figures

    curve = pd.DataFrame([{"condition": c, "metric": m, "position": p, "mean": v, "ci_low": v - 0.3, "ci_high": v + 0.3}
                          for c, shift in (("full", 0.0), ("window", -2.0), ("sink_window", -1.0))
                          for m, v0 in (("accuracy", 0.5), ("logprob", -2.0)) for p in (1, 2, 3)
                          for v in [v0 if m == "accuracy" else v0 + shift]])
    tables = {"curve": curve, "masked": pd.DataFrame({"condition": ["window", "sink_window"]}),
              "gold_attention": pd.DataFrame([{"layer": 0, "head": 0, "position": p, "mass": 0.1} for p in (1, 2, 3)]),
              "sinks": pd.DataFrame({"layer": [0], "sink_mass": [0.2], "baseline": [0.2]})}
    base = {"accuracy": {"mean": 0.1, "ci": [0.0, 0.3]}, "logprob": {"mean": -6.5, "ci": [-7.25, -5.75]}}
    summary = {"primary_metric": "accuracy", "n_items": 3, "n_sink": 1, "no_gold_baseline": base}
    try:
        figs = figures(SimpleNamespace(summary=summary, tables=tables))
        ax = figs["position_streaming"].axes[0]
        [line] = [ln for ln in ax.get_lines() if ln.get_label() == STREAMING_BASELINE]
        assert set(np.round(line.get_ydata(), 6)) == {-6.5}
        [band] = ax.patches
        assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((-7.25, -5.75))
        low, high = ax.get_ylim()
        assert low < -7.25 and high > -1.7  # the band and every condition's band in view
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["full", "window", "sink_window", STREAMING_BASELINE]
        [acc_line] = [ln for ln in figs["position_curve"].axes[0].get_lines() if ln.get_label().startswith("no gold")]
        assert set(np.round(acc_line.get_ydata(), 6)) == {0.1}
        bare = figures(SimpleNamespace(summary={**summary, "no_gold_baseline": {}}, tables=tables))
        assert not bare["position_streaming"].axes[0].patches
        assert [t.get_text() for t in bare["position_streaming"].axes[0].get_legend().get_texts()] == legend[:3]
    finally:
        plt.close("all")


# ---- noise never vivid, honest labels (#34 figure defects) ---------------------------------------
def test_kv_sinks_draws_each_layers_interval_over_prompts():
    from headscope.reports.plots_kv import plot_sinks

    sinks = pd.DataFrame({"layer": [0, 1, 2], "sink_mass": [0.15, 0.325, 0.10], "baseline_mass": [0.18] * 3,
                          "baseline": "uniform", "ci_low": [0.14, 0.31, 0.09], "ci_high": [0.16, 0.34, 0.11]})
    try:
        ax = plot_sinks(sinks, ax=plt.subplots()[1])
        heights = [round(p.get_height(), 3) for p in ax.patches]
        assert heights == [0.15, 0.325, 0.1, 0.18, 0.18, 0.18]
        [bars] = [c for c in ax.containers if getattr(c, "errorbar", None) is not None and c.errorbar is not None]
        segments = bars.errorbar.lines[2][0].get_segments()
        assert [tuple(np.round(seg[:, 1], 3)) for seg in segments] == [(0.14, 0.16), (0.31, 0.34), (0.09, 0.11)]
        assert [t.get_text() for t in ax.get_legend().get_texts()][1] == "if uniform"
        # review 16c B1: an ALiBi model's baseline is its bias alone (baseline "alibi", the uniform share beside it)
        alibi = plot_sinks(sinks.assign(baseline="alibi", uniform_share=0.25), ax=plt.subplots()[1])
        assert [t.get_text() for t in alibi.get_legend().get_texts()][1] == "ALiBi's bias alone\n(equal scores)"
    finally:
        plt.close("all")


def test_position_sinks_draws_each_layers_interval_from_the_sinks_table():
    """Review 7 B4: position_sinks drew the mass per layer without the 95% interval the finding quotes (and
    kv_sinks draws). Each bar's error bar spans exactly the table's ci_low..ci_high (sinks.layer_sinks), the
    axis reaches the highest end; a table without intervals draws none and says so."""
    from matplotlib.container import BarContainer

    from headscope.reports.plots_position import plot_sink_mass

    sinks = pd.DataFrame({"layer": [0, 1], "sink_mass": [0.1309, 0.0716], "baseline": [0.1199, 0.1199],
                          "ci_low": [0.1298, 0.0644], "ci_high": [0.1320, 0.0788], "ratio": [1.09, 0.6], "sink": [False] * 2})
    try:
        ax = plot_sink_mass(sinks, n_sink=4, ax=plt.subplots()[1])
        [bars] = [c for c in ax.containers if isinstance(c, BarContainer)]
        assert [round(b.get_height(), 4) for b in bars] == [0.1309, 0.0716]
        segments = bars.errorbar.lines[2][0].get_segments()
        assert [tuple(np.round(seg[:, 1], 4)) for seg in segments] == [(0.1298, 0.1320), (0.0644, 0.0788)]
        assert ax.get_ylim()[1] >= 0.1320 and any("95% t interval" in t.get_text() for t in ax.get_legend().get_texts())
        bare = plot_sink_mass(sinks.drop(columns=["ci_low", "ci_high"]), n_sink=4, ax=plt.subplots()[1])
        assert all(c.errorbar is None for c in bare.containers if isinstance(c, BarContainer))
        assert "no interval recorded" in bare.get_title()
    finally:
        plt.close("all")


def test_position_sinks_title_is_one_line_at_the_reports_size():
    """Review 16c C3: the title 'attention sink per layer (error bars: 95% t interval of the mean over examples)'
    wrapped to five lines over a small axes in a narrow column. It is one short line now, its detail in the legend
    (and the caption); the ALiBi baseline is named in the legend where the summary says so (review 16c B1)."""
    from headscope.reports import plots_position
    from headscope.reports.plots import fit_labels

    sinks = pd.DataFrame({"layer": [0, 1, 2], "sink_mass": [0.04, 0.02, 0.17], "baseline": [0.052] * 3,
                          "ci_low": [0.03, 0.02, 0.17], "ci_high": [0.04, 0.03, 0.17], "ratio": [0.7, 0.4, 3.3],
                          "sink": [False, False, True]})
    for kind, named in ((None, "uniform attention"), ("alibi", "ALiBi's bias alone\n(equal scores)")):
        fig, ax = plt.subplots(figsize=(7, 4))
        try:
            plots_position.plot_sink_mass(sinks, n_sink=1, ax=ax, baseline_kind=kind)
            fig.tight_layout()
            fit_labels(ax)  # as figures() draws it: the title stays one line at 7 x 4 in
            assert ax.get_title() == "attention sink per layer" and ax.get_title().count("\n") + 1 == 1
            legend = [t.get_text() for t in ax.get_legend().get_texts()]
            assert named in legend and "measured (error bars:\n95% t interval of the\nmean over examples)" in legend
        finally:
            plt.close(fig)


def test_position_sinks_y_label_stays_below_the_title():
    """Review 11a B4 (out_minilm/position/sinks.csv, layers 0-1): the one-line label 'attention mass on the first 4
    token(s) (0-1)' ran past the axis into the two-line title at the report's size (7 x 4 in, tight layout)."""
    from headscope.reports.plots_position import plot_sink_mass

    sinks = pd.DataFrame({"layer": range(6), "sink_mass": [0.111, 0.427, 0.463, 0.427, 0.463, 0.273], "baseline": 0.0616,
                          "ci_low": [0.106, 0.417, 0.45, 0.41, 0.44, 0.26], "ci_high": [0.116, 0.436, 0.47, 0.45, 0.48, 0.29],
                          "ratio": 2.0, "sink": True})
    for what in (None, "[CLS] (the first token)"):
        fig, ax = plt.subplots(figsize=(7, 4))
        try:
            plot_sink_mass(sinks, n_sink=4, what=what, ax=ax)
            fig.tight_layout()
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            label, title = ax.yaxis.label.get_window_extent(renderer), ax.title.get_window_extent(renderer)
            assert not _overlap(label, title), (what, label, title)
            assert ax.get_ylabel().endswith("on [CLS]" if what else "on the first 4 token(s)")
        finally:
            plt.close(fig)


def test_position_curves_at_chance_are_drawn_muted_on_a_0_1_accuracy_axis_with_their_band():
    """review 5 B2/A10: the curve and streaming figures titled AT CHANCE draw pale lines (every RGB channel
    >= MUTE, as plots.muted does a map); accuracy spans 0-1 and its exact band of 0/8, [0, 0.37], is drawn."""
    from types import SimpleNamespace

    from matplotlib.colors import to_rgb

    from headscope.reports.plots import MUTE
    from headscope.reports.plots_position import figures

    high = 1 - 0.025 ** (1 / 8)  # Clopper-Pearson upper bound of 0/8
    curve = pd.DataFrame([{"condition": c, "metric": m, "position": p, "mean": 0.0 if m == "accuracy" else -5.0,
                           "ci_low": 0.0 if m == "accuracy" else -5.5, "ci_high": high if m == "accuracy" else -4.5}
                          for c in ("full", "window") for m in ("accuracy", "logprob") for p in (1, 2, 3)])
    tables = {"curve": curve, "masked": pd.DataFrame({"condition": ["window"]}),
              "gold_attention": pd.DataFrame([{"layer": 0, "head": 0, "position": p, "mass": 0.1} for p in (1, 2, 3)]),
              "sinks": pd.DataFrame({"layer": [0], "sink_mass": [0.2], "baseline": [0.2]})}
    summary = {"primary_metric": "accuracy", "n_items": 3, "n_sink": 1}
    chance = {**summary, "chance": {"at_chance": True, "metric": "accuracy"}}
    try:
        for s, pale in ((chance, True), (summary, False)):
            figs = figures(SimpleNamespace(summary=s, tables=tables))
            for stem in ("position_curve", "position_streaming"):
                ax = figs[stem].axes[0]
                colours = [np.asarray(to_rgb(line.get_color())) for line in ax.get_lines()]
                assert colours and all((c.min() >= MUTE - 1e-9) == pale for c in colours), (stem, colours)
                assert ("AT CHANCE" in ax.get_title()) == pale
            acc = figs["position_curve"].axes[0]
            assert acc.get_ylim() == pytest.approx((-0.02, 1.02))
            band = acc.collections[0].get_paths()[0].vertices[:, 1]
            assert band.max() == pytest.approx(high) and band.min() == pytest.approx(0.0)
    finally:
        plt.close("all")


def _saturation(ax, value) -> float:
    """max - min of the RGB channels the map gives `value` (0 for grey or white, ~0.7 for a vivid red)."""
    mesh = ax.collections[0]
    rgb = np.asarray(mesh.cmap(mesh.norm(value)))[:3]
    return float(rgb.max() - rgb.min())


def _panels(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def _heads_rows(gradient, zero):
    return pd.DataFrame([{"layer": l, "head": h, "method": m, "importance": v[l][h], "importance_layer_norm": 0.0}
                         for m, v in (("gradient", gradient), ("zero", zero)) for l in range(2) for h in range(2)])


def test_unsigned_gradient_importance_is_sequential_from_zero_and_ablation_diverging():
    from headscope.reports.plots_heads import figures as heads_figures

    df = _heads_rows([[0.1, 0.9], [0.3, 0.0]], [[0.2, 0.4], [0.1, 0.0]])  # ablation effects all >= 0 here: still signed
    fig = heads_figures(_result("heads", df, {"metric": "logit_diff", "baseline_metric": 3.0}))["importance"]
    try:
        gradient, zero = _panels(fig)
        mesh = gradient.collections[0]
        assert (mesh.norm.vmin, mesh.norm.vmax) == (0.0, 0.9)  # from 0 to the largest |dL/d gate|
        assert _saturation(gradient, 0.0) < 0.1 and _saturation(gradient, 0.9) > 0.35  # near-white at 0, dark red at the top
        assert _norm(zero) == ("diverging", -0.4, 0.4)
        assert "AT CHANCE" not in gradient.get_title() + zero.get_title()
    finally:
        plt.close("all")


def test_heads_at_chance_or_under_the_noise_floor_are_not_drawn_vivid():
    """A random model at chance: its ablation effects are muted and say why; MiniLM-like gradients of
    1e-8..2e-7 under the noise floor go on the metric's own scale (white), not stretched to full colour."""
    from headscope.reports.plots_heads import figures as heads_figures

    df = _heads_rows([[1e-8, 2e-7], [5e-8, 0.0]], [[0.04, -0.05], [0.01, 0.0]])
    summary = {"metric": "logit_diff", "baseline_metric": 0.02, "noise_floor": 3e-5, "degenerate_gradient": "below",
               "chance": {"at_chance": True, "reason": "the 95% CI contains chance"}}
    fig = heads_figures(_result("heads", df, summary))["importance"]
    try:
        gradient, zero = _panels(fig)
        assert gradient.collections[0].norm.vmax == 1.0  # max(1, |baseline|): the metric's size
        assert _saturation(gradient, 2e-7) < 0.05  # as pale as 0 (the unmuted map's 0 is 0.06)
        assert "UNDER THE FLOOR" in gradient.get_title() and "±1" in gradient.get_title()
        assert "AT CHANCE" in zero.get_title() and "AT CHANCE" in gradient.get_title()
        assert _saturation(zero, 0.05) < 0.2 and _saturation(zero, -0.05) < 0.2  # RdBu_r's own ends: 0.40, 0.36
    finally:
        plt.close("all")


def test_heads_rounding_titles_of_both_panels_do_not_run_into_each_other():
    """Review 7 B4: a bfloat16 run whose two importance panels both carried the long ROUNDING ONLY line drew two red
    titles over each other; each panel's title is wrapped to its own width."""
    from headscope.reports.plots_heads import figures as heads_figures

    df = _heads_rows([[1e-8, 2e-7], [5e-8, 0.0]], [[1e-6, -2e-6], [1e-6, 0.0]])
    summary = {"metric": "logit_diff", "baseline_metric": 10.36, "noise_floor": 1.29, "degenerate_gradient": "below",
               "degenerate_zero": "below"}
    fig = heads_figures(_result("heads", df, summary))["importance"]
    try:
        gradient, zero = _panels(fig)
        fig.canvas.draw()
        left, right = (ax.title.get_window_extent() for ax in (gradient, zero))
        assert "UNDER THE FLOOR" in gradient.get_title() and "ROUNDING ONLY" in zero.get_title()
        assert left.x1 < right.x0  # side by side, apart
    finally:
        plt.close("all")


def _exact(sites, n_pos=0, tokens=()):
    rows = [{"site_type": "head_out", "layer": l, "head": h, "pos": None, "token": "", "effect": 0.4 * (l - h)}
            for l in range(2) for h in range(2)]
    rows += [{"site_type": "resid_pre", "layer": l, "head": None, "pos": p, "token": tokens[p], "effect": 0.1 * p}
             for l in range(2) for p in range(n_pos)] if "resid_pre" in sites else []
    return pd.DataFrame(rows)


def test_path_patching_shares_the_exact_scale_and_is_muted_at_chance():
    from headscope.reports.plots_patching import figures as patching_figures

    exact = _exact(("head_out",))
    paths = pd.DataFrame([{"sender_layer": l, "sender_head": h, "receiver": "logits", "effect": 0.05 * (h - l)}
                          for l in range(2) for h in range(2)])
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "clean_metric": 1.0,
               "corrupted_metric": 0.0}
    figs = patching_figures(_result("patching", exact, summary, exact=exact, path_patching=paths))
    quiet = patching_figures(_result("patching", exact, {**summary, "chance": {"at_chance": True}}, exact=exact,
                                     path_patching=paths))
    try:
        path = figs["path_patching"].axes[0]
        assert _norm(path) == ("diverging", -0.4, 0.4)  # head_out's ±0.4, not its own ±0.05
        assert "this panel's max |value| 0.05" in path.get_title()
        assert "AT CHANCE" not in path.get_title()
        titled = patching_figures(_result("patching", exact, summary, exact=exact, path_patching=paths.assign(n_rows=8)))
        said = " ".join(titled["path_patching"].axes[0].get_title().split())
        assert "path patching: sender head -> logits, n = 8 prompts" in said  # review 12c B3
        for stem in ("path_patching", "exact_head_out"):
            ax = quiet[stem].axes[0]
            assert "AT CHANCE" in ax.get_title() and _saturation(ax, 0.4) < 0.2
    finally:
        plt.close("all")


def test_patching_positions_of_several_prompts_are_counted_from_the_end_not_one_prompts_tokens():
    from headscope.reports.plots_patching import figures as patching_figures

    tokens = ["0: When", "1: Mary", "2: and", "3: John"]  # the longest prompt's tokens, as the analysis labels them
    exact = _exact(("head_out", "resid_pre"), 4, tokens)
    summary = {"metric": "logit_diff", "normalized": False, "clean_metric": 1.0, "corrupted_metric": 0.0,
               "n_positions": 4}
    many = patching_figures(_result("patching", exact, {**summary, "n_examples": 3}, exact=exact))["exact_resid_pre"]
    one = patching_figures(_result("patching", exact, {**summary, "n_examples": 1}, exact=exact))["exact_resid_pre"]
    try:
        ax = many.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["-4", "-3", "-2", "-1 (last)"]
        assert "from the end" in ax.get_xlabel() and "3 prompts" in ax.get_xlabel()
        assert [t.get_text() for t in one.axes[0].get_xticklabels()] == tokens  # one prompt: its own tokens
    finally:
        plt.close("all")


def test_patching_columns_that_fewer_prompts_reach_are_muted_and_give_their_n():
    """#34 review 5 (B7): under left padding, the columns far from the end average over the longer prompts only
    (the exact table's n_rows); as in the logit lens they are veiled and their ticks say n."""
    from matplotlib.patches import Rectangle

    from headscope.reports.plots_circuits import PARTIAL_VEIL
    from headscope.reports.plots_patching import figures as patching_figures

    exact = _exact(("head_out", "resid_pre"), 4, ["0: a", "", "2: b", "3: c"])
    exact["n_rows"] = exact["pos"].map({0: 2, 1: 6, 2: 8, 3: 8}).astype("Int64")  # head_out rows: NaN pos
    summary = {"metric": "logit_diff", "normalized": False, "clean_metric": 1.0, "corrupted_metric": 0.0,
               "n_positions": 4, "n_examples": 8}
    fig = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"]
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["-4 (n=2)", "-3 (n=6)", "-2", "-1 (last)"]
        veils = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_label() == "fewer prompts"]
        assert sorted(p.get_x() for p in veils) == [0, 1] and all(p.get_alpha() == PARTIAL_VEIL for p in veils)
        assert all(p.get_height() == 2 for p in veils)  # the 2 layers
        assert "fewer than all 8 prompts" in " ".join(ax.get_xlabel().split())  # lines wrapped to the map
        np.testing.assert_allclose(heat(ax), [[0.0, 0.1, 0.2, 0.3]] * 2)  # the values are drawn as they are
    finally:
        plt.close("all")


def test_patching_position_ticks_of_mixed_lengths_are_thinned_keeping_the_cells_the_finding_names():
    """Review 10a B1: prompts of 12 to 64 tokens gave one tick per place from the end, each pale one tagged "(n=1)"
    ... "(n=7)", printed over each other. The saved figure's drawn labels no longer overlap; every tick stays (the
    labels of the others are blank); the answer position and the cells the finding names keep theirs (-30: the
    end-aligned cell it cites; -59 and -6: where the prompts differ); the pale columns' n is in the x label by runs
    (n at -k = the prompts of at least k tokens: lengths 64, 59, 40, 35, 30, 30, 14, 12)."""
    from headscope.reports.plots_patching import figures as patching_figures

    lengths = (64, 59, 40, 35, 30, 30, 14, 12)
    rows = [{"site_type": "resid_pre", "layer": l, "head": None, "pos": p, "token": "", "effect": 0.01 * p * (l == 0),
             "n_rows": sum(n >= 64 - p for n in lengths)} for l in range(3) for p in range(64)]
    exact = pd.DataFrame(rows)

    def cell(layer, end, effect, ci, n):
        return {"layer": layer, "head": None, "pos": 64 + end, "from_end": end, "token": "", "effect": effect, "ci": ci,
                "n": n}

    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "n_positions": 64,
               "clean_metric": 7.6, "corrupted_metric": -7.55,
               "top_sites": {"resid_pre": [cell(0, -59, 17.95, None, 2), cell(2, -1, 15.08, [13.79, 16.37], 8),
                                           cell(1, -1, 8.26, [5.48, 11.05], 8), cell(0, -30, 5.80, [-4.07, 15.67], 6)]},
               "at_corrupted_token": {"from_end": {"-59": 1, "-30": 4, "-6": 3}, "n": 8, "positions_differ": [1, 1],
                                      "differ_from_end": {"-59": 1, "-30": 4, "-6": 3}, "sites": {"resid_pre": [
                                          {"layer": 0, "effect": 15.15, "ci": [13.83, 16.47], "n": 8}]}}}
    fig = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"]
    try:
        ax = fig.axes[0]
        shown = _shown_xticks_apart(fig, ax)
        texts = [t.get_text() for t in shown]
        assert {"-1", "-30", "-59", "-6"} <= set(texts) and not [t for t in texts if "(n=" in t]
        assert "-1 is the last" in ax.get_xlabel()  # a narrow -1 leaves room for -6 beside it (at any font size)
        assert 5 <= len(texts) <= 20 and len(ax.get_xticks()) == 64  # thinned labels, every tick kept
        np.testing.assert_allclose(heat(ax)[0], [0.01 * p / 15.15 for p in range(64)], atol=1e-12)  # share of the gap
        assert ax.get_xlabel().replace("\n", " ").endswith(
            "Pale columns are averaged over fewer than all 8 prompts: n = 1 at -64 to -60, 2 at -59 to -41, 3 at -40 to "
            "-36, 4 at -35 to -31, 6 at -30 to -15 and 7 at -14 to -13")
    finally:
        plt.close("all")


def test_wrap_to_width_narrows_by_the_overshoot_and_stops_at_ten_characters():
    from headscope.reports.plots import wrap_to_width

    # 15 characters into 10: one try at int(15 x 10 / 15) = 10 characters a line
    assert wrap_to_width("aaa bbb ccc ddd", len, 10) == ["aaa bbb", "ccc ddd"]
    assert wrap_to_width("aaa bbb", len, 10) == ["aaa bbb"]  # fits: left as it is
    # 16 into 5: the first try is already at the floor, 10 characters; a word is never broken (review 16cv C1)
    assert wrap_to_width("abcdefghijklmnop", len, 5) == ["abcdefghijklmnop"]
    assert wrap_to_width("ab abcdefghijklmnop cd", len, 5) == ["ab", "abcdefghijklmnop", "cd"]
    # 21 into 12: int(21 x 12 / 21) = 12 characters, with textwrap's options (here: whether to break at hyphens)
    assert wrap_to_width("layer-by-layer effect", len, 12) == ["layer-by-", "layer effect"]
    assert wrap_to_width("layer-by-layer effect", len, 12, break_on_hyphens=False) == ["layer-by-layer", "effect"]


def test_patching_x_label_of_mixed_lengths_stays_within_the_map_clear_of_the_colour_bar_label():
    """Review 11c B3: on prompts of mixed lengths the x label ("...; -1 is the last" and the pale columns' n by runs)
    was wider than the heat map, and the colour bar's label, taller than its bar, overprinted its end ("last" under
    "share of the"). Drawn at the saved layout: every x label line lies within the map's width, the colour-bar label
    within the figure, and the two boxes do not overlap; the ranges stay whole and the label says the same."""
    from headscope.reports.plots_patching import figures as patching_figures

    lengths = (64, 59, 40, 35, 30, 30, 14, 12)
    rows = [{"site_type": "resid_pre", "layer": l, "head": None, "pos": p, "token": "", "effect": 0.01 * p * (l == 0),
             "n_rows": sum(n >= 64 - p for n in lengths)} for l in range(3) for p in range(64)]
    exact = pd.DataFrame(rows)
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "n_positions": 64,
               "clean_metric": 7.6, "corrupted_metric": -7.55, "top_sites": {}}
    fig = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"]
    try:
        ax, bar = fig.axes[0], fig.axes[0].collections[0].colorbar.ax
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        heat_box, x_box = ax.get_window_extent(renderer), ax.xaxis.label.get_window_extent(renderer)
        bar_box = bar.yaxis.label.get_window_extent(renderer)
        assert heat_box.x0 - 1 <= x_box.x0 and x_box.x1 <= heat_box.x1 + 1, (x_box, heat_box)
        assert 0 <= bar_box.y0 and bar_box.y1 <= fig.bbox.height and bar_box.x1 <= fig.bbox.width, bar_box
        assert not _overlap(x_box, bar_box)
        # the label says the same words, wrapped to the bar (review 16c C4: never shrunk under 8 pt), never inside a word
        assert bar.get_ylabel().split() == "share of the clean-corrupted gap (1 = fully restored)".split()
        assert "clean-corrupted" in bar.get_ylabel().split("\n") or "clean-corrupted gap" in bar.get_ylabel()
        # review 12c B1: two sentences, each wrapped whole ("the last pale: columns" ran them together, "only" alone)
        lines = ax.get_xlabel().split("\n")
        assert " ".join(lines) == (
            "position from the end (mean over up to 8 prompts: only those that reach it); -1 is the last position. "
            "Pale columns are averaged over fewer than all 8 prompts: n = 1 at -64 to -60, 2 at -59 to -41, 3 at -40 to "
            "-36, 4 at -35 to -31, 6 at -30 to -15 and 7 at -14 to -13")
        assert not [line for line in lines if line.endswith((" at", " to", " =")) or len(line.split()) < 2]
        assert [i for i, line in enumerate(lines) if line.startswith("Pale columns")] == [
            next(i for i, line in enumerate(lines) if line.endswith("the last position.")) + 1]
        from PIL import Image

        from headscope.reports.render import figure_png

        png = np.asarray(Image.open(io.BytesIO(figure_png(fig))).convert("L"))  # the saved image, cropped tight
        inked = np.nonzero((png < 200).any(0))[0]  # [k] columns with ink: the colour-bar label is the rightmost
        assert png.shape[1] - 1 - inked.max() >= 0.15 * 110, (png.shape, inked.max())  # clear of the right edge
    finally:
        plt.close("all")


def test_patching_colour_bar_label_is_never_shrunk_below_8_points():
    """Review 16c C4: on a 3-layer map under a four-line title (rounding floor, the differing positions) the colour
    bar's label was shrunk to fit its short bar (about 5 pt). Drawn at the saved layout: the label is at 8 pt or more,
    no taller than its bar (re-wrapped, the figure grown), and says the same words."""
    from headscope.reports.plots_patching import figures as patching_figures

    lengths = (69, 59, 55, 50, 46, 43, 40, 22)
    rows = [{"site_type": "resid_pre", "layer": l, "head": None, "pos": p, "token": "", "effect": 0.2 * (p % 17 == 3),
             "n_rows": sum(n >= 69 - p for n in lengths)} for l in range(3) for p in range(69)]
    exact = pd.DataFrame(rows)
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "n_positions": 69,
               "clean_metric": 9.2, "corrupted_metric": -9.2, "top_sites": {}, "rounding_floor": {"floor": 6e-8},
               "at_corrupted_token": {"differ_from_end": {"-64": 1, "-49": 2, "-30": 3, "-17": 2}}}
    fig = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"]
    try:
        bar = fig.axes[0].collections[0].colorbar.ax
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        label = bar.yaxis.label
        assert label.get_fontsize() >= 8
        assert label.get_window_extent(renderer).height <= bar.get_window_extent(renderer).height + 0.5
        assert " ".join(label.get_text().split()) == "share of the clean-corrupted gap (1 = fully restored)"
    finally:
        plt.close("all")


def test_a_colour_bar_label_re_wrapped_to_a_short_bar_never_breaks_inside_a_word():
    """Review 16cv C1: on a 3-row map (the reviewer's exact_resid_pre, 3 layers x 69 positions) the label re-wrapped
    to its short bar read "clean-corrupt / ed gap": textwrap broke the long word. Every line is whole words."""
    from headscope.reports.plots import fit_bar_label

    text = "share of the clean-corrupted gap (1 = fully restored)"
    fig, ax = plt.subplots(figsize=(7, 0.9), dpi=110)
    try:
        bar = fig.colorbar(ax.imshow(np.zeros((3, 69)), aspect="auto"), ax=ax)
        bar.ax.set_ylabel(text)
        fig.tight_layout()
        fit_bar_label(bar.ax)
        lines = bar.ax.yaxis.label.get_text().split("\n")
        assert len(lines) > 1 and " ".join(lines) == text  # re-wrapped only at the spaces
        assert "clean-corrupted" in lines
    finally:
        plt.close("all")


def test_attribution_vs_exact_legend_gives_no_slope_interval_where_the_finding_gives_none():
    """#34 review 5 (A6): a site type whose exact effects are mostly zero gets no slope interval in the finding; the
    legend says the same (one rule: attribution_patching.interval_stated)."""
    from headscope.reports.findings import finding
    from headscope.reports.plots_patching import plot_attribution_vs_exact

    # 20 cells, 6 non-zero: exact 1..6, attribution 0.5 x exact + (+0.1, -0.1, -0.1, +0.1, 0, 0); 14 zeros both
    x = np.r_[np.arange(1.0, 7.0), np.zeros(14)]
    y = np.r_[0.5 * np.arange(1.0, 7.0) + 0.1 * np.array([1, -1, -1, 1, 0, 0]), np.zeros(14)]
    data = pd.DataFrame({"site_type": "attn_out", "effect": x, "attribution": y})
    ax = plot_attribution_vs_exact(data, ax=plt.subplots()[1])
    try:
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        slope = float(np.polyfit(x, y, 1)[0])
        assert f"attn_out (slope {slope:.2f}; no interval: 6 of 20 cells non-zero)" in texts
        said = finding("patching", {"metric": "logit_diff", "clean_metric": 1.0, "corrupted_metric": 0.0,
                                    "attribution_correlation": {"attn_out": {
                                        "pearson": float(np.corrcoef(x, y)[0, 1]), "n": 20, "n_nonzero": 6,
                                        "slope": slope, "slope_ci": [slope - 0.01, slope + 0.01]}}})
        assert "no interval for r or the slope" in said and "95% CI" not in said
    finally:
        plt.close("all")


def test_control_bytes_and_dollars_in_tokens_are_printable_labels_without_glyph_warnings():
    import warnings

    from headscope.reports.plots import label
    from headscope.reports.plots_attention import top_heads_figure
    from headscope.reports.plots_patching import figures as patching_figures

    assert label("a\x02b$c\n") == "a\\x02b\\$c\\n" and label("Ġthe é") == "Ġthe é"
    exact = _exact(("head_out", "resid_pre"), 2, ["0: \x02", "1: $x"])
    summary = {"metric": "logit_diff", "normalized": False, "clean_metric": 1.0, "corrupted_metric": 0.0,
               "n_examples": 1, "n_positions": 2}
    data = {"scale": 100, "default_score": "importance (gradient)",
            "scores": {"importance (gradient)": [[2.5e-7, 1.2e-8], [0.0, 0.0]]},
            "examples": [{"tokens": ["\x02", "b\x7f"], "patterns": [[[[100], [40, 60]]] * 2] * 2}]}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # matplotlib's "Glyph 2 missing from font" is a UserWarning
            fig = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"]
            fig.canvas.draw()
            top = top_heads_figure(data, k=2)
            top.canvas.draw()
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0: \\x02", "1: \\$x"]
        panels = [ax for ax in top.axes if ax.get_title().startswith("L")]
        assert [t.get_text() for t in panels[0].get_xticklabels()] == ["\\x02", "b\\x7f"]
        # MiniLM's tiny gradient scores: 3 significant digits, never "0.00"
        assert [ax.get_title() for ax in panels] == ["L0H0 (importance (gradient) 2.5e-07)",
                                                     "L0H1 (importance (gradient) 1.2e-08)"]
    finally:
        plt.close("all")


def test_every_plotting_module_follows_one_convention():
    """#33 item 5: plot_<what>(data, *, ax=None, ...) in every plots_<analysis> module (data first, every
    other argument keyword-only), figures(result, **kwargs), and no module of its own axes helper."""
    import importlib
    import inspect

    for name in ANALYSES:
        module = importlib.import_module(f"headscope.reports.plots_{name}")
        assert not hasattr(module, "_axes"), name
        params = list(inspect.signature(module.figures).parameters.values())
        assert [p.kind for p in params] == [inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_KEYWORD], name
        plots = [f for n, f in vars(module).items() if n.startswith("plot_") and inspect.isfunction(f)
                 and f.__module__ == module.__name__]
        assert plots, name
        for fn in plots:
            first, *rest = inspect.signature(fn).parameters.values()
            where = f"{name}.{fn.__name__}"
            assert first.name == "data" and first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, where
            assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in rest), where
            assert "ax" in {p.name for p in rest} and inspect.signature(fn).parameters["ax"].default is None, where


# ---- #34 follow-up: the remaining figures at chance, raw patching effects, aligned lens -----------
AT_CHANCE = {"chance": {"at_chance": True, "reason": "the 95% CI contains chance"}}


def _circuits_tables():
    dla = pd.DataFrame([{"kind": "head", "layer": l, "head": h, "component": f"L{l}H{h}", "contribution": 0.4 * (h - l)}
                        for l in range(2) for h in range(2)])
    edges = pd.DataFrame({"sender": ["input", "a0.h1", "a1.h0"], "receiver": ["a1.h0.q", "logits", "logits"],
                          "score": [0.008, -0.004, 0.001]})
    faith = pd.DataFrame([{"circuit": c, "k": k, "seed": 0, "faithfulness": f}
                          for c, k, f in (("top", 1, 0.0), ("top", 3, 1.7), ("random", 1, 0.0), ("random", 3, 0.1))])
    return {"dla_mean": dla, "edges": edges, "faithfulness": faith}


def test_circuits_at_chance_mute_dla_and_the_graph_and_do_not_report_faithfulness():
    from headscope.reports.plots_circuits import figures as circuits_figures

    tables = _circuits_tables()
    vivid = circuits_figures(_result("circuits", None, {}, **tables))
    quiet = circuits_figures(_result("circuits", None, dict(AT_CHANCE), **tables))
    small = circuits_figures(_result("circuits", None, {"gap_within_noise": {"reason": "CI [-0.01, 0.006] contains 0"}},
                                     **tables))
    try:
        dla, dla_quiet = vivid["circuits_dla_heads"].axes[0], quiet["circuits_dla_heads"].axes[0]
        assert _saturation(dla, 0.4) > 0.35 and _saturation(dla_quiet, 0.4) < 0.2 and _saturation(dla_quiet, -0.4) < 0.2
        assert "AT CHANCE" in dla_quiet.get_title() and "AT CHANCE" not in dla.get_title()
        graph, graph_quiet = vivid["circuits_graph"].axes[0], quiet["circuits_graph"].axes[0]
        assert "3 strongest edges" in graph.get_title() and "strongest" not in graph_quiet.get_title()
        assert "noise" in graph_quiet.get_title() and "AT CHANCE" in graph_quiet.get_title()
        from matplotlib.colors import to_rgb

        arrows = [to_rgb(t.arrow_patch.get_edgecolor()) for t in graph_quiet.texts if t.arrow_patch is not None]
        assert arrows and max(max(c) - min(c) for c in arrows) < 0.45  # pale: C3 red is 0.72 saturated
        faith = vivid["circuits_faithfulness"].axes[0].get_title()
        assert "NOT REPORTED" not in faith
        assert "NOT REPORTED: at chance" in quiet["circuits_faithfulness"].axes[0].get_title()
        assert "NOT REPORTED: clean-corrupted gap within noise: CI [-0.01, 0.006]" in " ".join(small[
            "circuits_faithfulness"].axes[0].get_title().split())  # wrapped to the axes' width
    finally:
        plt.close("all")


def test_circuit_graph_ticks_whole_heads_and_keys_the_edge_width():
    from headscope.reports.plots_circuits import plot_circuit_graph

    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        plot_circuit_graph(_circuits_tables()["edges"], ax=ax)
        fig.canvas.draw()
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks  # no head 0.5
        legend = ax.get_legend()
        assert legend.get_title().get_text() == "edges: width = |score|"
        keys = {t.get_text(): h.get_linewidth() for t, h in zip(legend.get_texts(), legend.legend_handles)}
        # widths 0.5 + 4.5 |score| / peak: 5 at the peak 0.008, 2.75 at half of it, 1.06 at the weakest 0.001
        assert keys["|score| 0.008"] == pytest.approx(5.0) and keys["|score| 0.004"] == pytest.approx(2.75)
        assert keys["|score| 0.001"] == pytest.approx(0.5 + 4.5 / 8)
    finally:
        plt.close(fig)


def test_position_gold_attention_is_muted_at_chance():
    from headscope.reports.plots_position import plot_gold_attention

    gold = pd.DataFrame([{"layer": l, "head": h, "position": p, "mass": 0.1 * (p + h)}
                         for l in range(2) for h in range(2) for p in (1, 2, 3)])
    try:
        vivid = plot_gold_attention(gold, ax=plt.subplots()[1])
        quiet = plot_gold_attention(gold, quiet="AT CHANCE: muted colours", ax=plt.subplots()[1])
        np.testing.assert_allclose(heat(vivid), [[0.2, 0.3, 0.4]] * 2)  # max over heads: 0.1 * (p + 1)
        assert (vivid.collections[0].norm.vmin, vivid.collections[0].norm.vmax) == (0.0, pytest.approx(0.4))
        assert _saturation(vivid, 0.4) > 0.35 and _saturation(quiet, 0.4) < 0.2
        assert "AT CHANCE" in quiet.get_title() and "AT CHANCE" not in vivid.get_title()
    finally:
        plt.close("all")


def test_an_encoders_gold_attention_is_worded_as_a_mean_over_every_query_token():
    """Review 19d C2: on an encoder (position's retrieval run) the gold mass is averaged over every query row
    (runs.AttentionStats), but the caption said "from the answer position"; a decoder's caption keeps it."""
    from headscope.reports.plots_position import plot_gold_attention

    encoder = caption("position_gold_attention", {"task": "retrieval", "primary_metric": "cosine"})
    assert encoder.startswith("Attention mass (0-1) on the gold span averaged over every query token (an encoder has "
                              "no answer position), layer x gold position, max over heads.")
    assert "from the answer position" not in encoder
    assert caption("position_gold_attention", {"task": "json_kv"}).startswith(
        "Attention mass (0-1) on the gold span from the answer position, layer x gold position")
    gold = pd.DataFrame([{"layer": 0, "head": 0, "position": p, "mass": 0.1} for p in (1, 2)])
    try:
        ax = plot_gold_attention(gold, every_query=True, ax=plt.subplots()[1])
        assert ax.get_title() == "attention onto the gold span, mean over every query token (max over heads)"
    finally:
        plt.close("all")


def test_top_heads_at_chance_are_chosen_by_a_pattern_statistic_or_titled_as_noise():
    from headscope.reports.plots_attention import top_heads_figure

    patterns = [[[[[100], [40, 60]]] * 2] * 2]  # [example][layer][head][query][key] (scale 100)
    data = {"scale": 100, "default_score": "importance (gradient)",
            "scores": {"importance (gradient)": [[0.9, 0.1], [0.2, 0.3]], "previous_token": [[0.0, 0.2], [0.7, 0.1]]},
            "examples": [{"tokens": ["a", "b"], "patterns": patterns[0]}]}
    only = {**data, "scores": {"importance (gradient)": data["scores"]["importance (gradient)"]}}
    try:
        by_pattern = top_heads_figure(data, k=2, quiet="AT CHANCE: muted colours")
        assert [ax.get_title() for ax in by_pattern.axes if ax.get_title().startswith("L")] == [
            "L1H0 (previous_token 0.7)", "L0H1 (previous_token 0.2)"]
        title = by_pattern._suptitle.get_text().replace("\n", " ")  # wrapped to the figure's width
        assert "a pattern statistic: importance (gradient) is noise at chance" in title
        noise = top_heads_figure(only, k=2, quiet="AT CHANCE: muted colours")
        title = noise._suptitle.get_text()
        assert "chosen by noise" in title and "AT CHANCE" in title and not title.startswith("top")
        image = noise.axes[0].images[0]
        rgb = np.asarray(image.cmap(image.norm(1.0)))[:3]
        assert rgb.max() - rgb.min() < 0.2  # muted: Reds' top is 0.4 saturated
        normal = top_heads_figure(data, k=2)  # not at chance: importance ranks
        assert normal._suptitle.get_text().startswith("top 2 heads by importance (gradient)")
    finally:
        plt.close("all")


def test_patching_with_a_gap_within_noise_draws_the_raw_effect():
    """The reviewer's run: clean 0.3385, corrupted 0.3409 (gap -0.0024, its CI contains 0); a raw effect of
    -0.0022 was drawn as +0.93 of the gap, "restored". Now the exact table's raw `effect` (patched - baseline)."""
    from headscope.reports.plots_patching import figures as patching_figures

    exact = pd.DataFrame([{"site_type": "head_out", "layer": l, "head": h, "pos": None, "token": "", "value": 0.3409 + e,
                           "effect": e} for (l, h), e in {(0, 0): -0.0022, (0, 1): 0.0004, (1, 0): 0.0, (1, 1): 0.0001}.items()])
    paths = pd.DataFrame([{"sender_layer": 0, "sender_head": h, "receiver": "logits", "effect": 0.001 * h} for h in range(2)])
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "clean_metric": 0.3385,
               "corrupted_metric": 0.3409, "gap_within_noise": {"gap": -0.0024, "reason": "CI contains 0"}}
    figs = patching_figures(_result("patching", exact, summary, exact=exact, path_patching=paths))
    try:
        head_out, path = figs["exact_head_out"].axes[0], figs["path_patching"].axes[0]
        np.testing.assert_allclose(heat(head_out), [[-0.0022, 0.0004], [0.0, 0.0001]], atol=1e-12)
        np.testing.assert_allclose(heat(path), [[0.0, 0.001]], atol=1e-12)
        for ax in (head_out, path):
            assert colorbar_label(ax) == "raw effect (logit_diff), gap within noise"
            assert "share" not in colorbar_label(ax)
        # review 14b C3: no narrower than the gap's noise (|gap| 0.0024 where no interval is recorded)
        np.testing.assert_allclose(_norm(head_out)[1:], (-0.0024, 0.0024))
    finally:
        plt.close("all")


def test_lens_of_mixed_lengths_aligns_prompts_at_the_answer_position():
    from headscope.reports.plots_circuits import plot_lens

    def rows(example, n, values):  # positions 0..n-1 of real tokens, the last one the answer position
        return [{"example": example, "layer": 0, "stage": "0_pre", "position": p, "is_answer": p == n - 1,
                 "logprob": values[p]} for p in range(n)]

    mixed = pd.DataFrame(rows(0, 3, [-5.0, -4.0, -1.0]) + rows(1, 2, [-3.0, -2.0]))
    same = pd.DataFrame(rows(0, 2, [-5.0, -1.0]) + rows(1, 2, [-3.0, -2.0]))
    try:
        ax = plot_lens(mixed, ax=plt.subplots()[1])
        assert [t.get_text() for t in ax.get_xticklabels()] == ["-3 (n=1)", "-2", "-1 (answer)"]  # -3: prompt 0 only
        np.testing.assert_allclose(heat(ax), [[-5.0, -3.5, -1.5]])  # answers with answers: (-1 + -2) / 2
        assert "from the end" in ax.get_xlabel() and "2 prompts" in ax.get_xlabel()
        kept = plot_lens(same, ax=plt.subplots()[1])
        assert [t.get_text() for t in kept.get_xticklabels()] == ["0", "1"] and kept.get_xlabel().startswith("position (")
    finally:
        plt.close("all")


def test_roles_hatch_the_induction_cells_a_sliding_window_makes_unmeasurable():
    """Review 9a A2/B3: a NaN induction score (the layer's window hides the probe's key) is a hatched
    grey cell, not the white of a measured 0; measured cells get no patch."""
    from headscope.reports.plots_heads import plot_roles

    roles = pd.DataFrame([{"layer": l, "head": h, "positional": 0.1, "sink": 0.2, "previous_token": 0.0,
                           "induction": float("nan") if l == 0 else 0.0, "confidence": 0.5}
                          for l in range(2) for h in range(2)])
    try:
        ax = plot_roles(roles)
        hatched = [(int(p.get_x()), int(p.get_y())) for p in ax.patches if p.get_hatch() == "//"]
        assert sorted(hatched) == [(3, 0), (3, 1)]  # column 3 is induction; rows 0-1 are layer 0's heads
        assert "not measurable" in ax.get_title()
        plain = plot_roles(roles.fillna(0.0))
        assert not [p for p in plain.patches if p.get_hatch()] and "not measurable" not in plain.get_title()
        # review 11b B4: a windowed layer's confidence is over its window's keys, not comparable with a global layer's
        slid = plot_roles(roles.assign(window=[5.0 if l == 0 else float("nan") for l in roles.layer]))
        assert "layer 0 slides over 5 keys (uniform max weight >= 1/5)" in slid.get_title()
        assert "over 5 keys" not in plain.get_title()
    finally:
        plt.close("all")


def test_roles_are_not_muted_as_task_noise_at_chance():
    """Review 17c B3: at chance the roles map was titled "AT CHANCE: muted colours (noise, not task behaviour)" while the
    heads finding named the roles: role scores are attention statistics on the prompts and random tokens, not the task's
    answers, so the map keeps its colours and title; the at-chance maps (importance) stay muted."""
    from headscope.reports.plots_heads import figures

    roles = pd.DataFrame([{"layer": l, "head": h, "positional": 0.1, "sink": 0.2, "previous_token": 0.9 * (h == 0),
                           "induction": 0.0, "confidence": 0.5} for l in range(2) for h in range(2)])
    df = pd.DataFrame([{"layer": l, "head": h, "method": "zero", "importance": 0.01 * (l + h)}
                       for l in range(2) for h in range(2)])
    summary = {"metric": "logit_diff", "baseline_metric": 0.01, "chance": {"at_chance": True, "metric": "logit_diff"}}
    try:
        figs = figures(_result("heads", df, summary, roles=roles))
        title = figs["roles"].axes[0].get_title()
        assert "AT CHANCE" not in title and "noise" not in title, title
        mesh = figs["roles"].axes[0].collections[0]
        alone = figures(_result("heads", df, {**summary, "chance": None}, roles=roles))["roles"].axes[0].collections[0]
        assert np.allclose(mesh.get_facecolors(), alone.get_facecolors())  # the same colours as above chance
        assert "AT CHANCE" in figs["importance"].axes[0].get_title() or any(
            "AT CHANCE" in t.get_text() for ax in figs["importance"].axes for t in ax.texts + [ax.title])
    finally:
        plt.close("all")


def test_roles_labels_of_many_heads_do_not_overlap():
    from headscope.reports.plots_heads import plot_roles

    for n_layers, n_heads in ((3, 4), (12, 12)):  # the reviewer's 12 heads; a 144-head model
        roles = pd.DataFrame([{"layer": l, "head": h, "positional": 0.1, "sink": 0.2, "previous_token": 0.0,
                               "induction": 0.0, "confidence": 0.5} for l in range(n_layers) for h in range(n_heads)])
        ax = plot_roles(roles)
        fig = ax.figure
        try:
            fig.tight_layout()
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            shown = [t for t in ax.get_yticklabels() if t.get_text()]
            boxes = [t.get_window_extent(renderer) for t in shown]
            assert not [i for i in range(len(boxes) - 1) if _overlap(boxes[i], boxes[i + 1])]
            if n_heads == 4:
                assert [t.get_text() for t in shown] == [f"L{l}H{h}" for l in range(3) for h in range(4)]  # every head
            assert _saturation(ax, 0.0) < 0.1 and _saturation(ax, 1.0) > 0.35  # white to red, from 0 (was magma)
            assert (ax.collections[0].norm.vmin, ax.collections[0].norm.vmax) == (0, 1)
        finally:
            plt.close(fig)


def test_l0_points_carry_their_paired_interval_and_labels_stay_clear_of_the_legend():
    """Review 12b B3 / C1 (out_full's l0.csv): the "λ=0.001" label of the right-most point (8 heads, 7.4698) ran
    under the legend, and the points carried no interval. Each point's bar spans metric_binary + (ci - change):
    8 heads 7.4698 + (-0.02 - 0.0187) = 7.4311 to 7.4698 + (0.06 - 0.0187) = 7.5111; the title says n and
    in-sample; after the figure's layout every label lies inside the axes, off the legend and off each other."""
    from headscope.reports.plots import laid_out
    from headscope.reports.plots_heads import plot_l0

    sweep = pd.DataFrame({"lambda": [0.001, 0.003, 0.01, 0.03, 0.1], "heads_kept": [8, 6, 5, 3, 3],
                          "metric_binary": [7.4698, 7.4559, 7.4365, 7.4246, 7.4246],
                          "metric": [7.4726, 7.4552, 7.4391, 7.4246, 7.4246],
                          "change": [0.0187, 0.0048, -0.0146, -0.0265, -0.0265],
                          "change_ci_low": [-0.02, -0.03, -0.05, -0.09, -0.09],
                          "change_ci_high": [0.06, 0.04, 0.02, 0.04, 0.04], "n_examples": 40})
    ax = plot_l0(sweep, metric="logit_diff", baseline=7.4511, ax=plt.subplots(figsize=(8, 4))[1])
    fig = laid_out(ax)
    try:
        bars = [c for c in ax.collections if c.get_segments()]
        ends = {round(float(seg[0][0])): (float(seg[0][1]), float(seg[1][1])) for seg in bars[0].get_segments()}
        assert ends[8] == pytest.approx((7.4698 - 0.0387, 7.4698 + 0.0413))
        assert "95% CI over 40 examples, in-sample" in ax.get_title()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        inside, legend = ax.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, text
            assert not _overlap(box, legend), text.get_text()
        boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
        names = sorted(boxes)  # λ=0.003 (6 heads) and λ=0.01 (5 heads) overprinted in out_full
        assert len(names) == 4 and not [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
                                        if _overlap(boxes[a], boxes[b])]
    finally:
        plt.close("all")


def test_l0_figure_says_held_out_with_both_counts_and_draws_the_held_out_unpruned_line():
    """#34 item 2: an l0 table scored on 8 held-out examples (gates fitted on 8 others) titles the figure with both
    counts, and the dashed unpruned line is the held-out examples' unpruned metric (2.5), not the run's (2.0); an
    in-sample table too small to split says why in its title."""
    from headscope.analyses.core.result import Result
    from headscope.reports.plots_heads import figures

    sweep = pd.DataFrame({"lambda": [0.03, 0.1], "heads_kept": [6, 3], "metric_binary": [2.45, 2.1],
                          "metric": [2.46, 2.2], "change": [-0.05, -0.4], "change_ci_low": [-0.1, -0.6],
                          "change_ci_high": [0.0, -0.2], "n_examples": 8, "unpruned": 2.5, "split": "held_out",
                          "in_sample_reason": "", "n_train": 8})
    summary = {"metric": "logit_diff", "baseline_metric": 2.0, "pruning_tolerance": {"band": 0.02, "name": "1%"}}
    try:
        ax = figures(Result(name="heads", df=pd.DataFrame(), summary=summary, tables={"l0": sweep}))["l0"].axes[0]
        # review 18v C2: one sentence, wrapped evenly (even_title) where it is wider than the axes
        assert ax.get_title().replace("\n", " ") == ("L0 head pruning on 8 held-out examples (gates fitted on 8 others; "
                                                    "bars: 95% CI)")
        unpruned = [line for line in ax.lines if line.get_label() == "unpruned"]
        assert [float(line.get_ydata()[0]) for line in unpruned] == [2.5]
        small = sweep.assign(split="in_sample", n_examples=12, n_train=12, unpruned=2.0,
                             in_sample_reason="only 12 examples, too few to hold some out (at least 16)")
        ax = figures(Result(name="heads", df=pd.DataFrame(), summary=summary, tables={"l0": small}))["l0"].axes[0]
        assert ax.get_title().replace("\n", " ") == ("L0 head pruning (bars: 95% CI over 12 examples, in-sample: "
                                                    "only 12 examples, too few to hold some out (at least 16))")
        # review 13c B1 (default report's l0.csv): lambda=0.1 (22.03) and lambda=0.03 (21.92), both at 12 heads, two
        # points 0.1 apart on a 2.4 span: their labels printed over each other; in the stored figure none may touch
        held = pd.DataFrame({"lambda": [0.001, 0.003, 0.01, 0.03, 0.1], "heads_kept": [25, 20, 15, 12, 12],
                             "metric_binary": [24.318, 24.3034, 23.6262, 21.9247, 22.0299],
                             "metric": [24.298, 24.1154, 23.6475, 21.6685, 20.6775],
                             "change": [0.2019, 0.1873, -0.4899, -2.1914, -2.0862],
                             "change_ci_low": [0.0532, -0.0394, -0.8602, -2.8079, -2.7236],
                             "change_ci_high": [0.3505, 0.414, -0.1196, -1.5749, -1.4489], "n_examples": 64,
                             "unpruned": 24.116, "split": "held_out", "in_sample_reason": "", "n_train": 64})
        fig = figures(Result(name="heads", df=pd.DataFrame(), summary={**summary, "baseline_metric": 24.1},
                             tables={"l0": held}))["l0"]
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
        inside = ax.get_window_extent(renderer)
        assert sorted(boxes) == ["λ=0.001", "λ=0.003", "λ=0.01", "λ=0.03", "λ=0.1"]
        assert not [(a, b) for a in boxes for b in boxes if a < b and _overlap(boxes[a], boxes[b])]
        assert all(inside.y0 <= box.y0 and box.y1 <= inside.y1 for box in boxes.values())
    finally:
        plt.close("all")


def test_l0_single_point_shows_both_markers_on_whole_head_ticks():
    from headscope.reports.plots_heads import plot_l0

    sweep = pd.DataFrame({"lambda": [0.03], "heads_kept": [12], "metric_binary": [12.2032], "metric": [12.2026]})
    ax = plot_l0(sweep, metric="logit_diff", baseline=12.2032, ax=plt.subplots()[1])
    try:
        kept, gates = (next(line for line in ax.get_lines() if line.get_label() == name)
                       for name in ("kept heads only", "test-time gates"))
        assert kept.get_marker() != gates.get_marker() and gates.get_zorder() > kept.get_zorder()
        assert kept.get_markerfacecolor() == "none" and kept.get_markersize() > gates.get_markersize()  # the cross shows inside
        assert list(ax.get_xticks()) == [12]
    finally:
        plt.close("all")


def test_dla_components_error_bars_are_the_t_intervals_over_examples():
    from headscope.reports.plots_circuits import figures, plot_dla_components

    dla = pd.DataFrame([{"kind": k, "component": c, "contribution": v, "example": e}
                        for k, c, vals in (("embed", "embed", [1, 2, 3, 6]), ("mlp", "mlp0", [0.5] * 4))
                        for e, v in enumerate(vals)])
    ax = plot_dla_components(dla, ax=plt.subplots()[1])
    try:
        bars = {float(line.get_xdata()[0]): list(line.get_ydata()) for line in ax.lines
                if len(line.get_xdata()) == 2 and line.get_xdata()[0] == line.get_xdata()[1]}
        # embed: mean 3, sd sqrt(14 / 3) = 2.160, t(0.975, 3) = 3.1824: 3 -+ 3.437; mlp0: no spread, no bar
        assert bars[0.0] == pytest.approx([3 - 3.4374, 3 + 3.4374], abs=1e-3)
        assert bars[1.0] == pytest.approx([0.5, 0.5])
        # verify 11c: on a model whose blocks 0 and 2 are mixtures of experts and block 1 dense, the ticks say which
        three = pd.DataFrame([{"kind": k, "component": c, "contribution": 1.0, "example": 0}
                              for k, c in (("embed", "embed"), ("mlp", "mlp0"), ("mlp", "mlp1"), ("mlp", "mlp2"))])
        moe = plot_dla_components(three, moe=[0, 2], ax=plt.subplots()[1])
        assert [t.get_text() for t in moe.get_xticklabels()] == ["embed", "mlp0 (MoE)", "mlp1", "mlp2 (MoE)"]
        dense = plot_dla_components(three, ax=plt.subplots()[1])
        assert [t.get_text() for t in dense.get_xticklabels()] == ["embed", "mlp0", "mlp1", "mlp2"]
        drawn = figures(_result("circuits", summary={"moe_layers": [0, 2], "n_layers": 3}, dla=three))  # the summary's
        ticks = drawn["circuits_dla_components"].axes[0].get_xticklabels()
        assert [t.get_text() for t in ticks] == ["embed", "mlp0 (MoE)", "mlp1", "mlp2 (MoE)"]
    finally:
        plt.close("all")


# ---- #34 third review: figure defects (top attention, token heatmap, circuit graph, lens) ---------
def _pattern_data(n_tokens, scores):
    """The explorer's dict for hand-made causal patterns (scale 100) on `n_tokens` tokens, 2 layers x 2 heads."""
    rows = [[100 // (q + 1)] * (q + 1) for q in range(n_tokens)]  # [query][key]: uniform over the prefix
    return {"scale": 100, "default_score": "importance (zero)", "scores": {"importance (zero)": scores},
            "examples": [{"tokens": [f"t{i}" for i in range(n_tokens)], "patterns": [[rows, rows], [rows, rows]]}]}


def test_top_attention_titles_clear_the_colour_bar_and_weights_are_white_to_red():
    """The review: on short examples (3-inch panels) the last panel's title ran into the colour bar, and
    the weights were blue; under the report's whitegrid style grid lines crossed the cells."""
    from headscope.reports.plots import SEQUENTIAL

    scores = [[-0.0291, 0.001], [-0.0286, 0.002]]  # long titles: "L0H0 (importance (zero) -0.0291)"
    with plt.rc_context({"axes.grid": True}):
        figs = [top_heads_figure(_pattern_data(2, scores), k=k) for k in (1, 2)]
    try:
        for fig in figs:
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            bar = next(ax for ax in fig.axes if ax.get_label() == "<colorbar>")
            bar_box = bar.get_tightbbox(renderer)  # the bar, its ticks and its label
            panels = [ax for ax in fig.axes if ax is not bar]
            titles = [ax.title.get_window_extent(renderer) for ax in panels] + [fig._suptitle.get_window_extent(renderer)]
            assert titles and not [t for t in titles if _overlap(t, bar_box)]
            for ax in panels:
                image = ax.images[0]
                assert image.cmap.name == SEQUENTIAL and (image.norm.vmin, image.norm.vmax) == (0, 1)
                assert not any(line.get_visible() for line in ax.get_xgridlines() + ax.get_ygridlines())
    finally:
        plt.close("all")


def test_attribution_vs_exact_legend_carries_each_slopes_interval():
    from headscope.reports.plots_patching import plot_attribution_vs_exact

    # exact 1..20, attribution 0.5 x exact + 0.1 x (+1, -1, -1, +1) repeated (orthogonal to 1 and x): slope 0.5,
    # se sqrt(0.2 / 18 / 665) = 0.0040876, t(0.975, 18) = 2.1009: 95% CI 0.4914 to 0.5086
    x = np.arange(1.0, 21.0)
    data = pd.DataFrame({"site_type": "resid_pre", "effect": x, "attribution": 0.5 * x + 0.1 * np.tile([1, -1, -1, 1], 5)})
    ax = plot_attribution_vs_exact(data, ax=plt.subplots()[1])
    try:
        assert "resid_pre (slope 0.50, 95% CI 0.49 to 0.51)" in [t.get_text() for t in ax.get_legend().get_texts()]
    finally:
        plt.close("all")


def test_token_heatmap_says_the_first_and_last_tokens_are_left_out_and_why():
    """The analysis ranks every token but the first and the last; the figure shows the inner ones and says so."""
    from headscope.reports.plots import SEQUENTIAL
    from headscope.reports.plots_attribution import plot_token_heatmap

    tokens = ["<bos>", "The", "cat", "sat", "."]  # positions 1-3 ranked, as the scores table holds them
    shares = {"last_layer": [0.5, 0.3, 0.2], "saliency": [0.1, 0.1, 0.8]}
    scores = pd.DataFrame([{"example": 0, "position": p, "token": tokens[p], "method": m, "layer": None, "head": None,
                            "score": v[p - 1]} for m, v in shares.items() for p in (1, 2, 3)])
    ax = plot_token_heatmap(scores)
    try:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["The", "cat", "sat"]
        np.testing.assert_allclose(heat(ax), [shares["last_layer"], shares["saliency"]])
        assert "first and last left out" in ax.get_xlabel() and "BOS/[CLS]" in ax.get_xlabel()
        text = caption("token_heatmap")
        assert "first token" in text and "last" in text and "not shown" in text
        assert "integrated-gradients baseline keeps them" in text  # why
        mesh = ax.collections[0]
        assert mesh.cmap.name == SEQUENTIAL and mesh.norm.vmin == 0
    finally:
        plt.close("all")


def test_token_heatmap_hatches_tokens_outside_the_last_layers_window():
    """Review 9a A3: the scores table's `masked` attention cells (0 by a sliding window's mask) are hatched
    grey, not drawn as 0 importance; the methods' cells and a table without masks get no hatch."""
    from headscope.reports.plots_attribution import plot_token_heatmap

    tokens = ["<bos>", "a", "b", "c", "d", "?"]
    shares = {"last_layer": [0.0, 0.0, 0.6, 0.4], "saliency": [0.4, 0.1, 0.2, 0.3]}
    scores = pd.DataFrame([{"example": 0, "position": p, "token": tokens[p], "method": m, "layer": None, "head": None,
                            "score": v[p - 1], "masked": m == "last_layer" and p < 3}
                           for m, v in shares.items() for p in (1, 2, 3, 4)])
    try:
        ax = plot_token_heatmap(scores)
        hatched = sorted((int(r.get_x()), int(r.get_y())) for r in ax.patches if r.get_hatch() == "//")
        assert hatched == [(0, 0), (1, 0)] and "sliding window" in ax.get_title()  # row 0 last_layer, columns a, b
        plain = plot_token_heatmap(scores.drop(columns="masked"))
        assert not [r for r in plain.patches if r.get_hatch()]
        assert "hatched grey" in caption("token_heatmap")
    finally:
        plt.close("all")


def _graph(edges):
    from headscope.reports.plots_circuits import plot_circuit_graph

    fig, ax = plt.subplots(figsize=(8, 5))
    plot_circuit_graph(pd.DataFrame(edges), ax=ax)
    legend = ax.get_legend()
    return ax, {t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles)}


def test_circuit_graph_key_lists_only_the_drawn_edge_kinds_and_labels_sit_over_the_edges():
    no_qk = {"sender": ["input", "a0.h1", "m0"], "receiver": ["a1.h0.v", "logits", "m1"], "score": [0.5, 0.3, 0.2]}
    q_and_k = {"sender": ["input", "a0.h1", "input"], "receiver": ["a1.h0.q", "a1.kv0.k", "logits"],
               "score": [0.5, -0.3, 0.2]}
    try:
        ax, keys = _graph(no_qk)
        styles = {name: h.get_linestyle() for name, h in keys.items() if name.startswith("into")}
        assert styles == {"into v (value) / MLP / logits": "-"}  # no q or k edge drawn: neither in the key
        assert "negative" not in keys and "dotted" not in ax.get_title()
        ax2, keys2 = _graph(q_and_k)
        styles2 = {name: h.get_linestyle() for name, h in keys2.items() if name.startswith("into")}
        assert styles2 == {"into q (query)": ":", "into k (key)": "--", "into logits": "-"}
        edge_styles = sorted(t.arrow_patch.get_linestyle() for t in ax2.texts if t.arrow_patch is not None)
        assert edge_styles == sorted([":", "--", "-"])  # the styles the key names, drawn
        for axes_ in (ax, ax2):
            edges = [t for t in axes_.texts if t.arrow_patch is not None]
            labels = [t for t in axes_.texts if t.get_text()]
            assert labels and edges
            assert min(t.get_zorder() for t in labels) > max(t.get_zorder() for t in edges)
            assert min(t.get_zorder() for t in labels) > max(c.get_zorder() for c in axes_.collections)  # over the nodes
            for t in labels:  # a white box under each label, at least 8 pt
                assert t.get_bbox_patch() is not None and t.get_bbox_patch().get_facecolor()[:3] == (1.0, 1.0, 1.0)
                assert t.get_fontsize() >= 8
    finally:
        plt.close("all")


def test_lens_columns_only_the_longer_prompts_reach_say_their_n_and_are_muted():
    """Prompts of 4, 3 and 2 tokens aligned at the answer: column -4 is the first prompt's alone, -3 the
    first two's; their means (hand-computed) are drawn, each tick says its n, and the columns are veiled."""
    from matplotlib.patches import Rectangle

    from headscope.reports.plots_circuits import plot_lens

    values = {0: [-6.0, -5.0, -4.0, -1.0], 1: [-3.0, -2.0, -0.5], 2: [-7.0, -2.5]}
    lens = pd.DataFrame([{"example": e, "layer": 0, "stage": "0_pre", "position": p, "is_answer": p == len(v) - 1,
                          "logprob": v[p]} for e, v in values.items() for p in range(len(v))])
    ax = plot_lens(lens, ax=plt.subplots()[1])
    try:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["-4 (n=1)", "-3 (n=2)", "-2", "-1 (answer)"]
        np.testing.assert_allclose(heat(ax), [[-6.0, (-5.0 - 3.0) / 2, (-4.0 - 2.0 - 7.0) / 3, (-1.0 - 0.5 - 2.5) / 3]])
        veils = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_facecolor()[:3] == (1.0, 1.0, 1.0)]
        assert sorted(p.get_x() for p in veils) == [0, 1] and all(p.get_alpha() >= 0.5 for p in veils)
        assert "fewer than all 3 prompts" in ax.get_xlabel()
        assert "n its mean is over" in caption("circuits_lens")
    finally:
        plt.close("all")


def test_every_figure_of_attention_weights_uses_the_conventions_sequential_map():
    """The review: attention patterns were blue while the convention draws unsigned values white -> red.
    Each figure of attention weights (or their 0-1 summaries) is on plots.SEQUENTIAL from 0."""
    from headscope.reports.plots import SEQUENTIAL
    from headscope.reports.plots_heads import plot_roles
    from headscope.reports.plots_position import plot_gold_attention

    roles = pd.DataFrame([{"layer": l, "head": h, "positional": 0.1, "sink": 0.9, "previous_token": 0.0,
                           "induction": 0.0, "confidence": 0.5} for l in range(2) for h in range(2)])
    gold = pd.DataFrame([{"layer": l, "head": h, "position": p, "mass": 0.1 * (p + h)}
                         for l in range(2) for h in range(2) for p in (1, 2)])
    top = top_heads_figure(_pattern_data(3, [[0.3, 0.1], [0.2, 0.05]]), k=2)
    try:
        maps = {"roles": plot_roles(roles).collections[0], "gold attention": plot_gold_attention(gold).collections[0]}
        maps.update({f"top attention {i}": ax.images[0] for i, ax in enumerate(top.axes) if ax.images})
        assert len(maps) == 4
        for name, mappable in maps.items():
            assert mappable.cmap.name == SEQUENTIAL and mappable.norm.vmin == 0, name
            white, red = (np.asarray(mappable.cmap(x))[:3] for x in (0.0, 1.0))
            assert (white > 0.9).all() and red[0] > red[2] + 0.3, name  # white at 0, red at the top
    finally:
        plt.close("all")


def test_kv_norms_mute_positions_few_prompts_reach_and_the_guide_claims_no_sink():
    """Review 9a B1: each point is muted by its own reach, not from the first thin position to the end (a
    sliding-window cache's reach is not monotone: the reviewer's 4, 4, 13, 13, 13, 9, 12, 3 ...), and the
    x label counts the section's prompts (16), not the most that reach any one position (13)."""
    from headscope.reports.plots_kv import GUIDE, plot_norms

    reach = [4, 4, 13, 13, 13, 9, 12, 3]  # positions 0..7; half of 16 is 8: 0, 1 and 7 are thin
    norms = pd.DataFrame([{"layer": layer, "kv_head": h, "position": p, "kind": "key", "norm": 1.0 + layer + p + h,
                           "n_prompts": n} for layer in (0, 1) for h in (0, 1) for p, n in enumerate(reach)])
    try:
        ax = plot_norms(norms, n_prompts=16, ax=plt.subplots()[1])
        lines = ax.get_lines()
        solid = [line for line in lines if line.get_linestyle() == "-"]
        faint = [line for line in lines if line.get_linestyle() == ":"]
        shown = [[p for p, y in zip(line.get_xdata(), line.get_ydata()) if np.isfinite(y)] for line in solid]
        assert shown == [[2, 3, 4, 5, 6]] * 2 and [line.get_label() for line in solid] == ["0", "1"]
        assert [list(line.get_xdata()) for line in faint] == [list(range(8))] * 2
        assert all(line.get_alpha() < 1 for line in faint)
        assert list(solid[1].get_ydata())[2:7] == [4.5, 5.5, 6.5, 7.5, 8.5]  # layer 1: mean over the two KV heads
        assert "fewer than half of the 16 prompts reach (n = 3-4; positions 0-1, 7)" in " ".join(ax.get_xlabel().split())
        every = plot_norms(norms.assign(n_prompts=16), n_prompts=16, ax=plt.subplots()[1])
        assert all(line.get_linestyle() == "-" for line in every.get_lines()) and "faint" not in every.get_xlabel()
    finally:
        plt.close("all")
    assert "stand out at the start" not in GUIDE


def test_probes_degenerate_control_is_not_plotted_real_line_not_hidden_and_selectivity_says_why():
    from types import SimpleNamespace

    from headscope.reports.plots_probes import figures, plot_probe

    # a control learnt exactly (one word type): 1.0 at every layer, like the real labels; folds of 7, 6, 6
    df = pd.DataFrame([{"layer": layer, "fold": f, "task": task, "score": 1.0, "n_test": n}
                       for layer in range(3) for task in ("real", "control") for f, n in enumerate((7, 6, 6))])
    per_layer = pd.DataFrame({"layer": range(3), "accuracy": 1.0, "control": 1.0, "selectivity": np.nan})
    why = "every example's token at the read position is the same word type"
    result = SimpleNamespace(df=df, tables={"per_layer": per_layer},
                             summary={"metric": "accuracy", "majority_baseline": 0.2, "labels": "answer",
                                      "site": "resid_post", "control_degenerate": why, "capacity_skipped": "x"})
    fig = figures(result)["probes"]
    try:
        left, right = fig.axes[:2]
        # #34 B3: the degenerate control (one label, 1.0 by construction) is not drawn as a result; the legend says so
        assert [c.get_label() for c in left.containers] == ["real"]
        assert "control: degenerate,\nnot plotted" in [t.get_text() for t in left.get_legend().get_texts()]
        assert left.get_ylim() == pytest.approx((0.0, 1.03))  # accuracy on its whole range
        real = left.containers[0]
        assert list(real.lines[0].get_ydata()) == [1.0, 1.0, 1.0] and list(real.lines[0].get_xdata()) == [0, 1, 2]
        # 19 of 19 correct: the exact 95% interval's lower end, (0.025)^(1/19), drawn as the error bar
        low = min(seg[0][1] for seg in real.lines[2][0].get_segments())
        assert low == pytest.approx(0.025 ** (1 / 19), abs=1e-6)
        texts = " ".join(t.get_text() for t in right.texts).replace("\n", " ")
        assert texts.startswith("not measurable: every example's token") and not right.patches
        assert "no capacity sweep" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    # a control that is a result and equals the real labels: both drawn, apart, the real line on top
    left = plot_probe(df, metric="accuracy", ax=plt.subplots()[1])
    try:
        real, control = (next(c for c in left.containers if c.get_label() == task) for task in ("real", "control"))
        r_line, c_line = real.lines[0], control.lines[0]
        assert r_line.get_marker() != c_line.get_marker() and r_line.get_linestyle() != c_line.get_linestyle()
        assert all(a != b for a, b in zip(r_line.get_xdata(), c_line.get_xdata()))  # offset: both visible
        assert r_line.get_zorder() > c_line.get_zorder()
        assert "not plotted" not in " ".join(t.get_text() for t in left.get_legend().get_texts())
    finally:
        plt.close("all")


def test_probes_selectivity_bars_measure_against_a_control_floor_of_0_as_the_finding_does():
    """Review 11a B3 (out_minilm/probes/per_layer.csv): with control R^2 -0.186 and -0.212, real minus control
    (1.160, 1.179) ranks layer 1 above layer 0; against max(control, 0) the bars are the real R^2s 0.9746 >
    0.9668 (the finding's measure), hatched; layer 2's control 0.05 is subtracted as is (0.9445 - 0.05)."""
    from headscope.reports.plots_probes import plot_selectivity

    r2, control = [0.9746, 0.9668, 0.9445], [-0.1855, -0.2121, 0.05]
    per_layer = pd.DataFrame({"layer": [0, 1, 2], "r2": r2, "control": control,
                              "selectivity": [a - b for a, b in zip(r2, control)]})
    ax = plot_selectivity(per_layer, ax=plt.subplots()[1])
    try:
        assert [p.get_height() for p in ax.patches] == pytest.approx([0.9746, 0.9668, 0.8945])
        assert [bool(p.get_hatch()) for p in ax.patches] == [True, True, False]
        assert "max(control, 0)" in ax.get_ylabel() and "hatched" in ax.get_ylabel()
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    finally:
        plt.close("all")


def test_pruning_curve_legend_names_what_each_ordering_ranks_by():
    """#34 A8: the gradient ordering ranks by per-layer-normalised |dL/d gate| while the importance figure shows
    raw values: the legend says which (the summary's ordering_basis)."""
    from headscope.reports.plots_heads import plot_pruning_curve

    prune = pd.DataFrame([{"ordering": o, "recompute": r, "fraction_pruned": f, "metric": 1.0 - f * (1 + i), "seed": 0}
                          for i, (o, r) in enumerate((("gradient", False), ("gradient", True), ("ablation", False)))
                          for f in (0.0, 0.5)])
    ax = plot_pruning_curve(prune, metric="logit_diff", basis={"gradient": "|dL/d gate| / its layer's L2 norm"},
                            ax=plt.subplots()[1])
    try:
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert {"gradient (|dL/d gate| / its layer's L2 norm)", "gradient recomputed (|dL/d gate| / its layer's L2 norm)",
                "ablation"} <= set(labels)
    finally:
        plt.close("all")


def _colorbar(ax):
    return ax.collections[0].colorbar


def test_patching_maps_of_one_scale_have_identical_colour_bar_ticks():
    """The review: resid_pre and head_out (tall figures) were ticked ±0.75/±0.5/±0.25 and mlp_out (short)
    ±0.5 only, on one shared ±1 scale. Maps of one bound b = 0.96 (by position, by head, every head by
    position) on panels 2, 4 and 8 inches tall are all ticked at -b, -b/2, 0, b/2, b, with the same labels."""
    from headscope.reports.plots_patching import plot_head_pos, plot_layer_head, plot_layer_pos

    exact = pd.DataFrame([{"site_type": s, "layer": l, "head": h, "pos": p, "token": f"{p}: t", "effect": 0.1 * (l - (p or 0))}
                          for s, heads, positions in (("mlp_out", [None], (0, 1)), ("head_out", (0, 1), [None]),
                                                      ("head_out_by_pos", (0, 1), (0, 1)))
                          for l in range(2) for h in heads for p in positions])
    draws = [(plot_layer_pos, {"site_type": "mlp_out", "n_prompts": 1}, 2), (plot_layer_head, {}, 4),
             (plot_head_pos, {"n_prompts": 1}, 8)]
    try:
        for draw, where, height in draws:
            ax = draw(exact, bound=0.96, ax=plt.subplots(figsize=(5, height))[1], **where)
            ax.figure.canvas.draw()
            bar = _colorbar(ax)
            np.testing.assert_allclose(bar.get_ticks(), [-0.96, -0.48, 0.0, 0.48, 0.96], err_msg=draw.__name__)
            assert [t.get_text() for t in bar.ax.get_yticklabels()] == ["-0.96", "-0.48", "0", "0.48", "0.96"]
            assert bar.ax.yaxis.get_offset_text().get_text() == ""
    finally:
        plt.close("all")


def test_patching_maps_hatch_the_cells_sliding_windows_keep_from_the_answer():
    """Review 9a B2: the exact table's `unreachable` cells (0 by construction on a sliding-window model)
    are hatched grey in the by-position maps, at their own (layer, position) and (head, position), and the
    caption says why; an unmarked table draws no hatch."""
    from headscope.reports.plots_patching import PREFIX_CAPTIONS, plot_head_pos, plot_layer_pos

    exact = pd.DataFrame([{"site_type": s, "layer": l, "head": h, "pos": p, "token": f"{p}: t",
                           "effect": 0.0 if p < l + 1 else 0.3,
                           "unreachable": p < l + 1}
                          for s, heads in (("resid_pre", [None]), ("head_out_by_pos", (0, 1)))
                          for l in range(2) for h in heads for p in range(4)])
    try:
        ax = plot_layer_pos(exact, site_type="resid_pre", n_prompts=1)
        hatched = sorted((int(r.get_x()), int(r.get_y())) for r in ax.patches if r.get_hatch() == "//")
        assert hatched == [(0, 0), (0, 1), (1, 1)] and "sliding windows' reach" in ax.get_title()
        heads = plot_head_pos(exact, n_prompts=1)
        hatched = sorted((int(r.get_x()), int(r.get_y())) for r in heads.patches if r.get_hatch() == "//")
        assert hatched == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3)]  # rows L0H0, L0H1, L1H0, L1H1
        plain = plot_layer_pos(exact.drop(columns="unreachable"), site_type="resid_pre", n_prompts=1)
        assert not [r for r in plain.patches if r.get_hatch()]
        assert "by construction" in PREFIX_CAPTIONS["exact_"] and "any decoder" in PREFIX_CAPTIONS["exact_"]
        # review 12b A1: the last layer's writes before the answer, never read on any decoder, hatched the other way
        # and said so; no window words where the windows cut nothing
        unread = exact.assign(unreachable=False, never_read=(exact["layer"] == 1) & (exact["pos"] < 3))
        ax = plot_layer_pos(unread, site_type="resid_pre", n_prompts=1)
        hatched = sorted((int(r.get_x()), int(r.get_y()), r.get_hatch()) for r in ax.patches if r.get_hatch())
        assert hatched == [(0, 1, "\\\\"), (1, 1, "\\\\"), (2, 1, "\\\\")]
        assert "never read" in ax.get_title() and "sliding windows" not in ax.get_title()
    finally:
        plt.close("all")


def test_lens_log_probability_is_white_to_red_ending_at_zero_and_zero_is_a_tick():
    """The review: the lens drew a log-probability on viridis and its colour bar stopped at -2.5, never
    marking 0, the ceiling. Now the convention's sequential map from the lowest value shown (-6.3, floored
    to -7) to 0 (red: certain), 0 a tick of the bar; a logit difference diverges about 0 and a rank is red at 0."""
    from headscope.reports.plots import SEQUENTIAL
    from headscope.reports.plots_circuits import plot_lens

    lens = pd.DataFrame([{"example": 0, "layer": l, "stage": f"{l}_pre", "position": p, "is_answer": p == 1,
                          "logprob": v, "rank": r, "logit_diff": d}
                         for l, row in enumerate([[(-6.3, 40, -1.5), (-2.0, 3, 0.5)], [(-4.0, 9, -0.2), (-0.0001, 0, 3.0)]])
                         for p, (v, r, d) in enumerate(row)])
    try:
        ax = plot_lens(lens, ax=plt.subplots()[1])
        ax.figure.canvas.draw()
        mesh, bar = ax.collections[0], _colorbar(ax)
        assert mesh.cmap.name == SEQUENTIAL and (mesh.norm.vmin, mesh.norm.vmax) == (-7.0, 0.0)
        assert 0.0 in list(bar.get_ticks()) and min(bar.get_ticks()) >= -7.0
        assert "0" in [t.get_text() for t in bar.ax.get_yticklabels()]
        assert "0 = certain" in colorbar_label(ax) and "red" in caption("circuits_lens")
        assert _saturation(ax, -7.0) < 0.1 and _saturation(ax, 0.0) > 0.3  # white at the lowest, vivid red at 0
        red = np.asarray(mesh.cmap(mesh.norm(0.0)))[:3]
        assert red[0] > red[2] + 0.3
        assert _norm(plot_lens(lens, value="logit_diff", ax=plt.subplots()[1])) == ("diverging", -3.0, 3.0)
        rank = plot_lens(lens, value="rank", ax=plt.subplots()[1]).collections[0]
        top = np.asarray(rank.cmap(rank.norm(0)))[:3]
        assert rank.norm.vmin == 0 and top[0] > top[2] + 0.3 and (np.asarray(rank.cmap(rank.norm(40)))[:3] > 0.9).all()
    finally:
        plt.close("all")


def _hlines(ax) -> list[float]:
    return [float(line.get_ydata()[0]) for line in ax.get_lines() if len(set(map(float, line.get_ydata()))) == 1
            and list(line.get_xdata()) == [0, 1]]


def test_permutation_axis_states_its_scale_and_marks_the_saturation_bound():
    """The review: the permutation figure's y axis read 0-1.8 with a corner "1e-5" while the caption said
    "total variation distance, 0-1". The factor is in the axis label (no offset text) and each tick label
    times it is the tick's value; where the summary records a saturated output (analyses' `saturated`:
    tvd_per_logit = e x median 1 - p(top)), that bound is a labelled line; a record that is absent, not
    saturated, malformed, or for an encoder's 1 - cosine draws no line."""
    from headscope.reports.plots_attribution import figures as attribution_figures
    from headscope.reports.plots_attribution import plot_permutation

    perm = pd.DataFrame({"example": range(4), "layer": 2, "max_attention": [0.19, 0.14, 0.2, 0.35],
                         "median_change": [4.6e-6, 6.2e-6, 8.5e-6, 1.9e-5]})
    try:
        ax = plot_permutation(perm, output_change="tvd", ax=plt.subplots()[1])
        ax.figure.canvas.draw()
        assert ax.yaxis.get_offset_text().get_text() == ""
        assert "total variation distance, 0-1" in ax.get_ylabel() and "tick values x 1e-5" in ax.get_ylabel()
        shown = [(float(t.get_text().replace("\N{MINUS SIGN}", "-")) * 1e-5, t.get_position()[1])
                 for t in ax.get_yticklabels() if t.get_text()]
        assert len(shown) >= 3 and all(np.isclose(v, y, rtol=1e-3, atol=1e-12) for v, y in shown)
        assert ax.get_ylim()[0] == 0.0 and _hlines(ax) == []
        sat = {"is_saturated": True, "median_headroom": 1.2e-4, "tvd_per_logit": float(np.e * 1.2e-4), "why": "..."}
        for record, change in (({**sat, "is_saturated": False}, "tvd"), ("saturated", "tvd"), ({"is_saturated": True}, "tvd"),
                               ({**sat, "tvd_per_logit": float("nan")}, "tvd"), (sat, "1-cosine")):
            assert _hlines(plot_permutation(perm, output_change=change, saturated=record, ax=plt.subplots()[1])) == []
        scores = pd.DataFrame([{"example": 0, "method": m, "position": p, "score": 0.5, "token": f"t{p}"}
                               for m in ("last_layer", "saliency") for p in (1, 2)])
        taus = pd.DataFrame({"attention": "last_layer", "method": ["saliency"] * 3, "tau": [0.1, 0.3, -0.2]})
        figs = attribution_figures(_result("attribution", taus, {"output_change": "tvd", "saturated": sat},
                                           permutation=perm, scores=scores))
        marked = figs["permutation"].axes[0]
        figs["permutation"].canvas.draw()
        np.testing.assert_allclose(_hlines(marked), [np.e * 1.2e-4])
        key = " ".join(t.get_text() for t in marked.get_legend().get_texts())
        assert "saturated output" in key and "1 logit" in key and "0.00033" in key and "1 - p(top)" in key
        assert "tick values x 1e-4" in marked.get_ylabel() and marked.yaxis.get_offset_text().get_text() == ""
    finally:
        plt.close("all")


def test_permutation_figure_on_an_encoder_draws_the_rounding_floor_and_keeps_its_top_point():
    """Review 11a B1, B5: an encoder's 1 - cosine medians of 1-4 float32 steps (2^-24 each) were stretched to the
    axis's height as if a trend; the summary's permutation_rounding_floor (8 steps, 8 x 2^-24) is a grey band from
    0 with its key, and the points sit inside it (at 1e-6 of the highest point, as on MiniLM, it would not show: no
    band, no key). MiniLM's points (the review's permutation.csv) keep room over the
    highest (its top was cut at 0.4458 for a point at 0.4431): the axis top is at least 5% over it."""
    from headscope.reports.plots_attribution import figures as attribution_figures
    from headscope.reports.plots_attribution import plot_permutation

    step = 2.0 ** -24
    perm = pd.DataFrame({"example": range(4), "layer": 2, "max_attention": [0.067, 0.035, 0.050, 0.072],
                         "median_change": [2 * step, step, 2 * step, 4 * step]})
    floor = {"dtype": "float32", "floor": 8 * step, "ulps": 8}
    try:
        scores = pd.DataFrame([{"example": 0, "method": m, "position": p, "score": 0.5, "token": f"t{p}"}
                               for m in ("last_layer", "saliency") for p in (1, 2)])
        taus = pd.DataFrame({"attention": "last_layer", "method": ["saliency"] * 3, "tau": [0.1, 0.3, -0.2]})
        fig = attribution_figures(_result("attribution", taus, {"output_change": "1-cosine",
                                                                "permutation_rounding_floor": floor},
                                          permutation=perm, scores=scores))["permutation"]
        ax = fig.axes[0]
        bands = [p for p in ax.patches if p.get_gid() == "rounding"]
        assert len(bands) == 1
        y0, y1 = bands[0].get_y(), bands[0].get_y() + bands[0].get_height()  # a Rectangle in data y, axes x
        assert y0 == 0.0 and y1 == pytest.approx(4.76837158203125e-07)
        assert perm.median_change.max() < y1 < ax.get_ylim()[1]  # every point inside the band, the band inside the axes
        key = " ".join(t.get_text() for t in ax.get_legend().get_texts())
        assert "within float32 rounding" in key and "8 rounding" in key and "4.8e-07" in key
        assert "1 - cosine similarity, 0-2" in ax.get_ylabel()
        bare = plot_permutation(perm, output_change="tvd", rounding=floor, ax=plt.subplots()[1])  # a TVD: no band
        assert [p for p in bare.patches if p.get_gid() == "rounding"] == []
        minilm = perm.assign(layer=5, median_change=[0.4431, 0.3874, 0.4035, 0.3977])
        ax = plot_permutation(minilm, output_change="1-cosine", ax=plt.subplots()[1])
        ax.figure.canvas.draw()
        assert ax.get_ylim()[0] == 0.0 and ax.get_ylim()[1] >= 1.05 * 0.4431
        floored = plot_permutation(minilm, output_change="1-cosine", rounding=floor, ax=plt.subplots()[1])
        assert [p for p in floored.patches if p.get_gid() == "rounding"] == [] and floored.get_legend() is None  # 1e-6 of 0.44
    finally:
        plt.close("all")


def test_permutation_caption_follows_the_summarys_output_change(tmp_path):
    """Review 11a B2: the permutation caption said "total variation distance, 0-1" and "logit-unit change" on an
    encoder, whose figure plots 1 - cosine on 0-2. With the run's summary the caption names its own quantity, in the
    report's HTML too; a compare page over an encoder and a decoder gives the caption that holds for both."""
    from headscope.reports.compare_figures import pair_caption
    from headscope.reports.html_report import _figures_html

    enc, dec = {"output_change": "1-cosine"}, {"output_change": "tvd"}
    said = caption("permutation", enc)
    assert "1 - cosine of the pooled embedding" in said and "0-2" in said and "rounding" in said
    assert "total variation" not in said and "logit" not in said
    assert "total variation distance of the next-token distribution, 0-1" in caption("permutation", dec)
    both = pair_caption("permutation", enc, dec)
    assert both == caption("permutation") and "0-1" in both and "0-2" in both
    assert pair_caption("permutation", enc, enc) == said
    fig, ax = plt.subplots()
    try:
        fig.savefig(tmp_path / "permutation.png")
    finally:
        plt.close(fig)
    html = _figures_html(tmp_path, enc)
    assert "1 - cosine of the pooled embedding with the unpermuted one, 0-2" in html and "total variation" not in html


def test_no_plotting_module_names_a_colour_map_of_its_own():
    """The review found the lens on viridis beside the convention's white -> red maps. Every colour map a
    plotting module uses comes from plots.py's named ones (DIVERGING, SEQUENTIAL, LAYERS for hue by layer):
    no string literal in reports/plots_*.py or reports/compare*.py is a registered colour-map name (single
    colours such as "grey" aside). The explorer (explorer_view.py) draws in JavaScript, not here."""
    import ast

    import matplotlib as mpl
    from matplotlib.colors import is_color_like

    maps = {name for name in mpl.colormaps if not is_color_like(name)}
    modules = sorted({*(REPO / "reports").glob("plots_*.py"), *(REPO / "reports").glob("compare*.py")})
    assert len(modules) >= 12
    found = [f"{path.name}:{node.lineno} {node.value!r}" for path in modules
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in maps]
    assert found == []


def test_every_heat_map_of_every_analysis_follows_the_colour_convention(figures):
    """Every colour-mapped grid any analysis draws: values below 0 (a signed quantity) on the diverging map
    centred on 0 with symmetric limits, or, all <= 0 with a scale ending at 0, a log-probability on the
    sequential map; values >= 0 on the diverging map (a signed quantity that happens to be >= 0) or on the
    sequential map from 0 (white at 0)."""
    from headscope.reports.plots import SEQUENTIAL

    seen = 0
    for name, figs in figures.items():
        for stem, fig in figs.items():
            for ax in fig.axes:
                for mappable in [*ax.collections, *ax.images]:
                    if getattr(mappable, "colorbar", None) is None or mappable.get_array() is None:
                        continue
                    seen += 1
                    values = np.asarray(np.ma.filled(mappable.get_array(), np.nan), dtype=float)
                    values = values[np.isfinite(values)]
                    vmin, vmax = float(mappable.norm.vmin), float(mappable.norm.vmax)
                    zero = np.asarray(mappable.cmap(mappable.norm(0.0)))[:3]
                    where = f"{name}/{stem}"
                    diverging = np.isclose(vmin, -vmax) and bool((zero > 0.9).all())
                    if values.size and values.min() < 0 and not diverging:
                        assert vmax == 0.0 and mappable.cmap.name == SEQUENTIAL and values.max() <= 0, where
                    elif not diverging:
                        assert vmin == 0.0 and (zero > 0.9).all(), where  # sequential from 0, white at 0
    assert seen >= 10


def test_tau_with_few_examples_draws_the_points_with_their_mean_and_t_interval():
    """#34 B4: box plots of 4 points per box mean nothing; under 10 examples per group the taus themselves are drawn,
    with their mean and 95% t interval (scipy's), and from 10 examples the boxes come back."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import ErrorbarContainer
    from scipy import stats

    from headscope.reports.plots_attribution import plot_tau

    taus = {("last_layer", "grad_x_input"): [0.3, -0.1, 0.1, -0.6], ("rollout", "grad_x_input"): [0.7, 0.3, 0.4, 0.2],
            ("last_layer", "leave_one_out"): [0.5, 0.1, -0.2, 0.4], ("rollout", "leave_one_out"): [0.6, 0.4, 0.4, -0.2]}
    df = pd.DataFrame([{"example": e, "attention": a, "method": m, "tau": t}
                       for (a, m), values in taus.items() for e, t in enumerate(values)])
    ax = plot_tau(df, ax=plt.subplots()[1])
    try:
        assert not ax.patches  # no boxes
        dots = [c for c in ax.collections if isinstance(c, PathCollection)]
        assert sorted(sorted(c.get_offsets()[:, 1].tolist()) for c in dots) == sorted(sorted(v) for v in taus.values())
        means = {}
        for bars in ax.containers:  # each group's errorbar: mean marker and the t interval's ends
            y = float(bars.lines[0].get_ydata()[0])
            segment = bars.lines[2][0].get_segments()[0]
            means[round(y, 6)] = (segment[0][1], segment[1][1])
        for values in taus.values():
            ref = stats.ttest_1samp(values, 0).confidence_interval(0.95)
            assert means[round(float(np.mean(values)), 6)] == pytest.approx((ref.low, ref.high))
        legend = ax.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == ["last layer", "rollout"]
        assert "95% t CI" in legend.get_title().get_text() and "n = 4" in legend.get_title().get_text()
    finally:
        plt.close("all")
    many = pd.concat([df.assign(example=df.example + 4 * k) for k in range(3)])  # 12 per group: boxes
    ax = plot_tau(many, ax=plt.subplots()[1])
    try:
        assert ax.patches and not [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    finally:
        plt.close("all")


def test_tau_intervals_are_clipped_to_the_range_of_a_tau_with_the_clipped_ends_marked():
    """Review 8 B3: with n = 3 the t interval of a mean tau ran past +1, off the panel, while the finding clips it to
    [-1, 1]. Here one group's scipy t interval reaches above 1 and another's below -1: each bar ends at +-1, an
    arrowhead sits at each clipped end (up at +1, down at -1), the legend says so once, and so does the caption."""
    from matplotlib.collections import PathCollection
    from scipy import stats

    from headscope.reports.plots_attribution import plot_tau

    taus = {("rollout", "integrated_gradients"): [0.9, 0.5, 0.95], ("last_layer", "integrated_gradients"): [-0.9, -0.4, -0.95],
            ("last_layer", "leave_one_out"): [0.1, 0.2, 0.0], ("rollout", "leave_one_out"): [0.2, 0.3, 0.1]}
    refs = {k: stats.ttest_1samp(v, 0).confidence_interval(0.95) for k, v in taus.items()}
    assert refs["rollout", "integrated_gradients"].high > 1 and refs["last_layer", "integrated_gradients"].low < -1
    df = pd.DataFrame([{"example": e, "attention": a, "method": m, "tau": t}
                       for (a, m), values in taus.items() for e, t in enumerate(values)])
    ax = plot_tau(df, ax=plt.subplots()[1])
    try:
        bars = {}
        for container in ax.containers:  # each group's mean and its bar's ends
            segment = container.lines[2][0].get_segments()[0]
            bars[round(float(container.lines[0].get_ydata()[0]), 6)] = (segment[0][1], segment[1][1])
        for key, values in taus.items():
            ref = refs[key]
            assert bars[round(float(np.mean(values)), 6)] == pytest.approx((max(-1.0, ref.low), min(1.0, ref.high)))
        x_of = {round(float(c.lines[0].get_ydata()[0]), 6): float(c.lines[0].get_xdata()[0]) for c in ax.containers}
        heads = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets()) == 1]  # not the empty proxy
        ends = sorted((float(c.get_offsets()[0, 1]), float(c.get_offsets()[0, 0])) for c in heads)
        up, down = x_of[round(float(np.mean([0.9, 0.5, 0.95])), 6)], x_of[round(float(np.mean([-0.9, -0.4, -0.95])), 6)]
        assert np.allclose(ends, [(-1.0, down), (1.0, up)])  # at the clipped ends of those two bars only
        paths = {round(float(c.get_offsets()[0, 1])): c.get_paths()[0].vertices for c in heads}
        assert paths[1][:, 1].argmax() != paths[-1][:, 1].argmax()  # pointing opposite ways: ^ at +1, v at -1
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert sum("clipped" in t for t in texts) == 1
        assert -1.1 < ax.get_ylim()[0] and ax.get_ylim()[1] < 1.1  # every bar inside the panel
        assert "clipped to [-1, 1]" in caption("tau")
    finally:
        plt.close("all")


def test_circuit_graph_uses_the_reports_names_and_only_the_keys_two_colours():
    """#34 fifth review: input -> a0.kv edges were purple (a k edge and a v edge of opposite signs on one
    arc at alpha 0.7), nodes were a0.h3 / m0 while the report says L0H3 / mlp0, edges ran through labels."""
    from matplotlib.colors import to_rgba

    edges = {"sender": ["input", "input", "a0.h1", "a0.h1", "m0"],
             "receiver": ["a1.kv0.k", "a1.kv0.v", "a1.h1.q", "m1", "logits"], "score": [-0.5, 0.4, 0.3, 0.2, 0.1]}
    try:
        ax, keys = _graph(edges)
        arrows = [t.arrow_patch for t in ax.texts if t.arrow_patch is not None]
        key = {to_rgba(keys["positive"].get_color()), to_rgba(keys["negative"].get_color())}
        assert len(arrows) == 5 and {to_rgba(a.get_edgecolor()) for a in arrows} == key  # opaque red and blue only
        bends = {a.get_connectionstyle().rad for a in arrows[:2]}  # input -> L1KV0's key and value
        assert len(bends) == 2, bends  # apart, not one on top of the other
        texts = {t.get_text() for t in ax.texts if t.get_text()}
        assert texts == {"input", "L0H1", "L1KV0", "L1H1", "mlp0", "mlp1", "logits"}, texts
        assert all(t.get_bbox_patch().get_alpha() in (None, 1.0) for t in ax.texts if t.get_text())  # opaque boxes
    finally:
        plt.close("all")


def _lens_rows(diffs: dict[int, list[float]], wrong: bool = True) -> pd.DataFrame:
    """A lens table by hand: per example, every layer at position 0 (the next token, no wrong answer there) and 1
    (the answer, logit_diff = diffs[example][layer] when `wrong`, else NaN); log-probabilities near 0 at the answer."""
    stages = ["0_pre", "1_pre", "final_post"]
    return pd.DataFrame([{"example": e, "layer": l, "stage": stages[l], "position": p, "target": 7, "is_answer": p == 1,
                          "logprob": -0.1 if p == 1 else -3.0, "rank": 0, "logit_diff": (d[l] if wrong else np.nan)
                          if p == 1 else np.nan} for e, d in diffs.items() for l in range(3) for p in (0, 1)])


def test_circuits_lens_draws_the_logit_difference_per_layer_beside_the_log_probability():
    """Review 8 B1: on a task of two answers (is/are) the lens heatmap's answer column is red at the embeddings, a
    constant guess's doing, while the finding reads the lens's logit difference. The figure now draws that
    difference (answer - wrong answer, logits) per stream read beside the heatmap, rows aligned: each example a grey
    line, the mean with its 95% t interval (scipy's), 0 marked; the heatmap's title says that with 2 answers the
    difference is the measure. With 10 answers no such note; without a wrong answer, the heatmap alone."""
    from matplotlib.container import ErrorbarContainer
    from scipy import stats

    from headscope.reports.plots_circuits import figures as circuit_figures

    diffs = {0: [0.4, 5.0, 10.0], 1: [-0.6, 3.0, 11.0], 2: [0.2, 7.5, 10.5]}  # [example][layer]
    try:
        fig = circuit_figures(_result("circuits", summary={"lens_n_answers": 2}, lens=_lens_rows(diffs)))["circuits_lens"]
        heat, diff, bar = fig.axes  # heatmap, logit difference, the heatmap's colour bar
        assert "nats" in bar.get_ylabel() and "2 distinct answers" in heat.get_title()
        assert "logit difference (right) is the measure" in heat.get_title()
        [means] = [c for c in diff.containers if isinstance(c, ErrorbarContainer)]
        x, y = means.lines[0].get_xdata(), means.lines[0].get_ydata()
        by_layer = np.array(list(diffs.values())).T  # [layer, example]
        assert np.allclose(x, by_layer.mean(axis=1)) and np.allclose(y, [0.5, 1.5, 2.5])  # the heatmap's row centres
        ends = [seg[:, 0] for seg in means.lines[2][0].get_segments()]  # each row's interval, low to high
        for layer, (lo, hi) in enumerate(ends):
            ref = stats.ttest_1samp(by_layer[layer], 0).confidence_interval(0.95)
            assert (lo, hi) == pytest.approx((ref.low, ref.high))
        assert sorted(diff.get_ylim()) == sorted(heat.get_ylim()) == [0.0, 3.0]  # rows aligned with the heatmap's
        assert [t.get_text() for t in diff.get_yticklabels()] == ["0_pre", "1_pre", "final_post"]
        grey = sorted(tuple(l.get_xdata()) for l in diff.get_lines() if l.get_color() == "0.7")
        assert grey == sorted(tuple(v) for v in diffs.values())  # each example's spread
        assert any(np.allclose(l.get_xdata(), 0.0) for l in diff.get_lines() if l.get_linestyle() == "--")  # 0 marked
        assert "logits" in diff.get_xlabel() and "answer - wrong answer" in diff.get_xlabel()
        assert "n = 3" in diff.get_title()
        # the summary's means and intervals (the finding's numbers) are what the bars draw, where it records them
        given = {"lens_n_answers": 2, "lens_mean_logit_diff_per_layer": {"0": 0.0, "1": 5.0, "2": 10.5},
                 "lens_logit_diff_ci_per_layer": {"0": [-1.0, 1.0], "1": [4.0, 6.0], "2": [10.0, 11.0]}}
        drawn = circuit_figures(_result("circuits", summary=given, lens=_lens_rows(diffs)))["circuits_lens"].axes[1]
        [bars] = [c for c in drawn.containers if isinstance(c, ErrorbarContainer)]
        assert np.allclose(bars.lines[0].get_xdata(), [0.0, 5.0, 10.5])
        assert np.allclose([seg[:, 0] for seg in bars.lines[2][0].get_segments()], [[-1, 1], [4, 6], [10, 11]])
        many = circuit_figures(_result("circuits", summary={"lens_n_answers": 10}, lens=_lens_rows(diffs)))
        assert len(many["circuits_lens"].axes) == 3 and "distinct answers" not in many["circuits_lens"].axes[0].get_title()
        alone = circuit_figures(_result("circuits", summary={"lens_n_answers": 2}, lens=_lens_rows(diffs, wrong=False)))
        assert len(alone["circuits_lens"].axes) == 2  # the heatmap and its colour bar: no difference to draw
        assert "answer minus wrong answer (logits)" in caption("circuits_lens")
    finally:
        plt.close("all")


def test_circuit_graph_draws_a_parallel_blocks_mlp_beside_its_heads_and_says_why():
    """Review 8 B2: on a parallel model (GPT-NeoX: the summary's edges_parallel_blocks) the MLPs were drawn at
    x = layer + 0.5, after their layer's heads, the picture of a sequential block. There each MLP sits at its heads'
    x (mlp1 at 1, as L1H0) and the key says the blocks are parallel; a sequential model keeps layer + 0.5 and no
    such words. The caption covers both."""
    from headscope.reports.plots_circuits import figures as circuit_figures

    edges = pd.DataFrame({"sender": ["input", "a0.h1", "input", "m0", "a1.h0"],
                          "receiver": ["m0", "m1", "a1.h0.v", "logits", "logits"], "score": [0.5, 0.4, 0.3, 0.2, 0.1]})
    said = "parallel blocks: each MLP reads its block's input, not its heads' output"
    try:
        where = {}
        for parallel in (True, False):
            fig = circuit_figures(_result("circuits", summary={"edges_parallel_blocks": parallel}, edges=edges))
            ax = fig["circuits_graph"].axes[0]
            where[parallel] = {t.get_text(): tuple(t.xy) for t in ax.texts if t.get_text()}
            title = ax.get_legend().get_title().get_text().replace("\n", " ")
            assert (said in title) is parallel and ("parallel" in ax.get_xlabel()) is parallel
        assert where[True]["mlp1"] == (1.0, -1.0) and where[True]["mlp0"] == (0.0, -1.0)
        assert where[True]["mlp1"][0] == where[True]["L1H0"][0] and where[True]["mlp0"][0] == where[True]["L0H1"][0]
        assert where[False]["mlp1"] == (1.5, -1.0) and where[False]["mlp0"] == (0.5, -1.0)
        assert where[True]["L1H0"] == where[False]["L1H0"] == (1.0, 0.0)  # the heads do not move
        assert "parallel blocks" in caption("circuits_graph") and "not its heads' output" in caption("circuits_graph")
    finally:
        plt.close("all")


def test_mlp_top_neurons_names_the_task_and_every_layers_bars_stand_out_from_white():
    """#34 fifth review: "Largest sub-updates on the Task" named no task, and layer 2's viridis-yellow bars
    were hard to see on white."""
    from matplotlib.colors import to_rgb

    from headscope.reports.plots_mlp import plot_top_neurons

    data = pd.DataFrame({"layer": [0, 1, 2, 2], "neuron": [9, 94, 67, 33], "task_update_norm": [0.6, 0.3, 0.24, 0.2]})
    try:
        ax = plot_top_neurons(data, task="colours", ax=plt.subplots()[1])
        assert ax.get_title() == "Largest sub-updates on the task 'colours'"
        fills = [to_rgb(b.get_facecolor()) for b in ax.patches if b.get_width() > 0]
        assert len(fills) == 4 and len(set(fills)) == 3  # one colour per layer
        # relative luminance (sRGB weights of the drawn colours): viridis's yellow end is 0.87; every bar stays below 0.62
        assert max(0.2126 * r + 0.7152 * g + 0.0722 * b for r, g, b in fills) < 0.62
        assert all(b.get_linewidth() > 0 for b in ax.patches if b.get_width() > 0)  # outlined
        assert " ".join(ax.get_xlabel().split()) == ("mean L2 norm of the update m_i v_i at the answer "
                                                     "(residual-stream units)")
        # review 8b C7: on a post-norm model the update is written through the post-MLP norm's gain
        assert " ".join(plot_top_neurons(data, post_norm=True, ax=plt.subplots()[1]).get_xlabel().split()) == (
            "mean L2 norm of the update m_i (g * v_i), g the post-MLP norm's gain, at the answer (residual-stream units)")
    finally:
        plt.close("all")


def test_mlp_top_neurons_y_label_is_one_short_word_inside_the_figure_and_one_layer_has_no_legend():
    """Review 12a B3, then 16b C3: the y label held three lines of label templates ("expert neuron (L<layer> E<expert>
    n<neuron>) dense layer: L<layer> dense n<neuron>") beside a legend with one entry. Now "neuron" (the caption says
    what a label means, the x label gives the units), drawn inside the figure; the layer legend only where the bars
    come from two layers or more."""
    from headscope.reports.plots import laid_out
    from headscope.reports.plots_mlp import CAPTIONS, plot_top_neurons

    moe = pd.DataFrame({"layer": [0, 1, 2], "neuron": [9, 94, 67], "task_update_norm": [0.6, 0.3, 0.24],
                        "expert": pd.array([None, 2, 4], dtype="Int64"), "expert_neuron": [9, 24, 50]})
    dense = moe.assign(layer=0, expert=pd.array([None, None, None], dtype="Int64"))
    try:
        for data, legend in ((moe, True), (moe.assign(expert=pd.array([1, 2, 4], dtype="Int64")), True),
                             (moe[["layer", "neuron", "task_update_norm"]], True), (dense, False)):
            ax = plot_top_neurons(data)
            assert ax.get_ylabel() == "neuron" and "residual-stream units" in ax.get_xlabel()
            assert (ax.get_legend() is not None) == legend
            fig = laid_out(ax)  # as mlp's figures() stores it
            fig.canvas.draw()
            box, page = ax.yaxis.label.get_window_extent(), fig.bbox
            assert box.y0 >= page.y0 and box.y1 <= page.y1 and box.x0 >= page.x0, (box, page)
            plt.close(fig)
        assert "L layer E expert n neuron" in CAPTIONS["mlp_top_neurons"]
        assert "L layer dense n neuron" in CAPTIONS["mlp_top_neurons"]
    finally:
        plt.close("all")


def test_patching_map_title_clears_the_colour_bar_label_below_chance():
    """Review 9b (B3): on the untrained run (3 layers x 12 positions, below chance, gap within noise) the two-line
    title ran under the colour bar's label, which overprinted its last word. Measured on the saved figure's layout:
    the title's box and the colour bar's (its ticks and label) do not overlap, and no word of the title is lost."""
    from headscope.reports.plots_patching import figures as patching_figures

    reach = [1, 1, 2, 6, 6, 6, 7, 8, 8, 8, 8, 8]  # prompts of 4 to 12 tokens, left-padded
    effect = {(0, 8): -0.037, (1, 8): -0.002, (1, 9): -0.006, (2, 8): 0.004, (2, 11): -0.033}
    exact = pd.DataFrame([{"site_type": "resid_pre", "layer": l, "head": None, "pos": p, "position_from_end": p - 12,
                           "token": "", "value": 0.0, "effect": effect.get((l, p), 0.0), "n_rows": reach[p]}
                          for l in range(3) for p in range(12)])
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "n_positions": 12,
               "clean_metric": -0.23, "corrupted_metric": -0.21,
               "gap_within_noise": {"gap": -0.028, "reason": "under the 0.1 floor"},
               "chance": {"at_chance": True, "below_chance": True, "metric": "logit_diff", "mean": -0.23}}
    fig = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"]
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        bar = ax.collections[0].colorbar.ax
        # wrapped to its bar, not shrunk (review 16c C4)
        assert " ".join(bar.yaxis.label.get_text().split()) == "raw effect (logit_diff), gap within noise"
        title, bar_box = ax.title.get_window_extent(renderer), bar.get_tightbbox(renderer)
        assert not _overlap(title, bar_box), (title, bar_box)
        assert ax.title.get_text().split() == ("patching resid_pre, by layer and position BELOW CHANCE: muted colours "
                                               "(the model prefers wrong answers; no task behaviour)").split()
    finally:
        plt.close("all")


@pytest.mark.parametrize("arch", ["mixtral", "qwen2moe"])
def test_dla_per_expert_draws_each_moe_layers_experts_and_total_on_one_zero_centred_scale(arch, more_arch_models,
                                                                                          tmp_path):
    """#34 items 3 and 7: the per-expert DLA of the tiny Mixtral / Qwen2-MoE (random weights), one panel per MoE
    layer: each bar the mean over examples of that expert's rows of dla_experts (recomputed here from the per-example
    rows) with its 95% t interval (scipy), red above 0 and blue below, the shared expert (Qwen2-MoE only) hatched and
    ticked "shared", the grey total the mean of the layer's mlpN rows of dla; every panel's y limits the same and
    symmetric about 0; tick labels, titles and the suptitle inside the figure and clear of each other; the report's
    figure grid puts it next to the components figure with alt text that says what it shows."""
    from scipy import stats

    from headscope.analyses.circuits import analysis as circuits
    from headscope.analyses.core.tasks import Task
    from headscope.reports.html_report import _figures_html
    from tests_support import random_tokens

    tokens = random_tokens(6, 8, seed=41)
    task = Task(name="rand", tokens=tokens[:, :-1], answers=tokens[:, -1], wrong_answers=tokens[:, 2].clone(),
                metric="logit_diff")
    res = circuits.direct_logit_attribution(more_arch_models(arch), task, top_k=3)
    figs = plot_result(res)
    fig = figs["circuits_dla_experts"]
    rows, dla = res.tables["dla_experts"], res.tables["dla"]

    def t_interval(x):
        x = np.asarray(x, dtype=float)
        half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / len(x) ** 0.5
        return x.mean(), x.mean() - half, x.mean() + half

    try:
        fig.draw_without_rendering()
        renderer, frame = fig.canvas.get_renderer(), fig.bbox
        panels = [ax for ax in fig.axes if ax.get_visible()]
        assert len(panels) == rows.layer.nunique() == 2
        limits = {ax.get_ylim() for ax in panels}
        assert len(limits) == 1 and next(iter(limits))[0] == pytest.approx(-next(iter(limits))[1])  # shared, about 0
        boxes = [fig._suptitle.get_window_extent(renderer)]
        for ax, layer in zip(panels, sorted(rows.layer.unique())):
            own = rows[rows.layer == layer]
            experts = sorted(own.expert.unique(), key=lambda e: (bool(own[own.expert == e].shared.iloc[0]), e))
            want = [t_interval(own[own.expert == e].sort_values("example").contribution) for e in experts]
            want.append(t_interval(dla[dla.component == f"mlp{layer}"].contribution))
            bars = ax.patches
            np.testing.assert_allclose([b.get_height() for b in bars], [w[0] for w in want], rtol=1e-5, atol=1e-7)
            caps = [seg for c in ax.collections for seg in c.get_segments()]  # the error bars, bottom to top
            drawn = sorted((round(s[:, 0].mean(), 6), s[:, 1].min(), s[:, 1].max()) for s in caps)
            np.testing.assert_allclose([d[1:] for d in drawn], [w[1:] for w in want], rtol=1e-5, atol=1e-6)
            for bar, (mean, *_ ) in zip(bars[:-1], want[:-1]):
                r, _, b, _ = bar.get_facecolor()
                assert mean == 0 or (r > b) == (mean > 0), (mean, bar.get_facecolor())
            shared = [bool(own[own.expert == e].shared.iloc[0]) for e in experts]
            assert [bool(b.get_hatch()) for b in bars[:-1]] == shared and any(shared) == (arch == "qwen2moe")
            ticks = [t.get_text() for t in ax.get_xticklabels()]
            n = own.example.nunique()
            routed = [int(own[own.expert == e].routed.sum()) for e in experts]
            assert ticks == [f"{'shared' if s else f'E{e}'}\n{r}/{n}" for e, s, r in zip(experts, shared, routed)] \
                + [f"total\nmlp{layer}"]
            assert f"n = {n}" in ax.get_title() and ax.get_ylim()[1] >= max(w[2] for w in want)
            labels = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
            assert not [(i, j) for i in range(len(labels)) for j in range(i) if _overlap(labels[i], labels[j])]
            boxes += [ax.title.get_window_extent(renderer), ax.xaxis.label.get_window_extent(renderer)]
        boxes.append(panels[0].yaxis.label.get_window_extent(renderer))
        for box in boxes:
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        assert not [(i, j) for i in range(len(boxes)) for j in range(i) if _overlap(boxes[i], boxes[j])]
        for stem in ("circuits_dla_components", "circuits_dla_experts"):
            figs[stem].savefig(tmp_path / f"{stem}.png", dpi=40)
        html = _figures_html(tmp_path)
        assert html.index("<b>circuits_dla_components</b>") < html.index("<b>circuits_dla_experts</b>")
        assert 'alt="circuits_dla_experts: Direct logit attribution per expert (logits) of each mixture-of-experts' \
            in html
    finally:
        plt.close("all")


def test_dla_per_expert_says_its_logits_are_before_a_final_soft_cap_in_both_views():
    """The per-expert DLA figure read "(logits)" while the other DLA figures of a soft-capped model say the logits are
    before the cap (the rows add up to the capped model's pre-cap logit difference): with a cap, the bar view's y label
    and the many-expert map's colour bar say "before the final soft-cap 30 tanh(x / 30)"; without one, "(logits)"."""
    from headscope.reports.plots_experts import experts_figure

    def table(experts):
        return pd.DataFrame([{"layer": l, "expert": e, "shared": False, "contribution": 0.1 * (e - 1), "ci_low": -0.5,
                              "ci_high": 0.5, "n": 8, "n_routed": 2} for l in (0, 1) for e in range(experts)])
    try:
        bars = experts_figure(table(4), cap=30.0)
        assert bars.axes[0].get_ylabel() == "direct logit attribution\n(logits before the final soft-cap 30 tanh(x / 30))"
        wide = experts_figure(table(40), cap=30.0)
        assert wide.axes[-1].get_ylabel().endswith("(logits before the final soft-cap 30 tanh(x / 30))")
        assert experts_figure(table(4)).axes[0].get_ylabel() == "direct logit attribution (logits)"
    finally:
        plt.close("all")


def test_dla_per_expert_of_many_experts_is_one_zero_centred_map_with_the_shared_and_total_columns_named():
    """#34 items 3 and 7, at a real MoE's width (Qwen1.5-MoE: 60 routed experts and a shared one a layer): bars would
    be unreadable, so 10 MoE layers x 40 experts draw one map, layers (rows) x experts (columns), the table's means
    in each cell, then the shared expert's and the layer total (the dla table's mlpN mean) right of a line, on the
    diverging map centred on 0; never-routed experts' cells hatched; every shown tick label apart, "shared" and
    "total" among them, and the figure at most 40 inches wide."""
    from headscope.reports.plots_experts import experts_figure

    rng = np.random.default_rng(5)
    rows = [{"layer": l, "expert": e, "shared": e == 40, "contribution": float(rng.normal(0, 0.2)), "ci_low": -1.0,
             "ci_high": 1.0, "n": 32, "n_routed": 0 if (l + e) % 9 == 0 and e < 40 else 4}
            for l in range(1, 11) for e in range(41)]
    mean = pd.DataFrame(rows)
    dla = pd.DataFrame([{"kind": "mlp", "component": f"mlp{l}", "contribution": v, "example": i}
                        for l in range(1, 11) for i, v in enumerate((0.3 * l - 1.5, 0.3 * l - 1.3))])
    fig = experts_figure(mean, dla=dla)
    try:
        ax = fig.axes[0]
        want = mean[~mean.shared].pivot(index="layer", columns="expert", values="contribution").to_numpy()  # [10, 40]
        shared = mean[mean.shared].sort_values("layer").contribution.to_numpy()
        totals = [0.3 * l - 1.4 for l in range(1, 11)]
        np.testing.assert_allclose(heat(ax), np.column_stack([want, shared, totals]))
        kind, vmin, vmax = _norm(ax)
        assert kind == "diverging" and vmax == pytest.approx(max(map(abs, totals)))  # 1.6, layer 10's total
        hatched = {(round(p.get_x()), round(p.get_y())) for p in ax.patches if p.get_hatch()}
        assert hatched == {(e, l - 1) for l in range(1, 11) for e in range(40) if (l + e) % 9 == 0}
        shown = [t.get_text() for t in _shown_xticks_apart(fig, ax)]
        assert shown[-2:] == ["shared", "total"] and len(shown) > 20
        assert "n = 32" in ax.get_title() and fig.get_size_inches()[0] <= 40
    finally:
        plt.close("all")


def _attribution_result(chance_entry):
    """A hand-built attribution Result of 4 examples whose rollout/saliency taus sit clear of 0 (review 13b B1)."""
    from headscope.analyses.core.result import Result

    taus = [0.4, 0.5, 0.45, 0.55]
    df = pd.DataFrame([{"example": e, "attention": a, "method": "saliency", "tau": t}
                       for a in ("last_layer", "rollout") for e, t in enumerate(taus)])
    tokens = ["<bos>", "a", "b", "c", "?"]
    scores = pd.DataFrame([{"example": 0, "position": p, "token": tokens[p], "method": m, "layer": None, "head": None,
                            "score": 1 / 3} for m in ("last_layer", "saliency") for p in (1, 2, 3)])
    perm = pd.DataFrame({"example": range(4), "max_attention": [0.3, 0.4, 0.5, 0.6], "median_change": [0.1, 0.2, 0.1, 0.3],
                         "layer": 1})
    summary = {"n_examples": 4, "metric": "logit_diff", "output_change": "tvd", "chance": chance_entry}
    return Result(name="attribution", df=df, summary=summary, tables={"scores": scores, "permutation": perm})


def test_attribution_figures_say_when_the_finding_withholds_what_they_draw():
    """Review 13b B1: at chance the finding withholds the taus, but tau.png drew them with intervals clear of 0 and
    the captions said nothing. Now every attribution figure's title says "not read" (greyed) and its caption why;
    where the guard cannot tell (too few examples) they say "read with a caveat"; a clear run says neither."""
    from headscope.reports.plots_attribution import MUTED, figures

    at = {"at_chance": True, "below_chance": False, "metric": "logit_diff", "mean": 0.02, "chance_value": 0.0,
          "ci": [-0.3, 0.34], "n_examples": 4, "task": "recall"}
    wide = {**at, "at_chance": False, "undetermined": True, "mean": 1.3, "ci": [-0.735, 3.34]}
    clear = {**at, "at_chance": False, "mean": 2.5, "ci": [0.8, 4.2]}
    try:
        for entry, said in ((at, "not read: the finding withholds these (model at chance on task recall, 4 examples)"),
                            (wide, "read with a caveat: 4 examples cannot tell the model from chance on task recall"),
                            (clear, None)):
            result = _attribution_result(entry)
            drawn = figures(result)
            assert set(drawn) == {"tau", "token_heatmap", "permutation"}
            for stem, fig in drawn.items():
                title = fig.axes[0].get_title()
                text = caption(stem, result.summary)
                if said is None:
                    assert "not read" not in title.lower() and "caveat" not in title and "Not read" not in text
                    continue
                assert said in " ".join(title.split("\n")), (stem, title)  # a title may be wrapped to its axes
                assert text.startswith("Not read: the finding withholds" if entry is at else "Read with a caveat")
                if entry is at:
                    assert fig.axes[0].title.get_color() == MUTED
                    assert "intervals clear of 0 here are not findings" in text
    finally:
        plt.close("all")


def test_token_heatmap_colour_bar_label_stays_clear_of_a_three_line_title():
    """Review 17c C1: at chance on a sliding-window model the heatmap's title has three lines (the hatch note, the
    at-chance note), wider than the map, and the colour bar's vertical label "share of importance (0-1)" ran up into
    them ("mask)" and "(0-1)" overprinted). Drawn: the label's box and the title's do not overlap, the label is no
    taller than its bar, and its words are the same, none broken."""
    from headscope.reports.plots_attribution import figures

    at = {"at_chance": True, "below_chance": False, "metric": "logit_diff", "mean": 0.02, "chance_value": 0.0,
          "ci": [-0.3, 0.34], "n_examples": 4, "task": "recall"}
    result = _attribution_result(at)
    result.tables["scores"]["masked"] = (result.tables["scores"]["method"] == "last_layer") & (
        result.tables["scores"]["position"] == 1)
    try:
        fig = figures(result)["token_heatmap"]
        ax, bar = fig.axes[0], fig.axes[1]
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        label = bar.yaxis.label
        assert "sliding window" in ax.get_title() and "not read" in ax.get_title()
        assert not label.get_window_extent(renderer).overlaps(ax.title.get_window_extent(renderer))
        assert label.get_window_extent(renderer).height <= bar.get_window_extent(renderer).height + 0.5
        assert label.get_text().split() == "share of importance (0-1)".split()
    finally:
        plt.close("all")


def test_kv_eviction_at_chance_is_drawn_in_units_muted_with_its_band_on_the_span():
    """Review 14a C1: at chance kv_eviction.png drew percentages of a full-cache mean 0 within noise (y to +-20,000%)
    without the at-chance styling. By hand: full-cache log-probabilities -1 and -3 (mean -2), window at 2 changes
    them by -0.5 and -1.5 (mean -1 nat); chance -log(100): the grey band is +-1% of the span, 0.01 x (log(100) - 2)
    nats; the title carries the at-chance line (plots.quiet_reason)."""
    import math

    from headscope.reports.plots import quiet_reason
    from headscope.reports.plots_kv import plot_eviction

    rows = [{"policy": "full", "budget": 8, "example": e, "context": 8, "metric": m} for e, m in enumerate((-1.0, -3.0))]
    rows += [{"policy": "window", "budget": 2, "example": e, "context": 8, "metric": m} for e, m in enumerate((-1.5, -4.5))]
    quiet = quiet_reason({"chance": {"at_chance": True}})
    ax = plot_eviction(pd.DataFrame(rows), metric="logprob", chance=-math.log(100), quiet=quiet, ax=plt.subplots()[1])
    try:
        [line] = [li for li in ax.get_lines() if li.get_label() == "window"]
        assert list(line.get_ydata()) == pytest.approx([-1.0])
        [band] = [c for c in ax.collections if c.get_label().startswith("within 1% of the span from chance")]
        ys = band.get_paths()[0].vertices[:, 1]
        assert max(ys) == pytest.approx(0.01 * (math.log(100) - 2)) and min(ys) == pytest.approx(-0.01 * (math.log(100) - 2))
        assert "AT CHANCE" in ax.get_title() and "answer log-probability (nats)" in ax.get_ylabel()
        assert "%" not in ax.get_ylabel()
    finally:
        plt.close("all")


def test_patching_map_of_a_gap_within_noise_is_muted_on_a_scale_no_narrower_than_that_noise():
    """Review 14b C3: the reviewer's float32 OLMoE run, gap 0.00287 with its 95% CI [-0.00111, 0.00685] over 8 pairs;
    resid_pre's -4 column (0.00287 at layer 0) was dark red on a ±0.0029 scale. Now the scale reaches the CI's far
    end, 0.00685 (not the panel's max), the colours are muted and the title says why."""
    from matplotlib.colors import rgb_to_hsv

    from headscope.reports.plots_patching import figures as patching_figures

    effect = {(0, 24): 0.0028689, (1, 24): 0.00046809, (1, 27): 0.0028689}  # exact.csv's non-zero resid_pre cells
    exact = pd.DataFrame([{"site_type": "resid_pre", "layer": l, "head": None, "pos": p, "position_from_end": p - 28,
                           "token": "", "value": 0.0, "effect": effect.get((l, p), 0.0), "n_rows": 8}
                          for l in range(2) for p in range(28)])
    summary = {"metric": "logprob", "normalized": False, "direction": "denoise", "n_examples": 8, "n_positions": 28,
               "clean_metric": -1.0005390, "corrupted_metric": -1.0034079,
               "rounding_floor": {"basis": "one rounding step", "floor": 1.1961554682859976e-07},
               "gap_within_noise": {"gap": 0.0028689, "ci": [-0.001107389721810955, 0.00684518475064649]},
               "at_corrupted_token": {"differ_from_end": {"-4": 8}}}  # review 14b C5: the swapped word, named
    ax = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"].axes[0]
    try:
        np.testing.assert_allclose(_norm(ax)[1:], (-0.00684518475064649, 0.00684518475064649))
        assert "GAP WITHIN NOISE: muted colours" in " ".join(ax.get_title().split())
        assert "differ" not in ax.get_title()  # review 16c C4: said in the caption, not a title line over 2 rows
        assert caption("exact_resid_pre", summary).endswith("Clean and corrupted prompts differ at -4 from the end.")
        mesh = ax.collections[0]
        red = rgb_to_hsv(np.asarray(mesh.cmap(mesh.norm(0.0028689)))[:3])
        top = rgb_to_hsv(np.asarray(mesh.cmap(1.0))[:3])  # the scale's own end: muted, never full red
        assert top[1] < 0.7 and red[1] < 0.35, (top, red)
    finally:
        plt.close("all")


def _position_at_chance() -> tuple[dict, dict]:
    """(summary, tables) of a position Result at chance with a streaming window: its titles carry the long subtitle."""
    curve = pd.DataFrame([{"condition": c, "metric": m, "position": p, "mean": 0.0, "ci_low": 0.0, "ci_high": 0.37}
                          for c in ("full", "window") for m in ("accuracy", "logprob") for p in (1, 2, 3, 4)])
    tables = {"curve": curve, "masked": pd.DataFrame({"condition": ["window"]}),
              "gold_attention": pd.DataFrame([{"layer": 0, "head": 0, "position": p, "mass": 0.0, "visible": 0.0}
                                              for p in (1, 2, 3, 4)]),
              "sinks": pd.DataFrame({"layer": [0], "sink_mass": [0.2], "baseline": [0.2]})}
    summary = {"primary_metric": "accuracy", "n_items": 4, "n_sink": 1,
               "chance": {"at_chance": True, "metric": "accuracy", "does_not_copy": True}}
    return summary, tables


def test_position_figures_keep_the_y_label_clear_of_the_title():
    """Review 14c C1: position_curve's y label 'accuracy (greedy output contains the value)' was taller than its
    4-inch axes and ran up into the 'NOT DOING THE TASK' subtitle, itself wider than the axes. Measured on the drawn
    figure: every figure's y label lies within its axes' height and clear of the title, and each title line within
    the figure's width."""
    from types import SimpleNamespace

    from headscope.reports.plots_position import figures

    s, tables = _position_at_chance()
    try:
        figs = figures(SimpleNamespace(summary=s, tables=tables))
        assert "NOT DOING THE TASK" in figs["position_curve"].axes[0].get_title()
        for stem, fig in figs.items():
            fig.draw_without_rendering()
            renderer = fig.canvas.get_renderer()
            ax = fig.axes[0]
            box, label, title = (x.get_window_extent(renderer) for x in (ax, ax.yaxis.label, ax.title))
            assert label.y0 >= box.y0 - 1 and label.y1 <= box.y1 + 1, stem  # beside its axes, not above them
            assert not label.overlaps(title), stem
            assert title.x0 >= 0 and title.x1 <= fig.bbox.width + 1 and title.y1 <= fig.bbox.height + 1, stem
    finally:
        plt.close("all")


def test_every_figure_a_result_draws_keeps_its_y_label_within_its_axes_under_the_title():
    """One rule for every figure (plots.fit_labels, which plot_result applies): heads' best_head y label (one line,
    334 px under the report's style) was taller than its 292 px axes; position's figures at chance keep passing it (a
    run's streaming figure ran 37 px past its axes when its label was wrapped before its title shortened them).
    Measured in pixels on each drawn figure: every y label (colour bars aside) is within its axes' height and ends
    below the title; a label that fits stays as written."""
    from headscope.analyses.core.result import Result
    from headscope.reports.plots import plot_result

    heads = {"curve": pd.DataFrame([{"ordering": o, "recompute": False, "seed": 0, "fraction_pruned": f,
                                     "metric": -2.0 - f} for o in ("gradient", "random") for f in (0.0, 0.5, 1.0)]),
             "best_head": pd.DataFrame({"layer": [0, 1], "head": [1, 0], "change": [-0.5, -0.2],
                                        "oracle_change": [-0.4, -0.1], "layer_removed_change": [-1.0, 0.3],
                                        "n_examples": [16, 16]})}
    position, tables = _position_at_chance()
    results = [Result(name="position", df=pd.DataFrame(), tables=tables, summary=position),
               Result(name="heads", df=pd.DataFrame(), tables=heads, summary={"metric": "logprob", "baseline_metric": -2.0})]
    try:
        figs = {f"{r.name}/{stem}": fig for r in results for stem, fig in plot_result(r).items()}
        assert {"position/position_streaming", "heads/best_head"} <= set(figs)
        for stem, fig in figs.items():
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            for ax in fig.axes:
                if getattr(ax, "_colorbar", None) is not None or not ax.get_ylabel():
                    continue
                box, label = ax.get_window_extent(renderer), ax.yaxis.label.get_window_extent(renderer)
                assert label.height <= box.height + 1, (stem, ax.get_ylabel(), label.height, box.height)
                if ax.get_title():
                    assert label.y1 <= ax.title.get_window_extent(renderer).y0, (stem, ax.get_ylabel())
        assert figs["heads/pruning_curve"].axes[0].get_ylabel().count("\n") == 0  # it fitted: left as written
    finally:
        plt.close("all")


def test_heads_line_and_bar_figures_at_chance_are_muted_and_say_so():
    """Review 14a B1: at chance the heads importance map was muted and titled AT CHANCE, but pruning_curve.png,
    best_head.png and l0.png drew the same noise in full colour with nothing said. Each now says AT CHANCE in its
    title and every drawn line, bar and legend key is pale (every RGB channel >= MUTE, as plots.muted does a map);
    above chance they stay vivid (some channel under MUTE) and say nothing."""
    from matplotlib.colors import to_rgba

    from headscope.analyses.core.result import Result
    from headscope.reports.plots import MUTE
    from headscope.reports.plots_heads import figures

    curve = pd.DataFrame([{"ordering": o, "recompute": False, "seed": 0, "fraction_pruned": f, "metric": -2.0 - f}
                          for o in ("gradient", "random") for f in (0.0, 0.5, 1.0)])
    best = pd.DataFrame({"layer": [0, 1], "head": [1, 0], "change": [-0.5, -0.2], "oracle_change": [-0.4, -0.1],
                         "layer_removed_change": [-1.0, 0.3], "n_examples": [16, 16]})
    sweep = pd.DataFrame({"lambda": [0.03, 0.1], "heads_kept": [6, 3], "metric_binary": [-2.1, -2.4],
                          "metric": [-2.1, -2.5]})
    summary = {"metric": "logprob", "baseline_metric": -2.0}
    tables = {"curve": curve, "best_head": best, "l0": sweep}
    stems = ("pruning_curve", "best_head", "l0")

    def colours(ax):
        legend = ax.get_legend()
        found = [line.get_color() for line in ax.lines if line.get_visible() and len(line.get_xdata())]
        found += [p.get_facecolor() for p in ax.patches if p.get_height() != 0 and p.get_label() != "_nolegend_"]
        found += [h.get_color() if hasattr(h, "get_color") and not hasattr(h, "get_facecolor") else h.get_facecolor()
                  for h in (legend.legend_handles if legend is not None else [])]
        return [np.asarray(to_rgba(c))[:3] for c in found if not (isinstance(c, str) and c == "none")]

    try:
        for chance, pale in (({"at_chance": True, "reason": "the 95% CI contains 0"}, True), (None, False)):
            s = {**summary, "chance": chance} if chance else summary
            figs = figures(Result(name="heads", df=pd.DataFrame(), summary=s, tables=tables))
            for stem in stems:
                ax = figs[stem].axes[0]
                assert ("AT CHANCE" in ax.get_title()) == pale, (stem, ax.get_title())
                drawn = [c for a in figs[stem].axes for c in colours(a)]
                assert drawn, stem
                vivid = [c for c in drawn if c.min() < MUTE - 1e-9]
                assert (not vivid) if pale else vivid, (stem, vivid[:3])
    finally:
        plt.close("all")


def test_mlp_top_neurons_one_label_style_and_at_chance_muted_like_dla_components():
    """Review 14a C4: mlp_top_neurons.png labelled a dense layer's neuron "L1.N79" beside "L0 E0 n51 (routed 16/16)" and
    "L0 shared n47"; now every label is "L<layer> <E<e> | shared | dense> n<neuron>". At chance it and
    circuits_dla_components.png (drawn in full colour beside the muted circuits_dla_experts.png) say AT CHANCE in the
    title and every bar is pale (each RGB channel >= MUTE); above chance neither says it and the bars are vivid."""
    from matplotlib.colors import to_rgba

    from headscope.reports.plots import MUTE
    from headscope.reports.plots_circuits import figures as circuits_figures
    from headscope.reports.plots_mlp import figures as mlp_figures

    top = pd.DataFrame({"layer": [0, 1, 0], "neuron": [51, 79, 303], "task_update_norm": [1.36, 0.9, 0.5],
                        "expert": pd.array([0, None, 4], dtype="Int64"), "expert_neuron": [51, 79, 47],
                        "n_routed": [16, None, 16]})
    agreement = pd.DataFrame({"layer": [0, 1, 2], "agreement": [0.1, 0.2, 0.1], "agreement_any": [0.3, 0.2, 0.2],
                              "agreement_shuffled": [0.04, 0.01, 0.03], "agreement_any_shuffled": [0.1, 0.08, 0.1]})
    experts = {"0": {"n_experts": 4, "shared_width": 96}, "2": {"n_experts": 4, "shared_width": 96}}
    dla = pd.DataFrame([{"kind": k, "component": c, "example": e, "contribution": v + 0.01 * e}
                        for k, c, v in (("embed", "embed", 0.3), ("mlp", "mlp0", 0.5), ("mlp", "mlp1", -0.2))
                        for e in range(4)])

    def bars(ax):
        return [np.asarray(to_rgba(p.get_facecolor()))[:3] for p in ax.patches if p.get_height() and p.get_width()]

    try:
        for extra, pale in ((dict(AT_CHANCE), True), ({}, False)):
            s = {"n_task_examples": 16, "task": "tools", "experts_per_layer": experts, **extra}
            ax = mlp_figures(_result("mlp", None, s, agreement=agreement, top_neurons=top))["mlp_top_neurons"].axes[0]
            comp = circuits_figures(_result("circuits", None, extra, dla=dla))["circuits_dla_components"].axes[0]
            for a in (ax, comp):
                assert ("AT CHANCE" in a.get_title()) == pale, a.get_title()
                drawn = bars(a)
                assert drawn and all((c.min() >= MUTE - 1e-9) == pale for c in drawn), drawn
        from headscope.reports.plots_mlp import neuron_labels

        assert neuron_labels(top, 16, {0: 4}) == ["L0 E0 n51 (routed 16/16)", "L1 dense n79", "L0 shared n47"]
    finally:
        plt.close("all")


def test_attribution_tau_figure_veils_leave_one_out_where_the_finding_leaves_it_out():
    """Review 14c B2: with 62 of 100 leave-one-out scores rounding ties the finding leaves leave-one-out out of its
    taus, but tau.png drew its group like any other. Now that group (x tick 1 here: saliency, leave-one-out) lies
    under a hatched veil with the reason in its greyed tick label; without the ties nothing is veiled."""
    from headscope.analyses.core.result import Result
    from headscope.reports.plots_attribution import MUTED, figures

    base = _attribution_result({"at_chance": False, "metric": "logit_diff", "mean": 2.5, "ci": [0.8, 4.2],
                                "n_examples": 4})
    loo = base.df.assign(method="leave_one_out", tau=[0.3, 0.2, 0.25, 0.35] * 2)
    ties = {"dtype": "bfloat16", "floor": [0.0806, 0.083], "n_scores": 100, "n_within": 62, "ranks_rounding": True}
    try:
        for ranks, veiled in ((True, True), (False, False)):
            s = {**base.summary, "loo_rounding": {**ties, "ranks_rounding": ranks}}
            result = Result(name="attribution", df=pd.concat([base.df, loo], ignore_index=True), summary=s,
                            tables=base.tables)
            ax = figures(result)["tau"].axes[0]
            veils = [p for p in ax.patches if p.get_gid() == "muted"]
            ticks = {t.get_text(): t for t in ax.get_xticklabels()}
            if not veiled:
                assert not veils and "leave-one-out" in ticks
                continue
            [veil] = veils
            box = veil.get_window_extent()  # pixels, back to data x
            x0, x1 = ax.transData.inverted().transform([(box.x0, 0), (box.x1, 0)])[:, 0]
            assert x0 == pytest.approx(0.52) and x1 == pytest.approx(1.48)
            label = "leave-one-out\n(not read:\n62 of 100 scores\nare rounding ties)"
            assert label in ticks and ticks[label].get_color() == MUTED
            assert ticks["saliency"].get_color() != MUTED
    finally:
        plt.close("all")


def test_withheld_mib_curve_is_faint_and_its_legend_has_no_number_nor_overlaps_the_axis_label():
    """Review 14b A4: circuits_mib.png drew a clean curve and "CPR ... = 0.583, 95% CI 0.190-0.890" over a gap within
    noise. Withheld (unreported), the legend names CPR with no number, the curve is faint, and under a three-line title
    the legend (anchored in points below the axis label) overlaps neither the tick labels nor the axis label;
    the faithfulness figure's note, wrapped to its axes, does not run over its y label."""
    from headscope.reports.plots import laid_out
    from headscope.reports.plots_circuits import plot_faithfulness, plot_mib

    fractions = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    f = [0.0] * 7 + [1 / 3, 2 / 3, 1.0]  # out_bf16/circuits/mib.csv: bfloat16 steps of a -0.0117 gap
    why = ("clean-corrupted gap within noise: mean gap -0.0117 answer logit, its 95% CI [-0.0252, 0.0018] over 8 pairs "
           "contains 0")
    fig = laid_out(plot_mib(pd.DataFrame({"fraction": fractions, "faithfulness": f}), cpr=0.583, cmd=0.416,
                            cpr_ci=[0.190, 0.890], cmd_ci=[0.109, 0.809], unreported=why))
    sweep = pd.DataFrame([{"circuit": c, "k": k, "draw": 0, "faithfulness": v}
                          for c, k, v in (("top", 1, 0.0), ("top", 14, -0.33), ("top", 110, 1.0), ("random", 1, 0.0),
                                          ("random", 14, 1.0), ("random", 110, 1.0))])
    faith = laid_out(plot_faithfulness(sweep, unreported=why).figure)
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["CPR: area under f (not reported)",
                                                                      "top-p% edges", "f = 1"]
        assert ax.lines[0].get_alpha() < 0.5
        renderer = fig.canvas.get_renderer()
        legend = ax.get_legend().get_window_extent(renderer)
        assert not [t.get_text() for t in _shown_xticks_apart(fig, ax) if _overlap(t.get_window_extent(renderer), legend)]
        assert not _overlap(ax.xaxis.label.get_window_extent(renderer), legend)
        fax = faith.axes[0]
        r = faith.canvas.get_renderer()
        assert not _overlap(fax.title.get_window_extent(r), fax.yaxis.label.get_window_extent(r))
    finally:
        plt.close(fig)
        plt.close(faith)


def _qwen_resid_pre():
    """Verify 17v's Qwen3-MoE bfloat16 resid_pre map in shape: 3 layers x 32 positions from the end, 8 prompts of 10 to
    32 tokens (columns -32 to -11 pale), clean and corrupted differing at -6, -5, -2; a few cells within the rounding
    floor 0.003 (dotted)."""
    reach = {p: min(8, max(1, (p - 21) // 2 + 1)) if p < 22 else 8 for p in range(32)}  # prompts reaching each column
    effect = {(0, 26): 0.1, (0, 27): 0.1, (0, 30): 0.6, (1, 31): 1.0, (2, 31): 1.0, (1, 27): 0.002, (2, 29): -0.001}
    exact = pd.DataFrame([{"site_type": "resid_pre", "layer": l, "head": None, "pos": p, "position_from_end": p - 32,
                           "token": "", "value": 0.0, "effect": effect.get((l, p), 0.0), "n_rows": reach[p]}
                          for l in range(3) for p in range(32)])
    summary = {"metric": "logit_diff", "normalized": True, "direction": "denoise", "n_examples": 8, "n_positions": 32,
               "rounding_floor": {"basis": "one rounding step", "floor": 0.003},
               "at_corrupted_token": {"differ_from_end": {"-6": 8, "-5": 8, "-2": 8}}}
    return exact, summary


def test_a_reports_patching_map_keeps_its_title_to_its_name_and_says_the_rest_in_its_caption():
    """Review 16c C4 (verify 17v): exact_resid_pre's title took 4 lines over a 3-row map (the dotted cells' floor, the
    places clean and corrupted differ, "measured)" and "the end)" alone on their lines). A report's map is titled by
    its name alone; the caption ends with this run's floor and those places, in the map's units."""
    from headscope.reports.plots_patching import figures as patching_figures

    exact, summary = _qwen_resid_pre()
    fig = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"]
    try:
        ax = fig.axes[0]
        assert ax.get_title() == "patching resid_pre, by layer and position"
        assert sum(1 for p in ax.patches if p.get_hatch() == "..") == 2  # the dots are drawn all the same
        said = caption("exact_resid_pre", summary)
        assert said.endswith("Site: resid pre. This run's rounding floor: ±0.003 in the map's units. Clean and corrupted "
                             "prompts differ at -6, -5, -2 from the end.")
        assert "differ" not in caption("exact_head_out", summary)  # a map by head has no positions
    finally:
        plt.close("all")


def test_patching_position_ticks_are_thinned_again_at_the_final_size():
    """Verify 17v C1: the ticks of Qwen3-MoE's resid_pre map ran together ("-32-30-28", 2 px apart) because they were
    thinned before the colour bar's wrapped label narrowed the map. Drawn wide and then narrowed (as the final layout
    narrows it), fit_position_ticks thins them again: every pair of labels is PAD px apart or more, measured, and -1
    keeps its label; without it they overprint. In a report's stored figure too."""
    from headscope.reports.plots import laid_out
    from headscope.reports.plots_patching import PAD, fit_position_ticks, plot_layer_pos
    from headscope.reports.plots_patching import figures as patching_figures

    def gaps(ax) -> list[float]:
        ax.figure.draw_without_rendering()
        renderer = ax.figure.canvas.get_renderer()
        boxes = sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()), key=lambda b: b.x0)
        return [b.x0 - a.x1 for a, b in zip(boxes, boxes[1:])]

    exact, summary = _qwen_resid_pre()
    try:
        ax = plot_layer_pos(exact, site_type="resid_pre", n_prompts=8, n_positions=32, ax=plt.subplots(figsize=(9, 4))[1])
        laid_out(ax)
        assert min(gaps(ax)) >= PAD - 0.01
        ax.figure.set_size_inches(5, 4)  # the map narrows after the first thinning
        ax.figure.tight_layout()
        assert min(gaps(ax)) < 0  # the old labels overprint at the final size
        assert fit_position_ticks(ax)
        assert min(gaps(ax)) >= PAD - 0.01 and [t.get_text() for t in ax.get_xticklabels()][-1] == "-1"
        stored = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"]
        assert min(gaps(stored.axes[0])) >= PAD - 0.01
    finally:
        plt.close("all")


def test_patching_cells_within_the_rounding_floor_are_dotted_and_a_panel_of_rounding_only_says_so():
    """Review 14a C2 / 14b B6: in bfloat16 (rounding floor 0.0079, one step of the metric) head_out effects of
    0.0055 at most were drawn at full colour on a ±0.0055 scale. Now the scale spans at least two floors (±0.0158),
    every non-zero cell within the floor is dotted grey and the panel says ROUNDING ONLY, muted; a panel with one
    cell above the floor dots the others only."""
    from headscope.reports.plots_patching import figures as patching_figures

    def dotted(ax):
        return sum(1 for p in ax.patches if p.get_hatch() == "..")

    small = {(0, 0): 0.0055, (0, 1): -0.0031, (1, 0): 0.0, (1, 1): 0.0008}
    for big, want in ((None, 3), (0.05, 3)):
        effect = dict(small) if big is None else {**small, (1, 0): big}
        exact = pd.DataFrame([{"site_type": "head_out", "layer": l, "head": h, "pos": None, "token": "", "value": 0.0,
                               "effect": e} for (l, h), e in effect.items()])
        summary = {"metric": "logprob", "normalized": False, "direction": "denoise", "clean_metric": -1.0,
                   "corrupted_metric": -1.0, "rounding_floor": {"floor": 0.0079}}  # no gap: raw effects
        ax = patching_figures(_result("patching", exact, summary, exact=exact))["exact_head_out"].axes[0]
        try:
            title = " ".join(ax.get_title().split())
            assert dotted(ax) == want
            if big is None:
                np.testing.assert_allclose(_norm(ax)[1:], (-0.0158, 0.0158))
                assert "ROUNDING ONLY: muted colours (every cell within the rounding floor ±0.0079" in title
            else:
                np.testing.assert_allclose(_norm(ax)[1:], (-0.05, 0.05))
                assert "ROUNDING ONLY" not in title and "dotted" not in title  # review 16c C4: the caption says it
                assert "This run's rounding floor: ±0.0079 in the map's units." in caption("exact_head_out", summary)
        finally:
            plt.close("all")


def test_attribution_vs_exact_legend_gives_no_slope_where_every_cell_is_within_the_rounding_floor():
    """Review 14b B6, the figure's side: the bfloat16 run's legend read "attn_out (slope 0.08; no interval: 0 of 56
    cells non-zero)" where 5 cells were non-zero, all within the rounding floor 0.0079. Now no slope, the floor named;
    a site with effects above the floor keeps its slope (np.polyfit, by hand) and counts cells above the floor."""
    from headscope.reports.plots_patching import plot_attribution_vs_exact

    tiny = np.r_[[0.0055, -0.003, 0.002, 0.001, 0.0008], np.zeros(51)]  # every |effect| under the floor
    x = np.r_[[0.5, 0.2], np.zeros(18)]
    y = np.r_[[0.45, 0.22], np.zeros(18)]
    data = pd.concat([pd.DataFrame({"site_type": "attn_out", "effect": tiny, "attribution": tiny[::-1]}),
                      pd.DataFrame({"site_type": "mlp_out", "effect": x, "attribution": y})])
    ax = plot_attribution_vs_exact(data, floor=0.0079, ax=plt.subplots()[1])
    try:
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "attn_out (no slope: none of 56 cells above the rounding floor 0.0079)" in texts
        slope = float(np.polyfit(x, y, 1)[0])
        assert f"mlp_out (slope {slope:.2f}; no interval: 2 of 20 cells above the rounding floor 0.0079)" in texts
    finally:
        plt.close("all")


def test_a_patching_map_under_a_long_title_keeps_its_drawn_size_and_legible_colour_bar_ticks():
    """Review 14bv C1: bf16's 11-line title (gap within noise, rounding only, ...) left a 2 x 28 map 12 px high, its
    layer ticks and colour-bar ticks overprinted. Measured in pixels on the drawn figure, as the report's style draws."""
    from headscope.reports.plots import MIN_MAP_INCHES, setup_style
    from headscope.reports.plots_patching import figures as patching_figures

    setup_style()
    rows = [{"site_type": "resid_pre", "layer": l, "head": None, "pos": p, "token": "", "effect": 0.001 * (p % 3),
             "n_rows": 4 if p < 5 else 8} for l in range(2) for p in range(28)]
    exact = pd.DataFrame(rows)
    summary = {"metric": "logprob", "normalized": False, "direction": "denoise", "clean_metric": -1.006,
               "corrupted_metric": -1.005, "n_examples": 8, "n_positions": 28, "answer_pieces": {"left_out": 1},
               "rounding_floor": {"floor": 0.0079}, "gap_within_noise": {"ci": [-0.0119, 0.0097], "gap": -0.0011}}
    fig = patching_figures(_result("patching", exact, summary, exact=exact))["exact_resid_pre"]
    try:
        ax = fig.axes[0]
        assert "GAP WITHIN NOISE" in ax.get_title() and "ROUNDING ONLY" in ax.get_title()
        assert ax.get_title().count("\n") >= 6  # the long-title case
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = ax.get_window_extent(renderer)
        assert box.height >= MIN_MAP_INCHES * fig.dpi - 1 and box.width >= MIN_MAP_INCHES * fig.dpi - 1
        assert MIN_MAP_INCHES * fig.dpi >= 150  # the old layout drew this map 12 px high
        title = ax.title.get_window_extent(renderer)
        assert title.y0 >= box.y1  # the title stays above the map
        bar = next(c.colorbar for c in ax.collections if getattr(c, "colorbar", None) is not None)
        ticks = sorted((t.get_window_extent(renderer) for t in bar.ax.get_yticklabels() if t.get_text()),
                       key=lambda b: b.y0)
        assert len(ticks) >= 3 and all(lo.y1 <= hi.y0 for lo, hi in zip(ticks, ticks[1:]))  # no overprint
        layers = sorted((t.get_window_extent(renderer) for t in ax.get_yticklabels()), key=lambda b: b.y0)
        assert all(lo.y1 <= hi.y0 for lo, hi in zip(layers, layers[1:]))
    finally:
        plt.close("all")


def test_patching_captions_say_raw_effects_where_the_gap_is_within_noise():
    """Review 14bv C3: the maps drew raw log-prob effects (gap within noise) under a caption saying "share of the gap"."""
    base = {"metric": "logprob", "normalized": False, "clean_metric": -1.006, "corrupted_metric": -1.005}
    noise = {**base, "gap_within_noise": {"ci": [-0.0119, 0.0097], "gap": -0.0011}}
    said = caption("exact_attn_out", noise)
    assert said.startswith("Exact activation patching: the change in the answer log-probability when each cell is "
                           "patched (the raw effect in the metric's units, not a share of the clean-corrupted gap: the "
                           "clean-corrupted gap is within noise, so a share of it would measure nothing); red positive")
    assert said.endswith("Site: attn out.") and "as a share of" not in said
    assert "raw change in the answer log-probability" in caption("path_patching", noise)
    assert "both as raw changes in the answer log-probability" in caption("attribution_vs_exact", noise)
    shares = caption("exact_attn_out", base)  # a measured gap: the maps draw shares, as the caption says
    assert "as a share of the clean-corrupted gap (1 = clean behaviour fully restored" in shares


def test_kv_eviction_y_label_ends_below_the_at_chance_title():
    """Review 14av C1: at chance the two-line y label, taller than the axes under a three-line title and a three-line
    x label, ran into the title's "AT CHANCE" line. Measured on the drawn figure, as kv's figures() lays it out: the
    y label's box ends under the title's and within the axes' height."""
    from headscope.reports.plots import fit_labels, laid_out, quiet_reason, setup_style
    from headscope.reports.plots_kv import plot_eviction

    setup_style()
    contexts = (12, 16, 18, 20)
    rows = [{"policy": p, "budget": b, "example": e, "context": c, "metric": float(e % 2)}
            for p, bs in (("full", (20,)), ("window", (1, 2, 4, 8, 16, 17, 32))) for b in bs for e, c in enumerate(contexts)]
    fig = laid_out(plot_eviction(pd.DataFrame(rows), metric="logit_diff",
                                 quiet=quiet_reason({"chance": {"at_chance": True}})))
    try:
        fit_labels(fig.axes[0])
        ax = fig.axes[0]
        assert "AT CHANCE" in ax.get_title()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        label, title, box = (x.get_window_extent(renderer) for x in (ax.yaxis.label, ax.title, ax))
        assert label.y1 <= title.y0 and label.height <= box.height
    finally:
        plt.close("all")


def test_l0_legend_says_where_the_test_time_gates_cross_sits_inside_the_kept_heads_circle():
    """Review 14av C3: at 18 heads the test-time gates' point (-1.6768) lay inside the kept-heads circle (-1.6787) with
    no word of it. Measured on the drawn figure: where the two points are closer than the circle's radius the legend
    names the head count and both values; where they are apart it adds nothing."""
    from headscope.reports.plots import laid_out
    from headscope.reports.plots_heads import plot_l0

    def drawn(gates: float):
        table = pd.DataFrame([{"lambda": 0.03, "heads_kept": 18, "metric": gates, "metric_binary": -1.6787,
                               "n_examples": 8}])
        ax = plot_l0(table, metric="logprob", baseline=-1.6787,
                     tolerance={"basis": "span", "band": 0.0611, "tolerance": 0.01, "chance": -8.16})
        fig = laid_out(ax)
        fig.canvas.draw()
        circle, cross = (li for li in ax.get_lines() if li.get_marker() in ("o", "x"))
        apart = abs(ax.transData.transform((18, gates))[1] - ax.transData.transform((18, -1.6787))[1])  # pixels
        radius = circle.get_markersize() / 2 * fig.dpi / 72
        return [t.get_text() for t in ax.get_legend().get_texts()], apart, radius

    try:
        said, apart, radius = drawn(-1.6768)
        assert apart < radius and said[1:3] == ["test-time gates", "(the x inside the circle at 18\nheads, -1.6768 vs -1.6787)"]
        said, apart, radius = drawn(-1.6787 + 0.04)
        assert apart > radius and said[1] == "test-time gates" and not any("inside the circle" in t for t in said)
    finally:
        plt.close("all")


def test_l0_gates_carry_their_interval_and_the_legend_says_which_bars_their_marker_hides():
    """Review 17a C4 (StableLM bf16 l0.csv): one lambda kept all 18 heads, so "kept heads only" is the unpruned model
    (change 0, interval [0, 0]) and the gates' point (4.2090 against 4.21875) had no interval: the title said "bars:
    95% CI" over no visible bar. The gates now carry theirs, drawn at metric + (ci - change); a bar that reaches less
    than its marker's radius either side is named in the legend with its interval, and the 0-wide one says why."""
    from headscope.reports.plots import laid_out
    from headscope.reports.plots_heads import plot_l0

    def drawn(half: float):
        row = {"lambda": 0.03, "heads_kept": 18, "fraction_kept": 1.0, "metric": 4.208984375, "metric_binary": 4.21875,
               "change": 0.0, "change_ci_low": 0.0, "change_ci_high": 0.0, "unpruned": 4.21875, "n_examples": 8,
               "split": "held_out", "in_sample_reason": "", "n_train": 8, "gates_change": -0.009765625,
               "gates_change_ci_low": -0.009765625 - half, "gates_change_ci_high": -0.009765625 + half}
        ax = plot_l0(pd.DataFrame([row]), metric="logit_diff", baseline=4.21875,
                     tolerance={"basis": "metric", "band": 0.0422, "tolerance": 0.01})
        laid_out(ax)
        return ax, [t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()]

    try:
        ax, said = drawn(0.004)  # about 15 points either side on this axis: a visible bar
        ends = [seg for c in ax.collections for seg in c.get_segments() if abs(seg[0][1] - seg[1][1]) > 1e-9]
        assert [(float(a[1]), float(b[1])) for a, b in ends] == [pytest.approx((4.208984375 - 0.004, 4.208984375 + 0.004))]
        assert ("(bars hidden by their marker, 95% CI of the change from unpruned: 18 heads: kept heads only 0 wide "
                "(every head kept: the unpruned model itself))") in said
        _, said = drawn(0.0001)  # under a point either side: hidden by the cross
        assert ("(bars hidden by their marker, 95% CI of the change from unpruned: 18 heads: kept heads only 0 wide "
                "(every head kept: the unpruned model itself), gates -0.0098 [-0.0099, -0.0097])") in said
    finally:
        plt.close("all")


def test_bf16_rounding_components_leave_the_dla_figure_and_the_graph_caption_names_no_families():
    """Review 16av-B1: bfloat16 attn_bias and remainder rows of 2e-4 to 4e-4 (no attention bias; the summary's
    dla_zero_components, bf16's floor 2^-8 of the largest) were drawn as zero bars with legend entries; the figure
    follows the summary. 16av-C1: the graph caption listed "(GPT-NeoX, GPT-J, Phi)" on a Cohere report."""
    from headscope.reports.plots_circuits import CAPTIONS, figures

    dla = pd.DataFrame([{"kind": k, "component": c, "contribution": v, "example": e}
                        for k, c, v in (("embed", "embed", 1.0), ("mlp", "mlp0", 0.5), ("attn_bias", "attn_bias0", 4e-4),
                                        ("remainder", "remainder", -1.5e-4)) for e in range(3)])
    try:
        low = figures(_result("circuits", summary={"dla_zero_components": ["attn_bias0", "remainder"]}, dla=dla))
        ax = low["circuits_dla_components"].axes[0]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["embed", "mlp"]
        assert "left out: attn_bias, remainder" in ax.get_title()
        old = figures(_result("circuits", summary={}, dla=dla))["circuits_dla_components"].axes[0]  # float32's floor
        assert [t.get_text() for t in old.get_legend().get_texts()] == ["embed", "mlp", "attn_bias", "remainder"]
    finally:
        plt.close("all")
    caption = CAPTIONS["circuits_graph"]
    assert "GPT-NeoX" not in caption and "Phi" not in caption
    assert "on parallel blocks, where each MLP reads its block's input, not its heads' output (the key then says " \
           "\"parallel blocks\")" in caption


def test_kv_norms_title_has_no_word_alone_and_the_plot_keeps_its_height(monkeypatch):
    """Review 17v C2: the random Cohere model's kv_norms.png (three layers at 4.00 under a per-head k_norm of weight 1,
    16 prompts, positions 20-34 reached by fewer than half) had a six-line title with "caching:" and "signal" alone on
    their lines, over a plot a third of the figure high. Through plot_result, as the report saves it: every title and
    x label line holds three words or more, the title is at most three lines, and the axes are drawn at least
    NORMS_HEIGHT inches high."""
    from headscope.analyses.core.result import Result
    from headscope.reports import plots_kv
    from headscope.reports.plots import plot_result

    norms = pd.DataFrame([{"layer": layer, "kv_head": 0, "position": p, "kind": "key", "norm": 4.0,
                           "n_prompts": 16 if p < 20 else 6} for layer in (0, 1, 2) for p in range(35)])
    key_norm = {"module": "k_norm", "per_head": True, "layers": [0, 1, 2], "bounds": [4.0, 4.0], "dim": 16}
    result = Result(name="kv", df=pd.DataFrame(), tables={"norms": norms, "sinks": pd.DataFrame()},
                    summary={"metric": "logit_diff", "key_norm": key_norm, "n_examples": 16, "eviction_skipped": "x"})
    monkeypatch.setattr(plots_kv, "plot_sinks", lambda *a, **k: plt.subplots()[1])
    try:
        fig = plot_result(result)["kv_norms"]
        ax = fig.axes[0]
        title, xlabel = ax.get_title().split("\n"), ax.get_xlabel().split("\n")
        assert len(title) <= 3 and all(len(line.split()) >= 3 for line in title + xlabel), (title, xlabel)
        assert " ".join(ax.get_title().split()) == ("Cached key norms (mean over KV heads) keys are normalised (k_norm) "
                                                   "before caching: their norms are set by its weight, not a sink signal")
        fig.canvas.draw()
        assert ax.get_window_extent(fig.canvas.get_renderer()).height / fig.dpi >= plots_kv.NORMS_HEIGHT - 0.01
    finally:
        plt.close("all")


def test_kv_norms_coincident_layers_are_drawn_dashed_on_top_and_a_constant_k_norm_shows():
    """Review 16av-C2: a random model with a per-head k_norm of weight 1 (sqrt(16) = 4): all three layers at 4.00,
    layers 0 and 1 hidden under layer 2 and the band "k_norm allows 4.00" of zero width."""
    from headscope.reports.plots_kv import plot_norms

    norms = pd.DataFrame([{"layer": layer, "kv_head": 0, "position": p, "kind": "key", "norm": 4.0, "n_prompts": 4}
                          for layer in (0, 1, 2) for p in range(5)])
    key_norm = {"module": "k_norm", "per_head": True, "layers": [0, 1, 2], "bounds": [4.0, 4.0]}
    try:
        ax = plot_norms(norms, key_norm=key_norm, n_prompts=4, ax=plt.subplots()[1])
        styles = {line.get_label(): line.get_linestyle() for line in ax.get_lines() if line.get_label() in "012"}
        assert styles == {"0": "--", "1": "--", "2": "-"}  # 0 and 1 drawn over layer 2, dashed
        # review 17v C2: said in the legend, by the dashes it explains, not in a title of six lines over the plot
        legend = " ".join(ax.get_legend().get_title().get_text().split())
        assert legend == "layer 0-2 coincide (within 0.5% of the largest norm): dashed on top"
        assert "coincide" not in ax.get_title()
        wide = [line for line in ax.get_lines() if line.get_label().startswith("k_norm allows 4.00")]
        assert len(wide) == 1 and list(wide[0].get_ydata()) == [4.0, 4.0] and wide[0].get_linewidth() >= 6
        apart = plot_norms(norms.assign(norm=norms.layer + 1.0), ax=plt.subplots()[1])  # 1, 2, 3: all visible
        assert "coincide" not in apart.get_title() + apart.get_legend().get_title().get_text()
        assert all(line.get_linestyle() == "-" for line in apart.get_lines())
    finally:
        plt.close("all")


def test_kv_sinks_reads_an_older_runs_table_with_the_old_column_names():
    """Mend 1: sinks.csv's uniform_mass / flat_mass held ALiBi's baseline and the uniform share on ALiBi, so they are
    now baseline_mass (+ baseline "uniform" / "alibi") and uniform_share. A table saved before (uniform_mass holding the
    baseline; flat_mass present only on ALiBi) draws the same bars and names the same baseline."""
    from headscope.analyses.kv.analysis import sink_shares
    from headscope.reports.plots_kv import plot_sinks

    new = pd.DataFrame({"layer": [0, 1], "sink_mass": [0.3, 0.6], "baseline_mass": [0.2, 0.2], "baseline": "uniform"})
    old = new.drop(columns=["baseline_mass", "baseline"]).assign(uniform_mass=[0.2, 0.2])
    try:
        for kind, extra_new, extra_old in (("uniform", {}, {}), ("alibi", {"uniform_share": 0.1}, {"flat_mass": 0.1})):
            drawn = [plot_sinks(t, ax=plt.subplots()[1]) for t in (new.assign(baseline=kind, **extra_new),
                                                                    old.assign(**extra_old))]
            bars = [[round(p.get_height(), 3) for p in ax.patches] for ax in drawn]
            labels = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in drawn]
            assert bars == [[0.3, 0.6, 0.2, 0.2]] * 2 and labels[0] == labels[1]
            assert labels[0][1] == ("ALiBi's bias alone\n(equal scores)" if kind == "alibi" else "if uniform")
            base, said, share = sink_shares(old.assign(**extra_old))
            assert base.tolist() == [0.2, 0.2] and said == kind
            assert (share is None) if kind == "uniform" else share.tolist() == [0.1, 0.1]
    finally:
        plt.close("all")


def _counting_draws(fig) -> list:
    """fig.draw_without_rendering wrapped to record each call; returns the list it appends to."""
    calls: list = []
    draw = fig.draw_without_rendering
    fig.draw_without_rendering = lambda: (calls.append(1), draw())[1]
    return calls


def test_fitters_draw_once_where_nothing_changed_and_measure_what_a_fresh_draw_does():
    """Speed 18: the fitters called in turn drew the figure again and again with nothing changed (fit_labels drew it
    three times). A figure whose title and y label fit is drawn once by fit_labels and fit_figure_labels together,
    and saves the same PNG as the same figure never fitted; after a change it is drawn again, and each extent read
    equals a fresh figure's, drawn in full."""
    from headscope.reports.plots import drawn, fit_figure_labels, fit_labels

    def make(title):
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot([0, 1], [0, 1])
        ax.set(title=title, ylabel="y", xlabel="x")
        fig.tight_layout()
        return fig, ax

    def png(fig):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=50)
        return buf.getvalue()

    try:
        fig, ax = make("short")
        calls = _counting_draws(fig)
        assert not fit_labels(ax) and fit_figure_labels(fig) is fig
        assert len(calls) == 1  # the old fitters: 3 (fit_title, fit_labels, fit_figure_labels)
        assert png(fig) == png(make("short")[0])
        ax.set_title("a title of another width")
        renderer = drawn(fig)
        assert len(calls) == 2
        fresh, fresh_ax = make("short")
        fresh_ax.set_title("a title of another width")
        fresh.draw_without_rendering()
        got = ax.title.get_window_extent(renderer).bounds
        assert got == fresh_ax.title.get_window_extent(fresh.canvas.get_renderer()).bounds
        constrained = plt.figure(layout="constrained")  # its layout runs at each draw: always drawn again
        calls = _counting_draws(constrained)
        drawn(constrained), drawn(constrained)
        assert len(calls) == 2
    finally:
        plt.close("all")


def test_rethin_until_settled_stops_once_the_blank_ticks_repeat():
    """The re-thinning loop fit_position_ticks and fit_budget_ticks share: refit runs until the blank tick labels after
    it are those before it, `tries` runs at the most; from None (nothing before) at least two. Hand-worked from the
    scripted blanks each run leaves."""
    from headscope.reports.plots import rethin_until_settled

    def run(blanks, tries, start):
        fig, ax = plt.subplots()
        ax.set_xticks(range(5), list("abcde"))
        script, runs = iter(blanks), []

        def refit():
            runs.append(1)
            gone = next(script)
            ax.set_xticks(range(5), ["" if i in gone else t for i, t in enumerate("abcde")])

        rethin_until_settled(ax, refit, tries, start)
        plt.close(fig)
        return len(runs)

    assert run([[1], [1, 3], [1, 3], [0]], 4, None) == 3
    assert run([[1], [1, 3], [1, 3]], 4, [1]) == 1
    assert run([[1], [2], [3], [4]], 3, None) == 3  # never settles: `tries` runs at the most
    assert run([[1], [1]], 4, None) == 2  # from None: twice at the least
