"""Automatic batch sizing: rows per forward pass from free memory, halving on out-of-memory.

`rows_per_pass` is the one rule every engine sizes its passes by. Under it, `chunk_size` turns
a per-row memory estimate (`row_bytes`) and a budget into rows per pass: the budget is an
explicit number of bytes, else a fraction of the free memory of the model's device
(torch.cuda.mem_get_info on CUDA; available RAM, at most CPU_BUDGET, on CPU); a user override
wins over both. Estimates can be wrong, so `run_chunks` runs a loop in chunks and, when
a chunk runs out of memory (torch.OutOfMemoryError, or the CPU allocator's RuntimeError),
halves the chunk size and retries that chunk. Chunks only group independent rows, so results
do not depend on the size (up to float rounding of batched matmuls).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from headscope.errors import ConfigError, MemoryBudgetError

log = logging.getLogger(__name__)
CPU_BUDGET = 2 * 2**30  # at most this many bytes of activations per forward pass on CPU
FRACTION = 0.5  # share of the device's free memory used by default
# Default cap of a no-grad pass on CPU: CPU_PASS_TOKENS tokens, and at most CPU_PASS_WIDE_BYTES
# of its widest per-token activation (the MLP's hidden layer, float32), so that each such tensor
# stays below malloc's 32 MiB mmap threshold (models/heap) and the next pass reuses its memory.
CPU_PASS_TOKENS, CPU_PASS_WIDE_BYTES = 4096, 16 << 20
OOM_MARKERS = ("out of memory", "not enough memory", "defaultcpuallocator")
# rows_per_pass(logits_cap=True): at most this many tokens, and decoder logits, in one pass
MAX_PASS_TOKENS, MAX_PASS_LOGITS = 32768, 2**28


def row_bytes(model, n_pos: int, *, grad: bool = False) -> int:
    """Rough peak activation bytes of one prompt row of n_pos tokens in one forward pass.

    No grad: logits and their softmax, a dozen residual-sized temporaries, the MLP hidden layer
    and the attention scores/pattern. grad=True adds what autograd keeps per layer for the
    backward pass. An over-estimate on purpose, so that chunks fit.
    """
    f = model.facts
    elem = model.dtype.itemsize
    per_pos = 2 * f.d_vocab + 12 * f.d_model + 4 * f.d_mlp + 4 * f.n_heads * n_pos
    if grad:
        per_pos += f.n_layers * (8 * f.d_model + 2 * f.d_mlp + 2 * f.n_heads * n_pos)
    return elem * n_pos * per_pos


def rows_per_pass(model, n_pos: int, *, grad: bool = False, memory_budget: int | None = None,
                  max_tokens: int | None = None, logits_cap: bool = False) -> int:
    """How many rows (sequences of n_pos tokens) one forward pass may hold: the one sizing rule
    of the engines (head masks and gate gradients, L0 training, patched runs).

    max_tokens: a token budget that overrides everything else. Otherwise what `memory_budget`
    bytes (None: default_budget of the model's device) hold by the per-row estimate
    (`row_bytes`, grad: with the backward pass's storage; MemoryBudgetError when not one row),
    and by default (no budget given) no-grad passes on CPU hold at most `cpu_rows` (fewer for
    wide MLPs). logits_cap: also at most MAX_PASS_TOKENS tokens and MAX_PASS_LOGITS decoder
    logits (pos x d_vocab floats; encoders stop before their LM head).
    """
    if max_tokens:
        return max(1, max_tokens // max(n_pos, 1))
    fits = chunk_size(row_bytes(model, n_pos, grad=grad), device=model.device, budget=memory_budget)
    cpu = None if grad or memory_budget is not None else cpu_rows(model.device, n_pos, widest(model))
    rows = min(fits, cpu or fits)
    if logits_cap:
        width = 0 if model.facts.is_encoder else model.facts.d_vocab
        rows = min(rows, max(1, min(MAX_PASS_TOKENS, MAX_PASS_LOGITS // max(width, 1)) // max(n_pos, 1)))
    return rows


def free_memory(device: torch.device | str) -> int:
    """Free bytes on `device`: CUDA's free memory, else the available system RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def default_budget(device: torch.device | str) -> int:
    """Bytes for one forward pass: half the free CUDA memory; on CPU half the free RAM, at most 2 GiB."""
    budget = int(free_memory(device) * FRACTION)
    return budget if torch.device(device).type == "cuda" else min(CPU_BUDGET, budget)


def chunk_size(bytes_per_row: int, *, device: torch.device | str = "cpu", budget: int | None = None,
               override: int | None = None) -> int:
    """Rows per forward pass: `override` if given, else budget // bytes_per_row.

    budget: bytes (None: default_budget(device)). Raises MemoryBudgetError when the budget holds
    no row at all, naming both sizes.
    """
    if override is not None:
        if not isinstance(override, int) or override < 1:
            raise ConfigError(f"A batch size override must be an int >= 1, got {override!r}.")
        return override
    if budget is not None and (not isinstance(budget, (int, float)) or budget <= 0):
        raise ConfigError(f"memory_budget must be a positive number of bytes, got {budget!r}.")
    total = default_budget(device) if budget is None else int(budget)
    if total < bytes_per_row:
        raise MemoryBudgetError(
            f"A memory budget of {total:,} bytes cannot hold one row ({bytes_per_row:,} bytes estimated); "
            f"free memory, pass a larger memory_budget, or use shorter prompts."
        )
    return total // bytes_per_row


def is_oom(err: BaseException) -> bool:
    """True for an out-of-memory error: torch.OutOfMemoryError or the CPU allocator's RuntimeError."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and any(m in str(err).lower() for m in OOM_MARKERS)


def run_chunks(fn: Callable[[range], object], n: int, size: int, *,
               on_oom: Callable[[int], None] | None = None) -> list[tuple[range, object]]:
    """[(chunk, fn(chunk))] over consecutive chunks of range(n) of at most `size` items.

    On out-of-memory the failing chunk is retried at half the size, and later chunks keep the
    smaller size; at size 1 the error is raised (an enclosing run_chunks may then halve its own
    chunks). Chunks that succeeded are kept. on_oom(length of the failed chunk) lets nested
    loops remember the smaller size.
    """
    if size < 1:
        raise ConfigError(f"chunk size must be >= 1, got {size}.")
    out: list[tuple[range, object]] = []
    start = 0
    while start < n:
        chunk = range(start, min(n, start + size))
        try:
            out.append((chunk, fn(chunk)))
        except Exception as err:  # noqa: BLE001 - only out-of-memory errors are handled
            if not is_oom(err):
                raise
            if on_oom is not None:
                on_oom(len(chunk))
            if size == 1:
                raise
            size = max(1, len(chunk) // 2)
            log.warning("out of memory on a chunk of %d; retrying with %d", len(chunk), size)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            continue
        start = chunk.stop
    return out


def cpu_rows(device: torch.device | str, tokens_per_row: int, width: int = 0) -> int | None:
    """The default cap on rows per no-grad pass on CPU (none elsewhere): CPU_PASS_TOKENS tokens,
    fewer when the widest per-token activation (`width` floats, e.g. d_mlp) would pass
    CPU_PASS_WIDE_BYTES."""
    if torch.device(device).type != "cpu":
        return None
    tokens = min(CPU_PASS_TOKENS, CPU_PASS_WIDE_BYTES // (4 * width)) if width > 0 else CPU_PASS_TOKENS
    return max(1, tokens // max(tokens_per_row, 1))


def widest(model) -> int:
    """The widest per-token activation of a pass, in floats: the MLP's hidden layer or fused q/k/v."""
    return max(model.facts.d_mlp, 3 * model.facts.d_model)
