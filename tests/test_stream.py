"""The Spark streaming engine end to end: events landing as many files, out of order within the watermark,
streamed with `--available-now`, against the batch engine (same rows), the reference (online values at the
final watermark), late events, bad records, restarts with a changed definition and crashes."""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from reference import percentile_ok, reference_frame
from test_batch_reference import BASE, H, collect_change_points, compare_value, make_events

from features import Entity, EventSource, Feature, FeatureGroup, Hop, KafkaTopic, Lifetime, Session, Tumble, agg
from features.cli import main
from features.demo import write_events
from features.errors import ConfigError
from features.pipelines.stream import sink as sink_module
from features.pipelines.stream import stream
from features.repo import Repo
from features.spec import WINDOW_END, AggKind
from features.stores import offline
from features.stores.compaction import StreamCompaction
from features.stores.offline import files_per_date
from features.stores.serving import online_features

pytestmark = pytest.mark.spark

SOURCE = EventSource("transactions", path="data/transactions", timestamp="event_ts", watermark="30m")
USER_GROUP = FeatureGroup(
    "user_stream",
    Entity("user", join_keys=["user_id"]),
    SOURCE,
    [
        Feature("failed_4h", agg.count(), window=Hop("4h", every="20m"), where="status = 'FAILED'"),
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("qty_sum_1h", agg.sum("qty"), window=Hop("1h", every="5m")),
        Feature("amount_max_4h", agg.max("amount"), window=Hop("4h", every="20m")),
        Feature("amount_avg_30m", agg.avg("amount"), window=Tumble("30m")),
        Feature("amount_sd_4h", agg.stddev("amount"), window=Hop("4h", every="20m")),
        Feature("status_first_4h", agg.first("status"), window=Hop("4h", every="20m")),
        Feature("status_last", agg.last("status"), window=Lifetime(every="5m")),
        Feature("amounts_last3", agg.last_k("amount", 3), window=Hop("1h", every="5m")),
        Feature("merchants_4h", agg.approx_count_distinct("merchant_id"), window=Hop("4h", every="1h")),
        Feature("merchants_exact_4h", agg.count_distinct("merchant_id"), window=Hop("4h", every="1h")),
        Feature("statuses_lifetime", agg.count_distinct("status"), window=Lifetime(every="1h")),
        Feature("amount_p50_4h", agg.approx_percentile("amount", 0.5), window=Hop("4h", every="1h")),
        Feature("n_lifetime", agg.count(), window=Lifetime(every="1h")),
    ],
)
# The aggregations with list, map and time values, and sessions: streamed by the files tests only (the Kafka
# tests stream USER_GROUP and PAIR_GROUP, whose values do not depend on the source).
NEWER_GROUP = FeatureGroup(
    "user_newer_stream",
    Entity("user", join_keys=["user_id"]),
    SOURCE,
    [
        Feature("amount_var_4h", agg.variance("amount"), window=Hop("4h", every="20m")),
        Feature("amount_top2_1h", agg.top_k("amount", 2), window=Hop("1h", every="5m")),
        Feature("status_hist_4h", agg.histogram("status"), window=Hop("4h", every="1h")),
        Feature("merchants_max3_4h", agg.bounded_count_distinct("merchant_id", 3), window=Hop("4h", every="1h")),
        Feature("n_session", agg.count(), window=Session("20m", every="5m")),
        Feature("session_started", agg.session_start(), window=Session("20m", every="5m")),
        Feature("status_top1_session", agg.top_frequent("status", 1), window=Session("20m", every="5m")),
        Feature(
            "failed_session_s", agg.session_duration(), window=Session("30m", every="5m"), where="status = 'FAILED'"
        ),
        Feature("last_seen", agg.last_event_time(), window=Hop("1h", every="5m")),
        Feature("merchant_set_4h", agg.distinct_values("merchant_id"), window=Hop("4h", every="1h")),
    ],
)
PAIR_GROUP = FeatureGroup(
    "card_merchant_stream",
    Entity("card_merchant", join_keys=["card_id", "merchant_id"]),
    SOURCE,
    [
        Feature("n_1h", agg.count(), window=Hop("1h", every="10m")),
        Feature("amount_sum_2h", agg.sum("amount"), window=Hop("2h", every="30m")),
    ],
)
GROUPS = [USER_GROUP, PAIR_GROUP]
STREAMED = [*GROUPS, NEWER_GROUP]
FLOAT_SUMS = {AggKind.SUM, AggKind.AVG, AggKind.STDDEV, AggKind.VARIANCE}

FILES = 6


