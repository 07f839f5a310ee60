"""Bounded-memory running top-k: the k largest scores per row over a stream of chunks.

Used for MLP trigger examples (Geva et al. 2021): per neuron, the k corpus prefixes with the
largest memory coefficient. Each chunk is merged into the running top-k and dropped, so memory
is O(rows x (k + chunk)) whatever the corpus size.
"""
from __future__ import annotations

import torch

from headscope.errors import ConfigError


class StreamingTopK:
    """The k largest scores per row seen so far, with the integer ids they came with.

    `update(scores, ids)` takes scores [rows, n] for n new items with integer ids [n] or [n, m]
    (shared by every row, e.g. (corpus row, position, next token)); `values` [rows, <=k] and `ids`
    [rows, <=k(, m)] give the running top-k in decreasing score (fewer than k until k items were seen).
    """

    def __init__(self, k: int, n_rows: int) -> None:
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be a positive int, got {k!r}.")
        if not isinstance(n_rows, int) or n_rows < 1:
            raise ConfigError(f"n_rows must be a positive int, got {n_rows!r}.")
        self.k = k
        self.n_rows = n_rows
        self.values = torch.empty(n_rows, 0)  # [rows, <=k]
        self.ids: torch.Tensor | None = None  # [rows, <=k(, m)], set by the first update
        self.n_seen = 0

    def update(self, scores: torch.Tensor, ids: torch.Tensor) -> None:
        """Merge scores [rows, n] with ids [n] or [n, m] into the running top-k."""
        if scores.ndim != 2 or scores.shape[0] != self.n_rows:
            raise ConfigError(f"scores must have shape [{self.n_rows}, n], got {tuple(scores.shape)}.")
        ids = torch.as_tensor(ids, dtype=torch.int64).cpu()  # [n(, m)]
        if ids.ndim not in (1, 2) or ids.shape[0] != scores.shape[1]:
            raise ConfigError(f"got ids of shape {tuple(ids.shape)} for {scores.shape[1]} scores per row; "
                             f"pass one id (or one row of ids) per column.")
        scores = scores.detach().float().cpu()  # [rows, n]
        new_ids = ids.expand(self.n_rows, *ids.shape)  # [rows, n(, m)]
        merged = torch.cat([self.values, scores], dim=1)  # [rows, <=k + n]
        merged_ids = new_ids if self.ids is None else torch.cat([self.ids, new_ids], dim=1)  # [rows, <=k + n(, m)]
        keep = min(self.k, merged.shape[1])
        self.values, order = merged.topk(keep, dim=1, sorted=True)  # [rows, keep]
        index = order if ids.ndim == 1 else order[..., None].expand(-1, -1, ids.shape[1])
        self.ids = merged_ids.gather(1, index)  # [rows, keep(, m)]
        self.n_seen += scores.shape[1]
