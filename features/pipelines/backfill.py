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

from features.engine.batch import TableRows, change_points, read_lower_bound
from features.engine.files import SetAsideFile, file_days
from features.engine.online_rows import write_online
from features.engine.schema import FILE_REASONS
from features.engine.session import is_local, session_soon
from features.engine.source import observed_count, quarantine_counts, read_source
from features.errors import ConfigError
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
    from features.stores.online import OnlineWriter


@dataclass(frozen=True)
class BackfillResult:
    group: str
    start: datetime
    end: datetime
    rows_in: int
    rows_out: int
    online_rows: int
    seconds: float
    # Bad source records set aside (per reason) and where; the validation of the change points; and, when they
    # failed it under the "quarantine" policy, where the batch went instead of the stores.
    quarantined: Mapping[str, int] = field(default_factory=dict)
    quarantine_path: str | None = None
    validation: ValidationReport | None = None
    batch_quarantined: str | None = None
    # Where the time went, in seconds: compute (planning the Spark pass: its rows are computed by the first job
    # that reads them, validation's screen, else the commit), validation, online (while the offline commit runs),
    # offline (the rest of that commit), tracking (waiting for the MLflow run, made in the background, before
    # writing), and from `backfill`: spark_start (waiting for the session).
    timings: dict[str, float] = field(default_factory=dict)
    # The source files set aside whole (unreadable, or not conforming to the source's schema): a record each
    # among `quarantined`, and the events they hold.
    files_set_aside: tuple[SetAsideFile, ...] = ()
    # The features computed, when only some were (the others' values were kept from the table); () when all were.
    only: tuple[str, ...] = ()

    @property
    def records_quarantined(self) -> int:
        return sum(self.quarantined.values())

    @property
    def events_set_aside(self) -> int:
        """The events of the files set aside whole."""
        return sum(f.events for f in self.files_set_aside)

    def summary(self) -> str:
        span = f"[{self.start.isoformat()}, {self.end.isoformat()})"
        if self.batch_quarantined is not None:
            failed = ", ".join(repr(n) for n in self.validation.failed_names()) if self.validation else ""
            text = (
                f"{self.group}: {self.rows_in:,} events in; the change points for {span} failed validation "
                f"({failed}) and were quarantined in {self.batch_quarantined}, nothing written, {self.seconds:.1f}s"
            )
        else:
            text = (
                f"{self.group}: {self.rows_in:,} events in, {self.rows_out:,} change points out for {span}, "
                f"{self.online_rows:,} keys online, {self.seconds:.1f}s"
            )
            if self.only:
                text += f" (computed {', '.join(self.only)}; the others kept from the table)"

        return text + self._set_aside_text()

    def _set_aside_text(self) -> str:
        """What was set aside: the files (how many, of what kind, their names and events), then the bad
        records (how many, per reason), and where they went."""
        parts = []
        if self.files_set_aside:
            kinds: dict[str, list[str]] = {}
            for f in self.files_set_aside:
                kinds.setdefault(f.kind, []).append(Path(f.file).name)
            listed = "; ".join(f"{len(names):,} {kind}: {_names(names)}" for kind, names in sorted(kinds.items()))
            parts.append(
                f"{_plural(len(self.files_set_aside), 'file')} set aside whole with "
                f"{_plural(self.events_set_aside, 'event')} ({listed})"
            )
        records = {r: n for r, n in self.quarantined.items() if r.split(":", 1)[0] not in FILE_REASONS}
        if records:
            reasons = ", ".join(f"{n:,} {reason}" for reason, n in records.items())
            parts.append(f"{sum(records.values()):,} bad source records quarantined ({reasons})")
        if not parts:
            return ""
        return "; " + ", ".join(parts) + (f" in {self.quarantine_path}" if self.quarantine_path else "")


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _names(names: list[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


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
    start_t, end_t = parse_time(start, "--start"), parse_time(end, "--end")
    check_range(start_t, end_t)
    selected = repo.select(groups)
    # Fail before Spark starts when a store cannot take writes (e.g. the repo was never applied).
    writers = {g.name: ready_writer(repo, g) for g in selected} if online else {}
    session = session_soon(spark)  # the JVM starts while the MLflow run is set up
    from features.ml import tracking

    params = {"start": start_t, "end": end_t, "online": online, "on_invalid": on_invalid or "group default"}
    # The run is made in the background, while Spark starts and the pass is planned; the groups wait for it
    # before they write anything.
    with tracking.start_run(repo, "backfill", selected, params, enabled=track, background=True) as run:
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
                online=online,
                progress=progress,
                on_invalid=on_invalid,
                now=now,
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


def backfill_group(
    spark: SparkSession,
    repo: Repo,
    group: FeatureGroup,
    start: datetime,
    end: datetime,
    *,
    online: bool = True,
    progress: bool | None = None,
    on_invalid: str | None = None,
    now: datetime | None = None,
    validate: bool = True,
    writer: OnlineWriter | None = None,
    on_swapped: Callable[[date], None] | None = None,
    features: Sequence[str] | None = None,
    before_writing: Callable[[], object] | None = None,
    statistics: bool = True,
) -> BackfillResult:
    """Backfill one group. Bad source records go to the group's quarantine folder; the change points are
    validated (features.quality) before either store is written, and a failure does what the policy says:
    raise ValidationFailed ("fail", writing nothing) or set the batch aside ("quarantine", writing nothing of
    it). `validate=False` skips the validation (benchmarks measure its cost that way).

    `features`: compute only these; the other features' values come from the table's rows (features.kernel.beside),
    which must hold them over the range, as computed with the current definition. Online, only these are written.

    `before_writing`: called once the rows are computed and validated, before anything is written (and before
    a failed batch is set aside); its error stops the backfill there.

    `statistics`: record the rows' statistics per feature and day (features.stores.statistics) when they are
    written; `False` skips them (benchmarks measure their cost that way)."""
    from features import quality
    from features.quality.profiling import ProfileSoon, observe_days

    began = time.perf_counter()
    chosen = quality.policy(group, quality.BACKFILL_DEFAULT, on_invalid)
    source = read_source(spark, group, repo.source_path(group), now=now)
    if online and writer is None:
        writer = ready_writer(repo, group)
    records = quality.quarantine_root(repo.root, group.name) / "records" / quality.new_run_id()
    table = repo.offline_path(group)
    computing, table_rows = _computed_part(spark, table, group, features)
    if table_rows is not None and writer is not None:
        # The others' values online stay as the store has them: the table's rows hold them before `end`, not at it.
        writer = writer.only([f.name for f in computing.features])
    lower = read_lower_bound(computing, micros(start))
    rejected = source.rejected_for(lower, micros(end))
    # The pass that computes the change points also counts the bad records: only when it finds some (or files
    # that cannot be read), a second pass sets them aside.
    events, bad_seen = source.counted_events(lower, micros(end))
    events_per_day = None
    if statistics:
        events, events_per_day = observe_days(events, group.source.timestamp, start, end)
    profiles = None
    profiling: ProfileSoon | None = None
    report: ValidationReport | None = None
    batch_quarantined: str | None = None
    online_rows = 0
    timings: dict[str, float] = {}
    clock = [began]

    def lap(name: str) -> None:
        now = time.perf_counter()
        timings[name] = timings.get(name, 0.0) + now - clock[0]
        clock[0] = now

    def write_newest_online(newest: DataFrame) -> None:
        """Each key's newest row to the online store, once the offline table's commit is made."""
        nonlocal online_rows
        if writer is not None:
            lap("offline")
            online_rows = write_online(writer, newest)
            lap("online")

    swapped: list[date] = []
    try:
        with spark_progress(spark, f"backfill {group.name}", progress):
            beside = None if table_rows is None else _beside_table(group, computing, table_rows, start)
            computed = change_points(computing, events, micros(start), micros(end), observe=True, beside=beside)
            rows = computed.with_latest
            # stage -> validate -> publish (the offline commit, then the online store), or quarantine
            with Staged(rows, table, start, end, in_driver=is_local(spark)) as staged:
                # Spark computes the rows when they are first needed: in the validation's screen (one pass that
                # also caches them for both stores), or without validation in the offline commit.
                lap("plan")
                if validate:
                    report = quality.validate_batch(group, staged.rows, range_start=start)
                if statistics and (report is None or report.success):
                    profiling = ProfileSoon(group, staged.rows, before=end)  # every feature's, as written
                if before_writing is not None:
                    lap("compute_validation")
                    before_writing()
                    lap("tracking")
                if report is not None and not report.success:
                    what = f"change points for [{start.isoformat()}, {end.isoformat()}]"
                    batch_quarantined = quality.handle_invalid(report, staged.rows, group, repo.root, chosen, what)
                    rows_out = 0
                else:
                    lap("compute_validation")
                    info = {
                        "group": group.name,
                        "definition_hash": definition_hash(group),
                        "features": feature_hashes(group),
                    }
                    count = None if report is None else report.rows
                    with profiling.watching() if profiling is not None else contextlib.nullcontext():
                        rows_out = staged.publish(info, online=write_newest_online, count=count)
                    swapped = staged.days
                    if profiling is not None:
                        profiles = profiling.result()
                        lap("statistics")
    except Exception as exc:  # the bad records are set aside whatever else failed
        try:
            _, by_day = quarantine_counts(rejected, records, group.source.timestamp)
            record_set_aside(table, group, swapped, source.set_aside, by_day)
        except Exception as also:
            exc.add_note(f"Setting the bad source records aside failed too: {also}")
        raise
    if on_swapped is not None:
        for day in swapped:
            on_swapped(day)
    lap("offline")
    quarantined: dict[str, int] = {}
    by_day: dict[date, int] = {}
    if source.bad_files or observed_count(bad_seen, "rejected") != 0:  # None (not known): look
        quarantined, by_day = quarantine_counts(rejected, records, group.source.timestamp)
        lap("quarantine")
    record_set_aside(table, group, swapped, source.set_aside, by_day)
    if profiles is not None and swapped:
        record_statistics(repo, group, profiles, events_per_day, by_day, start, end)
        lap("statistics")
    rows_in = computed.events_read()
    return BackfillResult(
        group.name,
        start,
        end,
        rows_in,
        rows_out,
        online_rows,
        time.perf_counter() - began,
        quarantined=quarantined,
        quarantine_path=str(records) if quarantined else None,
        validation=report,
        batch_quarantined=batch_quarantined,
        timings=timings,
        files_set_aside=source.set_aside,
        only=() if table_rows is None else tuple(f.name for f in computing.features),
    )


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