def arrival_order(events: pd.DataFrame, lateness: pd.Timedelta, seed: int) -> pd.DataFrame:
    """Events in the order they land: by time, each up to `lateness` behind its neighbours."""
    rng = np.random.default_rng(seed)
    jitter = pd.to_timedelta(rng.integers(0, int(lateness.total_seconds()), len(events)), unit="s")
    return events.iloc[np.argsort((events["event_ts"] + jitter).to_numpy(), kind="stable")].reset_index(drop=True)


def land(root: Path, events: pd.DataFrame, n_files: int, start_index: int = 0) -> None:
    write_events(events, root / "data" / "transactions", n_files=n_files, start_index=start_index)


def offline_rows(spark, repo: Repo, group: FeatureGroup) -> pd.DataFrame:
    rows = spark.read.format("delta").load(repo.offline_path(group)).toPandas().drop(columns=["date"])
    rows[WINDOW_END] = pd.to_datetime(rows[WINDOW_END], utc=True).astype("datetime64[us, UTC]")
    return rows.sort_values([*group.join_keys, WINDOW_END], ignore_index=True)


def is_null(x: object) -> bool:
    return x is None or x is pd.NA or x is pd.NaT or (isinstance(x, float) and math.isnan(x))


def same_value(a: object, b: object, exact: bool = False) -> bool:
    """Equal values; float sums within 1e-9 unless `exact` (their rounding depends on the order a pane's
    micro-batches were added in)."""
    if isinstance(a, list | np.ndarray) or isinstance(b, list | np.ndarray):
        return a is not None and b is not None and list(a) == list(b)
    if is_null(a) or is_null(b):
        return is_null(a) and is_null(b)
    if not exact and (isinstance(a, float) or isinstance(b, float)):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a))
    return a == b


def check_sample(group: FeatureGroup, rows: pd.DataFrame, events: pd.DataFrame, n: int = 40) -> None:
    """A sample of change points (keys, window_end, features) holds the reference values at its window end. Tables
    compared with another engine's or another run's are checked so too: both can be wrong alike."""
    assert len(rows) > 0
    sample = rows.sample(min(n, len(rows)), random_state=0).reset_index(drop=True)
    keys = list(sample[list(group.join_keys)].itertuples(index=False, name=None))
    want = reference_frame(events, group, list(zip(keys, sample[WINDOW_END], strict=True)))
    for feat in group.features:
        for key, t, got, exact in zip(keys, sample[WINDOW_END], sample[feat.name], want[feat.name], strict=True):
            problem = compare_value(feat, True, got, exact)
            assert problem is None, f"{group.name}.{feat.name} {key} at {t}: {problem}"


@pytest.fixture(scope="module")
def streamed(spark, feast_repo_factory, tmp_path_factory):
    """One repo, its events landed as FILES files out of order, streamed to the end."""
    events = make_events()
    root = tmp_path_factory.mktemp("stream") / "repo"
    land(root, arrival_order(events, pd.Timedelta(minutes=20), seed=1), FILES)
    feast_repo_factory(root, STREAMED)
    repo = Repo.load(root)
    with pytest.MonkeyPatch.context() as patch:  # compaction rounds (beside the batches) among so few appends
        patch.setattr(sink_module, "StreamCompaction", functools.partial(StreamCompaction, every=2, above=1))
        run = stream(repo, available_now=True, max_files_per_trigger=1, progress=False)
        run.await_termination()
    return repo, events, run


def assert_batch_engine_rows(
    spark, group: FeatureGroup, got: pd.DataFrame, events: pd.DataFrame, watermark, since=None
) -> None:
    """`got` (a stream's offline rows) holds the batch engine's change points of `events` up to `watermark` (and
    after `since`), row for row, every value equal (float sums within 1e-9)."""
    want = collect_change_points(group, spark.createDataFrame(events), BASE - H, watermark)
    if since is not None:
        want = want[want[WINDOW_END] > since].reset_index(drop=True)
    keys = [*group.join_keys, WINDOW_END]
    assert not got.duplicated(keys).any()
    assert got[keys].equals(want[keys])  # the same change points, row for row
    for feat in group.features:  # every aggregation, sketches included: the same kernel, the same bits
        exact = feat.aggregation.kind not in FLOAT_SUMS
        bad = [
            (k, a, b)
            for k, a, b in zip(got[keys].values, want[feat.name], got[feat.name], strict=True)
            if not same_value(a, b, exact)
        ]
        assert not bad, (group.name, feat.name, bad[:3])


