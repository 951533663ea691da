"""Serving: Feast's own HTTP feature server with settings for steady latency, and online reads as a DataFrame.

Nothing here is a parallel store or server: `serve` runs `feast serve`'s server (Feast's FastAPI app in gunicorn
with uvicorn workers, `POST /get-online-features`) and `online_features` calls `FeatureStore.get_online_features`.
What `serve` adds to Feast's server:

- a client's mistake in a request (an unknown feature or feature view, a join key missing, key lists of
  different lengths) is answered 400 or 404 with a JSON body `{"error": ..., "fix": ...}` and one log line,
  where Feast answers 500 with a traceback in the log, or for a composite key given in part 200 with every
  value NOT_FOUND (`features.stores.serving_requests.RequestErrors`); so is a body that is not JSON or has a
  field of the wrong type (400, where FastAPI answers 422 with pydantic's errors), or one its parsers cannot take
  (a key value that is null or an object, a lone surrogate, JSON nested too deep: Feast answered 500);
- limits on what one request may ask (`RequestLimits`: entity rows, body bytes), answered 413 beyond them, the
  body's size before it is read: one request of 1,000,000 rows held a worker for 14.5 s and left it 2 GiB larger;
- Ctrl-C (SIGINT) stops it within a second: gunicorn sends its workers SIGQUIT, which Feast's uvicorn worker
  ignores, so gunicorn waited 30 s and then SIGKILLed them;
- a broken feature_store.yaml, a port in use or a registry with nothing applied is one `error:` line (exit 2).
"""

from __future__ import annotations

import errno
import gc
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from features.errors import ConfigError, EnvironmentProblem
from features.spec import WINDOW_END, FeatureGroup
from features.stores.serving_input import RequestLimits

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
    limits: RequestLimits | None = None,
    log_served: float | None = None,
) -> dict[str, Any]:
    """The settings `serve` passes to Feast's `start_server`, and why they differ from `feast serve`'s defaults.

    - `max_requests=0`: `feast serve` recycles each gunicorn worker after ~1000 requests (+ jitter); every
      recycle drops the kept-alive connections of that worker and makes the next requests wait for a new
      worker to import Feast and load the registry, a stall of hundreds of milliseconds. Here workers live on.
    - `keep_alive_timeout`: clients keep their connection between requests (no TCP handshake per request).
    - no access log by default: one log line per request costs more than a Redis lookup.
    - `limits`: what one request may ask of a worker (`RequestLimits`'s defaults unless given); within them a
      worker's memory comes back after each request, so living on costs nothing (docs/serving.md, Limits).
    - `log_served`: the share of answers sampled into the served log (features.stores.served_logging), or None.
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
        "limits": limits or RequestLimits(),
        "log_served": log_served,
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
    limits: RequestLimits | None = None,
    log_served: float | None = None,
) -> None:
    """Run Feast's HTTP feature server for the repo until interrupted (blocks; SIGTERM/SIGINT stop it).

    Endpoints are Feast's: `POST /get-online-features`, `GET /health`, ... Binds to 127.0.0.1 unless `host`
    says otherwise (e.g. "0.0.0.0" to accept connections from other machines). `log_served`: the share of
    answered requests appended to the served log (docs/serving.md, The served log), None for none.
    """
    store = feature_store(repo)
    check_applied(store)
    check_port(host, port)
    # Everything loaded so far (Feast, pandas, the registry) lives as long as the server: keep it out of the
    # garbage collector's scans, which would otherwise pause requests for milliseconds. Forked workers inherit it.
    gc.collect()
    gc.freeze()
    options = server_options(
        workers=workers,
        keep_alive_s=keep_alive_s,
        registry_ttl_s=registry_ttl_s,
        access_log=access_log,
        limits=limits,
        log_served=log_served,
    )
    try:
        _run_server(store, host, port, options)
    except SystemExit as exc:  # gunicorn exits the process itself: 0 when stopped, else after logging why
        if exc.code not in (0, None):
            raise EnvironmentProblem(
                f"the feature server on {host}:{port} stopped with status {exc.code}; gunicorn's log lines above "
                "say why"
            ) from None


def check_port(host: str, port: int) -> None:
    """A ConfigError naming `--port` (or `--host`) unless a server could listen on host:port now: gunicorn
    retries a port in use for 5 s, logging each try, then exits 1 without saying what to do."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ConfigError(
            f"--host: {host!r} is not an address of this machine ({exc.strerror}). "
            "Fix: pass 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        ) from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds: TIME_WAIT is free
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"--port: port {port} on {host} is in use by another process. "
                    f"Fix: stop that process, or pass a free port, e.g. --port {port + 1}"
                ) from None
            raise ConfigError(
                f"--port: cannot listen on {host}:{port} ({exc.strerror}). Fix: pass another --port "
                "(ports below 1024 need root) or --host"
            ) from None


