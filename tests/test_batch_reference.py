"""The Spark batch engine against the brute-force reference (docs/semantics.md; docs/internals.md, Two phases).

`change_points(group, events, start, end).rows` is a change-point series: an as-of lookup "latest row with
window_end <= t" must give exactly `value(k, t)` for every t in [start, end]. Each Spark run is collected once
(module-scoped cache) and checked at many (key, t) pairs: exact window ends, one microsecond before them,
the range start and end, random times, times before any event and after windows expired.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import percentile_ok, reference_frame, to_micros

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, Session, Tumble, agg
from features.engine.batch import change_points
from features.spec import WINDOW_END, AggKind
from features.spec.aggregations import Empty

pytestmark = pytest.mark.spark

US = pd.Timedelta(microseconds=1)
MICROS = 1_000_000
BASE = pd.Timestamp("2026-03-02", tz="UTC")
H = pd.Timedelta(hours=1)
M = pd.Timedelta(minutes=1)

SOURCE = EventSource("transactions", path="data/transactions", timestamp="event_ts")
USER = Entity("user", join_keys=["user_id"])
CARD_MERCHANT = Entity("card_merchant", join_keys=["card_id", "merchant_id"])

# Range start in the middle of the data: events lie exactly on it and one microsecond before it.
MID_START = BASE + 12 * H
RANGES = {
    "full": (BASE - H, BASE + 56 * H),  # starts before any event, ends after every 24h window expired
    "mid": (MID_START, BASE + 40 * H),  # 1h-aligned (not 7m-aligned) start in the middle of the data
    "odd": (BASE + 15 * H + 7 * M + pd.Timedelta(seconds=30.5), BASE + 33 * H + 3 * M + pd.Timedelta(seconds=17.25)),
}

# ---------------------------------------------------------------------------------------------------------
# Groups

AGGS_WINDOW = Hop("4h", every="20m")
GROUP_AGGS = FeatureGroup(
    "aggs",
    USER,
    SOURCE,
    [
        Feature("n", agg.count(), window=AGGS_WINDOW),
        Feature("n_failed", agg.count(), window=AGGS_WINDOW, where="status = 'FAILED'"),
        Feature("n_not_big", agg.count(), window=AGGS_WINDOW, where="NOT (amount > 100)"),
        Feature("qty_sum", agg.sum("qty"), window=AGGS_WINDOW),
        Feature("qty_sum_ok", agg.sum("qty"), window=AGGS_WINDOW, where="status != 'FAILED'"),
        Feature("amount_sum", agg.sum("amount"), window=AGGS_WINDOW),
        Feature("amount_sum_ok", agg.sum("amount"), window=AGGS_WINDOW, where="status IN ('APPROVED', 'DECLINED')"),
        Feature("amount_avg", agg.avg("amount"), window=AGGS_WINDOW),
        Feature("qty_avg", agg.avg("qty"), window=AGGS_WINDOW),
        Feature("amount_min", agg.min("amount"), window=AGGS_WINDOW),
        Feature("amount_max", agg.max("amount"), window=AGGS_WINDOW),
        Feature("status_min", agg.min("status"), window=AGGS_WINDOW),
        Feature("qty_max_ok", agg.max("qty"), window=AGGS_WINDOW, where="ok"),
        Feature("amount_sd", agg.stddev("amount"), window=AGGS_WINDOW),
        Feature("qty_sd", agg.stddev("qty"), window=AGGS_WINDOW),
        Feature("status_first", agg.first("status"), window=AGGS_WINDOW),
        Feature("amount_first", agg.first("amount"), window=AGGS_WINDOW),
        Feature("status_last", agg.last("status"), window=AGGS_WINDOW),
        Feature("amount_last", agg.last("amount"), window=AGGS_WINDOW),
        Feature("ok_last", agg.last("ok"), window=AGGS_WINDOW),
        Feature("amounts_last3", agg.last_k("amount", 3), window=AGGS_WINDOW),
        Feature("statuses_last4", agg.last_k("status", 4), window=AGGS_WINDOW),
        Feature("qtys_last2", agg.last_k("qty", 2), window=AGGS_WINDOW, where="amount IS NOT NULL"),
        Feature("merchants", agg.approx_count_distinct("merchant_id"), window=AGGS_WINDOW),
        Feature("statuses", agg.approx_count_distinct("status"), window=AGGS_WINDOW),
        Feature("merchants_exact", agg.count_distinct("merchant_id"), window=AGGS_WINDOW),
        Feature("statuses_exact", agg.count_distinct("status"), window=AGGS_WINDOW, where="amount > 20"),
        Feature("amounts_exact", agg.count_distinct("amount"), window=AGGS_WINDOW),
        Feature("oks_exact", agg.count_distinct("ok"), window=AGGS_WINDOW),
        Feature("amount_p50", agg.approx_percentile("amount", 0.5), window=AGGS_WINDOW),
        Feature("amount_p90", agg.approx_percentile("amount", 0.9), window=AGGS_WINDOW),
        Feature("qty_p10", agg.approx_percentile("qty", 0.1), window=AGGS_WINDOW, where="status = 'APPROVED'"),
    ],
)

LIFETIME = Lifetime(every="30m")
# The aggregations with list, map and higher-moment values, over hops, a tumble and a lifetime, with `where`s.
GROUP_NEWER = FeatureGroup(
    "newer",
    USER,
    SOURCE,
    [
        Feature("amount_var", agg.variance("amount"), window=AGGS_WINDOW),
        Feature("qty_var", agg.variance("qty"), window=Tumble("1h")),
        Feature("amount_skew", agg.skew("amount"), window=AGGS_WINDOW),
        Feature("qty_skew", agg.skew("qty"), window=LIFETIME, where="status != 'FAILED'"),
        Feature("amount_kurt", agg.kurtosis("amount"), window=AGGS_WINDOW),
        Feature("qty_kurt", agg.kurtosis("qty"), window=Hop("2h", every="10m")),
        Feature("status_first3", agg.first_k("status", 3), window=AGGS_WINDOW),
        Feature("amount_first2", agg.first_k("amount", 2), window=LIFETIME),
        Feature("amount_top3", agg.top_k("amount", 3), window=AGGS_WINDOW),
        Feature("qty_top2", agg.top_k("qty", 2), window=Tumble("1h"), where="ok"),
        Feature("status_top2", agg.top_k("status", 2), window=LIFETIME),
        Feature("amount_bottom4", agg.bottom_k("amount", 4), window=AGGS_WINDOW),
        Feature("qty_bottom1", agg.bottom_k("qty", 1), window=Hop("2h", every="10m")),
        Feature("status_hist", agg.histogram("status"), window=AGGS_WINDOW),
        Feature("qty_hist", agg.histogram("qty"), window=Tumble("1h"), where="amount > 20"),
        Feature("merchant_hist", agg.histogram("merchant_id"), window=LIFETIME),
        Feature("merchant_top2", agg.top_frequent("merchant_id", 2), window=AGGS_WINDOW),
        Feature("status_top1", agg.top_frequent("status", 1), window=LIFETIME),
        Feature("merchants_max5", agg.bounded_count_distinct("merchant_id", 5), window=AGGS_WINDOW),
        Feature("statuses_max2", agg.bounded_count_distinct("status", 2), window=LIFETIME, where="ok"),
        Feature("last_seen", agg.last_event_time(), window=AGGS_WINDOW),
        Feature("last_failed_seen", agg.last_event_time(), window=LIFETIME, where="status = 'FAILED'"),
        Feature("last_seen_1h", agg.last_event_time(), window=Tumble("1h"), where="amount > 20"),
        Feature("merchant_set", agg.distinct_values("merchant_id"), window=AGGS_WINDOW),
        Feature("status_set", agg.distinct_values("status"), window=Tumble("1h"), where="amount > 20"),
        Feature("qty_set_life", agg.distinct_values("qty"), window=LIFETIME),
    ],
)

SHORT, LONG = Session("10m", every="5m"), Session("30m", every="10m")
# Sessions: every aggregation over them, two gaps, a `where` (its own sessions), beside a hop.
GROUP_SESSIONS = FeatureGroup(
    "sessions",
    USER,
    SOURCE,
    [
        Feature("n", agg.count(), window=SHORT),
        Feature("n_long", agg.count(), window=LONG),
        Feature("n_failed", agg.count(), window=SHORT, where="status = 'FAILED'"),
        Feature("duration", agg.session_duration(), window=SHORT),
        Feature("started", agg.session_start(), window=LONG),
        Feature("failed_duration", agg.session_duration(), window=LONG, where="status = 'FAILED'"),
        Feature("qty_sum", agg.sum("qty"), window=SHORT),
        Feature("amount_sum", agg.sum("amount"), window=LONG),
        Feature("amount_avg", agg.avg("amount"), window=SHORT),
        Feature("amount_min", agg.min("amount"), window=LONG),
        Feature("status_max", agg.max("status"), window=SHORT),
        Feature("amount_sd", agg.stddev("amount"), window=LONG),
        Feature("amount_skew", agg.skew("amount"), window=LONG),
        Feature("qty_var", agg.variance("qty"), window=SHORT),
        Feature("amount_kurt", agg.kurtosis("amount"), window=LONG),
        Feature("amount_bottom2", agg.bottom_k("amount", 2), window=SHORT, where="ok"),
        Feature("status_first", agg.first("status"), window=SHORT),
        Feature("amount_last", agg.last("amount"), window=LONG),
        Feature("amount_last2", agg.last_k("amount", 2), window=SHORT),
        Feature("status_first2", agg.first_k("status", 2), window=LONG),
        Feature("qty_top2", agg.top_k("qty", 2), window=LONG),
        Feature("merchants", agg.count_distinct("merchant_id"), window=LONG),
        Feature("merchants_approx", agg.approx_count_distinct("merchant_id"), window=SHORT),
        Feature("merchants_max3", agg.bounded_count_distinct("merchant_id", 3), window=LONG),
        Feature("status_hist", agg.histogram("status"), window=SHORT),
        Feature("status_top1", agg.top_frequent("status", 1), window=LONG),
        Feature("amount_p50", agg.approx_percentile("amount", 0.5), window=LONG),
        Feature("last_seen", agg.last_event_time(), window=SHORT),
        Feature("status_set", agg.distinct_values("status"), window=LONG),
        Feature("n_1h", agg.count(), window=Hop("1h", every="5m")),
    ],
)

GROUP_MIXED = FeatureGroup(
    "mixed",
    USER,
    SOURCE,
    [
        Feature("n_1h", agg.count(), window=Hop("1h", every="5m")),
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="5m")),
        Feature("failed_24h", agg.count(), window=Hop("24h", every="1h"), where="status = 'FAILED'"),
        Feature("merchants_24h", agg.approx_count_distinct("merchant_id"), window=Hop("24h", every="1h")),
        Feature("amounts_24h", agg.last_k("amount", 3), window=Hop("24h", every="1h")),
        Feature("amount_sd_24h", agg.stddev("amount"), window=Hop("24h", every="1h")),
        Feature("n_life", agg.count(), window=Lifetime(every="1h")),
        Feature("qty_life", agg.sum("qty"), window=Lifetime(every="1h")),
        Feature("amount_life", agg.sum("amount"), window=Lifetime(every="1h")),
        Feature("status_first_life", agg.first("status"), window=Lifetime(every="1h")),
        Feature("status_last_life", agg.last("status"), window=Lifetime(every="1h")),
        Feature("amount_min_life", agg.min("amount"), window=Lifetime(every="1h")),
        Feature("merchants_life", agg.count_distinct("merchant_id"), window=Lifetime(every="1h")),
        Feature("statuses_30m", agg.count_distinct("status"), window=Tumble("30m")),
        Feature("merchants_21m", agg.count_distinct("merchant_id"), window=Hop("21m", every="7m")),
        Feature("n_30m", agg.count(), window=Tumble("30m")),
        Feature("amount_avg_30m", agg.avg("amount"), window=Tumble("30m")),
        Feature("amount_p50_30m", agg.approx_percentile("amount", 0.5), window=Tumble("30m")),
        Feature("n_21m", agg.count(), window=Hop("21m", every="7m")),  # 7m: not aligned with hours
        Feature("qty_sum_21m", agg.sum("qty"), window=Hop("21m", every="7m")),
        Feature("amount_max_21m", agg.max("amount"), window=Hop("21m", every="7m")),
    ],
)

GROUP_COMPOSITE = FeatureGroup(
    "card_merchant",
    CARD_MERCHANT,
    SOURCE,
    [
        Feature("n_1h", agg.count(), window=Tumble("1h")),
        Feature("qty_2h", agg.sum("qty"), window=Hop("2h", every="30m")),
        Feature("statuses_2h", agg.last_k("status", 2), window=Hop("2h", every="30m")),
        Feature("amount_max_2h", agg.max("amount"), window=Hop("2h", every="30m")),
        Feature("n_1d", agg.count(), window=Hop("1d", every="6h")),  # no Lifetime: the read is bounded
    ],
)

GROUP_SINGLE_COUNT = FeatureGroup(
    "single_count", USER, SOURCE, [Feature("n", agg.count(), window=Hop("1h", every="5m"))]
)
GROUP_SINGLE_MAX = FeatureGroup(
    "single_max", USER, SOURCE, [Feature("amount_max", agg.max("amount"), window=Hop("30m", every="10m"))]
)
GROUP_SINGLE_TUMBLE = FeatureGroup(
    "single_tumble", USER, SOURCE, [Feature("amount_sum", agg.sum("amount"), window=Tumble("15m"))]
)
SINGLE_GROUPS = [GROUP_SINGLE_COUNT, GROUP_SINGLE_MAX, GROUP_SINGLE_TUMBLE]

# ---------------------------------------------------------------------------------------------------------
# Data

STATUSES = np.array(["APPROVED", "DECLINED", "FAILED"], dtype=object)


def _rows(
    rng: np.random.Generator,
    user: str,
    times: list[pd.Timestamp] | pd.DatetimeIndex,
    *,
    merchants: int = 12,
    null_rate: float = 0.1,
    all_null: bool = False,
) -> pd.DataFrame:
    n = len(times)
    amount = np.round(np.exp(rng.normal(3.5, 1.0, n)), 2)
    qty = rng.integers(-3, 12, n).astype(object)
    status = STATUSES[rng.choice(3, size=n, p=[0.6, 0.2, 0.2])].astype(object)
    ok = rng.random(n) < 0.5
    if all_null:
        amount[:] = np.nan
        qty[:] = None
        status[:] = None
    else:
        amount[rng.random(n) < null_rate] = np.nan
        qty[rng.random(n) < null_rate] = None
        status[rng.random(n) < null_rate / 2] = None
    cards = np.array([f"{user}-c{i}" for i in range(2)], dtype=object)
    return pd.DataFrame(
        {
            "user_id": user,
            "card_id": cards[rng.integers(0, len(cards), n)],
            "merchant_id": rng.integers(0, merchants, n).astype(np.int64),
            "amount": amount,
            "qty": pd.array(list(qty), dtype="Int64"),
            "status": status,
            "ok": ok,
            "event_ts": pd.DatetimeIndex(list(times)).as_unit("us"),
        }
    )


def _random_times(rng: np.random.Generator, n: int, start: pd.Timestamp, span: pd.Timedelta) -> list[pd.Timestamp]:
    offsets = rng.integers(0, span // US, n)
    return [start + int(o) * US for o in offsets]


def make_events(seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    # Events exactly on pane boundaries of every shape used here (5m, 7m, 10m, 20m, 30m, 1h), and 1us around.
    boundaries = [BASE + k * 5 * M for k in range(0, 360, 7)] + [BASE + k * 7 * M for k in range(0, 260, 9)]
    boundaries += [BASE + k * H - US for k in range(1, 30, 3)] + [BASE + k * 20 * M + US for k in range(0, 90, 5)]
    # Timestamp ties: several events of one key in the same microsecond (first/last/last_k break ties by value).
    ties = [t for t in _random_times(rng, 12, BASE + 2 * H, 26 * H) for _ in range(3)]
    ties += [BASE + 6 * H] * 4  # ties exactly on a boundary
    parts = [
        _rows(rng, "u1", _random_times(rng, 150, BASE, 30 * H) + boundaries),
        _rows(rng, "u2", _random_times(rng, 60, BASE, 30 * H) + ties),
        # Dense: hundreds of values in one 4h window (sketches compact), many distinct merchants.
        _rows(rng, "u3", _random_times(rng, 700, BASE + 8 * H, 6 * H), merchants=1_000_000),
        # Only the range-start pair and a few later events.
        _rows(rng, "u4", [MID_START - US, MID_START, MID_START + 3 * H + 17 * M, BASE + 40 * H - US]),
        _rows(rng, "u_null", _random_times(rng, 40, BASE + 4 * H, 20 * H), all_null=True),  # all-null windows
        _rows(rng, "u_sparse", [BASE + 70 * M, BASE + 95 * M, BASE + 95 * M + US]),  # then expires everywhere
        _rows(rng, "u_late", _random_times(rng, 25, BASE + 20 * H, 10 * H)),  # nothing before the mid start
        # Sessions split exactly at their gaps (10m, 30m) and one microsecond inside them.
        _rows(rng, "u_gap", [BASE + 2 * H + d for d in (0 * M, 10 * M, 20 * M - US, 50 * M - US, 80 * M - US, 81 * M)]),
    ]
    events = pd.concat(parts, ignore_index=True)
    events.loc[rng.choice(events.index[events["user_id"] == "u1"], 3, replace=False), "merchant_id"] = 99
    # Delivery order is not event-time order.
    events = events.iloc[rng.permutation(len(events))].reset_index(drop=True)
    events["event_ts"] = events["event_ts"].astype("datetime64[us, UTC]")
    return events


EVENTS = make_events()


@pytest.fixture(scope="module")
def events_df(spark):
    frame = spark.createDataFrame(EVENTS).cache()
    types = dict(frame.dtypes)
    assert types["event_ts"] == "timestamp" and types["qty"] == "bigint" and types["amount"] == "double"
    # NaN amounts arrive in Spark as nulls (as they do through Parquet), like the reference reads them.
    assert frame.where("amount IS NULL").count() == int(EVENTS["amount"].isna().sum())
    yield frame
    frame.unpersist()


# ---------------------------------------------------------------------------------------------------------
# Engine runs, as-of lookups


def us(t: pd.Timestamp) -> int:
    return to_micros(t)


def collect_change_points(group: FeatureGroup, frame, start: pd.Timestamp, end: pd.Timestamp) -> pd.DataFrame:
    rows = change_points(group, frame, us(start), us(end)).rows.toPandas()
    ends = pd.to_datetime(rows[WINDOW_END])
    rows[WINDOW_END] = (ends if ends.dt.tz is not None else ends.dt.tz_localize("UTC")).astype("datetime64[us, UTC]")
    return rows.sort_values([*group.join_keys, WINDOW_END], ignore_index=True)


@pytest.fixture(scope="module")
def computed(events_df) -> Callable[[FeatureGroup, str], pd.DataFrame]:
    """The collected change points of (group, range name), each computed once per module."""

    @cache
    def get(group: FeatureGroup, range_name: str) -> pd.DataFrame:
        start, end = RANGES[range_name]
        return collect_change_points(group, events_df, start, end)

    return get


def as_of(rows: pd.DataFrame, group: FeatureGroup, lookups: pd.DataFrame) -> pd.DataFrame:
    """For every lookup (keys, t): the engine row with the latest window_end <= t (NaN where there is none)."""
    keys = list(group.join_keys)
    if rows.empty:
        return lookups.reset_index(drop=True).assign(_found=False, **{f.name: None for f in group.features})
    left = lookups.assign(_i=np.arange(len(lookups)), _t=lookups["t"].map(to_micros).astype("int64"))
    right = rows.assign(_t=rows[WINDOW_END].map(to_micros).astype("int64"), _found=True)
    for key in keys:  # merge_asof needs identical key dtypes
        left[key] = left[key].astype(right[key].dtype)
    merged = pd.merge_asof(
        left.sort_values("_t"),
        right.drop(columns=[WINDOW_END]).sort_values("_t"),
        on="_t",
        by=keys,
        direction="backward",
        allow_exact_matches=True,
    )
    return merged.sort_values("_i").reset_index(drop=True)


def _floor(t_us: int, step_us: int) -> int:
    return t_us - t_us % step_us


def lookup_times(
    events: pd.DataFrame,
    rows: pd.DataFrame,
    group: FeatureGroup,
    key: tuple,
    start: pd.Timestamp,
    end: pd.Timestamp,
    rng: np.random.Generator,
    per_kind: int = 25,
) -> list[pd.Timestamp]:
    """Times to look a key up at, all in [start, end]: window ends (engine rows and every theoretical change
    point, exactly and 1us before), the range start and end, random times and random multiples of `every`."""
    lo, hi = us(start), us(end)
    mine = rows
    events_of_key = events
    for name, part in zip(group.join_keys, key, strict=True):
        mine = mine[mine[name] == part]
        events_of_key = events_of_key[events_of_key[name] == part]

    def sample(values: list[int] | np.ndarray, n: int = per_kind) -> list[int]:
        values = list(values)
        if len(values) <= n:
            return values
        return [values[i] for i in rng.choice(len(values), n, replace=False)]

    candidates: list[int] = [lo, lo + 1, hi, hi - 1]
    row_ends = [to_micros(t) for t in mine[WINDOW_END]]
    candidates += sample(row_ends) + [e - 1 for e in sample(row_ends)]
    theoretical = []
    for ts in sample([to_micros(t) for t in events_of_key["event_ts"]], 2 * per_kind):
        for feat in group.features:
            every = feat.window.every_s * MICROS
            enter = _floor(ts, every) + every
            theoretical.append(enter)
            if feat.window.size_s is not None:
                theoretical.append(enter + feat.window.size_s * MICROS)
    chosen = sample(theoretical)
    candidates += chosen + [e - 1 for e in chosen]
    candidates += [int(x) for x in rng.integers(lo, hi + 1, per_kind)]
    for every in {f.window.every_s * MICROS for f in group.features}:
        multiples = np.arange(_floor(lo, every) + every, hi + 1, every)
        candidates += sample(multiples, per_kind // 4)
    return [pd.Timestamp(t, unit="us", tz="UTC") for t in sorted(set(candidates)) if lo <= t <= hi]


def _is_null(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float | np.floating) and math.isnan(value)


def _native(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_native(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [_native(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def compare_value(feature: Feature, found: bool, got: Any, want: Any) -> str | None:
    """None if the engine's value matches the reference, else a description of the difference.
    `found` is False when no row precedes t: the engine says the window is empty."""
    kind = feature.aggregation.kind
    if not found:
        got = feature.aggregation.empty_value
    elif isinstance(got, list) and kind.op.empty is Empty.EMPTY_MAP:  # a map as Arrow gives it to pandas
        got = dict(got)
    elif not isinstance(got, dict) and _is_null(got):
        got = None
    got, want = _native(got), _native(want)
    if isinstance(want, pd.Timestamp) and isinstance(got, int):  # session_start from the kernel: µs
        got = pd.Timestamp(got, unit="us", tz="UTC")
    if isinstance(want, pd.Timestamp) and isinstance(got, pd.Timestamp) and got.tzinfo is None:
        got = got.tz_localize("UTC")  # Spark's toPandas gives UTC times without their zone
    if want is None:
        return None if got is None else f"got {got!r}, want null"
    if got is None:
        return f"got null, want {want!r}"
    if kind is AggKind.APPROX_PERCENTILE:
        return None if percentile_ok(float(got), float(want)) else f"got {got!r}, exact {want!r}"
    if kind in (AggKind.SUM, AggKind.AVG) and isinstance(want, float):
        return None if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-7) else f"got {got!r}, want {want!r}"
    if kind in (AggKind.STDDEV, AggKind.VARIANCE, AggKind.SKEW, AggKind.KURTOSIS):
        return None if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-5) else f"got {got!r}, want {want!r}"
    if kind.op.k_max is not None and kind is not AggKind.BOUNDED_COUNT_DISTINCT and not isinstance(want, dict):
        return None if [_native(v) for v in got] == list(want) else f"got {got!r}, want {want!r}"
    if isinstance(want, dict):
        return None if {str(k): int(v) for k, v in dict(got).items()} == want else f"got {got!r}, want {want!r}"
    if isinstance(want, bool | str) and type(got) is not type(want):
        return f"got {got!r} ({type(got).__name__}), want {want!r}"
    return None if got == want else f"got {got!r}, want {want!r}"


def found_flags(merged: pd.DataFrame) -> list[bool]:
    return [flag is True or flag is np.True_ for flag in merged["_found"]]


def check_against_reference(
    events: pd.DataFrame,
    group: FeatureGroup,
    rows: pd.DataFrame,
    start: pd.Timestamp,
    end: pd.Timestamp,
    keys: list[tuple],
    seed: int = 0,
    per_kind: int = 25,
) -> pd.DataFrame:
    """Compare engine as-of values with the reference at many times for `keys`; return the lookup frame."""
    rng = np.random.default_rng(seed)
    pairs = [(key, t) for key in keys for t in lookup_times(events, rows, group, key, start, end, rng, per_kind)]
    want = reference_frame(events, group, pairs)
    got = as_of(rows, group, want[[*group.join_keys, "t"]])
    found = found_flags(got)
    problems = []
    for feat in group.features:
        for i, (f, g, w) in enumerate(zip(found, got[feat.name], want[feat.name], strict=True)):
            problem = compare_value(feat, f, g, w)
            if problem is not None:
                key = tuple(want.loc[i, k] for k in group.join_keys)
                problems.append(f"{feat.name} key={key} t={want.loc[i, 't']}: {problem}")
    assert not problems, f"{len(problems)} mismatches with the reference, e.g.:\n" + "\n".join(problems[:15])
    return want.assign(_found=found, **{f"got_{f.name}": got[f.name] for f in group.features})


def all_keys(group: FeatureGroup) -> list[tuple]:
    frame = EVENTS[list(group.join_keys)].drop_duplicates()
    return [tuple(_native(v) for v in row) for row in frame.itertuples(index=False)]


# ---------------------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("range_name", ["full", "mid"])
def test_every_aggregation_matches_reference(computed, range_name: str) -> None:
    rows = computed(GROUP_AGGS, range_name)
    start, end = RANGES[range_name]
    looked_up = check_against_reference(EVENTS, GROUP_AGGS, rows, start, end, all_keys(GROUP_AGGS), seed=1)
    assert len(looked_up) > 500
    # The data exercised what it was built for.
    if range_name == "full":
        dense = looked_up[looked_up["user_id"] == "u3"]
        assert dense["n"].max() > 400  # large windows: many panes, many distinct values
        assert dense["merchants"].max() > 400
        nulls = looked_up[(looked_up["user_id"] == "u_null") & (looked_up["n"] > 0)]
        assert len(nulls) > 10 and nulls["amount_avg"].isna().all()  # rows in the window, all values null
        assert (looked_up["n"] == 0).sum() > 20
        assert (~looked_up["_found"]).sum() > 5  # lookups before a key's first change point


@pytest.mark.parametrize("range_name", ["full"])  # the range starts are the older aggregations' tests' subject
def test_list_map_and_moment_aggregations_match_reference(computed, range_name: str) -> None:
    rows = computed(GROUP_NEWER, range_name)
    start, end = RANGES[range_name]
    looked_up = check_against_reference(EVENTS, GROUP_NEWER, rows, start, end, all_keys(GROUP_NEWER), seed=5)
    if range_name == "full":  # the data exercised what it was built for
        assert looked_up["merchants_max5"].max() == 5 and looked_up["statuses_max2"].max() == 2
        assert looked_up["status_hist"].map(len).max() == 3 and (looked_up["status_hist"].map(len) == 0).any()
        assert looked_up["amount_top3"].map(lambda v: v is not None and len(v) == 3).any()
        seen = looked_up["last_seen"]
        assert seen.notna().any() and (seen.isna() & looked_up["_found"]).any()  # windows with and without events
        sets = looked_up["merchant_set"].map(len)
        assert (sets == 0).any() and (sets == 1).any() and sets.max() > 100  # empty, one value, many


# A range starting inside sessions (the value it starts with); the splits exactly at a gap (u_gap, before this
# range) are checked in the kernel's stream test, on the same kernel.
@pytest.mark.parametrize("range_name", ["odd"])
def test_every_aggregation_over_sessions_matches_reference(computed, range_name: str) -> None:
    rows = computed(GROUP_SESSIONS, range_name)
    start, end = RANGES[range_name]
    looked_up = check_against_reference(EVENTS, GROUP_SESSIONS, rows, start, end, all_keys(GROUP_SESSIONS), seed=6)
    open_ = looked_up["started"].notna()
    assert open_.any() and (~open_ & looked_up["_found"]).any()  # open and closed sessions were looked up
    assert looked_up["duration"].max() > 600  # sessions that outlast their gap


@pytest.mark.parametrize("range_name", ["full", "odd"])
def test_mixed_windows_and_every_in_one_group(computed, range_name: str) -> None:
    rows = computed(GROUP_MIXED, range_name)
    start, end = RANGES[range_name]
    check_against_reference(EVENTS, GROUP_MIXED, rows, start, end, all_keys(GROUP_MIXED), seed=2)


@pytest.mark.parametrize("range_name", ["full", "odd"])
def test_composite_keys(computed, range_name: str) -> None:
    rows = computed(GROUP_COMPOSITE, range_name)
    start, end = RANGES[range_name]
    keys = all_keys(GROUP_COMPOSITE)
    counts = EVENTS.groupby(["card_id", "merchant_id"]).size().sort_values(ascending=False)
    busy = [(c, int(m)) for c, m in counts.index[:20]]
    rng = np.random.default_rng(3)
    chosen = busy + [keys[i] for i in rng.choice(len(keys), 15, replace=False)]
    # The same merchant under two cards and the same card at two merchants are different keys.
    assert len({m for _, m in busy}) < len(busy) and len({c for c, _ in busy}) < len(busy)
    check_against_reference(EVENTS, GROUP_COMPOSITE, rows, start, end, sorted(set(chosen)), seed=3, per_kind=25)


@pytest.mark.parametrize("group", SINGLE_GROUPS, ids=lambda g: g.name)
def test_single_feature_groups(computed, group: FeatureGroup) -> None:
    for range_name in RANGES:
        start, end = RANGES[range_name]
        check_against_reference(EVENTS, group, computed(group, range_name), start, end, all_keys(group), seed=4)


def _engine_value(rows: pd.DataFrame, group: FeatureGroup, feature: str, key: tuple, t: pd.Timestamp) -> Any:
    got = as_of(rows, group, pd.DataFrame({**{k: [v] for k, v in zip(group.join_keys, key, strict=True)}, "t": [t]}))
    return _native(got.loc[0, feature]) if found_flags(got)[0] else "no row"


def test_specific_points(computed) -> None:
    """Hand-picked times: before any event, at an event on a boundary, 1us before, after expiry."""
    full = computed(GROUP_SINGLE_COUNT, "full")
    g = GROUP_SINGLE_COUNT
    assert _engine_value(full, g, "n", ("u_sparse",), BASE - H) == "no row"  # before any event: empty
    assert _engine_value(full, g, "n", ("u_sparse",), BASE + 70 * M) == "no row"  # event at 01:10, E = 01:10
    assert _engine_value(full, g, "n", ("u_sparse",), BASE + 75 * M - US) == "no row"
    assert _engine_value(full, g, "n", ("u_sparse",), BASE + 75 * M) == 1  # the 01:10 pane entered
    assert _engine_value(full, g, "n", ("u_sparse",), BASE + 100 * M) == 3  # 01:35 and 01:35 + 1us
    assert _engine_value(full, g, "n", ("u_sparse",), BASE + 135 * M - US) == 3
    assert _engine_value(full, g, "n", ("u_sparse",), BASE + 135 * M) == 2  # 01:10 left [01:15, 02:15)
    assert _engine_value(full, g, "n", ("u_sparse",), BASE + 160 * M) == 0  # expired: an explicit 0 row
    assert _engine_value(full, g, "n", ("u_sparse",), BASE + 50 * H) == 0
    # The range start pair of u4: the event 1us before the mid start is in the window ending at it.
    mid = computed(GROUP_SINGLE_COUNT, "mid")
    assert _engine_value(mid, g, "n", ("u4",), MID_START) == 1
    assert _engine_value(mid, g, "n", ("u4",), MID_START + 5 * M - US) == 1
    assert _engine_value(mid, g, "n", ("u4",), MID_START + 5 * M) == 2
    assert _engine_value(mid, g, "n", ("u4",), MID_START + H) == 1
    assert _engine_value(mid, g, "n", ("u4",), MID_START + H + 5 * M) == 0
    # Lifetime with an unaligned range start: u4 has two events before 15:00 and one at 15:17.
    mixed = computed(GROUP_MIXED, "odd")
    odd_start = RANGES["odd"][0]
    assert _engine_value(mixed, GROUP_MIXED, "n_life", ("u4",), odd_start) == 2
    assert _engine_value(mixed, GROUP_MIXED, "n_life", ("u4",), BASE + 16 * H - US) == 2
    assert _engine_value(mixed, GROUP_MIXED, "n_life", ("u4",), BASE + 16 * H) == 3


# ---------------------------------------------------------------------------------------------------------
# Structure of the change-point series

ALL_GROUPS = [GROUP_AGGS, GROUP_MIXED, GROUP_COMPOSITE, *SINGLE_GROUPS]
# The ranges each group is computed over in this module (Spark runs are the slow part).
RANGES_OF = {"aggs": ("full", "mid"), "mixed": ("full", "odd"), "card_merchant": ("full", "odd")}


@pytest.mark.parametrize("group", ALL_GROUPS, ids=lambda g: g.name)
def test_structure(computed, group: FeatureGroup) -> None:
    for range_name in RANGES_OF.get(group.name, tuple(RANGES)):
        rows = computed(group, range_name)
        start, end = RANGES[range_name]
        keys = list(group.join_keys)
        assert list(rows.columns) == [*keys, WINDOW_END, *[f.name for f in group.features]]
        assert not rows.duplicated([*keys, WINDOW_END]).any(), "duplicate (key, window_end) rows"
        assert rows[WINDOW_END].between(start, end).all(), "a window end outside [start, end]"
        assert rows[keys].notna().all().all()


def _nonempty_panes(group: FeatureGroup) -> pd.DataFrame:
    """The (key, pane) pairs that hold events, for a single-feature group."""
    every = group.features[0].window.every_s * MICROS
    panes = EVENTS.assign(_pane=EVENTS["event_ts"].map(lambda t: _floor(to_micros(t), every)))
    return panes[[*group.join_keys, "_pane"]].drop_duplicates()


@pytest.mark.parametrize("group", SINGLE_GROUPS, ids=lambda g: g.name)
def test_rows_grow_with_panes_not_window_length(computed, group: FeatureGroup) -> None:
    """A single-feature group emits at most an entry and an exit row per non-empty (key, pane), plus the
    range's first row per key; never one row per window end."""
    rows = computed(group, "full")
    panes = _nonempty_panes(group)
    per_key_rows = rows.groupby(list(group.join_keys)).size()
    per_key_panes = panes.groupby(list(group.join_keys)).size()
    for key, n_rows in per_key_rows.items():
        assert n_rows <= 2 * per_key_panes[key] + 1, f"{key}: {n_rows} rows for {per_key_panes[key]} panes"
    window = group.features[0].window
    start, end = RANGES["full"]
    every_ends = (us(end) - us(start)) // (window.every_s * MICROS)
    assert len(rows) < every_ends * len(per_key_rows) / 2  # far fewer rows than window ends


