"""Definitions and pane arithmetic (unit tests: no Spark, no Feast).

Every invalid definition raises a `features` error whose message names the offending field and says how to
fix it; valid ones are immutable values with the documented meaning.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from features import (
    DefinitionError,
    Entity,
    EventSource,
    Feature,
    FeatureGroup,
    FeaturesError,
    Hop,
    KafkaTopic,
    Lifetime,
    SchemaError,
    Tumble,
    agg,
)
from features.kernel.panes import (
    MICROS,
    WindowShape,
    entry_end,
    exit_end,
    floor_to,
    lookback_us,
    pane_length_us,
    shapes,
    window_end,
    window_interval,
)
from features.spec import AggKind, Aggregation, DType, Session
from features.spec.fingerprint import definition_hash

MINUTE = 60 * MICROS
HOUR = 60 * MINUTE

SCHEMA = {
    "txn_id": DType.STRING,
    "user_id": DType.STRING,
    "merchant_id": DType.STRING,
    "amount": DType.FLOAT64,
    "quantity": DType.INT64,
    "status": DType.STRING,
    "approved": DType.BOOL,
    "event_ts": DType.TIMESTAMP,
}

user = Entity("user", join_keys=["user_id"])
transactions = EventSource(name="transactions", path="data/transactions", timestamp="event_ts")


def group_of(*features: Feature, entity: Entity = user, source: EventSource = transactions) -> FeatureGroup:
    return FeatureGroup(name="g", entity=entity, source=source, features=list(features))


def count_24h(name: str = "txn_count_24h") -> Feature:
    return Feature(name, agg.count(), window=Hop("24h", every="5m"))


def expect_error(build, field: str, fix: str, error: type[FeaturesError] = DefinitionError) -> DefinitionError:
    """`build()` raises `error`, whose message names `field` and, after "Fix:", says `fix`."""
    with pytest.raises(error) as info:
        build()
    exc = info.value
    message = str(exc)
    assert isinstance(exc, FeaturesError)
    assert field in exc.field, f"field {exc.field!r} does not name {field!r}"
    assert message.startswith(exc.field + ":"), message
    assert "Fix:" in message, message
    assert fix in message.split("Fix:", 1)[1], f"the fix in {message!r} does not say {fix!r}"
    return exc


# --- errors ---------------------------------------------------------------------------------------------------


def test_error_hierarchy():
    assert issubclass(DefinitionError, FeaturesError)
    assert issubclass(DefinitionError, ValueError)  # plain `except ValueError` still catches definitions
    assert issubclass(SchemaError, DefinitionError)


@pytest.mark.parametrize("size", ["24x", "24", "h", "1.5h", "-1h", "24 hours", "1h30m", ""])
def test_unreadable_duration(size):
    exc = expect_error(lambda: Hop(size, every="5m"), "Hop.size", '"24h"')
    assert repr(size) in str(exc)


def test_unknown_unit_names_the_every_field():
    expect_error(lambda: Hop("1h", every="5w"), "Hop.every", "s, m, h, d")
    expect_error(lambda: Lifetime(every="1y"), "Lifetime.every", "s, m, h, d")
    expect_error(lambda: Tumble("1 week"), "Hop.size", "s, m, h, d")


@pytest.mark.parametrize("zero", ["0s", "0m", "0h", "0d", timedelta(0)])
def test_zero_duration(zero):
    expect_error(lambda: Hop("1h", every=zero), "Hop.every", "positive")
    expect_error(lambda: Lifetime(every=zero), "Lifetime.every", "positive")


@pytest.mark.parametrize("bad", [timedelta(seconds=1.5), timedelta(milliseconds=1), timedelta(minutes=-5)])
def test_bad_timedelta(bad):
    expect_error(lambda: Hop(bad, every="1s"), "Hop.size", "whole seconds")


@pytest.mark.parametrize("bad", [300, 5.0, None, ["5m"]])
def test_duration_of_wrong_type(bad):
    expect_error(lambda: Hop("1h", every=bad), "Hop.every", 'e.g. "5m"')


def test_watermark_duration_is_validated():
    expect_error(
        lambda: EventSource("s", path="p", timestamp="ts", watermark="10 minutes"), "EventSource('s').watermark", "m"
    )


@pytest.mark.parametrize(("size", "every"), [("1h", "7m"), ("90m", "1h"), ("1m", "5m"), ("25h", "1d")])
def test_size_not_a_multiple_of_every(size, every):
    exc = expect_error(lambda: Hop(size, every=every), "Hop.size", "multiple of")
    assert f"every={every}" in str(exc)
    assert f'every="{every}"' in str(exc)  # the suggested fix is a valid Hop


def test_duplicate_feature_name():
    exc = expect_error(lambda: group_of(count_24h("n"), count_24h("n")), "FeatureGroup('g').features", "own name")
    assert "'n'" in str(exc)


@pytest.mark.parametrize(
    "build",
    [
        lambda: Entity("", join_keys=["user_id"]),
        lambda: Entity("user", join_keys=[""]),
        lambda: EventSource("", path="p", timestamp="ts"),
        lambda: EventSource("s", path="p", timestamp=""),
        lambda: Feature("", agg.count(), window=Tumble("1h")),
        lambda: FeatureGroup("", entity=user, source=transactions, features=[count_24h()]),
    ],
    ids=["entity", "join_key", "source", "timestamp", "feature", "group"],
)
def test_empty_names(build):
    exc = expect_error(build, "", "letters, digits and _")
    assert "empty" in str(exc)


@pytest.mark.parametrize("name", ["amount sum", "1h_count", "amount-sum", "montant€", "a.b", " user"])
def test_invalid_names(name):
    expect_error(lambda: Feature(name, agg.count(), window=Tumble("1h")), "Feature.name", "letters, digits and _")
    expect_error(lambda: Entity(name, join_keys=["user_id"]), "Entity.name", "letters, digits and _")
    expect_error(lambda: Entity("user", join_keys=[name]), "Entity('user').join_keys", "letters, digits and _")
    expect_error(lambda: EventSource(name, path="p", timestamp="ts"), "EventSource.name", "letters, digits and _")
    expect_error(
        lambda: FeatureGroup(name, entity=user, source=transactions, features=[count_24h()]),
        "FeatureGroup.name",
        "letters, digits and _",
    )


def test_feature_name_clashing_with_a_join_key():
    exc = expect_error(lambda: group_of(count_24h("user_id")), "Feature('user_id').name", "rename the feature")
    assert "join key" in exc.problem


# Each name breaks something when a feature has it: this package's tables (window_end, date), Feast's
# get_historical_features (event_timestamp and entity_row_id duplicated, rn overwritten, *_y dropped by its
# point-in-time join), the engines' and training sets' working columns (fx_*, __features_*).
@pytest.mark.parametrize(
    "name, why",
    [
        ("window_end", "the time of each change point"),
        ("date", "partition column"),
        ("event_timestamp", "lookup time of Feast's entity rows"),
        ("entity_row_id", "row id Feast's point-in-time join adds"),
        ("rn", "rank Feast's point-in-time join gives"),
        ("amount_y", "ends with '_y'"),
        ("fx_latest", "starts with 'fx_'"),
        ("__features_row", "starts with '__features_'"),
    ],
)
def test_feature_named_like_a_reserved_column(name, why):
    exc = expect_error(lambda: group_of(count_24h(name)), f"Feature({name!r}).name", "rename the feature")
    assert repr(name) in exc.problem and why in exc.problem, exc.problem
    assert "event_timestamp" in exc.fix and "window_end" in exc.fix and "_y" in exc.fix  # every reserved name


@pytest.mark.parametrize("name", ["window_end", "date", "event_timestamp", "entity_row_id", "fx_key", "__features_row"])
def test_join_key_named_like_a_reserved_column(name):
    exc = expect_error(lambda: Entity("user", join_keys=["account", name]), "Entity('user').join_keys", "rename")
    assert repr(name) in exc.problem and "event_timestamp" in exc.fix


@pytest.mark.parametrize("name", ["rn", "user_y", "created", "timestamp", "event_ts", "dates", "fx", "_features_x"])
def test_names_near_the_reserved_ones_are_fine(name):
    """A join key may be `rn` or end with `_y` (Feast takes the keys from the entity rows); the rest are free."""
    assert Entity("user", join_keys=[name]).join_keys == (name,)
    if name not in ("rn", "user_y"):
        assert group_of(count_24h(name)).features[0].name == name


def test_feature_name_clashing_with_a_composite_key():
    card_merchant = Entity("card_merchant", join_keys=["card_id", "merchant_id"])
    expect_error(lambda: group_of(count_24h("merchant_id"), entity=card_merchant), "Feature('merchant_id')", "rename")


@pytest.mark.parametrize("keys", [[], (), "user_id", None])
def test_empty_join_keys(keys):
    expect_error(lambda: Entity("user", join_keys=keys), "Entity('user').join_keys", 'join_keys=["user_id"]')


def test_duplicate_join_key():
    expect_error(lambda: Entity("pair", join_keys=["a", "b", "a"]), "Entity('pair').join_keys", "each column once")


@pytest.mark.parametrize("fmt", ["csv", "PARQUET", "delta", ""])
def test_unknown_format(fmt):
    exc = expect_error(lambda: EventSource("s", path="p", timestamp="ts", format=fmt), "EventSource('s').format", "")
    assert "parquet, json" in str(exc)


@pytest.mark.parametrize("path", ["", "   ", None])
def test_empty_path(path):
    expect_error(lambda: EventSource("s", path=path, timestamp="ts"), "EventSource('s').path", "folder")


KAFKA_SCHEMA = {"user_id": "string", "ts": "timestamp"}


def test_a_kafka_topic_streams_what_the_folder_holds():
    topic = KafkaTopic("clicks", "broker-1:9092, broker-2:9092", options={"startingOffsets": "earliest"})
    source = EventSource("clicks", path="data/clicks", timestamp="ts", schema=KAFKA_SCHEMA, kafka=topic)
    assert source.kafka is topic and topic.bootstrap_servers == "broker-1:9092,broker-2:9092"
    assert (topic.value_format, topic.event_time, topic.archive) == ("json", "value", False)
    assert dict(topic.options) == {"startingOffsets": "earliest"}
    assert hash(source) != hash(EventSource("clicks", path="data/clicks", timestamp="ts", schema=KAFKA_SCHEMA))


def test_the_record_time_needs_no_timestamp_field_in_the_values():
    topic = KafkaTopic("clicks", "localhost:9092", event_time="record")
    source = EventSource("clicks", path="data/clicks", timestamp="ts", schema={"user_id": "string"}, kafka=topic)
    assert dict(source.schema or {}) == {"ts": DType.TIMESTAMP, "user_id": DType.STRING}


@pytest.mark.parametrize(
    ("make", "field", "fix"),
    [
        (lambda: KafkaTopic("", "h:9092"), "KafkaTopic('').topic", "249 letters"),
        (lambda: KafkaTopic("a topic", "h:9092"), "KafkaTopic('a topic').topic", "249 letters"),
        (lambda: KafkaTopic("t", "localhost"), "KafkaTopic('t').bootstrap_servers", "host:9092"),
        (lambda: KafkaTopic("t", "h:9092", value_format="xml"), "KafkaTopic('t').value_format", "json"),
        (lambda: KafkaTopic("t", "h:9092", event_time="now"), "KafkaTopic('t').event_time", '"record"'),
        (
            lambda: KafkaTopic("t", "h:9092", options={"subscribe": "u"}),
            "KafkaTopic('t').options['subscribe']",
            "remove",
        ),
        (
            lambda: KafkaTopic("t", "h:9092", options={"kafka.bootstrap.servers": "x:1"}),
            "KafkaTopic('t').options['kafka.bootstrap.servers']",
            "remove",
        ),
        (
            lambda: EventSource("s", path="p", timestamp="ts", format="kafka"),
            "EventSource('s').format",
            "kafka=KafkaTopic(",
        ),
        (
            lambda: EventSource("s", path="p", timestamp="ts", kafka=KafkaTopic("t", "h:9092")),
            "EventSource('s').schema",
            "schema=",
        ),
        (
            lambda: EventSource("s", path="", timestamp="ts", schema=KAFKA_SCHEMA, kafka=KafkaTopic("t", "h:9092")),
            "EventSource('s').path",
            "folder",
        ),
        (
            lambda: EventSource(
                "s",
                path="p",
                timestamp="ts",
                format="json",
                schema=KAFKA_SCHEMA,
                kafka=KafkaTopic("t", "h:1", archive=True),
            ),
            "EventSource('s').kafka",
            'format="parquet"',
        ),
        (lambda: EventSource("s", path="p", timestamp="ts", kafka="t"), "EventSource('s').kafka", "KafkaTopic("),
    ],
)
def test_kafka_mistakes_name_the_field_and_the_fix(make, field, fix):
    expect_error(make, field, fix)


def test_schema_with_unknown_type():
    exc = expect_error(
        lambda: EventSource("s", path="p", timestamp="ts", schema={"ts": "timestamp", "price": "decimal(10,2)"}),
        "EventSource('s').schema['price']",
        "double",
    )
    assert "'decimal(10,2)'" in str(exc)


@pytest.mark.parametrize("schema", [{"amount": "double"}, {"ts": "string", "amount": "double"}])
def test_schema_without_a_timestamp_type_for_the_timestamp(schema):
    expect_error(
        lambda: EventSource("s", path="p", timestamp="ts", schema=schema),
        "EventSource('s').schema",
        '"ts": "timestamp"',
    )


def test_schema_with_invalid_column_name():
    expect_error(
        lambda: EventSource("s", path="p", timestamp="ts", schema={"ts": "timestamp", "my col": "int"}),
        "EventSource('s').schema",
        "letters, digits and _",
    )


def test_count_takes_no_column():
    expect_error(lambda: Aggregation(AggKind.COUNT, "amount"), "agg.count.column", "where=")


@pytest.mark.parametrize("make", [agg.sum, agg.avg, agg.min, agg.max, agg.stddev, agg.first, agg.last])
@pytest.mark.parametrize("column", ["", "  ", None])
def test_empty_column(make, column):
    expect_error(lambda: make(column), ".column", '("amount")')


def test_empty_column_of_sketches_and_lists():
    expect_error(lambda: agg.approx_count_distinct(""), "agg.approx_count_distinct.column", "source column")
    expect_error(lambda: agg.approx_percentile("", 0.5), "agg.approx_percentile.column", "source column")
    expect_error(lambda: agg.last_k("", 3), "agg.last_k.column", "source column")


@pytest.mark.parametrize("q", [-0.01, 1.01, 95, True, "0.5", None, float("nan")])
def test_bad_quantile(q):
    expect_error(lambda: agg.approx_percentile("amount", q), "agg.approx_percentile.q", "from 0 to 1")


@pytest.mark.parametrize("q", [0, 0.0, 0.5, 0.99, 1])
def test_good_quantile(q):
    assert agg.approx_percentile("amount", q).quantile == q


@pytest.mark.parametrize("k", [0, -1, 1001, 2.5, True, "5", None])
def test_bad_k(k):
    expect_error(lambda: agg.last_k("amount", k), "agg.last_k.k", "1 to 1000")


NUMERIC_FIX = "aggregate a numeric column"
ORDERED_FIX = "aggregate a number or string column"
SCALAR_FIX = "aggregate a number, string or boolean column"
DISCRETE_FIX = "aggregate an integer or string column"


@pytest.mark.parametrize(
    ("aggregation", "column_type", "fix"),
    [
        (agg.sum("status"), "string", NUMERIC_FIX),
        (agg.avg("approved"), "bool", NUMERIC_FIX),
        (agg.stddev("merchant_id"), "string", NUMERIC_FIX),
        (agg.variance("status"), "string", NUMERIC_FIX),
        (agg.skew("approved"), "bool", NUMERIC_FIX),
        (agg.kurtosis("merchant_id"), "string", NUMERIC_FIX),
        (agg.approx_percentile("status", 0.5), "string", NUMERIC_FIX),
        (agg.max("approved"), "bool", ORDERED_FIX),
        (agg.min("event_ts"), "timestamp", ORDERED_FIX),
        (agg.top_k("approved", 3), "bool", ORDERED_FIX),
        (agg.bottom_k("event_ts", 3), "timestamp", ORDERED_FIX),
        (agg.last("event_ts"), "timestamp", SCALAR_FIX),
        (agg.approx_count_distinct("event_ts"), "timestamp", SCALAR_FIX),
        (agg.last_k("event_ts", 3), "timestamp", SCALAR_FIX),
        (agg.first_k("event_ts", 3), "timestamp", SCALAR_FIX),
        (agg.bounded_count_distinct("event_ts", 3), "timestamp", SCALAR_FIX),
        (agg.histogram("amount"), "float64", DISCRETE_FIX),
        (agg.top_frequent("approved", 3), "bool", DISCRETE_FIX),
        (agg.distinct_values("amount"), "float64", DISCRETE_FIX),  # a set of floats: no exact membership
        (agg.distinct_values("event_ts"), "timestamp", DISCRETE_FIX),
    ],
    ids=lambda v: v.describe() if isinstance(v, Aggregation) else v,
)
def test_wrong_input_type(aggregation, column_type, fix):
    group = group_of(Feature("f", aggregation, window=Hop("1h", every="5m")))
    exc = expect_error(lambda: group.check_schema(SCHEMA), "Feature('f').aggregation", fix)
    assert f"of type {column_type}" in str(exc)
    with pytest.raises(DefinitionError):
        group.output_types(SCHEMA)


@pytest.mark.parametrize(
    ("build", "field", "fix"),
    [
        (lambda: agg.top_k("amount", 0), "agg.top_k.k", "1 to 1000"),
        (lambda: agg.bottom_k("amount", -2), "agg.bottom_k.k", "1 to 1000"),
        (lambda: agg.first_k("amount", 1001), "agg.first_k.k", "1 to 1000"),
        (lambda: agg.top_frequent("status", True), "agg.top_frequent.k", "1 to 1000"),
        (lambda: agg.bounded_count_distinct("status", 2.5), "agg.bounded_count_distinct.k", "1 to 1000000"),
        (lambda: agg.histogram(""), "agg.histogram.column", "source column"),
        (lambda: agg.variance(" "), "agg.variance.column", "source column"),
    ],
)
def test_invalid_parameters_of_the_newer_aggregations(build, field, fix):
    expect_error(build, field, fix)


def test_session_windows_and_their_errors():
    window = Session("30m", every="5m")
    assert (window.gap_s, window.every_s, window.size_s) == (1800, 300, None)
    assert window.is_session and not window.is_lifetime and repr(window) == "Session('30m', every='5m')"
    assert Session("2m").every_s == 60  # every defaults to one minute
    expect_error(lambda: Session("7m", every="5m"), "Session.gap", 'Session("5m", every="5m")')
    expect_error(lambda: Session("0m"), "Session.gap", "")
    expect_error(
        lambda: Feature("d", agg.session_duration(), window=Hop("1h", every="5m")),
        "Feature('d').window",
        'window=Session("30m", every="1m")',
    )
    expect_error(lambda: Aggregation(AggKind.SESSION_START, "event_ts"), "agg.session_start.column", "where=")
    group = group_of(Feature("s", agg.session_start(), window=window), Feature("n", agg.count(), window=window))
    assert group.output_types(SCHEMA)["s"] is DType.TIMESTAMP
    # A session's gap decides its values: a changed gap is a changed definition.
    other = group_of(
        Feature("s", agg.session_start(), window=Session("20m", every="5m")), Feature("n", agg.count(), window=window)
    )
    assert definition_hash(group) != definition_hash(other)


def test_output_types_of_the_newer_aggregations():
    features = [
        Feature("var", agg.variance("quantity"), window=Hop("1h", every="5m")),
        Feature("sk", agg.skew("amount"), window=Hop("1h", every="5m")),
        Feature("ku", agg.kurtosis("amount"), window=Hop("1h", every="5m")),
        Feature("fk", agg.first_k("status", 2), window=Hop("1h", every="5m")),
        Feature("tk", agg.top_k("quantity", 2), window=Hop("1h", every="5m")),
        Feature("bk", agg.bottom_k("amount", 2), window=Hop("1h", every="5m")),
        Feature("h", agg.histogram("status"), window=Hop("1h", every="5m")),
        Feature("tf", agg.top_frequent("quantity", 2), window=Hop("1h", every="5m")),
        Feature("bcd", agg.bounded_count_distinct("status", 5), window=Hop("1h", every="5m")),
        Feature("seen", agg.last_event_time(), window=Hop("1h", every="5m")),
        Feature("ds", agg.distinct_values("status"), window=Hop("1h", every="5m")),
        Feature("dq", agg.distinct_values("quantity"), window=Hop("1h", every="5m")),
    ]
    types = group_of(*features).output_types(SCHEMA)
    assert {f.name: types[f.name] for f in features} == {
        "var": DType.FLOAT64,
        "sk": DType.FLOAT64,
        "ku": DType.FLOAT64,
        "fk": DType.STRING_LIST,
        "tk": DType.INT64_LIST,
        "bk": DType.FLOAT64_LIST,
        "h": DType.COUNT_MAP,
        "tf": DType.COUNT_MAP,
        "bcd": DType.INT64,
        "seen": DType.TIMESTAMP,
        "ds": DType.STRING_LIST,
        "dq": DType.INT64_LIST,
    }


def test_last_event_time_reads_no_column_and_distinct_values_one():
    expect_error(lambda: Aggregation(AggKind.LAST_EVENT_TIME, "event_ts"), "agg.last_event_time.column", "where=")
    expect_error(lambda: agg.distinct_values(""), "agg.distinct_values.column", 'agg.distinct_values("amount")')
    assert agg.last_event_time().empty_value is None
    assert agg.distinct_values("status").empty_value == [] and agg.distinct_values("status").describe() == (
        "agg.distinct_values('status')"
    )
    assert agg.distinct_values("status").empty_value is not agg.distinct_values("status").empty_value  # fresh


def test_a_column_the_source_does_not_have():
    group = group_of(Feature("total", agg.sum("amount_usd"), window=Hop("1h", every="5m")))
    exc = expect_error(
        lambda: group.check_schema(SCHEMA), "Feature('total').aggregation.column", "source's columns", SchemaError
    )
    assert "'amount_usd'" in str(exc) and "amount, approved" in str(exc)  # lists what there is


def test_a_join_key_the_source_does_not_have():
    group = group_of(count_24h(), entity=Entity("card", join_keys=["card_id"]))
    expect_error(lambda: group.check_schema(SCHEMA), "FeatureGroup('g').entity.join_keys", "columns", SchemaError)


def test_a_timestamp_the_source_does_not_have_or_that_is_no_timestamp():
    missing = group_of(count_24h(), source=EventSource("s", path="p", timestamp="created_at"))
    expect_error(lambda: missing.check_schema(SCHEMA), "EventSource('s').timestamp", "columns", SchemaError)
    wrong = group_of(count_24h(), source=EventSource("s", path="p", timestamp="txn_id"))
    expect_error(lambda: wrong.check_schema(SCHEMA), "EventSource('s').timestamp", "timestamp column", SchemaError)


@pytest.mark.parametrize("item", ["count_24h", agg.count(), Hop("1h", every="5m"), None])
def test_not_a_feature_in_features(item):
    expect_error(lambda: group_of(count_24h(), item), "FeatureGroup('g').features", "Feature(...)")


@pytest.mark.parametrize("features", [[], ()])
def test_no_features(features):
    expect_error(
        lambda: FeatureGroup("g", entity=user, source=transactions, features=features),
        "FeatureGroup('g').features",
        "at least one Feature",
    )


def test_feature_parts_of_the_wrong_kind():
    expect_error(lambda: Feature("f", "count", window=Tumble("1h")), "Feature('f').aggregation", "features.agg")
    expect_error(lambda: Feature("f", agg.count(), window="1h"), "Feature('f').window", 'Hop("24h", every="5m")')
    expect_error(lambda: Feature("f", agg.count(), window=Tumble("1h"), where="  "), "Feature('f').where", "leave")
    expect_error(
        lambda: FeatureGroup("g", entity="user", source=transactions, features=[count_24h()]),
        "FeatureGroup('g').entity",
        "Entity(",
    )
    expect_error(
        lambda: FeatureGroup("g", entity=user, source="data/transactions", features=[count_24h()]),
        "FeatureGroup('g').source",
        "EventSource",
    )


def test_unknown_feature_lookup():
    expect_error(lambda: group_of(count_24h()).feature("nope"), "FeatureGroup('g')", "txn_count_24h")


# --- valid definitions --------------------------------------------------------------------------------------


def test_the_design_example_builds():
    group = FeatureGroup(
        name="user_transactions",
        entity=user,
        source=EventSource(
            name="transactions", path="data/transactions", format="parquet", timestamp="event_ts", watermark="10m"
        ),
        features=[
            Feature("failed_count_24h", agg.count(), window=Hop("24h", every="5m"), where="status = 'FAILED'"),
            Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
            Feature("amount_max_24h", agg.max("amount"), window=Hop("24h", every="5m")),
            Feature("merchants_24h", agg.approx_count_distinct("merchant_id"), window=Hop("24h", every="1h")),
            Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="1h")),
        ],
    )
    assert [f.name for f in group.features] == [
        "failed_count_24h",
        "amount_sum_1h",
        "amount_max_24h",
        "merchants_24h",
        "txn_count_lifetime",
    ]
    assert group.join_keys == ("user_id",)
    assert group.source.watermark_s == 600
    assert group.feature("amount_sum_1h").aggregation == agg.sum("amount")


def test_tumble_is_hop_of_size_size():
    assert Tumble("1h") == Hop("1h", every="1h") == Hop("60m", every="3600s")
    assert hash(Tumble("1h")) == hash(Hop("1h", every="1h"))
    assert Tumble("1d").panes == 1
    assert repr(Tumble("90m")) == "Hop('90m', every='90m')"


def test_hop_fields():
    window = Hop("24h", every="5m")
    assert (window.size_s, window.every_s, window.panes, window.is_lifetime) == (86_400, 300, 288, False)
    assert window.describe() == "Hop('1d', every='5m')"
    assert Hop("90s", every="30s").size_s == 90
    assert Hop(" 7d ", every="1d").size_s == 7 * 86_400


def test_lifetime():
    window = Lifetime(every="1h")
    assert window.is_lifetime and window.size_s is None and window.panes is None
    assert window.every_s == 3600
    assert window == Lifetime(every="60m") and window != Hop("1h", every="1h")
    assert repr(window) == "Lifetime(every='1h')"


def test_timedelta_durations():
    assert Hop(timedelta(hours=24), every=timedelta(minutes=5)) == Hop("24h", every="5m")
    assert Hop(timedelta(days=1), every="1h") == Hop("24h", every=timedelta(seconds=3600))
    assert Lifetime(every=timedelta(seconds=90)).every_s == 90
    assert EventSource("s", path="p", timestamp="ts", watermark=timedelta(minutes=2)).watermark_s == 120


@pytest.mark.parametrize(
    ("obj", "attribute", "value"),
    [
        (user, "name", "other"),
        (user, "join_keys", ("x",)),
        (transactions, "path", "elsewhere"),
        (count_24h(), "name", "other"),
        (count_24h(), "window", Tumble("1h")),
        (agg.sum("amount"), "column", "other"),
        (Hop("1h", every="5m"), "size_s", 60),
        (Lifetime(every="1h"), "every_s", 60),
        (group_of(count_24h()), "features", ()),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str | tuple | int) else None,
)
def test_definitions_are_frozen(obj, attribute, value):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, attribute, value)


def test_collections_inside_definitions_are_immutable():
    source = EventSource("s", path="p", timestamp="ts", schema={"ts": "timestamp"}, options={"a": "b"})
    with pytest.raises(TypeError):
        source.schema["x"] = DType.INT64  # type: ignore[index]
    with pytest.raises(TypeError):
        source.options["a"] = "c"  # type: ignore[index]
    keys = ["user_id"]
    entity = Entity("user", join_keys=keys)
    keys.append("other")  # the caller's list is copied
    assert entity.join_keys == ("user_id",)
    features = [count_24h()]
    group = group_of(*features)
    assert isinstance(group.features, tuple)


def test_declared_schema_types_are_normalized():
    source = EventSource(
        "s", path="p", timestamp="ts", schema={"ts": "TIMESTAMP", "n": "bigint", "x": "Double", "ok": "boolean"}
    )
    assert dict(source.schema) == {"ts": DType.TIMESTAMP, "n": DType.INT64, "x": DType.FLOAT64, "ok": DType.BOOL}


def test_equal_definitions_are_equal():
    assert count_24h() == count_24h()
    assert Entity("user", join_keys=["user_id"]) == user
    assert group_of(count_24h()) == group_of(count_24h())
    assert agg.last_k("amount", 5) != agg.last_k("amount", 6)


def test_output_types():
    group = group_of(
        Feature("n", agg.count(), window=Hop("1h", every="5m")),
        Feature("sum_f", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("sum_i", agg.sum("quantity"), window=Hop("1h", every="5m")),
        Feature("avg_i", agg.avg("quantity"), window=Hop("1h", every="5m")),
        Feature("min_s", agg.min("status"), window=Hop("1h", every="5m")),
        Feature("max_i", agg.max("quantity"), window=Hop("1h", every="5m")),
        Feature("sd", agg.stddev("amount"), window=Hop("1h", every="5m")),
        Feature("first_b", agg.first("approved"), window=Hop("1h", every="5m")),
        Feature("last_s", agg.last("status"), window=Lifetime(every="5m")),
        Feature("distinct", agg.approx_count_distinct("merchant_id"), window=Hop("24h", every="1h")),
        Feature("p95", agg.approx_percentile("quantity", 0.95), window=Hop("24h", every="1h")),
        Feature("last5_f", agg.last_k("amount", 5), window=Hop("24h", every="5m")),
        Feature("last5_s", agg.last_k("status", 5), window=Hop("24h", every="5m")),
        Feature("last5_i", agg.last_k("quantity", 5), window=Hop("24h", every="5m")),
        Feature("last5_b", agg.last_k("approved", 5), window=Hop("24h", every="5m")),
    )
    assert group.output_types(SCHEMA) == {
        "user_id": DType.STRING,
        "n": DType.INT64,
        "sum_f": DType.FLOAT64,
        "sum_i": DType.INT64,
        "avg_i": DType.FLOAT64,
        "min_s": DType.STRING,
        "max_i": DType.INT64,
        "sd": DType.FLOAT64,
        "first_b": DType.BOOL,
        "last_s": DType.STRING,
        "distinct": DType.INT64,
        "p95": DType.FLOAT64,
        "last5_f": DType.FLOAT64_LIST,
        "last5_s": DType.STRING_LIST,
        "last5_i": DType.INT64_LIST,
        "last5_b": DType.BOOL_LIST,
    }
    assert next(iter(group.output_types(SCHEMA))) == "user_id"  # join keys come first


def test_composite_key_output_types():
    card_merchant = Entity("card_merchant", join_keys=["txn_id", "merchant_id"])
    group = group_of(count_24h(), entity=card_merchant)
    assert list(group.output_types(SCHEMA)) == ["txn_id", "merchant_id", "txn_count_24h"]


def test_empty_window_values():
    zero = {
        AggKind.COUNT,
        AggKind.SUM,
        AggKind.APPROX_COUNT_DISTINCT,
        AggKind.COUNT_DISTINCT,
        AggKind.BOUNDED_COUNT_DISTINCT,
    }
    assert {kind for kind in AggKind if kind.empty_is_zero} == zero
    assert agg.histogram("status").empty_value == {} and agg.top_frequent("status", 2).empty_value == {}
    assert agg.histogram("status").empty_value is not agg.histogram("status").empty_value  # never shared
    assert agg.top_k("amount", 2).empty_value is None


def test_definitions_import_no_engines():
    code = (
        "import sys, features; from features import agg, Hop; agg.count(); Hop('1h', every='5m'); "
        "heavy = [m for m in ('pyspark', 'feast', 'mlflow', 'great_expectations') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


# --- pane arithmetic ----------------------------------------------------------------------------------------


def us(text: str) -> int:
    t = datetime.fromisoformat(text).replace(tzinfo=UTC)
    return int(t.timestamp()) * MICROS + t.microsecond


def test_floor_to_at_boundaries():
    assert floor_to(0, 5 * MINUTE) == 0
    assert floor_to(5 * MINUTE, 5 * MINUTE) == 5 * MINUTE  # a boundary is its own floor
    assert floor_to(5 * MINUTE - 1, 5 * MINUTE) == 0
    assert floor_to(5 * MINUTE + 1, 5 * MINUTE) == 5 * MINUTE


def test_floor_to_before_1970_is_a_true_floor():
    assert floor_to(-1, 5 * MINUTE) == -5 * MINUTE  # not 0, as truncation toward zero would give
    assert floor_to(-5 * MINUTE, 5 * MINUTE) == -5 * MINUTE
    assert floor_to(-5 * MINUTE - 1, 5 * MINUTE) == -10 * MINUTE
    assert floor_to(us("1969-12-31T23:57:30"), 5 * MINUTE) == us("1969-12-31T23:55:00")
    assert floor_to(us("1969-07-20T20:17:40"), HOUR) == us("1969-07-20T20:00:00")


def test_window_end_is_epoch_aligned():
    assert window_end(us("2026-01-01T10:07:59.999999"), 5 * MINUTE) == us("2026-01-01T10:05:00")
    assert window_end(us("2026-01-01T10:10:00"), 5 * MINUTE) == us("2026-01-01T10:10:00")
    assert window_end(us("2026-01-01T10:59:00"), 24 * HOUR) == us("2026-01-01T00:00:00")


def test_window_interval_is_half_open():
    hop = Hop("1h", every="5m")
    e = us("2026-01-01T10:05:00")
    assert window_interval(e, hop) == (e - HOUR, e)  # at t = E: the window [E - size, E)
    assert window_interval(e + 5 * MINUTE - 1, hop) == (e - HOUR, e)  # the same value until the next end
    assert window_interval(e - 1, hop) == (e - HOUR - 5 * MINUTE, e - 5 * MINUTE)


def test_window_interval_of_lifetime_is_unbounded():
    assert window_interval(us("2026-01-01T10:31:00"), Lifetime(every="1h")) == (None, us("2026-01-01T10:00:00"))


def test_window_interval_before_1970():
    assert window_interval(-1, Tumble("1h")) == (-2 * HOUR, -HOUR)


def test_entry_and_exit_ends():
    p = us("2026-01-01T10:00:00")
    assert entry_end(p, 5 * MINUTE) == p + 5 * MINUTE
    assert exit_end(p, HOUR, 5 * MINUTE) == p + HOUR + 5 * MINUTE


def test_change_points_of_a_hop():
    shape = WindowShape.of(Hop("1h", every="5m"))
    assert shape == WindowShape(HOUR, 5 * MINUTE)
    p = us("2026-01-01T10:05:00")
    assert shape.change_points(p) == (p + 5 * MINUTE, p + HOUR + 5 * MINUTE)


def test_change_points_of_a_finer_pane():
    # A group with Hop("1h", every="5m") and Tumble("1m") has 1-minute panes; a pane at 10:07 changes the
    # 5-minute feature where its 5-minute pane (10:05) enters and leaves.
    shape = WindowShape.of(Hop("1h", every="5m"))
    assert shape.change_points(us("2026-01-01T10:07:00")) == (us("2026-01-01T10:10:00"), us("2026-01-01T11:10:00"))


def test_change_points_of_lifetime():
    shape = WindowShape.of(Lifetime(every="1h"))
    assert shape == WindowShape(None, HOUR)
    assert shape.change_points(us("2026-01-01T10:30:00")) == (us("2026-01-01T11:00:00"),)


def test_change_points_before_1970():
    shape = WindowShape.of(Tumble("1h"))
    assert shape.change_points(-1) == (0, HOUR)


@pytest.mark.parametrize(("size_m", "every_m", "pane_m"), [(60, 5, 5), (60, 5, 1), (15, 15, 5), (30, 10, 2)])
def test_change_points_are_exactly_where_membership_changes(size_m, every_m, pane_m):
    """Brute force: a pane is inside the window ending at E iff entry <= E < exit; nowhere else does it change."""
    shape = WindowShape.of(Hop(f"{size_m}m", every=f"{every_m}m"))
    every = every_m * MINUTE
    for pane in range(-3 * HOUR, 3 * HOUR, pane_m * MINUTE):
        enter, leave = shape.change_points(pane)
        for end in range(-5 * HOUR, 5 * HOUR + 1, every):
            lo, hi = window_interval(end, Hop(f"{size_m}m", every=f"{every_m}m"))
            inside = lo <= pane and pane + pane_m * MINUTE <= hi  # the whole pane, as every event in it
            assert inside == (enter <= end < leave), (pane, end)


def test_pane_length_is_the_gcd_of_every():
    assert pane_length_us([Hop("24h", every="5m"), Hop("24h", every="1h"), Lifetime(every="1h")]) == 5 * MINUTE
    assert pane_length_us([Hop("1h", every="90s"), Tumble("1m")]) == 30 * MICROS
    assert pane_length_us([Lifetime(every="1d")]) == 24 * HOUR


def test_lookback_is_the_longest_window():
    group = group_of(
        Feature("a", agg.count(), window=Hop("1h", every="5m")),
        Feature("b", agg.count(), window=Hop("2d", every="1h")),
        Feature("c", agg.count(), window=Tumble("90m")),
    )
    assert lookback_us(group) == 48 * HOUR


def test_lookback_of_lifetime_is_unbounded():
    group = group_of(count_24h(), Feature("all", agg.count(), window=Lifetime(every="1h")))
    assert lookback_us(group) is None


def test_shapes_are_distinct_and_in_definition_order():
    group = group_of(
        Feature("a", agg.count(), window=Hop("24h", every="5m")),
        Feature("b", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("c", agg.max("amount"), window=Hop("24h", every="5m")),
        Feature("d", agg.count(), window=Lifetime(every="1h")),
    )
    assert shapes(group) == [WindowShape(24 * HOUR, 5 * MINUTE), WindowShape(HOUR, 5 * MINUTE), WindowShape(None, HOUR)]


def test_an_unknown_online_mode_is_named_with_the_choices() -> None:
    with pytest.raises(DefinitionError, match=r"FeatureGroup\('g'\)\.online: unknown mode 'lazy'.*\"final\""):
        FeatureGroup(
            "g",
            Entity("user", ["user_id"]),
            EventSource("s", "p", "ts"),
            [Feature("n", agg.count(), Hop("1h", "5m"))],
            online="lazy",
        )
    assert (
        FeatureGroup(
            "g", Entity("user", ["user_id"]), EventSource("s", "p", "ts"), [Feature("n", agg.count(), Hop("1h", "5m"))]
        ).online
        == "eager"
    )
