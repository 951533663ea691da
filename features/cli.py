"""The `features` command line: apply, plan, backfill, stream, savepoint, status, validate, verify, monitor, compact,
migrate, demo, serve."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from features.cli_backfill import add_backfill_parser, run_backfill
from features.cli_checks import print_json, validate_command, verify_command
from features.errors import ConfigError, DataError, FeaturesError, JobStalled, machine_problem
from features.stores.serving_input import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_ENTITY_ROWS, RequestLimits
from features.version import package_version

DEFAULT_REPO = "feature_repo"
LOG_LEVELS = ("debug", "info", "warning", "error")
DEMO_BROKER = "127.0.0.1:9092"  # where `features demo --kafka` looks for a broker, and starts one if none answers


def default_repo() -> str:
    """The current folder when it holds feature_store.yaml (as Feast's own CLI works), else `feature_repo`."""
    return "." if Path("feature_store.yaml").is_file() else DEFAULT_REPO


def _repo_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repo",
        default=default_repo(),
        help="the feature repository (folder with feature_store.yaml); default: the current folder when it holds "
        f"feature_store.yaml, else {DEFAULT_REPO}",
    )


def _job_args(parser: argparse.ArgumentParser) -> None:
    """The options of the commands jobs run: how much they log, and output a scheduler can parse."""
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        help="Python logging and Spark's log level (default: warnings of Python, errors of Spark)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line per result on stdout, not the text")
    if parser.prog.split()[-1] != "apply":  # the commands that run Spark jobs
        _stall_arg(parser)


