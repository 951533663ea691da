"""Spark's file-source log kept to the files it still needs (docs/streaming.md, "Running a stream for months"): the
newest compact file loses the entries older than the newest less the file source's maxFileAge, Spark reads none
of those files again, and what the state holds is still known to a definition change or a savepoint."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest
from test_batch_reference import BASE, H, make_events
from test_stream import arrival_order, assert_batch_engine_rows, check_sample, land, offline_rows
from test_stream_upgrade import AFTER, BEFORE, assert_online_reference, define, stream_files

from features.engine import source_log
from features.engine.query_log import committed_position
from features.engine.source_log import DAY_MS, FILE_AGE_MS, PRUNED, Pruning, landed_before_ms, prune
from features.pipelines.stream import savepoint
from features.repo import Repo
from features.spec import WINDOW_END

NOW_MS = 1_800_000_000_000


def _log(folder: Path, name: str, entries: list[tuple[str, int, int]]) -> Path:
    """A source log file as Spark writes it (a version line, then a JSON line per file), with its .crc."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["v1", *(json.dumps({"path": p, "timestamp": t, "batchId": b}) for p, t, b in entries)]
    path = folder / name
    path.write_text("\n".join(lines))
    (folder / f".{name}.crc").write_bytes(b"crc")
    return path


def _paths(path: Path) -> list[str]:
    return [json.loads(line)["path"] for line in path.read_text().splitlines()[1:]]


def test_entries_older_than_the_newest_less_the_file_age_leave_the_newest_compact_file(tmp_path) -> None:
    query = tmp_path / "query"
    folder = query / "sources" / "0"
    old = NOW_MS - FILE_AGE_MS - DAY_MS
    _log(folder, "4.compact", [("a", old - 5, 0)])  # an earlier fold: Spark deletes it in time; left alone
    compact = _log(folder, "9.compact", [("a", old - 5, 0), ("b", old, 3), ("c", NOW_MS - DAY_MS, 8), ("d", old, 9)])
    _log(folder, "10", [("e", NOW_MS, 10)])  # the newest file is in a later batch's log

    pruned = prune(query)

    # "d" is as old as "b", but batch 9 may not have committed: it would run again from its entries.
    assert _paths(compact) == ["c", "d"]
    assert compact.read_text().startswith("v1\n")
    assert not (folder / ".9.compact.crc").exists() and (folder / ".10.crc").exists()
    assert _paths(folder / "4.compact") == ["a"]
    assert pruned == source_log.Pruned(entries=2, kept=2, landed_before_ms=NOW_MS - FILE_AGE_MS)
    assert landed_before_ms(query) == NOW_MS - FILE_AGE_MS
    assert not list(folder.glob(".*.tmp"))


def test_a_log_with_nothing_old_is_left_as_it_is(tmp_path) -> None:
    query = tmp_path / "query"
    compact = _log(query / "sources" / "0", "9.compact", [("a", NOW_MS - DAY_MS, 0), ("b", NOW_MS, 9)])
    written = compact.stat().st_mtime_ns
    assert prune(query) is None
    assert compact.stat().st_mtime_ns == written and landed_before_ms(query) is None
    # Not folded yet, and a Kafka source's offsets (a NUL byte first): nothing to prune.
    _log(tmp_path / "young" / "sources" / "0", "0", [("a", 0, 0)])
    (tmp_path / "kafka" / "sources" / "0").mkdir(parents=True)
    (tmp_path / "kafka" / "sources" / "0" / "0").write_bytes(b"\x00v1\n{}")
    assert prune(tmp_path / "young") is None and prune(tmp_path / "kafka") is None


