"""Request-time features (features.spec.request, features.kernel.request_time; docs/definitions.md, "Request-time
features"), without Spark: every mistake in a definition named with its fix, the values against a row-by-row
reference on randomized rows (nulls, keys with no history), and a function that misbehaves named with its first
failing row."""

from __future__ import annotations

import json
import math
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from features import Entity, EventSource, Feature, FeatureGroup, Hop, RequestFeature, agg
from features.errors import ConfigError, DataError, DefinitionError
from features.kernel.request_time import add_request_features, request_values
from features.repo import Repo
from features.spec.request import check_request_features
from features.spec.types import DType

EXAMPLE_YAML = Path(__file__).resolve().parents[1] / "feature_repo" / "feature_store.yaml"

users = FeatureGroup(
    name="users",
    entity=Entity("user", join_keys=["user_id"]),
    source=EventSource(name="txns", path="data/txns", timestamp="ts"),
    features=[
        Feature("amount_max_24h", agg.max("amount"), window=Hop("24h", every="5m")),
        Feature("count_24h", agg.count(), window=Hop("24h", every="5m")),
    ],
)
GROUPS = {"users": users}


def ratio() -> RequestFeature:
    return RequestFeature(
        "amount_vs_max_24h",
        lambda amount, amount_max_24h: amount / amount_max_24h,
        request={"amount": "double"},
        features=["users:amount_max_24h"],
        dtype="double",
    )


# ---------------------------------------------------------------------------------------------------------
# Definitions


def test_a_definition_holds_its_inputs_in_the_functions_order() -> None:
    feature = RequestFeature(
        "recent",
        lambda request_time, seen, amount: (request_time - seen).dt.total_seconds() < amount,
        request={"amount": "float"},
        features={"seen": "users:amount_max_24h"},
        dtype="bool",
    )
    assert feature.parameters == ("request_time", "seen", "amount")
    assert feature.wants_request_time and feature.dtype is DType.BOOL
    assert feature.request == {"amount": DType.FLOAT64}
    assert [s.ref for s in feature.features] == ["users:amount_max_24h"]
    assert not ratio().wants_request_time
    check_request_features([ratio(), feature], GROUPS)


@pytest.mark.parametrize(
    ("build", "field", "fix"),
    [
        (lambda: RequestFeature("x", 3, dtype="double"), "RequestFeature('x').function", "pass a function"),
        (lambda: RequestFeature("x", lambda: 1, dtype="decimal"), "RequestFeature('x').dtype", "use int64, double"),
        (
            lambda: RequestFeature("x", lambda a: a, request={"a": "money"}, dtype="double"),
            "RequestFeature('x').request['a']",
            "use int64, double",
        ),
        (
            lambda: RequestFeature("x", lambda request_time: 1, request={"request_time": "timestamp"}, dtype="int"),
            "RequestFeature('x').request",
            "take a parameter named request_time",
        ),
        (
            lambda: RequestFeature("x", lambda amount, tip: amount, request={"amount": "double"}, dtype="double"),
            "RequestFeature('x').function",
            "declare it in request={'tip': 'double'}",
        ),
        (
            lambda: RequestFeature("x", lambda amount: amount, request={"amount": "double", "n": "int"}, dtype="int"),
            "RequestFeature('x').function",
            "add the parameter, or remove 'n'",
        ),
        (
            lambda: RequestFeature("x", lambda *cols: cols[0], request={"a": "int"}, dtype="int"),
            "RequestFeature('x').function",
            "name each parameter: a",
        ),
        (
            lambda: RequestFeature("x", lambda a: a, features=["amount_max_24h"], dtype="double"),
            "RequestFeature('x').features",
            'write "group:feature"',
        ),
        (
            lambda: RequestFeature("x", lambda a: a, features="users:a", dtype="double"),
            "RequestFeature('x').features",
            'pass a list: features=["users:a"]',
        ),
        (
            lambda: RequestFeature("x", lambda a: a, request={"a": "int"}, features=["users:a"], dtype="int"),
            "RequestFeature('x').features",
            "name the feature's parameter apart",
        ),
        (
            lambda: RequestFeature("x", lambda a: a, features=["u:a", "v:a"], dtype="int"),
            "RequestFeature('x').features",
            "name them apart with a mapping",
        ),
        (lambda: RequestFeature("window_end", lambda: 1, dtype="int"), "RequestFeature('window_end').name", "rename"),
        (lambda: RequestFeature("9x", lambda: 1, dtype="int"), "RequestFeature.name", "use letters, digits and _"),
    ],
)
def test_a_wrong_definition_is_refused_naming_the_field_and_the_fix(build, field, fix) -> None:
    with pytest.raises(DefinitionError) as raised:
        build()
    assert raised.value.field == field
    assert fix in raised.value.fix


