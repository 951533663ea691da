"""The SparkSession: reuse an active one (Databricks, notebooks), connect to `SPARK_REMOTE` when it is set (PySpark's
own convention for Spark Connect), else start a small local one.

A Spark Connect session (Databricks serverless and shared clusters) has no SparkContext, RDDs or JVM in this
process: whatever the package does with a session it was given goes through the helpers below, which take the
Connect way when `is_connect(spark)`."""

from __future__ import annotations

import functools
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from features.engine import jars
from features.engine.jvm_archive import java_options, making
from features.engine.jvm_output import start_jvm
from features.engine.worker_daemon import workers_python
from features.errors import EnvironmentProblem

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)
CONCURRENT_WRITERS = 8  # a local session's files open at once per write task (dates of a nightly backfill and more)
JAVA_HELP = (
    "Spark needs Java 17 or newer. Install it (Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`; "
    "macOS: `brew install openjdk@17`) and make sure `java` is on PATH or JAVA_HOME is set."
)
# Errors-only logging for the local session started here (Spark's default logs INFO/WARN lines at startup), without
# the executor's copy of a failed task's Java trace: the error reaches the Python caller, and the files the source
# reads on purpose to see whether Spark can are reported in one line (see the file's comments).
LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")


@functools.cache
def java_description() -> str | None:
    """What `java -version` prints for the Java that Spark would start, or None if there is none."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    return f"{java}\n" + subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr


def java_version() -> int | None:
    """The major version of the Java that Spark would start, or None if there is none."""
    out = java_description()
    if out is None:
        return None
    for token in out.split("\n", 1)[-1].replace('"', " ").split():
        head = token.split(".")[0]
        if head.isdigit() and ("." in token or token.isdigit()):
            major = int(head)
            return int(token.split(".")[1]) if major == 1 else major
    return None


def check_java() -> None:
    version = java_version()
    if version is None:
        raise EnvironmentProblem(f"Java was not found. {JAVA_HELP}")
    if version < 17:
        raise EnvironmentProblem(f"Java {version} was found. {JAVA_HELP}")


# A local session's JVM ends when it runs out of heap, so that the command fails instead of waiting for ever. Spark
# fetches and deserializes each task's result in a thread of its own ("task-result-getter"), which catches only
# non-fatal errors: an OutOfMemoryError there ends that thread, the task is never marked finished, and its job (a
# collect to Python) waits for ever, with no task running and the JVM idle (issue 71: a stream's first batch of
# sixty days collected for deltalake's commit). Spark does not catch OutOfMemoryError on purpose and leaves it to
# the JVM's options (SPARK-5687, apache/spark#4474, closed unmerged; SPARK-47279, apache/spark#45385, likewise).
# `-XX:-ExitOnOutOfMemoryError` in FEATURES_JAVA_OPTIONS turns it off.
EXIT_ON_OOM = "-XX:+ExitOnOutOfMemoryError"

# Settings the package relies on for correct results, applied to every session it uses (also an active one).
REQUIRED_CONF = {
    "spark.sql.session.timeZone": "UTC",  # epoch-aligned windows mean the same thing everywhere
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",  # not the deprecated INT96
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # With adaptive execution, a union of key-partitioned inputs that claims their partitioning gave duplicate
    # (key, window_end) rows in Spark 4.3: the engines' unions must be re-partitioned by Spark itself.
    "spark.sql.unionOutputPartitioning": "false",
}


def is_connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect client session. Decided by its class, not `is_remote()`: a process may
    hold both kinds (a test run), and importing the Connect module here would slow every classic start."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def is_local(spark: SparkSession) -> bool:
    """Whether `spark` is a classic session in local mode on a machine of its own: its driver is the machine that
    computes, so rows collected there crossed no network, and a table's path is on the driver's own disk. Not on
    Databricks, whose single-node clusters run in local mode over cloud storage mounted in the driver."""
    if is_connect(spark) or "DATABRICKS_RUNTIME_VERSION" in os.environ:
        return False
    return spark.sparkContext.master.startswith("local")


def is_stopped(spark: SparkSession) -> bool:
    """Whether `spark` was stopped since (a notebook may stop the session a helper thread started)."""
    if is_connect(spark):
        return bool(spark.is_stopped)  # type: ignore[attr-defined]
    return spark.sparkContext._jsc is None


def cancel_all(spark: SparkSession) -> None:
    """Cancel the session's running Spark jobs (Ctrl-C): `interruptAll` on Connect, the SparkContext's
    `cancelAllJobs` otherwise."""
    if is_connect(spark):
        spark.interruptAll()
    else:
        spark.sparkContext.cancelAllJobs()


def apply_required_conf(spark: SparkSession) -> None:
    """Set REQUIRED_CONF where the session differs. Only differing values are set: a shared or serverless cluster
    may refuse to set a setting at all, even to the value it already has."""
    for key, value in REQUIRED_CONF.items():
        if spark.conf.get(key, None) != value:
            spark.conf.set(key, value)


def cores(spark: SparkSession) -> int:
    """How many tasks the session runs at once."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except (AttributeError, NotImplementedError):  # Spark Connect has no SparkContext: its shuffle partitions
        return int(spark.conf.get("spark.sql.shuffle.partitions") or 1)


