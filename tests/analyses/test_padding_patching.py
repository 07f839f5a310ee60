"""The patching family on left-padded Tasks of mixed-length prompts (issue #19 item 3): every
per-example result equals the example run alone (`task.example(i)`), positions compared end
aligned (a row's last real token is the last position in both); a position that is padding in
a row is NaN there and left out of the cell's mean, which is then the mean of the per-example
values of the examples that have that position."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

import headscope as hs
from headscope.analyses.patching import engine
from headscope.analyses.patching.analysis import FULL_SITES, PatchingConfig, activation_patching, exact_sweep, run
from headscope.analyses.patching.attribution_patching import attribution_patching
from headscope.analyses.patching.causal_tracing import causal_tracing
from headscope.analyses.patching.inputs import resolve_metric
from headscope.analyses.patching.path_patching import path_patching
from headscope.analyses.patching.sites import site_types
from headscope.errors import TaskError
from headscope.hooks.sites import available_sites

ARCHS = ("gpt2", "llama3", "neox")
KEYS = ["site_type", "layer", "head", "pos"]
TOL = 1e-4


def _offsets(task) -> list[int]:
    """Per row: how many padding positions precede its first real token."""
    return (task.tokens.shape[1] - task.attention_mask.sum(1)).tolist()


def _per_example(task, frame_of, pos_col: str | None = "pos") -> pd.DataFrame:
    """frame_of(example task) for every row, positions moved to padded coordinates, column `ex`."""
    frames = []
    for i, offset in enumerate(_offsets(task)):
        df = frame_of(task.example(i)).copy()
        if pos_col is not None:
            df[pos_col] = df[pos_col] + offset
        frames.append(df.assign(ex=i))
    return pd.concat(frames, ignore_index=True)


def _sites(model) -> list[str]:
    have = set(available_sites(model))
    return [n for n in FULL_SITES if site_types(n)[0].hook(0) in have]


def _max_diff(a, b) -> float:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert not np.isnan(a).any() and not np.isnan(b).any()
    return float(np.abs(a - b).max())


@pytest.mark.parametrize("resumed", [True, False], ids=["resumed", "full"])
@pytest.mark.parametrize("arch", ARCHS)
def test_exact_sweep_rows_equal_each_example_alone(arch, resumed, arch_models, mixed_tasks, monkeypatch):
    """Every cell of every site type, per row: the padded sweep (resumed mid-model, or full passes)
    gives the example's own sweep at the end-aligned cell, and NaN where the cell is padding."""
    monkeypatch.setattr(engine, "RESUME_PADDED", resumed)
    model, task = arch_models(arch), mixed_tasks(arch)
    assert task.padded
    types = [st.check(model) for st in site_types(_sites(model))]
    pm = resolve_metric(task, "logit_diff")
    base, source, sweeps = exact_sweep(model, task.corrupted_tokens, task.tokens, types, pm,
                                       attention_mask=task.attention_mask)
    worst = 0.0
    for i, offset in enumerate(_offsets(task)):
        ex = task.example(i)
        ex_pm = resolve_metric(ex, "logit_diff")
        ex_base, ex_source, ex_sweeps = exact_sweep(model, ex.corrupted_tokens, ex.tokens, types, ex_pm)
        worst = max(worst, _max_diff(base[i], ex_base[0]), _max_diff(source[i], ex_source[0]))
        for st in types:
            cells, values, _ = sweeps[st.name]  # (the layers' null runs: test_patching_null_runs.py)
            ex_cells, ex_values, _ = ex_sweeps[st.name]
            ex_at = {(layer, head, None if pos is None else pos + offset): v
                     for (layer, head, pos), v in zip(ex_cells, ex_values[:, 0].tolist())}
            got = values[:, i].tolist()
            for cell, value in zip(cells, got):
                if cell[2] is not None and cell[2] < offset:  # padding in this row
                    assert np.isnan(value), (st.name, cell)
                else:
                    worst = max(worst, abs(value - ex_at[cell]))
    assert worst < TOL, worst


