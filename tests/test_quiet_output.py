"""Output fit for a log: where the package reads files that may fail on purpose (the source's probe of each
Parquet file's layout), Spark's own logging of the failure stays quiet, and the reason is kept in one line.

The check runs Spark in a subprocess, with the local session `features` starts there: the JVM writes its log
to its process's stderr, which a test on the shared session cannot capture.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pandas as pd
import pytest

from features import Feature, FeatureGroup, Hop, agg
from features.engine.session import spark_ui

# Reads a folder of event files the way a backfill does (features.engine.source.read_source), then reads the
# stray file with no probe around it; prints what it found as one JSON line.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
    from features.engine.session import get_spark
    from features.engine.source import read_source

    folder = sys.argv[1]
    schema = {"user_id": "string", "amount": "double", "event_ts": "timestamp"}
    group = FeatureGroup(
        "g",
        entity=Entity("user", join_keys=["user_id"]),
        source=EventSource("events", path=folder, timestamp="event_ts", schema=schema),
        features=[Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m"))],
    )
    spark = get_spark(shuffle_partitions=2)
    read = read_source(spark, group, folder)
    found = {
        "events": read.events.count(),
        "rejected": {Path(r["source_file"]).name: r["reason"] for r in read.rejected.collect()},
    }
    try:
        spark.read.parquet(str(Path(folder) / "2-stray.parquet")).collect()
    except Exception as exc:  # a failure nobody expected: the caller gets Spark's reason and trace
        found["unexpected"] = str(exc)
    print(json.dumps(found))
    """
)


@pytest.mark.spark
def test_probing_source_files_prints_no_java_trace(tmp_path: Path) -> None:
    """A folder with a pandas file (nanosecond timestamps: Spark's first read of it fails, the second reads it)
    and a stray file that is not Parquet: Spark's executor logged an ERROR line with a ~40-line Java trace for
    each failed read, naming the good pandas file too."""
    folder = tmp_path / "events"
    folder.mkdir()
    stamps = pd.to_datetime(["2026-01-01 00:00:00.123456789", "2026-01-01 00:00:01.000000001"], utc=True)
    pd.DataFrame({"user_id": ["a", "b"], "amount": [1.0, 2.0], "event_ts": stamps}).to_parquet(
        folder / "1-pandas.parquet"
    )
    (folder / "2-stray.parquet").write_text("not parquet: a stray file in the landing folder\n")

    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["events"] == 2  # the pandas file was read
    assert list(found["rejected"]) == ["2-stray.parquet"]
    assert "not a Parquet file" in found["rejected"]["2-stray.parquet"]  # the reason, in the quarantine record
    assert "not a Parquet file" in found["unexpected"] and "\tat org.apache.spark" in found["unexpected"]

    err = done.stderr
    for noise in ("Exception in task", "aborting job", "\tat ", "1-pandas.parquet", "2-stray.parquet"):
        assert noise not in err, f"{noise!r} on stderr:\n{err[:3000]}"


