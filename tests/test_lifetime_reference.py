"""Every aggregation over a Lifetime window against the brute-force reference, in both engines.

The stream keeps a key's pane table only as far back as a later window still reads; what only Lifetime windows
read any more is folded into one BASE row per key (features.kernel.microbatch.prune), stored as a chunk of its own,
and merged again with newer panes at each later fold. The events here span 30 hours, far beyond that horizon
(two to three hours here), so every key's Lifetime values past the first hours come from its BASE row. The stream's
processor (features.engine.stream_operator.PaneProcessor) runs without Spark, on in-memory state handles, its state read
back from bytes at every batch; the batch engine runs on Spark, from the range start (its first rows carry the
whole history) and over the full range.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from reference import reference_frame, to_micros
from state_handles import MemoryHandle, Timers, packed
from test_batch_reference import (
    BASE,
    RANGES,
    SOURCE,
    USER,
    H,
    M,
    _rows,
    check_against_reference,
    collect_change_points,
    compare_value,
    make_events,
)
from test_kernel import TYPES, processor_input

from features import Feature, FeatureGroup, Hop, Lifetime, agg
from features import kernel as pt
from features.engine import stream_operator, stream_rows
from features.engine.batch import ARROW_TYPES
from features.spec import WINDOW_END, DType

LIFE = Lifetime(every="1h")
LIFE_5M = Lifetime(every="5m")
GROUP = FeatureGroup(
    "lifetime",
    USER,
    SOURCE,
    [
        Feature("n", agg.count(), window=LIFE),
        Feature("n_failed", agg.count(), window=LIFE_5M, where="status = 'FAILED'"),
        Feature("qty_sum", agg.sum("qty"), window=LIFE),
        Feature("amount_sum", agg.sum("amount"), window=LIFE_5M),
        Feature("amount_avg", agg.avg("amount"), window=LIFE),
        Feature("qty_avg", agg.avg("qty"), window=LIFE_5M),
        Feature("amount_min", agg.min("amount"), window=LIFE),
        Feature("amount_max", agg.max("amount"), window=LIFE),
        Feature("qty_max_ok", agg.max("qty"), window=LIFE_5M, where="ok"),
        Feature("status_max", agg.max("status"), window=LIFE),
        Feature("amount_sd", agg.stddev("amount"), window=LIFE),
        Feature("qty_sd", agg.stddev("qty"), window=LIFE_5M),
        Feature("status_first", agg.first("status"), window=LIFE),
        Feature("amount_first", agg.first("amount"), window=LIFE_5M),
        Feature("status_last", agg.last("status"), window=LIFE),
        Feature("qty_last", agg.last("qty"), window=LIFE_5M),  # a null qty: the value before it, maybe in BASE
        Feature("amounts_last3", agg.last_k("amount", 3), window=LIFE),
        Feature("statuses_last2", agg.last_k("status", 2), window=LIFE_5M, where="amount > 20"),
        Feature("merchants", agg.approx_count_distinct("merchant_id"), window=LIFE),
        Feature("statuses", agg.approx_count_distinct("status"), window=LIFE_5M),
        Feature("merchants_exact", agg.count_distinct("merchant_id"), window=LIFE),
        Feature("oks_exact", agg.count_distinct("ok"), window=LIFE_5M),
        Feature("amount_p50", agg.approx_percentile("amount", 0.5), window=LIFE),
        Feature("amount_p90", agg.approx_percentile("amount", 0.9), window=LIFE_5M),
        Feature("qty_p10", agg.approx_percentile("qty", 0.1), window=LIFE, where="status = 'APPROVED'"),
        Feature("last_seen", agg.last_event_time(), window=LIFE),
        Feature("last_big_seen", agg.last_event_time(), window=LIFE_5M, where="amount > 20"),
        Feature("merchant_set", agg.distinct_values("merchant_id"), window=LIFE_5M),
        Feature("status_set", agg.distinct_values("status"), window=LIFE, where="ok"),
        # Bounded windows beside them: they set how far back the state reaches, and read no BASE row.
        Feature("amount_max_30m", agg.max("amount"), window=Hop("30m", every="10m")),
        Feature("n_30m", agg.count(), window=Hop("30m", every="10m")),
    ],
)


def _gap_events() -> pd.DataFrame:
    """A key with values in its first hours, then, a day later, events whose values are all null: there
    `last`, `first`, `last_k` and every other value can only come from the BASE row."""
    rng = np.random.default_rng(12)
    early = _rows(rng, "u_gap", [BASE + k * 13 * M for k in range(10)], null_rate=0.0)
    later = _rows(rng, "u_gap", [BASE + 26 * H + k * 7 * M for k in range(4)], all_null=True)
    return pd.concat([early, later], ignore_index=True)


EVENTS = pd.concat([make_events(), _gap_events()], ignore_index=True)
KEYS = sorted((k,) for k in EVENTS["user_id"].unique())
LATENESS = H


def _output() -> dict[str, pa.DataType]:
    """The processor's output columns, as features.engine.stream_operator.project declares them."""
    types = GROUP.output_types({**TYPES, "event_ts": DType.TIMESTAMP})
    return {
        stream_rows.KIND: pa.string(),
        **{k: ARROW_TYPES[types[k]] for k in GROUP.join_keys},
        WINDOW_END: pa.int64(),
        **{f.name: ARROW_TYPES[types[f.name]] for f in GROUP.features},
        stream_operator.LATEST: pa.bool_(),
        stream_rows.REPLACED: pa.bool_(),
        stream_rows.REASON: pa.string(),
        stream_rows.RECORD: pa.string(),
    }


