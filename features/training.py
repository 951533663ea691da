"""Point-in-time correct training sets through Feast, with their lineage on the active MLflow run.

    rows = transactions[["user_id", "event_timestamp", "is_fraud"]]     # keys, a timestamp, a label
    frame = features.training_set(rows, ["user_transactions:failed_count_24h", "card_merchant"], repo="feature_repo")

Each row gets every requested feature's value at its timestamp `t` (docs/semantics.md), looked up in the
offline change-point tables: the latest row with `window_end <= t`. A key with no such row had nothing in any
window yet, so counts, sums and distinct counts are 0 there and every other feature is null, exactly as the
stores and the engines define an empty window.

pandas rows go through Feast's `get_historical_features` (DuckDB, on the driver). Spark rows are joined in
Spark on the same tables (features.engine.pit): the same values, the rows never pass through the driver.

`fill_empty` gives a frame read from either store those values and one set of column types; the model
wrapper (features.model) applies it to online values, so a model sees the same columns in training and serving.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from features.errors import ConfigError
from features.repo import Repo
from features.spec import DType, Feature, FeatureGroup
from features.spec.fingerprint import definition_hash, feature_hash

if TYPE_CHECKING:
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import SparkSession

FEAST_TIMESTAMP = "event_timestamp"  # the column Feast reads the lookup time from
ROW_ID = "__features_row"  # keeps the caller's row order through Feast's join


@dataclass(frozen=True)
class FeatureRef:
    """One feature of one group, as Feast names it: `group:feature`."""

    group: FeatureGroup
    feature: Feature
    dtype: DType

    @property
    def ref(self) -> str:
        return f"{self.group.name}:{self.feature.name}"

    def column(self, full_feature_names: bool = False) -> str:
        """The column Feast gives it: the feature name, or `group__feature` with full feature names."""
        return f"{self.group.name}__{self.feature.name}" if full_feature_names else self.feature.name

    def as_column(self, full_feature_names: bool = False) -> FeatureColumn:
        return FeatureColumn(self.column(full_feature_names), self.dtype, self.feature.aggregation.kind.empty_is_zero)


@dataclass(frozen=True)
class FeatureColumn:
    """What `fill_empty` needs to know of a feature column (plain values: a logged model keeps them)."""

    name: str
    dtype: DType
    empty_is_zero: bool  # count, sum, approx_count_distinct: 0 for an empty window, not null


def resolve_features(repo: Repo, features: Sequence[str | FeatureGroup]) -> list[FeatureRef]:
    """`group:feature` strings, group names (all their features) or FeatureGroups, as FeatureRefs in order."""
    from features.feast_objects import source_schema

    if isinstance(features, str | FeatureGroup):
        features = [features]
    if not features:
        raise ConfigError("features: no features requested; pass e.g. ['user_transactions:failed_count_24h']")
    refs: list[FeatureRef] = []
    for item in features:
        name, wanted = _split(item)
        group = repo.groups.get(name)
        if group is None:
            raise ConfigError(
                f"features: {item if isinstance(item, str) else name!r} names no feature group of {repo.root}; "
                f"it defines {', '.join(sorted(repo.groups)) or 'none'}"
            )
        types = group.output_types(source_schema(group, repo.root))
        names = [f.name for f in group.features]
        for feature_name in wanted or names:
            if feature_name not in names:
                raise ConfigError(
                    f"features: {name}:{feature_name} is not a feature of group {name!r}; it has {', '.join(names)}"
                )
            ref = FeatureRef(group, group.feature(feature_name), types[feature_name])
            if all(r.ref != ref.ref for r in refs):
                refs.append(ref)
    return refs


def _split(item: str | FeatureGroup) -> tuple[str, list[str]]:
    if isinstance(item, FeatureGroup):
        return item.name, []
    group, _, feature = item.partition(":")
    return group.strip(), [feature.strip()] if feature else []


def join_keys(refs: Sequence[FeatureRef]) -> list[str]:
    """Every join key the features need, in order of first use."""
    keys: list[str] = []
    for ref in refs:
        keys += [k for k in ref.group.join_keys if k not in keys]
    return keys


# ---------------------------------------------------------------------------------------------------------
# One set of values and types for both stores


def empty_value(column: FeatureColumn) -> int | float | None:
    """A feature's value over an empty window (docs/semantics.md#empty-windows): 0 for count, sum, approx_count_distinct
    and count_distinct (an integer 0 for integer features), None (null) for every other aggregation."""
    if not column.empty_is_zero:
        return None
    return 0 if column.dtype is DType.INT64 else 0.0


def fill_empty(
    frame: pd.DataFrame, features: Sequence[FeatureRef | FeatureColumn], full_feature_names: bool = False
) -> pd.DataFrame:
    """The frame with the empty-window values (docs/semantics.md) where a store had no row, and one type per feature.

    Where Feast found no row for a key at or before the lookup time, every window was empty: counts, sums and
    approx_count_distinct become 0, the rest stay null. Types: integers int64 when never null (counts) and
    pandas' nullable Int64 otherwise, floats float64 (NaN for null), booleans pandas' boolean, strings object,
    lists Python lists (None for null)."""
    out = frame.copy()
    for spec in features:
        ref = spec.as_column(full_feature_names) if isinstance(spec, FeatureRef) else spec
        column = ref.name
        values = out[column]
        empty = empty_value(ref)
        if empty is not None:
            out[column] = pd.to_numeric(values).fillna(empty).astype(type(empty))
        elif ref.dtype is DType.INT64:
            out[column] = pd.array(pd.to_numeric(values), dtype="Int64")
        elif ref.dtype is DType.FLOAT64:
            out[column] = pd.to_numeric(values).astype("float64")
        elif ref.dtype is DType.BOOL:
            out[column] = values.astype("boolean")
        elif ref.dtype.name.endswith("_LIST"):
            out[column] = pd.Series([_as_list(v) for v in values], index=out.index, dtype=object)
        else:
            out[column] = pd.Series([None if _missing(v) else v for v in values], index=out.index, dtype=object)
    return out


def _missing(value: Any) -> bool:
    return value is None or (np.isscalar(value) and bool(pd.isna(value)))


def _as_list(value: Any) -> list[Any] | None:
    if _missing(value):
        return None
    return [v.item() if isinstance(v, np.generic) else v for v in value]


# ---------------------------------------------------------------------------------------------------------
# Lineage


@dataclass(frozen=True)
class Lineage:
    """What a training set was built from: logged on the active MLflow run (features.tracking)."""

    features: list[str]  # "group:feature", in the order asked
    definition_hashes: dict[str, str]  # group -> features.spec.fingerprint.definition_hash
    feature_hashes: dict[str, str]  # "group:feature" -> feature_hash
    definitions: dict[str, dict[str, Any]]  # group -> features.spec.fingerprint.describe
    rows: int
    start: datetime | None  # the entity rows' earliest and latest timestamps (UTC)
    end: datetime | None
    timestamp_column: str
    offline_dates: dict[str, list[str]] = field(default_factory=dict)  # group -> [first, last] date partition

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "definition_hashes": dict(self.definition_hashes),
            "feature_hashes": dict(self.feature_hashes),
            "definitions": self.definitions,
            "entity_rows": {
                "rows": self.rows,
                "timestamp_column": self.timestamp_column,
                "start": self.start.isoformat() if self.start else None,
                "end": self.end.isoformat() if self.end else None,
            },
            "offline_dates": dict(self.offline_dates),
        }


def lineage_of(refs: Sequence[FeatureRef], times: pd.Series, timestamp_column: str, repo: Repo) -> Lineage:
    valid = times.dropna()
    start = valid.min().to_pydatetime() if len(valid) else None
    end = valid.max().to_pydatetime() if len(valid) else None
    return lineage_from(refs, len(times), start, end, timestamp_column, repo)


def lineage_from(
    refs: Sequence[FeatureRef],
    rows: int,
    start: datetime | None,
    end: datetime | None,
    timestamp_column: str,
    repo: Repo,
) -> Lineage:
    """The lineage of a training set of `rows` rows with lookup times in [start, end] (UTC)."""
    from features.spec.fingerprint import describe

    groups = {r.group.name: r.group for r in refs}
    return Lineage(
        features=[r.ref for r in refs],
        definition_hashes={name: definition_hash(g) for name, g in groups.items()},
        feature_hashes={r.ref: feature_hash(r.group, r.feature) for r in refs},
        definitions={name: describe(g) for name, g in groups.items()},
        rows=rows,
        start=start,
        end=end,
        timestamp_column=timestamp_column,
        offline_dates={name: _date_range(repo, g) for name, g in groups.items()},
    )


def offline_dates(repo: Repo, group: FeatureGroup | str) -> list[date]:
    """The dates of the group's offline table partitions (each a UTC day a backfill or stream wrote)."""
    from features.offline import rows_by_date

    return [day for day, rows in rows_by_date(repo.offline_path(group)).items() if rows]