@pytest.mark.parametrize(
    ("feature", "field", "fix"),
    [
        (
            RequestFeature("x", lambda amount_max_24h: 1, features=["accounts:amount_max_24h"], dtype="int"),
            "RequestFeature('x').features",
            "use one of ['users'] before the colon",
        ),
        (
            RequestFeature("x", lambda amount_avg_24h: 1, features=["users:amount_avg_24h"], dtype="int"),
            "RequestFeature('x').features",
            "use one of ['amount_max_24h', 'count_24h']",
        ),
        (
            RequestFeature("count_24h", lambda count_24h: 1, features=["users:count_24h"], dtype="int"),
            "RequestFeature('count_24h').name",
            "rename the request-time feature",
        ),
        (
            RequestFeature("user_id", lambda count_24h: 1, features=["users:count_24h"], dtype="int"),
            "RequestFeature('user_id').name",
            "rename the request-time feature",
        ),
    ],
)
def test_a_reference_the_repo_cannot_resolve_is_refused(feature, field, fix) -> None:
    with pytest.raises(DefinitionError) as raised:
        check_request_features([feature], GROUPS)
    assert raised.value.field == field
    assert fix in raised.value.fix


def test_two_request_time_features_of_one_name_are_refused() -> None:
    with pytest.raises(DefinitionError, match="two request-time features have this name"):
        check_request_features([ratio(), ratio()], GROUPS)


REPO_MODULE = """
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

amount_vs_max_24h = RequestFeature(
    "amount_vs_max_24h",
    lambda amount, amount_max_24h: amount / amount_max_24h,
    request={"amount": "double"},
    features={"amount_max_24h": "users:{feature}"},
    dtype="double",
)
"""


def repo_with(tmp_path: Path, feature: str) -> Path:
    shutil.copy(EXAMPLE_YAML, tmp_path / "feature_store.yaml")
    (tmp_path / "defs.py").write_text(REPO_MODULE.replace("{feature}", feature))
    return tmp_path


def test_a_repo_holds_its_request_time_features_checked_against_its_groups(tmp_path) -> None:
    repo = Repo.load(repo_with(tmp_path, "amount_max_24h"))
    assert list(repo.request_features) == ["amount_vs_max_24h"]
    (tmp_path / "other.py").write_text(REPO_MODULE.replace("{feature}", "amount_max_24h").replace("/ amount", "* 2 /"))
    with pytest.raises(ConfigError, match=r"define request-time features named 'amount_vs_max_24h'. Fix: rename"):
        Repo.load(tmp_path)


def test_a_repo_whose_request_time_feature_reads_an_unknown_feature_does_not_load(tmp_path) -> None:
    with pytest.raises(DefinitionError, match=r"group 'users' has no feature 'amount_avg'"):
        Repo.load(repo_with(tmp_path, "amount_avg"))


# ---------------------------------------------------------------------------------------------------------
# Values