def test_offline_rows_equal_the_batch_engine(spark, streamed) -> None:
    """Each micro-batch emits up to the watermark its own events set: one batch per landed file, none without
    events after them to emit the last rows."""
    repo, events, run = streamed
    progress = {p.group: p for p in run.progress()}
    for group in STREAMED:
        assert [p.numInputRows > 0 for p in run.queries[group.name].recentProgress] == [True] * FILES
        watermark = pd.Timestamp(progress[group.name].watermark)
        got = offline_rows(spark, repo, group)
        assert_batch_engine_rows(spark, group, got, events, watermark)
        check_sample(group, got, events)


def test_the_offline_tables_were_compacted_beside_the_batches(streamed) -> None:
    """A round every 2 appends, the last one started by the last batch and waited for when the run ended: every
    date is one file, rows as the batch engine's (above)."""
    repo, _, run = streamed
    for group in STREAMED:
        assert set(files_per_date(repo.offline_path(group)).values()) == {1}
        assert run.sinks[group.name].compaction.running is None


def test_online_values_are_the_reference_at_their_window_end(spark, streamed) -> None:
    """Eager online values: each key's value at its newest window end closed in event time when it last had
    events, or at a later change point (ahead of the offline table for the keys with recent events)."""
    repo, events, _ = streamed
    for group in STREAMED:
        keys = events[list(group.join_keys)].drop_duplicates().sort_values(list(group.join_keys))
        got = online_features(repo, group, keys.reset_index(drop=True), with_window_end=True)
        offline = offline_rows(spark, repo, group)
        last = keys.merge(offline.groupby(list(group.join_keys), as_index=False)[WINDOW_END].max(), how="left")
        assert got[WINDOW_END].notna().all()
        # A key's online value is at or after its newest offline row; a key without one (all its events after
        # the watermark) has only its eager value, ahead of the whole offline table.
        has_rows = last[WINDOW_END].notna().to_numpy()
        assert has_rows.sum() > len(keys) / 2
        assert (got[WINDOW_END].to_numpy()[has_rows] >= last[WINDOW_END].to_numpy()[has_rows]).all()
        assert (got[WINDOW_END].to_numpy()[~has_rows] > offline[WINDOW_END].max()).all()
        assert (got[WINDOW_END] > offline[WINDOW_END].max()).any()  # eager values ahead of the offline table
        pairs = [(tuple(k), t) for k, t in zip(keys.itertuples(index=False), got[WINDOW_END], strict=True)]
        want = reference_frame(events, group, pairs)
        for feat in group.features:
            for i, (key, _) in enumerate(pairs):
                value, exact = got[feat.name].iloc[i], want[feat.name].iloc[i]
                if feat.aggregation.kind is AggKind.APPROX_PERCENTILE and exact is not None:
                    assert percentile_ok(value, exact), (feat.name, key, exact, value)
                else:
                    assert same_value(exact, value), (feat.name, key, exact, value)


def test_an_eager_value_is_online_before_the_watermark_and_a_late_event_corrects_it(
    spark, feast_repo_factory, tmp_path
) -> None:
    group = FeatureGroup(
        "eager",
        Entity("user", join_keys=["user_id"]),
        EventSource("transactions", path="data/transactions", timestamp="event_ts", watermark="30m"),
        [
            Feature("n_1h", agg.count(), window=Hop("1h", every="5m")),
            Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="5m")),
        ],
    )
    t0 = BASE + 10 * H
    first = pd.DataFrame(
        {"user_id": "u1", "event_ts": [t0 + m * pd.Timedelta(minutes=1) for m in range(1, 21)], "amount": 1.0}
    )
    first.loc[first.index[-1], "event_ts"] = t0 + pd.Timedelta(minutes=21)  # the newest: its pane is still open
    land(tmp_path, first, 1)
    feast_repo_factory(tmp_path, [group])
    repo = Repo.load(tmp_path)
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    online = online_features(repo, group, ["u1"], with_window_end=True)
    # 19 events before t0 + 20m, whose pane closed; the watermark (t0 - 9m) is far behind.
    assert online[WINDOW_END].iloc[0] == t0 + pd.Timedelta(minutes=20)
    assert online["n_1h"].iloc[0] == 19 and online["amount_max_1h"].iloc[0] == 1.0
    if offline.exists(repo.offline_path(group)):  # final rows only: none yet, or behind the watermark
        assert (offline_rows(spark, repo, group)[WINDOW_END] <= t0 - pd.Timedelta(minutes=9)).all()

    late = pd.DataFrame({"user_id": ["u1"], "event_ts": [t0 + pd.Timedelta(seconds=210)], "amount": [7.0]})
    land(tmp_path, late, 1, start_index=1)  # behind the eager end, within the watermark
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    online = online_features(repo, group, ["u1"], with_window_end=True)
    assert online[WINDOW_END].iloc[0] == t0 + pd.Timedelta(minutes=20)  # the same window end, corrected
    assert online["n_1h"].iloc[0] == 20 and online["amount_max_1h"].iloc[0] == 7.0


