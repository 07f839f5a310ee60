"""Patching site types: which hook point each one patches and which cells it sweeps.

    resid_pre, resid_mid, resid_post,   (layer, pos)        blocks.L.hook_<kind>
    attn_out, mlp_out
    head_out                            (layer, head)       blocks.L.attn.hook_z, all positions
    head_out_by_pos                     (layer, head, pos)  blocks.L.attn.hook_z
    q                                   (layer, head)       blocks.L.attn.hook_q, all positions
    k, v                                (layer, kv_head)    hook_k / hook_v (n_kv_heads under GQA)
    pattern                             (layer, head)       blocks.L.attn.hook_pattern, all queries

A head's output is z_h @ W_O[h], so patching z_h patches exactly that head's output. On multi-head latent
attention (DeepSeek-V3) hook_q/k/v are the per-head tensors that enter attention (the bridge computes attention
from them) and z is o_proj's input split by v_head_dim, so every type is exact there too; a k cell patches that
head's whole key, the rotary part that MLA shares across heads included, for that head only.

resid_mid: TransformerLens 4.3's bridge aliases hook_resid_mid to ln2.hook_in, so a patch there
changes only the MLP's input, not the residual stream that skips the MLP (and
transformer_lens.patching.get_act_patch_resid_mid inherits this). headscope patches the
residual stream itself: resid_mid = resid_pre + attn_out, so the attention output is rewritten
to (source resid_mid - this run's resid_pre) at the patched cells (`writer`). A parallel block
(GPT-NeoX, GPT-J) has no resid_mid at all: `absent` says why `run` leaves such a type out. Neither can
`pattern` be patched where TransformerLens discards hook_pattern edits (OPT, GPT-J: hooks/edits.py).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from headscope.errors import ConfigError, IndexOutOfRangeError, SiteError
from headscope.hooks.edits import edits_discarded
from headscope.hooks.sites import SITES, check_site, site
from headscope.models.hooked_model import is_parallel


@dataclass(frozen=True, kw_only=True)
class SiteType:
    name: str
    kind: str  # the hooks.SITES kind of the activation patched (what the source run provides)
    by_head: bool
    by_pos: bool
    writer: str | None = None  # patched by rewriting this site kind instead (resid_mid: attn_out)

    @property
    def head_axis(self) -> int | None:
        """The head axis of one row of the activation (batch dropped)."""
        dim = SITES[self.kind].head_dim
        return None if dim is None else dim - 1

    @property
    def pos_axis(self) -> int:
        return SITES[self.kind].pos_dim - 1

    def hook(self, layer: int) -> str:
        return site(self.kind, layer)

    def write_hook(self, layer: int) -> str:
        """The hook point whose output is rewritten (and whose gradient is the site's gradient)."""
        return site(self.writer or self.kind, layer)

    def n_heads(self, model) -> int:
        return model.facts.n_kv_heads if self.kind in ("k", "v") else model.facts.n_heads

    def row_shape(self, model, n_pos: int) -> tuple[int, ...]:
        """Shape of one row of the activation (batch dropped)."""
        f = model.facts
        if self.kind == "pattern":
            return (f.n_heads, n_pos, n_pos)
        if self.by_head:
            return (n_pos, self.n_heads(model), f.d_head)
        return (n_pos, f.d_model)

    def check(self, model) -> SiteType:
        """Raise SiteError if this model never computes the hook points this site type needs, or (pattern) if
        TransformerLens discards edits to them (hooks/edits.py: every cell would be exactly 0, review 16d A3)."""
        for layer in range(model.facts.n_layers):
            check_site(model, self.hook(layer))
            check_site(model, self.write_hook(layer))
        if self.kind == "pattern" and (why := edits_discarded(model, "pattern")):
            raise SiteError(f"{why}: every {self.name} cell would read exactly 0")
        return self

    def cells(self, model, n_pos: int) -> list[tuple[int, int | None, int | None]]:
        """Every (layer, head or None, pos or None) this site type sweeps: layer, then pos, then head."""
        heads = range(self.n_heads(model)) if self.by_head else [None]
        positions = range(n_pos) if self.by_pos else [None]
        return [(layer, h, p) for layer in range(model.facts.n_layers) for p in positions for h in heads]

    def index(self, head: int | None, pos: int | None) -> dict[int, int | None]:
        """{axis of one activation row: index} selecting one cell (engine.index_mask's format)."""
        idx: dict[int, int | None] = {}
        if self.by_pos:
            idx[self.pos_axis] = pos
        if self.by_head:
            idx[self.head_axis] = head
        return idx


def _resid(name: str) -> SiteType:
    return SiteType(name=name, kind=name, by_head=False, by_pos=True)


SITE_TYPES: dict[str, SiteType] = {
    **{n: _resid(n) for n in ("resid_pre", "resid_post", "attn_out", "mlp_out")},
    "resid_mid": SiteType(name="resid_mid", kind="resid_mid", by_head=False, by_pos=True, writer="attn_out"),
    "head_out": SiteType(name="head_out", kind="z", by_head=True, by_pos=False),
    "head_out_by_pos": SiteType(name="head_out_by_pos", kind="z", by_head=True, by_pos=True),
    **{n: SiteType(name=n, kind=n, by_head=True, by_pos=False) for n in ("q", "k", "v", "pattern")},
}


def site_types(sites) -> list[SiteType]:
    """Look up site type names; unknown names get a SiteError with the closest valid names."""
    names = [sites] if isinstance(sites, str) else list(sites)
    if not names:
        raise ConfigError(f"sites is empty; pass some of {', '.join(SITE_TYPES)}.")
    for name in names:
        if name not in SITE_TYPES:
            close = difflib.get_close_matches(str(name), list(SITE_TYPES), n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise SiteError(f"Unknown patching site {name!r}.{hint} Valid sites: {', '.join(SITE_TYPES)}.")
    return [SITE_TYPES[n] for n in dict.fromkeys(names)]


PARALLEL_MID = "none on this model; its blocks are parallel (attention and MLP both read the block's input)"


def absent(model, st: SiteType) -> str:
    """Why `model` has no `st` (a site type whose hooks it never computes), in words for the finding:
    resid_mid on parallel blocks has no state between attention and MLP (PARALLEL_MID); otherwise
    the site check's own one-line reason."""
    blocks = list(getattr(getattr(model, "bridge", None), "blocks", None) or [])
    if st.name == "resid_mid" and blocks and all(is_parallel(b) for b in blocks):
        return PARALLEL_MID
    try:
        st.check(model)
    except (SiteError, IndexOutOfRangeError) as error:
        return f"not patched: {error}"
    return "not patched: its hook points never fire on this model"


def unpatchable(model, st: SiteType, available: set[str]) -> bool:
    """Does `run` leave `st` out: its hook never fires, or TransformerLens discards the edit (pattern)?"""
    return st.hook(0) not in available or (st.kind == "pattern" and edits_discarded(model, "pattern") is not None)


def cell_frame(
    st: SiteType,
    cells: list[tuple[int, int | None, int | None]],
    labels: list[str],
    **values: np.ndarray,
) -> pd.DataFrame:
    """Tidy rows for a site type's cells: site_type, layer, head, pos, token, then `values` columns.

    head and pos are nullable ints (missing where the site sweeps all heads or all positions).
    """
    layer, head, pos = zip(*cells) if cells else ((), (), ())
    frame = pd.DataFrame({
        "site_type": st.name,
        "layer": np.asarray(layer, dtype=int),
        "head": pd.array(head, dtype="Int64"),
        "pos": pd.array(pos, dtype="Int64"),
        "token": [labels[p] if p is not None else "all" for p in pos],
    })
    for column, array in values.items():
        frame[column] = np.asarray(array, dtype=float)
    return frame


# layers whose attention a cell's change still passes through on its way to the answer: from its own
# layer (resid_pre: before that layer's attention) or from the next (everything written after it)
_FIRST_LATER_LAYER = {"resid_pre": 0, "resid_mid": 1, "resid_post": 1, "attn_out": 1, "mlp_out": 1, "head_out_by_pos": 1}


def window_reach(windows: tuple, site_type: str, layer: int) -> int | None:
    """How many positions back from the answer query a (site_type, layer, position) cell can still move
    it when the layers slide (models.layer_windows): each attention it passes through carries a change at
    most window - 1 positions forward (the keys a query sees, models.visible_keys), so the sum of
    (window - 1) over the layers from there to the end; None where a global layer lies on the way (any
    distance) or no attention does (never_read_cells: a write after the last attention, windowed or not)."""
    later = windows[layer + _FIRST_LATER_LAYER[site_type]:]
    return None if not later or any(w is None for w in later) else sum(w - 1 for w in later)


def _back(row: pd.Series) -> int | None:
    """How many positions before the answer position (-1 from the end) a position cell of a tracked site type lies."""
    if row["site_type"] not in _FIRST_LATER_LAYER or pd.isna(row["position_from_end"]):
        return None
    return -1 - int(row["position_from_end"])


def never_read_cells(df: pd.DataFrame, n_layers: int) -> pd.Series:
    """Per row of the exact table, True for a write after the last layer's attention (its attn_out, mlp_out,
    resid_mid, resid_post, a head's output by position) at a position other than the answer position: no
    attention runs after it to carry it there, so it is 0 by construction on every decoder (review 12b A1:
    not a window effect)."""
    def unread(row: pd.Series) -> bool:
        back = _back(row)
        return back is not None and back > 0 and int(row["layer"]) + _FIRST_LATER_LAYER[row["site_type"]] >= n_layers
    return df.apply(unread, axis=1).astype(bool)


def unreachable_cells(df: pd.DataFrame, windows: tuple) -> pd.Series:
    """Per row of the exact table, True for a position cell that the sliding windows keep from the answer
    position (-1 from the end): more than window_reach positions back, with some attention still after it
    (a write after the last one is never_read_cells', on any decoder), so 0 by construction because of the
    windows. None where every prompt fits every window it crosses (window - 1 >= the distance)."""
    def out_of_reach(row: pd.Series) -> bool:
        back = _back(row)
        if back is None:
            return False
        reach = window_reach(windows, row["site_type"], int(row["layer"]))
        return reach is not None and back > reach
    return df.apply(out_of_reach, axis=1).astype(bool)
