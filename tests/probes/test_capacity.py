"""capacity_sweep against scikit-learn run by hand on the same folds, and on data whose answer is known."""
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import KFold, StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from headscope.errors import ConfigError
from headscope.probes import LogisticProbe, RidgeProbe, capacity_sweep, control_labels


def _data(n=300, d=64, n_types=30, seed=0):
    """Real labels (4 classes) written along 4 directions of norm 3; word types (30) along random
    directions of norm ~4 spread over all 64 dimensions: a strongly regularised probe reads the few
    label directions but cannot memorise the types; a weak regulariser memorises both."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    types = rng.integers(0, n_types, n)
    X = 3.0 * np.eye(d)[y] + 0.5 * rng.normal(size=(n_types, d))[types] + 0.2 * rng.normal(size=(n, d))
    return X, y, types


def test_scores_equal_sklearn_by_hand_and_most_selective_is_the_argmax():
    X, y, types = _data()
    grid = (0.001, 0.03, 1.0)
    table = capacity_sweep(LogisticProbe(), X, y, types, grid=grid, cv=4, seed=3)
    control = control_labels(types, y, seed=3)
    folds = list(StratifiedKFold(4, shuffle=True, random_state=3).split(X, y))
    for C, row in zip(grid, table.itertuples()):
        pipe = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=1000))
        real = cross_val_score(pipe, X, y, cv=folds).mean()
        ctrl = cross_val_score(pipe, X, control, cv=folds).mean()
        assert row.strength == C and row.param == "C"
        assert row.score == pytest.approx(real, abs=1e-9) and row.control == pytest.approx(ctrl, abs=1e-9)
        assert row.selectivity == pytest.approx(real - ctrl, abs=1e-9)
    assert table["most_selective"].sum() == 1
    assert table.loc[table["most_selective"], "selectivity"].item() == table["selectivity"].max()


def test_weak_probes_are_the_selective_ones_on_data_built_that_way():
    X, y, types = _data()
    table = capacity_sweep(LogisticProbe(), X, y, types, grid=(0.003, 1000.0), cv=4, seed=0).set_index("strength")
    assert table.loc[0.003, "score"] > 0.9 and table.loc[1000.0, "score"] > 0.99
    assert table.loc[1000.0, "control"] > 0.9  # an unregularised probe memorises the 30 types
    assert table.loc[0.003, "selectivity"] > table.loc[1000.0, "selectivity"] + 0.1
    assert table.loc[0.003, "most_selective"]


def test_ridge_grid_is_over_alpha():
    X, _, types = _data()
    y = X[:, 0] * 2.0 + 0.1
    table = capacity_sweep(RidgeProbe(), X, y, types, grid=(10.0,), cv=3, seed=0)
    folds = list(KFold(3, shuffle=True, random_state=0).split(X, y))
    expected = cross_val_score(make_pipeline(StandardScaler(), Ridge(alpha=10.0)), X, y, cv=folds).mean()
    assert table.loc[0, "param"] == "alpha" and table.loc[0, "score"] == pytest.approx(expected, abs=1e-9)


def test_bad_grids_and_estimators_are_one_clear_error():
    X, y, types = _data(n=40)
    with pytest.raises(ConfigError, match="grid must be non-empty and positive"):
        capacity_sweep(LogisticProbe(), X, y, types, grid=(0.0,))
    with pytest.raises(ConfigError, match="takes a LogisticProbe or a RidgeProbe"):
        capacity_sweep(LogisticRegression(), X, y, types)


def test_one_word_type_makes_the_control_a_constant_learnt_exactly():
    from headscope.probes import selectivity

    X, y, _ = _data(n=60)
    res = selectivity(LogisticProbe(C=0.1), X, y, np.zeros(len(y)), cv=3, seed=0)
    folds = list(StratifiedKFold(3, shuffle=True, random_state=0).split(X, y))
    real = cross_val_score(make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=1000)), X, y, cv=folds)
    assert res["control"].tolist() == [1.0, 1.0, 1.0]
    assert res["selectivity"] == pytest.approx(real.mean() - 1.0, abs=1e-9)
