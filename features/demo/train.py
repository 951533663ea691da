"""The demo fraud classifier: does it learn from the windowed features?

Every generated transaction is a labelled entity row (its user, card and merchant, its time, its own amount,
`is_fraud`). Its features are the point-in-time values of the fraud groups at that time (features.ml.training),
i.e. from events of earlier panes only. The model trains on an earlier time range and is scored on a later
one it never saw, twice: with the windowed features and with the transaction's own amount alone. The fraud in
the generated data is bursts of failed attempts on compromised cards at merchants new to the card, which
only the windowed features can see.

Used by notebook 04 (when notebook 02 has not built the model yet) and by the tests; notebook 02 writes the
same steps out in its cells. Everything here calls only the public API (`features`, `features.pipelines.backfill`,
`features.ml.model`, `features.ml.tracking`, `features.demo`): it is what a user would write in a notebook.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from os import PathLike
from typing import TYPE_CHECKING, Any

import pandas as pd

import features
from features.demo.datagen import generate_transactions
from features.errors import EnvironmentProblem
from features.version import DISTRIBUTION

if TYPE_CHECKING:
    from features.pipelines.backfill import BackfillResult
    from features.repo import Repo

LABEL = "is_fraud"
TIMESTAMP = "event_timestamp"
KEYS = ["user_id", "card_id", "merchant_id"]
INPUT_COLUMNS = ["amount"]  # the transaction's own value, known when it is scored
FEATURES = [
    "user_transactions:failed_count_24h",
    "user_transactions:amount_sum_1h",
    "user_transactions:amount_max_24h",
    "user_transactions:merchants_24h",
    "user_transactions:txn_count_lifetime",
    "card_merchant:txn_count_1h",
    "card_merchant:amount_sum_24h",
    "card_merchant:failed_count_1h",
]
# The example repo's request-time features (feature_repo/fraud.py): computed from the transaction's own fields
# (amount, merchant_id) and the stored values, at training per row and in the served model at every request.
REQUEST_FEATURES = [
    "amount_vs_avg_24h",
    "amount_vs_max_24h",
    "seconds_since_card_txn",
    "merchant_new_30d",
    "attempts_vs_usual_1h",
]
MODEL_NAME = "fraud_classifier"
SEED = 20260101


def prepare(
    repo: Repo | str | PathLike[str],
    *,
    events: int,
    users: int,
    days: float,
    start: datetime | None = None,
    seed: int = SEED,
) -> tuple[pd.DataFrame, list[BackfillResult]]:
    """Land generated transactions in the repo's source folder, apply, and backfill [start, start + days)
    (whole hours); replaces earlier demo data. Returns the transactions and the backfill results."""
    from features.demo.run import START, check_sizes, clear_outputs, write_sources
    from features.pipelines.backfill import backfill

    loaded = features.load_repo(repo) if isinstance(repo, str | PathLike) else repo
    check_sizes(events, users, days)
    start = start or START
    transactions = generate_transactions(events, users, start, days, seed=seed)
    write_sources(loaded, transactions)
    clear_outputs(loaded)
    features.apply(loaded)
    end = start + timedelta(hours=math.ceil(days * 24))
    results = backfill(loaded, start, end, progress=False)
    return transactions, results


def labelled_rows(transactions: pd.DataFrame) -> pd.DataFrame:
    """One entity row per transaction: its keys, `event_timestamp`, its amount and its label, in time order."""
    rows = transactions[[*KEYS, "event_ts", *INPUT_COLUMNS, LABEL]].rename(columns={"event_ts": TIMESTAMP})
    return rows.sort_values(TIMESTAMP, kind="stable").reset_index(drop=True)


def classifier(seed: int = 0) -> Any:
    """Gradient-boosted trees: they take the features' nulls (no row yet, an empty max) as they are."""
    require_scikit_learn()
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(
        max_iter=200,
        learning_rate=0.05,
        max_leaf_nodes=15,
        min_samples_leaf=20,
        l2_regularization=1.0,
        random_state=seed,
    )


