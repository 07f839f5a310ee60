"""`headscope compare` on the numbers that were in no list (reports/compare_measures.py): attribution's permutation
and adversarial tests, patching's attribution-vs-exact r, kv's first-key norm ratio, position's first-token attention.
Each case builds two summaries, one apart and one within noise, and checks the list the note lands in and the interval
it prints against scipy / numpy by hand."""
from __future__ import annotations

import html

import numpy as np
from scipy import stats

from headscope.reports import io
from headscope.reports.compare import NOT_COMPARED, SAME, Run, compare_html
from headscope.reports.compare_headlines import headline_notes


def _runs(root, name: str, sa: dict, sb: dict, settings: tuple[dict, dict] = ({}, {})) -> tuple[Run, Run]:
    """Two output folders with one analysis's summary each (and its preset settings in the manifest)."""
    for side, s, config in (("a", sa, settings[0]), ("b", sb, settings[1])):
        io.write_json(root / side / "manifest.json", {"model": {"name": "m"}, "seed": 0, "config": {
            "analyses": [name], "settings": {"analysis_configs": {name: config}}}})
        io.write_json(root / side / name / "summary.json", s)
    return Run(root / "a"), Run(root / "b")


def _t(x: np.ndarray) -> tuple[float, float]:
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    return float(ci.low), float(ci.high)


def _verdict(va: float, vb: float, ia: tuple[float, float], ib: tuple[float, float]) -> tuple[str, float, float]:
    """Whether |B - A| is inside the two intervals' combined half-widths (compare's rule), by hand."""
    half, diff = (ia[1] - ia[0]) / 2 + (ib[1] - ib[0]) / 2, abs(vb - va)
    return ("within" if diff <= half else "beyond"), diff, half


def _one(notes: list[str], label: str) -> str:
    found = [n for n in notes if n.removeprefix(SAME).removeprefix(NOT_COMPARED).startswith(label + ":")]
    assert len(found) == 1, (label, notes)
    return found[0]


def _attribution(change: np.ndarray, adv: np.ndarray | None = None, **more) -> dict:
    """An attribution summary with the permutation test's per-example changes of the logit difference (their mean,
    sd and n, as summary.py writes them), a median TVD and, with `adv`, a saturated output's adversarial change."""
    s = {"metric": "logit_diff", "output_change": "tvd", "n_examples": len(change), "permutation_layer": 1,
         "n_permutations": 20, "median_permutation_change": 0.05, "permutation_change_range": [0.01, 0.2],
         "permutation_change_n": len(change), "permutation_metric_change": float(change.mean()),
         "permutation_metric_change_sd": float(change.std(ddof=1)), "permutation_metric_change_n": len(change),
         "adversarial_epsilon": 0.01, "adversarial_steps": 50, "median_adversarial_jsd": 0.3,
         "fraction_adversarial_near_ln2": 0.25}
    if adv is not None:
        s.update({"saturated": {"is_saturated": True, "why": "p >= 0.99 on most examples"},
                  "adversarial_metric_change": float(adv.mean()), "adversarial_metric_change_sd": float(adv.std(ddof=1)),
                  "adversarial_metric_change_n": len(adv)})
    return {**s, **more}


