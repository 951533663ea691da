"""A real Redis server for the tests (no fakes): `redis_server` fixture, one server for the whole test run.

Where it comes from, in order:
1. `FEATURES_TEST_REDIS` (e.g. redis://127.0.0.1:6379, as `./dev test` exports after starting one);
2. whatever answers on 127.0.0.1:6379;
3. a `redis-server` started here on a free port, without persistence, stopped when the run ends.

If none is possible, the tests that need Redis fail with a message saying how to get one when the environment
variable CI is set, and are skipped otherwise (the reason is printed in pytest's summary).

Tests share the server with whatever else uses it, so they never flush it: each test uses its own Feast
project name (`RedisServer.project()`), which Feast puts at the end of every key, and deletes its keys after.

Usage in a test module: `from redis_server import RedisServer, redis_server  # noqa: F401`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

import pytest

ENV = "FEATURES_TEST_REDIS"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 6379
START_TIMEOUT_S = 20.0
_KEY = pytest.StashKey["RedisServer | str"]()


@dataclass
class RedisServer:
    host: str
    port: int
    db: int = 0
    started_here: bool = False

    @property
    def connection_string(self) -> str:
        """Feast's `online_store.connection_string` for this server."""
        return f"{self.host}:{self.port}" + (f",db={self.db}" if self.db else "")

    def client(self):
        from redis import Redis

        return Redis(host=self.host, port=self.port, db=self.db, socket_timeout=10)

    @staticmethod
    def project(prefix: str = "t") -> str:
        """A Feast project name no other test uses (keys end with it)."""
        return f"{prefix}_{uuid.uuid4().hex[:10]}"

    def delete_project(self, project: str) -> int:
        """Delete every key of a Feast project (keys are the serialized entity key followed by the project)."""
        client = self.client()
        try:
            keys = list(client.scan_iter(match=b"*" + project.encode(), count=1000))
            for start in range(0, len(keys), 1000):
                client.delete(*keys[start : start + 1000])
            return len(keys)
        finally:
            client.close()


def _answers(host: str, port: int, db: int = 0) -> bool:
    from redis import Redis
    from redis.exceptions import RedisError

    client = Redis(host=host, port=port, db=db, socket_connect_timeout=1, socket_timeout=2)
    try:
        return bool(client.ping())
    except RedisError:
        return False
    finally:
        client.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((DEFAULT_HOST, 0))
        return sock.getsockname()[1]


def _from_env(value: str) -> RedisServer | str:
    url = urlparse(value if "://" in value else f"redis://{value}")
    db = int(url.path.strip("/") or 0)
    server = RedisServer(url.hostname or DEFAULT_HOST, url.port or DEFAULT_PORT, db)
    if _answers(server.host, server.port, db):
        return server
    return f"{ENV}={value} is set, but no Redis answers there"


def _start(request: pytest.FixtureRequest) -> RedisServer | str:
    binary = shutil.which("redis-server")
    if binary is None:
        return (
            f"nothing answers on {DEFAULT_HOST}:{DEFAULT_PORT} and there is no redis-server binary to start one. "
            "Fix: install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis), "
            f"or run ./dev test, which does, or point {ENV} at a running Redis"
        )
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="features-test-redis-")
    log = os.path.join(workdir, "redis.log")
    command = [binary, "--port", str(port), "--bind", DEFAULT_HOST, "--save", "", "--appendonly", "no"]
    command += ["--dir", workdir, "--logfile", log]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop() -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    request.config.add_cleanup(stop)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = (process.stderr.read() if process.stderr else b"").decode(errors="replace").strip()
            if not error and os.path.exists(log):
                with open(log, errors="replace") as f:
                    error = f.read()[-500:]
            return f"{binary} exited with status {process.returncode} at start: {error}"
        if _answers(DEFAULT_HOST, port):
            return RedisServer(DEFAULT_HOST, port, started_here=True)
        time.sleep(0.05)
    return f"{binary} did not answer on {DEFAULT_HOST}:{port} within {START_TIMEOUT_S:.0f}s"


def _find(request: pytest.FixtureRequest) -> RedisServer | str:
    if os.environ.get(ENV):
        return _from_env(os.environ[ENV])
    if _answers(DEFAULT_HOST, DEFAULT_PORT):
        return RedisServer(DEFAULT_HOST, DEFAULT_PORT)
    return _start(request)


@pytest.fixture(scope="session")
def redis_server(request: pytest.FixtureRequest) -> RedisServer:
    """The test run's Redis server (found or started once, whichever modules import this fixture)."""
    stash = request.config.stash
    if _KEY not in stash:
        stash[_KEY] = _find(request)
    found = stash[_KEY]
    if isinstance(found, RedisServer):
        return found
    message = f"Redis tests need a real redis-server: {found}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    print(f"\nskipping Redis tests: {found}")
    pytest.skip(message)
