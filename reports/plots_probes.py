"""Figures of the probes analysis: probe score against the control task, and selectivity, per layer.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables;
`figures(result)` draws both side by side in one figure.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline.
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from headscope.reports.findings import _num, and_join, ci_pair, level_words
from headscope.reports.plots import axes, label


def plot_probe(data: pd.DataFrame, *, metric: str = "accuracy", chance: float | None = None,
               control_degenerate: str | None = None, ax=None):
    """Probe score per layer (`data`: the Result's df) on the real labels and the control task, the
    quantity the finding states (analyses/probes/scores.py: pooled out-of-fold accuracy with its exact
    95% interval, or mean R^2 over folds with its t interval), with the majority-class rate as `chance`
    when given. The two lines differ in marker and line style and sit a little apart in x, so equal
    scores (a control learnt exactly) never hide the real line. A degenerate control (`control_degenerate`,
    the summary's reason: one label or a few word types, so any probe fits it) is not a result and is not drawn; the legend
    says so. Accuracy is drawn on its whole range, 0 to 1."""
    from headscope.analyses.probes.scores import layer_scores

    ax = axes(ax, (5, 4))
    table = layer_scores(data, classify=metric == "accuracy")
    styles = {"real": dict(marker="o", ls="-", color="tab:blue", zorder=3, offset=-0.06),
              "control": dict(marker="s", ls="--", color="tab:orange", zorder=2, offset=0.06, mfc="none")}
    for task in ("real",) if control_degenerate else ("real", "control"):
        g = table[table.task == task].sort_values("layer")
        if g.empty:
            continue
        style = dict(styles[task])
        x = g.layer.to_numpy(dtype=float) + style.pop("offset") * (not control_degenerate)  # apart only when both drawn
        err = [g.score - g.ci_low, g.ci_high - g.score]
        ax.errorbar(x, g.score, yerr=err, capsize=3, lw=1.5, label=task, **style)
    if chance is not None:
        ax.axhline(chance, color="grey", ls=":", lw=1, label="majority class")
    if control_degenerate:  # a legend entry without a mark: the control's absence, in words
        ax.plot([], [], ls="none", label="control: degenerate,\nnot plotted")
    if metric == "accuracy":
        ax.set_ylim(0, 1.03)  # the whole range (a little room for points at 1)
    ax.legend(fontsize="small", title="labels", loc="upper left", bbox_to_anchor=(1.01, 1))  # off the data
    ax.set(ylabel=f"{metric.replace('_', ' ')} (95% CI)", xlabel="layer", title="Linear probe vs control task")
    ax.set_xticks(sorted(data.layer.unique()))
    return ax


def plot_selectivity(data: pd.DataFrame, *, ax=None, why: str | None = None):
    """Selectivity per layer (`data`: the per_layer table) as the finding measures it: the real score minus
    max(control, 0), since a control R^2 below 0 (worse than the mean) is no floor to subtract and would
    overstate it (and could rank layers apart from the finding); such bars are hatched and the axis says so.
    When it is not measurable (every value missing, `why` the reason) the panel says so in words instead of
    empty axes read as 0."""
    ax = axes(ax, (5, 4))
    ax.set_title("Selectivity (Hewitt & Liang)")
    if data["selectivity"].isna().all():
        text = "not measurable" + (f": {why}" if why else ": the control task gives no score to subtract")
        ax.text(0.5, 0.5, textwrap.fill(text, 40), ha="center", va="center", transform=ax.transAxes, fontsize="small")
        ax.set(xticks=[], yticks=[])
        return ax
    score = next((c for c in ("r2", "accuracy", "score") if c in data), None)
    table = data[data["selectivity"].notna()].sort_values("layer")
    floored = (table["control"] < 0).to_numpy() if score else np.zeros(len(table), dtype=bool)  # [layers]
    values = (table[score] - table["control"].clip(lower=0)) if score else table["selectivity"]  # [layers]
    x = np.arange(len(table))
    bars = ax.bar(x, values.to_numpy(dtype=float), color="tab:blue", width=0.7)
    for bar, below in zip(bars, floored):
        if below:
            bar.set_hatch("//")
            bar.set_edgecolor("white")
    ax.set_xticks(x, [str(int(v)) for v in table["layer"]])
    ax.axhline(0, color="grey", lw=1)
    ylabel = "selectivity (real - control score)"
    if floored.any():
        ylabel = "selectivity (real - max(control, 0))\nhatched: control below 0, counted as 0"
    ax.set(ylabel=ylabel, xlabel="layer")
    return ax


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for a probes Result: one figure, score and selectivity side by side."""
    s = result.summary
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    plot_probe(result.df, metric=s.get("metric", "score"), chance=s.get("majority_baseline"),
               control_degenerate=s.get("control_degenerate"), ax=ax1)
    plot_selectivity(result.tables["per_layer"], ax=ax2, why=s.get("control_degenerate"))
    strength = ""
    if s.get("capacity_skipped"):
        strength = "; no capacity sweep (selectivity not measurable): default strength"
    elif isinstance(s.get("capacity"), Mapping):
        strength = "; each layer's most selective strength"
    fig.suptitle(f"labels: {label(s.get('labels', ''))}, site: {label(s.get('site', ''))}{strength}")
    fig.tight_layout()
    return {"probes": fig}


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "Linear probes per layer: how well a property can be read linearly from the activations, "
    "and selectivity (accuracy minus a control task with random labels per type, Hewitt & Liang "
    "2019). High accuracy with low selectivity means the probe memorises rather than reads."
)
CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "probes": "Left: probe score per layer on the real labels (circles, solid) and the control task (squares, dashed), "
              "the quantity the finding states: out-of-fold accuracy pooled over the examples with its exact 95% CI "
              "(regression: mean R^2 over folds with its t interval), accuracy on its whole 0-1 range; a control task "
              "that is degenerate (one label, or too few word types at the read position: any probe fits it exactly) "
              "is not plotted; dotted: the majority class. Right: selectivity = "
              "real minus control (minus 0 where the control's R^2 is below 0, hatched: a negative control would "
              "overstate it, as the finding says), or why it is not measurable. With the capacity sweep each layer "
              "shows its most selective regularisation strength; when selectivity is not measurable there is no sweep "
              "(default strength).",
}


