"""One-prompt use (#32 item 7): analyses take a prompt string with its answer (and corrupted prompt and
wrong answer), or token tensors, resolved once in task resolution (task_files.one_prompt). Each is
compared with the same analysis on a Task built by hand from the tokenizer's ids."""
import pytest
import torch

import headscope as hs
from headscope.analyses.core.task_files import resolve_task


def _ids(model, prompt: str, answer: str) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = model.to_tokens(prompt)  # [1, pos]
    answer_ids = model.tokenizer(answer, add_special_tokens=False)["input_ids"]
    assert len(answer_ids) == 1
    return tokens, torch.tensor(answer_ids)


def test_head_importance_of_one_prompt_equals_a_one_row_task(tiny_models):
    model = tiny_models["gpt2"]
    tokens, answer = _ids(model, "w1 w2 w3 w4", " w5")
    by_hand = hs.Task(name="by_hand", tokens=tokens, answers=answer, metric="logprob")
    one = hs.head_importance(model, "w1 w2 w3 w4", answer=" w5")
    ref = hs.head_importance(model, by_hand)
    assert len(one.df) == len(ref.df) == 2 * model.facts.n_layers * model.facts.n_heads
    assert one.df["importance"].tolist() == ref.df["importance"].tolist()
    assert one.summary["baseline_metric"] == ref.summary["baseline_metric"]


def test_patching_of_one_prompt_pair_equals_a_one_row_task(tiny_models):
    model = tiny_models["gpt2"]
    tokens, answer = _ids(model, "w1 w2 w3 w4", " w5")
    corrupted, wrong = _ids(model, "w1 w2 w6 w4", " w7")
    by_hand = hs.Task(name="by_hand", tokens=tokens, answers=answer, corrupted_tokens=corrupted, wrong_answers=wrong)
    one = hs.activation_patching(model, prompt="w1 w2 w3 w4", answer=" w5", corrupted_prompt="w1 w2 w6 w4",
                                 wrong_answer=" w7", sites="resid_pre")
    ref = hs.activation_patching(model, by_hand, "resid_pre")
    assert one.summary["metric"] == "logit_diff" and one.summary["n_examples"] == 1
    assert one.df["effect"].tolist() == ref.df["effect"].tolist()
    # the tensors' tuple form is the same Task again, through the registry's run too
    task = hs.prompt_task(model, "w1 w2 w3 w4", " w5", corrupted_prompt="w1 w2 w6 w4", wrong_answer=" w7")
    for got, want in ((task.tokens, tokens), (task.answers, answer), (task.corrupted_tokens, corrupted),
                      (task.wrong_answers, wrong)):
        assert torch.equal(got, want)
    resolved = resolve_task(model, (tokens, answer, corrupted, wrong))
    assert resolved.metric == "logit_diff" and torch.equal(resolved.corrupted_tokens, corrupted)


def test_bare_tokens_predict_their_last_token(tiny_models):
    model = tiny_models["llama"]
    tokens = model.to_tokens("w3 w4 w5 w6")  # [1, pos]
    task = resolve_task(model, tokens)
    assert torch.equal(task.tokens, tokens[:, :-1]) and task.answers.tolist() == [int(tokens[0, -1])]
    assert task.metric == "logprob"
    assert torch.equal(hs.prompt_task(model, "w3 w4 w5 w6").tokens, task.tokens)  # no answer: the same Task
    lens = hs.logit_lens(model, tokens)
    assert lens.summary["n_examples"] == 1


def test_a_list_of_prompts_is_padded_as_task_rows(tiny_models):
    model = tiny_models["gpt2"]  # word level: <pad>=1, <bos>=2, w<i>=4+i
    task = hs.prompt_task(model, ["w1 w2 w3", "w4 w5"], [" w6", " w7"])
    assert task.tokens.tolist() == [[2, 5, 6, 7], [1, 2, 8, 9]] and task.answers.tolist() == [10, 11]
    assert task.attention_mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert hs.head_importance(model, ["w1 w2 w3", "w4 w5"], answer=[" w6", " w7"]).summary["n_examples"] == 2


def test_one_prompt_mistakes_are_one_line(tiny_models):
    model = tiny_models["gpt2"]
    with pytest.raises(hs.ConfigError, match="go with a prompt"):
        hs.kv_analysis(model, answer=" w5")
    with pytest.raises(hs.ConfigError, match="not both"):
        hs.kv_analysis(model, "kv", prompt="w1 w2", answer=" w5")
    with pytest.raises(hs.TaskError, match="answers are up to 2 tokens long"):
        hs.attribution(model, "w1 w2", answer=" w5 w6")
    with pytest.raises(hs.ConfigError, match="wrong_answer must be a list of 2 strings"):
        hs.prompt_task(model, ["w1", "w2"], [" w3", " w4"], wrong_answer=" w5")