def random_rows(seed: int, n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    amount = pd.Series(np.round(rng.gamma(2.0, 30.0, n), 2))
    amount[rng.random(n) < 0.1] = np.nan  # a field missing from the request
    biggest = pd.Series(np.round(rng.gamma(2.0, 60.0, n), 2))
    biggest[rng.random(n) < 0.2] = np.nan  # a key with no history
    now = pd.Timestamp("2026-03-01", tz="UTC") + pd.to_timedelta(rng.integers(0, 86_400, n), unit="s")
    last = pd.Series(now - pd.to_timedelta(rng.integers(0, 7_200, n), unit="s"))
    last[rng.random(n) < 0.2] = pd.NaT
    merchants = [[f"m{j}" for j in range(int(k))] if k >= 0 else None for k in rng.integers(-1, 5, n)]
    merchant = [f"m{j}" for j in rng.integers(0, 6, n)]
    return pd.DataFrame(
        {
            "amount": amount,
            "amount_max_24h": biggest,
            "request_time": pd.Series(now).astype("datetime64[us, UTC]"),
            "last_event": pd.Series(last).astype("datetime64[us, UTC]"),
            "merchants_30d": merchants,
            "merchant_id": merchant,
        }
    )


def fraud_features(row: bool) -> list[RequestFeature]:
    """The fraud request features of the issue, each as a vectorized and as a row function."""
    if row:
        ratio_fn = lambda amount, amount_max_24h: (  # noqa: E731
            None if amount is None or not amount_max_24h else amount / amount_max_24h
        )
        since_fn = lambda request_time, last_event: (  # noqa: E731
            None if last_event is None else int((request_time - last_event).total_seconds())
        )
        new_fn = lambda merchant_id, merchants_30d: merchant_id not in (merchants_30d or [])  # noqa: E731
    else:
        ratio_fn = lambda amount, amount_max_24h: amount / amount_max_24h.where(amount_max_24h != 0)  # noqa: E731
        since_fn = lambda request_time, last_event: (request_time - last_event).dt.total_seconds()  # noqa: E731
        new_fn = lambda merchant_id, merchants_30d: pd.Series(  # noqa: E731
            [m not in (s if s is not None else []) for m, s in zip(merchant_id, merchants_30d, strict=True)]
        )
    amount, merchant = {"amount": "double"}, {"merchant_id": "string"}
    return [
        RequestFeature("ratio", ratio_fn, request=amount, features=["users:amount_max_24h"], dtype="double", row=row),
        RequestFeature(
            "seconds_since_last", since_fn, features={"last_event": "users:last_event"}, dtype="int64", row=row
        ),
        RequestFeature(
            "new_merchant",
            new_fn,
            request=merchant,
            features={"merchants_30d": "users:merchants"},
            dtype="bool",
            row=row,
        ),
    ]


def reference(rows: pd.DataFrame) -> pd.DataFrame:
    """Row by row, from the definitions in the words of the docs."""
    out = []
    for r in rows.to_dict("records"):
        amount = None if pd.isna(r["amount"]) else r["amount"]
        biggest = None if pd.isna(r["amount_max_24h"]) else r["amount_max_24h"]
        last = None if pd.isna(r["last_event"]) else r["last_event"]
        out.append(
            {
                "ratio": None if amount is None or biggest is None or biggest == 0 else amount / biggest,
                "seconds_since_last": None if last is None else int((r["request_time"] - last).total_seconds()),
                "new_merchant": r["merchant_id"] not in (r["merchants_30d"] or []),
            }
        )
    return pd.DataFrame(out)


def assert_values_equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Each of `want`'s columns equal in `got`, value by value (a null as any of pandas' missing values)."""
    for name in want.columns:
        for i, (a, b) in enumerate(zip(got[name].tolist(), want[name].tolist(), strict=True)):
            if b is None or (isinstance(b, float) and math.isnan(b)):
                assert a is None or a is pd.NA or (isinstance(a, float) and math.isnan(a)), (name, i, a)
            else:
                assert a == b, (name, i, a, b)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("row", [False, True])
def test_values_equal_the_row_by_row_reference(seed, row) -> None:
    rows = random_rows(seed)
    got = add_request_features(rows, fraud_features(row))
    want = reference(rows)
    assert list(got.columns) == [*rows.columns, "ratio", "seconds_since_last", "new_merchant"]
    assert str(got["ratio"].dtype) == "float64" and str(got["seconds_since_last"].dtype) == "Int64"
    assert str(got["new_merchant"].dtype) == "boolean"
    assert_values_equal(got, want)
    pd.testing.assert_frame_equal(rows, random_rows(seed))  # the input is left as it was


def example_rows(seed: int, n: int = 200) -> pd.DataFrame:
    """The inputs of the example repo's five in the one form: nulls, zeros (no history) and a new card."""
    rng = np.random.default_rng(seed)
    rows = random_rows(seed, n)
    average = pd.Series(np.round(rng.gamma(2.0, 20.0, n), 2))
    average[rng.random(n) < 0.2] = np.nan
    average[rng.random(n) < 0.05] = 0.0
    attempts_30d = rng.integers(0, 900, n)
    attempts_30d[rng.random(n) < 0.2] = 0
    return rows.rename(columns={"last_event": "last_txn_at"}).assign(
        amount_avg_24h=average,
        attempts_1h=rng.integers(0, 5, n),
        attempts_30d=attempts_30d,
        merchants_30d=[m if m is not None else [] for m in rows["merchants_30d"]],
    )


