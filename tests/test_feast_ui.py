"""Feast's own web UI (`feast ui`, part of the Feast wheel) on the demo's definitions, as docs/serving.md shows it.

The demo's feature groups are applied into a temporary repo (`features apply` semantics,
`features.pipelines.registration.apply`; its `where` check uses the session's Spark). `feast ui` is started there on
127.0.0.1 as a subprocess, and the test reads what the page reads: the REST registry API the UI server mounts
at /api/v1, and the feature views page rendered by headless Chromium (Debian's `chromium` package, which
`./dev test` installs when it can). Without Chromium the test fails when the environment variable CI is set,
and is skipped otherwise.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from chromium import chromium, render
from conftest import EXAMPLE_REPO, build_feast_repo

DEMO_VIEWS = {"user_transactions", "card_activity", "card_merchant"}
START_TIMEOUT_S = 90.0  # importing Feast and building the app takes a while on 2 cores
STOP_TIMEOUT_S = 15.0


@dataclass
class UiServer:
    root: Path
    port: int
    process: subprocess.Popen
    log: Path

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _feast_command() -> list[str]:
    """The `feast` entry point next to this interpreter, else Feast's CLI module."""
    script = Path(sys.executable).with_name("feast")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "feast.cli.cli"]


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()  # uvicorn shuts down on SIGTERM
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_until_answering(server: UiServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"feast ui exited with {server.process.returncode}: {server.log.read_text()}")
        try:
            if server.get("/projects-list.json")[0] == 200:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.3)
    raise AssertionError(f"feast ui did not answer on 127.0.0.1:{server.port} within {START_TIMEOUT_S:.0f}s")


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory, spark) -> Path:
    """The demo's feature groups, applied (registry only: the UI shows definitions, not data)."""
    from features.repo import Repo

    groups = list(Repo.load(EXAMPLE_REPO).groups.values())
    assert {g.name for g in groups} == DEMO_VIEWS, "the demo's groups changed: update DEMO_VIEWS and docs/serving.md"
    return build_feast_repo(tmp_path_factory.mktemp("feast-ui") / "repo", groups)


@pytest.fixture(scope="module")
def ui_server(demo_repo: Path) -> Iterator[UiServer]:
    port = _free_port()
    log = demo_repo / f"feast-ui-{port}.log"
    with log.open("wb") as stderr:  # a file, not a pipe: a pipe nobody reads would block the server once full
        process = subprocess.Popen(
            [*_feast_command(), "ui", "--host", "127.0.0.1", "--port", str(port)],
            cwd=demo_repo,
            stdout=stderr,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopping it never signals pytest
        )
    server = UiServer(demo_repo, port, process, log)
    try:
        _wait_until_answering(server)
        yield server
    finally:
        _stop(process)
    assert process.poll() is not None, "feast ui still running after the test"


@pytest.mark.slow
@pytest.mark.spark
def test_registry_api_lists_the_demo_feature_views(ui_server: UiServer):
    status, body = ui_server.get("/projects-list.json")
    assert status == 200, body
    projects = json.loads(body)["projects"]
    assert [p["id"] for p in projects] == ["fraud"], projects
    assert projects[0]["registryPath"] == "/api/v1"

    # What the feature views page fetches (the UI's React app, REST mode), and the query docs/serving.md shows
    for query in ("project=fraud&include_relationships=true", "project=fraud"):
        status, body = ui_server.get(f"/api/v1/feature_views?{query}")
        assert status == 200, body
        views = {v["spec"]["name"]: v for v in json.loads(body)["featureViews"]}
        assert set(views) == DEMO_VIEWS, query
        features = {f["name"] for f in views["user_transactions"]["spec"]["features"]}
        assert "failed_count_24h" in features, features


@pytest.mark.slow
@pytest.mark.spark
def test_feature_views_page_lists_the_demo_feature_views(ui_server: UiServer, tmp_path: Path):
    dom = render(chromium(), ui_server.url("/p/fraud/feature-view"), tmp_path / "chromium-profile")
    # Each view is a row of the table, named by a link to its own page
    listed = {name for name in DEMO_VIEWS if f'data-test-subj="row-{name}"' in dom}
    linked = {name for name in DEMO_VIEWS if f'href="/p/fraud/feature-view/{name}"' in dom}
    assert listed == linked == DEMO_VIEWS, f"rows {sorted(listed)}, links {sorted(linked)}; the page:\n{dom[-4000:]}"
