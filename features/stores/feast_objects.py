"""Feast objects (Entity, FileSource, FeatureView) generated from a FeatureGroup.

One group becomes one FeatureView named like the group, whose batch source is the group's offline table of
change points (a Delta table partitioned by `date`, timestamp column `window_end`; Feast's DuckDB store reads
it with DuckDB's delta extension, which `enable_delta_reads` installs from its package). The ttl is 0
(unbounded) because the change-point series carries its own expiry rows: a point-in-time lookup of the
latest row with `window_end <= t` is already the exact value at t.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from features.errors import ConfigError, EnvironmentProblem
from features.parquet_schema import infer_json, infer_parquet
from features.repo import (
    OFFLINE_DIR,
    deferred_exports,
    exports_deferred,
    read_schema_record,
    recorded_schema,
    resolve,
)
from features.spec import WINDOW_END, DType, Feature, FeatureGroup

if TYPE_CHECKING:
    from feast import Entity, FeatureView, FileSource, ValueType
    from feast.types import FeastType

    from features.repo import Repo

_delta_reads: list[bool] = []  # set once DuckDB's delta extension is installed (once per process)


def feast_type(dtype: DType) -> FeastType:
    """The Feast schema type (`feast.types`) of a logical type."""
    from feast.types import Array, Bool, Float64, Int64, Map, String, UnixTimestamp

    scalars = {
        DType.INT64: Int64,
        DType.FLOAT64: Float64,
        DType.STRING: String,
        DType.BOOL: Bool,
        DType.TIMESTAMP: UnixTimestamp,
        # Feast's Map is string -> any Value: the counts are stored as int64 Values (features.stores.feast_codec).
        DType.COUNT_MAP: Map,
    }
    lists = {
        DType.INT64_LIST: Int64,
        DType.FLOAT64_LIST: Float64,
        DType.STRING_LIST: String,
        DType.BOOL_LIST: Bool,
    }
    if dtype in scalars:
        return scalars[dtype]
    return Array(lists[dtype])


def feast_value_type(dtype: DType) -> ValueType:
    """The Feast ValueType (entity types, ValueProto fields) of a logical type."""
    from feast import ValueType

    return {
        DType.INT64: ValueType.INT64,
        DType.FLOAT64: ValueType.DOUBLE,
        DType.STRING: ValueType.STRING,
        DType.BOOL: ValueType.BOOL,
        DType.TIMESTAMP: ValueType.UNIX_TIMESTAMP,
        DType.INT64_LIST: ValueType.INT64_LIST,
        DType.FLOAT64_LIST: ValueType.DOUBLE_LIST,
        DType.STRING_LIST: ValueType.STRING_LIST,
        DType.BOOL_LIST: ValueType.BOOL_LIST,
        DType.COUNT_MAP: ValueType.MAP,
    }[dtype]


def source_schema(
    group: FeatureGroup, repo_root: str | Path | None = None, schema: Mapping[str, DType] | None = None
) -> dict[str, DType]:
    """The source columns and their types: `schema`, else the declared one, else the one `features apply`
    recorded for a Parquet source (features.pipelines.registration.record_source_schemas), else read from the
    files (all of them, for Parquet)."""
    if schema is not None:
        return dict(schema)
    source = group.source
    if source.schema is not None:
        return dict(source.schema)
    where = f"EventSource({source.name!r})"
    inferred = None
    if source.format in ("parquet", "json"):
        path = resolve(Path(repo_root or "."), source.path)
        recorded = read_schema_record(repo_root, source) if repo_root is not None else recorded_schema(source, path)
        if recorded is not None and source.format == "parquet":
            return recorded
        inferred = infer_parquet(path, where) if source.format == "parquet" else infer_json(path, where)
        problem = f"no schema is declared and no {source.format} files were found at {source.path!r}"
    else:
        problem = f"no schema is declared, and a {source.format} source has no files to read it from"
    if not inferred:
        raise ConfigError(
            f"{where}.schema: {problem}. Fix: declare schema={{column: type, ...}} on the EventSource, "
            "or land data in the source folder first"
        )
    return inferred


# Run in a process of its own: a DuckDB database opened here would leave its threads behind in every process
# this one forks (the feature server's workers abort at exit with them).
_INSTALL_DELTA = """
import pathlib, duckdb, duckdb_extension_delta
with duckdb.connect() as con:
    version = con.sql("PRAGMA version").fetchone()[0]
    folder = pathlib.Path(duckdb_extension_delta.__file__).parent / "extensions" / version
    con.sql(f"INSTALL '{folder / 'delta.duckdb_extension'}'")
