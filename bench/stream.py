"""Streaming benchmark: `features stream` against Spark's own streaming `groupBy(key, window(ts, size, slide))`.

    python bench/stream.py [--events 5000000] [--users 10000] [--files 10] [--big-users 1000000] [--repeats 3]

Events land as `--files` Parquet files; every run streams them with `--available-now`, one file per
micro-batch, through the product's whole path (validation, offline table, SQLite online store), in one Spark
session, so only ratios within this run compare:
  * events/s of a one-feature group (count over 24h windows) sliding every 5m (required: >= 150k/s) and every 5s
    (required: >= 200k/s), the median of `--repeats` rounds (all runs listed)
  * the same for the full example group `user_transactions`, 5 features of 4 window shapes (required: >= 150k/s),
    and for a session group: 4 features over `Session("30m", every="1m")` (required: >= 100k/s)
  * the naive streaming query at 24h/5m and ours, both on the first `--naive-events` events in 2 files
    (ratio printed)
  * each rate also as a ratio to a floor measured in the same run: a bare Structured Streaming job over the same
    files and trigger, one count per key (no windows), appending to Parquet
  * per-batch time and state size with `--users` keys and with `--big-users` keys (batch cost should follow
    the keys a batch touches)
  * with a Kafka broker on `--kafka` (`.ci/kafka start`; "" skips): the same events produced to a topic of 8
    partitions, once as JSON values and once as Avro values (`--kafka-formats`), the full group streamed from each
    in as many batches as there are files (required: >= 0.8 of the file source's steady events/s). Each round
    runs the Kafka runs beside the file source's (before it in odd rounds), and the ratio is the median of the
    rounds' own ratios, so that the machine's drift over the run does not fall between the two. With JSON values,
    each round also streams the same events landed as JSON-lines files (`format="json"`): Kafka JSON / JSON files
    is what the Kafka source costs beside a file source that decodes the same text.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from features.demo import generate_transactions, write_events
from features.engine import stream_operator
from features.engine.session import get_spark
from features.pipelines.registration import apply
from features.pipelines.stream import stream
from features.repo import Repo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work-stream"  # not under work/, which bench/backfill.py clears
START = datetime(2026, 1, 1, tzinfo=UTC)
EXAMPLE = Path(__file__).resolve().parent.parent / "feature_repo"

DEFINITIONS = """
from pathlib import Path

from features import Entity, EventSource, Feature, FeatureGroup, Hop, KafkaTopic, Lifetime, Session, agg, to_feast

