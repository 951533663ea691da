"""A local session's settings (features.engine.session, docs/operations.md, local sessions): a live stream's JVM
takes its whole heap when it starts, every other command's grows its heap as it needs; its Python workers import
PySpark from the installed package."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from features.engine.session import _local_settings
from features.engine.worker_daemon import workers_python


def java_options(long_running: bool) -> list[str]:
    settings, _ = _local_settings(None, long_running=long_running)
    return shlex.split(settings.get("spark.driver.extraJavaOptions", ""))


def test_a_long_running_session_takes_its_whole_heap_at_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEATURES_DRIVER_MEMORY", "3g")
    monkeypatch.setenv("FEATURES_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
    options = java_options(long_running=True)
    assert "-Xms3g" in options and "-XX:+AlwaysPreTouch" in options
    assert options[-1] == "-XX:TieredStopAtLevel=1"  # the user's own options come last
    assert not any(o.startswith("-Xms") or "PreTouch" in o for o in java_options(long_running=False))


@pytest.mark.parametrize("own", ["-Xms1g", "-XX:-AlwaysPreTouch"])
def test_the_users_own_heap_options_stand(monkeypatch: pytest.MonkeyPatch, own: str) -> None:
    monkeypatch.setenv("FEATURES_JAVA_OPTIONS", own)
    options = java_options(long_running=True)
    assert own in options
    assert not any(o.startswith("-Xms") and o != own for o in options)
    assert "-XX:+AlwaysPreTouch" not in options


@pytest.mark.spark
def test_generated_code_of_many_plans_planned_again_is_not_compiled_again(spark) -> None:
    """A stream's micro-batches plan the same queries again (some 30 per group and batch): the classes Spark
    generated for them the first time serve again, more than Spark's default cache of 100 of them."""
    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def plan_all() -> None:
        # A literal is part of the generated code: each of the 150 plans compiles classes of its own. Each round
        # plans them anew, as a micro-batch does; `execute` compiles on the driver and runs no job.
        for i in range(150):
            spark.range(3).selectExpr(f"id * {i} + 1 AS a")._jdf.queryExecution().executedPlan().execute()

    plan_all()
    before = compiled.getCount()
    plan_all()
    assert compiled.getCount() == before


@pytest.mark.spark
def test_a_write_over_more_dates_than_open_writers_keeps_every_row(spark, tmp_path) -> None:
    """A local session writes each date's rows without sorting them first, while a task holds at most
    CONCURRENT_WRITERS dates; past that Spark sorts the rest, and every row is still written once, one file per
    task and date."""
    from pyspark.sql import functions as F

    from features.engine.session import CONCURRENT_WRITERS

    assert spark.conf.get("spark.sql.maxConcurrentOutputFileWriters") == str(CONCURRENT_WRITERS)
    dates = CONCURRENT_WRITERS * 2
    # Dates interleaved within each of the two tasks, as a kernel's rows (by key, then time) are.
    rows = spark.range(0, dates * 50, numPartitions=2).select(
        F.col("id"), F.date_add(F.lit("2026-01-01").cast("date"), (F.col("id") % dates).cast("int")).alias("date")
    )
    table = str(tmp_path / "table")
    rows.write.format("delta").partitionBy("date").save(table)
    back = spark.read.format("delta").load(table)
    assert sorted(r.id for r in back.select("id").collect()) == list(range(dates * 50))
    assert back.select(F.input_file_name()).distinct().count() == dates * 2


def test_the_worker_daemon_drops_only_the_zips_of_the_installed_pyspark(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """Spark puts PySpark's own zips first on its workers' path; the daemon of local sessions imports PySpark from
    the installed package instead, and leaves every other entry, a zip of the same name elsewhere included."""
    import pyspark

    from features.engine import worker_daemon

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    elsewhere = tmp_path / "pyspark.zip"
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    monkeypatch.setattr(sys, "path", [*zips, str(elsewhere), *sys.path])
    assert worker_daemon._installed_pyspark_zips() == zips
    # Where only the zips hold PySpark (no package beside them), they stay.
    monkeypatch.setattr(sys, "path", [*zips, str(tmp_path)])
    assert worker_daemon._installed_pyspark_zips() == []


@pytest.mark.parametrize("kept", [True, False], ids=["daemon", "default"])
def test_the_worker_daemon_keeps_freed_memory_for_the_next_batch(kept: bool) -> None:
    """The daemon's workers keep a large freed array's memory for the next one (no page faulted in again); a
    process without the setting returns it to the system at once."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6")
    except OSError:
        pytest.skip("not glibc: the setting applies to glibc's malloc only")
    script = f"""
import numpy as np
from features.engine.worker_daemon import keep_freed_memory
if {kept}:
    keep_freed_memory()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1])
before = rss()
values = np.ones(50_000_000)
used = rss() - before
del values
print(used, rss() - before)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    used, after = map(int, done.stdout.split())
    assert used > 90_000  # pages of 4 kB: the array's 400 MB
    assert (after > used * 0.9) if kept else (after < used * 0.1)