def get_spark(
    app_name: str = "features", shuffle_partitions: int | None = None, *, long_running: bool = False
) -> SparkSession:
    """The active SparkSession if there is one (Databricks, notebooks, spark-submit; a Spark Connect session
    there too), else a Spark Connect session to `SPARK_REMOTE` when it is set, else a local one.

    `long_running`: a local session for a process that runs until stopped (a live stream), whose JVM takes its
    whole heap when it starts (`_local_settings`)."""
    from features.engine.runtime import check_pyspark

    check_pyspark()  # a PySpark this version does not support stops here, naming it and the fix
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()  # under Spark Connect (is_remote()), the active Connect session
    if active is not None:
        apply_required_conf(active)
        return active
    settings = {"spark.app.name": app_name, **REQUIRED_CONF}
    if shuffle_partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        # The builder connects by itself; a master or driver settings would be refused (the server has its own).
        # `SPARK_REMOTE=local[N]` starts a Connect server in this process: it gets the local defaults.
        if remote.startswith("local"):
            settings.update(_local_settings(shuffle_partitions, master=False, long_running=long_running)[0])
        spark = SparkSession.builder.config(map=settings).getOrCreate()
        apply_required_conf(spark)  # a session that already existed does not take the builder's settings
        return spark
    making_archive = False
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        # This process starts the JVM itself; under spark-submit the user's master and memory settings stand.
        local, making_archive = _local_settings(shuffle_partitions, long_running=long_running)
        settings.update(local)
        if not debugging():  # at DEBUG, all that Spark and its workers print
            start_jvm(settings)
    spark = SparkSession.builder.config(map=settings).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if making_archive:
        threading.Thread(target=_fill_archive, args=(spark,), name="jvm-archive", daemon=True).start()
    return spark


_EARLY: list[Future[SparkSession]] = []  # the session being started by `start_early`, once per process


def start_early(long_running: bool = False) -> None:
    """Start the local session in a daemon thread now, in a process that has none yet (a command's), so that the
    JVM starts while this process goes on (loading the repo, planning, setting up MLflow): a cold job waits for it
    the least. A start never used costs nothing more: the process does not wait for the thread when it exits. Not
    under Spark Connect, whose active session is the calling thread's."""
    from pyspark import SparkContext

    if _EARLY or SparkContext._active_spark_context is not None or _remote():
        return

    future: Future[SparkSession] = Future()

    def start() -> None:
        try:
            future.set_result(get_spark(long_running=long_running))
        except BaseException as exc:  # raised where the session is waited for
            future.set_exception(exc)

    threading.Thread(target=start, name="spark-start", daemon=True).start()
    _EARLY.append(future)


def session_soon(spark: SparkSession | None, long_running: bool = False) -> Callable[[], SparkSession]:
    """A function returning `spark`, or else the session `get_spark` gives, started now (`start_early`)
    when there is no active one yet: the caller does its own set-up meanwhile."""
    if spark is not None:
        return lambda: spark
    start_early(long_running)
    if not _EARLY:
        return functools.partial(get_spark, long_running=long_running)

    def started() -> SparkSession:
        session = _EARLY[0].result()
        if is_stopped(session) or _remote():  # stopped since (a notebook), or Spark Connect since: the caller's
            return get_spark(long_running=long_running)
        _cancel_jobs_on_interrupt(session)
        return session

    return started


def _remote() -> bool:
    """Whether this process uses Spark Connect (PySpark's Connect mode, or SPARK_REMOTE set)."""
    from pyspark.sql.utils import is_remote

    return is_remote() or bool(os.environ.get("SPARK_REMOTE"))