def _expected_cells(task, per_ex: pd.DataFrame, normalized: bool = False) -> pd.DataFrame:
    """Per cell: the mean of the per-example values over the examples that have it (value, effect,
    attribution), normalised with those examples' clean and corrupted means when asked."""
    def agg(g: pd.DataFrame) -> pd.Series:
        value, clean, corrupt, base = g["value"].mean(), g["clean"].mean(), g["corrupt"].mean(), g["base"].mean()
        attr = g["attribution"].mean()
        if normalized:
            scale = clean - corrupt
            return pd.Series({"value": (value - corrupt) / scale, "effect": (value - base) / scale,
                              "base": (base - corrupt) / scale, "attribution": attr / scale, "scale": scale,
                              "n_rows": len(g)})
        return pd.Series({"value": value, "effect": value - base, "base": base, "attribution": attr, "scale": 1.0,
                          "n_rows": len(g)})

    return per_ex.groupby(KEYS, dropna=False)[["value", "clean", "corrupt", "base", "attribution"]].apply(agg).reset_index()


@pytest.mark.parametrize("arch", ARCHS)
def test_activation_patching_cells_are_means_of_examples(arch, arch_models, mixed_tasks):
    """The Result of hs.activation_patching (noising, normalised logit difference, attribution
    estimates) on the padded task: each cell is the per-example analysis aggregated over the
    examples where the cell exists, normalised by their own clean and corrupted metrics."""
    model, task = arch_models(arch), mixed_tasks(arch)
    sites = ["resid_pre", "attn_out", "head_out", "head_out_by_pos"]
    result = hs.activation_patching(model, task, sites, direction="noise", metric="normalized_logit_diff",
                                    attribution=True)
    got = result.df

    def raw(ex):  # the example alone, raw logit differences: its clean, corrupted and base metrics
        res = activation_patching(model, ex, sites, direction="noise", metric="logit_diff", attribution=True)
        s = res.summary
        return res.df.assign(clean=s["clean_metric"], corrupt=s["corrupted_metric"], base=s["baseline"])

    raw_ex = _per_example(task, raw)
    want = _expected_cells(task, raw_ex, normalized=True)
    joined = got.merge(want, on=KEYS, suffixes=("", "_ex"), validate="one_to_one")
    assert len(joined) == len(got) == len(want)
    for column in ("value", "effect", "base", "attribution"):  # times the cell's denominator (see below)
        assert _max_diff(joined[column] * joined["scale"], joined[column + "_ex"] * joined["scale"]) < TOL, column
    assert (joined["n_rows"] == joined["n_rows_ex"]).all()  # the examples that have the cell's position
    # standalone attribution patching (denoising, normalised): mean estimate / mean (clean - corrupt)
    attr = attribution_patching(model, task, sites, direction="denoise", metric="normalized_logit_diff").df
    per_ex = _per_example(task, lambda ex: attribution_patching(model, ex, sites, direction="denoise",
                                                                metric="logit_diff").df)
    per_ex["scale"] = per_ex["ex"].map((raw_ex["clean"] - raw_ex["corrupt"]).groupby(raw_ex["ex"]).first())
    sums = per_ex.groupby(KEYS, dropna=False)[["attribution", "scale"]].mean().reset_index()
    both = attr.merge(sums, on=KEYS, suffixes=("", "_ex"), validate="one_to_one")
    assert len(both) == len(attr) == len(sums)
    # normalised numbers are compared times their denominator: a cell whose examples have a tiny
    # clean - corrupt gap magnifies float rounding
    assert _max_diff(both["attribution"] * both["scale"], both["attribution_ex"]) < TOL
    # #34: a position's token is named only where every prompt that has it has the same token there
    n_pos, seen = task.tokens.shape[1], {}
    for i, offset in enumerate(_offsets(task)):
        for j, tok in enumerate(model.to_str_tokens(task.example(i).tokens[0])):
            seen.setdefault(offset + j, set()).add(tok)
    labelled = got.dropna(subset=["pos"])
    want_token = [f"{p}: {next(iter(seen[p]))}" if len(seen[p]) == 1 else "" for p in labelled["pos"]]
    assert labelled["token"].tolist() == want_token and "" in want_token and any(want_token)  # both kinds
    assert (labelled["position_from_end"] == labelled["pos"] - n_pos).all()
    short = labelled[labelled["n_rows"] < len(task)]  # padding in some rows: value - base is the effect, not
    assert len(short) and _max_diff(short["value"] - short["base"], short["effect"]) < 1e-9  # value - baseline
    # #34: each top site's ci is the interval of its share, a ratio of means (each example alone): mean effect over
    # the mean clean - corrupt gap of the examples that have the cell, delta method with their covariance by hand
    # (review 16c B5; a small gap magnifies rounding: relative tolerance); n counts those examples
    from scipy import stats

    for kind in ("resid_pre", "head_out_by_pos"):
        for top in result.summary["top_sites"][kind][:3]:
            rows = raw_ex[(raw_ex.site_type == kind) & (raw_ex.layer == top["layer"]) & (raw_ex.pos == top["pos"])
                          & ((raw_ex["head"] == top["head"]) if top["head"] is not None else True)]
            e, g = rows["effect"].to_numpy(float), (rows["clean"] - rows["corrupt"]).to_numpy(float)
            r = e.mean() / g.mean()
            half = stats.t.ppf(0.975, len(e) - 1) * (e - r * g).std(ddof=1) / np.sqrt(len(e)) / abs(g.mean())
            want, x = (r - half, r + half), e
            assert top["n"] == len(x) and top["ci"] == pytest.approx(list(want), rel=1e-4, abs=1e-4), (kind, top)


