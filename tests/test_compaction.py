"""Compaction of the offline table (features.stores.compaction): a stream's date partitions hold at most `above +
every` small files when a round starts however many batches ran (24, and 32 before it commits, with the stream's
settings), its rounds run beside the stream's appends and leave full files as they are, readers never see a row
missing or doubled while a compaction commits, a backfill of the same day at the same moment loses nothing, and
`features compact` compacts and vacuums (docs/table-format.md)."""

from __future__ import annotations

import math
import threading
from concurrent import futures
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from test_offline_table import T0, M, assert_once, cli_group, rows, table_rows

from features.spec import WINDOW_END
from features.stores import compaction as compaction_module
from features.stores import offline
from features.stores.compaction import (
    COMPACT_ABOVE,
    EVERY_APPENDS,
    FULL_FILE_BYTES,
    WAIT_AFTER,
    StreamCompaction,
    compact,
    vacuum,
)
from features.stores.offline import files_per_date

pytestmark = pytest.mark.spark


def stream_batches(spark, table: str, batches: int, compaction: StreamCompaction | None, first: int = 0) -> list:
    """`batches` micro-batches of 3 users x 2 minutes each, appended as a stream appends them; the files per date
    after each."""
    log = offline.StreamLog(table, "s1")
    seen = []
    for batch in range(first, first + batches):
        log.refresh()
        offline.append_batch(spark, rows(spark, T0 + 2 * batch * M, 2), log, batch)
        if compaction is not None:
            compaction.after_append(spark)
            compaction.wait()  # a round runs beside the batches: counted once it has ended
        seen.append(files_per_date(table)[T0.date()])
    return seen


def test_a_streams_date_partition_holds_at_most_above_plus_every_files(spark, tmp_path: Path) -> None:
    """Each append adds one file to a date and every `every`-th compacts the dates above `above`: no date holds more
    than above + every files when a round starts, and every // 2 more until it has committed (a round still running
    then is waited for). With the stream's settings (8 + 16 + 8) that is the 32-file bound."""
    assert COMPACT_ABOVE + EVERY_APPENDS + WAIT_AFTER <= offline.MAX_FILES == 32
    table = str(tmp_path / "g")
    clock = [0.0]
    compaction = StreamCompaction(table, every=4, above=2, vacuum_every_s=3600, clock=lambda: clock[0])
    seen = stream_batches(spark, table, 9, compaction)
    assert seen == [1, 2, 3, 1, 2, 3, 4, 1, 2]  # rounds after appends 4 and 8 (the 4th: 4 files > 2)
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 9 * 2 * 3
    log = offline.StreamLog(table, "s1")  # the stream still finds its own last batch past the compactions' commits
    log.refresh()
    assert log.last_batch == 8
    assert len(list(Path(table).glob("date=*/*.parquet"))) == 9 + 2  # replaced files wait for an hour's vacuum
    assert compaction.vacuumed == 0.0
    clock[0] = 3600.0  # an hour later: the next round also vacuums (files younger than the retention stay)
    stream_batches(spark, table, 4, compaction, first=9)
    assert compaction.vacuumed == 3600.0


def test_a_round_runs_beside_the_streams_appends_and_its_error_reaches_the_stream(
    spark, tmp_path: Path, monkeypatch
) -> None:
    """A batch does not wait for the round it starts: appends go on while it runs (their files stay), it is waited
    for `every // 2` appends after it started, and a round's failure is raised there; Delta refusing its commit is
    no failure."""
    table = str(tmp_path / "g")
    go, failure = threading.Event(), []
    real = compaction_module.compact

    def held(*args, **kwargs):
        assert go.wait(60)
        if failure:
            raise failure[0]
        return real(*args, **kwargs)

    monkeypatch.setattr(compaction_module, "compact", held)
    compaction = StreamCompaction(table, every=4, above=2, vacuum_every_s=math.inf)
    log = offline.StreamLog(table, "s1")

    def append(batch: int) -> dict:
        log.refresh()
        offline.append_batch(spark, rows(spark, T0 + 2 * batch * M, 2), log, batch)
        return compaction.after_append(spark)

    assert [append(b) for b in range(4)] == [{}] * 4  # the 4th started a round, which waits for `go`
    assert compaction.running is not None and not compaction.running.done()
    assert append(4) == {}  # one append after it started: not waited for
    assert files_per_date(table) == {T0.date(): 5}
    go.set()
    assert append(5) == {T0.date(): 5}  # two (every // 2) after: waited for; the 5th append's file was there
    assert files_per_date(table) == {T0.date(): 2}
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 6 * 2 * 3

    failure.append(OSError("No space left on device"))
    assert [append(b) for b in range(6, 8)] == [{}, {}]  # the 8th append started a round, which fails
    futures.wait([compaction.running])
    with pytest.raises(OSError, match="No space left"):
        append(8)  # the next batch fails with it (its append made), as the round's own batch failed before
    failure[0] = RuntimeError("CommitFailedError: a concurrent transaction deleted the same data")
    assert [append(b) for b in range(9, 13)] == [{}] * 4
    assert compaction.wait() == {}  # refused by Delta: left for the next round
    assert files_per_date(table) == {T0.date(): 9}
    assert compaction.wait() == {}  # nothing runs


