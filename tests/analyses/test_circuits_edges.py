"""Edge attribution (EAP, EAP-IG) and exact circuit faithfulness against TransformerLens 4.3's
attribution_patch / faithfulness, exact edge patching and a hand-built one-path model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformer_lens.tools.analysis.attribution_patching import (
    EdgeAttributionConfig,
    attribution_patch,
    faithfulness,
)

import headscope as hs
from headscope.analyses.circuits import edges as E
from headscope.analyses.circuits import faithfulness as F
from headscope.analyses.core.tasks import Task
from tests_support import build_tiny_model


def pair_task(n: int = 3, n_pos: int = 8, changed: int = 2, seed: int = 0) -> Task:
    """Random prompts whose corrupted copy differs at one position; random answer pairs."""
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(10, 60, (n, n_pos), generator=g)
    cor = tok.clone()
    cor[:, changed] = torch.randint(10, 60, (n,), generator=g)
    ans, wrong = torch.randint(10, 60, (n,), generator=g), torch.randint(10, 60, (n,), generator=g)
    return Task(name="pairs", tokens=tok, corrupted_tokens=cor, answers=ans, wrong_answers=wrong)


def clear_task(n: int = 4, n_pos: int = 8, seed: int = 0) -> Task:
    """Random prompts ending in token 11, their corrupted copies in 12, one answer pair (20 over 21) for all: a
    random model's direct path then moves the logit difference alike on every example (a clear gap)."""
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(10, 60, (n, n_pos), generator=g)
    cor = tok.clone()
    tok[:, -1], cor[:, -1] = 11, 12
    return Task(name="clear", tokens=tok, corrupted_tokens=cor, answers=torch.full((n,), 20),
                wrong_answers=torch.full((n,), 21))


def metric_fn(task: Task, i: int):
    return lambda logits: logits[0, -1, task.answers[i]] - logits[0, -1, task.wrong_answers[i]]


@pytest.fixture(scope="module")
def mha_models(tiny_models, tmp_path_factory):
    """GPT-2, NeoX (parallel attention and MLP) and a Llama without GQA (TransformerLens's edge
    graph refuses shared K/V heads)."""
    llama = build_tiny_model("llama", tmp_path_factory.mktemp("llama-mha"), num_key_value_heads=4)
    return {"gpt2": tiny_models["gpt2"], "neox": tiny_models["neox"], "llama": hs.load_model(str(llama), device="cpu")}


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_eap_equals_transformer_lens_edge_attribution(mha_models, family):
    model, task = mha_models[family], pair_task()
    graph, scores, _ = E.edge_scores(model, task, ig_steps=1)
    ref = torch.zeros_like(scores)
    for i in range(len(task)):  # TL: one pair per call, averaged over pairs
        res = attribution_patch(model.bridge, task.tokens[i:i + 1], task.corrupted_tokens[i:i + 1], metric_fn(task, i),
                                config=EdgeAttributionConfig(granularity="edge"))
        for (u, v), s in res.edge_scores.items():
            ref[graph.receivers.index(E.from_tl_node(v)), graph.senders.index(E.from_tl_node(u))] += s / len(task)
    assert ref.abs().max() > 1e-2
    torch.testing.assert_close(scores, ref, atol=1e-4, rtol=0)
    assert bool(((ref != 0) <= graph.reach).all())  # same graph: no TL edge outside ours
    assert graph.parallel is (family == "neox")  # the summary's edges_parallel_blocks: NeoX's MLP reads the block input


