"""Backfill: compute a group's change points for [start, end), replace them in the offline table, and bring
the online store up to each key's value as of `end`."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession

from features.engine.batch import ChangePoints, TableRows, change_points, read_lower_bound
from features.engine.files import SetAsideFile, file_days
from features.engine.online_rows import write_online
from features.engine.session import is_local, session_soon
from features.engine.source import SourceRead, observed_count, quarantine_counts, read_source
from features.errors import ConfigError
from features.pipelines.backfill_result import BackfillResult
from features.pipelines.options import BackfillOptions
from features.progress import spark_progress
from features.repo import Repo
from features.spec import WINDOW_END, FeatureGroup
from features.spec.fingerprint import definition_hash, feature_hashes
from features.stores.manifest import read_manifest
from features.stores.manifest import update as update_manifest
from features.stores.offline import Staged, read_table

if TYPE_CHECKING:
    from pyspark.sql import Observation

    from features.kernel.profile import FeatureProfile
    from features.quality import ValidationReport
    from features.quality.profiling import ProfileSoon
    from features.stores.online import OnlineWriter


def parse_time(value: str | datetime, field: str) -> datetime:
    """An ISO-8601 time as an aware UTC datetime (naive input is taken as UTC)."""
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"{field}: {value!r} is not an ISO-8601 time; write e.g. 2026-01-31 or 2026-01-31T06:00"
            ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def check_range(start: datetime, end: datetime) -> None:
    """A ConfigError unless [start, end) holds some time (equal times are an empty range, not a swapped one)."""
    if start == end:
        raise ConfigError(
            f"--start and --end are both {start.isoformat()}: the range [--start, --end) is empty; give an --end "
            "after --start (e.g. --start 2026-01-01 --end 2026-01-02 for one day)"
        )
    if start > end:
        raise ConfigError(f"--start {start.isoformat()} is not before --end {end.isoformat()}; swap them")


def micros(t: datetime) -> int:
    return int(t.timestamp()) * 1_000_000 + t.microsecond


def backfill(
    repo: Repo,
    start: str | datetime,
    end: str | datetime,
    groups: list[str] | None = None,
    *,
    spark: SparkSession | None = None,
    online: bool = True,
    progress: bool | None = None,
    on_invalid: str | None = None,
    now: datetime | None = None,
    track: bool = True,
    on_swapped: Callable[[FeatureGroup, date], None] | None = None,
    features: Sequence[str] | None = None,
) -> list[BackfillResult]:
    """Backfill the named groups (all by default) over [start, end).

    `on_invalid` overrides each group's policy for change points that fail validation ("fail", the default,
    or "quarantine"); `now` is the current time for the source's `max_future` check (default: the clock).
    `track`: record the run in MLflow (features.ml.tracking: definitions, range, counts, validation).
    `on_swapped(group, day)`: called as each date partition of a group is swapped into its table.
    `features`: of one group, compute only these (see `backfill_group`)."""
    options = BackfillOptions(online=online, on_invalid=on_invalid, track=track, progress=progress, now=now)
    return backfill_range(repo, start, end, groups, options, spark=spark, on_swapped=on_swapped, features=features)


def backfill_range(
    repo: Repo,
    start: str | datetime,
    end: str | datetime,
    groups: list[str] | None,
    options: BackfillOptions,
    *,
    spark: SparkSession | None = None,
    on_swapped: Callable[[FeatureGroup, date], None] | None = None,
    features: Sequence[str] | None = None,
) -> list[BackfillResult]:
    """`backfill`, its options as one value (features.pipelines.options)."""
    start_t, end_t = parse_time(start, "--start"), parse_time(end, "--end")
    check_range(start_t, end_t)
    selected = repo.select(groups)
    # Fail before Spark starts when a store cannot take writes (e.g. the repo was never applied).
    writers = {g.name: ready_writer(repo, g) for g in selected} if options.online else {}
    session = session_soon(spark)  # the JVM starts while the MLflow run is set up
    from features.ml import tracking

    params = {
        "start": start_t,
        "end": end_t,
        "online": options.online,
        "on_invalid": options.on_invalid or "group default",
    }
    # The run is made in the background, while Spark starts and the pass is planned; the groups wait for it
    # before they write anything.
    with tracking.start_run(repo, "backfill", selected, params, enabled=options.track, background=True) as run:
        waiting = time.perf_counter()
        spark = session()
        shared = {"spark_start": time.perf_counter() - waiting}
        results = []
        for g in selected:
            result = backfill_group(
                spark,
                repo,
                g,
                start_t,
                end_t,
                options,
                writer=writers.get(g.name),
                on_swapped=None if on_swapped is None else functools.partial(on_swapped, g),
                features=features,
                before_writing=run.ready,
            )
            result.timings.update(shared)
            shared = dict.fromkeys(shared, 0.0)  # paid once per run
            run.log_result(result)
            results.append(result)
    return results


def ready_writer(repo: Repo, group: FeatureGroup) -> OnlineWriter:
    """The group's online writer, checked to be able to write (types from the declared or stored schema)."""
    from features.stores.feast_objects import source_schema
    from features.stores.online import online_writer

    writer = online_writer(repo, group, group.output_types(source_schema(group, repo.root)))
    writer.check_ready()
    return writer


