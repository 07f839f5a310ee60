"""One prompt in a notebook (#32 item 7): hs.show_tokens, hs.show_attention(model, prompt, layer=, heads=)
and show_attention(pattern, tokens), the short HTML view of a one-example Result, Result.tensor and
Result.save / Result.load. Values are checked against plain Hugging Face on the same checkpoint and
against numbers worked by hand."""
import html
import json
import re

import pandas as pd
import pytest
import torch

import headscope as hs
from tests_support import hf_model

PROMPT, ANSWER, CORRUPTED, WRONG = "w1 w2 w3 w4", " w5", "w1 w2 w6 w4", " w7"


@pytest.fixture(scope="module")
def one_prompt(tiny_models):
    model = tiny_models["gpt2"]
    return model, {
        "heads": hs.head_importance(model, PROMPT, answer=ANSWER),
        "patching": hs.activation_patching(model, prompt=PROMPT, answer=ANSWER, corrupted_prompt=CORRUPTED,
                                           wrong_answer=WRONG, sites=["resid_pre", "head_out"]),
        "attribution": hs.attribution(model, PROMPT, answer=ANSWER),
    }


def test_show_tokens_shows_every_token_escaped_on_diverging_colours():
    view = hs.show_tokens([2.0, -1.0, 0.0, 0.5], ["<bos>", " Mary", "<script>", "&"])
    spans = re.findall(r'<span style="background: ([^;]+);[^>]*>([^<]*)</span>', view._repr_html_())
    assert [html.unescape(text) for _, text in spans] == ["<bos>", " Mary", "<script>", "&"]
    assert [c for c, _ in spans] == ["rgba(200, 40, 30, 1.000)", "rgba(30, 90, 210, 0.500)",  # |s| / max |s|
                                     "rgba(200, 40, 30, 0.000)", "rgba(200, 40, 30, 0.250)"]
    assert "<script>" not in view._repr_html_()
    with pytest.raises(hs.ConfigError, match="4 tokens but 3 scores"):
        hs.show_tokens([1.0, 2.0, 3.0], ["a", "b", "c", "d"])


def test_show_tokens_of_an_attribution_result_is_every_token_with_signed_integrated_gradients(one_prompt, tiny_dirs):
    """Review 18e C2: one row per method (the gradients on every token, then leave-one-out, last-layer attention and
    rollout as the shares the taus rank, blank on the first and last token), all in one table so a token's scores
    share a column, each row with its own scale; rollout's shares equal Abnar & Zuidema's rollout of plain HF's
    head-mean attention, (0.5 A + 0.5 I) per layer, renormalised over the ranked tokens."""
    model, results = one_prompt
    result = results["attribution"]
    tokens = model.to_str_tokens(model.to_tokens(PROMPT)[0])
    page = hs.show_tokens(result)._repr_html_()
    assert page.count("<table") == 1 and "opacity |score| / the row's largest |score|" in page
    rows = re.findall(r"<tr><th [^>]*>([^<]+)</th>(.*?)</tr>", page)
    assert [name for name, _ in rows] == ["integrated_gradients", "grad_x_input", "saliency", "leave_one_out (share)",
                                          "last-layer attention (share)", "rollout (share)"]
    for _, row in rows:  # every token in every row, the first (BOS) and last too: the columns line up
        assert [html.unescape(t) for t in re.findall(r'title="[^"]*">([^<]*)</td>', row)] == tokens
        assert re.search(r"max \|score\| [0-9.e+-]+</td>$", row)
    ig = result.tables["token_scores"].query("method == 'integrated_gradients'").score
    table = result.tables["ig"].iloc[0]  # completeness: IG sums to the metric's change from the baseline
    assert abs(ig.sum() - (table.metric_input - table.metric_baseline)) <= abs(table.delta) + 1e-4
    assert (ig < 0).any() == ("rgba(30, 90, 210" in rows[0][1])
    titles = re.findall(r'title="(\d+): ([^"]*)"', rows[-1][1])
    assert titles[0][1] == titles[-1][1] == "not scored"
    with torch.no_grad():
        att = hf_model(tiny_dirs["gpt2"])(model.to_tokens(PROMPT), output_attentions=True).attentions
    joint = torch.eye(len(tokens))
    for a in att:  # [1, head, q, k] per layer
        mixed = 0.5 * a[0].mean(0) + 0.5 * torch.eye(len(tokens))
        joint = (mixed / mixed.sum(-1, keepdim=True)) @ joint
    share = joint[-1, 1:-1] / joint[-1, 1:-1].sum()  # [ranked]
    got = torch.tensor([float(v) for _, v in titles[1:-1]])
    assert torch.allclose(got, share, atol=1e-3)


