"""Dense keys with a fine, long window: a stream whose every key gets an event every second, over `Hop("1h", "1s")`.

    python bench/stream_dense.py [--keys 3000] [--file-seconds 20] [--measured-files 30] [--fill-minutes 60]

The shape a user with sensors runs: `--keys` keys, one event per key per second of event time, landed as Parquet
files of `--file-seconds` seconds each (3,000 keys x 20 s = 60,000 events a file); one group of a count, a sum and a
max over `Hop("1h", every="1s")`; `features stream --available-now` with one file per micro-batch through the
product's whole path (validation, offline table, SQLite online store; tracking off), in one Spark session.
Three runs over `--measured-files` files each, so that only ratios within this run compare:
  * early: a fresh stream over the first files of event time (its windows hold up to a few minutes);
  * full: a stream that first took up `--fill-minutes` of earlier files (in micro-batches of 5 minutes of
    files, then stopped, as a running stream is restarted), then the measured files, one per micro-batch: its
    windows are full (an hour of 1 s panes of every key);
  * the floor: a bare Structured Streaming job over the measured files and trigger, one count per key, no windows
    (bench/stream.py's).
Printed: steady events/s of each (the batches after the first two) and seconds per batch; full / early (the
work per batch should follow the events, not the panes held); full / floor. Required (issue: the stream near
Spark's floor): full >= 100,000 events/s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from features.engine.session import get_spark
from features.pipelines.registration import apply
from features.pipelines.stream import stream
from features.repo import Repo

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stream as stream_bench
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work-dense"
START = datetime(2026, 1, 1, tzinfo=UTC)
EXAMPLE = Path(__file__).resolve().parent.parent / "feature_repo"
DEFINITIONS = """
from pathlib import Path

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg, to_feast