def example_reference(r: dict) -> dict:
    """The example repo's five for one row, in the words of their descriptions."""

    def ratio(numerator, denominator):
        missing = pd.isna(numerator) or pd.isna(denominator) or denominator <= 0
        return None if missing else numerator / denominator

    last = None if pd.isna(r["last_txn_at"]) else r["last_txn_at"]
    return {
        "amount_vs_avg_24h": ratio(r["amount"], r["amount_avg_24h"]),
        "amount_vs_max_24h": ratio(r["amount"], r["amount_max_24h"]),
        "seconds_since_card_txn": None if last is None else (r["request_time"] - last).total_seconds(),
        "merchant_new_30d": r["merchant_id"] not in r["merchants_30d"],
        "attempts_vs_usual_1h": ratio(r["attempts_1h"] + 1, r["attempts_30d"] / 720),
    }


@pytest.mark.parametrize("seed", [1, 2])
def test_the_example_repos_five_equal_the_row_by_row_reference(seed) -> None:
    """feature_repo/fraud.py's request-time features (written with numpy for a served request's one row)."""
    defined = Repo.load(EXAMPLE_YAML.parent).request_features
    rows = example_rows(seed)
    got = add_request_features(rows, list(defined.values()))
    want = pd.DataFrame([example_reference(r) for r in rows.to_dict("records")])
    assert sorted(defined) == sorted(want.columns)
    assert_values_equal(got, want)


def test_a_timestamp_and_a_list_come_out_in_their_types() -> None:
    rows = pd.DataFrame({"n": [1, 2, None]})
    start = datetime(2026, 1, 1, tzinfo=UTC)
    later = RequestFeature(
        "later",
        lambda n: [start + timedelta(days=v if v == v else 0) for v in n],
        request={"n": "int"},
        dtype="timestamp",
    )
    listed = RequestFeature(
        "listed", lambda n: [None if v != v else [v, v] for v in n], request={"n": "int"}, dtype="float64_list"
    )
    got = add_request_features(rows, [later, listed])
    assert str(got["later"].dtype) == "datetime64[us, UTC]"
    assert got["later"].iloc[1] == pd.Timestamp("2026-01-03", tz="UTC")
    assert got["listed"].tolist() == [[1.0, 1.0], [2.0, 2.0], None]


ROWS = pd.DataFrame({"amount": [10.0, 20.0, 30.0], "amount_max_24h": [5.0, 0.0, 2.0]})


def failing(function, dtype: str = "double", row: bool = False) -> RequestFeature:
    return RequestFeature(
        "ratio", function, request={"amount": "double"}, features=["users:amount_max_24h"], dtype=dtype, row=row
    )


def test_a_row_function_takes_its_inputs_by_name_or_by_position() -> None:
    """Called by position where it allows (the fast way), by name where a parameter is keyword-only."""

    def by_name(*, amount_max_24h, amount):
        return amount - amount_max_24h

    def by_position(amount, amount_max_24h, /):
        return amount - amount_max_24h

    for function in (by_name, by_position, lambda amount_max_24h, amount: amount - amount_max_24h):
        assert failing(function, row=True).positional is (function is not by_name)
        assert request_values(ROWS, failing(function, row=True)).tolist() == [5.0, 20.0, 28.0]


