"""Point-in-time correct training sets through Feast, with their lineage on the active MLflow run.

    rows = transactions[["user_id", "event_timestamp", "is_fraud"]]     # keys, a timestamp, a label
    frame = features.training_set(rows, ["user_transactions:failed_count_24h", "card_merchant"], repo="feature_repo")

Each row gets every requested feature's value at its timestamp `t` (docs/semantics.md), looked up in the
offline change-point tables: the latest row with `window_end <= t`. A key with no such row had nothing in any
window yet, so counts, sums and distinct counts are 0 there and every other feature is null, exactly as the
stores and the engines define an empty window.

pandas rows go through Feast's `get_historical_features` (DuckDB, on the driver). Spark rows are joined in
Spark on the same tables (features.engine.pit): the same values, the rows never pass through the driver.

`fill_empty` (features.stores.feature_refs) gives a frame read from either store those values and one set of column
types; the model wrapper (features.ml.model) applies it to online values, so a model sees the same columns in
training and serving. A training set can read the tables as of an earlier version (`as_of_version`, `as_of`),
and its lineage (features.ml.lineage) records the versions it read.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from features.errors import ConfigError
from features.ml.lineage import Lineage, lineage_from, lineage_of
from features.repo import Repo
from features.spec import DType, FeatureGroup
from features.spec.aggregations import Empty
from features.spec.fingerprint import feature_hashes
from features.spec.request import RequestFeature
from features.stores.feature_refs import ROW_ID, FeatureRef, fill_empty, join_keys, offline_dates, resolve_features
from features.stores.manifest import read_manifest

if TYPE_CHECKING:
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import SparkSession

FEAST_TIMESTAMP = "event_timestamp"  # the column Feast reads the lookup time from


def table_versions(
    repo: Repo,
    refs: Sequence[FeatureRef],
    as_of_version: int | Mapping[str, int] | None = None,
    as_of: datetime | None = None,
) -> dict[str, int]:
    """Per requested group, the version of its offline table a training set reads: the one asked for
    (`as_of_version`: an int when the features come from one group, else group -> version), the one current at
    `as_of`, or the newest. A ConfigError names a group without one."""
    from features.stores import offline

    groups = list(dict.fromkeys(r.group.name for r in refs))
    if as_of_version is not None and as_of is not None:
        raise ConfigError("training_set: pass as_of_version or as_of, not both")
    if isinstance(as_of_version, int) and not isinstance(as_of_version, bool):
        if len(groups) != 1:
            raise ConfigError(
                f"training_set: as_of_version={as_of_version} is one table's version, and the features come from "
                f"groups {groups}, each with its own offline table. Fix: as_of_version={{group: version}} for "
                "each (a training set's lineage records them as `table_versions`)"
            )
        as_of_version = {groups[0]: as_of_version}
    if as_of_version is not None and not isinstance(as_of_version, Mapping):
        raise ConfigError(
            f"training_set: as_of_version must be an int or a mapping of group to version, got {as_of_version!r}"
        )
    versions: dict[str, int] = {}
    for name in groups:
        table = repo.offline_path(name)
        if as_of_version is not None:
            wanted = as_of_version.get(name)
            if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
                raise ConfigError(
                    f"training_set: as_of_version has {wanted!r} for group {name!r}; give each requested group "
                    "its table version, an int >= 0"
                )
            found: int | None = wanted
        elif as_of is not None:
            found = offline.version_at(table, _aware(as_of))
        else:
            found = offline.current_version(table)
        if found is None:
            state = "has no offline rows" if as_of is None else f"had no offline table at {_aware(as_of).isoformat()}"
            raise ConfigError(
                f"features: group {name!r} {state} in {table}. Fix: run `features backfill --repo {repo.root} "
                "--start ... --end ...` over the entity rows' time range"
            )
        versions[name] = found
    unknown = sorted(set(as_of_version or {}) - set(groups))
    if unknown:
        raise ConfigError(f"training_set: as_of_version names groups no requested feature is from: {unknown}")
    return versions


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def offline_spans(
    repo: Repo, refs: Sequence[FeatureRef], versions: dict[str, int]
) -> dict[str, tuple[datetime, datetime]]:
    """Per requested group, the UTC time its offline table's days cover (at `versions`): [first day, the day
    after the last). A ConfigError if a group has no offline rows."""
    spans = {}
    for group in {r.group.name: r.group for r in refs}.values():
        dates = offline_dates(repo, group, versions.get(group.name))
        if not dates:
            raise ConfigError(
                f"features: group {group.name!r} has no offline rows in {repo.offline_path(group)}. Fix: run "
                f"`features backfill --repo {repo.root} --start ... --end ...` over the entity rows' time range"
            )
        first = datetime.combine(dates[0], datetime.min.time(), UTC)
        after = datetime.combine(dates[-1] + timedelta(days=1), datetime.min.time(), UTC)
        spans[group.name] = (first, after)
    return spans


def _check_coverage(repo: Repo, refs: Sequence[FeatureRef], times: pd.Series, versions: dict[str, int]) -> None:
    """A ConfigError if a group has no offline rows; a warning if lookups fall on days no backfill covered, or on
    days computed before a feature was added or changed."""
    valid = times.dropna()
    for name, (first, after) in offline_spans(repo, refs, versions).items():
        if len(valid):
            _warn_outside(name, (first, after), int((valid < first).sum()), int((valid >= after).sum()))
    if len(valid):
        _warn_without_history(repo, refs, valid.min(), valid.max())


def _warn_without_history(repo: Repo, refs: Sequence[FeatureRef], first: datetime, last: datetime) -> None:
    """Warn of features the table holds no values of on some days of the lookups: days a backfill computed before
    the feature was added, or with an earlier definition of it (the manifest keeps each day's hash per feature).
    There its column is empty or holds the old definition's values."""
    for group in {r.group.name: r.group for r in refs}.values():
        current = feature_hashes(group)
        days = read_manifest(repo.offline_path(group), group.name).partitions
        wanted = [r.feature.name for r in refs if r.group.name == group.name]
        for name in wanted:
            without = sorted(
                d
                for d, e in days.items()
                if first.date() <= d <= last.date() and e.feature_hashes.get(name) != current[name]
            )
            if not without:
                continue
            warnings.warn(
                f"training_set: feature {group.name}:{name} has no history on {len(without)} day(s) from "
                f"{without[0]} to {without[-1]} (computed before it was added or changed), where entity rows look "
                "it up: its values there are empty or the old definition's. Fix: `features backfill --repo "
                f"{repo.root} --group {group.name} --since-last --only-changed` computes it alone over those days",
                stacklevel=4,
            )


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
    as_of_version: int | Mapping[str, int] | None = None,
    as_of: datetime | None = None,
    request_features: Sequence[str | RequestFeature] = (),
    request_time_column: str | None = None,
) -> pd.DataFrame | SparkDataFrame:
    """The entity rows, in their order, with each requested feature's value at each row's timestamp.

    `entity_rows`: a pandas or Spark DataFrame with the join keys of every requested group, a timestamp
    column (`timestamp_column`; naive times are UTC) and anything else (labels, request-time values), which
    is passed through. `features`: "group:feature" references, group names (all of a group's features) or
    FeatureGroups. `spark`: False for pandas, True (or a SparkSession) for a Spark DataFrame; by default the
    kind of `entity_rows`. `full_feature_names`: name columns `group__feature` (needed when two groups share
    a feature name). `as_of_version` / `as_of`: read the offline tables as they were at a version (an int for
    one group's features, else group -> version, e.g. a logged lineage's `table_versions`) or a time (Delta's
    time travel; docs/table-format.md), so that a training set can be rebuilt exactly later.
    `request_features`: request-time features (names of the repo's, or RequestFeature objects) computed per row
    from its request columns and the stored values at its time, after the features (features.ml.training_request);
    their request time is `request_time_column`, by default the row's timestamp.

    pandas rows are looked up by Feast's `get_historical_features`. Spark rows are joined in Spark, in their
    own session (classic or Spark Connect), on the same offline tables and with the same values
    (`features.engine.pit`): they never pass through the driver, and the result is a lazy Spark DataFrame.

    When an MLflow run is active, the lineage (feature references, definition hashes, the rows' time range, the
    tables' versions) is logged on it (`features.ml.tracking.log_training_lineage`); a pandas result's
    `frame.attrs["features.lineage"]` holds it too, pinned to a version or not.
    """
    loaded = repo if isinstance(repo, Repo) else Repo.load(repo)
    refs = resolve_features(loaded, features)
    asked = list(refs)
    plan = None
    if request_features:
        from features.ml.training_request import RequestPlan

        time_column = request_time_column or timestamp_column
        plan = RequestPlan(loaded, refs, request_features, time_column, full_feature_names)
        columns = entity_rows.columns
        plan.check(list(columns), [r.column(full_feature_names) for r in refs])
        refs = [*refs, *plan.extra]  # the stored inputs no one asked for: looked up, then dropped
    _check_names(refs, full_feature_names)
    versions = table_versions(loaded, refs, as_of_version, as_of)
    pinned = as_of_version is not None or as_of is not None
    if not isinstance(entity_rows, pd.DataFrame) or pinned:
        # Feast reads a table's newest version only: a pinned version is joined in Spark, with the same values.
        rows = entity_rows if not isinstance(entity_rows, pd.DataFrame) else _to_spark(entity_rows, _given(spark))
        args = (refs, loaded, timestamp_column, full_feature_names, log_lineage, versions)
        frame, lineage = _spark_training_set(rows, *args)  # called from here: its warnings name the caller's line
        result = _as_asked(frame, lineage, entity_rows, spark, refs, full_feature_names)
        if plan is None:
            return result
        return plan.apply(result) if isinstance(result, pd.DataFrame) else plan.apply_in_spark(result)
    entity_df = _entity_frame(entity_rows, refs, timestamp_column, full_feature_names)
    _check_coverage(loaded, refs, entity_df[FEAST_TIMESTAMP], versions)
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
    _warn_if_written(loaded, refs, versions)
    lineage = lineage_of(refs, entity_df[FEAST_TIMESTAMP], timestamp_column, loaded, versions)
    out.attrs["features.lineage"] = lineage.to_dict()
    if log_lineage:
        from features.ml import tracking

        tracking.log_training_lineage(lineage)
    if plan is not None:
        out = plan.apply(out)
    if not spark:
        return out
    # Maps, and the sets whose empty value is [], from which Spark could infer no type: given theirs.
    typed = {
        r.column(full_feature_names): r.dtype
        for r in asked
        if r.dtype is DType.COUNT_MAP or r.feature.aggregation.kind.op.empty is Empty.EMPTY_LIST
    }
    typed |= {f.name: f.dtype for f in (plan.features if plan is not None else []) if f.dtype.name.endswith("_LIST")}
    return _to_spark(out, _given(spark), typed)