def test_count_falls_back_to_zero_row(computed) -> None:
    rows = computed(GROUP_SINGLE_COUNT, "full")
    sparse = rows[rows["user_id"] == "u_sparse"]
    # Last event 01:35:00.000001 -> pane 01:35, leaves the 1h windows at 02:40.
    assert sparse[WINDOW_END].tolist()[-1] == BASE + 160 * M
    assert sparse["n"].tolist()[-1] == 0
    # Every key ends at 0 in the full range, whose end is after all events expired.
    last = rows.groupby("user_id")["n"].last()
    assert (last == 0).all(), last.to_dict()
    mixed = computed(GROUP_MIXED, "full")
    tail = mixed.groupby("user_id").tail(1).set_index("user_id").drop(index="u4")  # u4's 24h windows last longer
    assert (tail[["n_1h", "failed_24h", "merchants_24h", "n_30m", "n_21m"]] == 0).all().all()
    assert tail["amount_max_1h"].isna().all() and tail["amount_avg_30m"].isna().all()
    assert tail["amounts_24h"].isna().all()
    assert (tail["n_life"] > 0).all()  # Lifetime never expires


@pytest.mark.parametrize(
    ("group", "range_name"),
    [(GROUP_SINGLE_COUNT, "mid"), (GROUP_SINGLE_COUNT, "odd"), (GROUP_MIXED, "odd"), (GROUP_AGGS, "mid")],
    ids=["single_count-mid", "single_count-odd", "mixed-odd", "aggs-mid"],
)
def test_first_row_at_range_start_carries_the_value_at_start(computed, group: FeatureGroup, range_name: str) -> None:
    rows = computed(group, range_name)
    start, _ = RANGES[range_name]
    sizes = [f.window.size_s for f in group.features]
    lookback = None if None in sizes else max(s for s in sizes if s is not None) * MICROS
    before = EVENTS[EVENTS["event_ts"] < start]
    if lookback is not None:
        before = before[before["event_ts"].map(to_micros) >= us(start) - lookback]
    keys_before = set(before["user_id"])
    firsts = rows.groupby("user_id").head(1).set_index("user_id")
    assert keys_before, "the data should have keys with events before the start"
    for key in keys_before:
        assert firsts.loc[key, WINDOW_END] == start, f"{key}: first row at {firsts.loc[key, WINDOW_END]}"
    for key in set(firsts.index) - set(EVENTS.loc[EVENTS["event_ts"] < start, "user_id"]):
        assert firsts.loc[key, WINDOW_END] > start, f"{key} has no event before the start"
    assert "u_late" not in keys_before
    if range_name == "mid":
        assert "u4" in keys_before  # its event at start - 1us
    snapshot = rows[rows[WINDOW_END] == start]
    want = reference_frame(EVENTS, group, [((k,), start) for k in snapshot["user_id"]])
    for feat in group.features:
        for key, got, ref in zip(snapshot["user_id"], snapshot[feat.name], want[feat.name], strict=True):
            problem = compare_value(feat, True, got, ref)
            assert problem is None, f"{feat.name} {key} at start: {problem}"


