"""A stream's micro-batch against the panes it holds: the processor's Python time per batch as the state fills.

    python bench/state_size.py [--keys 5000] [--events 50000] [--minutes 1 10 30 60] [--repeats 7]
                               [--shapes count_sum min_max top_k]

One bucket of the stream (`--keys` keys, each with an event about every second) driven through the stream's own
processor (`features.engine.stream_operator.PaneProcessor`) with in-memory state handles (tests/state_handles.py)
instead of Spark's: each batch is what a worker does for the bucket (decode the events, step the pane table, store the
chunks it changed, emit the rows), without Spark or RocksDB, in a process that keeps freed memory for reuse as the
stream's Python workers do (`features.engine.worker_daemon.keep_freed_memory`). Three groups (`--shapes`), each over
`Hop("1h", every="1s")` with a 2m watermark: a count and a sum (aggregations that add up), a min and a max, and a
top_k (3 largest). The state grows a minute of events at a time (every key one event a second: a pane per key
and second); at each of `--minutes` it has held, `--repeats` batches of `--events` events (one second of event
time each) are timed, and the bytes of the chunks they write counted (what RocksDB is then handed to write and
checkpoint). Baseline: a second bucket of the same group holding the fewest minutes (what the held panes add),
timed in turns with the first, so that each ratio pairs two batches run a moment apart on a shared machine.
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
from features.engine import stream_operator, stream_rows
from features.engine.batch import ARROW_TYPES
from features.engine.worker_daemon import keep_freed_memory
from features.spec import DType

S = 1_000_000
# The stream's first event time (µs), 20 minutes into an hour.
T0 = (1_800_000_000 + 20 * 60) * S
WATERMARK_US = 120 * S
TYPES = {"user_id": DType.STRING, "amount": DType.FLOAT64, "event_ts": DType.TIMESTAMP}
HOUR = Hop("1h", every="1s")
SHAPES = {
    "count_sum": [Feature("n_1h", agg.count(), window=HOUR), Feature("amount_sum_1h", agg.sum("amount"), window=HOUR)],
    "min_max": [
        Feature("amount_min_1h", agg.min("amount"), window=HOUR),
        Feature("amount_max_1h", agg.max("amount"), window=HOUR),
    ],
    "top_k": [Feature("amount_top3_1h", agg.top_k("amount", 3), window=HOUR)],
}


def group_of(shape: str) -> FeatureGroup:
    return FeatureGroup(
        shape,
        Entity("user", join_keys=["user_id"]),
        EventSource("e", path="events", timestamp="event_ts", watermark="2m"),
        SHAPES[shape],
    )


def output_of(group: FeatureGroup) -> dict[str, pa.DataType]:
    types = group.output_types(TYPES)
    return {
        stream_rows.KIND: pa.string(),
        "user_id": pa.string(),
        "window_end": pa.int64(),
        **{f.name: ARROW_TYPES[types[f.name]] for f in group.features},
        stream_operator.LATEST: pa.bool_(),
        stream_rows.REPLACED: pa.bool_(),
        stream_rows.REASON: pa.string(),
        stream_rows.RECORD: pa.string(),
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
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--no-save", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    users = np.array([f"user_{i}" for i in range(args.keys)], dtype=object)

    def frame(keys: np.ndarray, ts: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
        n = len(keys)
        return pd.DataFrame(
            {
                "user_id": users[keys],
                pt.TS: ts,
                "fx_v_raw_amount": rng.random(n),
                stream_rows.REASON: np.full(n, None, dtype=object),
                stream_rows.RECORD: np.full(n, None, dtype=object),
                stream_operator.LANDED: np.full(n, 1, dtype=np.int64),
            }
        )

    class Bucket:
        """One bucket of a group's stream, its state grown a minute of events at a time."""

        def __init__(self, group: FeatureGroup, label: int, rng: np.random.Generator) -> None:
            self.label, self.rng, self.held = label, rng, 0
            self.processor = stream_operator.PaneProcessor(
                pt.Plan.of(group, TYPES), group.name, output_of(group), delay_us=WATERMARK_US
            )
            self.handle = _CountingHandle()
            self.processor.init(self.handle)

        def batch(self, events: pd.DataFrame, upto_s: int) -> float:
            packed_events = packed(events)
            timers = Timers(T0 + upto_s * S - WATERMARK_US)
            began = time.perf_counter()
            for _ in self.processor.handleInputRows((self.label,), iter([packed_events]), timers):
                pass
            return time.perf_counter() - began

        def grow(self, minutes: int) -> None:
            """Up to `minutes` of panes, every key one event a second (not timed)."""
            while self.held < minutes * 60:
                seconds = min(60, minutes * 60 - self.held)
                second = np.repeat(np.arange(self.held, self.held + seconds), args.keys)
                keys = np.tile(np.arange(args.keys), seconds)
                self.batch(
                    frame(keys, T0 + second * S + self.rng.integers(0, S, len(keys)), self.rng), self.held + seconds
                )
                self.held += seconds

        def timed(self) -> tuple[float, float]:
            """A batch of `--events` events in the next second: (seconds, MB written)."""
            self.handle.written = 0
            keys = self.rng.integers(0, args.keys, args.events)
            ts = T0 + self.held * S + self.rng.integers(0, S, args.events)
            took = self.batch(frame(keys, ts, self.rng), self.held + 1)
            self.held += 1
            return took, self.handle.written / 1e6

    def run(shape: str) -> list[tuple[int, int, float, float, float, list[float]]]:
        """At each of `--minutes`: (minutes held, panes, median s, the baseline's median s, the median of the
        paired ratios, MB written per batch). A bucket holding the fewest minutes and one holding more are timed
        in turns, so each ratio pairs two batches run a moment apart on the shared machine."""
        group = group_of(shape)
        stream_operator._RESIDENT.clear()
        fewest, grown = Bucket(group, 0, np.random.default_rng(0)), Bucket(group, 1, np.random.default_rng(1))
        fewest.grow(args.minutes[0])
        out = []
        for minutes in args.minutes:
            grown.grow(minutes)
            pairs = [(fewest.timed(), grown.timed()) for _ in range(args.repeats)]
            base, times = [b[0] for b, _ in pairs], [g[0] for _, g in pairs]
            ratio = statistics.median(g[0] / b[0] for b, g in pairs)
            panes = stream_operator._RESIDENT[(group.name, 1)].held.rows
            written = statistics.median(g[1] for _, g in pairs)
            out.append((minutes, panes, statistics.median(times), statistics.median(base), ratio, written))
            print(
                f"{shape}, {minutes} min: {panes:,} panes, median {out[-1][2]:.3f} s (fewest held "
                f"{out[-1][3]:.3f} s, {ratio:.2f}x), {written:.1f} MB; batches {' / '.join(f'{t:.3f}' for t in times)}",
                flush=True,
            )
        return out

    keep_freed_memory()
    load_before = load()
    chunk_us = pt.chunk_length(pt.Plan.of(group_of(args.shapes[0]), TYPES))
    runs = {shape: run(shape) for shape in args.shapes}
    header = " | ".join(f"{shape}: batch s | fewest held: batch s | paired ratio" for shape in args.shapes)
    lines = [
        f"{load_before} at the start, {load()} at the end.",
        "",
        f"`python bench/state_size.py --keys {args.keys} --events {args.events} --repeats {args.repeats}`: one "
        f'bucket of {args.keys:,} keys, three groups over `Hop("1h", every="1s")` (count and sum; min and max; '
        f"top_k of 3), micro-batches of {args.events:,} events (one second of event time) through the stream's "
        "processor (`PaneProcessor.handleInputRows`) with in-memory state handles: its Python time per batch "
        f"(decode, step, store the changed chunks, emit), without Spark or RocksDB, with the state holding some "
        f"minutes of 1 s panes of every key, in chunks of {chunk_us / S:g} s. Baseline: a bucket of the same group "
        f"holding about {args.minutes[0]} minute(s), timed in turns with the one holding more ({args.repeats} "
        "pairs): medians of each, and the median of the pairs' ratios.",
        "",
        f"| panes held | panes | {header} |",
        "|---|---|" + "---|---|---|" * len(args.shapes),
        *[
            f"| {m} min | {n:,} | "
            + " | ".join(f"{runs[s][i][2]:.3f} | {runs[s][i][3]:.3f} | {runs[s][i][4]:.2f}x" for s in args.shapes)
            + " |"
            for i, (m, n, *_) in enumerate(runs[args.shapes[0]])
        ],
        "",
        "MB written per batch (median): "
        + "; ".join(f"{s} " + " / ".join(f"{r[5]:.1f}" for r in runs[s]) for s in args.shapes),
    ]
    print("\n".join(lines))
    if not args.no_save:
        update_section("State size (bench/state_size.py)", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
