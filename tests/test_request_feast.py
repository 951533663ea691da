"""Request-time features as Feast on-demand feature views (features.stores.feast_request; docs/serving.md,
"Request-time features in Feast"), without Spark: what `features apply` registers for each, and each kind of
feature Feast cannot carry left out with a warning naming it, why and the fix. Feast's values against the
reference, online and in training sets: tests/test_request_everywhere.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from features.repo import Repo
from features.stores.feast_objects import repo_objects
from features.stores.feast_request import feast_request_values, request_views

EXAMPLE_YAML = Path(__file__).resolve().parents[1] / "feature_repo" / "feature_store.yaml"
MODULE = """
import threading

from features import Entity, EventSource, Feature, FeatureGroup, Hop, RequestFeature, agg

users = FeatureGroup(
    name="users",
    entity=Entity("user", join_keys=["user_id"]),
    source=EventSource(
        name="txns",
        path="data/txns",
        timestamp="ts",
        schema={"user_id": "string", "amount": "double", "ts": "timestamp"},
    ),
    features=[Feature("amount_max_24h", agg.max("amount"), window=Hop("24h", every="5m"))],
)

ratio = RequestFeature(
    "amount_vs_max_24h",
    lambda amount, amount_max_24h: amount / amount_max_24h,
    request={"amount": "double"},
    features=["users:amount_max_24h"],
    dtype="double",
)
since = RequestFeature(
    "hour_of_request", lambda request_time: request_time.dt.hour, dtype="int64", description="UTC hour"
)
named_like_a_group = RequestFeature("users", lambda amount: amount * 2, request={"amount": "double"}, dtype="double")
LOCK = threading.Lock()


def locked(amount):
    with LOCK:
        return amount


unpicklable = RequestFeature("locked", locked, request={"amount": "double"}, dtype="double")
constant = RequestFeature("constant", lambda: 1.0, dtype="double", row=True)  # Feast's views need a source
code_as_int = RequestFeature(  # Feast's sample row sends "hello world"
    "code_as_int", lambda code: code.astype(int), request={"code": "string"}, dtype="int64"
)
null_on_sample = RequestFeature(  # Feast's sample row sends 1.0, and types the view by what it gives
    "null_on_sample", lambda amount: amount.where(amount > 1), request={"amount": "double"}, dtype="double"
)
"""


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    shutil.copy(EXAMPLE_YAML, tmp_path / "feature_store.yaml")
    (tmp_path / "defs.py").write_text(MODULE)
    return Repo.load(tmp_path)


def test_each_feature_feast_can_carry_is_a_view_of_its_name(repo: Repo) -> None:
    views, _ = request_views(repo, [o for o in repo_objects(repo) if type(o).__name__ == "FeatureView"])
    by_name = {view.name: view for view in views}
    assert sorted(by_name) == ["amount_vs_max_24h", "hour_of_request"]
    ratio = by_name["amount_vs_max_24h"]
    assert [f.name for f in ratio.features] == ["amount_vs_max_24h"] and ratio.mode == "python"
    assert [p.features[0].name for p in ratio.source_feature_view_projections.values()] == ["amount_max_24h"]
    assert list(ratio.get_request_data_schema()) == ["amount"]
    assert list(by_name["hour_of_request"].get_request_data_schema()) == ["request_time"]  # sent by the client
    assert by_name["hour_of_request"].description == "UTC hour"
    # The transformation Feast keeps in its registry computes it by the one function, from Feast's columns.
    # Feast's python mode gives a list per column (a stored input under both its names) and takes a list back.
    rows = {"user_id": ["u1", "u2"], "users__amount_max_24h": [50.0, None], "amount_max_24h": [50.0, None]}
    rows |= {"amount": [10.0, 3.0]}
    packed = ratio.udf_string.split("feast_request_values(inputs, ")[1].split(")")[0][1:-1]
    assert feast_request_values(rows, packed) == {"amount_vs_max_24h": [0.2, None]}
    restored = type(ratio).from_proto(ratio.to_proto())  # as Feast reads it back, without this process's objects
    assert restored.feature_transformation.transform(rows)["amount_vs_max_24h"] == [0.2, None]


def test_features_feast_cannot_carry_are_left_out_with_why_and_the_fix(repo: Repo, capsys) -> None:
    import os

    from feast.repo_config import load_repo_config

    from features.stores.feast_repo import repo_contents

    config = load_repo_config(repo.root, repo.root / "feature_store.yaml")
    before = os.getcwd()
    os.chdir(repo.root)
    try:
        contents = repo_contents(repo, config)
    finally:
        os.chdir(before)
    assert sorted(v.name for v in contents.on_demand_feature_views) == ["amount_vs_max_24h", "hour_of_request"]
    warned = {line.split("'")[1]: line for line in capsys.readouterr().err.splitlines() if "not registered" in line}
    assert sorted(warned) == ["code_as_int", "constant", "locked", "null_on_sample", "users"]
    assert all("features' own training sets, models and server compute it" in line for line in warned.values())
    assert "'users' is also a feature group's name" in warned["users"] and "Fix: rename" in warned["users"]
    assert "its function cannot be pickled for Feast's registry (TypeError" in warned["locked"]
    assert "Fix: define the function at a module's top level" in warned["locked"]
    assert "on the sample row Feast computes every new view on when it is applied, it fails" in warned["code_as_int"]
    assert "'hello world'" in warned["code_as_int"] and "Fix: make the function give a value" in warned["code_as_int"]
    assert "computes every new view on when it is applied, it gives null there" in warned["null_on_sample"]
    assert "it reads no request field, stored feature or request_time. Fix: give the function" in warned["constant"]