def test_range_end_is_included(computed) -> None:
    """Rows reach window ends up to and including `end`, so the last row per key is the value at `end`."""
    rows = computed(GROUP_SINGLE_COUNT, "mid")
    _, end = RANGES["mid"]
    # u4's event at end - 1us enters the 1h windows at `end` (a multiple of 5m): that row must be there.
    u4 = rows[rows["user_id"] == "u4"]
    assert u4[WINDOW_END].max() == end and u4["n"].iloc[-1] == 1


# ---------------------------------------------------------------------------------------------------------
# Randomized small cases (hypothesis): exhaustive lookups at every boundary

EDGE = Hop("10m", every="5m")
GROUP_EDGE = FeatureGroup(
    "edge",
    USER,
    SOURCE,
    [
        Feature("n", agg.count(), window=EDGE),
        Feature("q", agg.sum("qty"), window=EDGE),
        Feature("q_max", agg.max("qty"), window=Hop("15m", every="5m")),
        Feature("q_last", agg.last("qty"), window=Tumble("5m")),
        Feature("q_first", agg.first("qty"), window=Lifetime(every="5m")),
        Feature("q_last2", agg.last_k("qty", 2), window=Hop("15m", every="5m")),
        Feature("n_even", agg.count(), window=Hop("6m", every="3m"), where="qty >= 0"),
        Feature("t_last", agg.last_event_time(), window=EDGE),
        Feature("t_last_even", agg.last_event_time(), window=Lifetime(every="5m"), where="qty >= 0"),
        Feature("q_set", agg.distinct_values("qty"), window=Hop("15m", every="5m")),
        Feature("q_set_6m", agg.distinct_values("qty"), window=Hop("6m", every="3m")),
    ],
)
_OFFSETS_US = sorted(
    {o * MICROS + d for o in (0, 180, 300, 360, 600, 900, 1080, 1500, 1800, 2400) for d in (-1, 0, 1)} - {-1}
)


