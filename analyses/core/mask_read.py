"""Scoring a masked LM at its mask (review 15c B1): where an encoder checkpoint has its masked-LM head
(RobertaForMaskedLM.lm_head, BertForMaskedLM.cls) and every prompt of a task with one-token answers holds exactly
one mask token, the answer is read at that token through the head, as a decoder's answer is read at its last
position: the decoder metrics (logit difference, log-probability, accuracy) take the head's logits there as their
one answer position. Elsewhere an encoder keeps its pooled-embedding cosine (heads, attribution)."""
from __future__ import annotations

from typing import Any

import torch

from headscope.analyses.core.tasks import Task


def mlm_head(model) -> torch.nn.Module | None:
    """The checkpoint's own masked-LM head (hidden [..., d_model] -> logits [..., vocab]) on an encoder loaded as
    *ForMaskedLM, else None (BertModel and other bare encoders have none)."""
    if not model.facts.is_encoder:
        return None
    original = getattr(model.bridge, "original_model", None)
    if original is None or not type(original).__name__.endswith("ForMaskedLM"):
        return None
    head = next((getattr(original, name) for name in ("lm_head", "cls") if hasattr(original, name)), None)
    return head if isinstance(head, torch.nn.Module) else None


def mask_hits(model, task: Task) -> torch.Tensor | None:
    """[batch] how many of each prompt's real tokens are the tokenizer's mask token; None without one."""
    mask_id = getattr(model.tokenizer, "mask_token_id", None)
    if mask_id is None:
        return None
    hit = task.tokens.cpu() == int(mask_id)  # [batch, pos]
    if task.attention_mask is not None:
        hit &= task.attention_mask.cpu().bool()
    return hit.sum(1)


def mask_positions(model, task: Task) -> torch.Tensor | None:
    """[batch] int64 each prompt's mask-token position where the task is scored at the mask: an encoder with its
    masked-LM head (mlm_head), a task with one-token answers, and exactly one mask token in every prompt; None
    otherwise (the encoder's cosine then scores it)."""
    if mlm_head(model) is None or task.answers is None or task.continuation is not None or task.metric == "cosine":
        return None
    hits = mask_hits(model, task)
    if hits is None or not bool((hits == 1).all()):
        return None
    real = task.tokens.cpu() == int(model.tokenizer.mask_token_id)  # [batch, pos]
    if task.attention_mask is not None:
        real &= task.attention_mask.cpu().bool()
    return real.int().argmax(1).to(torch.int64)


def logits_at(model, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Final hidden states [n, pos, d_model] -> the masked-LM head's logits at each row's position [n, 1, vocab]
    (positions [n]), in the pass's dtype and differentiable: the one answer position the decoder metrics read."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    picked = hidden[rows, positions.to(hidden.device)]  # [n, d_model]
    return mlm_head(model)(picked)[:, None]  # [n, 1, vocab]


def mask_read(model, task: Task, positions: torch.Tensor | None = None) -> dict[str, Any] | None:
    """The summary's record of a task scored at its mask ({mask_token, n_prompts, head}); None where it is not."""
    positions = mask_positions(model, task) if positions is None else positions
    if positions is None:
        return None
    original = model.bridge.original_model
    name = "lm_head" if hasattr(original, "lm_head") else "cls"
    return {"mask_token": str(model.tokenizer.mask_token), "n_prompts": len(task),
            "head": f"{type(original).__name__}.{name}"}


def mask_metric(read: dict) -> str:
    """Reads.metric of an encoder scored at its mask (the summary's mask_read)."""
    return (f"the task's metric on the answer at each prompt's {read.get('mask_token', 'mask token')}, read through "
            f"the checkpoint's masked-LM head ({read.get('head', 'its MLM head')}) as a decoder's at its answer "
            "position")