@pytest.mark.parametrize("arch", ARCHS)
def test_run_quick_equals_examples_alone(arch, arch_models, mixed_tasks):
    """`patching` run with PatchingConfig.preset(quick=True): exact cells, attribution estimates,
    direct-path patching and the clean/corrupted summary metrics, against the examples alone."""
    model, task = arch_models(arch), mixed_tasks(arch)
    config = PatchingConfig.preset(quick=True)
    got = run(model, task, config)

    alone = [run(model, task.example(i), config) for i in range(len(task))]
    per_ex = pd.concat([r.df.assign(pos=r.df["pos"] + offset, ex=i, clean=r.summary["clean_metric"],
                                    corrupt=r.summary["corrupted_metric"], base=r.summary["baseline"])
                        for i, (r, offset) in enumerate(zip(alone, _offsets(task)))], ignore_index=True)
    want = _expected_cells(task, per_ex)
    joined = got.df.merge(want, on=KEYS, suffixes=("", "_ex"), validate="one_to_one")
    assert len(joined) == len(got.df) == len(want)
    for column in ("value", "effect", "attribution"):
        assert _max_diff(joined[column], joined[column + "_ex"]) < TOL, column
    for key, column in (("clean_metric", "clean"), ("corrupted_metric", "corrupt"), ("baseline", "base")):
        assert abs(got.summary[key] - per_ex.groupby("ex")[column].first().mean()) < TOL, key
    paths = got.tables["path_patching"]
    ex_paths = pd.concat([r.tables["path_patching"] for r in alone], ignore_index=True)
    mean = ex_paths.groupby(["sender_layer", "sender_head"])[["value", "effect"]].mean().reset_index()
    both = paths.merge(mean, on=["sender_layer", "sender_head"], suffixes=("", "_ex"), validate="one_to_one")
    assert len(both) == len(paths)
    assert _max_diff(both["value"], both["value_ex"]) < TOL
    assert _max_diff(both["effect"], both["effect_ex"]) < TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_path_patching_into_heads_equals_examples_alone(arch, arch_models, mixed_tasks):
    """Senders of layer 0 into layer 1's k inputs (padded keys in the receiver's attention),
    per receiver, noising: values are means of the per-example values."""
    model, task = arch_models(arch), mixed_tasks(arch)
    receivers = [(1, h) for h in range(model.facts.n_kv_heads)]
    kwargs = dict(component="k", per_receiver=True, direction="noise", metric="logit_diff")
    got = path_patching(model, task, receivers, **kwargs).df
    per_ex = _per_example(task, lambda ex: path_patching(model, ex, receivers, **kwargs).df, pos_col=None)
    keys = ["sender_layer", "sender_head", "receiver"]
    mean = per_ex.groupby(keys)[["value", "effect"]].mean().reset_index()
    both = got.merge(mean, on=keys, suffixes=("", "_ex"), validate="one_to_one")
    assert len(both) == len(got) > 0
    assert _max_diff(both["value"], both["value_ex"]) < TOL
    assert _max_diff(both["effect"], both["effect_ex"]) < TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_causal_tracing_equals_examples_alone(arch, arch_models, mixed_tasks):
    """Causal tracing with a subject span (padded coordinates) and one noise tensor, each example
    traced alone under its share of the noise: AIEs per end-aligned cell are means over the
    examples that have the position, restored likewise, and the role table pools the examples'
    cells (no padding role)."""
    model, task = arch_models(arch), mixed_tasks(arch)
    n_pos, n_samples = task.tokens.shape[1], 2
    subject = torch.tensor([[n_pos - 4, n_pos - 2]] * len(task))  # two tokens, end aligned
    task = dataclasses.replace(task, spans={"subject": subject})
    gen = torch.Generator().manual_seed(0)
    in_span = (torch.arange(n_pos) >= subject[:, :1]) & (torch.arange(n_pos) < subject[:, 1:])  # [batch, pos]
    noise = torch.randn(n_samples, len(task), n_pos, model.facts.d_model, generator=gen) * in_span[None, :, :, None]
    kwargs = dict(n_samples=n_samples, metric="logit_diff", window=1)
    got = causal_tracing(model, task, noise=noise, **kwargs)
    offsets = _offsets(task)
    frames, summaries = [], []
    for i, offset in enumerate(offsets):
        res = causal_tracing(model, task.example(i), noise=noise[:, i:i + 1, offset:], **kwargs)
        frames.append(res.df.assign(pos=res.df["pos"] + offset, ex=i))
        summaries.append(res.summary)
    per_ex = pd.concat(frames, ignore_index=True)
    want = per_ex.groupby(["kind", "layer", "pos"], dropna=False)[["ie", "restored"]].mean().reset_index()
    both = got.df.merge(want, on=["kind", "layer", "pos"], suffixes=("", "_ex"), validate="one_to_one")
    assert len(both) == len(got.df) == len(want)
    assert _max_diff(both["ie"], both["ie_ex"]) < TOL
    assert _max_diff(both["restored"], both["restored_ex"]) < TOL
    cells = both.dropna(subset=["pos"])  # #34: token and role only where every example with the position agrees
    for column in ("token", "role"):
        agreed = per_ex.dropna(subset=["pos"]).groupby("pos")[column].agg(lambda v: v.iloc[0] if v.nunique() == 1 else "")
        if column == "token":  # the example's own labels count from its first token: "j: tok" -> "pos: tok"
            agreed = per_ex.dropna(subset=["pos"]).assign(t=lambda d: d.token.str.split(": ", n=1).str[1]).groupby(
                "pos").t.agg(lambda v: v.iloc[0] if v.nunique() == 1 else None)
            agreed = pd.Series([f"{p}: {t}" if pd.notna(t) else "" for p, t in agreed.items()], index=agreed.index)
        assert cells[column].tolist() == cells["pos"].map(agreed).tolist(), column
    roles = per_ex.dropna(subset=["pos"]).groupby(["kind", "layer", "role"])["ie"].mean().reset_index()
    table = got.tables["causal_tracing_roles"].merge(roles, on=["kind", "layer", "role"], suffixes=("", "_ex"))
    assert len(table) == len(roles) == len(got.tables["causal_tracing_roles"])
    assert "padding" not in set(got.tables["causal_tracing_roles"]["role"])
    assert _max_diff(table["ie"], table["ie_ex"]) < TOL
    for key in ("clean_metric", "corrupted_metric"):  # each row's own last position
        assert abs(got.summary[key] - np.mean([s[key] for s in summaries])) < TOL, key


