"""Edge attribution patching (EAP) and EAP-IG over a whole task, in batched passes (issue #23).

The graph (TransformerLens 4.3's edge graph, summed over positions): senders are the token
embedding ("input", hook_embed), each head's residual write ("a{l}.h{h}", attn.hook_result, no
output bias) and each MLP's output ("m{l}"); receivers are each head's query, key and value input
("a{l}.h{h}.q", ".k", ".v"; on GQA/MQA models keys and values are read per key-value head,
"a{l}.kv{g}.k"), each MLP's input ("m{l}") and the logits ("logits"). A receiver's input is the
residual stream *before* its norm (TransformerLens's split hook_q/k/v_input, hook_mlp_in and the
last hook_resid_post): the norm belongs to the receiver, so the input is exactly the sum of the
senders' writes plus constants (positional embedding, biases) and an edge is one term of it.

Three estimators, named by where the gradient is taken (`method`):
- "eap-clean" (Syed, Rager & Conmy 2023; Hanna et al.'s `method="EAP"`, the published EAP
  baseline): score = (a_clean[u] - a_corrupt[u]) . dM/dx_v on the clean run: the first-order
  estimate of M(clean) - M(clean with the edge corrupted) (noising). The authors' code reports the
  same number with the opposite sign ((corrupted - clean) . gradient); headscope keeps one sign for
  all three: positive means the edge's clean value raises the metric.
- "eap-denoising" (TransformerLens 4.3's `attribution_patch`): the gradient on the corrupted run:
  the first-order estimate of M(corrupted with the edge restored) - M(corrupted).
- "eap-ig" (Hanna, Pezzelle & Belinkov 2024, their `EAP-IG-inputs`; the default): the gradient
  averaged over steps k = 0..m-1 of the model run on the input embedding
  corrupt + k/m (clean - corrupt), the straight path along which every sender moves from its
  corrupted to its clean activation; m = 1 is "eap-denoising" exactly. The default because Hanna
  et al. find the circuits it selects markedly more faithful than either one-step EAP's.
The two one-step conventions differ wherever the model is far from linear between the runs (on
random GPT-2 / Llama-GQA checkpoints they share 13 / 8 of their top-20 edges).

Each score is summed over (real, unpadded) positions and averaged over examples, with M the task's
metric (logit difference answer - wrong answer at the answer position, or the answer's logit). All
steps and examples of a chunk share one forward and one backward pass (rows = steps x examples).
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import pandas as pd
import torch

from headscope.analyses.circuits.headsplit import KINDS, HeadSplit, per_head
from headscope.analyses.core.contract import one_token_answers
from headscope.analyses.core.tasks import Task
from headscope.errors import ConfigError, TaskError, UnsupportedModelError
from headscope.execution.batching import rows_per_pass
from headscope.hooks.post_norm import post_attention_norm


# ---- the graph -----------------------------------------------------------------------------
@dataclass(frozen=True)
class EdgeGraph:
    """Senders, receivers and which sender can reach which receiver.

    reach: [n_receivers, n_senders] bool, True where the sender writes before the receiver reads
    (same-layer heads do not reach their own MLP on parallel attention/MLP blocks)."""

    n_layers: int
    n_heads: int
    n_kv: int
    parallel: bool
    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    reach: torch.Tensor

    @property
    def n_edges(self) -> int:
        return int(self.reach.sum())

    def sender_index(self, layer: int, head: int | None = None) -> int:
        """Index of head (layer, head), or of the MLP of `layer` when head is None."""
        base = 1 + layer * (self.n_heads + 1)
        return base + (self.n_heads if head is None else head)

    def receiver_slices(self, layer: int) -> dict[str, slice]:
        """Receiver index ranges of `layer`: "q" [n_heads], "k" and "v" [n_kv], "mlp" [1]."""
        base = layer * (self.n_heads + 2 * self.n_kv + 1)
        h, k = self.n_heads, self.n_kv
        return {"q": slice(base, base + h), "k": slice(base + h, base + h + k),
                "v": slice(base + h + k, base + h + 2 * k), "mlp": slice(base + h + 2 * k, base + h + 2 * k + 1)}

    def edge_frame(self, scores: torch.Tensor) -> pd.DataFrame:
        """Tidy rows (sender, receiver, layers, kinds, score) for every edge of the graph."""
        r_idx, s_idx = self.reach.nonzero(as_tuple=True)
        return pd.DataFrame({
            "sender": [self.senders[i] for i in s_idx.tolist()],
            "receiver": [self.receivers[i] for i in r_idx.tolist()],
            "sender_index": s_idx.numpy(), "receiver_index": r_idx.numpy(),
            "score": scores[r_idx, s_idx].double().numpy(),
        })


def build_graph(model) -> EdgeGraph:
    """The edge graph of `model` (decoders with additive attention writes)."""
    f = model.facts
    n_layers, n_heads, n_kv = f.n_layers, f.n_heads, f.n_kv_heads or f.n_heads
    parallel = bool(getattr(model.bridge.cfg, "parallel_attn_mlp", False))
    senders = ["input"]
    for layer in range(n_layers):
        senders += [f"a{layer}.h{h}" for h in range(n_heads)] + [f"m{layer}"]
    kv = "h" if n_kv == n_heads else "kv"
    receivers, written = [], []  # written[r]: senders written before receiver r
    for layer in range(n_layers):
        before = 1 + layer * (n_heads + 1)
        receivers += [f"a{layer}.h{h}.q" for h in range(n_heads)]
        receivers += [f"a{layer}.{kv}{g}.k" for g in range(n_kv)] + [f"a{layer}.{kv}{g}.v" for g in range(n_kv)]
        written += [before] * (n_heads + 2 * n_kv)
        receivers.append(f"m{layer}")
        written.append(before if parallel else before + n_heads)
    receivers.append("logits")
    written.append(len(senders))
    reach = torch.arange(len(senders))[None, :] < torch.tensor(written)[:, None]  # [R, S]
    return EdgeGraph(n_layers, n_heads, n_kv, parallel, tuple(senders), tuple(receivers), reach)


@contextmanager
def edge_hooks_enabled(bridge):
    """Turn on the bridge's per-head writes and split q/k/v and MLP inputs; restore on exit. Where the
    bridge refuses the per-head hooks (a plain AttentionBridge, GPT-J) they stay off and `head_split`
    computes them from the weights."""
    cfg = bridge.cfg
    saved = (cfg.use_attn_result, cfg.use_split_qkv_input, cfg.use_hook_mlp_in, bool(getattr(cfg, "use_attn_in", False)))
    try:
        if saved[3]:
            bridge.set_use_attn_in(False)
        try:
            bridge.set_use_attn_result(True)
            bridge.set_use_split_qkv_input(True)
        except NotImplementedError:  # TransformerLens splits only its JointQKV / PositionEmbeddings bridges
            _set_flag(bridge, "use_attn_result", saved[0])
            _set_flag(bridge, "use_split_qkv_input", saved[1])
        bridge.set_use_hook_mlp_in(True)
        yield
    finally:
        _set_flag(bridge, "use_attn_result", saved[0])
        _set_flag(bridge, "use_split_qkv_input", saved[1])
        bridge.set_use_hook_mlp_in(saved[2])
        if saved[3]:
            bridge.set_use_attn_in(True)


def _set_flag(bridge, name: str, value: bool) -> None:
    if bool(getattr(bridge.cfg, name)) != bool(value):
        getattr(bridge, f"set_{name}")(value)


SPLIT_REASON = "TransformerLens's bridge does not compute them for this model's attention (its plain AttentionBridge)"


_NATIVE_SPLIT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> every hook_{q,k,v}_input fired


def head_split(model) -> HeadSplit | None:
    """None where the bridge makes hook_result and hook_{q,k,v}_input itself (inside edge_hooks_enabled),
    else the HeadSplit that computes them from the weights. Review 19a A4: MPT's ALiBi attention bridge takes
    use_split_qkv_input and never fires the split inputs (a KeyError mid-pass), so whether they fire is probed
    once (one pass of two tokens), as native_mlp_in's."""
    cfg = model.bridge.cfg
    if not (cfg.use_attn_result and cfg.use_split_qkv_input):
        return HeadSplit(model, SPLIT_REASON)
    key = model.bridge
    if key not in _NATIVE_SPLIT:
        fired: set[str] = set()
        names = [f"blocks.{layer}.attn.hook_{k}_input" for layer in range(model.facts.n_layers) for k in KINDS]
        try:
            with torch.no_grad():
                _forward(model, torch.zeros(1, 2, dtype=torch.long), None,
                         [(n, lambda x, hook: fired.add(hook.name)) for n in names])
        except KeyError:  # no such hook on this bridge
            pass
        _NATIVE_SPLIT[key] = len(fired) == len(names)
    if _NATIVE_SPLIT[key]:
        return None
    attn = type(model.bridge.blocks[0].attn).__name__
    return HeadSplit(model, f"TransformerLens's bridge does not fire this model's split q/k/v inputs (its {attn} "
                            "takes use_split_qkv_input and ignores it)")


