"""The stream processor's state layout, driven without Spark through in-memory state handles: join keys as
codes of a per-bucket dictionary that is compacted as keys come and go, and pane tables stored narrow."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from state_handles import MemoryHandle, Timers, packed

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg, atomic
from features import kernel as pt
from features.engine import stream_operator, stream_rows
from features.engine.stream_definition import save_definition, saved_definition
from features.spec import DType

H = 3600 * 1_000_000
GROUP = FeatureGroup(
    "state_layout",
    Entity("user", join_keys=["user_id"]),
    EventSource("events", path="unused", timestamp="ts", watermark="10m"),
    [Feature("n_2h", agg.count(), Hop("2h", "10m")), Feature("total_2h", agg.sum("amount"), Hop("2h", "10m"))],
)
DELAY_US = GROUP.source.watermark_s * 1_000_000
PLAN = pt.Plan.of(GROUP, {"user_id": DType.STRING, "ts": DType.INT64, "amount": DType.INT64})
OUTPUT = {
    stream_rows.KIND: pa.string(),
    "user_id": pa.string(),
    "window_end": pa.int64(),
    "n_2h": pa.int64(),
    "total_2h": pa.int64(),
    stream_operator.LATEST: pa.bool_(),
    stream_rows.REASON: pa.string(),
    stream_rows.RECORD: pa.string(),
}


def _events(users: np.ndarray, ts: np.ndarray, **values: np.ndarray) -> pd.DataFrame:
    """A bucket's events as the processor receives them: keys, times, the source's values, nothing set aside."""
    n = len(ts)
    return pd.DataFrame(
        {
            "user_id": users,
            pt.TS: ts,
            **values,
            stream_rows.REASON: np.full(n, None, dtype=object),
            stream_rows.RECORD: np.full(n, None, dtype=object),
            stream_operator.LANDED: np.full(n, 1, dtype=np.int64),
        }
    )


def _batches() -> list[pd.DataFrame]:
    """Hour by hour, 40 users at a time; every 3 hours a new set of users, so old keys leave the state."""
    rng = np.random.default_rng(3)
    out = []
    for hour in range(12):
        users = [f"u{hour // 3}_{i}" for i in range(40)]
        n = 400
        users, ts = rng.choice(users, n), hour * H + rng.integers(0, H, n)
        out.append(_events(users, ts, fx_v_raw_amount=rng.integers(1, 100, n)))
    return out


def _run(
    monkeypatch, slack: int, resident: bool = True, kinds: tuple[str, ...] = (stream_rows.ROW,)
) -> tuple[pd.DataFrame, stream_operator.PaneProcessor]:
    monkeypatch.setattr(stream_operator, "COMPACT_SLACK", slack)
    processor = stream_operator.PaneProcessor(PLAN, GROUP.name, OUTPUT, delay_us=DELAY_US)
    processor.init(MemoryHandle())
    rows = []
    for events in _batches():
        if not resident:  # as if each batch ran on another Python worker
            stream_operator._RESIDENT.clear()
        arrow = pa.Table.from_pandas(events, preserve_index=False).to_batches(max_chunksize=150)
        packed = pd.DataFrame({stream_operator.PACK: [stream_operator._ipc(b) for b in arrow]})
        watermark = int(events[pt.TS].max()) - 10 * 60 * 1_000_000
        for out in processor.handleInputRows((0,), iter([packed]), Timers(watermark)):
            rows.append(out[out[stream_rows.KIND].isin(kinds)])
    return pd.concat(rows, ignore_index=True), processor


def test_compacting_the_key_dictionary_changes_no_value(monkeypatch) -> None:
    kept, _ = _run(monkeypatch, slack=10**9)
    compacted, processor = _run(monkeypatch, slack=0)
    pd.testing.assert_frame_equal(compacted, kept)
    assert len(kept) > 1000
    # 160 users came and went (40 per 3 hours); the dictionary holds at most twice the keys the state holds.
    keys = processor._dictionary()
    chunks = [b for chunk, b in processor.chunks.items.items() if pt.is_pane_chunk(chunk)]
    live = {int(c) for b in chunks for c in pt.read_frame(b)[pt.KEY]}
    assert len(live) <= len(keys) <= 2 * len(live) < 160
    assert live <= set(range(len(keys)))


@pytest.mark.parametrize("slack", [10**9, 0], ids=["kept", "compacted"])
def test_state_kept_in_the_worker_gives_what_the_state_store_gives(monkeypatch, slack: int) -> None:
    """A bucket whose next batch runs on the same Python worker starts from the state the worker kept; every
    row, eager value and stat equals a run that reads the state store each batch."""
    kinds = (stream_rows.ROW, stream_rows.EAGER, stream_rows.STAT)
    reads = []
    dictionary = stream_operator.PaneProcessor._dictionary
    monkeypatch.setattr(stream_operator.PaneProcessor, "_dictionary", lambda self: reads.append(1) or dictionary(self))
    stored, _ = _run(monkeypatch, slack, resident=False, kinds=kinds)
    assert len(reads) == len(_batches())
    reads.clear()
    kept, _ = _run(monkeypatch, slack, resident=True, kinds=kinds)
    assert len(reads) == 1  # only the first batch read the store
    pd.testing.assert_frame_equal(kept, stored)
    assert (kept[stream_rows.KIND] == stream_rows.EAGER).any()


def test_a_worker_keeps_no_state_that_the_store_does_not_hold(monkeypatch) -> None:
    """A step whose batch Spark then discards (its state store not committed) leaves the worker's copy ahead of
    the store: the batch run again reads back what the discarded step wrote, and gives what a worker reading the
    whole store gives."""
    processor = stream_operator.PaneProcessor(PLAN, GROUP.name, OUTPUT, delay_us=DELAY_US)
    handle = MemoryHandle()
    processor.init(handle)
    batches = _batches()
    for events in batches[:4]:
        committed = (handle.value.value, {n: dict(m.items) for n, m in handle.maps.items()})
        list(processor.handleInputRows((0,), iter([packed(events)]), Timers(int(events[pt.TS].max()))))

    def again(resident: bool) -> pd.DataFrame:
        handle.value.value = committed[0]  # the fourth batch failed: the store rolls back to the third
        for name, items in committed[1].items():
            handle.maps[name].items = dict(items)
        if not resident:
            stream_operator._RESIDENT.clear()
        events = batches[3]
        return pd.concat(processor.handleInputRows((0,), iter([packed(events)]), Timers(int(events[pt.TS].max()))))

    kept = again(resident=True)
    pd.testing.assert_frame_equal(kept, again(resident=False))


def test_a_worker_behind_the_store_reads_only_the_chunks_that_differ(monkeypatch) -> None:
    """Spark hands a bucket to whichever Python worker is free: a worker's copy is then some steps behind the
    store. It reads again only the chunks written since (and the key dictionary when it changed), and every row,
    eager value and stat equals a run that reads the whole store each batch."""
    kinds = (stream_rows.ROW, stream_rows.EAGER, stream_rows.STAT)
    stored, _ = _run(monkeypatch, 0, resident=False, kinds=kinds)
    workers = [stream_operator.OrderedDict(), stream_operator.OrderedDict()]
    turns = iter([0, 1, 1, 0, 1, 0, 0, 0, 1, 0, 1, 1])  # which worker runs each batch
    read, held, whole = [], [], []
    chunk_map = type(MemoryHandle().getMapState("chunks"))

    def get_value(self, key):
        read.append(key[0])
        return (self.items[key[0]],) if key[0] in self.items else None

    monkeypatch.setattr(chunk_map, "getValue", get_value)
    load, misfiled = stream_operator.PaneProcessor._load, stream_operator.PaneProcessor._misfiled

    def on_worker(self, bucket):
        monkeypatch.setattr(stream_operator, "_RESIDENT", workers[next(turns)])
        held.append(sum(pt.is_pane_chunk(c) for c in self.chunks.items))
        return load(self, bucket)

    monkeypatch.setattr(stream_operator.PaneProcessor, "_load", on_worker)
    monkeypatch.setattr(stream_operator.PaneProcessor, "_misfiled", lambda *a: whole.append(1) or misfiled(*a))
    kept, _ = _run(monkeypatch, 0, resident=True, kinds=kinds)
    pd.testing.assert_frame_equal(kept, stored)
    assert len(whole) == 2  # each worker's first batch read the whole store
    chunks = [c for c in read if pt.is_pane_chunk(c)]
    assert 0 < len(chunks) < sum(held) / 2


def test_a_batch_rewrites_the_lifetime_base_chunk_only_when_it_folded_panes() -> None:
    """The BASE chunk holds a row for every key the stream has seen (its Lifetime partials): rewritten at every
    batch, it made a live stream's state store write, and keep a changelog of, all its keys each second. A live
    stream of a batch a minute: the BASE chunk is written only at the batches whose watermark dropped a chunk of
    panes (every 10 minutes here), and after every batch the store holds exactly the worker's table."""
    group = FeatureGroup(
        "base_writes",
        GROUP.entity,
        GROUP.source,
        [Feature("n_life", agg.count(), Lifetime("10m")), Feature("n_1h", agg.count(), Hop("1h", "10m"))],
    )
    plan = pt.Plan.of(group, {"user_id": DType.STRING, "ts": DType.INT64})
    output = {name: t for name, t in OUTPUT.items() if name not in ("n_2h", "total_2h")}
    processor = stream_operator.PaneProcessor(
        plan, group.name, {**output, "n_life": pa.int64(), "n_1h": pa.int64()}, delay_us=DELAY_US
    )
    handle = MemoryHandle()
    processor.init(handle)
    chunks = handle.maps["chunks"]
    base_writes = []
    write = chunks.updateValue
    chunks.updateValue = lambda key, value: (base_writes.append(1) if key[0] == pt.BASE else None, write(key, value))
    rng = np.random.default_rng(5)
    minute, batches = 60 * 1_000_000, 150
    for i in range(batches):
        n = 30
        events = _events(rng.choice([f"u{k}" for k in range(50)], n), 10 * H + i * minute + rng.integers(0, minute, n))
        list(processor.handleInputRows((0,), iter([packed(events)]), Timers(10 * H + i * minute - 5 * minute)))
        stored = [pt.read_frame(b) for c, b in chunks.items.items() if pt.is_pane_chunk(c)]
        held = stream_operator._RESIDENT[(group.name, 0)].table
        order = [pt.KEY, pt.PANE]
        want = held.sort_values(order, ignore_index=True)
        pd.testing.assert_frame_equal(pd.concat(stored).sort_values(order, ignore_index=True), want)
    assert pt.BASE in chunks.items
    # A stretch of 10 minutes of panes leaves the hour each time the watermark (5 minutes behind the batch)
    # passes 70, 80, ..., 140 minutes: 8 of the 150 batches.
    assert len(base_writes) == 8


