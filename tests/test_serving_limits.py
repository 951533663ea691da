"""The feature server's limits (issue 66, item 10): a request of more entity rows than `--max-entity-rows`, or a body
over `--max-body-bytes`, is answered 413 with `{"error", "fix"}` naming the option, the body's size from its
Content-Length before the body is read, a chunked body's as its parts come in; a worker's memory comes back after
requests at the row limit (and over it). The defaults, and the options' check on the command line.

One server per store, started with limits other than the defaults (so that they are seen to reach the workers),
on a free port of 127.0.0.1; every request goes there, bounded in count and size.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis_server as redis_fixtures
from feast import FeatureStore
from feature_servers import Server, start_server, stop_server
from online_repos import STORES, T0, USER, count_rows, make_repo, writer

from features.cli import build_parser, main
from features.stores.serving import server_options
from features.stores.serving_input import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_ENTITY_ROWS, RequestLimits

redis_server = redis_fixtures.redis_server  # the session's real Redis (a fixture)

ONLINE = "/get-online-features"
ROWS = 20_000  # twice the default: the option reaches the workers
BODY_BYTES = 400_000  # ROWS keys of 7 characters fit; 500,000 one-digit keys do not
KEYS = [f"u{i:06d}" for i in range(ROWS)]
FEATURES = [f"{USER.name}:{f.name}" for f in USER.features]
# What a worker's memory may grow by over the requests of the memory test (it grew ~0-20 MiB at 10,000 rows, and
# stayed 83 MiB up after one request of 100,000 rows, 2.1 GiB after one of 1,000,000).
RSS_GROWTH_MIB = 48


@pytest.fixture(scope="module", params=STORES)
def limited(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`features serve --max-entity-rows ROWS --max-body-bytes BODY_BYTES`, one worker, every tenth key online."""
    kind = request.param
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    root = make_repo(tmp_path_factory.mktemp(f"limits-{kind}") / "repo", kind, redis)
    writer(root, USER).write(count_rows(T0, {key: i for i, key in enumerate(KEYS[::10])}))
    options = ["--max-entity-rows", str(ROWS), "--max-body-bytes", str(BODY_BYTES)]
    running = start_server(root, workers=1, options=options)
    yield running
    stop_server(running)
    if redis is not None:
        redis.delete_project(FeatureStore(repo_path=str(root)).project)


def _rows(keys: list, features: list[str] = FEATURES) -> bytes:
    return json.dumps({"features": features, "entities": {"user_id": keys}}, separators=(",", ":")).encode()


def _values(answer: dict, feature: str) -> list:
    return answer["results"][answer["metadata"]["feature_names"].index(feature)]["values"]


def _assert_413(answer: dict, error: str, option: str, server: Server) -> None:
    assert set(answer) == {"error", "fix"} and answer["error"].startswith(error), answer
    assert option in answer["error"] and option in answer["fix"], answer
    log = server.log.read_text()
    assert f"413 {ONLINE}: {answer['error']}" in log and "Traceback" not in log, log[-3000:]


def test_rows_up_to_the_limit_are_served_and_more_are_413(limited: Server) -> None:
    status, answer = limited.post_bytes(ONLINE, _rows(KEYS))
    assert status == 200, answer
    counts = _values(answer, "txn_count")
    assert len(counts) == ROWS and (counts[0], counts[1], counts[10]) == (0, None, 1)
    status, answer = limited.post_bytes(ONLINE, _rows([*KEYS, "u1"]))
    assert status == 413, answer
    _assert_413(
        answer,
        f"entities: {ROWS + 1:,} rows, more than the server takes in one request ({ROWS:,}",
        "--max-entity-rows",
        limited,
    )


def test_a_body_at_the_limit_is_read(limited: Server) -> None:
    body = _rows(["u000000"])
    status, answer = limited.post_bytes(ONLINE, body + b" " * (BODY_BYTES - len(body)))
    assert status == 200 and _values(answer, "txn_count") == [0], answer


