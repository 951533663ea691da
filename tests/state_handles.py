"""In-memory stand-ins for the state handles Spark gives a `transformWithStateInPandas` processor, so that the
stream's processor (features.engine.stream_operator.PaneProcessor) runs without Spark: in the unit tests, and in
bench/state_size.py (which then times the processor's own work, not RocksDB's)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from features.engine import stream_operator


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

    def keys(self):
        return iter([(k,) for k in self.items])

    def getValue(self, key):  # noqa: N802
        return (self.items[key[0]],) if key[0] in self.items else None

    def updateValue(self, key, value) -> None:  # noqa: N802
        self.items[key[0]] = value[0]

    def removeKey(self, key) -> None:  # noqa: N802
        del self.items[key[0]]


class MemoryHandle:
    def __init__(self) -> None:
        self.maps: dict[str, _Map] = {}
        self.value = _Value()

    def getValueState(self, *args):  # noqa: N802
        return self.value

    def getMapState(self, name, *args):  # noqa: N802
        return self.maps.setdefault(name, _Map())

    def registerTimer(self, at) -> None:  # noqa: N802
        pass


class Timers:
    def __init__(self, watermark_us: int) -> None:
        self.ms = watermark_us // 1000

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return self.ms


def packed(events: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {stream_operator.PACK: [stream_operator._ipc(pa.RecordBatch.from_pandas(events, preserve_index=False))]}
    )
