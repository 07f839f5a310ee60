"""Review 15c C1, B3: compare on a bfloat16 copy of a float32 model folder (one model in two dtypes)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from headscope.models.fingerprint import folder_fingerprint, rounded_fingerprint
from headscope.reports import io
from headscope.reports.compare import settings_notes
from headscope.reports.compare_headlines import headline_notes
from headscope.reports.compare_run import ROUNDING, SAME, Run, models_differ, precision_only, rounding_premise

NO_STEP = "; neither run records this number's rounding step, so the move is not set against one."  # review 19e B3


def _folders(root):
    """./fp32 (float32 weights, a 0-dim parameter among them), ./bf16 (the same cast to bfloat16: round to nearest
    even) and ./other (fp32 with its first row moved by 1, far past bfloat16's step)."""
    gen = torch.Generator().manual_seed(0)
    weights = {"emb.weight": torch.randn(40, 8, generator=gen), "ln.bias": torch.randn(8, generator=gen),
               "pos_ids": torch.arange(5), "mlp.act_fn.alpha_p": torch.tensor(0.8)}  # 0-dim: Apertus' xIELU (20b A1)
    other = {**weights, "emb.weight": weights["emb.weight"].clone()}
    other["emb.weight"][0] += 1.0
    for name, tensors in (("fp32", weights), ("other", other),
                          ("bf16", {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()})):
        (root / name).mkdir()
        save_file(tensors, str(root / name / "model.safetensors"))
    return root / "fp32", root / "bf16", root / "other"


def test_rounded_fingerprint_matches_a_dtype_copy(tmp_path):
    fp32, bf16, other = _folders(tmp_path)
    assert folder_fingerprint(fp32) != folder_fingerprint(bf16)  # the bytes differ: --resume's fingerprint tells them apart
    assert rounded_fingerprint(fp32, "bfloat16") == rounded_fingerprint(bf16, "bfloat16")
    assert rounded_fingerprint(fp32, "float32") != rounded_fingerprint(bf16, "float32")  # float32 keeps the lost bits
    assert rounded_fingerprint(other, "bfloat16") != rounded_fingerprint(fp32, "bfloat16")
    assert rounded_fingerprint(tmp_path, "bfloat16") is None  # no safetensors weights


def _run(root, folder, dtype, summary, rows=(0, 2, 5, 7)):
    io.write_json(root / "manifest.json", {
        "model": {"name": f"./{folder.name}", "source": str(folder)}, "seed": 0,
        "config": {"analyses": ["attribution"], "task": "fill.csv", "dtype": dtype, "quick": True, "n_examples": None}})
    io.write_json(root / "attribution" / "summary.json", summary)
    io.write_json(root / "attribution" / "task.json", {"task": "fill", "source": "your task (fill.csv)", "n_examples": 4,
                                                       "rows": list(rows), "sample": {"prompt": "Ann has a <mask> hat."}})
    return Run(root)


TAU = {"n_examples": 4, "mean_tau_attention_gradient": 0.4, "std_tau_attention_gradient": 0.2}


def test_compare_calls_a_dtype_copy_one_model_and_its_differences_rounding(tmp_path):
    """Review 15c C1: ./fp32 and its bfloat16 copy ./bf16 were 'different models' (prunable counts not compared);
    B3: a tau that moved by bfloat16 rounding on the same 4 rows was judged by the rows' sampling intervals."""
    fp32, bf16, other = _folders(tmp_path)
    a = _run(tmp_path / "a", fp32, "float32", TAU)
    b = _run(tmp_path / "b", bf16, "bfloat16", {**TAU, "mean_tau_attention_gradient": 0.375})
    c = _run(tmp_path / "c", other, "bfloat16", {**TAU, "mean_tau_attention_gradient": 0.375})
    assert models_differ(a, b) == "" and precision_only(a, b) == (0, 1)
    assert models_differ(a, c) == "different models (./fp32 vs ./other)" and precision_only(a, c) is None
    assert [n for n in settings_notes(a, b, ["attribution"]) if n.startswith("model:")] == [
        "model: A ./fp32, B ./bf16 (the same model in another dtype: the two folders hold the same weights once rounded "
        "to bfloat16, safetensors tensors compared by name, shape and sampled rows)."]
    assert [n for n in settings_notes(a, c, ["attribution"]) if n.startswith("model:")] == ["model: A ./fp32, B ./other."]
    tau = [n for n in headline_notes(a, b) if "gradient x input" in n]
    # review 17b B1: a short note in the page's rounding group, whose premise (rounding_premise) the page says once
    assert tau == [ROUNDING + "attribution mean Kendall tau of attention and gradient x input: A 0.4, B 0.375, |B - A| "
                   "= 0.025 (n 4 each)" + NO_STEP]
    assert rounding_premise(a, b) == (
        "Moved by bfloat16's rounding: A and B are one model on the same examples in two dtypes (A float32, B "
        "bfloat16), so each |B - A| below is what bfloat16's rounding does to that number, not sampling noise (the "
        "examples' sampling intervals do not judge it), set against its rounding step where the run records one; "
        "largest move relative to the number's size first:")
    same = [n for n in headline_notes(a, _run(tmp_path / "d", bf16, "bfloat16", TAU)) if "gradient x input" in n]
    assert same == [SAME + "attribution mean Kendall tau of attention and gradient x input: A 0.4, B 0.4 (n 4 each) (the "
                    "same value in both dtypes (A float32, B bfloat16), one model on the same examples: bfloat16's "
                    "rounding does not move it)."]
    other_rows = _run(tmp_path / "e", bf16, "bfloat16", {**TAU, "mean_tau_attention_gradient": 0.375}, rows=(1, 2, 5, 7))
    assert "within noise" in [n for n in headline_notes(a, other_rows) if "gradient x input" in n][0]  # other rows: sampling


def _pale(colour):
    """A colour blended MUTE (0.7) of the way to white, by hand."""
    return tuple(0.3 * c + 0.7 for c in colour[:3])


def _heads(root, degenerate: bool, ablation: bool = False):
    import pandas as pd

    io.write_json(root / "manifest.json", {"model": {"name": "m"}, "seed": 0, "config": {"analyses": ["heads"]}})
    io.write_csv(root / "heads" / "results.csv", pd.DataFrame(
        [{"layer": l, "head": h, "method": "gradient", "importance": 1.0 + l + h, "importance_layer_norm": 0.0}
         for l in range(2) for h in range(2)]))
    io.write_csv(root / "heads" / "curve.csv", pd.DataFrame({
        "ordering": ["gradient"] * 3 + ["ablation"] * 3, "recompute": False, "seed": 0,
        "fraction_pruned": [0.0, 0.5, 1.0] * 2, "metric": [1.0, 0.9, 0.4, 1.0, 0.95, 0.4]}))
    io.write_json(root / "heads" / "summary.json", {"metric": "cosine", "baseline_metric": 1.0, "n_heads": 4, **(
        {"degenerate_gradient": "every head's |gradient importance| is below 0.016, under the numerical floor"}
        if degenerate else {}), **({"degenerate_zero": "every head's |zero importance| is under the floor"} if ablation else {})})
    return Run(root)


def test_rounding_gradient_is_drawn_pale_in_compare_and_the_pruning_curve(tmp_path):
    """Review 15c C2: B's gradient importance, rounding by its own report, was an ordinary heat map on the compare
    page and an ordinary line in the overlay and in pruning_curve.png, beside a finding calling it rounding."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns
    from matplotlib.colors import to_rgba

    from headscope.reports.compare_heads import importance_figure
    from headscope.reports.compare_pruning import pruning_section
    from headscope.reports.plots_heads import pruning_figure

    a, b = _heads(tmp_path / "a", False), _heads(tmp_path / "b", True)
    fig = importance_figure(a, b)[0]
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[:2] == ["A: gradient importance", "B: gradient importance\n(pale: gradient importance whose\n"
                          "predicted loss changes are under the\nrounding floor)"]
    plt.close(fig)
    made = []
    real = plt.subplots
    try:  # the overlay's figure, kept open to read its lines
        plt.subplots = lambda *x, **k: made.append(real(*x, **k)) or made[-1]
        pruning_section(a, b)
    finally:
        plt.subplots = real
    lines = {str(line.get_label()): to_rgba(line.get_color())[:3] for line in made[0][1].get_lines()}
    first = sns.color_palette(n_colors=2)[0]  # the overlay's colour of its first key, gradient
    assert lines["A: gradient"] == tuple(first)
    assert lines["B: gradient: predicted loss changes under\nthe floor (pale)"] == pytest.approx(_pale(first))
    plt.close("all")
    curve = pd.read_csv(tmp_path / "b" / "heads" / "curve.csv")
    fig = pruning_figure(curve, metric="cosine", baseline=1.0, rounding={"gradient"})
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    # review 15a B2: the gradients are measured; what lies under the floor is the loss change they predict
    assert "gradient:\npredicted loss changes under the floor (pale)" in legend and "ablation" in legend
    drawn = {to_rgba(line.get_color())[:3] for line in fig.axes[0].get_lines()}
    assert any(max(abs(x - y) for x, y in zip(d, _pale(first))) < 1e-9 for d in drawn)  # the gradient line, pale
    assert tuple(first) not in drawn  # and nowhere at full colour
    plt.close(fig)


def test_pale_overlay_legend_breaks_its_labels_between_words(tmp_path):
    """The overlay's legend for B's gradient and ablation orderings, both rounding by B's report: the pruning curve's
    words (pale_line) in two lines, broken after a word; ablation's as before 986d333 ("rounding, not a\nmeasurement"
    came of a chain of replaces that counted spaces)."""
    import matplotlib.pyplot as plt

    from headscope.reports.compare_pruning import pruning_section
    from headscope.reports.plots_heads import pale_line

    made = []
    real = plt.subplots
    try:  # the overlay's figure, kept to read its legend
        plt.subplots = lambda *x, **k: made.append(real(*x, **k)) or made[-1]
        pruning_section(_heads(tmp_path / "a", False), _heads(tmp_path / "b", True, ablation=True))
    finally:
        plt.subplots = real
    texts = [t.get_text() for t in made[0][1].get_legend().get_texts()]
    pale = ["B: gradient: predicted loss changes under\nthe floor (pale)", "B: ablation: rounding, not\na measurement (pale)"]
    assert [t for t in texts if t.startswith("B: ")] == pale and "A: ablation" in texts
    assert [t.split(": ", 2)[2].replace("\n", " ") for t in pale] == [pale_line("gradient"), pale_line("ablation")]
    plt.close("all")


def test_a_rounding_difference_is_judged_against_the_lower_dtypes_recorded_rounding_step(tmp_path):
    """Review 15c B3: where the lower precision's summary records the number's rounding (heads' noise_floor: one
    bfloat16 step of the metric, 2**-7 at 1), the difference is set against it, not against the rows' intervals."""
    fp32, bf16, _ = _folders(tmp_path)
    heads = {"metric": "cosine", "n_examples": 4, "chance": {"mean": 0.0, "ci": [-0.1, 0.1]}}
    notes = {}
    for side, folder, dtype, value in (("a", fp32, "float32", 1.0), ("b", bf16, "bfloat16", 0.995),
                                       ("c", bf16, "bfloat16", 0.98)):
        root = tmp_path / side
        _run(root, folder, dtype, TAU)
        io.write_json(root / "heads" / "summary.json", {**heads, "baseline_metric": value, "noise_floor": 2 ** -7})
        io.write_json(root / "heads" / "task.json", {"task": "fill", "source": "your task (fill.csv)", "n_examples": 4,
                                                     "rows": [0, 2, 5, 7], "sample": {"prompt": "Ann has a <mask> hat."}})
        notes[side] = Run(root)
    start = ("heads unpruned cosine similarity: A 1, B {} (n 4 each) (a rounding difference, not sampling noise: one "
             "model on the same examples, run in two dtypes (A float32, B bfloat16), so |B - A| = {} is what bfloat16's "
             "rounding does to this number; the examples' sampling intervals do not judge it; ")
    within = [n for n in headline_notes(notes["a"], notes["b"]) if "heads unpruned" in n]
    assert within == [ROUNDING + "heads unpruned cosine similarity: A 1, B 0.995, |B - A| = 0.005 (n 4 each); within "
                      "bfloat16's rounding step of it (0.0078)."]
    beyond = [n for n in headline_notes(notes["a"], notes["c"]) if n.startswith("heads unpruned")]
    assert beyond == [start.format("0.98", "0.02") + "more than bfloat16's rounding step of it (0.0078): the precision "
                      "changes the computation here, not only its rounding)."]


