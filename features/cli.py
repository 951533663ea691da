"""The `features` command line: apply, backfill, demo."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from features.errors import FeaturesError

DEFAULT_REPO = "feature_repo"


def _repo_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", default=DEFAULT_REPO, help="the feature repository (folder with feature_store.yaml)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="features", description="Declarative windowed features on Spark and Feast.")
    sub = parser.add_subparsers(dest="command", required=True)

    apply = sub.add_parser("apply", help="register the repo's feature groups with Feast (like `feast apply`)")
    _repo_arg(apply)

    backfill = sub.add_parser("backfill", help="compute change points for a time range into both stores")
    _repo_arg(backfill)
    backfill.add_argument("--start", required=True, help="first window end, ISO-8601 UTC (e.g. 2026-01-01)")
    backfill.add_argument("--end", required=True, help="end of the range (exclusive), ISO-8601 UTC")
    backfill.add_argument("--group", action="append", default=[], help="only this group (repeatable)")
    backfill.add_argument("--no-online", action="store_true", help="write the offline table only")

    demo = sub.add_parser("demo", help="generate transactions, apply, backfill, and show features")
    _repo_arg(demo)
    demo.add_argument("--events", type=int, default=200_000, help="events to generate (default 200000)")
    demo.add_argument("--users", type=int, default=2_000, help="users to generate (default 2000)")
    demo.add_argument("--days", type=float, default=3.0, help="days of history (default 3)")
    return parser


@contextmanager
def _in_dir(path: Path):
    # Feast's apply changes the working directory; give it back.
    before = os.getcwd()
    try:
        yield
    finally:
        os.chdir(before)


def apply(repo_path: str) -> list[str]:
    """Register the repo with Feast (same as `feast apply` in that folder); returns the group names."""
    from feast.repo_config import load_repo_config
    from feast.repo_operations import apply_total

    from features.repo import Repo

    repo = Repo.load(repo_path)
    with _in_dir(repo.root):
        apply_total(load_repo_config(repo.root, repo.root / "feature_store.yaml"), repo.root, True)
    return list(repo.groups)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except FeaturesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "apply":
        print(f"applied feature groups: {', '.join(apply(args.repo)) or 'none'}")
        return 0
    if args.command == "backfill":
        from features.backfill import backfill
        from features.repo import Repo

        for result in backfill(Repo.load(args.repo), args.start, args.end, args.group, online=not args.no_online):
            print(result.summary())
        return 0
    if args.command == "demo":
        from features.demo.run import run_demo

        run_demo(args.repo, events=args.events, users=args.users, days=args.days)
        return 0
    raise AssertionError(args.command)  # argparse only accepts the commands above


if __name__ == "__main__":
    sys.exit(main())
