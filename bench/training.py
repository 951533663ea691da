"""Training sets from Spark label rows: the Spark point-in-time join against the previous pandas-through-Feast path.

`python bench/training.py [--sizes 1000000 10000000] [--feast-max 1000000]`

On a demo-sized repo (feature_repo/fraud.py's definitions; 2,000 users, generated transactions over 3 days,
`user_transactions` backfilled), label rows as a Spark DataFrame (read from Parquet: user, time, amount,
label) get the group's five features by `features.training_set`:
  * the Spark path (features.engine.pit): the join in Spark, the result consumed by Spark (`noop` sink);
  * the previous path: `toPandas()` on the driver, Feast's `get_historical_features` (DuckDB) there, the result
    made a Spark DataFrame again and consumed the same way (what `training_set` did with Spark rows before).
Every measurement runs in a fresh process of its own (a cold JVM each, so both paths pay the same start), so
that its peak memory is its own: the driver's max RSS (`resource.getrusage`, this Python process) and, beside
it, the peak RSS of the local Spark JVM it started (VmHWM, Linux). The previous path is run up to
`--feast-max` rows; above that it is reported infeasible, with a cost projected linearly from its largest run.
Required: the Spark path >= 4x faster at 1M rows, and its driver max RSS <= 2 GB at 10M rows.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/repo_yaml.py
from repo_yaml import write_feature_store_yaml  # noqa: E402
from results import load, update_section  # noqa: E402 - bench/ on the path first

WORK = ROOT / "work-training"
REPO = WORK / "repo"
FRAUD = ROOT.parent / "feature_repo" / "fraud.py"
START = datetime(2026, 1, 1, tzinfo=UTC)
DAYS = 3
EVENTS = 400_000
USERS = 2_000
GROUP = "user_transactions"
REQUIRED_SPEEDUP = 4.0
REQUIRED_RSS_GB = 2.0


def labels_path(rows: int) -> Path:
    return WORK / f"labels-{rows}"


# ---------------------------------------------------------------------------------------------------------
# Child processes: one measurement each


def setup(sizes: list[int]) -> dict[str, object]:
    """The repo (definitions, events, `user_transactions` backfilled) and one Parquet label set per size."""
    from features.demo import generate_transactions, write_events
    from features.engine.session import get_spark
    from features.pipelines.backfill import backfill
    from features.pipelines.registration import apply
    from features.repo import Repo

    shutil.rmtree(WORK, ignore_errors=True)
    (REPO / "data").mkdir(parents=True)
    events = generate_transactions(EVENTS, USERS, START, DAYS, seed=17)
    write_events(events, REPO / "data" / "transactions", n_files=4)
    users = sorted(events["user_id"].unique())
    write_feature_store_yaml(REPO, "bench_training")
    shutil.copy(FRAUD, REPO / "fraud.py")
    apply(str(REPO))
    spark = get_spark("bench-training")
    repo = Repo.load(REPO)
    [result] = backfill(repo, START, START + timedelta(days=DAYS), [GROUP], spark=spark, progress=False, track=False)
    for rows in sizes:
        write_labels(spark, rows, users)
    return {"events": EVENTS, "users": len(users), "offline_rows": result.rows_out}


def write_labels(spark, rows: int, users: list[str]) -> None:
    """`rows` label rows: a user drawn by a hash of the row number, a time uniform over the days, an amount,
    a 2% label; written by Spark (never through this process)."""
    from pyspark.sql import functions as F

    span_us = DAYS * 86_400 * 1_000_000
    start_us = int(START.timestamp() * 1_000_000)
    ids = spark.createDataFrame([(i, u) for i, u in enumerate(users)], "idx long, user_id string")
    base = spark.range(rows, numPartitions=max(2, rows // 1_000_000)).select(
        F.col("id"),
        F.pmod(F.xxhash64("id", F.lit(1)), F.lit(len(users))).alias("idx"),
        F.timestamp_micros(F.lit(start_us) + F.pmod(F.xxhash64("id", F.lit(2)), F.lit(span_us))).alias(
            "event_timestamp"
        ),
        (F.pmod(F.xxhash64("id", F.lit(3)), F.lit(10_000)) / 100).alias("amount"),
        (F.pmod(F.xxhash64("id", F.lit(4)), F.lit(100)) < 2).cast("int").alias("is_fraud"),
    )
    labels = base.join(F.broadcast(ids), "idx").orderBy("id").select("user_id", "event_timestamp", "amount", "is_fraud")
    labels.write.mode("overwrite").parquet(str(labels_path(rows)))


def measure(path: str, rows: int) -> dict[str, object]:
    """One training set of `rows` label rows by `path` ("spark" or "feast"), consumed by Spark's noop sink."""
    import warnings

    from features.engine.session import get_spark
    from features.ml.training import training_set

    started = time.perf_counter()
    spark = get_spark("bench-training")
    labels = spark.read.parquet(str(labels_path(rows)))
    ready = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if path == "spark":
            frame = training_set(labels, [GROUP], REPO, log_lineage=False)
        else:  # the previous path: the rows to pandas on the driver, Feast there, back to Spark
            frame = training_set(labels.toPandas(), [GROUP], REPO, spark=True, log_lineage=False)
    frame.write.format("noop").mode("overwrite").save()
    done = time.perf_counter()
    return {
        "path": path,
        "rows": rows,
        "seconds": done - ready,
        "start_seconds": ready - started,
        "driver_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
        "jvm_rss_gb": jvm_peak_gb(),
    }