def test_a_function_that_raises_is_named_with_its_first_failing_row() -> None:
    def strict(amount, amount_max_24h):
        if (amount_max_24h == 0).any():
            raise ZeroDivisionError("no maximum")
        return amount / amount_max_24h

    with pytest.raises(DataError) as raised:
        request_values(ROWS, failing(strict))
    assert str(raised.value).startswith(
        "ratio: the request-time feature failed at row 1 (amount=20.0, amount_max_24h=0.0): ZeroDivisionError: "
        "no maximum. Fix: make the function give a float64 for every row"
    )
    with pytest.raises(DataError, match=r"failed at row 1 \(amount=20.0, amount_max_24h=0.0\): ZeroDivisionError"):
        request_values(ROWS, failing(lambda amount, amount_max_24h: amount / amount_max_24h, row=True))


@pytest.mark.parametrize(
    ("function", "dtype", "message"),
    [
        (lambda amount, amount_max_24h: amount.iloc[:2], "double", "returned 2 values for 3 rows"),
        (lambda amount, amount_max_24h: 1.0, "double", r"returned one value \(1.0\), not a column of 3 values"),
        (
            lambda amount, amount_max_24h: amount.astype(str),
            "double",
            "failed at row 0 (.*): '10.0' does not fit float64",
        ),
        (lambda amount, amount_max_24h: amount / 4, "int64", "failed at row 0 (.*): 2.5 does not fit int64"),
        (lambda amount, amount_max_24h: amount > 15, "string", "failed at row 0 (.*): False does not fit string"),
    ],
)
def test_a_function_that_returns_the_wrong_length_or_type_is_named(function, dtype, message) -> None:
    with pytest.raises(DataError, match=f"^ratio: .*{message}"):
        request_values(ROWS, failing(function, dtype))


def test_rows_without_an_input_column_are_refused_with_the_fix() -> None:
    with pytest.raises(DataError, match=r"no column 'amount_max_24h'.*Fix: add 'amount_max_24h' to the rows"):
        request_values(ROWS[["amount"]], ratio())
    since = fraud_features(row=False)[1]
    with pytest.raises(DataError, match=r"no column 'request_time'.*Fix: give request_time"):
        request_values(pd.DataFrame({"last_event": [pd.Timestamp("2026-01-01", tz="UTC")]}), since)


# ---------------------------------------------------------------------------------------------------------
# Inputs as every path hands them over (features.stores.request_inputs), and pickling


def test_request_features_are_asked_by_name_or_object_each_once(tmp_path) -> None:
    from features.stores.request_inputs import request_features_of, request_fields

    repo = Repo.load(repo_with(tmp_path, "amount_max_24h"))
    [named] = request_features_of(repo, "amount_vs_max_24h")
    assert request_features_of(repo, [named, "amount_vs_max_24h"]) == [named]
    with pytest.raises(ConfigError, match=r"request_features: 'nope' is no request-time feature .*Fix: name one of"):
        request_features_of(repo, ["nope"])
    other = RequestFeature("amount_vs_max_24h", lambda amount: amount, request={"amount": "double"}, dtype="double")
    with pytest.raises(ConfigError, match=r"two request-time features are named 'amount_vs_max_24h'. Fix: ask"):
        request_features_of(repo, [named, other])
    counted = RequestFeature("counted", lambda amount: amount, request={"amount": "int"}, dtype="int")
    with pytest.raises(ConfigError, match=r"the field 'amount' is float64 .* and int64 for 'counted'. Fix: declare"):
        request_fields([named, counted])


@pytest.mark.parametrize(
    ("values", "dtype", "want"),
    [
        ([1, 2.5, None], DType.FLOAT64, [1.0, 2.5, None]),
        ([1, 2.0, None], DType.INT64, [1, 2, None]),
        ([True, None], DType.BOOL, [True, None]),
        (["a", None], DType.STRING, ["a", None]),
        (
            ["2026-01-02T10:00:00Z", 1767261600, None],
            DType.TIMESTAMP,
            [pd.Timestamp("2026-01-02 10:00", tz="UTC"), pd.Timestamp("2026-01-01 10:00", tz="UTC"), None],
        ),
        ([["a", "b"], None], DType.STRING_LIST, [["a", "b"], None]),
    ],
)
def test_request_fields_come_in_their_declared_type(values, dtype, want) -> None:
    from features.stores.request_inputs import typed_request_field

    got = typed_request_field(pd.DataFrame({"f": pd.Series(values, dtype=object)}), "f", dtype).tolist()
    missing = [v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)) for v in got]
    assert [None if m else v for v, m in zip(got, missing, strict=True)] == want


