"""Entities, sources, features and feature groups: immutable, validated when constructed."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from types import MappingProxyType
from typing import Any

from features.errors import DefinitionError, SchemaError
from features.spec.aggregations import Aggregation
from features.spec.avro import check_covers, record_fields
from features.spec.drift import Drift
from features.spec.durations import Duration, parse_duration
from features.spec.types import TYPE_NAMES, DType
from features.spec.windows import Window

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FORMATS = ("parquet", "json")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DEFAULT_MIN_TIMESTAMP = "2000-01-01"
DEFAULT_MIN_TIMESTAMP_US = 946_684_800_000_000  # 2000-01-01T00:00:00Z
# What a group does with a batch of feature rows that fails validation (features.quality); None = the engine's
# default (fail for backfills, quarantine for streams).
ON_INVALID = ("fail", "quarantine")
# When a stream writes the online store: "eager" after every micro-batch, from the events so far (ahead of the
# watermark, corrected by later events); "final" only once the watermark has passed a window end.
ONLINE = ("eager", "final")
# Columns every change-point row carries besides the join keys and features.
WINDOW_END = "window_end"
DATE = "date"  # the offline table's partition column: the UTC date of `window_end`
# A staged row's flag (the batch engine sets it, the offline table's staging reads it): true on a copy of each
# key's newest row, its value as of the range end for the online store.
LATEST = "fx_latest"
# Column names with a meaning of their own, in this package's tables or in Feast's point-in-time join (its
# DuckDB offline store, `get_historical_features`): a join key or feature of that name would be overwritten,
# duplicated or dropped there. Name -> what it is.
RESERVED_COLUMNS: Mapping[str, str] = MappingProxyType(
    {
        WINDOW_END: "the time of each change point, the timestamp field of the group's Feast feature view",
        DATE: "the date partition column of the offline table",
        "event_timestamp": "the lookup time of Feast's entity rows in get_historical_features",
        "entity_row_id": "the row id Feast's point-in-time join adds to the entity rows",
    }
)
# Reserved for features only: Feast's point-in-time join ranks the rows of a feature view in a column `rn`
# (the join keys come from the entity rows, so a key of that name is kept).
RESERVED_FEATURE_COLUMNS: Mapping[str, str] = MappingProxyType(
    {"rn": "the rank Feast's point-in-time join gives the candidate rows of a feature view"}
)
# Prefixes of the columns the engines and training sets add while they work (features.engine, features.ml.training).
RESERVED_PREFIXES = ("fx_", "__features_")
# Feast's point-in-time join drops every column of a feature view whose name ends so (its join suffix).
RESERVED_FEATURE_SUFFIX = "_y"


def reserved_use(name: str, *, feature: bool) -> str | None:
    """Why `name` cannot be a join key (or, with `feature`, a feature) name, or None if it can."""
    reserved = {**RESERVED_COLUMNS, **RESERVED_FEATURE_COLUMNS} if feature else RESERVED_COLUMNS
    if name in reserved:
        return f"{name!r} is a reserved column name: {reserved[name]}"
    prefix = next((p for p in RESERVED_PREFIXES if name.startswith(p)), None)
    if prefix is not None:
        return f"{name!r} starts with {prefix!r}, the prefix of the columns the engines add while they work"
    if feature and name.endswith(RESERVED_FEATURE_SUFFIX):
        return (
            f"{name!r} ends with {RESERVED_FEATURE_SUFFIX!r}: Feast's point-in-time join (get_historical_features) "
            "drops such columns as its own"
        )
    return None


def reserved_fix(kind: str) -> str:
    """The fix for a reserved name, listing the names reserved."""
    if kind == "feature":
        names = [*RESERVED_COLUMNS, *RESERVED_FEATURE_COLUMNS]
        patterns = f"names starting with {' or '.join(RESERVED_PREFIXES)} or ending with {RESERVED_FEATURE_SUFFIX}"
    else:
        names, patterns = list(RESERVED_COLUMNS), f"names starting with {' or '.join(RESERVED_PREFIXES)}"
    return f"rename the {kind}; do not use {', '.join(names)}, or {patterns}"


def check_name(value: object, field_name: str) -> str:
    if not isinstance(value, str) or not value:
        raise DefinitionError(field_name, "the name is empty", "give a name of letters, digits and _")
    if not _NAME.match(value):
        raise DefinitionError(
            field_name,
            f"{value!r} is not a valid name",
            "use letters, digits and _ only, starting with a letter or _ (it becomes a column name)",
        )
    return value


@dataclass(frozen=True)
class Entity:
    """What features are about; `join_keys` are the source columns that identify one instance."""

    name: str
    join_keys: tuple[str, ...]
    description: str = ""

    def __init__(self, name: str, join_keys: Sequence[str], description: str = "") -> None:
        check_name(name, "Entity.name")
        if isinstance(join_keys, str) or not join_keys:
            raise DefinitionError(
                f"Entity({name!r}).join_keys",
                "expected a non-empty list of column names",
                f'write join_keys=["{name}_id"] (or several columns for a composite key)',
            )
        keys = tuple(check_name(k, f"Entity({name!r}).join_keys") for k in join_keys)
        for key in keys:
            reason = reserved_use(key, feature=False)
            if reason is not None:
                raise DefinitionError(f"Entity({name!r}).join_keys", reason, reserved_fix("join key"))
        if len(set(keys)) != len(keys):
            raise DefinitionError(f"Entity({name!r}).join_keys", "a key is listed twice", "list each column once")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "join_keys", keys)
        object.__setattr__(self, "description", description)


# "confluent-avro": Confluent's wire format, a magic byte 0 and a 4-byte schema id before the Avro body.
VALUE_FORMATS = ("json", "avro", "confluent-avro")
AVRO_FORMATS = ("avro", "confluent-avro")
EVENT_TIMES = ("value", "record")
# Reader options the KafkaTopic's own fields set: giving them in `options` too would say two things.
_OWN_OPTIONS = {
    "subscribe": "topic",
    "subscribepattern": "topic",
    "assign": "topic",
    "kafka.bootstrap.servers": "bootstrap_servers",
}
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_SERVER = re.compile(r"\[?[A-Za-z0-9._:-]+\]?:(\d{1,5})")


@dataclass(frozen=True)
class KafkaTopic:
    """The Kafka topic a source's events stream from; the source's `path` holds the same events for backfills
    (and, with `archive=True`, the stream writes every record it reads there).

    `value_format="json"`: each record's value is one JSON object with the fields of the source's `schema`.
    "avro": each value is one Avro record of `schema` (the Avro schema as JSON text, e.g. an .avsc file's), whose
    fields hold the source's columns; "confluent-avro": the same after Confluent's 5-byte header (magic byte 0,
    schema id), as Confluent's serializers write it (the schema is the one given: no registry is asked).
    `event_time="value"` takes an event's time from the source's `timestamp` field of the value; "record" from
    the record's own Kafka timestamp. `options` are Spark's Kafka reader options (`startingOffsets`,
    `maxOffsetsPerTrigger`, `kafka.security.protocol`, ...)."""

    topic: str
    bootstrap_servers: str
    value_format: str = "json"
    event_time: str = "value"
    archive: bool = False
    options: Mapping[str, str] = field(default_factory=dict)
    schema: str | None = None

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str,
        value_format: str = "json",
        event_time: str = "value",
        archive: bool = False,
        options: Mapping[str, str] | None = None,
        schema: str | Mapping[str, Any] | None = None,
    ) -> None:
        where = f"KafkaTopic({topic!r})"
        if not isinstance(topic, str) or not _TOPIC.fullmatch(topic):
            raise DefinitionError(
                f"{where}.topic",
                "not a Kafka topic name",
                "use 1 to 249 letters, digits, '.', '_' or '-'",
            )
        servers = [s.strip() for s in str(bootstrap_servers).split(",")]
        if not all(_SERVER.fullmatch(s) for s in servers):
            raise DefinitionError(
                f"{where}.bootstrap_servers",
                f"{bootstrap_servers!r} is not a list of host:port",
                'write "host:9092" or "host1:9092,host2:9092"',
            )
        if value_format not in VALUE_FORMATS:
            raise DefinitionError(
                f"{where}.value_format",
                f"unknown value format {value_format!r}",
                f"use one of {', '.join(VALUE_FORMATS)}",
            )
        text = None
        if value_format in AVRO_FORMATS:
            if schema is None:
                raise DefinitionError(
                    f"{where}.schema",
                    f"value_format={value_format!r} needs the Avro schema of the values",
                    'pass schema= the Avro schema as JSON text, e.g. schema=Path("transaction.avsc").read_text()',
                )
            text, _ = record_fields(schema, f"{where}.schema")
        elif schema is not None:
            raise DefinitionError(
                f"{where}.schema",
                "an Avro schema is given for JSON values, whose fields are the EventSource's schema",
                'remove schema=, or set value_format="avro" if the values are Avro',
            )
        if event_time not in EVENT_TIMES:
            raise DefinitionError(
                f"{where}.event_time",
                f"unknown event time {event_time!r}",
                '"value" (the source\'s timestamp field) or "record" (the Kafka record\'s timestamp)',
            )
        opts = {str(k): str(v) for k, v in (options or {}).items()}
        for key in opts:
            own = _OWN_OPTIONS.get(key.lower())
            if own is not None:
                raise DefinitionError(f"{where}.options[{key!r}]", f"set by KafkaTopic.{own}", "remove it from options")
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "bootstrap_servers", ",".join(servers))
        object.__setattr__(self, "value_format", value_format)
        object.__setattr__(self, "event_time", event_time)
        object.__setattr__(self, "archive", bool(archive))
        object.__setattr__(self, "options", MappingProxyType(opts))
        object.__setattr__(self, "schema", text)

    @property
    def avro_fields(self) -> dict[str, Any]:
        """The Avro record's fields (name -> Avro type as written); empty for JSON values."""
        return {} if self.schema is None else record_fields(self.schema, f"KafkaTopic({self.topic!r}).schema")[1]

    def __hash__(self) -> int:
        return hash((self.topic, self.bootstrap_servers, self.value_format, self.event_time, self.archive, self.schema))


@dataclass(frozen=True)
class EventSource:
    """Timestamped events: a folder of Parquet or JSON-lines files, and optionally a Kafka topic of the same
    events that the stream reads instead (`kafka=KafkaTopic(...)`; backfills read the folder).

    `path` is relative to the feature repository unless absolute or a URI. `schema` (column -> type name)
    is optional for Parquet, where it is read from the files, and needed for JSON files and Kafka values.
    Records stamped more than `max_future` after the current time are set aside as bad data (None: never), and so
    are records stamped before `min_timestamp` (default 2000-01-01, UTC; None: never), which are far more often a
    default value (1970-01-01) than an event.
    """

    name: str
    path: str
    timestamp: str
    format: str = "parquet"
    watermark_s: int = 600
    schema: Mapping[str, DType] | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    max_future_s: int | None = 86400
    kafka: KafkaTopic | None = None
    min_timestamp_us: int | None = DEFAULT_MIN_TIMESTAMP_US

    def __init__(
        self,
        name: str,
        path: str,
        timestamp: str,
        format: str = "parquet",  # noqa: A002 - the public spelling
        watermark: Duration = "10m",
        schema: Mapping[str, str] | None = None,
        options: Mapping[str, str] | None = None,
        max_future: Duration | None = "1d",
        kafka: KafkaTopic | None = None,
        min_timestamp: str | datetime | date | None = DEFAULT_MIN_TIMESTAMP,
    ) -> None:
        check_name(name, "EventSource.name")
        where = f"EventSource({name!r})"
        if format == "kafka":
            raise DefinitionError(
                f"{where}.format",
                "Kafka is given as kafka=KafkaTopic(...), beside the folder of the same events that backfills read",
                'write EventSource(..., path="data/<folder>", kafka=KafkaTopic("<topic>", "<host>:9092"))',
            )
        if format not in FORMATS:
            raise DefinitionError(f"{where}.format", f"unknown format {format!r}", f"use one of {', '.join(FORMATS)}")
        if not isinstance(path, str) or not path.strip():
            raise DefinitionError(f"{where}.path", "the path is empty", "give the folder that holds the event files")
        if kafka is not None and not isinstance(kafka, KafkaTopic):
            raise DefinitionError(
                f"{where}.kafka",
                f"expected a KafkaTopic, got {type(kafka).__name__}",
                "write kafka=KafkaTopic(topic, bootstrap_servers)",
            )
        if kafka is not None and kafka.archive and format != "parquet":
            raise DefinitionError(
                f"{where}.kafka",
                "the stream archives what it reads from Kafka as Parquet files in path, and format is " + repr(format),
                'use format="parquet" (the default) for a source with KafkaTopic(archive=True)',
            )
        check_name(timestamp, f"{where}.timestamp")
        if kafka is not None and schema is None:
            raise DefinitionError(
                f"{where}.schema",
                "a Kafka source needs the schema of the columns its values hold",
                'add schema={"column": "type", ...} to the EventSource',
            )
        if kafka is not None and kafka.event_time == "record":
            schema = {timestamp: "timestamp", **schema}  # the record's time arrives as this column
        parsed = None
        if schema is not None:
            parsed = {}
            for column, type_name in schema.items():
                check_name(column, f"{where}.schema")
                dtype = TYPE_NAMES.get(str(type_name).lower())
                if dtype is None:
                    raise DefinitionError(
                        f"{where}.schema[{column!r}]",
                        f"unknown type {type_name!r}",
                        f"use one of {', '.join(sorted(set(TYPE_NAMES)))}",
                    )
                parsed[column] = dtype
            if parsed.get(timestamp) is not DType.TIMESTAMP:
                raise DefinitionError(
                    f"{where}.schema",
                    f"the timestamp column {timestamp!r} is not declared as timestamp",
                    f'add "{timestamp}": "timestamp" to the schema',
                )
        if kafka is not None and kafka.schema is not None and parsed is not None:
            record_time = (timestamp,) if kafka.event_time == "record" else ()
            check_covers(kafka.avro_fields, parsed, f"KafkaTopic({kafka.topic!r}).schema", skip=record_time)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "timestamp", timestamp)
        object.__setattr__(self, "format", format)
        object.__setattr__(self, "watermark_s", parse_duration(watermark, f"{where}.watermark"))
        object.__setattr__(self, "schema", None if parsed is None else MappingProxyType(parsed))
        object.__setattr__(self, "options", MappingProxyType(dict(options or {})))
        object.__setattr__(
            self, "max_future_s", None if max_future is None else parse_duration(max_future, f"{where}.max_future")
        )
        object.__setattr__(self, "kafka", kafka)
        object.__setattr__(self, "min_timestamp_us", _min_timestamp_us(min_timestamp, f"{where}.min_timestamp"))

    @property
    def min_timestamp(self) -> datetime | None:
        return None if self.min_timestamp_us is None else _EPOCH + timedelta(microseconds=self.min_timestamp_us)

    def __hash__(self) -> int:
        return hash((self.name, self.path, self.timestamp, self.format, self.kafka))

    def landing_folder(self) -> EventSource:
        """This source as its folder alone, Parquet files of its columns, without its Kafka topic."""
        schema = None if self.schema is None else {c: t.value for c, t in self.schema.items()}
        max_future = None if self.max_future_s is None else f"{self.max_future_s}s"
        return EventSource(
            self.name,
            self.path,
            self.timestamp,
            watermark=f"{self.watermark_s}s",
            schema=schema,
            options=dict(self.options),
            max_future=max_future,
            min_timestamp=self.min_timestamp,
        )