def _date_range(repo: Repo, group: FeatureGroup) -> list[str]:
    dates = offline_dates(repo, group)
    return [dates[0].isoformat(), dates[-1].isoformat()] if dates else []


def offline_spans(repo: Repo, refs: Sequence[FeatureRef]) -> dict[str, tuple[datetime, datetime]]:
    """Per requested group, the UTC time its offline table's days cover: [first day, the day after the last).
    A ConfigError if a group has no offline rows."""
    spans = {}
    for group in {r.group.name: r.group for r in refs}.values():
        dates = offline_dates(repo, group)
        if not dates:
            raise ConfigError(
                f"features: group {group.name!r} has no offline rows in {repo.offline_path(group)}. Fix: run "
                f"`features backfill --repo {repo.root} --start ... --end ...` over the entity rows' time range"
            )
        first = datetime.combine(dates[0], datetime.min.time(), UTC)
        after = datetime.combine(dates[-1] + timedelta(days=1), datetime.min.time(), UTC)
        spans[group.name] = (first, after)
    return spans


def _check_coverage(repo: Repo, refs: Sequence[FeatureRef], times: pd.Series) -> None:
    """A ConfigError if a group has no offline rows; a warning if lookups fall on days no backfill covered."""
    valid = times.dropna()
    for name, (first, after) in offline_spans(repo, refs).items():
        if len(valid):
            _warn_outside(name, (first, after), int((valid < first).sum()), int((valid >= after).sum()))


