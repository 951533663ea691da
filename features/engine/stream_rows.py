"""The rows a stream's stateful operator outputs, one schema for every kind: change points, eager values, late
events, bad records and each bucket's stats (features.engine.stream_operator.PaneProcessor makes them, the stream's sink
splits them by `KIND`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from features import kernel as pt
from features.spec.definitions import LATEST  # on ROW rows: the key's newest row of the batch, for online

KIND = "fx_kind"  # what an output row is: a change point, a late event, a bad record, or a bucket's state size
ROW, LATE, BAD, STAT = "row", "late", "bad", "stat"
EAGER = "eager"  # a touched key's value ahead of the watermark, for the online store only
REASON = "fx_reason"
RECORD = "fx_record"  # a late event or bad record as JSON; on STAT rows the bucket's STAT_FIELDS as a JSON list
REPLACED = "fx_replaced"  # on LATEST rows: the key has an EAGER row too, newer, which replaces it online
# What a STAT row tells of its bucket: pane rows and serialized bytes in state, events read, the watermark it
# emitted up to (µs), and when its oldest event landed (µs). One JSON column rather than a column each: every
# output row carries every column, and these would be null on all but one row per bucket.
STAT_FIELDS = ("bucket", "state_rows", "state_bytes", "events", "watermark", "landed")


class OutputFrames:
    """Builds the operator's output frames; `output`: column -> Arrow type, in the order of the output schema."""

    def __init__(self, output: dict[str, Any]) -> None:
        self.output = output

    def frame(self, kind: str, n: int, columns: dict[str, Any]) -> pd.DataFrame:
        """An output frame; the columns not given are null. Arrow-backed where it can be: PySpark hands an Arrow
        array to Spark as it is, where a numpy object column is scanned value by value."""
        columns[KIND] = pa.array([kind], pa.string()).take(np.zeros(n, dtype=np.int32))
        data = {}
        for name, arrow_type in self.output.items():
            values = columns.get(name)
            if values is None:
                # PySpark converts nested values one by one, and takes pandas' NA for a value there.
                values = np.full(n, None, dtype=object) if pa.types.is_nested(arrow_type) else pa.nulls(n, arrow_type)
            data[name] = pd.arrays.ArrowExtensionArray(values) if isinstance(values, pa.Array) else values
        return pd.DataFrame(data)

    def rows(
        self, rows: pd.DataFrame, keys: pt.KeyDictionary, kind: str = ROW, superseded: np.ndarray | None = None
    ) -> pd.DataFrame:
        codes = rows[pt.KEY].to_numpy(dtype=np.int64)
        out: dict[str, Any] = keys.decode(codes)
        for c in rows.columns.drop(pt.KEY):
            arrow_type = self.output.get(c)
            if arrow_type is None:
                out[c] = rows[c].to_numpy()
            elif pa.types.is_nested(arrow_type):  # PySpark converts nested values one by one, from lists and dicts
                values = pt.to_arrow(rows[c], arrow_type).to_pylist(maps_as_pydicts="strict")
                out[c] = pd.Series(values, dtype=object).to_numpy()
            else:
                out[c] = pt.to_arrow(rows[c], arrow_type)
        out[LATEST] = pt.key_lasts([codes])  # rows come sorted by key, then window end
        if superseded is not None:
            out[REPLACED] = out[LATEST] & np.isin(codes, superseded)
        return self.frame(kind, len(rows), out)

    def side(self, kind: str, reasons: np.ndarray, records: np.ndarray) -> pd.DataFrame:
        return self.frame(kind, len(reasons), {REASON: reasons, RECORD: records})

    def stat(self, bucket: int, rows: int, size: int, upto: int, events: int, landed: int | None) -> pd.DataFrame:
        """The bucket's STAT_FIELDS, for the progress report."""
        record = json.dumps([bucket, rows, size, events, upto, landed])
        return self.frame(STAT, 1, {RECORD: np.array([record], dtype=object)})
