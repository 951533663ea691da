"""Incremental backfills, done: the plan's runs in order (features.pipelines.schedule_plan says which partitions and
why), each date recorded in the manifest right after its partition is swapped in, so that an interrupted schedule
resumes with the first date it did not finish; late batches remembered first; the commands that print a plan or
run it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from features.pipelines.days import spans
from features.pipelines.schedule_plan import Plan, Run, one_run, plan, plural, request
from features.repo import Repo
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash, feature_hashes
from features.stores.manifest import now_utc, update

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from features.pipelines.backfill import BackfillResult


# ---------------------------------------------------------------------------------------------------------
# Doing it


def execute(
    repo: Repo,
    the_plan: Plan,
    *,
    spark: SparkSession | None = None,
    online: bool = True,
    progress: bool | None = None,
    on_invalid: str | None = None,
    now: datetime | None = None,
    track: bool = True,
    say: Callable[[str], None] | None = None,
) -> list[BackfillResult]:
    """Run the plan: remember new late batches and mark what they make stale (first, so that an interrupted
    schedule still knows), then each run in order, one Spark pass per run, recording each of its dates as
    soon as its partition is in the table. A run of several dates that fails validation is redone a date
    at a time (the dates before the bad one get completed). A failing run stops the schedule with its error;
    the dates recorded before it stay recorded."""
    from features.errors import ValidationFailed
    from features.pipelines.backfill import backfill, ready_writer
    from features.progress import PartitionProgress

    _remember_late(repo, the_plan)
    if online:  # fail before any Spark work when a store cannot take writes (e.g. the repo was never applied)
        for gp in the_plan.groups:
            if gp.runs:
                ready_writer(repo, gp.group).close()
    results: list[BackfillResult] = []
    with PartitionProgress(the_plan.partitions, "backfill", enabled=progress) as bar:
        write = say or bar.write
        for gp in the_plan.groups:
            todo = list(gp.runs)
            while todo:
                run = todo.pop(0)
                # A run that only drops features reads nothing: its days keep when they were read.
                recorder = _Recorder(repo, gp.group, run.record, None if run.features == () else now_utc())
                if run.features == ():  # features only removed: the days' rows stay as they are
                    for day in run.days:
                        recorder(gp.group, day)
                    write(f"{run.group}: {spans(run.days)}: features only removed; nothing to compute, recorded")
                    bar.advance(len(run.days), 0)
                    continue
                try:
                    [result] = backfill(
                        repo,
                        run.start,
                        run.end,
                        [run.group],
                        spark=spark,
                        online=online,
                        progress=progress,
                        on_invalid=on_invalid,
                        now=now,
                        track=track,
                        on_swapped=recorder,
                        features=run.features,
                    )
                except ValidationFailed:
                    if len(run.days) > 1 and run.record == run.days:  # whole days: the same range, day by day
                        write(f"{run.group}: {spans(run.days)} failed validation; computing these days one at a time")
                        todo[:0] = [one_run(run.group, [day], run.features) for day in run.days]
                        continue
                    _stopped(write, run, bar.partitions)
                    raise
                except BaseException:
                    _stopped(write, run, bar.partitions + len(recorder.recorded))
                    raise
                write(result.summary())
                if result.batch_quarantined is not None:
                    write(f"{run.group}: {spans(run.days)} not recorded as completed; the next run tries again")
                bar.advance(len(run.days), result.rows_out)
                results.append(result)
        if the_plan.runs:
            groups = plural(sum(bool(g.runs) for g in the_plan.groups), "group")
            write(f"done: {plural(bar.partitions, 'partition')} of {groups}, {plural(bar.rows, 'change-point row')}")
    return results


def _stopped(write: Callable[[str], None], run: Run, completed: int) -> None:
    write(
        f"{run.group}: stopped at {spans(run.days)}; the {plural(completed, 'partition')} completed before it "
        "stay recorded, and the same command resumes with the first one not completed"
    )


class _Recorder:
    """Records a run's dates in the manifest as their partitions are swapped in (`on_swapped` of a backfill)."""

    def __init__(self, repo: Repo, group: FeatureGroup, record: Sequence[date], read_at: datetime | None) -> None:
        self.repo, self.group, self.record, self.read_at = repo, group, set(record), read_at
        self.recorded: list[date] = []

    def __call__(self, group: FeatureGroup, day: date) -> None:
        if day in self.record:
            record_completed(self.repo, self.group, [day], self.read_at)
            self.recorded.append(day)


def _remember_late(repo: Repo, the_plan: Plan) -> None:
    for gp in the_plan.groups:
        if not gp.new_late:
            continue
        with update(repo.offline_path(gp.group), gp.group.name) as manifest:
            for batch in gp.new_late.values():
                manifest.mark_stale(batch.days, [batch.batch])
                manifest.remember_late(batch)


def record_completed(
    repo: Repo, group: FeatureGroup, days: Sequence[date], source_read_at: datetime | None = None
) -> None:
    """Record days whose partitions were just swapped in, with the definition, their row counts and when their
    backfill began reading the source."""
    from features.stores.offline import rows_by_date

    table = repo.offline_path(group)
    current, hashes = definition_hash(group), feature_hashes(group)
    rows = rows_by_date(table)
    with update(table, group.name) as manifest:
        for day in days:
            manifest.record(day, current, hashes, rows.get(day, 0), source_read_at=source_read_at)


def command_plan(
    repo_path: str,
    groups: Sequence[str] = (),
    *,
    now: datetime | None = None,
    spark: SparkSession | None = None,
    **options: Any,
) -> tuple[Repo, Plan]:
    """The repo and the plan of a `features backfill` command: `options` are `request`'s (checked by it)."""
    repo = Repo.load(repo_path)
    return repo, plan(repo, request(**options), groups, now=now, spark=spark)


def backfill_command(
    repo_path: str,
    *,
    start: str | None = None,
    end: str | None = None,
    day: str | None = None,
    since_last: bool = False,
    force: bool = False,
    days_per_run: str | int | None = None,
    only_changed: bool = False,
    dry_run: bool = False,
    groups: Sequence[str] = (),
    online: bool = True,
    on_invalid: str | None = None,
    track: bool = True,
    now: datetime | None = None,
    spark: SparkSession | None = None,
) -> int:
    """`features backfill`: check the options, print the plan, do it; the exit status (errors raise). Spark
    starts only once the repo, the groups and the stores checked out, so that a mistake prints one line."""
    options = {
        "start": start,
        "end": end,
        "day": day,
        "since_last": since_last,
        "force": force,
        "only_changed": only_changed,
    }
    repo, the_plan = command_plan(repo_path, groups, now=now, spark=spark, days_per_run=days_per_run, **options)
    print(the_plan.describe(), flush=True)
    if dry_run:
        print("dry run: nothing computed, nothing recorded")
        return 0
    execute(repo, the_plan, spark=spark, online=online, on_invalid=on_invalid, now=now, track=track)
    return 0