def _heads_run(root, folder, dtype, grid, summary):
    """A heads run of `folder` at `dtype`: gradient importance `grid` ([2][2], se 0.01 each) on rows 0, 2, 5, 7."""
    import pandas as pd

    io.write_json(root / "manifest.json", {
        "model": {"name": f"./{folder.name}", "source": str(folder)}, "seed": 0,
        "config": {"analyses": ["heads"], "task": "fill.csv", "dtype": dtype, "quick": True, "n_examples": None}})
    io.write_csv(root / "heads" / "results.csv", pd.DataFrame([
        {"layer": l, "head": h, "method": "gradient", "importance": grid[l][h], "importance_se": 0.01}
        for l in range(2) for h in range(2)]))
    io.write_json(root / "heads" / "summary.json", {"metric": "logprob", "baseline_metric": -0.003, "n_heads": 4,
                                                    "n_examples": 4, **summary})
    io.write_json(root / "heads" / "task.json", {"task": "fill", "source": "your task (fill.csv)", "n_examples": 4,
                                                 "rows": [0, 2, 5, 7], "sample": {"prompt": "Ann has a <mask> hat."}})
    return Run(root)


def test_compare_band_of_a_dtype_copy_says_its_measured_gradient_rounding_leaves_the_weights_out(tmp_path):
    """Review 15cv A1: B's gradient rounding 6.5e-05 is measured against float32 on B's own bfloat16 weights (the
    arithmetic only), beside a B - A of 7.65e-05 that also holds the weights' rounding. For one model in two dtypes on
    the same rows all of B - A is bfloat16's rounding, said so; the band names B's figure as arithmetic only. Largest
    |B - A| by hand: |0.003694 - 0.0037705| = 7.65e-05."""
    from headscope.reports.compare_heads import importance_figure

    fp32, bf16, other = _folders(tmp_path)
    base = [[0.0037705, 0.0011], [0.0028650, 0.0005]]
    moved = [[0.003694, 0.00111], [0.002836, 0.0005]]
    a = _heads_run(tmp_path / "a", fp32, "float32", base,
                   {"rounding_gradient": 3.3e-09, "rounding_gradient_source": "analytic"})
    b = _heads_run(tmp_path / "b", bf16, "bfloat16", moved,
                   {"rounding_gradient": 6.5e-05, "rounding_gradient_source": "measured"})
    rule = next(n for n in importance_figure(a, b)[1] if "B - A head importance" in n)
    assert "(A 3.3e-09 (analytic), B 6.5e-05 (measured: arithmetic only, against float32 on its own rounded weights))" in rule
    assert rule.endswith("(largest |B - A| 7.65e-05). One model on the same examples run in two dtypes (A float32, "
                         "B bfloat16): all of B - A is bfloat16's rounding, of the weights and of the arithmetic, not "
                         "sampling noise; a gradient rounding measured against float32 on a run's own rounded weights "
                         "covers the arithmetic only.")
    c = _heads_run(tmp_path / "c", other, "bfloat16", moved,
                   {"rounding_gradient": 6.5e-05, "rounding_gradient_source": "measured"})
    rule = next(n for n in importance_figure(a, c)[1] if "B - A head importance" in n)  # other weights: no such words
    assert "B 6.5e-05 (measured))" in rule and "two dtypes" not in rule