def test_each_stored_chunk_holds_its_own_rows_only() -> None:
    """A chunk's rows are often a slice of the bucket's table, and Arrow pickles a slice with its parent's whole
    buffers: the sketches and lists of every chunk were stored in each (a state some 50x larger, a driver out of
    memory). The stored chunks together take what their rows take stored once, give or take each chunk's own
    overhead."""
    group = FeatureGroup(
        "chunk_bytes",
        GROUP.entity,
        GROUP.source,
        [
            Feature("users_2h", agg.approx_count_distinct("merchant"), Hop("2h", "10m")),
            Feature("last3_2h", agg.last_k("amount", 3), Hop("2h", "10m")),
        ],
    )
    plan = pt.Plan.of(
        group, {"user_id": DType.STRING, "ts": DType.INT64, "merchant": DType.STRING, "amount": DType.INT64}
    )
    output = {name: t for name, t in OUTPUT.items() if name not in ("n_2h", "total_2h")}
    output |= {"users_2h": pa.int64(), "last3_2h": pa.list_(pa.int64())}
    processor = stream_operator.PaneProcessor(plan, group.name, output, delay_us=DELAY_US)
    handle = MemoryHandle()
    processor.init(handle)
    rng = np.random.default_rng(8)
    for hour in range(6):
        n = 600
        users, ts = rng.choice([f"u{k}" for k in range(30)], n), hour * H + rng.integers(0, H, n)
        merchants, amounts = rng.choice([f"m{k}" for k in range(200)], n), rng.integers(1, 100, n)
        events = _events(users, ts, fx_v_raw_merchant=merchants, fx_v_raw_amount=amounts)
        list(processor.handleInputRows((0,), iter([packed(events)]), Timers(hour * H)))
    blobs = [b for c, b in handle.maps["chunks"].items.items() if pt.is_pane_chunk(c)]
    assert len(blobs) > 4
    once = len(pt.to_bytes(pd.concat([pt.read_frame(b) for b in blobs], ignore_index=True)))
    assert sum(map(len, blobs)) <= once + 1000 * len(blobs), (sum(map(len, blobs)), once)


