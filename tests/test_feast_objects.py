"""Feast objects generated from feature groups: types, entities, ttl, offline path, schema inference, and
point-in-time retrieval through Feast's DuckDB offline store over a hand-written offline table."""

from __future__ import annotations

import shutil
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from feast import Entity as FeastEntity
from feast import FeatureStore, FeatureView, FileSource, ValueType
from feast.types import Array, Bool, Float64, Int64, String
from repo_yaml import feature_store_yaml

from features import ConfigError, DataError, Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg
from features.parquet_schema import dtype_of_arrow
from features.repo import offline_table_path
from features.spec import DType
from features.stores.feast_objects import feast_value_type, source_schema, to_feast

REPO = Path(__file__).resolve().parents[1] / "feature_repo"
FEATURE_STORE_YAML = feature_store_yaml("test")
SCHEMA = {
    "user_id": "string",
    "card_id": "string",
    "merchant_id": "int64",
    "amount": "double",
    "status": "string",
    "ok": "bool",
    "event_ts": "timestamp",
}


def _source(schema: dict[str, str] | None = SCHEMA, fmt: str = "parquet") -> EventSource:
    return EventSource("transactions", path="data/transactions", timestamp="event_ts", format=fmt, schema=schema)


def _user_group(source: EventSource | None = None) -> FeatureGroup:
    return FeatureGroup(
        name="user_transactions",
        entity=Entity("user", join_keys=["user_id"]),
        source=source or _source(),
        features=[
            Feature("txn_count_1h", agg.count(), window=Hop("1h", every="5m")),
            Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
            Feature("last_status", agg.last("status"), window=Lifetime(every="5m")),
            Feature("last_ok", agg.last("ok"), window=Lifetime(every="5m")),
            Feature("last_merchants", agg.last_k("merchant_id", 3), window=Hop("1h", every="5m")),
            Feature("last_amounts", agg.last_k("amount", 3), window=Hop("1h", every="5m")),
            Feature("last_statuses", agg.last_k("status", 3), window=Hop("1h", every="5m")),
            Feature("last_oks", agg.last_k("ok", 3), window=Hop("1h", every="5m")),
        ],
    )


def _composite_group() -> FeatureGroup:
    return FeatureGroup(
        name="card_merchant",
        entity=Entity("card_merchant", join_keys=["card_id", "merchant_id"]),
        source=_source(),
        features=[Feature("txn_count_1h", agg.count(), window=Hop("1h", every="5m"))],
    )


def _view(objects: list) -> FeatureView:
    return next(o for o in objects if isinstance(o, FeatureView))


def test_feature_view_types_ttl_and_online(tmp_path: Path) -> None:
    view = _view(to_feast(_user_group(), repo_root=tmp_path))
    assert view.name == "user_transactions"
    assert view.ttl == timedelta(0)
    assert view.online
    types = {f.name: f.dtype for f in view.features}
    assert types == {
        "txn_count_1h": Int64,
        "amount_sum_1h": Float64,
        "last_status": String,
        "last_ok": Bool,
        "last_merchants": Array(Int64),
        "last_amounts": Array(Float64),
        "last_statuses": Array(String),
        "last_oks": Array(Bool),
    }
    assert [(f.name, f.dtype) for f in view.entity_columns] == [("user_id", String)]
    assert "agg.sum('amount') over Hop('1h', every='5m')" in view.features[1].description


def test_entity_and_source(tmp_path: Path) -> None:
    entity, source, view = to_feast(_user_group(), repo_root=tmp_path)
    assert isinstance(entity, FeastEntity)
    assert (entity.name, entity.join_key, entity.value_type) == ("user", "user_id", ValueType.STRING)
    assert isinstance(source, FileSource)
    assert source.timestamp_field == "window_end"
    # Relative to the repo, so that a copied or moved repo reads its own table (tests/test_copied_repo.py).
    assert source.path == "data/offline/user_transactions"
    assert view.batch_source is source
    assert view.entities == ["user"]


def test_composite_key_becomes_one_feast_entity_per_join_key(tmp_path: Path) -> None:
    card, merchant, _source_obj, view = to_feast(_composite_group(), repo_root=tmp_path)
    assert (card.name, card.join_key, card.value_type) == ("card_merchant__card_id", "card_id", ValueType.STRING)
    assert (merchant.name, merchant.join_key, merchant.value_type) == (
        "card_merchant__merchant_id",
        "merchant_id",
        ValueType.INT64,
    )
    assert view.entities == ["card_merchant__card_id", "card_merchant__merchant_id"]


def test_explicit_offline_path_is_kept_relative_to_the_repo(tmp_path: Path) -> None:
    source = to_feast(_user_group(), repo_root=tmp_path, offline_path="elsewhere/ut")[1]
    from feast.data_format import DeltaFormat

    assert source.path == "elsewhere/ut"
    assert isinstance(source.file_options.file_format, DeltaFormat)
    absolute = to_feast(_user_group(), repo_root=tmp_path, offline_path=str(tmp_path / "ut"))[1]
    assert absolute.path == str(tmp_path / "ut")
    remote = to_feast(_user_group(), repo_root=tmp_path, offline_path="s3://bucket/offline/ut/")[1]
    assert remote.path == "s3://bucket/offline/ut/"