def test_compare_sets_attribution_permutation_and_adversarial_numbers_as_its_finding_states_them(tmp_path):
    from headscope.reports.findings import finding

    rng = np.random.default_rng(0)
    base = rng.normal(0.0, 0.1, 8)  # [examples] per-example mean changes of the logit difference
    label = "attribution permutation test: mean change of the logit difference"
    # apart: A's changes near 0, B's near -1 (t intervals over 8 examples each, by scipy)
    a, b = _runs(tmp_path / "x", "attribution", _attribution(base), _attribution(base - 1.0))
    ia, ib = _t(base), _t(base - 1.0)
    kind, diff, half = _verdict(base.mean(), base.mean() - 1.0, ia, ib)
    assert kind == "beyond"
    note = _one(headline_notes(a, b), label)
    assert note == (f"{label}: A {base.mean():.3g}, B {base.mean() - 1:.3g} (n 8 each) (beyond noise: |B - A| = "
                    f"{diff:.3g} exceeds the combined half-widths {half:.3g}; 95% CIs A [{ia[0]:.3g}, {ia[1]:.3g}], "
                    f"B [{ib[0]:.3g}, {ib[1]:.3g}]).")
    assert f"95% CI [{ia[0]:+.3g}, {ia[1]:+.3g}]" in finding("attribution", a.summary("attribution"))  # A's own
    page = compare_html(a, b)
    assert f"<li>{html.escape(note)}</li>" in page[page.index("id='differences'"):page.index("id='same'")]
    # within noise: B's changes shifted by 0.02
    a, b = _runs(tmp_path / "y", "attribution", _attribution(base), _attribution(base + 0.02))
    ib = _t(base + 0.02)
    kind, diff, half = _verdict(base.mean(), base.mean() + 0.02, ia, ib)
    assert kind == "within"
    notes = headline_notes(a, b)
    assert _one(notes, label) == (SAME + f"{label}: A {base.mean():.3g}, B {base.mean() + 0.02:.3g} (n 8 each) (within "
                                  f"noise: |B - A| = {diff:.3g} is inside the combined half-widths {half:.3g}; 95% CIs "
                                  f"A [{ia[0]:.3g}, {ia[1]:.3g}], B [{ib[0]:.3g}, {ib[1]:.3g}]).")
    # the median TVD, the median JSD and the share near ln 2 carry no interval: equal at the printed precision
    for what in ("permutation test: median tvd over permutations", "adversarial attention: median JSD (nats)",
                 "adversarial attention: share of examples within 90% of ln 2"):
        assert _one(notes, f"attribution {what}").startswith(SAME), notes
    a, b = _runs(tmp_path / "z", "attribution", _attribution(base), _attribution(base, median_permutation_change=0.09))
    assert _one(headline_notes(a, b), "attribution permutation test: median tvd over permutations") == (
        NOT_COMPARED + "attribution permutation test: median tvd over permutations: not compared: A 0.05, B 0.09 (n 8 "
        "each) (its finding states no interval for it: whether this is beyond noise is not known).")


def test_compare_adversarial_attention_of_another_search_or_a_saturated_output(tmp_path):
    rng = np.random.default_rng(1)
    base, adv = rng.normal(0.0, 0.1, 6), rng.normal(-0.5, 0.2, 6)
    label = "attribution adversarial attention: mean change of the logit difference"
    # both outputs saturated: the finding states the adversarial attention's change with its t interval
    a, b = _runs(tmp_path / "x", "attribution", _attribution(base, adv), _attribution(base, adv - 2.0))
    ia, ib = _t(adv), _t(adv - 2.0)
    kind, diff, half = _verdict(adv.mean(), adv.mean() - 2.0, ia, ib)
    notes = headline_notes(a, b)
    assert kind == "beyond" and _one(notes, label) == (
        f"{label}: A {adv.mean():.3g}, B {adv.mean() - 2:.3g} (n 6 each) (beyond noise: |B - A| = {diff:.3g} exceeds "
        f"the combined half-widths {half:.3g}; 95% CIs A [{ia[0]:.3g}, {ia[1]:.3g}], B [{ib[0]:.3g}, {ib[1]:.3g}]).")
    jsd = _one(notes, "attribution adversarial attention: median JSD (nats)")  # said to say nothing there
    assert jsd.startswith(NOT_COMPARED) and "A's report says its median JSD says nothing about faithfulness" in jsd
    a, b = _runs(tmp_path / "w", "attribution", _attribution(base, adv), _attribution(base, adv + 0.05))
    assert _one(headline_notes(a, b), label).startswith(SAME + f"{label}: A {adv.mean():.3g}, B {adv.mean() + 0.05:.3g} "
                                                        "(n 6 each) (within noise")
    # B's output is not saturated: its finding does not state the change, so only A's report does
    a, b = _runs(tmp_path / "y", "attribution", _attribution(base, adv), _attribution(base))
    notes = headline_notes(a, b)
    assert _one(notes, label) == NOT_COMPARED + f"{label}: not compared: only A's report states it (n 6 examples)."
    assert _one(notes, "attribution adversarial attention: share of examples within 90% of ln 2") == (
        NOT_COMPARED + "attribution adversarial attention: share of examples within 90% of ln 2: not compared: only B's "
        "report states it (n 6 examples).")  # A's saturated output: its finding states no share
    # --quick's 20 Adam steps against 50 (no summary key: the manifest's preset with the budget's change)
    sa = {k: v for k, v in _attribution(base).items() if k != "adversarial_steps"}
    sb = {**sa, "median_adversarial_jsd": 0.1, "budget": {"changed": {"adversarial_steps": [50, 20]}}}
    a, b = _runs(tmp_path / "z", "attribution", sa, sb, ({"adversarial_steps": 50}, {"adversarial_steps": 50}))
    note = _one(headline_notes(a, b), "attribution adversarial attention: median JSD (nats)")
    assert note == (NOT_COMPARED + "attribution adversarial attention: median JSD (nats): not compared, not the same "
                    "quantity: A searched 50 Adam steps, B 20: a longer search finds attention farther from the model's, "
                    "a setting, not the model (A 0.3, B 0.1; n 6 each).")
    # another permuted layer: another quantity
    a, b = _runs(tmp_path / "v", "attribution", _attribution(base), _attribution(base - 1.0, permutation_layer=3))
    assert "not the same quantity: A's test is on layer 1's attention, B's on layer 3's" in _one(
        headline_notes(a, b), "attribution permutation test: mean change of the logit difference")