PERM = {"n_examples": 4, "permutation_layer": 2, "permutation_metric_change": -2.51, "permutation_metric_change_n": 4,
        "permutation_metric_change_sd": 1.4}


def test_a_dtype_pair_whose_settings_differ_is_not_called_rounding(tmp_path):
    """Review 16c C1: B's budget cut n_permutations 20 -> 10 (A ran the preset 20); compare called the permutation
    means' gap 'a rounding difference' though they average different numbers of random permutations."""
    from headscope.reports.compare_run import settings_apart

    fp32, bf16, _ = _folders(tmp_path)
    a = _run(tmp_path / "a", fp32, "float32", PERM)
    cut = {**PERM, "permutation_metric_change": -2.56, "budget": {"changed": {"n_permutations": [20, 10]}}}
    b = _run(tmp_path / "b", bf16, "bfloat16", cut)
    assert settings_apart(a, b, "attribution") == "n_permutations A 20, B 10"
    [note] = [n for n in headline_notes(a, b) if "permutation test: mean change" in n]
    assert "(a rounding difference" not in note and not note.startswith(SAME)
    assert note == ("attribution permutation test: mean change of the metric: A -2.51, B -2.56 (n 4 each) (not "
                    "a rounding difference alone: one model on the same examples in two dtypes (A float32, B bfloat16), "
                    "but the two runs' attribution settings differ (n_permutations A 20, B 10), so |B - A| = 0.05 is "
                    "bfloat16's rounding and the settings together, which neither run measures apart; the examples' "
                    "sampling intervals do not judge it)."), note
    same_cut = _run(tmp_path / "c", fp32, "float32", {**PERM, "budget": {"changed": {"n_permutations": [20, 10]}}})
    assert settings_apart(same_cut, b, "attribution") == ""  # the same change in both: the same settings
    [note] = [n for n in headline_notes(same_cut, b) if "permutation test: mean change" in n]
    assert note.startswith(ROUNDING) and "|B - A| = 0.05" in note


def test_the_settings_caveat_covers_only_the_numbers_the_differing_setting_feeds(tmp_path):
    """Review 16cv B3: n_permutations 20 vs 10 was cited beside the gradient x input tau, which uses no permutations:
    that tau's gap is bfloat16's rounding alone; the permutation mean keeps the caveat."""
    fp32, bf16, _ = _folders(tmp_path)
    a = _run(tmp_path / "a", fp32, "float32", {**PERM, **TAU})
    b = _run(tmp_path / "b", bf16, "bfloat16", {**PERM, **TAU, "mean_tau_attention_gradient": 0.375,
                                                  "budget": {"changed": {"n_permutations": [20, 10]}}})
    notes = headline_notes(a, b)
    [tau] = [n for n in notes if "gradient x input" in n]
    assert tau.startswith(ROUNDING) and "settings differ" not in tau, tau
    [perm] = [n for n in notes if "permutation test: mean change" in n]
    assert "settings differ (n_permutations A 20, B 10)" in perm


def _mlp_run(root, folder, dtype, others_k):
    """An mlp run on task fill: layer 1 agrees on 41 of 192 neurons, layers 0 and 2 on others_k of 384 together
    (review 16a B1's counts: 51 in float32, 52 in bfloat16)."""
    counts = {"0": others_k - 20, "1": 41, "2": 20}
    io.write_json(root / "manifest.json", {
        "model": {"name": f"./{folder.name}", "source": str(folder)}, "seed": 0,
        "config": {"analyses": ["mlp"], "task": "fill.csv", "dtype": dtype, "quick": True, "n_examples": None}})
    io.write_json(root / "mlp" / "summary.json", {
        "agreement_per_layer": {k: v / 192 for k, v in counts.items()}, "agreement_count_per_layer": counts,
        "agreement_shuffled_count_per_layer": {"0": 10, "1": 10, "2": 10},
        "agreement_shuffled_per_layer": {k: 10 / 192 for k in counts}, "n_neurons_per_layer": 192, "n_prefixes": 374})
    io.write_json(root / "mlp" / "task.json", {"task": "fill", "source": "your task (fill.csv)", "n_examples": 16,
                                               "rows": list(range(16)), "sample": {"prompt": "Ann has a <mask> hat."}})
    return Run(root)


