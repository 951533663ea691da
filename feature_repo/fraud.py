"""Example fraud feature groups, and the Feast objects generated from them so that `feast apply` works here."""

from pathlib import Path

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg, to_feast

HERE = Path(__file__).resolve().parent

user = Entity("user", join_keys=["user_id"])
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
    ],
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

# Feast's `feast apply` picks up module-level Feast objects only (not objects inside a list), so each one gets
# its own name. A composite key becomes one Feast entity per join key.
user_entity, user_transactions_source, user_transactions_view = to_feast(user_transactions, repo_root=HERE)
card_entity, merchant_entity, card_merchant_source, card_merchant_view = to_feast(
    card_merchant_activity, repo_root=HERE
)