@dataclass(frozen=True)
class Feature:
    """One named value: `aggregation` over the rows of `window`, after the optional `where` filter."""

    name: str
    aggregation: Aggregation
    window: Window
    where: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        check_name(self.name, "Feature.name")
        if not isinstance(self.aggregation, Aggregation):
            raise DefinitionError(
                f"Feature({self.name!r}).aggregation",
                f"expected an aggregation, got {type(self.aggregation).__name__}",
                'build it with features.agg, e.g. agg.sum("amount")',
            )
        if not isinstance(self.window, Window):
            raise DefinitionError(
                f"Feature({self.name!r}).window",
                f"expected a window, got {type(self.window).__name__}",
                'use Hop("24h", every="5m"), Tumble("1h"), Lifetime(every="1h") or Session("30m", every="1m")',
            )
        if self.aggregation.kind.op.session_only and not self.window.is_session:
            raise DefinitionError(
                f"Feature({self.name!r}).window",
                f"{self.aggregation.kind.value}() describes a session, and {self.window.describe()} has none",
                'aggregate over a session window, e.g. window=Session("30m", every="1m")',
            )
        if self.where is not None and (not isinstance(self.where, str) or not self.where.strip()):
            raise DefinitionError(
                f"Feature({self.name!r}).where",
                "the filter is empty",
                "write a Spark SQL condition such as \"status = 'FAILED'\", or leave where out",
            )


