"""Reviews 18a/18d/18v on the top_attention, roles, pruning_curve and l0 figures and the sink heads' words: keys outside a
sliding window hatched (not drawn as 0 attention), role scores no head passes called what they are, induction signed,
"1 random order" where there is one, an evenly wrapped l0 title, and which queries a windowed sink head averages over."""
from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch


def _data(n_tokens, windows=None, positions=None, scores=None, is_encoder=False):
    """The explorer's dict (scale 100) for 2 layers x 2 heads, uniform causal patterns on `n_tokens` tokens."""
    rows = [[100 // (q + 1)] * (q + 1) for q in range(n_tokens)]  # [query][key]
    ex = {"tokens": [f"t{i}" for i in range(n_tokens)], "patterns": [[rows, rows], [rows, rows]]}
    if positions is not None:
        ex["positions"] = positions
    data = {"scale": 100, "is_encoder": is_encoder, "examples": [ex],
            "default_score": "importance (zero)", "scores": scores or {"importance (zero)": [[0.9, 0.1], [0.8, 0.2]]}}
    if windows is not None:
        data["windows"] = windows
    return data


def _hatched(ax):
    """(key, query) of each hatched cell the panel draws."""
    return sorted((int(p.get_x()), int(p.get_y())) for p in ax.patches if p.get_hatch())


def test_top_attention_hatches_the_keys_outside_a_sliding_window_and_says_so():
    """Reviews 18a C1, 18d C1: a window-masked key was drawn as white 0 attention, unhatched and unnamed. Layer 0 slides
    over 3 keys: on 6 tokens query q sees keys q-2..q, so (by hand) the masked cells are (q, k) = (3, 0), (4, 0), (4, 1),
    (5, 0), (5, 1), (5, 2); layer 1 (global) masks none. A cut example (positions 0, 5, 6, 7 of the prompt) masks by
    position: key 0 for the three later queries only."""
    from headscope.reports.findings import caption
    from headscope.reports.plots_attention import top_heads_figure

    masked = {(3, 0), (4, 0), (4, 1), (5, 0), (5, 1), (5, 2)}  # (query, key)
    fig = top_heads_figure(_data(6, windows=[3, None]), k=2)  # L0H0 0.9, L1H0 0.8
    try:
        panels = [ax for ax in fig.axes if ax.get_title().startswith("L")]
        assert [ax.get_title() for ax in panels] == ["L0H0 (importance (zero) 0.9)", "L1H0 (importance (zero) 0.8)"]
        drawn = panels[0].images[0].get_array()
        assert {(int(q), int(k)) for q, k in zip(*np.nonzero(np.ma.getmaskarray(drawn)))} == masked
        assert _hatched(panels[0]) == sorted((k, q) for q, k in masked)  # a patch over each masked cell
        assert not np.ma.getmaskarray(panels[1].images[0].get_array()).any() and not _hatched(panels[1])
        title = fig._suptitle.get_text().replace("\n", " ")
        assert "layer 0 slides over 3 keys; hatched: keys outside the window (masked, not zero attention)" in title
        assert ("On a sliding-window layer a hatched grey cell is a key outside the query's window (masked, not zero "
                "attention).") in caption("top_attention")
        plain = top_heads_figure(_data(6), k=2)  # no window: nothing hatched, no window line
        assert not any(_hatched(ax) for ax in plain.axes) and "hatched" not in plain._suptitle.get_text()
        cut = top_heads_figure(_data(4, windows=[3, None], positions=[0, 5, 6, 7]), k=1)
        assert _hatched(cut.axes[0]) == [(0, 1), (0, 2), (0, 3)]  # positions 5, 6, 7 see back to 3, 4, 5
    finally:
        plt.close("all")


def test_top_attention_by_a_role_score_no_head_passes_says_none_passes():
    """Review 18a B3: "top 4 heads by previous_token" at 0.11-0.15 while no head passes the role threshold (0.5,
    analyses/heads/roles.py): the title calls them the largest scores, none passing; with one head at 0.6 they are
    top heads again. Induction's threshold is 0.3, and a decoder's layer-0 head (0.6 here) is never an induction head."""
    from headscope.reports.plots_attention import top_heads_figure

    low = {"previous_token": [[0.15, 0.11], [0.13, 0.12]]}
    fig = top_heads_figure(_data(3, scores=low), score="previous_token", k=2)
    passing = top_heads_figure(_data(3, scores={"previous_token": [[0.15, 0.6], [0.13, 0.12]]}), score="previous_token",
                               k=2)
    induction = {"induction": [[0.6, 0.1], [0.2, -0.25]]}
    layer0 = top_heads_figure(_data(3, scores=induction), score="induction", k=2)
    encoder = top_heads_figure(_data(3, scores=induction, is_encoder=True), score="induction", k=2)
    try:
        assert fig._suptitle.get_text().replace("\n", " ") == (
            "the 2 largest previous_token scores (none passes the role threshold 0.5): attention on example 1")
        assert passing._suptitle.get_text() == "top 2 heads by previous_token: attention on example 1"
        assert "none passes the role threshold 0.3" in layer0._suptitle.get_text().replace("\n", " ")
        assert encoder._suptitle.get_text().startswith("top 2 heads by induction")  # an encoder's layer 0 counts
    finally:
        plt.close("all")


def test_roles_draw_a_negative_induction_score_blue_not_clipped_to_white():
    """Review 18a C2: L2H3's induction -0.233 was clipped to 0 (white) on the sequential map. Induction has its own
    diverging map from -1 to 1: its cell has the colour RdBu_r gives (-0.233 + 1) / 2, blue; the other roles stay
    on the sequential map from 0 (the first mesh)."""
    from matplotlib import colormaps

    from headscope.reports.plots import DIVERGING, SEQUENTIAL
    from headscope.reports.plots_heads import CAPTIONS, plot_roles

    roles = pd.DataFrame([{"layer": 0, "head": h, "positional": 0.1, "sink": 0.2, "previous_token": 0.05,
                           "induction": v, "confidence": 0.5} for h, v in enumerate((-0.233, 0.054))])
    try:
        ax = plot_roles(roles)
        first, second = ax.collections[:2]
        assert first.cmap.name == SEQUENTIAL and first.norm.vmin == 0
        assert second.cmap.name == DIVERGING and (second.norm.vmin, second.norm.vmax) == (-1, 1)
        faces = second.get_facecolors().reshape(2, 5, 4)[:, 3]  # [head, rgba]: the induction column (the 4th of 5)
        np.testing.assert_allclose(faces[0][:3], colormaps["RdBu_r"]((-0.233 + 1) / 2)[:3], atol=1e-6)
        np.testing.assert_allclose(faces[1][:3], colormaps["RdBu_r"]((0.054 + 1) / 2)[:3], atol=1e-6)
        assert faces[0][2] > faces[0][0] + 0.1  # blue, not the white of 0
        assert "below 0 is drawn as 0" not in CAPTIONS["roles"] and "centred on 0" in CAPTIONS["roles"]
    finally:
        plt.close("all")


def _curve(seeds):
    rows = []
    for ordering, seed_list in (("gradient", [0]), ("random", seeds)):
        for seed in seed_list:
            for n in (0, 1, 2):
                rows.append({"ordering": ordering, "recompute": False, "seed": seed, "n_pruned": n,
                             "fraction_pruned": n / 4, "metric": 2.0 - 0.1 * n * (seed + 1), "pruned": ""})
    return pd.DataFrame(rows)


def test_pruning_curve_with_one_random_order_says_so_not_a_range_over_seeds():
    """Review 18d C3: the budget cut the random orders to 1, and the title still said "random: range over seeds"."""
    from headscope.reports.plots_heads import plot_pruning_curve

    try:
        one = plot_pruning_curve(_curve([0]), metric="logit_diff", baseline=2.0)
        two = plot_pruning_curve(_curve([0, 1]), metric="logit_diff", baseline=2.0)
        assert one.get_title() == "iterative head pruning (1 random order, no range)"
        assert two.get_title() == "iterative head pruning (random: range over seeds)"
    finally:
        plt.close("all")


def test_l0_title_is_wrapped_evenly_with_no_lone_word():
    """Review 18v C2 (slm_bf16's l0.png): "L0 head pruning on 8 held-out / examples / (gates fitted on 8 others; bars:
    95% / CI)". After the report's fitting (plot_result), no title line is under half the longest, and the words
    are all there in order."""
    from headscope.analyses.core.result import Result
    from headscope.reports.plots import plot_result

    sweep = pd.DataFrame({"lambda": [0.03], "heads_kept": [18], "fraction_kept": [1.0], "metric": [4.2123],
                          "metric_binary": [4.2142], "change": [0.0], "change_ci_low": [0.0], "change_ci_high": [0.0],
                          "gates_change": [-0.00195], "gates_change_ci_low": [-0.0077], "gates_change_ci_high": [0.0038],
                          "unpruned": [4.2142], "n_examples": [8], "split": ["held_out"], "in_sample_reason": [""],
                          "n_train": [8]})
    result = Result(name="heads", df=pd.DataFrame(), summary={"metric": "logit_diff", "baseline_metric": 3.17},
                    tables={"l0": sweep})
    figs = plot_result(result)
    try:
        lines = figs["l0"].axes[0].get_title().split("\n")
        assert " ".join(lines) == "L0 head pruning on 8 held-out examples (gates fitted on 8 others; bars: 95% CI)"
        assert len(lines) > 1 and min(map(len, lines)) >= max(map(len, lines)) / 2, lines
    finally:
        plt.close("all")


def _windowed_model(n_layers=2, window=8, types=("sliding_attention", "full_attention")):
    """What roles.sink_uniform reads of a model: its facts and its Hugging Face config's windows (Gemma 2's layout)."""
    config = SimpleNamespace(sliding_window=window, layer_types=list(types))
    return SimpleNamespace(facts=SimpleNamespace(n_layers=n_layers, is_encoder=False),
                           bridge=SimpleNamespace(original_model=SimpleNamespace(config=config)))


def test_sink_uniform_is_the_mean_of_one_over_the_keys_seen_over_the_sink_queries():
    """By hand: a uniform head puts 1/(r + 1) on the first token at r positions after it. Layer 0 slides over 8 keys, so
    its sink averages over r = 1..7 on each row: mean(1/2 .. 1/8) = 0.2454; layer 1 (global) over r = 1..13 on a row of
    14 and r = 1..10 on a row left-padded by 3, pooled."""
    from headscope.analyses.heads.roles import role_windows, sink_uniform

    tokens = torch.zeros(2, 14, dtype=torch.long)
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[1, :3] = 0
    got = sink_uniform(_windowed_model(), tokens, mask)
    local = np.mean([1 / (r + 1) for r in range(1, 8)])
    glob = np.mean([1 / (r + 1) for r in range(1, 14)] + [1 / (r + 1) for r in range(1, 11)])
    assert got == pytest.approx([local, glob], abs=1e-6) and local == pytest.approx(0.2454, abs=1e-4)
    roles = pd.DataFrame({"layer": [0, 1], "head": [0, 0], "window": [8.0, float("nan")], "induction": [0.0, 0.0],
                          "induction_length": 4, "induction_cut": True, "longest_prompt": 14})
    assert role_windows(roles, got)["role_windows"]["sink_uniform"] == {"0": round(local, 4), "1": round(glob, 4)}


def test_sink_heads_on_sliding_window_layers_say_which_queries_and_the_uniform_share():
    """Review 18v B1b (neo_f32): 6 of the 7 sink heads are on layers 1 and 3 (window 8), whose sink averages over
    queries 1-7 only; uniform there 0.2454 against 0.1200 on the global layers, so the 0.5 threshold is 0.5 / 0.2454
    = 2.0x uniform there and 0.5 / 0.12 = 4.2x on the global layers."""
    from headscope.reports.heads_words import finding

    sinks = ["L1H1", "L1H2", "L1H3", "L1H4", "L2H1", "L3H1", "L3H5"]
    windows = {"windows": {"1": 8, "3": 8}, "induction_length": 4, "induction_unmeasurable": [], "induction_cut": True,
               "longest_prompt": 36, "sink_uniform": {"0": 0.12, "1": 0.2454, "2": 0.12, "3": 0.2454}}
    summary = {"n_layers": 4, "roles": {"sink": sinks}, "role_windows": windows}
    words = finding(summary)
    assert ("6 of the 7 sink heads (L1H1, L1H2, L1H3, ...) are on sliding-window layers 1 and 3 (a window of 8), "
            "where that average covers only queries 1-7 after the first token, those whose window holds it: a uniform "
            "head puts 0.245 of its attention there, against 0.12 on the global layers, so the one threshold (0.5) is "
            "2.0x uniform there and 4.2x on the global layers.") in words
    older = {**summary, "role_windows": {k: v for k, v in windows.items() if k != "sink_uniform"}}
    assert "covers only queries 1-7 after the first token, those whose window holds it." in finding(older)
    wide = {**summary, "role_windows": {**windows, "longest_prompt": 8}}  # a window as long as every prompt hides nothing
    assert "sliding-window" not in finding(wide)
    global_only = {**summary, "roles": {"sink": ["L2H1"]}}
    assert "sliding-window layers" not in finding(global_only)