def test_padding_misuse_is_refused(arch_models, mixed_tasks):
    """Patching reads each row's answer at its last position: a right-padded decoder task raises
    TaskError; so does a causal-tracing subject span over a row's padding."""
    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    flipped = dataclasses.replace(task, attention_mask=task.attention_mask.flip(1))
    with pytest.raises(TaskError, match="left-padded"):
        activation_patching(model, flipped, ["head_out"], metric="logit_diff")
    on_padding = dataclasses.replace(task, spans={"subject": torch.tensor([[0, 2]] * len(task))})
    with pytest.raises(TaskError, match="covers padding"):
        causal_tracing(model, on_padding, n_samples=1)


def _patched_at(model, ex, hook_name: str, pos: int) -> float:
    """One prompt alone: its logit difference with the clean run's activation at hook_name, position pos,
    written over the corrupted run's, minus the unpatched corrupted run's."""
    answer, wrong, kept = int(ex.answer_tokens[0]), int(ex.wrong_answers[0]), {}

    def logit_diff(logits) -> float:
        return float(logits[0, -1, answer] - logits[0, -1, wrong])

    def write(act, hook):
        act = act.clone()
        act[:, pos] = kept["a"][:, pos]
        return act

    with torch.no_grad():
        model.run_with_hooks(ex.tokens, fwd=[(hook_name, lambda act, hook: kept.update(a=act.clone()))])
        patched = logit_diff(model.run_with_hooks(ex.corrupted_tokens, fwd=[(hook_name, write)]))
        return patched - logit_diff(model.run_with_hooks(ex.corrupted_tokens))