SMALL_KEYS = ["a", "b", "c", "d"]  # each key's events are a case of its own: four cases per Spark job


@st.composite
def small_events(draw) -> pd.DataFrame:
    rows = draw(
        st.lists(
            st.tuples(
                st.sampled_from(SMALL_KEYS),
                st.sampled_from(_OFFSETS_US),
                st.one_of(st.none(), st.integers(-3, 3)),
            ),
            min_size=1,
            max_size=60,
        )
    )
    return pd.DataFrame(
        {
            "user_id": [r[0] for r in rows],
            "qty": pd.array([r[2] for r in rows], dtype="Int64"),
            "event_ts": pd.DatetimeIndex([BASE + r[1] * US for r in rows]).as_unit("us").tz_convert("UTC"),
        }
    )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=small_events(), start_offset=st.sampled_from([-600, 0, 300, 420, 901]))
def test_randomized_small_cases(spark, events: pd.DataFrame, start_offset: int) -> None:
    start, end = BASE + start_offset * pd.Timedelta(seconds=1), BASE + 45 * M
    rows = collect_change_points(GROUP_EDGE, spark.createDataFrame(events), start, end)
    times = sorted(
        {start, end}
        | {t for k in range(-3, 16) for t in (BASE + k * 3 * M, BASE + k * 3 * M - US) if start <= t <= end}
        | {t for k in range(-3, 16) for t in (BASE + k * 5 * M, BASE + k * 5 * M - US) if start <= t <= end}
    )
    pairs = [((k,), t) for k in SMALL_KEYS for t in times]
    want = reference_frame(events, GROUP_EDGE, pairs)
    got = as_of(rows, GROUP_EDGE, want[["user_id", "t"]])
    found = found_flags(got)
    for feat in GROUP_EDGE.features:
        for i in range(len(want)):
            problem = compare_value(feat, found[i], got.loc[i, feat.name], want.loc[i, feat.name])
            assert problem is None, f"{feat.name} {want.loc[i, 'user_id']} t={want.loc[i, 't']}: {problem}"
    assert not rows.duplicated(["user_id", WINDOW_END]).any()


