"""Served values as statistics: the served log (features.stores.served_log) profiled per feature and UTC day of
serving, by the same profiles the offline statistics hold (features.kernel.profile), so that `features monitor
--served` measures their drift from a model's training days by the same functions (features.kernel.drift_measures)."""

from __future__ import annotations

import json
from datetime import date
from typing import Any

import numpy as np
import pyarrow as pa

from features.errors import ConfigError
from features.kernel.profile import FeatureProfile, profile_days
from features.repo import Repo
from features.spec import DType, FeatureGroup
from features.stores.feature_refs import resolve_features
from features.stores.served_log import read_served, served_table
from features.stores.statistics import DayStatistics

SERVED_AT = "served_at"


def served_statistics(
    repo: Repo, groups: list[FeatureGroup], first: date | None = None, end: date | None = None
) -> dict[str, DayStatistics]:
    """Per group, each feature's profile per UTC day of the values the server logged on the days [first, end)."""
    table = served_table(repo.root)
    rows = read_served(table, first, end)
    if rows is None or rows.num_rows == 0:
        raise ConfigError(
            f"--served: no served values were logged in {table}"
            + ("" if first is None else f" on {first} or later")
            + f"; start the feature server with `features serve --repo {repo.root} --log-served` and send it "
            "requests, or leave out --served to compare the recorded statistics"
        )
    values = [json.loads(text) for text in rows.column("values").to_pylist()]
    served_at = rows.column(SERVED_AT)
    return {g.name: DayStatistics(_group_profiles(repo, g, values, served_at), {}) for g in groups}


def _group_profiles(
    repo: Repo, group: FeatureGroup, values: list[dict[str, Any]], served_at: pa.ChunkedArray
) -> dict[tuple[int, str], FeatureProfile]:
    profiles: dict[tuple[int, str], FeatureProfile] = {}
    for ref in resolve_features(repo, [group]):
        served = np.array([ref.ref in row for row in values], dtype=bool)
        if not served.any():
            continue  # never asked for: no day to judge
        column = arrow_of_served([row[ref.ref] for row, s in zip(values, served, strict=True) if s], ref.dtype)
        taken = pa.table({SERVED_AT: served_at.filter(pa.array(served)), ref.feature.name: column})
        profiles.update(profile_days(taken, SERVED_AT, [ref.feature.name]))
    return profiles


def arrow_of_served(values: list[Any], dtype: DType) -> pa.Array:
    """Values in the server's JSON forms as the Arrow values the offline table holds, as far as their profile
    tells: times (epoch seconds) as timestamps, maps (objects) as maps; the rest as pyarrow reads them."""
    if dtype is DType.TIMESTAMP:
        micros = pa.array([None if v is None else int(v) * 1_000_000 for v in values], pa.int64())
        return micros.cast(pa.timestamp("us", "UTC"))
    if dtype is DType.COUNT_MAP:
        return pa.array([None if v is None else list(v.items()) for v in values], pa.map_(pa.string(), pa.int64()))
    return pa.array(values)