def test_effect_on_the_corrupted_token_equals_each_prompts_own_patched_pass(arch_models, mixed_tasks):
    """#34 review 5 (A5): prompts of different lengths have their corrupted token at different places from the end;
    summary["at_corrupted_token"] reads each row's effect at its own first differing position. Against plain hooked
    passes of each prompt alone (unpadded): the clean activation written over the corrupted run's at that position,
    the logit difference minus the unpatched one, averaged over the prompts, with its t interval."""
    from scipy import stats

    model, task = arch_models("llama3"), mixed_tasks("llama3")
    sites = ("resid_pre", "attn_out", "mlp_out")
    result = activation_patching(model, task, sites=sites)
    info = result.summary["at_corrupted_token"]
    expected, places = {}, []
    for i in range(task.tokens.shape[0]):
        ex = task.example(i)
        first = int(torch.nonzero(ex.tokens[0] != ex.corrupted_tokens[0])[0])  # [1, pos] each, no padding
        places.append(first - ex.tokens.shape[1])
        for name in sites:
            for layer in range(model.facts.n_layers):
                expected.setdefault((name, layer), []).append(_patched_at(model, ex, hs.site(name, layer), first))
    assert len(set(places)) > 1  # the corrupted token sits at different places from the end
    assert abs(np.mean(expected["resid_pre", 0])) > 1e-3  # the token carries an effect to compare
    assert info["from_end"] == {str(o): places.count(o) for o in set(places)} and info["n"] == len(places)
    counts = [int((task.example(i).tokens[0] != task.example(i).corrupted_tokens[0]).sum())
              for i in range(task.tokens.shape[0])]  # each prompt alone, unpadded
    assert info["positions_differ"] == [min(counts), max(counts)]
    differ = [int(p) - task.example(i).tokens.shape[1] for i in range(task.tokens.shape[0])
              for p in torch.nonzero(task.example(i).tokens[0] != task.example(i).corrupted_tokens[0])[:, 0]]
    assert len(info["differ_from_end"]) > 1  # every differing place, with the prompts that differ there
    assert info["differ_from_end"] == {str(o): differ.count(o) for o in sorted(set(differ))}
    assert result.summary["metric_at_last_position"] is True  # the logit difference is read at the last token
    for name in sites:
        for record in info["sites"][name]:
            effects = np.array(expected[name, record["layer"]])
            half = stats.t.ppf(0.975, len(effects) - 1) * effects.std(ddof=1) / np.sqrt(len(effects))
            assert record["n"] == len(effects)
            assert record["effect"] == pytest.approx(effects.mean(), abs=TOL)
            np.testing.assert_allclose(record["ci"], [effects.mean() - half, effects.mean() + half], atol=TOL)
    table = result.tables["corrupted_token"].set_index(["site_type", "layer"])
    gap = result.summary["clean_metric"] - result.summary["corrupted_metric"]
    if "gap_within_noise" in result.summary:  # review 14b-v C5: no share of a gap within noise
        gap = np.nan
    np.testing.assert_allclose(table.loc[("resid_pre", 0), "share_of_gap"], np.mean(expected["resid_pre", 0]) / gap,
                               atol=TOL)
    shares = result.df["share_of_gap"].to_numpy(dtype=float)
    np.testing.assert_allclose(shares, result.df["effect"].to_numpy(dtype=float) / gap)