def _input(plan: pt.Plan, events: pd.DataFrame) -> pd.DataFrame:
    """One micro-batch of one bucket as the processor receives it (packed Arrow IPC)."""
    frame = processor_input(plan, GROUP, events)
    frame[stream_rows.REASON] = np.full(len(frame), None, dtype=object)
    frame[stream_rows.RECORD] = np.full(len(frame), None, dtype=object)
    frame[stream_operator.LANDED] = np.zeros(len(frame), dtype=np.int64)
    return packed(frame)


def _as_timestamps(rows: pd.DataFrame) -> pd.DataFrame:
    ends = pd.to_datetime(rows[WINDOW_END].to_numpy(dtype=np.int64), unit="us", utc=True)
    return rows.assign(**{WINDOW_END: ends.astype("datetime64[us, UTC]")})


def _base_keys(processor: stream_operator.PaneProcessor) -> int:
    """How many keys the stored BASE chunk holds."""
    base = processor.chunks.items.get(pt.BASE)
    return 0 if base is None else len(pt.read_frame(base))


@pytest.fixture(scope="module")
def streamed() -> dict[str, object]:
    """EVENTS through the stream's processor in 9 micro-batches of one bucket, each event up to LATENESS behind
    its neighbours, the watermark LATENESS behind the newest event of the batches before (Spark's); the state is
    read back from its bytes at every batch. The change points, each batch's eager values with the events
    delivered so far, and how many keys the BASE chunk held after each batch and at the end."""
    plan = pt.Plan.of(GROUP, TYPES)
    processor = stream_operator.PaneProcessor(
        plan, GROUP.name, _output(), delay_us=int(LATENESS / pd.Timedelta(microseconds=1))
    )
    processor.init(MemoryHandle())
    rng = np.random.default_rng(11)
    late_us = int(LATENESS / pd.Timedelta(microseconds=1))
    arrival = np.array([to_micros(t) for t in EVENTS["event_ts"]]) + rng.integers(0, late_us, len(EVENTS))
    parts = np.array_split(np.argsort(arrival, kind="stable"), 9)
    rows, eager, base_keys, newest = [], [], [], None
    for n, part in enumerate(parts):
        stream_operator._RESIDENT.clear()  # every batch reads its state from the stored bytes, the BASE chunk too
        watermark = 0 if newest is None else newest - late_us  # Spark's first watermark is the epoch
        batch = EVENTS.iloc[part]
        delivered = EVENTS.iloc[np.sort(np.concatenate(parts[: n + 1]))]
        for out in processor.handleInputRows((0,), iter([_input(plan, batch)]), Timers(watermark)):
            assert not out[stream_rows.KIND].isin([stream_rows.LATE, stream_rows.BAD]).any()
            rows.append(out[out[stream_rows.KIND] == stream_rows.ROW])
            if (out[stream_rows.KIND] == stream_rows.EAGER).any():
                eager.append((out[out[stream_rows.KIND] == stream_rows.EAGER], delivered))
        newest = max(newest or 0, max(to_micros(t) for t in batch["event_ts"]))
        base_keys.append(_base_keys(processor))
    # The rest of the window ends: the bucket's timer fires with the watermark past every event's expiry.
    for out in processor.handleExpiredTimer((0,), Timers(to_micros(RANGES["full"][1])), None):
        rows.append(out[out[stream_rows.KIND] == stream_rows.ROW])
    base_keys.append(_base_keys(processor))
    columns = [*GROUP.join_keys, WINDOW_END, *(f.name for f in GROUP.features)]
    change_points = pd.concat(rows, ignore_index=True)[columns]
    return {"rows": _as_timestamps(change_points), "eager": eager, "base_keys": base_keys}


