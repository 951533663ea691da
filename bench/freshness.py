"""Freshness benchmark: how long until an event's effect is online, with a live stream under load.

    python bench/freshness.py [--rate 100000] [--probes 20] [--window 1h] [--every 5s] [--watermark 2m]
                              [--land-phase 0.2]

A live `features stream --trigger 1s` (its own process, as users run it) on a group counting events over
`Hop(--window, every=--every)`, with a 2m watermark. A loader lands a Parquet file of `--rate` events every second in
10,000 background keys, stamped with the current time: in a process of its own at a lower priority, as producers
run on other machines than the stream (the report says the rate it reached). Every few seconds a probe event for
a key of its own is landed, stamped now; the benchmark then polls Feast's `get_online_features` until the
probe's key counts it. The wall time from landing to that read, over all probes, is reported as p50 / p99 / max.
The probes start once the stream runs as it does from then on: it has appended its first change points to the
offline table (the watermark has passed; that batch creates the table and takes seconds once) and three batches
more.
An eager online value is the window's at the newest pane end that has closed in event time (docs/semantics.md,
"Online values"), so a probe counts once its pane has closed: each probe lands at a random point of the pane
grid (not just after the previous one was seen, which would land every probe at the same point), and the report
also gives the part after the probe's pane closed, what the stream itself takes. The report says where in the
wall clock's second the background files landed: the trigger fires on the second, and a 1 s pane closes with the
first file holding a later event, so a file landed in the second after its newest event's costs one trigger more
(`--land-phase` makes the files at a chosen point of the second instead of wherever the loader started).
Required: p99 <= 15 s (the 5 s pane, two triggers and the writes), where a stream that waits for the watermark
would take minutes (the watermark plus a pane).

With `--kafka host:port` the events are produced to a topic of 8 partitions instead (as JSON values, the same
rate and probes), and each probe is timed from the broker's acknowledgement of its record. Required: p99 <= 5 s,
which a pane of 5 s cannot meet whatever the stream does (the pane alone waits up to 5 s): run it with
`--every 1s`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/repo_yaml.py
from repo_yaml import write_feature_store_yaml
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work-fresh"
REPO = WORK / "repo"
KEYS = 10_000
DEFINITIONS = """
from features import Entity, EventSource, Feature, FeatureGroup, Hop, KafkaTopic, agg

user = Entity("user", join_keys=["user_id"])
events = EventSource(
    "events", path="events", timestamp="event_ts", watermark="{watermark}",
    schema={{"user_id": "string", "amount": "double", "event_ts": "timestamp"}},{kafka}
)
fresh = FeatureGroup(
    "fresh", user, events,
    [
        Feature("n", agg.count(), window=Hop("{window}", every="{every}")),
        Feature("amount_sum", agg.sum("amount"), window=Hop("{window}", every="{every}")),
    ],
)
"""


PARTITIONS = 8


def make_repo(window: str, every: str, watermark: str, kafka: str = "") -> None:
    (REPO / "events").mkdir(parents=True)
    write_feature_store_yaml(REPO, "bench_fresh")
    (REPO / "fresh_groups.py").write_text(
        DEFINITIONS.format(window=window, every=every, watermark=watermark, kafka=kafka)
    )
    apply = [sys.executable, "-m", "features.cli", "apply", "--repo", str(REPO)]
    subprocess.run(apply, check=True, capture_output=True)


class Lander:
    """Lands Parquet files in the source folder, each under a hidden name first (the stream never sees half a
    file), named in landing order (`prefix`: one per process landing there)."""

    def __init__(self, prefix: str = "part") -> None:
        self.prefix = prefix
        self.n = 0
        self.lock = threading.Lock()

    def land(self, frame: pd.DataFrame) -> float:
        with self.lock:
            self.n += 1
            name = f"{self.prefix}-{self.n:07d}.parquet"
        hidden = REPO / "events" / f".{name}"
        frame.to_parquet(hidden, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)
        os.replace(hidden, REPO / "events" / name)
        return time.time()


class KafkaLander:
    """Produces each event as a JSON value to a topic, in turn over its partitions; `land` returns when the
    broker has acknowledged the frame's records."""

    def __init__(self, bootstrap: str, topic: str = "") -> None:
        """A new topic, or with `topic` one made already."""
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        self.topic = topic or f"bench_fresh_{int(time.time())}"
        if not topic:
            config = {"message.timestamp.before.max.ms": str(2**63 - 1)}
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.create_topics([NewTopic(self.topic, PARTITIONS, 1, config=config)])[self.topic].result(timeout=60)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.n = 0
        self.lock = threading.Lock()

    def land(self, frame: pd.DataFrame) -> float:
        # Encoded column by column (numpy's string functions): a loop over the events took most of a core at
        # 100,000 a second, beside the stream on the same two cores.
        stamps = np.datetime_as_string(frame["event_ts"].dt.tz_localize(None).to_numpy("datetime64[us]"), unit="us")
        values = '{"user_id":"' + frame["user_id"].to_numpy(str).astype(object)
        values = values + '","amount":' + frame["amount"].to_numpy().astype(str).astype(object)
        values = values + ',"event_ts":"' + stamps.astype(object) + 'Z"}'
        with self.lock:
            for value in values:
                while True:
                    try:
                        self.producer.produce(self.topic, value.encode(), partition=self.n % PARTITIONS)
                        break
                    except BufferError:
                        self.producer.poll(0.05)
                self.n += 1
            self.producer.flush(60)
        return time.time()


