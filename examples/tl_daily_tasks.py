"""A TransformerLens user's ten daily tasks, in headscope and in TransformerLens 4.3, side by side.

Each task is a pair of functions, `hs_<task>` (headscope) and `tl_<task>` (TransformerLens 4.3's
TransformerBridge booted on the same local checkpoint), written as a notebook user would type them.
`run()` executes every pair, checks that the two compute the same numbers wherever they compute the
same quantity (logits, generated text, cache entries, patching sweeps, ablation effects, logit lens,
DLA on TransformerLens's folded model, integrated gradients, reloaded files), and counts each
function's lines. Run it: `python examples/tl_daily_tasks.py [CHECKPOINT_DIR]` (default: the zoo's
synth-gpt2, which solves IOI) prints the table of lines.

What is counted: the function body's non-blank, non-comment lines, its docstring left out, and a final
`return` of plain names left out (it only hands the values to the checks; a notebook cell shows them by
naming them). Imports a task needs beyond `import headscope as hs` and `from transformer_lens.model_bridge
import TransformerBridge` count. Each task stands alone: TransformerLens's answer ids and metric are
built inside each task that needs them, as headscope builds them inside each call. The TransformerLens
side is the shortest idiomatic code found: its own tools where 4.3 has them (`transformer_lens.patching`,
`tools.analysis.logit_lens` / `direct_logit_attribution` in compatibility mode), captum for integrated
gradients, CircuitsVis (TransformerLens's companion package) for the attention view; results it returns
as tensors are not dressed up into tables.
"""
from __future__ import annotations

import ast
import inspect
import re
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from transformer_lens.model_bridge import TransformerBridge

import headscope as hs

PROMPT = "when Mary and John went to the shop , John gave a book to"  # zoo IOI: the answer is Mary
CORRUPT = "when Mary and John went to the shop , Mary gave a book to"  # same length; its answer is John
# the user's own table, in their own column names (four IOI rows of one token length)
DF = pd.DataFrame({
    "text": [PROMPT, "after Alice and Bob went to the park , Bob handed a ball to",
             "while Kate and Leo were at the school , Kate gave a pen to",
             "then Emma and Sam met at the market , Sam sent a letter to"],
    "label": [" Mary", " Alice", " Leo", " Emma"],
    "bad": [CORRUPT, "after Alice and Bob went to the park , Alice handed a ball to",
            "while Kate and Leo were at the school , Leo gave a pen to",
            "then Emma and Sam met at the market , Emma sent a letter to"],
    "other": [" John", " Bob", " Kate", " Sam"],
})
FIELDS = {"prompt": "text", "answer": "label", "corrupted_prompt": "bad", "wrong_answer": "other"}


# ---- 1. load, tokenize, generate ------------------------------------------------------------------
def hs_load_tokenize_generate(path):
    model = hs.load_model(path)
    tokens, str_tokens = model.to_tokens(PROMPT), model.to_str_tokens(PROMPT)
    text = model.generate(PROMPT, max_new_tokens=3, do_sample=False)
    return model, tokens, str_tokens, text


def tl_load_tokenize_generate(path):
    bridge = TransformerBridge.boot_transformers(path)
    tokens, str_tokens = bridge.to_tokens(PROMPT), bridge.to_str_tokens(PROMPT)
    # use_past_kv_cache=False: with transformers >= 5.2x, 4.3's cached generation is wrong (README)
    text = bridge.generate(PROMPT, max_new_tokens=3, do_sample=False, use_past_kv_cache=False, verbose=False)
    return bridge, tokens, str_tokens, text


# ---- 2. cache indexing ---------------------------------------------------------------------------
def hs_cache_indexing(model):
    logits, cache = model.run_with_cache(PROMPT)
    pattern, resid = cache["pattern", -1][0, :, -1], cache["resid_post", 1][0, -1]
    heads, labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    return logits, pattern, resid, heads, labels


def tl_cache_indexing(bridge):
    logits, cache = bridge.run_with_cache(PROMPT)
    pattern, resid = cache["pattern", -1][0, :, -1], cache["resid_post", 1][0, -1]
    heads, labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    return logits, pattern, resid, heads, labels


# ---- 3. hooks ------------------------------------------------------------------------------------
def hs_hooks(model):
    def zero_head(z, hook):
        z[:, :, 3] = 0
        return z
    stored = {}
    logits = model.run_with_hooks(PROMPT, fwd_hooks=[
        ("blocks.1.attn.hook_z", zero_head), ("blocks.1.hook_resid_post", lambda x, hook: stored.update({hook.name: x}))])
    return logits, stored