def active_files(table: str) -> dict[str, int]:
    actions = pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pydict()
    return dict(zip(actions["path"], actions["size_bytes"], strict=True))


@pytest.mark.parametrize("features", [False, True], ids=["plain table", "table features"])
def test_a_streams_rounds_leave_full_files_and_rewrite_only_the_small_ones(spark, tmp_path: Path, features) -> None:
    """Delta's OPTIMIZE would rewrite a live day's compacted file with every round's few new files (all under its 1 GiB
    default): a round rewrites only the files under `full_bytes`, and a full file stays, its rows once. A plain
    table's rounds run on deltalake, one of a higher protocol (the change data feed here) on Delta's OPTIMIZE."""
    table = str(tmp_path / "g")
    log = offline.StreamLog(table, "s1")
    offline.append_batch(spark, rows(spark, T0, 400), log, 0)  # 1,200 rows: a file many appends' size
    if features:
        spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    assert compaction_module.plain(DeltaTable(table)) is not features
    [(full, size)] = active_files(table).items()
    compaction = StreamCompaction(table, every=4, above=2, full_bytes=size, vacuum_every_s=math.inf)
    assert stream_batches(spark, table, 4, compaction, first=300) == [2, 3, 4, 2]
    files = active_files(table)
    assert full in files and len(files) == 2  # the full file as it was, and the 4 new appends in one
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 1200 + 4 * 2 * 3
    assert spark.conf.get("spark.databricks.delta.optimize.minFileSize", None) is None  # the session as it was
    # `features compact` (no bound) still makes one file of the date.
    assert compact(spark, table) == {T0.date(): 2}
    assert files_per_date(table) == {T0.date(): 1}


@pytest.mark.parametrize("full_bytes", [None, FULL_FILE_BYTES], ids=["features compact", "a stream's round"])
def test_readers_never_see_a_row_missing_or_doubled_while_a_compaction_commits(
    spark, tmp_path: Path, full_bytes
) -> None:
    table = str(tmp_path / "g")
    stream_batches(spark, table, 6, None)
    expected = len(table_rows(table))
    seen: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            got = table_rows(table)
            seen.append(len(got) if not got.duplicated(["user_id", WINDOW_END]).any() else -1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert compact(spark, table, 1, full_bytes) == {T0.date(): 6}
        spark_rows = offline.read_table(spark, table).count()
    finally:
        stop.set()
        reader.join()
    assert seen and set(seen) == {expected}, seen
    assert spark_rows == expected
    assert files_per_date(table) == {T0.date(): 1}


def test_a_compaction_and_a_backfill_of_the_same_day_at_once_lose_nothing(spark, tmp_path: Path) -> None:
    table = str(tmp_path / "g")
    stream_batches(spark, table, 8, None)
    errors: list[BaseException] = []

    def compacting() -> None:
        try:
            compaction = StreamCompaction(table, every=1, above=1, vacuum_every_s=math.inf)
            for _ in range(3):
                compaction.after_append(spark)  # a conflict waits for its next round
            compaction.wait()
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=compacting)
    thread.start()
    offline.replace_range(spark, rows(spark, T0, 10, value=500.0, latest=False), table, T0, T0 + 10 * M)
    thread.join()
    assert not errors, errors
    got = table_rows(table)
    assert_once(got)
    assert len(got) == 16 * 3
    assert (got.loc[got[WINDOW_END] < T0 + 10 * M, "v"] >= 500).all()  # the backfill's rows in its range


def test_features_compact_compacts_and_removes_what_no_version_needs(spark, feast_repo, capsys) -> None:
    from features.cli import main

    root = feast_repo([cli_group("g")], apply=False)
    table = str(root / "data" / "offline" / "g")
    stream_batches(spark, table, 3, None)

    def parquet() -> list[str]:
        return sorted(p.name for p in Path(table).glob("date=*/*.parquet"))

    assert len(parquet()) == 3
    assert main(["status", "--repo", str(root)]) == 0
    assert "  table      version 2, 1 dates in 3 files (at most 3 a date)" in capsys.readouterr().out
    assert main(["compact", "--repo", str(root), "--retention", "1h"]) == 0
    assert "g: 1 dates compacted (3 files into 1)" in capsys.readouterr().out
    assert main(["status", "--repo", str(root)]) == 0
    assert "1 dates in 1 files (at most 1 a date)" in capsys.readouterr().out
    assert len(parquet()) == 4  # the replaced files stay for older versions, within the retention
    properties = DeltaTable(table).metadata().configuration
    assert properties["delta.deletedFileRetentionDuration"] == "interval 1 hours"
    vacuum(spark, table, timedelta(0))  # what a later run does once they are older than the retention
    assert len(parquet()) == 1
    assert len(table_rows(table)) == 3 * 2 * 3