def test_verify_finds_the_streamed_stores_consistent(spark, streamed) -> None:
    """`features verify` after a stream: eager online values against a recompute, offline rows both ways."""
    from features.pipelines.verify import verify_group

    repo, _, _ = streamed
    for group in STREAMED:
        report = verify_group(spark, repo, group, sample=6)
        assert report.ok, report.table()
        assert report.tallies["online", group.features[0].name].match == 6


def test_progress_reports_every_batch(streamed) -> None:
    _, events, run = streamed
    history = run.status()
    mine = history[history["group"] == USER_GROUP.name]
    assert mine["events"].sum() == len(events)
    assert len(mine) >= FILES  # one batch per file, then one that only moves the watermark
    last = run.progress()[0]
    assert last.rows_total == mine["rows_emitted"].sum() > 0
    assert last.late_total == 0 and last.state_rows > 0 and last.watermark is not None
    landed_batches = mine[mine["events"] > 0]
    assert (landed_batches["freshness_seconds"] > 0).all() and (landed_batches["freshness_seconds"] < 600).all()
    assert f"batch {last.batch_id}" in last.line()


def test_a_stream_without_validation_reports_and_writes_as_one_with_it(spark, streamed, feast_repo_factory, tmp_path):
    """Without validation the batch's rows are only counted by kind, and the buckets' stats come with that count:
    the same progress and the same offline rows as the validated stream's."""
    repo, events, run = streamed
    root = tmp_path / "repo"
    land(root, arrival_order(events, pd.Timedelta(minutes=20), seed=1), FILES)
    feast_repo_factory(root, [USER_GROUP])
    unvalidated = stream(Repo.load(root), available_now=True, max_files_per_trigger=1, progress=False, validate=False)
    unvalidated.await_termination()
    history = unvalidated.status()
    assert history["events"].sum() == len(events)
    last = unvalidated.progress()[0]
    validated = next(p for p in run.progress() if p.group == USER_GROUP.name)
    assert (last.rows_total, last.state_rows, last.watermark) == (
        validated.rows_total,
        validated.state_rows,
        validated.watermark,
    )
    assert offline_rows(spark, Repo.load(root), USER_GROUP).equals(offline_rows(spark, repo, USER_GROUP))


def test_late_events_are_kept_aside_and_the_next_backfill_heals_the_table(spark, streamed) -> None:
    from features.pipelines.backfill import backfill

    repo, events, run = streamed
    watermark = pd.Timestamp(run.progress()[0].watermark)
    late = events[events["user_id"] == "u1"].head(3).copy()
    late["event_ts"] = watermark - pd.Timedelta(hours=2)  # well behind the watermark
    bad = late.head(1).assign(user_id=None)  # no key: a bad record
    land(repo.root, pd.concat([late, bad], ignore_index=True), 1, start_index=FILES)
    before = offline_rows(spark, repo, USER_GROUP)
    again = stream(repo, [USER_GROUP.name], available_now=True, progress=False)
    again.await_termination()
    progress = again.progress()[0]
    assert progress.late_total == 3 and progress.bad_records_total == 1
    kept = spark.read.parquet(repo.late_path(USER_GROUP)).toPandas()
    assert len(kept) == 3 and set(kept["user_id"]) == {"u1"} and kept["batch_id"].nunique() == 1
    assert offline_rows(spark, repo, USER_GROUP).equals(before)  # nothing late reached the stores
    quarantined = list((repo.root / "data" / "quarantine" / USER_GROUP.name / "records").glob("stream-b*"))
    assert len(quarantined) == 1
    # The backfill of the late events' range reads them from the source: the table is exact again.
    everything = pd.concat([events, late], ignore_index=True)
    start, end = (watermark - pd.Timedelta(hours=3)).floor("h"), watermark.ceil("h")
    backfill(repo, start, end, [USER_GROUP.name], online=False, progress=False)
    healed = offline_rows(spark, repo, USER_GROUP)
    healed = healed[(healed[WINDOW_END] > start) & (healed[WINDOW_END] < end)]
    pairs = [((k,), t) for k, t in zip(healed["user_id"], healed[WINDOW_END], strict=True)]
    want = reference_frame(everything, USER_GROUP, pairs)
    assert want["n_lifetime"].tolist() == healed["n_lifetime"].tolist()
    assert want["failed_4h"].tolist() == healed["failed_4h"].tolist()