def _cancel_jobs_on_interrupt(spark: SparkSession) -> None:
    """What PySpark does when the main thread starts the session (here a helper thread did): Ctrl-C cancels the
    running Spark jobs, then raises KeyboardInterrupt."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return

    def interrupted(signum: int, frame: object) -> None:
        try:
            cancel_all(spark)
        finally:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)


def make_class_archive(timeout_s: float = 300.0) -> bool:
    """Make the JVM class archive (features.engine.jvm_archive) now, if this Java and PySpark have none yet:
    start a local session, run the jobs that fill it, stop the JVM and wait until it has written the archive.
    Returns whether it made one. For set-up scripts (`./dev test` calls it before the tests, so that every
    session of the run starts with the archive, not only those after the first one ends)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:  # a session runs in this process: nothing to make here
        return False
    settings, making = _local_settings(None)
    if not making:
        return False
    spark = SparkSession.builder.config(map={"spark.app.name": "features-class-archive", **settings}).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _fill_archive(spark)
    gateway = SparkContext._gateway
    spark.stop()
    process = getattr(gateway, "proc", None)  # the JVM PySpark started; it exits when its stdin closes
    gateway.shutdown()
    SparkContext._gateway = SparkContext._jvm = None
    if process is not None:
        process.stdin.close()
        process.wait(timeout_s)  # the JVM writes the archive as it exits
    packages = [str(jar) for jar in jars.class_path(_pyspark_version())]
    options = java_options(java_description() or "", packages)  # turns the complete file into the archive
    return bool(options) and options[0].startswith("-XX:SharedArchiveFile=")


def _fill_archive(spark: SparkSession) -> None:
    """Load the classes of the offline table's writes and reads into the JVM whose exit makes the class archive
    (features.engine.jvm_archive): the first session may be one that never touches a Delta table (e.g.
    `features apply`), and every later one would then load Delta's classes from its jars, measured at a
    third of a second per process. A few small jobs in a scratch folder, once per installation. (A change to
    what this loads raises jvm_archive.FILL_VERSION, so that archives made before are made again.)"""
    from pyspark.sql import functions as F

    try:
        with tempfile.TemporaryDirectory(prefix="features-archive-") as scratch:
            table = str(Path(scratch) / "table")
            rows = spark.range(4).select(F.col("id"), F.current_date().alias("date"))
            rows.write.format("delta").partitionBy("date").save(table)
            later = rows.where("id >= 2")
            later.write.format("delta").mode("overwrite").option("replaceWhere", "id >= 2").save(table)
            spark.read.format("delta").load(table).where("id > 0").count()
    except Exception as exc:  # the session may stop first (a short command): the archive then holds less
        logger.debug("filling the JVM class archive stopped: %s", exc)


