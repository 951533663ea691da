"""Synthetic card transactions for the demo, the tests and the benchmarks.

Vectorized numpy: millions of events generate in seconds, and one seed always gives the same frame.

What the data looks like:
- users: activity is log-normally skewed (a few users are far more active than the median one); each owns
  1-3 cards and mostly shops at a handful of favourite merchants;
- merchants: Zipf-like popularity;
- time: daily seasonality (quiet around 04:00 UTC, busiest around 16:00), microsecond timestamps, UTC;
- amounts: log-normal around a per-user typical spend, rounded to cents, about `null_amount_rate` null;
- fraud: some cards are compromised at a random time and, within minutes, produce a burst of FAILED/DECLINED
  attempts at merchants new to the user, then a few high-amount APPROVED charges (all labelled is_fraud=1);
  a small base rate of other transactions is labelled fraud too;
- delivery: rows are returned in delivery order. A `late_fraction` of events arrive late (mostly up to a few
  minutes, a few more than 10 minutes, i.e. beyond the default watermark), so they come after later events.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

COLUMNS = ("txn_id", "user_id", "card_id", "merchant_id", "amount", "status", "event_ts", "is_fraud")
STATUSES = ("APPROVED", "DECLINED", "FAILED")
_APPROVED, _DECLINED, _FAILED = range(3)

_S = 1_000_000  # microseconds per second
_DAY = 86_400 * _S

# Normal traffic.
_STATUS_P = (0.955, 0.03, 0.015)
_FAVOURITES = 8  # merchants a user mostly shops at, so that a burst at new merchants stands out
_FAVOURITE_SHARE = 0.8
_ZIPF_EXPONENT = 1.1
_ACTIVITY_SIGMA = 1.2  # log-normal spread of user activity: the top 1% are ~16x the median user
_BASE_FRAUD_RATE = 0.0005

# Fraud bursts: about this share of all events, from at most this share of all cards.
_BURST_SHARE = 0.004
_MAX_COMPROMISED_SHARE = 0.05
_MEAN_BURST_SIZE = 8.5  # 3-10 attempts plus 1-3 charges
_MAX_BURST_US = 30 * 60 * _S

# Late delivery: most late events by up to 5 minutes, the rest by 10-30 minutes.
_VERY_LATE_SHARE = 0.05

# JSON lines are built column by column with numpy strings; these characters need the json module.
_TEXT = np.dtypes.StringDType()
_JSON_ESCAPES = re.compile(r'["\\\x00-\x1f]')


@dataclass(frozen=True)
class _Population:
    """Who shops where: per-user, per-card and per-merchant attributes drawn once per seed."""

    user_weight: np.ndarray  # probability that an event belongs to each user
    user_mu: np.ndarray  # log of each user's typical amount
    card_first: np.ndarray  # index of each user's first card
    card_count: np.ndarray  # 1-3 cards per user
    card_owner: np.ndarray  # user of each card
    favourites: np.ndarray  # (n_users, _FAVOURITES) merchant indexes
    merchant_p: np.ndarray  # Zipf-like popularity

    @property
    def n_users(self) -> int:
        return len(self.user_weight)

    @property
    def n_cards(self) -> int:
        return len(self.card_owner)

    @property
    def n_merchants(self) -> int:
        return len(self.merchant_p)


def _population(rng: np.random.Generator, n_users: int, n_merchants: int) -> _Population:
    activity = rng.lognormal(0.0, _ACTIVITY_SIGMA, n_users)
    card_count = rng.integers(1, 4, n_users)
    card_first = np.cumsum(card_count) - card_count
    popularity = 1.0 / np.arange(1, n_merchants + 1) ** _ZIPF_EXPONENT
    # Shuffle so that merchant id order says nothing about popularity.
    merchant_p = rng.permutation(popularity / popularity.sum())
    return _Population(
        user_weight=activity / activity.sum(),
        user_mu=rng.normal(3.2, 0.5, n_users),
        card_first=card_first,
        card_count=card_count,
        card_owner=np.repeat(np.arange(n_users), card_count),
        favourites=rng.choice(n_merchants, size=(n_users, _FAVOURITES), p=merchant_p),
        merchant_p=merchant_p,
    )


def _seasonal_times(rng: np.random.Generator, n: int, start_us: int, span_us: int) -> np.ndarray:
    """`n` offsets in [0, span_us) whose density follows the time of day (inverse CDF over small bins)."""
    bin_us = max(60 * _S, -(-span_us // 2_000_000))  # minute bins, coarser only for very long spans
    starts = np.arange(0, span_us, bin_us, dtype=np.int64)
    lengths = np.minimum(bin_us, span_us - starts)
    hour = ((start_us + starts + lengths // 2) % _DAY) / (3600 * _S)
    intensity = 0.15 + 0.85 * (1.0 - np.cos(2.0 * np.pi * (hour - 4.0) / 24.0)) / 2.0
    cdf = np.cumsum(intensity * lengths)
    idx = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), len(starts) - 1)
    return starts[idx] + (rng.random(n) * lengths[idx]).astype(np.int64)


def _normal_events(
    rng: np.random.Generator, pop: _Population, n: int, start_us: int, span_us: int
) -> dict[str, np.ndarray]:
    users = rng.choice(pop.n_users, size=n, p=pop.user_weight)
    cards = pop.card_first[users] + (rng.random(n) * pop.card_count[users]).astype(np.int64)
    merchants = np.where(
        rng.random(n) < _FAVOURITE_SHARE,
        pop.favourites[users, rng.integers(0, _FAVOURITES, n)],
        rng.choice(pop.n_merchants, size=n, p=pop.merchant_p),
    )
    amount = np.exp(pop.user_mu[users] + rng.normal(0.0, 0.9, n))
    status = rng.choice(len(STATUSES), size=n, p=_STATUS_P)
    fraud = rng.random(n) < _BASE_FRAUD_RATE
    # The base-rate fraud is an unusual charge: any merchant, a few times the user's typical amount.
    merchants = np.where(fraud, rng.integers(0, pop.n_merchants, n), merchants)
    amount = np.where(fraud, amount * rng.uniform(3.0, 8.0, n), amount)
    return {
        "user": users,
        "card": cards,
        "merchant": merchants,
        "amount": amount,
        "status": status,
        "ts": _seasonal_times(rng, n, start_us, span_us),
        "fraud": fraud.astype(np.int64),
    }


def _burst_count(n_events: int, n_cards: int) -> int:
    wanted = round(n_events * _BURST_SHARE / _MEAN_BURST_SIZE)
    if n_events >= 50:
        wanted = max(wanted, 1)  # even small test data sets show the pattern
    return min(wanted, max(1, int(n_cards * _MAX_COMPROMISED_SHARE)))


def _fraud_bursts(rng: np.random.Generator, pop: _Population, n_events: int, span_us: int) -> dict[str, np.ndarray]:
    """Compromised cards: FAILED/DECLINED attempts within minutes at new merchants, then large charges."""
    n_bursts = _burst_count(n_events, pop.n_cards)
    cards = rng.choice(pop.n_cards, size=n_bursts, replace=False)
    attempts = rng.integers(3, 11, n_bursts)
    sizes = attempts + rng.integers(1, 4, n_bursts)
    # Tiny data sets: keep the bursts to at most half of the events.
    keep = np.cumsum(sizes) <= n_events // 2
    cards, attempts, sizes = cards[keep], attempts[keep], sizes[keep]
    total = int(sizes.sum())

    burst = np.repeat(np.arange(len(sizes)), sizes)
    first = np.cumsum(sizes) - sizes
    pos = np.arange(total) - np.repeat(first, sizes)
    is_attempt = pos < attempts[burst]
    gaps = rng.exponential(np.where(is_attempt, 20.0 * _S, 60.0 * _S))
    gaps[pos == 0] = 0.0
    elapsed = np.cumsum(gaps)
    offset = np.minimum(elapsed - np.repeat(elapsed[first], sizes), _MAX_BURST_US - 1).astype(np.int64)
    compromised_at = (rng.random(len(sizes)) * max(span_us - _MAX_BURST_US, 1)).astype(np.int64)

    amount = np.where(
        is_attempt,
        rng.lognormal(np.log(40.0), 1.2, total),  # card testing and declined tries
        rng.lognormal(np.log(600.0), 0.4, total),  # the cash-out: far above a typical spend
    )
    status = np.where(is_attempt, np.where(rng.random(total) < 0.6, _FAILED, _DECLINED), _APPROVED)
    return {
        "user": pop.card_owner[cards][burst],
        "card": cards[burst],
        "merchant": _unfamiliar_merchants(rng, pop, pop.card_owner[cards][burst]),
        "amount": amount,
        "status": status,
        "ts": np.minimum(compromised_at[burst] + offset, span_us - 1),
        "fraud": np.ones(total, dtype=np.int64),
    }


def _unfamiliar_merchants(rng: np.random.Generator, pop: _Population, users: np.ndarray) -> np.ndarray:
    """Merchants a user is unlikely to have seen: the less popular half, never one of the user's favourites."""
    tail = np.flatnonzero(pop.merchant_p <= np.median(pop.merchant_p))
    merchants = tail[rng.integers(0, len(tail), len(users))]
    for _ in range(20):  # redraw the few that hit a favourite; each round leaves a small fraction
        clash = (pop.favourites[users] == merchants[:, None]).any(axis=1)
        if not clash.any():
            break
        merchants[clash] = tail[rng.integers(0, len(tail), int(clash.sum()))]
    return merchants