MLP_REASON = "TransformerLens's bridge does not fire this model's hook_mlp_in (a parallel block, or BLOOM's block)"
_NATIVE_MLP_IN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bridge -> every hook_mlp_in fired


def native_mlp_in(model) -> bool:
    """Whether every block's hook_mlp_in fires (inside edge_hooks_enabled), from one probe pass of two tokens.
    It does not on parallel blocks (no ln2: the MLP reads ln1's output) nor on BLOOM, whose block bridge never
    wires it (reviews 16a/16c A1)."""
    key = model.bridge
    if key not in _NATIVE_MLP_IN:
        n_layers, fired = model.facts.n_layers, set()
        hooks = [(f"blocks.{layer}.hook_mlp_in", lambda x, hook: fired.add(hook.name)) for layer in range(n_layers)]
        tokens = torch.zeros(1, 2, dtype=torch.long)
        try:
            with torch.no_grad():
                _forward(model, tokens, None, hooks)
        except KeyError:  # no such hook on this bridge
            pass
        _NATIVE_MLP_IN[key] = len(fired) == n_layers
    return _NATIVE_MLP_IN[key]


def mlp_split(model, split: HeadSplit | None) -> HeadSplit | None:
    """None where the bridge's hook_mlp_in gives each MLP's input before its norm; else the HeadSplit that
    reads the MLP's normed input (mlp.hook_in) and maps it back through the MLP's norm (ln2's, or ln1's on a
    parallel block, as for GPT-J): `split` itself where the heads are split too."""
    if split is not None:
        return split
    return None if native_mlp_in(model) else HeadSplit(model, MLP_REASON)


