"""The `features` commands that rewrite stored state rather than compute features: `migrate` and `compact`
(offline tables), `savepoint` (a stream's state), `retention` (what is kept set aside)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    if args.command == "migrate":
        return migrate(args.repo, args.group)
    if args.command == "compact":
        return compact(args.repo, args.group, args.retention)
    return savepoint(args.repo, args.group, args.to, args.checkpoint_dir)


def savepoint(repo_path: str, group_name: str, to: str | None, checkpoint_dir: str | None) -> int:
    """`features savepoint`: a group's stream state after its last committed micro-batch, written to a folder."""
    from features.engine.session import get_spark
    from features.pipelines.stream.savepoint import take
    from features.repo import Repo

    repo = Repo.load(repo_path)
    (group,) = repo.select([group_name])
    taken = take(get_spark("features-savepoint"), repo, group, to, checkpoint_dir)
    print(taken.line())
    print(f"start from it: features stream --repo {repo.root} --group {group.name} --from-savepoint {taken.path}")
    return 0


def migrate(repo_path: str, groups: list[str]) -> int:
    """`features migrate`: each group's offline table of an earlier version converted into a Delta table."""
    from features.repo import Repo
    from features.stores import migration

    repo = Repo.load(repo_path)
    for group in repo.select(groups):
        table = repo.offline_path(group)
        if not migration.needs_migration(table):
            print(f"{group.name}: {table} needs no conversion (a Delta table, or no table yet)")
            continue
        from features.engine.session import get_spark

        files = migration.migrate(get_spark("features-migrate"), table)
        print(f"{group.name}: converted {table} into a Delta table ({files} Parquet files rewritten)")
    return 0


def compact(repo_path: str, groups: list[str], retention: str | None) -> int:
    """`features compact`: each group's offline table compacted (dates with several files) and vacuumed."""
    from datetime import timedelta

    from features.engine.session import get_spark
    from features.repo import Repo
    from features.spec.durations import parse_duration
    from features.stores.compaction import compact, vacuum
    from features.stores.offline import exists

    repo = Repo.load(repo_path)
    keep = timedelta(seconds=parse_duration(retention, "--retention")) if retention is not None else None
    spark = None
    for group in repo.select(groups):
        table = repo.offline_path(group)
        if not exists(table):
            print(f"{group.name}: no offline table yet")
            continue
        spark = spark or get_spark("features-compact")
        compacted = compact(spark, table)
        vacuum(spark, table, keep)
        files = sum(compacted.values())
        done = f"{len(compacted)} dates compacted ({files} files into {len(compacted)})" if compacted else "compact"
        print(f"{group.name}: {done}; files no version within the retention needs removed")
    return 0


def retention(args: argparse.Namespace) -> int:
    """`features retention`: what each group keeps set aside, after removing what is older than --keep."""
    from features.pipelines.retention import held, sweep
    from features.repo import Repo
    from features.spec.durations import parse_duration

    repo = Repo.load(args.repo)
    keep_s = parse_duration(args.keep, "--keep")
    for group in repo.select(args.group):
        removed = sweep(repo, group.name, keep_s, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        for gone in (r for r in removed if r.folders):
            print(f"{verb}: {gone.line()}")
        for kept in held(repo, group.name):
            print(f"held:    {kept.line()}")
    return 0