@pytest.mark.parametrize(
    ("values", "dtype", "error", "fix"),
    [
        (["1.5"], DType.FLOAT64, "f.0: '1.5' is not a float64", "send a number for 'f'"),
        ([1, 2.5], DType.INT64, "f.1: 2.5 is not a int64", "send a whole number for 'f'"),
        ([True], DType.FLOAT64, "f.0: True is not a float64", "send a number for 'f'"),
        (["yes"], DType.BOOL, "f.0: 'yes' is not a bool", "send true or false for 'f'"),
        (["soon"], DType.TIMESTAMP, "f.0: 'soon' is not a timestamp", "send an ISO-8601 time"),
        ([[1, "x"]], DType.INT64_LIST, "f.0: [1, 'x'] is not a int64_list", "send a list of int64 values"),
    ],
)
def test_a_request_field_of_another_type_is_named_with_its_row_and_fix(values, dtype, error, fix) -> None:
    from features.errors import RequestFieldError
    from features.stores.request_inputs import typed_request_field

    with pytest.raises(RequestFieldError) as raised:
        typed_request_field(pd.DataFrame({"f": pd.Series(values, dtype=object)}), "f", dtype)
    assert str(raised.value).startswith(error) and fix in raised.value.fix
    with pytest.raises(RequestFieldError, match=r"^g: missing: a request-time feature reads this request field"):
        typed_request_field(pd.DataFrame({"f": [1]}), "g", DType.FLOAT64)


def test_a_repo_feature_pickles_by_value_and_unpickles_without_its_module(tmp_path) -> None:
    import pickle
    import sys

    repo = Repo.load(repo_with(tmp_path, "amount_max_24h"))
    feature = repo.request_features["amount_vs_max_24h"]
    data = pickle.dumps(feature)
    module = feature.function.__module__
    kept = sys.modules.pop(module)  # as where the repo's modules cannot be imported
    try:
        again = pickle.loads(data)
    finally:
        sys.modules[module] = kept
    assert again.name == feature.name and again.request == feature.request and again.features == feature.features
    assert request_values(ROWS, again).tolist() == [2.0, math.inf, 15.0]


def test_stored_inputs_are_filled_as_training_sets_fill_them_whatever_their_form() -> None:
    """fill_empty's empty-window values, for the forms the stores give: numpy floats with NaN, numpy integers,
    pandas' nullable integers, objects (JSON)."""
    from features.spec.aggregations import Empty
    from features.stores.feature_refs import FeatureColumn, fill_empty

    sums, counts = FeatureColumn("sum", DType.FLOAT64, Empty.ZERO), FeatureColumn("count", DType.INT64, Empty.ZERO)
    biggest = FeatureColumn("max", DType.FLOAT64, Empty.NULL)
    for given in (
        {"sum": [np.nan, 2.5], "count": [0, 3], "max": [np.nan, 4.0]},
        {"sum": [None, 2.5], "count": pd.array([None, 3], dtype="Int64"), "max": [None, 4.0]},
        {"sum": pd.Series([None, 2.5], dtype=object), "count": pd.Series([None, 3], dtype=object), "max": [None, 4.0]},
    ):
        filled = fill_empty(pd.DataFrame(given), [sums, counts, biggest])
        assert filled["sum"].tolist() == [0.0, 2.5] and filled["sum"].dtype == np.float64
        assert filled["count"].tolist() == [0, 3] and filled["count"].dtype == np.int64
        assert math.isnan(filled["max"].iloc[0]) and filled["max"].iloc[1] == 4.0


