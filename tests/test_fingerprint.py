"""Definition hashes: stable under reordering and renaming of files, changed by anything deciding values."""

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.spec.fingerprint import definition_hash, describe, feature_hashes

USER = Entity("user", join_keys=["user_id"])
SRC = EventSource("tx", path="data/tx", timestamp="ts")
COUNT = Feature("n_1h", agg.count(), window=Hop("1h", every="5m"))
TOTAL = Feature("amount_1h", agg.sum("amount"), window=Hop("1h", every="5m"))


def group(*features: Feature, source: EventSource = SRC, description: str = "") -> FeatureGroup:
    return FeatureGroup("g", USER, source, list(features), description=description)


def test_hash_ignores_feature_order_descriptions_and_source_folder() -> None:
    moved = EventSource("tx", path="elsewhere/tx", timestamp="ts")
    assert definition_hash(group(COUNT, TOTAL)) == definition_hash(group(TOTAL, COUNT))
    assert definition_hash(group(COUNT)) == definition_hash(group(COUNT, source=moved, description="new words"))


def test_hash_changes_with_what_decides_values() -> None:
    base = definition_hash(group(COUNT))
    assert base != definition_hash(group(COUNT, TOTAL))
    assert base != definition_hash(group(Feature("n_1h", agg.count(), window=Hop("2h", every="5m"))))
    assert base != definition_hash(group(Feature("n_1h", agg.count(), window=Hop("1h", every="5m"), where="x > 1")))
    assert feature_hashes(group(COUNT))["n_1h"] == feature_hashes(group(COUNT, TOTAL))["n_1h"]


def test_describe_is_json_ready() -> None:
    import json

    data = json.loads(json.dumps(describe(group(COUNT, TOTAL))))
    assert data["features"][1] == {
        "name": "amount_1h",
        "aggregation": "sum",
        "column": "amount",
        "quantile": None,
        "k": None,
        "window": {"size_s": 3600, "every_s": 300},
        "where": None,
    }
