"""Tasks from user files (JSONL, CSV or Parquet, read with `datasets`) and task resolution.

A task file has one example per row with the fields
    prompt            text ending where the answer is predicted
    answer            the correct next token (one token under the model's tokenizer)
    corrupted_prompt  optional: a same-length prompt whose answer differs
    wrong_answer      optional: the corrupted prompt's answer (needed for logit difference)
"""
from __future__ import annotations

from headscope.errors import TaskFileError

from pathlib import Path

import torch

from headscope.analyses.core.tasks import ZOO_TASKS, Task, zoo

REQUIRED = ("prompt", "answer")
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}



def read_task_rows(path: str | Path) -> list[dict]:
    """The rows of a task file, checked for the required fields."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise TaskFileError(f"Task file {str(path)!r}: unknown format {path.suffix!r}; use .jsonl, .csv or .parquet.")
    if not path.is_file():
        raise TaskFileError(f"Task file {str(path)!r} does not exist or is not a file.")
    import datasets

    try:
        rows = list(datasets.load_dataset(FORMATS[path.suffix.lower()], data_files=str(path), split="train"))
    except Exception as err:  # datasets raises many types for unreadable files
        raise TaskFileError(f"Task file {str(path)!r} could not be read as {path.suffix}: {err}") from err
    if not rows:
        raise TaskFileError(f"Task file {str(path)!r} has no examples; add at least one row.")
    for i, row in enumerate(rows):
        missing = [f for f in REQUIRED if not row.get(f)]
        if missing:
            raise TaskFileError(f"Task file {str(path)!r}, row {i}: missing field(s) {missing}; every row needs {list(REQUIRED)}.")
    return rows


def _single_token(model, text: str, row: int) -> int:
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise TaskFileError(f"row {row}: answer {text!r} is {len(ids)} tokens under this tokenizer; answers must be one token.")
    return int(ids[0])


def _tokens(model, prompts: list[str], what: str) -> torch.Tensor:
    seqs = [model.to_tokens(p)[0] for p in prompts]
    lengths = {len(s) for s in seqs}
    if len(lengths) > 1:
        raise TaskFileError(
            f"{what} tokenize to different lengths {sorted(lengths)}; analyses compare positions across "
            f"examples, so make every prompt the same number of tokens."
        )
    return torch.stack(seqs).cpu()  # [batch, pos]


def load_task_file(model, path: str | Path) -> Task:
    """A Task from a task file, tokenized with the model's tokenizer."""
    rows = read_task_rows(path)
    tokens = _tokens(model, [r["prompt"] for r in rows], "prompts")
    answers = torch.tensor([_single_token(model, r["answer"], i) for i, r in enumerate(rows)])
    corrupted = wrong = None
    if all(r.get("corrupted_prompt") for r in rows):
        corrupted = _tokens(model, [r["corrupted_prompt"] for r in rows], "corrupted prompts")
        if corrupted.shape != tokens.shape:
            raise TaskFileError(
                f"clean prompts have {tokens.shape[1]} tokens but corrupted prompts {corrupted.shape[1]}; "
                f"patching needs clean and corrupted prompts of the same length."
            )
    if all(r.get("wrong_answer") for r in rows):
        wrong = torch.tensor([_single_token(model, r["wrong_answer"], i) for i, r in enumerate(rows)])
    return Task(
        name=Path(path).stem, tokens=tokens, answers=answers, corrupted_tokens=corrupted, wrong_answers=wrong,
        metric="logit_diff" if wrong is not None else "logprob",
    )


def resolve_task(model, task: str | None, *, default: str = "kv", n_examples: int = 64, seed: int = 0, **kw) -> Task:
    """The Task an analysis runs on: a zoo task name, a task file path, or `default` when None."""
    name = task or default
    if name in ZOO_TASKS:
        return zoo(model, name, n_examples=n_examples, seed=seed, **kw)
    if Path(name).suffix.lower() in FORMATS:
        return load_task_file(model, name)
    raise TaskFileError(f"Unknown task {name!r}: use a zoo task ({', '.join(ZOO_TASKS)}) or a .jsonl/.csv/.parquet file.")