def writer_names(n_layers: int) -> list[str]:
    names = ["hook_embed"]
    for layer in range(n_layers):
        names += [f"blocks.{layer}.attn.hook_result", f"blocks.{layer}.hook_mlp_out"]
    return names


def reader_names(n_layers: int) -> list[str]:
    names = []
    for layer in range(n_layers):
        names += [f"blocks.{layer}.attn.hook_{x}_input" for x in "qkv"] + [f"blocks.{layer}.hook_mlp_in"]
    return names + [f"blocks.{n_layers - 1}.hook_resid_post"]


SPLIT_READS = tuple(f"hook_{k}" for k in KINDS)


def split_reader_names(n_layers: int, heads: bool = True, mlps: bool = True) -> list[str]:
    """reader_names where headscope splits the inputs itself (HeadSplit): hook_q/k/v (heads) and mlp.hook_in
    (mlps), the heads' projections and the MLP's normed input, whose gradients HeadSplit maps back to the norms'
    inputs."""
    return [n.replace("_input", "") if heads and ".attn.hook_" in n else
            n.replace("hook_mlp_in", "mlp.hook_in") if mlps else n for n in reader_names(n_layers)]


def _keeper(store: dict):
    def hook(x, hook):
        store[hook.name] = x.detach()
    return hook


def check_model(model, task: Task) -> None:
    """One-line refusals: encoders, tasks without corrupted prompts or answers."""
    if model.facts.is_encoder:
        raise ConfigError(f"edge attribution reads next-token logits; {model.facts.name} is an encoder.")
    if task.corrupted_tokens is None or task.answers is None:
        raise TaskError(f"Task {task.name!r} needs corrupted prompts and answers for edge attribution.")
    if task.unpaired:
        raise TaskError(f"Task {task.name!r}: rows {task.unpaired} have no corrupted pair; pass `task.pairs()[0]`.")
    one_token_answers(task, "edge attribution")


