"""Soak: a live stream fed for a long time, with event time running many times faster than the wall clock.

    python bench/soak.py [--catch-up-minutes 20] [--live-minutes 5] [--days 30] [--events-per-file 2000]

The demo repo's two groups (user_transactions, card_merchant: counts with a filter, sums, max, an HLL, last_k,
Lifetime counts over 1h/5m and 24h/5m windows) run as `features stream --trigger 1s` in a process of their own,
with MLflow tracking on, as a continuous job runs them. A loader lands one Parquet file every second. For
`--catch-up-minutes` its events' times run from `--days` ago up to now (30 days in 20 minutes: 2,160 times the wall
clock), then for `--live-minutes` they are stamped with the current time. Halfway through, the stream is killed
(SIGKILL) and started again. Every 5 s the bench samples the offline table's files per date partition, the size
of the checkpoints, the stream's driver and worker RSS and the batches' durations (from its progress lines).

At the end the loader stops, the live stream takes up what landed (a last `--available-now` run drains it where the
stream had not within 2 minutes), and the bench checks:
- nothing was set aside (no late event, no quarantined record: every event is good and in order);
- the offline table equals a backfill of the same range into a second table, row for row, and
  `features verify` finds the online store and the offline table consistent with a recompute;
- driver RSS, worker RSS and batch duration are flat: the last quarter's median within 15% of the second's;
- files per date partition <= 32;
- a training set read from the soaked table takes at most 1.5x the time of the same read from the backfill's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import load, update_section

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("user_transactions", "card_merchant")
BATCH_LINE = re.compile(r"^(\S+) batch (\d+): ([\d,]+) events in ([\d.]+)s")
FILES_BOUND = 32
FLAT = 0.15


def make_repo(work: Path, apply: Callable[[Path], object] | None = None) -> Path:
    """The demo's feature repo (its definitions and feature_store.yaml) in `work`, applied (by `features apply` in a
    process of its own unless `apply(repo)` is given)."""
    shutil.rmtree(work, ignore_errors=True)
    repo = work / "repo"
    shutil.copytree(ROOT / "feature_repo", repo, ignore=shutil.ignore_patterns("data", "__pycache__"))
    (repo / "data" / "transactions").mkdir(parents=True)
    _apply(repo, apply)
    return repo


def _apply(repo: Path, apply: Callable[[Path], object] | None) -> None:
    """`apply(repo)` when given, else `features apply` in a process of its own."""
    if apply is not None:
        apply(repo)
    else:
        subprocess.run(_features("apply", "--repo", str(repo)), check=True, capture_output=True)


def _features(*args: str) -> list[str]:
    return [sys.executable, "-m", "features.cli", *args]


@dataclass
class Feeder:
    """Lands a file a second; event time runs from `start` to the wall clock over `catch_up_s`, then live."""

    source: Path
    start: pd.Timestamp
    catch_up_s: float
    events_per_file: int
    users: int = 2000
    landed: list[pd.DataFrame] = field(default_factory=list)
    last: Path | None = None  # the file landed last
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(11))

    def event_time(self, elapsed_s: float) -> pd.Timestamp:
        now = pd.Timestamp.now(tz="UTC")
        if elapsed_s >= self.catch_up_s:
            return now
        return self.start + (now - self.start) * (elapsed_s / self.catch_up_s)

    def run(self, stop: threading.Event, began: float) -> None:
        previous = self.event_time(0.0)
        while not stop.is_set():
            tick = time.time()
            current = self.event_time(tick - began)
            self.land(previous, max(current, previous + pd.Timedelta(microseconds=1)))
            previous = current
            stop.wait(max(0.0, 1.0 - (time.time() - tick)))

    def land(self, lo: pd.Timestamp, hi: pd.Timestamp) -> None:
        n, rng = self.events_per_file, self.rng
        offsets = np.sort(rng.random(n)) * (hi - lo).value
        frame = pd.DataFrame(
            {
                "txn_id": [f"t{len(self.landed)}-{i}" for i in range(n)],
                "user_id": np.char.add("u", rng.integers(0, self.users, n).astype(str)),
                "card_id": np.char.add("c", rng.integers(0, self.users, n).astype(str)),
                "merchant_id": np.char.add("m", rng.integers(0, 50, n).astype(str)),
                "amount": np.round(rng.gamma(2.0, 30.0, n), 2),
                "status": rng.choice(["OK", "OK", "OK", "FAILED"], n),
                "event_ts": (lo + pd.to_timedelta(offsets.astype(np.int64), unit="ns")).astype("datetime64[us, UTC]"),
                "is_fraud": rng.integers(0, 2, n),
            }
        )
        name = f"part-{len(self.landed):07d}.parquet"
        hidden = self.source / f".{name}"
        frame.to_parquet(hidden, index=False)
        os.replace(hidden, self.source / name)
        self.landed.append(frame)
        self.last = self.source / name


@dataclass
class Sample:
    at: float
    files_per_partition: int
    checkpoint_bytes: int
    driver_rss: int
    worker_rss: int
    old_generation: int | None  # bytes of the driver's heap in its old generation (jstat), where Java has jstat


def _driver(pid: int) -> Any:
    """The stream's JVM (a psutil.Process), or None."""
    import psutil

    try:
        return next((p for p in psutil.Process(pid).children(recursive=True) if "java" in p.name()), None)
    except psutil.NoSuchProcess:
        return None


