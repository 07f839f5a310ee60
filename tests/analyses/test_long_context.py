"""Long prompts (#22 item 5): position and kv never hold a layer's whole attention pattern where the
hook-free blocks run, and their numbers still equal plain Hugging Face's.

A TorchDispatchMode watches every tensor the analyses create: none may have the shape of a layer's
pattern ([batch, head > 1, >= L0 queries, >= L0 keys] for a 600-token prompt), which is what the
bridge's pass allocates in every layer (checked too: the same watch fires when a hook sends the
pass through the bridge). References: Hugging Face eager (logits, output_attentions, a 4-d mask for
the StreamingLLM conditions, a cropped cache for eviction, generate for greedy decoding).
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import headscope as hs
from headscope.analyses.core.tasks import Task
from headscope.analyses.kv import analysis as kv
from headscope.analyses.kv import eviction as kv_eviction
from headscope.analyses.position import prompts as pp
from headscope.analyses.position.runs import run_decoder_sweeps
from headscope.analyses.position.sinks import streaming_keep
from tests_support import build_tiny_model, hf_model

N_CTX = 1024
L0 = 400  # a [batch, head, >= L0, >= L0] tensor is a layer's pattern; chunks are 256 queries


class PatternWatch(TorchDispatchMode):
    """Records the shape of every pattern-sized tensor an aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.ndim == 4 and t.shape[1] > 1 and min(t.shape[-2:]) >= L0:
                self.seen.append((str(func), tuple(t.shape)))
        return out


@pytest.fixture(scope="module")
def long_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("long-context")
    return {"gpt2": build_tiny_model("gpt2", root / "gpt2", n_positions=N_CTX),
            "llama": build_tiny_model("llama", root / "llama", max_position_embeddings=N_CTX)}


@pytest.fixture(scope="module")
def long_models(long_dirs):
    return {family: hs.load_model(path, device="cpu") for family, path in long_dirs.items()}