def jvm_peak_gb() -> float | None:
    """The peak RSS (VmHWM) of the Spark JVM this process started, or None where /proc is not there."""
    import psutil

    peaks = []
    for child in psutil.Process().children(recursive=True):
        status = Path(f"/proc/{child.pid}/status")
        if child.name().startswith("java") and status.exists():
            line = next((x for x in status.read_text().splitlines() if x.startswith("VmHWM:")), None)
            if line:
                peaks.append(int(line.split()[1]) / 1024**2)
    return max(peaks) if peaks else None


# ---------------------------------------------------------------------------------------------------------
# The run


def child(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False, cwd=ROOT.parent
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--feast-max", type=int, default=1_000_000, help="largest size the previous path runs")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        out = setup([int(x) for x in rest]) if kind == "setup" else measure(kind, int(rest[0]))
        print(json.dumps(out))
        return 0
    begun = f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {load()} at the start"
    print(begun, flush=True)
    info = child("setup", *map(str, args.sizes))
    print(f"setup: {info}", flush=True)
    spark_runs, feast_runs = {}, {}
    for rows in args.sizes:
        spark_runs[rows] = child("spark", str(rows))
        print(spark_runs[rows], flush=True)
        if rows <= args.feast_max:
            feast_runs[rows] = child("feast", str(rows))
            print(feast_runs[rows], flush=True)
    body = report(args.sizes, info, spark_runs, feast_runs, begun + f", {load()} at the end.")
    print(body)
    update_section("Training sets (bench/training.py)", body)
    return 0 if passed(args.sizes, spark_runs, feast_runs) else 1


def _gb(value: object) -> str:
    return "-" if value is None else f"{float(value):.2f}"  # type: ignore[arg-type]


def _projected(rows: int, feast_runs: dict[int, dict[str, object]]) -> tuple[float, float]:
    """Seconds and driver GB of the previous path at `rows`, linear from its largest measured run."""
    base = max(feast_runs)
    run = feast_runs[base]
    scale = rows / base
    return float(run["seconds"]) * scale, float(run["driver_rss_gb"]) * scale  # type: ignore[arg-type]


def report(sizes: list[int], info: dict[str, object], spark_runs: dict, feast_runs: dict, when: str) -> str:
    lines = [
        when,
        "",
        f"`python bench/training.py`: label rows as a Spark DataFrame (Parquet: user, time, amount, label; users "
        f"drawn uniformly, times uniform over {DAYS} days) get the five features of `{GROUP}` from "
        f"`features.training_set` on a demo-sized repo ({info['events']:,} generated events, {info['users']:,} users, "
        f"{info['offline_rows']:,} change points in the offline table); local Spark on 2 cores, the result consumed "
        "by Spark's `noop` sink. Spark path: the point-in-time join in Spark (features.engine.pit). Previous path: "
        "`toPandas()`, Feast's `get_historical_features` on the driver, back to Spark. Each run is a fresh process "
        "(cold JVM; seconds exclude the session start, listed apart); driver max RSS is that Python process's "
        "`ru_maxrss`, JVM peak its local Spark JVM's VmHWM (driver heap 4 GB).",
        "",
        "| rows | path | seconds | session start s | driver max RSS GB | JVM peak RSS GB |",
        "|---|---|---|---|---|---|",
    ]
    for rows in sizes:
        s = spark_runs[rows]
        lines.append(
            f"| {rows:,} | Spark join | {s['seconds']:.1f} | {s['start_seconds']:.1f} | {_gb(s['driver_rss_gb'])} "
            f"| {_gb(s['jvm_rss_gb'])} |"
        )
        if rows in feast_runs:
            f = feast_runs[rows]
            lines.append(
                f"| {rows:,} | toPandas + Feast | {f['seconds']:.1f} | {f['start_seconds']:.1f} "
                f"| {_gb(f['driver_rss_gb'])} | {_gb(f['jvm_rss_gb'])} |"
            )
        else:
            secs, gb = _projected(rows, feast_runs)
            lines.append(
                f"| {rows:,} | toPandas + Feast | not run: projected {secs:.0f} | | projected {gb:.1f} (infeasible "
                "beside the JVM on this 23 GB machine) | |"
            )
    lines += ["", "| ratio | value | required |", "|---|---|---|"]
    for rows in sizes:
        s = spark_runs[rows]
        if rows in feast_runs:
            lines.append(
                f"| previous / Spark path seconds, {rows:,} rows | "
                f"{feast_runs[rows]['seconds'] / s['seconds']:.1f}x | {'>= 4x' if rows == 1_000_000 else ''} |"
            )
        else:
            secs, _ = _projected(rows, feast_runs)
            lines.append(f"| projected previous / Spark path seconds, {rows:,} rows | {secs / s['seconds']:.1f}x | |")
    for rows in sizes:
        required = f"<= {REQUIRED_RSS_GB:.0f} GB" if rows == 10_000_000 else ""
        lines.append(
            f"| Spark path driver max RSS, {rows:,} rows | {_gb(spark_runs[rows]['driver_rss_gb'])} GB | {required} |"
        )
    return "\n".join(lines)


def passed(sizes: list[int], spark_runs: dict, feast_runs: dict) -> bool:
    ok = True
    if 1_000_000 in feast_runs:
        ok &= feast_runs[1_000_000]["seconds"] / spark_runs[1_000_000]["seconds"] >= REQUIRED_SPEEDUP
    if 10_000_000 in spark_runs:
        ok &= spark_runs[10_000_000]["driver_rss_gb"] <= REQUIRED_RSS_GB
    return bool(ok)


if __name__ == "__main__":
    raise SystemExit(main())
