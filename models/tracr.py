"""Tracr-compiled models (Lindner et al. 2023) as Hugging Face GPT-2 directories, with their circuit.

Tracr compiles a RASP program into transformer weights whose circuit is known by construction:
which heads and MLPs the program uses, and which residual subspaces (one per RASP value) each
reads and writes. headscope loads such a model as a plain Hugging Face GPT-2 directory, so every
engine (capture, patching, head gates, edge attribution, the hook-free passes) runs on it unchanged.

Why GPT-2 and not TransformerLens 4.3's `utilities.tracr` + `TransformerBridge.boot_native`: a
natively booted bridge has its own module layout and no Hugging Face model under it, and
headscope's loading, ModelFacts, hook-free blocks and edge hooks are built on
`boot_transformers` over a Hugging Face family; a GPT-2 directory also loads without JAX, Tracr or
any headscope code (any GPT-2 reader computes the program). TransformerLens's converter is still
used for the one thing it does well: the categorical unembedding (`make_tracr_categorical_unembed`).

The conversion is exact up to float32 rounding:
- Tracr has no layer norm. GPT-2's LayerNorm is made the identity: the residual stream is stored
  twice, as [x, -x, 0...], so its mean is 0 at every position (nothing is centred away), and
  `layer_norm_epsilon` = 2^40 makes 1/sqrt(var + eps) exactly 2^-20 in float32 (for var < 2^16;
  relative error var / 2^41 above), undone by a norm weight of 2^20. Readers read the first copy.
- GPT-2's head size is n_embd / n_head; Tracr's key size is free. Heads are padded with zero
  dimensions to hd = max(key_size, ceil(2 d_tracr / n_heads)), n_embd = n_heads * hd, and W_Q is
  scaled by sqrt(hd / key_size) so that GPT-2's 1/sqrt(hd) is Tracr's 1/sqrt(key_size).
- ReLU MLPs (`activation_function="relu"`), learned positions (Tracr's pos_embed is GPT-2's wpe),
  causal attention (programs compiled with causal=True; the answer is read at the last position).
- Vocabulary: the input values, Tracr's BOS and PAD, the output values (an output value that is
  also an input value shares its id: its embedding is the input's, its unembedding the output's).

Ground truth (`tracr.json`, key "truth"): the heads and MLPs of Tracr's craft model and the edges
between them, derived by `compile_program` from the craft blocks' own input and output spaces
(u -> v when a basis direction u writes is one v reads; the token embedding is the sender
"input"), in the names of headscope's edge graph (analyses/circuits/edges.py).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from headscope.errors import ConfigError, ModelNotFoundError, UnsupportedModelError

CHECKPOINTS = Path(__file__).parent / "tracr_checkpoints"
BOS, PAD, UNK = "BOS", "compiler_pad", "<unk>"
EPS_EXP = 40  # layer_norm_epsilon = 2^40: 1/sqrt(var + eps) = 2^-20 exactly for var < 2^16
META = "tracr.json"


def is_assembled(obj: Any) -> bool:
    """Whether obj looks like Tracr's AssembledTransformerModel (duck-typed: no JAX import)."""
    return all(hasattr(obj, a) for a in ("params", "model_config", "residual_labels", "input_encoder"))


def names() -> list[str]:
    """The shipped programs (directories under tracr_checkpoints/)."""
    return sorted(p.name for p in CHECKPOINTS.iterdir() if (p / META).exists()) if CHECKPOINTS.exists() else []


def checkpoint_dir(name: str) -> Path:
    """Directory of shipped program `name` (one clear line when there is none)."""
    folder = CHECKPOINTS / name
    if not (folder / META).exists():
        raise ModelNotFoundError(f"Unknown Tracr model {name!r}; shipped: {', '.join(names()) or 'none'}.")
    return folder


def metadata(folder: str | os.PathLike) -> dict:
    """The program's tracr.json: name, vocab, max_seq_len, output values, truth."""
    path = Path(folder) / META
    if not path.exists():
        raise ConfigError(f"{folder} has no {META}: not a headscope Tracr directory.")
    return json.loads(path.read_text())