def _patching(r: float, n: int = 60, **more) -> dict:
    return {"metric": "logit_diff", "n_examples": 8, "clean_metric": 3.0, "corrupted_metric": 0.0,
            "attribution_correlation": {"head_out": {"pearson": r, "n": n, "n_nonzero": n, **more}}}


def _fisher(r: float, n: int) -> tuple[float, float]:
    z, half = np.arctanh(r), 1.959964 / np.sqrt(n - 3)
    return float(np.tanh(z - half)), float(np.tanh(z + half))


def test_compare_sets_patching_attribution_vs_exact_r_by_fisher_intervals(tmp_path):
    from headscope.reports.findings import finding

    label = "patching attribution-vs-exact Pearson r at head_out"
    a, b = _runs(tmp_path / "x", "patching", _patching(0.95), _patching(0.30, n=40))
    fa, fb = _fisher(0.95, 60), _fisher(0.30, 40)
    z, half = abs(np.arctanh(0.30) - np.arctanh(0.95)), 1.959964 / np.sqrt(57) + 1.959964 / np.sqrt(37)
    assert z > half and f"r = 0.950 (n = 60 cells, 95% CI [{fa[0]:.3f}, {fa[1]:.3f}])" in finding(
        "patching", a.summary("patching"))  # the interval A's report prints
    note = _one(headline_notes(a, b), label)
    assert note == (f"{label}: A 0.950, B 0.300 (n differs: 60 vs 40 cells: intervals of other widths) (beyond noise: "
                    f"|z_B - z_A| = {z:.3g} exceeds the combined Fisher half-widths {half:.3g}; Fisher 95% CIs A "
                    f"[{fa[0]:.3f}, {fa[1]:.3f}], B [{fb[0]:.3f}, {fb[1]:.3f}]).")
    a, b = _runs(tmp_path / "y", "patching", _patching(0.90), _patching(0.86))
    fb = _fisher(0.86, 60)
    z, half = abs(np.arctanh(0.86) - np.arctanh(0.90)), 2 * 1.959964 / np.sqrt(57)
    assert z < half and _one(headline_notes(a, b), label) == (
        SAME + f"{label}: A 0.900, B 0.860 (n 60 cells each) (within noise: |z_B - z_A| = {z:.3g} is inside the "
        f"combined Fisher half-widths {half:.3g}; Fisher 95% CIs A [{_fisher(0.9, 60)[0]:.3f}, {_fisher(0.9, 60)[1]:.3f}]"
        f", B [{fb[0]:.3f}, {fb[1]:.3f}]).")
    # B's r rests on its largest cell (without it 0.05): its finding states no interval, so it is not compared
    a, b = _runs(tmp_path / "z", "patching", _patching(0.90), _patching(0.90, pearson_without_top=0.05))
    assert _one(headline_notes(a, b), label) == (NOT_COMPARED + f"{label}: not compared: B's report says its r is driven "
                                                 "by its largest cell (the agreement rests on one point) (n 60 cells each).")
    assert "is driven by its largest cell" in finding("patching", b.summary("patching"))


