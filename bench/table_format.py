"""The offline table's writes and reads as this package makes them on its Delta Lake table (features.stores.offline)
against plain Parquet folders doing the same work without transactions: what the table format costs
(docs/table-format.md).

`python bench/table_format.py [--rows 600000] [--batches 24] [--repeats 5]`

One warm local session (2 cores), change points shaped like the demo group's (a user key, the window end every
5 minutes over 3 days, five features of mixed types). Measured, alternating the two, median of `--repeats`:
  * backfill: replace the 3 days' rows. Parquet: Spark's dynamic partition overwrite of the dates. Delta:
    `offline.replace_range` (the rows kept for validation, then one commit with `replaceWhere`).
  * stream: `--batches` micro-batches, each one hour of window ends, appended. Parquet: a plain append of the
    batch's files. Delta: what the stream does per batch: read the log's new commits (`StreamLog.refresh`), then
    `offline.append_batch` (the rows outside backfilled ranges, one commit recording the batch id, the log read
    again to find a backfill that raced it). For reference, the ways Delta offers to make a replay write nothing
    twice, measured alone: `txnAppId`/`txnVersion`, `replaceWhere` on the batch's window ends, `MERGE`.
  * reads of the table after the appends: all rows by Spark, and by pandas (pyarrow over the Parquet files;
    `deltalake` for Delta, which Feast's file source and DuckDB use too).
  * `OPTIMIZE` of the appended day (Delta's compaction) and the file count before and after it.
  * a backfill's commit racing a stream's append into the same day: Delta must refuse the backfill's commit
    (ConcurrentAppendException) so that it is made again on the new version rather than dropping or doubling rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from results import load, update_section  # noqa: E402 - bench/ on the path first

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

START = datetime(2026, 1, 1, tzinfo=UTC)
DAYS = 3
HOP_S = 300


def change_points(spark: SparkSession, rows: int, start: datetime, seconds: int) -> DataFrame:
    """`rows` change points with window ends on the 5-minute grid in [start, start + seconds)."""
    from pyspark.sql import functions as F

    slots = max(1, seconds // HOP_S)
    rid = F.col("id")
    end = F.lit(int(start.timestamp())) + (rid % slots) * HOP_S
    return spark.range(rows).select(
        F.floor(rid / slots).cast("long").alias("user_id"),
        end.cast("timestamp").alias("window_end"),
        (rid % 7).alias("txn_count_1h"),
        (F.rand(1) * 100).alias("amount_sum_24h"),
        (F.rand(2) * 50).alias("amount_avg_1h"),
        (F.rand(3) * 900).alias("amount_max_7d"),
        (rid % 13).alias("merchants_24h"),
    )


def timed(fn: Callable[..., object], *args: object) -> float:
    began = time.perf_counter()
    fn(*args)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=600_000, help="change points over the 3 days")
    parser.add_argument("--batches", type=int, default=24, help="stream micro-batches (one hour of windows each)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from features.engine.batch import LATEST
    from features.engine.session import get_spark
    from features.stores import offline

    started = f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {load()} at the start"
    spark = get_spark("bench-table-format")
    work = Path(tempfile.mkdtemp(prefix="bench-table-format-"))
    end = START + timedelta(days=DAYS)
    days_rows = change_points(spark, args.rows, START, DAYS * 86400).withColumn(LATEST, F.lit(False)).localCheckpoint()
    days_rows.count()
    dated = days_rows.drop(LATEST).withColumn("date", F.to_date("window_end"))
    parquet, delta = str(work / "parquet"), str(work / "delta")

    def parquet_backfill() -> None:
        writer = dated.repartition("date").write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
        writer.partitionBy("date").parquet(parquet)

    times: dict[str, list[float]] = {"backfill parquet": [], "backfill delta": []}
    for _ in range(args.repeats + 1):  # the first round warms both paths up and is dropped
        times["backfill parquet"].append(timed(parquet_backfill))
        times["backfill delta"].append(timed(offline.replace_range, spark, days_rows, delta, START, end))
    for key in times:
        times[key] = times[key][1:]

    per_batch = max(1, args.rows // (DAYS * 24))
    batches = [change_points(spark, per_batch, end + timedelta(hours=i), 3600) for i in range(args.batches)]
    batches = [b.localCheckpoint() for b in batches]
    copies = {name: str(work / f"delta-{name}") for name in ["txn", "replaceWhere", "merge"]}
    for path in copies.values():
        dated.write.format("delta").partitionBy("date").save(path)
    log = offline.StreamLog(delta, "bench")

    def stream_batch(i: int, batch: DataFrame) -> None:
        log.refresh()
        offline.append_batch(spark, batch, log, i)

    def txn(i: int, batch: DataFrame) -> None:
        writer = batch.withColumn("date", F.to_date("window_end")).write.format("delta").mode("append")
        writer.option("txnAppId", "bench").option("txnVersion", i).save(copies["txn"])

    def replace_where(i: int, batch: DataFrame) -> None:
        lo = end + timedelta(hours=i)
        pred = (
            f"date = '{lo.date()}' AND window_end >= '{lo:%Y-%m-%d %H:%M:%S}' "
            f"AND window_end < '{lo + timedelta(hours=1):%Y-%m-%d %H:%M:%S}'"
        )
        writer = batch.withColumn("date", F.to_date("window_end")).write.format("delta").mode("overwrite")
        writer.option("replaceWhere", pred).save(copies["replaceWhere"])

    def merge(i: int, batch: DataFrame) -> None:
        batch.withColumn("date", F.to_date("window_end")).createOrReplaceTempView("bench_batch")
        lo = end + timedelta(hours=i)
        spark.sql(
            f"MERGE INTO delta.`{copies['merge']}` t USING bench_batch s ON t.date = '{lo.date()}' "
            "AND t.user_id = s.user_id AND t.window_end = s.window_end WHEN NOT MATCHED THEN INSERT *"
        )

    def parquet_append(batch: DataFrame) -> None:
        batch.withColumn("date", F.to_date("window_end")).write.mode("append").partitionBy("date").parquet(parquet)

    ways = {"txn": txn, "replaceWhere": replace_where, "merge": merge}
    stream_times: dict[str, list[float]] = {"parquet": [], "delta": [], **{w: [] for w in ways}}
    for i, batch in enumerate(batches):
        stream_times["parquet"].append(timed(parquet_append, batch))
        stream_times["delta"].append(timed(stream_batch, i, batch))
        for name, way in ways.items():
            stream_times[name].append(timed(way, i, batch))

    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    reads: dict[str, list[float]] = {k: [] for k in ("spark parquet", "spark delta", "pandas parquet", "pandas delta")}
    counts: dict[str, int] = {}
    for _ in range(args.repeats):
        reads["spark parquet"].append(timed(lambda: counts.update(sp=spark.read.parquet(parquet).count())))
        reads["spark delta"].append(timed(lambda: counts.update(sd=offline.read_table(spark, delta).count())))
        reads["pandas parquet"].append(
            timed(lambda: counts.update(pp=len(ds.dataset(parquet, partitioning="hive").to_table().to_pandas())))
        )
        reads["pandas delta"].append(timed(lambda: counts.update(pd=len(offline.read_pandas(delta)))))
    if len(set(counts.values())) != 1:
        raise SystemExit(f"the tables differ: {counts}")

    last_day = (end + timedelta(hours=args.batches - 1)).date()
    files_before = len([a for a in DeltaTable(delta).file_uris() if f"date={last_day}" in a])
    optimize_s = timed(lambda: spark.sql(f"OPTIMIZE delta.`{delta}` WHERE date = '{last_day}'").collect())
    files_after = len([a for a in DeltaTable(delta).file_uris() if f"date={last_day}" in a])

    race = race_backfill_and_append(spark, dated, str(work / "race"), end)

    med = {k: statistics.median(v) for k, v in {**times, **reads}.items()}
    smed = {k: statistics.median(v) for k, v in stream_times.items()}
    lines = [
        f"{started}, {load()} at the end.",
        "",
        f"`python bench/table_format.py --rows {args.rows} --batches {args.batches} --repeats {args.repeats}`: "
        f"{args.rows:,} change points (a user key, 5-minute window ends over {DAYS} days, five features) in one warm "
        f"local session on 2 cores; Delta Lake 4.4.0 on Spark {spark.version}. Medians; ratios are Parquet's "
        "time over Delta's (above 1: Delta is faster).",
        "",
        "| operation | Parquet folders s | Delta s | Parquet / Delta |",
        "|---|---|---|---|",
        _row("backfill: replace 3 days", med["backfill parquet"], med["backfill delta"]),
    ]
    lines.append(
        _row(f"stream: one micro-batch ({per_batch:,} rows) as the stream writes it", smed["parquet"], smed["delta"])
    )
    for name in ways:
        lines.append(_row(f"stream: one micro-batch, Delta's {name} alone (not used)", smed["parquet"], smed[name]))
    lines += [
        _row(f"read all {counts['sp']:,} rows, Spark", med["spark parquet"], med["spark delta"]),
        _row("read all rows, pandas (pyarrow / deltalake)", med["pandas parquet"], med["pandas delta"]),
        "",
        f"`OPTIMIZE` of the day the stream appended to: {optimize_s:.2f} s, {files_before} files -> {files_after}.",
        f"A backfill's commit racing a stream's append into its days: {race}.",
    ]
    body = "\n".join(lines)
    print(body)
    update_section("Offline table format (bench/table_format.py)", body)


def _row(name: str, parquet_s: float, delta_s: float) -> str:
    return f"| {name} | {parquet_s:.3f} | {delta_s:.3f} | {parquet_s / delta_s:.2f}x |"


def race_backfill_and_append(spark: SparkSession, dated: DataFrame, path: str, end: datetime) -> str:
    """Start a large replace of the days and, while its files are being written, append to one of the days: the
    replace must fail to commit, and the append's rows stay."""
    from pyspark.sql import functions as F

    dated.limit(1000).write.format("delta").partitionBy("date").save(path)
    heavy = dated.withColumn("amount_sum_24h", F.length(F.sha2(F.col("amount_sum_24h").cast("string"), 512)) * 1.0)
    heavy = heavy.unionByName(heavy).unionByName(heavy)
    outcome: dict[str, str] = {}
    day_pred = f"date >= '{START.date()}' AND date < '{end.date()}'"

    def backfill() -> None:
        try:
            heavy.write.format("delta").mode("overwrite").option("replaceWhere", day_pred).save(path)
            outcome["backfill"] = "committed"
        except Exception as exc:  # the conflict is the expected outcome; anything else is reported as it is
            outcome["backfill"] = type(exc).__name__ if "Concurrent" in type(exc).__name__ else str(exc)[:200]
            if "ConcurrentAppendException" in str(exc):
                outcome["backfill"] = "ConcurrentAppendException"

    thread = threading.Thread(target=backfill)
    thread.start()
    time.sleep(1.0)
    one_day_ago = end - timedelta(days=1)
    stream = change_points(spark, 10, one_day_ago, 600).withColumn("date", F.to_date("window_end"))
    stream.write.format("delta").mode("append").save(path)
    appended = "the append committed first" if thread.is_alive() else "the backfill finished before the append"
    thread.join()
    return f"{appended}; the backfill: {outcome.get('backfill')}"


if __name__ == "__main__":
    main()
