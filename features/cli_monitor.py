"""`features monitor`: drift of the features' daily values from a reference (features.pipelines.monitor); exit 0
when none is found, 1 when some is, 2 for a usage error."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_monitor_parser(sub: Any, repo_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    monitor = sub.add_parser(
        "monitor",
        help="drift of each feature's daily values from a reference (dates, or a model's training set); "
        "exit 1 when found",
    )
    repo_arg(monitor)
    monitor.add_argument("--group", action="append", default=[], help="only this group (repeatable)")
    monitor.add_argument("--reference-start", help="first UTC day of the reference, YYYY-MM-DD; with --reference-end")
    monitor.add_argument("--reference-end", help="the day after the reference's last (excluded), YYYY-MM-DD")
    monitor.add_argument(
        "--reference-model",
        help="the reference is the days a logged model's training set covered: <name> (its latest version), "
        "<name>/<version>, models:/<name>/<version> or runs:/<run id>",
    )
    monitor.add_argument("--start", help="first UTC day judged (default: the reference's end)")
    monitor.add_argument("--end", help="the day after the last judged (default: after the last day with statistics)")
    monitor.add_argument(
        "--psi",
        type=float,
        help="population stability index above which a day drifts (default: the group's Drift, else 0.2)",
    )
    monitor.add_argument(
        "--js",
        type=float,
        help="Jensen-Shannon distance above which a day drifts (default: the group's Drift, else 0.1)",
    )
    monitor.add_argument("--min-rows", type=int, help="days with fewer rows are listed, not judged (default 100)")
    monitor.add_argument(
        "--served",
        action="store_true",
        help="compare the values the feature server logged (features serve --log-served), not the recorded statistics",
    )
    monitor.add_argument(
        "--report",
        metavar="FILE",
        help="also write the report as one self-contained HTML file: per feature its distribution, null share and "
        "drift over the days, per group its health and volume",
    )
    monitor.add_argument(
        "--checkpoint-dir",
        help="root of the stream's checkpoints, for the report's health (default: <repo>/data/checkpoints)",
    )
    monitor.add_argument("--no-tracking", action="store_true", help="do not record the run in MLflow")
    monitor.add_argument("--json", action="store_true", help="print one JSON document instead of the table")


def run_monitor(args: argparse.Namespace) -> int:
    from features.pipelines.monitor import monitor
    from features.pipelines.monitor_report import log_monitor_run, report_page, report_path, write_report
    from features.repo import Repo

    path = None if args.report is None else report_path(args.report)
    repo = Repo.load(args.repo)
    report = monitor(
        repo,
        args.group,
        reference_start=args.reference_start,
        reference_end=args.reference_end,
        reference_model=args.reference_model,
        start=args.start,
        end=args.end,
        psi=args.psi,
        js=args.js,
        min_rows=args.min_rows,
        served=args.served,
    )
    document = None
    if path is not None:
        document = report_page(repo, report, args.group, checkpoint_root=args.checkpoint_dir).document()
        write_report(document, path)
    if not args.no_tracking:
        log_monitor_run(repo, report, args.group, document)
    if args.json:
        from features.cli_checks import print_json
        from features.pipelines.status import jsonable

        print_json({**jsonable(report), "drifted": bool(report.drifted), "report": None if path is None else str(path)})
    else:
        print("\n".join(report.lines() + ([f"report: {path}"] if path else [])))
    return 1 if report.drifted else 0