def test_each_differing_position_is_aligned_over_every_prompt(arch_models, mixed_tasks, hf_of):
    """#34 review 12b A2: a corruption that changes two positions per prompt (a swap of two names) is aligned on each
    of them in order: summary at_corrupted_token.orders[k] reads every row's effect at its own (k+1)-th differing
    position. Against plain Hugging Face (LlamaForCausalLM, each prompt alone, unpadded): the clean run's input to
    decoder layer l at that position written over the corrupted run's, the logit difference minus the unpatched one."""
    model, task, hf = arch_models("llama3"), mixed_tasks("llama3"), hf_of("llama3")
    bad = task.tokens.clone()  # [B, pos]: two tokens changed per row, at places from the end that vary by row
    real = task.attention_mask.bool() if task.attention_mask is not None else torch.ones_like(bad, dtype=torch.bool)
    for r in range(bad.shape[0]):
        start = int(torch.nonzero(real[r])[0])
        for p in (start + 1, bad.shape[1] - 2):  # the prompt's second token and the one before its last
            bad[r, p] = (int(task.tokens[r, p]) + 7) % model.facts.d_vocab
    result = activation_patching(model, task, sites=("resid_pre",), metric="logit_diff", corrupted_tokens=bad)
    info = result.summary["at_corrupted_token"]
    assert info["positions_differ"] == [2, 2] and [o["order"] for o in info["orders"]] == [1, 2]

    def logit_diff(ids, r, hook=None) -> float:
        handle = hook and hf.model.layers[hook[0]].register_forward_pre_hook(hook[1], with_kwargs=True)
        try:
            with torch.no_grad():
                out = hf(ids).logits[0, -1]
        finally:
            if handle:
                handle.remove()
        return float(out[task.answer_tokens[r]] - out[task.wrong_answers[r]])

    expected, places, ends = {}, {1: [], 2: []}, {"clean": [], "corrupted": []}
    for r in range(bad.shape[0]):
        keep = real[r]
        clean, corrupt = task.tokens[r][keep][None], bad[r][keep][None]  # [1, pos] each, no padding
        where = torch.nonzero(clean[0] != corrupt[0])[:, 0].tolist()
        base = logit_diff(corrupt, r)
        ends["clean"].append(logit_diff(clean, r))
        ends["corrupted"].append(base)
        for order, pos in enumerate(where, start=1):
            places[order].append(pos - clean.shape[1])
            for layer in range(model.facts.n_layers):
                kept = {}

                def grab(mod, args, kwargs, kept=kept):
                    kept["h"] = (args[0] if args else kwargs["hidden_states"]).clone()

                def put(mod, args, kwargs, pos=pos, kept=kept):
                    h = (args[0] if args else kwargs["hidden_states"]).clone()
                    h[:, pos] = kept["h"][:, pos]
                    return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})

                logit_diff(clean, r, (layer, grab))
                expected.setdefault((order, layer), []).append(logit_diff(corrupt, r, (layer, put)) - base)
    assert np.mean(expected[2, 0]) != pytest.approx(np.mean(expected[1, 0]), abs=1e-3)  # two different measurements
    table = result.tables["corrupted_token"].set_index(["differing_position", "site_type", "layer"])
    for record in info["orders"]:
        order = record["order"]
        assert record["n"] == bad.shape[0] and record["from_end"] == {
            str(o): places[order].count(o) for o in set(places[order])}
        for row in record["sites"]["resid_pre"]:
            effects = expected[order, row["layer"]]
            assert row["n"] == len(effects)
            assert row["effect"] == pytest.approx(np.mean(effects), abs=1e-3, rel=1e-3)
            assert table.loc[(order, "resid_pre", row["layer"]), "effect"] == pytest.approx(row["effect"])
    assert info["sites"] == info["orders"][0]["sites"]  # the first order is the record older readers use
    from scipy import stats

    for which, values in ends.items():  # review 12c C6: the headline's clean and corrupted metrics carry a t interval
        x = np.array(values)
        half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
        np.testing.assert_allclose(result.summary[f"{which}_metric_ci"], [x.mean() - half, x.mean() + half], atol=1e-3)
    assert result.summary["metric_n"] == len(ends["clean"])