def _check_expectations(expectations: Sequence[Any], where: str, columns: Sequence[str]) -> tuple[Any, ...]:
    """The user's Great Expectations expectations, checked by shape and by the columns they name (this module
    never imports Great Expectations; the objects are only inspected)."""
    if isinstance(expectations, str) or not isinstance(expectations, Sequence):
        raise DefinitionError(
            f"{where}.expectations",
            f"expected a list of expectations, got {type(expectations).__name__}",
            "pass a list, e.g. expectations=[gx.expectations.ExpectColumnValuesToBeBetween(column=..., max_value=...)]",
        )
    for item in expectations:
        if not isinstance(getattr(item, "expectation_type", None), str) or not hasattr(item, "configuration"):
            raise DefinitionError(
                f"{where}.expectations",
                f"{item!r} is not a Great Expectations expectation",
                "list objects from great_expectations.expectations, e.g. "
                'gx.expectations.ExpectColumnValuesToBeBetween(column="amount_sum_1h", max_value=10000)',
            )
        kwargs = item.configuration.kwargs
        named = [kwargs.get(k) for k in ("column", "column_A", "column_B")] + list(kwargs.get("column_list") or [])
        unknown = [c for c in named if isinstance(c, str) and c not in columns]
        if unknown:
            raise DefinitionError(
                f"{where}.expectations",
                f"{item.expectation_type} reads column(s) {', '.join(map(repr, unknown))}, which the group's rows "
                f"do not have",
                f"name one of the group's columns: {', '.join(columns)}",
            )
    return tuple(expectations)


