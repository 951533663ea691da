"""Pane tables as the stream's state store keeps them: serialized to bytes, and split into chunks of time."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from features.kernel.plan import BASE, PANE, Plan
from features.kernel.table import column_array, frame_of, pane_columns

# The chunk under which a bucket's stored state names its layout (features.kernel.migrate.Layout.id): no pane's
# chunk is this late.
LAYOUT_CHUNK = np.iinfo(np.int64).max
# The chunk under which a bucket's stored state keeps its Versions; the entries from here on are not panes.
VERSIONS_CHUNK = LAYOUT_CHUNK - 1


def is_pane_chunk(chunk: int) -> bool:
    """Whether a stored chunk holds panes (not the layout or the versions)."""
    return chunk < VERSIONS_CHUNK


@dataclass(frozen=True)
class Versions:
    """Which step (by the random token it stored in the bucket's meta) last wrote each stored chunk and the key
    dictionary, and the layout the chunks were built for. Spark hands a bucket to whichever Python worker is free,
    so a worker's copy of a bucket is often a step or more behind the store: with these it reads only the
    chunks that differ, not the whole state."""

    layout: str
    keys: int  # the step that last changed the key dictionary
    chunks: dict[int, int]  # chunk -> the step that last wrote it (0: before versions were kept)

    def to_bytes(self) -> bytes:
        return json.dumps([self.layout, self.keys, list(self.chunks.items())]).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Versions:
        layout, keys, chunks = json.loads(blob)
        return cls(layout, int(keys), {int(c): int(v) for c, v in chunks})


def to_bytes(table: pd.DataFrame) -> bytes:
    """A pane table as bytes for the state store: its columns pickled as numpy arrays (far cheaper than a
    conversion to Arrow for the many small chunks a batch writes), integer columns as offsets from their
    smallest value in the narrowest type that holds them (key codes, panes of one hour and counts need a few
    bytes, not eight)."""
    return pickle.dumps({c: _narrow(column_array(table[c])) for c in table.columns}, protocol=5)


def from_bytes(plan: Plan, blob: bytes) -> pd.DataFrame:
    return read_frame(blob)[pane_columns(plan)]


def read_frame(blob: bytes) -> pd.DataFrame:
    """A frame written by `to_bytes`."""
    return frame_of({c: _widen(v) for c, v in pickle.loads(blob).items()})


def _narrow(values: Any) -> Any:
    if isinstance(values, pd.arrays.ArrowExtensionArray):  # lists of variable-length partials pickle as Arrow
        array = pa.array(values)
        # Copied into buffers of its own: a chunk's rows are often a slice of a bigger table's, and Arrow pickles
        # a slice with the whole of its parent's buffers (every chunk of a bucket stored its sketches whole:
        # 45 bytes a pane became 2.3 KB with approximate distinct counts, and a 4 GB driver ran out of memory)
        return pa.concat_arrays([array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array])
    if values.dtype != np.int64 or len(values) == 0:
        return values
    low, high = int(values.min()), int(values.max())
    for dtype in (np.uint8, np.uint16, np.uint32):
        if high - low <= np.iinfo(dtype).max:
            return (low, (values - low).astype(dtype))
    return values


def _widen(stored: Any) -> np.ndarray:
    if isinstance(stored, tuple):
        low, offsets = stored
        return offsets.astype(np.int64) + low
    if isinstance(stored, pa.Array):
        return pd.arrays.ArrowExtensionArray(stored)
    return stored


HOUR_US = 3600 * 1_000_000
# A batch rewrites the chunk its events fall in: the store's commit and the worker's writes to it grow with that
# chunk. A 32nd of the window (112.5 s at 1 h) wrote 9.6 MB a batch in a live stream of 100,000 events a second
# (1 s panes, 10,000 keys), a 256th 1.5 MB, the batch 8% faster (bench/freshness.py --kafka).
CHUNKS_PER_WINDOW = 256
# Each chunk costs a pickle, a state read and its summaries' levels however few rows it holds: a chunk of one pane
# (a 24 h window of 5 min panes) pays them per pane, and a backlog of hours writes and reads hundreds of them.
MIN_CHUNK_PANES = 8


def chunk_length(plan: Plan) -> int:
    """How much pane time one stored chunk holds. A micro-batch rewrites the chunks its events fall in, so a
    chunk is a 256th of the panes the state keeps (the longest window, or a session's gap and `every`), at most
    an hour: at 1 s panes and a 1 h window a batch rewrites some 14 s of panes, not the hour. At least 8 panes
    where that is at most an eighth of what is kept, so that a chunk's fixed costs are shared; the state's oldest
    chunks are dropped whole (`prune`'s `align_us`), so a longer chunk keeps that much more state."""
    kept = max((c.size_us or c.every_us) + (c.gap_us or 0) for c in plan.calcs)
    floor = min(MIN_CHUNK_PANES * plan.pane_us, kept // MIN_CHUNK_PANES)
    return max(plan.pane_us, floor, min(HOUR_US, kept // CHUNKS_PER_WINDOW))


def chunk_of(table: pd.DataFrame, chunk_us: int) -> np.ndarray:
    """Each row's chunk: its pane's time rounded down to `chunk_us` (BASE rows form their own chunk)."""
    pane = table[PANE].to_numpy(dtype=np.int64)
    return np.where(pane == BASE, BASE, pane - pane % chunk_us)


def panes_to_arrow(table: pd.DataFrame) -> pa.Table:
    """A pane table as an Arrow table (a savepoint's Parquet rows): each column as it is, numpy or Arrow."""
    return pa.table({c: pa.array(column_array(table[c])) for c in table.columns})


def panes_from_arrow(table: pa.Table) -> pd.DataFrame:
    """A pane table read back from `panes_to_arrow`'s rows: lists of variable-length partials stay Arrow, as the kernel
    keeps them; every other column becomes numpy (strings and bytes as objects)."""
    columns: dict[str, Any] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        values = column.combine_chunks()
        if pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_struct(values.type):
            columns[name] = pd.arrays.ArrowExtensionArray(values)
        else:
            columns[name] = values.to_numpy(zero_copy_only=False)
    return frame_of(columns)
