"""What `headscope compare` (reports/compare.py) reads and shares: one output folder (`Run`), the note
prefixes that sort its notes (SAME: agreement, said in its section; NOT_COMPARED: the page's "Not compared,
and why" list; anything else: a difference), the chance refusal, the noise verdict of two intervals and the
A/B overlay of curves.
"""
from __future__ import annotations

import base64
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from headscope.analyses.core.chance import does_not_copy
from headscope.errors import OutputError
from headscope.reports import io
from headscope.reports.provenance import section_provenance
from headscope.reports.render import escape, figure_png

SIDES = ("A", "B")
NOT_COMPARED = "(not compared) "  # prefix of a note for the page's "Not compared, and why" list
SAME = "(same) "  # prefix of a note that reports agreement: shown in its section, not listed as a difference
ROUNDING = "(rounding) "  # prefix of a number one model moved in two dtypes by the lower one's rounding: listed in one
# compact group after the differences, its premise said once (review 17b B1: 18 such moves, each with a 60-word note)
NO_INTERVAL = " (no interval recorded: whether this is beyond noise is not known)."


class Run:
    """One output folder: its manifest and, per analysis, its summary, tables and provenance (read lazily, once
    each: a compare page asks for the same ones many times; what they return is shared, so read-only)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._read: dict[tuple, tuple[tuple, Any]] = {}  # (what, name[, stem]) -> (files' stamps, what was read)
        try:
            self.manifest = json.loads((self.path / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise OutputError(f"{str(self.path)!r} is not a headscope output folder (no readable manifest.json: "
                              f"{getattr(err, 'strerror', None) or err}).") from None
        if not isinstance(self.manifest, dict):
            raise OutputError(f"{str(self.path)!r}: manifest.json is not a headscope manifest.")

    @property
    def label(self) -> str:
        model = (self.manifest.get("model") or {}).get("name", "?")
        config = self.manifest.get("config") or {}
        task = config.get("task") or "default task"
        dtype = f", {config['dtype']}" if config.get("dtype") else ""  # review 11b C6: float32 vs bfloat16 of one model
        return f"{model} ({task}, seed {self.manifest.get('seed', '?')}{dtype})"

    def label_against(self, other: Run) -> str:
        """`label`, with --quick and --n-examples where they differ from `other`'s (review 11b C6: the page's title
        line showed the same words for two runs that differ in a setting)."""
        mine, theirs = (r.manifest.get("config") or {} for r in (self, other))
        extra = []
        if bool(mine.get("quick")) != bool(theirs.get("quick")):
            extra.append("--quick" if mine.get("quick") else "not --quick")
        if mine.get("n_examples") != theirs.get("n_examples"):
            extra.append(f"--n-examples {mine.get('n_examples') or 'not set'}")
        return self.label[:-1] + "".join(f", {e}" for e in extra) + ")" if extra else self.label

    def _once(self, key: tuple, files: tuple[Path, ...], read: Any) -> Any:
        """read() the first time `key` is asked for, then what it gave while `files` keep their inode, modification
        time and size (a stat each, not a parse: a folder rewritten in place is read again)."""
        stamp = tuple(_stamp(f) for f in files)
        held = self._read.get(key)
        if held is None or held[0] != stamp:
            held = self._read[key] = (stamp, read())
        return held[1]

    def summary(self, name: str) -> dict[str, Any] | None:
        return self._once(("summary", name), (self.path / name / "summary.json",), lambda: self._summary(name))

    def _summary(self, name: str) -> dict[str, Any] | None:
        try:
            data = io.read_json(self.path / name / "summary.json")
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def status(self, name: str) -> str:
        """The manifest's status of analysis `name` ("" when it records none)."""
        status = self.manifest.get("status") or {}
        return str(status.get(name, "")) if isinstance(status, dict) else ""

    def provenance(self, name: str) -> dict[str, Any] | None:
        """The section provenance of analysis `name` (task, source, n, sample; reports/provenance.py), None
        when it has no summary."""
        if self.summary(name) is None:
            return None
        used = self.manifest.get("task_used") or {}
        folder = self.path / name
        return self._once(("provenance", name), (folder / "task.json", folder / "summary.json",
                                                 self.path / "manifest.json"), lambda: section_provenance(
            self.path / name, str(used.get(name, "")) if isinstance(used, dict) else ""))

    def why_blank(self, name: str) -> str:
        """Why this run has no result for analysis `name`: its manifest status, or that it did not run it."""
        analyses = (self.manifest.get("config") or {}).get("analyses") or []
        state = self.status(name)
        if state and state not in ("done", "done (resumed)"):
            return state
        if name not in analyses:
            return "not part of this run (not among its analyses)"
        return f"no readable {name}/summary.json in this folder"

    def table(self, name: str, stem: str) -> pd.DataFrame | None:
        return self._once(("table", name, stem), (self.path / name / f"{stem}.csv",), lambda: self._table(name, stem))

    def _table(self, name: str, stem: str) -> pd.DataFrame | None:
        try:
            return pd.read_csv(self.path / name / f"{stem}.csv")
        except (OSError, ValueError):  # missing, empty or unreadable: the comparison leaves it out
            return None


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """(inode, modification time in ns, size) of a file (an atomic rewrite is a new inode), None where it has none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _img(fig: Any, alt: str) -> str:
    png = figure_png(fig)
    plt.close(fig)
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" style="max-width:100%">'


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def _analysis_settings(run: Run, name: str) -> Mapping[str, Any]:
    settings = ((run.manifest.get("config") or {}).get("settings") or {}).get("analysis_configs") or {}
    found = settings.get(name) if isinstance(settings, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def task_identity(record: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """(task name, the user's file or None) of a section provenance (task.json, or the manifest's task_used line
    for its source); None where the task is not recorded. The source's wording of why a default was used is not
    part of it: one default task reached for two reasons is the same task."""
    task = record.get("task")
    if not isinstance(task, str) or not task:
        return None
    source = str(record.get("source") or "")
    from headscope.analyses.core.contract import SUBSET_MARK

    given = source.removeprefix("your task (").removesuffix(")") if source.startswith("your task (") else ""
    if SUBSET_MARK in source and source.startswith("your task ("):  # its one-token rows (contract.one_token_plan)
        given = source.removeprefix("your task (").split(SUBSET_MARK, 1)[0] + " (its one-token rows)"
    return task, given if "." in given else None  # a file (x.jsonl); a zoo task named by the user is that task


def task_words(record: Mapping[str, Any]) -> str:
    """'fruit_cloze.jsonl', 'the shipped sentences', 'the kv task': the task of a section provenance in words."""
    found = task_identity(record)
    if found is None:
        return "a task it did not record"
    task, given = found
    return given or ("the shipped sentences" if task == "sentences" else f"the {task} task")


def tasks_differ(a: Run, b: Run, name: str) -> str:
    """"A ran attribution on fruit_cloze.jsonl, B on the shipped sentences" where the two runs' analysis `name` ran on
    different tasks (task_identity: the task's name and the user's file, from each run's <name>/task.json and
    manifest task_used); "" where they ran on the same task, or either run does not record its task. Other examples
    of the same task are sampling, which the intervals compare allows for; another task is not."""
    pa, pb = a.provenance(name), b.provenance(name)
    if pa is None or pb is None:
        return ""
    ia, ib = task_identity(pa), task_identity(pb)
    if ia is None or ib is None or ia == ib:
        return ""
    wa, wb = task_words(pa), task_words(pb)
    if wa == wb:  # one name for two tasks (a file and a default of that name): the sources tell them apart
        wa, wb = (f"{w} ({p.get('source') or 'source not recorded'})" for w, p in ((wa, pa), (wb, pb)))
    return f"A ran {name} on {wa}, B on {wb}"


def models_differ(a: Run, b: Run) -> str:
    """"different models (x vs y, 12 vs 72 heads)" where the runs' manifests name different models ("" otherwise,
    and where the two folders hold the same weights after rounding: same_weights); the head counts from each run's
    heads summary where it has one."""
    names = [(r.manifest.get("model") or {}).get("name") for r in (a, b)]
    heads = [(r.summary("heads") or {}).get("n_heads") for r in (a, b)]
    if (names[0] == names[1] or same_weights(a, b)) and heads[0] == heads[1]:
        return ""
    count = "" if None in heads else f", {heads[0]} vs {heads[1]} heads" if heads[0] != heads[1] else f", {heads[0]} heads each"
    return f"different models ({names[0]} vs {names[1]}{count})"


PRECISION_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}  # significand bits: what rounds less


def dtype_step(low: str, sizes: list[float], floor: tuple[float, str] | None) -> tuple[float, str]:
    """(the rounding step a difference between numbers of these sizes is judged against in dtype `low`, its words):
    the larger of one `low` step at the largest size (2^(exponent - significand bits + 1)) and the runs' rounding
    floor (`floor`: its value first; comparison_floor)."""
    import math

    size = max(abs(x) for x in sizes)
    ulp = 2.0 ** (math.floor(math.log2(size)) - PRECISION_BITS[low] + 1) if size > 0 else 0.0
    if floor is not None and floor[0] >= ulp:
        return floor[0], f"the runs' rounding floor; one {low} step at {size:.3g} is {ulp:.3g}"
    return ulp, f"one {low} step at {size:.3g}"


def comparison_floor(sums: list[Mapping[str, Any]], gaps: list) -> tuple[float, str] | None:
    """(the larger of the two runs' rounding floors of the patching metric, in its raw units, and its words), or None
    where neither run records one or a run reports normalised effects (review 13a A4: f32 against bf16 ranked third
    cells of +0.022 and -0.029 answer log-probability, under bf16's 0.077, as "different sites"). A difference
    between the runs cannot be resolved below the coarser run's rounding, so a cell under it is no site to rank."""
    from headscope.reports.findings import _words

    floors = [(s.get("rounding_floor") or {}).get("floor") if isinstance(s.get("rounding_floor"), Mapping) else None
              for s in sums]
    if any(g is None for g in gaps) or not any(_number(f) for f in floors):
        return None
    side = max((i for i in (0, 1) if _number(floors[i])), key=lambda i: floors[i])
    value = float(floors[side])
    coarser = "" if floors[0] == floors[1] else f" of the coarser run ({SIDES[side]})"
    return value, f"under the rounding floor{coarser}, {value:.2g} {_words(sums[side].get('metric', ''))}".rstrip()


def _lower_dtype(a: Run, b: Run) -> str | None:
    """The runs' dtype of fewer significand bits (either where they are equal), None where either is not recorded."""
    dtypes = [str((r.manifest.get("config") or {}).get("dtype") or "").removeprefix("torch.") for r in (a, b)]
    if not all(d in PRECISION_BITS for d in dtypes):
        return None
    return min(dtypes, key=PRECISION_BITS.__getitem__)


@functools.lru_cache(maxsize=16)
def _rounded(folder: str, dtype: str, stamps: tuple) -> str | None:  # stamps: the weights' files, so a rewrite is read anew
    from headscope.models.fingerprint import rounded_fingerprint

    return rounded_fingerprint(folder, dtype)


def same_weights(a: Run, b: Run) -> str | None:
    """The lower of the runs' dtypes where their manifests name two different model folders that both still exist and
    hold the same weights once rounded to it (models/fingerprint.rounded_fingerprint; review 15c C1: ./m_fp32 and its
    bfloat16 copy ./m_bf16 are one model in two dtypes); None otherwise (one name, a folder gone, other weights)."""
    models = [r.manifest.get("model") or {} for r in (a, b)]
    sources = [m.get("source") for m in models]
    dtype = _lower_dtype(a, b)
    if dtype is None or models[0].get("name") == models[1].get("name") or not all(
            isinstance(s, str) and Path(s).is_dir() for s in sources):
        return None
    prints = [_rounded(str(Path(s).resolve()), dtype, tuple(_stamp(f) for f in sorted(Path(s).glob("*.safetensors"))))
              for s in sources]
    return dtype if prints[0] is not None and prints[0] == prints[1] else None


def same_model_words(a: Run, b: Run) -> str:
    """"the same model in another dtype: ..." where the runs name two folders of the same weights (same_weights), ""
    otherwise."""
    dtype = same_weights(a, b)
    if dtype is None:
        return ""
    return (f"the same model in another dtype: the two folders hold the same weights once rounded to {dtype}, "
            "safetensors tensors compared by name, shape and sampled rows")


def precision_only(a: Run, b: Run) -> tuple[int, int] | None:
    """(the side index of the higher precision, of the lower) where A and B are one model on one task, seed, --quick
    and --n-examples run at two dtypes (review 11b A7: float32 beside bfloat16; one model: one name, or two folders of
    the same weights, same_weights), so what differs between their
    results beyond the lower precision's rounding is the precision's; None otherwise."""
    ca, cb = ((r.manifest.get("config") or {}) for r in (a, b))
    same = [(c.get("task"), r.manifest.get("seed"), bool(c.get("quick")), c.get("n_examples")) for r, c in ((a, ca), (b, cb))]
    bits = [PRECISION_BITS.get(str(c.get("dtype"))) for c in (ca, cb)]
    if same[0] != same[1] or None in bits or bits[0] == bits[1]:
        return None
    names = [(r.manifest.get("model") or {}).get("name") for r in (a, b)]
    if names[0] != names[1] and same_weights(a, b) is None:  # two folders: one model only where the weights agree
        return None
    return (0, 1) if bits[0] > bits[1] else (1, 0)


def dtype_of(run: Run) -> str:
    return str((run.manifest.get("config") or {}).get("dtype") or "its dtype")


def chance_refusal(a: Run, b: Run, name: str) -> str:
    """"not compared: A at chance on its task" (or B, or both, or below chance) when either run's
    analysis `name` is at or below chance, as its own report says (a quantity relative to a clean
    metric at chance is refused there, so it is not compared here); "" otherwise."""
    where: dict[str, list[str]] = {}  # "at" / "below" -> the sides there
    for side, run in zip(SIDES, (a, b)):
        chance = (run.summary(name) or {}).get("chance")
        if isinstance(chance, Mapping) and chance.get("at_chance") is True:
            level = "not" if does_not_copy(chance) else "below" if chance.get("below_chance") is True else "at"
            where.setdefault(level, []).append(side)
    said = []
    for level, sides in where.items():
        one = len(sides) == 1
        task = "its task" if one else "their tasks"
        said.append(f"{' and '.join(sides)} {'does' if one else 'do'} not do {task} (accuracy 0 on a copy task)"
                    if level == "not" else f"{' and '.join(sides)} {level} chance on {task}")
    return "not compared: " + " and ".join(said) if said else ""


STYLES = {"A": {"linestyle": "-", "marker": "o", "linewidth": 3.0, "alpha": 0.55, "zorder": 2},  # wide, pale
          "B": {"linestyle": "--", "marker": "s", "linewidth": 1.4, "alpha": 1.0, "zorder": 3}}  # thin, on top


NATURAL_RANGE = {"accuracy": (0.0, 1.0), "probability": (0.0, 1.0), "cosine": (-1.0, 1.0),  # what a metric can take
                 "logprob": (None, 0.0)}  # a log-probability is at most 0


def _overlay(frames: list[pd.DataFrame | None], key: str, x: str, y: str, xlabel: str, ylabel: str, title: str, *,
             y_range: tuple[float | None, float | None] | None = None, integer_x: bool = False) -> Any:
    """Lines of A and B on one axis, one colour per `key` value: A wide, pale and solid with circles, B thin,
    dashed with squares and drawn on top, so a B line on A's is seen inside it rather than hidden; within a side
    each later line is narrower and above the earlier ones (A's gradient and gradient-recomputed both show).
    `y_range`: the metric's natural range (NATURAL_RANGE; a bounded metric gets the whole of it, so a flat curve
    at 0 is not drawn on -0.04..0.04; an open end is autoscaled); `integer_x`: ticks
    only at whole numbers (slots)."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4))
    keys = list(dict.fromkeys(k for f in frames if f is not None for k in f[key]))
    colours = dict(zip(keys, sns.color_palette(n_colors=max(1, len(keys)))))
    for side, frame in zip(SIDES, frames):
        if frame is None:
            continue
        groups = list(frame.groupby(key, sort=False))
        for i, (k, group) in enumerate(groups):  # each later line narrower and on top: one side's equal curves show too
            mean = group.groupby(x)[y].mean()
            style = {**STYLES[side], "linewidth": STYLES[side]["linewidth"] * (1 + (len(groups) - 1 - i) / len(groups)),
                     "zorder": STYLES[side]["zorder"] + i / len(groups)}
            ax.plot(mean.index, mean.to_numpy(), markersize=4, color=colours[k], label=f"{side}: {k}",
                    clip_on=y_range is None, **style)  # a point on a bound stays whole
    if y_range is not None:  # a bound of the metric is the axis's end; an open end is autoscaled
        low, high = ax.get_ylim()
        ax.set_ylim(low if y_range[0] is None else y_range[0], high if y_range[1] is None else y_range[1])
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


OVERLAY_TITLE = "A wide solid circles, B thin dashed squares"


VERDICT_TOLERANCE = 1e-6  # relative to the values' size: summaries round to 6 decimals (0.833333 + 0.083333 != 0.916667)


def noise_verdict(va: float, vb: float, ia: tuple[float, float] | None, ib: tuple[float, float] | None) -> str:
    """Whether |B - A| lies within the runs' own uncertainty: no larger than the sum of the two 95% intervals'
    half-widths is "within noise" (a conservative test: such intervals may still differ at p < 0.05). "Beyond" needs
    the difference to exceed them by more than the summaries' rounding (VERDICT_TOLERANCE): a difference that equals
    them, as two identical intervals with each value on the other's edge give, is within (review 11a A3)."""
    if ia is None or ib is None:
        return NO_INTERVAL
    half = (ia[1] - ia[0]) / 2 + (ib[1] - ib[0]) / 2
    diff = abs(vb - va)
    spans = f"95% CIs A [{ia[0]:.3g}, {ia[1]:.3g}], B [{ib[0]:.3g}, {ib[1]:.3g}]"
    slack = VERDICT_TOLERANCE * max(1.0, abs(va), abs(vb), half)
    if diff < half - slack:
        return f" (within noise: |B - A| = {diff:.3g} is inside the combined half-widths {half:.3g}; {spans})."
    if diff <= half + slack:
        return (f" (within noise: |B - A| = {diff:.3g} equals the combined half-widths {half:.3g}, not beyond them; "
                f"{spans})." if tuple(ia) != tuple(ib) else
                f" (within noise: |B - A| = {diff:.3g} equals the combined half-widths, not beyond them; the intervals "
                f"coincide, 95% CI [{ia[0]:.3g}, {ia[1]:.3g}] in both).")
    return f" (beyond noise: |B - A| = {diff:.3g} exceeds the combined half-widths {half:.3g}; {spans})."


def layers_by_noise(layers: Sequence[tuple[str, float, float, Any, Any]], lead: str, n: str,
                    unknown: Callable[[str], str], *, count_many: bool = False, why_none: str = "") -> list[str]:
    """One note on per-layer values of A and B (`layers`: each layer's words, its A and B values and 95% intervals),
    each layer grouped by noise_verdict: beyond noise where any layer is (naming those, then the others within and
    those without an interval), within noise in every layer (SAME), else the not-compared sentence `unknown` makes of
    the layers without an interval (NOT_COMPARED). `lead` opens the beyond and within sentences; n: the example count in
    words; count_many: over 6 layers, more than 3 within noise are counted, not listed (as the findings summarise);
    why_none: why a layer has no interval, after "no interval"."""
    kinds: dict[str, list[str]] = {"within": [], "beyond": [], "unknown": []}
    for text, va, vb, ia, ib in layers:
        verdict = noise_verdict(va, vb, ia, ib)
        kind = "within" if verdict.startswith(" (within") else "beyond" if verdict.startswith(" (beyond") else "unknown"
        kinds[kind].append(text)
    many = count_many and len(layers) > 6

    def listed(items: list[str]) -> str:
        return f"{len(items)} layers" if many and len(items) > 3 else "; ".join(items)

    if kinds["beyond"]:
        rest = f"; within noise: {listed(kinds['within'])}" if kinds["within"] else ""
        none = f"; no interval{why_none}: {'; '.join(kinds['unknown'])}" if kinds["unknown"] else ""
        return [f"{lead}: beyond noise (|B - A| past the two 95% CIs' combined half-widths) in "
                f"{'; '.join(kinds['beyond'])}{rest}{none} ({n})."]
    if kinds["unknown"]:
        return [NOT_COMPARED + unknown("; ".join(kinds["unknown"]))]
    return [SAME + f"{lead}: within noise in every layer (|B - A| inside the two 95% CIs' combined half-widths): "
            f"{listed(kinds['within'])} ({n})."]


def same_rows(a: Run, b: Run, name: str) -> bool:
    """Whether analysis `name` ran on the same examples in A and B as far as their provenance tells: one task and file,
    one example count, the same file rows where both record them, the same sample prompt."""
    pa, pb = a.provenance(name), b.provenance(name)
    if pa is None or pb is None or task_identity(pa) is None or task_identity(pa) != task_identity(pb):
        return False
    rows = [p.get("rows") if isinstance(p.get("rows"), list) else None for p in (pa, pb)]
    prompts = [(p.get("sample") or {}).get("prompt") for p in (pa, pb)]
    return (pa.get("n_examples") == pb.get("n_examples") and rows[0] == rows[1]
            and (None not in rows or (a.manifest.get("seed") == b.manifest.get("seed") and None not in prompts))
            and prompts[0] == prompts[1])


MEASURED_ROUNDING = {("heads", "unpruned"): "noise_floor"}  # (analysis, word of its headline): its rounding's summary key


def _used(run: Run, name: str, key: str) -> Any:
    """The value setting `key` of analysis `name` ran with where its budget changed it, else "preset"."""
    moved = ((run.provenance(name) or {}).get("budget_changed") or {}).get(key)
    return moved[1] if isinstance(moved, (list, tuple)) and len(moved) == 2 else "preset"


def _traced(run: Run) -> bool | None:
    """Whether the run's patching traced: True, False where it could not for its task (its summary's causal_tracing
    not_run, other than trace_samples 0; an older summary: no record though its trace_samples were above 0), None
    where not known (an older summary without a record whose budget set trace_samples to 0)."""
    trace = (run.summary("patching") or {}).get("causal_tracing")
    if isinstance(trace, Mapping):
        why = str(trace.get("not_run") or "")
        return True if not why else None if why == "trace_samples is 0" else False
    return None if _used(run, "patching", "trace_samples") in (0, None) else False


def idle_settings(a: Run, b: Run, name: str) -> frozenset[str]:
    """Settings of analysis `name` that changed nothing in either run, so a budget's change to them is no setting
    that differs (review 17a A2: "trace_samples A 1, B 0" was blamed for a difference though causal tracing runs on
    neither run's task): patching's trace_samples where neither run traced and at least one could not for its task;
    probes' capacity where neither run swept (verification 18v C1: A's sweep was skipped, the control task degenerate,
    and B's budget turned it off, so both probed at the default strength; a summary's `capacity` is the grid swept,
    None where none was)."""
    if name == "probes":
        sums = [r.summary("probes") for r in (a, b)]
        swept = [s is None or "capacity" not in s or s["capacity"] is not None for s in sums]  # not recorded: may have
        return frozenset() if any(swept) else frozenset({"capacity"})
    if name != "patching":
        return frozenset()
    traced = [_traced(r) for r in (a, b)]
    return frozenset({"trace_samples"}) if True not in traced and False in traced else frozenset()


def feeding_settings(name: str, label: str) -> frozenset[str] | None:
    """The settings of analysis `name` that the number compare labels `label` depends on (review 16cv B3: a saliency
    tau does not use the permutations; review 17a A2: patching's clean and corrupted prompts' metric uses none, its
    examples aside, which same_rows checks); None where not known here: every setting counts."""
    if name == "heads" and "unpruned" in label:  # review 17d B2: the unpruned metric uses no L0 or pruning setting
        return frozenset()
    if name == "patching" and "Pearson r at " in label:  # 17d B3: a site's r reads its own cells, not path patching
        return frozenset()  # or the other sites patched (a site one run left out has no r to compare)
    if name == "patching" and label.startswith(("patching clean prompts'", "patching corrupted prompts'")):
        return frozenset()
    if name != "attribution":
        return None
    if "permutation" in label:
        return frozenset({"n_permutations"})
    if "adversarial" in label:
        return frozenset({"adversarial_steps", "adversarial_epsilon"})
    if "Kendall tau" in label:  # IG's tau follows its steps; saliency, gradient x input and leave-one-out use none
        return frozenset({"n_steps", "ig_max_steps"} if "integrated gradients" in label else ())
    return None


def settings_apart(a: Run, b: Run, name: str, only: frozenset[str] | None = None) -> str:
    """The settings analysis `name` ran with that differ between A and B as their budgets left them ('n_permutations A
    20, B 10'; '' where none differs): a budget change is recorded as {setting: [preset, used]}, and a setting one run
    did not change ran at the other's preset (review 16c C1). only: just these settings (feeding_settings)."""
    changed = [((r.provenance(name) or {}).get("budget_changed") or {}) for r in (a, b)]
    out = []
    keys = (set(changed[0]) | set(changed[1])) - idle_settings(a, b, name)
    for key in sorted(keys if only is None else keys & only):
        pair = [c.get(key) if isinstance(c.get(key), (list, tuple)) and len(c.get(key)) == 2 else None for c in changed]
        preset = next((p[0] for p in pair if p is not None), None)
        used = [preset if p is None else p[1] for p in pair]
        if used[0] != used[1]:
            out.append(f"{key} A {used[0]}, B {used[1]}")
    return "; ".join(out)


def precision_verdict(a: Run, b: Run, name: str, va: float, vb: float, label: str = "") -> str | None:
    """Where A and B are one model run at two dtypes (precision_only) on the same examples of analysis `name`
    (same_rows): the words that replace a sampling-noise verdict (review 15c B3: the whole |B - A| of two runs of
    one model's weights on the same rows is the lower precision's rounding; the examples' intervals, which allow for
    another sample of rows, do not judge it), judged against the lower precision's rounding step of the number where
    its summary records one (MEASURED_ROUNDING: heads' unpruned metric, `noise_floor`); None otherwise."""
    sides = precision_only(a, b)
    if sides is None or not same_rows(a, b, name):
        return None
    low = dtype_of((a, b)[sides[1]])
    dtypes = f"A {dtype_of(a)}, B {dtype_of(b)}"
    if apart := settings_apart(a, b, name, feeding_settings(name, label)):  # review 16c C1; 16cv B3: the ones it uses
        return (f" (not a rounding difference alone: one model on the same examples in two dtypes ({dtypes}), but the "
                f"two runs' {name} settings differ ({apart}), so |B - A| = {abs(vb - va):.3g} is {low}'s rounding and "
                "the settings together, which neither run measures apart; the examples' sampling intervals do not "
                "judge it).")
    if va == vb:
        return f" (the same value in both dtypes ({dtypes}), one model on the same examples: {low}'s rounding does not move it)."
    said = (f" (a rounding difference, not sampling noise: one model on the same examples, run in two dtypes ({dtypes}), "
            f"so |B - A| = {abs(vb - va):.3g} is what {low}'s rounding does to this number; the examples' sampling "
            "intervals do not judge it")
    step = rounding_step(a, b, name, label, va, vb)
    if step is None:
        return said + ", and neither summary records this number's rounding to set it against)."
    inside = abs(vb - va) <= step[0]
    return said + (f"; {'within' if inside else 'more than'} {low}'s rounding step of it ({step[1]})"
                   + ("" if inside else ": the precision changes the computation here, not only its rounding") + ").")


PATCHING_METRICS = ("patching clean prompts'", "patching corrupted prompts'")  # compare_headlines' patching labels


def rounding_step(a: Run, b: Run, name: str, label: str, va: float, vb: float) -> tuple[float, str] | None:
    """(the lower precision's rounding step of a headline, its words) where the runs record one: heads' unpruned
    metric, its summary's measured `noise_floor` (MEASURED_ROUNDING); patching's clean and corrupted prompts' metric,
    the rule its top sites are judged by (dtype_step: one step at the number's size or the runs' rounding floor of the
    metric, whichever is larger; review 18a C4: the patching rows carried no step while the heads row had one), the
    floor where neither run records one being patching's own analytic one, one step at max(1, |metric|)
    (attribution_patching.rounding_floor); None otherwise."""
    sides = precision_only(a, b)
    if sides is None:
        return None
    low_run = (a, b)[sides[1]]
    key = next((k for (m, word), k in MEASURED_ROUNDING.items() if m == name and word in label), None)
    if key is not None:
        floor = (low_run.summary(name) or {}).get(key)
        return (float(floor), f"{float(floor):.2g}") if _number(floor) else None
    if name != "patching" or not label.startswith(PATCHING_METRICS):
        return None
    from headscope.reports.patching_words import _gap

    sums = [r.summary("patching") or {} for r in (a, b)]
    low = dtype_of(low_run)
    floor = comparison_floor(sums, [_gap(s) for s in sums])
    if floor is None:  # patching's analytic floor (eps x max(1, size)), never below one step at the number's size
        size = max([1.0] + [abs(float(s[k])) for s in sums for k in ("clean_metric", "corrupted_metric")
                            if _number(s.get(k))])
        step = 2.0 ** (1 - PRECISION_BITS[low]) * size
        return step, (f"{step:.3g}: one {low} rounding step of the metric at {size:.3g}, the clean and corrupted "
                      "metrics' size; neither run records a rounding floor")
    step, why = dtype_step(low, [va, vb], floor)
    return step, f"{step:.3g}: {why}"


def rounding_premise(a: Run, b: Run) -> str:
    """The one sentence the page's group of ROUNDING notes opens with ('' where A and B are not one model in two
    dtypes)."""
    sides = precision_only(a, b)
    if sides is None:
        return ""
    low = dtype_of((a, b)[sides[1]])
    return (f"Moved by {low}'s rounding: A and B are one model on the same examples in two dtypes (A {dtype_of(a)}, "
            f"B {dtype_of(b)}), so each |B - A| below is what {low}'s rounding does to that number, not sampling noise "
            "(the examples' sampling intervals do not judge it), set against its rounding step where the run records "
            "one; largest move relative to the number's size first:")


def rounding_note(a: Run, b: Run, name: str, label: str, va: float, vb: float, n: str) -> str | None:
    """The note of a headline that one model moved in two dtypes on the same examples (precision_verdict's premise),
    None where that premise does not hold: the same value (SAME); equal at the shown precision (SAME, with the digits
    that show the move, review 17b B1: "A 10.2, B 10.2" was listed as a difference); a move past the recorded rounding
    step, or of runs whose settings feeding it differ (a difference, with precision_verdict's words); else a ROUNDING
    note, short, whose premise the page says once (rounding_premise)."""
    from headscope.reports.patching_words import distinct_pair

    words = precision_verdict(a, b, name, va, vb, label)
    if words is None:
        return None
    if va == vb:
        return SAME + f"{label}: A {va:.3g}, B {vb:.3g} ({n})" + words
    if words.startswith(" (not a rounding difference alone") or "more than" in words:
        return f"{label}: A {va:.3g}, B {vb:.3g} ({n})" + words
    low = dtype_of((a, b)[precision_only(a, b)[1]])
    found = rounding_step(a, b, name, label, va, vb)
    step = f"; within {low}'s rounding step of it ({found[1]})" if found is not None else ""
    shown = distinct_pair(va, vb)
    if f"{va:.3g}" == f"{vb:.3g}":
        return (SAME + f"{label}: A {shown[0]}, B {shown[1]} ({n}): equal at the shown precision (3 significant "
                f"figures), moved below it by {low}'s rounding{step}.")
    step = step or "; neither run records this number's rounding step, so the move is not set against one"  # 19e B3
    return rounding_text(f"{label}: A {va:.3g}, B {vb:.3g}, |B - A| = {abs(vb - va):.3g} ({n}){step}.", va, vb)


class RoundingNote(str):
    """A ROUNDING note with the numbers it compares, `move` = |B - A| / max(|A|, |B|) (review 19v C2: the page
    sorted its rounding group by parsing the notes' 3-digit text, so A 18.4, B 18.4 read as no move)."""

    move: float


def rounding_text(text: str, va: float, vb: float) -> RoundingNote:
    """ROUNDING + `text`, carrying the relative move of the unrounded values `va` and `vb`."""
    note = RoundingNote(ROUNDING + text)
    note.move = abs(vb - va) / max(abs(va), abs(vb), 1e-300)
    return note


def rounding_move(note: str) -> float:
    """A ROUNDING note's relative move |B - A| / max(|A|, |B|), carried by the note (rounding_text); the page lists
    the largest first. A note built without its numbers sorts last (-1)."""
    return float(getattr(note, "move", -1.0))


def rounding_dtypes(a: Run, b: Run, name: str) -> tuple[str, str] | None:
    """(the lower dtype, 'A float32, B bfloat16') where A and B ran analysis `name` as one model on the same examples
    in two dtypes (precision_only, same_rows), None otherwise: what per-layer rows judge by rounding, not intervals."""
    sides = precision_only(a, b)
    if sides is None or not same_rows(a, b, name):
        return None
    return dtype_of((a, b)[sides[1]]), f"A {dtype_of(a)}, B {dtype_of(b)}"
