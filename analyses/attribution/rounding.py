"""Gradient x input's rounding floor measured by a float32 re-run (review 19e A1).

methods.gradient_floor bounds the error a half-precision gradient can make of |g . x| (eps x the example's largest
token gradient x the token's embedding norm): a worst case. On review 18e's Nemotron the bfloat16 error reached 0.77
of it, but on review 19e's Phi-3 it was 10-100x below it (|bf16 - float32| 0.002-0.016 against a floor of 0.05-0.56,
which exceeded every score, so all 70 were tied and the method dropped). Where a float32 copy of the weights fits
(float32_fits), each example's gradient x input is re-run in float32 on the same (half-precision) weights upcast, and
a score within MEASURED_SAFETY x its own measured |half - float32| error is a tie; elsewhere the bound stays.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from headscope.execution.batching import free_memory

HALF = (torch.bfloat16, torch.float16)
MEASURED_SAFETY = 2.0  # a score within twice its own measured rounding error is a tie: at least half of it is rounding
FLOAT32_SHARE = 0.25  # a float32 copy of the half-precision weights must take at most this share of free memory


def half_parameters(model) -> int:
    """Elements of the model's bfloat16/float16 parameters and buffers (what upcast copies to float32)."""
    seen = {id(t): t for t in [*model.bridge.parameters(), *model.bridge.buffers()] if t.dtype in HALF}
    return sum(t.numel() for t in seen.values())


def float32_fits(model, free: int | None = None) -> bool:
    """Whether to measure: the model computes in bfloat16/float16 and a float32 copy of those weights (4 bytes each)
    takes at most FLOAT32_SHARE of the free memory on its device (`free` bytes; default batching.free_memory)."""
    if model.dtype not in HALF:
        return False
    free = free_memory(model.device) if free is None else free
    return 4 * half_parameters(model) <= FLOAT32_SHARE * free


@contextmanager
def upcast(model) -> Iterator[None]:
    """Run the model in float32 on its own half-precision weights: every bfloat16/float16 parameter's data and buffer
    replaced by a float32 copy (exact), the originals put back afterwards (the same tensors, so nothing rounds twice)."""
    params: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    buffers: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
    done: set[int] = set()
    try:
        for module in model.bridge.modules():
            for p in module._parameters.values():
                if p is not None and p.dtype in HALF and id(p) not in done:
                    done.add(id(p))
                    params.append((p, p.data))
                    p.data = p.data.float()
            for name, b in module._buffers.items():
                if b is not None and b.dtype in HALF:
                    buffers.append((module, name, b))
                    module._buffers[name] = b.float()
        yield
    finally:
        for p, data in params:
            p.data = data
        for module, name, b in buffers:
            module._buffers[name] = b


def measured_floor(model, tokens: torch.Tensor, forward, args: Sequence[torch.Tensor],
                   signed: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
    """MEASURED_SAFETY x |g . x in the model's dtype - g . x in float32| per token -> [g, pos]: tokens [g, pos],
    forward/args as methods.gradient_scores (each arg [g]), signed [g, pos] the half-precision run's signed g . x
    (its product summed in float32). One example at a time (float32 activations take twice the memory)."""
    from headscope.analyses.attribution.methods import gradient_scores

    exact = torch.empty_like(signed)  # [g, pos]
    with upcast(model):
        for j in range(tokens.shape[0]):
            one = gradient_scores(model, tokens[j:j + 1], forward, [a[j:j + 1] for a in args],
                                  None if at is None else at[j:j + 1])
            exact[j] = one["grad_x_input_signed"][0].to(exact)
    return MEASURED_SAFETY * (signed - exact).abs()