def _warn_outside(group: str, span: tuple[datetime, datetime], early: int, late: int) -> None:
    """Warn of lookups on days no backfill covered: there a missing row reads as an empty window (counts 0)
    whatever the events said, and a later one as the last backfilled value."""
    if not early and not late:
        return
    first, last = span[0].date(), (span[1] - timedelta(days=1)).date()
    warnings.warn(
        f"training_set: {early + late:,} entity rows lie outside the days of group {group!r}'s offline "
        f"table ({first} to {last}); their features read as empty windows (0 counts) before that "
        "and as the last backfilled values after it. Backfill those dates for exact values",
        stacklevel=4,
    )


# ---------------------------------------------------------------------------------------------------------
# The training set


def training_set(
    entity_rows: pd.DataFrame | SparkDataFrame,
    features: Sequence[str | FeatureGroup],
    repo: str | Path | Repo = "feature_repo",
    *,
    timestamp_column: str = FEAST_TIMESTAMP,
    spark: bool | SparkSession | None = None,
    full_feature_names: bool = False,
    log_lineage: bool = True,
) -> pd.DataFrame | SparkDataFrame:
    """The entity rows, in their order, with each requested feature's value at each row's timestamp.

    `entity_rows`: a pandas or Spark DataFrame with the join keys of every requested group, a timestamp
    column (`timestamp_column`; naive times are UTC) and anything else (labels, request-time values), which
    is passed through. `features`: "group:feature" references, group names (all of a group's features) or
    FeatureGroups. `spark`: False for pandas, True (or a SparkSession) for a Spark DataFrame; by default the
    kind of `entity_rows`. `full_feature_names`: name columns `group__feature` (needed when two groups share
    a feature name).

    pandas rows are looked up by Feast's `get_historical_features`. Spark rows are joined in Spark, in their
    own session (classic or Spark Connect), on the same offline tables and with the same values
    (`features.engine.pit`): they never pass through the driver, and the result is a lazy Spark DataFrame.

    When an MLflow run is active, the lineage (feature references, definition hashes, the rows' time range)
    is logged on it (`features.tracking.log_training_lineage`); a pandas result's
    `frame.attrs["features.lineage"]` holds it too.
    """
    loaded = repo if isinstance(repo, Repo) else Repo.load(repo)
    refs = resolve_features(loaded, features)
    _check_names(refs, full_feature_names)
    if not isinstance(entity_rows, pd.DataFrame):
        frame = _spark_training_set(entity_rows, refs, loaded, timestamp_column, full_feature_names, log_lineage)
        if spark is None or spark is True or not isinstance(spark, bool):
            return frame
        # pandas asked for: the joined rows are collected, typed as the pandas path types them.
        return fill_empty(frame.toPandas(), refs, full_feature_names)
    entity_df = _entity_frame(entity_rows, refs, timestamp_column, full_feature_names)
    _check_coverage(loaded, refs, entity_df[FEAST_TIMESTAMP])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # from Feast's DuckDB backend, not actionable here
        job = loaded.feature_store().get_historical_features(
            entity_df=entity_df, features=[r.ref for r in refs], full_feature_names=full_feature_names
        )
        joined = job.to_df()
    if len(joined) != len(entity_df):
        raise AssertionError(f"Feast returned {len(joined)} rows for {len(entity_df)} entity rows")
    joined = joined.sort_values(ROW_ID, kind="stable").reset_index(drop=True)
    columns = [r.column(full_feature_names) for r in refs]
    # The caller's columns as given (Feast may change their types), then the features.
    out = pd.concat([entity_rows.reset_index(drop=True), fill_empty(joined[columns], refs, full_feature_names)], axis=1)
    lineage = lineage_of(refs, entity_df[FEAST_TIMESTAMP], timestamp_column, loaded)
    out.attrs["features.lineage"] = lineage.to_dict()
    if log_lineage:
        from features import tracking

        tracking.log_training_lineage(lineage)
    if not spark:
        return out
    return _to_spark(out, spark if not isinstance(spark, bool) else None)


