"""The sweep engine (execution/sweep.py) against plain passes: every run of a stacked, resumed sweep
equals one TransformerLens-bridge forward pass with that run's edits alone; out-of-memory halves
the explicit chunk size and leaves the values unchanged."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.execution import resume, sweep
from tests_support import random_tokens

B, POS, FIRST = 2, 7, 3  # prompts, positions; the source prompts differ from the base ones from FIRST on


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 5] - logits[:, -1, 7]


def _prompts():
    base = random_tokens(B, POS, seed=11)
    source = base.clone()
    source[:, FIRST:] = random_tokens(B, POS, seed=12)[:, FIRST:]
    return base, source


def _copy_hook(cells: list, n_lead: int):
    """Run i of the pass takes the lead rows' activation at cells[i] (an index into one row, or None:
    no edit), as exact patching does."""
    def hook(act: torch.Tensor, hook) -> torch.Tensor:
        act = act.clone()
        for i, cell in enumerate(cells):
            if cell is not None:
                rows = slice(n_lead + i * B, n_lead + (i + 1) * B)
                act[(rows, *cell)] = act[(slice(0, n_lead), *cell)]
        return act
    return hook


def _plain(model, base: torch.Tensor, source: torch.Tensor, name: str | None, cell) -> torch.Tensor:
    """One bridge pass on `base` with `name` at `cell` taken from the source prompts' own pass -> metric [B]."""
    with torch.no_grad():
        if name is None:
            return _metric(model.bridge(base, return_type="logits"))
        _, cache = model.bridge.run_with_cache(source, names_filter=[name])

        def put(act, hook):
            act = act.clone()
            act[(slice(None), *cell)] = cache[name][(slice(None), *cell)]
            return act

        return _metric(model.bridge.run_with_hooks(base, return_type="logits", fwd_hooks=[(name, put)]))


def _patch_sweep(model, base, source, runs: list, layer_of, pos_of) -> sweep.Sweep:
    """runs: (hook name or None, cell); consecutive runs share a block where layer_of says so."""
    def hooks_for(span: range):
        names = {runs[r][0] for r in span} - {None}
        return [(name, _copy_hook([runs[r][1] if runs[r][0] == name else None for r in span], B)) for name in names]

    return sweep.Sweep(tokens=base, lead=source, hooks_for=hooks_for, metric=_metric, stacked_metric=True,
                       layer_of=layer_of, pos_of=pos_of)


@pytest.mark.parametrize("resumed", [True, False])
def test_a_head_and_position_sweep_equals_one_plain_pass_per_run(resumed, tiny_models):
    """Head runs (z, every position: merged z-shortcut passes) and position runs (resid_pre and z at
    one position: passes that start at the first changed position) of a stacked sweep, resumed
    from one captured pass or as full passes, each equal a bridge pass with that edit alone."""
    model = tiny_models["llama"]
    assert resume.supports(model).prefix and resume.supports(model).fast
    base, source = _prompts()
    f = model.facts
    heads = [(hs.site("z", layer), (slice(None), h)) for layer in range(f.n_layers) for h in range(f.n_heads)]
    cells = [(hs.site("resid_pre", 1), (p,)) for p in range(POS)] + [(hs.site("z", 1), (p, 2)) for p in range(1, POS)]
    for runs in ([(None, None), *heads], cells):
        def layer_of(run: int, runs=runs) -> int:
            return int((runs[run][0] or runs[run + 1][0]).split(".")[1])  # the unpatched run joins the next

        def pos_of(run: int, runs=runs) -> int | None:
            cell = runs[run][1] or runs[run + 1][1]
            return cell[0] if isinstance(cell[0], int) else None

        spec = _patch_sweep(model, base, source, runs, layer_of if resumed else None, pos_of)
        got, lead = sweep.run(model, spec, range(len(runs)), lambda n_pos: sweep.ChunkSize(5 * B))
        want = torch.stack([_plain(model, base, source, name, cell) for name, cell in runs])  # [run, B]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(lead, _plain(model, source, source, None, None), atol=1e-4, rtol=1e-5)
        effect = (want - _plain(model, base, source, None, None)).abs().amax(1)  # [run]
        assert effect.max() > 1e-3  # the edits matter
        if runs is cells:  # before FIRST the source's activations are the base's: nothing changes there
            assert all(effect[r] < 1e-5 for r, (_, cell) in enumerate(runs) if cell[0] < FIRST)


def _gate_hooks(gates: torch.Tensor) -> list:
    """hook_z hooks scaling head h of row n by gates[n, layer, h], every layer."""
    def make(layer: int):
        return lambda z, hook: z * gates[:, layer][:, None, :, None].to(z.dtype)
    return [(hs.site("z", layer), make(layer)) for layer in range(gates.shape[1])]