def _ratios(values: dict[int, np.ndarray]) -> list[dict]:
    """key_norm_ratios records from per-prompt ratios, their t intervals by scipy."""
    return [{"layer": k, "ratio": float(x.mean()), "ci": list(_t(x)), "n": len(x)} for k, x in values.items()]


def test_compare_sets_the_kv_first_key_norm_ratio_layer_by_layer(tmp_path):
    from headscope.reports.compare_measures import NORM_LABEL
    from headscope.reports.findings import finding

    rng = np.random.default_rng(2)
    one, two = rng.normal(1.2, 0.1, 16), rng.normal(2.5, 0.2, 16)
    kv = {"metric": "logit_diff", "n_examples": 16}
    a, b = _runs(tmp_path / "x", "kv", {**kv, "key_norm_ratios": _ratios({0: one, 1: one})},
                 {**kv, "key_norm_ratios": _ratios({0: one + 0.01, 1: two})})
    i1, i1b, i2 = _t(one), _t(one + 0.01), _t(two)
    assert _verdict(one.mean(), two.mean(), i1, i2)[0] == "beyond"
    assert _verdict(one.mean(), one.mean() + 0.01, i1, i1b)[0] == "within"
    assert f"layer 1 {one.mean():.2f} [{i1[0]:.2f}, {i1[1]:.2f}]" in finding("kv", a.summary("kv"))  # as A states it
    note = _one(headline_notes(a, b), NORM_LABEL)
    assert note == (f"{NORM_LABEL}: beyond noise (|B - A| past the two 95% CIs' combined half-widths) in layer 1 A "
                    f"{one.mean():.2f} [{i1[0]:.2f}, {i1[1]:.2f}], B {two.mean():.2f} [{i2[0]:.2f}, {i2[1]:.2f}]; within "
                    f"noise: layer 0 A {one.mean():.2f} [{i1[0]:.2f}, {i1[1]:.2f}], B {one.mean() + 0.01:.2f} "
                    f"[{i1b[0]:.2f}, {i1b[1]:.2f}] (n 16 prompts each).")
    a, b = _runs(tmp_path / "y", "kv", {**kv, "key_norm_ratios": _ratios({0: one, 1: two})},
                 {**kv, "key_norm_ratios": _ratios({0: one + 0.01, 1: two})})
    assert _one(headline_notes(a, b), NORM_LABEL).startswith(SAME + f"{NORM_LABEL}: within noise in every layer")
    # an older summary's ratios carry no interval: not compared, and why
    a, b = _runs(tmp_path / "z", "kv", {**kv, "sink_key_norm_ratio_per_layer": {"0": 1.2, "1": 2.5}},
                 {**kv, "key_norm_ratios": _ratios({0: one, 1: two})})
    assert _one(headline_notes(a, b), NORM_LABEL).startswith(NOT_COMPARED + f"{NORM_LABEL}: not compared: layer 0 A "
                                                             f"1.20, B {one.mean():.2f} [{i1[0]:.2f}, {i1[1]:.2f}]")


def _sinks(masses: dict[int, np.ndarray]) -> list[dict]:
    """Position's sink records from per-example masses, t intervals by scipy (uniform share 0.1)."""
    return [{"layer": k, "mass": float(x.mean()), "ci": list(_t(x)), "n": len(x), "uniform": 0.1,
             "ratio": float(x.mean()) / 0.1, "sink": bool(x.mean() >= 0.15)} for k, x in masses.items()]


