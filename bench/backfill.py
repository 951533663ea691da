"""Backfill benchmark: the two-phase engine against the naive `groupBy(key, window(ts, size, slide))`.

    python bench/backfill.py [--events 2000000] [--users 10000] [--days 2]
    python bench/backfill.py --scale [--sizes 1000000,4000000,16000000]
    python bench/backfill.py --mixed    (the demo's mixed groups and each aggregation alone: bench/mixed.py)
    python bench/backfill.py --alone    (each aggregation alone only)

Measured in one run on the same data and session, so only the ratios mean anything:
  * naive 24h/5m  vs  two-phase 24h/5m   (required: two-phase >= 30x faster)
  * two-phase 24h/5s  vs  two-phase 24h/5m  (required: <= 1.5x); the naive 24h/5s is projected, not run
  * change-point rows per non-empty (key, pane)  (required: <= 2)
Both sides read the same Parquet files and write their result as Parquet.

`--scale` measures instead how the two-phase 24h/5m backfill grows with the events (users grow with them,
so that each user's events, and so the change points per event, stay the same): seconds per million events
at each size, and each step's time ratio against its events ratio (1.0 = linear).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from features.demo import generate_transactions, write_events
from features.engine.session import get_spark
from features.pipelines.backfill import BackfillResult, backfill_group
from features.pipelines.options import BackfillOptions
from features.pipelines.registration import apply
from features.repo import Repo

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/repo_yaml.py
from repo_yaml import write_feature_store_yaml
from results import load, update_section

T = TypeVar("T")

WORK = Path(__file__).resolve().parent / "work"
REPO = WORK / "repo"
START = datetime(2026, 1, 1, tzinfo=UTC)
EVERY = {"5m": "5 minutes", "5s": "5 seconds"}

# A feature repository with one count group per slide, on the generated events (a real Feast repo:
# the backfill measured is the product's, offline table and online store included).
DEFINITIONS = """
from pathlib import Path

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg, to_feast