def test_a_new_definition_and_bucket_count_at_once_stop_with_the_reset_command(spark, streamed) -> None:
    repo, _, _ = streamed
    changed = FeatureGroup(
        USER_GROUP.name,
        USER_GROUP.entity,
        SOURCE,
        [*USER_GROUP.features, Feature("n_1h", agg.count(), Hop("1h", "5m"))],
    )
    repo.groups[USER_GROUP.name] = changed
    try:
        with pytest.raises(ConfigError, match=r"--buckets \d+ -> 3: .* one at a time.*--group user_stream --reset"):
            stream(repo, [USER_GROUP.name], available_now=True, progress=False, online=False, buckets=3)
    finally:
        repo.groups[USER_GROUP.name] = USER_GROUP


def test_state_of_an_older_layout_stops_with_the_reset_command(spark, streamed) -> None:
    repo, _, _ = streamed
    saved = Path(repo.checkpoint_path(USER_GROUP, None)) / "features-definition.json"
    text = saved.read_text()
    description = json.loads(text)
    del description["state_format"]  # as written before the key dictionary
    saved.write_text(json.dumps(description))
    try:
        fix = r"another version of features.*features savepoint. with the version that wrote it.*user_stream --reset"
        with pytest.raises(ConfigError, match=fix):
            stream(repo, [USER_GROUP.name], available_now=True, progress=False, online=False)
    finally:
        saved.write_text(text)


@pytest.mark.parametrize(("buckets", "partitions"), [(4, 4), (8, 4), (3, 2)])
def test_buckets_spread_evenly_over_the_shuffle_partitions(spark, buckets, partitions) -> None:
    from pyspark.sql import functions as F

    from features.engine.inputs import _spark_hash_long, bucket_labels

    labels = bucket_labels(buckets, partitions)
    assert len(set(labels)) == buckets
    frame = spark.createDataFrame([(v,) for v in labels], "v bigint")
    # Where Spark's shuffle by the bucket column puts each label: pmod(hash(v), partitions).
    placed = [r[0] for r in frame.select(F.pmod(F.hash("v"), F.lit(partitions))).collect()]
    assert placed == [i % partitions for i in range(buckets)]
    values = [-(2**63), -(2**40) - 7, -1, 0, 1, 2**40 + 3, 2**63 - 1]
    hashed = spark.createDataFrame([(v,) for v in values], "v bigint").select(F.hash("v")).collect()
    assert [r[0] for r in hashed] == [_spark_hash_long(v) for v in values]


def test_stream_argument_errors(capsys) -> None:
    assert main(["stream", "--repo", "no/such/repo"]) == 2
    assert "feature_store.yaml" in capsys.readouterr().err
    assert main(["stream", "--max-files-per-trigger", "0"]) == 2
    assert "--max-files-per-trigger" in capsys.readouterr().err
    assert main(["stream", "--repo", str(Path(__file__).parents[1] / "feature_repo"), "--trigger", "5 parsecs"]) == 2
    assert "--trigger" in capsys.readouterr().err
    assert main(["stream", "--repo", str(Path(__file__).parents[1] / "feature_repo"), "--buckets", "0"]) == 2
    assert "--buckets: 0 is not a positive number" in capsys.readouterr().err


def from_kafka(group: FeatureGroup, topic: str, events: pd.DataFrame, batches: int) -> FeatureGroup:
    """`group` reading `events` from `topic` (produced there now) in about `batches` micro-batches."""
    from kafka_broker import BOOTSTRAP, json_values, produce, round_robin

    with tempfile.TemporaryDirectory() as scratch:
        produce(topic, round_robin(json_values(events, Path(scratch)), 4))
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": str(-(-len(events) // batches))}
    schema = {c: t for c, t in KAFKA_SCHEMA.items() if c in events.columns}
    source = EventSource(
        SOURCE.name,
        SOURCE.path,
        SOURCE.timestamp,
        watermark="30m",
        schema=schema,
        kafka=KafkaTopic(topic, BOOTSTRAP, options=options),
    )
    return FeatureGroup(group.name, group.entity, source, list(group.features))


KAFKA_SCHEMA = {
    "user_id": "string",
    "card_id": "string",
    "merchant_id": "int64",
    "amount": "double",
    "qty": "int64",
    "status": "string",
    "ok": "bool",
    "event_ts": "timestamp",
}