def test_the_stream_folds_lifetime_panes_into_base_rows(streamed) -> None:
    """The premise of this module: the stream's state did fold panes, early, for every key, and kept on."""
    base_keys = streamed["base_keys"]  # after each of the 9 batches, then after the timer
    assert base_keys[1] > 0  # after the second batch already, with most events still to come
    assert base_keys == sorted(base_keys) and base_keys[-1] == len(KEYS)


def test_stream_change_points_match_the_reference(streamed) -> None:
    rows = streamed["rows"]
    assert not rows.duplicated([*GROUP.join_keys, WINDOW_END]).any()
    start, end = RANGES["full"]
    check_against_reference(EVENTS, GROUP, rows, start, end, KEYS, seed=5, per_kind=15)


def test_stream_eager_values_match_the_reference_of_the_events_so_far(streamed) -> None:
    """Eager values read the BASE row too (`values_of`, not `emit`): each batch's, against the reference of the
    events delivered up to that batch."""
    checked = 0
    for values, delivered in streamed["eager"][1:]:  # the first batch's state has folded nothing yet
        values = _as_timestamps(values)
        sample = values.iloc[:: max(1, len(values) // 3)]
        t = sample[WINDOW_END]
        want = reference_frame(delivered, GROUP, [((k,), e) for k, e in zip(sample["user_id"], t, strict=True)])
        got = sample.reset_index(drop=True)
        for feat in GROUP.features:
            for i in range(len(got)):
                problem = compare_value(feat, True, got.loc[i, feat.name], want.loc[i, feat.name])
                assert problem is None, f"{feat.name} {got.loc[i, 'user_id']} at {t.iloc[i]}: {problem}"
        checked += len(got)
    assert checked >= 10


@pytest.fixture(scope="module")
def events_df(spark):
    frame = spark.createDataFrame(EVENTS).cache()
    yield frame
    frame.unpersist()


@pytest.mark.spark
@pytest.mark.parametrize("range_name", ["full", "odd"])
def test_batch_change_points_match_the_reference(spark, events_df, range_name: str) -> None:
    """The batch engine reads all history for a Lifetime window: from a range start in the middle of the data
    ("odd", unaligned) each key's first row carries its values from every earlier event."""
    start, end = RANGES[range_name]
    rows = collect_change_points(GROUP, events_df, start, end)
    assert rows[WINDOW_END].between(start, end).all()
    check_against_reference(EVENTS, GROUP, rows, start, end, KEYS, seed=6, per_kind=15)