def background(kafka: tuple[str, str] | None, rate: int, stop: Any, sent: Any, phase: float | None) -> None:
    """The load: `rate` events a second, landed as files or produced to `kafka` (bootstrap, topic), in a process
    of its own at a lower priority. Producers run on other machines than the stream: here they share its two
    cores, and a loader in the bench's process would also hold the interpreter the probes are timed by. `sent`
    counts the events it landed, so that the report says the rate that was reached. With `phase`, each second's
    events are made at that fraction of the wall clock's second (the stream's trigger fires on the second)."""
    os.nice(10)
    lander: Lander | KafkaLander = KafkaLander(*kafka) if kafka else Lander("background")
    rng = np.random.default_rng(1)
    while not stop.is_set():
        if phase is not None:
            stop.wait((phase - time.time()) % 1.0)
        began = time.time()
        now = pd.Timestamp(began, unit="s", tz="UTC")
        frame = pd.DataFrame(
            {
                "user_id": np.char.add("bg", rng.integers(0, KEYS, rate).astype(str)),
                "amount": rng.random(rate),
                "event_ts": now - pd.to_timedelta(rng.random(rate), unit="s"),
            }
        )
        lander.land(frame)
        with sent.get_lock():
            sent.value += rate
        if phase is None:
            stop.wait(max(0.0, 1.0 - (time.time() - began)))
        else:
            stop.wait(max(0.0, 0.5 - (time.time() - began)))  # then to the phase of the next second


def landing_phases(folder: Path, since: float) -> np.ndarray:
    """Where in the wall clock's second the background files landed since `since` (their last write; a rename
    keeps it): the trigger fires on the second, so a file landed at 0.3 waits 0.7 s for the batch that reads it."""
    times = np.array([f.stat().st_mtime for f in folder.glob("background-*.parquet")])
    return np.mod(times[times >= since], 1.0)