def test_compare_sets_positions_first_token_attention_layer_by_layer(tmp_path):
    from headscope.reports.findings import finding

    rng = np.random.default_rng(3)
    low, high = rng.normal(0.12, 0.02, 12), rng.normal(0.6, 0.05, 12)
    pos = {"primary_metric": "accuracy", "n_examples": 12, "n_sink": 4}
    label = "position attention on the first 4 tokens per layer"
    a, b = _runs(tmp_path / "x", "position", {**pos, "sinks": _sinks({0: low, 1: low})},
                 {**pos, "sinks": _sinks({0: low, 1: high})})
    il, ih = _t(low), _t(high)
    assert _verdict(low.mean(), high.mean(), il, ih)[0] == "beyond"
    assert f"layer 1 {low.mean():.2f} [{il[0]:.2f}, {il[1]:.2f}]" in finding("position", a.summary("position"))
    notes = headline_notes(a, b)
    assert _one(notes, label) == (f"{label}: beyond noise (|B - A| past the two 95% CIs' combined half-widths) in layer "
                                  f"1 A {low.mean():.2f} [{il[0]:.2f}, {il[1]:.2f}], B {high.mean():.2f} [{ih[0]:.2f}, "
                                  f"{ih[1]:.2f}]; within noise: layer 0 A {low.mean():.2f} [{il[0]:.2f}, {il[1]:.2f}], B "
                                  f"{low.mean():.2f} [{il[0]:.2f}, {il[1]:.2f}] (n 12 each).")
    assert any(n.startswith("position attention-sink layers (") and n.endswith(", B layer 1 (layer 0 1.2x, layer 1 "
                                                                               f"{high.mean() / 0.1:.1f}x).") for n in notes)
    a, b = _runs(tmp_path / "y", "position", {**pos, "sinks": _sinks({0: low, 1: high})},
                 {**pos, "sinks": _sinks({0: low + 0.005, 1: high})})
    notes = headline_notes(a, b)
    assert _one(notes, label).startswith(SAME + f"{label}: within noise in every layer")
    page = compare_html(a, b)
    assert html.escape(_one(notes, label).removeprefix(SAME)) in page[page.index("id='same'"):page.index("id='not-c")]
    verdict = "position attention-sink layers (at least 1.5x the uniform share, its excess 95%-CI above 0): "
    assert SAME + verdict + "the same verdict: A and B layer 1." in notes
    # review 16cv B1: an ALiBi run's verdict is judged against ALiBi's share (summary sink_baseline), named so
    a, b = _runs(tmp_path / "w", "position", {**pos, "sink_baseline": "alibi", "sinks": _sinks({0: low, 1: high})},
                 {**pos, "sink_baseline": "alibi", "sinks": _sinks({0: low + 0.005, 1: high})})
    assert SAME + verdict.replace("the uniform share", "the share ALiBi's position bias alone gives") + (
        "the same verdict: A and B layer 1.") in headline_notes(a, b)
    a, b = _runs(tmp_path / "v", "position", {**pos, "sink_baseline": "alibi", "sinks": _sinks({0: low, 1: high})},
                 {**pos, "sinks": _sinks({0: low + 0.005, 1: high})})
    assert SAME + verdict.replace("the uniform share", "each run's own baseline (A the share ALiBi's position bias "
                                  "alone gives, B the uniform share)") + "the same verdict: A and B layer 1." in \
        headline_notes(a, b)
    # another count of first tokens is another quantity
    a, b = _runs(tmp_path / "z", "position", {**pos, "sinks": _sinks({0: low})},
                 {**pos, "n_sink": 1, "sinks": _sinks({0: low})})
    [note] = [n for n in headline_notes(a, b) if "attention on the first tokens per layer" in n]
    assert note == (NOT_COMPARED + "position attention on the first tokens per layer and which layers are sinks: not "
                    "compared: A counts the first 4 token(s) as the sink, B the first 1: another quantity.")


