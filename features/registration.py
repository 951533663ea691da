"""`features apply` as a library call: register a repo's feature groups with Feast, after checking them.

The CLI, the demo, the notebooks and the benchmarks call it; it lives apart from the command line so that all
of them import downwards."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

from features.errors import ConfigError
from features.repo import Repo


@contextmanager
def _in_dir(path: Path):
    # Feast's apply changes the working directory; give it back.
    before = os.getcwd()
    try:
        yield
    finally:
        os.chdir(before)


def apply(repo_path: str, *, prune: bool = False) -> list[str]:
    """Register the repo with Feast (what `feast apply` does in that folder, plus every FeatureGroup of the
    repo's modules, whether or not a module exports its `to_feast` objects); returns the group names.

    The schema of each Parquet source that declares none is inferred from all its files and recorded in the
    repo (data/schemas/<source>.json): every later read uses it, until the next apply; a conflict between files
    is printed as a warning naming them and the type recorded. Each group's `where` is checked by Spark against
    the source's schema first, so that a typo fails here and not in the first backfill. Feature views of groups
    that are no longer defined are removed only with `prune` (else a ConfigError names them): Feast's apply
    would drop them, and their online values, silently."""
    from features.feast_objects import apply_repo, record_source_schemas

    repo = Repo.load(repo_path)
    check_removed_groups(repo, prune=prune)
    for warning in record_source_schemas(repo):
        print(f"warning: {warning}", file=sys.stderr)
    check_wheres(repo)
    with _in_dir(repo.root):
        apply_repo(repo)
    return list(repo.groups)


def check_wheres(repo: Repo) -> None:
    """Spark's parser and analyzer on each `where`, over an empty frame with the source's schema (Spark starts
    only when some feature has a `where`)."""
    from features.feast_objects import source_schema

    groups = [g for g in repo.groups.values() if any(f.where is not None for f in g.features)]
    if not groups:
        return
    from features.engine.schema import spark_schema
    from features.engine.session import get_spark
    from features.engine.source import check_columns

    spark = get_spark()
    for group in groups:
        check_columns(group, spark.createDataFrame([], spark_schema(source_schema(group, repo.root))))


TAG = "features.source"  # the tag features.feast_objects.to_feast puts on every view it makes


def removed_groups(repo: Repo) -> list[str]:
    """Feature views in the Feast registry made from a group that the repo no longer defines."""
    views = repo.feature_store().list_feature_views(allow_cache=False)
    return sorted(v.name for v in views if TAG in (v.tags or {}) and v.name not in repo.groups)


def check_removed_groups(repo: Repo, *, prune: bool) -> list[str]:
    """Refuse to apply when it would remove views of deleted groups, unless `prune`; returns those views."""
    removed = removed_groups(repo)
    if not removed:
        return []
    names = ", ".join(map(repr, removed))
    if not prune:
        raise ConfigError(
            f"apply: the Feast registry has feature view(s) {names} but no feature group in {repo.root} defines "
            "them any more; run `features apply --prune` to remove them (with their online values), or restore "
            "the group(s)"
        )
    tables = ", ".join(repo.offline_path(name) for name in removed)
    print(
        f"pruning feature view(s) {names} from the Feast registry and the online store; their offline data "
        f"stays in {tables} (delete it when it is no longer needed)"
    )
    return removed
