"""What a stream's read of files holding a column as Arrow's null type costs the micro-batches of files without one.

    python bench/stream_nulls.py [--sizes 1000000:10,100000:20] [--users 10000] [--repeats 3]

A stream reads such files (pandas writes a column of None alone so) by a source of its own: a second listing of the
landing folder, a look at each new file's footer in a Python worker, and the same look in the main read's check of
each file (features.engine.stream_source.read_stream). For each size (`events:files`), the example group
`user_transactions` (5 features, bench/stream.py's) streams the files with `--available-now`, one file per
micro-batch, through the product's whole path (validation, offline table, SQLite online store; tracking off), from a
fresh checkpoint each run, with that read (`features.engine.stream_source.NULLS_READ`, as every new checkpoint has
it) and without it (as a checkpoint from before it), in rounds whose order alternates, in one Spark session. None of the
files holds a null-typed column. A run's figure is its steady seconds per micro-batch (the batches after the first
two, as bench/stream.py counts them). Required: with / without <= 1.05, the median of the rounds' ratios, each size.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

from features.engine import stream_source
from features.engine.session import get_spark

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stream as stream_bench
from results import load, update_section
from stream import FULL_GROUP, land, make_repo, run_ours

REQUIRED = 1.05


def measure(events: int, files: int, users: int, repeats: int) -> dict[bool, list[float]]:
    """Steady seconds per micro-batch of each run, with the read (True) and without it (False)."""
    landed = land(f"events-{events}-{files}", events, users, 2.0, files)
    runs: dict[bool, list[float]] = {True: [], False: []}
    for i in range(repeats + 1):  # round 0 warms up both (JIT, Python workers)
        for on in (False, True) if i % 2 == 0 else (True, False):
            stream_source.NULLS_READ = on
            repo = make_repo(
                f"{events}-{files}-r{i}-{'on' if on else 'off'}", landed, FULL_GROUP.format(name="user_transactions")
            )
            result = run_ours(repo)
            if i:
                runs[on].append(result["batch_s"])
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000:10,100000:20", help="events:files, comma-separated")
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [tuple(int(n) for n in size.split(":")) for size in args.sizes.split(",")]
    stream_bench.WORK = Path(__file__).resolve().parent / "work-stream-nulls"
    shutil.rmtree(stream_bench.WORK, ignore_errors=True)
    stream_bench.WORK.mkdir(parents=True)
    load_before = load()
    spark = get_spark("bench-stream-nulls")
    measured = {}
    try:
        for events, files in sizes:
            measured[(events, files)] = measure(events, files, args.users, args.repeats)
    finally:
        stream_source.NULLS_READ = True
        shutil.rmtree(stream_bench.WORK, ignore_errors=True)
    lines = [
        f"`python bench/stream_nulls.py --sizes {args.sizes}`: generated events of {args.users:,} users over 2 days "
        "in Parquet files none of which holds a null-typed column, streamed by `features stream --available-now` one "
        "file per micro-batch into the offline table and the SQLite online store, validated, the example group "
        f"`user_transactions` (5 features); per size, {args.repeats} rounds of a run with and a run without the read "
        "of files holding a column as Arrow's null type (order alternating) after a warm-up round; local Spark on "
        f"{spark.sparkContext.defaultParallelism} cores; {load_before} at the start, {load()} at the end. Steady "
        "seconds per micro-batch: the batches after the first two.",
        "",
        "| events, files | steady s per batch without (median; runs) | with (median; runs) | with / without, median "
        "of the rounds' ratios | required |",
        "|---|---|---|---|---|",
    ]
    met = True
    for (events, files), runs in measured.items():
        ratios = [w / wo for w, wo in zip(runs[True], runs[False], strict=True)]
        ratio = statistics.median(ratios)
        met = met and ratio <= REQUIRED
        cells = [
            f"{statistics.median(runs[on]):.3f}; {', '.join(f'{t:.3f}' for t in runs[on])}" for on in (False, True)
        ]
        each = ", ".join(f"{r:.2f}" for r in ratios)
        lines.append(f"| {events:,}, {files} | {cells[0]} | {cells[1]} | {ratio:.3f}x ({each}) | <= {REQUIRED:.2f}x |")
    body = "\n".join(lines)
    print(body)
    update_section("Null-typed columns in a stream (bench/stream_nulls.py)", body)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