def test_python_values_give_the_functions_what_columns_give_them() -> None:
    """A list of Python values per column (the feature server's JSON, Feast's python-mode views) is put in the one
    form a frame's columns are put in: the function sees the same Series, whichever form the values came in."""
    from features.spec.aggregations import Empty
    from features.stores.feature_refs import FeatureColumn
    from features.stores.request_inputs import request_columns, request_columns_of_values

    seen: list[dict[str, pd.Series]] = []

    def look(amount, merchant, total, count, biggest, last, merchants, request_time):
        seen.append({name: column for name, column in locals().items() if name != "seen"})  # its parameters
        return amount

    refs = {"total": "g:total", "count": "g:count", "biggest": "g:biggest", "last": "g:last", "merchants": "g:m"}
    feature = RequestFeature(
        "look", look, request={"amount": "double", "merchant": "string"}, features=refs, dtype="double"
    )
    kinds = [DType.FLOAT64, DType.INT64, DType.INT64, DType.TIMESTAMP, DType.STRING_LIST]
    empties = [Empty.ZERO, Empty.ZERO, Empty.NULL, Empty.NULL, Empty.EMPTY_LIST]
    stored = {r: FeatureColumn(r, k, e) for r, k, e in zip(refs.values(), kinds, empties, strict=True)}
    last = datetime(2026, 1, 2, 10, 0, 0, 250_000, tzinfo=UTC)
    values = {
        "amount": [2.5, None, 4],
        "merchant": ["m1", None, "m2"],
        "g:total": [1.5, None, 2.0],
        "g:count": [3, None, 0],
        "g:biggest": [7, None, 2],
        "g:last": [last.timestamp(), None, last.timestamp() + 1],  # JSON's epoch seconds
        "g:m": [["m1"], None, []],
    }
    moment = datetime(2026, 1, 3, tzinfo=UTC)
    frame = pd.DataFrame(values | {"g:last": pd.Series([last, None, last + timedelta(seconds=1)])})
    request_columns(frame, [feature], stored, moment, frame.index)
    request_columns_of_values(values, [feature], stored, moment, 3)
    feast = values | {"g:last": [last, None, last + timedelta(seconds=1)]}  # Feast's datetimes
    request_columns_of_values(feast, [feature], stored, moment, 3)
    assert seen[1]["total"].tolist() == [1.5, 0.0, 2.0] and seen[1]["merchants"].tolist() == [["m1"], [], []]
    assert seen[1]["biggest"].dtype == "Int64" and seen[1]["last"].iloc[0] == last
    for given in seen[1:]:
        for name, column in seen[0].items():
            pd.testing.assert_series_equal(given[name], column, check_names=False)


def test_the_server_completes_feasts_answer_with_or_without_the_inputs_it_added(tmp_path) -> None:
    """`features serve` appends the request-time features to Feast's answer as Feast wrote it when the client asked
    for every input itself, and removes the inputs it added to the request otherwise: the same values either way."""
    from starlette.responses import JSONResponse

    from features.stores.serving_request_time import RequestTimeFeatures

    def feast_body(names: list[str], columns: list[list]) -> bytes:  # as Feast's app answers
        stamps = ["2026-01-01T00:00:00Z"] * 2
        results = [{"values": v, "statuses": ["PRESENT", "NOT_FOUND"], "event_timestamps": stamps} for v in columns]
        return JSONResponse({"results": results, "metadata": {"feature_names": names}}).body

    server = RequestTimeFeatures(repo_with(tmp_path, "amount_max_24h"))
    asked = {"entities": {"user_id": ["u1", "u2"]}, "request_features": ["amount_vs_max_24h"]}
    asked |= {"request": {"amount": [10.0, 3.0]}}
    answers = {}
    for features in (["users:amount_max_24h"], []):  # the input asked for, or added to what Feast is asked
        extended = server.prepare(asked | {"features": features})
        assert json.loads(extended.body)["features"] == ["users:amount_max_24h"]
        answer = extended.completed(feast_body(["user_id", "amount_max_24h"], [["u1", "u2"], [50.0, None]]))
        answers[len(features)] = json.loads(answer)
    kept, added = answers[1], answers[0]
    assert kept["metadata"]["feature_names"] == ["user_id", "amount_max_24h", "amount_vs_max_24h"]
    assert added["metadata"]["feature_names"] == ["user_id", "amount_vs_max_24h"]
    assert kept["results"][2] == added["results"][1]
    assert kept["results"][2]["values"] == [0.2, None]
    assert kept["results"][2]["statuses"] == ["PRESENT", "NULL_VALUE"]