def test_compare_says_rollout_taus_only_one_report_states_and_bootstrap_intervals_of_absolute_changes(tmp_path):
    """A's summary has rollout's taus, B's (older) none: the lists were zipped, so A's rollout taus were in no list.
    The mean absolute change is judged by the bootstrap intervals its finding prints (given here: [0.10, 0.20] and
    [0.30, 0.40], half-widths 0.05 each, |B - A| 0.2 by hand: beyond)."""
    taus = {"mean_tau_attention_saliency": 0.2, "std_tau_attention_saliency": 0.1, "n_tau_attention_saliency": 8}
    roll = {"mean_tau_rollout_saliency": 0.5, "std_tau_rollout_saliency": 0.1, "n_tau_rollout_saliency": 8}
    absolute = lambda m, ci: {"permutation_abs_metric_change": m, "permutation_abs_metric_change_ci": ci,  # noqa: E731
                              "permutation_abs_metric_change_sd": 0.1, "permutation_abs_metric_change_n": 8}
    a, b = _runs(tmp_path, "attribution", {"n_examples": 8, "metric": "logit_diff", **taus, **roll,
                                           **absolute(0.15, [0.10, 0.20])},
                 {"n_examples": 8, "metric": "logit_diff", **taus, **absolute(0.35, [0.30, 0.40])})
    notes = headline_notes(a, b)
    label = "attribution mean Kendall tau of attention rollout and saliency"
    assert _one(notes, label) == NOT_COMPARED + f"{label}: not compared: only A's report states it (n 8 examples)."
    label = "attribution permutation test: mean absolute change of the logit difference"
    assert _one(notes, label) == (f"{label}: A 0.15, B 0.35 (n 8 each) (beyond noise: |B - A| = 0.2 exceeds the combined "
                                  "half-widths 0.1; 95% CIs A [0.1, 0.2], B [0.3, 0.4]).")


def test_compare_does_not_set_a_saturated_outputs_median_distance_against_another(tmp_path):
    """On a saturated output the attribution finding says a small distance shows nothing (a change of a logit moves
    the TVD by about 1e-6): compare leaves the median TVD out with that reason, and compares the metric's change."""
    base, adv = np.linspace(-0.2, 0.2, 6), np.linspace(-0.6, -0.4, 6)
    a, b = _runs(tmp_path, "attribution", _attribution(base, adv, median_permutation_change=6.5e-7),
                 _attribution(base, adv, median_permutation_change=2.8e-7))
    label = "attribution permutation test: median tvd over permutations"
    assert _one(headline_notes(a, b), label) == (
        NOT_COMPARED + f"{label}: not compared: A's report says its output is saturated, where a small distance does not "
        "show that the layer does little (the task metric's change is compared instead); B's report says its output is "
        "saturated, where a small distance does not show that the layer does little (the task metric's change is "
        "compared instead) (n 6 each).")


def test_compare_says_a_patching_site_one_run_never_patched_is_blank_for_that_reason(tmp_path):
    """Review 16b C1: A's time budget cut patching's sites to resid_pre and head_out, so A has no r at attn_out; compare
    said "n differs: not recorded vs 96 cells: intervals of other widths", a sampling reason. The real reason comes
    first, B's own reason after it, and B's n as B's; a sites setting that leaves the site out is named likewise."""
    label = "patching attribution-vs-exact Pearson r at attn_out"
    cut = {"budget": {"changed": {"sites": [None, ["resid_pre", "head_out"]]}}}
    few = {"pearson": 0.997, "n": 96, "n_nonzero": 2}
    sb = {**_patching(0.9), "attribution_correlation": {"head_out": {"pearson": 0.9, "n": 60, "n_nonzero": 60},
                                                        "attn_out": few}}
    a, b = _runs(tmp_path / "x", "patching", {**_patching(0.9), **cut}, sb)
    assert _one(headline_notes(a, b), label) == (
        NOT_COMPARED + f"{label}: not compared: A's report did not patch attn_out: its time budget cut patching's sites "
        "to resid_pre and head_out; B's report says its r rests on 2 non-zero exact effect(s) and says nothing about "
        "agreement (n 96 cells in B).")
    a, b = _runs(tmp_path / "y", "patching", _patching(0.9), sb, settings=({"sites": ["head_out"]}, {}))
    assert _one(headline_notes(a, b), label).startswith(
        NOT_COMPARED + f"{label}: not compared: A's report did not patch attn_out: its sites setting (head_out) leaves "
        "it out; B's report")


