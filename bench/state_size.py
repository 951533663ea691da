"""A stream's step against the panes it holds: the kernel's time for one micro-batch as the state fills.

    python bench/state_size.py [--keys 5000] [--events 50000] [--minutes 1 10 30 60] [--repeats 5]

One bucket of the stream (`--keys` keys, each with an event about every second), a count and a sum over
`Hop("1h", every="1s")` with a 2m watermark: the pane table holds `--minutes` of 1 s panes for every key, then
micro-batches of `--events` events, one second of event time each, go through `features.kernel.step` as the
stream's processor calls it (watermark, eager values; not its chunk-aligned pruning), on the pane functions alone
(no Spark). Medians of `--repeats` batches per size; the baseline is the smallest state's batch: the ratio is what
the held panes add to a batch of the same events.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import load, update_section

import features.kernel as pt
from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.spec import DType

S = 1_000_000
T0 = 1_800_000_000  # seconds: the stream's first event time
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--minutes", type=int, nargs="+", default=[1, 10, 30, 60])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-save", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    plan = replace(pt.Plan.of(GROUP, TYPES), keys=(pt.KEY,))  # the stream's processor sees key codes
    values = [c.value for c in plan.calcs if c.value is not None]
    rng = np.random.default_rng(0)

    def batch(second: int) -> pd.DataFrame:
        frame = pd.DataFrame(
            {
                pt.KEY: rng.integers(0, args.keys, args.events),
                pt.TS: (T0 + second) * S + rng.integers(0, S, args.events),
            }
        )
        for value in values:
            frame[value] = rng.random(args.events)
        return frame

    def step(table: pd.DataFrame, second: int) -> pt.Step:
        # As the stream: the watermark 2 minutes behind, eager values at the newest closed second.
        return pt.step(
            plan,
            table,
            batch(second),
            (T0 + second - 121) * S,
            (T0 + second - 120) * S,
            eager_at=(T0 + second) * S,
            eager_after=(T0 + second - 1) * S,
        )

    load_before = load()
    rows = []
    for minutes in args.minutes:
        seconds = minutes * 60
        table = pt.combine(plan, [pt.phase1(plan, batch(s)) for s in range(seconds)])
        table = step(table, seconds).table
        times = []
        for i in range(1, args.repeats + 1):
            began = time.perf_counter()
            table = step(table, seconds + i).table
            times.append(time.perf_counter() - began)
        rows.append((minutes, len(table), statistics.median(times), times))
        print(f"{minutes} min: {len(table):,} panes, median {rows[-1][2]:.3f} s", flush=True)
    base = rows[0][2]
    lines = [
        f"{load_before} at the start, {load()} at the end.",
        "",
        f"`python bench/state_size.py --keys {args.keys} --events {args.events} --repeats {args.repeats}`: one "
        f'bucket of {args.keys:,} keys, a count and a sum over `Hop("1h", every="1s")`, micro-batches of '
        f"{args.events:,} events (one second of event time) through `features.kernel.step` as the stream calls it, "
        "with the pane table holding some minutes of 1 s panes of every key; the pane functions alone (no Spark), "
        f"medians of {args.repeats} batches. Baseline: the batch with {args.minutes[0]} minute(s) of panes held.",
        "",
        "| panes held | panes | batch s (median) | batches s | / baseline |",
        "|---|---|---|---|---|",
        *[
            f"| {m} min | {n:,} | {t:.3f} | {' / '.join(f'{x:.3f}' for x in ts)} | {t / base:.1f}x |"
            for m, n, t, ts in rows
        ],
    ]
    print("\n".join(lines))
    if not args.no_save:
        update_section("State size (bench/state_size.py)", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