def test_the_files_read_are_counted_by_the_sources_own_batches(tmp_path) -> None:
    """The source numbers its batches itself: a query batch that ran on no new file (to move the watermark) puts
    the query's numbers ahead. Query batch 5 read the source up to its batch 3; its batch 4 has not committed."""
    query = tmp_path / "query"
    folder = query / "sources" / "0"
    _log(folder, "1.compact", [("a", 0, 0), ("b", 0, 1)])
    _log(folder, "0", [("a", 0, 0)])  # before the fold: Spark deletes it in time
    _log(folder, "2", [("c", 0, 2)])
    _log(folder, "3", [("d", 0, 3)])
    _log(folder, "4", [("e", 0, 4)])
    (query / "offsets").mkdir()
    (query / "offsets" / "5").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":3}')
    (query / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n-')
    assert source_log.logged_files(query, 5) == {"a", "b", "c", "d"}
    assert source_log.logged_files(query, 0) == set()


def test_a_batch_reads_the_files_its_sources_logged_since_the_batch_before(tmp_path) -> None:
    """The files of a query's batch, from its sources' logs: each source's batches after the one the query's batch
    before had read up to. Source 0 folded its batch 3 (the fold holds the batches before it too); source 1 lists
    the folder for the null-typed reads, and a file landing between the two listings comes in its next batch."""
    query = tmp_path / "query"
    zero, one = query / "sources" / "0", query / "sources" / "1"
    _log(zero, "2", [("a", 0, 2), ("b", 0, 2)])
    _log(zero, "3.compact", [("x", 0, 0), ("a", 0, 2), ("b", 0, 2), ("c", 0, 3)])
    _log(zero, "4", [("d", 0, 4)])
    _log(one, "1", [("a", 0, 1), ("b", 0, 1)])
    _log(one, "2", [("c", 0, 2)])
    offsets = query / "offsets"
    offsets.mkdir()
    (offsets / "6").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":1}\n{"logOffset":0}')
    (offsets / "7").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":3}\n{"logOffset":2}')
    (offsets / "8").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":3}\n{"logOffset":2}')  # no new file
    (offsets / "9").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":4}\n{"logOffset":2}')

    assert source_log.batch_files(query, 7) == ["a", "b", "c"]
    assert source_log.batch_files(query, 8) == []
    assert source_log.batch_files(query, 9) == ["d"]
    # Spark has not logged the batch (or the one before it is gone): the logs do not tell.
    assert source_log.batch_files(query, 10) is None and source_log.batch_files(query, 6) is None
    (offsets / "5").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":0}\n-')
    assert source_log.batch_files(query, 6) is None  # source 0's batch 1 is gone


def test_the_recorded_cutoff_only_moves_forward(tmp_path) -> None:
    query = tmp_path / "query"
    source_log.record_pruned(query, 100)
    source_log.record_pruned(query, 50)
    assert landed_before_ms(query) == 100
    assert json.loads((query / "sources" / PRUNED).read_text()) == {"landed_before_ms": 100}


def test_a_running_stream_prunes_at_its_first_batch_then_hourly(tmp_path) -> None:
    query = tmp_path / "query"
    clock = [0.0]
    pruning = Pruning(query, clock=lambda: clock[0])
    old = NOW_MS - FILE_AGE_MS - 1
    _log(query / "sources" / "0", "9.compact", [("a", old, 0), ("b", NOW_MS, 9)])
    assert pruning.after_batch() is not None
    _log(query / "sources" / "0", "19.compact", [("b", NOW_MS, 9), ("c", NOW_MS + FILE_AGE_MS + 1, 12)])
    clock[0] = source_log.PRUNE_EVERY_S - 1
    assert pruning.after_batch() is None  # within the hour
    clock[0] = source_log.PRUNE_EVERY_S
    assert pruning.after_batch() is not None
    assert _paths(query / "sources" / "0" / "19.compact") == ["c"]


@pytest.mark.spark
def test_a_pruned_log_reads_no_file_again_and_a_change_still_builds_from_every_file(
    spark, tmp_path, capsys, monkeypatch
) -> None:
    """Ten files landed 30, 28, ..., 12 days ago, one per micro-batch: batch 9 folds Spark's log and its sink
    prunes the six older than the newest less seven days; a savepoint still names all ten. Then the group changes
    (a Lifetime count over all of history among the features it adds) and three files land now: the stream reads
    only those three, and builds the new features from all ten earlier files, the pruned ones too (their rows
    equal the batch engine's)."""
    monkeypatch.setattr(source_log, "PRUNE_EVERY_S", 0.0)
    root = tmp_path / "repo"
    events = make_events()
    cut = BASE + 16 * H
    first, rest = events[events["event_ts"] < cut], events[events["event_ts"] >= cut]
    land(root, arrival_order(first, pd.Timedelta(minutes=20), seed=1), 10)
    landing = sorted((root / "data" / "transactions").glob("part-*"))
    now = time.time()
    for i, path in enumerate(landing):
        os.utime(path, (now - (30 - 2 * i) * 86_400,) * 2)
    stream_files(define(root, BEFORE))

    query = Path(Repo.load(root).checkpoint_path(BEFORE, None)) / "query"
    assert [Path(p).name for p in _paths(query / "sources" / "0" / "9.compact")] == [p.name for p in landing[6:]]
    position = committed_position(query)
    assert len(position.files) == 4 and position.landed_before_ms is not None
    changed_at = pd.Timestamp(position.watermark_us, unit="us", tz="UTC")
    # A savepoint names every file the state holds, the pruned ones too: a copy of the folder keeps no times.
    taken = savepoint.take(spark, Repo.load(root), BEFORE, to=str(tmp_path / "sp"))
    manifest = json.loads((taken.path / savepoint.MANIFEST).read_text())
    assert sorted(manifest["source"]["files"]) == [p.name for p in landing]

    repo = define(root, AFTER)
    land(root, arrival_order(rest, pd.Timedelta(minutes=20), seed=2), 3, start_index=10)
    capsys.readouterr()
    stream_files(repo)
    assert "built failed_4h, qty_sum_2h, n_lifetime" in capsys.readouterr().err
    logged = source_log.logged_files(query, committed_position(query).batch)
    read_since = sorted(Path(p).name for p in logged - source_log.logged_files(query, position.batch))
    assert read_since == [f"part-000{i}.parquet" for i in (10, 11, 12)]

    rows = offline_rows(spark, repo, AFTER)
    after = rows[rows[WINDOW_END] > changed_at].reset_index(drop=True)
    assert_batch_engine_rows(spark, AFTER, after, events, rows[WINDOW_END].max(), since=changed_at)
    check_sample(AFTER, after, events)
    assert_online_reference(repo, AFTER, events, after["user_id"].unique(), ["n_lifetime", "qty_sum_2h"])


def test_a_savepoint_names_each_file_once_however_spark_spelled_it(tmp_path) -> None:
    from features.engine.savepoint_files import relative_files

    root = tmp_path / "landing"
    files = frozenset({(root / "a.parquet").as_uri(), f"file:{root}/a.parquet", f"file:{root}/d/b.parquet"})
    assert relative_files(files, str(root)) == ["a.parquet", "d/b.parquet"]