def test_path_patching_to_the_logits_gives_each_path_its_interval_over_the_prompts(arch_models, mixed_tasks, hf_of):
    """#34 review 12c B3: path patching's table and top_paths carry the 95% t interval of the per-prompt effects and
    n. Against plain Hugging Face (LlamaForCausalLM, each prompt alone, unpadded): head h's clean-minus-corrupted
    write (its slice of o_proj's input times its W_O columns) added to the corrupted run's final residual only."""
    from scipy import stats

    model, task, hf = arch_models("llama3"), mixed_tasks("llama3"), hf_of("llama3")
    got = path_patching(model, task, receivers="logits", direction="denoise", metric="logit_diff")
    heads, d = hf.config.num_attention_heads, hf.config.hidden_size // hf.config.num_attention_heads
    d = getattr(hf.config, "head_dim", None) or d
    real = task.attention_mask.bool()
    effects: dict[tuple[int, int], list[float]] = {}
    for r in range(task.tokens.shape[0]):
        clean, corrupt = task.tokens[r][real[r]][None], task.corrupted_tokens[r][real[r]][None]  # [1, pos]
        writes = {}
        for name, ids in (("clean", clean), ("corrupt", corrupt)):
            z = {}
            hooks = [hf.model.layers[l].self_attn.o_proj.register_forward_pre_hook(
                lambda m, a, l=l, z=z: z.__setitem__(l, a[0].detach())) for l in range(len(hf.model.layers))]
            with torch.no_grad():
                hf(ids)
            for h_ in hooks:
                h_.remove()
            writes[name] = z

        def logit_diff(extra=None, corrupt=corrupt, r=r) -> float:
            hook = extra is not None and hf.model.norm.register_forward_pre_hook(lambda m, a: (a[0] + extra,))
            with torch.no_grad():
                out = hf(corrupt).logits[0, -1]
            if hook:
                hook.remove()
            return float(out[task.answer_tokens[r]] - out[task.wrong_answers[r]])

        base = logit_diff()
        for layer, attn in enumerate(hf.model.layers):
            w = attn.self_attn.o_proj.weight  # [d_model, heads * d]
            for h in range(heads):
                piece = slice(h * d, (h + 1) * d)
                delta = (writes["clean"][layer][..., piece] - writes["corrupt"][layer][..., piece]) @ w[:, piece].T
                effects.setdefault((layer, h), []).append(logit_diff(delta) - base)
    table = got.df.set_index(["sender_layer", "sender_head"])
    for (layer, h), values in effects.items():
        x = np.array(values)
        half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
        row = table.loc[(layer, h)]
        assert row["effect"] == pytest.approx(x.mean(), abs=1e-3) and int(row["n_rows"]) == len(x)
        np.testing.assert_allclose([row["ci_low"], row["ci_high"]], [x.mean() - half, x.mean() + half], atol=1e-3)
    top = got.summary["top_paths"][0]
    assert top["n"] == len(real) and top["ci"] == [pytest.approx(v) for v in table.loc[tuple(top["sender"]),
                                                                                      ["ci_low", "ci_high"]]]
    assert got.summary["n_examples"] == len(real)


def _two_templates(model, corrupt_long: dict, corrupt_short: dict, prefix: str = ""):
    """Prompts of two lengths (4 of 'w1 w2 w3 w4 wN', 4 of 'w2 w3 w4 wN', the last word different in each; after
    `prefix`), each corrupted by replacing words (corrupt_*: word -> word), answer w7 against w8; and the summary of
    exact patching of resid_pre on them."""
    prompts = [f"{prefix}w1 w2 w3 w4 w{50 + i}" for i in range(4)] + [f"{prefix}w2 w3 w4 w{54 + i}" for i in range(4)]
    bad = [" ".join(corrupt_long.get(w, w) for w in p.split()) for p in prompts[:4]] + \
          [" ".join(corrupt_short.get(w, w) for w in p.split()) for p in prompts[4:]]
    task = hs.prompt_task(model, prompts, [" w7"] * 8, bad, [" w8"] * 8)
    return prompts, activation_patching(model, task, sites=("resid_pre",)).summary


def _cited_column(text: str) -> tuple[int, str]:
    """(the offset from the end, the parenthesis closing the sentence) of the finding's end-aligned cell."""
    import re

    cited = re.search(r"End-aligned \(cells counted from each prompt's end\), the largest residual cell away from the "
                      r"answer position is the resid_pre at layer \d, position (-\d) from the end.*? \(([^()]*)\)\.", text)
    assert cited, text
    return int(cited.group(1)), cited.group(2)


