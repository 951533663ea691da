"""A feature repository: a Feast repo folder whose Python files also declare FeatureGroups.

Layout conventions (all relative to the repo root unless given as absolute paths or URIs):
    feature_store.yaml          Feast's configuration (project, registry, online and offline stores)
    *.py                        definitions; every module-level FeatureGroup is picked up
    data/offline/<group>/       the offline change-point table, Parquet partitioned by date=YYYY-MM-DD
    data/late/<group>/          events the stream received behind its watermark, batch=<id>/*.parquet with the
                                source's columns: the next backfill of their dates makes the offline table exact
    data/checkpoints/<group>/   the stream's checkpoint and state (default; the user can set another root)
    data/schemas/<source>.json  the schema `features apply` inferred for a Parquet source that declares none,
                                from all its files: every later read uses it, until the next apply
"""

from __future__ import annotations

import contextvars
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from features.atomic import write_whole
from features.errors import ConfigError, FeaturesError
from features.spec import DType, EventSource, FeatureGroup, RequestFeature
from features.spec.request import check_request_features

if TYPE_CHECKING:
    from feast import FeatureStore

OFFLINE_DIR = Path("data") / "offline"
LATE_DIR = Path("data") / "late"
CHECKPOINT_DIR = Path("data") / "checkpoints"
SCHEMA_DIR = Path("data") / "schemas"
SCHEMA_FORMAT = 1
_SKIP_DIRS = {"data", "__pycache__", ".ipynb_checkpoints"}
# True while `Repo.load` imports the repo's modules: their `to_feast` exports are then placeholders, built (and
# Feast imported, seconds of every cold command) only if something uses them. `features apply` makes the
# objects from the groups itself, and plain `feast apply` imports the modules in a process of its own.
_DEFERRED_EXPORTS = contextvars.ContextVar("features_deferred_exports", default=False)


def exports_deferred() -> bool:
    return _DEFERRED_EXPORTS.get()


@contextmanager
def _exports(deferred: bool) -> Iterator[None]:
    token = _DEFERRED_EXPORTS.set(deferred)
    try:
        yield
    finally:
        _DEFERRED_EXPORTS.reset(token)


class DeferredExport:
    """One of the objects a `to_feast` call in a repo module returns, while `Repo.load` imports the module: the
    call's objects are built when any of them is first used (attribute access), then this one stands for its
    object. `isinstance` checks do not see through it; `features apply` needs none of them."""

    __slots__ = ("_build", "_index")

    def __init__(self, build: Callable[[], list[Any]], index: int) -> None:
        self._build = build
        self._index = index

    def __getattr__(self, name: str) -> Any:
        return getattr(self._build()[self._index], name)

    def __repr__(self) -> str:
        return f"<to_feast export {self._index}, built when used>"


def deferred_exports(build: Callable[[], list[Any]], count: int) -> list[DeferredExport]:
    """`count` placeholders for the objects `build()` returns, built once, outside `Repo.load`'s deferral."""
    built: list[list[Any]] = []

    def once() -> list[Any]:
        if not built:
            with _exports(deferred=False):
                built.append(build())
        return built[0]

    return [DeferredExport(once, i) for i in range(count)]


def resolve(root: Path, path: str) -> str:
    """`path` as given if absolute or a URI (s3://, dbfs:/, ...), else relative to `root`."""
    if "://" in path or path.startswith("dbfs:") or Path(path).is_absolute():
        return path
    return str((root / path).resolve())


def offline_table_path(root: Path | str, group_name: str) -> str:
    """Where a group's offline table lives under a repo root."""
    return str((Path(root) / OFFLINE_DIR / group_name).resolve())


def online_store_type(config: Mapping[str, Any]) -> str:
    """feature_store.yaml's online store type as written (`online_store: redis` or `type: redis` under it),
    Feast's default (sqlite) when it names none."""
    online = config.get("online_store") or {}
    return online if isinstance(online, str) else str(online.get("type", "sqlite"))


# The online stores features writes (features.stores.online), by every name feature_store.yaml may give them.
ONLINE_STORE_TYPES = {
    "sqlite": "sqlite",
    "feast.infra.online_stores.sqlite.SqliteOnlineStore": "sqlite",
    "redis": "redis",
    "feast.infra.online_stores.redis.RedisOnlineStore": "redis",
}