def require_scikit_learn() -> None:
    """The demo's model is scikit-learn's, which the package installs only with its `demo` extra (a cluster
    library stays small without it)."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise EnvironmentProblem(
            f"the demo's model needs scikit-learn, which is not installed. Fix: `pip install '{DISTRIBUTION}[demo]'` "
            "(or scikit-learn itself)"
        ) from None


def feature_columns(frame: pd.DataFrame) -> list[str]:
    """The windowed and request-time feature columns of a training set built with FEATURES and REQUEST_FEATURES."""
    names = [ref.split(":", 1)[1] for ref in FEATURES] + REQUEST_FEATURES
    return [c for c in names if c in frame.columns]


@dataclass
class Comparison:
    """The same classifier trained with and without the windowed features, scored on a later time range."""

    cutoff: pd.Timestamp  # train on [first + warmup, cutoff), test on [cutoff, last]
    train_rows: int
    test_rows: int
    train_fraud: int
    test_fraud: int
    auc_with: float
    auc_without: float
    with_features: Any  # fitted on INPUT_COLUMNS + the feature columns
    without_features: Any  # fitted on INPUT_COLUMNS
    columns: list[str]
    test: pd.DataFrame  # the held-out rows with both models' scores (score_with, score_without)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "model": ["amount only", "amount + windowed and request-time features"],
                "columns": [", ".join(INPUT_COLUMNS), ", ".join(self.columns)],
                "held-out ROC AUC": [self.auc_without, self.auc_with],
            }
        )

    def metrics(self) -> dict[str, float]:
        return {
            "roc_auc": self.auc_with,
            "roc_auc_without_windowed_features": self.auc_without,
            "train_rows": self.train_rows,
            "test_rows": self.test_rows,
            "train_fraud": self.train_fraud,
            "test_fraud": self.test_fraud,
        }


def compare(
    frame: pd.DataFrame,
    *,
    test_fraction: float = 1 / 3,
    warmup: timedelta = timedelta(hours=6),
    seed: int = 0,
    extra_columns: Sequence[str] = (),
) -> Comparison:
    """Split a training set by time (the last `test_fraction` of its span is held out; the first `warmup`,
    when users have no history yet, is left out) and compare the two models' ROC AUC on the held-out part.
    `extra_columns`: features of the frame beyond FEATURES and REQUEST_FEATURES the model is fitted on too."""
    require_scikit_learn()
    from sklearn.metrics import roc_auc_score

    times = pd.to_datetime(frame[TIMESTAMP], utc=True)
    first, last = times.min(), times.max()
    cutoff = last - (last - first) * test_fraction
    train = frame[(times >= first + warmup) & (times < cutoff)]
    test = frame[times >= cutoff].copy()
    for part, name in ((train, "training"), (test, "held-out")):
        if part[LABEL].nunique() < 2:
            raise ValueError(f"the {name} range has only one class; generate more events or days")
    columns = [*feature_columns(frame), *extra_columns]
    with_cols, without_cols = [*INPUT_COLUMNS, *columns], list(INPUT_COLUMNS)
    with_model = classifier(seed).fit(train[with_cols], train[LABEL])
    without_model = classifier(seed).fit(train[without_cols], train[LABEL])
    test["score_with"] = with_model.predict_proba(test[with_cols])[:, 1]
    test["score_without"] = without_model.predict_proba(test[without_cols])[:, 1]
    return Comparison(
        cutoff=cutoff,
        train_rows=len(train),
        test_rows=len(test),
        train_fraud=int(train[LABEL].sum()),
        test_fraud=int(test[LABEL].sum()),
        auc_with=float(roc_auc_score(test[LABEL], test["score_with"])),
        auc_without=float(roc_auc_score(test[LABEL], test["score_without"])),
        with_features=with_model,
        without_features=without_model,
        columns=columns,
        test=test,
    )


def build_model(
    repo: Repo | str | PathLike[str],
    *,
    events: int,
    users: int,
    days: float,
    seed: int = SEED,
    name: str = MODEL_NAME,
) -> tuple[int, Comparison]:
    """Everything notebook 02 does, in one call: data, backfill, training set (with the request-time features too),
    both models, and the model with the features logged with its lineage and registered as `name` (it computes the
    request-time features itself at every request). Returns its version."""
    from features.ml import tracking
    from features.ml.model import log_model

    loaded = features.load_repo(repo) if isinstance(repo, str | PathLike) else repo
    transactions, _results = prepare(loaded, events=events, users=users, days=days, seed=seed)
    with tracking.training_run(loaded, run_name=name):
        frame = features.training_set(labelled_rows(transactions), FEATURES, loaded, request_features=REQUEST_FEATURES)
        result = compare(frame)
        tracking.log_run_metrics(result.metrics())
        info = log_model(
            result.with_features,
            FEATURES,
            loaded,
            input_example=frame,
            input_columns=INPUT_COLUMNS,
            request_features=REQUEST_FEATURES,
            registered_model_name=name,
        )
    return int(info.registered_model_version), result
