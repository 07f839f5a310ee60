"""Linear probes: scikit-learn's estimator checks, the input-space coefficients, the control task."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from headscope.probes import LogisticProbe, RidgeProbe, control_labels, selectivity


@parametrize_with_checks([LogisticProbe(), RidgeProbe(), LogisticProbe(standardize=False)])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_logistic_coefficients_act_on_raw_activations():
    """X @ coef_.T + intercept_ equals the decision function of scaler + logistic regression."""
    rng = np.random.default_rng(0)
    X = rng.normal(3.0, [1.0, 5.0, 0.1, 2.0], size=(200, 4))
    y = rng.integers(0, 3, size=200)
    probe = LogisticProbe(C=0.5).fit(X, y)
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=0.5, max_iter=1000)).fit(X, y)
    np.testing.assert_allclose(X @ probe.coef_.T + probe.intercept_, ref.decision_function(X), atol=1e-6)
    np.testing.assert_array_equal(probe.predict(X), ref.predict(X))


def test_ridge_recovers_a_known_linear_map():
    """With a tiny penalty, y = X w + b is recovered in the raw activation space (closed form)."""
    rng = np.random.default_rng(1)
    X = rng.normal(0.0, [1.0, 10.0, 0.5], size=(100, 3)) + 7.0
    w, b = np.array([2.0, -0.3, 4.0]), 1.5
    probe = RidgeProbe(alpha=1e-8).fit(X, X @ w + b)
    np.testing.assert_allclose(probe.coef_, w, atol=1e-6)
    np.testing.assert_allclose(probe.intercept_, b, atol=1e-5)
    assert probe.score(X, X @ w + b) == pytest.approx(1.0, abs=1e-9)


def test_control_labels_are_one_random_label_per_type():
    types = np.repeat(np.arange(50), 4)  # 50 types, 4 tokens each
    labels = np.tile([0, 1, 2, 3], 50)
    ctrl = control_labels(types, labels, seed=3)
    for t in range(50):
        assert len(set(ctrl[types == t])) == 1
    assert set(ctrl) <= {0, 1, 2, 3} and len(set(ctrl)) > 1
    np.testing.assert_array_equal(ctrl, control_labels(types, labels, seed=3))
    assert not np.array_equal(ctrl, control_labels(types, labels, seed=4))


def test_selectivity_separates_encoded_labels_from_memorised_types():
    rng = np.random.default_rng(2)
    n, n_types = 400, 100
    types = rng.integers(0, n_types, size=n)
    y = rng.integers(0, 2, size=n)
    # A: the label is linearly encoded, the type is not -> control near chance, high selectivity.
    X = np.c_[y + rng.normal(0, 0.2, n), rng.normal(size=(n, 5))]
    res = selectivity(LogisticProbe(), X, y, types, cv=4, seed=0)
    assert res["score"].mean() > 0.95 and res["control"].mean() < 0.65 and res["selectivity"] > 0.3
    # B: features are the type (one-hot) and labels a function of the type -> real ~ control.
    y_type = rng.integers(0, 2, size=n_types)[types]
    X_type = np.eye(n_types)[types]
    res = selectivity(LogisticProbe(C=10.0), X_type, y_type, types, cv=4, seed=0)
    assert res["score"].mean() > 0.8 and abs(res["selectivity"]) < 0.15


def test_folds_pool_to_correct_over_scored_rows_not_the_mean_of_fold_accuracies():
    from headscope.probes.linear import pooled_correct, pooled_score

    # 3 of 6 and 3 of 5 right: 6 of 11 = 0.545, not the folds' mean 0.55; a fold that scored nothing adds nothing
    scores, scored = [3 / 6, 3 / 5, float("nan")], [6, 5, 0]
    assert pooled_correct(scores, scored) == (6, 11) and pooled_score(scores, scored, True) == 6 / 11
    assert np.isnan(pooled_score([float("nan")], [0], True))  # nothing scored
    assert pooled_score([0.25, 0.75, 0.5], [6, 5, 4], False) == 0.5  # R^2: the mean over folds, sizes aside


def test_selectivity_needs_enough_examples():
    with pytest.raises(ValueError, match="at least 5 examples"):
        selectivity(LogisticProbe(), np.zeros((3, 2)), np.array([0, 1, 0]), np.array([0, 1, 2]), cv=5)


def test_a_training_fold_with_one_control_class_scores_the_constant_it_can_learn():
    """Review 8 A0 (a two-class is/are task, few word types at the read position): one training fold of the
    control task held a single label, LogisticProbe refused it, sklearn recorded NaN and probes crashed.
    Such a fold learns the only rule it can, that label: right on every test row of that label, and the test
    rows of the other label (absent from its training part) are not scored (review 9b A1), counted here by
    hand; the other folds are fitted as usual (sklearn's own fit and score)."""
    from sklearn.base import clone

    from headscope.probes.linear import control_labels, cv_splitter

    rng = np.random.default_rng(0)
    y = np.array([0] * 11 + [1] * 13)  # the review's 11 " is" and 13 " are"
    types = np.array([0] * 10 + [1] * 2 + [0] * 10 + [1] * 2)  # two word types, one rare: the control has two labels
    X = np.c_[y + rng.normal(0, 0.3, 24), rng.normal(size=(24, 3))]
    seed = next(s for s in range(200) if _one_class_fold(types, y, s))  # a seed that puts one control label in a fold
    res = selectivity(LogisticProbe(), X, y, types, cv=3, seed=seed)
    control = control_labels(types, y, seed=seed)
    folds = list(cv_splitter(y, LogisticProbe(), 3, seed).split(X, y))
    expect, counted = [], []
    for train, test in folds:
        if len(np.unique(control[train])) == 1:
            expect.append(1.0)
            counted.append(int((control[test] == control[train][0]).sum()))
        else:
            expect.append(clone(LogisticProbe()).fit(X[train], control[train]).score(X[test], control[test]))
            counted.append(len(test))
    assert np.isfinite(res["control"]).all() and np.isfinite(res["score"]).all()
    np.testing.assert_allclose(res["control"], expect)
    assert res["n_scored_control"].tolist() == counted and sum(counted) < len(y)


def _one_class_fold(types, y, seed) -> bool:
    from headscope.probes.linear import control_labels, cv_splitter

    control = control_labels(types, y, seed=seed)
    if len(np.unique(control)) < 2:
        return False
    return any(len(np.unique(control[train])) == 1
               for train, _ in cv_splitter(y, LogisticProbe(), 3, seed).split(np.zeros((len(y), 1)), y))


def _many_answers(seed: int = 0):
    """Review 9b A1's many-answer task, by hand: 14 classes of 2,2,2,2,2,2,3,3,3,3,3,3,4,5 rows (39) plus two
    classes of one row, each class written along its own direction (norm 3, noise 0.1): a linear probe is
    right on every row whose class it has seen and cannot predict a class it has not."""
    rng = np.random.default_rng(seed)
    sizes = [2] * 6 + [3] * 6 + [4, 5] + [1, 1]
    y = np.repeat(np.arange(len(sizes)), sizes)  # [41]
    X = 3.0 * np.eye(16)[y] + 0.1 * rng.normal(size=(len(y), 16))
    return X, y, rng.integers(0, 8, len(y))  # eight word types for the control task


@pytest.mark.filterwarnings("ignore:The number of unique classes is greater than 50%")
def test_many_classes_of_few_rows_score_every_learnable_row_and_say_which_were_not():
    """Review 9b A1: plain KFold put a class's every row in one test part, so the pooled accuracy was the folds'
    ceiling (24 of 39 at 3 folds, 35 of 39 at 5), not the probe's. The folds now keep each class of two rows or
    more in training, a row whose class its training part lacks is not scored, and 3 and 5 folds agree."""
    from sklearn.model_selection import KFold

    from headscope.probes.linear import fold_scores, pooled_score, scoreable

    X, y, types = _many_answers()
    singles = np.isin(y, [14, 15])  # the two one-row classes: no training part can hold them
    for cv in (3, 5):
        res = selectivity(LogisticProbe(tol=1e-2), X, y, types, cv=cv, seed=0)  # a loose tol: 4x faster, the same predictions
        assert res["scored"].tolist() == (~singles).tolist()  # every row of a class of 2 or more, by hand
        assert int(res["n_scored"].sum()) == 39 and res["n_test"].sum() == 41  # 2 rows not scored
        assert pooled_score(res["score"], res["n_scored"], True) == 1.0  # right on every learnable row
    # plain shuffled KFold(3) on the same labels: its ceiling counted by hand (each test row's class in the
    # training part's set), and the probe scored on exactly those rows is still perfect
    folds = list(KFold(3, shuffle=True, random_state=0).split(X))
    ceiling = sum(int(v in set(y[train])) for train, test in folds for v in y[test])
    assert ceiling < 39 and int(scoreable(y, folds).sum()) == ceiling
    score, scored = fold_scores(LogisticProbe(tol=1e-2), X, y, folds)
    assert scored.sum() == ceiling and pooled_score(score, scored, True) == 1.0
