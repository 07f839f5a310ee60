"""Row gathers for stacked passes: `take(t, rows)` = t[rows] along the batch axis.

Resumed passes gather captured tensors (block inputs, z, keys and values) to the rows of a
stacked batch many times per sweep. On CPU, advanced indexing copies element by element while
index_select copies whole rows: about 7x faster on a [32, 26, 640] float tensor.
"""
from __future__ import annotations

import torch


def take(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """t[rows] along dim 0 (a fresh, contiguous tensor) for rows: 1-d int64 indices >= 0 (no
    negative indices or masks, unlike t[rows]), moved to t's device (sharded models)."""
    return t.index_select(0, rows.to(t.device))