@dataclass
class Repo:
    root: Path
    config: dict[str, Any]
    groups: dict[str, FeatureGroup] = field(default_factory=dict)
    request_features: dict[str, RequestFeature] = field(default_factory=dict)

    @property
    def project(self) -> str:
        return str(self.config.get("project", ""))

    @property
    def online_store_type(self) -> str:
        return online_store_type(self.config)

    def source_path(self, group: FeatureGroup) -> str:
        """The group's source folder; the reads of it use this repo's recorded schema (`recorded_schema`)."""
        path = resolve(self.root, group.source.path)
        _RECORDS_OF[(group.source.name, path)] = self.root
        return path

    def offline_path(self, group: FeatureGroup | str) -> str:
        name = group if isinstance(group, str) else group.name
        return offline_table_path(self.root, name)

    def late_path(self, group: FeatureGroup | str) -> str:
        name = group if isinstance(group, str) else group.name
        return str((self.root / LATE_DIR / name).resolve())

    def checkpoint_path(self, group: FeatureGroup | str, root: str | None = None) -> str:
        """The stream's checkpoint folder for a group: under `root` if given, else under the repo."""
        name = group if isinstance(group, str) else group.name
        if root:
            return str(Path(resolve(self.root, root)) / name)
        return str((self.root / CHECKPOINT_DIR / name).resolve())

    def select(self, names: list[str] | None) -> list[FeatureGroup]:
        """The named groups (all of them when `names` is empty), or a ConfigError naming the unknown one."""
        if not names:
            return list(self.groups.values())
        unknown = [n for n in names if n not in self.groups]
        if unknown:
            raise ConfigError(
                f"--group: no feature group named {', '.join(map(repr, unknown))} in {self.root}; "
                f"the repo defines {', '.join(sorted(self.groups)) or 'none'}"
            )
        return [self.groups[n] for n in names]

    def feature_store(self) -> FeatureStore:
        from feast import FeatureStore

        return FeatureStore(repo_path=str(self.root))

    @classmethod
    def load(cls, path: str | Path) -> Repo:
        root = Path(path).expanduser().resolve()
        config_file = root / "feature_store.yaml"
        if not config_file.is_file():
            raise ConfigError(
                f"--repo: {root} has no feature_store.yaml; point --repo at a Feast feature repository "
                "(the folder holding feature_store.yaml and the definitions)"
            )
        repo = cls(root=root, config=read_config(config_file))
        defined_in: dict[str, Path] = {}
        for module_file in sorted(root.rglob("*.py")):
            if _SKIP_DIRS.intersection(module_file.relative_to(root).parts[:-1]):
                continue
            with _exports(deferred=True):
                module = _import(module_file, root)
            for value in vars(module).values():
                if isinstance(value, RequestFeature):
                    _add_request_feature(repo, value, module_file, defined_in)
                if not isinstance(value, FeatureGroup):
                    continue
                other = repo.groups.setdefault(value.name, value)
                defined_in.setdefault(value.name, module_file)
                if other is not value and other != value:  # the same definition twice (a copied module) is one
                    raise ConfigError(
                        f"FeatureGroup.name: {defined_in[value.name]} and {module_file} define different feature "
                        f"groups named {value.name!r}. Fix: rename one of them, or delete the copy"
                    )
        for group in repo.groups.values():
            repo.source_path(group)  # notes the repo whose recorded schemas the reads of its sources use
        check_request_features(list(repo.request_features.values()), repo.groups)
        return repo


def _add_request_feature(repo: Repo, feature: RequestFeature, module_file: Path, defined_in: dict[str, Path]) -> None:
    other = repo.request_features.setdefault(feature.name, feature)
    key = f"request:{feature.name}"
    defined_in.setdefault(key, module_file)
    if other is not feature:
        raise ConfigError(
            f"RequestFeature.name: {defined_in[key]} and {module_file} define request-time features named "
            f"{feature.name!r}. Fix: rename one of them, or delete the copy"
        )


# ---------------------------------------------------------------------------------------------------------
# Recorded source schemas

# (source name, source folder) -> the root of the repo last loaded that reads it: the engines read a source by
# its folder alone, and take the recorded schema of the repo that named that folder (`Repo.source_path`).
_RECORDS_OF: dict[tuple[str, str], Path] = {}


def schema_record_path(root: Path | str, source_name: str) -> Path:
    """Where a repo records the inferred schema of a source."""
    return Path(root) / SCHEMA_DIR / f"{source_name}.json"