@pytest.mark.slow
def test_a_killed_kafka_stream_ends_like_an_uninterrupted_one(spark, feast_repo_factory, tmp_path, capsys, kafka_topic):
    """SIGKILL the stream process at a random point, restart it (here, in this process's session): the offline
    table and the online store end exactly as those of a run that was never interrupted. The kill leaves at most
    the micro-batch in flight to replay, from the offsets in the checkpoint; the test reports which batch the
    restart replayed and how long it took to catch up. (A stream from files is killed in the soak test,
    tests/test_soak.py: each kill costs process starts.)"""
    events = arrival_order(make_events(), pd.Timedelta(minutes=20), seed=2)
    group = from_kafka(PAIR_GROUP, kafka_topic, events, FILES)
    command = [sys.executable, "-m", "features.cli", "stream", "--available-now"]
    roots = {}
    for name in ("calm", "killed"):
        roots[name] = tmp_path / name
        land(roots[name], events, FILES)  # for Kafka, what a backfill would read
        feast_repo_factory(roots[name], [group])
    # The uninterrupted run goes on in this process's session while the killed one starts and restarts: its
    # query is the one `features stream` starts, with the same micro-batches, and costs no cold start of its own.
    calm_run = stream(Repo.load(roots["calm"]), available_now=True, progress=False, tracking=False)
    planned = 1
    try:
        kills, report = _kill_and_restart(command, roots["killed"], group, planned)
        calm_run.await_termination()
    finally:
        calm_run.stop()
    # At least one run was killed (each kill checked to leave at most its batch in flight), and the last
    # one finished from the checkpoint the killed ones left: every planned batch committed.
    assert kills >= 1, "no kill came before the stream finished: nothing was interrupted"
    with capsys.disabled():
        print("\n" + "\n".join(report or ["no batch was in flight at any kill"]))
    calm, killed = Repo.load(roots["calm"]), Repo.load(roots["killed"])
    want, got = offline_rows(spark, calm, group), offline_rows(spark, killed, group)
    assert not got.duplicated([*group.join_keys, WINDOW_END]).any()
    pd.testing.assert_frame_equal(got, want)
    check_sample(group, want, events)
    keys = events[list(group.join_keys)].drop_duplicates().reset_index(drop=True)
    pd.testing.assert_frame_equal(online_features(killed, group, keys), online_features(calm, group, keys))


def _kill_and_restart(command: list[str], root: Path, group: FeatureGroup, planned: int) -> tuple[int, list[str]]:
    """Run the stream `command` on `root`, SIGKILLed up to `planned` times and started again each time, until a run
    finishes by itself; how many kills came, and a line per restart. The run after the last kill is the stream the
    command runs, in this process: it starts from what the killed process left on disk, without a cold start."""
    query = Path(Repo.load(root).checkpoint_path(group)) / "query"

    def batches(log: str) -> set[int]:  # Spark's checkpoint: offsets/<id> planned, commits/<id> done
        return {int(p.name) for p in (query / log).glob("[0-9]*")}

    def caught_up(in_flight: int | None) -> bool:
        return in_flight is not None and max(batches("commits"), default=-1) >= in_flight

    rng = np.random.default_rng(5)
    # Kill i comes once targets[i] batches are committed, at a random moment of the next second and a half: in
    # a batch, between two, or while the process starts. Progress, not the clock, decides, so that a faster
    # start cannot let the stream finish first; two batches always remain after the last kill.
    # A kill may also come too late, once the stream has finished: then fewer.
    targets = sorted(int(t) for t in rng.choice(FILES - 2, size=planned, replace=False))
    kills, report, in_flight = 0, [], None
    deadline = time.monotonic() + 900  # the whole test; an uninterrupted run takes well under a minute

    def restarted(began: float, took: float | None) -> None:
        if in_flight is not None:
            after = "killed again before" if took is None else f"{took - began:.1f}s after the restart"
            report.append(f"restart {kills}: replays batch {in_flight} (in flight at the kill); caught up: {after}")

    while kills < planned:
        began = time.monotonic()
        proc = subprocess.Popen([*command, "--repo", str(root)], stderr=subprocess.PIPE, text=True)
        kill_at = took = None
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail(f"the stream did not finish within the deadline after {kills} kill(s): {report}")
            took = took or (time.monotonic() if caught_up(in_flight) else None)
            if kill_at is None and len(batches("commits")) >= targets[kills]:
                kill_at = time.monotonic() + float(rng.uniform(0, 1.5))
            if kill_at is not None and time.monotonic() > kill_at:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.1)
        restarted(began, took)
        if proc.returncode != -signal.SIGKILL:  # the kill came too late: the stream had finished
            assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
            break
        kills += 1
        pending = sorted(batches("offsets") - batches("commits"))
        assert len(pending) <= 1, f"more than the batch in flight is uncommitted: {pending}"
        in_flight = pending[0] if pending else None
    if kills == planned:
        began, took = time.monotonic(), None
        run = stream(Repo.load(root), available_now=True, progress=False)
        try:
            while not run.await_termination(0.1):
                assert time.monotonic() < deadline, f"the stream did not finish within the deadline: {report}"
                took = took or (time.monotonic() if caught_up(in_flight) else None)
        finally:
            run.stop()
        restarted(began, took or time.monotonic())
    assert batches("commits") == batches("offsets")
    return kills, report