def hf_clean_eap(path, task: Task) -> dict[tuple[str, str], float]:
    """Clean-run EAP of every edge into an MLP or the logits, from plain Hugging Face GPT-2 and
    PyTorch hooks: the senders' writes (wte, each head's rows of c_proj, each MLP) on both prompts,
    the metric's gradient at ln_2's and ln_f's inputs on the clean run."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(str(path), attn_implementation="eager").eval()
    cfg = hf.config
    n_l, n_h, hd = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head
    writes, leaves, handles = {}, {}, []

    def keep(name):
        return lambda mod, args, out: writes.__setitem__(name, out.detach())

    def heads(layer):
        def pre(mod, args):
            z = args[0].detach()  # [b, pos, heads * hd]
            for h in range(n_h):
                writes[f"a{layer}.h{h}"] = z[..., h * hd:(h + 1) * hd] @ mod.weight[h * hd:(h + 1) * hd].detach()
        return pre

    def leaf(name):
        def pre(mod, args):
            leaves[name] = x = torch.zeros_like(args[0], requires_grad=True)
            return (args[0] + x,)
        return pre

    handles.append(hf.transformer.wte.register_forward_hook(keep("input")))
    for layer, block in enumerate(hf.transformer.h):
        handles.append(block.attn.c_proj.register_forward_pre_hook(heads(layer)))
        handles.append(block.mlp.register_forward_hook(keep(f"m{layer}")))
        handles.append(block.ln_2.register_forward_pre_hook(leaf(f"m{layer}")))
    handles.append(hf.transformer.ln_f.register_forward_pre_hook(leaf("logits")))
    try:
        with torch.no_grad():
            hf(task.corrupted_tokens)
        corrupt = dict(writes)
        logits = hf(task.tokens).logits  # the clean run, with gradients
        rows = torch.arange(len(task))
        metric = (logits[rows, -1, task.answers] - logits[rows, -1, task.wrong_answers]).sum()
        names = [f"m{l}" for l in range(n_l)] + ["logits"]
        grads = dict(zip(names, torch.autograd.grad(metric, [leaves[r] for r in names])))
    finally:
        for h in handles:
            h.remove()
    order = ["input"] + [x for l in range(n_l) for x in [f"a{l}.h{h}" for h in range(n_h)] + [f"m{l}"]]
    out = {}
    for r in names:
        last = len(order) if r == "logits" else order.index(r)  # senders written before the receiver
        for u in order[:last]:
            out[(u, r)] = float(((writes[u] - corrupt[u]) * grads[r]).sum() / len(task))
    return out


def test_clean_eap_equals_hugging_face_autograd(tiny_dirs, mha_models):
    model, task = mha_models["gpt2"], pair_task()
    graph, clean, info = E.edge_scores(model, task, method="eap-clean")
    ref = hf_clean_eap(tiny_dirs["gpt2"], task)
    ours = torch.tensor([float(clean[graph.receivers.index(r), graph.senders.index(u)]) for u, r in ref])
    want = torch.tensor(list(ref.values()), dtype=torch.float32)
    assert info["method"] == "eap-clean" and want.abs().max() > 1e-2
    torch.testing.assert_close(ours, want, atol=1e-4 * float(want.abs().max()), rtol=1e-4)
    # the conventions are different estimators (so the comparison above can tell them apart)
    _, noisy, _ = E.edge_scores(model, task, method="eap-denoising")
    assert float((noisy - clean).abs().max()) > 0.05 * float(clean.abs().max())
    _, ig1, _ = E.edge_scores(model, task, ig_steps=1, method="eap-ig")  # one IG step is the corrupted run
    torch.testing.assert_close(ig1, noisy, atol=1e-6, rtol=0)


def test_gqa_graph_reads_keys_and_values_per_kv_head(tiny_models):
    model = tiny_models["llama"]  # 4 query heads, 2 key-value heads
    graph, scores, _ = E.edge_scores(model, pair_task(n=2), ig_steps=1)
    assert "a0.kv1.k" in graph.receivers and "a0.h3.q" in graph.receivers and "a0.h2.k" not in graph.receivers
    assert len(graph.receivers) == 2 * (4 + 2 + 2 + 1) + 1
    assert scores[graph.receivers.index("a1.kv0.v")].abs().sum() > 0


def exact_edge_effect(model, task: Task, graph: E.EdgeGraph, receiver: str, sender: str) -> float:
    """Mean metric change when only `sender`'s clean-minus-corrupted write enters only `receiver`'s
    input of the corrupted run (plain bridge hooks on TransformerLens's split inputs)."""
    with E.edge_hooks_enabled(model.bridge):
        w_clean, _ = E.capture_writers(model, task.tokens)
        w_corr, base = E.capture_writers(model, task.corrupted_tokens)
        s = graph.senders.index(sender)
        delta = w_clean[:, :, s] - w_corr[:, :, s]  # [n, pos, d]
        if receiver == "logits":
            site, head = f"blocks.{graph.n_layers - 1}.hook_resid_post", None
        elif "." not in receiver:
            site, head = f"blocks.{receiver[1:]}.hook_mlp_in", None
        else:
            layer, h, kind = receiver.split(".")
            site, head = f"blocks.{layer[1:]}.attn.hook_{kind}_input", int(h.lstrip("hkv"))

        def add(x, hook):
            x = x.clone()
            if head is None:
                x += delta
            else:
                x[:, :, head] += delta
            return x

        with torch.no_grad():
            patched = E._forward(model, task.corrupted_tokens, None, [(site, add)])
    pos, wr = task.answer_positions(), task.wrong_answers
    return float((E.row_metric(patched, pos, task.answers, wr) - E.row_metric(base, pos, task.answers, wr)).mean())


def test_eap_ig_approaches_exact_edge_patching(mha_models):
    model, task = mha_models["gpt2"], pair_task(n=4, n_pos=6, changed=1, seed=3)
    corr = {}
    for steps in (1, 5, 20):
        graph, scores, _ = E.edge_scores(model, task, ig_steps=steps)
        if steps == 1:  # a handful of edges: the 12 strongest of EAP
            top = E.top_edges(graph, scores, 12)
            exact = torch.tensor([exact_edge_effect(model, task, graph, r, s) for s, r in zip(top.sender, top.receiver)])
        est = scores[torch.tensor(top.receiver_index.values), torch.tensor(top.sender_index.values)].float()
        corr[steps] = float(torch.corrcoef(torch.stack([est, exact]))[0, 1])
    print("EAP-IG vs exact edge patching, Pearson r by steps:", corr)
    assert corr[20] >= corr[1] - 0.02 and corr[5] >= corr[1] - 0.02
    assert corr[20] > 0.9


def one_path_model(tiny_dirs):
    """GPT-2 with every MLP and every head's output zeroed except head 0.2, whose attention is
    uniform (W_Q = W_K = 0)."""
    model = hs.load_model(str(tiny_dirs["gpt2"]), device="cpu")
    hf = model.bridge.original_model
    d, hd = 64, 16
    with torch.no_grad():
        for layer, block in enumerate(hf.transformer.h):
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
            keep = torch.zeros(d, 1)
            if layer == 0:
                keep[2 * hd:3 * hd] = 1
                block.attn.c_attn.weight[:, 2 * hd:3 * hd] = 0  # W_Q of head 2
                block.attn.c_attn.weight[:, d + 2 * hd:d + 3 * hd] = 0  # W_K of head 2
                block.attn.c_attn.bias[: 2 * d] = 0
            block.attn.c_proj.weight.mul_(keep)
    return model


def test_one_path_toy_ranks_that_path_first(tiny_dirs):
    """GPT-2 with every MLP and every head's output zeroed except head 0.2, whose attention is
    uniform (W_Q = W_K = 0): the only edges whose write changes and is read are input -> a0.h2.v
    and a0.h2 -> logits (the corrupted token is not at the answer position); all others score 0."""
    model = one_path_model(tiny_dirs)
    task = pair_task(n=4, n_pos=6, changed=1, seed=5)
    graph, scores, info = E.edge_scores(model, task, ig_steps=1)
    top = E.top_edges(graph, scores, graph.n_edges)
    assert {(top.sender[0], top.receiver[0]), (top.sender[1], top.receiver[1])} == {("input", "a0.h2.v"), ("a0.h2", "logits")}
    assert top.score.abs().iloc[2:].max() < 1e-6 * top.score.abs().iloc[0]
    # the head's write is linear in its values: a0.h2 -> logits is the whole first-order effect
    assert abs(top.set_index(["sender", "receiver"]).score[("a0.h2", "logits")]) > 1e-3
    keep, _ = F.keep_masks(graph, scores, [2], seed=0, draws=0)  # the path alone is the model
    metric = F.circuit_metrics(model, task, graph, keep).mean()
    assert abs(float(metric) - info["metric_clean"]) < 1e-4


def test_faithfulness_equals_transformer_lens(mha_models):
    model, task = mha_models["llama"], pair_task()
    graph, scores, info = E.edge_scores(model, task, ig_steps=1)
    keep, labels = F.keep_masks(graph, scores, [0, 6, graph.n_edges], seed=0)
    metric = F.circuit_metrics(model, task, graph, keep)  # [circuits, examples]
    # the empty circuit is the corrupted run, the whole graph the clean run
    assert abs(float(metric[0].mean()) - info["metric_corrupt"]) < 1e-4
    assert abs(float(metric[-4].mean()) - info["metric_clean"]) < 1e-4
    c, i = labels.index((6, "top", 0)), 1
    circuit = [(E.to_tl_node(graph.senders[s], p, graph.n_layers, False),
                 E.to_tl_node(graph.receivers[r], p, graph.n_layers, True))
               for r, s in zip(*[x.tolist() for x in keep[c].nonzero(as_tuple=True)]) for p in range(task.tokens.shape[1])]
    ref = faithfulness(model.bridge, task.tokens[i:i + 1], task.corrupted_tokens[i:i + 1], metric_fn(task, i), circuit)
    ours = (float(metric[c, i]) - ref.corrupt_metric) / (ref.full_metric - ref.corrupt_metric)
    assert abs(ours - ref.recovered) < 1e-4
    assert 0.02 < abs(ref.recovered) and abs(ref.recovered - 1) > 0.02  # a circuit that is neither empty nor whole


def test_run_adds_edges_faithfulness_and_figures(tiny_models):
    from headscope.analyses.circuits import CircuitsConfig, run
    from headscope.reports import plots_circuits

    task = clear_task(n=4)  # review 14b A4: pair_task's random pairs have a gap within noise (CPR 10.975 [-9.3, 16.1])
    quick, full = CircuitsConfig.preset(quick=True), CircuitsConfig.preset()
    assert (quick.edge_method, full.edge_method, full.ig_steps) == ("eap-clean", "eap-ig", 5)
    n_edges = 110  # GPT-2, 2 layers x 4 heads: 12 + 5 edges into layer 0, 72 + 10 into layer 1, 11 into the logits
    config = CircuitsConfig(quick=True, edge_method="eap-ig", ig_steps=2, k_values=(0, 3, n_edges))  # given sizes stay
    result = run(tiny_models["gpt2"], task, config)
    assert (result.summary["edge_method"], result.summary["ig_steps"]) == ("eap-ig", 2)
    assert result.summary["n_edges"] == n_edges and result.summary["edges_parallel_blocks"] is False  # GPT-2: sequential
    sweep, top = result.tables["faithfulness"], result.tables["edges"]
    assert set(sweep.k) == {0, 3, n_edges} and (sweep.circuit == "random").sum() == 9
    full = sweep[sweep.k == n_edges].faithfulness  # every edge of the graph: the clean run
    assert (full - 1).abs().max() < 1e-4 and sweep[sweep.k == 0].faithfulness.abs().max() < 1e-4
    assert len(top) == n_edges and top.score.abs().is_monotonic_decreasing
    assert result.summary["smallest_k_80"] in (3, n_edges) and len(result.summary["top_edges"]) == 10
    figs = plots_circuits.figures(result)
    assert {"circuits_faithfulness", "circuits_graph", "circuits_mib"} <= set(figs)
    # MIB's curve: top int(p * 110) edges, f exactly 0 for the empty circuit and 1 for the whole graph
    mib, s = result.tables["mib"], result.summary
    assert list(mib.k) == [0, 0, 0, 1, 2, 5, 11, 22, 55, 110]
    assert mib.faithfulness.iloc[-1] == 1.0 and (mib.faithfulness[mib.k == 0] == 0.0).all()
    x, f = mib.fraction.to_numpy(), mib.faithfulness.to_numpy()
    assert abs(s["mib_cpr"] - np.trapezoid(f, x)) < 1e-12 and abs(s["mib_cmd"] - np.trapezoid(np.abs(1 - f), x)) < 1e-12
    assert set(s["mib_faithfulness"]) == {"0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1"}
    assert s["mib_n_examples"] == 4 and s["mib_n_boot"] == F.N_BOOT  # the pairs; no draw with m(full) = m(empty)
    assert s["mib_cpr_ci"][0] <= s["mib_cpr_ci"][1] and s["mib_cmd_ci"][0] <= s["mib_cmd_ci"][1]
    legend = [t.get_text() for t in figs["circuits_mib"].axes[0].get_legend().get_texts()]
    assert f"CPR: area under f = {s['mib_cpr']:.3f}, 95% CI {s['mib_cpr_ci'][0]:.3f}-{s['mib_cpr_ci'][1]:.3f}" in legend
    assert "gap_within_noise" not in s and s["edge_metric"] == "logit difference (answer - wrong answer)"
    lens = result.tables["lens"]
    hits = lens[lens.is_answer].groupby("layer")["rank"].apply(lambda r: int((r == 0).sum()))
    assert s["lens_top1_count_per_layer"] == {str(k): v for k, v in hits.items()}


@pytest.mark.parametrize("wrong", [True, False])
def test_a_gap_within_noise_withholds_faithfulness_and_cpr_cmd(tiny_dirs, tiny_models, wrong):
    """Review 14b A4: CPR 0.828 (CI [-4.0, 2.9]) over a clean-corrupted gap of -0.0105 logits that patching calls
    noise. The gap, from plain Hugging Face logits and a scipy t interval, is within noise: the summary says so
    by patching's rule (gap_within_noise), the finding withholds faithfulness and CPR/CMD giving the gap and its
    interval, and the MIB figure's legend carries no number. Without wrong answers the metric is the answer's
    logit, named so (review 14b A3)."""
    from scipy import stats
    from transformers import AutoModelForCausalLM

    from headscope.analyses.circuits import CircuitsConfig, run
    from headscope.reports import plots_circuits
    from headscope.reports.findings import finding

    task = pair_task(n=4)
    if not wrong:
        task = Task(name="pairs", tokens=task.tokens, corrupted_tokens=task.corrupted_tokens, answers=task.answers)
    hf = AutoModelForCausalLM.from_pretrained(tiny_dirs["gpt2"]).eval()
    with torch.no_grad():
        clean, corrupt = hf(task.tokens).logits[:, -1].double(), hf(task.corrupted_tokens).logits[:, -1].double()
    rows = torch.arange(len(task))

    def metric(logits):  # [n]: answer minus wrong answer, or the answer's logit
        return logits[rows, task.answers] - (logits[rows, task.wrong_answers] if wrong else 0.0)

    diff = (metric(clean) - metric(corrupt)).numpy()  # [n]
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))
    lo, hi = diff.mean() - half, diff.mean() + half
    assert lo <= 0 <= hi  # the case under test: the interval contains 0
    result = run(tiny_models["gpt2"], task, CircuitsConfig(quick=True, k_values=(0, 110), lens_positions="answer"))
    s = result.summary
    small = s["gap_within_noise"]
    assert small["gap"] == pytest.approx(diff.mean(), abs=1e-5) and small["ci"] == pytest.approx([lo, hi], abs=1e-5)
    words = "logit difference" if wrong else "answer logit"
    assert s["edge_metric"] == ("logit difference (answer - wrong answer)" if wrong else "answer logit")
    text = finding("circuits", s)
    assert (f"Edge attribution ran (eap-clean scores, 110 edges, 4 examples), but the clean-corrupted gap of its "
            f"metric, the {words}, is within noise (mean gap {diff.mean():.3g} {words}, its 95% CI [{lo:.3g}, {hi:.3g}] "
            "over 4 pairs contains 0): the circuit's faithfulness, the circuit size reaching 80% of the gap and MIB's "
            "CPR/CMD are ratios over that gap, so none is reported.") in text, text
    assert "MIB's circuit metrics" not in text and "CPR 0" not in text and "CPR 1" not in text
    # review 15a C4: no ratio over noise is stored or drawn, only the edge scores
    assert set(result.tables) & {"faithfulness", "mib"} == set() and "edges" in result.tables
    assert not {"mib_cpr", "mib_cmd", "mib_faithfulness", "faithfulness_at_k", "smallest_k_80"} & set(s)
    figs = plots_circuits.figures(result)
    try:
        assert "circuits_graph" in figs and not {"circuits_faithfulness", "circuits_mib"} & set(figs)
    finally:
        import matplotlib.pyplot as plt

        plt.close("all")