class Laps:
    """Where a backfill's time goes: `lap(name)` adds the time since the last lap (or the start) to `name`."""

    def __init__(self) -> None:
        self.began = self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def total(self) -> float:
        return time.perf_counter() - self.began


@dataclass(frozen=True)
class SourcePass:
    """What the read stage gives the others: the source's records of the range, not read yet (one Spark pass reads
    them for the change points and counts the bad ones), and the part of the group computed."""

    source: SourceRead
    computing: FeatureGroup  # the group, or the features of it computed (`features`)
    beside: TableRows | None  # the table's rows of the others, when only some are computed
    events: DataFrame  # the good events of [lower bound, end), counting bad records (and events per day) as read
    bad_seen: Observation  # that count of bad records
    rejected: DataFrame  # the bad records of the range
    events_per_day: Observation | None  # that count of events per day, for the statistics
    table: str  # the offline table
    records: Path  # where the bad records go

    @property
    def only(self) -> tuple[str, ...]:
        """The features computed, when only some are; () when all are."""
        return () if self.beside is None else tuple(f.name for f in self.computing.features)


@dataclass
class Written:
    """What the validate and publish stages did (filled as they go: the set-aside stage needs the days swapped in
    before a failure too)."""

    report: ValidationReport | None = None
    batch_quarantined: str | None = None  # where the batch went when it failed validation under "quarantine"
    rows_out: int = 0
    online_rows: int = 0
    swapped: list[date] = field(default_factory=list)  # the date partitions swapped into the table
    profiles: Mapping[tuple[int, str], FeatureProfile] | None = None  # the rows' statistics


def backfill_group(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    start: datetime,
    end: datetime,
    options: BackfillOptions,
    *,
    writer: OnlineWriter | None = None,
    on_swapped: Callable[[date], None] | None = None,
    features: Sequence[str] | None = None,
    before_writing: Callable[[], object] | None = None,
) -> BackfillResult:
    """Backfill one group: read the source, compute the change points, validate them, publish them (the offline
    commit, then the online store) or set the batch aside, and set the bad source records aside. A failed validation
    does what the policy says: raise ValidationFailed ("fail", writing nothing) or set the batch aside ("quarantine",
    writing nothing of it).

    `features`: compute only these; the other features' values come from the table's rows (features.kernel.beside),
    which must hold them over the range, as computed with the current definition. Online, only these are written.

    `before_writing`: called once the rows are computed and validated, before anything is written (and before
    a failed batch is set aside); its error stops the backfill there."""
    from features import quality

    clock = Laps()
    chosen = quality.policy(group, quality.BACKFILL_DEFAULT, options.on_invalid)
    read = read_stage(spark, repo, group, start, end, options, features)
    if options.online and writer is None:
        writer = ready_writer(repo, group)
    if read.only and writer is not None:
        # The others' values online stay as the store has them: the table's rows hold them before `end`, not at it.
        writer = writer.only(list(read.only))
    written = Written()
    try:
        with spark_progress(spark, f"backfill {group.name}", options.progress):
            computed = compute_stage(read, start, end)
            with Staged(computed.with_latest, read.table, start, end, in_driver=is_local(spark)) as staged:
                # Spark computes the rows when they are first needed: in the validation's screen (one pass that
                # also caches them for both stores), or without validation in the offline commit.
                clock.lap("plan")
                written.report, profiling = validate_stage(group, staged, options, start, end)
                if before_writing is not None:
                    clock.lap("compute_validation")
                    before_writing()
                    clock.lap("tracking")
                if written.report is not None and not written.report.success:
                    what = f"change points for [{start.isoformat()}, {end.isoformat()}]"
                    written.batch_quarantined = quality.handle_invalid(
                        written.report, staged.rows, group, repo.root, chosen, what
                    )
                else:
                    clock.lap("compute_validation")
                    publish_stage(staged, group, writer, profiling, written, clock)
    except Exception as exc:  # the bad records are set aside whatever else failed
        try:
            set_aside_stage(read, group, written.swapped, clock, failed=True)
        except Exception as also:
            exc.add_note(f"Setting the bad source records aside failed too: {also}")
        raise
    if on_swapped is not None:
        for day in written.swapped:
            on_swapped(day)
    clock.lap("offline")
    quarantined, by_day = set_aside_stage(read, group, written.swapped, clock)
    if written.profiles is not None and written.swapped:
        record_statistics(repo, group, written.profiles, read.events_per_day, by_day, start, end)
        clock.lap("statistics")
    return BackfillResult(
        group.name,
        start,
        end,
        computed.events_read(),
        written.rows_out,
        written.online_rows,
        clock.total(),
        quarantined=quarantined,
        quarantine_path=str(read.records) if quarantined else None,
        validation=written.report,
        batch_quarantined=written.batch_quarantined,
        timings=clock.seconds,
        files_set_aside=read.source.set_aside,
        only=read.only,
    )