def _run_server(store: FeatureStore, host: str, port: int, options: dict[str, Any]) -> None:
    """Feast's `start_server` (its gunicorn branch), with `with_request_errors` on Feast's app and workers that
    stop on gunicorn's SIGQUIT; blocks until the server stops."""
    from feast.feature_server import start_server

    if sys.platform == "win32":  # no gunicorn: Feast runs its app in uvicorn alone (without this package's checks)
        start_server(store, host=host, port=port, **{k: v for k, v in options.items() if k != "limits"})
        return
    from feast import metrics as feast_metrics
    from feast.permissions.server.utils import (
        ServerType,
        init_auth_manager,
        init_security_manager,
        str_to_auth_manager_type,
    )

    metrics = getattr(getattr(store.config, "feature_server", None), "metrics", None)
    metrics_enabled = bool(options["metrics"] or getattr(metrics, "enabled", False))
    if metrics_enabled:
        flags = feast_metrics.build_metrics_flags(metrics)
        feast_metrics.start_metrics_server(
            store, metrics_config=flags, start_resource_monitoring=False, start_freshness_monitoring=False
        )
    auth_type = str_to_auth_manager_type(store.config.auth_config.type)
    init_security_manager(auth_type=auth_type, fs=store)
    init_auth_manager(auth_type=auth_type, server_type=ServerType.REST, auth_config=store.config.auth_config)
    gunicorn_options = {
        "bind": f"{host}:{port}",
        "accesslog": None if options["no_access_log"] else "-",
        "workers": options["workers"],
        "worker_connections": options["worker_connections"],
        "max_requests": options["max_requests"],
        "max_requests_jitter": options["max_requests_jitter"],
        "keepalive": options["keep_alive_timeout"],
        "registry_ttl_sec": options["registry_ttl_sec"],
        "limits": options["limits"],  # not gunicorn's: `Application` hands it to `with_request_errors`
        "log_served": options["log_served"],  # nor this: `Application` hands it to `with_served_log`
    }
    _application_class()(store=store, metrics_enabled=metrics_enabled, **gunicorn_options).run()