def _layer(s: Mapping[str, Any], layer: Any) -> str:
    """'layer 0 (after block 0)': which stream a layer's probe read (circuits names it 1_pre)."""
    where = {"resid_post": "after block", "resid_pre": "before block", "resid_mid": "inside block"}.get(str(s.get("site")))
    return f"layer {layer}" + (f" ({where} {layer})" if where else "")


def _quantity(s: Mapping[str, Any], value: float, ci: Any, correct: Any = None, digits: int = 2) -> str:
    """'accuracy 0.55 (6 of 11 correct out of fold, 95% CI [0.23, 0.83])' or 'R^2 0.90 (mean over 5 folds, ...)'."""
    metric, n = s.get("metric", "accuracy"), _scored(s)
    inner = []
    if metric == "accuracy" and correct is not None and n:
        inner.append(f"{correct} of {n} correct out of fold")
    elif metric != "accuracy" and s.get("cv"):
        inner.append(f"mean over {s['cv']} folds")
    if ci_pair(ci):
        inner.append(f"95% CI [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]")
    name = "R^2" if metric == "r2" else metric
    return f"{name} {value:.{digits}f}" + (f" ({', '.join(inner)})" if inner else "")


def _examples(s: Mapping[str, Any]) -> str:
    """' (816 token positions of 64 sentences)' where each token of the shipped sentences is an example (the
    summary's shipped_text), else ' (40 examples)': one word for one unit, so a count of tokens is not read
    as a count of prompts."""
    n, text = s.get("n_examples"), s.get("shipped_text")
    if n is None:
        return ""
    sentences = text.get("n_sentences") if isinstance(text, Mapping) else None
    if s.get("example_unit") == "examples" and isinstance(sentences, int) and sentences:
        return f" ({n} token positions of {sentences} sentences)"
    return f" ({n} examples)"


def _scored(s: Mapping[str, Any]) -> Any:
    """The examples an accuracy is over: those scored (a row whose class its fold's training part lacks is
    not), else every example (summaries written before n_scored)."""
    scored = s.get("n_scored")
    return scored if isinstance(scored, int) and not isinstance(scored, bool) else s.get("n_examples")