def _emitted_per_batch(delay_us: int, inputs: list[pd.DataFrame | None], newest: list[int]) -> list[pd.DataFrame]:
    """One bucket's change points after each batch (`inputs`: its events, None for none; `newest`: the batch's
    newest event time, which every bucket is told), handed Spark's watermark (the batches before less the 10
    minutes), then after Spark's batch without events that fires the timers the last watermark passed."""
    stream_operator._RESIDENT.clear()
    processor = stream_operator.PaneProcessor(PLAN, GROUP.name, OUTPUT, delay_us=delay_us)
    processor.init(MemoryHandle())
    columns = ["user_id", "window_end", "n_2h", "total_2h"]
    emitted, spark_watermark = [], 0
    for events, top in zip(inputs, newest, strict=True):
        frame = pd.DataFrame({stream_operator.PACK: [None]}) if events is None else packed(events)
        frame[stream_operator.NEWEST] = top
        out = list(processor.handleInputRows((0,), iter([frame]), Timers(spark_watermark)))
        emitted.append(pd.concat([o[o[stream_rows.KIND] == stream_rows.ROW][columns] for o in out], ignore_index=True))
        spark_watermark = top - DELAY_US
    out = list(processor.handleExpiredTimer((0,), Timers(spark_watermark), None))
    emitted.append(pd.concat([o[o[stream_rows.KIND] == stream_rows.ROW][columns] for o in out] or [emitted[0][:0]]))
    return [e.reset_index(drop=True) for e in emitted]


