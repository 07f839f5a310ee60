"""#23 item 5 on the shipped zoo models: the retrieved value becomes linearly decodable, selectively
(Hewitt & Liang's capacity sweep), right after the layer whose heads move it to the answer position;
that layer is found independently by direct logit attribution and by exact path patching."""
import pytest

import headscope as hs
from headscope.analyses.core.tasks import zoo
from headscope.analyses.patching.path_patching import path_patching
from headscope.analyses.probes.analysis import ProbesConfig, probe_sweep
from headscope.probes import C_GRID

pytestmark = pytest.mark.slow
GRID = C_GRID[1::2]  # 0.003, 0.03, 0.3


@pytest.mark.parametrize("name", ["zoo/synth-llama", "zoo/synth-gpt2"])
def test_value_is_selectively_decodable_after_the_mover_layer(name):
    model = hs.load_model(name, device="cpu")
    task = zoo(model, "kv", n_examples=256, seed=0)
    # the mover layer, twice independently: the heads with the largest direct effect on the logit
    # difference, and the heads whose exact path patching to the logits moves it most
    dla = hs.direct_logit_attribution(model, task).df
    heads = dla[dla.kind == "head"].groupby("layer").contribution.sum()
    mover = int(heads.idxmax())
    ranked = path_patching(model, task, "logits").df.assign(size=lambda d: d.effect.abs())
    assert int(ranked.groupby("sender_layer")["size"].sum().idxmax()) == mover
    # the value, at the answer position: the report's probe (labels "answer"), 3 of its grid's C values, 3 folds
    result = probe_sweep(model, task, config=ProbesConfig(cv=3), capacity=GRID)
    sel = result.tables["per_layer"].set_index("layer").selectivity
    assert all(sel[layer] < 0 for layer in range(mover)), sel.to_dict()  # before: only the key is there
    assert all(sel[layer] >= 0.5 for layer in range(mover, model.facts.n_layers)), sel.to_dict()
    assert result.summary["first_selective_layer"] == mover
    assert result.tables["capacity"].groupby("layer").most_selective.sum().eq(1).all()
    # the queried key, at the same position, is the input token: decodable at layer 0, but its per-type
    # control is as easy as the key itself at every strength, so no probe of it is selective (the most
    # selective one may be the weakest probe: with every key in training, stratified folds, the stronger
    # ones score 1.0 on both)
    swept = probe_sweep(model, task, labels="span:query", capacity=GRID, cv=3).tables
    key, first = swept["per_layer"].set_index("layer"), swept["capacity"].query("layer == 0")
    assert key.selectivity.max() < 0.5, key.to_dict()
    assert first.score.max() > 0.7 and (first.selectivity.abs() < 0.1).all(), first.to_dict()