def read_stage(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    start: datetime,
    end: datetime,
    options: BackfillOptions,
    features: Sequence[str] | None,
) -> SourcePass:
    """The source's records that the change points of [start, end) need, and the part of the group computed. The
    pass that computes the change points also counts the bad records: only when it finds some (or files that
    cannot be read), a second pass sets them aside."""
    from features import quality
    from features.quality.profiling import observe_days

    source = read_source(spark, group, repo.source_path(group), now=options.now)
    records = quality.quarantine_root(repo.root, group.name) / "records" / quality.new_run_id()
    table = repo.offline_path(group)
    computing, table_rows = _computed_part(spark, table, group, features)
    beside = None if table_rows is None else _beside_table(group, computing, table_rows, start)
    lower = read_lower_bound(computing, micros(start))
    rejected = source.rejected_for(lower, micros(end))
    events, bad_seen = source.counted_events(lower, micros(end))
    events_per_day = None
    if options.statistics:
        events, events_per_day = observe_days(events, group.source.timestamp, start, end)
    return SourcePass(source, computing, beside, events, bad_seen, rejected, events_per_day, table, records)


def compute_stage(read: SourcePass, start: datetime, end: datetime) -> ChangePoints:
    """The change points of [start, end), planned: Spark computes them when they are first needed."""
    return change_points(read.computing, read.events, micros(start), micros(end), observe=True, beside=read.beside)


def validate_stage(
    group: FeatureGroup, staged: Staged, options: BackfillOptions, start: datetime, end: datetime
) -> tuple[ValidationReport | None, ProfileSoon | None]:
    """The change points' validation (their first Spark pass), and when they pass, their statistics to compute beside
    the commit (every feature's, as written)."""
    from features import quality
    from features.quality.profiling import ProfileSoon

    report = quality.validate_batch(group, staged.rows, range_start=start) if options.validate else None
    if options.statistics and (report is None or report.success):
        return report, ProfileSoon(group, staged.rows, before=end)
    return report, None


def publish_stage(
    staged: Staged,
    group: FeatureGroup,
    writer: OnlineWriter | None,
    profiling: ProfileSoon | None,
    written: Written,
    clock: Laps,
) -> None:
    """One commit replaces the range in the offline table; once it is made, each key's newest row goes to the online
    store; the rows' statistics are computed beside the commit."""
    info = {"group": group.name, "definition_hash": definition_hash(group), "features": feature_hashes(group)}
    online = None if writer is None else OnlineWrite(writer, clock)
    count = None if written.report is None else written.report.rows
    with profiling.watching() if profiling is not None else contextlib.nullcontext():
        written.rows_out = staged.publish(info, online=online, count=count)
    written.swapped = staged.days
    written.online_rows = 0 if online is None else online.rows
    if profiling is not None:
        written.profiles = profiling.result()
        clock.lap("statistics")


