"""`features backfill`: its flags, read once into what to compute (the plan's request) and how (BackfillOptions), and
the command's steps (plan, then a dry run or the runs, then the results) told by one of two reporters: text on
stdout, or with --json one JSON line per result on stdout and the rest on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from features.cli_checks import print_json

if TYPE_CHECKING:
    from features.pipelines.backfill import BackfillResult
    from features.pipelines.options import BackfillOptions
    from features.pipelines.schedule_plan import BackfillPlan, Request

ParserArgs = Callable[[argparse.ArgumentParser], None]


def add_backfill_parser(sub: Any, repo_arg: ParserArgs, job_args: ParserArgs) -> None:
    backfill = sub.add_parser(
        "backfill", help="compute change points for a time range, a day, or every day not done yet, into both stores"
    )
    repo_arg(backfill)
    job_args(backfill)
    backfill.add_argument("--start", help="first window end, ISO-8601 UTC (e.g. 2026-01-01); with --end")
    backfill.add_argument("--end", help="end of the range (exclusive), ISO-8601 UTC")
    backfill.add_argument(
        "--date", help="one UTC day, YYYY-MM-DD, unless already completed; also recomputes stale partitions"
    )
    backfill.add_argument(
        "--since-last",
        action="store_true",
        help="every day after the last completed one up to the last complete day, and the stale partitions",
    )
    backfill.add_argument("--force", action="store_true", help="with --date: recompute the day even if completed")
    backfill.add_argument(
        "--days-per-run",
        help="at most this many consecutive days per Spark pass over the source, a memory cap (default 31); "
        "each day is still recorded as completed on its own",
    )
    backfill.add_argument(
        "--only-changed",
        action="store_true",
        help="after features were added or changed, compute only those and keep the others' values from the table "
        "(faster when the others are costly and their change points few; see docs/operations.md)",
    )
    backfill.add_argument("--dry-run", action="store_true", help="print what would be computed, and stop")
    backfill.add_argument("--group", action="append", default=[], help="only this group (repeatable)")
    backfill.add_argument("--no-online", action="store_true", help="write the offline table only")
    backfill.add_argument(
        "--no-tracking", action="store_true", help="do not record the run in MLflow (e.g. for benchmarks)"
    )
    backfill.add_argument(
        "--on-invalid",
        choices=["fail", "quarantine"],
        help="what change points failing validation do, for every group: fail (stop, write nothing; the default) "
        "or quarantine (set them aside, write nothing of them, carry on); default: each group's on_invalid",
    )


def backfill_request(args: argparse.Namespace) -> Request:
    """What to compute: a range, a day or the days not completed, checked (a ConfigError names the wrong flag)."""
    from features.pipelines import schedule

    return schedule.request(
        start=args.start,
        end=args.end,
        day=args.date,
        since_last=args.since_last,
        force=args.force,
        days_per_run=args.days_per_run,
        only_changed=args.only_changed,
    )


def backfill_options(args: argparse.Namespace) -> BackfillOptions:
    """How every run of the plan goes."""
    from features.pipelines.options import BackfillOptions

    return BackfillOptions(online=not args.no_online, on_invalid=args.on_invalid, track=not args.no_tracking)


class BackfillReport(Protocol):
    """What the command tells, step by step."""

    @property
    def say(self) -> Callable[[str], None] | None:
        """Where each run's line goes as it ends; None: above the progress bar."""

    def planned(self, the_plan: BackfillPlan) -> None: ...

    def dry_run(self, the_plan: BackfillPlan) -> None: ...

    def done(self, results: Sequence[BackfillResult]) -> None: ...


class TextReport:
    """The plan and each run's line on stdout, under a progress bar on a terminal."""

    say = None

    def planned(self, the_plan: BackfillPlan) -> None:
        print(the_plan.describe(), flush=True)

    def dry_run(self, the_plan: BackfillPlan) -> None:
        print("dry run: nothing computed, nothing recorded")

    def done(self, results: Sequence[BackfillResult]) -> None:
        """Nothing more: each result's line was said as its run ended."""


class JsonReport:
    """One JSON line per result on stdout (per group and date range; with --dry-run, per group the days it would
    compute and why), so that a scheduler can parse it; the plan and each run's line on stderr."""

    def say(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def planned(self, the_plan: BackfillPlan) -> None:
        self.say(the_plan.describe())

    def dry_run(self, the_plan: BackfillPlan) -> None:
        for gp in the_plan.groups:
            print_json({"group": gp.group.name, "dry_run": True, "days": gp.todo, "notes": gp.notes})

    def done(self, results: Sequence[BackfillResult]) -> None:
        for result in results:
            print_json(result)


def run_backfill(args: argparse.Namespace) -> int:
    """`features backfill`: check the flags, tell the plan, do it; the exit status (errors raise). Spark starts only
    once the repo, the flags, the groups and the stores checked out, so that a mistake prints one line."""
    from features.pipelines import schedule
    from features.repo import Repo

    report: BackfillReport = JsonReport() if args.json else TextReport()
    repo = Repo.load(args.repo)
    the_plan = schedule.plan(repo, backfill_request(args), args.group)
    report.planned(the_plan)
    if args.dry_run:
        report.dry_run(the_plan)
        return 0
    report.done(schedule.run_plan(repo, the_plan, backfill_options(args), say=report.say))
    return 0
