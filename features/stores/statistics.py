"""The statistics table of a group: a Delta table at data/statistics/<group>, beside the offline tables, written by
deltalake in the driver (a few rows per write, no Spark job).

One row per (write, feature, day of window_end): the feature's profile (features.kernel.profile: its counts,
moments, sketch, HyperLogLog registers and category counts, which merge; and, for people reading the table,
null_share, std, the quantiles of QUANTILES and distinct), and one row per (write, day) with feature "" and kind
"group": events_in, rows_out, set_aside, late. A stream appends its micro-batches' rows, which reads merge per
day; a backfill replaces the rows of the days it replaces that overlap its range (span_start_us, span_end_us: the
window ends a row covers).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from features.kernel.profile import DAY_US, QUANTILES, RECORD_SCHEMA, FeatureProfile, merge_into, to_records
from features.kernel.profile import from_records as profiles_of_records
from features.stores.delta_open import newest

STATISTICS_DIR = Path("data") / "statistics"
GROUP_ROW = ""  # the feature column of a group's rows
BACKFILL_WRITER, STREAM_WRITER = "backfill", "stream"
COMPACT_EVERY = 200  # a stream's micro-batches between compactions of its finished days (`compact_stream_days`)
COMMIT_ATTEMPTS = 5  # commits tried when another writer committed first (a stream's append beside a backfill)
DAY_ZERO = date(1970, 1, 1)
_GROUP_COUNTS = ("events_in", "rows_out", "set_aside", "late")


def quantile_column(q: float) -> str:
    """The column of a quantile: p05 for 0.05."""
    return f"p{round(q * 100):02d}"


TABLE_SCHEMA = pa.schema(
    [
        ("date", pa.date32()),
        ("writer", pa.string()),
        ("batch", pa.int64()),
        ("span_start_us", pa.int64()),
        ("span_end_us", pa.int64()),
        ("written_at", pa.timestamp("us", "UTC")),
        *RECORD_SCHEMA,
        ("null_share", pa.float64()),
        ("std", pa.float64()),
        *[(quantile_column(q), pa.float64()) for q in QUANTILES],
        ("distinct", pa.float64()),
        *[(name, pa.int64()) for name in _GROUP_COUNTS],
    ]
)


@dataclass(frozen=True)
class GroupDay:
    """A group's counts of one day (events by their time, rows by their window end); None where not known."""

    events_in: int | None = None
    rows_out: int | None = None
    set_aside: int | None = None
    late: int | None = None

    def plus(self, other: GroupDay) -> GroupDay:
        def add(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else a + b

        return GroupDay(*(add(getattr(self, n), getattr(other, n)) for n in _GROUP_COUNTS))


def statistics_table(repo_root: str | Path, group: str) -> str:
    return str((Path(repo_root) / STATISTICS_DIR / group).resolve())


def day_of(moment: datetime) -> int:
    """Days since 1970-01-01 of a UTC time."""
    return (moment.astimezone(UTC).date() - DAY_ZERO).days


def to_date(day: int) -> date:
    return DAY_ZERO + timedelta(days=day)


def record_backfill(
    table: str,
    profiles: Mapping[tuple[int, str], FeatureProfile],
    counts: Mapping[int, GroupDay],
    start: datetime,
    end: datetime,
) -> None:
    """A backfill's statistics of [start, end): the rows of its days that overlap the range are replaced."""
    lo, hi = _micros(start), _micros(end)
    days = range(lo // DAY_US, (hi - 1) // DAY_US + 1)

    def span(day: int) -> tuple[int, int]:
        return max(lo, day * DAY_US), min(hi, (day + 1) * DAY_US)

    rows = _rows(profiles, counts, BACKFILL_WRITER, None, {d: span(d) for d in days})
    predicate = f"day >= {days[0]} AND day <= {days[-1]} AND span_end_us > {lo} AND span_start_us < {hi}"
    _write(table, rows, predicate)


def record_batch(
    table: str,
    profiles: Mapping[tuple[int, str], FeatureProfile],
    counts: Mapping[int, GroupDay],
    batch: int,
    spans: Mapping[int, tuple[int, int]],
) -> None:
    """A stream micro-batch's statistics, appended. `spans`: per day, the window ends its rows cover."""
    _write(table, _rows(profiles, counts, STREAM_WRITER, batch, spans), None)


def _rows(
    profiles: Mapping[tuple[int, str], FeatureProfile],
    counts: Mapping[int, GroupDay],
    writer: str,
    batch: int | None,
    spans: Mapping[int, tuple[int, int]],
) -> pa.Table:
    now = datetime.now(UTC)
    records = to_records(dict(profiles)).to_pylist()
    for day, c in sorted(counts.items()):
        records.append({"day": day, "feature": GROUP_ROW, "kind": "group", **{n: getattr(c, n) for n in _GROUP_COUNTS}})
    for r in records:
        lo, hi = spans.get(r["day"], (r["day"] * DAY_US, (r["day"] + 1) * DAY_US))
        r.update(date=to_date(r["day"]), writer=writer, batch=batch, span_start_us=lo, span_end_us=hi, written_at=now)
        if r["feature"] != GROUP_ROW:
            p = profiles[(r["day"], r["feature"])]
            r.update(null_share=p.null_share, std=p.std, distinct=p.distinct())
            r.update({quantile_column(q): p.quantile(q) for q in QUANTILES})
    return pa.Table.from_pylist(records, schema=TABLE_SCHEMA)


def _write(table: str, rows: pa.Table, predicate: str | None) -> None:
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError

    Path(table).mkdir(parents=True, exist_ok=True)
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            if not _exists(table):
                write_deltalake(table, rows, mode="append")
            elif predicate is None:
                write_deltalake(newest(table), rows, mode="append")
            else:
                write_deltalake(table, rows, mode="overwrite", predicate=predicate)
            return
        except CommitFailedError:  # another writer's commit came first: make this one again after it
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


def _exists(table: str) -> bool:
    return (Path(table) / "_delta_log").is_dir()


def _micros(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def read_rows(table: str, first: int | None = None, last: int | None = None) -> pa.Table | None:
    """The table's rows of days [first, last] (all by default), None when there is no table."""
    if not _exists(table):
        return None
    from deltalake import DeltaTable

    filters = [f for f in (("day", ">=", first), ("day", "<=", last)) if f[2] is not None]
    return DeltaTable(table).to_pyarrow_table(filters=filters or None)


@dataclass(frozen=True)
class DayStatistics:
    """What the table holds of some days, merged: each (day, feature)'s profile and each day's group counts."""

    profiles: dict[tuple[int, str], FeatureProfile]
    counts: dict[int, GroupDay]

    def days(self) -> list[int]:
        return sorted({d for d, _ in self.profiles} | set(self.counts))

    def features(self) -> list[str]:
        return sorted({f for _, f in self.profiles})

    def over(self, days: Iterable[int], feature: str) -> FeatureProfile | None:
        """The feature's profile over several days, merged."""
        wanted = set(days)
        merged: dict[str, FeatureProfile] = {}
        for (d, f), p in sorted(self.profiles.items()):
            if f == feature and d in wanted:
                merge_into(merged, {f: p})
        return merged.get(feature)


def read_statistics(table: str, first: int | None = None, last: int | None = None) -> DayStatistics:
    """The days [first, last] of the table (all by default), each (day, feature)'s rows merged."""
    return merged(read_rows(table, first, last))


def merged(rows: pa.Table | None) -> DayStatistics:
    """Rows of the table, each (day, feature)'s merged."""
    profiles: dict[tuple[int, str], FeatureProfile] = {}
    counts: dict[int, GroupDay] = {}
    if rows is None or rows.num_rows == 0:
        return DayStatistics(profiles, counts)
    features = rows.filter(pc.not_equal(rows.column("feature"), GROUP_ROW))
    for key, profile in profiles_of_records(features):
        merge_into(profiles, {key: profile})
    groups = rows.filter(pc.equal(rows.column("feature"), GROUP_ROW))
    for r in groups.select(["day", *_GROUP_COUNTS]).to_pylist():
        found = GroupDay(*(r[n] for n in _GROUP_COUNTS))
        counts[r["day"]] = counts[r["day"]].plus(found) if r["day"] in counts else found
    return DayStatistics(profiles, counts)


def compact_stream_days(table: str, before: int) -> int:
    """A stream's rows of the days before `before` (days since 1970-01-01), one per micro-batch, merged into one per
    (day, feature) in one commit, then the files and log entries no longer read removed: a stream that runs for
    months keeps a few rows a day. Merging is exact (features.kernel.profile), so reads are unchanged. Returns the
    rows removed. A commit another writer made first (a backfill of one of those days) makes this round give up:
    retried on stale rows, it could put back what the backfill replaced; the next round tries again."""
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    rows = read_rows(table, last=before - 1)
    if rows is None:
        return 0
    streamed = rows.filter(pc.equal(rows.column("writer"), STREAM_WRITER))
    keys = zip(streamed.column("day").to_pylist(), streamed.column("feature").to_pylist(), strict=True)
    if streamed.num_rows == len(set(keys)):
        return 0  # one row per (day, feature) already
    found = merged(streamed)
    compacted = _rows(found.profiles, found.counts, STREAM_WRITER, None, {})
    try:
        predicate = f"writer = '{STREAM_WRITER}' AND day < {before}"
        write_deltalake(table, compacted, mode="overwrite", predicate=predicate)
    except CommitFailedError:
        return 0
    delta = DeltaTable(table)
    with contextlib.suppress(CommitFailedError):  # a write came between: its files wait for the next round
        delta.optimize.compact()
    # Files are removed an hour after no version needs them: a read under way (`features monitor`) keeps its files.
    delta.vacuum(retention_hours=1, enforce_retention_duration=False, dry_run=False)
    delta.create_checkpoint()
    delta.cleanup_metadata()
    return streamed.num_rows - compacted.num_rows
