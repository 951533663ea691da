"""`features demo --kafka`: the demo's transactions produced to a Kafka topic and streamed from it to the
offline table and the online store, as a user's stream would read them:

    1. generate the transactions                      (the file demo's, same seed)
    2. a Kafka broker: the one at --bootstrap-servers, or one the demo starts on this machine (features.demo.broker)
    3. features apply --repo PATH
    4. produce the events to a new topic, one JSON value each (Spark's Kafka sink: no Kafka client library)
    5. features stream --available-now, each source read from the topic (EventSource(..., kafka=KafkaTopic(...)))

Each run writes to a topic of its own, so that a broker kept between runs gives no records of an earlier one;
on a broker the demo did not start, that topic stays (the broker creates it on the first write)."""

from __future__ import annotations

import dataclasses
import uuid
from contextlib import ExitStack

from features.demo.broker import KAFKA_VERSION, broker_answers, local_broker
from features.demo.datagen import generate_transactions
from features.demo.run import (
    SEED,
    SHOW_USERS,
    START,
    check_sizes,
    clear_outputs,
    features_shown,
    most_recent,
    online_group,
    print_table,
    shown,
    with_types,
)
from features.errors import ConfigError
from features.repo import Repo
from features.spec import EventSource, FeatureGroup, KafkaTopic

# Written as the JSON files of a source hold them: microseconds, and the zone, which the stream's parse keeps.
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
STEPS = 5


def run_kafka_demo(repo: str, *, events: int, users: int, days: float, bootstrap_servers: str) -> None:
    """Produce the demo's transactions to a topic on a broker at `bootstrap_servers` (started here when none
    answers there), stream them to the stores, and print what each step gives."""
    from features.engine.session import get_spark
    from features.pipelines.registration import apply
    from features.pipelines.stream import stream

    check_sizes(events, users, days)
    loaded = Repo.load(repo)
    group = online_group(loaded)
    topic = f"features-demo-{uuid.uuid4().hex[:8]}"

    _step(1, f"Generating {events:,} card transactions of {users:,} users from {START:%Y-%m-%d} for {days:g} days")
    transactions = generate_transactions(events, users, START, days, seed=SEED)
    clear_outputs(loaded)

    with ExitStack() as stack:
        started = not broker_answers(bootstrap_servers)
        if not started:
            _step(2, f"Kafka: the broker answering at {bootstrap_servers}")
            servers = bootstrap_servers
        else:
            _step(2, f"Kafka: no broker answers at {bootstrap_servers}; starting Kafka {KAFKA_VERSION} (KRaft) there")
            servers = stack.enter_context(local_broker(bootstrap_servers))
            print(f"   serving at {servers}; it stops when the demo ends")

        _step(3, f"Registering the feature groups with Feast: features apply --repo {shown(loaded.root)}")
        print(f"   feature views: {', '.join(apply(str(loaded.root)))}")

        _step(4, f"Producing the {events:,} events to topic {topic!r}, one JSON value each (Spark's Kafka sink)")
        spark = get_spark()
        frame = spark.createDataFrame(transactions)
        value = f"to_json(struct(*), map('timestampFormat', \"{TIMESTAMP_FORMAT}\")) AS value"
        writer = frame.selectExpr(value).write.format("kafka").option("kafka.bootstrap.servers", servers)
        writer.option("topic", topic).save()

        groups = {name: read_from(g, topic, servers) for name, g in loaded.groups.items()}
        on_topic = dataclasses.replace(loaded, groups=groups)
        _step(5, "Streaming the topic to the offline table and the online store: features stream --available-now")
        run = stream(on_topic, available_now=True, reset=True, progress=False)
        run.await_termination()
        for line in run.summary():
            print(f"   {line}")

    store = loaded.feature_store()
    names = features_shown(group)
    refs = [f"{group.name}:{name}" for name in names]
    key = group.join_keys[0]
    print("\n   Online values after the stream (FeatureStore.get_online_features):")
    recent = most_recent(transactions[key], transactions["event_ts"], SHOW_USERS)
    online = store.get_online_features(features=refs, entity_rows=[{key: k} for k in recent]).to_df()
    schema = dict(group.source.schema or {})
    print_table(with_types(online[[key, *names]], group, schema))

    kept = f"Topic {topic!r} stays on the broker at {servers}. " if not started else ""
    print(
        f"\n{kept}Next: `features demo --repo {shown(loaded.root)}` computes the same groups from files with a "
        "backfill; a source streams from Kafka when it names a topic: EventSource(..., kafka=KafkaTopic(...))."
    )


def read_from(group: FeatureGroup, topic: str, servers: str) -> FeatureGroup:
    """`group`, its source's events read from `topic` by the stream (the folder stays the backfills' source)."""
    source = group.source
    if source.schema is None:
        raise ConfigError(
            f"--kafka: EventSource({source.name!r}) declares no schema, which a Kafka source needs to parse its "
            'JSON values. Fix: add schema={"column": "type", ...} to it'
        )
    kafka = KafkaTopic(topic, servers, options={"startingOffsets": "earliest"})
    on_topic = EventSource(
        source.name,
        source.path,
        source.timestamp,
        format=source.format,
        watermark=f"{source.watermark_s}s",
        schema={column: dtype.value for column, dtype in source.schema.items()},
        options=dict(source.options),
        max_future=None if source.max_future_s is None else f"{source.max_future_s}s",
        kafka=kafka,
    )
    return FeatureGroup(
        group.name,
        group.entity,
        on_topic,
        list(group.features),
        description=group.description,
        expectations=list(group.expectations),
        on_invalid=group.on_invalid,
        online=group.online,
    )


def _step(number: int, text: str) -> None:
    print(f"\n[{number}/{STEPS}] {text}", flush=True)