# ---- metric and captures -------------------------------------------------------------------
def real_tokens(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """mask [batch, pos] -> bool [batch, pos, 1, ...] broadcastable to `like` [batch, pos, ...] on its
    device (None without a mask): where padding must be zeroed (torch.where, so NaNs do not leak)."""
    if mask is None:
        return None
    m = mask.to(like.device).bool()
    return m.reshape(*m.shape, *([1] * (like.ndim - 2)))


def row_metric(logits: torch.Tensor, pos: torch.Tensor, answers: torch.Tensor, wrong: torch.Tensor | None) -> torch.Tensor:
    """[rows]: logit(answer) - logit(wrong answer) at each row's answer position (the answer's
    logit alone when there is no wrong answer). logits [rows, pos, vocab]."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    last = logits[rows, pos.to(logits.device)]  # [rows, vocab]
    wide = torch.promote_types(last.dtype, torch.float32)  # metrics.logit_diff's float32 subtraction (review 17a B1)
    value = last[rows, answers.to(logits.device)].to(wide)
    if wrong is not None:
        value = value - last[rows, wrong.to(logits.device)].to(wide)
    return value


def _forward(model, tokens: torch.Tensor, mask: torch.Tensor | None, hooks) -> torch.Tensor:
    kw = {} if mask is None else {"attention_mask": mask.to(model.device)}
    with model.bridge.hooks(fwd_hooks=hooks):
        return model.bridge(tokens.to(model.device), **kw)


def capture_writers(model, tokens: torch.Tensor, mask: torch.Tensor | None = None,
                    final: bool = False) -> tuple[torch.Tensor, ...]:
    """(writes [batch, pos, n_senders, d_model], logits [batch, pos, vocab]) of one no-grad pass,
    plus the last block's output [batch, pos, d_model] when `final`; the caller has
    edge_hooks_enabled."""
    n_layers = model.facts.n_layers
    split = head_split(model)
    msplit = mlp_split(model, split)
    got: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(x, hook):
            got[name] = x.detach()
        return hook

    names = writer_names(n_layers) + ([f"blocks.{n_layers - 1}.hook_resid_post"] if final else [])
    if split is not None:  # each head's write from hook_z; ln1's input and hook_q/k/v to check the split
        names = [n.replace("attn.hook_result", "attn.hook_z") for n in names]
        names += [split.norm_input(layer) for layer in range(n_layers)]
        names += [f"blocks.{layer}.attn.hook_{k}" for layer in range(n_layers) for k in KINDS]
    if msplit is not None:  # the MLP's norm input and its output mlp.hook_in, to check the MLP split
        names += [msplit.mlp_norm_input(layer) for layer in range(n_layers)]
        names += [f"blocks.{layer}.mlp.hook_in" for layer in range(n_layers)]
    names = list(dict.fromkeys(names))
    with torch.no_grad():
        logits = _forward(model, tokens, mask, [(n, keep(n)) for n in names])
    if split is not None:
        for layer in range(n_layers):
            x = got[split.norm_input(layer)]
            for k in KINDS:
                act = got[f"blocks.{layer}.attn.hook_{k}"]
                split.check(layer, k, x, per_head(act, split.n_heads(layer, k)))
            got[f"blocks.{layer}.attn.hook_result"] = split.result(layer, per_head(got[f"blocks.{layer}.attn.hook_z"],
                                                                                   model.facts.n_heads))
    if msplit is not None:
        for layer in range(n_layers):
            msplit.check(layer, "mlp", got[msplit.mlp_norm_input(layer)], got[f"blocks.{layer}.mlp.hook_in"])
    parts = [got["hook_embed"][:, :, None]]
    for layer in range(n_layers):
        parts += [got[f"blocks.{layer}.attn.hook_result"], got[f"blocks.{layer}.hook_mlp_out"][:, :, None]]
    writes = torch.cat(parts, dim=2).float()  # [batch, pos, S, d]
    real = real_tokens(mask, writes)
    if real is not None:  # padding writes nothing: zero it (whatever padded queries computed)
        writes = torch.where(real, writes, 0.0)
    out = (writes, logits.float())
    if not final:
        return out
    resid = got[f"blocks.{n_layers - 1}.hook_resid_post"].float()
    real = real_tokens(mask, resid)
    return out + ((resid if real is None else torch.where(real, resid, 0.0)),)


def additive_error(model, w_clean, w_corr, r_clean, r_corr) -> tuple[float, float]:
    """(relative error, tolerance) of the residual stream as the sum of the senders' writes: the
    clean-minus-corrupted final residual against the summed write deltas ([b, pos, S, d] and [b, pos, d]),
    relative to that residual difference. The tolerance is what rounding allows in the model's dtype: one
    step, eps(dtype), of the two residual streams' size (each write and each residual add is rounded relative
    to the stream it joins), relative to their difference, and never below float32's 1e-3. Measured in
    bfloat16: errors of 0.004-0.007 under tolerances of 0.02-0.07 (random Llamas, a trained 3-layer Qwen3),
    while a post-norm Gemma 2 is off by 0.58 (random) to 9.1 (trained) in either dtype."""
    diff = (r_clean - r_corr) - (w_clean - w_corr).sum(2)  # [b, pos, d]
    scale = (r_clean - r_corr).norm().clamp_min(1e-12)
    eps = float(torch.finfo(model.dtype).eps)
    return float(diff.norm() / scale), max(1e-3, float(eps * (r_clean.norm() + r_corr.norm()) / scale))


def check_additive(model, w_clean, w_corr, r_clean, r_corr) -> None:
    """Refuse models whose residual stream is not the sum of the senders' writes (post-norm or scaled
    blocks): the relative error of the sum must be within its dtype's rounding (`additive_error`)."""
    err, tol = additive_error(model, w_clean, w_corr, r_clean, r_corr)
    if err > tol:
        dtype = str(model.dtype).removeprefix("torch.")
        miss = f"relative error {err:.2g}, beyond the {tol:.2g} that {dtype} rounding allows"
        if any(post_attention_norm(b) is not None for b in model.bridge.blocks):  # review 18d B1, 18b B2
            raise UnsupportedModelError(
                f"{model.facts.name}: its blocks pass the heads' summed output through a post-attention norm before "
                f"adding it to the residual stream (post-norm), so the heads' raw writes z_h W_O with the embedding "
                f"and MLP writes miss the stream ({miss}); through the norm a head's write depends on its layer's "
                "other heads (the norm's scale), and edge attribution needs each head's write added unchanged.")
        raise UnsupportedModelError(
            f"{model.facts.name}: the senders' writes as captured (the embedding, each head's z_h W_O, each MLP's "
            f"output) do not sum to the residual stream ({miss}): its blocks scale or transform what they add, "
            "and edge attribution needs blocks that add their writes unchanged.")


