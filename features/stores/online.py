"""Online writers: put each key's latest change point into Feast's online store, in Feast's own format.

Feast reads what these write (`FeatureStore.get_online_features`, `feast serve`); nothing here is a parallel
store. Unlike Feast's own writes, every write is guarded by event time: a stored value with a newer
`window_end` is never replaced by an older one, so replays, backfills and restarts cannot move a key back.
A value with the same `window_end` is replaced (a replay may carry a corrected value).

Writers are built from plain data (paths, names, types) and open their connection lazily, so they can be
pickled to Spark executors and used inside `mapInPandas` / `foreachPartition`. They encode a pandas batch a
column at a time in Feast's format (features.stores.feast_codec), then hand it to the store in bulk. Each store
is a module of its own behind `OnlineWriter` (features.stores.online_interface); `online_writer` picks the one
a repo's feature_store.yaml configures:

- SQLite (`SqliteOnlineWriter`): multi-row upserts in the B-tree order of the table's key, the whole batch in
  one transaction, the next part encoded while SQLite writes the previous one. SQLite takes one writer at a
  time (`parallel = False`).
- Redis (`RedisOnlineWriter`): pipelined `EVALSHA` calls of a Lua script that, for each key, compares the
  stored `_ts:<view>` field with the new event time and writes the view's fields only if the new one is newer
  or equal. Each check-and-write is atomic in Redis, so any number of executors may write at once
  (`parallel = True`). The calls are written in the Redis protocol directly from the encoded columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from features.spec import DType, FeatureGroup
from features.stores.online_config import online_config
from features.stores.online_interface import OnlineWriter
from features.stores.online_redis import RedisOnlineWriter
from features.stores.online_sqlite import SqliteOnlineWriter

if TYPE_CHECKING:
    from feast import FeatureStore, RepoConfig

    from features.repo import Repo

__all__ = ["OnlineWriter", "RedisOnlineWriter", "SqliteOnlineWriter", "online_writer"]


def online_writer(
    repo_config_or_store: RepoConfig | FeatureStore | Repo | str | Path,
    group: FeatureGroup,
    types: Mapping[str, DType],
) -> OnlineWriter:
    """The writer for the repo's configured online store; `types` is `group.output_types(schema)`."""
    config = online_config(repo_config_or_store)
    join_keys = {k: types[k] for k in group.join_keys}
    features = {f.name: types[f.name] for f in group.features}
    if config.kind == "sqlite":
        return SqliteOnlineWriter(
            db_path=config.sqlite_path(),
            table=f"{config.project}_{config.online_name(group.name)}",
            view=group.name,
            join_keys=join_keys,
            features=features,
            entity_key_serialization_version=config.entity_key_serialization_version,
            repo_path=str(config.repo_path or ""),
        )
    options = config.options
    return RedisOnlineWriter(
        connection_string=options["connection_string"],
        project=config.project,
        view=group.name,
        view_name=config.online_name(group.name),
        join_keys=join_keys,
        features=features,
        redis_type=str(options["redis_type"]),
        sentinel_master=options["sentinel_master"],
        key_ttl_seconds=options["key_ttl_seconds"],
        entity_key_serialization_version=config.entity_key_serialization_version,
    )
