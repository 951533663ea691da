"""`features serve` as the serving tests run it: a subprocess on a free port of 127.0.0.1, its log (stderr) in a
file of the repo, started once it answers `GET /health` and stopped with its workers (tests/test_serving.py,
tests/test_serving_limits.py)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 120.0  # importing Feast in the server and its worker is slow on a busy machine
STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    root: Path
    port: int
    process: subprocess.Popen
    log: Path  # the server's stderr: gunicorn's and its workers' log

    def post(self, path: str, body: dict, connection: http.client.HTTPConnection | None = None) -> tuple[int, dict]:
        conn = connection or http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            if connection is None:
                conn.close()

    def post_bytes(self, path: str, data: bytes, content_type: str = "application/json") -> tuple[int, dict]:
        """A body as sent, not necessarily JSON."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("POST", path, data, {"Content-Type": content_type})
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
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


def start_server(root: Path, workers: int = 1, options: Sequence[str] = ()) -> Server:
    """`features serve` for the repo on a free port of 127.0.0.1 (with `options`, e.g. its limits), once it answers."""
    port = free_port()
    command = [sys.executable, "-m", "features.cli", "serve", "--repo", str(root), "--port", str(port)]
    log = root / f"serve-{port}.log"
    with log.open("wb") as stderr:  # a file, not a pipe: a pipe nobody reads would block the server once full
        process = subprocess.Popen(
            [*command, "--workers", str(workers), *options],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # its own process group: stopping it never signals pytest
        )
    server = Server(root, port, process, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"features serve exited with {process.returncode}: {log.read_text()}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return server
        except OSError:
            time.sleep(0.2)
    stop_server(server)
    raise AssertionError(f"features serve did not answer on 127.0.0.1:{port} within {START_TIMEOUT_S:.0f}s")


def stop_server(server: Server) -> None:
    process = server.process
    if process.poll() is None:
        process.terminate()  # gunicorn's graceful shutdown of the master and its workers
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