def test_an_exact_zero_gap_follows_the_same_rule(tiny_models):
    """Review 15a C4: bfloat16's exact 0 gap (corrupted prompts equal to the clean ones here, so every pair's gap is
    0 by construction) skipped edges ('give the same metric') where float32's 1.4e-5 gap drew CPR 1.009: both are
    within noise by patching's rule, so both keep the edge scores and withhold every ratio alike."""
    from headscope.analyses.circuits import CircuitsConfig, run

    task = pair_task(n=3)
    task = Task(name="pairs", tokens=task.tokens, corrupted_tokens=task.tokens.clone(), answers=task.answers,
                wrong_answers=task.wrong_answers)
    s = run(tiny_models["gpt2"], task, CircuitsConfig(quick=True, k_values=(0, 110), lens_positions="answer")).summary
    assert "edges_skipped" not in s and s["gap_within_noise"]["gap"] == 0.0 and s["gap_within_noise"]["ci"] == [0, 0]
    assert "mib_cpr" not in s and s["n_edges"] == 110


def test_mib_areas_closed_form():
    """CPR and CMD over MIB's linear fractions 0.001..1 for curves with closed-form areas (the
    trapezoid rule is exact on piecewise-linear curves)."""
    x = np.array(F.MIB_FRACTIONS)
    cpr, cmd = F.mib_areas(x, x)  # f(p) = p
    assert abs(cpr - (1 - 0.001**2) / 2) < 1e-15 and abs(cmd - (0.999 - (1 - 0.001**2) / 2)) < 1e-15
    assert F.mib_areas(x, np.ones(10)) == (pytest.approx(0.999, abs=1e-15), 0.0)
    cpr, cmd = F.mib_areas(x, np.full(10, 2.0))  # above 1 counts against CMD, as |1 - f|
    assert abs(cpr - 1.998) < 1e-15 and abs(cmd - 0.999) < 1e-15
    # a step: 0 up to 10%, 1 from 20%: the one sloped trapezoid is half of 0.1 wide
    step = (x >= 0.2).astype(float)
    cpr, cmd = F.mib_areas(x, step)
    assert abs(cpr - (0.05 + 0.8)) < 1e-15 and abs(cmd - (0.099 + 0.05)) < 1e-15
    assert F.mib_k_values(110) == (0, 0, 0, 1, 2, 5, 11, 22, 55, 110)
    with pytest.raises(hs.errors.ConfigError):
        F.mib_areas(x, x[:3])