def test_each_stream_run_is_an_mlflow_run_with_batch_metrics(streamed) -> None:
    from features.ml.tracking import client_for, find_runs
    from features.spec.fingerprint import definition_hash

    repo, events, run = streamed
    runs = find_runs(repo, kind="stream", group=USER_GROUP.name, definition_hash=definition_hash(USER_GROUP))
    client, _, _ = client_for(repo)
    [first] = [row for _, row in runs.iterrows() if row["run_id"] == run.tracker.run_id]  # the module's stream
    assert first["status"] == "FINISHED"
    history = client.get_metric_history(first["run_id"], f"{USER_GROUP.name}.events")
    assert sum(m.value for m in history) == len(events)
    # Rolled up (features.pipelines.rollup): one point per minute of the run, at the step of the minute's last batch.
    batches = set(run.status().query(f"group == '{USER_GROUP.name}'")["batch_id"])
    assert {m.step for m in history} <= batches and max(m.step for m in history) == max(batches)


def test_the_stream_does_not_repeat_days_a_backfill_completed(spark, feast_repo_factory, tmp_path) -> None:
    """A backfill completes 2026-03-02, then the stream replays the whole source: the day keeps exactly the
    backfill's rows (no (key, window_end) twice), and the stream adds the other days."""
    events = make_events()
    root = tmp_path / "repo"
    land(root, arrival_order(events, pd.Timedelta(minutes=20), seed=3), 3)
    feast_repo_factory(root, [PAIR_GROUP])
    assert main(["backfill", "--repo", str(root), "--date", "2026-03-02", "--no-tracking"]) == 0
    repo = Repo.load(root)
    day = offline_rows(spark, repo, PAIR_GROUP)
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    rows = offline_rows(spark, repo, PAIR_GROUP)
    keys = [*PAIR_GROUP.join_keys, WINDOW_END]
    assert not rows.duplicated(keys).any()
    on_day = rows[rows[WINDOW_END].dt.strftime("%Y-%m-%d") == "2026-03-02"].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        on_day, day[day[WINDOW_END].dt.strftime("%Y-%m-%d") == "2026-03-02"].reset_index(drop=True)
    )
    assert (rows[WINDOW_END] >= pd.Timestamp("2026-03-03", tz="UTC")).any()
    check_sample(PAIR_GROUP, rows, events)


def test_a_stream_whose_tracking_cannot_start_starts_no_query(spark, feast_repo_factory, tmp_path, monkeypatch) -> None:
    """The MLflow run is made while the stream sets up; its error stops the stream before the first batch."""
    root = tmp_path / "repo"
    land(root, make_events().head(500), 1)
    feast_repo_factory(root, [PAIR_GROUP])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://somewhere")
    with pytest.raises(ConfigError, match=r"^MLFLOW_TRACKING_URI: .*--no-tracking"):
        stream(Repo.load(root), available_now=True, progress=False)
    assert not any(q.name == f"features_{PAIR_GROUP.name}" for q in spark.streams.active)
    assert not offline.exists(Repo.load(root).offline_path(PAIR_GROUP))