def _given(spark: bool | SparkSession | None) -> SparkSession | None:
    return spark if spark is not None and not isinstance(spark, bool) else None


def _warn_if_written(repo: Repo, refs: Sequence[FeatureRef], versions: dict[str, int]) -> None:
    """Feast reads each table's newest version: warn when a commit landed while it read, as the lineage then
    names the version before it."""
    from features.stores.offline import current_version

    for name, version in versions.items():
        now = current_version(repo.offline_path(name))
        if now != version:
            warnings.warn(
                f"training_set: group {name!r}'s offline table was written while the training set was read "
                f"(version {version} -> {now}); the lineage records version {version}, and rows may come from "
                f"either. Pass as_of_version={{{name!r}: {now}}} to read one version",
                stacklevel=3,
            )


def _as_asked(
    frame: SparkDataFrame,
    lineage: Lineage,
    entity_rows: pd.DataFrame | SparkDataFrame,
    spark: bool | SparkSession | None,
    refs: Sequence[FeatureRef],
    full_feature_names: bool,
) -> pd.DataFrame | SparkDataFrame:
    """The Spark join's result as `training_set` was asked for it: Spark, unless pandas is (`spark=False`; for
    pandas rows, by default), which carries the lineage in `attrs` as the Feast path's result does."""
    given_pandas = isinstance(entity_rows, pd.DataFrame)
    wants_spark = bool(spark) if given_pandas else spark is not False
    if wants_spark:
        return frame
    # The joined rows are collected, typed as the pandas path types them; pandas rows are kept as given.
    if given_pandas:
        columns = [r.column(full_feature_names) for r in refs]
        found = fill_empty(frame.select(*columns).toPandas(), refs, full_feature_names)
        out = pd.concat([entity_rows.reset_index(drop=True), found], axis=1)
    else:
        out = fill_empty(frame.toPandas(), refs, full_feature_names)
    out.attrs["features.lineage"] = lineage.to_dict()
    return out