HERE = Path(__file__).resolve().parent
user = Entity("user", join_keys=["user_id"])
transactions = EventSource("transactions", path="events", timestamp="event_ts")
count_5m = Feature("txn_count_24h", agg.count(), Hop("24h", "5m"))
count_5s = Feature("txn_count_24h", agg.count(), Hop("24h", "5s"))
count_24h_5m = FeatureGroup("count_24h_5m", user, transactions, [count_5m])
count_24h_5s = FeatureGroup("count_24h_5s", user, transactions, [count_5s])
user_5m, source_5m, view_5m = to_feast(count_24h_5m, repo_root=HERE)
user_5s, source_5s, view_5s = to_feast(count_24h_5s, repo_root=HERE)
"""


def make_repo(events: int, users: int, days: float) -> Repo:
    shutil.rmtree(WORK, ignore_errors=True)
    (REPO / "events").mkdir(parents=True)
    frame = generate_transactions(events, users, START, days, seed=7)
    write_events(frame, REPO / "events", n_files=4)
    del frame
    write_feature_store_yaml(REPO, "bench")
    (REPO / "bench_groups.py").write_text(DEFINITIONS)
    apply(str(REPO))
    return Repo.load(REPO)


def cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process and all its descendants: the Spark JVM and its
    Python workers. The work a run needs, whatever else the machine is doing (Linux /proc; 0 elsewhere)."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in stats:  # utime, stime, and the times of its exited children it waited for
            total += sum(int(v) for v in stats[pid][11:15])
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def timed(fn: Callable[[], T]) -> tuple[float, float, T]:
    """Wall seconds, CPU seconds (`cpu_seconds`) and the result of fn()."""
    began, began_cpu = time.perf_counter(), cpu_seconds()
    out = fn()
    return time.perf_counter() - began, cpu_seconds() - began_cpu, out


def naive(events: DataFrame, every: str) -> DataFrame:
    windows = F.window("event_ts", "24 hours", EVERY[every])
    return events.groupBy("user_id", windows.alias("w")).agg(F.count(F.lit(1)).alias("txn_count_24h"))


def run_naive(spark: SparkSession, every: str) -> int:
    """What users write without this project: expand every event into all its windows, count, write."""
    out = WORK / "naive"
    shutil.rmtree(out, ignore_errors=True)
    result = naive(spark.read.parquet(str(REPO / "events")), every)
    result.write.parquet(str(out))
    return spark.read.parquet(str(out)).count()


def non_empty_panes(spark: SparkSession, every: str) -> int:
    """(key, pane) pairs with events."""
    seconds = {"5m": 300, "5s": 5}[every]
    ts = F.unix_seconds(F.col("event_ts"))
    events = spark.read.parquet(str(REPO / "events"))
    return events.select("user_id", (ts - ts % seconds).alias("pane")).distinct().count()


def check_agreement(spark: SparkSession, repo: Repo, start: datetime, end: datetime) -> int:
    """The engine must be right before its speed matters: every naive window of 50 users, looked up as of
    its end in the offline table the backfill wrote, has the same count."""
    events = spark.read.parquet(str(REPO / "events"))
    users = events.select("user_id").distinct().orderBy("user_id").limit(50)
    expected = (
        naive(events.join(users, "user_id"), "5m")
        .select("user_id", F.col("w.end").alias("window_end"), "txn_count_24h")
        .where((F.col("window_end") >= F.lit(start)) & (F.col("window_end") < F.lit(end)))
        .toPandas()
    )
    table = spark.read.format("delta").load(repo.offline_path("count_24h_5m")).join(users, "user_id").toPandas()
    mismatches = 0
    for user, exp in expected.groupby("user_id"):
        mine = table[table.user_id == user].sort_values("window_end").set_index("window_end").txn_count_24h
        got = mine.reindex(exp.window_end.to_numpy(), method="ffill").fillna(0).to_numpy()
        mismatches += int((got != exp.txn_count_24h.to_numpy()).sum())
    return mismatches


def run_group(spark: SparkSession, repo: Repo, every: str, days: float) -> BackfillResult:
    """The product's backfill of every window end from the first event to a day after the last (all windows
    the naive query makes)."""
    start, end = START, START + timedelta(days=days + 1)
    return backfill_group(spark, repo, repo.groups[f"count_24h_{every}"], start, end, BackfillOptions(progress=False))


@dataclass
class Runs:
    """Wall and CPU seconds of repeated runs of one configuration."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def add(self, wall: float, cpu: float) -> None:
        self.wall.append(wall)
        self.cpu.append(cpu)

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)

    def listed(self) -> str:
        return " / ".join(f"{w:.2f}" for w in self.wall)


