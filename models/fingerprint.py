"""A model folder's content fingerprint: what `--resume` compares to notice changed weights.

A model is its files, not its path: new weights saved over the same folder must not mix with
results of the old ones. Reading gigabytes of weights in full at every run would cost more than
some analyses, so large files are fingerprinted by a sample of their bytes:

- every regular file at the top of the folder that loading reads (weights, config, tokenizer:
  MODEL_SUFFIXES; not a model card, plot or training log) by name and size;
- a file of at most 4 MiB (configs, tokenizers, tiny models) by the sha256 of all its bytes;
- a larger file by its head (a safetensors file's whole header: every tensor's name, dtype,
  shape and offsets; else the first 64 KiB) and 16 blocks of 64 KiB spread evenly over the rest,
  the last block included (about 1 MiB read per file).

New weights of the same shapes change every sampled block in practice (retraining or fine-tuning
moves all of them); an edit confined to bytes between the sampled blocks of a large file goes
unnoticed, the price of not reading the whole file.
"""
from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any

MODEL_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".tiktoken")  # weights, config, tokenizer files
WHOLE = 4 * 1024 * 1024  # files up to this size are hashed whole
BLOCK = 64 * 1024
SAMPLES = 16
MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on its JSON header


def _head_length(fh, size: int) -> int:
    """Bytes of the file's head to hash whole: a safetensors header (8-byte length + JSON), else BLOCK."""
    raw = fh.read(8)
    fh.seek(0)
    if len(raw) == 8:
        n = struct.unpack("<Q", raw)[0]
        if 0 < n <= MAX_HEADER and 8 + n <= size:
            return 8 + n
    return min(BLOCK, size)


def file_digest(path: str | os.PathLike) -> str:
    """sha256 (hex) of the file's bytes when it has at most WHOLE of them, else of its size, head
    and SAMPLES evenly spaced blocks (the module docstring)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        h.update(str(size).encode())
        if size <= WHOLE:
            for chunk in iter(lambda: fh.read(1024 * 1024), b""):
                h.update(chunk)
            return h.hexdigest()
        h.update(fh.read(_head_length(fh, size)))
        for k in range(SAMPLES):
            fh.seek((size - BLOCK) * k // (SAMPLES - 1))
            h.update(fh.read(BLOCK))
    return h.hexdigest()


def folder_fingerprint(folder: str | os.PathLike | None) -> str | None:
    """sha256 (hex) over the name and file_digest of every regular model file (MODEL_SUFFIXES) at the
    top of `folder` (symlinks followed, as a hub snapshot's are); None when `folder` is not a directory."""
    if folder is None or not Path(folder).is_dir():
        return None
    h = hashlib.sha256()
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.endswith(MODEL_SUFFIXES) and entry.is_file():  # (follows symlinks: a hub snapshot's blobs)
            h.update(entry.name.encode("utf-8", "surrogateescape") + b"\0" + file_digest(entry.path).encode() + b"\n")
    return h.hexdigest()


def model_fingerprint(spec_or_location: str | os.PathLike | None) -> str | None:
    """The fingerprint of a model's files: a local folder, a zoo model, or a hub name's cached
    snapshot (None when there is none, e.g. not downloaded yet, or for a spec that names no model)."""
    from headscope.errors import HeadscopeError
    from headscope.models.loading import _cached_snapshot, resolve_spec

    if spec_or_location is not None and Path(os.fspath(spec_or_location)).is_dir():
        return folder_fingerprint(spec_or_location)
    try:
        kind, location = resolve_spec(spec_or_location)
    except HeadscopeError:
        return None
    return folder_fingerprint(location if kind == "local" else _cached_snapshot(location))


ROUNDED_ROWS = 16  # rows (elements of a 1-D tensor) read per tensor by rounded_fingerprint, evenly spaced, both ends


def rounded_fingerprint(folder: str | os.PathLike | None, dtype: str) -> str | None:
    """sha256 (hex) of a folder's weights as `dtype` would hold them (review 15c C1: a bfloat16 copy of a float32
    model is the same model): every tensor of its *.safetensors files by name and shape, and ROUNDED_ROWS evenly
    spaced rows of it (the first and last included) cast to `dtype` (torch's round-to-nearest-even), so the copy
    and the original cast to the copy's dtype hash alike. None where the folder has no safetensors weights or
    `dtype` is not a torch floating dtype. Sampled, as file_digest is: an edit between the sampled rows is unseen."""
    import torch
    from safetensors import safe_open

    target = getattr(torch, str(dtype).removeprefix("torch."), None)
    if folder is None or not Path(folder).is_dir() or not isinstance(target, torch.dtype) or not target.is_floating_point:
        return None
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    tensors: dict[str, Any] = {}
    for path in files:  # sharded weights: one name space across the shards
        handle = safe_open(str(path), framework="pt")
        tensors.update({name: handle for name in handle.keys()})
    h = hashlib.sha256()
    for name in sorted(tensors):
        part = tensors[name].get_slice(name)
        shape = list(part.get_shape())
        h.update(f"{name}\0{shape}\n".encode("utf-8", "surrogateescape"))
        if not shape or not all(shape):  # a scalar or an empty tensor: its value in full
            rows = [tensors[name].get_tensor(name)]
        else:
            picks = sorted({(shape[0] - 1) * k // (ROUNDED_ROWS - 1) for k in range(ROUNDED_ROWS)})
            rows = [part[i:i + 1] for i in picks]  # [1, ...] each
        for row in rows:
            value = row.to(target) if row.is_floating_point() else row  # integer buffers as stored
            # reshape(-1): a 0-dim tensor (Apertus' xIELU alpha_p, beta...) cannot be viewed as bytes (review 20b A1)
            h.update(value.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return h.hexdigest()