def _stall_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stall-timeout",
        help="end the command (exit 4) when Spark makes no progress this long, e.g. 10m; 0 never (default: "
        "FEATURES_STALL_TIMEOUT, else 10m)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="features", description="Declarative windowed features on Spark and Feast.")
    parser.add_argument("--version", action="version", version=f"features {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    apply = sub.add_parser("apply", help="register the repo's feature groups with Feast (like `feast apply`)")
    _repo_arg(apply)
    apply.add_argument(
        "--prune",
        action="store_true",
        help="also remove feature views of groups no longer defined (from the registry and the online store)",
    )
    _job_args(apply)

    add_backfill_parser(sub, _repo_arg, _job_args)

    stream = sub.add_parser("stream", help="run groups as Spark streams that keep both stores fresh")
    _repo_arg(stream)
    _job_args(stream)
    stream.add_argument("--group", action="append", default=[], help="only this group (repeatable)")
    stream.add_argument("--trigger", default="5s", help="how often a micro-batch starts (default 5s)")
    stream.add_argument(
        "--available-now", action="store_true", help="process what has landed, then stop (bounded runs, tests)"
    )
    stream.add_argument("--checkpoint-dir", help="root of the per-group checkpoints (default: <repo>/data/checkpoints)")
    stream.add_argument(
        "--reset", action="store_true", help="delete the saved state and rebuild it by replaying the source"
    )
    stream.add_argument(
        "--from-savepoint", metavar="PATH", help="start the --group in a new checkpoint from a `features savepoint`"
    )
    stream.add_argument("--max-files-per-trigger", type=int, help="at most this many new files per micro-batch")
    stream.add_argument(
        "--buckets",
        type=int,
        help="hash buckets of keys the state is split into (default: one per shuffle partition); on a saved state, "
        "it moves there; a live stream of the group takes the rescale up in its own process",
    )
    stream.add_argument("--no-online", action="store_true", help="write the offline table only")
    stream.add_argument("--no-tracking", action="store_true", help="do not record the run in MLflow")
    stream.add_argument(
        "--metrics-every", default="1m", help="MLflow gets one point per metric per this much time (default 1m)"
    )
    stream.add_argument(
        "--retention",
        default="30d",
        help="keep late events and quarantined data this long, then remove them ('none': for ever; default 30d)",
    )

    retention = sub.add_parser("retention", help="report what groups keep set aside (late, quarantined), sweep the old")
    _repo_arg(retention)
    retention.add_argument("--group", action="append", default=[], help="only this group (repeatable)")
    retention.add_argument("--keep", default="30d", help="remove what was set aside longer ago than this (default 30d)")
    retention.add_argument("--dry-run", action="store_true", help="report what would be removed, remove nothing")

    validate = sub.add_parser("validate", help="validate groups' offline tables and write Great Expectations Data Docs")
    _repo_arg(validate)
    _job_args(validate)
    validate.add_argument("--group", action="append", default=[], help="only this group (repeatable)")

    verify = sub.add_parser(
        "verify", help="check a sample of keys: online against offline, offline against a recompute from the source"
    )
    _repo_arg(verify)
    _job_args(verify)
    verify.add_argument("--group", action="append", default=[], help="only this group (repeatable)")
    verify.add_argument("--sample", type=int, default=100, help="keys checked per group (default 100)")
    verify.add_argument("--no-tracking", action="store_true", help="do not record the run in MLflow")
    verify.add_argument(
        "--max-staleness",
        help="pass online rows at most this far behind the key's last offline row, e.g. 10m (default: none)",
    )

    migrate = sub.add_parser(
        "migrate", help="convert offline tables of an earlier version (Parquet folders) into Delta tables, in place"
    )
    _repo_arg(migrate)
    migrate.add_argument("--group", action="append", default=[], help="only this group (repeatable)")

    savepoint = sub.add_parser(
        "savepoint", help="write a group's stream state to a folder that `features stream --from-savepoint` starts from"
    )
    _repo_arg(savepoint)
    savepoint.add_argument("--group", required=True, help="the group whose stream state is saved")
    savepoint.add_argument("--to", help="the savepoint's folder (default: <repo>/data/savepoints/<group>/<UTC time>)")
    savepoint.add_argument(
        "--checkpoint-dir", help="root of the stream's checkpoints (default: <repo>/data/checkpoints)"
    )

    compact = sub.add_parser(
        "compact", help="rewrite the offline tables' small files as one per date, and delete files no version needs"
    )
    _repo_arg(compact)
    _stall_arg(compact)
    compact.add_argument("--group", action="append", default=[], help="only this group (repeatable)")
    compact.add_argument(
        "--retention",
        help="keep the files older versions need this long, e.g. 7d (the table's setting, which stays; default: "
        "as set, Delta's 7 days when never set); versions older than it can no longer be read",
    )

    status = sub.add_parser(
        "status", help="per group: days completed, stale and set aside, the stream's watermark and lag, the last runs"
    )
    _repo_arg(status)
    status.add_argument("--group", action="append", default=[], help="only this group (repeatable)")
    status.add_argument("--checkpoint-dir", help="root of the stream's checkpoints (default: <repo>/data/checkpoints)")
    status.add_argument("--json", action="store_true", help="print one JSON document instead of the table")

    plan = sub.add_parser(
        "plan", help="what `features apply` would change (groups, features, Feast objects) and make stale; no changes"
    )
    _repo_arg(plan)
    plan.add_argument("--json", action="store_true", help="print one JSON document instead of the lines")

    demo = sub.add_parser("demo", help="generate transactions, apply, backfill, and show features")
    _repo_arg(demo)
    demo.add_argument("--events", type=int, default=200_000, help="events to generate (default 200000)")
    demo.add_argument("--users", type=int, default=2_000, help="users to generate (default 2000)")
    demo.add_argument("--days", type=float, default=3.0, help="days of history (default 3)")
    demo.add_argument(
        "--kafka",
        action="store_true",
        help="produce the events to a Kafka topic and stream them to the stores (a local broker if none answers)",
    )
    demo.add_argument(
        "--bootstrap-servers",
        default=DEMO_BROKER,
        help=f"the Kafka broker of --kafka (default {DEMO_BROKER}; started there when none answers)",
    )

    serve = sub.add_parser(
        "serve",
        help="start Feast's HTTP feature server for the repo (POST /get-online-features), tuned for latency",
    )
    _repo_arg(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=6566, help="port to listen on (default 6566)")
    serve.add_argument("--workers", type=int, default=None, help="worker processes (default: one per CPU, at most 4)")
    serve.add_argument("--access-log", action="store_true", help="log every request (off by default: it costs latency)")
    for flag, default, what in (
        ("--max-entity-rows", DEFAULT_MAX_ENTITY_ROWS, "entity rows one request may ask for"),
        ("--max-body-bytes", DEFAULT_MAX_BODY_BYTES, "bytes a request body may have"),
    ):
        serve.add_argument(flag, type=int, default=default, help=f"{what}; more is answered 413 (default {default})")
    serve.add_argument(
        "--log-served",
        action="store_true",
        help="append a sample of the answers to the served log (data/served), for `features monitor --served`",
    )
    serve.add_argument("--log-sample", type=float, help="with --log-served: share of requests logged (default 0.01)")
    from features import cli_monitor

    cli_monitor.add_monitor_parser(sub, _repo_arg)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with _watched(args):
            return _run(args)
    except JobStalled as exc:  # the watchdog ended it (features.engine.watchdog)
        print(f"error: {exc}", file=sys.stderr)
        return 4
    except DataError as exc:  # the data failed (e.g. validation), not the command: status 1
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except FeaturesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not the user's mistake: the traceback for the report, then one line
        problem = machine_problem(exc)  # or the machine's: a full disk, a table file deleted by hand
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        return _unexpected(args.command, exc)


def _watched(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
    if not hasattr(args, "stall_timeout"):
        return contextlib.nullcontext()
    from features.engine.watchdog import StallLimit, watching

    return watching(args.command, StallLimit.parse(args.stall_timeout))


def _unexpected(command: str, exc: Exception) -> int:
    """Status 3 for an unexpected exception: its traceback (for whoever debugs it), then one `error:` line (what
    alerting shows)."""
    import traceback

    traceback.print_exc()
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"
    print(f"error: features {command} failed unexpectedly: {reason[:500]}", file=sys.stderr)
    return 3


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "log_level", None):
        _set_log_level(args.repo, args.log_level)
    if args.command == "status":
        return _status(args)
    if args.command == "plan":
        return _plan(args)
    if args.command == "backfill":
        return run_backfill(args)
    if args.command == "apply":
        from features.pipelines.registration import apply

        # With --json, stdout holds the JSON line alone: Feast's notes of what it created go to stderr.
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            applied = apply(args.repo, prune=args.prune)
        if args.json:
            print_json({"applied": applied})
        else:
            print(f"applied feature groups: {', '.join(applied) or 'none'}")
        return 0
    if args.command == "monitor":
        from features import cli_monitor

        return cli_monitor.run_monitor(args)
    if args.command == "retention":
        from features.cli_maintenance import retention

        return retention(args)
    if args.command == "stream":
        return _stream(args)
    if args.command == "validate":
        return validate_command(args.repo, args.group, as_json=args.json)
    if args.command == "verify":
        return verify_command(args)
    if args.command in ("compact", "migrate", "savepoint"):
        from features import cli_maintenance

        return cli_maintenance.run(args)
    if args.command == "demo":
        if args.kafka:
            from features.demo.kafka_demo import run_kafka_demo

            run_kafka_demo(
                args.repo,
                events=args.events,
                users=args.users,
                days=args.days,
                bootstrap_servers=args.bootstrap_servers,
            )
            return 0
        from features.demo.run import run_demo

        run_demo(args.repo, events=args.events, users=args.users, days=args.days)
        return 0
    if args.command == "serve":
        from features.stores.served_logging import served_sample
        from features.stores.serving import serve

        if args.workers is not None and args.workers < 1:
            raise ConfigError(f"--workers: {args.workers} is not a positive number of worker processes")
        if not 0 < args.port < 65536:
            raise ConfigError(f"--port: {args.port} is not a TCP port (1-65535)")
        limits = RequestLimits(max_entity_rows=args.max_entity_rows, max_body_bytes=args.max_body_bytes)
        served = served_sample(args.log_served, args.log_sample)
        serve(
            args.repo,
            host=args.host,
            port=args.port,
            workers=args.workers,
            access_log=args.access_log,
            limits=limits,
            log_served=served,
        )
        return 0
    raise AssertionError(args.command)  # argparse only accepts the commands above


def _set_log_level(repo_path: str, level: str) -> None:
    """`--log-level`: Python's logging, and Spark's through the session (started here, once the repo loads, so
    that the whole run logs at that level; a Spark Connect session has no SparkContext to set it on)."""
    from features.repo import Repo

    configure_logging(level)
    Repo.load(repo_path)  # a wrong --repo fails in one line, before Spark starts
    from features.engine.session import get_spark, is_connect

    spark = get_spark()
    if not is_connect(spark):
        spark.sparkContext.setLogLevel({"warning": "WARN"}.get(level, level.upper()))  # log4j's names


def configure_logging(level: str) -> None:
    """Python's logging at `level` on stderr; at DEBUG, a session started after this logs with Spark's own profile
    (features.engine.session), errors with their traces."""
    import logging

    layout = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=layout)
    logging.getLogger().setLevel(level.upper())
    # py4j logs each call to the JVM at DEBUG: thousands of lines that say nothing about the run. It also logs, at
    # ERROR with its whole trace, the error a Python callback (a stream's foreachBatch) raised: the query then fails
    # with that error, which the command reports in one line; at DEBUG it shows.
    logging.getLogger("py4j").setLevel(logging.INFO if level.upper() == "DEBUG" else logging.CRITICAL)


