"""The offline table as Delta Lake against the Parquet folders it replaced, in the warm figures of
bench/backfill.py, bench/stream.py and bench/training.py: this checkout against the last commit whose offline table
was Parquet folders, in the same run (docs/table-format.md).

`python bench/table_warm.py [--events 1000000] [--users 5000] [--labels 1000000] [--repeats 3] [--baseline REF]`

Each side gets a copy of the demo repo (`feature_repo/`: both example groups, mixed aggregations and window
shapes) with the same generated events over 3 days, applied by its own code. A round runs one process per side, in
turn (A B A B), each with one warm local session that measures, after an unmeasured warm-up of each:
  * backfill: both groups over the 3 days, validated, offline table and SQLite online store written (tracking
    off, as in bench/backfill.py); the best of two runs, each replacing the range the one before wrote;
  * training: `training_set` of `--labels` label rows (a Spark DataFrame read from Parquet) with the five features
    of `user_transactions`, read from the offline table that backfill wrote, consumed by Spark's `noop` sink; the
    best of two runs;
  * stream: `user_transactions` streamed from its landing folder into an empty offline table (`--available-now`,
    one file per micro-batch, validation and online store on, tracking off), the steady events/s of the batches
    after the first two, as bench/stream.py measures it.
Figures are medians over `--repeats` rounds; the ratio is this checkout's figure against the baseline's, oriented
so that above 1 means the Delta table is faster (>= 0.9 required: the Delta table costs at most a tenth).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from results import load, update_section  # noqa: E402 - bench/ on the path first
from table_whole import BASELINE, fresh, make_repo, run_python, short, two_sides  # noqa: E402

START = datetime(2026, 1, 1, tzinfo=UTC)
END = datetime(2026, 1, 4, tzinfo=UTC)
GROUP = "user_transactions"
FIGURES = {  # name: (unit, larger is better)
    "backfill": ("s", False),
    "training set": ("s", False),
    "stream": ("events/s", True),
}


# ---------------------------------------------------------------------------------------------------------
# The child: one side, one round, in one session. It runs on the side's own code (PYTHONPATH), whose modules
# had other paths before the layers (features.compat maps the old ones, but not the reverse).


def _api() -> dict[str, Any]:
    try:
        from features.ml.training import training_set
        from features.pipelines.backfill import backfill
        from features.pipelines.stream import stream
    except ImportError:  # the baseline's layout
        from features.backfill import backfill  # type: ignore[no-redef]
        from features.stream import stream  # type: ignore[no-redef]
        from features.training import training_set  # type: ignore[no-redef]
    from features.engine.session import get_spark
    from features.repo import Repo

    return {"backfill": backfill, "stream": stream, "training_set": training_set, "get_spark": get_spark, "Repo": Repo}


def _labels(spark: Any, repo: Path, rows: int) -> Any:
    """`rows` label rows: a user drawn by a hash of the row number from the repo's users, a time uniform over the
    days; written to Parquet by Spark and read back (as a user's label table is)."""
    from pyspark.sql import functions as F

    users = sorted(
        r.user_id
        for r in spark.read.parquet(str(repo / "data" / "transactions")).select("user_id").distinct().collect()
    )
    ids = spark.createDataFrame(list(enumerate(users)), "idx long, user_id string")
    span_us = int((END - START).total_seconds() * 1_000_000)
    base = spark.range(rows).select(
        F.pmod(F.xxhash64("id", F.lit(1)), F.lit(len(users))).alias("idx"),
        F.timestamp_micros(
            F.lit(int(START.timestamp() * 1_000_000)) + F.pmod(F.xxhash64("id", F.lit(2)), F.lit(span_us))
        ).alias("event_timestamp"),
    )
    path = repo / "labels"
    base.join(F.broadcast(ids), "idx").select("user_id", "event_timestamp").write.mode("overwrite").parquet(str(path))
    return spark.read.parquet(str(path))


def _timed_after_warm_up(work: Any, runs: int = 2) -> list[float]:
    """The seconds of `runs` runs of `work`, after one unmeasured run."""
    work()
    walls = []
    for _ in range(runs):
        began = time.perf_counter()
        work()
        walls.append(time.perf_counter() - began)
    return walls


def child(batch_repo: Path, stream_repo: Path, labels: int) -> dict[str, Any]:
    api = _api()
    spark = api["get_spark"]("bench-table-warm")
    repo = api["Repo"].load(batch_repo)

    def backfill() -> None:
        api["backfill"](repo, START, END, spark=spark, progress=False, track=False)

    backfills = _timed_after_warm_up(backfill)
    rows = _labels(spark, batch_repo, labels)

    def training() -> None:
        frame = api["training_set"](rows, [GROUP], repo, log_lineage=False)
        frame.write.format("noop").mode("overwrite").save()

    trainings = _timed_after_warm_up(training)

    run = api["stream"](
        api["Repo"].load(stream_repo),
        [GROUP],
        spark=spark,
        available_now=True,
        max_files_per_trigger=1,
        progress=False,
        tracking=False,
    )
    run.await_termination()
    [query] = run.queries.values()
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    steady = batches[2:] or batches  # the first two batches warm up (the first emits nothing)
    rate = sum(p["numInputRows"] for p in steady) / (sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000)
    return {
        "backfill": min(backfills),
        "training set": min(trainings),
        "stream": rate,
        "runs": {"backfill": backfills, "training set": trainings},
    }


# ---------------------------------------------------------------------------------------------------------
# The run


def run_child(code: Path, batch_repo: Path, stream_repo: Path, labels: int) -> dict[str, Any]:
    args = [__file__, "--child", str(batch_repo), str(stream_repo), "--labels", str(labels)]
    _, out = run_python(code, args, batch_repo)
    return json.loads(out.strip().splitlines()[-1])


def ratio(figure: str, ours: float, baseline: float) -> float:
    """Above 1: this checkout is faster."""
    return ours / baseline if FIGURES[figure][1] else baseline / ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=5_000)
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, help="the git ref of the Parquet-table code")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]), args.labels)))
        return
    began = datetime.now(UTC)
    with two_sides(args.baseline, "bench-table-warm-") as (work, sides):
        repos = {}
        for i, (name, code) in enumerate(sides.items()):
            batch = make_repo(code, work / f"batch{i}", args.events, args.users)
            streamed = work / f"stream{i}"
            shutil.copytree(batch, streamed)
            repos[name] = (batch, streamed)
        figures: dict[str, dict[str, list[float]]] = {name: {f: [] for f in FIGURES} for name in sides}
        for attempt in range(args.repeats):
            for name, code in sides.items():
                for repo in repos[name]:
                    fresh(repo)
                result = run_child(code, *repos[name], args.labels)
                for figure in FIGURES:
                    figures[name][figure].append(result[figure])
                print(f"round {attempt + 1}: {name} {json.dumps(result)}", flush=True)
    delta, parquet = list(sides)
    lines = [
        f"Run on {began:%Y-%m-%d} at commit {short('HEAD')}; {load()} at the end.",
        "",
        f"`python bench/table_warm.py --events {args.events} --users {args.users} --labels {args.labels} "
        f"--repeats {args.repeats}`: the demo repo's groups over 3 days of generated events, one warm session per "
        f"side and round (best of two runs after a warm-up; the stream's steady events/s), this checkout against "
        f"{short(args.baseline)} (the last commit with Parquet folders), rounds alternating, medians (every round "
        "listed). Ratio: above 1, the Delta table is faster.",
        "",
        "| figure | Delta | Parquet | Delta vs Parquet |",
        "|---|---|---|---|",
    ]
    for figure, (unit, _) in FIGURES.items():
        d, p = statistics.median(figures[delta][figure]), statistics.median(figures[parquet][figure])
        fmt = "{:,.0f}" if unit == "events/s" else "{:.2f}"
        runs = " / ".join(fmt.format(x) for x in figures[delta][figure])
        runs += " vs " + " / ".join(fmt.format(x) for x in figures[parquet][figure])
        lines.append(
            f"| {figure}, {unit} ({runs}) | {fmt.format(d)} | {fmt.format(p)} | **{ratio(figure, d, p):.2f}x** |"
        )
    text = "\n".join(lines)
    print(text)
    update_section("Offline table format, warm figures (bench/table_warm.py)", text)


if __name__ == "__main__":
    main()
