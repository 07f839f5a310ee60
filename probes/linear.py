"""Linear probes over activations, as scikit-learn estimators, with control tasks.

`LogisticProbe` (classification) and `RidgeProbe` (regression) standardise their inputs and
report the probe direction in the input (activation) space: `coef_` and `intercept_` apply to
raw activations, so `X @ coef_.T + intercept_` is the decision function. They follow the
estimator contract (hyper-parameters only in __init__, fit returns self, fitted attributes end
in `_`) and pass `sklearn.utils.estimator_checks`.

Selectivity (Hewitt & Liang 2019): the control task gives every word type (e.g. the token id at
the probed position) a random label drawn from the real labels' distribution; a probe that is
expressive enough to memorise types scores well on it too. selectivity = score(real) -
score(control), both cross-validated on the same folds.

Many classes of few rows each (a many-answer task): folds that keep every class in training
(`cv_splitter`, stratified), and a classifier is scored only on the test rows whose class its training
part holds (`scoreable`): a row of an unseen class is one no classifier can predict, so counting it
wrong would report the folds' ceiling as the probe's accuracy. `selectivity` says how many rows it scored.
"""
from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.preprocessing import StandardScaler
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from headscope.errors import ConfigError

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    def validate_data(estimator, X, y="no_validation", reset=True, **kw):
        return estimator._validate_data(X, y, reset=reset, **kw)


class _Standardised(BaseEstimator):
    """Shared fit: standardise (optionally), fit the inner linear model, fold the scaling into coef_."""

    def _inner(self):  # the scikit-learn linear model on standardised inputs
        raise NotImplementedError

    def _fit(self, X, y):
        self.scaler_ = StandardScaler(with_mean=self.standardize, with_std=self.standardize).fit(X)
        self.model_ = self._inner().fit(self.scaler_.transform(X), y)
        scale = self.scaler_.scale_ if self.standardize else np.ones(X.shape[1])
        mean = self.scaler_.mean_ if self.standardize else np.zeros(X.shape[1])
        self.coef_ = self.model_.coef_ / scale  # [n_outputs, n_features] (or [n_features])
        self.intercept_ = self.model_.intercept_ - self.coef_ @ mean
        return self

    def _scores(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False)
        return X @ self.coef_.T + self.intercept_


class LogisticProbe(ClassifierMixin, _Standardised):
    """Multinomial logistic-regression probe; C is the inverse L2 strength (scikit-learn's)."""

    def __init__(self, C: float = 1.0, standardize: bool = True, max_iter: int = 1000, tol: float = 1e-4):
        self.C = C
        self.standardize = standardize
        self.max_iter = max_iter
        self.tol = tol

    def _inner(self):
        return LogisticRegression(C=self.C, max_iter=self.max_iter, tol=self.tol)

    def fit(self, X, y):
        X, y = validate_data(self, X, y)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ConfigError(f"LogisticProbe needs at least 2 classes in y, got 1 class ({self.classes_[0]!r}).")
        self._fit(X, y)
        self.n_iter_ = self.model_.n_iter_
        return self

    def decision_function(self, X):
        scores = self._scores(X)  # [n, n_classes] (binary: [n, 1])
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def predict_proba(self, X):
        scores = self._scores(X)
        if scores.shape[1] == 1:
            scores = np.hstack([np.zeros_like(scores), scores])
        scores = scores - scores.max(1, keepdims=True)
        p = np.exp(scores)
        return p / p.sum(1, keepdims=True)

    def predict_log_proba(self, X):
        return np.log(self.predict_proba(X))

    def predict(self, X):
        proba = self.predict_proba(X)  # checks fitted first
        return self.classes_[proba.argmax(1)]


class RidgeProbe(RegressorMixin, _Standardised):
    """Ridge-regression probe (R^2 score); alpha is the L2 strength on standardised inputs."""

    def __init__(self, alpha: float = 1.0, standardize: bool = True):
        self.alpha = alpha
        self.standardize = standardize

    def _inner(self):
        return Ridge(alpha=self.alpha)

    def __sklearn_tags__(self):  # scikit-learn >= 1.6
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def _more_tags(self):  # older scikit-learn
        return {"multioutput": True}

    def fit(self, X, y):
        X, y = validate_data(self, X, y, multi_output=True, y_numeric=True)
        return self._fit(X, y)

    def predict(self, X):
        return self._scores(X)


def control_labels(types, labels, seed: int = 0) -> np.ndarray:
    """Hewitt & Liang's control task: one random label per type, drawn from the labels' distribution."""
    types, labels = np.asarray(types), np.asarray(labels)
    if types.shape[0] != labels.shape[0]:
        raise ConfigError(f"types ({types.shape[0]}) and labels ({labels.shape[0]}) must have one entry per example.")
    rng = np.random.default_rng(seed)
    uniq, inverse = np.unique(types, return_inverse=True)
    per_type = labels[rng.integers(0, labels.shape[0], size=uniq.shape[0])]
    return per_type[inverse.reshape(-1)]


