"""Where a steady micro-batch's time goes: the stream's sink timed stage by stage, Spark's own phases, and the
Python workers sampled.

    python bench/stream_profile.py [--shape dense|group|count|big] [--measured-files 12] [--py-spy]

`--shape dense` is bench/stream_dense.py's full run (3,000 keys, an event per key per second, files of 20 s, count /
sum / max over `Hop("1h", every="1s")`, an hour taken up first so that the windows are full); `--shape group` is
bench/stream.py's 5-feature group `user_transactions` (10,000 keys, files of 500,000 events), `--shape count` its
one count over `Hop("24h", every="5m")` on the same files, `--shape big` that count over 1,000,000 keys
(bench/stream.py's state-size run). Each streams one file per micro-batch through the product's whole path
(validation, statistics, offline table, SQLite online store; tracking off). Printed, over the steady batches (those
after the first two): Spark's phases of a trigger (the query progress's durationMs: addBatch is the sink's
foreachBatch, the rest Spark's bookkeeping), the median and slowest trigger, the offline table's compaction rounds
(each one's seconds, in a batch or beside the batches), the sink's stages (its functions timed on the driver; the
first Spark job, which computes the stateful operator's output, runs inside "screen"), the stateful operator's
metrics, each Spark stage of the last batch, and with `--py-spy` the Python workers' CPU time by part (py-spy's
samples of every worker).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from features.engine.session import get_spark
from features.pipelines.stream import aside, stream
from features.pipelines.stream import sink as sink_module
from features.pipelines.stream.aside import SetAside
from features.repo import Repo
from features.stores import compaction, offline

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stream as stream_bench
import stream_dense

WORK = Path(__file__).resolve().parent / "work-profile"
ROUNDS = "compaction round"
SPENT: dict[str, list[float]] = collections.defaultdict(list)  # stage -> seconds, one per call
# Python workers' frames -> the part of a batch they belong to (the first match along the stack, innermost first).
WORKER_PARTS = [
    ("<frozen importlib", "worker start: imports"),  # first: importlib's `_load_unlocked` frames contain "_load"
    ("_pack", "pack: events per bucket into Arrow IPC (mapInArrow)"),
    ("_unpack", "processor: unpack the events"),
    ("._load (", "processor: state read"),
    ("_write_chunks", "processor: state write"),
    ("_compact", "processor: state write"),
    ("_step", "processor: step (phase 1 + 2, kernel)"),
    ("handleInputRows", "processor: other"),
    ("handleExpiredTimer", "processor: other"),
    ("transformwithstate", "transformWithState: Arrow in/out, state API"),
    ("stateful_processor", "transformWithState: Arrow in/out, state API"),
    ("screen", "validation screen (pandas)"),
    ("profil", "statistics (pandas)"),
    ("serializers", "Arrow in/out (PySpark serializers)"),
    ("worker", "worker other"),
]


def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT[name].append(time.perf_counter() - began)

    return wrapper


def instrument() -> None:
    """The sink's stages timed where the sink calls them (module attributes and methods, wrapped once; those an
    earlier version has, too, where it has them)."""
    for name, label in (
        ("_stats", "the buckets' stats collected (before they came with the screen)"),
        ("write_online", "online write (SQLite)"),
        ("record_batch_statistics", "statistics recorded"),
        ("record_emitted", "watermark noted in the checkpoint"),
    ):
        if hasattr(sink_module, name):
            setattr(sink_module, name, timed(label, getattr(sink_module, name)))
    screen = timed("screen: the batch computed (stateful operator), screened", sink_module.BatchSink._screen_kinds)
    sink_module.BatchSink._screen_kinds = screen  # type: ignore[method-assign]
    offline.append_batch = timed("offline append (Delta)", offline.append_batch)
    compaction.compact = timed(ROUNDS, compaction.compact)  # in a batch, or beside the batches (since 71272c9)
    aside.write_late = timed("late events written", aside.write_late)
    for cls, names in (
        (sink_module.BatchSink, ("_batch", "_eager_valid", "_rows_valid", "_publish", "_report")),
        (SetAside, ("write", "sweep", "_write_bad", "_set_aside_unreadable_files")),
    ):
        for name in names:
            setattr(cls, name, timed(f"{cls.__name__}.{name}", getattr(cls, name)))


def dense_repo(args: argparse.Namespace) -> Repo:
    stream_dense.WORK = WORK
    events = WORK / "dense_events"
    stream_dense.land(events, args.keys, 0, args.fill_minutes * 60, args.file_seconds)
    repo = stream_dense.make_repo("dense", events)
    print(f"filled {args.fill_minutes} min in {stream_dense.fill(repo, max(1, 300 // args.file_seconds)):.0f} s")
    stream_dense.land(events, args.keys, args.fill_minutes * 60, args.measured_files * args.file_seconds, 20)
    return repo


def group_repo(args: argparse.Namespace) -> Repo:
    stream_bench.WORK = WORK
    WORK.mkdir(parents=True, exist_ok=True)
    users = 1_000_000 if args.shape == "big" else 10_000
    return stream_bench.shape_repo("group" if args.shape == "group" else "count", args.measured_files, users)


def sample_workers(seconds: int, out: Path, spies: list[subprocess.Popen[bytes]]) -> Callable[[], None]:
    """py-spy over each Python worker daemon (and the workers it forks) for `seconds`, each from when it is up: a
    thread adds a py-spy to `spies` for every daemon it finds (the stateful operator's may start after the
    others) until the function returned is called."""
    command = ["py-spy", "record", "--subprocesses", "--nonblocking", "-f", "raw", "-r", "50", "-d", str(seconds)]
    stop = threading.Event()

    def watch() -> None:
        seen: set[str] = set()
        while not stop.wait(0.1):
            for pid in [p for p in os.listdir("/proc") if p.isdigit() and p not in seen and _is_daemon(p)]:
                seen.add(pid)
                spies.append(subprocess.Popen([*command, "-o", f"{out}.{pid}", "-p", pid], stdout=subprocess.DEVNULL))

    def stopped() -> None:
        stop.set()
        thread.join()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return stopped


def _is_daemon(pid: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        ppid = Path(f"/proc/{pid}/stat").read_text().split()[3]
        parent = Path(f"/proc/{ppid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"features.engine.worker_daemon" in cmd and b"java" in parent.split(b"\0")[0]


def worker_parts(raw: Path) -> dict[str, int]:
    """py-spy's collapsed stacks summed by part (WORKER_PARTS); samples."""
    parts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        part = next(
            (label for frame in reversed(frames) for key, label in WORKER_PARTS if key in frame), "worker other"
        )
        parts[part] += int(count)
    return parts


