"""What a stream's file source pays each micro-batch to find new files, as its landing folder fills: Spark's file
source lists the whole folder at every trigger (its `latestOffset` phase), files read long ago included.

    python bench/source_listing.py [--files 1000,10000,50000,100000,200000] [--batches 12] [--no-save]

For each size: a folder of that many small Parquet files (hard links of a few, in hourly subfolders of 3,600 as a
file-a-second producer would land them) and a plain Structured Streaming query over it as `features stream` reads a
folder (recursive lookup), reading the newest unread file at each trigger (`latestFirst`, `maxFilesPerTrigger` 1:
Spark then lists at every trigger, as it does in a live stream whose batches take what landed since the last),
into Spark's noop sink, batches back to back. Printed: the medians over the batches after the first two of the
`latestOffset` phase and of the whole trigger, and the listing's ratio to the first size's (the baseline, in the
same run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from features.engine.session import get_spark

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work" / "source_listing"
PER_FOLDER = 3_600  # an hour of a file a second
PER_SEED = 60_000  # under the file system's limit of hard links to one file


def fill(folder: Path, have: int, want: int) -> None:
    """Files `have` .. `want` - 1 of the folder, each a hard link to one of a few small Parquet files."""
    for i in range(have, want):
        seed = WORK / f"seed-{i // PER_SEED}.parquet"
        if not seed.exists():
            pd.DataFrame({"user_id": ["u1"], "amount": [1.0]}).to_parquet(seed)
        hour = folder / f"hour={i // PER_FOLDER:05d}"
        if i % PER_FOLDER == 0:
            hour.mkdir(parents=True, exist_ok=True)
        os.link(seed, hour / f"part-{i:07d}.parquet")


def listed(spark, folder: Path, batches: int) -> tuple[float, float]:
    """Medians (s) of the `latestOffset` phase and of the trigger, over the batches after the first two."""
    query = (
        spark.readStream.schema("user_id string, amount double")
        .option("recursiveFileLookup", "true")
        .option("latestFirst", "true")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(folder))
        .writeStream.format("noop")
        .option("checkpointLocation", str(WORK / f"checkpoint-{time.time_ns()}"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        while len([p for p in query.recentProgress if p["numInputRows"] > 0]) < batches + 2:
            time.sleep(0.2)
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
    finally:
        query.stop()
    steady = [p["durationMs"] for p in query.recentProgress if p["numInputRows"] > 0][2:]
    return (
        statistics.median(d["latestOffset"] for d in steady) / 1000,
        statistics.median(d["triggerExecution"] for d in steady) / 1000,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default="1000,10000,50000,100000,200000")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    spark = get_spark()
    folder, have, rows = WORK / "landing", 0, []
    for n in sorted(int(x) for x in args.files.split(",")):
        fill(folder, have, n)
        have = n
        rows.append((n, *listed(spark, folder, args.batches)))
        print(f"{n:,} files: listing {rows[-1][1]:.3f} s, trigger {rows[-1][2]:.3f} s", flush=True)
    shutil.rmtree(WORK, ignore_errors=True)
    base = rows[0][1]
    lines = [
        f"`python bench/source_listing.py --files {args.files} --batches {args.batches}`, {load()}. Seconds a "
        "micro-batch (medians); the ratio is the listing's to the first size's (the baseline), in the same run.",
        "",
        "| files in the folder | Spark's `latestOffset` (the listing) | ratio | the whole trigger | days of a file a "
        "second |\n|---|---|---|---|---|",
    ]
    for n, listing, trigger in rows:
        lines.append(f"| {n:,} | {listing:.3f} | **{listing / base:.1f}** | {trigger:.3f} | {n / 86_400:.2f} |")
    body = "\n".join(lines)
    print(body)
    if not args.no_save:
        update_section("A stream's file listing as its folder fills (bench/source_listing.py)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