def rows_sentence(s: Mapping[str, Any]) -> str:
    """Which examples the probe was fitted and scored on, where that is not all of them: '5 of 14 rows kept:
    9 have an answer no other row has (a class of one row is never both fitted and tested).' and '37 of the
    39 rows scored: 2 have an answer absent from the training part of the fold that tests them, which no
    probe can predict.', and, when the probe is right on every scored row while rows went unscored, that its
    accuracy over all rows 'equals the folds' ceiling (k of n rows have their class in training)'."""
    parts, unit = [], s.get("example_unit") or "rows"
    n, dropped = s.get("n_examples"), s.get("n_dropped_single_examples")
    if isinstance(n, int) and isinstance(dropped, int) and dropped > 0:
        why = s.get("dropped_reason") or f"{dropped} have a class no other example has"
        parts.append(f"{n} of {n + dropped} {unit} kept: {why} (a class of one example is never both fitted and "
                     "tested).")
    unscored, scored = s.get("n_unscored"), _scored(s)
    if isinstance(n, int) and isinstance(unscored, int) and unscored > 0 and isinstance(scored, int):
        why = s.get("unscored_reason") or f"{unscored} have a class absent from the training part of their fold"
        parts.append(f"{scored} of the {n} {unit} scored: {why}.")
        correct = s.get("best_correct")
        if isinstance(correct, int) and correct == scored:
            parts.append(f"The probe is right on every scored {unit[:-1]}; its accuracy over all {n} ({correct / n:.2f}) "
                         f"equals the folds' ceiling ({correct} of {n} {unit} have their class in training), a bound "
                         "set by the folds, not by the model.")
    return " ".join(parts)


def _stands_out(s: Mapping[str, Any]) -> tuple[bool, list[str], tuple[float, float] | None]:
    """(does the best layer stand out, the other layers tied with it, the best's interval). One rule for
    both: a layer is tied when its 95% interval overlaps the best layer's (its upper end at or above the
    best's lower end); the best stands out when no layer is tied. Summaries without per-layer intervals:
    the best layer stands out."""
    metric = s.get("metric", "accuracy")
    per = {k: _num(v) for k, v in (s.get(f"{metric}_per_layer") or {}).items()}
    cis = s.get("ci_per_layer") or {}
    per = {k: v for k, v in per.items() if v is not None and k in cis}
    if len(per) < 2:
        return True, [], None
    best = max(per, key=lambda k: per[k])
    low, high = cis[best]
    tied = sorted((k for k in per if k != best and cis[k][1] >= low), key=int)
    return not tied, tied, (low, high)


def _tied_sentence(s: Mapping[str, Any], tied: list[str], value: str, digits: int) -> str:
    """'layer 0 (after block 0) scores highest, R^2 0.975 (...); its interval overlaps layer 1's (R^2 0.967,
    95% CI [0.960, 0.974]), so these layers cannot be told apart': every tied layer named with its value and
    interval (the first 6; the rest counted)."""
    metric = s.get("metric", "accuracy")
    per, cis = s.get(f"{metric}_per_layer") or {}, s.get("ci_per_layer") or {}
    best = str(s.get("best_layer", "?"))

    def shown_as(k: str) -> tuple[str, ...]:  # a layer's value and interval as written
        return tuple(f"{_num(v):.{digits}f}" for v in (per[k], *cis[k]))

    # layers that read the same as the best (value and interval) share its place: no one of them "scores highest"
    # (verify 11a: layer 0 was named highest where layers 1 and 2 were also 1.00, 40 of 40)
    same = [k for k in tied if best in per and best in cis and shown_as(k) == shown_as(best)]
    tied = [k for k in tied if k not in same]
    if same:
        top = sorted([best, *same], key=int)
        where = {"resid_post": "after", "resid_pre": "before", "resid_mid": "inside"}.get(str(s.get("site")))
        blocks = f" ({where} blocks {and_join(top)})" if where else ""
        head = f"layers {and_join(top)}{blocks} each score {value}"
        if not tied:
            return f"{head}, so these layers cannot be told apart"
        best_said = head
    name = "R^2" if metric == "r2" else metric
    folds = f" over {s['cv']} folds" if metric != "accuracy" and s.get("cv") else ""
    one = len(tied) == 1
    shown = [f"layer {k}{chr(39) + 's' if one else ''} ({name} {per[k]:.{digits}f}, 95% CI{folds} "
             f"[{cis[k][0]:.{digits}f}, {cis[k][1]:.{digits}f}])" for k in tied[:6]]
    more = f" and {len(tied) - 6} more" if len(tied) > 6 else ""
    listed = ", ".join(shown[:-1]) + (f", {shown[-1]}{more}" if more else f" and {shown[-1]}")
    whose = shown[0] if one else f"those of {listed}"
    if same:
        return f"{best_said}; their intervals overlap {whose}, so these layers cannot be told apart"
    return (f"{_layer(s, s.get('best_layer', '?'))} scores highest, {value}; its interval overlaps {whose}, so "
            f"{'the two' if one else 'these layers'} cannot be told apart")