def _old_generation(pid: int) -> int | None:
    """The driver's heap in use in its old generation (`jstat -gc`'s OU). A heap taken whole at the start keeps the
    RSS flat whatever it holds: this is what grows if the stream keeps objects it should let go."""
    driver, jstat = _driver(pid), shutil.which("jstat")
    if driver is None or jstat is None:
        return None
    out = subprocess.run([jstat, "-gc", str(driver.pid)], capture_output=True, text=True).stdout.split()
    half = len(out) // 2
    columns = dict(zip(out[:half], out[half:], strict=True)) if len(out) % 2 == 0 else {}
    return int(float(columns["OU"]) * 1024) if "OU" in columns else None


def _heap_options(pid: int) -> list[str]:
    """The driver JVM's heap options, as the stream started it."""
    driver = _driver(pid)
    return [] if driver is None else [a for a in driver.cmdline() if a.startswith(("-Xm", "-XX:+AlwaysPreTouch"))]


def _tree_rss(pid: int) -> tuple[int, int]:
    """RSS of the stream's JVM (the driver) and of its Python processes (the CLI's and Spark's workers)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        processes = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    driver = workers = 0
    for p in processes:
        try:
            rss = p.memory_info().rss
            if "java" in p.name():
                driver += rss
            elif p.pid != pid:
                workers += rss
        except psutil.NoSuchProcess:
            continue
    return driver, workers


def _folder_bytes(folder: Path) -> int:
    """The bytes of the files under `folder`, read while the stream writes there: a temporary file it renames or
    deletes between the listing and its size counts nothing."""
    total = 0
    for f in folder.rglob("*") if folder.exists() else []:
        try:
            total += f.stat().st_size if f.is_file() else 0
        except FileNotFoundError:
            continue
    return total


def _max_files(table: Path) -> int:
    """The most data files any date of the offline table has (its current version's files)."""
    from features.stores.offline import files_per_date

    return max(files_per_date(str(table)).values(), default=0)


class Stream:
    """`features stream --trigger 1s` in a process of its own; its progress lines parsed as they come."""

    def __init__(self, repo: Path, log: Path) -> None:
        self.repo, self.log = repo, log
        self.durations: list[tuple[float, float]] = []  # (wall time, batch seconds)
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        command = _features("stream", "--repo", str(self.repo), "--trigger", "1s")
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        threading.Thread(target=self._read, args=(self.process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        with self.log.open("a") as log:
            for line in process.stdout or []:
                log.write(line)
                match = BATCH_LINE.match(line)
                if match and int(match.group(3).replace(",", "")) > 0:
                    self.durations.append((time.time(), float(match.group(4))))

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Wait for the process's first micro-batch with events (the JVM started and the query runs)."""
        seen, deadline = len(self.durations), time.time() + timeout_s
        while len(self.durations) == seen:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the stream exited with {self.process.returncode}; see {self.log}")
            if time.time() > deadline:
                raise RuntimeError(f"the stream ran no batch in {timeout_s:.0f}s; see {self.log}")
            time.sleep(0.2)

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.kill()


def _quarter_ratio(points: list[tuple[float, float]]) -> float | None:
    """The median of the last quarter (by time) over the median of the second quarter."""
    if len(points) < 8:
        return None
    values = [v for _, v in sorted(points)]
    q = len(values) // 4
    second, last = np.median(values[q : 2 * q]), np.median(values[3 * q :])
    return float(last / second) if second else None


def soak(
    work: Path,
    catch_up_min: float,
    live_min: float,
    days: float,
    events_per_file: int,
    drain: Callable[[Path], None] | None = None,
    apply: Callable[[Path], object] | None = None,
) -> dict[str, object]:
    """Run the soak in `work`; returns its measurements (see the module docstring). `apply(repo)` and
    `drain(repo)` (what the live stream left when it stopped) run by default as `features apply` and `features
    stream --available-now` processes; the tests run them in their own session, which costs no JVM start."""
    repo = make_repo(work, apply)
    feeder = Feeder(
        repo / "data" / "transactions",
        pd.Timestamp.now(tz="UTC") - pd.Timedelta(days=days),
        catch_up_min * 60,
        events_per_file,
    )
    stream = Stream(repo, work / "stream.log")
    total_s = (catch_up_min + live_min) * 60
    stop = threading.Event()
    feeder.land(feeder.start - pd.Timedelta(minutes=1), feeder.start)
    stream.start()
    stream.wait_ready()  # the clock starts once the stream runs: a JVM's start is not part of the soak
    began = time.time()
    loader = threading.Thread(target=feeder.run, args=(stop, began), daemon=True)
    loader.start()
    samples: list[Sample] = []
    heap_options: list[str] = []
    killed_at = None
    offline = [repo / "data" / "offline" / g for g in GROUPS]
    while time.time() - began < total_s:
        time.sleep(5)
        assert stream.process is not None
        if stream.process.poll() is not None:
            raise RuntimeError(f"the stream exited with {stream.process.returncode}; see {stream.log}")
        driver, workers = _tree_rss(stream.process.pid)
        samples.append(
            Sample(
                time.time() - began,
                max(_max_files(t) for t in offline),
                _folder_bytes(repo / "data" / "checkpoints"),
                driver,
                workers,
                # Every fourth sample: each `jstat` is a JVM start of its own, on the stream's cores.
                _old_generation(stream.process.pid) if len(samples) % 4 == 0 else None,
            )
        )
        heap_options = heap_options or _heap_options(stream.process.pid)
        if killed_at is None and time.time() - began >= total_s / 2:
            stream.kill()
            killed_at = time.time()
            stream.start()
            stream.wait_ready()
    stop.set()
    loader.join()
    # The live stream takes up what landed before it stops; a draining run (a cold start) only when it did not.
    taken = feeder.last is not None and _taken(repo, feeder.last, stream)
    stream.stop()
    if not taken:
        (drain or _drain_process)(repo)
    events = pd.concat(feeder.landed, ignore_index=True)
    events.to_parquet(work / "events.parquet", index=False)
    # Flatness is judged where batches do the same work: during the catch-up (each file spans the same stretch of
    # event time), after the restart's warm-up. Live batches span a second of event time each: far less work.
    restarted, live_from = total_s / 2 + 30, catch_up_min * 60
    after = [s for s in samples if restarted <= s.at < live_from] or samples
    steady = [(t - began, d) for t, d in stream.durations if restarted <= t - began < live_from] or stream.durations
    return {
        "events": len(events),
        "files_landed": len(feeder.landed),
        "batches": len(stream.durations),
        "batches_before_kill": sum(t < (killed_at or np.inf) for t, _ in stream.durations),
        "samples": samples,
        "max_files_per_partition": max(s.files_per_partition for s in samples),
        "checkpoint_mb": [round(s.checkpoint_bytes / 1e6, 1) for s in samples[:: max(1, len(samples) // 8)]],
        "driver_rss_ratio": _quarter_ratio([(s.at, s.driver_rss) for s in after]),
        "worker_rss_ratio": _quarter_ratio([(s.at, s.worker_rss) for s in after]),
        "old_generation_ratio": _quarter_ratio([(s.at, s.old_generation) for s in after if s.old_generation]),
        "heap_options": heap_options,
        "batch_seconds_ratio": _quarter_ratio(steady),
        "aside": _aside(repo),
        "repo": repo,
        "first": events["event_ts"].min(),
        "last": events["event_ts"].max(),
    }


def _taken(repo: Path, last: Path, stream: Stream, timeout_s: float = 120.0) -> bool:
    """Wait until every group's live query committed a batch that read `last`, the file landed last (Spark's
    file source log in its checkpoint: the files land in order, the log lists those read); False when the stream
    exits or `timeout_s` passes first."""
    queries = [folder / "query" for folder in (repo / "data" / "checkpoints").iterdir()]
    deadline = time.time() + timeout_s
    while not all(_committed(query, last) for query in queries):
        assert stream.process is not None
        if stream.process.poll() is not None or time.time() > deadline:
            return False
        time.sleep(0.5)
    return True


def _committed(query: Path, file: Path) -> bool:
    """Whether a committed batch of the query whose checkpoint is `query` read `file`."""
    from features.engine.source_log import logged_files

    commits = [int(p.name) for p in (query / "commits").glob("*") if p.name.isdigit()]
    return bool(commits) and file.as_uri() in logged_files(query, max(commits))


def _drain_process(repo: Path) -> None:
    command = _features("stream", "--repo", str(repo), "--available-now")
    drained = subprocess.run(command, capture_output=True, text=True)
    (repo.parent / "drain.log").write_text(drained.stdout + drained.stderr)
    if drained.returncode != 0:
        raise RuntimeError(f"the draining run failed:\n{drained.stderr[-3000:]}")


def _aside(repo: Path) -> dict[str, int]:
    """Files set aside: late events and quarantined records or batches, per group."""
    return {group: len(_aside_files(repo, group)) for group in GROUPS}


def _aside_files(repo: Path, group: str) -> list[Path]:
    data = repo / "data"
    return sorted([*(data / "late" / group).rglob("*.parquet"), *(data / "quarantine" / group).rglob("*.parquet")])


def aside_detail(repo: Path) -> str:
    """What was set aside, file by file with its first rows: why a soak that should set nothing aside did."""
    lines = []
    for group in GROUPS:
        for path in _aside_files(repo, group):
            frame = pd.read_parquet(path)
            lines.append(f"{path.relative_to(repo)}: {len(frame)} rows\n{frame.head(3).to_string()}")
        for result in (repo / "data" / "quarantine" / group).rglob("result.json"):  # a failed validation's
            lines.append(f"{result.relative_to(repo)}: {result.read_text()[:2000]}")
    return "\n".join(lines)


def backfill_twin(  # type: ignore[no-untyped-def]
    repo: Path, work: Path, spark, apply: Callable[[Path], object] | None = None
) -> tuple[object, dict[str, tuple[int, int]]]:
    """A copy of the repo whose offline tables a backfill writes over the soaked tables' range (up to the stream's
    final watermark); per group, the soaked rows and how many rows differ between the two tables. `apply` as in
    `soak`."""
    from features.pipelines.backfill import backfill
    from features.pipelines.stream.batch_progress import emitted_watermark
    from features.repo import Repo

    soaked = Repo.load(repo)
    twin_root = work / "twin"
    # Not the registry: Feast's apply would tear down the infrastructure the copied one records, which is the
    # soaked repo's online store tables.
    skipped = shutil.ignore_patterns(
        "offline", "checkpoints", "late", "quarantine", "online_store.db", "registry.db", "mlflow.db", "mlartifacts"
    )
    shutil.copytree(repo, twin_root, ignore=skipped)
    _apply(twin_root, apply)
    twin = Repo.load(twin_root)
    out = {}
    for group in GROUPS:
        watermark = emitted_watermark(Path(soaked.checkpoint_path(group)) / "query")
        assert watermark is not None
        table = spark.read.format("delta").load(soaked.offline_path(group)).drop("date")
        first = table.agg({"window_end": "min"}).collect()[0][0]
        backfill(twin, first, watermark, groups=[group], online=False, progress=False, track=False)
        mine = table.where(table.window_end < watermark)
        theirs = spark.read.format("delta").load(twin.offline_path(group)).drop("date")
        out[group] = (mine.count(), _differing(mine, theirs.where(theirs.window_end < watermark), soaked, group))
    return twin, out


def _differing(mine, theirs, repo, group: str) -> int:  # type: ignore[no-untyped-def]
    """Rows of either table without an equal row in the other: same keys and window end, every value equal
    (float values within 1e-9 relative: a stream adds a pane's micro-batches in the order they came, a backfill
    its events at once, so a float sum's last bits may differ)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    keys = [*repo.groups[group].join_keys, "window_end"]
    joined = mine.alias("a").join(theirs.alias("b"), keys, "full_outer")
    different = F.lit(False)
    for column in mine.schema.fields:
        if column.name in keys:
            continue
        a, b = F.col(f"a.`{column.name}`"), F.col(f"b.`{column.name}`")
        if isinstance(column.dataType, DoubleType):
            close = F.abs(a - b) <= F.greatest(F.lit(1.0), F.abs(a)) * F.lit(1e-9)
            same = (a.isNull() & b.isNull()) | F.coalesce(close, F.lit(False))
        else:
            same = a.eqNullSafe(b)
        different = different | ~same
    return joined.where(different).count()


def verify(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_features("verify", "--repo", str(repo), "--no-tracking"), capture_output=True, text=True)


def _labels(repo) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """Label rows as a training set has them: 20,000 events' keys and times."""
    rng = np.random.default_rng(3)
    events = pd.read_parquet(Path(repo.root).parent / "events.parquet")
    picked = events.iloc[rng.integers(0, len(events), 20_000)]
    rows = picked[["user_id", "card_id", "merchant_id", "event_ts"]].rename(columns={"event_ts": "event_timestamp"})
    return rows.reset_index(drop=True)


def training_ratio(soaked, twin) -> float:  # type: ignore[no-untyped-def]
    """Median time of a training set (Feast's retrieval) on the soaked tables over the same on the backfill's,
    in paired runs."""
    from features.ml.training import training_set

    labels = _labels(soaked)
    times: dict[str, list[float]] = {"soaked": [], "twin": []}
    for _ in range(3):
        for name, repo in (("soaked", soaked), ("twin", twin)):
            began = time.perf_counter()
            training_set(labels, ["user_transactions", "card_merchant"], repo, log_lineage=False)
            times[name].append(time.perf_counter() - began)
    return float(np.median(times["soaked"]) / np.median(times["twin"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catch-up-minutes", type=float, default=20.0)
    parser.add_argument("--live-minutes", type=float, default=5.0)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--events-per-file", type=int, default=2000)
    parser.add_argument("--no-save", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    work = Path(__file__).resolve().parent / "work-soak"
    load_before = load()
    result = soak(work, args.catch_up_minutes, args.live_minutes, args.days, args.events_per_file)
    from features.engine.session import get_spark
    from features.repo import Repo

    twin, differences = backfill_twin(result["repo"], work, get_spark("features-soak-check"))  # type: ignore[arg-type]
    ratio = training_ratio(Repo.load(result["repo"]), twin)  # type: ignore[arg-type]
    verified = verify(result["repo"])  # type: ignore[arg-type]
    verdicts = {
        "nothing set aside": all(n == 0 for n in result["aside"].values()),  # type: ignore[union-attr]
        "offline = backfill": all(differ == 0 for _, differ in differences.values()),
        "verify": verified.returncode == 0,
        "driver RSS flat": _within(result["driver_rss_ratio"]),
        "worker RSS flat": _within(result["worker_rss_ratio"]),
        "batch duration flat": _within(result["batch_seconds_ratio"]),
        f"files per partition <= {FILES_BOUND}": result["max_files_per_partition"] <= FILES_BOUND,  # type: ignore[operator]
        "training set <= 1.5x": ratio <= 1.5,
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    lines = [
        f"Run on {datetime.now(UTC):%Y-%m-%d} at commit {commit.strip()}; {load_before} at the start, "
        f"{load()} at the end.",
        "",
        f"`python bench/soak.py --catch-up-minutes {args.catch_up_minutes:g} --live-minutes {args.live_minutes:g} "
        f"--days {args.days:g} --events-per-file {args.events_per_file}`: the demo's two groups as a live "
        "`features stream --trigger 1s` (MLflow on), one file landed a second, event time from "
        f"{result['first']:%Y-%m-%d %H:%M} to {result['last']:%Y-%m-%d %H:%M} UTC, SIGKILL and restart halfway.",
        "",
        f"- events {result['events']:,} in {result['files_landed']:,} files, {result['batches']:,} batches with events",
        f"- set aside (late + quarantined files): {json.dumps(result['aside'])}",
        f"- max files per date partition: {result['max_files_per_partition']}",
        f"- checkpoint MB over time: {result['checkpoint_mb']}",
        "- last quarter / second quarter (medians, catch-up after the restart): driver RSS "
        f"{_fmt(result['driver_rss_ratio'])}, worker RSS {_fmt(result['worker_rss_ratio'])}, batch seconds "
        f"{_fmt(result['batch_seconds_ratio'])}; for information, the driver's heap in use in its old generation "
        f"(`jstat`; the heap is taken whole at the start: {' '.join(result['heap_options'])}) "  # type: ignore[arg-type]
        f"{_fmt(result['old_generation_ratio'])}",
        "- offline rows vs a backfill of the same range: "
        + ", ".join(f"{g} {rows:,} rows, {differ:,} differing" for g, (rows, differ) in differences.items()),
        f"- training set on the soaked tables / on the backfill's: {ratio:.2f}x",
        f"- `features verify`: exit {verified.returncode}",
        "",
        "| check | met |",
        "|---|---|",
        *[f"| {name} | {'yes' if ok else 'NO'} |" for name, ok in verdicts.items()],
    ]
    if verified.returncode != 0:
        print(verified.stdout[-3000:], verified.stderr[-3000:], file=sys.stderr)
    print("\n".join(lines))
    if not args.no_save:
        update_section("Soak (bench/soak.py)", "\n".join(lines))
    return 0 if all(verdicts.values()) else 1


def _within(ratio: object) -> bool:
    return ratio is not None and abs(float(ratio) - 1.0) <= FLAT  # type: ignore[arg-type]


def _fmt(ratio: object) -> str:
    return "-" if ratio is None else f"{float(ratio):.2f}"  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