def test_a_batch_emits_up_to_the_watermark_its_own_events_set() -> None:
    """Spark hands a batch the watermark the batches before it set, and fires timers past a newer one only in a
    batch without events after it. The processor emits each batch's rows up to the watermark the batch's own
    events set: the rows a processor that waits for Spark's watermark emits a batch later, and nothing is left
    for the batch without events. So for a bucket without events, told only the batch's newest event time: its
    keys' rows as their panes leave the windows."""
    batches = _batches()
    newest = [int(b[pt.TS].max()) for b in batches]
    never = 10**15  # a delay no event time reaches: the processor emits only as Spark's watermark passes
    for inputs in (batches, [batches[0], *[None] * (len(batches) - 1)]):
        now, later = _emitted_per_batch(DELAY_US, inputs, newest), _emitted_per_batch(never, inputs, newest)
        assert len(now[-1]) == 0 and len(later[0]) == 0
        for i in range(len(batches)):
            pd.testing.assert_frame_equal(now[i], later[i + 1])
        assert sum(map(len, now)) > 100


def test_key_dictionary_codes_round_trip() -> None:
    keys = pt.KeyDictionary(["a", "b"])
    codes, fresh = keys.encode(pd.DataFrame({"a": ["x", "y", "x", "z"], "b": [1, 2, 1, 2]}))
    assert codes.tolist() == [0, 1, 0, 2] and len(fresh) == 3
    codes, fresh = keys.encode(pd.DataFrame({"a": ["z", "w"], "b": [2, 9]}))
    assert codes.tolist() == [2, 3] and fresh.to_dict("list") == {"a": ["w"], "b": [9]}
    decoded = keys.decode(np.array([3, 0]))
    assert decoded["a"].to_pylist() == ["w", "x"] and decoded["b"].to_pylist() == [9, 1]
    renumber = keys.compact(np.array([1, 3]))
    assert renumber.tolist() == [-1, 0, -1, 1] and keys.frame.to_dict("list") == {"a": ["y", "w"], "b": [2, 9]}