def baseline(rate: float) -> str:
    """The majority baseline as every probes sentence prints it, to 3 significant figures (review 16b B3: "0.17" and
    "0.175" for one 7/40 in one finding)."""
    return f"{rate:.3g}"


def correction_words(s: Mapping[str, Any]) -> str:
    """How the chance verdict on the best layer was corrected for choosing it, and how close it is (review 15a B1:
    above chance at p = 0.013 in float32, at chance in bfloat16, the best of 3 layers uncorrected): '' for an
    uncorrected entry."""
    entry = s.get("chance")
    if not isinstance(entry, Mapping) or entry.get("correction") != "bonferroni":
        return ""
    m, p, raw = _num(entry.get("n_compared")), _num(entry.get("p_value")), _num(entry.get("p_value_uncorrected"))
    alpha, level = _num(entry.get("alpha")) or 0.05, _num(entry.get("ci_level"))  # the family's alpha; the corrected level
    if m is None or p is None or raw is None:
        return ""
    if entry.get("below_chance"):  # review 16d B1: significantly below chance is not "at chance, narrowly"
        verdict, span = (f"below chance (corrected p under alpha {alpha:g}): the probe scores systematically worse than "
                         "always guessing the majority class, which learning the property cannot cause; it points to "
                         "the split or the fit (held-out classes rare in the training folds, or a probe fitting noise), "
                         "not to information in the layer"), ""
    elif entry.get("at_chance"):  # the opening sentence gives the corrected interval
        narrowly = alpha <= p < 2 * alpha
        floor = _num(entry.get("floor"))
        verdict, span = "at chance" + (", narrowly (corrected p under twice the threshold)" if narrowly else ""), ""
        if p < alpha:  # review 18a A1: the test rejects chance, the effect floor does not (not a contradiction)
            verdict = (f"at chance all the same: the gain over the majority baseline is under the {floor:g} floor"
                       if floor else "at chance all the same")
    else:
        verdict = "above chance" + (f", marginally (corrected p between {alpha / 5:g} and {alpha:g})"
                                    if p >= alpha / 5 else "")
        ci = entry.get("ci")
        span = (f"; its {level_words(level)} exact interval [{ci[0]:.3g}, {ci[1]:.3g}] against the majority baseline "
                f"{baseline(_num(entry.get('chance_value')) or 0)}" if level is not None and ci_pair(ci) else "")
    return (f"The chance test takes the best of {m:.0f} layers, so it is Bonferroni-corrected for that choice "
            f"(alpha {alpha:g}/{m:.0f}{span}): corrected p = {p:.2g} (uncorrected {raw:.2g}), {verdict}.")


def chance_sentence(entry: Mapping[str, Any], s: Mapping[str, Any]) -> str:
    """The opening when the probe is at chance (reports.findings.finding calls it): an interval too wide
    to tell chance from a good probe (its upper end at least halfway from the majority rate to perfect)
    is said to be underpowered, with n, classes and the interval; otherwise the shared chance sentence."""
    from headscope.reports.findings import chance_sentence as shared

    ci, level, mean = entry.get("ci"), _num(entry.get("chance_value")), _num(entry.get("mean"))
    if not ci_pair(ci) or level is None or mean is None or entry.get("below_chance") or ci[1] < level + (1 - level) / 2:
        return shared(entry, "probes")
    n, classes = _scored(s), s.get("n_classes")
    per = f", about {n / classes:.0f} per class" if n and classes else ""
    who = f" with {n} examples" + (f" ({classes} classes{per})" if classes else "") if n else ""
    shown = s.get("best_ci") if ci_pair(s.get("best_ci")) else ci  # the 95% interval _quantity names (the entry's
    value = _quantity(s, mean, shown, s.get("best_correct"))  # may be Bonferroni-widened: correction_words gives it)
    return (f"The probe cannot be told from chance{who}: {value} holds both the majority baseline {baseline(level)} and "
            f"{baseline(level + (1 - level) / 2)}, halfway from it to perfect accuracy. The test is underpowered (not evidence "
            "that the property is absent); relative findings are not reported.")


def read_words(s: Mapping[str, Any]) -> str:
    """Where each prompt was read, where its prompts hold the mask token (review 15c B2: an answer probe read at </s>
    while every prompt had a <mask> where the answer goes): at the mask, or why not; '' otherwise."""
    mask, k = s.get("mask_token") or "[MASK]", _num(s.get("n_mask_prompts"))
    if s.get("read_at") == "mask":
        return f"Each prompt is read at its {mask} token, where its answer goes."
    if not k:
        return ""
    n = _num(s.get("n_examples"))
    of = f" of {n:.0f}" if n is not None else ""
    where = "its last real token" if s.get("read_at") == "last" else "the configured position"
    return (f"{k:.0f}{of} prompts hold {mask}, but not every prompt exactly one, so each prompt is read at {where}, "
            f"not at {mask}: this is not the decodability of the answer where the model fills it.")