def tl_hooks(bridge):
    def zero_head(z, hook):
        z[:, :, 3] = 0
        return z
    stored = {}
    logits = bridge.run_with_hooks(PROMPT, fwd_hooks=[
        ("blocks.1.attn.hook_z", zero_head), ("blocks.1.hook_resid_post", lambda x, hook: stored.update({hook.name: x}))])
    return logits, stored


# ---- 4. IOI activation patching ------------------------------------------------------------------
def hs_ioi_patching(model):
    pat = hs.activation_patching(model, prompt=PROMPT, answer=" Mary", corrupted_prompt=CORRUPT, wrong_answer=" John",
                                 sites=["resid_pre", "head_out"])
    return pat


def tl_ioi_patching(bridge):
    from transformer_lens import patching
    clean, corrupt = bridge.to_tokens(PROMPT), bridge.to_tokens(CORRUPT)
    mary, john = bridge.to_single_token(" Mary"), bridge.to_single_token(" John")
    _, clean_cache = bridge.run_with_cache(clean)

    def logit_diff(logits):
        return logits[0, -1, mary] - logits[0, -1, john]
    resid = patching.get_act_patch_resid_pre(bridge, corrupt, clean_cache, logit_diff)  # [layer, pos]
    heads = patching.get_act_patch_attn_head_out_all_pos(bridge, corrupt, clean_cache, logit_diff)  # [layer, head]
    return resid, heads


# ---- 5. attention view ---------------------------------------------------------------------------
def hs_attention_view(model):
    return hs.show_attention(model, PROMPT, layer=1, heads=[0, 3])


def tl_attention_view(bridge):
    import circuitsvis as cv
    _, cache = bridge.run_with_cache(PROMPT)
    return cv.attention.attention_patterns(tokens=bridge.to_str_tokens(PROMPT), attention=cache["pattern", 1][0, [0, 3]])


# ---- 6. ablation sweep: zero each head, the change in logit difference ---------------------------
def hs_ablation_sweep(model):
    return hs.head_importance(model, PROMPT, answer=" Mary", wrong_answer=" John", methods=["zero"])


def tl_ablation_sweep(bridge):
    mary, john = bridge.to_single_token(" Mary"), bridge.to_single_token(" John")
    clean = bridge(PROMPT)[0, -1]
    importance = torch.zeros(bridge.cfg.n_layers, bridge.cfg.n_heads)
    for layer in range(bridge.cfg.n_layers):
        for head in range(bridge.cfg.n_heads):
            def zero_head(z, hook, head=head):
                z[:, :, head] = 0
                return z
            logits = bridge.run_with_hooks(PROMPT, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)])[0, -1]
            importance[layer, head] = (clean[mary] - clean[john]) - (logits[mary] - logits[john])
    return importance


# ---- 7. logit lens and direct logit attribution ---------------------------------------------------
def hs_lens_dla(model):
    lens = hs.logit_lens(model, PROMPT, answer=" Mary", wrong_answer=" John")
    dla = hs.direct_logit_attribution(model, PROMPT, answer=" Mary", wrong_answer=" John")
    return lens, dla


def tl_lens_dla(bridge):
    from transformer_lens.tools.analysis import direct_logit_attribution, logit_lens
    bridge.enable_compatibility_mode()  # DLA refuses the unprocessed bridge
    lens = logit_lens(bridge, PROMPT, targets=[" Mary", " John"], return_type="log_probs")
    dla = direct_logit_attribution(bridge, PROMPT, answer_tokens=" Mary", incorrect_tokens=" John", unit="head")
    return lens, dla


# ---- 8. attribution of one prompt (integrated gradients on the token embeddings) ------------------
def hs_attribution(model):
    return hs.attribution(model, PROMPT, answer=" Mary", wrong_answer=" John")


def tl_attribution(bridge, n_steps):  # n_steps: the user's choice (headscope doubles its steps until converged)
    from captum.attr import LayerIntegratedGradients
    tokens = bridge.to_tokens(PROMPT)
    mary, john = bridge.to_single_token(" Mary"), bridge.to_single_token(" John")
    baseline = tokens.clone()
    baseline[:, 1:-1] = bridge.tokenizer.pad_token_id  # keep BOS and the last token

    def logit_diff(tokens):
        logits = bridge(tokens)[:, -1]
        return logits[:, mary] - logits[:, john]
    scores = LayerIntegratedGradients(logit_diff, bridge.embed).attribute(tokens, baseline, n_steps=n_steps).sum(-1)
    return scores


# ---- 9. the user's own DataFrame: patching averaged over its rows ---------------------------------
def hs_own_dataframe(model):
    return hs.activation_patching(model, hs.load_task(model, DF, FIELDS), sites="resid_pre")