def _spark_training_set(
    rows: SparkDataFrame,
    refs: Sequence[FeatureRef],
    repo: Repo,
    timestamp_column: str,
    full_feature_names: bool,
    log_lineage: bool,
) -> SparkDataFrame:
    """The Spark path: checks and lineage from one aggregation over the rows, then the join in Spark."""
    from features.engine import pit

    _check_columns(list(rows.columns), refs, timestamp_column, full_feature_names)
    spans = offline_spans(repo, refs)
    stats = pit.row_stats(rows, timestamp_column, spans)
    if stats.unparsed:
        raise ConfigError(
            f"entity_rows.{timestamp_column}: {stats.unparsed:,} values are not timestamps; pass datetimes or "
            "ISO-8601 strings"
        )
    _check_times(timestamp_column, stats.missing)
    for name, (early, late) in stats.outside.items():
        _warn_outside(name, spans[name], early, late)
    lineage = lineage_from(refs, stats.rows, stats.start, stats.end, timestamp_column, repo)
    if log_lineage:
        from features import tracking

        tracking.log_training_lineage(lineage)
    if stats.start is None or stats.end is None:  # no rows: nothing to look up, the columns all the same
        stats = pit.RowStats(0, 0, 0, datetime(1970, 1, 1, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC), {})
    return pit.join_features(
        rows,
        refs,
        repo,
        timestamp_column,
        start=stats.start,
        end=stats.end,
        full_feature_names=full_feature_names,
    )


