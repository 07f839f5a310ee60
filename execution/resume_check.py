"""The first-call check behind `resume.supports`: whether resuming a pass, and each of its savings
(the z shortcut, resuming from a position, the hook-free blocks and capture), reproduces a plain
forward pass on this model, from one reference pass in which only the blocks from `_check_start` on
run (`_reference`). A failed check warns once per model with what runs instead. resume.supports
calls `_check` the first time it sees a model and remembers the answer.
"""
from __future__ import annotations

import logging
import warnings

import torch

from headscope.errors import HeadscopeWarning
from headscope.execution import block_shape, resume
from headscope.execution.resume import Support
from headscope.execution.rows import take

log = logging.getLogger(__name__)
_CHECK_TOL = 1e-4  # relative to the logits' scale (float32; half precision gets 8 eps of its dtype)


def _check(model) -> Support:
    """The checks behind `supports`, for about 0.5-0.9 plain passes of two 6-token prompts
    (benchmarks/first_call.py, a random GPT-2-small shape), all from the one block `_check_start`
    (the last block, or the earliest that still leaves every kind of block after it): a reference
    pass through the bridge in which only blocks from there on run (`_reference`), six resumes
    with every saving at once (two without the z shortcut, so the last block runs whole; each saving
    on its own only where one fails, to say which), and the hook-free capture replayed from there,
    compared block by block with the bridge's. In half precision a failure is confirmed on a second
    pair of prompts before anything is turned off: rounding can flip a near-tie (a mixture of
    experts' choice of expert) on one pair of prompts by chance, while a wrong saving fails on both."""
    found, failed, half = _check_on(model, seed=0)
    if failed and half:
        found, failed, _ = _check_on(model, seed=1)
    if failed:
        _warn_fallback(model, failed)
    return found