def tl_own_dataframe(bridge):
    from transformer_lens import patching
    clean, corrupt = bridge.to_tokens(list(DF.text)), bridge.to_tokens(list(DF.bad))
    answers, wrong = (torch.tensor([[bridge.to_single_token(t)] for t in column]) for column in (DF.label, DF.other))
    _, clean_cache = bridge.run_with_cache(clean)

    def logit_diff(logits):
        return (logits[:, -1].gather(-1, answers) - logits[:, -1].gather(-1, wrong)).mean()
    return patching.get_act_patch_resid_pre(bridge, corrupt, clean_cache, logit_diff)  # [layer, pos]


# ---- 10. save and load a cache and a result -------------------------------------------------------
def hs_save_load(model, result, folder):
    _, cache = model.run_with_cache(PROMPT)
    cache.save(folder / "cache.safetensors")
    result.save(folder / "patching")
    cache = hs.Activations.load(folder / "cache.safetensors", model=model)
    result = hs.Result.load(folder / "patching")
    return cache, result


def tl_save_load(bridge, result, folder):
    from transformer_lens import ActivationCache
    _, cache = bridge.run_with_cache(PROMPT)
    torch.save(cache.cache_dict, folder / "cache.pt")
    torch.save(result, folder / "patching.pt")
    cache = ActivationCache(torch.load(folder / "cache.pt"), bridge)
    result = torch.load(folder / "patching.pt")
    return cache, result


TASKS = {  # task -> its label in the table
    "load_tokenize_generate": "load, tokenize, generate",
    "cache_indexing": "cache indexing",
    "hooks": "hooks",
    "ioi_patching": "IOI patching",
    "attention_view": "attention view",
    "ablation_sweep": "ablation sweep",
    "lens_dla": "logit lens and DLA",
    "attribution": "attribution of one prompt",
    "own_dataframe": "own DataFrame",
    "save_load": "save and load",
}