def cv_splitter(y, estimator, cv: int = 5, seed: int = 0):
    """Shuffled folds. Classifiers: stratified whenever a class has two rows or more, so every class of
    c >= 2 rows keeps at least one row in each training part (a test part holds at most ceil(c / k) <= c - 1
    of them); the folds are capped at the largest class's size (scikit-learn's limit), and a class of one
    row can only ever be tested on a part that lacks it (fold_scores does not score it). Regressors and
    classes of one row each: plain KFold."""
    y = np.asarray(y)
    if getattr(estimator, "_estimator_type", None) == "classifier" or isinstance(estimator, ClassifierMixin):
        _, counts = np.unique(y, return_counts=True)
        if counts.max() >= 2:
            return StratifiedKFold(n_splits=int(min(cv, counts.max())), shuffle=True, random_state=seed)
    return KFold(n_splits=cv, shuffle=True, random_state=seed)


def scoreable(y, folds) -> np.ndarray:
    """[n] bool: whether each row's class occurs in the training part of the fold that tests it (a row no
    fold tests: False). A row whose class its training part lacks cannot be predicted by any classifier:
    counting it wrong would measure the folds (their ceiling), not the probe."""
    y = np.asarray(y)
    out = np.zeros(y.shape[0], dtype=bool)
    for train, test in folds:
        out[test] = np.isin(y[test], y[train])
    return out


def fold_scores(estimator, X, y, folds) -> tuple[np.ndarray, np.ndarray]:
    """(score [k], rows scored [k]): the estimator's score on each (train, test) fold. A classifier is
    scored on the test rows whose class its training part holds (`scoreable`); a fold with none scores
    NaN over 0 rows. A classifier's training part with one class (few word types give the control task
    one label on a fold) is no failure: the only rule it can learn is that class, right on every scored
    row (sklearn would record NaN for the fit's error and every pooled score after it)."""
    X, y = np.asarray(X), np.asarray(y)
    classify = isinstance(estimator, ClassifierMixin)
    scores, scored = [], []
    for train, test in folds:
        if classify:
            test = test[np.isin(y[test], y[train])]
        scored.append(len(test))
        if not len(test):
            scores.append(float("nan"))
        elif classify and len(np.unique(y[train])) == 1:
            scores.append(1.0)
        else:
            scores.append(float(clone(estimator).fit(X[train], y[train]).score(X[test], y[test])))
    return np.asarray(scores), np.asarray(scored)


def pooled_correct(scores, scored) -> tuple[int, int]:
    """(correct, scored) rows over a classifier's folds: each fold's accuracy [k] times its scored rows [k],
    summed and rounded whole (a fold that scored no row has a NaN accuracy and adds nothing), and the rows
    scored. analyses/probes/scores.py states this count with its exact binomial interval."""
    scores, scored = np.asarray(scores, dtype=float), np.asarray(scored, dtype=float)
    return int(round(float(np.nansum(scores * scored)))), int(scored.sum())


def pooled_score(scores, scored, classify: bool) -> float:
    """The cross-validated score: classification, accuracy over every scored row (pooled_correct: folds weighted
    by their scored rows, correct / scored); regression, the mean R^2 over folds. NaN when nothing was scored."""
    if not classify:
        return float(np.asarray(scores, dtype=float).mean())
    correct, total = pooled_correct(scores, scored)
    return correct / total if total else float("nan")


def selectivity(estimator, X, y, types, *, cv: int = 5, seed: int = 0) -> dict:
    """Cross-validated scores on the real labels and on the control task, per fold, and selectivity.

    Returns {"score": [k], "control": [k], "selectivity": pooled score minus pooled control (pooled_score),
    "n_test": [k] each fold's test size, "n_scored" / "n_scored_control": [k] the test rows scored on each
    task (classifiers: those whose class the training part holds, `scoreable`), "scored": [n] bool, which
    rows of the real task were scored, "folds": k}. Both tasks use the same folds (cv_splitter on the real
    labels) and the same rule. The score is the estimator's own (accuracy for LogisticProbe, R^2 for
    RidgeProbe). When every example has one word type the control labels are one constant, which any
    classifier learns: control 1.0.
    """
    y = np.asarray(y)
    if y.shape[0] < cv:
        raise ConfigError(f"{cv}-fold cross-validation needs at least {cv} examples, got {y.shape[0]}; lower cv or add examples.")
    classify = isinstance(estimator, ClassifierMixin)
    control = control_labels(types, y, seed=seed)
    with warnings.catch_warnings():  # classes smaller than the folds are expected (and handled: cv_splitter)
        warnings.filterwarnings("ignore", message="The least populated class in y has only")
        folds = list(cv_splitter(y, estimator, cv, seed).split(X, y))
    real, n_real = fold_scores(estimator, X, y, folds)
    if classify and len(np.unique(control)) == 1:
        # one word type (e.g. every row ends in [SEP]): the control is a constant, learnt exactly
        ctrl, n_ctrl = np.ones(len(folds)), np.array([len(test) for _, test in folds])
    else:
        ctrl, n_ctrl = fold_scores(estimator, X, control, folds)
    scored = scoreable(y, folds) if classify else np.ones(y.shape[0], dtype=bool)
    return {"score": real, "control": ctrl,
            "selectivity": pooled_score(real, n_real, classify) - pooled_score(ctrl, n_ctrl, classify),
            "n_test": np.array([len(test) for _, test in folds]), "n_scored": n_real, "n_scored_control": n_ctrl,
            "scored": scored, "folds": len(folds)}
