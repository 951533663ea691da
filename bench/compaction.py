"""What a live stream's compaction rounds cost as its day grows: full files left alone, against Delta's default.

    python bench/compaction.py [--appends 240] [--rows 40000] [--full-mb 16]

One date partition of a Delta table takes `--appends` appends of `--rows` rows each (a stream's micro-batches
writing to its live day: eight columns of random values, 2.6 MB a file at the default 40,000 rows), with a
compaction round every 16 appends (features.stores.compaction.StreamCompaction, the stream's settings), twice in the
same session, the order alternating by round: (a) the stream's rounds, which leave the files of `--full-mb` or more
as they are, and (b) the same rounds with Delta's OPTIMIZE as it is by default (every file under 1 GiB is rewritten:
the live day's whole compacted file each round). `--full-mb` stands in for the stream's 128 MB so that the day
outgrows it in minutes.
Prints the seconds of each table's rounds early and late in the day and in all, and the ratio (a) / (b).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work" / "compaction"
UNBOUNDED = 2**62  # no file counts as full: every file under Delta's minFileSize is rewritten


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=240)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--full-mb", type=int, default=16)
    args = parser.parse_args()
    from pyspark.sql import functions as F

    from features.engine.session import get_spark
    from features.stores.compaction import EVERY_APPENDS, StreamCompaction
    from features.stores.offline import DATE, files_per_date

    began = load()
    shutil.rmtree(WORK, ignore_errors=True)
    spark = get_spark(app_name="bench-compaction")
    full = args.full_mb * 1024 * 1024
    tables = {"full files left": str(WORK / "bounded"), "Delta's default": str(WORK / "unbounded")}
    rounds = {
        name: StreamCompaction(table, full_bytes=full if name == "full files left" else UNBOUNDED)
        for name, table in tables.items()
    }
    seconds: dict[str, list[float]] = {name: [] for name in tables}
    columns = [F.rand(seed=i).alias(f"f{i}") for i in range(8)]
    for i in range(args.appends):
        batch = spark.range(args.rows).select(F.col("id").alias("key"), *columns, F.lit("2026-01-01").alias(DATE))
        order = list(tables) if (i // EVERY_APPENDS) % 2 == 0 else list(reversed(tables))
        for name in order:
            batch.write.format("delta").mode("append").partitionBy(DATE).save(tables[name])
            start = time.perf_counter()
            if rounds[name].after_append(spark):
                seconds[name].append(time.perf_counter() - start)
    day_mb = {name: sum(_sizes(t)) / 2**20 for name, t in tables.items()}
    lines = [
        f"Run on {time.strftime('%Y-%m-%d')}; {began} at the start.",
        "",
        f"`python bench/compaction.py --appends {args.appends} --rows {args.rows} --full-mb {args.full_mb}`: one date "
        f"partition of a Delta table, {args.appends} appends of {args.rows:,} rows (8 random columns), a round every "
        f"{EVERY_APPENDS} appends, both tables in one local session (2 cores), the order alternating by round; "
        f"(a) files of {args.full_mb} MB or more left as they are (the stream's rounds, whose bound is 128 MB), "
        "(b) Delta's OPTIMIZE by default (files under 1 GiB rewritten).",
        "",
        "| rounds | day's data, MB | files in the day | first 3 rounds, s | last 3 rounds, s | all rounds, s |",
        "|---|---|---|---|---|---|",
    ]
    for name, table in tables.items():
        s = seconds[name]
        files = sum(files_per_date(table).values())
        lines.append(f"| {name} | {day_mb[name]:.0f} | {files} | {sum(s[:3]):.1f} | {sum(s[-3:]):.1f} | {sum(s):.1f} |")
    ratio = sum(seconds["full files left"]) / sum(seconds["Delta's default"])
    late = sum(seconds["full files left"][-3:]) / sum(seconds["Delta's default"][-3:])
    lines += [
        "",
        f"All rounds, (a) / (b): **{ratio:.2f}x**; the last 3 rounds: **{late:.2f}x**.",
        "",
        f"{load()} at the end.",
    ]
    body = "\n".join(lines)
    print(body)
    update_section("Compaction rounds (bench/compaction.py)", body)
    spark.stop()


def _sizes(table: str) -> list[int]:
    import pyarrow as pa
    from deltalake import DeltaTable

    return pa.table(DeltaTable(table).get_add_actions(flatten=True)).column("size_bytes").to_pylist()


if __name__ == "__main__":
    main()
