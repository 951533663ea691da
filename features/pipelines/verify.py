"""`features verify`: the stores checked against each other and against a recompute from the raw source, the
consistency job Chronon runs (online/offline skew is a bug: docs/semantics.md, One value everywhere).

For a sample of keys of each group:
- online: the online store's row (values and window end E) against the offline table's point-in-time value at E
  (the latest change point with window_end <= E); an online row newer than the key's last offline row (an eager
  value, or a backfill's value as of its end) is checked against the recompute at E instead. An online row older
  than the key's last offline row is stale (its store missed a later write): its lag is the last offline row's
  window end minus E, and a lag over `max_staleness_s` counts against every feature of the row (one window end
  per row);
- offline: every offline row of those keys against the recompute at its window end, and every recomputed change
  point against the offline table's point-in-time value there (a change point the table lacks shows up so).
The recompute is the batch engine over the source's events of the sampled keys, read afresh.

Per feature: match, mismatch, missing (a value the store lacks), extra (a value where the source has none) and,
online, stale; the mismatch rate (mismatched among the values compared) and the largest lag.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from features.errors import ConfigError
from features.spec import WINDOW_END, FeatureGroup
from features.spec.durations import format_duration
from features.stores.feature_refs import as_dict

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from features.repo import Repo

CHECKS = ("online", "offline")
COUNTS = ("match", "mismatch", "missing", "extra", "stale")
EXAMPLES = 3  # examples kept per feature and problem


@dataclass
class Tally:
    """One feature's outcome in one check."""

    match: int = 0
    mismatch: int = 0
    missing: int = 0
    extra: int = 0
    stale: int = 0  # online rows that lag the key's last offline row by more than the tolerance
    max_lag_s: float = 0.0  # the largest lag of an online row behind the key's last offline row
    examples: list[str] = field(default_factory=list)

    def add(self, outcome: str, example: str | None = None) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        if outcome != "match" and example is not None and len(self.examples) < EXAMPLES:
            self.examples.append(f"{outcome}: {example}")

    @property
    def mismatch_rate(self) -> float | None:
        """Mismatched among the values compared; None when none was."""
        compared = self.match + self.mismatch
        return self.mismatch / compared if compared else None

    @property
    def ok(self) -> bool:
        return self.mismatch == self.missing == self.extra == self.stale == 0


@dataclass
class GroupReport:
    group: str
    keys: int
    tallies: dict[tuple[str, str], Tally]  # (check, feature) -> tally

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tallies.values())

    def table(self) -> str:
        width = max(len(f) for _, f in self.tallies)
        lines = [
            f"{self.group}: {self.keys} keys sampled",
            f"  {'check':<8} {'feature':<{width}}  " + "  ".join(f"{c:>8}" for c in (*COUNTS, "mismatch%", "max lag")),
        ]
        for (check, feature), t in self.tallies.items():
            counts = "  ".join(f"{getattr(t, c):>8}" for c in COUNTS)
            rate = "-" if t.mismatch_rate is None else f"{t.mismatch_rate:.2%}"
            lag = _lag_text(t.max_lag_s) if check == "online" else "-"
            lines.append(f"  {check:<8} {feature:<{width}}  {counts}  {rate:>9}  {lag:>8}")
        for (check, feature), t in self.tallies.items():
            lines += [f"  {check} {feature} {example}" for example in t.examples]
        return "\n".join(lines)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (check, feature), t in self.tallies.items():
            out.update({f"verify.{check}.{feature}.{c}": getattr(t, c) for c in COUNTS})
            if t.mismatch_rate is not None:
                out[f"verify.{check}.{feature}.mismatch_rate"] = t.mismatch_rate
            if check == "online":
                out[f"verify.{check}.{feature}.max_lag_s"] = t.max_lag_s
        return out