HERE = Path(__file__).resolve().parent
sensor = Entity("sensor", join_keys=["sensor_id"])
readings = EventSource("readings", path="{events}", timestamp="event_ts", watermark="10s")
hour = Hop("1h", every="1s")
group = FeatureGroup(
    "dense",
    sensor,
    readings,
    [
        Feature("readings_1h", agg.count(), window=hour),
        Feature("value_sum_1h", agg.sum("value"), window=hour),
        Feature("value_max_1h", agg.max("value"), window=hour),
    ],
)
sensor_entity, source, view = to_feast(group, repo_root=HERE)
"""


def land(folder: Path, keys: int, first_second: int, seconds: int, file_seconds: int) -> None:
    """Files of `file_seconds` seconds each from `first_second` on: every key one reading a second."""
    folder.mkdir(parents=True, exist_ok=True)
    names = np.array([f"s{k:06d}" for k in range(keys)], dtype=object)
    rng = np.random.default_rng(first_second)
    for begin in range(first_second, first_second + seconds, file_seconds):
        second = np.repeat(np.arange(begin, begin + file_seconds), keys)
        # Each reading at a random microsecond of its second, so panes are 1 s but times are not aligned.
        micros = second * 1_000_000 + rng.integers(0, 1_000_000, len(second))
        start_us = int(START.timestamp() * 1_000_000)
        table = pa.table(
            {
                "sensor_id": np.tile(names, file_seconds),
                "value": rng.normal(20.0, 5.0, len(second)),
                "event_ts": pa.array(start_us + micros, pa.timestamp("us", tz="UTC")),
            }
        )
        pq.write_table(table, folder / f"part-{begin // file_seconds:06d}.parquet")


def make_repo(name: str, events: Path) -> Repo:
    root = WORK / name
    root.mkdir(parents=True)
    shutil.copy(EXAMPLE / "feature_store.yaml", root / "feature_store.yaml")
    (root / "dense_groups.py").write_text(DEFINITIONS.format(events=str(events)))
    apply(str(root))
    return Repo.load(root)


def fill(repo: Repo, files_per_batch: int) -> float:
    """Take up the files landed so far in batches of `files_per_batch` files; the seconds it took."""
    began = time.perf_counter()
    run = stream(repo, available_now=True, max_files_per_trigger=files_per_batch, progress=False, tracking=False)
    run.await_termination()
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=3000)
    parser.add_argument("--file-seconds", type=int, default=20)
    parser.add_argument("--measured-files", type=int, default=30)
    parser.add_argument("--fill-minutes", type=int, default=60)
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    stream_bench.WORK = WORK  # the floor writes its output and checkpoint here
    at_start = load()
    spark = get_spark()
    measured_seconds = args.measured_files * args.file_seconds
    fill_seconds = args.fill_minutes * 60

    early_files = WORK / "early_events"
    land(early_files, args.keys, 0, measured_seconds, args.file_seconds)
    early = stream_bench.run_ours(make_repo("early", early_files))
    print(f"early: {early['steady_rate']:,.0f} events/s, {early['batch_s']:.2f} s a batch", flush=True)

    full_files = WORK / "full_events"
    land(full_files, args.keys, 0, fill_seconds, args.file_seconds)
    full_repo = make_repo("full", full_files)
    filled_in = fill(full_repo, max(1, 300 // args.file_seconds))
    print(f"filled {args.fill_minutes} min of events in {filled_in:.0f} s", flush=True)
    land(full_files, args.keys, fill_seconds, measured_seconds, args.file_seconds)
    full = stream_bench.run_ours(full_repo)
    print(f"full: {full['steady_rate']:,.0f} events/s, {full['batch_s']:.2f} s a batch", flush=True)

    floor_files = WORK / "floor_events"
    land(floor_files, args.keys, fill_seconds, measured_seconds, args.file_seconds)
    floor = stream_bench.run_floor(spark, floor_files, "floor", key="sensor_id")
    print(f"floor: {floor['steady_rate']:,.0f} events/s", flush=True)

    events_per_file = args.keys * args.file_seconds
    rows = [
        ("early: a fresh stream, windows up to " + f"{measured_seconds // 60} min", early),
        (f"full: after {args.fill_minutes} min taken up, windows full", full),
        ("floor: bare Structured Streaming, one count per key (no windows)", floor),
    ]
    table = [
        "| run | steady events/s | s per batch | state pane rows | state MB |",
        "|---|---|---|---|---|",
    ]
    for name, run in rows:
        state = f"{run['state_rows']:,} | {run['state_mb']:.1f}" if "state_rows" in run else "- | -"
        table.append(f"| {name} | {run['steady_rate']:,.0f} | {run['batch_s']:.2f} | {state} |")
    figures = [
        "| figure | value | required |",
        "|---|---|---|",
        f"| full, steady events/s | {full['steady_rate']:,.0f} | >= 100,000 |",
        f"| full / early, seconds per batch | {full['batch_s'] / early['batch_s']:.2f}x | |",
        f"| full / floor, steady events/s | {full['steady_rate'] / floor['steady_rate']:.2f} | |",
    ]
    body = "\n".join(
        [
            f"`python bench/stream_dense.py --keys {args.keys} --file-seconds {args.file_seconds} "
            f"--measured-files {args.measured_files} --fill-minutes {args.fill_minutes}`: {args.keys:,} keys, one "
            f"event per key per second of event time, files of {args.file_seconds} s ({events_per_file:,} events), "
            'a count, a sum and a max over `Hop("1h", every="1s")`, `features stream --available-now` one file '
            "per micro-batch (validation, offline table, SQLite online store; tracking off), local Spark on 2 "
            f"cores, {args.measured_files} files measured per run; {at_start} at the start, {load()} at the "
            f"end. The full run's stream first took up {args.fill_minutes} min of earlier files in micro-batches "
            f"of 5 min ({filled_in:.0f} s) and was stopped. Steady = the batches after the first two.",
            "",
            *table,
            "",
            *figures,
        ]
    )
    print(body)
    update_section("Dense keys, a full hour of 1 s panes (bench/stream_dense.py)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