def test_the_column_record_does_not_grow_with_the_prompts_length(tiny_models):
    """The end-aligned column record (at_corrupted_token.column_tokens) holds only the columns of the top sites, the
    cells a finding can cite: 36 words in front of the prompts (42 positions) leave it at most TOP_N columns a site
    type (one here), each the column's most common clean token counted from the words (the finding's words on a
    cited column: the test below)."""
    from headscope.analyses.patching.analysis import TOP_N

    model = tiny_models["llama"]
    prefix = " ".join(f"w{10 + i % 30}" for i in range(36)) + " "
    prompts, s = _two_templates(model, {"w2": "w30", "w4": "w44"}, {"w4": "w44"}, prefix)
    held = s["at_corrupted_token"]["column_tokens"]
    assert s["n_positions"] >= 42 and 0 < len(held) <= TOP_N
    cited = {str(r["from_end"]) for records in s["top_sites"].values() for r in records if "from_end" in r}
    assert set(held) == cited
    words = [["<bos>", *p.split()] for p in prompts]
    for end, record in held.items():
        column = [w[int(end)] for w in words if len(w) >= -int(end)]
        assert (record["n"], record["of"]) == (column.count(record["token"]), len(column))
        assert record["n"] == max(column.count(t) for t in column)


def test_end_aligned_sentence_says_what_its_column_holds_one_token_or_a_mixture(tiny_models):
    """Issue #34 (a): templates of two lengths, the corruption at -4 and -2 from the end in the longer ones (4 prompts)
    and at -2 only in the shorter (4): summary at_corrupted_token.column_tokens gives each end-aligned column's most
    common clean token, on how many prompts, of those it reaches (counted here from the words), and the finding's
    end-aligned sentence says of its cell whether that column is one token, each prompt's changed token, or a mixture
    (patching_aligned.column_holds), instead of "averaging whatever tokens" for every column. Corrupted at -4 in the
    longer prompts and at -2 in the shorter only, every differing column is a mixture, and the sentence says so."""
    from headscope.reports.findings import finding
    from headscope.reports.patching_aligned import column_holds

    model = tiny_models["llama"]
    prompts, s = _two_templates(model, {"w2": "w30", "w4": "w44"}, {"w4": "w44"})
    info = s["at_corrupted_token"]
    assert info["from_end"] == {"-4": 4, "-2": 4}  # the first differing token sits at two places from the end
    words = [["<bos>", *p.split()] for p in prompts]  # the tiny tokenizer: one token a word, headscope's BOS first
    expect = {}
    for k in range(1, 7):
        column = [w[-k] for w in words if len(w) >= k]
        top = max(sorted(set(column), key=lambda t: model.tokenizer.convert_tokens_to_ids(t)), key=column.count)
        expect[str(-k)] = {"token": top, "n": column.count(top), "of": len(column)}
    cited = {str(r["from_end"]) for records in s["top_sites"].values() for r in records if "from_end" in r}
    assert info["column_tokens"] == {k: v for k, v in expect.items() if k in cited}  # only the top sites' columns
    said = {end: column_holds(s, {"from_end": end}) for end in (-1, -2, -3, -4) if str(end) in cited}
    assert {-2, -4} <= set(said) and said == {end: words for end, words in {
        -1: ("a mixture of tokens: 'w50' on 1 of the 8 prompts there, other tokens on the rest, changed in none", True),
        -2: ("not a mixture: each of the 8 prompts there has its changed token at this place", False),
        -3: ("one token: 'w3' on all 8 prompts there, changed in none", False),
        -4: ("a mixture of changed and unchanged tokens: 'w2' on all 8 prompts there, changed in 4 of them", True),
    }.items() if end in said}
    text = finding("patching", s)
    end, words_said = _cited_column(text)
    assert str(end) in cited
    assert words_said.endswith(said[end][0]) and "whatever tokens" not in text

    _, s = _two_templates(model, {"w2": "w30"}, {"w4": "w44"})  # -4 in the longer prompts, -2 in the shorter
    assert s["at_corrupted_token"]["from_end"] == {"-4": 4, "-2": 4}
    end, words_said = _cited_column(finding("patching", s))
    assert end in (-2, -4)  # layer 0's residual stream differs only where the prompts do
    assert words_said.endswith("a mixture of changed and unchanged tokens: "
                               f"{'w4' if end == -2 else 'w2'!r} on all 8 prompts there, changed in 4 of them")