def same(a: Any, b: Any) -> bool:
    """Equal feature values: nulls alike, lists item by item, maps key by key (as dicts or (key, value) pairs),
    floats within 1e-9 relative (a float sum's last bits depend on the order a stream added a pane's
    micro-batches), times as instants (Feast's online reads give aware datetimes, the offline table naive UTC)."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return _null(a) == _null(b) if _null(a) or _null(b) else as_dict(a) == as_dict(b)
    if isinstance(a, list | np.ndarray) or isinstance(b, list | np.ndarray):
        return _null(a) == _null(b) if _null(a) or _null(b) else [*a] == [*b]
    if _null(a) or _null(b):
        return _null(a) and _null(b)
    if isinstance(a, datetime | np.datetime64) or isinstance(b, datetime | np.datetime64):
        return _instant(a) == _instant(b)
    if isinstance(a, float | np.floating) or isinstance(b, float | np.floating):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _instant(value: Any) -> pd.Timestamp:
    """A time as a UTC timestamp; one without a zone is UTC."""
    ts = pd.Timestamp(value)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def _null(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float | np.floating) and math.isnan(value)


def _empty_value(group: FeatureGroup, feature: str) -> Any:
    """What a window with no rows gives (a lookup before a key's first change point): 0, {} or None."""
    return group.feature(feature).aggregation.empty_value


class Series:
    """Each key's change points, for point-in-time lookups: the latest row with window_end <= t."""

    def __init__(self, rows: pd.DataFrame, keys: list[str]) -> None:
        rows = rows.assign(**{WINDOW_END: _micros(rows[WINDOW_END])}).sort_values([*keys, WINDOW_END])
        self.rows = rows.reset_index(drop=True)
        self.by_key = {k if isinstance(k, tuple) else (k,): part for k, part in self.rows.groupby(keys, sort=False)}

    def at(self, key: tuple, t: int) -> pd.Series | None:
        part = self.by_key.get(key)
        if part is None:
            return None
        i = int(np.searchsorted(part[WINDOW_END].to_numpy(), t, side="right"))
        return None if i == 0 else part.iloc[i - 1]

    def has(self, key: tuple, t: int) -> bool:
        part = self.by_key.get(key)
        return part is not None and bool((part[WINDOW_END].to_numpy() == t).any())


def _micros(values: pd.Series) -> np.ndarray:
    ends = pd.to_datetime(values, utc=True)
    return (ends.dt.tz_convert("UTC").astype("datetime64[us, UTC]").astype("int64")).to_numpy()


def _value(group: FeatureGroup, row: pd.Series | None, feature: str) -> Any:
    return _empty_value(group, feature) if row is None else row[feature]


def verify_group(
    spark: SparkSession, repo: Repo, group: FeatureGroup, sample: int = 100, seed: int = 0, max_staleness_s: int = 0
) -> GroupReport:
    """Check a sample of `group`'s keys in both stores (see the module docstring)."""
    from pyspark.sql import functions as F

    from features.engine.batch import change_points
    from features.engine.source import read_source
    from features.stores.offline import read_table
    from features.stores.serving import online_features

    keys = list(group.join_keys)
    features = [f.name for f in group.features]
    table = read_table(spark, repo.offline_path(group))
    source = read_source(spark, group, repo.source_path(group)).events
    # A stream that has emitted no final row yet has only eager online values: their keys come from the source.
    sampled_from = source if table is None else table
    picked = sampled_from.select(*keys).distinct().orderBy(F.xxhash64(*keys, F.lit(seed))).limit(sample)
    if table is None:
        offline = picked.toPandas().assign(**{WINDOW_END: pd.Series(dtype="datetime64[us, UTC]")}).iloc[:0]
    else:
        offline = table.join(F.broadcast(picked), keys).drop("date").toPandas()
    key_rows = (picked.toPandas() if table is None else offline[keys]).drop_duplicates().reset_index(drop=True)
    stored = Series(offline, keys)
    online = online_features(repo, group, key_rows, with_window_end=True)
    online_ends = online[WINDOW_END].dropna()
    bounds = [int(t) for t in (stored.rows[WINDOW_END].min(), stored.rows[WINDOW_END].max()) if not pd.isna(t)]
    if len(online_ends):
        bounds += [int(_micros(online_ends).min()), int(_micros(online_ends).max())]
    if not bounds:
        raise ConfigError(
            f"verify: group {group.name!r} has no offline rows and no online values yet; run `features backfill` "
            "or `features stream` first"
        )
    start, end = min(bounds), max(bounds)
    events = source.join(F.broadcast(picked), keys)
    recomputed = Series(change_points(group, events, start, end).rows.toPandas(), keys)
    tallies = {(check, f): Tally() for check in CHECKS for f in features}
    last_offline = {k: int(part[WINDOW_END].max()) for k, part in stored.by_key.items()}

    for i, row in online.iterrows():
        key = tuple(key_rows.loc[i, k] for k in keys)
        end_on = row[WINDOW_END]
        if pd.isna(end_on):
            for f in features:
                tallies["online", f].add("missing", f"key {key}: no online row")
            continue
        t = int(_micros(pd.Series([end_on]))[0])
        _tally_lag([tallies["online", f] for f in features], key, t, last_offline.get(key, -1), max_staleness_s)
        reference = stored if t <= last_offline.get(key, -1) else recomputed
        want = reference.at(key, t)
        for f in features:
            got = row[f]
            if same(got, _value(group, want, f)):
                tallies["online", f].add("match")
            else:
                what = "offline" if reference is stored else "recompute"
                tallies["online", f].add(
                    "mismatch", f"key {key} at {_iso(t)}: online {got!r}, {what} {_value(group, want, f)!r}"
                )

    for _, row in stored.rows.iterrows():
        key, t = tuple(row[k] for k in keys), int(row[WINDOW_END])
        want = recomputed.at(key, t)
        for f in features:
            if key not in recomputed.by_key:
                tallies["offline", f].add("extra", f"key {key} at {_iso(t)}: no source events")
            elif same(row[f], _value(group, want, f)):
                tallies["offline", f].add("match")
            else:
                tallies["offline", f].add(
                    "mismatch", f"key {key} at {_iso(t)}: offline {row[f]!r}, recompute {_value(group, want, f)!r}"
                )
    limit = int(stored.rows[WINDOW_END].max()) if len(stored.rows) else -1  # no offline row: nothing to miss
    for _, row in recomputed.rows.iterrows():
        key, t = tuple(row[k] for k in keys), int(row[WINDOW_END])
        if t > limit or stored.has(key, t):
            continue  # past the table's end, or compared above
        have = stored.at(key, t)
        for f in features:
            if not same(_value(group, have, f), row[f]):
                tallies["offline", f].add(
                    "missing", f"key {key} at {_iso(t)}: offline {_value(group, have, f)!r}, recompute {row[f]!r}"
                )
    return GroupReport(group.name, len(key_rows), tallies)


def _tally_lag(tallies: list[Tally], key: tuple, t: int, last: int, max_staleness_s: int) -> None:
    """An online row at window end `t` against the key's last offline row at `last`: its lag, and stale when the
    lag is over the tolerance."""
    lag_s = max(last - t, 0) / 1e6
    for tally in tallies:
        tally.max_lag_s = max(tally.max_lag_s, lag_s)
        if lag_s > max_staleness_s:
            tally.add("stale", f"key {key}: online at {_iso(t)}, offline at {_iso(last)} ({_lag_text(lag_s)} behind)")


def _lag_text(seconds: float) -> str:
    return format_duration(round(seconds)) if round(seconds) else "0"


def _iso(t_us: int) -> str:
    return pd.Timestamp(t_us, unit="us", tz="UTC").isoformat()


def verify(
    repo: Repo, groups: Sequence[str] = (), *, sample: int = 100, max_staleness_s: int = 0, track: bool = True
) -> list[GroupReport]:
    """`features verify`: every group (or the named ones), logged to MLflow as `verify.*` metrics. An online row
    stale by at most `max_staleness_s` seconds passes."""
    from features.engine.session import get_spark
    from features.ml import tracking

    chosen = repo.select(list(groups))
    spark = get_spark("features-verify")
    reports = [verify_group(spark, repo, g, sample, max_staleness_s=max_staleness_s) for g in chosen]
    params = {"sample": sample, "max_staleness_s": max_staleness_s}
    with tracking.start_run(repo, "verify", chosen, params, enabled=track) as run:
        for report in reports:
            run.log_metrics(report.metrics(), group=report.group)
    return reports
