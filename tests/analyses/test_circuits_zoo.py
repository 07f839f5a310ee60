"""What the circuits analysis finds on the two shipped zoo models (#23), each claim checked against an
independent reading: head roles from attention patterns, and exact path patching for IOI."""
import pytest
import torch

import headscope as hs
from headscope.analyses.circuits.faithfulness import circuit_discovery
from headscope.analyses.core.tasks import zoo
from headscope.analyses.patching.path_patching import path_patching

pytestmark = pytest.mark.slow
ZOO = ("zoo/synth-llama", "zoo/synth-gpt2")


@pytest.fixture(scope="module")
def zoo_models():
    return {name: hs.load_model(name, device="cpu") for name in ZOO}


def pattern_roles(model, threshold: float = 0.4) -> tuple[set, set]:
    """(previous-token heads, induction heads) from attention patterns on repeated random sequences:
    the mean attention to the previous token, and in the second copy to the token after the current
    token's first occurrence."""
    n = 24
    task = zoo(model, "induction", n_examples=32, seed=5, length=n, position=20)
    L, H = model.facts.n_layers, model.facts.n_heads
    acts = hs.capture(model, task.tokens, [hs.site("pattern", layer) for layer in range(L)])
    prev, induction = set(), set()
    for layer in range(L):
        p = acts[hs.site("pattern", layer)]  # [batch, head, q, k]
        q = torch.arange(2, p.shape[2])
        q2 = torch.arange(1 + n, p.shape[2])  # second copy: token q2 first occurs at q2 - n
        prev_score = p[:, :, q, q - 1].mean((0, 2))  # [head]
        ind_score = p[:, :, q2, q2 - n + 1].mean((0, 2))  # [head]
        prev |= {(layer, h) for h in range(H) if prev_score[h] > threshold}
        induction |= {(layer, h) for h in range(H) if ind_score[h] > threshold}
    return prev, induction


def smallest_circuit(model, task, target: float = 0.8):
    """The top-k edges of the smallest swept circuit reaching `target` of the clean-corrupt gap."""
    n_edges = None
    frames, summary = circuit_discovery(model, task, ig_steps=1, k_values=None, seed=0, n_listed=100_000, target=target)
    n_edges = summary["n_edges"]
    k = summary["smallest_k_80"]
    assert k is not None, (model.name, summary["faithfulness_at_k"], n_edges)
    return frames["edges"].head(k), summary


def head_of(node: str, n_heads: int, n_kv: int) -> set:
    """Heads a node name stands for: "a1.h3" / "a1.h3.q" -> {(1, 3)}; "a1.kv0.k" -> the heads of KV group 0."""
    if not node.startswith("a"):
        return set()
    layer, unit = node[1:].split(".")[:2]
    if unit.startswith("kv"):
        g, per = int(unit[2:]), n_heads // n_kv
        return {(int(layer), h) for h in range(g * per, (g + 1) * per)}
    return {(int(layer), int(unit[1:]))}


@pytest.mark.parametrize("name", ZOO)
def test_induction_circuit_has_a_previous_token_head_feeding_an_induction_key(zoo_models, name):
    model = zoo_models[name]
    prev, induction = pattern_roles(model)
    assert prev and induction, (prev, induction)
    # the trigger-corrupted task: the key side (previous-token head -> induction head's key) carries the gap
    edges, summary = smallest_circuit(model, zoo(model, "induction", n_examples=32, seed=0, corrupt="trigger"))
    f = model.facts
    k_comp = [(s, r) for s, r in zip(edges.sender, edges.receiver)
              if r.endswith(".k") and head_of(s, f.n_heads, f.n_kv_heads or f.n_heads) & prev
              and head_of(r, f.n_heads, f.n_kv_heads or f.n_heads) & induction]
    assert k_comp, (summary["smallest_k_80"], list(zip(edges.sender, edges.receiver))[:20])


@pytest.mark.parametrize("name", ZOO)
def test_ioi_circuit_holds_the_heads_exact_path_patching_ranks_highest(zoo_models, name):
    model = zoo_models[name]
    task = zoo(model, "ioi", n_examples=32, seed=0)
    edges, summary = smallest_circuit(model, task)
    f = model.facts
    nodes = set().union(*(head_of(n, f.n_heads, f.n_kv_heads or f.n_heads) for n in (*edges.sender, *edges.receiver)))
    ranked = path_patching(model, task, "logits").df.assign(size=lambda d: d.effect.abs()).sort_values("size", ascending=False)
    top = [(int(r.sender_layer), int(r.sender_head)) for r in ranked.head(3).itertuples()]
    assert set(top) <= nodes, (top, summary["smallest_k_80"], sorted(nodes))