def test_mlp_between_layer_flip_on_a_dtype_pair_is_rounding_and_marginal_is_said(tmp_path):
    """Review 16a B1: p_Bonferroni 0.047 (float32) against 0.066 (bfloat16) on the same pooled counts was listed as a
    difference in the model, and the float32 finding said "the layers differ" at 0.047 without "marginally". Fisher's
    exact test by scipy on 41 of 192 against 51 (52) of 384."""
    from scipy.stats import fisher_exact

    from headscope.reports.findings import finding

    p_a, p_b = fisher_exact([[41, 151], [51, 333]])[1], fisher_exact([[41, 151], [52, 332]])[1]
    assert 0.01 < 3 * p_a < 0.05 < 3 * p_b  # the premise: the two corrected p's either side of 0.05
    fp32, bf16, _ = _folders(tmp_path)
    a, b = _mlp_run(tmp_path / "a", fp32, "float32", 51), _mlp_run(tmp_path / "b", bf16, "bfloat16", 52)
    assert (f"(51 of 384) p = {p_a:.2g} (p_Bonferroni = {3 * p_a:.2g} for picking the best of 3 layers), so the layers "
            "differ, marginally (corrected p between 0.01 and 0.05)") in finding("mlp", a.summary("mlp"))
    [note] = [n for n in headline_notes(a, b) if n.startswith("mlp between-layer")]
    assert note == (f"mlp between-layer agreement: A layer 1 against the others pooled: the layers differ, marginally "
                    f"(p = {p_a:.2g}, p_Bonferroni = {3 * p_a:.2g} over 3 layers), B layer 1 against the others pooled: "
                    f"the layers cannot be told apart (p = {p_b:.2g}, p_Bonferroni = {3 * p_b:.2g} over 3 layers) (a "
                    "rounding difference, not sampling noise: one model on the same examples, run in two dtypes (A "
                    "float32, B bfloat16), so the verdict moved with bfloat16's rounding, a test near its threshold on "
                    "either side of it)."), note


def _patching_run(root, folder, dtype, summary):
    io.write_json(root / "manifest.json", {
        "model": {"name": f"./{folder.name}", "source": str(folder)}, "seed": 0,
        "config": {"analyses": ["patching"], "task": "fill.csv", "dtype": dtype, "quick": True, "n_examples": None}})
    io.write_json(root / "patching" / "summary.json", {"metric": "logit_diff", "n_examples": 8, "metric_n": 8,
                                                       "normalized": False, **summary})
    io.write_json(root / "patching" / "task.json", {"task": "fill", "source": "your task (fill.csv)", "n_examples": 8,
                                                    "rows": list(range(8)), "sample": {"prompt": "Ann has a <mask> hat."}})
    return Run(root)


NOT_TRACED = {"not_run": "the task marks no subject span to noise, and the model's tokenizer does not cover the zoo "
                         "vocabulary for the zoo facts task, the one traced instead (causal tracing runs only on prompts "
                         "with a subject span)"}


def test_a_budget_change_to_causal_tracing_that_runs_in_neither_run_is_no_setting(tmp_path):
    """Review 17a A2: causal tracing never ran on the user's task (no subject span), yet the budgets' trace_samples
    None -> 1 (A) and None -> 0 (B) were listed as settings that differ and blamed, with the rounding, for the clean
    prompts' logit difference (3.918648 against 3.919922), which no tracing setting could move."""
    from headscope.reports.compare_run import settings_apart

    fp32, bf16, _ = _folders(tmp_path)
    ends = {"clean_metric_ci": [2.0, 6.0], "corrupted_metric_ci": [-6.0, -2.0]}
    old = [_patching_run(tmp_path / side, folder, dtype, {  # older summaries: no causal_tracing record at all
        "clean_metric": clean, "corrupted_metric": -4.33, **ends, "budget": {"changed": {"trace_samples": [None, k]}}})
        for side, folder, dtype, clean, k in (("a", fp32, "float32", 3.918648, 1), ("b", bf16, "bfloat16", 3.919922, 0))]
    new = [_patching_run(tmp_path / f"{side}2", folder, dtype, {
        "clean_metric": clean, "corrupted_metric": -4.33, **ends, "causal_tracing": NOT_TRACED})
        for side, folder, dtype, clean in (("a", fp32, "float32", 3.918648), ("b", bf16, "bfloat16", 3.919922))]
    for a, b in (old, new):
        assert settings_apart(a, b, "patching") == ""
        assert [n for n in settings_notes(a, b, ["patching"]) if "budget" in n] == []
        [clean] = [n for n in headline_notes(a, b) if "clean prompts'" in n]
        assert clean == (SAME + "patching clean prompts' logit difference: A 3.91865, B 3.91992 (n 8 each): equal at "
                         "the shown precision (3 significant figures), moved below it by bfloat16's rounding; within "
                         "bfloat16's rounding step of it (0.0338: one bfloat16 rounding step of the metric at 4.33, the "
                         "clean and corrupted metrics' size; neither run records a rounding floor)."), clean  # 2^-7 x 4.33
    # where one run traced, its budget's cut is a setting that differs
    traced = _patching_run(tmp_path / "c", fp32, "float32", {
        "clean_metric": 3.918648, "corrupted_metric": -4.33, **ends, "budget": {"changed": {"trace_samples": [None, 1]}},
        "causal_tracing": {"n_examples": 8, "clean_metric": 0.5, "corrupted_metric": 0.1}})
    assert settings_apart(traced, old[1], "patching") == "trace_samples A 1, B 0"
    assert [n for n in settings_notes(traced, old[1], ["patching"]) if "budget" in n] == [
        "patching budget changes: A trace_samples None -> 1, B trace_samples None -> 0."]


def _site(layer, effect, ci, head=None, pos=36, share_ci=None):
    return {"layer": layer, "head": head, "pos": None if head is not None else pos,
            "from_end": None if head is not None else -1, "token": "36:  to", "effect": effect, "ci": ci, "n": 8,
            **({"share_ci": share_ci} if share_ci else {})}


def _sites_summary(attn, head, mlp, clean, corrupted):
    return {"clean_metric": clean, "corrupted_metric": corrupted, "clean_metric_ci": [2.0, 6.0],
            "corrupted_metric_ci": [-6.0, -2.0], "rounding_floor": {"basis": "measured", "floor": 0.015625, "n_cells": 36},
            "top_sites": {"attn_out": attn, "head_out": head, "mlp_out": mlp}, "causal_tracing": NOT_TRACED}