def test_mib_bootstrap_resamples_examples_jointly():
    """CPR and CMD's bootstrap: each resample draws examples once for every circuit (f is a ratio of
    means), recomputed here example by example with np.trapezoid over the same seeded draws."""
    x = np.array(F.MIB_FRACTIONS)
    rng = np.random.default_rng(7)
    n = 6
    empty, full = rng.normal(0.0, 0.3, n), rng.normal(3.0, 0.5, n)  # [n]
    curve = empty + np.clip(x[:, None] * 1.3, 0, 1.1) * (full - empty) + rng.normal(0, 0.2, (len(x), n))  # [F, n]
    boot = F.mib_bootstrap(np.vstack([empty, full, curve]), x, n_boot=200, seed=3)
    draws = np.random.default_rng(3).integers(0, n, size=(200, n))
    cprs, cmds = [], []
    for d in draws:
        e, fl = empty[d].mean(), full[d].mean()
        f = [(curve[i, d].mean() - e) / (fl - e) for i in range(len(x))]
        cprs.append(np.trapezoid(f, x))
        cmds.append(np.trapezoid(np.abs(1 - np.array(f)), x))
    assert np.allclose(boot["cpr_ci"], np.quantile(cprs, [0.025, 0.975]), atol=1e-12)
    assert np.allclose(boot["cmd_ci"], np.quantile(cmds, [0.025, 0.975]), atol=1e-12)
    assert (boot["n_examples"], boot["n_boot"], boot["level"]) == (n, 200, 0.95)
    assert F.mib_bootstrap(np.ones((12, 1)) * np.arange(12)[:, None], x)["cpr_ci"] is None  # one example: no interval
    same = F.mib_bootstrap(np.tile(np.vstack([empty, full, curve])[:, :1], (1, 5)), x)  # equal examples: no spread
    f0 = (curve[:, 0] - empty[0]) / (full[0] - empty[0])
    assert np.allclose(same["cpr_ci"], np.trapezoid(f0, x)) and np.allclose(same["cmd_ci"], np.trapezoid(np.abs(1 - f0), x))


