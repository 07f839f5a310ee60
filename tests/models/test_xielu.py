"""Review 20b B1 (redone): Apertus's xIELU is positive for large negative inputs, so a neuron's top trigger (ranked by
its coefficient xielu(k_i . x)) can be a prefix of negative k_i . x. The mlp analysis counts, per layer, the neurons
whose top trigger has a negative pre-activation; checked by hand with Hugging Face's own up_proj and activation over
every prefix of the corpus (tiny random Apertus, 2 layers)."""
import warnings

import pytest
import torch

import headscope as hs
from headscope.analyses.core.tasks import Task
from headscope.models.config_facts import positive_below_zero
from headscope.reports.plots_mlp import negative_trigger_words
from tests_support import N_WORDS, SPECIALS, random_tokens, save_random_checkpoint, word_tokenizer


@pytest.fixture(scope="module")
def apertus(tmp_path_factory):
    from transformers import ApertusConfig

    config = ApertusConfig(vocab_size=len(SPECIALS) + N_WORDS, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=2,
                           eos_token_id=3, pad_token_id=1)
    def init(model):  # matrices away from their init; xIELU's learned alphas set so its negative branch is the steeper
        for name, p in model.named_parameters():
            if name.endswith("act_fn.alpha_p"):
                p.fill_(-3.0)  # softplus: alpha_p 0.05
            elif name.endswith("act_fn.alpha_n"):
                p.fill_(2.0)  # beta + softplus: alpha_n 2.6
            elif p.ndim >= 2:
                p.normal_(0, 0.2)

    folder = tmp_path_factory.mktemp("apertus")
    hf = save_random_checkpoint(config, folder, word_tokenizer(), init=init)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.eval(), hs.load_model(folder, device="cpu", dtype="float32")


def test_negative_top_triggers_counted_as_hugging_face_computes_them(apertus):
    hf, model = apertus
    assert positive_below_zero(model.bridge) and not positive_below_zero(hs.load_model("zoo/synth-llama").bridge)
    corpus = random_tokens(6, 10, seed=4)  # [rows, pos]: prefixes end at positions 1..8 (each has a next token)
    task = Task(name="rand", tokens=corpus[:, :-1], answers=corpus[:, -1])
    res = hs.mlp_memories_analysis(model, task, corpus=corpus, layers=(0, 1), top_k_triggers=3)
    seen = {}
    handles = [hf.model.layers[l].mlp.up_proj.register_forward_hook(lambda m, a, o, l=l: seen.update({l: o}))
               for l in (0, 1)]
    try:
        with torch.no_grad():
            hf(corpus[:, :-1])
    finally:
        for h in handles:
            h.remove()
    want = {}
    for l in (0, 1):
        pre = seen[l][:, 1:]  # [rows, 8, d_mlp]: prefixes ending at positions 1..8 (min_position 1)
        with torch.no_grad():
            coef = hf.model.layers[l].mlp.act_fn(pre)  # HF's own xIELU
        best = coef.reshape(-1, coef.shape[-1]).argmax(0)  # [d_mlp] each neuron's top prefix
        want[str(l)] = int((pre.reshape(-1, pre.shape[-1]).gather(0, best[None])[0] < 0).sum())
    assert res.summary["negative_top_triggers_per_layer"] == want
    assert sum(want.values()) > 0  # random keys: some neurons' strongest prefix points away from them
    words = negative_trigger_words(res.summary)
    assert f"for {want['0']} of 48 at layer 0 and {want['1']} of 48 at layer 1 neurons" in words
    assert words.startswith("xielu is positive for negative inputs too")