def test_top_patching_sites_of_one_model_in_two_dtypes_are_judged_by_rounding_not_intervals(tmp_path):
    """Review 17a C1: attn_out L0 at +8.239 (float32) and +8.2246 (bfloat16), a quarter of one bfloat16 step at 8, was
    "beyond noise" by the examples' intervals; mlp_out L1 (-0.0214) against L2 (+0.0234), both intervals reaching 0,
    were "different sites"; two head_out cells that swap by less than the rounding floor were a differing top site."""
    import html
    import re

    import torch

    from headscope.reports.compare import patching_section

    # bfloat16 keeps 8 significand bits: at 8 its spacing is 2^(3 - 7) = 0.0625, by torch's own rounding
    assert float(torch.tensor(8.0625, dtype=torch.bfloat16)) == 8.0625
    assert float(torch.tensor(8.0 + 0.0625 * 0.49, dtype=torch.bfloat16)) == 8.0
    fp32, bf16, other = _folders(tmp_path)
    a = _patching_run(tmp_path / "a", fp32, "float32", _sites_summary(
        [_site(0, 8.239032, [3.68, 12.80], share_ci=[0.99762, 1.00111])],
        [_site(0, 0.50, [0.499, 0.501], head=5), _site(0, 0.49, [0.489, 0.491], head=1)],  # not tied by intervals
        [_site(0, 0.1224, [-0.21, 0.45]), _site(1, -0.021377, [-0.0547, 0.0119])], 3.918648, -4.325621))
    b = _patching_run(tmp_path / "b", bf16, "bfloat16", _sites_summary(
        [_site(0, 8.224609, [3.67, 12.78], share_ci=[0.99486, 0.99899])],
        [_site(0, 0.50, [0.499, 0.501], head=1), _site(0, 0.495, [0.494, 0.496], head=5)],
        [_site(0, 0.1348, [-0.20, 0.47]), _site(2, 0.0234375, [-0.0979, 0.1448])], 3.919922, -4.330078))
    table, notes = patching_section(a, b)
    verdicts = [html.unescape(re.findall(r"<td>(.*?)</td>", r)[-1]) for r in re.findall(r"<tr>(.*?)</tr>", table)[1:]]
    assert verdicts == [
        "the same cell; |B - A| = 0.0144 logit difference, bfloat16's rounding: within its step here (0.0625: one "
        "bfloat16 step at 8.24)",
        "different cells ranked apart by bfloat16's rounding: A's cell moves by 0.005 and B's by 0.01 logit difference "
        "between the runs, within its rounding step here (0.0156: the runs' rounding floor; one bfloat16 step at 0.5 is "
        "0.00391)",
        "different cells ranked apart by bfloat16's rounding: A's cell moves by 0.01 and B's by 0.005 logit difference "
        "between the runs, within its rounding step here (0.0156: the runs' rounding floor; one bfloat16 step at 0.5 is "
        "0.00391)",
        "the same cell; |B - A| = 0.0124 logit difference, bfloat16's rounding: within its step here (0.0156: the "
        "runs' rounding floor; one bfloat16 step at 0.135 is 0.000977)",
        "different cells, neither clear of 0 in its own run (each 95% CI reaches 0): no site in either run"], verdicts
    assert "one model on the same examples in two dtypes (A float32, B bfloat16)" in html.unescape(table)
    assert notes == ["(same) Top head_out site: A lists head_out L0 H5 first, B head_out L0 H1: not a difference: "
                     + verdicts[1] + "."]
    # another model (other weights): the examples' intervals judge it, as before
    c = _patching_run(tmp_path / "c", other, "bfloat16", b.summary("patching"))
    table, notes = patching_section(a, c)
    assert "beyond noise: not each inside the other's 95% interval" in html.unescape(table)
    # a move past the step is said as the precision's, not rounding
    moved = {**b.summary("patching"), "top_sites": {**b.summary("patching")["top_sites"],
                                                     "attn_out": [_site(0, 7.9, [3.6, 12.2], share_ci=[0.95, 0.97])]}}
    d = _patching_run(tmp_path / "d", bf16, "bfloat16", moved)
    assert ("beyond rounding: |B - A| = 0.339 logit difference, more than bfloat16's step here (0.0625: one bfloat16 "
            "step at 8.24): the precision changes the computation here, not only its rounding") in html.unescape(
        patching_section(a, d)[0])


def _kv_run(root, folder, dtype, ratios, masses):
    io.write_json(root / "manifest.json", {
        "model": {"name": f"./{folder.name}", "source": str(folder)}, "seed": 0,
        "config": {"analyses": ["kv"], "task": "fill.csv", "dtype": dtype, "quick": True, "n_examples": None}})
    io.write_json(root / "kv" / "summary.json", {
        "metric": "logit_diff", "n_examples": 16,
        "key_norm_ratios": [{"layer": k, "ratio": r, "ci": [r - 0.05, r + 0.05], "n": 16} for k, r in enumerate(ratios)],
        "sinks": [{"layer": k, "mass": m, "ci": [m - 0.01, m + 0.01], "n": 16, "uniform": 0.1, "ratio": m / 0.1,
                   "sink": False} for k, m in enumerate(masses)]})
    io.write_json(root / "kv" / "task.json", {"task": "fill", "source": "your task (fill.csv)", "n_examples": 16,
                                              "rows": list(range(16)), "sample": {"prompt": "Ann has a <mask> hat."}})
    return Run(root)


def test_per_layer_kv_rows_of_one_model_in_two_dtypes_are_rounding_not_sampling_noise(tmp_path):
    """Verification 17v C3: on a dtype pair the kv (and position) per-layer rows were judged "within noise" by the
    prompts' intervals, while every other row said those intervals do not judge a rounding difference. Now the same
    rule: a move visible at the shown 2 decimals is a rounding note, one below it is equal at the shown precision,
    with the digits that show it; another model's pair is still judged by the intervals."""
    from headscope.reports.compare_measures import NORM_LABEL, SINK_LABEL

    fp32, bf16, other = _folders(tmp_path)
    a = _kv_run(tmp_path / "a", fp32, "float32", [1.0391, 0.9744], [0.167575, 0.111397])
    b = _kv_run(tmp_path / "b", bf16, "bfloat16", [1.0389, 0.9757], [0.167620, 0.111708])
    notes = headline_notes(a, b)
    [norm] = [n for n in notes if NORM_LABEL in n]
    assert norm == (ROUNDING + f"{NORM_LABEL}: layer 1 moved most: A 0.974, B 0.976, |B - A| = 0.0013; every layer: "
                    "layer 0 A 1.04, B 1.04; layer 1 A 0.97, B 0.98 (n 16 prompts each).")
    [sink] = [n for n in notes if n.removeprefix(SAME).startswith(SINK_LABEL)]
    assert sink == (SAME + f"{SINK_LABEL}: equal in every layer at the shown precision (2 decimals), moved below it by "
                    "bfloat16's rounding (one model on the same prompts in two dtypes, A float32, B bfloat16; largest "
                    "|B - A| 0.00031, layer 1): layer 0 A 0.1675750, B 0.1676200; layer 1 A 0.111397, B 0.111708 (n "
                    "16 prompts each).")  # each |B - A| to 3 significant digits (patching_words.distinct_pair)
    assert not any("within noise" in n for n in (norm, sink))
    c = _kv_run(tmp_path / "c", other, "bfloat16", [1.0389, 0.9757], [0.167620, 0.111708])  # other weights
    [norm] = [n for n in headline_notes(a, c) if NORM_LABEL in n]
    assert norm.startswith(SAME + f"{NORM_LABEL}: within noise in every layer")