def _delivery_order(rng: np.random.Generator, ts: np.ndarray, late_fraction: float) -> np.ndarray:
    """A permutation of event-time-sorted rows into delivery order (late events move behind later ones)."""
    n = len(ts)
    late = rng.random(n) < late_fraction
    very_late = rng.random(n) < _VERY_LATE_SHARE
    if late.any() and not (late & very_late).any():
        very_late[np.flatnonzero(late)[0]] = True  # streaming tests always get one event past the watermark
    delay = np.where(
        very_late,
        rng.integers(10 * 60 * _S + 1, 30 * 60 * _S, n),
        rng.integers(1 * _S, 5 * 60 * _S, n),
    )
    delivered = ts + np.where(late, delay, 0)
    return np.argsort(delivered, kind="stable")


def _ids(prefix: str, n: int, min_width: int) -> np.ndarray:
    width = max(min_width, len(str(max(n - 1, 0))))
    return np.array([f"{prefix}{i:0{width}d}" for i in range(n)], dtype=object)


def _utc_micros(value: datetime | str | pd.Timestamp) -> int:
    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return ts.value // 1000


def _check(n_events: int, n_users: int, days: float, n_merchants: int, rates: dict[str, float]) -> None:
    if n_events < 0:
        raise ValueError(f"n_events must be >= 0, got {n_events}")
    if n_users < 1:
        raise ValueError(f"n_users must be >= 1, got {n_users}")
    if n_merchants < 1:
        raise ValueError(f"n_merchants must be >= 1, got {n_merchants}")
    if not days > 0:
        raise ValueError(f"days must be > 0, got {days}")
    for name, rate in rates.items():
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {rate}")


