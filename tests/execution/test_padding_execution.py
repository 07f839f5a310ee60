"""The execution engines on a left-padded batch of mixed-length prompts (#19 item 3): captured,
resumed (bridge and hook-free blocks, the z shortcut, from a position, mixed groups) and
differentiable last-position passes give every row the logits (and gate gradients) of plain
Hugging Face on that row alone, unpadded."""
from __future__ import annotations

import contextlib

import pytest
import torch

from headscope.errors import ConfigError
from headscope.execution import resume
from tests_support import hf_reference, hf_z_edit

ARCHS = ("gpt2", "llama3", "neox")
TOL = dict(atol=1e-4, rtol=0)


def _alone(hf, task, i: int, arch: str = "", edit=None) -> torch.Tensor:
    """Row i alone, unpadded, through plain Hugging Face (with a z edit): last-position logits [d_vocab]."""
    with hf_z_edit(hf, edit) if edit else contextlib.nullcontext():
        return hf(task.example(i).tokens).logits[0, -1]


@pytest.fixture(scope="module")
def refs(arch_models, arch_dirs, mixed_tasks):
    """arch -> (model, padded task, plain HF, [batch, d_vocab] each row's logits alone)."""
    out = {}

    def get(arch):
        if arch not in out:
            task, hf = mixed_tasks(arch), hf_reference(arch_dirs[arch])
            with torch.no_grad():
                want = torch.stack([_alone(hf, task, i) for i in range(len(task))])
            out[arch] = arch_models(arch), task, hf, want
        return out[arch]

    return get


def _starts(task) -> torch.Tensor:
    """[batch] each row's first real position (left padding)."""
    return task.attention_mask.bool().int().argmax(1)


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_capture_and_resume_equal_each_row_alone(arch, refs):
    model, task, _, want = refs(arch)
    assert task.padded and len(set(task.attention_mask.sum(1).tolist())) == len(task)  # every length differs
    support = resume.supports(model)
    assert support.fast_capture and support.shortcut
    rows = torch.tensor([3, 0, 5, 5, 1, 2, 4])  # any order, repeats
    n_layers = model.facts.n_layers
    for fast in (False, True):  # the bridge's blocks, and the hook-free capture and blocks
        ckpt = resume.capture(model, task.tokens, attention_mask=task.attention_mask, z_layers=range(n_layers),
                              fast=fast)
        assert (ckpt.calls[1] is ckpt.calls[0]) == fast  # the hook-free capture ran (or not)
        torch.testing.assert_close(ckpt.logits, want, **TOL)
        for start in range(n_layers):
            for z in (None, ckpt.z[start][rows]):  # a whole block, or the z shortcut
                got = resume.resume(model, ckpt, start, rows, z=z, fast=fast)[:, 0]
                torch.testing.assert_close(got, want[rows], **TOL)
            full = resume.resume(model, ckpt, start, rows, fast=fast, last_only=False)  # [n, pos, d_vocab]
            torch.testing.assert_close(full[:, -1], want[rows], **TOL)
            assert torch.isfinite(full).all()  # padded query rows stay finite (no NaN to leak into sums)
    got = resume.last_logits(model, task.tokens, attention_mask=task.attention_mask)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_edits_from_a_position_and_mixed_groups_equal_each_row_alone(arch, refs):
    """Head 1 of a block zeroed from padded position p on (row-alone position p - start, at
    least 0), resumed from p through the captured keys and values, one group at a time and in
    one mixed pass; plain HF edits z before its output projection on each row alone."""
    model, task, hf, want = refs(arch)
    n_layers, starts, n = model.facts.n_layers, _starts(task), len(task)
    p = int(starts.min()) + 2  # inside every row that is long enough, in the padding of the others
    assert int(starts.max()) > p
    ckpt = resume.capture(model, task.tokens, attention_mask=task.attention_mask, z_layers=range(n_layers))
    groups = []
    for block in range(n_layers):
        z = ckpt.z[block].clone()
        z[:, p:, 1] = 0.0
        groups.append((block, torch.arange(n), z))
        with torch.no_grad():
            alone = torch.stack([_alone(hf, task, i, arch, lambda layer, z, i=i, block=block: _zero_from(
                z, layer, block, max(0, p - int(starts[i])))) for i in range(n)])
        assert (alone - want).abs().max() > 1e-3  # the edit mattered
        for fast in (False, True):
            got = resume.resume(model, ckpt, block, torch.arange(n), z=z, from_pos=p, fast=fast)[:, 0]
            torch.testing.assert_close(got, alone, **TOL)
        mixed = resume.resume_mixed(model, ckpt, [groups[-1]], from_pos=p)[:, 0]
        torch.testing.assert_close(mixed, alone, **TOL)
        groups[-1] = (*groups[-1], alone)
    both = resume.resume_mixed(model, ckpt, [g[:3] for g in groups], from_pos=p)[:, 0]  # [n_layers * n, d_vocab]
    torch.testing.assert_close(both, torch.cat([g[3] for g in groups]), **TOL)


def _zero_from(z: torch.Tensor, layer: int, block: int, start: int) -> torch.Tensor:
    if layer != block:
        return z
    z = z.clone()
    z[:, start:, 1] = 0.0
    return z


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_gate_gradients_equal_each_row_alone(arch, refs):
    """The differentiable hook-free pass with per-row head gates: logits and the gates' gradients
    on the padded batch equal plain HF with the same gates on each row alone, and stay finite."""
    model, task, hf, _ = refs(arch)
    n, n_layers, n_heads = len(task), model.facts.n_layers, model.facts.n_heads
    gates = torch.rand(n, n_layers, n_heads, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
    answers = task.answers

    def edit(layer, z, rows=slice(None)):  # z [n, q, head, d_head]
        return z * gates[rows, layer, None, :, None]

    got = resume.last_logits(model, task.tokens, attention_mask=task.attention_mask, edit_z=edit)  # [n, d_vocab]
    (grad,) = torch.autograd.grad(got.log_softmax(-1).gather(1, answers[:, None]).sum(), [gates])
    assert torch.isfinite(grad).all()
    for i in range(n):
        alone = _alone(hf, task, i, arch, lambda layer, z, i=i: edit(layer, z, slice(i, i + 1)))
        (want_grad,) = torch.autograd.grad(alone.log_softmax(-1)[answers[i]], [gates])
        torch.testing.assert_close(got[i], alone, **TOL)
        torch.testing.assert_close(grad[i], want_grad[i], **TOL)


def test_right_padded_decoder_rows_are_refused(refs):
    """A last-position pass would read padding as the answer: a typed error instead of wrong numbers."""
    model, task, _, _ = refs("llama3")
    flipped = task.attention_mask.flip(1)  # right padding
    for run in (lambda: resume.capture(model, task.tokens, attention_mask=flipped),
                lambda: resume.last_logits(model, task.tokens, attention_mask=flipped)):
        with pytest.raises(ConfigError, match="left-padded"):
            run()
