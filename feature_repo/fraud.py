"""Example fraud feature groups, the request-time features a transaction is scored with, and the Feast objects
generated from the groups so that `feast apply` works here."""

from pathlib import Path

import numpy as np

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, RequestFeature, agg, to_feast

HERE = Path(__file__).resolve().parent

user = Entity("user", join_keys=["user_id"])
card = Entity("card", join_keys=["card_id"])
card_merchant = Entity("card_merchant", join_keys=["card_id", "merchant_id"])

transactions = EventSource(
    name="transactions",
    path="data/transactions",
    format="parquet",
    timestamp="event_ts",
    watermark="10m",
    schema={
        "txn_id": "string",
        "user_id": "string",
        "card_id": "string",
        "merchant_id": "string",
        "amount": "double",
        "status": "string",
        "event_ts": "timestamp",
        "is_fraud": "int64",
    },
)

user_transactions = FeatureGroup(
    name="user_transactions",
    entity=user,
    source=transactions,
    features=[
        Feature("failed_count_24h", agg.count(), window=Hop("24h", every="5m"), where="status = 'FAILED'"),
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("amount_max_24h", agg.max("amount"), window=Hop("24h", every="5m")),
        Feature("merchants_24h", agg.approx_count_distinct("merchant_id"), window=Hop("24h", every="1h")),
        Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="1h")),
        # What the request-time features below read
        Feature("amount_avg_24h", agg.avg("amount"), window=Hop("24h", every="5m")),
        Feature("attempts_1h", agg.count(), window=Hop("1h", every="5m")),
        Feature("attempts_30d", agg.count(), window=Hop("30d", every="1h")),
        Feature("merchants_30d", agg.distinct_values("merchant_id"), window=Hop("30d", every="1h")),
    ],
)

card_activity = FeatureGroup(
    name="card_activity",
    entity=card,
    source=transactions,
    features=[Feature("last_txn_at", agg.last_event_time(), window=Lifetime(every="5m"))],
)

card_merchant_activity = FeatureGroup(
    name="card_merchant",
    entity=card_merchant,
    source=transactions,
    features=[
        Feature("txn_count_1h", agg.count(), window=Hop("1h", every="5m")),
        Feature("amount_sum_24h", agg.sum("amount"), window=Hop("24h", every="1h")),
        Feature("failed_count_1h", agg.count(), window=Hop("1h", every="5m"), where="status = 'FAILED'"),
        Feature("last_status", agg.last("status"), window=Lifetime(every="5m")),
        Feature("last_amounts_24h", agg.last_k("amount", 5), window=Hop("24h", every="5m")),
    ],
)

# Request-time features: computed when a transaction is scored, from its own fields and the stored values, by the
# same function in training sets, in the logged model and in `features serve` (docs/definitions.md). They are given
# pandas Series and answer with numpy: a served request is one row, on which each pandas operation costs tens of
# microseconds and numpy's a microsecond or two.


def ratio(numerator, denominator):
    """numerator / denominator, null where the denominator is not positive (a user with no history yet)."""
    below = np.asarray(denominator, dtype=np.float64)
    return np.asarray(numerator, dtype=np.float64) / np.where(below > 0, below, np.nan)


amount_vs_avg_24h = RequestFeature(
    "amount_vs_avg_24h",
    lambda amount, amount_avg_24h: ratio(amount, amount_avg_24h),
    request={"amount": "double"},
    features=["user_transactions:amount_avg_24h"],
    dtype="double",
    description="this amount against the user's average of the last 24 hours (null without one)",
)
amount_vs_max_24h = RequestFeature(
    "amount_vs_max_24h",
    lambda amount, amount_max_24h: ratio(amount, amount_max_24h),
    request={"amount": "double"},
    features=["user_transactions:amount_max_24h"],
    dtype="double",
    description="this amount against the user's largest of the last 24 hours (null without one)",
)
seconds_since_card_txn = RequestFeature(
    "seconds_since_card_txn",
    lambda request_time, last_txn_at: (
        (request_time.to_numpy("datetime64[us]") - last_txn_at.to_numpy("datetime64[us]")) / np.timedelta64(1, "s")
    ),
    features=["card_activity:last_txn_at"],
    dtype="double",
    description="seconds since the card's last transaction, of the panes closed by then (null for a new card)",
)
merchant_new_30d = RequestFeature(
    "merchant_new_30d",
    lambda merchant_id, merchants_30d: merchant_id not in merchants_30d,
    request={"merchant_id": "string"},
    features=["user_transactions:merchants_30d"],
    dtype="bool",
    row=True,
    description="whether the user paid this merchant in none of the last 30 days",
)
attempts_vs_usual_1h = RequestFeature(
    "attempts_vs_usual_1h",
    lambda attempts_1h, attempts_30d: ratio(attempts_1h.to_numpy() + 1, attempts_30d.to_numpy() / 720),
    features=["user_transactions:attempts_1h", "user_transactions:attempts_30d"],
    dtype="double",
    description="this hour's attempts, this one included, against the user's hourly rate of the last 30 days",
)

# Feast's `feast apply` picks up module-level Feast objects only (not objects inside a list), so each one gets
# its own name. A composite key becomes one Feast entity per join key.
user_entity, user_transactions_source, user_transactions_view = to_feast(user_transactions, repo_root=HERE)
card_entity, merchant_entity, card_merchant_source, card_merchant_view = to_feast(
    card_merchant_activity, repo_root=HERE
)
card_activity_entity, card_activity_source, card_activity_view = to_feast(card_activity, repo_root=HERE)