def long_sweep(tokenizer, n_items: int = 200):
    """A word-level retrieval sweep of about 3 tokens an item (~600 tokens), gold at 3 slots, a
    two-token answer."""
    items = [f"w{10 + i % 40} w{10 + (7 * i) % 40}" for i in range(n_items - 1)]
    return pp.item_sweep(tokenizer, items=items, gold="w55 w56", positions=(1, n_items // 2, n_items),
                         head="w30", sep="w1", tail="w1 w55", answer="w56 w57")


def no_hook():
    return [(hs.site("resid_pre", 0), lambda x, hook: None)]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_position_sweep_on_a_long_prompt_holds_no_pattern_and_equals_hf(family, long_dirs, long_models):
    model, hf = long_models[family], hf_model(long_dirs[family])
    sweep = long_sweep(model.tokenizer)
    n, ans = sweep.prompt_len, sweep.answer_ids.tolist()
    assert n > 550
    window, n_sink = 64, 2
    watch = PatternWatch()
    with watch:
        out = run_decoder_sweeps(model, [sweep], n_sink=n_sink, window=lambda _: window, generate=True,
                                 extra_new_tokens=1)[0]
    assert watch.seen == []
    row = 1  # the gold in the middle
    ids = torch.tensor([sweep.tokens[row].tolist() + ans[:-1]])  # [1, n + 1]
    with torch.no_grad():
        res = hf(ids, output_attentions=True)
        greedy = hf.generate(sweep.tokens[row:row + 1], max_new_tokens=3, do_sample=False, pad_token_id=1)
    logp = res.logits[0].log_softmax(-1)
    assert out.metrics["logprob"][row].item() == pytest.approx(sum(logp[n - 1 + j, a].item() for j, a in enumerate(ans)),
                                                               abs=1e-4)
    s, e = sweep.gold_spans[row].tolist()
    for layer, att in enumerate(res.attentions):  # [1, head, q, k]
        torch.testing.assert_close(out.gold_mass[row, layer], att[0, :, n - 1, s:e].sum(-1), atol=1e-5, rtol=1e-5)
        sinks = att[0, :, n_sink:n, :n_sink].sum(-1).mean(-1)  # [head]: query rows n_sink..n-1
        torch.testing.assert_close(out.sink_mass[row, layer], sinks, atol=1e-5, rtol=1e-5)
    text = model.tokenizer.decode(greedy[0, n:], skip_special_tokens=True)
    assert out.metrics["accuracy"][row].item() == float("w56 w57" in text)
    for cond, keep_sinks in (("sinks+window", True), ("window", False)):
        keep = streaming_keep(n + 1, n + 1, n_sink, window, keep_sinks=keep_sinks)
        mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min)[None, None]  # [1, 1, q, k]
        with torch.no_grad():
            ref = hf(ids, attention_mask=mask).logits[0].log_softmax(-1)
        expected = sum(ref[n - 1 + j, a].item() for j, a in enumerate(ans))
        assert out.masked[cond]["logprob"][row].item() == pytest.approx(expected, abs=1e-4), cond
    # the watch is not blind: through the bridge every layer's pattern is there; and the reducer's
    # bridge route (any hook attached) gives the same numbers
    with model.hooks(fwd=no_hook()), watch:
        bridged = run_decoder_sweeps(model, [sweep], n_sink=n_sink, window=lambda _: window, generate=False)[0]
    assert len(watch.seen) >= model.facts.n_layers
    torch.testing.assert_close(bridged.gold_mass, out.gold_mass, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bridged.sink_mass, out.sink_mass, atol=1e-5, rtol=1e-5)
    for cond in ("sinks+window", "window"):
        torch.testing.assert_close(bridged.masked[cond]["logprob"], out.masked[cond]["logprob"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_kv_analysis_on_a_long_prompt_holds_no_pattern_and_equals_hf(family, long_dirs, long_models):
    model, hf = long_models[family], hf_model(long_dirs[family])
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(4, 64, (2, 600), generator=gen)
    task = Task(name="long", tokens=tokens, answers=tokens[:, 5], wrong_answers=tokens[:, 6])
    watch = PatternWatch()
    with watch:
        result = kv.kv_analysis(model, task, kv.KVConfig(budgets=(8, 64, 599), n_sink=2))
    assert watch.seen == []
    # the prefilled context holds no autograd graph (it kept every layer's activations alive)
    assert not kv_eviction.context_cache(model, tokens).layers[0].keys.requires_grad
    with torch.no_grad():
        attns = hf(tokens, output_attentions=True).attentions  # per layer [2, head, q, k]
    for layer, att in enumerate(attns):
        sinks = att[:, :, 1:, :1].sum(-1).mean((1, 2)).mean().item()  # n_sink = 1: query rows 1..
        assert result.tables["sinks"].sink_mass[layer] == pytest.approx(sinks, abs=1e-5)
    # heavy hitters' received attention, summed a chunk of queries at a time, against HF's patterns
    received = kv_eviction.attention_received(model, tokens)
    group = model.facts.n_heads // model.facts.n_kv_heads
    for layer, att in enumerate(attns):
        want = att[:, :, :599, :599].sum(2)  # [2, head, ctx]
        want = want.reshape(2, model.facts.n_kv_heads, group, 599).sum(2)
        torch.testing.assert_close(received[layer], want, atol=1e-4, rtol=1e-4)
    # every policy and budget, decoded on the prefilled context, against a cropped HF cache
    df = result.df
    for policy in kv_eviction.POLICIES:
        keep = kv_eviction.keep_mask(policy, n_layers=model.facts.n_layers, batch=2, n_kv_heads=model.facts.n_kv_heads,
                                     ctx=599, budget=64, n_sink=2, received=received)
        with torch.no_grad():
            out = hf(tokens[:, :599], use_cache=True)
            cache = out.past_key_values
            for layer in range(model.facts.n_layers):
                lay = cache.layers[layer]
                idx = keep[layer].nonzero()  # rows (batch, kv_head, pos), 64 per (batch, kv_head)
                pos = idx[:, 2].reshape(2, model.facts.n_kv_heads, 64)
                pos = pos[..., None].expand(-1, -1, -1, lay.keys.shape[-1])
                lay.keys, lay.values = lay.keys.gather(2, pos), lay.values.gather(2, pos)
            last = hf(tokens[:, -1:], past_key_values=cache, position_ids=torch.full((2, 1), 599)).logits[:, -1]
        expected = (last[torch.arange(2), task.answers] - last[torch.arange(2), task.wrong_answers]).numpy()
        got = df[(df.policy == policy) & (df.budget == 64)].sort_values("example").metric.to_numpy()
        assert abs(got - expected).max() <= 1e-4, policy


def test_json_kv_fills_the_context_it_is_given(arch_models):
    """PositionConfig(context=N): as many of Liu et al.'s pairs as fit N tokens (one more would not),
    beyond the default cap of 20 pairs when N allows."""
    from headscope.analyses.position.analysis import PositionConfig, build_sweeps, position_bias

    model = arch_models("gpt2")  # a byte-level BPE trained on English; 256 positions
    config = PositionConfig(sweep="json_kv", context=model.facts.n_ctx, n_examples=1, positions=(1,), window=0, n_boot=10)
    sweeps = build_sweeps(model, config)
    n = sweeps[0].n_items
    assert pp.sweep_tokens(sweeps) <= model.facts.n_ctx
    more = pp.kv_sweeps(model.tokenizer, n_pairs=n + 1, n_examples=1, seed=0, positions=(1,))
    assert pp.sweep_tokens(more) > model.facts.n_ctx
    short = build_sweeps(model, PositionConfig(sweep="json_kv", context=128, n_examples=1, positions=(1,)))
    assert short[0].n_items < n and pp.sweep_tokens(short) <= 128
    result = position_bias(model, config=config)
    assert result.summary["prompt_tokens"] == sweeps[0].prompt_len
    assert f"{n} pairs" in result.summary["n_items_note"]