"""


def enable_delta_reads() -> None:
    """Install DuckDB's delta extension from its package (duckdb-extension-delta) into the user's DuckDB
    extensions, unless it is there: Feast's DuckDB store loads it by name to read the offline tables, and DuckDB
    would otherwise download it from its own site at that moment."""
    if _delta_reads:
        return
    import subprocess
    import sys
    from importlib.metadata import version

    # Not `import duckdb` here: its module starts threads that a forked worker inherits (see above).
    installed = Path.home() / ".duckdb" / "extensions" / f"v{version('duckdb')}"
    if not any(installed.glob("*/delta.duckdb_extension")):
        done = subprocess.run([sys.executable, "-c", _INSTALL_DELTA], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise EnvironmentProblem(
                "DuckDB's delta extension (which Feast's DuckDB store reads the offline tables with) could not be "
                f"installed from the duckdb-extension-delta package: {done.stderr.strip()[-500:]}. Fix: "
                "`pip install duckdb==1.5.5 duckdb-extension-delta==1.5.5` (the versions must match)"
            )
    _delta_reads.append(True)


def feast_entities(group: FeatureGroup, types: Mapping[str, DType]) -> list[Entity]:
    """One Feast Entity per join key: Feast entities hold a single join key, so a composite key becomes
    several entities (named `<entity>__<key>`) that the FeatureView lists together."""
    from feast import Entity as FeastEntity

    keys = group.join_keys
    return [
        FeastEntity(
            name=group.entity.name if len(keys) == 1 else f"{group.entity.name}__{key}",
            join_keys=[key],
            value_type=feast_value_type(types[key]),
            description=group.entity.description,
        )
        for key in keys
    ]


def _describe(feat: Feature) -> str:
    text = f"{feat.aggregation.describe()} over {feat.window.describe()}"
    if feat.where:
        text += f" where {feat.where}"
    return f"{feat.description} ({text})" if feat.description else text


def to_feast(
    group: FeatureGroup,
    *,
    offline_path: str | None = None,
    repo_root: str | Path | None = None,
    schema: Mapping[str, DType] | None = None,
) -> list[Entity | FileSource | FeatureView]:
    """Feast objects for one group: its entities (one per join key), the offline FileSource, the FeatureView.

    Unpack them into module-level names in the repo (`feast apply` only picks up module attributes, not
    objects inside a list), e.g. `user_entity, user_source, user_view = to_feast(group, repo_root=HERE)`.
    `offline_path`: the table's folder, relative to the repo (default `data/offline/<group>`), absolute, or a URI;
    `repo_root` is where the source's schema is read from when it declares none.
    """
    if exports_deferred():  # a module being imported by Repo.load: Feast only if an object is used
        return deferred_exports(  # type: ignore[return-value]
            lambda: to_feast(group, offline_path=offline_path, repo_root=repo_root, schema=schema),
            len(group.join_keys) + 2,
        )
    from feast import FeatureView, Field, FileSource
    from feast.data_format import DeltaFormat

    enable_delta_reads()
    root = Path(repo_root) if repo_root is not None else Path.cwd()
    types = group.output_types(source_schema(group, root, schema))
    entities = feast_entities(group, types)
    source = FileSource(
        name=f"{group.name}_offline",
        path=offline_source_path(group, offline_path),
        file_format=DeltaFormat(),
        timestamp_field=WINDOW_END,
        description=f"Change points of feature group {group.name!r}, a Delta table partitioned by date",
    )
    fields = [Field(name=key, dtype=feast_type(types[key])) for key in group.join_keys]
    fields += [
        Field(name=feat.name, dtype=feast_type(types[feat.name]), description=_describe(feat))
        for feat in group.features
    ]
    view = FeatureView(
        name=group.name,
        entities=entities,
        ttl=timedelta(0),
        schema=fields,
        source=source,
        online=True,
        description=group.description,
        tags={"features.source": group.source.name},
    )
    return [*entities, source, view]


def offline_source_path(group: FeatureGroup, offline_path: str | None = None) -> str:
    """The offline table's path as the group's FileSource records it in the registry: relative to the repo
    (`data/offline/<group>`, or `offline_path` as given), so that a copied or moved repo reads its own table; Feast's
    stores resolve it against the repo (features.stores.feast_paths). An absolute path or a URI stays as it is."""
    return offline_path or (OFFLINE_DIR / group.name).as_posix()


def repo_objects(repo: Repo) -> list[Entity | FileSource | FeatureView]:
    """The Feast objects of every group of the repo, in group order."""
    return [obj for group in repo.groups.values() for obj in to_feast(group, repo_root=repo.root)]