@pytest.mark.spark
def test_at_debug_level_spark_errors_show_with_their_traces(tmp_path: Path) -> None:
    """`--log-level debug` sets Python's logging to DEBUG before the session starts: Spark then logs with its own
    profile, and a failed read shows the executor's ERROR line with its Java trace."""
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "2-stray.parquet").write_text("not parquet\n")
    debug = SCRIPT.replace(
        "spark = get_spark(",
        "from features.cli import configure_logging\nconfigure_logging('debug')\nspark = get_spark(",
    )
    done = subprocess.run(
        [sys.executable, "-c", debug, str(folder)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception in task" in done.stderr and "\tat org.apache.spark" in done.stderr, done.stderr[-3000:]
    assert "Command to send" not in done.stderr  # py4j's line per call to the JVM stays off


@pytest.mark.spark
def test_spark_ui_and_console_progress_on_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """FEATURES_SPARK_UI=1 (docs/operations.md, local sessions): Spark's web UI serves and its console bar is on;
    by default both are off."""
    script = (
        "from features.engine.session import get_spark\n"
        "spark = get_spark()\n"
        "print(spark.sparkContext.uiWebUrl, spark.conf.get('spark.ui.showConsoleProgress'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FEATURES_SPARK_UI"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, "FEATURES_SPARK_UI": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    url, progress = done.stdout.split()[-2:]
    assert url.startswith("http://") and progress == "true", done.stdout
    monkeypatch.delenv("FEATURES_SPARK_UI", raising=False)
    assert spark_ui() == "false"


@pytest.mark.spark
def test_a_stream_started_and_stopped_with_ctrl_c_prints_no_chatter(feast_repo, tmp_path: Path) -> None:
    """`features stream` in a process of its own, stopped with Ctrl-C after its first micro-batch. PySpark's driver
    worker of transformWithStateInPandas printed five lines with the processor's repr and the output schema, Java
    its "incubator modules" warning, and the probe of a pandas file the scheduler's "aborting job" line (prefixed
    with the query's id in a stream). Ctrl-C printed some sixty lines of tracebacks: the KeyboardInterrupt landed
    inside a Py4J call, which logged it, and PySpark's handler called the JVM from inside that call."""
    from features import Entity, EventSource

    schema = {"user_id": "string", "event_ts": "timestamp"}
    source = EventSource("events", path="data/events", timestamp="event_ts", watermark="10m", schema=schema)
    group = FeatureGroup(
        "quiet", Entity("user", join_keys=["user_id"]), source, [Feature("n_1h", agg.count(), window=Hop("1h", "5m"))]
    )
    root = feast_repo([group])
    (root / "data" / "events").mkdir(parents=True)
    stamps = pd.to_datetime(["2026-01-01 00:00:00.123456789", "2026-01-01 02:00:01.000000001"], utc=True)
    pd.DataFrame({"user_id": ["a", "b"], "event_ts": stamps}).to_parquet(root / "data" / "events" / "1.parquet")

    command = [sys.executable, "-m", "features.cli", "stream", "--repo", str(root), "--trigger", "1s"]
    process = subprocess.Popen(
        [*command, "--no-tracking"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    watchdog = threading.Timer(600, process.kill)  # a stream that never prints its first batch fails, not hangs
    watchdog.start()
    try:
        assert process.stderr is not None
        first = process.stderr.readline()  # the first batch's progress line
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=300)
    finally:
        watchdog.cancel()
        process.kill()
    err = first + err
    assert process.returncode == 0, err[-3000:]
    assert "2 events" in out, out
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == "stopped; the next run resumes from the checkpoint", err[-3000:]
    assert all(line.startswith("quiet batch ") for line in lines[:-1]) and len(lines) > 1, err[-3000:]


# Streams one file per micro-batch and stops the run while a batch runs a Spark job (a long one, which the stop
# cancels); prints "stopped" once `run.stop()` has returned.
STOP_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from features.pipelines.stream import sink
    from features.pipelines.stream import stream
    from features.repo import Repo

    inside = threading.Event()
    publish = sink.BatchSink._publish

    def slow_publish(self, batch, *args):
        inside.set()
        batch.sparkSession.range(10**12).selectExpr("sum(id)").collect()  # until the stop cancels it
        return publish(self, batch, *args)

    sink.BatchSink._publish = slow_publish
    run = stream(Repo.load(sys.argv[1]), max_files_per_trigger=1, progress=False, tracking=False, trigger="1s")
    assert inside.wait(300), "no micro-batch started"
    run.stop()
    print("stopped", flush=True)
    """
)


@pytest.mark.spark
def test_stopping_a_stream_in_the_middle_of_a_batch_is_quiet(feast_repo) -> None:
    """`run.stop()` while a micro-batch runs a Spark job: Spark matched the interrupted job's ~20,000-character
    error with a pattern that overflows the stack, and printed a thousand-line StackOverflowError."""
    from features import Entity, EventSource

    schema = {"user_id": "string", "event_ts": "timestamp"}
    source = EventSource("events", path="data/events", timestamp="event_ts", watermark="10m", schema=schema)
    group = FeatureGroup(
        "stopped", Entity("user", join_keys=["user_id"]), source, [Feature("n_1h", agg.count(), window=Hop("1h", "5m"))]
    )
    events = pd.DataFrame(
        {"user_id": ["a", "b"], "event_ts": pd.to_datetime(["2026-01-01 00:00", "2026-01-01 02:00"], utc=True)}
    )
    root = feast_repo([group], events.astype({"event_ts": "datetime64[us, UTC]"}))

    done = subprocess.run(
        [sys.executable, "-c", STOP_SCRIPT, str(root)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stdout + done.stderr[-3000:]
    assert not done.stderr.strip(), done.stderr[:3000]


@pytest.mark.spark
def test_a_broadcast_a_stop_interrupted_is_not_logged_and_other_broadcast_errors_are(spark) -> None:
    """The local session's logging (features/engine/log4j2.properties), read by the session's own log4j: a stop in
    the middle of a batch interrupted a broadcast being stored, and Spark's ERROR line about it printed under the
    "stopped" line; that line is left out, every other error of the logger shows."""
    jvm = spark._jvm
    log4j = jvm.org.apache.logging.log4j
    name = "org.apache.spark.broadcast.TorrentBroadcast"
    config = log4j.LogManager.getContext(False).getConfiguration().getLoggerConfig(name)
    assert config.getName() == name

    def decision(text: str) -> str:
        event = (
            log4j.core.impl.Log4jLogEvent.newBuilder()
            .setLoggerName(name)
            .setLevel(log4j.Level.ERROR)
            .setMessage(log4j.message.SimpleMessage(text))
            .build()
        )
        return config.getFilter().filter(event).toString()

    assert decision("Store broadcast broadcast_15 fail, remove all pieces of the broadcast") == "DENY"
    assert decision("Failed to get broadcast_15_piece0 of broadcast_15") == "NEUTRAL"
