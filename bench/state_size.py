"""A stream's micro-batch against the panes it holds: the processor's Python time per batch as the state fills.

    python bench/state_size.py [--keys 5000] [--events 50000] [--minutes 1 10 30 60] [--repeats 5]

One bucket of the stream (`--keys` keys, each with an event about every second), a count and a sum over
`Hop("1h", every="1s")` with a 2m watermark, driven through the stream's own processor
(`features.engine.stream.PaneProcessor`) with in-memory state handles (tests/state_handles.py) instead of Spark's:
each batch is what a worker does for the bucket (decode the events, step the pane table, store the chunks it
changed, emit the rows), without Spark or RocksDB, in a process that keeps freed memory for reuse as the stream's
Python workers do (`features.engine.worker_daemon.keep_freed_memory`). The state grows a minute of events at a
time; at each of `--minutes` it has held, `--repeats` batches of `--events` events (one second of event time each)
are timed, and the bytes of the chunks they write counted (what RocksDB is then handed to write and checkpoint).

Two layouts in the same run: the table stored in chunks of `features.kernel.chunk_length` (a 256th of the
window here) and in chunks of an hour (the layout before it, which a batch rewrote whole). Baselines: the same
layout's batch with the fewest minutes held (what the held panes add), and the hour's chunks at the same state.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from results import load, update_section
from state_handles import MemoryHandle, Timers, packed

import features.kernel as pt
from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.engine import stream as engine
from features.engine.worker_daemon import keep_freed_memory
from features.spec import DType

S = 1_000_000
HOUR_US = 3600 * S
# The stream's first event time (µs), 20 minutes into an hour: at each mark the hour layout's newest chunk is
# partly filled, as it is on average in a stream that runs on (at a whole hour it would be empty).
T0 = (1_800_000_000 + 20 * 60) * S
WATERMARK_US = 120 * S
TYPES = {"user_id": DType.STRING, "amount": DType.FLOAT64, "event_ts": DType.TIMESTAMP}
GROUP = FeatureGroup(
    "g",
    Entity("user", join_keys=["user_id"]),
    EventSource("e", path="events", timestamp="event_ts", watermark="2m"),
    [
        Feature("n_1h", agg.count(), window=Hop("1h", every="1s")),
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="1s")),
    ],
)
OUTPUT = {
    engine.KIND: pa.string(),
    "user_id": pa.string(),
    "window_end": pa.int64(),
    "n_1h": pa.int64(),
    "amount_sum_1h": pa.float64(),
    engine.LATEST: pa.bool_(),
    engine.REASON: pa.string(),
    engine.RECORD: pa.string(),
}


class _CountingHandle(MemoryHandle):
    """The in-memory state, counting the bytes of the chunks a batch writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        chunks = self.getMapState("chunks")
        store = chunks.updateValue

        def counted(key, value) -> None:
            self.written += len(value[0])
            store(key, value)

        chunks.updateValue = counted  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--minutes", type=int, nargs="+", default=[1, 10, 30, 60])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-save", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    plan = pt.Plan.of(GROUP, TYPES)
    users = np.array([f"user_{i}" for i in range(args.keys)], dtype=object)

    def events(start_s: int, seconds: int, rng: np.random.Generator) -> pd.DataFrame:
        n = args.events * seconds
        return pd.DataFrame(
            {
                "user_id": users[rng.integers(0, args.keys, n)],
                pt.TS: T0 + start_s * S + rng.integers(0, seconds * S, n),
                "fx_v_raw_amount": rng.random(n),
                engine.REASON: np.full(n, None, dtype=object),
                engine.RECORD: np.full(n, None, dtype=object),
                engine.LANDED: np.full(n, 1, dtype=np.int64),
            }
        )

    def run(chunk_us: int) -> list[tuple[int, int, float, list[float], float]]:
        """(minutes held, panes, median s, batch seconds, MB written per batch) at each of `--minutes`."""
        rng = np.random.default_rng(0)
        engine._RESIDENT.clear()
        processor = engine.PaneProcessor(plan, GROUP.name, OUTPUT, delay_us=WATERMARK_US)
        processor.chunk_us = chunk_us
        handle = _CountingHandle()
        processor.init(handle)
        held, out = 0, []

        def batch(start_s: int, seconds: int) -> float:
            frame = packed(events(start_s, seconds, rng))
            timers = Timers(T0 + (start_s + seconds) * S - WATERMARK_US)
            began = time.perf_counter()
            for _ in processor.handleInputRows((0,), iter([frame]), timers):
                pass
            return time.perf_counter() - began

        for minutes in args.minutes:
            while held < minutes * 60:  # a minute of events at a time (not timed)
                step = min(60, minutes * 60 - held)
                batch(held, step)
                held += step
            times, written = [], []
            for _ in range(args.repeats):
                handle.written = 0
                times.append(batch(held, 1))
                written.append(handle.written / 1e6)
                held += 1
            resident = engine._RESIDENT[(GROUP.name, 0)].table
            out.append((minutes, len(resident), statistics.median(times), times, statistics.median(written)))
            print(
                f"chunks of {chunk_us / S:g} s, {minutes} min: {len(resident):,} panes, "
                f"median {out[-1][2]:.3f} s, {out[-1][4]:.1f} MB written",
                flush=True,
            )
        return out

    keep_freed_memory()
    load_before = load()
    chunk_us = pt.chunk_length(plan)
    short, hour = run(chunk_us), run(HOUR_US)
    lines = [
        f"{load_before} at the start, {load()} at the end.",
        "",
        f"`python bench/state_size.py --keys {args.keys} --events {args.events} --repeats {args.repeats}`: one "
        f'bucket of {args.keys:,} keys, a count and a sum over `Hop("1h", every="1s")`, micro-batches of '
        f"{args.events:,} events (one second of event time) through the stream's processor "
        "(`PaneProcessor.handleInputRows`) with in-memory state handles: its Python time per batch (decode, step, "
        "store the changed chunks, emit), without Spark or RocksDB, medians of "
        f"{args.repeats} batches, with the pane table holding some minutes of 1 s panes of every key. Two layouts "
        f"in the same run: chunks of {chunk_us / S:g} s (`chunk_length`: a 256th of the window) and of one hour "
        "(the layout before). Baselines: the same layout with the fewest minutes held, and the hour's chunks at the "
        "same state.",
        "",
        f"| panes held | panes | chunks of {chunk_us / S:g} s: batch s | MB written | / fewest held "
        "| chunks of 1 h: batch s | MB written | / fewest held | 1 h / short |",
        "|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {m} min | {n:,} | {t:.3f} | {w:.1f} | {t / short[0][2]:.1f}x | {th:.3f} | {wh:.1f} | "
            f"{th / hour[0][2]:.1f}x | {th / t:.1f}x |"
            for (m, n, t, _, w), (_, _, th, _, wh) in zip(short, hour, strict=True)
        ],
        "",
        "Batch seconds (short chunks): "
        + "; ".join(f"{m} min {' / '.join(f'{x:.3f}' for x in ts)}" for m, _, _, ts, _ in short),
    ]
    print("\n".join(lines))
    if not args.no_save:
        update_section("State size (bench/state_size.py)", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