@dataclass(frozen=True)
class FeatureGroup:
    """Features of one entity from one source, computed together and stored as one Feast FeatureView."""

    name: str
    entity: Entity
    source: EventSource
    features: tuple[Feature, ...]
    description: str = ""
    # Great Expectations expectations the user adds to the group's derived suite (held as given, never
    # imported here), and what a failed validation does: "fail", "quarantine", or None for the engine's default.
    expectations: tuple[Any, ...] = ()
    on_invalid: str | None = None
    online: str = "eager"
    drift: Drift | None = None  # `features monitor`'s thresholds (None: its defaults); not part of the values

    def __init__(
        self,
        name: str,
        entity: Entity,
        source: EventSource,
        features: Sequence[Feature],
        description: str = "",
        expectations: Sequence[Any] = (),
        on_invalid: str | None = None,
        online: str = "eager",
        drift: Drift | None = None,
    ) -> None:
        check_name(name, "FeatureGroup.name")
        where = f"FeatureGroup({name!r})"
        if not isinstance(entity, Entity):
            raise DefinitionError(f"{where}.entity", "expected an Entity", 'pass Entity("user", join_keys=["user_id"])')
        if not isinstance(source, EventSource):
            raise DefinitionError(f"{where}.source", "expected an EventSource", "pass the EventSource to read")
        if not features:
            raise DefinitionError(f"{where}.features", "the group has no features", "list at least one Feature")
        seen: set[str] = set()
        for feat in features:
            if not isinstance(feat, Feature):
                raise DefinitionError(f"{where}.features", f"{feat!r} is not a Feature", "list Feature(...) objects")
            if feat.name in seen:
                raise DefinitionError(
                    f"{where}.features",
                    f"the feature name {feat.name!r} is used twice",
                    "give each feature its own name",
                )
            if feat.name in entity.join_keys:
                raise DefinitionError(
                    f"Feature({feat.name!r}).name",
                    f"{feat.name!r} is also a join key of entity {entity.name!r}, and each row holds both",
                    "rename the feature",
                )
            reason = reserved_use(feat.name, feature=True)
            if reason is not None:
                raise DefinitionError(f"Feature({feat.name!r}).name", reason, reserved_fix("feature"))
            seen.add(feat.name)
        if on_invalid is not None and on_invalid not in ON_INVALID:
            raise DefinitionError(
                f"{where}.on_invalid",
                f"unknown policy {on_invalid!r}",
                'use "fail" (stop, write nothing), "quarantine" (set the batch aside, keep going) or leave it out',
            )
        if online not in ONLINE:
            raise DefinitionError(
                f"{where}.online",
                f"unknown mode {online!r}",
                'use "eager" (online after every micro-batch, the default) or "final" (once the watermark passed)',
            )
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "entity", entity)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "features", tuple(features))
        object.__setattr__(self, "description", description)
        columns = [*entity.join_keys, WINDOW_END, *(f.name for f in features)]
        object.__setattr__(self, "expectations", _check_expectations(expectations, where, columns))
        object.__setattr__(self, "on_invalid", on_invalid)
        object.__setattr__(self, "online", online)
        if drift is not None and not isinstance(drift, Drift):
            raise DefinitionError(f"{where}.drift", f"{drift!r} is not a Drift", "pass Drift(psi=0.2, js=0.1)")
        object.__setattr__(self, "drift", drift)

    @property
    def join_keys(self) -> tuple[str, ...]:
        return self.entity.join_keys

    def feature(self, name: str) -> Feature:
        for feat in self.features:
            if feat.name == name:
                return feat
        raise DefinitionError(
            f"FeatureGroup({self.name!r})", f"has no feature {name!r}", f"use one of {[f.name for f in self.features]}"
        )

    def check_schema(self, schema: Mapping[str, DType]) -> None:
        """Raise a SchemaError naming the field if the group reads a column the source does not have."""
        where = f"FeatureGroup({self.name!r})"

        def need(column: str, field_name: str) -> DType:
            if column not in schema:
                raise SchemaError(
                    field_name,
                    f"column {column!r} is not in source {self.source.name!r} (columns: {', '.join(sorted(schema))})",
                    "use one of the source's columns, or add the column to the source data",
                )
            return schema[column]

        if need(self.source.timestamp, f"EventSource({self.source.name!r}).timestamp") is not DType.TIMESTAMP:
            raise SchemaError(
                f"EventSource({self.source.name!r}).timestamp",
                f"column {self.source.timestamp!r} is not a timestamp",
                "point timestamp= at a timestamp column (or cast it upstream)",
            )
        for key in self.join_keys:
            need(key, f"{where}.entity.join_keys")
        for feat in self.features:
            agg = feat.aggregation
            if agg.column is not None:
                agg.check_input(need(agg.column, f"Feature({feat.name!r}).aggregation.column"), feat.name)

    def output_types(self, schema: Mapping[str, DType]) -> dict[str, DType]:
        """The logical type of every output column: join keys, then features."""
        self.check_schema(schema)
        types = {key: schema[key] for key in self.join_keys}
        for feat in self.features:
            column = feat.aggregation.column
            types[feat.name] = feat.aggregation.output_type(None if column is None else schema[column])
        return types


def _min_timestamp_us(value: str | datetime | date | None, where: str) -> int | None:
    """`EventSource(min_timestamp=...)` as UTC microseconds (a naive time or a date is UTC)."""
    if value is None:
        return None
    fix = 'write a UTC day or time, e.g. min_timestamp="2000-01-01", or None to keep every timestamp'
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise DefinitionError(where, f"{value!r} is not a day or a time", fix) from None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if not isinstance(value, datetime):
        raise DefinitionError(where, f"expected a day or a time, got {type(value).__name__}", fix)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