def test_show_tokens_marks_a_method_whose_scores_the_analysis_finds_rounding(one_prompt):
    """Review 19v C1: in bfloat16 the attribution summary finds every gradient x input score within its rounding floor
    (ranks_rounding) and the report leaves it out, yet show_tokens drew it as an ordinary row. Now its row is starred
    as integrated gradients' is, with the legend line saying why (the counts of the summary and of this example)."""
    from types import SimpleNamespace

    result = one_prompt[1]["attribution"]
    assert not result.summary["gradient_rounding"]["ranks_rounding"]  # float32 here: no mark
    assert "grad_x_input *" not in hs.show_tokens(result).html
    rounding = {"dtype": "bfloat16", "floor": [0.02, 0.1], "n_within": 30, "n_scores": 30, "ranks_rounding": True}
    tables = {**result.tables, "gradient_rounding": pd.DataFrame(
        [{"example": 0, "dtype": "bfloat16", "floor": 0.1, "n_scores": 2, "n_within_floor": 2}])}
    bf16 = SimpleNamespace(name="attribution", tables=tables, summary={**result.summary, "gradient_rounding": rounding})
    page = hs.show_tokens(bf16).html
    names = re.findall(r"<tr><th [^>]*>([^<]+)</th>", page)
    assert "grad_x_input *" in names and "saliency" in names and "leave_one_out (share)" in names, names
    assert ("* gradient x input: 30 of 30 of its scores over all examples are within their bfloat16 rounding floor "
            "(this example: 2 of 2) and count as ties, so its ranking would rank rounding: used in no claim.") in page


def test_show_attention_of_a_layer_and_of_a_pattern_equals_hugging_face(one_prompt, tiny_dirs):
    model, _ = one_prompt
    tokens = model.to_tokens(PROMPT)  # [1, pos]
    with torch.no_grad():
        ref = hf_model(tiny_dirs["gpt2"])(tokens, output_attentions=True).attentions[1][0]  # [head, q, k]
    strs = model.to_str_tokens(tokens[0])
    for view, heads in ((hs.show_attention(model, PROMPT, layer=1, heads=[2, -1]), [2, 3]),
                        (hs.show_attention(ref[[2, 3]], strs), [2, 3])):
        cells = re.findall(r"title='([^']*) -&gt; ([^']*): ([0-9.]+)'", view._repr_html_())
        n = len(strs)
        assert len(cells) == 2 * n * n
        got = torch.tensor([float(v) for _, _, v in cells]).reshape(2, n, n)
        assert torch.allclose(got, ref[heads].float(), atol=1e-4)
        assert [html.unescape(q) for q, _, _ in cells[:n * n:n]] == strs
    with pytest.raises(hs.ConfigError, match=r"pattern must be \[head, query, key\]"):
        hs.show_attention(ref, strs[:-1])


def test_one_example_view_is_short_and_points_at_result_df(one_prompt):
    _, results = one_prompt
    for name, result in results.items():
        page = result._repr_html_()
        assert len(page) < 20_000 and "<img" not in page, (name, len(page))
        if len(result.df) > 10:
            assert f"{len(result.df) - 10} more rows in result.df." in page and "CSV" not in page
    grid = re.search(r"<b>importance \(zero\)</b>", results["heads"]._repr_html_())
    assert grid is not None


