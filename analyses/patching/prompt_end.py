"""Patching positions counted from each prompt's last token, the answer's teacher-forced pieces left out.

A task whose answers have several tokens (Task.continuation) runs each prompt on with all but the answer's last
token, so the last k - 1 positions of a k-token row are answer pieces, not the user's prompt. Counted from the
end of the padded row, position -1 would be the prompt's last token on one-token rows and an answer piece on the
others, and a cell there would average the two (review 11b C1). Here every position cell is read per row at its
place from that row's prompt end: row r's values move right by its pieces s_r (so -1 is every prompt's last
token) and the cells of its answer pieces are left out (the sweep patches them; no position shows them). The
summary (`answer_pieces`), the finding and the section's provenance say so, with how many places that is. Tasks
with one-token answers have no pieces: nothing moves.
"""
from __future__ import annotations

import torch


def answer_pieces(task) -> torch.Tensor:
    """[batch] int64: how many of each row's last positions are teacher-forced answer pieces (k - 1 for a k-token
    answer; 0 for every row of a task with one-token answers)."""
    if task.continuation is None:
        return torch.zeros(len(task), dtype=torch.int64)
    return ((task.continuation >= 0).sum(1) - 1).clamp_min(0).to(torch.int64).cpu()


def to_prompt_end(x: torch.Tensor, pieces: torch.Tensor, fill=0) -> torch.Tensor:
    """x [batch, pos] with row r moved right by pieces[r] (its answer pieces fall off the end) and `fill` in the
    places freed at the start: position -1 is then every row's prompt's last token."""
    n_pos = x.shape[1]
    out = torch.full_like(x, fill)
    for r, s in enumerate(pieces.tolist()):
        out[r, s:] = x[r, :n_pos - s]
    return out


def cell_values(cells: list, values: torch.Tensor, pieces: torch.Tensor) -> tuple[list, torch.Tensor]:
    """(cells, per-row values [cell, batch]) of a site type's cells (layer, head, pos) re-read at each row's place
    from its prompt's end: cell (layer, head, p) of row r takes the row's value at (layer, head, p - pieces[r]), NaN
    where that lies before the row's start; the answer pieces' cells are left out, and so are the position cells
    then real in no row (the first max(pieces) positions of the longest prompt's frame). Cells without a position
    stay; without pieces nothing changes."""
    if not bool(pieces.any()) or all(p is None for _, _, p in cells):
        return cells, values
    index = {cell: i for i, cell in enumerate(cells)}
    out = torch.full_like(values, float("nan"))
    for s in sorted(set(pieces.tolist())):
        rows = torch.nonzero(pieces == s).flatten()  # [k] the rows with s answer pieces
        for i, (layer, head, p) in enumerate(cells):
            j = i if p is None else index.get((layer, head, p - s))
            if j is not None:
                out[i, rows] = values[j, rows]
    keep = [i for i, (_, _, p) in enumerate(cells) if p is None or bool((~torch.isnan(out[i])).any())]
    return [cells[i] for i in keep], out[keep]


def record(pieces: torch.Tensor) -> dict | None:
    """The summary's `answer_pieces` (None where no row has any): {"rows": rows whose answer has several tokens,
    "max": the most pieces in a row, "positions": "from the prompt's end", "left_out": the (row, position) places of
    answer pieces, each patched in every site type's sweep but in no cell of any table or map}."""
    several = int((pieces > 0).sum())
    if not several:
        return None
    return {"rows": several, "max": int(pieces.max()), "positions": "from the prompt's end", "left_out": int(pieces.sum())}
