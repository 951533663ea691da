"""The groups several test modules share: the example's `user_transactions` group as the tests use it (the
features of feature_repo/fraud.py, on a source whose schema is read from the files, with the extra features each
test needs), `hop` of the schedule and command tests, and `user_activity` of the tests of what is recorded of a
group."""

from __future__ import annotations

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, Tumble, agg

SOURCE = EventSource("transactions", path="data/transactions", timestamp="event_ts")  # schema read from files
USER = Entity("user", join_keys=["user_id"])
COUNT_1H = Feature("txn_count_1h", agg.count(), window=Hop("1h", every="5m"))
SUM_1H = Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m"))
FRAUD_FEATURES = (
    Feature("failed_count_24h", agg.count(), window=Hop("24h", every="5m"), where="status = 'FAILED'"),
    SUM_1H,
    Feature("amount_max_24h", agg.max("amount"), window=Hop("24h", every="5m")),
    Feature("merchants_24h", agg.approx_count_distinct("merchant_id"), window=Hop("24h", every="1h")),
    Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="1h")),
    # beyond the example: a value of each other shape (a string, a list, a tumbling window)
    Feature("last_status", agg.last("status"), window=Lifetime(every="5m")),
    Feature("last_amounts_1h", agg.last_k("amount", 3), window=Hop("1h", every="5m")),
    Feature("amount_avg_30m", agg.avg("amount"), window=Tumble("30m")),
)


def user_transactions(*extra: Feature, source: EventSource = SOURCE) -> FeatureGroup:
    """The group with `FRAUD_FEATURES`, then `extra`."""
    return FeatureGroup(name="user_transactions", entity=USER, source=source, features=[*FRAUD_FEATURES, *extra])


# `hop`, on a source whose schema is declared; HOP_V1 is its definition before amount_sum_1h was added.
TYPED_SOURCE = EventSource(
    "transactions",
    path="data/transactions",
    timestamp="event_ts",
    watermark="10m",
    schema={"user_id": "string", "amount": "double", "status": "string", "event_ts": "timestamp"},
)
HOP_V1 = FeatureGroup("hop", USER, TYPED_SOURCE, [COUNT_1H])
HOP = FeatureGroup("hop", USER, TYPED_SOURCE, [COUNT_1H, SUM_1H])

USER_ACTIVITY = FeatureGroup(
    "user_activity",
    USER,
    SOURCE,
    [COUNT_1H, SUM_1H, Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="1h"))],
)