def _application_class() -> type:
    """Feast's gunicorn application with `with_request_errors` and `StoppingWorker` (classes made here: importing
    gunicorn and uvicorn is left to the server)."""
    import asyncio
    import signal

    from feast.feature_server import FeastServeApplication
    from gunicorn.arbiter import Arbiter
    from uvicorn.server import Server
    from uvicorn_worker import UvicornWorker

    from features.stores.served_logging import with_served_log
    from features.stores.serving_requests import with_request_errors

    class WorkerServer(Server):
        """uvicorn's server, except that a signal only stops it: uvicorn raises the signal again once stopped,
        killing the worker by it, which gunicorn logs as a warning ("Worker was sent SIGINT!") on every
        Ctrl-C. The master knows why its workers stop (it sends them SIGQUIT)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop without waiting for open requests
            self.should_exit = True

    class StoppingWorker(UvicornWorker):
        """Feast's uvicorn worker, except that SIGQUIT (gunicorn's quick shutdown, what it sends its workers
        on SIGINT) stops the server: the original's handler sets a flag nothing reads, so gunicorn waited its
        30 s graceful timeout and then SIGKILLed the workers."""

        async def _serve(self) -> None:
            self.config.app = self.wsgi
            server = WorkerServer(config=self.config)
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGQUIT, server.handle_exit, signal.SIGQUIT, None)
            await server.serve(sockets=self.sockets)
            if not server.started:
                sys.exit(Arbiter.WORKER_BOOT_ERROR)
            # Served and shut down: leave without the interpreter's teardown, which would destroy the thread
            # objects DuckDB (imported by Feast's offline store) made in the master before it forked this
            # worker, threads that do not run here; the C++ runtime aborts the worker on that.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    class Application(FeastServeApplication):
        def __init__(self, store: FeatureStore, **options: Any) -> None:
            super().__init__(store, **options)
            with_request_errors(self._app, store, options["registry_ttl_sec"], options["limits"])
            if options["log_served"]:  # added last, so outermost: it sees what the client sent and got
                with_served_log(self._app, store, options["log_served"])

        def load_config(self) -> None:
            super().load_config()
            self.cfg.set("worker_class", StoppingWorker)
            # gunicorn's control socket (~/.gunicorn/gunicorn.ctl) is one path for every gunicorn of the user:
            # a second server would take it over. Nothing here uses it.
            if "control_socket_disable" in self.cfg.settings:
                self.cfg.set("control_socket_disable", True)

    return Application


def feature_store(repo: str | Path | Repo | FeatureStore) -> FeatureStore:
    """A FeatureStore for a repo folder (or Repo), or the store itself."""
    from feast import FeatureStore

    from features.repo import Repo

    if isinstance(repo, FeatureStore):
        return repo
    root = repo.root if isinstance(repo, Repo) else Path(repo).expanduser().resolve()
    config_file = root / "feature_store.yaml"
    if not config_file.is_file():
        raise ConfigError(
            f"--repo: {root} has no feature_store.yaml; point --repo at a Feast feature repository "
            "(the folder holding feature_store.yaml and the definitions)"
        )
    return open_store(root)


def open_store(root: Path) -> FeatureStore:
    """Feast's FeatureStore for the repo at `root`; a ConfigError naming feature_store.yaml, the setting and
    the fix where Feast refuses the file (it raises a multi-line pydantic report, or its own errors)."""
    from feast import FeatureStore
    from feast.errors import FeastError
    from feast.repo_config import FeastConfigError
    from pydantic import ValidationError

    from features.repo import read_config

    config_file = root / "feature_store.yaml"
    config = read_config(config_file)  # YAML that does not parse, no project, an unknown online store
    try:
        return FeatureStore(repo_path=str(root))
    except (FeastConfigError, FeastError, ValidationError) as exc:
        raise ConfigError(
            f"{config_file}: {config_problem(exc, config)}. Fix: correct that setting (Feast's reference: "
            "https://docs.feast.dev/reference/feature-repository/feature-store-yaml; feature_repo/"
            "feature_store.yaml in the features repository is a working one)"
        ) from None


def config_problem(exc: BaseException, config: Mapping[str, Any]) -> str:
    """Feast's reason for refusing feature_store.yaml in one line: each pydantic error as `setting: message`
    (a setting of the online or offline store named under it), else the first line of Feast's message."""
    from pydantic import ValidationError

    report = exc if isinstance(exc, ValidationError) else exc.__cause__ or exc.__context__
    if not isinstance(report, ValidationError):
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        return first.rstrip(".")
    problems = []
    for error in report.errors():
        path = ".".join(str(part) for part in error["loc"])
        head = str(error["loc"][0]) if error["loc"] else ""
        if head and head not in config:  # Feast checks each store's settings on their own: say under which
            under = [k for k in ("online_store", "offline_store", "registry") if isinstance(config.get(k), Mapping)]
            path = next((f"{k}.{path}" for k in under if head in config[k]), path)
        message = str(error["msg"]).removeprefix("Value error, ").rstrip(".")
        problems.append(f"{path}: {message}" if path else message)
    return "; ".join(problems)


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
    nullable Int64, booleans as boolean, floats as float64 (NaN for null), lists as Python lists, maps (histogram,
    top_frequent) as dicts of ints (Feast's Map values; the HTTP server answers them as JSON objects).
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
