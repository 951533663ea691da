"""The stream processor's state layout, driven without Spark through in-memory state handles: join keys as
codes of a per-bucket dictionary that is compacted as keys come and go, and pane tables stored narrow."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features import kernel as pt
from features.engine import stream as engine
from features.spec import DType

H = 3600 * 1_000_000
GROUP = FeatureGroup(
    "state_layout",
    Entity("user", join_keys=["user_id"]),
    EventSource("events", path="unused", timestamp="ts", watermark="10m"),
    [Feature("n_2h", agg.count(), Hop("2h", "10m")), Feature("total_2h", agg.sum("amount"), Hop("2h", "10m"))],
)
PLAN = pt.Plan.of(GROUP, {"user_id": DType.STRING, "ts": DType.INT64, "amount": DType.INT64})
OUTPUT = {
    engine.KIND: pa.string(),
    "user_id": pa.string(),
    "window_end": pa.int64(),
    "n_2h": pa.int64(),
    "total_2h": pa.int64(),
    engine.LATEST: pa.bool_(),
    engine.REASON: pa.string(),
    engine.RECORD: pa.string(),
}


class _Value:
    def __init__(self) -> None:
        self.value = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self):
        return self.value

    def update(self, value) -> None:
        self.value = value


class _Map:
    def __init__(self) -> None:
        self.items: dict = {}

    def iterator(self):
        return iter([((k,), (v,)) for k, v in self.items.items()])

    def updateValue(self, key, value) -> None:  # noqa: N802
        self.items[key[0]] = value[0]

    def removeKey(self, key) -> None:  # noqa: N802
        del self.items[key[0]]


class _Handle:
    def __init__(self) -> None:
        self.maps: dict[str, _Map] = {}
        self.value = _Value()

    def getValueState(self, *args):  # noqa: N802
        return self.value

    def getMapState(self, name, *args):  # noqa: N802
        return self.maps.setdefault(name, _Map())

    def registerTimer(self, at) -> None:  # noqa: N802
        pass


class _Timers:
    def __init__(self, watermark_us: int) -> None:
        self.ms = watermark_us // 1000

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return self.ms


def _batches() -> list[pd.DataFrame]:
    """Hour by hour, 40 users at a time; every 3 hours a new set of users, so old keys leave the state."""
    rng = np.random.default_rng(3)
    out = []
    for hour in range(12):
        users = [f"u{hour // 3}_{i}" for i in range(40)]
        n = 400
        out.append(
            pd.DataFrame(
                {
                    "user_id": rng.choice(users, n),
                    pt.TS: hour * H + rng.integers(0, H, n),
                    "fx_v_raw_amount": rng.integers(1, 100, n),
                    engine.REASON: np.full(n, None, dtype=object),
                    engine.RECORD: np.full(n, None, dtype=object),
                    engine.LANDED: np.full(n, 1, dtype=np.int64),
                }
            )
        )
    return out


def _run(monkeypatch, slack: int) -> tuple[pd.DataFrame, engine.PaneProcessor]:
    monkeypatch.setattr(engine, "COMPACT_SLACK", slack)
    processor = engine.PaneProcessor(PLAN, GROUP.name, OUTPUT)
    processor.init(_Handle())
    rows = []
    for events in _batches():
        arrow = pa.Table.from_pandas(events, preserve_index=False).to_batches(max_chunksize=150)
        packed = pd.DataFrame({engine.PACK: [engine._ipc(b) for b in arrow]})
        watermark = int(events[pt.TS].max()) - 10 * 60 * 1_000_000
        for out in processor.handleInputRows((0,), iter([packed]), _Timers(watermark)):
            rows.append(out[out[engine.KIND] == engine.ROW])
    return pd.concat(rows, ignore_index=True), processor


def test_compacting_the_key_dictionary_changes_no_value(monkeypatch) -> None:
    kept, _ = _run(monkeypatch, slack=10**9)
    compacted, processor = _run(monkeypatch, slack=0)
    pd.testing.assert_frame_equal(compacted, kept)
    assert len(kept) > 1000
    # 160 users came and went (40 per 3 hours); the dictionary holds at most twice the keys the state holds.
    keys = processor._dictionary()
    live = {int(c) for b in processor.chunks.items.values() for c in pt.read_frame(b)[pt.KEY]}
    assert len(live) <= len(keys) <= 2 * len(live) < 160
    assert live <= set(range(len(keys)))


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