def spark_stages(spark: Any, since_ms: int) -> dict[str, tuple[float, float, int]]:
    """Spark's stages (from its status store, which runs without the UI) submitted at `since_ms` or later, by
    call site: (wall seconds from submission to completion, task seconds, stages)."""
    found: dict[str, tuple[float, float, int]] = {}
    for stage, began, ended in completed_stages(spark, since_ms):
        wall, tasks, n = found.get(stage.name(), (0.0, 0.0, 0))
        found[stage.name()] = (wall + (ended - began) / 1000, tasks + stage.executorRunTime() / 1000, n + 1)
    return found


def completed_stages(spark: Any, since_ms: int) -> Iterator[tuple[Any, int, int]]:
    """Spark's completed stages submitted at `since_ms` or later (from its status store, which runs without the
    UI): (stage, submitted ms, completed ms)."""
    jvm, context = spark._jvm, spark.sparkContext
    empty = jvm.java.util.Collections.emptyList()
    listed = (
        context._jsc.sc().statusStore().stageList(empty, False, False, context._gateway.new_array(jvm.double, 0), empty)
    )
    return completed(listed.iterator(), since_ms)


def completed(entries: Any, since_ms: int) -> Iterator[tuple[Any, int, int]]:
    """The entries (stages or jobs: a Java iterator of Spark's status store) submitted at `since_ms` or later that
    have completed: (entry, submitted ms, completed ms)."""
    while entries.hasNext():
        entry = entries.next()
        if entry.submissionTime().isEmpty() or entry.completionTime().isEmpty():
            continue
        began, ended = entry.submissionTime().get().getTime(), entry.completionTime().get().getTime()
        if began >= since_ms:
            yield entry, began, ended


def started_ms(progress: dict[str, Any]) -> int:
    """When a micro-batch started (its query progress's `timestamp`), in ms since the epoch."""
    return int(datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp() * 1000)


def print_state_operator(steady: list[dict[str, Any]]) -> None:
    """The stateful operator's own metrics (the query progress's `stateOperators`), averaged over the steady batches."""
    sums: collections.Counter[str] = collections.Counter()
    for p in steady:
        for op in p.get("stateOperators", []):
            sums.update({k: v for k, v in op.items() if isinstance(v, int | float)})
            sums.update({f"custom {k}": v for k, v in op.get("customMetrics", {}).items()})
    print("| state operator metric | per batch |\n|---|---|")
    for name, total in sorted(sums.items()):
        print(f"| {name} | {total / len(steady):,.1f} |")