def test_schema_argument_wins_over_the_declared_one(tmp_path: Path) -> None:
    schema = {**_source().schema, "amount": DType.INT64}
    view = _view(to_feast(_user_group(), repo_root=tmp_path, schema=schema))
    assert {f.name: f.dtype for f in view.features}["amount_sum_1h"] == Int64


def test_schema_inferred_from_parquet_files(tmp_path: Path) -> None:
    part = tmp_path / "data" / "transactions" / "date=2024-01-01"
    part.mkdir(parents=True)
    frame = pd.DataFrame(
        {
            "user_id": ["u1"],
            "card_id": ["c1"],
            "merchant_id": pd.Series([7], dtype="int32"),
            "amount": pd.Series([1.5], dtype="float32"),
            "status": ["OK"],
            "ok": [True],
            "event_ts": pd.to_datetime(["2024-01-01 00:00:01"], utc=True),
        }
    )
    frame.to_parquet(part / "part-0.parquet", index=False)
    (part.parent / "_SUCCESS").write_text("")
    schema = source_schema(_user_group(_source(schema=None)), tmp_path)
    assert schema["merchant_id"] is DType.INT64
    assert schema["amount"] is DType.FLOAT64
    assert schema["event_ts"] is DType.TIMESTAMP
    assert schema["ok"] is DType.BOOL
    view = _view(to_feast(_user_group(_source(schema=None)), repo_root=tmp_path))
    assert {f.name: f.dtype for f in view.features}["last_merchants"] == Array(Int64)