HERE = Path(__file__).resolve().parent
user = Entity("user", join_keys=["user_id"])
transactions = EventSource("transactions", path="{events}", timestamp="event_ts", watermark="10m"{kafka})
{groups}
"""
SCHEMA = {
    "txn_id": "string",
    "user_id": "string",
    "card_id": "string",
    "merchant_id": "string",
    "amount": "double",
    "status": "string",
    "event_ts": "timestamp",
    "is_fraud": "int64",
}
KAFKA_PARTITIONS = 8
_AVRO_TYPES: dict[str, Any] = {
    "string": "string",
    "double": "double",
    "int64": "long",
    "timestamp": {"type": "long", "logicalType": "timestamp-micros"},
}
AVRO_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Transaction",
        "fields": [{"name": c, "type": ["null", _AVRO_TYPES[t]]} for c, t in SCHEMA.items()],
    }
)
ONE_FEATURE = """
group = FeatureGroup("{name}", user, transactions, [Feature("txn_count_24h", agg.count(), Hop("24h", "{every}"))])
user_entity, source, view = to_feast(group, repo_root=HERE)
"""
FULL_GROUP = """
group = FeatureGroup(
    "{name}",
    user,
    transactions,
    [
        Feature("failed_count_24h", agg.count(), window=Hop("24h", every="5m"), where="status = 'FAILED'"),
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("amount_max_24h", agg.max("amount"), window=Hop("24h", every="5m")),
        Feature("merchants_24h", agg.approx_count_distinct("merchant_id"), window=Hop("24h", every="1h")),
        Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="1h")),
    ],
)
user_entity, source, view = to_feast(group, repo_root=HERE)
"""
SESSION_GROUP = """
in_session = Session("30m", every="1m")
group = FeatureGroup(
    "{name}",
    user,
    transactions,
    [
        Feature("attempts_in_session", agg.count(), window=in_session),
        Feature("failed_in_session", agg.count(), window=in_session, where="status = 'FAILED'"),
        Feature("session_spend", agg.sum("amount"), window=in_session),
        Feature("session_seconds", agg.session_duration(), window=in_session),
    ],
)
user_entity, source, view = to_feast(group, repo_root=HERE)
"""


def land(name: str, events: int, users: int, days: float, files: int) -> Path:
    folder = WORK / name
    frame = generate_transactions(events, users, START, days, seed=11)
    write_events(frame, folder, n_files=files)
    return folder


def shape_repo(shape: str, files: int, users: int = 10_000) -> Repo:
    """`files` files of 500,000 events over `users` keys landed, and a repo streaming them: `count` one count over
    `Hop("24h", every="5m")`, `group` the 5-feature group `user_transactions` (bench/stream_profile.py and
    bench/stream_step.py stream these)."""
    events = land("events", 500_000 * files, users, 2.0 * files / 10, files)
    if shape == "count":
        return make_repo("count", events, ONE_FEATURE.format(name="count_24h_5m", every="5m"))
    return make_repo("group", events, FULL_GROUP.format(name="user_transactions"))


def as_json_lines(events: Path) -> Path:
    """The landed Parquet files again as JSON-lines files of the same names' order (what a JSON producer sends)."""
    import pandas as pd

    folder = WORK / "events_json"
    for i, file in enumerate(sorted(events.glob("*.parquet"))):
        write_events(pd.read_parquet(file), folder, format="json", start_index=i)
    return folder


def make_repo(name: str, events: Path, groups: str, kafka: str = "") -> Repo:
    root = WORK / name
    root.mkdir(parents=True)
    shutil.copy(EXAMPLE / "feature_store.yaml", root / "feature_store.yaml")
    (root / "bench_groups.py").write_text(DEFINITIONS.format(events=str(events), groups=groups, kafka=kafka))
    apply(str(root))
    return Repo.load(root)


def run_ours(repo: Repo) -> dict[str, float]:
    """Stream everything that landed; events/s overall and after the first (warm-up) batch."""
    began = time.perf_counter()
    run = stream(repo, available_now=True, max_files_per_trigger=1, progress=True, tracking=False)
    run.await_termination()
    total = time.perf_counter() - began
    query = next(iter(run.queries.values()))
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    history = run.status()
    steady = batches[2:] or batches  # the first two batches warm up (the first emits nothing)
    steady_rows = sum(p["numInputRows"] for p in steady)
    steady_s = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    events = int(history["events"].sum())
    return {
        "events": events,
        "seconds": total,
        "rate": events / total,
        "steady_rate": steady_rows / steady_s,
        "batch_s": steady_s / len(steady),
        "state_rows": int(history["state_rows"].max()),
        "state_mb": float(history["state_bytes"].max()) / 1e6,
        "rows_out": int(history["rows_emitted"].sum()),
    }


def produce(events: Path, bootstrap: str, topic: str, value_format: str = "json") -> float:
    """Produce the landed events to a new topic, as JSON or Avro values (`AVRO_SCHEMA`, fastavro's encoder), in
    turn over its partitions (so that each partition's event time moves as the files' does); returns records per
    second produced (the encoding included)."""
    import pandas as pd
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"retention.ms": "-1", "message.timestamp.before.max.ms": str(2**63 - 1)}
    admin.create_topics([NewTopic(topic, KAFKA_PARTITIONS, 1, config=config)])[topic].result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000})
    began, sent = time.perf_counter(), 0
    for file in sorted(events.glob("*.parquet")):
        for value in _values(pd.read_parquet(file), value_format, WORK / "json" / file.stem):
            while True:
                try:
                    producer.produce(topic, value, partition=sent % KAFKA_PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.1)
            sent += 1
    if producer.flush(120):
        raise RuntimeError(f"Kafka did not take every record of {topic}")
    return sent / (time.perf_counter() - began)