def test_the_page_lists_real_differences_first_and_rounding_moves_once_in_one_group(tmp_path):
    """Review 17b B1: 18 bfloat16 rounding moves, several printed equal ("A 10.2, B 10.2"), each with a 60-word note,
    buried the two real changes (taus 0.667 -> 0.417). The page says the premise once, lists the moves largest first by
    their size relative to the number (the 0.25 tau first), and a move below the printed precision under "Within
    noise or the same" with the digits that show it (10.2216 against 10.2324: |B - A| = 0.0108)."""
    import html
    import re

    from headscope.reports.compare import compare_html

    fp32, bf16, _ = _folders(tmp_path)
    taus = {"n_examples": 4, "std_tau_attention_gradient": 0.2, "std_tau_attention_loo": 0.2}
    a = _run(tmp_path / "a", fp32, "float32", {**taus, **PERM, "permutation_metric_change": 10.2216,
                                                "mean_tau_attention_gradient": 0.667, "mean_tau_attention_loo": 0.5})
    b = _run(tmp_path / "b", bf16, "bfloat16", {**taus, **PERM, "permutation_metric_change": 10.2324,
                                                 "mean_tau_attention_gradient": 0.417, "mean_tau_attention_loo": 0.514})
    page = html.unescape(compare_html(a, b))
    differences = page[page.index("<h2 id='differences'>"):page.index("<h2 id='same'>")]
    items = re.findall(r"<li>(.*?)</li>", differences)
    assert items[0] == "None beyond the rounding moves below."
    assert differences.count("Moved by bfloat16's rounding") == 1 and "so |B - A| = " not in differences
    assert items[1:] == [
        "attribution mean Kendall tau of attention and gradient x input: A 0.667, B 0.417, |B - A| = 0.25 (n 4 each)" + NO_STEP,
        "attribution mean Kendall tau of attention and leave-one-out: A 0.5, B 0.514, |B - A| = 0.014 (n 4 each)" + NO_STEP]
    same = page[page.index("<h2 id='same'>"):page.index("<h2 id='not-compared'>")]
    assert ("<li>attribution permutation test: mean change of the metric: A 10.2216, B 10.2324 (n 4 each): equal at "
            "the shown precision (3 significant figures), moved below it by bfloat16's rounding.</li>") in same
    assert abs(10.2324 - 10.2216 - 0.0108) < 1e-12 and f"{10.2216:.3g}" == f"{10.2324:.3g}"  # the premise, by hand


def test_settings_that_do_not_feed_the_unpruned_metric_or_an_r_leave_them_rounding(tmp_path):
    """Review 17d B2: B's budget cut pruning.n_random 2 -> 1, which the unpruned metric does not use: its gap on the
    same rows is bfloat16's rounding alone, no settings caveat. B3: the attribution-vs-exact r at head_out of one model
    in two dtypes over the same 24 cells was judged by Fisher intervals ("within noise"), the sampling of another set
    of examples; it is rounding as every other number of the pair, and B's path_patching off (which the r does not
    read) is no caveat beside it."""
    fp32, bf16, _ = _folders(tmp_path)
    heads = {"metric": "logit_diff", "n_examples": 4, "chance": {"mean": 0.0, "ci": [-0.1, 0.1]}}
    corr = {"head_out": {"n": 24, "n_nonzero": 19, "n_within_rounding": 0, "pearson": 0.758, "slope": 0.5,
                         "slope_ci": [0.4, 0.6], "slope_n": 24}}
    runs = {}
    for side, folder, dtype, value, r, budget in (("a", fp32, "float32", 2.9183, 0.758, {}),
                                                  ("b", bf16, "bfloat16", 2.921875, 0.769,
                                                   {"budget": {"changed": {"pruning.n_random": [2, 1]}}})):
        root = tmp_path / side
        _run(root, folder, dtype, TAU)
        io.write_json(root / "heads" / "summary.json", {**heads, "baseline_metric": value, **budget})
        patching = {"metric": "logit_diff", "n_examples": 4, **({"budget": {"changed": {"path_patching": [True, False]}}}
                                                                  if budget else {}),
                    "attribution_correlation": {"head_out": {**corr["head_out"], "pearson": r}}}
        io.write_json(root / "patching" / "summary.json", patching)
        for name in ("heads", "patching"):
            io.write_json(root / name / "task.json", {"task": "fill", "source": "your task (fill.csv)", "n_examples": 4,
                                                      "rows": [0, 2, 5, 7], "sample": {"prompt": "Ann has a <mask> hat."}})
        manifest = io.read_json(root / "manifest.json")
        manifest["config"]["analyses"] = ["attribution", "heads", "patching"]
        io.write_json(root / "manifest.json", manifest)
        runs[side] = Run(root)
    notes = headline_notes(runs["a"], runs["b"])
    [unpruned] = [n for n in notes if "unpruned" in n]
    assert "settings differ" not in unpruned and "bfloat16's rounding" in unpruned, unpruned
    [r] = [n for n in notes if "Pearson r at head_out" in n]
    assert "Fisher" not in r and "within noise" not in r and "settings differ" not in r, r
    assert r == ("(rounding) patching attribution-vs-exact Pearson r at head_out: A 0.758, B 0.769, |B - A| = 0.011 "
                 "(n 24 cells each)" + NO_STEP), r  # in the page's one group of rounding moves (review 17b B1)