def test_schema_inferred_from_json_lines(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "transactions"
    folder.mkdir(parents=True)
    (folder / "a.json").write_text(
        '{"user_id": "u1", "card_id": "c", "merchant_id": 3, "amount": 2.5, "status": "OK", "ok": true, '
        '"event_ts": "2024-01-01T00:00:01"}\n'
    )
    schema = source_schema(_user_group(_source(schema=None, fmt="json")), tmp_path)
    assert schema == {
        "user_id": DType.STRING,
        "card_id": DType.STRING,
        "merchant_id": DType.INT64,
        "amount": DType.FLOAT64,
        "status": DType.STRING,
        "ok": DType.BOOL,
        "event_ts": DType.TIMESTAMP,
    }


@pytest.mark.parametrize("land_empty_folder", [False, True])
def test_no_schema_and_no_data_is_a_config_error(tmp_path: Path, land_empty_folder: bool) -> None:
    if land_empty_folder:
        (tmp_path / "data" / "transactions").mkdir(parents=True)
    with pytest.raises(ConfigError) as info:
        to_feast(_user_group(_source(schema=None)), repo_root=tmp_path)
    message = str(info.value)
    assert "EventSource('transactions').schema" in message
    assert "declare schema=" in message
    assert "land data" in message


def test_dtype_of_arrow() -> None:
    assert dtype_of_arrow(pa.int8()) is DType.INT64
    assert dtype_of_arrow(pa.uint32()) is DType.INT64
    assert dtype_of_arrow(pa.float32()) is DType.FLOAT64
    assert dtype_of_arrow(pa.float64()) is DType.FLOAT64
    assert dtype_of_arrow(pa.string()) is DType.STRING
    assert dtype_of_arrow(pa.large_string()) is DType.STRING
    assert dtype_of_arrow(pa.dictionary(pa.int32(), pa.string())) is DType.STRING
    assert dtype_of_arrow(pa.bool_()) is DType.BOOL
    assert dtype_of_arrow(pa.timestamp("us", tz="UTC")) is DType.TIMESTAMP
    assert dtype_of_arrow(pa.struct([("a", pa.int64())])) is None


def test_feast_value_type() -> None:
    assert feast_value_type(DType.FLOAT64) is ValueType.DOUBLE
    assert feast_value_type(DType.STRING_LIST) is ValueType.STRING_LIST


def _applied_store(root: Path, group: FeatureGroup) -> FeatureStore:
    root.mkdir(parents=True, exist_ok=True)
    (root / "feature_store.yaml").write_text(FEATURE_STORE_YAML)
    store = FeatureStore(repo_path=str(root))
    store.apply(to_feast(group, repo_root=root))
    return store


def _write_offline(root: Path, group: str, frame: pd.DataFrame) -> None:
    """Write change points as the engines lay them out: a Delta table partitioned by the window end's date."""
    from deltalake import write_deltalake

    frame = frame.assign(window_end=frame["window_end"].astype("datetime64[us, UTC]"))
    frame["date"] = frame["window_end"].dt.date
    write_deltalake(offline_table_path(root, group), frame, partition_by=["date"])


def test_historical_features_are_point_in_time_correct(tmp_path: Path) -> None:
    group = _composite_group()
    store = _applied_store(tmp_path, group)
    ends = pd.to_datetime(["2024-01-01 23:55", "2024-01-02 00:05", "2024-01-02 01:05"], utc=True)
    _write_offline(
        tmp_path,
        group.name,
        pd.DataFrame(
            {
                "card_id": ["c1", "c1", "c1"],
                "merchant_id": [7, 7, 7],
                "window_end": ends,
                "txn_count_1h": [1, 2, 0],
            }
        ),
    )
    at = pd.to_datetime(
        [
            "2024-01-01 23:54:59",  # before any row: null
            "2024-01-01 23:55:00",  # exactly at a window end: that row
            "2024-01-02 00:04:59",  # still the row before, across the date partition
            "2024-01-02 00:05:00",
            "2024-01-03 00:00:00",  # after the last row (count back to 0): unbounded ttl keeps it
            "2024-01-02 00:05:00",  # another merchant of the same card: no rows
        ],
        utc=True,
    )
    entity_df = pd.DataFrame(
        {"card_id": ["c1"] * 6, "merchant_id": [7, 7, 7, 7, 7, 8], "event_timestamp": at, "row": range(6)}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = store.get_historical_features(entity_df=entity_df, features=["card_merchant:txn_count_1h"]).to_df()
    got = result.sort_values("row")["txn_count_1h"].tolist()
    assert pd.isna(got[0]) and pd.isna(got[5])
    assert got[1:5] == [1, 1, 2, 0]


def test_example_repo_applies_with_feast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`feast apply` in feature_repo/ registers the example groups (module-level objects are picked up); the
    request-time features' on-demand views are registered by `features apply` (docs/definitions.md)."""
    from feast.repo_config import load_repo_config
    from feast.repo_operations import apply_total

    repo = tmp_path / "feature_repo"
    repo.mkdir()
    for name in ("feature_store.yaml", "fraud.py", ".feastignore"):
        shutil.copy(REPO / name, repo / name)
    monkeypatch.chdir(repo)  # apply_total changes the cwd; monkeypatch restores it
    monkeypatch.syspath_prepend(str(repo))  # as the feast CLI does
    monkeypatch.delitem(sys.modules, "fraud", raising=False)  # Feast imports the file as module "fraud"
    apply_total(load_repo_config(repo, repo / "feature_store.yaml"), repo, skip_source_validation=True)
    sys.modules.pop("fraud", None)
    store = FeatureStore(repo_path=str(repo))
    assert sorted(v.name for v in store.list_feature_views()) == ["card_activity", "card_merchant", "user_transactions"]
    assert store.list_on_demand_feature_views() == []  # the request-time features: `features apply`'s
    assert sorted(e.name for e in store.list_entities()) == [
        "card",
        "card_merchant__card_id",
        "card_merchant__merchant_id",
        "user",
    ]
    assert (repo / "data" / "online_store.db").is_file()


def test_unreadable_source_files_are_a_data_error(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "transactions"
    folder.mkdir(parents=True)
    (folder / "part-0.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"EventSource\('transactions'\)\.path: cannot read the schema"):
        to_feast(_user_group(_source(schema=None)), repo_root=tmp_path)


# --- `features apply` registers every group ---------------------------------------------------------------------

PLAIN_MODULE = """
from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg

group = FeatureGroup(
    name="plain",
    entity=Entity("user", join_keys=["user_id"]),
    source=EventSource(name="events", path="data/events", timestamp="event_ts",
                       schema={{"user_id": "string", "amount": "double", "event_ts": "timestamp"}}),
    features=[Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="{every}"))],
)
"""


def _plain_repo(root: Path, **modules: str) -> Path:
    root.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "feature_repo" / "feature_store.yaml", root)
    for name, text in modules.items():
        (root / f"{name}.py").write_text(text)
    return root


def test_apply_registers_groups_without_exports_and_a_copied_module_once(tmp_path: Path) -> None:
    from features.pipelines.registration import apply

    module = PLAIN_MODULE.format(every="5m")
    # The copy also exports its Feast objects (for plain `feast apply`): the same objects, applied once.
    exported = module + (
        "\nfrom pathlib import Path\nfrom features import to_feast\n"
        "user, source, view = to_feast(group, repo_root=Path(__file__).parent)\n"
    )
    root = _plain_repo(tmp_path / f"repo_{tmp_path.name[-8:]}", mod_a=module, mod_a_copy=exported)
    assert apply(str(root)) == ["plain"]
    store = FeatureStore(repo_path=str(root))
    view = store.get_feature_view("plain")
    assert [f.name for f in view.features] == ["amount_sum_1h"]
    assert view == next(o for o in to_feast(_plain_group(root), repo_root=root) if isinstance(o, FeatureView))


def _plain_group(root: Path) -> FeatureGroup:
    from features.repo import Repo

    return Repo.load(root).groups["plain"]


def test_two_different_groups_under_one_name_name_both_files(tmp_path: Path) -> None:
    from features.repo import Repo

    root = _plain_repo(
        tmp_path / f"repo_{tmp_path.name[-8:]}",
        mod_a=PLAIN_MODULE.format(every="5m"),
        mod_b=PLAIN_MODULE.format(every="10m"),
    )
    with pytest.raises(ConfigError, match=r"mod_a\.py and .*mod_b\.py define different feature groups named 'plain'"):
        Repo.load(root)