# ---------------------------------------------------------------------------------------------------------
# Numerical accuracy


def test_stddev_is_numerically_stable(spark) -> None:
    """stddev of values with a large mean and a small spread (balances, epoch seconds) is the sample stddev.

    Spark's own stddev_samp gets these right to ~1e-9; a (count, sum, sum of squares) partial cancels
    catastrophically in `ss - s*s/n` and returns 0.1013 for the first key and 0.0 for the second.
    """
    group = FeatureGroup("sd", USER, SOURCE, [Feature("sd", agg.stddev("amount"), window=Tumble("1h"))])
    events = pd.DataFrame(
        {
            "user_id": ["balance"] * 3 + ["epoch_s"] * 3,
            "amount": [1e6 + 0.1, 1e6 + 0.2, 1e6 + 0.3, 1.7e9 + 1, 1.7e9 + 2, 1.7e9 + 3],
            "event_ts": pd.DatetimeIndex([BASE + k * M for k in range(6)]).as_unit("us"),
        }
    )
    rows = collect_change_points(group, spark.createDataFrame(events), BASE, BASE + 2 * H)
    at = rows[rows[WINDOW_END] == BASE + H].set_index("user_id")["sd"]
    want = reference_frame(events, group, [(("balance",), BASE + H), (("epoch_s",), BASE + H)])["sd"].tolist()
    assert want == pytest.approx([0.1, 1.0], rel=1e-9)
    assert at["balance"] == pytest.approx(want[0], rel=1e-6)
    assert at["epoch_s"] == pytest.approx(want[1], rel=1e-6)