def compare(spark: SparkSession, args: argparse.Namespace) -> tuple[list[str], bool]:
    """The two-phase backfills against the naive query, on the same events; the report and whether every
    requirement is met."""
    repo = make_repo(args.events, args.users, args.days)
    load_before = load()
    run_group(spark, repo, "5m", args.days)  # warm-up: JIT and file caches, so that run order does not matter
    mismatches = check_agreement(spark, repo, START, START + timedelta(days=args.days + 1))
    runs = {"5m": Runs(), "5s": Runs()}
    results: dict[str, BackfillResult] = {}
    naive = Runs()
    # Rounds: each runs both two-phase groups, then the naive query (in the first `--naive-runs` rounds), so that
    # both sides are measured alike, warm, and compared by their medians.
    for i in range(args.runs):
        for every in ("5m", "5s"):
            wall, cpu, results[every] = timed(lambda every=every: run_group(spark, repo, every, args.days))
            runs[every].add(wall, cpu)
        if not args.skip_naive and i < args.naive_runs:
            naive.add(*timed(lambda: run_naive(spark, "5m"))[:2])
    rows = {every: r.rows_out for every, r in results.items()}
    panes = {every: non_empty_panes(spark, every) for every in results}

    medians = {every: r.median for every, r in runs.items()}
    lines = [
        f"Run on {datetime.now(UTC):%Y-%m-%d}; {load_before} at the start, {load()} at the end.",
        "",
        f"`python bench/backfill.py`: {results['5m'].rows_in:,} events read, {args.users:,} users, "
        f"{args.days:g} days generated; `features backfill` of every window end from the first event to a day "
        "after the last (all windows the naive query makes) of one count feature over 24h windows, validated, "
        f"offline table and online store written; local Spark on {spark.sparkContext.defaultParallelism} cores. "
        f"Seconds are medians: two-phase of {args.runs} runs after a warm-up (all runs: "
        f"{'; '.join(f'24h/{e} {r.listed()}' for e, r in runs.items())}), the naive query of {len(naive.wall)} "
        f"(after the two-phase runs of the same round: {naive.listed()}), which reads the same files and writes the "
        "same windows as Parquet. CPU seconds: what this process, the Spark JVM and its Python workers used (the "
        "median of the runs): the work each side needs, whatever else the machine was doing.",
        "",
        "| run | seconds | CPU seconds | rows out | non-empty (key, pane) | rows per pane |",
        "|---|---|---|---|---|---|",
    ]
    for every in ("5m", "5s"):
        lines.append(
            f"| two-phase 24h/{every} | {medians[every]:.2f} | {runs[every].median_cpu:.2f} | {rows[every]:,} | "
            f"{panes[every]:,} | {rows[every] / panes[every]:.2f} |"
        )
    if naive.wall:
        lines.append(f"| naive groupBy(window 24h/5m) | {naive.median:.2f} | {naive.median_cpu:.2f} | | | |")
        lines.append(
            f"| naive groupBy(window 24h/5s) | not run: projected {naive.median * 60:.0f} (60x the windows) | | | | |"
        )
    lines += ["", "| ratio | value | CPU seconds ratio | required |", "|---|---|---|---|"]
    if naive.wall:
        cpu_ratio = naive.median_cpu / runs["5m"].median_cpu
        lines.append(
            f"| naive 24h/5m / two-phase 24h/5m | {naive.median / medians['5m']:.1f}x | {cpu_ratio:.1f}x | >= 30x |"
        )
        lines.append(f"| projected naive 24h/5s / two-phase 24h/5s | {naive.median * 60 / medians['5s']:.0f}x | | |")
    cpu_ratio = runs["5s"].median_cpu / runs["5m"].median_cpu
    lines.append(
        f"| two-phase 24h/5s / two-phase 24h/5m | {medians['5s'] / medians['5m']:.2f}x | {cpu_ratio:.2f}x | <= 1.5x |"
    )
    worst = max(rows[e] / panes[e] for e in rows)
    lines.append(f"| rows out per non-empty (key, pane), worst | {worst:.2f} | | <= 2 |")
    lines.append(f"| mismatches against naive windows, 50 users | {mismatches} | | 0 |")
    ok = mismatches == 0 and medians["5s"] / medians["5m"] <= 1.5 and worst <= 2
    if naive.wall:
        ok = ok and naive.median / medians["5m"] >= 30
    return lines, ok


EVENTS_PER_USER = 200  # as in the comparison: 2M events of 10k users


@dataclass(frozen=True)
class Size:
    events: int
    users: int
    result: BackfillResult
    runs: Runs

    @property
    def millions(self) -> float:
        return self.events / 1e6