def print_last_batch_stages(spark: Any, last: dict[str, Any]) -> None:
    """Each Spark stage of the last steady batch on its own: tasks, wall and task seconds, CPU, bytes moved."""
    since = started_ms(last)
    rows = []
    for stage, began, ended in completed_stages(spark, since):
        rows.append(
            (
                stage.stageId(),
                stage.numTasks(),
                (ended - began) / 1000,
                stage.executorRunTime() / 1000,
                stage.executorCpuTime() / 1e9,
                stage.inputBytes() / 1e6,
                stage.shuffleReadBytes() / 1e6,
                stage.shuffleWriteBytes() / 1e6,
                stage.outputBytes() / 1e6,
                began - since,
                stage.executorDeserializeTime() / 1000,
            )
        )
    print(
        "| stage | tasks | starts at s | wall s | task s | CPU s | deserialize s | input MB | shuffle read MB | "
        "shuffle write MB | output MB |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for sid, tasks, wall, run, cpu, inp, sr, sw, out, at, des in sorted(rows):
        print(
            f"| {sid} | {tasks} | {at / 1000:.2f} | {wall:.3f} | {run:.3f} | {cpu:.3f} | {des:.3f} | {inp:.1f} | "
            f"{sr:.1f} | {sw:.1f} | {out:.1f} |"
        )
    print_last_batch_jobs(spark, since)


def print_last_batch_jobs(spark: Any, since: int) -> None:
    """Each Spark job of the last steady batch: when it was submitted and how long it took to complete, against
    the time its stages ran (the rest is the job's own cost on the driver: planning aside, scheduling and the
    result's way back)."""
    jobs = completed(spark.sparkContext._jsc.sc().statusStore().jobsList(None).iterator(), since)
    found = [(job.jobId(), job.stageIds().length(), began - since, ended - began) for job, began, ended in jobs]
    print("| job | stages | submitted at s | wall s |\n|---|---|---|---|")
    for jid, stages, at, wall in sorted(found):
        print(f"| {jid} | {stages} | {at / 1000:.2f} | {wall / 1000:.3f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("dense", "group", "count", "big"), default="dense")
    parser.add_argument("--keys", type=int, default=3000)
    parser.add_argument("--file-seconds", type=int, default=20)
    parser.add_argument("--fill-minutes", type=int, default=60)
    parser.add_argument("--measured-files", type=int, default=12)
    parser.add_argument("--py-spy", action="store_true", help="sample the Python workers over the measured run")
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    spark = get_spark()
    repo = dense_repo(args) if args.shape == "dense" else group_repo(args)
    instrument()
    SPENT.clear()
    raw = WORK / "workers.txt"
    spies: list[subprocess.Popen[bytes]] = []
    began = time.perf_counter()
    run = stream(repo, available_now=True, max_files_per_trigger=1, progress=False, tracking=False)
    stop_sampling = sample_workers(600, raw, spies) if args.py_spy else None
    run.await_termination()
    if stop_sampling is not None:
        stop_sampling()
    wall = time.perf_counter() - began
    for spy in spies:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled when interrupted
        spy.wait()
    query = next(iter(run.queries.values()))
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    steady = batches[2:]
    n = len(steady)
    phases: collections.Counter[str] = collections.Counter()
    for p in steady:
        phases.update(p["durationMs"])
    trigger = phases["triggerExecution"] / 1000 / n
    print(f"{args.shape}: {len(batches)} batches, {wall:.1f} s; steady: {n} batches, {trigger:.3f} s a trigger")
    triggers = sorted(p["durationMs"]["triggerExecution"] / 1000 for p in steady)
    rounds = ", ".join(f"{s:.2f} s" for s in SPENT.get(ROUNDS, [])) or "none"
    print(f"steady triggers: median {triggers[n // 2]:.3f} s, slowest {triggers[-1]:.3f} s; compaction rounds {rounds}")
    print("| Spark phase | s per batch | share |\n|---|---|---|")
    for name, ms in phases.most_common():
        print(f"| {name} | {ms / 1000 / n:.3f} | {ms / 1000 / n / trigger:.0%} |")
    since = started_ms(steady[0])
    stages = spark_stages(spark, since)
    print("| Spark stage (call site) | wall s per batch | task s per batch | stages per batch |\n|---|---|---|---|")
    for name, (wall, tasks, count) in sorted(stages.items(), key=lambda kv: -kv[1][0]):
        print(f"| {name} | {wall / n:.3f} | {tasks / n:.3f} | {count / n:.1f} |")
    print("| sink stage | s per batch | share of a trigger |\n|---|---|---|")
    stages_timed = {name: seconds for name, seconds in SPENT.items() if name != ROUNDS}  # rounds: above
    for name, seconds in sorted(stages_timed.items(), key=lambda kv: -sum(kv[1][2:])):
        per = sum(seconds[2:]) / max(1, len(seconds) - 2)  # steady calls (a stage may not run in every batch)
        print(f"| {name} | {per:.3f} | {per / trigger:.0%} | ({len(seconds)} calls)")
    print_state_operator(steady)
    print_last_batch_stages(spark, steady[-1])
    if spies:
        parts: collections.Counter[str] = collections.Counter()
        for sampled in WORK.glob("workers.txt.*"):
            parts.update(worker_parts(sampled))
        total = sum(parts.values())
        # 50 samples a second per process: samples / 50 = CPU seconds over the whole run, all batches
        print("| Python workers, whole run | CPU s | share |\n|---|---|---|")
        for part, count in parts.most_common():
            print(f"| {part} | {count / 50:.2f} | {count / total:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
