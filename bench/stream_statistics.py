"""The statistics' cost in a stream: the same micro-batches with and without them.

    python bench/stream_statistics.py [--events 1000000] [--users 10000] [--files 10] [--repeats 3]

The example group `user_transactions` (5 features, bench/stream.py's) streams `--files` Parquet files with
`--available-now`, one file per micro-batch, through the product's whole path (validation, offline table, SQLite
online store; tracking off), from a fresh checkpoint each run, with the statistics on and off
(`BatchSink.statistics`, the only difference), in rounds whose order alternates, in one Spark session. A run's
figure is its steady seconds per micro-batch (the batches after the first two, as bench/stream.py counts them).
Required: with / without <= 1.15, the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

from features.engine.session import get_spark
from features.pipelines.stream import sink

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stream as stream_bench
from results import load, update_section
from stream import FULL_GROUP, land, make_repo, run_ours

REQUIRED = 1.15


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    stream_bench.WORK = Path(__file__).resolve().parent / "work-stream-statistics"
    shutil.rmtree(stream_bench.WORK, ignore_errors=True)
    stream_bench.WORK.mkdir(parents=True)
    load_before = load()
    spark = get_spark("bench-stream-statistics")
    events = land("events", args.events, args.users, args.days, args.files)
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    try:
        for i in range(args.repeats + 1):  # round 0 warms up both (JIT, Python workers)
            for on in (False, True) if i % 2 == 0 else (True, False):
                sink.BatchSink.statistics = on
                repo = make_repo(f"r{i}-{'on' if on else 'off'}", events, FULL_GROUP.format(name="user_transactions"))
                result = run_ours(repo)
                if i:
                    runs[on].append(result)
    finally:
        sink.BatchSink.statistics = True
        shutil.rmtree(stream_bench.WORK, ignore_errors=True)
    ratios = [w["batch_s"] / wo["batch_s"] for w, wo in zip(runs[True], runs[False], strict=True)]
    ratio = statistics.median(ratios)
    lines = [
        f"`python bench/stream_statistics.py`: {args.events:,} generated events of {args.users:,} users over "
        f"{args.days:g} days in {args.files} Parquet files, streamed by `features stream --available-now` one file "
        "per micro-batch into the offline table and the SQLite online store, validated, the example group "
        f"`user_transactions` (5 features); {args.repeats} rounds of a run with and a run without the statistics "
        f"(order alternating) after a warm-up round; local Spark on {spark.sparkContext.defaultParallelism} cores; "
        f"{load_before} at the start, {load()} at the end. Steady seconds per micro-batch: the batches after the "
        "first two.",
        "",
        "| run | steady s per batch (median) | runs |",
        "|---|---|---|",
    ]
    for on, name in ((False, "without statistics"), (True, "with statistics")):
        each = [r["batch_s"] for r in runs[on]]
        lines.append(f"| {name} | {statistics.median(each):.3f} | {', '.join(f'{t:.3f}' for t in each)} |")
    lines += [
        "",
        "| ratio | value | required |",
        "|---|---|---|",
        f"| micro-batch with statistics / without, median of the rounds ({', '.join(f'{r:.2f}' for r in ratios)}) "
        f"| {ratio:.3f}x | <= {REQUIRED:.2f}x |",
    ]
    body = "\n".join(lines)
    print(body)
    update_section("Statistics cost in a stream (bench/stream_statistics.py)", body)
    return 0 if ratio <= REQUIRED else 1


if __name__ == "__main__":
    sys.exit(main())