def generate_transactions(
    n_events: int,
    n_users: int,
    start: datetime | str,
    days: float,
    seed: int = 0,
    *,
    n_merchants: int | None = None,
    null_amount_rate: float = 0.01,
    late_fraction: float = 0.02,
) -> pd.DataFrame:
    """`n_events` card transactions with event_ts in [start, start + days), in delivery order.

    Columns, in this order (`COLUMNS`): txn_id, user_id, card_id, merchant_id (str), amount (float64, NaN
    where null), status (str, one of `STATUSES`), event_ts (datetime64[us, UTC]), is_fraud (int64 0/1).
    A naive `start` is read as UTC. txn ids number the events in event-time order.
    """
    n_merchants = max(50, n_users // 5) if n_merchants is None else n_merchants
    _check(n_events, n_users, days, n_merchants, {"null_amount_rate": null_amount_rate, "late_fraction": late_fraction})
    rng = np.random.default_rng(seed)
    start_us = _utc_micros(start)
    span_us = max(int(days * _DAY), 1)
    pop = _population(rng, n_users, n_merchants)

    bursts = _fraud_bursts(rng, pop, n_events, span_us)
    normal = _normal_events(rng, pop, n_events - len(bursts["ts"]), start_us, span_us)
    cols = {name: np.concatenate([normal[name], bursts[name]]) for name in normal}
    by_time = np.argsort(cols["ts"], kind="stable")
    order = _delivery_order(rng, cols["ts"][by_time], late_fraction)
    # One gather straight into delivery order; order[i] is row i's rank in event time.
    cols = {name: values[by_time[order]] for name, values in cols.items()}

    amount = np.maximum(np.round(cols["amount"], 2), 0.01)
    amount[rng.random(n_events) < null_amount_rate] = np.nan
    frame = pd.DataFrame(
        {
            # txn ids follow event time, so a reader can tell how far a delivered row is out of order.
            "txn_id": _ids("t", n_events, 9)[order],
            "user_id": _ids("u", pop.n_users, 6)[cols["user"]],
            "card_id": _ids("c", pop.n_cards, 7)[cols["card"]],
            "merchant_id": _ids("m", pop.n_merchants, 5)[cols["merchant"]],
            "amount": amount.astype(np.float64),
            "status": np.array(STATUSES, dtype=object)[cols["status"]],
            "event_ts": (start_us + cols["ts"]).astype("datetime64[us]"),
            "is_fraud": cols["fraud"].astype(np.int64),
        },
        copy=False,  # the arrays are fresh; skip pandas' copy into consolidated blocks
    )
    frame["event_ts"] = frame["event_ts"].dt.tz_localize("UTC")
    return frame


def _json_literals(values: pd.Series) -> np.ndarray:
    """Every value of a column as JSON text ("null" when missing), vectorized with numpy strings.

    Floats use numpy's shortest round-trip repr, so they read back bit for bit; timestamps become
    ISO-8601 UTC with microseconds and a Z, e.g. "2026-01-01T00:00:00.123456Z" (naive ones are read as UTC).
    """
    missing = values.isna().to_numpy()
    if pd.api.types.is_datetime64_any_dtype(values):
        naive = values.dt.tz_convert("UTC").dt.tz_localize(None) if values.dt.tz is not None else values
        iso = np.datetime_as_string(naive.to_numpy().astype("datetime64[us]"), unit="us").astype(_TEXT)
        text = np.strings.add(np.strings.add('"', iso), 'Z"')
    elif pd.api.types.is_bool_dtype(values):
        text = np.where(values.fillna(False).to_numpy(bool), "true", "false").astype(_TEXT)
    elif pd.api.types.is_integer_dtype(values):
        text = values.fillna(0).to_numpy(np.int64).astype(_TEXT)
    elif pd.api.types.is_float_dtype(values):
        floats = values.to_numpy(np.float64, na_value=np.nan)
        missing |= ~np.isfinite(floats)  # JSON has no NaN or Infinity
        text = floats.astype(_TEXT)
    else:
        text = _json_strings(values, missing)
    return np.where(missing, "null", text).astype(_TEXT)


def _json_strings(values: pd.Series, missing: np.ndarray) -> np.ndarray:
    plain = values.to_numpy(object)
    present = plain[~missing]
    if pd.api.types.infer_dtype(present) in ("string", "empty") and not _JSON_ESCAPES.search("".join(present)):
        # The common case (ids, codes): nothing to escape, so quoting is enough.
        quoted = np.where(missing, "", plain).astype(_TEXT)
        return np.strings.add(np.strings.add('"', quoted), '"')
    # Quotes, backslashes, control characters or non-strings: let the json module escape each value.
    return np.array([json.dumps(v, ensure_ascii=False, default=str) for v in plain], dtype=_TEXT)


def _write_parquet(chunk: pd.DataFrame, target: Path) -> None:
    table = pa.Table.from_pandas(chunk, preserve_index=False)
    # Naive timestamps are read as UTC; every timestamp is stored as microseconds UTC.
    schema = pa.schema(
        [pa.field(f.name, pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type) else f for f in table.schema]
    )
    pq.write_table(table.cast(schema), target)


def _write_json(chunk: pd.DataFrame, target: Path) -> None:
    lines = np.full(len(chunk), "{", dtype=_TEXT)
    for i, name in enumerate(chunk.columns):
        key = ("," if i else "") + json.dumps(str(name)) + ":"
        lines = np.strings.add(np.strings.add(lines, key), _json_literals(chunk[name]))
    with open(target, "w", encoding="utf-8") as out:
        out.writelines(np.strings.add(lines, "}\n").tolist())


_WRITERS = {"parquet": _write_parquet, "json": _write_json}
_MILLISECOND_NS = 1_000_000


def write_events(
    df: pd.DataFrame,
    path: str | os.PathLike[str],
    *,
    format: str = "parquet",  # noqa: A002 - matches EventSource(format=...)
    n_files: int = 1,
    start_index: int = 0,
) -> list[str]:
    """Write `df`, in its row order, as `n_files` consecutive chunks into the folder `path` (created).

    Files are named part-NNNNN.parquet / part-NNNNN.json from `start_index`, so that lexical order is
    delivery order. Each file is written under a hidden name first and then renamed, because Spark's file
    stream source ignores names starting with "." and must never see a half-written file. Spark delivers files
    in modification-time order and leaves ties in listing order, so each file gets a modification time at least
    a millisecond after every file already in the folder.
    """
    writer = _WRITERS.get(format)
    if writer is None:
        raise ValueError(f"format must be one of {sorted(_WRITERS)}, got {format!r}")
    if n_files < 1 or start_index < 0:
        raise ValueError(f"need n_files >= 1 and start_index >= 0, got {n_files} and {start_index}")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    bounds = [i * len(df) // n_files for i in range(n_files + 1)]
    paths = []
    newest = max((entry.stat().st_mtime_ns for entry in os.scandir(folder) if entry.is_file()), default=0)
    for i in range(n_files):
        target = folder / f"part-{start_index + i:05d}.{format}"
        hidden = folder / f".{target.name}.tmp"
        writer(df.iloc[bounds[i] : bounds[i + 1]], hidden)
        newest = max(time.time_ns(), newest + _MILLISECOND_NS)
        os.utime(hidden, ns=(newest, newest))
        os.replace(hidden, target)
        paths.append(str(target))
    return paths
