"""Write a trained zoo model as a shippable checkpoint directory.

    config.json, model.safetensors   save_pretrained(safe_serialization=True)
    tokenizer.json, ...              the word-level tokenizer (vocab.build_tokenizer)
    card.json                        command, seed, steps, wall time, held-out accuracies, targets
    MODEL_CARD.md                    the same for people, with what the loss curves show
    loss_curve.png                   per-task training loss and held-out accuracy by step
    history.csv                      the numbers behind loss_curve.png
"""
from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path

import torch

from headscope.models.zoo import evaluate, vocab
from headscope.models.zoo.recipes import Recipe
from headscope.models.zoo.train import TrainResult

TASK_LABELS = {
    "kv": "kv retrieval, 8 pairs",
    "induction": "induction, second half per token",
    "facts": "facts recall",
    "ioi": "ioi, held-out name pairs",
}


def plot_history(history: list[dict], path: Path, *, title: str) -> None:
    """Two panels: smoothed per-task training loss, and held-out accuracy at each eval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    train_rows = pd.DataFrame([r for r in history if r["kind"] == "train"])
    eval_rows = pd.DataFrame([r for r in history if r["kind"] == "eval"])
    tasks = ("kv", "induction", "facts", "ioi")
    loss = train_rows.melt(id_vars="step", value_vars=[f"loss_{t}" for t in tasks], var_name="task", value_name="task_loss")
    loss = loss.rename(columns={"task_loss": "loss"})
    loss["task"] = loss["task"].str.removeprefix("loss_")
    loss["loss"] = loss.groupby("task")["loss"].transform(lambda s: s.rolling(50, min_periods=1).mean())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    sns.lineplot(data=loss, x="step", y="loss", hue="task", ax=axes[0])
    axes[0].set_yscale("log")
    axes[0].set_title("training loss (50-step mean)")
    if len(eval_rows):
        acc = eval_rows.melt(id_vars="step", value_vars=[f"acc_{t}" for t in tasks], var_name="task", value_name="accuracy")
        acc["task"] = acc["task"].str.removeprefix("acc_")
        sns.lineplot(data=acc, x="step", y="accuracy", hue="task", marker="o", ax=axes[1])
    axes[1].set_ylim(0, 1.02)
    axes[1].set_title("held-out accuracy")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _markdown(card: dict, notes: str) -> str:
    acc, targets, extra = card["accuracy"], card["targets"], card["accuracy_by_pairs"]
    rows = "\n".join(
        f"| {TASK_LABELS[t]} | {acc[t]:.1%} | >= {targets[t]:.0%} | {'yes' if card['meets_target'][t] else '**no**'} |"
        for t in acc
    )
    pairs = ", ".join(f"{k.split('_')[1]} pairs {v:.1%}" for k, v in extra.items())
    m = card["model"]
    return f"""# {card['name']}

{card['description']}. A headscope zoo model: a decoder-only transformer trained from scratch by
headscope's own code on four synthetic tasks (see `headscope.models.zoo.data`), shipped so that
every analysis can run offline on a model whose mechanisms are known. Load it as
`headscope.load_model("zoo/{card['name']}")` or with `transformers.AutoModelForCausalLM.from_pretrained(<this dir>)`.

- Architecture: `{card['hf_class']}`, {m['n_layers']} layers x {m['n_heads']} heads
  ({'{:d} KV heads, '.format(m['n_kv_heads']) if m['arch'] == 'llama' else ''}d_model {m['d_model']}, MLP {m['d_mlp']}),
  {card['params']:,} parameters, weights in {card['dtype']} safetensors.
- Tokenizer: word level, {card['vocab_size']} tokens (`<unk> <pad> <bos> <eos>` + task words); prompts start with `<bos>`.
- Training command: `{card['command']}` (seed {card['seed']}, {card['steps']} steps,
  {card['wall_time_s'] / 60:.1f} min on {card['hardware']}).

## Held-out accuracy

Argmax over the whole vocabulary, {card['eval']['n']} fresh examples per task (seed {card['eval']['seed']}).

| task | accuracy | target | met |
|---|---|---|---|
{rows}

kv accuracy by number of pairs: {pairs}.

![loss curve](loss_curve.png)

## Notes

{notes}
"""


def save_checkpoint(
    result: TrainResult, recipe: Recipe, out: Path, *, seed: int, steps: int, command: str,
    notes: str = "", eval_n: int = 1000,
) -> dict:
    """Save model, tokenizer, card.json, MODEL_CARD.md and loss_curve.png into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    model = result.model
    model.save_pretrained(out, safe_serialization=True)
    (out / "model.safetensors").chmod(0o644)  # readable by everyone, like the other files
    vocab.build_tokenizer().save_pretrained(out)
    acc = evaluate.evaluate(model, n=eval_n)
    by_pairs = evaluate.kv_by_pairs(model, n=eval_n // 2)
    card = {
        "name": recipe.name,
        "description": recipe.description,
        "hf_class": type(model).__name__,
        "model": asdict(recipe.model),
        "train": asdict(recipe.train) | {"steps": steps},
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": vocab.VOCAB_SIZE,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "command": command,
        "seed": seed,
        "steps": steps,
        "wall_time_s": round(result.wall_time_s, 1),
        "hardware": f"{torch.get_num_threads()} CPU thread(s), {platform.machine()}",
        "torch": torch.__version__,
        "accuracy": acc,
        "accuracy_by_pairs": by_pairs,
        "targets": dict(evaluate.TARGETS),
        "meets_target": {t: acc[t] >= evaluate.TARGETS[t] for t in acc},
        "eval": {"n": eval_n, "seed": evaluate.EVAL_SEED, "induction_length": evaluate.INDUCTION_LENGTH},
        "final_eval": [r for r in result.history if r["kind"] == "eval"][-1:],
    }
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    _write_history(result.history, out / "history.csv")
    plot_history(result.history, out / "loss_curve.png", title=recipe.name)
    write_model_card(out, notes)
    return card


def _write_history(history: list[dict], path: Path) -> None:
    """Per-step training losses and periodic held-out accuracies, one row per step / eval."""
    import pandas as pd

    pd.DataFrame(history).to_csv(path, index=False, float_format="%.4g")


def write_model_card(out: Path, notes: str = "") -> None:
    """(Re)write MODEL_CARD.md from card.json, with free-text notes (what was tried, curves)."""
    card = json.loads((out / "card.json").read_text())
    (out / "MODEL_CARD.md").write_text(_markdown(card, notes or "None."))
