"""Incremental backfills, done: the plan's runs in order (features.pipelines.schedule_plan says which partitions and
why), each date recorded in the manifest right after its partition is swapped in, so that an interrupted schedule
resumes with the first date it did not finish; late batches remembered first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, datetime
from typing import TYPE_CHECKING

from features.pipelines.days import spans
from features.pipelines.options import BackfillOptions
from features.pipelines.schedule_plan import BackfillPlan, Run, one_run, plural
from features.pipelines.schedule_plan import plan as plan  # re-exported with `request`: the public API's plan
from features.pipelines.schedule_plan import request as request
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
    the_plan: BackfillPlan,
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
    the dates recorded before it stay recorded. `say`: where each run's line goes (default: above the progress
    bar)."""
    options = BackfillOptions(online=online, on_invalid=on_invalid, track=track, progress=progress, now=now)
    return run_plan(repo, the_plan, options, spark=spark, say=say)


def run_plan(
    repo: Repo,
    the_plan: BackfillPlan,
    options: BackfillOptions,
    *,
    spark: SparkSession | None = None,
    say: Callable[[str], None] | None = None,
) -> list[BackfillResult]:
    """`execute`, its options as one value (features.pipelines.options)."""
    from features.errors import ValidationFailed
    from features.pipelines.backfill import backfill_range, ready_writer
    from features.progress import PartitionProgress

    _remember_late(repo, the_plan)
    if options.online:  # fail before any Spark work when a store cannot take writes (e.g. the repo was never applied)
        for gp in the_plan.groups:
            if gp.runs:
                ready_writer(repo, gp.group).close()
    results: list[BackfillResult] = []
    with PartitionProgress(the_plan.partitions, "backfill", enabled=options.progress) as bar:
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
                    [result] = backfill_range(
                        repo,
                        run.start,
                        run.end,
                        [run.group],
                        options,
                        spark=spark,
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


def _remember_late(repo: Repo, the_plan: BackfillPlan) -> None:
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