def test_patching_clean_and_corrupted_rows_of_a_dtype_pair_carry_the_rounding_step_of_the_top_sites(tmp_path):
    """Review 18a C4 (Phi-3, bfloat16 against float32): "patching clean prompts' logit difference: A 0, B -0.00319,
    |B - A| = 0.00319" carried no rounding step while the heads row gave one. The step is the top sites' rule: one
    bfloat16 step at the number's size or the runs' rounding floor of the metric (here bfloat16's measured 0.03125),
    whichever is larger; a move past it is a difference."""
    import torch

    # bfloat16's spacing at 0.00319 (exponent -9) is 2^(-9 - 7), by torch's own rounding
    v = float(torch.tensor(0.0031890869, dtype=torch.bfloat16))
    assert float(torch.tensor(v + 2.0 ** -16, dtype=torch.bfloat16)) == v + 2.0 ** -16
    assert float(torch.tensor(v + 2.0 ** -16 * 0.49, dtype=torch.bfloat16)) == v
    fp32, bf16, _ = _folders(tmp_path)
    ends = {"clean_metric_ci": [-0.72, 0.72], "corrupted_metric_ci": [-0.77, 0.79]}
    a = _patching_run(tmp_path / "a", bf16, "bfloat16", {"clean_metric": 0.0, "corrupted_metric": 0.01171875, **ends,
                                                          "rounding_floor": {"basis": "measured", "floor": 0.03125}})
    b = _patching_run(tmp_path / "b", fp32, "float32", {"clean_metric": -0.0031890869, "corrupted_metric": 0.0108288,
                                                         **ends, "rounding_floor": {"basis": "measured", "floor": 9.5e-7}})
    notes = [n for n in headline_notes(a, b) if n.startswith((ROUNDING + "patching", "patching"))]
    assert notes == [
        ROUNDING + "patching clean prompts' logit difference: A 0, B -0.00319, |B - A| = 0.00319 (n 8 each); within "
        "bfloat16's rounding step of it (0.0312: the runs' rounding floor; one bfloat16 step at 0.00319 is 1.53e-05).",
        ROUNDING + "patching corrupted prompts' logit difference: A 0.0117, B 0.0108, |B - A| = 0.00089 (n 8 each); "
        "within bfloat16's rounding step of it (0.0312: the runs' rounding floor; one bfloat16 step at 0.0117 is "
        "6.1e-05)."], notes
    c = _patching_run(tmp_path / "c", fp32, "float32", {"clean_metric": -0.05, "corrupted_metric": 0.0108288, **ends})
    [clean] = [n for n in headline_notes(a, c) if "clean prompts'" in n]
    assert not clean.startswith((ROUNDING, SAME)) and clean.endswith(
        "more than bfloat16's rounding step of it (0.0312: the runs' rounding floor; one bfloat16 step at 0.05 is "
        "0.000244): the precision changes the computation here, not only its rounding)."), clean


def _probes_run(root, folder, dtype, summary):
    io.write_json(root / "manifest.json", {
        "model": {"name": f"./{folder.name}", "source": str(folder)}, "seed": 0,
        "config": {"analyses": ["probes"], "task": "moves.csv", "dtype": dtype, "quick": True, "n_examples": None}})
    io.write_json(root / "probes" / "summary.json", {"metric": "accuracy", "n_examples": 40, "best_accuracy": 0.7,
                                                     "best_ci": [0.53, 0.83], **summary})
    io.write_json(root / "probes" / "task.json", {"task": "moves", "source": "your task (moves.csv)", "n_examples": 40,
                                                  "rows": list(range(40)), "sample": {"prompt": "It goes to"}})
    return Run(root)


def test_a_probes_capacity_setting_that_took_effect_in_neither_run_is_no_setting(tmp_path):
    """Verification 18v C1 (StableLM, float32 against bfloat16): "the two runs' probes settings differ (capacity A True,
    B False), so |B - A| = 0 is bfloat16's rounding and the settings together", though A's sweep was skipped (its control
    task degenerate: C = 1) and B's budget turned it off, so both probed at C = 1. Where a run did sweep (its summary's
    capacity is the grid), the setting still differs."""
    fp32, bf16, _ = _folders(tmp_path)
    skipped = "selectivity is not measurable here (the control task is degenerate), so no strength is picked by it"
    a = _probes_run(tmp_path / "a", fp32, "float32", {"capacity": None, "capacity_skipped": skipped})
    b = _probes_run(tmp_path / "b", bf16, "bfloat16", {"capacity": None, "capacity_skipped": None,
                                                        "budget": {"changed": {"capacity": [True, False]}}})
    [note] = [n for n in headline_notes(a, b) if n.startswith((SAME + "probes best", "probes best"))]
    assert note == (SAME + "probes best accuracy: A 0.7, B 0.7 (n 40 each) (the same value in both dtypes (A float32, B "
                    "bfloat16), one model on the same examples: bfloat16's rounding does not move it)."), note
    assert [n for n in settings_notes(a, b, ["probes"]) if "budget" in n] == []
    swept = _probes_run(tmp_path / "c", fp32, "float32", {"capacity": {"param": "C", "grid": [0.1, 1.0]},
                                                           "capacity_skipped": None})
    [note] = [n for n in headline_notes(swept, b) if "probes best" in n]
    assert "the two runs' probes settings differ (capacity A True, B False)" in note, note
    assert [n for n in settings_notes(swept, b, ["probes"]) if "budget" in n] == [
        "probes budget changes: A none, B capacity True -> False."]


ORDER_A = "L1H0 L2H2 L3H2 L2H0 L2H3 L3H1 L1H3 L3H0 L1H2 L3H3 L0H1 L0H2 L2H1 L1H1 L0H3 L0H0".split()
ORDER_B = "L1H0 L2H2 L3H2 L2H0 L2H3 L1H3 L3H1 L1H2 L3H0 L0H1 L3H3 L0H2 L2H1 L0H3 L1H1 L0H0".split()


def _pruning_run(root, folder, dtype, order, metrics, line, interval, floor):
    """A heads run whose fixed ablation order removes `order` two heads a step (heads/curve.csv), `metrics` at 0, 2,
    ..., 16 heads removed, 8 of 16 prunable with its 1% line record at 10 heads (review 18b's Gemma 3 numbers)."""
    import pandas as pd

    io.write_json(root / "manifest.json", {
        "model": {"name": f"./{folder.name}", "source": str(folder)}, "seed": 0,
        "config": {"analyses": ["heads"], "task": "animals.csv", "dtype": dtype, "quick": True, "n_examples": None}})
    io.write_csv(root / "heads" / "curve.csv", pd.DataFrame({
        "ordering": "ablation", "recompute": False, "seed": 0, "n_pruned": range(0, 17, 2),
        "fraction_pruned": [k / 16 for k in range(0, 17, 2)], "metric": metrics,
        "pruned": [None] + [f"{order[k]} {order[k + 1]}" for k in range(0, 16, 2)]}))
    io.write_json(root / "heads" / "summary.json", {
        "metric": "logit_diff", "baseline_metric": metrics[0], "n_heads": 16, "n_examples": 16, "noise_floor": floor,
        "max_fraction_prunable_ablation": 0.5, "heads_prunable_ablation": 8,
        "prunable_ci_ablation": {"interval_heads": interval, "line": {
            "n_pruned": 10, "metric": metrics[5], "line": 0.99 * metrics[0], "change": metrics[5] - metrics[0],
            "change_low": line[0], "change_high": line[1], "on_the_line": True, "past": True}}})
    io.write_json(root / "heads" / "task.json", {"task": "animals", "source": "your task (animals.csv)", "n_examples": 16,
                                                 "rows": list(range(16)), "sample": {"prompt": "It hoots. It is a"}})
    return Run(root)