def _param(model: Any, module: str, name: str) -> np.ndarray:
    return np.asarray(model.params[module][name], dtype=np.float64)


def gpt2_weights(model: Any, output_label: str | None = None) -> tuple[dict, dict[str, np.ndarray], list[str]]:
    """(GPT-2 config kwargs, state dict of float32 arrays in GPT-2's names, vocabulary) of a compiled
    Tracr model (module doc). output_label: the program's RASP label (inferred from the output
    values when None, as TransformerLens does)."""
    from transformer_lens.utilities.tracr import make_tracr_categorical_unembed

    cfg = model.model_config
    if cfg.layer_norm:
        raise UnsupportedModelError("Tracr models compiled with layer_norm=True are not supported.")
    try:
        unembed = np.asarray(make_tracr_categorical_unembed(model, output_label), dtype=np.float64)  # [d, n_out]
    except (NotImplementedError, ValueError) as err:
        raise UnsupportedModelError(f"only categorical Tracr outputs are supported: {err}") from None
    tok, pos = _param(model, "token_embed", "embeddings"), _param(model, "pos_embed", "embeddings")
    d, n_heads, ks, n_layers = tok.shape[1], cfg.num_heads, cfg.key_size, cfg.num_layers
    hd = max(ks, math.ceil(2 * d / n_heads))
    width, d_mlp = n_heads * hd, cfg.mlp_hidden_size

    def write(w):  # [..., d] -> [..., width]: the residual stored as [x, -x, 0]
        out = np.zeros((*w.shape[:-1], width))
        out[..., :d], out[..., d:2 * d] = w, -w
        return out

    def read(w):  # [d, k] -> [width, k]: read the first copy
        out = np.zeros((width, w.shape[1]))
        out[:d] = w
        return out

    def per_head(w, b, scale=1.0):  # [d, H*ks], [H*ks] -> [width, H*hd], [H*hd], each head zero-padded
        wo, bo = np.zeros((width, n_heads * hd)), np.zeros(n_heads * hd)
        for h in range(n_heads):
            wo[:d, h * hd:h * hd + ks] = w[:, h * ks:(h + 1) * ks] * scale
            bo[h * hd:h * hd + ks] = b[h * ks:(h + 1) * ks] * scale
        return wo, bo

    in_map = dict(model.input_encoder.encoding_map)  # value -> Tracr token id
    out_map = dict(model.output_encoder.encoding_map)  # value -> output index
    vocab = [UNK] + [str(v) for v, _ in sorted(in_map.items(), key=lambda kv: kv[1])]
    vocab += [str(v) for v in out_map if str(v) not in vocab]
    index = {t: i for i, t in enumerate(vocab)}
    wte, lm_head = np.zeros((len(vocab), d)), np.zeros((len(vocab), width))
    for v, i in in_map.items():
        wte[index[str(v)]] = tok[i]
    for v, j in out_map.items():
        lm_head[index[str(v)], :d] = unembed[:, j]
    norm = {"weight": np.full(width, 2.0 ** (EPS_EXP // 2)), "bias": np.zeros(width)}
    state = {"transformer.wte.weight": write(wte), "transformer.wpe.weight": write(pos), "lm_head.weight": lm_head}
    for layer in range(n_layers):
        p, at = f"transformer.h.{layer}.", f"transformer/layer_{layer}/"
        q = per_head(_param(model, at + "attn/query", "w"), _param(model, at + "attn/query", "b"), math.sqrt(hd / ks))
        k = per_head(_param(model, at + "attn/key", "w"), _param(model, at + "attn/key", "b"))
        v = per_head(_param(model, at + "attn/value", "w"), _param(model, at + "attn/value", "b"))
        w_o, b_o = _param(model, at + "attn/linear", "w"), _param(model, at + "attn/linear", "b")  # [H*ks, d]
        c_proj = np.zeros((n_heads * hd, width))
        for h in range(n_heads):
            c_proj[h * hd:h * hd + ks] = write(w_o[h * ks:(h + 1) * ks])
        state.update({
            p + "attn.c_attn.weight": np.concatenate([q[0], k[0], v[0]], axis=1),
            p + "attn.c_attn.bias": np.concatenate([q[1], k[1], v[1]]),
            p + "attn.c_proj.weight": c_proj, p + "attn.c_proj.bias": write(b_o),
            p + "mlp.c_fc.weight": read(_param(model, at + "mlp/linear_1", "w")),
            p + "mlp.c_fc.bias": _param(model, at + "mlp/linear_1", "b"),
            p + "mlp.c_proj.weight": write(_param(model, at + "mlp/linear_2", "w")),
            p + "mlp.c_proj.bias": write(_param(model, at + "mlp/linear_2", "b")),
        })
        for ln in ("ln_1", "ln_2"):
            state.update({p + f"{ln}.{k2}": v2 for k2, v2 in norm.items()})
    state.update({f"transformer.ln_f.{k2}": v2 for k2, v2 in norm.items()})
    config = dict(vocab_size=len(vocab), n_positions=pos.shape[0], n_embd=width, n_layer=n_layers, n_head=n_heads,
                  n_inner=d_mlp, activation_function="relu", layer_norm_epsilon=2.0 ** EPS_EXP,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
                  bos_token_id=index[BOS], eos_token_id=index[BOS], pad_token_id=index[PAD])
    return config, {k2: v2.astype(np.float32) for k2, v2 in state.items()}, vocab


def _tokenizer(vocab: list[str], max_len: int):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(WordLevel(vocab={t: i for i, t in enumerate(vocab)}, unk_token=UNK))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token=UNK, pad_token=PAD, bos_token=BOS,
                                   model_max_length=max_len, padding_side="right")


def write_dir(model: Any, folder: str | os.PathLike, meta: dict | None = None, output_label: str | None = None) -> Path:
    """Write a compiled Tracr model as a Hugging Face GPT-2 directory (config.json,
    model.safetensors, tokenizer files) plus tracr.json (meta, with the vocabulary and output values)."""
    import torch
    from safetensors.torch import save_file
    from transformers import GPT2Config

    config, state, vocab = gpt2_weights(model, output_label)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = GPT2Config(**config)
    cfg.architectures = ["GPT2LMHeadModel"]
    cfg.save_pretrained(folder)
    save_file({k: torch.from_numpy(v).contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    _tokenizer(vocab, config["n_positions"]).save_pretrained(folder)
    info = dict(meta or {})
    info.update({"vocab": [str(v) for v in sorted(model.input_encoder.encoding_map, key=str) if str(v) not in (BOS, PAD)],
                 "outputs": [str(v) for v in model.output_encoder.encoding_map],
                 "max_seq_len": config["n_positions"] - 1, "causal": bool(model.model_config.causal)})
    tmp = folder / (META + ".tmp")
    tmp.write_text(json.dumps(info, indent=1, sort_keys=True))
    os.replace(tmp, folder / META)
    return folder


def to_directory(model: Any) -> str:
    """A compiled Tracr model written to a fresh temporary GPT-2 directory (for load_model)."""
    if not model.model_config.causal:
        raise UnsupportedModelError("headscope reads next-token logits of causal decoders: compile the Tracr "
                                    "program with causal=True (compile_rasp_to_model(..., causal=True)).")
    return str(write_dir(model, tempfile.mkdtemp(prefix="headscope-tracr-")))


# ---- compiling (needs the optional extra: pip install 'headscope[tracr]') -------------------------
def _labels(space) -> set[str]:
    return {d.name if d.value is None else f"{d.name}:{d.value}" for d in space.basis}


def craft_truth(craft_model, model: Any, sink_labels: set[str]) -> dict:
    """The circuit of a compiled program from its craft blocks: {"nodes": heads "a{l}.h{h}" and MLPs
    "m{l}" the program uses, "edges": [sender, receiver] in headscope's edge-graph names,
    "blocks": per component what it reads and writes (RASP basis labels)}.

    Blocks are placed in layers as Tracr's assembler places them (attention and MLP modules in
    order, skipping a half-layer whose kind does not match); a head's query, key and value inputs
    read its w_qk left and right spaces and its w_ov input space; the sender "input" (the token
    embedding) writes the residual directions its embedding rows touch."""
    from tracr.craft import transformers

    blocks, slot = [], 0  # slot: 2 * layer + (1 for an MLP)
    for module in craft_model.blocks:
        is_mlp = isinstance(module, transformers.MLP)
        while slot % 2 != int(is_mlp):
            slot += 1
        layer = slot // 2
        if is_mlp:
            blocks.append({"name": f"m{layer}", "layer": layer, "reads": {"mlp": sorted(_labels(module.fst.input_space))},
                           "writes": sorted(_labels(module.snd.output_space))})
        else:
            for h, head in enumerate(module.as_multi().heads()):
                blocks.append({"name": f"a{layer}.h{h}", "layer": layer, "reads": {
                    "q": sorted(_labels(head.w_qk.left_space)), "k": sorted(_labels(head.w_qk.right_space)),
                    "v": sorted(_labels(head.w_ov.input_space))}, "writes": sorted(_labels(head.w_ov.output_space))})
        slot += 1
    labels = list(model.residual_labels)
    tok = np.asarray(model.params["token_embed"]["embeddings"])
    input_writes = {labels[i] for i in np.flatnonzero(np.abs(tok).sum(0))}
    senders = [("input", -1, 0, input_writes)] + [
        (b["name"], b["layer"], int(b["name"].startswith("m")), set(b["writes"])) for b in blocks]
    edges = []
    for b in blocks:
        order = (b["layer"], int(b["name"].startswith("m")))
        for kind, reads in b["reads"].items():
            receiver = b["name"] if kind == "mlp" else f"{b['name']}.{kind}"
            edges += [[s, receiver] for s, layer, m, writes in senders
                      if (layer, m) < order and writes & set(reads)]
    edges += [[s, "logits"] for s, _, _, writes in senders if writes & sink_labels]
    return {"nodes": [b["name"] for b in blocks], "edges": edges, "blocks": blocks}


def compile_program(program, vocab, max_seq_len: int, folder: str | os.PathLike, meta: dict | None = None,
                    mlp_exactness: int = 100):
    """Compile a RASP program (causal, BOS "BOS") with Tracr, keeping its craft model, and write it
    with its ground truth (craft_truth) as a headscope Tracr directory. Returns (folder, assembled)."""
    from tracr.compiler import (
        basis_inference,
        craft_graph_to_model,
        craft_model_to_transformer,
        expr_to_craft_graph,
        nodes,
        rasp_to_graph,
        validating,
    )
    from tracr.craft import bases
    from tracr.rasp import rasp

    bad = validating.static_validate(program)
    if bad:
        raise UnsupportedModelError("Tracr cannot compile: " + "; ".join(f"{e.expr.name}: {e.reason}" for e in bad))
    extracted = rasp_to_graph.extract_rasp_graph(program)
    graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
    basis_inference.infer_bases(graph, sink, set(vocab), max_seq_len)
    expr_to_craft_graph.add_craft_components_to_rasp_graph(
        graph, bos_dir=bases.BasisDirection(rasp.tokens.label, BOS), mlp_exactness=mlp_exactness)
    craft_model = craft_graph_to_model.craft_graph_to_model(graph, sources)
    assembled = craft_model_to_transformer.craft_model_to_transformer(
        craft_model=craft_model, graph=graph, sink=sink, max_seq_len=max_seq_len, causal=True,
        compiler_bos=BOS, compiler_pad=PAD)
    sink_labels = {d.name if d.value is None else f"{d.name}:{d.value}" for d in sink[nodes.OUTPUT_BASIS]}
    truth = craft_truth(craft_model, assembled, sink_labels)
    info = {**(meta or {}), "program": program.label, "truth": truth}
    return write_dir(assembled, folder, info, output_label=program.label), assembled