@pytest.mark.slow
def test_a_backfill_next_to_a_running_stream(spark, feast_repo_factory, tmp_path) -> None:
    """A backfill of the first day runs while the stream takes new files: no (key, window end) twice, none
    missing (the table equals the batch engine's), and the online store holds the stream's newest values.

    Every event of the backfilled day lands before the backfill starts: a backfill computes its range from the
    events it finds when it reads the source. (With half of the events landed first, the day's later events
    landed while the backfill ran, and whether it saw them depended on which thread came first.)"""
    import threading

    from features.pipelines.backfill import backfill

    events = arrival_order(make_events(), pd.Timedelta(minutes=20), seed=4)
    root = tmp_path / "repo"
    # Arrival order lags event time by at most 20 minutes: events from here on are all after the backfilled day.
    half = int(np.argmax(events["event_ts"] >= BASE + 24 * H + pd.Timedelta(minutes=20)))
    assert (events["event_ts"].iloc[:half] < BASE + 24 * H).sum() == (events["event_ts"] < BASE + 24 * H).sum()
    assert len(events) - half >= 30
    land(root, events.iloc[:half], 3)
    feast_repo_factory(root, [PAIR_GROUP])
    repo = Repo.load(root)
    run = stream(repo, trigger="1s", max_files_per_trigger=1, progress=False, tracking=False)
    errors: list[BaseException] = []

    def backfill_first_day() -> None:
        try:
            backfill(repo, BASE, BASE + 24 * H, online=True, progress=False, track=False)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=backfill_first_day)
    worker.start()
    land(root, events.iloc[half:], 3, start_index=3)
    worker.join()
    deadline = time.monotonic() + 600
    while run.status().get("events", pd.Series(dtype=int)).sum() < len(events) and time.monotonic() < deadline:
        assert not run.errors, run.errors
        time.sleep(1)
    run.stop()
    assert not errors, errors
    drained = stream(repo, available_now=True, progress=False, tracking=False)
    drained.await_termination()
    # The watermark the stream emitted up to: the drain's last batch's, or, when the drain had nothing to do, the
    # one its checkpoint's last committed batch emitted up to (never an earlier run's report).
    assert drained.progress()[0].watermark is not None
    watermark = pd.Timestamp(drained.progress()[0].watermark)
    assert watermark >= pd.Timestamp(run.progress()[0].watermark)
    got = offline_rows(spark, repo, PAIR_GROUP)
    want = collect_change_points(PAIR_GROUP, spark.createDataFrame(events), BASE - H, watermark)
    keys = [*PAIR_GROUP.join_keys, WINDOW_END]
    assert not got.duplicated(keys).any()
    pd.testing.assert_frame_equal(got[keys], want[keys])
    for feat in PAIR_GROUP.features:
        assert all(same_value(a, b) for a, b in zip(want[feat.name], got[feat.name], strict=True)), feat.name
    check_sample(PAIR_GROUP, got, events)
    # Online: each key's newest value (eager, at or after the offline table's last row), never an older one.
    pair = list(PAIR_GROUP.join_keys)
    keys = got[pair].drop_duplicates().reset_index(drop=True)
    online = online_features(repo, PAIR_GROUP, keys, with_window_end=True)
    newest = keys.merge(got.groupby(pair, as_index=False)[WINDOW_END].max(), on=pair)
    assert (online[WINDOW_END] >= newest[WINDOW_END]).all()
    pairs = [(tuple(k), t) for k, t in zip(keys.itertuples(index=False), online[WINDOW_END], strict=True)]
    want = reference_frame(events, PAIR_GROUP, pairs)
    for feat in PAIR_GROUP.features:
        assert all(same_value(a, b) for a, b in zip(want[feat.name], online[feat.name], strict=True)), feat.name


def test_a_failing_micro_batch_is_quarantined_and_the_stream_goes_on(spark, feast_repo_factory, tmp_path) -> None:
    """Streams quarantine by default: a batch whose rows break a user expectation reaches neither store, with
    Great Expectations' result beside it; the batches before and after it are written."""
    import great_expectations as gx

    guarded = FeatureGroup(
        "guarded",
        PAIR_GROUP.entity,
        SOURCE,
        PAIR_GROUP.features,
        expectations=[gx.expectations.ExpectColumnValuesToBeBetween(column="amount_sum_2h", max_value=1e6)],
    )
    events = make_events()
    events = events[events["card_id"] == "u1-c0"].sort_values("event_ts").reset_index(drop=True)
    spike = events.iloc[[len(events) // 2]].assign(amount=1e9)
    spike_time = spike["event_ts"].iloc[0]
    first, rest = events[events["event_ts"] < spike_time], events[events["event_ts"] >= spike_time]
    root = tmp_path / "repo"
    land(root, first, 2)
    feast_repo_factory(root, [guarded])
    land(root, spike, 1, start_index=2)
    land(root, rest, 2, start_index=3)
    repo = Repo.load(root)
    run = stream(repo, available_now=True, max_files_per_trigger=1, progress=False, tracking=False)
    run.await_termination()
    progress = run.progress()[0]
    assert progress.batches_quarantined >= 1
    quarantined = sorted((root / "data" / "quarantine" / "guarded" / "batches").glob("stream-b*"))
    assert len(quarantined) == progress.batches_quarantined
    assert all((q / "result.json").is_file() and (q / "rows").is_dir() for q in quarantined)
    rows = offline_rows(spark, repo, guarded)
    assert len(rows) > 0 and (rows["amount_sum_2h"] < 1e6).all()  # the good batches, and only them
    assert (rows[WINDOW_END] < spike_time).any() and (rows[WINDOW_END] > spike_time + 3 * H).any()
