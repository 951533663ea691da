"""The offline table's writers (features.stores.offline): a backfill's range replaced in one commit, a stream's batches
appended once each, and the two writing the same days at once with every row there exactly once, on a local path
and on a file:// URI (docs/table-format.md)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.engine.batch import LATEST
from features.spec import WINDOW_END
from features.stores import driver_writes, migration, offline

pytestmark = pytest.mark.spark

T0 = datetime(2026, 3, 1, tzinfo=UTC)
M = timedelta(minutes=1)


@pytest.fixture(params=["path", "uri"])
def table(request, tmp_path: Path) -> str:
    folder = tmp_path / "offline" / "g"
    return str(folder) if request.param == "path" else folder.as_uri()


def rows(spark, start: datetime, minutes: int, users: int = 3, value: float = 1.0, latest: bool | None = None):
    """A change point per user and minute in [start, start + minutes)."""
    from pyspark.sql import functions as F

    frame = pd.DataFrame(
        [(f"u{u}", start + i * M, value + i) for i in range(minutes) for u in range(users)],
        columns=["user_id", WINDOW_END, "v"],
    )
    out = spark.createDataFrame(frame).withColumn(WINDOW_END, F.col(WINDOW_END).cast("timestamp"))
    return out if latest is None else out.withColumn(LATEST, F.lit(latest))


def table_rows(table: str) -> pd.DataFrame:
    got = offline.read_pandas(table)
    got[WINDOW_END] = pd.to_datetime(got[WINDOW_END], utc=True)
    return got.sort_values(["user_id", WINDOW_END], ignore_index=True)


def assert_once(got: pd.DataFrame) -> None:
    assert not got.duplicated(["user_id", WINDOW_END]).any(), got[got.duplicated(["user_id", WINDOW_END], keep=False)]


def replaced(spark, frame, table: str, start: datetime, end: datetime, in_driver: bool, info=None) -> int:
    """A backfill's publish of `frame` (rows flagged LATEST false) over [start, end): by Spark's Delta writer, or
    `in_driver` by deltalake (a local session's backfill of a size validation counted)."""
    if not in_driver:
        return offline.replace_range(spark, frame, table, start, end, info)
    with offline.Staged(frame, table, start, end, in_driver=True) as staged:
        return staged.publish(info, count=frame.count())


def engines(table: str, newest: int) -> list[str]:
    """Which engine made each of the table's `newest` commits, newest first ("delta-rs" or "Apache-Spark")."""
    from deltalake import DeltaTable

    return [entry["engineInfo"].split(":")[0].split("/")[0] for entry in DeltaTable(table).history(newest)]


@pytest.mark.parametrize("in_driver", [False, True], ids=["spark", "driver"])
def test_a_backfill_replaces_its_range_in_one_commit_and_keeps_the_rest(spark, table: str, in_driver: bool) -> None:
    day = T0
    assert replaced(spark, rows(spark, day, 60, latest=False), table, day, day + 60 * M, in_driver) == 180
    # A later range starting mid-day: the rows before it stay, those in it are replaced.
    later = rows(spark, day + 30 * M, 60, value=100.0, latest=False)
    assert replaced(spark, later, table, day + 30 * M, day + 90 * M, in_driver, info={"group": "g"}) == 180
    assert engines(table, 2) == ["delta-rs" if in_driver else "Apache-Spark"] * 2
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 90 * 3
    assert (got.loc[got[WINDOW_END] < day + 30 * M, "v"] < 100).all()
    assert (got.loc[got[WINDOW_END] >= day + 30 * M, "v"] >= 100).all()
    [last, first] = offline.commits(table)
    assert last.info["group"] == "g" and last.spans() == [(day + 30 * M, day + 90 * M)] and first.writer == "backfill"
    # Time travel (docs/table-format.md): the table as the first backfill left it.
    before = spark.read.format("delta").option("versionAsOf", first.version).load(table)
    assert before.count() == 180 and before.where("v >= 100").count() == 0


def test_a_replayed_batch_is_not_written_twice(spark, table: str) -> None:
    log = offline.StreamLog(table, "s1")
    log.refresh()
    assert offline.append_batch(spark, rows(spark, T0, 5), log, 7) == 15
    # A restart: a new process knows nothing but the log, in which batch 7 is.
    restarted = offline.StreamLog(table, "s1")
    restarted.refresh()
    assert restarted.last_batch == 7
    assert offline.append_batch(spark, rows(spark, T0, 5).repartition(3), restarted, 7) == 0
    assert offline.append_batch(spark, rows(spark, T0 + 5 * M, 1), restarted, 8) == 3
    # Another stream's (a new checkpoint's) batch ids are its own.
    other = offline.StreamLog(table, "s2")
    other.refresh()
    assert other.last_batch is None
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 18


def test_a_batch_replayed_by_a_later_version_appends_only_the_rows_after_what_its_commit_reached(
    spark, table: str
) -> None:
    """A stream killed after batch 7's commit, before Spark's, and started by a version of features that emits
    further (up to the watermark the batch's own events set, where earlier versions emitted up to the one Spark
    handed the batch): the replay appends the rows after what the commit reached, each row once. A commit of an
    earlier version records no watermark: it reached the one Spark handed the batch."""
    us = lambda t: int(t.timestamp() * 1e6)  # noqa: E731
    log = offline.StreamLog(table, "s1")
    log.refresh()
    assert offline.append_batch(spark, rows(spark, T0, 5), log, 7) == 15  # as an earlier version: no watermark
    restarted = offline.StreamLog(table, "s1")
    restarted.refresh()
    replay = rows(spark, T0, 8)  # emitted up to T0 + 7 minutes, where Spark handed the batch T0 + 4
    assert offline.append_batch(spark, replay, restarted, 7, 24, us(T0 + 7 * M), us(T0 + 4 * M)) == 9
    # Replayed again by this version: its commit says how far it reached.
    again = offline.StreamLog(table, "s1")
    again.refresh()
    assert again.last_upto == us(T0 + 7 * M)
    assert offline.append_batch(spark, replay, again, 7, 24, us(T0 + 7 * M), us(T0 + 4 * M)) == 0
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 24


def test_a_restarted_stream_knows_backfills_older_than_its_own_recent_batches(spark, tmp_path: Path) -> None:
    """The first look at the log reads all of it: a backfill committed before many of the stream's batches still
    owns its range (its commits are written here by deltalake, another Delta writer, to be quick)."""
    import json

    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    table = str(tmp_path / "offline" / "g")
    offline.replace_range(spark, rows(spark, T0, 30, latest=False), table, T0, T0 + 30 * M)
    for batch in range(60):
        meta = json.dumps({offline.KEY: {"writer": offline.STREAM, "stream": "s1", "batch": batch}})
        one = pa.table({"user_id": ["u9"], WINDOW_END: [T0 + (40 + batch) * M], "v": [1.0], "date": [T0.date()]})
        properties = CommitProperties(custom_metadata={"userMetadata": meta})
        write_deltalake(table, one, mode="append", commit_properties=properties)
    log = offline.StreamLog(table, "s1")
    log.refresh()
    assert log.last_batch == 59 and log.spans == [(T0, T0 + 30 * M)]
    assert log.refresh() == []  # nothing new since


def test_the_stream_leaves_what_a_backfill_wrote(spark, table: str) -> None:
    offline.replace_range(spark, rows(spark, T0, 30, latest=False), table, T0, T0 + 30 * M)
    log = offline.StreamLog(table, "s1")
    log.refresh()
    assert offline.append_batch(spark, rows(spark, T0 + 20 * M, 20, value=50.0), log, 0) == 30  # 10 minutes
    got = table_rows(table)
    assert_once(got)
    assert (got.loc[got[WINDOW_END] < T0 + 30 * M, "v"] < 50).all()  # the backfill's values


def test_a_backfill_committed_just_before_an_append_keeps_its_range(spark, table: str) -> None:
    """The stream looked at the log, then a backfill of its days committed, then the stream appended: its rows in
    the backfill's range are taken out again."""
    stale = offline.StreamLog(table, "s1")
    stale.refresh()
    offline.replace_range(spark, rows(spark, T0, 30, latest=False), table, T0, T0 + 30 * M)
    offline.append_batch(spark, rows(spark, T0 + 20 * M, 20, value=50.0), stale, 0)
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 40 * 3
    assert (got.loc[got[WINDOW_END] < T0 + 30 * M, "v"] < 50).all()
    assert (got.loc[got[WINDOW_END] >= T0 + 30 * M, "v"] >= 50).all()
    assert stale.spans == [(T0, T0 + 30 * M)]


@pytest.mark.parametrize("in_driver", [False, True], ids=["spark", "driver"])
def test_a_stream_and_a_backfill_of_the_same_days_at_once(spark, table: str, in_driver: bool) -> None:
    """No lock between them: Delta (Spark's writer or deltalake) refuses a backfill commit that a stream's append
    came before, the backfill commits again on the new version, and the stream leaves the range the backfill owns.
    Every row once."""
    day = T0
    replaced(spark, rows(spark, day, 1, latest=False), table, day, day + M, in_driver)  # the table exists
    errors: list[BaseException] = []

    def streaming() -> None:
        try:
            log = offline.StreamLog(table, "s1")
            for batch in range(12):
                log.refresh()
                offline.append_batch(spark, rows(spark, day + (batch * 10) * M, 10, value=1000.0), log, batch)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    thread = threading.Thread(target=streaming)
    thread.start()
    for _ in range(3):
        replaced(spark, rows(spark, day, 60, users=3, latest=False), table, day, day + 60 * M, in_driver)
    thread.join()
    assert not errors, errors
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 120 * 3  # 60 backfilled minutes, then the stream's
    assert (got.loc[got[WINDOW_END] < day + 60 * M, "v"] < 1000).all()
    assert (got.loc[got[WINDOW_END] >= day + 60 * M, "v"] >= 1000).all()


def test_a_backfill_in_the_driver_makes_the_table_spark_makes_and_leaves_changed_columns_to_spark(
    spark, table: str
) -> None:
    """A local backfill's first commit makes the table as Spark's writer does (partitioned by date, the table's
    properties, nullable columns, the commit's info), Spark reads and writes it after; rows whose columns differ
    from the table's (a feature added, or retyped) go to Spark's writer, which merges or refuses them."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    assert replaced(spark, rows(spark, T0, 10, latest=False), table, T0, T0 + 10 * M, True, {"group": "g"}) == 30
    delta = DeltaTable(table)
    assert engines(table, 1) == ["delta-rs"] and delta.metadata().partition_columns == ["date"]
    assert delta.metadata().configuration == offline.TABLE_CONF
    assert all(f.nullable for f in delta.schema().fields)
    [commit] = offline.commits(table)
    assert commit.info["group"] == "g" and commit.spans() == [(T0, T0 + 10 * M)]
    assert offline.read_table(spark, table).count() == 30
    assert offline.rows_by_date(table) == {T0.date(): 30}
    # Spark's writer on the table deltalake made.
    assert replaced(spark, rows(spark, T0 + 5 * M, 10, value=50.0, latest=False), table, T0 + 5 * M, T0 + 15 * M, False)
    # A feature added: the rows have a column the table lacks.
    wider = rows(spark, T0 + 10 * M, 10, value=70.0, latest=False).withColumn("w", F.lit(1))
    assert replaced(spark, wider, table, T0 + 10 * M, T0 + 20 * M, True) == 30
    assert engines(table, 1) == ["Apache-Spark"] and "w" in DeltaTable(table).schema().to_arrow().names
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 60 and got["w"].notna().sum() == 30
    retyped = rows(spark, T0 + 20 * M, 1, latest=False).withColumn("v", F.lit("text"))
    with pytest.raises(Exception, match="DELTA_FAILED_TO_MERGE_FIELDS"):
        replaced(spark, retyped, table, T0 + 20 * M, T0 + 21 * M, True)


def test_a_local_session_commits_backfills_in_the_driver_except_on_databricks(spark, monkeypatch) -> None:
    from features.engine.session import is_local

    assert is_local(spark)
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "17.3")  # a single-node cluster's master is local[...] too
    assert not is_local(spark)


def test_a_backfill_larger_than_the_driver_takes_goes_to_spark(spark, table: str, monkeypatch) -> None:
    """Rows over DRIVER_CELLS (rows x columns), as validation counted them or else as counted before the commit,
    are written by Spark."""
    monkeypatch.setattr(driver_writes, "DRIVER_CELLS", 3 * 10 * 3 - 1)  # 3 users x 10 minutes x 3 columns
    frame = rows(spark, T0, 10, latest=False)
    for count in (30, None):
        with offline.Staged(frame, table, T0, T0 + 10 * M, in_driver=True) as staged:
            assert staged.publish(count=count) == 30
        assert engines(table, 1) == ["Apache-Spark"]
    monkeypatch.setattr(driver_writes, "DRIVER_CELLS", 3 * 10 * 3)
    for count in (30, None):
        with offline.Staged(frame, table, T0, T0 + 10 * M, in_driver=True) as staged:
            assert staged.publish(count=count) == 30
        assert engines(table, 1) == ["delta-rs"] and len(table_rows(table)) == 30


def test_a_stream_appends_in_the_driver_unless_its_columns_changed(spark, table: str) -> None:
    """deltalake writes an append (no Spark job), an added column included (merged into the table's schema,
    nullable); a column of another type goes to Delta's Spark writer, which refuses it, never casts
    (features.stores.driver_writes)."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    offline.replace_range(spark, rows(spark, T0, 1, latest=False), table, T0, T0 + M)
    log = offline.StreamLog(table, "s1")
    # A literal column is not null, where the table's columns are nullable: appended all the same. The last batch
    # lacks `w` (a feature removed): null there.
    wider = [rows(spark, T0 + m * M, 2).withColumn("w", F.lit(1)) for m in (3, 5)]
    for batch, appended in enumerate([rows(spark, T0 + M, 2), *wider, rows(spark, T0 + 7 * M, 2)]):
        log.refresh()
        assert offline.append_batch(spark, appended, log, batch) == 6
    assert engines(table, 4) == ["delta-rs"] * 4
    assert DeltaTable(table).schema().fields[-1].name == "w" and DeltaTable(table).schema().fields[-1].nullable
    log.refresh()
    with pytest.raises(Exception, match="DELTA_FAILED_TO_MERGE_FIELDS"):
        offline.append_batch(spark, rows(spark, T0 + 9 * M, 1).withColumn("v", F.lit("text")), log, 4)
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 3 + 4 * 6
    assert got["w"].notna().sum() == 12 and got.loc[got[WINDOW_END] >= T0 + 7 * M, "w"].isna().all()


def test_a_micro_batch_larger_than_the_driver_takes_is_appended_by_spark(spark, table: str, monkeypatch) -> None:
    """A batch of more values (rows x columns) than the driver may collect goes to Spark's writer, a new column
    merged all the same; the next, smaller one to deltalake. (Issue 71: the first batch of `--reset` over sixty
    days, 94M values collected whole for deltalake's commit, ran the driver out of heap, and the stream waited for
    ever: tests/test_local_session.py.) The driver's own heap bounds it too, below DRIVER_CELLS when small."""
    from pyspark.sql import functions as F

    offline.replace_range(spark, rows(spark, T0, 1, latest=False), table, T0, T0 + M)
    log = offline.StreamLog(table, "s1")
    monkeypatch.setattr(driver_writes, "DRIVER_CELLS", 3 * 4 * 4 - 1)  # 3 users x 4 minutes x 4 columns
    for batch, minutes in enumerate((4, 3)):
        log.refresh()
        appended = rows(spark, T0 + (1 + 4 * batch) * M, minutes).withColumn("w", F.lit(batch))
        assert offline.append_batch(spark, appended, log, batch, count=3 * minutes) == 3 * minutes
    assert engines(table, 2) == ["delta-rs", "Apache-Spark"]
    assert len(table_rows(table)) == 3 + 12 + 9 and table_rows(table)["w"].notna().sum() == 21
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    monkeypatch.setattr(driver_writes, "DRIVER_CELLS", 10**12)
    assert driver_writes.fits(appended, heap // driver_writes.HEAP_PER_CELL // 4)
    assert not driver_writes.fits(appended, heap // driver_writes.HEAP_PER_CELL // 4 + 1)


def test_a_reset_removes_what_streams_wrote(spark, table: str) -> None:
    offline.replace_range(spark, rows(spark, T0, 30, latest=False), table, T0, T0 + 30 * M)
    log = offline.StreamLog(table, "s1")
    log.refresh()
    offline.append_batch(spark, rows(spark, T0 + 30 * M, 10), log, 0)
    offline.remove_stream_rows(spark, table, log.spans)
    got = table_rows(table)
    assert len(got) == 90 and got[WINDOW_END].max() < T0 + 30 * M
    assert offline.rows_by_date(table) == {T0.date(): 90}


def old_table(folder: Path) -> None:
    """Parquet folders as earlier versions of features wrote them: a backfill's one file per date, and a stream's
    files named by batch id."""
    day = folder / "date=2026-03-01"
    day.mkdir(parents=True)
    frame = pd.DataFrame({"user_id": ["u0", "u1"], WINDOW_END: [T0 + M, T0 + 2 * M], "v": [1.0, 2.0]})
    frame[WINDOW_END] = frame[WINDOW_END].astype("datetime64[us, UTC]")
    frame.to_parquet(day / "part-0.parquet", index=False)
    streamed = frame.assign(**{WINDOW_END: frame[WINDOW_END] + 10 * M, "v": [5.0, 6.0]})
    streamed.iloc[:1].to_parquet(day / "stream-b0000000003-000.parquet", index=False)


def test_a_table_of_an_earlier_version_is_refused_then_converted_in_place(spark, tmp_path: Path) -> None:
    from features.errors import ConfigError

    folder = tmp_path / "offline" / "g"
    old_table(folder)
    table = str(folder)
    with pytest.raises(ConfigError, match=r"earlier version of features .* Fix: convert it in place with `features"):
        offline.exists(table)
    assert migration.needs_migration(table)
    assert migration.migrate(spark, table) == 2
    assert not migration.needs_migration(table) and migration.migrate(spark, table) == 0
    assert len(table_rows(table)) == 3
    # The earlier backfill's range is a backfill's range: a stream leaves it.
    log = offline.StreamLog(table, "s1")
    log.refresh()
    assert log.spans == [(T0 + M, T0 + 2 * M + timedelta(microseconds=1))]
    offline.append_batch(spark, rows(spark, T0, 5, value=100.0), log, 0)
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 3 + 3 * 5 - 3 * 2  # the stream's rows at the backfilled minutes 1 and 2 left out
    assert offline.rows_by_date(table) == {T0.date(): 12}


def test_a_first_commit_in_flight_is_a_table_with_nothing_written_yet(tmp_path: Path) -> None:
    """A first Delta commit writes its data files before its log: a reader then (the soak's sampler, `features
    verify`) sees no table yet, and is not told to migrate one."""
    day = tmp_path / "g" / "date=2026-03-01"
    day.mkdir(parents=True)
    pd.DataFrame({"v": [1.0]}).to_parquet(day / "part-00000-0b1c7a7e-3f7c-4e55-9f0e-2d1d5c0b8a11.c000.snappy.parquet")
    table = str(tmp_path / "g")
    assert not offline.exists(table) and not migration.needs_migration(table)
    assert offline.files_per_date(table) == {}


def cli_group(name: str) -> FeatureGroup:
    """A group whose offline table a CLI test writes by hand (rows as `rows` makes them)."""
    return FeatureGroup(
        name,
        Entity("user", ["user_id"]),
        EventSource("tx", "data/tx", "event_ts", schema={"user_id": "string", "event_ts": "timestamp", "v": "float64"}),
        [Feature("v_sum", agg.sum("v"), Hop("1h", every="5m"))],
    )


def test_features_migrate_converts_each_group(feast_repo, tmp_path: Path, capsys) -> None:
    from features.cli import main

    root = feast_repo([cli_group("old_group")], apply=False)
    old_table(root / "data" / "offline" / "old_group")
    assert main(["migrate", "--repo", str(root)]) == 0
    assert "old_group: converted " in capsys.readouterr().out
    assert main(["migrate", "--repo", str(root)]) == 0
    assert "needs no conversion" in capsys.readouterr().out
    assert len(offline.read_pandas(str(root / "data" / "offline" / "old_group"))) == 3