def _check_names(refs: Sequence[FeatureRef], full_feature_names: bool) -> None:
    """Two requested features may not give the same column (Feast refuses them too, less plainly)."""
    seen: dict[str, str] = {}
    for ref in refs:
        column = ref.column(full_feature_names)
        if column in seen:
            raise ConfigError(
                f"features: {seen[column]} and {ref.ref} would both be column {column!r}; pass "
                "full_feature_names=True (columns group__feature) or request only one of them"
            )
        seen[column] = ref.ref


def _check_columns(
    columns: list[str], refs: Sequence[FeatureRef], timestamp_column: str, full_feature_names: bool
) -> None:
    """The rows have every join key and the timestamp column, and no column a feature would overwrite."""
    missing = [k for k in join_keys(refs) if k not in columns]
    if missing:
        needed = sorted({r.group.name for r in refs if set(r.group.join_keys) & set(missing)})
        raise ConfigError(
            f"entity_rows: no column {', '.join(map(repr, missing))}, the join key(s) of {', '.join(needed)}; "
            f"add it, or request other features (the rows have {', '.join(map(str, columns))})"
        )
    if timestamp_column not in columns:
        raise ConfigError(
            f"timestamp_column: entity_rows have no column {timestamp_column!r}; pass "
            f"timestamp_column='<the column with each row's time>' (the rows have {', '.join(map(str, columns))})"
        )
    if timestamp_column != FEAST_TIMESTAMP and FEAST_TIMESTAMP in columns:
        raise ConfigError(
            f"entity_rows: a column {FEAST_TIMESTAMP!r} besides the timestamp column {timestamp_column!r}; "
            f"rename or drop it (Feast reads the lookup time from {FEAST_TIMESTAMP!r})"
        )
    clash = [r.column(full_feature_names) for r in refs if r.column(full_feature_names) in columns]
    if clash or ROW_ID in columns:
        raise ConfigError(
            f"entity_rows: column(s) {', '.join(map(repr, clash or [ROW_ID]))} would be overwritten by a feature; "
            "rename them or pass full_feature_names=True"
        )


def _check_times(timestamp_column: str, missing: int) -> None:
    if missing:
        raise ConfigError(f"entity_rows.{timestamp_column}: {missing:,} rows have no timestamp; drop or fill them")


def _entity_frame(
    rows: pd.DataFrame, refs: Sequence[FeatureRef], timestamp_column: str, full_feature_names: bool
) -> pd.DataFrame:
    """The entity rows as Feast wants them: UTC `event_timestamp`, a row id, no clash with feature columns."""
    _check_columns(list(rows.columns), refs, timestamp_column, full_feature_names)
    times = _utc(rows[timestamp_column], timestamp_column)
    _check_times(timestamp_column, int(times.isna().sum()))
    frame = rows.drop(columns=[timestamp_column]).copy()
    frame[FEAST_TIMESTAMP] = times.to_numpy()
    frame[ROW_ID] = np.arange(len(frame))
    return frame.reset_index(drop=True)


def _utc(values: pd.Series, column: str) -> pd.Series:
    try:
        times = pd.to_datetime(values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"entity_rows.{column}: not timestamps ({exc}); pass datetimes or ISO-8601 strings") from None
    times = times.dt.tz_localize(UTC) if times.dt.tz is None else times.dt.tz_convert(UTC)
    return times.astype("datetime64[us, UTC]")


def _to_spark(frame: pd.DataFrame, session: SparkSession | None) -> SparkDataFrame:
    from features.engine.session import get_spark

    spark = session or get_spark()
    converted = frame.copy()
    for column in converted.columns:
        if isinstance(converted[column].dtype, pd.api.extensions.ExtensionDtype) and not isinstance(
            converted[column].dtype, pd.DatetimeTZDtype
        ):
            converted[column] = converted[column].astype(object).where(converted[column].notna(), None)
    return spark.createDataFrame(converted)