def _check_on(model, seed: int) -> tuple[Support, list[tuple[str, str]], bool]:
    """`_check` on one pair of random 6-token prompts (from `seed`) -> (what holds, the failed
    checks as (saving, why), whether the model computes in half precision)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.facts.d_vocab, (2, 6), generator=gen).to(model.device)
    start = _check_start(model)
    try:
        ckpt = _reference(model, tokens, start)
    except Exception as err:  # noqa: BLE001 - an unusual model: keep full passes
        return Support(False, False, False), [("capturing a pass", f"failed: {err}")], False
    eps = torch.finfo(ckpt.logits.dtype).eps
    tol = max(_CHECK_TOL, 8 * eps) * (1.0 + ckpt.logits.abs().max().item())
    rows = torch.tensor([1, 0, 1], device=model.device)
    want = ckpt.logits[rows]
    z = take(ckpt.z[start], rows)

    failed: list[tuple[str, str]] = []  # (saving, why), warned about once at the end

    def holds(what: str, make) -> bool:
        try:
            for got in make():
                if got.shape[-1] != want.shape[-1]:
                    failed.append((what, f"logits of width {got.shape[-1]}, not {want.shape[-1]}"))
                    return False
                diff = (got[:, -1] - want).abs().max().item()
                if not diff <= tol:  # a NaN difference fails too
                    failed.append((what, f"max |logit difference| {diff:.3g} > {tol:.3g}"))
                    return False
            return True
        except _NotApplicable:  # not a failure: the saving does not apply to this model
            return False
        except Exception as err:  # noqa: BLE001 - an unusual block layout: that saving stays off
            failed.append((what, f"failed: {type(err).__name__}: {err}"))
            return False

    def run(**kwargs):
        return resume.resume(model, ckpt, start, rows, **kwargs)

    plan = resume._fast_plan(model)
    # all savings at once first (6 resumes: 4 through the z shortcut, 2 running the last block whole, its
    # MLP branch cut to the last position, which a block adding into its MLP's output in place, as
    # Falcon's, must survive: review 17b A2); only where one of them fails, each on its own (the
    # sequence below says which to turn off)
    at_once = ckpt.kv is not None and plan is not None and holds("resuming", lambda: (
        run(fast=hook_free, **kwargs) for hook_free in (False, True)
        for kwargs in (dict(z=z, from_pos=3), dict(z=z, last_only=False), dict(from_pos=3))))
    if at_once:
        failed.clear()
        ok = shortcut = prefix = fast = True
    else:
        failed.clear()
        ok = holds("resuming", lambda: (run(last_only=lo, fast=False) for lo in (True, False)))
        shortcut = ok and holds("the z shortcut", lambda: _shortcut_applies(model, start) and (
            run(z=z, last_only=lo, fast=False) for lo in (True, False)))
        prefix = ok and ckpt.kv is not None and holds("resuming from a position", lambda: (
            run(from_pos=p, z=z if shortcut and p == 3 else None, fast=False) for p in (3, 5)))
        fast = ok and plan is not None and holds("hook-free blocks", lambda: (
            run(fast=True, last_only=lo, from_pos=3 if prefix and not lo else 0, z=z if shortcut and not lo else None)
            for lo in (True, False)))

    def from_quick_capture():
        # the hook-free capture replayed from block `start` on the bridge's input there (blocks
        # before it are of kinds checked after it), with the blocks' own call arguments; block
        # 0's input and every later block's input compared with the bridge's
        quick = resume._capture_fast(model, tokens, [start], None, given=ckpt, start=start)
        if quick is None:  # arguments the hook-free blocks do not handle
            raise _NotApplicable
        for i, (a, b) in enumerate(zip(quick.resid, ckpt.resid)):  # every block's input, not only the logits
            diff = (a - b).abs().max().item()
            if not diff <= tol:
                raise AssertionError(f"block {i}'s input differs by {diff:.3g}")
        yield quick.logits[rows].unsqueeze(1)
        yield resume.resume(model, quick, start, rows, fast=True, from_pos=3 if prefix else 0,
                     z=take(quick.z[start], rows) if shortcut else None)

    fast_capture = fast and holds("the hook-free capture", from_quick_capture)  # False where it does not apply
    return Support(ok, shortcut, prefix, fast, fast_capture), failed, ckpt.logits.dtype in (torch.float16, torch.bfloat16)


def _reference(model, tokens: torch.Tensor, start: int) -> resume.Checkpoint:
    """The checks' reference: a capture of the model's own bridge pass of `tokens` in which blocks
    0..start-1 hand their input on unchanged (_standing_in), so block `start` gets the embedding
    and only blocks start.. run, for (L - start) / L of a pass. Everything the model does around
    its blocks (embedding, masks, rotary tables, the cache, the final norm and unembedding) runs
    as in any pass, and the blocks checked are those `_check_start` picked: every kind occurs among
    them. The skipped blocks' cache layers (never read by blocks start..) get a copy of a later
    layer of their own type, so the cache holds every layer as after a whole pass. A model whose
    loop wants more of a block than its input handed on (an exception, or block `start` given
    another shape) gets the whole pass instead."""
    if start:
        try:
            with resume._standing_in(list(model.bridge.blocks)[:start], lambda i: resume._passed_on):
                ckpt = resume.capture(model, tokens, z_layers=[start], fast=False)
        except Exception:  # noqa: BLE001 - the whole pass below
            ckpt = None
        if ckpt is not None and ckpt.resid[start].shape == ckpt.resid[0].shape:
            if ckpt.kv is not None:
                layers = ckpt.kv.layers
                for i in range(start):
                    j = next((j for j in range(start, len(layers)) if type(layers[j]) is type(layers[i])), start)
                    ckpt.kv.update(layers[j].keys, layers[j].values, i)
            return ckpt
    return resume.capture(model, tokens, z_layers=[start], fast=False)


def _check_start(model) -> int:
    """The block the checks resume from: the latest from which every kind of block still runs
    (block_shape.kind: the layer's class, attention type, MLP), so one resume per saving covers
    each kind for 1/L of a pass where all blocks are alike."""
    kinds = [block_shape.kind(model, i) for i in range(model.facts.n_layers)]
    last = {k: i for i, k in enumerate(kinds)}  # each kind's last block
    return min(last.values())


def _shortcut_applies(model, start: int) -> bool:
    """Raise _NotApplicable where a block from `start` on has no shape the shortcut knows (block_shape.parts
    None: Granite's scaled residual writes), so the shortcut stays off without a warning: it is off by design."""
    if any(block_shape.parts(b) is None for b in list(model.bridge.blocks)[start:]):
        raise _NotApplicable
    return True


class _NotApplicable(Exception):
    """A saving that does not apply to the model (not a failed check: nothing to warn about)."""


# what runs instead when a check fails (Support's fields false from there on)
_FALLBACK = {
    "capturing a pass": "every sweep (head ablation and pruning, L0 evaluation, exact patching) runs full forward passes",
    "resuming": "every sweep (head ablation and pruning, L0 evaluation, exact patching) runs full forward passes",
    "the z shortcut": "head edits resume with their block's attention recomputed",
    "resuming from a position": "patched passes compute every position",
    "hook-free blocks": "resumed passes run the bridge's blocks",
    "the hook-free capture": "captures, gate gradients and L0 training run the bridge's full pass",
}


def _warn_fallback(model, failed: list[tuple[str, str]]) -> None:
    """One HeadscopeWarning per model naming each failed check and what runs instead (results
    are the same, only slower). supports() checks a model once, so this is said once."""
    parts = "; ".join(f"{what} ({why}), so {_FALLBACK[what]}" for what, why in failed)
    msg = (f"headscope: on model {model.facts.name!r} a resumed-pass check did not reproduce a full forward pass: {parts}. "
           f"Results are unchanged; those passes are slower.")
    log.info(msg)
    warnings.warn(msg, HeadscopeWarning, stacklevel=4)