def test_runs_that_share_edits_resume_from_a_pass_captured_under_them(tiny_models):
    """capture_hooks: every run's gates equal a reference's before its own first block, so runs resume
    from a pass captured under the reference, even a run that keeps a head the reference removes
    (its edit leaves z as captured before the reference's hook: not a run to skip)."""
    model = tiny_models["llama"]
    f = model.facts
    base, _ = _prompts()
    ref = torch.ones(f.n_layers, f.n_heads)
    ref[0, 1] = ref[1, 3] = 0.0
    masks = ref.repeat(5, 1, 1)  # [run, L, H]
    masks[1, 1, 3] = 1.0  # keeps a removed head: equal to the unedited model from block 1 on
    masks[2, 0, 2] = 0.0
    masks[3, 1, 0] = 0.5
    masks[4, 0, 1] = 1.0
    first = [f.n_layers, 1, 0, 1, 0]  # the first block each run differs from ref (run 0 is ref)
    order = [2, 4, 1, 3, 0]  # runs by block

    def hooks_for(span: range) -> list:
        return _gate_hooks(masks[order[span.start:span.stop]].repeat_interleave(B, 0))

    spec = sweep.Sweep(tokens=base, hooks_for=hooks_for, metric=_metric, stacked_metric=True,
                       layer_of=lambda run: first[order[run]], capture_hooks=_gate_hooks(ref.expand(B, -1, -1)))
    got, _ = sweep.run(model, spec, range(5), lambda n_pos: sweep.ChunkSize(2 * B))
    with torch.no_grad():
        want = torch.stack([_metric(model.bridge.run_with_hooks(base, return_type="logits",
                                                                fwd_hooks=_gate_hooks(masks[r].expand(B, -1, -1))))
                            for r in order])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    assert (want[2] - want[4]).abs().max() > 1e-4  # run 1 (keeps head 1.3) differs from the captured run 0


def test_chunk_size_halves_on_out_of_memory_and_keeps_the_values(tiny_models, monkeypatch):
    """A pass of more than 2 runs (resumed, or full) runs out of memory: the chunk size drops to
    half the failed pass, later passes start there, and every run equals a plain pass."""
    model = tiny_models["llama"]
    base, _ = _prompts()
    runs = [(layer, 1.1 + 0.2 * i) for layer in range(model.facts.n_layers) for i in range(4)]  # resid_pre x factor

    def hooks_for(span: range):
        hooks = []
        for layer in sorted({runs[r][0] for r in span}):
            factors = torch.tensor([runs[r][1] if runs[r][0] == layer else 1.0 for r in span]).repeat_interleave(B)
            hooks.append((hs.site("resid_pre", layer), lambda x, hook, f=factors: x * f[:, None, None]))
        return hooks

    with torch.no_grad():
        want = torch.stack([_metric(model.bridge.run_with_hooks(base, return_type="logits", fwd_hooks=[
            (hs.site("resid_pre", layer), lambda x, hook, f=factor: x * f)])) for layer, factor in runs])
    assert resume.supports(model).ok  # its one-time check runs before resume is limited
    for resumed, expected in ((True, [4, 2, 2, 2, 2]), (False, [8, 4, 2, 2, 2, 2])):  # runs a pass: a block, or all
        spec = sweep.Sweep(tokens=base, hooks_for=hooks_for, metric=_metric, stacked_metric=True,
                           layer_of=(lambda run: runs[run][0]) if resumed else None)
        seen: list[int] = []

        def limited(real, at: int, seen=seen):
            def call(*args, **kwargs):
                seen.append(args[at].shape[0])
                if args[at].shape[0] > 2 * B:
                    raise torch.OutOfMemoryError(f"CUDA out of memory (injected at {args[at].shape[0]} rows)")
                return real(*args, **kwargs)
            return call

        if resumed:  # every row of a pass moves (no lead rows): the resumed pass holds them all
            monkeypatch.setattr(resume, "resume", limited(resume.resume, 3))
        else:
            monkeypatch.setattr(type(model), "run_with_hooks", limited(type(model).run_with_hooks, 1))
        size = sweep.ChunkSize(8 * B)
        got, _ = sweep.run(model, spec, range(len(runs)), lambda n_pos, size=size: size)
        monkeypatch.undo()
        assert seen == [k * B for k in expected]
        assert size.rows == 2 * B and size.items(B) == 2
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_chunk_size_counts_whole_items():
    size = sweep.ChunkSize(10)
    assert size.items(3) == 3 and size.items(20) == 1  # at least one item a pass
    size.on_oom(3)(3)  # a pass of 3 items of 3 rows failed: at most 4 rows (one item) from now on
    assert size.rows == 4 and size.items(3) == 1
    size.halve(8, 1)  # a larger failed pass never grows it
    assert size.rows == 4
    with pytest.raises(ValueError, match="rows per pass"):
        sweep.ChunkSize(0)


def test_position_runs_split_from_where_lead_and_base_differ():
    """Runs before position 8 (lead and base agree there: no pass) form one piece; the 12 after it
    4 pieces of 3, each pass starting at its own first position; few tokens, one piece."""
    assert sweep.by_position(range(20), lambda i: i, 8, 500) == [range(0, 8), *(range(s, s + 3) for s in (8, 11, 14, 17))]
    assert sweep.by_position(range(2, 20), lambda i: i, 0, 30) == [range(2, 20)]
    assert sweep.by_position(range(5), lambda i: i, 9, 500) == [range(0, 5)]  # every run before the difference
