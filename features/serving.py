"""Serving: Feast's own HTTP feature server with settings for steady latency, and online reads as a DataFrame.

Nothing here is a parallel store or server: `serve` starts `feast serve`'s server (gunicorn + uvicorn workers,
`POST /get-online-features`) and `online_features` calls `FeatureStore.get_online_features`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from features.errors import ConfigError
from features.spec import WINDOW_END, FeatureGroup

if TYPE_CHECKING:
    from feast import FeatureStore, FeatureView

    from features.repo import Repo

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6566
# Seconds an idle kept-alive client connection stays open (gunicorn `keepalive`, uvicorn's keep-alive timeout).
DEFAULT_KEEP_ALIVE_S = 75
# How often each worker reloads the registry in the background (Feast's feature server default).
DEFAULT_REGISTRY_TTL_S = 60


def default_workers() -> int:
    """One worker process per CPU, at most 4: a worker serves many concurrent requests (asyncio)."""
    return max(1, min(4, os.cpu_count() or 1))


def server_options(
    *,
    workers: int | None = None,
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_S,
    registry_ttl_s: int = DEFAULT_REGISTRY_TTL_S,
    access_log: bool = False,
) -> dict[str, Any]:
    """The settings `serve` passes to Feast's `start_server`, and why they differ from `feast serve`'s defaults.

    - `max_requests=0`: `feast serve` recycles each gunicorn worker after ~1000 requests (+ jitter); every
      recycle drops the kept-alive connections of that worker and makes the next requests wait for a new
      worker to import Feast and load the registry, a stall of hundreds of milliseconds. Here workers live on.
    - `keep_alive_timeout`: clients keep their connection between requests (no TCP handshake per request).
    - no access log by default: one log line per request costs more than a Redis lookup.
    """
    return {
        "no_access_log": not access_log,
        "workers": workers or default_workers(),
        "worker_connections": 1000,
        "max_requests": 0,
        "max_requests_jitter": 0,
        "keep_alive_timeout": keep_alive_s,
        "registry_ttl_sec": registry_ttl_s,
        "tls_key_path": "",
        "tls_cert_path": "",
        "metrics": False,
    }


def serve(
    repo: str | Path | Repo | FeatureStore,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    workers: int | None = None,
    *,
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_S,
    registry_ttl_s: int = DEFAULT_REGISTRY_TTL_S,
    access_log: bool = False,
) -> None:
    """Run Feast's HTTP feature server for the repo until interrupted (blocks; SIGTERM/SIGINT stop it).

    Endpoints are Feast's: `POST /get-online-features`, `GET /health`, ... Binds to 127.0.0.1 unless `host`
    says otherwise (e.g. "0.0.0.0" to accept connections from other machines).
    """
    from feast.feature_server import start_server

    store = feature_store(repo)
    check_applied(store)
    # Everything loaded so far (Feast, pandas, the registry) lives as long as the server: keep it out of the
    # garbage collector's scans, which would otherwise pause requests for milliseconds. Forked workers inherit it.
    gc.collect()
    gc.freeze()
    options = server_options(
        workers=workers, keep_alive_s=keep_alive_s, registry_ttl_s=registry_ttl_s, access_log=access_log
    )
    start_server(store, host=host, port=port, **options)


def feature_store(repo: str | Path | Repo | FeatureStore) -> FeatureStore:
    """A FeatureStore for a repo folder (or Repo), or the store itself."""
    from feast import FeatureStore

    from features.repo import Repo

    if isinstance(repo, FeatureStore):
        return repo
    root = repo.root if isinstance(repo, Repo) else Path(repo).expanduser().resolve()
    if not (root / "feature_store.yaml").is_file():
        raise ConfigError(
            f"--repo: {root} has no feature_store.yaml; point --repo at a Feast feature repository "
            "(the folder holding feature_store.yaml and the definitions)"
        )
    return FeatureStore(repo_path=str(root))


def check_applied(store: FeatureStore) -> None:
    """A ConfigError unless the registry holds at least one feature view (a server would serve nothing)."""
    try:
        views = store.list_feature_views()
    except Exception as exc:  # a missing or unreadable registry: Feast raises various errors
        views, problem = [], f"its registry cannot be read ({exc})"
    else:
        problem = "its registry holds no feature views"
    if not views:
        root = store.repo_path or "PATH"
        raise ConfigError(f"repo {root}: {problem}. Fix: run `features apply --repo {root}` first")


def online_features(
    repo_or_store: str | Path | Repo | FeatureStore,
    group_or_view: str | FeatureGroup | FeatureView,
    keys: Sequence[Any] | Mapping[str, Sequence[Any]] | pd.DataFrame,
    *,
    features: Sequence[str] | None = None,
    with_window_end: bool = False,
) -> pd.DataFrame:
    """Each key's online values as a DataFrame: the join-key columns, then one column per feature.

    `keys`: a DataFrame or a dict of columns holding the join keys; a list of dicts (`{"user_id": "u1"}`);
    or, for a view with one join key, a list of key values (`["u1", "u2"]`); for a composite key, a list of
    tuples in the order of the group's join keys. Rows come back in the order given, one per key.

    A key that has no row online gets nulls (also for counts: nothing was written for it yet).
    `with_window_end=True` adds a `window_end` column: the event time Feast stores with the values, i.e. the
    end of the window they describe (NaT where the key has no row). Integer features come back as pandas'
    nullable Int64, booleans as boolean, floats as float64 (NaN for null), lists as Python lists.
    """
    store = feature_store(repo_or_store)
    name = group_or_view if isinstance(group_or_view, str) else group_or_view.name
    view = store.get_feature_view(name)
    join_keys = list(view.join_keys)
    fields = {f.name: f for f in view.features}
    wanted = list(features) if features is not None else list(fields)
    unknown = [f for f in wanted if f not in fields]
    if unknown:
        raise ConfigError(
            f"features: {', '.join(map(repr, unknown))} not in feature view {name!r}; it has {', '.join(fields)}"
        )
    rows = _entity_columns(keys, join_keys)
    out = pd.DataFrame({k: pd.Series(rows[k], dtype=object) for k in join_keys})
    if out.empty:  # Feast refuses an empty request
        values: dict[str, list[Any]] = {f: [] for f in wanted}
    else:
        response = store.get_online_features(features=[f"{name}:{f}" for f in wanted], entity_rows=rows)
        values = response.to_dict()
    for feature in wanted:
        out[feature] = _typed(values[feature], fields[feature].dtype)
    if with_window_end:
        ends = _window_ends(response, wanted[0], len(out)) if len(out) else pd.Series([], dtype="datetime64[us, UTC]")
        out[WINDOW_END] = ends
    return out


def _entity_columns(keys: Any, join_keys: list[str]) -> dict[str, list[Any]]:
    """The keys as {join key: values}, Feast's columnar form of entity rows."""
    if isinstance(keys, pd.DataFrame | Mapping):
        missing = [k for k in join_keys if k not in keys]
        if missing:
            raise ConfigError(f"keys: missing join key column(s) {', '.join(map(repr, missing))}")
        return {k: pd.Series(keys[k]).tolist() for k in join_keys}
    keys = list(keys)
    if all(isinstance(k, Mapping) for k in keys):
        rows: list[Mapping[str, Any]] = keys
    elif len(join_keys) == 1 and not any(isinstance(k, tuple | list) for k in keys):
        rows = [{join_keys[0]: k} for k in keys]
    else:
        rows = []
        for key in keys:
            if not isinstance(key, tuple | list) or len(key) != len(join_keys):
                raise ConfigError(f"keys: {key!r} is not a tuple of ({', '.join(join_keys)})")
            rows.append(dict(zip(join_keys, key, strict=True)))
    missing = sorted({k for row in rows for k in join_keys if k not in row})
    if missing:
        raise ConfigError(f"keys: a key has no value for {', '.join(map(repr, missing))}")
    return {k: [_native(row[k]) for row in rows] for k in join_keys}


def _native(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _typed(values: list[Any], dtype: Any) -> Any:
    from feast.types import Bool, Float32, Float64, Int32, Int64

    if dtype in (Int64, Int32):
        return pd.array(values, dtype="Int64")
    if dtype in (Float64, Float32):
        return pd.array(values, dtype="Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    if dtype == Bool:
        return pd.array(values, dtype="boolean")
    return pd.Series(values, dtype=object)


def _window_ends(response: Any, feature: str, n: int) -> pd.Series:
    """The event timestamp Feast returned with the view's values, per row (NaT where nothing was found)."""
    from feast.protos.feast.serving.ServingService_pb2 import FieldStatus

    proto = response.proto
    index = list(proto.metadata.feature_names.val).index(feature)
    vector = proto.results[index]
    micros = [
        ts.seconds * 1_000_000 + ts.nanos // 1000
        if status == FieldStatus.PRESENT and (ts.seconds or ts.nanos)
        else None
        for ts, status in zip(vector.event_timestamps, vector.statuses, strict=True)
    ]
    if len(micros) != n:
        raise AssertionError(f"Feast returned {len(micros)} timestamps for {n} keys")
    return pd.Series(pd.to_datetime(pd.array(micros, dtype="Int64"), unit="us", utc=True))
