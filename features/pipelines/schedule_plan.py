"""Incremental backfills, the plan: which (group, date) partitions to compute and why, said before doing it
(features.pipelines.schedule does it).

Three ways to say what `features backfill` computes:

    --start/--end   exactly that range, as always (re-running replaces it); every whole day in it that had
                    ended is recorded as completed
    --date D        the day D, unless a backfill already completed it with the group's current definition
                    (--force recomputes it anyway)
    --since-last    every day after the last completed one, up to the last complete day; also days missing
                    between completed ones, and from the source's first day when none is completed yet

A day is complete once its data is in (features.pipelines.completeness): the group's stream, or for a group that
only backfills its source, has gone one source watermark past the day's end. A day whose data has not landed yet is
reported as waiting, not computed empty.
`--date` and `--since-last` also recompute every stale partition:

- computed with another definition of the group: the manifest keeps the definition and feature hashes of
  each partition (features.spec.fingerprint), so an added, removed or changed feature is detected and named;
- made stale by late events, which the stream writes to `Repo.late_path(group)` and which are also in the
  source: the completed dates holding the window ends they change (features.pipelines.stale) are recomputed from the
  source, after which the table equals a backfill from the full source.

Dates are computed in order, up to `days_per_run` consecutive dates per Spark run (default
DAYS_PER_RUN): one run reads the source once and computes all its dates in one Spark pass (a Lifetime
feature reads all history once per run, not once per date), then swaps the dates' partitions in one after
the other, recording each in the manifest (features.stores.manifest) right after its swap. An interrupted schedule
therefore resumes with the first date it did not finish. `days_per_run` caps the memory of a run (the
kernel holds a bucket's events of the whole run), not its speed: a date with no events costs a task with
no rows. A run whose change points fail validation is redone a date at a time, so that the dates before
the bad one are completed and the error names the bad date.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from features.errors import ConfigError
from features.pipelines.completeness import DataHorizon, data_horizon
from features.pipelines.days import DAY, days_from, midnight, spans
from features.pipelines.stale import (
    DAY_US,
    EPOCH,
    changed_features,
    landed_after,
    new_late_batches,
    stale_partitions,
)
from features.repo import Repo
from features.spec import FeatureGroup
from features.stores.manifest import LateBatch, Manifest, PartitionRecord, now_utc, read_manifest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NEW = "not computed yet"
FORCED = "--force"
RANGE = "the requested range"
MANY_RUNS = 31  # above this many one-day runs, the plan suggests a bigger --days-per-run
DAYS_PER_RUN = 31  # the default: a month of dates per Spark pass (a memory cap; see the module docstring)


# ---------------------------------------------------------------------------------------------------------
# What the user asked for


@dataclass(frozen=True)
class Request:
    """One of: a range (`start`, `end`), one day (`day`), or `since_last`."""

    start: datetime | None = None
    end: datetime | None = None
    day: date | None = None
    since_last: bool = False
    force: bool = False
    days_per_run: int = DAYS_PER_RUN
    only_changed: bool = False  # compute only added or changed features beside the table's values of the others

    @property
    def mode(self) -> str:
        return "range" if self.start is not None else "date" if self.day is not None else "since-last"

    def describe(self) -> str:
        if self.start is not None and self.end is not None:
            return f"--start {self.start.isoformat()} --end {self.end.isoformat()}"
        if self.day is not None:
            return f"--date {self.day.isoformat()}" + (" --force" if self.force else "")
        return "--since-last"


def request(
    *,
    start: str | datetime | None = None,
    end: str | datetime | None = None,
    day: str | date | None = None,
    since_last: bool = False,
    force: bool = False,
    days_per_run: int | str | None = None,
    only_changed: bool = False,
) -> Request:
    """Check a combination of `features backfill` options; a ConfigError names the wrong one and the fix."""
    from features.pipelines.backfill import check_range, parse_time

    ranged = start is not None or end is not None
    if day is not None and since_last:
        raise ConfigError(
            "--date and --since-last: choose one (--date computes one day, --since-last every day not completed yet)"
        )
    if ranged and (day is not None or since_last):
        which = "--date" if day is not None else "--since-last"
        raise ConfigError(
            f"--start/--end and {which}: choose one (a range to compute as given, or a schedule of whole days)"
        )
    if not ranged and day is None and not since_last:
        raise ConfigError(
            "backfill: say what to compute: --since-last (every day not completed yet), --date YYYY-MM-DD "
            "(one day), or --start ISO --end ISO (a range)"
        )
    if start is None and end is not None:
        raise ConfigError("--end: given without --start; give both, the range is [--start, --end)")
    if end is None and start is not None:
        raise ConfigError("--start: given without --end; give both, the range is [--start, --end)")
    if force and day is None:
        raise ConfigError(
            "--force: only with --date, to recompute a completed day (--start/--end always recomputes its range; "
            "--since-last computes the days not completed and the stale ones)"
        )
    runs = DAYS_PER_RUN if days_per_run is None else _days_per_run(days_per_run)
    if start is not None and end is not None:
        start_t, end_t = parse_time(start, "--start"), parse_time(end, "--end")
        check_range(start_t, end_t)
        return Request(start=start_t, end=end_t, days_per_run=runs, only_changed=only_changed)
    if day is not None:
        return Request(day=_parse_day(day), force=force, days_per_run=runs, only_changed=only_changed)
    return Request(since_last=True, days_per_run=runs, only_changed=only_changed)


def _parse_day(value: str | date) -> date:
    if isinstance(value, datetime):
        raise ConfigError(f"--date: {value.isoformat()} is a time; give the day, YYYY-MM-DD")
    if isinstance(value, date):
        return value
    try:
        if len(value) != 10:
            raise ValueError(value)
        return date.fromisoformat(value)
    except ValueError:
        raise ConfigError(f"--date: {value!r} is not a day; write YYYY-MM-DD (UTC), e.g. 2026-01-31") from None


def _days_per_run(value: int | str) -> int:
    try:
        runs = int(value)
    except (TypeError, ValueError):
        runs = 0
    if runs < 1 or str(value).strip() != str(runs):
        raise ConfigError(f"--days-per-run: {value!r} is not a positive whole number of days; e.g. --days-per-run 7")
    return runs


# ---------------------------------------------------------------------------------------------------------
def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


# ---------------------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class Run:
    """One backfill of one group over [start, end): the partitions it computes, and those it completes."""

    group: str
    start: datetime
    end: datetime
    days: tuple[date, ...]
    record: tuple[date, ...]
    # Only these features are computed (the others' values are the table's): days computed before with the current
    # definition of the other features. None: all of them.
    features: tuple[str, ...] | None = None


@dataclass
class GroupPlan:
    group: FeatureGroup
    horizon: DataHorizon  # how far the group's data is in: its last complete day
    todo: dict[date, str] = field(default_factory=dict)  # day -> why it is computed
    runs: list[Run] = field(default_factory=list)
    skipped: dict[date, PartitionRecord] = field(default_factory=dict)  # completed, current: left alone
    new_late: dict[str, LateBatch] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def partitions(self) -> int:
        return sum(len(run.days) for run in self.runs)

    def lines(self) -> list[str]:
        name = self.group.name
        out = []
        if self.runs:
            by_reason: dict[str, list[date]] = {}
            for day, why in sorted(self.todo.items()):
                by_reason.setdefault(why, []).append(day)
            reasons = "; ".join(f"{spans(days)} ({why})" for why, days in by_reason.items())
            runs = f" in {plural(len(self.runs), 'run')}" if len(self.runs) > 1 else ""
            out.append(f"{name}: {plural(self.partitions, 'partition')} to compute{runs}: {reasons}")
        for run in self.runs:
            if run.features:
                out.append(
                    f"{name}: {spans(run.days)}: computing only {', '.join(run.features)}; the other features' "
                    "values are kept from the table"
                )
        for day, entry in sorted(self.skipped.items()):
            out.append(
                f"{name}: {day.isoformat()} was completed at {entry.completed_at:%Y-%m-%d %H:%M} UTC with the "
                "current definition; skipping it (--force recomputes it)"
            )
        if not self.runs and not self.skipped and not self.notes:
            out.append(f"{name}: nothing to compute")
        seen = list(self.new_late.values())
        if seen:
            events = sum(b.events for b in seen)
            made = sorted({d for b in seen for d in b.days})
            effect = f"making {spans(made)} stale" if made else "no completed partition is affected"
            out.append(
                f"{name}: {plural(len(seen), 'new late batch')} ({plural(events, 'event')}): "
                f"{', '.join('batch=' + b.batch for b in seen)}; {effect}"
            )
        out += [f"{name}: {note}" for note in self.notes]
        return out


@dataclass
class BackfillPlan:
    request: Request
    groups: list[GroupPlan]
    now: datetime

    @property
    def partitions(self) -> int:
        return sum(g.partitions for g in self.groups)

    @property
    def runs(self) -> list[Run]:
        return [run for g in self.groups for run in g.runs]

    def describe(self) -> str:
        head = f"backfill {self.request.describe()}: {plural(self.partitions, 'partition')} to compute"
        if self.request.mode == "since-last":
            ends = {g.group.name: _day(g.horizon.last_day) for g in self.groups}
            shown = (
                next(iter(ends.values()))
                if len(set(ends.values())) == 1
                else ", ".join(f"{day} ({name})" for name, day in ends.items())
            )
            head += f", up to {shown} (the last complete day: the data is in one source watermark past its end)"
        lines = [head] + ["  " + line for g in self.groups for line in g.lines()]
        one_day_runs = sum(len(g.runs) for g in self.groups)
        if self.request.mode != "range" and self.request.days_per_run == 1 and one_day_runs > MANY_RUNS:
            lines.append(
                f"  ({one_day_runs} one-day Spark runs: without --days-per-run 1, each run computes up to "
                f"{DAYS_PER_RUN} days in one pass over the source, and still records each day as it is done)"
            )
        return "\n".join(lines)


def plan(
    repo: Repo,
    req: Request,
    groups: Sequence[str] | None = None,
    *,
    now: datetime | None = None,
    spark: SparkSession | None = None,
    scan: bool = True,
) -> BackfillPlan:
    """What a backfill will compute and why, from each group's manifest, the stream's late batches and how far
    each group's data is in (features.pipelines.completeness).

    Changes nothing. Spark starts only to find the source's first day, for a `--since-last` of a group with
    no completed partition yet, and the newest event of a source that is not Parquet (not at all without `scan`,
    which takes the clock's word for such a source)."""
    now = (now or now_utc()).astimezone(UTC)
    selected = repo.select(list(groups) if groups else None)
    horizons = {g.name: data_horizon(repo, g, now, spark, scan=scan) for g in selected}
    if req.day is not None:
        _check_complete(horizons.values(), req.day)
    plans = []
    for group in selected:
        manifest = read_manifest(repo.offline_path(group), group.name)
        gp = GroupPlan(group, horizons[group.name], new_late=new_late_batches(repo, group, manifest, now))
        stale = stale_partitions(group, manifest, gp.new_late, landed_after(repo, group, manifest))
        if req.mode == "range":
            _plan_range(gp, req, stale)
        elif req.mode == "date":
            _plan_date(gp, req, manifest, stale)
        else:
            _plan_since_last(gp, repo, req, manifest, stale, spark)
        _compute_only_changes(gp, manifest, req.only_changed)
        plans.append(gp)
    return BackfillPlan(req, plans, now)


def _check_complete(horizons: Iterable[DataHorizon], day: date) -> None:
    for horizon in horizons:
        if not horizon.complete(day):
            raise ConfigError(
                f"--date: {day.isoformat()} is not complete yet for {horizon.group.name!r}: it is complete "
                f"{horizon.complete_at(day)} ({horizon.waiting().removeprefix('waiting for data: ')}); pick an "
                "earlier day, or compute the part so far with --start/--end"
            )


def _day(day: date | None) -> str:
    return "no day" if day is None else day.isoformat()


def _plan_range(gp: GroupPlan, req: Request, stale: dict[date, str]) -> None:
    from features.stores.offline import dates_between

    assert req.start is not None and req.end is not None
    days = dates_between(req.start, req.end)
    whole = tuple(
        d for d in days if req.start <= midnight(d) and midnight(d + DAY) <= req.end and gp.horizon.complete(d)
    )
    gp.todo = dict.fromkeys(days, RANGE)
    gp.runs = [Run(gp.group.name, req.start, req.end, tuple(days), whole)]
    partial = [d for d in days if d not in whole]
    if partial:
        gp.notes.append(
            f"{spans(partial)} not recorded as completed (the range covers only part of the day, or the day "
            f"is not complete yet: {gp.horizon.waiting()})"
        )
    outside = sorted(d for d in stale if d not in whole)
    if outside:
        gp.notes.append(f"{spans(outside)} stay stale ({stale[outside[0]]}); --since-last recomputes them")


def _compute_only_changes(gp: GroupPlan, manifest: Manifest, only_changed: bool) -> None:
    """Split the runs so that days whose features were only removed are recorded without a recompute, and with
    `only_changed`, days needing only some features (`changed_features`) compute those alone."""
    changed = changed_features(gp.group, manifest, gp.new_late, gp.todo)
    could = sorted(d for d, why in gp.todo.items() if changed[d] and not why.startswith(FORCED) and not only_changed)
    if could:
        names = ", ".join(sorted({n for d in could for n in changed[d] or ()}))
        gp.notes.append(
            f"{spans(could)}: --only-changed would compute only {names} there, beside the table's values of the "
            "others (cheaper where the group's change points are few against its events)"
        )
    for day, why in gp.todo.items():
        if why == FORCED or why.startswith(FORCED + ";") or (changed[day] and not only_changed):
            changed[day] = None
    runs = []
    for run in gp.runs:
        whole = (
            run.record == run.days and run.start == midnight(run.days[0]) and run.end == midnight(run.days[-1] + DAY)
        )
        if not whole or all(changed.get(d) is None for d in run.days):
            runs.append(run)
            continue
        current: list[date] = []
        for day in run.days:
            if current and changed.get(day) != changed.get(current[-1]):
                runs.append(one_run(gp.group.name, current, changed.get(current[-1])))
                current = []
            current.append(day)
        runs.append(one_run(gp.group.name, current, changed.get(current[-1])))
    gp.runs = runs


def _plan_date(gp: GroupPlan, req: Request, manifest: Manifest, stale: dict[date, str]) -> None:
    assert req.day is not None
    todo = dict(stale)
    entry = manifest.partitions.get(req.day)
    if req.force:
        todo[req.day] = FORCED + (f"; {stale[req.day]}" if req.day in stale else "")
    elif entry is None:
        todo[req.day] = NEW
    elif req.day not in stale:
        gp.skipped[req.day] = entry
    _set_runs(gp, todo, req.days_per_run)


def _plan_since_last(
    gp: GroupPlan,
    repo: Repo,
    req: Request,
    manifest: Manifest,
    stale: dict[date, str],
    spark: SparkSession | None,
) -> None:
    last = gp.horizon.last_day
    completed = manifest.completed()
    todo = dict(stale)
    first = None
    if last is not None:
        first = completed[0] if completed else source_first_day(repo, gp.group, spark, gp.horizon.now)
    if gp.horizon.newest_event is None and not gp.horizon.streamed:
        gp.notes.append("the source has no events yet")
    elif first is not None and last is not None and first <= last:
        todo.update({d: NEW for d in days_from(first, last) if d not in manifest.partitions})
        if not completed:
            gp.notes.append(f"no partition completed yet: starting at the source's first day, {first.isoformat()}")
    if completed and not todo:
        gp.notes.append(f"up to date (completed up to {completed[-1].isoformat()})")
    if gp.horizon.behind_clock:
        gp.notes.append(gp.horizon.waiting())
    _set_runs(gp, todo, req.days_per_run)


def _set_runs(gp: GroupPlan, todo: dict[date, str], days_per_run: int) -> None:
    gp.todo = dict(sorted(todo.items()))
    gp.runs = chunk_runs(gp.group.name, list(gp.todo), days_per_run)


def chunk_runs(group: str, days: list[date], days_per_run: int) -> list[Run]:
    """Consecutive days, at most `days_per_run` of them per run, in order."""
    runs: list[Run] = []
    current: list[date] = []
    for day in sorted(days):
        if current and (day - current[-1] != DAY or len(current) == days_per_run):
            runs.append(one_run(group, current))
            current = []
        current.append(day)
    if current:
        runs.append(one_run(group, current))
    return runs


def one_run(group: str, days: list[date], features: tuple[str, ...] | None = None) -> Run:
    return Run(group, midnight(days[0]), midnight(days[-1] + DAY), tuple(days), tuple(days), features)


def source_first_day(repo: Repo, group: FeatureGroup, spark: SparkSession | None, now: datetime) -> date | None:
    """The UTC day of the source's earliest good event, or None for an empty source (Spark reads one column)."""
    from pyspark.sql import functions as F

    from features.engine.session import get_spark
    from features.engine.source import read_source

    spark = spark or get_spark()
    events = read_source(spark, group, repo.source_path(group), now=now).events
    first = events.agg(F.min(F.unix_micros(F.col(group.source.timestamp).cast("timestamp")))).first()[0]
    return None if first is None else EPOCH + timedelta(days=int(first) // DAY_US)