def scale(spark: SparkSession, sizes: list[int], days: float, repeats: int) -> list[str]:
    """The 24h/5m backfill at growing sizes, users growing with the events."""
    load_before = load()
    measured = []
    for i, events in enumerate(sizes):
        users = max(1, events // EVENTS_PER_USER)
        repo = make_repo(events, users, days)
        if i == 0:
            run_group(spark, repo, "5m", days)  # warm-up
        runs = Runs()
        for _ in range(repeats):
            wall, cpu, result = timed(lambda repo=repo: run_group(spark, repo, "5m", days))
            runs.add(wall, cpu)
        measured.append(Size(events, users, result, runs))
        print(f"{events:,} events: {runs.listed()} s", flush=True)
    shutil.rmtree(WORK, ignore_errors=True)

    lines = [
        f"Run on {datetime.now(UTC):%Y-%m-%d}; {load_before} at the start, {load()} at the end.",
        "",
        f"`python bench/backfill.py --scale`: the 24h/5m count backfill of the comparison above (validated, offline "
        f"table and online store written) on {', '.join(f'{m.events:,}' for m in measured)} generated events over "
        f"{days:g} days, {EVENTS_PER_USER} events per user (users grow with the events); local Spark on "
        f"{spark.sparkContext.defaultParallelism} cores. Seconds are the median of {repeats} runs (all listed), CPU "
        "seconds the median (this process, the Spark JVM and its Python workers).",
        "",
        "| events | users | rows out | seconds | runs | CPU seconds | seconds per million events | "
        "CPU seconds per million events | time ratio / events ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for previous, m in zip([None, *measured], measured, strict=False):
        growth = (
            "" if previous is None else f"{(m.runs.median / previous.runs.median) / (m.events / previous.events):.2f}"
        )
        lines.append(
            f"| {m.result.rows_in:,} | {m.users:,} | {m.result.rows_out:,} | {m.runs.median:.2f} | {m.runs.listed()} | "
            f"{m.runs.median_cpu:.2f} | {m.runs.median / m.millions:.2f} | {m.runs.median_cpu / m.millions:.2f} | "
            f"{growth} |"
        )
    lines += ["", _linearity(measured)]
    return lines


def _linearity(measured: list[Size]) -> str:
    """Each step's growth in words: within 15% of linear is near-linear."""
    parts = []
    for a, b in pairwise(measured):
        per_event = (b.runs.median / b.events) / (a.runs.median / a.events)
        step = f"{a.millions:g}M -> {b.millions:g}M events"
        if per_event > 1.15:
            parts.append(f"{step}: super-linear, {per_event:.2f}x the time per event")
        elif per_event < 0.85:
            parts.append(f"{step}: sub-linear, {per_event:.2f}x the time per event (fixed costs spread out)")
        else:
            parts.append(f"{step}: near-linear ({per_event:.2f}x the time per event)")
    return "Growth: " + "; ".join(parts) + "." if parts else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--skip-naive", action="store_true", help="skip the slow naive runs")
    parser.add_argument("--naive-runs", type=int, default=3, help="runs of the naive query (one per round)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each two-phase backfill")
    parser.add_argument("--scale", action="store_true", help="measure how the backfill grows with the events")
    parser.add_argument("--sizes", default="1000000,4000000,16000000", help="event counts for --scale")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size for --scale")
    parser.add_argument("--mixed", action="store_true", help="the demo's mixed groups and each aggregation alone")
    parser.add_argument("--alone", action="store_true", help="--mixed without the groups: each aggregation alone")
    parser.add_argument(
        "--sample",
        type=float,
        default=0.1,
        help="--mixed: the naive query of each aggregation alone runs on half this fraction and this fraction",
    )
    parser.add_argument("--no-save", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()

    spark = get_spark("bench-backfill")
    if args.mixed or args.alone:
        from mixed import mixed

        lines, ok = mixed(
            spark,
            args.events,
            args.users,
            3.0,
            min(args.runs, 3),
            args.sample,
            args.alone,
            args.skip_naive,
            args.naive_runs,
        )
        title = (
            "Each aggregation alone (bench/backfill.py --alone)"
            if args.alone
            else "Mixed groups (bench/backfill.py --mixed)"
        )
    elif args.scale:
        lines = scale(spark, [int(n) for n in args.sizes.split(",")], args.days, args.repeats)
        ok, title = True, "Backfill scale (bench/backfill.py --scale)"
    else:
        lines, ok = compare(spark, args)
        title = "Backfill (bench/backfill.py)"
    print("\n".join(lines))
    if not args.no_save:
        update_section(title, "\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