# ---- scoring -------------------------------------------------------------------------------
def _chunk_rows(model, n_pos: int, graph: EdgeGraph, grad: bool) -> int:
    """Rows per pass: the engine's rule, shrunk for the per-head copies of the residual stream."""
    base = rows_per_pass(model, n_pos, grad=grad)
    d = model.facts.d_model
    extra = n_pos * d * 4 * (graph.n_heads + 2 * graph.n_kv + len(graph.senders)) * (3 if grad else 2)
    cap = max(1, (256 * 2**20) // max(extra, 1))
    return max(1, min(base, cap))


METHODS = ("eap-clean", "eap-denoising", "eap-ig")


def resolve_method(method: str | None, ig_steps: int) -> tuple[str, int]:
    """(method, gradient steps): None means "eap-ig" with ig_steps > 1 and "eap-denoising" with 1
    (the meaning ig_steps had before the methods were named); one-step methods ignore ig_steps."""
    if ig_steps < 1:
        raise ConfigError(f"ig_steps must be >= 1, got {ig_steps}.")
    if method is None:
        method = "eap-ig" if ig_steps > 1 else "eap-denoising"
    if method not in METHODS:
        raise ConfigError(f"edge method must be one of {METHODS}, got {method!r}.")
    return method, (ig_steps if method == "eap-ig" else 1)


def method_label(method: str, steps: int) -> str:
    """Human-readable name of an estimator, saying where its gradient is taken."""
    if method == "eap-clean":
        return "EAP, clean-run gradient (Syed et al.; EAP-IG authors' method='EAP')"
    if method == "eap-denoising":
        return "EAP, corrupted-run gradient (denoising; TransformerLens attribution_patch)"
    if steps == 1:  # the one interpolation point is the corrupted input
        return "EAP-IG with 1 step: the corrupted-run gradient (the same estimate as eap-denoising)"
    return f"EAP-IG ({steps} steps, input embeddings interpolated)"


def edge_scores(model, task: Task, ig_steps: int = 1, method: str | None = None) -> tuple[EdgeGraph, torch.Tensor, dict]:
    """(graph, scores [n_receivers, n_senders] float64 (0 where no edge), info) over the whole task.

    method: "eap-clean", "eap-denoising" or "eap-ig" (module doc); None: by ig_steps (resolve_method).
    info: metric_clean, metric_corrupt (means over examples), metric_clean_rows, metric_corrupt_rows (the
    per-example values [n], for the gap's interval), n_examples, ig_steps, method."""
    check_model(model, task)
    method, ig_steps = resolve_method(method, ig_steps)
    on_clean = method == "eap-clean"
    graph = build_graph(model)
    n, n_pos = len(task), task.tokens.shape[1]
    pos, answers, wrong = task.answer_positions(), task.answers, task.wrong_answers
    mask = task.attention_mask
    bridge, n_layers = model.bridge, model.facts.n_layers
    scores = torch.zeros(len(graph.receivers), len(graph.senders), dtype=torch.float64)
    rows_clean: list[float] = []  # [n] per-example metric of the clean run
    rows_corrupt: list[float] = []  # [n] and of the corrupted run
    ex_per_chunk = max(1, _chunk_rows(model, n_pos, graph, grad=True) // ig_steps)
    with edge_hooks_enabled(bridge):
        split = head_split(model)
        msplit = mlp_split(model, split)
        # native: the bridge's split inputs; split: leaves on hook_q/k/v (mlp.hook_in), mapped back to x_h after the pass
        readers = split_reader_names(n_layers, heads=split is not None, mlps=msplit is not None)
        for start in range(0, n, ex_per_chunk):
            part = slice(start, min(n, start + ex_per_chunk))
            b = part.stop - part.start
            mk = None if mask is None else mask[part]
            w_clean, lg_clean, r_clean = capture_writers(model, task.tokens[part], mk, final=True)
            w_corr, lg_corr, r_corr = capture_writers(model, task.corrupted_tokens[part], mk, final=True)
            check_additive(model, w_clean, w_corr, r_clean, r_corr)
            wr = None if wrong is None else wrong[part]
            rows_clean += row_metric(lg_clean, pos[part], answers[part], wr).double().tolist()
            rows_corrupt += row_metric(lg_corr, pos[part], answers[part], wr).double().tolist()
            e_clean, e_corr = w_clean[:, :, 0], w_corr[:, :, 0]  # [b, pos, d] input embeddings
            alpha = (torch.arange(ig_steps, dtype=torch.float32, device=e_clean.device) / ig_steps  # on CUDA too
                     ).repeat_interleave(b)  # [steps*b]
            embed = e_corr.repeat(ig_steps, 1, 1) + alpha[:, None, None] * (e_clean - e_corr).repeat(ig_steps, 1, 1)
            embed = embed.to(model.device, model.dtype)
            leaves: dict[str, torch.Tensor] = {}

            def set_embed(x, hook, embed=embed):
                return embed

            def open_leaf(name, leaves=leaves):
                def hook(x, hook):
                    leaves[name] = leaf = torch.zeros_like(x, requires_grad=True)
                    return x + leaf
                return hook

            hooks = ([] if on_clean else [("hook_embed", set_embed)]) + [(r, open_leaf(r)) for r in readers]
            normed_in: dict[str, torch.Tensor] = {}  # split: ln1's (the MLP norm's) input per layer
            kept = ([split.norm_input(layer) for layer in range(n_layers)] if split is not None else []) + (
                [msplit.mlp_norm_input(layer) for layer in range(n_layers)] if msplit is not None else [])
            hooks += [(h, _keeper(normed_in)) for h in dict.fromkeys(kept)]
            rows_tokens = (task.tokens if on_clean else task.corrupted_tokens)[part].repeat(ig_steps, 1)
            rows_mask = None if mk is None else mk.repeat(ig_steps, 1)
            with torch.enable_grad():
                logits = _forward(model, rows_tokens, rows_mask, hooks)
                metric = row_metric(logits.float(), pos[part].repeat(ig_steps), answers[part].repeat(ig_steps),
                                    None if wr is None else wr.repeat(ig_steps)).sum()
                grads = torch.autograd.grad(metric, [leaves[r] for r in readers], allow_unused=True)
            grad_parts = []
            for name, g in zip(readers, grads):
                g = torch.zeros_like(leaves[name]) if g is None else g
                if split is not None and name.split(".")[-1] in SPLIT_READS:  # dM/dq_h -> dM/dx_h
                    layer, kind = int(name.split(".")[1]), name[-1]
                    g = split.input_grad(layer, kind, normed_in[split.norm_input(layer)],
                                         per_head(g, split.n_heads(layer, kind)))
                elif msplit is not None and name.endswith("mlp.hook_in"):  # dM/d(normed input) -> dM/dx
                    layer = int(name.split(".")[1])
                    g = msplit.mlp_input_grad(layer, normed_in[msplit.mlp_norm_input(layer)], g)
                g = g.float().reshape(ig_steps, b, *g.shape[1:]).mean(0)  # [b, pos, (heads,) d]
                grad_parts.append(g if g.ndim == 4 else g[:, :, None])
            g_all = torch.cat(grad_parts, dim=2).cpu()  # [b, pos, R, d]
            real = real_tokens(mk, g_all)
            if real is not None:  # sums over positions cover real tokens only
                g_all = torch.where(real, g_all, 0.0)
            delta = (w_clean - w_corr).cpu()  # [b, pos, S, d], 0 on padding (capture_writers)
            scores += torch.einsum("bpsd,bprd->rs", delta.double(), g_all.double())
    scores = (scores / n) * graph.reach
    info = {"metric_clean": sum(rows_clean) / n, "metric_corrupt": sum(rows_corrupt) / n,
            "metric_clean_rows": rows_clean, "metric_corrupt_rows": rows_corrupt, "n_examples": n,
            "ig_steps": ig_steps, "method": method}
    return graph, scores, info


def top_edges(graph: EdgeGraph, scores: torch.Tensor, k: int) -> pd.DataFrame:
    """The k edges of largest |score|, strongest first (ties in graph order)."""
    frame = graph.edge_frame(scores)
    order = frame.score.abs().sort_values(ascending=False, kind="stable").index
    out = frame.loc[order].head(k).reset_index(drop=True)
    out.insert(0, "rank", range(1, len(out) + 1))
    return out


# ---- TransformerLens's node names (for comparing with tools.analysis.attribution_patching) ------
def from_tl_node(node) -> str:
    """A TransformerLens edge-graph Node -> this graph's sender/receiver name (positions summed)."""
    if node.kind == "embed":
        return "input"
    if node.kind in ("mlp_out", "mlp_in"):
        return f"m{node.layer}"
    if node.kind == "logits":
        return "logits"
    if node.kind == "attn_head_out":
        return f"a{node.layer}.h{node.head}"
    return f"a{node.layer}.h{node.head}.{node.kind[0]}"


def to_tl_node(name: str, pos: int, n_layers: int, receiver: bool):
    """This graph's node name at position pos -> a TransformerLens Node (receiver: an MLP's input)."""
    from transformer_lens.tools.analysis.attribution_patching import Node

    if name == "input":
        return Node("embed", pos)
    if name == "logits":
        return Node("logits", pos, layer=n_layers - 1)
    parts = name.split(".")
    if len(parts) == 1:
        return Node("mlp_in" if receiver else "mlp_out", pos, layer=int(name[1:]))
    layer, head = int(parts[0][1:]), int(parts[1][1:])
    if len(parts) == 2:
        return Node("attn_head_out", pos, layer=layer, head=head)
    return Node(f"{parts[2]}_input", pos, layer=layer, head=head)