@dataclass
class OnlineWrite:
    """Each key's newest row to the online store, once the offline table's commit is made (`Staged.publish`)."""

    writer: OnlineWriter
    clock: Laps
    rows: int = 0

    def __call__(self, newest: DataFrame) -> None:
        self.clock.lap("offline")
        self.rows = write_online(self.writer, newest)
        self.clock.lap("online")


def set_aside_stage(
    read: SourcePass, group: FeatureGroup, swapped: list[date], clock: Laps, *, failed: bool = False
) -> tuple[dict[str, int], dict[date, int]]:
    """The bad source records written to the quarantine folder, when the pass counted some (or could not count, or
    `failed`: it may not have run), and what was set aside noted for each date swapped in (`record_set_aside`).
    Returns the records per reason and per date."""
    quarantined: dict[str, int] = {}
    by_day: dict[date, int] = {}
    if failed or read.source.bad_files or observed_count(read.bad_seen, "rejected") != 0:  # None (not known): look
        quarantined, by_day = quarantine_counts(read.rejected, read.records, group.source.timestamp)
        clock.lap("quarantine")
    record_set_aside(read.table, group, swapped, read.source.set_aside, by_day)
    return quarantined, by_day


def _computed_part(
    spark: SparkSession, table: str, group: FeatureGroup, names: Sequence[str] | None
) -> tuple[FeatureGroup, DataFrame | None]:
    """The group of the features to compute, and the table whose rows hold the others' values: `names` alone when
    the table has the others' columns, else all of them (and no table)."""
    if names is None or set(names) >= {f.name for f in group.features}:
        return group, None
    rows = read_table(spark, table)
    others = [f.name for f in group.features if f.name not in names]
    if rows is None or not set(others) <= set(rows.columns):
        return group, None
    return replace(group, features=[f for f in group.features if f.name in names]), rows


def _beside_table(group: FeatureGroup, computing: FeatureGroup, rows: DataFrame, start: datetime) -> TableRows:
    """The table's rows of the features not computed, from far enough back to hold each key's last row before
    `start`."""
    from pyspark.sql import functions as F

    names = {f.name for f in computing.features}
    kept = replace(group, features=[f for f in group.features if f.name not in names])
    lower = read_lower_bound(kept, micros(start))
    if lower is not None:
        rows = rows.where(F.col(WINDOW_END) >= F.timestamp_micros(F.lit(lower)))
    return TableRows(group, rows)


def record_statistics(
    repo: Repo,
    group: FeatureGroup,
    profiles: Mapping[tuple[int, str], FeatureProfile],
    events: Observation | None,
    set_aside: Mapping[date, int],
    start: datetime,
    end: datetime,
) -> None:
    """The statistics of the rows just written, and each day's events in, rows out and records set aside, in
    place of the statistics the range had (features.stores.statistics)."""
    from features.quality.profiling import observed_days
    from features.stores import statistics as stats

    counted = {} if events is None else observed_days(events)
    rows_out = {d: p.rows for (d, _), p in profiles.items()}
    days = range(stats.day_of(start), stats.day_of(end - timedelta(microseconds=1)) + 1)
    counts = {d: stats.GroupDay(counted.get(d), rows_out.get(d, 0), set_aside.get(stats.to_date(d), 0)) for d in days}
    stats.record_backfill(stats.statistics_table(repo.root, group.name), profiles, counts, start, end)


def record_set_aside(
    table: str, group: FeatureGroup, days: list[date], files: tuple[SetAsideFile, ...], records: Mapping[date, int]
) -> None:
    """Record in the table's manifest, for each date whose partition this backfill swapped in, what it set
    aside of the events stamped that date: the files set aside whole that hold some (their events counted from
    the files' timestamps; a file without a readable timestamp counts on no date), and the bad records
    (features.stores.manifest.set_aside_by_day reads it back). A later backfill of a date replaces its entry."""
    if not days:
        return
    stamped = [d for d in (file_days(f.file, group.source.timestamp) for f in files) if d is not None]
    notes = {}
    for day in sorted(set(days)):
        per_file = [d[day] for d in stamped if d.get(day)]
        notes[day] = (len(per_file), sum(per_file), records.get(day, 0))
    if not any(any(n) for n in notes.values()) and not set(notes) & set(read_manifest(table, group.name).set_aside):
        return  # nothing to note, nor to clear: the manifest stays as it is (or absent)
    with update_manifest(table, group.name) as manifest:
        for day, (files_n, events_n, records_n) in notes.items():
            manifest.note_set_aside(day, files_n, events_n, records_n)
