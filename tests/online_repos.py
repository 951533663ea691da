"""Applied Feast repositories on either online store (SQLite file or a real Redis), for the online tests.

The groups cover every type the definitions produce online: integers (counts, HLL estimates), floats (sums,
maxima, averages, KLL estimates), strings and booleans (`last`), lists (`last_k`), and nulls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import repo_yaml
from feast import FeatureStore
from redis_server import RedisServer

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg, to_feast
from features.stores.online import OnlineWriter, online_writer

STORES = ("sqlite", "redis")

SOURCE = EventSource(
    "transactions",
    path="data/transactions",
    timestamp="event_ts",
    schema={
        "user_id": "string",
        "card_id": "string",
        "merchant_id": "int64",
        "amount": "double",
        "status": "string",
        "ok": "bool",
        "event_ts": "timestamp",
    },
)
HOP = Hop("1h", every="5m")
USER = FeatureGroup(
    name="user_transactions",
    entity=Entity("user", join_keys=["user_id"]),
    source=SOURCE,
    features=[
        Feature("txn_count", agg.count(), window=HOP),
        Feature("amount_sum", agg.sum("amount"), window=HOP),
        Feature("amount_max", agg.max("amount"), window=HOP),
        Feature("merchants", agg.approx_count_distinct("merchant_id"), window=HOP),
        Feature("amount_p90", agg.approx_percentile("amount", 0.9), window=HOP),
        Feature("last_status", agg.last("status"), window=Lifetime(every="5m")),
        Feature("last_ok", agg.last("ok"), window=Lifetime(every="5m")),
        Feature("last_merchants", agg.last_k("merchant_id", 3), window=HOP),
        Feature("last_amounts", agg.last_k("amount", 3), window=HOP),
        Feature("last_statuses", agg.last_k("status", 3), window=HOP),
        Feature("last_oks", agg.last_k("ok", 3), window=HOP),
    ],
)
# Another view on the same entity key: in Redis both live in the same hash.
USER_DAILY = FeatureGroup(
    name="user_daily",
    entity=Entity("user", join_keys=["user_id"]),
    source=SOURCE,
    features=[Feature("txn_count_1d", agg.count(), window=Hop("1d", every="1h"))],
)
CARD_MERCHANT = FeatureGroup(
    name="card_merchant",
    entity=Entity("card_merchant", join_keys=["card_id", "merchant_id"]),
    source=SOURCE,
    features=[
        Feature("txn_count", agg.count(), window=HOP),
        Feature("last_status", agg.last("status"), window=Lifetime(every="5m")),
    ],
)
GROUPS = (USER, USER_DAILY, CARD_MERCHANT)

T0 = pd.Timestamp("2024-01-01 00:05", tz="UTC")
T1 = pd.Timestamp("2024-01-01 00:10", tz="UTC")
T2 = pd.Timestamp("2024-01-01 00:15", tz="UTC")


def feature_store_yaml(kind: str, project: str, redis: RedisServer | None = None, **redis_options: Any) -> str:
    if kind == "sqlite":
        return repo_yaml.feature_store_yaml(project)
    assert redis is not None, "a Redis repo needs the redis_server fixture"
    return repo_yaml.feature_store_yaml(project, repo_yaml.redis_online(redis.connection_string, **redis_options))


def make_repo(
    root: Path,
    kind: str,
    redis: RedisServer | None = None,
    groups: tuple[FeatureGroup, ...] = GROUPS,
    project: str | None = None,
    **redis_options: Any,
) -> Path:
    """An applied repo in `root` whose online store is `kind` ("sqlite" or "redis"); a fresh project name."""
    root.mkdir(parents=True, exist_ok=True)
    project = project or RedisServer.project()
    (root / "feature_store.yaml").write_text(feature_store_yaml(kind, project, redis, **redis_options))
    store = FeatureStore(repo_path=str(root))
    store.apply([obj for group in groups for obj in to_feast(group, repo_root=root)])
    return root


def writer(root: Path, group: FeatureGroup) -> OnlineWriter:
    return online_writer(FeatureStore(repo_path=str(root)), group, group.output_types(SOURCE.schema))


def read(root: Path, group: FeatureGroup, rows: list[dict]) -> dict[str, list]:
    store = FeatureStore(repo_path=str(root))
    refs = [f"{group.name}:{f.name}" for f in group.features]
    return store.get_online_features(features=refs, entity_rows=rows).to_dict()


def every_type_rows(window_end: pd.Timestamp = T0) -> pd.DataFrame:
    """Rows of USER with every type, edge values and nulls (u2 is all null but its count)."""
    import numpy as np

    return pd.DataFrame(
        {
            "user_id": ["u1", "u2", "ü-3 😀", "u4"],
            "window_end": [window_end] * 4,
            "txn_count": np.array([3, 0, 2**63 - 1, 128], dtype="int64"),
            "amount_sum": [12.5, 0.0, -1e300, 0.1],
            "amount_max": [9.25, np.nan, float("inf"), -0.0],
            "merchants": pd.array([2, None, 0, 127], dtype="Int64"),
            "amount_p90": [9.0, None, 1e-300, 3.0],
            "last_status": ["FAILED", None, "é" * 200, ""],
            "last_ok": [np.bool_(False), None, True, True],
            "last_merchants": [np.array([7, 3, 7]), None, [-(2**63)], []],
            "last_amounts": [[9.25, 3.25], None, np.array([0.5]), []],
            "last_statuses": [np.array(["FAILED", "OK"], dtype=object), None, ["x" * 300], []],
            "last_oks": [[False, True, True], None, [True], []],
        }
    )


EXPECTED_EVERY_TYPE = {
    "txn_count": [3, 0, 2**63 - 1, 128, None],
    "amount_sum": [12.5, 0.0, -1e300, 0.1, None],
    "amount_max": [9.25, None, float("inf"), -0.0, None],
    "merchants": [2, None, 0, 127, None],
    "amount_p90": [9.0, None, 1e-300, 3.0, None],
    "last_status": ["FAILED", None, "é" * 200, "", None],
    "last_ok": [False, None, True, True, None],
    "last_merchants": [[7, 3, 7], None, [-(2**63)], [], None],
    "last_amounts": [[9.25, 3.25], None, [0.5], [], None],
    "last_statuses": [["FAILED", "OK"], None, ["x" * 300], [], None],
    "last_oks": [[False, True, True], None, [True], [], None],
}
EVERY_TYPE_KEYS = ["u1", "u2", "ü-3 😀", "u4", "nobody"]


def count_rows(window_end: pd.Timestamp, counts: dict[str, int], group: FeatureGroup = USER) -> pd.DataFrame:
    """Rows of USER keyed by user, `txn_count` given, every other feature null."""
    rows = pd.DataFrame({"user_id": list(counts), "window_end": [window_end] * len(counts)})
    for feat in group.features:
        rows[feat.name] = None
    rows[group.features[0].name] = list(counts.values())
    return rows