def write_schema_record(
    root: Path | str,
    source: EventSource,
    columns: Mapping[str, DType],
    *,
    files: int,
    conflicts: list[dict[str, Any]] | None = None,
) -> Path:
    """Record a source's inferred schema (atomically: written aside, then renamed over the old record), with
    the number of files it was inferred from and the conflicts between them."""
    path = schema_record_path(root, source.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "format": SCHEMA_FORMAT,
        "source": source.name,
        "path": source.path,
        "columns": {column: dtype.value for column, dtype in columns.items()},
        "inferred_from_files": files,
        "recorded_at": datetime.now(UTC).isoformat(),
        "conflicts": conflicts or [],
    }
    write_whole(path, json.dumps(data, indent=1) + "\n")
    return path


def read_schema_record(root: Path | str, source: EventSource) -> dict[str, DType] | None:
    """The schema recorded for `source` in the repo at `root`, or None when there is none. A ConfigError naming
    the file and the fix when the record is unreadable or was inferred for another path."""
    path = schema_record_path(root, source.name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    again = f"run `features apply --repo {root}` to infer the schema from the files and record it again"
    try:
        data = json.loads(text)
        if data.get("format") != SCHEMA_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this version of features reads {SCHEMA_FORMAT}")
        columns = {str(column): DType(value) for column, value in data["columns"].items()}
        recorded_path = str(data["path"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a readable schema record ({type(exc).__name__}: {exc}). Fix: {again}") from None
    if recorded_path != source.path:
        raise ConfigError(
            f"{path}: the schema of EventSource({source.name!r}) was recorded for path {recorded_path!r}, and the "
            f"source now reads {source.path!r}. Fix: {again}"
        )
    return columns


def recorded_schema(source: EventSource, folder: str) -> dict[str, DType] | None:
    """The recorded schema of `source` read from `folder`, in the repo that last named that folder for it
    (`Repo.source_path`); None when no loaded repo did, or it recorded none."""
    root = _RECORDS_OF.get((source.name, folder))
    return None if root is None else read_schema_record(root, source)


def read_config(config_file: Path) -> dict[str, Any]:
    """feature_store.yaml as a mapping, checked for what every command needs (a project, a known online store
    type): a ConfigError naming the file, the field and the fix, not Feast's traceback later."""
    example = "see feature_repo/feature_store.yaml in the features repository for a working one"
    try:
        config = yaml.safe_load(os.path.expandvars(config_file.read_text()))  # as Feast reads it
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(
            f"{config_file}: not valid YAML{where} ({problem}). Fix: correct the YAML; {example}"
        ) from None
    if not isinstance(config, dict):
        kind = "empty" if config is None else f"a {type(config).__name__}"
        raise ConfigError(
            f"{config_file}: the file is {kind}, not a mapping of settings. Fix: write `key: value` lines "
            f"(project, registry, provider, online_store); {example}"
        )
    if not config.get("project"):
        raise ConfigError(
            f"{config_file}: project: missing. Fix: add a line `project: <name>` (letters, digits and underscores)"
        )
    online = config.get("online_store")
    if online is not None and not isinstance(online, dict | str):
        raise ConfigError(
            f"{config_file}: online_store: {online!r} is not a mapping. Fix: write `online_store:` with indented "
            "`type: sqlite` and `path: data/online_store.db` (or `type: redis` and `connection_string: ...`)"
        )
    kind = online_store_type(config)
    if kind not in ONLINE_STORE_TYPES:
        raise ConfigError(
            f"{config_file}: online_store.type: {kind!r} is not an online store features can write. "
            "Fix: use `type: sqlite` (with `path: data/online_store.db`) or `type: redis` "
            "(with `connection_string: host:port`)"
        )
    return config


def _import(module_file: Path, root: Path) -> Any:
    """Import a repo file under the module name Feast gives it, so both see the same objects."""
    name = ".".join(module_file.relative_to(root).with_suffix("").parts)
    stat = module_file.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    loaded = sys.modules.get(name)
    # The module already imported, unless its file changed since (a definition edited in a notebook's kernel) or
    # another importer (Feast) loaded it, without the file's stamp.
    if getattr(loaded, "__file__", None) == str(module_file) and getattr(loaded, "__features_stamp__", None) == stamp:
        return loaded
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location(name, module_file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {module_file}")
    module = importlib.util.module_from_spec(spec)
    module.__features_stamp__ = stamp  # type: ignore[attr-defined]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except FeaturesError:
        del sys.modules[name]
        raise  # a definition's own error names the field and the fix
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"{module_file}{_line_in(exc, module_file)}: {type(exc).__name__}: {exc}") from exc
    return module


def _line_in(exc: BaseException, module_file: Path) -> str:
    """`, line N` of the innermost frame of the traceback in `module_file` (a syntax error's own line)."""
    import traceback

    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        return f", line {exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(module_file)]
    return f", line {frames[-1].lineno}" if frames else ""