@pytest.mark.parametrize(
    "values",
    [
        np.array([5, 7, 300], dtype=np.int64),
        np.array([-(2**40), 2**40], dtype=np.int64),
        np.array([pt.BASE, 0], dtype=np.int64),
        np.array([1.5, np.nan]),
        np.array(["a", None], dtype=object),
    ],
)
def test_stored_columns_come_back_exactly(values) -> None:
    frame = pd.DataFrame({"c": values})
    back = pt.read_frame(pt.to_bytes(frame))
    pd.testing.assert_frame_equal(back, frame)


def test_a_checkpoints_definition_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch) -> None:
    """A stream killed while it saves its definition (or a reader at that moment) finds the previous one whole:
    the new one is written beside it and renamed over it. A rename that fails leaves the previous one."""
    save_definition(tmp_path, {"layout": "before"})

    def refused(*_: object) -> None:
        raise OSError("no rename")

    monkeypatch.setattr(atomic.os, "replace", refused)
    with pytest.raises(OSError, match="no rename"):
        save_definition(tmp_path, {"layout": "after"})
    assert saved_definition(tmp_path) == {"layout": "before"}
    assert [p.name for p in tmp_path.iterdir()] == ["features-definition.json"]  # nothing left beside it
    monkeypatch.undo()
    save_definition(tmp_path, {"layout": "after"})
    assert saved_definition(tmp_path) == {"layout": "after"}


def test_state_stored_in_chunks_of_another_length_continues_and_is_refiled(monkeypatch) -> None:
    """A bucket's state written in chunks of one hour (by an earlier version of features) read by a processor
    whose chunks are shorter: the same rows as a stream that always used the shorter chunks, and after the next
    batch every stored chunk holds its own panes only."""
    chunk = pt.chunk_length(PLAN)
    assert chunk < H  # the test's group stores chunks shorter than an hour

    def run(lengths: list[int]) -> tuple[pd.DataFrame, MemoryHandle]:
        handle, rows = MemoryHandle(), []
        for events, length in zip(_batches(), lengths, strict=True):
            stream_operator._RESIDENT.clear()  # each batch reads the store
            processor = stream_operator.PaneProcessor(PLAN, GROUP.name, OUTPUT, delay_us=DELAY_US)
            processor.chunk_us = length
            processor.init(handle)
            watermark = int(events[pt.TS].max()) - 10 * 60 * 1_000_000
            for out in processor.handleInputRows((0,), iter([packed(events)]), Timers(watermark)):
                rows.append(out[out[stream_rows.KIND].isin((stream_rows.ROW, stream_rows.EAGER))])
        return pd.concat(rows, ignore_index=True), handle

    n = len(_batches())
    always, _ = run([chunk] * n)
    upgraded, handle = run([H] * (n // 2) + [chunk] * (n - n // 2))
    pd.testing.assert_frame_equal(upgraded, always)
    stored = {c: pt.read_frame(b) for c, b in handle.maps["chunks"].items.items() if pt.is_pane_chunk(c)}
    assert len(stored) > 2
    for at, frame in stored.items():
        assert (pt.chunk_of(frame, chunk) == at).all()


def test_the_watermark_a_batch_emitted_is_the_recorded_one_else_sparks(tmp_path) -> None:
    """Spark's offsets hold the watermark it handed each batch, a batch behind what the batch emitted; the stream
    records its last batch's. A batch it has no record for (one without events, or a checkpoint of an earlier
    version of features) falls back to Spark's, which is never later than what the batch emitted."""
    from features.engine.query_log import EMITTED, last_commit, record_emitted, watermark_at

    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, ms in ((0, 0), (1, 5_000)):
        (tmp_path / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":{ms}}}\n')
        (tmp_path / "commits" / str(batch)).write_text("v1\n{}\n")
    assert last_commit(tmp_path) == (1, 5_000_000)  # no record: Spark's
    record_emitted(tmp_path, 1, 9_000_000)
    assert last_commit(tmp_path) == (1, 9_000_000)
    assert watermark_at(tmp_path, 0) is None  # Spark's first watermark, the epoch: none yet
    record_emitted(tmp_path, 2, 12_000_000)  # batch 2's rows written, its commit not (a kill in between)
    assert last_commit(tmp_path) == (1, 5_000_000)
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [EMITTED]
