"""Serving: `features serve` (Feast's HTTP feature server) returns what the fast writer wrote, on SQLite and
Redis, over `POST /get-online-features`; workers are not recycled; `online_features` gives a typed DataFrame.
A client's mistake in a request is a 4xx saying what was wrong and the fix (also what Feast answered 500 for: a
key value that is no key, a lone surrogate, JSON nested 1,000 deep); a broken feature_store.yaml or a
port in use is one `error:` line and exit 2; Ctrl-C stops the server at once.

Each server runs as a subprocess on a free port of 127.0.0.1 (its log in a file; tests/feature_servers.py) and is
stopped when its tests are done.
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
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import redis_server as redis_fixtures
from feast import FeatureStore
from feature_servers import START_TIMEOUT_S, STOP_TIMEOUT_S, Server, free_port, start_server, stop_server
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
from repo_yaml import write_feature_store_yaml

from features import ConfigError
from features.cli import build_parser, main
from features.stores.serving import online_features, server_options

redis_server = redis_fixtures.redis_server  # the session's real Redis (a fixture)


def _serving_rows() -> pd.DataFrame:
    rows = every_type_rows()
    rows.loc[2, "amount_max"] = 1e300  # JSON has no infinity: keep what the server returns representable
    return rows


def _expected() -> dict[str, list]:
    want = {name: list(values) for name, values in EXPECTED_EVERY_TYPE.items()}
    want["amount_max"][2] = 1e300
    return want


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
    running = start_server(root)
    yield running
    stop_server(running)
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
    write_feature_store_yaml(root, "p")
    assert main(["serve", "--repo", str(root), "--port", str(free_port())]) == 2
    assert f"run `features apply --repo {root}`" in capsys.readouterr().err
    assert main(["serve", "--repo", str(tmp_path / "missing")]) == 2
    assert main(["serve", "--repo", str(root), "--workers", "0"]) == 2


# ---------------------------------------------------------------------------------------------------------
# A client's mistake is a 4xx that says what was wrong and the fix (Feast answers 500 with a traceback)

ONLINE = "/get-online-features"
TXN_COUNT = f"{USER.name}:txn_count"
MISTAKES = {
    "unknown feature": (404, {"features": [f"{USER.name}:nope"], "entities": {"user_id": ["u1"]}}, "'nope'"),
    "unknown feature view": (404, {"features": ["nope:txn_count"], "entities": {"user_id": ["u1"]}}, "'nope'"),
    "unknown feature service": (404, {"feature_service": "nope", "entities": {"user_id": ["u1"]}}, "'nope'"),
    "not a reference": (400, {"features": ["txn_count"], "entities": {"user_id": ["u1"]}}, "'txn_count'"),
    "no features": (400, {"features": [], "entities": {"user_id": ["u1"]}}, "no features"),
    "wrong entity key": (400, {"features": [TXN_COUNT], "entities": {"card_id": ["u1"]}}, "'user_id'"),
    "no entity key": (400, {"features": [TXN_COUNT], "entities": {}}, "'user_id'"),
    "a key of a composite key missing": (
        400,
        {"features": [f"{CARD_MERCHANT.name}:txn_count"], "entities": {"card_id": ["c1"]}},
        "'merchant_id'",
    ),
    "key lists of different lengths": (
        400,
        {"features": [f"{CARD_MERCHANT.name}:txn_count"], "entities": {"card_id": ["c1", "c2"], "merchant_id": [7]}},
        "differ in length",
    ),
    "no key values": (400, {"features": [TXN_COUNT], "entities": {"user_id": []}}, "no rows"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_client_mistake_is_a_4xx_saying_what_and_the_fix(served: Server, mistake: str) -> None:
    status, body, named = MISTAKES[mistake]
    got, answer = served.post(ONLINE, body)
    assert got == status, answer
    assert set(answer) == {"error", "fix"} and named in answer["error"] and answer["fix"], answer
    log = served.log.read_text()
    assert f"{status} {ONLINE}: {answer['error']}" in log  # one line in the server's log
    assert "Traceback" not in log, log[-3000:]
    assert served.online(USER, {"user_id": ["u1"]})["txn_count"] == [3]  # and the server serves on


def test_the_fix_names_what_exists(served: Server) -> None:
    _, answer = served.post(ONLINE, {"features": [f"{USER.name}:nope"], "entities": {"user_id": ["u1"]}})
    assert "'txn_count'" in answer["fix"] and "'last_oks'" in answer["fix"]
    _, answer = served.post(ONLINE, {"features": ["nope:txn_count"], "entities": {"user_id": ["u1"]}})
    assert f"'{USER.name}'" in answer["fix"] and f"'{CARD_MERCHANT.name}'" in answer["fix"]
    _, answer = served.post(ONLINE, {"features": [TXN_COUNT], "entities": {"card_id": ["u1"]}})
    assert '"user_id": [...]' in answer["fix"]


# A body Feast's request model refuses (FastAPI answers 422 with pydantic's errors): 400, naming the field

ONLINE_FIX = 'send a JSON object like {"features": ["<view>:<feature>", ...]'
# name -> (path, body, content type, what the error says, what the fix says)
INVALID = {
    "malformed JSON": (ONLINE, b'{"features": [', "application/json", "body: not valid JSON (", ONLINE_FIX),
    "no body": (ONLINE, b"", "application/json", "body: missing", ONLINE_FIX),
    "a JSON list": (ONLINE, b"[1, 2]", "application/json", "body: not a JSON object (got [1, 2])", ONLINE_FIX),
    "not sent as JSON": (ONLINE, b"{}", "text/plain", "body: not read as JSON (its Content-Type", "Content-Type"),
    "features not a list": (
        ONLINE,
        json.dumps({"features": TXN_COUNT, "entities": {"user_id": ["u1"]}}).encode(),
        "application/json",
        f'features: should be a valid list, got "{TXN_COUNT}"',
        'send "features" as a list of',
    ),
    "a feature not a string": (
        ONLINE,
        b'{"features": [1], "entities": {"user_id": ["u1"]}}',
        "application/json",
        "features.0: should be a valid string, got 1",
        'send "features" as a list of',
    ),
    "entities not an object": (
        ONLINE,
        json.dumps({"features": [TXN_COUNT], "entities": ["u1"]}).encode(),
        "application/json",
        'entities: should be a valid dictionary, got ["u1"]',
        'send "entities" as an object of join key -> list of values',
    ),
    "a key's values not a list": (
        ONLINE,
        json.dumps({"features": [TXN_COUNT], "entities": {"user_id": "u1"}}).encode(),
        "application/json",
        'entities.user_id: should be a valid list, got "u1"',
        'send "entities" as an object',
    ),
    "no entities": (
        ONLINE,
        json.dumps({"features": [TXN_COUNT]}).encode(),
        "application/json",
        "entities: missing",
        'send "entities" as an object',
    ),
    "full_feature_names not a boolean": (
        ONLINE,
        json.dumps({"features": [TXN_COUNT], "entities": {"user_id": ["u1"]}, "full_feature_names": "yes!"}).encode(),
        "application/json",
        "full_feature_names: should be a valid boolean",
        'send "full_feature_names" as true or false',
    ),
    "malformed JSON to another endpoint": (
        "/push",
        b"{",
        "application/json",
        "body: not valid JSON (",
        "send a JSON object as /push takes (https://docs.feast.dev/",
    ),
    "a wrong type to another endpoint": (
        "/push",
        b'{"push_source_name": 1, "df": {}}',
        "application/json",
        "push_source_name: should be a valid string, got 1",
        "correct push_source_name to the type /push takes",
    ),
}


@pytest.mark.parametrize("mistake", list(INVALID))
def test_a_body_the_request_model_refuses_is_a_400_naming_the_field(served: Server, mistake: str) -> None:
    path, data, content_type, error, fix = INVALID[mistake]
    status, answer = served.post_bytes(path, data, content_type)
    assert status == 400, answer
    assert set(answer) == {"error", "fix"} and answer["error"].startswith(error) and fix in answer["fix"], answer
    log = served.log.read_text()
    assert f"400 {path}: {answer['error']}" in log  # one line in the server's log
    assert "Traceback" not in log, log[-3000:]
    assert served.online(USER, {"user_id": ["u1"]})["txn_count"] == [3]


def test_every_field_refused_is_named(served: Server) -> None:
    status, answer = served.post(ONLINE, {"features": "x", "entities": [], "full_feature_names": "?"})
    assert status == 400
    assert answer["error"].count(": should be a valid") == 3, answer
    assert {"features:", "entities:", "full_feature_names:"} <= set(answer["error"].split()), answer


# What Feast answered 500 for (a key value that is no key, a lone surrogate, JSON nested ~1,000 deep): 400, naming
# where in the body

CARD_COUNT = f"{CARD_MERCHANT.name}:txn_count"
KEY_FIX = "send each key value as a string or a number"
INT_FIX = 'send "merchant_id" values as integers from -9223372036854775808 to 9223372036854775807'
SURROGATE_FIX = "send valid Unicode"
DEEP = "JSON nested more than 32 levels deep"


def _online_body(entities: str, features: str = f'["{TXN_COUNT}"]') -> bytes:
    """A request written as text, for what json.dumps cannot write (a lone surrogate escape, raw bytes)."""
    return f'{{"features": {features}, "entities": {entities}}}'.encode("utf-8", "surrogatepass")


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# name -> (path, body, what the error starts with, what the fix says)
HOSTILE = {
    "null as a key value": (
        ONLINE,
        _online_body('{"user_id": ["u1", null]}'),
        "entities.user_id.1: null is not a key value (user_id is a string key)",
        KEY_FIX,
    ),
    "an object as a key value": (
        ONLINE,
        _online_body('{"user_id": [{"id": "u1"}]}'),
        'entities.user_id.0: {"id": "u1"} is not a key value',
        KEY_FIX,
    ),
    "a list as a key value": (ONLINE, _online_body('{"user_id": [["u1"]]}'), "entities.user_id.0: [", KEY_FIX),
    "true as a string key": (
        ONLINE,
        _online_body('{"user_id": [true]}'),
        "entities.user_id.0: true is not a key value (user_id is a string key)",
        KEY_FIX,
    ),
    "a word as an integer key": (
        ONLINE,
        _online_body('{"card_id": ["c1"], "merchant_id": ["x"]}', f'["{CARD_COUNT}"]'),
        'entities.merchant_id.0: "x" is not an integer (merchant_id is an int64 key)',
        INT_FIX,
    ),
    "an integer key out of range": (
        ONLINE,
        _online_body('{"card_id": ["c1", "c2"], "merchant_id": [7, 1180591620717411303424]}', f'["{CARD_COUNT}"]'),
        "entities.merchant_id.1: 1180591620717411303424 is out of range (merchant_id is an int64 key)",
        INT_FIX,
    ),
    "a fraction as an integer key": (
        ONLINE,
        _online_body('{"card_id": ["c1"], "merchant_id": [7.5]}', f'["{CARD_COUNT}"]'),
        "entities.merchant_id.0: 7.5 is not an integer",
        INT_FIX,
    ),
    "NaN as a key value": (ONLINE, _online_body('{"user_id": [NaN]}'), "entities.user_id.0: NaN is not a key", KEY_FIX),
    "a number of 5,000 digits": (
        ONLINE,
        _online_body(f'{{"user_id": ["u1", {"7" * 5000}]}}'),
        "entities.user_id.1: a number of more than 4,300 digits",
        "send the value as a string",
    ),
    "a version of a view where none is served": (
        ONLINE,
        _online_body('{"user_id": ["u1"]}', f'["{USER.name}@v2:txn_count"]'),
        f"features: '{USER.name}@v2:txn_count' asks for version 'v2' of feature view '{USER.name}'",
        f"ask for '{TXN_COUNT}'",
    ),
    "a lone surrogate escaped in a key value": (
        ONLINE,
        _online_body('{"user_id": ["u1", "\\ud800"]}'),
        "entities.user_id.1: a string holding a lone UTF-16 surrogate",
        SURROGATE_FIX,
    ),
    "a lone surrogate encoded as UTF-8 in a key value": (
        ONLINE,
        _online_body('{"user_id": ["\ud800"]}'),
        "entities.user_id.0: a string holding a lone UTF-16 surrogate",
        SURROGATE_FIX,
    ),
    "a lone surrogate in a join key's name": (
        ONLINE,
        _online_body('{"user_\\udc00": ["u1"]}'),
        "entities.user_\\udc00: a string holding a lone UTF-16 surrogate",
        SURROGATE_FIX,
    ),
    "a body that is not UTF-8": (ONLINE, _online_body('{"user_id": ["u1"]}') + b"\xff", "body: not UTF-8", "UTF-8"),
    "JSON nested 1,000 deep in a key value": (
        ONLINE,
        _online_body(f'{{"user_id": [{_nested(1000)}]}}'),
        f"entities.user_id.0.0...: {DEEP}",
        "at most 32 levels",
    ),
    "JSON nested 1,000 deep in features": (
        ONLINE,
        _online_body('{"user_id": ["u1"]}', _nested(1000)),
        f"features.0.0.0...: {DEEP}",
        "at most 32 levels",
    ),
    "JSON nested 1,000 deep as the body": (ONLINE, _nested(1000).encode(), f"0.0.0.0...: {DEEP}", "at most 32 levels"),
    "JSON nested 33 deep": (
        ONLINE,
        _online_body('{"user_id": ["u1"]}', f'["{TXN_COUNT}", {_nested(31)}]'),
        f"features.1.0.0...: {DEEP}",
        "at most 32 levels",
    ),
    "JSON nested 1,000 deep to another endpoint": (
        "/push",
        f'{{"push_source_name": "x", "df": {{"a": {_nested(1000)}}}}}'.encode(),
        f"df.a.0.0...: {DEEP}",
        "at most 32 levels",
    ),
    "one feature twice": (
        ONLINE,
        _online_body('{"user_id": ["u1"]}', f'["{TXN_COUNT}", "{TXN_COUNT}"]'),
        f"features: '{TXN_COUNT}', '{TXN_COUNT}' would be answered under one name, 'txn_count'",
        "request each feature once",
    ),
    "features of one name in two views": (
        ONLINE,
        _online_body('{"user_id": ["u1"], "card_id": ["c1"], "merchant_id": [7]}', f'["{TXN_COUNT}", "{CARD_COUNT}"]'),
        f"features: '{TXN_COUNT}', '{CARD_COUNT}' would be answered under one name",
        '"full_feature_names": true',
    ),
}


@pytest.mark.parametrize("mistake", list(HOSTILE))
def test_what_feast_answered_500_is_a_400_naming_where(served: Server, mistake: str) -> None:
    path, data, error, fix = HOSTILE[mistake]
    status, answer = served.post_bytes(path, data)
    assert status == 400, answer
    assert set(answer) == {"error", "fix"} and answer["error"].startswith(error) and fix in answer["fix"], answer
    log = served.log.read_text(errors="replace")
    assert f"400 {path}: {answer['error']}" in log  # one line in the server's log
    assert "Traceback" not in log, log[-3000:]
    assert served.online(USER, {"user_id": ["u1"]})["txn_count"] == [3]


def test_what_is_close_to_a_mistake_is_served(served: Server) -> None:
    """The checks refuse no request Feast answers right: a surrogate pair, an integer key as a string or a whole
    float, a number for a string key, JSON 32 levels deep."""
    got = served.online(CARD_MERCHANT, {"card_id": ["c1", "c2", "c1"], "merchant_id": ["8", 7.0, 2**63 - 1]})
    assert got["txn_count"] == [2, 3, None]
    pair = _online_body('{"user_id": ["u1", "\\ud83d\\ude00", 4]}')  # the pair is one character: not written
    status, answer = served.post_bytes(ONLINE, pair)
    assert status == 200 and answer["results"][1]["values"] == [3, None, None], answer
    deep = _online_body('{"user_id": ["u1"]}', f'["{TXN_COUNT}"], "x": [{_nested(30)}]')  # 32 levels
    status, answer = served.post_bytes(ONLINE, deep)
    assert status == 200 and answer["results"][1]["values"] == [3], answer


# ---------------------------------------------------------------------------------------------------------
# Stopping, a port in use, a broken feature_store.yaml: one `error:` line, exit 2


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An applied repo on SQLite, nothing written: for servers a test starts and stops itself."""
    return make_repo(tmp_path_factory.mktemp("serve-own") / "repo", "sqlite")


