"""What a live stream's compaction rounds cost as its day grows: full files left alone, against Delta's default.

    python bench/compaction.py [--appends 240] [--rows 40000] [--full-mb 16]

One date partition of a Delta table takes `--appends` appends of `--rows` rows each (a stream's micro-batches
writing to its live day: eight columns of random values, 2.6 MB a file at the default 40,000 rows), with a
compaction round every 16 appends (features.stores.compaction.StreamCompaction, the stream's settings), three times
in the same session, the order rotating by round: (a) the stream's rounds, which leave the files of `--full-mb` or
more as they are (deltalake's compaction in the driver), (b) the same rounds with Delta's OPTIMIZE, its
`minFileSize` set to the bound (the stream's rounds before deltalake did them), and (c) rounds that rewrite every
file, as Delta's OPTIMIZE does by default (every file under 1 GiB: the live day's whole compacted file each
round). `--full-mb` stands in for the stream's 128 MB so that the day outgrows it in minutes.
Prints the seconds of each table's rounds early and late in the day and in all, and the ratios (a) / (c) and
(b) / (a).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work" / "compaction"
UNBOUNDED = 2**62  # no file counts as full: every file is rewritten
BOUNDED, OPTIMIZE, EVERY = "(a) full files left", "(b) full files left, Delta's OPTIMIZE", "(c) every file rewritten"


class OptimizeRounds:
    """The stream's rounds as they ran before deltalake did them: Delta's OPTIMIZE of the dates holding more than
    `above` files under `full` bytes, every `every` appends, its minFileSize set to `full`."""

    def __init__(self, table: str, full: int, above: int, every: int) -> None:
        self.table, self.full, self.above, self.every, self.appends = table, full, above, every, 0

    def after_append(self, spark) -> dict:
        from features.stores.compaction import optimize
        from features.stores.offline import files_per_date

        self.appends += 1
        if self.appends % self.every:
            return {}
        crowded = {d: n for d, n in files_per_date(self.table, self.full).items() if n > self.above}
        if crowded:
            optimize(spark, self.table, list(crowded), self.full)
        return crowded


def waited(compaction) -> Callable[[object], dict]:
    """`compaction.after_append` that returns once the round it starts has ended (a stream's run beside its
    batches): the round's own time is what is measured."""

    def after_append(spark) -> dict:
        compaction.after_append(spark)
        return compaction.wait()

    return after_append


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=240)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--full-mb", type=int, default=16)
    args = parser.parse_args()
    from pyspark.sql import functions as F

    from features.engine.session import get_spark
    from features.stores.compaction import COMPACT_ABOVE, EVERY_APPENDS, StreamCompaction
    from features.stores.offline import DATE, files_per_date

    began = load()
    shutil.rmtree(WORK, ignore_errors=True)
    spark = get_spark(app_name="bench-compaction")
    full = args.full_mb * 1024 * 1024
    tables = {BOUNDED: str(WORK / "bounded"), OPTIMIZE: str(WORK / "optimize"), EVERY: str(WORK / "unbounded")}
    rounds = {
        BOUNDED: waited(StreamCompaction(tables[BOUNDED], full_bytes=full)),
        OPTIMIZE: OptimizeRounds(tables[OPTIMIZE], full, COMPACT_ABOVE, EVERY_APPENDS).after_append,
        EVERY: waited(StreamCompaction(tables[EVERY], full_bytes=UNBOUNDED)),
    }
    seconds: dict[str, list[float]] = {name: [] for name in tables}
    columns = [F.rand(seed=i).alias(f"f{i}") for i in range(8)]
    for i in range(args.appends):
        batch = spark.range(args.rows).select(F.col("id").alias("key"), *columns, F.lit("2026-01-01").alias(DATE))
        shift = (i // EVERY_APPENDS) % len(tables)
        for name in [*tables][shift:] + [*tables][:shift]:
            batch.write.format("delta").mode("append").partitionBy(DATE).save(tables[name])
            start = time.perf_counter()
            if rounds[name](spark):
                seconds[name].append(time.perf_counter() - start)
    day_mb = {name: sum(_sizes(t)) / 2**20 for name, t in tables.items()}
    lines = [
        f"Run on {time.strftime('%Y-%m-%d')}; {began} at the start.",
        "",
        f"`python bench/compaction.py --appends {args.appends} --rows {args.rows} --full-mb {args.full_mb}`: one date "
        f"partition of a Delta table, {args.appends} appends of {args.rows:,} rows (8 random columns), a round every "
        f"{EVERY_APPENDS} appends, the three tables in one local session (2 cores), the order rotating by round; "
        f"(a) files of {args.full_mb} MB or more left as they are (the stream's rounds, whose bound is 128 MB: "
        "deltalake's compaction in the driver), (b) the same rounds with Delta's OPTIMIZE (its minFileSize set to "
        "the bound: the stream's rounds before), (c) every file rewritten (as Delta's OPTIMIZE by default: files "
        "under 1 GiB).",
        "",
        "| rounds | day's data, MB | files in the day | first 3 rounds, s | last 3 rounds, s | all rounds, s |",
        "|---|---|---|---|---|---|",
    ]
    for name, table in tables.items():
        s = seconds[name]
        files = sum(files_per_date(table).values())
        lines.append(f"| {name} | {day_mb[name]:.0f} | {files} | {sum(s[:3]):.1f} | {sum(s[-3:]):.1f} | {sum(s):.1f} |")
    ratio = sum(seconds[BOUNDED]) / sum(seconds[EVERY])
    late = sum(seconds[BOUNDED][-3:]) / sum(seconds[EVERY][-3:])
    engine = sum(seconds[OPTIMIZE]) / sum(seconds[BOUNDED])
    lines += [
        "",
        f"All rounds, (a) / (c): **{ratio:.2f}x**; the last 3 rounds: **{late:.2f}x**. Delta's OPTIMIZE / deltalake "
        f"for the same rounds, (b) / (a): **{engine:.1f}x**.",
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