def test_compare_says_two_pruning_points_at_one_count_removed_different_heads(tmp_path):
    """Review 18b C2 (Gemma 3, bfloat16 against float32): compare read A's point "at 10 heads removed is 4.005" against
    B's "4.437" as one point, while the two ablation orders part at the 6th head and by 10 heads remove L3H3 in A and
    L0H1 in B. By hand: the orders remove the same heads at 4 and 12 (sets compared); the changes from unpruned there
    are 4.588409 - 4.479309 = 0.109100 against 4.592541 - 4.483667 = 0.108874 (0.000226 apart) and 4.457642 - 4.479309
    = -0.021667 against 4.459708 - 4.483667 = -0.023959 (0.002292 apart), both under bfloat16's step 0.0376."""
    from headscope.reports.compare_pruning import pruning_notes

    assert set(ORDER_A[:4]) == set(ORDER_B[:4]) and set(ORDER_A[:12]) == set(ORDER_B[:12])
    assert set(ORDER_A[:10]) - set(ORDER_B[:10]) == {"L3H3"} and set(ORDER_B[:10]) - set(ORDER_A[:10]) == {"L0H1"}
    assert [i for i in range(16) if ORDER_A[i] != ORDER_B[i]][0] == 5  # the 6th head removed
    fp32, bf16, _ = _folders(tmp_path)
    a = _pruning_run(tmp_path / "a", bf16, "bfloat16", ORDER_A,
                     [4.479309, 4.561279, 4.588409, 4.632263, 4.619019, 4.005310, 4.457642, 3.375244, -0.106689],
                     (-0.924, -0.0243), [8.0, 8.0], 0.0376)
    b = _pruning_run(tmp_path / "b", fp32, "float32", ORDER_B,
                     [4.483667, 4.559550, 4.592541, 4.609105, 4.523076, 4.437321, 4.459708, 3.739136, -0.104040],
                     (-0.796, 0.704), [4.0, 14.0], 5.7e-07)
    [note] = pruning_notes(a, b)
    assert "the point at 10 heads removed is 4.005" in note and "the point at 10 heads removed is 4.437" in note
    assert note.endswith(
        " The two points at 10 heads removed are of different heads, not one point read twice: the fixed orders part "
        "at the 6th head removed (A L3H1, B L1H3), and by 10 heads removed A has removed L3H3 where B has removed L0H1, "
        "which neither heads finding records as tied within rounding; with the same heads removed (at 4 and 12 heads) "
        "the changes are 0.00023 and 0.0023 apart, within bfloat16's rounding step of the metric (0.038): where the "
        "heads agree the precision moves the curve by less than its rounding, so the gap between the two points goes "
        "with the heads removed."), note
    same = _pruning_run(tmp_path / "c", fp32, "float32", ORDER_A,
                        [4.483667, 4.559550, 4.592541, 4.609105, 4.523076, 4.437321, 4.459708, 3.739136, -0.104040],
                        (-0.796, 0.704), [4.0, 14.0], 5.7e-07)
    assert "different heads" not in pruning_notes(a, same)[0]  # one order: the two points are one point read twice


def test_patching_at_the_corrupted_token_of_a_dtype_pair_is_judged_by_the_rounding_step(tmp_path):
    """Review 18d C4 on one model in two dtypes: the resid_pre at the corrupted token per layer, |B - A| against the
    rounding step at its size (as the top sites): 8.239032 against 8.224609 moves 0.0144, under one bfloat16 step at
    8.24 (2^(3 - 7) = 0.0625); 0.1 against 0.3 moves 0.2, past the floor 0.015625."""
    from headscope.reports.compare import patching_section

    fp32, bf16, _ = _folders(tmp_path)

    def run(side, folder, dtype, effects):
        rows = [{"layer": k, "effect": e, "ci": [e - 1, e + 1], "n": 8} for k, e in enumerate(effects)]
        return _patching_run(tmp_path / side, folder, dtype, {
            **_sites_summary([], [], [], 3.918648, -4.325621),
            "at_corrupted_token": {"n": 8, "positions_differ": [1, 1], "sites": {"resid_pre": rows}}})

    a = run("a", fp32, "float32", [8.239032, 0.1])
    notes = patching_section(a, run("b", bf16, "bfloat16", [8.224609, 0.1]))[1]
    assert ROUNDING + ("patching resid_pre at the corrupted token (aligned on each prompt's own, not counted from the "
                       "end), per layer: layer 0 moved most: A 8.24, B 8.22, |B - A| = 0.0144 logit difference, within "
                       "bfloat16's rounding step there (0.0625: one bfloat16 step at 8.24), as every layer; every layer: "
                       "layer 0 A 8.24, B 8.22; layer 1 A 0.1, B 0.1 (n 8 prompts each).") in notes, notes
    notes = patching_section(a, run("c", bf16, "bfloat16", [8.224609, 0.3]))[1]
    assert ("patching resid_pre at the corrupted token (aligned on each prompt's own, not counted from the end), per "
            "layer: beyond bfloat16's rounding at layer 1: |B - A| = 0.2 logit difference, more than its step there "
            "(0.0156: the runs' rounding floor; one bfloat16 step at 0.3 is 0.00195): the precision changes the "
            "computation here, not only its rounding; every layer: layer 0 A 8.24, B 8.22; layer 1 A 0.1, B 0.3 logit "
            "difference (n 8 prompts each).") in notes, notes


def test_the_rounding_group_is_ordered_by_the_moves_themselves_not_their_printed_digits(tmp_path):
    """Review 19v C2: the page's rounding group, "largest move relative to the number's size first", parsed the
    notes' 3-digit text, so resid_pre's 18.4 against 18.3705 (printed A 18.4, B 18.4) sorted as no move, last. The
    notes carry their numbers: by hand, corrupted 0.0182 / 9.0182 = 0.20%, resid_pre 0.0295 / 18.4 = 0.16%, clean
    0.0113 / 9.25 = 0.12% (printed 9.25, 9.24: 0.11%)."""
    import html
    import re

    from headscope.reports.compare import compare_html

    fp32, bf16, _ = _folders(tmp_path)

    def run(side, folder, dtype, clean, corrupted, resid):
        rows = [{"layer": 0, "effect": resid, "ci": [resid - 1, resid + 1], "n": 8}]
        return _patching_run(tmp_path / side, folder, dtype, {
            **_sites_summary([], [], [], clean, corrupted),
            "at_corrupted_token": {"n": 8, "positions_differ": [1, 1], "sites": {"resid_pre": rows}}})

    a = run("a", fp32, "float32", 9.25, -9.0, 18.4)
    b = run("b", bf16, "bfloat16", 9.2387, -9.0182, 18.3705)
    page = html.unescape(compare_html(a, b))
    group = page[page.index("<ul class='rounding'>"):page.index("<h2 id='same'>")]
    listed = [re.sub(r":.*", "", item) for item in re.findall(r"<li>(.*?)</li>", group)]
    moves = {"patching corrupted prompts' logit difference": 0.0182 / 9.0182,
             "patching resid_pre at the corrupted token (aligned on each prompt's own, not counted from the end), per "
             "layer": 0.0295 / 18.4, "patching clean prompts' logit difference": 0.0113 / 9.25}
    assert listed == sorted(moves, key=moves.__getitem__, reverse=True), listed
