"""The shipped Tracr programs (models/tracr_checkpoints) load as plain GPT-2 directories without JAX
and compute their RASP program on every input of a small vocabulary, against the programs'
semantics written here in Python; their ground truth agrees with the sparsity of the saved weights."""
from __future__ import annotations

import itertools
import json
import sys

import pytest
import torch
from safetensors.torch import load_file

import headscope as hs
from headscope.models import tracr as T


def reverse_last(x):
    return x[0]


def hist_last(x):
    return x.count(x[-1])


def induction_last(x):
    hits = [j for j in range(1, len(x)) if x[j - 1] == x[-1]]
    return x[hits[0]] if len(hits) == 1 else None


@pytest.fixture(scope="module")
def tracr_models():
    return {name: hs.load_model(f"tracr/{name}", device="cpu") for name in T.names()}


def last_outputs(model, rows: list[list[int]]) -> list[str]:
    """The model's top token at the last position of "BOS x..." for rows of equal length."""
    tokens = model.to_tokens([" ".join(map(str, r)) for r in rows])
    with torch.no_grad():
        logits = model(tokens)[:, -1]  # [rows, vocab]
    return model.tokenizer.convert_ids_to_tokens(logits.argmax(-1).tolist())


def test_shipped_programs_compute_their_semantics_on_every_input(tracr_models):
    assert set(T.names()) >= {"reverse", "hist", "sort", "induction"}
    for name, fn, values in (("reverse", reverse_last, (1, 2, 3)), ("hist", hist_last, (1, 2, 3)),
                             ("induction", induction_last, (1, 2, 3, 4))):
        model = tracr_models[name]
        for length in range(1, 6):
            rows = [list(x) for x in itertools.product(values, repeat=length) if fn(list(x)) is not None]
            if rows:
                assert last_outputs(model, rows) == [str(fn(r)) for r in rows], (name, length)
    meta = T.metadata(T.checkpoint_dir("sort"))
    rows = [[*x, *x, meta["query_offset"] + r] for x in itertools.permutations(meta["values"], meta["n"])
            for r in range(meta["n"])]
    assert len(rows) == 72
    assert last_outputs(tracr_models["sort"], rows) == [str(sorted(r[:3])[r[-1] - 10]) for r in rows]
    # no JAX or Tracr was needed
    assert "jax" not in sys.modules and "tracr" not in sys.modules


def weight_truth(folder) -> tuple[set[str], set[tuple[str, str]]]:
    """Nodes and edges read off the saved GPT-2 weights alone: a head or MLP is used when its output
    matrix is nonzero; u -> v when a residual dimension u writes (first copy) is one v reads."""
    sd = load_file(str(folder / "model.safetensors"))
    n_layer = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("transformer.h."))
    width = sd["transformer.wte.weight"].shape[1]
    n_head = json.loads((folder / "config.json").read_text())["n_head"]
    hd = width // n_head
    nz = lambda m, dim: set((m.abs().sum(dim) > 0).nonzero().flatten().tolist())  # noqa: E731
    writes, reads = {"input": nz(sd["transformer.wte.weight"], 0)}, {}
    for l in range(n_layer):
        p = f"transformer.h.{l}."
        qkv = sd[p + "attn.c_attn.weight"]
        for h in range(n_head):
            out = sd[p + "attn.c_proj.weight"][h * hd:(h + 1) * hd]
            if out.abs().sum() > 0:
                writes[f"a{l}.h{h}"] = nz(out, 0)
                for i, x in enumerate("qkv"):
                    reads[f"a{l}.h{h}.{x}"] = (nz(qkv[:, i * width + h * hd:i * width + (h + 1) * hd], 1), (l, 0))
        if sd[p + "mlp.c_proj.weight"].abs().sum() > 0:
            writes[f"m{l}"] = nz(sd[p + "mlp.c_proj.weight"], 0)
            reads[f"m{l}"] = (nz(sd[p + "mlp.c_fc.weight"], 1), (l, 1))
    reads["logits"] = (nz(sd["lm_head.weight"], 0), (n_layer, 0))
    order = {"input": (-1, 0), **{k: (int(k.split(".")[0][1:]), int(k[0] == "m")) for k in writes if k != "input"}}
    edges = {(u, v) for v, (r, at) in reads.items() for u, w in writes.items() if order[u] < at and w & r}
    return set(writes) - {"input"}, edges


@pytest.mark.parametrize("name", ["reverse", "hist", "sort", "induction"])
def test_ground_truth_matches_the_weights(name):
    folder = T.checkpoint_dir(name)
    truth = T.metadata(folder)["truth"]
    nodes, edges = weight_truth(folder)
    assert nodes == set(truth["nodes"])
    assert edges == {tuple(e) for e in truth["edges"]}


def test_unknown_tracr_name_is_one_line():
    with pytest.raises(hs.errors.ModelNotFoundError, match="Unknown Tracr model 'nope'; shipped: "):
        hs.load_model("tracr/nope")


def test_engines_run_on_a_tracr_model(tracr_models):
    """capture and head_gates on reverse: the reading head (layer 3) attends from the last position
    to x[0] (position 1, after BOS); gating it off removes the answer, gates at 1 change nothing."""
    model = tracr_models["reverse"]
    rows = [list(x) for x in itertools.product((1, 2, 3), repeat=4)]
    tokens = model.to_tokens([" ".join(map(str, r)) for r in rows])
    acts = hs.capture(model, tokens, [hs.site("pattern", 3)])
    last = acts[hs.site("pattern", 3)][:, 0, -1]  # [rows, key]
    assert (last.argmax(-1) == 1).all() and float(last[:, 1].min()) > 0.99
    answers = torch.tensor(model.tokenizer.convert_tokens_to_ids([str(r[0]) for r in rows]))
    with torch.no_grad():
        plain = model(tokens)[:, -1]
        with hs.head_gates(model) as gates:
            same = model(tokens)[:, -1]
            gates.data[3, 0] = 0.0
            off = model(tokens)[:, -1]
    torch.testing.assert_close(same, plain)
    assert float(plain.gather(1, answers[:, None]).min()) > 0.99 and float(off.abs().max()) < 1e-4


def test_a_compiled_model_must_be_causal():
    """load_model takes a compiled Tracr model (duck-typed: no Tracr here) and refuses a
    bidirectional one in one line, before anything is written."""
    from types import SimpleNamespace

    fake = SimpleNamespace(params={}, residual_labels=[], input_encoder=None,
                           model_config=SimpleNamespace(causal=False, layer_norm=False))
    assert T.is_assembled(fake)
    with pytest.raises(hs.errors.UnsupportedModelError, match="compile the Tracr program with causal=True"):
        hs.load_model(fake)
