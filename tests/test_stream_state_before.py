"""A bucket's stream state written by the version of features before the state was held in chunks with merged
summaries (issue 69) is taken up by this version as it is: no `--reset`, no `features migrate`, and the rows
after it are those of a stream that ran this version from the start.

tests/fixtures/stream_state_77674e5.json.gz holds the stored state (meta, pane chunks, key dictionary) of one bucket
after the first half of the micro-batches below, as commit 77674e5's processor wrote it (`python
tests/test_stream_state_before.py` writes it with the code at hand). No Spark."""

from __future__ import annotations

import base64
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from reference import to_micros
from state_handles import MemoryHandle, Timers, packed
from test_batch_reference import GROUP_AGGS, GROUP_NEWER, SOURCE, USER, H, make_events
from test_kernel import TYPES, check_rows_sample, processor_input

from features import FeatureGroup
from features import kernel as pt
from features.engine import stream_operator, stream_rows
from features.engine.batch import ARROW_TYPES
from features.spec import WINDOW_END, DType

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "stream_state_77674e5.json.gz"
# Every sort of partial a pane keeps: counts, sums, extremes, moments, by time, lists, maps, distinct values and
# their hashes, percentile buckets; over hops of three lengths and a Lifetime (the state's BASE chunk).
CHOSEN = {
    *("n", "n_failed", "qty_sum", "amount_sum", "amount_avg", "status_min", "amount_max", "amount_sd"),
    *("status_first", "amount_last", "amounts_last3", "merchants", "merchants_exact", "amount_p90"),
    *("amount_skew", "qty_skew", "amount_first2", "amount_top3", "amount_bottom4", "status_hist"),
    *("merchant_top2", "merchants_max5", "last_seen", "merchant_set", "qty_set_life", "qty_kurt"),
}
GROUP = FeatureGroup(
    "before", USER, SOURCE, [f for f in (*GROUP_AGGS.features, *GROUP_NEWER.features) if f.name in CHOSEN]
)
PLAN = pt.Plan.of(GROUP, TYPES)
LATE_US = H // pd.Timedelta(microseconds=1)
EVENTS = make_events().query("user_id != 'u3'").reset_index(drop=True)  # u3's thousand merchants: a big state
BATCHES = 8
SAVED_AFTER = 4  # the fixture holds the state after this many batches


def _output() -> dict[str, pa.DataType]:
    types = GROUP.output_types({**TYPES, "event_ts": DType.TIMESTAMP})
    return {
        stream_rows.KIND: pa.string(),
        "user_id": pa.string(),
        WINDOW_END: pa.int64(),
        **{f.name: ARROW_TYPES[types[f.name]] for f in GROUP.features},
        stream_operator.LATEST: pa.bool_(),
        stream_rows.REPLACED: pa.bool_(),
        stream_rows.REASON: pa.string(),
        stream_rows.RECORD: pa.string(),
    }


def _parts() -> list[np.ndarray]:
    """The events' indexes per micro-batch: in time order, each up to an hour behind its neighbours."""
    rng = np.random.default_rng(21)
    arrival = np.array([to_micros(t) for t in EVENTS["event_ts"]]) + rng.integers(0, LATE_US, len(EVENTS))
    return np.array_split(np.argsort(arrival, kind="stable"), BATCHES)


def _run(processor: stream_operator.PaneProcessor, parts: list[np.ndarray], newest: int | None) -> list[pd.DataFrame]:
    """The change points and eager values of each batch of `parts`, the first one read from the stored state."""
    out = []
    stream_operator._RESIDENT.clear()
    for part in parts:
        frame = processor_input(PLAN, GROUP, EVENTS.iloc[part])
        frame[stream_rows.REASON] = np.full(len(frame), None, dtype=object)
        frame[stream_rows.RECORD] = np.full(len(frame), None, dtype=object)
        frame[stream_operator.LANDED] = np.zeros(len(frame), dtype=np.int64)
        watermark = 0 if newest is None else newest - LATE_US
        for rows in processor.handleInputRows((0,), iter([packed(frame)]), Timers(watermark)):
            out.append(rows[rows[stream_rows.KIND].isin([stream_rows.ROW, stream_rows.EAGER])])
        newest = max(newest or 0, int(frame[pt.TS].max()))
    return out


def _processor(handle: MemoryHandle) -> stream_operator.PaneProcessor:
    processor = stream_operator.PaneProcessor(PLAN, GROUP.name, _output(), delay_us=LATE_US)
    processor.init(handle)
    return processor


def _newest(parts: list[np.ndarray]) -> int:
    return max(to_micros(t) for part in parts for t in EVENTS["event_ts"].iloc[part])


def write_fixture() -> None:
    handle = MemoryHandle()
    _run(_processor(handle), _parts()[:SAVED_AFTER], None)
    encoded = {
        name: {str(k): base64.b64encode(v).decode() for k, v in m.items.items()} for name, m in handle.maps.items()
    }
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_bytes(gzip.compress(json.dumps({"meta": list(handle.value.value), "maps": encoded}).encode()))


def _saved() -> MemoryHandle:
    saved = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    handle = MemoryHandle()
    handle.value.value = tuple(saved["meta"])
    for name, items in saved["maps"].items():
        handle.getMapState(name).items = {int(k): base64.b64decode(v) for k, v in items.items()}
    return handle


def test_a_state_written_before_the_chunked_summaries_continues_as_if_this_version_had_written_it() -> None:
    """The saved state read, then stepped on: every change point and eager value of the batches after it is the
    reference's (a sample of them: the reference is slow)."""
    parts = _parts()
    continued = pd.concat(_run(_processor(_saved()), parts[SAVED_AFTER:], _newest(parts[:SAVED_AFTER])))
    continued = continued.astype({"user_id": object})
    rows = continued[continued[stream_rows.KIND] == stream_rows.ROW]
    assert len(rows) > 100 and rows[WINDOW_END].min() > _newest(parts[:SAVED_AFTER]) - 2 * LATE_US
    check_rows_sample(GROUP, rows, EVENTS, n=25)
    eager = continued[continued[stream_rows.KIND] == stream_rows.EAGER]
    delivered = EVENTS.iloc[np.concatenate(parts[: SAVED_AFTER + 1])]
    first = eager[eager[WINDOW_END] == eager[WINDOW_END].min()]
    check_rows_sample(GROUP, first, delivered, n=10)


if __name__ == "__main__":
    sys.exit(write_fixture())