def _spark_training_set(
    rows: SparkDataFrame,
    refs: Sequence[FeatureRef],
    repo: Repo,
    timestamp_column: str,
    full_feature_names: bool,
    log_lineage: bool,
    versions: dict[str, int],
) -> tuple[SparkDataFrame, Lineage]:
    """The Spark path: checks and lineage from one aggregation over the rows, then the join in Spark, on the
    tables at `versions` (the lazy result reads them whenever it runs)."""
    from features.engine import pit

    _check_columns(list(rows.columns), refs, timestamp_column, full_feature_names)
    spans = offline_spans(repo, refs, versions)
    stats = pit.row_stats(rows, timestamp_column, spans)
    if stats.unparsed:
        raise ConfigError(
            f"entity_rows.{timestamp_column}: {stats.unparsed:,} values are not timestamps; pass datetimes or "
            "ISO-8601 strings"
        )
    _check_times(timestamp_column, stats.missing)
    for name, (early, late) in stats.outside.items():
        _warn_outside(name, spans[name], early, late)
    if stats.start is not None and stats.end is not None:
        _warn_without_history(repo, refs, stats.start, stats.end)
    lineage = lineage_from(refs, stats.rows, stats.start, stats.end, timestamp_column, repo, versions)
    if log_lineage:
        from features.ml import tracking

        tracking.log_training_lineage(lineage)
    if stats.start is None or stats.end is None:  # no rows: nothing to look up, the columns all the same
        stats = pit.RowStats(0, 0, 0, datetime(1970, 1, 1, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC), {})
    joined = pit.join_features(
        rows,
        refs,
        repo,
        timestamp_column,
        start=stats.start,
        end=stats.end,
        full_feature_names=full_feature_names,
        versions=versions,
    )
    return joined, lineage


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