# ---- counting and checking (not part of the comparison) -------------------------------------------
def count_lines(fn) -> int:
    """Non-blank, non-comment lines of fn's body: its docstring and a final `return` of plain names
    (or of a tuple of names) left out."""
    source = textwrap.dedent(inspect.getsource(fn))
    body = ast.parse(source).body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    last = body[-1].value if isinstance(body[-1], ast.Return) else None
    if last is not None and all(isinstance(e, ast.Name) for e in (last.elts if isinstance(last, ast.Tuple) else [last])):
        body = body[:-1]
    lines = source.splitlines()[body[0].lineno - 1:body[-1].end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


@dataclass(frozen=True)
class Row:
    task: str
    headscope: int
    transformer_lens: int
    checked: str  # what was checked equal, or why the TransformerLens side did not run


def close(a, b, atol: float = 1e-4, what: str = "") -> None:
    a, b = (torch.as_tensor(x.copy() if hasattr(x, "copy") else x).detach().float().cpu() for x in (a, b))
    assert a.shape == b.shape, f"{what}: shapes {tuple(a.shape)} and {tuple(b.shape)}"
    err = (a - b).abs().max().item() if a.numel() else 0.0
    assert err <= atol, f"{what}: headscope and TransformerLens differ by {err:.3g} (> {atol})"


def _shown_patterns(html: str, n_heads: int, n: int) -> torch.Tensor:
    """The weights headscope's pattern view shows (each cell's tooltip, 4 decimals): [head, query, key]."""
    values = [float(v) for v in re.findall(r": ([0-9.]+)'></td>", html)]
    return torch.tensor(values).reshape(n_heads, n, n)


def run(path: str | Path | None = None) -> list[Row]:
    """Run every pair on the checkpoint at `path` (default: the zoo's synth-gpt2), check that both sides
    agree, and return each task's line counts."""
    from headscope.models.zoo.registry import checkpoint_dir

    path = str(path or checkpoint_dir("synth-gpt2"))
    torch.manual_seed(0)
    checked: dict[str, str] = {}
    with torch.no_grad():
        model, tokens, str_tokens, text = hs_load_tokenize_generate(path)
        bridge, ref_tokens, ref_str, ref_text = tl_load_tokenize_generate(path)
        assert torch.equal(tokens, ref_tokens.cpu()) and str_tokens == ref_str, (str_tokens, ref_str)
        assert text == ref_text, (text, ref_text)
        checked["load_tokenize_generate"] = "tokens, string tokens, generated text"

        ours, ref = hs_cache_indexing(model), tl_cache_indexing(bridge)
        for a, b, what in zip(ours[:4], ref[:4], ("logits", "pattern", "resid_post", "stack_head_results")):
            close(a, b, what=what)
        assert ours[4] == ref[4]
        checked["cache_indexing"] = "logits, pattern, resid_post, per-head results"

        ours, ref = hs_hooks(model), tl_hooks(bridge)
        close(ours[0], ref[0], what="hooked logits")
        # hook.name: headscope's is the name registered; TransformerLens 4.3's bridge says blocks.1.hook_out
        assert list(ours[1]) == ["blocks.1.hook_resid_post"] and len(ref[1]) == 1, (list(ours[1]), list(ref[1]))
        close(ours[1]["blocks.1.hook_resid_post"], next(iter(ref[1].values())), what="stored activation")
        checked["hooks"] = "edited logits, stored activation"

        pat, (resid, heads) = hs_ioi_patching(model), tl_ioi_patching(bridge)
        close(pat.tensor("value", site_type="resid_pre"), resid, what="resid_pre patching")
        close(pat.tensor("value", site_type="head_out"), heads, what="head_out patching")
        checked["ioi_patching"] = "patched logit difference, [layer, pos] and [layer, head]"

        view = hs_attention_view(model)
        _, cache = bridge.run_with_cache(PROMPT)
        close(_shown_patterns(view._repr_html_(), 2, tokens.shape[1]), cache["pattern", 1][0, [0, 3]], atol=6e-5,
              what="shown attention")
        try:
            import circuitsvis  # noqa: F401
        except ImportError:
            checked["attention_view"] = "headscope's shown weights against TL's pattern (TL view not run: no circuitsvis)"
        else:
            tl_attention_view(bridge)
            checked["attention_view"] = "headscope's shown weights against TL's pattern"

        imp, ref = hs_ablation_sweep(model), tl_ablation_sweep(bridge)
        close(imp.tensor("importance", method="zero"), ref, what="zero-ablation sweep")
        checked["ablation_sweep"] = "logit-difference drop per head"

        lens, dla = hs_lens_dla(model)
        ref_lens, ref_dla = tl_lens_dla(TransformerBridge.boot_transformers(path))  # a second bridge: it gets folded
        at = lens.df[lens.df.is_answer].sort_values("layer")  # the last position, one row per stack entry
        close(at.logprob.to_numpy(), ref_lens.values[:, 0, 0], what="logit lens log p(answer)")
        close(at.logit_diff.to_numpy(), ref_lens.values[:, 0, 0] - ref_lens.values[:, 0, 1], what="lens logit diff")
        mine = dla.df.set_index("component").contribution
        close(mine[[label for label in ref_dla.labels if label != "remainder"]].to_numpy(),
              ref_dla.attribution[[i for i, label in enumerate(ref_dla.labels) if label != "remainder"]].squeeze(-1),
              what="DLA per head")
        checked["lens_dla"] = "lens log-probs, DLA per head (TL folded)"

    attr = hs_attribution(model)
    ig = attr.tables["token_scores"].query("method == 'integrated_gradients'").sort_values("position")
    assert attr.config["baseline_token"] == model.tokenizer.pad_token_id
    scores = tl_attribution(bridge, int(attr.tables["ig"].n_steps.iloc[0]))
    close(ig.score.to_numpy(), scores[0], atol=1e-4, what="integrated gradients")
    checked["attribution"] = "integrated gradients per token"

    with torch.no_grad():
        pat_df, ref = hs_own_dataframe(model), tl_own_dataframe(bridge)
        close(pat_df.tensor("value", site_type="resid_pre"), ref, what="patching over the DataFrame")
        checked["own_dataframe"] = "mean patched logit difference [layer, pos]"

        with tempfile.TemporaryDirectory() as tmp:
            (ours := Path(tmp) / "hs").mkdir()
            (theirs := Path(tmp) / "tl").mkdir()
            cache, result = hs_save_load(model, pat, ours)
            ref_cache, ref_result = tl_save_load(bridge, resid, theirs)
        assert cache.keys() and all(name in ref_cache.cache_dict for name in cache.keys() if "hook_result" not in name)
        for name in cache.keys():
            if name in ref_cache.cache_dict:
                close(cache[name], ref_cache[name], what=f"reloaded {name}")
        assert result.df.equals(pat.df) and result.summary == pat.summary and torch.equal(ref_result, resid)
        checked["save_load"] = "reloaded cache entries; reloaded results equal the saved ones"

    return [Row(TASKS[t], count_lines(globals()[f"hs_{t}"]), count_lines(globals()[f"tl_{t}"]), checked[t]) for t in TASKS]


def table(rows: list[Row]) -> str:
    lines = ["| task | headscope lines | TransformerLens 4.3 lines |", "|---|---|---|"]
    lines += [f"| {r.task} | {r.headscope} | {r.transformer_lens} |" for r in rows]
    lines.append(f"| total | {sum(r.headscope for r in rows)} | {sum(r.transformer_lens for r in rows)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    result_rows = run(sys.argv[1] if len(sys.argv) > 1 else None)
    print(table(result_rows))
    for r in result_rows:
        print(f"- {r.task}: equal {r.checked}")
