"""Serving: `features serve` (Feast's HTTP feature server) returns what the fast writer wrote, on SQLite and
Redis, over `POST /get-online-features`; workers are not recycled; `online_features` gives a typed DataFrame.

Each server runs as a subprocess on a free port of 127.0.0.1 and is stopped when its tests are done.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import redis_server as redis_fixtures
from feast import FeatureStore
from online_repos import (
    CARD_MERCHANT,
    EVERY_TYPE_KEYS,
    EXPECTED_EVERY_TYPE,
    STORES,
    T0,
    T1,
    USER,
    every_type_rows,
    make_repo,
    read,
    writer,
)

from features import ConfigError
from features.cli import build_parser, main
from features.serving import online_features, server_options

redis_server = redis_fixtures.redis_server  # the session's real Redis (a fixture)

START_TIMEOUT_S = 120.0  # importing Feast in the server and its worker is slow on a busy machine
STOP_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    root: Path
    port: int
    process: subprocess.Popen

    def post(self, path: str, body: dict, connection: http.client.HTTPConnection | None = None) -> tuple[int, dict]:
        conn = connection or http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            if connection is None:
                conn.close()

    def online(self, group, entities: dict[str, list]) -> dict[str, list]:
        """Feature name -> values, from the server's JSON answer."""
        body = {"features": [f"{group.name}:{f.name}" for f in group.features], "entities": entities}
        status, answer = self.post("/get-online-features", body)
        assert status == 200, answer
        names = answer["metadata"]["feature_names"]
        return {name: result["values"] for name, result in zip(names, answer["results"], strict=True)}

    def workers(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return sorted(int(pid) for pid in children.read_text().split())


def _serving_rows() -> pd.DataFrame:
    rows = every_type_rows()
    rows.loc[2, "amount_max"] = 1e300  # JSON has no infinity: keep what the server returns representable
    return rows


def _expected() -> dict[str, list]:
    want = {name: list(values) for name, values in EXPECTED_EVERY_TYPE.items()}
    want["amount_max"][2] = 1e300
    return want


def _start(root: Path) -> Server:
    port = _free_port()
    command = [sys.executable, "-m", "features.cli", "serve", "--repo", str(root), "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: stopping it never signals pytest
    )
    server = Server(root, port, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"features serve exited with {process.returncode}: {process.stderr.read().decode()}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return server
        except OSError:
            time.sleep(0.2)
    _stop(server)
    raise AssertionError(f"features serve did not answer on 127.0.0.1:{port} within {START_TIMEOUT_S:.0f}s")


def _stop(server: Server) -> None:
    process = server.process
    if process.poll() is None:
        process.terminate()  # gunicorn's graceful shutdown of the master and its workers
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if process.stderr:
        process.stderr.close()


@pytest.fixture(scope="module", params=STORES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An applied repo on each store, filled by the fast writer, served by `features serve`."""
    kind = request.param
    server = request.getfixturevalue("redis_server") if kind == "redis" else None
    root = make_repo(tmp_path_factory.mktemp(f"serve-{kind}") / "repo", kind, server)
    writer(root, USER).write(_serving_rows())
    cards = pd.DataFrame(
        {
            "card_id": ["c1", "c1", "c2"],
            "merchant_id": [7, 8, 7],
            "window_end": [T0, T1, T0],
            "txn_count": [1, 2, 3],
            "last_status": ["OK", "FAILED", None],
        }
    )
    writer(root, CARD_MERCHANT).write(cards)
    running = _start(root)
    yield running
    _stop(running)
    if server is not None:
        server.delete_project(FeatureStore(repo_path=str(root)).project)


def _same(got: object, want: object) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return got == want and math.copysign(1, got) == math.copysign(1, want)
    return got == want


# ---------------------------------------------------------------------------------------------------------
# HTTP: feast serve returns the written values unchanged


def test_http_returns_every_type_as_written(served: Server) -> None:
    got = served.online(USER, {"user_id": EVERY_TYPE_KEYS})
    sdk = read(served.root, USER, [{"user_id": k} for k in EVERY_TYPE_KEYS])
    assert got["user_id"] == EVERY_TYPE_KEYS
    for name, want in _expected().items():
        assert got[name] == sdk[name], f"{name}: HTTP {got[name]!r} != SDK {sdk[name]!r}"
        assert all(_same(g, w) for g, w in zip(got[name], want, strict=True)), f"{name}: {got[name]!r} != {want!r}"


def test_http_composite_keys_and_one_entity(served: Server) -> None:
    got = served.online(CARD_MERCHANT, {"card_id": ["c1", "c2", "c9"], "merchant_id": [8, 7, 7]})
    assert got["txn_count"] == [2, 3, None]
    assert got["last_status"] == ["FAILED", None, None]
    one = served.online(USER, {"user_id": ["u1"]})
    assert one["txn_count"] == [3] and one["last_amounts"] == [[9.25, 3.25]]


def test_workers_are_not_recycled(served: Server) -> None:
    """`feast serve` restarts a worker after ~1000 requests (max_requests); `features serve` must not."""
    if not Path(f"/proc/{served.process.pid}/task").is_dir():
        pytest.skip("needs Linux's /proc to list the server's worker processes")
    before = served.workers()
    assert before, "the server has no worker process"
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    body = {"features": [f"{USER.name}:txn_count"], "entities": {"user_id": ["u1"]}}
    try:
        for _ in range(1_100):
            status, answer = served.post("/get-online-features", body, conn)  # one kept-alive connection
            assert status == 200 and answer["results"][1]["values"] == [3]
    finally:
        conn.close()
    assert served.workers() == before


# ---------------------------------------------------------------------------------------------------------
# The DataFrame helper


def frame_columns(with_window_end: bool = False) -> list[str]:
    return ["user_id", *(f.name for f in USER.features), *(["window_end"] if with_window_end else [])]


def test_online_features_as_a_typed_dataframe(served: Server) -> None:
    frame = online_features(served.root, USER, EVERY_TYPE_KEYS, with_window_end=True)
    assert list(frame.columns) == frame_columns(with_window_end=True)
    assert frame["user_id"].tolist() == EVERY_TYPE_KEYS
    assert str(frame["txn_count"].dtype) == "Int64" and str(frame["merchants"].dtype) == "Int64"
    assert frame["amount_sum"].dtype == np.float64 and str(frame["last_ok"].dtype) == "boolean"
    want = _expected()
    for name in ("txn_count", "merchants"):
        assert [None if pd.isna(v) else int(v) for v in frame[name]] == want[name]
    for name in ("amount_sum", "amount_max", "amount_p90"):
        assert [None if np.isnan(v) else v for v in frame[name]] == want[name]
    assert frame["last_status"].tolist() == want["last_status"]
    assert frame["last_amounts"].tolist() == want["last_amounts"]
    assert frame["window_end"].tolist()[:4] == [T0] * 4
    assert pd.isna(frame["window_end"].iloc[4])  # no row for that key


def test_online_features_key_forms(served: Server) -> None:
    store = FeatureStore(repo_path=str(served.root))
    by_dicts = online_features(store, "user_transactions", [{"user_id": "u4"}, {"user_id": "u1"}])
    by_frame = online_features(store, USER, pd.DataFrame({"user_id": ["u4", "u1"], "label": [0, 1]}))
    subset = online_features(store, USER, ["u4", "u1"], features=["txn_count"])
    assert by_dicts["txn_count"].tolist() == by_frame["txn_count"].tolist() == [128, 3]
    assert list(subset.columns) == ["user_id", "txn_count"]
    cards = online_features(store, CARD_MERCHANT, [("c1", 8), ("c2", 7)], with_window_end=True)
    assert cards["txn_count"].tolist() == [2, 3]
    assert cards["window_end"].tolist() == [T1, T0]
    empty = online_features(store, USER, [], with_window_end=True)
    assert empty.empty and list(empty.columns) == list(frame_columns(with_window_end=True))
    assert str(empty["txn_count"].dtype) == "Int64" and empty["last_status"].dtype == object
    with pytest.raises(ConfigError, match="'nope' not in feature view"):
        online_features(store, USER, ["u1"], features=["nope"])
    with pytest.raises(ConfigError, match="not a tuple of"):
        online_features(store, CARD_MERCHANT, ["c1"])


# ---------------------------------------------------------------------------------------------------------
# The command and its settings


def test_serve_defaults_to_this_machine_and_never_recycles_workers() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.repo) == ("127.0.0.1", 6566, "feature_repo")
    options = server_options()
    assert options["max_requests"] == 0 and options["max_requests_jitter"] == 0
    assert options["keep_alive_timeout"] >= 30 and options["no_access_log"] and options["workers"] >= 1


def test_serve_before_apply_says_to_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "feature_store.yaml").write_text(
        "project: p\nprovider: local\nregistry: data/registry.db\nonline_store:\n  type: sqlite\n"
        "  path: data/online_store.db\noffline_store:\n  type: duckdb\nentity_key_serialization_version: 3\n"
    )
    assert main(["serve", "--repo", str(root), "--port", str(_free_port())]) == 2
    assert f"run `features apply --repo {root}`" in capsys.readouterr().err
    assert main(["serve", "--repo", str(tmp_path / "missing")]) == 2
    assert main(["serve", "--repo", str(root), "--workers", "0"]) == 2
