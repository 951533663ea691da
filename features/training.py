"""Point-in-time correct training sets through Feast, with their lineage on the active MLflow run.

    rows = transactions[["user_id", "event_timestamp", "is_fraud"]]     # keys, a timestamp, a label
    frame = features.training_set(rows, ["user_transactions:failed_count_24h", "card_merchant"], repo="feature_repo")

Each row gets every requested feature's value at its timestamp `t` (DESIGN.md section 2), looked up by Feast's
`get_historical_features` in the offline change-point tables: the latest row with `window_end <= t`. A key
with no such row had nothing in any window yet, so counts, sums and approx_count_distinct are 0 there and
every other feature is null, exactly as the stores and the engines define an empty window.

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


def fill_empty(
    frame: pd.DataFrame, features: Sequence[FeatureRef | FeatureColumn], full_feature_names: bool = False
) -> pd.DataFrame:
    """The frame with DESIGN.md's empty-window values where a store had no row, and one type per feature.

    Where Feast found no row for a key at or before the lookup time, every window was empty: counts, sums and
    approx_count_distinct become 0, the rest stay null. Types: integers int64 when never null (counts) and
    pandas' nullable Int64 otherwise, floats float64 (NaN for null), booleans pandas' boolean, strings object,
    lists Python lists (None for null)."""
    out = frame.copy()
    for spec in features:
        ref = spec.as_column(full_feature_names) if isinstance(spec, FeatureRef) else spec
        column = ref.name
        values = out[column]
        if ref.empty_is_zero:
            values = pd.to_numeric(values).fillna(0)
            out[column] = values.astype("int64" if ref.dtype is DType.INT64 else "float64")
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
    from features.spec.fingerprint import describe

    groups = {r.group.name: r.group for r in refs}
    valid = times.dropna()
    return Lineage(
        features=[r.ref for r in refs],
        definition_hashes={name: definition_hash(g) for name, g in groups.items()},
        feature_hashes={r.ref: feature_hash(r.group, r.feature) for r in refs},
        definitions={name: describe(g) for name, g in groups.items()},
        rows=len(times),
        start=valid.min().to_pydatetime() if len(valid) else None,
        end=valid.max().to_pydatetime() if len(valid) else None,
        timestamp_column=timestamp_column,
        offline_dates={name: _date_range(repo, g) for name, g in groups.items()},
    )


def offline_dates(repo: Repo, group: FeatureGroup) -> list[date]:
    """The dates of the group's offline table partitions (each a UTC day a backfill or stream wrote)."""
    table = Path(repo.offline_path(group))
    found = []
    for part in table.glob("date=*"):
        if part.is_dir() and any(part.glob("*.parquet")):
            try:
                found.append(date.fromisoformat(part.name.removeprefix("date=")))
            except ValueError:
                continue
    return sorted(found)


def _date_range(repo: Repo, group: FeatureGroup) -> list[str]:
    dates = offline_dates(repo, group)
    return [dates[0].isoformat(), dates[-1].isoformat()] if dates else []


def _check_coverage(repo: Repo, refs: Sequence[FeatureRef], times: pd.Series) -> None:
    """A ConfigError if a group has no offline rows; a warning if lookups fall on days no backfill covered
    (there, a missing row would read as an empty window, and counts as 0, whatever the events said)."""
    valid = times.dropna()
    for group in {r.group.name: r.group for r in refs}.values():
        dates = offline_dates(repo, group)
        if not dates:
            raise ConfigError(
                f"features: group {group.name!r} has no offline rows in {repo.offline_path(group)}. Fix: run "
                f"`features backfill --repo {repo.root} --start ... --end ...` over the entity rows' time range"
            )
        if not len(valid):
            continue
        first = datetime.combine(dates[0], datetime.min.time(), UTC)
        after = datetime.combine(dates[-1] + timedelta(days=1), datetime.min.time(), UTC)
        early, late = int((valid < first).sum()), int((valid >= after).sum())
        if early or late:
            warnings.warn(
                f"training_set: {early + late:,} entity rows lie outside the days of group {group.name!r}'s offline "
                f"table ({dates[0]} to {dates[-1]}); their features read as empty windows (0 counts) before that "
                "and as the last backfilled values after it. Backfill those dates for exact values",
                stacklevel=3,
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

    When an MLflow run is active, the lineage (feature references, definition hashes, the rows' time range)
    is logged on it (`features.tracking.log_training_lineage`); `frame.attrs["features.lineage"]` holds it too.
    """
    loaded = repo if isinstance(repo, Repo) else Repo.load(repo)
    refs = resolve_features(loaded, features)
    is_spark = not isinstance(entity_rows, pd.DataFrame)
    rows = entity_rows.toPandas() if is_spark else entity_rows
    entity_df = _entity_frame(rows, refs, timestamp_column, full_feature_names)
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
    out = pd.concat([rows.reset_index(drop=True), fill_empty(joined[columns], refs, full_feature_names)], axis=1)
    lineage = lineage_of(refs, entity_df[FEAST_TIMESTAMP], timestamp_column, loaded)
    out.attrs["features.lineage"] = lineage.to_dict()
    if log_lineage:
        from features import tracking

        tracking.log_training_lineage(lineage)
    want_spark = is_spark if spark is None else bool(spark)
    if not want_spark:
        return out
    return _to_spark(out, spark if spark is not None and not isinstance(spark, bool) else None)


def _entity_frame(
    rows: pd.DataFrame, refs: Sequence[FeatureRef], timestamp_column: str, full_feature_names: bool
) -> pd.DataFrame:
    """The entity rows as Feast wants them: UTC `event_timestamp`, a row id, no clash with feature columns."""
    missing = [k for k in join_keys(refs) if k not in rows.columns]
    if missing:
        needed = sorted({r.group.name for r in refs if set(r.group.join_keys) & set(missing)})
        raise ConfigError(
            f"entity_rows: no column {', '.join(map(repr, missing))}, the join key(s) of {', '.join(needed)}; "
            f"add it, or request other features (the rows have {', '.join(map(str, rows.columns))})"
        )
    if timestamp_column not in rows.columns:
        raise ConfigError(
            f"timestamp_column: entity_rows have no column {timestamp_column!r}; pass "
            f"timestamp_column='<the column with each row's time>' (the rows have {', '.join(map(str, rows.columns))})"
        )
    if timestamp_column != FEAST_TIMESTAMP and FEAST_TIMESTAMP in rows.columns:
        raise ConfigError(
            f"entity_rows: a column {FEAST_TIMESTAMP!r} besides the timestamp column {timestamp_column!r}; "
            f"rename or drop it (Feast reads the lookup time from {FEAST_TIMESTAMP!r})"
        )
    clash = [r.column(full_feature_names) for r in refs if r.column(full_feature_names) in rows.columns]
    if clash or ROW_ID in rows.columns:
        raise ConfigError(
            f"entity_rows: column(s) {', '.join(map(repr, clash or [ROW_ID]))} would be overwritten by a feature; "
            "rename them or pass full_feature_names=True"
        )
    times = _utc(rows[timestamp_column], timestamp_column)
    if times.isna().any():
        raise ConfigError(
            f"entity_rows.{timestamp_column}: {int(times.isna().sum()):,} rows have no timestamp; drop or fill them"
        )
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