def test_result_tensor_lays_columns_out_on_layer_head_pos(one_prompt, tiny_dirs):
    """resid_pre patching as a [layer, pos] tensor equals patching each block's input in plain Hugging
    Face by hand (the corrupted run with position p of block l's input taken from the clean run)."""
    model, results = one_prompt
    result = results["patching"]
    value = result.tensor("value", site_type="resid_pre")  # [layer, pos]
    clean, corrupted = model.to_tokens(PROMPT), model.to_tokens(CORRUPTED)
    answer, wrong = (model.tokenizer(a, add_special_tokens=False)["input_ids"][0] for a in (ANSWER, WRONG))
    hf = hf_model(tiny_dirs["gpt2"])
    with torch.no_grad():
        clean_states = hf(clean, output_hidden_states=True).hidden_states  # [layer][1, pos, d]
    n_layers, n_pos = model.facts.n_layers, clean.shape[1]
    assert value.shape == (n_layers, n_pos)
    for layer in range(n_layers):
        for pos in range(n_pos):
            def restore(module, args, kwargs, layer=layer, pos=pos):
                hidden = args[0].clone()
                hidden[:, pos] = clean_states[layer][:, pos]
                return (hidden, *args[1:]), kwargs
            handle = hf.transformer.h[layer].register_forward_pre_hook(restore, with_kwargs=True)
            try:
                with torch.no_grad():
                    logits = hf(corrupted).logits[0, -1]
            finally:
                handle.remove()
            assert abs(float(logits[answer] - logits[wrong]) - float(value[layer, pos])) < 1e-4
    heads = results["heads"].tensor("importance", method="zero")
    assert heads.shape == (n_layers, model.facts.n_heads)
    with pytest.raises(hs.ConfigError, match=r"filter them, e\.g\. method=one of \['gradient', 'zero'\]"):
        results["heads"].tensor("importance")


def test_result_save_and_load_round_trip_exactly(one_prompt, tmp_path):
    _, results = one_prompt
    for name, result in results.items():
        folder = result.save(tmp_path / name)
        assert sorted(p.suffix for p in folder.iterdir()) == [".json"] + [".parquet"] * (1 + len(result.tables))
        back = hs.Result.load(folder)
        assert back.name == result.name and list(back.tables) == list(result.tables)
        pd.testing.assert_frame_equal(back.df, result.df, check_exact=True)
        for table in result.tables:
            pd.testing.assert_frame_equal(back.tables[table], result.tables[table], check_exact=True)
        assert back.summary == json.loads(json.dumps(dict(result.summary)))
        assert back.config == json.loads(json.dumps(dict(result.config)))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(hs.ConfigError, match="holds other files"):
        results["heads"].save(tmp_path / "mine")
    with pytest.raises(hs.errors.ResultFileError, match="is not a saved Result"):
        hs.Result.load(tmp_path / "mine")


def test_a_results_notebook_view_names_the_precision_it_ran_in(tiny_dirs):
    """Review 14c C4: a Result's notebook view opened "model ./phi3_dates; task dates" and never said the run was in
    bfloat16. The tiny GPT-2 loaded in bfloat16 (its parameters' dtype read from plain torch): the view names it where it
    names the model, and the config records it; a float32 load says float32."""
    from headscope.reports.render import result_html

    for dtype in ("bfloat16", "float32"):
        model = hs.load_model(tiny_dirs["gpt2"], dtype=dtype)
        assert str(next(model.bridge.parameters()).dtype) == f"torch.{dtype}"
        result = hs.activation_patching(model, prompt=PROMPT, answer=ANSWER, corrupted_prompt=CORRUPTED,
                                        wrong_answer=WRONG, sites=["resid_pre"])
        assert result.config["dtype"] == dtype
        page = result_html(result, with_figures=False)
        assert f"<p class='source'>model {html.escape(str(tiny_dirs['gpt2']))}, run in {dtype}; task " in page