def test_ctrl_c_stops_the_server_and_its_workers_at_once(applied: Path) -> None:
    """SIGINT to the process group, as Ctrl-C in a terminal: gunicorn sends its workers SIGQUIT, which Feast's
    uvicorn worker ignored (gunicorn then waited 30 s and SIGKILLed them)."""
    server = start_server(applied, workers=2)
    try:
        _wait_until_booted(server, 2)  # a worker still booting dies of the SIGINT itself, as it would in a terminal
        workers = server.workers() if Path(f"/proc/{server.process.pid}/task").is_dir() else []
        started = time.monotonic()
        os.killpg(server.process.pid, signal.SIGINT)
        status = server.process.wait(timeout=STOP_TIMEOUT_S)
        took = time.monotonic() - started
    finally:
        stop_server(server)
    log = server.log.read_text()
    assert status in (0, 130), log
    assert took < 10, f"stopping took {took:.1f}s\n{log}"
    assert "SIGKILL" not in log and "was sent" not in log and "Traceback" not in log, log
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()], "a worker outlived the server"


def _wait_until_booted(server: Server, workers: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while server.log.read_text().count("Application startup complete") < workers:
        assert time.monotonic() < deadline, server.log.read_text()
        time.sleep(0.1)


def _serve(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "features.cli", "serve", "--repo", str(root), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)


def test_a_port_in_use_is_one_error_line_naming_the_port(applied: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve(applied, "--port", str(port))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --port:") and str(port) in lines[-1] and "--port" in lines[-1], done.stderr
    assert not any(line.startswith("error:") for line in lines[:-1]) and "Traceback" not in done.stderr
    assert "Listening at" not in done.stderr  # refused before gunicorn starts (it retried for 5 s, then exited 1)


BROKEN_YAML = {
    "not YAML": ("project: p\nonline_store: [1\n", "not valid YAML"),
    "an unknown online store setting": (
        "project: p\nprovider: local\nregistry: data/registry.db\nonline_store:\n  type: sqlite\n  pth: x\n",
        "online_store.pth: Extra inputs are not permitted",
    ),
    "a setting of the wrong type": (
        "project: p\nprovider: local\nregistry: data/registry.db\nonline_store:\n  type: sqlite\n"
        "entity_key_serialization_version: banana\n",
        "entity_key_serialization_version: Input should be a valid integer",
    ),
    "an unknown offline store": (
        "project: p\nprovider: local\nregistry: data/registry.db\nonline_store:\n  type: sqlite\n"
        "offline_store:\n  type: nosuch\n",
        "Offline Store Class 'nosuch'",
    ),
    "a project name Feast refuses": (
        "project: p-q\nprovider: local\nregistry: data/registry.db\nonline_store:\n  type: sqlite\n",
        "project: Project names for SQLite online stores cannot contain hyphens",
    ),
}


@pytest.mark.parametrize("broken", list(BROKEN_YAML))
def test_a_broken_feature_store_yaml_is_exit_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], broken: str
) -> None:
    text, problem = BROKEN_YAML[broken]
    config = tmp_path / "feature_store.yaml"
    config.write_text(text)
    assert main(["serve", "--repo", str(tmp_path), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {config}: {problem}"), err
    assert "Fix:" in err and "Traceback" not in err