def _exchange(server: Server, head: bytes, body: bytes, last: bytes = b"") -> tuple[int, dict[str, str], dict]:
    """Sends the request's head and `body` as they are (not necessarily all the body its head announces), then
    `last` on its own, and reads the answer to its end: the server closes the connection after it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + body)
        if last:
            # Arriving alone (in one read), the bytes that decide the answer leave nothing unread when the server
            # closes: unread bytes make the close a reset, which can drop the answer before it is read.
            time.sleep(0.2)
            sock.sendall(last)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    response = http.client.HTTPResponse(_Replay(answer))  # type: ignore[arg-type]
    response.begin()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(response.read())


class _Replay:
    """An answer's bytes, as the socket `http.client.HTTPResponse` parses from."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


def test_a_body_over_the_limit_is_413_before_it_is_read(limited: Server) -> None:
    """A Content-Length of 50 MB: answered when the head arrives, with 1 KB of the body sent."""
    head = (
        f"POST {ONLINE} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 50000000\r\n\r\n"
    ).encode()
    status, headers, answer = _exchange(limited, head, b" " * 1024)
    assert status == 413 and headers.get("connection") == "close", (status, headers, answer)
    _assert_413(
        answer,
        f"body: 50,000,000 bytes (its Content-Length), more than the server takes ({BODY_BYTES:,} bytes",
        "--max-body-bytes",
        limited,
    )
    assert limited.online(USER, {"user_id": ["u000010"]})["txn_count"] == [1]


def test_a_chunked_body_over_the_limit_is_413_as_it_comes_in(limited: Server) -> None:
    """No Content-Length: the parts are counted; the answer comes once they pass the limit, the body unfinished."""
    head = (
        f"POST {ONLINE} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    part = b" " * 50_000
    up_to_the_limit = b"%x\r\n%s\r\n" % (len(part), part) * (BODY_BYTES // len(part))
    status, headers, answer = _exchange(limited, head, up_to_the_limit, last=b"1\r\n \r\n")  # one byte over, unended
    assert status == 413 and headers.get("connection") == "close", (status, headers, answer)
    _assert_413(
        answer, "body: sent in parts (no Content-Length), larger than the server takes", "--max-body-bytes", limited
    )
    assert limited.online(USER, {"user_id": ["u000010"]})["txn_count"] == [1]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def test_a_worker_s_memory_comes_back_after_requests_at_the_row_limit(limited: Server) -> None:
    """The worker's RSS after two requests at the row limit (what stays allocated from one to the next: after them
    it swings by ~20 MiB, request to request) against after three more and two of 150,000 rows, refused: without the
    limit each of those took >100 MiB that stayed."""
    if not Path(f"/proc/{limited.process.pid}/task").is_dir():
        pytest.skip("needs Linux's /proc to find the worker and its memory")
    (worker,) = limited.workers()
    at_limit, over = _rows(KEYS, FEATURES[:3]), _rows([0] * 150_000, FEATURES[:1])
    assert len(over) < BODY_BYTES  # refused for its rows, once read and parsed
    for body in [at_limit] * 2:
        assert limited.post_bytes(ONLINE, body)[0] == 200
    before = _rss_mib(worker)
    for body in [at_limit, over, at_limit, over, at_limit]:
        status, answer = limited.post_bytes(ONLINE, body)
        assert status == (200 if body is at_limit else 413), answer
    after = _rss_mib(worker)
    print(f"worker RSS: {before:.0f} MiB after 2 requests of {ROWS:,} rows, {after:.0f} MiB after 5 more")
    assert after - before < RSS_GROWTH_MIB, f"{before:.0f} MiB -> {after:.0f} MiB"
    assert limited.workers() == [worker]  # the same worker: none was recycled to give memory back


def test_the_limits_default_to_safe_values_and_are_checked() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.max_entity_rows, args.max_body_bytes) == (DEFAULT_MAX_ENTITY_ROWS, DEFAULT_MAX_BODY_BYTES)
    assert (DEFAULT_MAX_ENTITY_ROWS, DEFAULT_MAX_BODY_BYTES) == (10_000, 1 << 20)
    assert server_options()["limits"] == RequestLimits()
    assert server_options(limits=RequestLimits(5, 6))["limits"] == RequestLimits(5, 6)


@pytest.mark.parametrize("option", ["--max-entity-rows", "--max-body-bytes"])
def test_a_limit_that_is_not_positive_is_one_error_line(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--repo", "nowhere", option, "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {option}: 0 is not a positive whole number") and err.count("\n") == 1, err
