"""A soak of dense keys: every key an event every second for `--hours` of event time, over `Hop("1h", "1s")`.

    python bench/soak_dense.py [--keys 1000] [--hours 2] [--file-seconds 20]

bench/stream_dense.py's group (a count, a sum and a max over `Hop("1h", every="1s")`) and data (one reading per key
per second, Parquet files of `--file-seconds` s), streamed by one `features stream --available-now` run through the
product's whole path (validation, statistics, offline Delta table, SQLite online store; tracking off), one file per
micro-batch, from an empty checkpoint to the end of `--hours` of event time. The batches are cut into four quarters
of event time: in the first hour the windows fill (the state grows), after it they are full and as many panes leave
as enter, so a stream whose work follows what changed keeps its batch time, and one whose work follows what it
holds (or whose tables' logs grow with the batches) gets slower. Printed: each quarter's median seconds per batch
and state; required: the last quarter's median <= 1.2x the second's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import pandas as pd

from features.pipelines.stream import stream

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stream_dense
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work-soak-dense"
REQUIRED = 1.2


def quarters(history: pd.DataFrame) -> pd.DataFrame:
    """Median seconds per batch, events and largest state of each quarter of the batches that read events."""
    batches = history[history["events"] > 0].reset_index(drop=True)
    batches["quarter"] = (batches.index * 4 // len(batches)) + 1
    return batches.groupby("quarter").agg(
        batches=("batch_seconds", "size"),
        median_s=("batch_seconds", "median"),
        p90_s=("batch_seconds", lambda s: s.quantile(0.9)),
        events=("events", "median"),
        state_rows=("state_rows", "max"),
        state_mb=("state_bytes", lambda s: s.max() / 1e6),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--file-seconds", type=int, default=20)
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    stream_dense.WORK = WORK
    at_start = load()
    events = WORK / "events"
    seconds = int(args.hours * 3600)
    stream_dense.land(events, args.keys, 0, seconds, args.file_seconds)
    repo = stream_dense.make_repo("soak", events)
    began = time.perf_counter()
    run = stream(repo, available_now=True, max_files_per_trigger=1, progress=False, tracking=False)
    run.await_termination()
    took = time.perf_counter() - began
    table = quarters(run.status())
    ratio = table.loc[4, "median_s"] / table.loc[2, "median_s"]
    lines = [
        "| quarter | batches | s per batch (median) | p90 | events per batch | state pane rows | state MB |",
        "|---|---|---|---|---|---|---|",
    ]
    span = args.hours * 60 / 4
    for quarter, row in table.iterrows():
        minutes = f"{(quarter - 1) * span:.0f}-{quarter * span:.0f} min"
        lines.append(
            f"| {quarter} ({minutes}) | {int(row.batches)} | {row.median_s:.2f} | {row.p90_s:.2f} | {row.events:,.0f} "
            f"| {row.state_rows:,.0f} | {row.state_mb:.1f} |"
        )
    body = "\n".join(
        [
            f"`python bench/soak_dense.py --keys {args.keys} --hours {args.hours:g} --file-seconds "
            f"{args.file_seconds}`: {args.keys:,} keys, one event per key per second for {args.hours:g} h of event "
            f'time in files of {args.file_seconds} s, a count, a sum and a max over `Hop("1h", every="1s")`, one '
            f"`features stream --available-now` run, one file per micro-batch (validation, statistics, offline "
            f"table, SQLite online store; tracking off), local Spark on 2 cores; {took:.0f} s in all; {at_start} "
            f"at the start, {load()} at the end.",
            "",
            *lines,
            "",
            "| figure | value | required |",
            "|---|---|---|",
            f"| last quarter / second quarter, median s per batch | {ratio:.2f}x | <= {REQUIRED}x |",
        ]
    )
    print(body)
    update_section("Soak of dense keys (bench/soak_dense.py)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