def _status(args: argparse.Namespace) -> int:
    """`features status`: a table per group, or one JSON document."""
    from features.pipelines.status import status
    from features.repo import Repo

    return _show(status(Repo.load(args.repo), args.group, checkpoint_root=args.checkpoint_dir), args.json)


def _plan(args: argparse.Namespace) -> int:
    """`features plan`: what `features apply` would change; changes nothing."""
    from features.pipelines.apply_plan import plan_apply
    from features.repo import Repo

    return _show(plan_apply(Repo.load(args.repo)), args.json)


def _show(report: Any, as_json: bool) -> int:
    """A report (status, plan) as its lines, or as one JSON document."""
    if as_json:
        print_json(report)
    else:
        print("\n".join(report.lines()))
    return 0


def _stream(args: argparse.Namespace) -> int:
    """`features stream`: run until stopped (Ctrl-C stops cleanly) or, with --available-now, until done."""
    from features.errors import ValidationFailed
    from features.pipelines.options import StreamOptions
    from features.pipelines.stream import handoff
    from features.repo import Repo

    options = StreamOptions(
        trigger=args.trigger,
        available_now=args.available_now,
        checkpoint_root=args.checkpoint_dir,
        reset=args.reset,
        from_savepoint=args.from_savepoint,
        online=not args.no_online,
        buckets=args.buckets,
        max_files_per_trigger=args.max_files_per_trigger,
        progress=True,
        tracking=not args.no_tracking,
        metrics_every=args.metrics_every,
        retention=None if args.retention.lower() == "none" else args.retention,
    )
    repo = Repo.load(args.repo)
    if options.buckets is not None and not options.reset and options.from_savepoint is None:
        # Every group named runs in a live stream: each takes the rescale up in its own process.
        held = handoff.live_holders(repo, args.group, options.checkpoint_root)
        for name, checkpoint in (held or {}).items():
            print(handoff.ask_rescale(name, checkpoint, options.buckets), file=sys.stderr, flush=True)
        if held:
            return 0
    from features.pipelines.stream.runner import start_streams  # Spark, for a stream this process runs

    run = start_streams(repo, args.group, options)
    try:
        interrupted = run.await_or_interrupt()
    except ValidationFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C, while the first one's stop was under way
        run.stop()
        interrupted = True
    if interrupted:
        print("stopped; the next run resumes from the checkpoint", file=sys.stderr)
    if args.json:
        for progress in run.progress():
            print_json(progress)
    else:
        print("\n".join(run.summary()))
    return 0


def job_main(command: str, argv: Sequence[str]) -> int:
    """`features <command> <argv>` for schedulers (spark-submit, Databricks, cron), with the statuses of `main`:
    0 done, 1 the data failed, 2 a usage or configuration error, 3 an unexpected error, 4 stalled (no progress in
    Spark for the stall limit), 130 interrupted."""
    return main([command, *argv])


if __name__ == "__main__":
    sys.exit(main())