def command_line(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """The options given that differ from their defaults, as they were written (the report names its run)."""
    given = {k: v for k, v in vars(args).items() if k != "no_save" and v != parser.get_default(k)}
    return "".join(f" --{k.replace('_', '-')} {v}" for k, v in given.items())


def steady(log: Path, timeout_s: float) -> None:
    """Wait until the stream has appended its first rows to the offline table (the watermark passed its first pane
    ends: the batch that creates the table and its statistics takes seconds once) and run three batches more."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        totals = [int(t.replace(",", "")) for t in re.findall(r"rows out \(([\d,]+) total\)", log.read_text())]
        if len([t for t in totals if t > 0]) > 3:
            return
        time.sleep(1.0)
    raise RuntimeError(f"the stream appended no rows within {timeout_s:.0f} s: see {log}")


def batch_seconds(log: str) -> list[float]:
    """The seconds of each micro-batch the stream's progress lines report."""
    return [float(m) for m in re.findall(r" batch \d+: [\d,]+ events in ([\d.]+)s", log)]


def wait_online(store, key: str, timeout_s: float) -> float | None:
    """Poll Feast until the probe's key counts its event; the wall time then (None after the timeout)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        response = store.get_online_features(features=["fresh:n"], entity_rows=[{"user_id": key}]).to_dict()
        if (response["n"][0] or 0) >= 1:
            return time.time()
        time.sleep(0.1)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=100_000, help="background events per second")
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--window", default="1h")
    parser.add_argument("--every", default="5s")
    parser.add_argument("--watermark", default="2m")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds a probe may take before it counts as lost")
    parser.add_argument("--kafka", default="", help="Kafka bootstrap servers: produce there instead of landing files")
    parser.add_argument("--no-save", action="store_true", help="do not update bench/RESULTS.md")
    parser.add_argument(
        "--land-phase",
        type=float,
        default=None,
        help="make each second's background events at this fraction of "
        "the wall clock's second (0-1), instead of a second after the last ones were made",
    )
    args = parser.parse_args()
    load_before = load()
    shutil.rmtree(WORK, ignore_errors=True)
    lander = KafkaLander(args.kafka) if args.kafka else Lander()
    source = ""
    if isinstance(lander, KafkaLander):
        source = f"\n    kafka=KafkaTopic({lander.topic!r}, {args.kafka!r}, options={{'startingOffsets': 'earliest'}}),"
    make_repo(args.window, args.every, args.watermark, source)
    context = multiprocessing.get_context("spawn")
    stop, sent = context.Event(), context.Value("q", 0)
    kafka = (args.kafka, lander.topic) if isinstance(lander, KafkaLander) else None
    loader = context.Process(target=background, args=(kafka, args.rate, stop, sent, args.land_phase), daemon=True)
    loader.start()
    loading_since = time.time()
    log = (WORK / "stream.log").open("w")
    command = [sys.executable, "-m", "features.cli", "stream", "--repo", str(REPO), "--trigger", "1s", "--no-tracking"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    from feast import FeatureStore

    store = FeatureStore(repo_path=str(REPO))
    latencies: list[float] = []
    after_pane: list[float] = []  # from the probe's pane closing (its end, in event time) to online
    lost = 0
    every_s = pd.Timedelta(args.every).total_seconds()
    phases = np.random.default_rng(7)
    try:
        time.sleep(45)  # the JVM, the first micro-batches and the backlog they find
        steady(WORK / "stream.log", pd.Timedelta(args.watermark).total_seconds() + 120)
        probing_from = (WORK / "stream.log").stat().st_size
        probing_since = time.time()
        for i in range(args.probes):
            key = f"probe{i}"
            phase = phases.random() * every_s
            time.sleep(1.0)  # after the last probe was seen, then to the probe's point of the pane grid
            time.sleep((phase - time.time()) % every_s)
            stamp = pd.Timestamp.now(tz="UTC")
            landed = lander.land(pd.DataFrame({"user_id": [key], "amount": [1.0], "event_ts": [stamp]}))
            seen = wait_online(store, key, args.timeout)
            if seen is None:
                lost += 1
            else:
                latencies.append(seen - landed)
                pane_end = (np.floor(stamp.timestamp() / every_s) + 1) * every_s
                after_pane.append(seen - max(pane_end, landed))
            print(f"probe {i}: {'lost' if seen is None else f'{seen - landed:.1f}s'}", flush=True)
    finally:
        stop.set()
        loading_s = time.time() - loading_since
        loader.join(timeout=30)
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()
    batches = batch_seconds((WORK / "stream.log").read_text()[probing_from:])
    p50, p99, worst = (np.percentile(latencies, q) for q in (50, 99, 100)) if latencies else (np.nan,) * 3
    stream_p50, stream_p99 = (np.percentile(after_pane, q) for q in (50, 99)) if after_pane else (np.nan,) * 2
    kafka = isinstance(lander, KafkaLander)
    landed_at = np.array([]) if kafka else landing_phases(REPO / "events", probing_since)
    how = f"produced to a Kafka topic of {PARTITIONS} partitions" if kafka else "landed as a Parquet file"
    limit = 5 if kafka else 15
    lines = [
        f"Run on {datetime.now(UTC):%Y-%m-%d}; {load_before} at the start, {load()} at the end.",
        "",
        f"`python bench/freshness.py{command_line(args, parser)}`: a live `features stream "
        f'--trigger 1s` (its own process) on a count and a sum over `Hop("{args.window}", every="{args.every}")`, '
        f"watermark {args.watermark}, SQLite online store; {args.rate:,} background events {how} every second in "
        f"{KEYS:,} keys by a loader in a process of its own at a lower priority (reached: "
        f"{sent.value / loading_s:,.0f} events a second); {args.probes} probe events, each stamped with the current "
        "time, timed from "
        f"{'the broker acknowledging it' if kafka else 'its landing'} until Feast's `get_online_features` "
        f"returns its effect. Each probe lands at a random point of the {args.every} pane grid; an eager value "
        "counts it once its pane has closed in event time, so the last two columns give the part after that (the "
        "stream's own delay).",
        "",
        "| source | probes | online | lost | p50 s | p99 s | max s | required | after the pane closed: p50 s | p99 s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {'Kafka' if kafka else 'files'} | {args.probes} | {len(latencies)} | {lost} | {p50:.1f} | {p99:.1f} "
        f"| {worst:.1f} | p99 <= {limit} s | {stream_p50:.1f} | {stream_p99:.1f} |",
        "",
        f"The stream's micro-batches while the probes ran: {len(batches)}, "
        + (
            "seconds each (the stream's own timing, from the batch's start to its rows online) p50 "
            f"{np.percentile(batches, 50):.1f}, p99 {np.percentile(batches, 99):.1f}, max {max(batches):.1f}."
            if batches
            else "none reported."
        )
        + (
            " The background files landed at "
            + ", ".join(f"{q:.2f}" for q in np.percentile(landed_at, [10, 50, 90]))
            + " s past the wall clock's second (p10, p50, p90; the trigger fires on the second)."
            if len(landed_at)
            else ""
        ),
    ]
    print("\n".join(lines))
    if not args.no_save:
        title = "Freshness from Kafka (bench/freshness.py --kafka)" if kafka else "Freshness (bench/freshness.py)"
        update_section(title, "\n".join(lines))
    shutil.rmtree(WORK, ignore_errors=True)
    return 0 if latencies and lost == 0 and p99 <= limit else 1


if __name__ == "__main__":
    sys.exit(main())