def test_compare_top_sites_table_says_a_site_one_run_never_patched_is_blank_for_that_reason(tmp_path):
    """Review 16b C1, the top-sites table: A's cells for attn_out said "(its summary lists 0 attn_out site(s))"; now
    they say A did not patch it and why (its budget's cut)."""
    from headscope.reports.compare import patching_section

    cell = {"layer": 0, "head": None, "pos": 3, "from_end": -1, "effect": 3.0, "ci": [2.5, 3.5], "n": 8}
    sa = {**_patching(0.9), "budget": {"changed": {"sites": [None, ["resid_pre"]]}}, "top_sites": {"resid_pre": [cell]}}
    sb = {**_patching(0.9), "top_sites": {"resid_pre": [cell], "attn_out": [cell]}}
    a, b = _runs(tmp_path, "patching", sa, sb)
    page, _ = patching_section(a, b)
    assert "<em>(did not patch attn_out: its time budget cut patching&#x27;s sites to resid_pre)</em>" in page, page
    assert "its summary lists 0" not in page


def test_sink_values_from_copies_of_one_input_are_not_beyond_noise():
    """Review 17c C5: tr_bf16 vs tr_f32 (one StarCoder2, window 12, two dtypes) had position sink intervals of width 0
    (4 and 8 examples, copies of one input over the queries measured: review 17c B1), so bfloat16 rounding (0.593455 vs
    0.591514) was listed "beyond noise". Such a record (an older summary's zero-width interval over n >= 2, or a new
    one's n_distinct 1) has no interval: not compared, and never beyond noise."""
    from headscope.reports.compare_measures import sink_note

    def rec(layer, mass, n, **extra):
        return {"layer": layer, "mass": mass, "baseline": 0.51, "ci": [mass, mass], "ratio": mass / 0.51, "n": n,
                "sink": False, **extra}

    sa = {"n_sink": 4, "sinks": [rec(0, 0.593455, 4), rec(1, 0.498602, 4), rec(2, 0.543880, 4)]}
    sb = {"n_sink": 4, "sinks": [rec(0, 0.591514, 8), rec(1, 0.498598, 8), rec(2, 0.543301, 8)]}
    line = sink_note(sa, sb, name="position")[0]
    assert ": beyond noise" not in line and line.startswith("(not compared) position attention on the first 4 tokens")
    assert ("not compared (layers 0, 1, 2: a run's examples are copies of one input over the queries measured, so it "
            "has no interval; a difference there is not judged against noise): layer 0 A 0.59, B 0.59") in line
    new = {"n_sink": 4, "sinks": [{**rec(0, 0.5935, 4, n_distinct=1), "ci": None}]}
    assert "copies of one input" in sink_note(new, {"n_sink": 4, "sinks": [rec(0, 0.30, 4, ci=[0.2, 0.4])]},
                                              name="position")[0]
    # distinct examples with a real interval are still judged: 0.30 [0.29, 0.31] vs 0.50 [0.49, 0.51] is beyond noise
    wide = sink_note({"n_sink": 4, "sinks": [{**rec(0, 0.30, 4), "ci": [0.29, 0.31]}]},
                     {"n_sink": 4, "sinks": [{**rec(0, 0.50, 4), "ci": [0.49, 0.51]}]}, name="position")[0]
    assert "beyond noise" in wide and "copies" not in wide