def _to_spark(
    frame: pd.DataFrame, session: SparkSession | None, typed: Mapping[str, DType] | None = None
) -> SparkDataFrame:
    """The frame in Spark; `typed`: columns that keep their type, COUNT_MAP (dicts) and lists that may be empty."""
    from features.engine.inputs import SPARK_TYPES
    from features.engine.session import get_spark

    spark = session or get_spark()
    converted = frame.copy()
    for column in converted.columns:
        if isinstance(converted[column].dtype, pd.api.extensions.ExtensionDtype) and not isinstance(
            converted[column].dtype, pd.DatetimeTZDtype
        ):
            converted[column] = converted[column].astype(object).where(converted[column].notna(), None)
    if not typed:
        return spark.createDataFrame(converted)
    # Spark infers a struct (one field per key) from a column of dicts, and no element type from empty lists: such
    # columns cross as JSON text and are parsed back with their type. SQL expressions, not
    # pyspark.sql.functions: the session may be classic or Connect.
    for column in typed:
        converted[column] = [None if v is None else json.dumps(v) for v in converted[column]]
    quoted = {c: "`" + str(c).replace("`", "``") + "`" for c in converted.columns}
    return spark.createDataFrame(converted).selectExpr(
        *[
            f"from_json({quoted[c]}, '{SPARK_TYPES[typed[c]]}') AS {quoted[c]}" if c in typed else quoted[c]
            for c in converted.columns
        ]
    )