def test_a_workers_task_that_imports_freezes_what_lives_then_out_of_the_collectors_sight() -> None:
    """After a task that imported modules, the objects alive are frozen (the daemon's collection after every task
    then skips them); a task that imports nothing freezes nothing more."""
    script = """
import gc
from features.engine.worker_daemon import freezing_imports
def importing(sock, authenticated):
    import xml.dom.minidom  # not imported before
    return 0
def plain(sock, authenticated):
    return 0
assert gc.get_freeze_count() == 0
assert freezing_imports(importing)(None, False) == 0
frozen = gc.get_freeze_count()
assert freezing_imports(plain)(None, False) == 0
print(frozen, gc.get_freeze_count())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    frozen, after = map(int, done.stdout.split())
    assert frozen > 10_000  # the modules' objects, and the package's
    assert after == frozen


def test_the_python_worker_daemon_is_ours_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEATURES_PYTHON_DAEMON", raising=False)
    settings, _ = _local_settings(None)
    assert settings["spark.python.daemon.module"] == "features.engine.worker_daemon"
    monkeypatch.setenv("FEATURES_PYTHON_DAEMON", "pyspark.daemon")  # PySpark's own (docs/operations.md)
    settings, _ = _local_settings(None)
    assert settings["spark.python.daemon.module"] == "pyspark.daemon"


def test_a_local_sessions_streams_rename_their_checkpoint_files_without_forking(spark) -> None:
    """The checkpoint manager a local session names is one its Spark has (a stream would fail at its first batch
    otherwise), and the session runs with it."""
    from features.engine.session import CHECKPOINT_FILES

    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == CHECKPOINT_FILES
    assert spark._jvm.java.lang.Class.forName(CHECKPOINT_FILES).getName() == CHECKPOINT_FILES


def test_the_workers_python_runs_a_module_as_python_m_does_with_pyspark_from_its_package(tmp_path) -> None:
    """Spark starts its other Python processes (a stream's driver-side `transformWithStateInPandas` check) as
    `<PYSPARK_PYTHON> -m <module> [arguments]`, the zips first on their path: `features-spark-python` runs the module
    as `python -m` would (the working folder first on the path, the module's arguments and exit status), with PySpark
    from its package."""
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(z) for z in sorted(lib.glob("*.zip")))}
    command = workers_python()
    assert Path(command).name == "features-spark-python"
    (tmp_path / "probe.py").write_text(
        "import json, sys, pyspark\nprint(json.dumps([sys.argv[1:], sys.path[0], pyspark.__file__, __name__]))\n"
    )
    (tmp_path / "fails.py").write_text("raise SystemExit(3)\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([command, *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=False)

    done = run("-m", "probe", "a", "--b")
    assert json.loads(done.stdout) == [["a", "--b"], str(tmp_path), pyspark.__file__, "__main__"], done.stderr
    assert run("-m", "fails").returncode == 3
    # Anything else goes to the interpreter unchanged (and imports PySpark as Spark's path says).
    done = run(
        "-c", "import sys, pyspark; print(sys.argv[1:], pyspark.__file__.endswith('.zip/pyspark/__init__.py'))", "x"
    )
    assert done.stdout.strip() == "['x'] True", done.stderr


def test_a_local_session_starts_python_with_the_workers_python_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    _local_settings(None)
    assert os.environ["PYSPARK_PYTHON"] == workers_python()
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    _local_settings(None)
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


@pytest.mark.spark
def test_python_workers_import_pyspark_from_the_installed_package(spark) -> None:
    import pyspark

    def where(rows):  # runs in a Python worker, forked by the session's worker daemon
        import sys

        yield sys.modules["pyspark"].__file__, any(p.endswith("pyspark.zip") for p in sys.path)

    assert spark.sparkContext.parallelize([1], 1).mapPartitions(where).collect() == [(pyspark.__file__, False)]

    def frozen(batches):  # a SQL task's worker; the daemon reuses it for the next one, which sees its freeze
        import gc

        import pyarrow as pa

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"frozen": [gc.get_freeze_count()]})

    counts = [spark.range(1).mapInArrow(frozen, "frozen long").collect()[0].frozen for _ in range(2)]
    assert counts[1] > 10_000, counts


@pytest.mark.spark
def test_a_driver_out_of_heap_ends_its_jvm_instead_of_waiting_for_ever() -> None:
    """Issue 71: a stream's first batch over sixty days of history, collected whole for deltalake's commit, ran the
    driver out of heap in Spark's thread that fetches a task's result; that thread died, the task was never marked
    finished, and the stream waited for ever with the JVM idle. Here a collect of one task's 88 MB in a driver of
    512 MB (Spark's least) runs out of heap in that same thread (a collect of 64 MB fits; 120 MB runs the task
    itself out of heap, which ends the JVM by Spark's own handler): the local session's JVM ends
    (features.engine.session.EXIT_ON_OOM), and the collect raises, where it waited for ever (6 runs out of 7)."""
    script = """
from pyspark import SparkContext
from features.engine.session import get_spark
spark = get_spark()
try:
    spark.range(0, 11_000_000, 1, 1).toArrow()
    print("collected")
except Exception as exc:
    print("raised", type(exc).__name__)
print("jvm exited", SparkContext._gateway.proc.wait(60))
"""
    env = {**os.environ, "FEATURES_DRIVER_MEMORY": "512m"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "Terminating due to java.lang.OutOfMemoryError: Java heap space" in done.stdout, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2].startswith("raised ") and done.stdout.splitlines()[-1] == "jvm exited 3"