def finding(s: Mapping[str, Any]) -> str:
    """Which layer (if any) stands out, its score with its interval (scores.py: one quantity throughout)
    against the majority baseline, selectivity, and how each layer's strength was chosen. A probe at
    chance (the summary's chance entry) states nothing relative: the opening sentence says why."""
    from headscope.reports.findings import _chance

    metric = s.get("metric", "accuracy")
    best = _num(s.get(f"best_{metric}"))
    if best is None:
        return ""
    parts = []
    if _chance(s) is None:
        majority = _num(s.get("majority_baseline"))
        value = _quantity(s, best, s.get("best_ci"), s.get("best_correct"))
        if not s.get("best_ci"):  # an older summary: the fold spread
            sd, folds = _num(s.get("best_std")), s.get("cv")
            value = ("R^2" if metric == "r2" else metric) + f" {best:.2f}"
            value += f" (sd {sd:.2f} over {folds} folds)" if sd is not None and folds else ""
        against = f" against a majority baseline of {baseline(majority)}" if majority is not None else ""
        examples = _examples(s)
        out, tied, ci = _stands_out(s)
        if out:
            parts.append(f"The {s.get('labels', '')} probe is best at {_layer(s, s.get('best_layer', '?'))} with "
                         f"{value}{against}{examples}.")
        else:  # intervals narrower than 0.05 need a third digit to show where they overlap
            digits = 3 if ci[1] - ci[0] < 0.05 else 2
            value = _quantity(s, best, s.get("best_ci"), s.get("best_correct"), digits=digits)
            parts.append(f"No layer stands out for the {s.get('labels', '')} probe{examples}: "
                         f"{_tied_sentence(s, tied, value + against, digits)}.")
        if majority is not None and best <= majority + 0.02 and "chance" not in s:
            parts.append("That is chance level: the property is not linearly readable from these activations.")
    if correction_words(s):
        parts.append(correction_words(s))
    if read_words(s):
        parts.append(read_words(s))
    if rows_sentence(s):
        parts.append(rows_sentence(s))
    sel, control = _num(s.get("best_selectivity")), _num(s.get("best_control"))
    if _chance(s) is not None:
        sel = None
    if sel is not None and metric == "r2" and control is not None and control < 0 and best is not None:
        floor = best - max(control, 0.0)
        parts.append(f"The control task's R^2 is {control:.2f}, below 0 (worse than predicting the mean), so score minus "
                     f"control ({sel:.2f}) overstates selectivity; against the control's floor of 0 it is {floor:.2f}.")
    elif s.get("control_degenerate"):
        parts.append(f"Selectivity cannot be measured on this task: {s['control_degenerate']}."
                     + (" With fewer word types than classes the word alone cannot give the label, so a score above "
                        "the majority baseline is read from elsewhere in the context." if _chance(s) is None
                        and _num(s.get("majority_baseline")) is not None and _num(s.get("n_word_types")) is not None
                        and _num(s.get("n_classes")) is not None and s["n_word_types"] < s["n_classes"] else ""))
    elif sel is not None:
        parts.append(f"Selectivity (score minus the control task) is {sel:.2f}"
                     + ("; below 0 the control task (random labels per word type) is easier to fit than the real "
                        "labels, so this probe shows no evidence that the property is read rather than memorised."
                        if sel < 0 else "; low selectivity means the probe memorises rather than reads."
                        if sel < 0.1 else "."))
    capacity = s.get("capacity")
    if s.get("capacity_skipped"):
        parts.append(f"No capacity sweep: {s['capacity_skipped']}.")
    elif isinstance(capacity, Mapping) and capacity.get("grid") and not s.get("control_degenerate") and _chance(s) is None:
        first = s.get("first_selective_layer")
        grid = ", ".join(f"{v:g}" for v in capacity["grid"])
        where = (f"the first layer whose most selective probe reaches selectivity 0.5 is layer {first}" if first is not None
                 else "no layer's most selective probe reaches selectivity 0.5")
        parts.append(f"Each layer reports its most selective probe over {capacity.get('param', 'C')} in {{{grid}}} "
                     f"(Hewitt & Liang's capacity sweep): {where}.")
    return " ".join(parts)