def _values(frame: Any, value_format: str, scratch: Path) -> list[bytes]:
    """Each event as a producer sends it: a line of the JSON-lines files (features.demo), or an Avro record."""
    if value_format == "json":
        [written] = write_events(frame, scratch, format="json")
        values = Path(written).read_bytes().splitlines()
        shutil.rmtree(scratch)
        return values
    import io

    import fastavro

    parsed = fastavro.parse_schema(json.loads(AVRO_SCHEMA))
    out = []
    for record in frame.astype(object).where(frame.notna(), None).to_dict("records"):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, record)
        out.append(buffer.getvalue())
    return out


def kafka_source(bootstrap: str, topic: str, per_batch: int, value_format: str = "json") -> str:
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": str(per_batch)}
    avro = f", value_format='avro', schema={AVRO_SCHEMA!r}" if value_format == "avro" else ""
    return f", schema={SCHEMA!r}, kafka=KafkaTopic({topic!r}, {bootstrap!r}{avro}, options={options!r})"


def sample(events: Path, count: int) -> Path:
    """The first `count` events in two files: what the naive query and ours are compared on (the naive query
    copies each event into 288 windows, so it gets a sample)."""
    import pandas as pd

    subset = WORK / "naive_events"
    first = pd.read_parquet(sorted(events.glob("*.parquet"))[0]).head(count)
    write_events(first, subset, n_files=2)
    return subset