CHECKPOINT_FILES = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def _local_settings(
    shuffle_partitions: int | None, master: bool = True, long_running: bool = False
) -> tuple[dict[str, str], bool]:
    """The settings of a local session, and whether its JVM makes the class archive at its exit."""
    check_java()
    # Local workers must run this interpreter (with this package and its dependencies), not `python3` on PATH, and
    # import PySpark from its package (features.engine.worker_daemon).
    os.environ.setdefault("PYSPARK_PYTHON", workers_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cpus = os.cpu_count() or 2
    memory = os.environ.get("FEATURES_DRIVER_MEMORY", "4g")
    settings: dict[str, str] = {}
    if master:
        settings["spark.master"] = os.environ.get("FEATURES_SPARK_MASTER", f"local[{cpus}]")
    settings |= {
        "spark.sql.shuffle.partitions": str(shuffle_partitions or max(4, cpus * 2)),
        "spark.driver.memory": memory,
        # Off unless asked: the UI costs a start its server (and a port), and Spark's console bar would cut into
        # the package's own progress lines.
        "spark.ui.enabled": spark_ui(),
        "spark.ui.showConsoleProgress": spark_ui(),
        # Unless this is Int.MaxValue, Spark measures the open Arrow batch after every row it sends to Python
        # (the kernel's input): 16% of the kernel stage. Batches stay bounded by maxRecordsPerBatch (10,000 rows).
        "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
        # A batch's change points are cached while they are validated, then written from the cache: the cache's
        # compression is work on both sides of it, and validation's cost against the batch without it went from
        # 1.20x to 1.12x (bench/quality.py) uncompressed. A local batch's rows fit in memory either way.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # Spark keeps the classes it generates and compiles for a plan in a cache of 100 by default. A stream of
        # three groups plans some 90 per round of micro-batches (its kernel, screen, writes), so that each batch
        # found its classes evicted and compiled them again, and Java compiled those anew: a quarter of the JVM's
        # work. Ten times as many keep every batch after the first compiling almost nothing.
        "spark.sql.codegen.cache.maxEntries": "1000",
        # A task's rows go to the files of the dates they hold (the offline table's partitions). Spark sorts each
        # task's rows by date first, to keep one file open at a time; with a writer open per date it does not
        # sort, unless a task holds more dates than this (it then sorts the rest). Writing a 3-day backfill's 2M
        # rows took 2.5 / 3.1 s instead of 3.4 / 3.8 s (bench/startup.py's nightly job, the commit's write job).
        "spark.sql.maxConcurrentOutputFileWriters": str(CONCURRENT_WRITERS),
        # PySpark's worker daemon, importing PySpark from its package rather than from the zip Spark puts first on
        # the workers' path (features.engine.worker_daemon): a cold process's first batch waited 2 s for each
        # daemon and 1 s for each worker to compile PySpark from source. `pyspark.daemon` is PySpark's own.
        "spark.python.daemon.module": os.environ.get("FEATURES_PYTHON_DAEMON", "features.engine.worker_daemon"),
        # A stream's checkpoint files (offsets, commits, the file source's log, each state store's changelog) are
        # written to a temporary file and renamed. Spark's default renames through Hadoop's FileContext, which on a
        # local disk forks a `readlink` process for each path it renames (Hadoop's native library is not in
        # PySpark): some 16 processes of 10-30 ms a micro-batch, in the tasks and in the stream's own thread. Its
        # FileSystem-based manager renames with the operating system's rename, atomic on a local disk: a steady
        # batch of the one-count group took 2.09-2.13 s instead of 2.34-2.40 (bench/stream_profile.py, 3 pairs).
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILES,
    }
    # The Kafka connector (and Delta Lake) on the class path of the JVM itself, not added later as spark.jars:
    # nothing is copied per session, and the class archive below holds their classes too.
    packages = [str(jar) for jar in jars.class_path(_pyspark_version())]
    settings["spark.driver.extraClassPath"] = os.pathsep.join(packages)
    settings["spark.executor.extraClassPath"] = os.pathsep.join(packages)
    settings |= jars.DELTA_CONF
    # Delta replays its log with this many tasks (50 by default), and VACUUM lists a table's folders with this many
    # (10,000 by default: 19 s of empty tasks on 2 cores): a few suit a local session's cores.
    settings["spark.databricks.delta.snapshotPartitions"] = str(max(2, cpus))
    settings["spark.sql.sources.parallelPartitionDiscovery.parallelism"] = str(max(2, cpus))
    # Ours keeps Spark's log to errors without the traces the package reports in one line; at Python's DEBUG
    # (`--log-level debug`), Spark's own profile, traces included.
    quiet = LOG4J2_CONFIG.is_file() and not debugging()
    options = [f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"] if quiet else []
    archive = java_options(java_description() or "", packages)
    options += archive
    options.append(EXIT_ON_OOM)
    extra = shlex.split(os.environ.get("FEATURES_JAVA_OPTIONS", ""))  # docs/operations.md: local sessions
    if long_running and not any(o.startswith(("-Xms", "-XX:+AlwaysPreTouch", "-XX:-AlwaysPreTouch")) for o in extra):
        # A process that runs for months takes its whole heap at the start, as Spark's standalone executors, Kafka's
        # brokers and Elasticsearch do: else Java's collector grows the heap in steps over the first quarter of an
        # hour or more, and the process's memory keeps rising long after its work has stopped growing
        # (docs/streaming.md, "Running a stream for months").
        options += [f"-Xms{memory}", "-XX:+AlwaysPreTouch"]
    options += extra
    if options:
        settings["spark.driver.extraJavaOptions"] = " ".join(_quoted(o) for o in options)
    if extra:  # the executors of a local-cluster master are JVMs of their own
        settings["spark.executor.extraJavaOptions"] = " ".join(_quoted(o) for o in extra)
    return settings, making(archive)


def spark_ui() -> str:
    """Spark's setting for its web UI and console progress bar in a local session: on ("true") when
    FEATURES_SPARK_UI asks for them."""
    return "true" if os.environ.get("FEATURES_SPARK_UI", "").strip().lower() in ("1", "true", "yes") else "false"


def debugging() -> bool:
    """Whether Python's logging is at DEBUG (`--log-level debug`): Spark's errors then show with their traces."""
    return logging.getLogger().isEnabledFor(logging.DEBUG)


def _pyspark_version() -> tuple[int, int]:
    import pyspark

    from features.engine.runtime import parse_version

    return parse_version(pyspark.__version__) or (0, 0)


def _quoted(option: str) -> str:
    """An option as Spark splits extraJavaOptions (a path may hold a space)."""
    return f'"{option}"' if " " in option else option