def test_additivity_allows_bfloat16_rounding_and_refuses_a_post_norm_gemma2(tiny_dirs, arch_models):
    """#34 review 7 A2: a pre-norm model's residual stream is the sum of its writes to the rounding of its
    dtype; in bfloat16 that is ~0.005 of the clean-corrupted difference (a fixed 1e-3 refused it, blaming
    the architecture), so edges, faithfulness and CPR/CMD run. A post-norm Gemma 2 (float32) is off by far
    more than rounding and is still refused, and the circuits finding says so with the reason."""
    from headscope.analyses.circuits import analysis as circuits
    from headscope.errors import UnsupportedModelError
    from headscope.reports.findings import finding

    task = pair_task()
    low = hs.load_model(tiny_dirs["llama"], device="cpu", dtype=torch.bfloat16)
    with E.edge_hooks_enabled(low.bridge):
        w_c, _, r_c = E.capture_writers(low, task.tokens, None, final=True)
        w_k, _, r_k = E.capture_writers(low, task.corrupted_tokens, None, final=True)
    delta = (r_c - r_k).double()  # [b, pos, d] the final residual difference
    err = float((delta - (w_c - w_k).double().sum(2)).norm() / delta.norm())
    assert 1e-3 < err < 2.0 ** -7 * float((r_c.norm() + r_k.norm()) / delta.norm())  # over 1e-3, within bf16's step
    s = circuits.run(low, task, circuits.CircuitsConfig(quick=True, k_values=(1, 4))).summary
    assert "edges_skipped" not in s and s["n_edges"] > 0 and s["top_edges"]
    # CPR/CMD where the gap is clear, none over a gap within noise (review 15a C4), never both or neither
    assert ("mib_cpr" in s) != ("gap_within_noise" in s) and s.get("mib_cpr", 1.0) > 0

    gemma = arch_models("gemma2")  # float32, post-attention and post-MLP norms
    with E.edge_hooks_enabled(gemma.bridge):
        w_c, _, r_c = E.capture_writers(gemma, task.tokens, None, final=True)
        w_k, _, r_k = E.capture_writers(gemma, task.corrupted_tokens, None, final=True)
    # review 18d B1: the stream is the sum of the normed writes; what misses it is the heads' raw z_h W_O
    with pytest.raises(UnsupportedModelError, match=r"its blocks pass the heads' summed output through a post-attention "
                       r"norm before adding it to the residual stream \(post-norm\), so the heads' raw writes z_h W_O "
                       r"with the embedding and MLP writes miss the stream \(relative error .* beyond the 0.001 that "
                       r"float32 rounding allows\); through the norm a head's write depends on its layer's other heads"):
        E.check_additive(gemma, w_c, w_k, r_c, r_k)
    s = circuits.run(gemma, task, circuits.CircuitsConfig(quick=True, k_values=(1,))).summary
    assert "post-norm" in s["edges_skipped"] and "mib_cpr" not in s
    assert "the residual stream is not the sum" not in s["edges_skipped"]
    assert ("Edge attribution, the circuit's faithfulness and MIB's CPR/CMD were not run: "
            f"{s['edges_skipped'].rstrip('.')}.") in finding("circuits", s)