def run_naive(spark: SparkSession, subset: Path) -> dict[str, float]:
    """What users write without this project: Spark's streaming window aggregation, appended to Parquet."""
    stream_operator.configure(spark)
    schema = spark.read.parquet(str(subset)).schema
    counts = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(subset))
        .withWatermark("event_ts", "10 minutes")
        .groupBy("user_id", F.window("event_ts", "24 hours", "5 minutes"))
        .count()
    )
    out = WORK / "naive_out"
    began = time.perf_counter()
    query = (
        counts.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(WORK / "naive_checkpoint"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - began
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return {"events": rows, "seconds": seconds, "rate": rows / seconds}


def run_floor(spark: SparkSession, events: Path, name: str, key: str = "user_id") -> dict[str, float]:
    """The floor: a bare Structured Streaming job over the same files and trigger (one file per micro-batch,
    available-now), keeping one count per key in its state (no windows) and appending each batch's updated
    counts to Parquet. Measured as `run_ours` measures ours."""
    schema = spark.read.parquet(str(events)).schema
    counts = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(events))
    counts = counts.groupBy(key).count()
    out = WORK / f"{name}_out"

    def write(batch: Any, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(out))

    began = time.perf_counter()
    query = (
        counts.writeStream.foreachBatch(write)
        .option("checkpointLocation", str(WORK / f"{name}_checkpoint"))
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    total = time.perf_counter() - began
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    steady = batches[2:] or batches  # as for ours: the first two batches warm up
    steady_s = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    events_read = sum(p["numInputRows"] for p in batches)
    return {
        "events": events_read,
        "seconds": total,
        "rate": events_read / total,
        "steady_rate": sum(p["numInputRows"] for p in steady) / steady_s,
        "batch_s": steady_s / len(steady),
    }


def median_run(tries: list[dict[str, float]]) -> dict[str, Any]:
    """The run with the median steady rate (the lower middle one of an even number), and every run's rate."""
    ordered = sorted(tries, key=lambda r: r["steady_rate"])
    return {**ordered[(len(ordered) - 1) // 2], "runs": [r["steady_rate"] for r in tries]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--big-users", type=int, default=1_000_000, help="keys of the state-size run (0: skip)")
    parser.add_argument("--naive-events", type=int, default=100_000, help="events the naive query reads (0: skip)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds: each run and the floor once per round")
    parser.add_argument("--kafka", default="127.0.0.1:9092", help='Kafka bootstrap servers ("": no Kafka run)')
    parser.add_argument("--kafka-formats", default="json,avro", help="the Kafka runs' value formats (comma-separated)")
    parser.add_argument("--no-save", action="store_true", help="do not update bench/RESULTS.md")
    parser.add_argument(
        "--configs", default="count_5m,count_5s,full,session", help="which groups the rounds run (comma-separated)"
    )
    args = parser.parse_args()
    load_before = load()

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    spark = get_spark("bench-stream")
    events = land("events", args.events, args.users, args.days, args.files)
    runs: dict[str, dict[str, Any]] = {}
    naive: dict[str, Any] | None = None  # the naive query and ours on the same sample
    one, five_s = f"one count 24h/5m, {args.users:,} keys", f"one count 24h/5s, {args.users:,} keys"
    full = f"user_transactions (5 features), {args.users:,} keys"
    sessions = f"session group (4 features, Session 30m/1m), {args.users:,} keys"
    formats = [f for f in args.kafka_formats.split(",") if f] if args.kafka else []
    label = {"json": "JSON", "avro": "Avro"}
    from_kafka = {f: f"{full}, from Kafka ({KAFKA_PARTITIONS} partitions, {label[f]} values)" for f in formats}
    json_files = f"{full}, from JSON-lines files"
    floor = f"floor: bare Structured Streaming, one count per key (no windows), {args.users:,} keys"
    required = {one: 150_000, five_s: 200_000, full: 150_000, sessions: 100_000}
    produced: dict[str, float] = {}
    ratios: dict[str, list[float]] = {f: [] for f in formats}  # per round: from Kafka / from files, steady events/s
    json_ratios: list[float] = []  # per round: Kafka JSON values / JSON-lines files

    def report() -> None:
        """Print (and save) what has run so far: a long run that is stopped still leaves its figures."""
        lines = [
            f"Run on {datetime.now(UTC):%Y-%m-%d}; {load_before} at the start, {load()} at the end.",
            "",
            f"`python bench/stream.py`: {args.events:,} generated events over {args.days:g} days landed as "
            f"{args.files} Parquet files; `features stream --available-now`, one file per micro-batch, validation, "
            f"offline table and SQLite online store included (MLflow tracking off); local Spark on "
            f"{spark.sparkContext.defaultParallelism} cores. Steady = the batches after the first two (warm-up; "
            f"the first emits nothing). {args.repeats} rounds, each running the floor and then every group once; "
            "each figure is the run with the median steady rate (every run's steady events/s in the last column). "
            "The floor is a bare Structured Streaming job over the same files and trigger that keeps one count per "
            "key (no windows) and appends each batch's updated counts to Parquet.",
            "",
            "| run | events | seconds | events/s | steady events/s | / floor | s per batch | state pane rows "
            "| state MB | rows out | runs, steady events/s |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        base = runs[floor]["steady_rate"] if floor in runs else None
        for name, r in runs.items():
            versus = f"{r['steady_rate'] / base:.2f}" if base else ""
            lines.append(
                f"| {name} | {r['events']:,} | {r['seconds']:.1f} | {r['rate']:,.0f} | {r['steady_rate']:,.0f} | "
                f"{versus} | {r['batch_s']:.2f} | {r.get('state_rows', 0):,} | {r.get('state_mb', 0.0):.1f} | "
                f"{r.get('rows_out', 0):,} | {' / '.join(f'{x:,.0f}' for x in r.get('runs', []))} |"
            )
        lines += ["", "| figure | value | required |", "|---|---|---|"]
        for name, rate in required.items():
            if name in runs:
                lines.append(f"| {name}, steady events/s | {runs[name]['steady_rate']:,.0f} | >= {rate:,} |")
        for fmt in from_kafka:
            if ratios[fmt]:
                each = " / ".join(f"{r:.2f}" for r in ratios[fmt])
                lines.append(
                    f"| from Kafka ({label[fmt]} values) / from files, steady events/s, the median of the rounds' "
                    f"ratios ({each}) | {statistics.median(ratios[fmt]):.2f}x | >= 0.8x |"
                )
                lines.append(
                    f"| {label[fmt]} records encoded and produced per second (confluent-kafka, one Python thread) "
                    f"| {produced[fmt]:,.0f} | |"
                )
        if json_ratios:
            each = " / ".join(f"{r:.2f}" for r in json_ratios)
            lines.append(
                f"| from Kafka (JSON values) / from JSON-lines files, steady events/s, the median of the rounds' "
                f"ratios ({each}) | {statistics.median(json_ratios):.2f}x | |"
            )
        if naive is not None:
            lines.append(
                f"| ours 24h/5m / Spark's streaming groupBy(window 24h/5m), both on the first {naive['events']:,} "
                f"events in 2 files, events/s ({naive['ours']:,.0f} / {naive['naive']:,.0f}) "
                f"| {naive['ours'] / naive['naive']:.1f}x | |"
            )
        print("\n".join(lines), flush=True)
        if not args.no_save:
            default = args.configs == parser.get_default("configs")
            update_section(
                f"Streaming (bench/stream.py{'' if default else ' --configs ' + args.configs})", "\n".join(lines)
            )

    configurations = [
        (name, folder, group)
        for name, folder, group in (
            (one, "count_5m", ONE_FEATURE.format(name="count_24h_5m", every="5m")),
            (five_s, "count_5s", ONE_FEATURE.format(name="count_24h_5s", every="5s")),
            (full, "full", FULL_GROUP.format(name="user_transactions")),
            (sessions, "session", SESSION_GROUP.format(name="user_sessions")),
        )
        if folder in args.configs.split(",")
    ]
    streams_full = any(folder == "full" for _, folder, _ in configurations)
    json_events = as_json_lines(events) if "json" in formats and streams_full else None
    sources = {}  # per Kafka value format: the source's definition, over a topic produced once
    for fmt in formats:
        topic = f"bench_stream_{fmt}_{int(time.time())}"
        produced[fmt] = produce(events, args.kafka, topic, fmt)
        sources[fmt] = kafka_source(args.kafka, topic, -(-args.events // args.files), fmt)
    tries: dict[str, list[dict[str, float]]] = {}

    def kafka_runs(i: int) -> dict[str, float]:
        rates = {}
        for fmt, name in from_kafka.items():
            repo = make_repo(
                f"kafka_{fmt}_{i}",
                WORK / f"kafka_archive_{fmt}_{i}",
                FULL_GROUP.format(name="user_transactions"),
                sources[fmt],
            )
            tries.setdefault(name, []).append(run_ours(repo))
            rates[fmt] = tries[name][-1]["steady_rate"]
        return rates

    for i in range(args.repeats):
        kafka_first = i % 2 == 1
        from_topic = kafka_runs(i) if kafka_first else {}
        tries.setdefault(floor, []).append(run_floor(spark, events, f"floor_{i}"))
        for name, folder, group in configurations:
            tries.setdefault(name, []).append(run_ours(make_repo(f"{folder}_{i}", events, group)))
        if json_events is not None:
            json_source = f", format='json', schema={SCHEMA!r}"
            repo = make_repo(f"json_files_{i}", json_events, FULL_GROUP.format(name="user_transactions"), json_source)
            tries.setdefault(json_files, []).append(run_ours(repo))
        if not kafka_first:
            from_topic = kafka_runs(i)
        if full in tries:  # this round's file run of the same group
            for fmt, rate in from_topic.items():
                ratios[fmt].append(rate / tries[full][-1]["steady_rate"])
        if json_events is not None and "json" in from_topic:
            json_ratios.append(from_topic["json"] / tries[json_files][-1]["steady_rate"])
        runs.update({name: median_run(t) for name, t in tries.items()})
        report()
    if args.naive_events:
        subset = sample(events, args.naive_events)
        theirs = run_naive(spark, subset)
        ours = run_ours(make_repo("count_5m_sample", subset, ONE_FEATURE.format(name="count_sample", every="5m")))
        naive = {"events": theirs["events"], "naive": theirs["rate"], "ours": ours["rate"]}
        report()
    if args.big_users:
        big = land("big_events", args.events, args.big_users, args.days, args.files)
        repo = make_repo("count_big", big, ONE_FEATURE.format(name="count_24h_5m_big", every="5m"))
        runs[f"one count 24h/5m, {args.big_users:,} keys"] = run_ours(repo)
        report()
    kafka_ok = full not in runs or all(
        runs[name]["steady_rate"] >= 0.8 * runs[full]["steady_rate"] for name in from_kafka.values() if name in runs
    )
    met = all(runs[name]["steady_rate"] >= rate for name, rate in required.items() if name in runs)
    return 0 if kafka_ok and met else 1


if __name__ == "__main__":
    sys.exit(main())