def test_the_sink_rule_is_worded_by_what_was_computed_where_no_interval_exists():
    """Verification 18v B3 (StarCoder2, window 12): every position layer's examples were copies of one input, so no
    interval was computed (excess_ci None, the ratio alone decides: analyses/position/sinks.layer_sinks), yet the finding
    and compare cited "its excess over it 95%-CI above 0"."""
    from headscope.reports.compare_measures import sink_note
    from headscope.reports.findings import sink_sentence

    def rec(layer, mass, ci=None, excess=None):
        return {"layer": layer, "mass": mass, "baseline": 0.51, "ci": ci, "excess_ci": excess, "ratio": mass / 0.51,
                "n": 4, "sink": False, **({} if ci else {"n_distinct": 1, "read_tokens": 12})}

    alone = [rec(0, 0.5935), rec(1, 0.4986)]
    text = sink_sentence(alone, n_sink=4)
    assert text.endswith("verdict rests on the ratio alone. No layer is an attention sink (none is at least 1.5x the "
                         "uniform share)."), text
    assert "95%-CI" not in text
    mixed = [rec(0, 0.5935), rec(1, 0.4986, ci=[0.45, 0.55], excess=[-0.06, 0.04])]
    assert sink_sentence(mixed, n_sink=4).endswith(
        "No layer is an attention sink (none is at least 1.5x the uniform share, with its excess over it 95%-CI above 0 "
        "where an interval is given (the ratio alone on layer 0)).")
    line = sink_note({"n_sink": 4, "sinks": alone}, {"n_sink": 4, "sinks": alone}, name="position")[-1]
    assert line == (SAME + "position attention-sink layers (at least 1.5x the uniform share; no interval in either run, "
                    "so the ratio alone decides): the same verdict: A and B none.")
    line = sink_note({"n_sink": 4, "sinks": alone}, {"n_sink": 4, "sinks": mixed}, name="position")[-1]
    assert "(at least 1.5x the uniform share, its excess 95%-CI above 0 where a run gives an interval (the ratio alone on " \
           "A's layers 0-1; B's layer 0))" in line, line
    both = [rec(0, 0.5935, ci=[0.5, 0.7], excess=[0.01, 0.2]), rec(1, 0.4986, ci=[0.45, 0.55], excess=[-0.06, 0.04])]
    assert "(at least 1.5x the uniform share, its excess 95%-CI above 0): the same verdict" in sink_note(
        {"n_sink": 4, "sinks": both}, {"n_sink": 4, "sinks": both}, name="position")[-1]


def test_layers_by_noise_groups_each_layer_by_the_two_intervals_as_both_per_layer_notes_say_it():
    """compare_run.layers_by_noise, by hand: layer 0 (1.0 [0.9, 1.1] against 2.0 [1.9, 2.1]: |B - A| = 1 past the
    half-widths 0.1 + 0.1) beyond; layers 1-5 (0.5 [0.4, 0.6] against 0.55 [0.45, 0.65]: 0.05 inside 0.2) within;
    layer 6 (2.0 [1.0, 3.0] against 0.0 [-1.0, 1.0]: 2 equals 1 + 1) within; layer 7 without B's interval unknown."""
    from headscope.reports.compare_run import layers_by_noise

    beyond = ("L0", 1.0, 2.0, (0.9, 1.1), (1.9, 2.1))
    within = [(f"L{k}", 0.5, 0.55, (0.4, 0.6), (0.45, 0.65)) for k in range(1, 6)] + [
        ("L6", 2.0, 0.0, (1.0, 3.0), (-1.0, 1.0))]
    unknown = ("L7", 0.3, 0.3, (0.2, 0.4), None)
    layers = [beyond, *within, unknown]

    def none(listed: str) -> str:
        return f"lbl: not compared: {listed} (n 8)"

    head = "lbl: beyond noise (|B - A| past the two 95% CIs' combined half-widths) in L0; within noise: "
    assert layers_by_noise(layers, "lbl", "n 8", none, count_many=True, why_none=" (copies)") == [
        head + "6 layers; no interval (copies): L7 (n 8)."]  # 8 layers, 6 within: counted
    assert layers_by_noise(layers, "lbl", "n 8", none) == [head + "L1; L2; L3; L4; L5; L6; no interval: L7 (n 8)."]
    assert layers_by_noise([*within, unknown], "lbl", "n 8", none, count_many=True) == [
        NOT_COMPARED + "lbl: not compared: L7 (n 8)"]
    every = "lbl: within noise in every layer (|B - A| inside the two 95% CIs' combined half-widths): "
    assert layers_by_noise(within, "lbl", "n 8", none, count_many=True) == [
        SAME + every + "L1; L2; L3; L4; L5; L6 (n 8)."]  # 6 layers: not many, listed
    seven = [*within, ("L7", 0.5, 0.5, (0.4, 0.6), (0.4, 0.6))]
    assert layers_by_noise(seven, "lbl", "n 8", none, count_many=True) == [SAME + every + "7 layers (n 8)."]
