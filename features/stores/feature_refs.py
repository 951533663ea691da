"""The features a training set or a model asks for, and the one set of values and types both stores give them.

A request names features as `group:feature`, a group (all its features) or a FeatureGroup; `resolve_features`
turns it into FeatureRefs. Where a store has no row for a key at or before a lookup time, every window was
empty: `fill_empty` gives those rows the empty-window values (docs/semantics.md: 0, null, or {} for a map) and
one type per feature, for training sets read from either store and for the online values a logged model serves
(features.ml.model).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

import numpy as np
import pandas as pd

from features.errors import ConfigError
from features.kernel.request_time import series_of
from features.repo import Repo
from features.spec import DType, Feature, FeatureGroup
from features.spec.aggregations import Empty
from features.stores.feast_codec import map_items

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
        return FeatureColumn(self.column(full_feature_names), self.dtype, self.feature.aggregation.kind.op.empty)


@dataclass(frozen=True)
class FeatureColumn:
    """What `fill_empty` needs to know of a feature column (plain values: a logged model keeps them, the
    Empty by its name)."""

    name: str
    dtype: DType
    empty: Empty  # the value of an empty window: 0 (counts, sums), {} (histograms), else null


def resolve_features(repo: Repo, features: Sequence[str | FeatureGroup]) -> list[FeatureRef]:
    """`group:feature` strings, group names (all their features) or FeatureGroups, as FeatureRefs in order."""
    from features.stores.feast_objects import source_schema

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


def empty_value(column: FeatureColumn) -> Any:
    """A feature's value over an empty window (docs/semantics.md#empty-windows): 0 for the counts and sums (an
    integer 0 for integer features), a new {} for the maps (histogram, top_frequent), a new [] for
    distinct_values, None (null) for the rest."""
    if column.empty is Empty.ZERO:
        return 0 if column.dtype is DType.INT64 else 0.0
    return column.empty.make()


def fill_empty(
    frame: pd.DataFrame, features: Sequence[FeatureRef | FeatureColumn], full_feature_names: bool = False
) -> pd.DataFrame:
    """The frame with the empty-window values (docs/semantics.md) where a store had no row, and one type per feature.

    Where Feast found no row for a key at or before the lookup time, every window was empty: counts, sums and
    distinct counts become 0, maps {}, distinct_values [], the rest stay null. Types: integers int64 when never
    null (counts) and pandas' nullable Int64 otherwise, floats float64 (NaN for null), booleans pandas' boolean,
    strings object, lists Python lists (None for null), maps Python dicts (Feast and pyarrow give (key, value)
    pairs)."""
    out = frame.copy()
    for spec in features:
        ref = spec.as_column(full_feature_names) if isinstance(spec, FeatureRef) else spec
        out[ref.name] = filled_column(out[ref.name], ref)
    return out


def filled_column(values: pd.Series, column: FeatureColumn) -> pd.Series:
    """One column as `fill_empty` gives it (indexed as `values`). Plain numpy numbers are filled by numpy, without
    pandas' conversions: the feature server fills a request's row or few with it."""
    empty = empty_value(column)
    plain_numbers = isinstance(values.dtype, np.dtype) and values.dtype.kind in "iuf"
    if column.dtype is DType.COUNT_MAP:
        return pd.Series([as_dict(v, column.empty) for v in values], index=values.index, dtype=object)
    if column.dtype.name.endswith("_LIST"):
        return filled_lists(values, column, values.index)
    if empty is not None and plain_numbers:
        numbers = values.to_numpy()
        if numbers.dtype.kind == "f":
            numbers = np.where(np.isnan(numbers), empty, numbers)
        elif numbers.dtype == np.dtype(type(empty)):  # numpy integers: never null, and already of its type
            return values
        return pd.Series(numbers.astype(type(empty)), index=values.index)
    if empty is not None:
        return pd.to_numeric(values).fillna(empty).astype(type(empty))
    if column.dtype is DType.INT64:
        return pd.Series(pd.array(pd.to_numeric(values), dtype="Int64"), index=values.index)
    if column.dtype is DType.FLOAT64:
        return values if values.dtype == np.float64 else pd.to_numeric(values).astype("float64")
    if column.dtype is DType.BOOL:
        return values.astype("boolean")
    return pd.Series([None if _missing(v) else v for v in values], index=values.index, dtype=object)


def filled_lists(values: Iterable[Any], column: FeatureColumn, index: pd.Index) -> pd.Series:
    """A list feature's values as `fill_empty` gives them (Python lists, the empty value for a null), indexed by
    `index`."""
    empty = column.empty
    # Arrow's lists (a Spark batch's) converted in the comprehension itself: a call per value was most of the cost
    lists = [v.tolist() if type(v) is np.ndarray else _as_list(v, empty) for v in values]
    # each list one object (np.array would read lists of one length as a second dimension), 30x faster than pandas
    return series_of(np.fromiter(lists, dtype=object, count=len(lists)), index)


def _missing(value: Any) -> bool:
    return value is None or (np.isscalar(value) and bool(pd.isna(value)))


def as_dict(value: Any, empty: Empty = Empty.NULL) -> dict[str, Any] | None:
    """A map value as a dict of plain Python values, from a dict or from the (key, value) pairs pyarrow, ibis
    (Feast's offline reads) and Spark give; a null becomes `empty`'s value."""
    pairs = map_items(value)
    if pairs is None:
        return empty.make()
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in pairs}


def _as_list(value: Any, empty: Empty = Empty.NULL) -> list[Any] | None:
    """A list value as a list of plain Python values; a null becomes `empty`'s value (None, or a new [])."""
    if isinstance(value, np.ndarray):  # what Arrow gives (a Spark batch): converted by numpy, element types too
        return value.tolist()
    if type(value) is list and not (value and isinstance(value[0], np.generic)):  # JSON's, Feast's: a list holds
        return list(value)  # one type, so its first value tells; a copy, as the other forms give a list of its own
    if _missing(value):
        return empty.make()
    return [v.item() if isinstance(v, np.generic) else v for v in value]


def offline_dates(repo: Repo, group: FeatureGroup | str, version: int | None = None) -> list[date]:
    """The dates of the group's offline table partitions (each a UTC day a backfill or stream wrote), as of
    `version` if given."""
    from features.stores.offline import rows_by_date

    return [day for day, rows in rows_by_date(repo.offline_path(group), version).items() if rows]
