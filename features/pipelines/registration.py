"""`features apply` as a library call: register a repo's feature groups with Feast, after checking them.

The CLI, the demo, the notebooks and the benchmarks call it; it lives apart from the command line so that all
of them import downwards."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from features.atomic import write_whole
from features.errors import ConfigError
from features.repo import Repo, read_schema_record
from features.spec import DType, FeatureGroup
from features.spec.fingerprint import definition_hash
from features.version import package_version

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# What Feast prints (with print, on stdout) on every apply and plan of a repo whose modules define no
# feast.Project: a repo of this package takes its project from feature_store.yaml, so there is nothing to act on.
PROJECT_NOTE = "No project found in the repository. Using project name {} defined in feature_store.yaml"


class _LinesWithout(io.TextIOBase):
    """A text stream passing each complete line on to `out`, except the line `dropped` (print writes a line in
    more than one call: lines are put together before they are compared)."""

    def __init__(self, out: TextIO, dropped: str) -> None:
        super().__init__()
        self.out, self.dropped, self.partial = out, dropped, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.partial = (self.partial + text).split("\n")
        kept = [line for line in lines if line != self.dropped]
        if kept:
            self.out.write("\n".join(kept) + "\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def finish(self) -> None:
        """Pass on what is left of a last line without its newline."""
        if self.partial and self.partial != self.dropped:
            self.out.write(self.partial)
        self.partial = ""
        self.out.flush()


@contextmanager
def without_project_note(project: str) -> Iterator[None]:
    """Everything Feast prints meanwhile, except its `PROJECT_NOTE` for `project`, to the stdout of the moment (a
    caller's redirect stands)."""
    filtered = _LinesWithout(sys.stdout, PROJECT_NOTE.format(project))
    try:
        with redirect_stdout(filtered):
            yield
    finally:
        filtered.finish()


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
    the source's schema first, so that a typo fails here and not in the first backfill (once per expression and
    schema: `check_wheres`). Feature views of groups that are no longer defined are removed only with `prune`
    (else a ConfigError names them): Feast's apply would drop them, and their online values, silently. A change that a
    stream running the group cannot take (a new join key or timestamp column) is refused while it runs."""
    from features.engine.session import session_soon
    from features.pipelines.stream.handoff import check_running_streams_take
    from features.stores.feast_repo import apply_repo

    repo = Repo.load(repo_path)
    check_running_streams_take(repo)
    session = None if _all_checked(repo) else session_soon(None)  # the JVM starts while Feast loads
    check_removed_groups(repo, prune=prune)
    for warning in record_source_schemas(repo):
        print(f"warning: {warning}", file=sys.stderr)
    check_wheres(repo, session)
    with _in_dir(repo.root), without_project_note(repo.project):
        apply_repo(repo)
    record_applied(repo)
    return list(repo.groups)


# Where `features apply` records each group's definition as it registered it (its hash): a live stream watches it
# to take a changed definition up between micro-batches (features.pipelines.stream.reload).
APPLIED = Path("data") / "applied.json"


def record_applied(repo: Repo) -> None:
    path = repo.root / APPLIED
    path.parent.mkdir(parents=True, exist_ok=True)
    hashes = {name: definition_hash(group) for name, group in sorted(repo.groups.items())}
    write_whole(path, json.dumps({"groups": hashes}, indent=1) + "\n")


def read_applied(root: Path) -> dict[str, str]:
    """Each group's definition hash as the last `features apply` registered it ({} before one recorded any)."""
    try:
        return dict(json.loads((root / APPLIED).read_text())["groups"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return {}  # unreadable: a live stream keeps the definitions it runs, until the next apply


# Where `features apply` records the `where`s Spark accepted, against which schema, with which versions.
WHERE_CHECKS = Path("data") / "where_checks.json"


def _with_wheres(
    repo: Repo, inferred: Mapping[str, Mapping[str, DType]]
) -> Iterator[tuple[FeatureGroup, dict[str, DType]]]:
    """Each group with a `where`, and its source's schema (`inferred`'s for the sources it has)."""
    from features.stores.feast_objects import source_schema

    for group in repo.groups.values():
        if any(f.where is not None for f in group.features):
            yield group, source_schema(group, repo.root, inferred.get(group.source.name))


def _all_checked(repo: Repo) -> bool:
    """Whether every `where` passed before against its source's schema as known without reading the source's
    files (declared, or recorded by an earlier apply): decided before this apply records the schemas again, so
    that Spark, when it is needed, starts at once, while Feast loads."""
    checked = _checked_wheres(repo.root)
    for group in repo.groups.values():
        if any(f.where is not None for f in group.features):
            schema = group.source.schema or _recorded(repo.root, group)
            if schema is None or not set(_where_keys(group, schema)) <= checked:
                return False
    return True


def _recorded(root: Path, group: FeatureGroup) -> dict[str, DType] | None:
    if group.source.format != "parquet":
        return None  # only Parquet sources have a recorded schema; others are read from their files
    try:
        return read_schema_record(root, group.source)
    except ConfigError:
        return None  # a stale record (another path, an older format): this apply records it again, then checks


def _where_keys(group: FeatureGroup, schema: Mapping[str, DType]) -> list[str]:
    """One key per `where` of the group: the expression, the source's columns and types, and the versions of
    Spark and of this package, hashed (a check made under all of them holds while none of them changes)."""
    import pyspark

    columns = sorted((column, dtype.value) for column, dtype in schema.items())
    versions = [pyspark.__version__, package_version()]
    texts = [json.dumps([*versions, f.where, columns]) for f in group.features if f.where is not None]
    return [hashlib.sha256(text.encode()).hexdigest() for text in texts]


def _checked_wheres(root: Path) -> set[str]:
    try:
        return set(json.loads((root / WHERE_CHECKS).read_text())["checked"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return set()  # an unreadable record only costs a check again


def check_wheres(
    repo: Repo,
    session: Callable[[], SparkSession] | None = None,
    *,
    inferred: Mapping[str, Mapping[str, DType]] | None = None,
    record: bool = True,
) -> None:
    """Spark's parser and analyzer on each `where`, over an empty frame with the source's schema, and each `where`
    evaluated on one row of plain values (`check_where_values`: a cast that fails whatever the data). Spark starts
    only when some `where` has not passed this check before against the same schema, Spark and package versions
    (recorded in the repo, `WHERE_CHECKS`: an apply that changes no `where` needs no JVM). `session`: gives the
    session (default: `get_spark`). `inferred`: source name -> the schema to check against instead of the
    recorded one; `record`: whether to record the `where`s that passed."""
    checked, unchecked = _checked_wheres(repo.root), []
    for group, schema in _with_wheres(repo, inferred or {}):
        group.check_schema(schema)  # the columns it reads, also when its `where`s passed before
        if not set(keys := _where_keys(group, schema)) <= checked:
            unchecked.append((group, schema, keys))
    if not unchecked:
        return
    from features.engine.schema import spark_schema
    from features.engine.session import get_spark
    from features.engine.source import check_columns, check_where_values

    spark = (session or get_spark)()
    for group, schema, keys in unchecked:
        empty = spark.createDataFrame([], spark_schema(schema))
        check_columns(group, empty)
        check_where_values(group, empty)
        checked.update(keys)
    if not record:
        return
    path = repo.root / WHERE_CHECKS
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps({"checked": sorted(checked)}, indent=1) + "\n")


def check_wheres_unapplied(repo: Repo) -> None:
    """The check `apply` makes of each `where` (`check_wheres`), against the schemas apply would record (the
    source's files as they are now), recording nothing: `features plan` refuses what `features apply` would,
    with the same error, and changes nothing in the repo. Spark starts for a `where` that no apply checked."""
    check_wheres(repo, inferred=inferred_schemas(repo), record=False)


TAG = "features.source"  # the tag features.stores.feast_objects.to_feast puts on every view it makes


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


def record_source_schemas(repo: Repo) -> list[str]:
    """Infer the schema of every Parquet source of the repo that declares none, from all the files present, and
    record it in the repo (`features.repo.write_schema_record`): every later read uses it, until the next
    `features apply`. Returns a warning per conflict between files (a type, or a column a group reads that some
    files lack), naming the files and the choice recorded."""
    from features.engine.schema import read_columns
    from features.parquet_schema import infer_parquet_schema
    from features.repo import write_schema_record

    warnings: list[str] = []
    for name, groups in _inferred_sources(repo).items():
        source = groups[0].source
        where = f"EventSource({name!r})"
        inferred = infer_parquet_schema(repo.source_path(groups[0]), where)
        if inferred is None:
            continue  # no files yet: the first read that finds some infers from them (nothing recorded)
        read = {c for g in groups for c in read_columns(g, inferred.columns)}
        conflicts = [c for c in inferred.conflicts if c.column in read]
        warnings += [c.describe(where) for c in conflicts]
        warnings += [note for c in sorted(read) if (note := inferred.missing_note(where, c)) is not None]
        write_schema_record(
            repo.root,
            source,
            inferred.columns,
            files=inferred.files,
            conflicts=[
                {
                    "column": c.column,
                    "recorded": c.recorded.value,
                    "set_aside": [{"file": f.file, "type": f.type, "rows": f.rows} for f in c.misfits],
                }
                for c in inferred.conflicts
            ],
        )
    return warnings


def _inferred_sources(repo: Repo) -> dict[str, list[FeatureGroup]]:
    """The Parquet sources on this machine that declare no schema (apply infers and records theirs), by name,
    with the groups reading each."""
    sources: dict[str, list[FeatureGroup]] = {}
    for group in repo.groups.values():
        source = group.source
        if source.schema is None and source.format == "parquet" and "://" not in repo.source_path(group):
            sources.setdefault(source.name, []).append(group)
    return sources


def inferred_schemas(repo: Repo) -> dict[str, dict[str, DType]]:
    """Per source of a group with a `where`, the schema `record_source_schemas` would record now, unrecorded
    (sources without files, declared or remote ones are left out: apply records none for them)."""
    from features.parquet_schema import infer_parquet_schema

    schemas = {}
    for name, groups in _inferred_sources(repo).items():
        if any(f.where is not None for g in groups for f in g.features):
            inferred = infer_parquet_schema(repo.source_path(groups[0]), f"EventSource({name!r})")
            if inferred is not None:
                schemas[name] = dict(inferred.columns)
    return schemas
