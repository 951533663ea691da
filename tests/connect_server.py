"""A real Spark Connect server for the tests (the session kind Databricks serverless and shared clusters give).

`running_server()` starts `org.apache.spark.sql.connect.service.SparkConnectServer` from PySpark's own jars in a
JVM of its own (local[2], two shuffle partitions, UTC) on a free loopback port and gives its `sc://` address (e.g.
for `SPARK_REMOTE` in a CLI subprocess); `client_session(url)` a Spark Connect client session to it. The fixtures
`connect_url` and `spark_connect` (session scope) are tests/conftest.py's: one server per test process, whichever
modules use it (a fixture a test module imports is that module's own, and each module started a server of its
own), stopped when the run ends.

PySpark refuses `SparkSession.builder.remote(...)` in a process that already has a classic session (the shared
`spark` fixture), so the client is built with the Connect builder itself, which has no such check: both kinds
of session live side by side in the test process, as a notebook on a Connect cluster never does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import spark_submit_java_options

from features.engine import jars
from features.engine.runtime import parse_version

START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@contextmanager
def running_server() -> Iterator[str]:
    """The `sc://` address of a Spark Connect server started for this test run, stopped on the way out."""
    import pyspark

    home = Path(pyspark.__file__).parent
    port = _free_port()
    log = Path(tempfile.mkdtemp(prefix="features-connect-")) / "server.log"
    env = dict(os.environ, SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable)
    env.pop("SPARK_REMOTE", None)
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.driver.memory": "2g",
    }
    # Delta Lake (the offline tables) on the server's class path, as a Connect server of a cluster has it.
    delta = [str(j) for j in jars.class_path(parse_version(pyspark.__version__) or (0, 0))]
    conf |= {"spark.driver.extraClassPath": os.pathsep.join(delta), **jars.DELTA_CONF}
    command = [str(home / "bin" / "spark-submit"), "--master", "local[2]", *spark_submit_java_options()]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "spark-internal"]
    with log.open("w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(port):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Spark Connect server did not start; its log:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


@contextmanager
def client_session(url: str) -> Iterator[object]:
    """A Spark Connect client session (pyspark.sql.connect.session.SparkSession) to the server at `url`."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(url).getOrCreate()
    try:
        yield session
    finally:
        session.stop()
