"""The stream's state held in chunks (features.kernel.held) and its window values read from chunk summaries
(features.kernel.summaries), without Spark: the values are those of the panes read whole (the batch engine's
reads) and the reference's, and a steady micro-batch touches the chunks near its window ends only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from test_batch_reference import GROUP_AGGS, GROUP_NEWER, SOURCE, USER, make_events
from test_kernel import H, check_against_reference, run_stream

from features import Feature, FeatureGroup, Hop, Lifetime, agg
from features import kernel as pt
from features.kernel import summaries
from features.kernel.table import values_at
from features.spec import DType

# Every sort of partial a pane keeps, over hops and tumbles and a Lifetime (the BASE chunk).
CHOSEN = {
    *("n", "n_failed", "qty_sum", "amount_sum", "amount_avg", "status_min", "amount_max", "amount_sd"),
    *("status_first", "amount_last", "amounts_last3", "merchants", "merchants_exact", "amount_p90"),
    *("amount_skew", "qty_skew", "amount_first2", "amount_top3", "amount_bottom4", "status_hist"),
    *("merchant_top2", "merchants_max5", "last_seen", "merchant_set", "qty_set_life", "qty_kurt"),
    *("qty_top2", "status_top2", "qty_bottom1"),  # integers and text, with ties
}
GROUP = FeatureGroup(
    "held", USER, SOURCE, [f for f in (*GROUP_AGGS.features, *GROUP_NEWER.features) if f.name in CHOSEN]
)
EVENTS = make_events().query("user_id != 'u3'").reset_index(drop=True)  # u3's thousand merchants: slow to check


def _streamed(monkeypatch: pytest.MonkeyPatch, share: int) -> pd.DataFrame:
    monkeypatch.setattr(summaries, "WHOLE_SHARE", share)
    rows, late, _ = run_stream(GROUP, EVENTS, batches=10, lateness=H, seed=5, coded=True)
    assert late.empty
    return rows.sort_values(["user_id", "window_end"], ignore_index=True)


def test_values_read_from_summaries_are_those_of_the_panes_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same micro-batches with every value read from chunk summaries, and with every value read from the
    panes whole: the same rows, integers, lists and maps exactly, floats to rounding (added in another grouping);
    and the summaries' rows are the reference's."""
    read = _streamed(monkeypatch, 0)  # never whole
    whole = _streamed(monkeypatch, 10**12)  # always whole
    assert len(read) == len(whole) > 500
    for column in read.columns:
        if column in ("amount_sum", "amount_avg", "amount_sd", "amount_skew", "qty_skew", "qty_kurt"):
            np.testing.assert_allclose(read[column].astype(float), whole[column].astype(float), rtol=1e-9)
        else:
            assert [repr(v) for v in read[column]] == [repr(v) for v in whole[column]], column
    check_against_reference(GROUP, read, EVENTS)


MINUTE = 60 * 1_000_000
STEADY = FeatureGroup(
    "steady",
    USER,
    SOURCE,
    [
        Feature("n_1h", agg.count(), window=Hop("1h", every="1m")),
        Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="1m")),
        Feature("amount_top2_1h", agg.top_k("amount", 2), window=Hop("1h", every="1m")),
        Feature("n_life", agg.count(), window=Lifetime(every="1m")),
    ],
)


def test_a_steady_batch_rewrites_and_merges_only_what_its_events_and_window_ends_touch() -> None:
    """Three hours of 1-minute panes of 40 keys in chunks of a minute, then a minute of events at a time: each
    step changes the chunk its events fall in and the BASE chunk (a minute of panes leaves the hour), keeps every
    other chunk as it was, and merges at most one summary per level (the runs the newest complete chunk
    completes), while its values read over a hundred."""
    plan = replace(pt.Plan.of(STEADY, {"user_id": DType.STRING, "amount": DType.FLOAT64}), keys=(pt.KEY,))
    rng = np.random.default_rng(1)
    t0 = 1_800_000_000 * 1_000_000

    def minute(i: int) -> pd.DataFrame:
        n = 200
        return pd.DataFrame(
            {
                pt.KEY: rng.integers(0, 40, n),
                pt.TS: t0 + i * MINUTE + rng.integers(0, MINUTE, n),
                "fx_v_raw_amount": rng.random(n),
            }
        )

    held = pt.Held.of(plan, MINUTE, [])
    pt.advance(held, pd.concat([minute(i) for i in range(180)]), None, t0 + 179 * MINUTE)
    pt.advance(held, minute(180), t0 + 179 * MINUTE, t0 + 180 * MINUTE, MINUTE, t0 + 181 * MINUTE)
    assert len(held.chunks) > 60
    for i in range(181, 191):
        before, kept = dict(held.chunks), dict(held.summaries)
        step = pt.advance(held, minute(i), t0 + (i - 1) * MINUTE, t0 + i * MINUTE, MINUTE, t0 + (i + 1) * MINUTE)
        assert len(step.rows) and step.eager is not None and len(step.eager)
        dropped = set(before) - set(held.chunks)
        assert step.changed - dropped == {t0 + i * MINUTE, pt.BASE}  # the events' chunk; the BASE rows folded
        assert all(held.chunks[c] is s for c, s in before.items() if c not in step.changed)
        merged = [run for run, s in held.summaries.items() if kept.get(run) is not s]
        assert 0 < len(merged) <= 7 and len(held.summaries) > 100


def test_values_at_any_window_end_are_those_of_the_panes_read_whole() -> None:
    """Window ends anywhere, asked together: before the oldest chunk held (a window that holds no pane, as an
    eager value at a stream's start asks), across the chunks, after the newest (a final flush): each value is the
    one read from the panes whole, whatever else the same call asks."""
    plan = replace(pt.Plan.of(STEADY, {"user_id": DType.STRING, "amount": DType.FLOAT64}), keys=(pt.KEY,))
    t0 = 1_800_000_000 * 1_000_000
    rng = np.random.default_rng(7)
    for _ in range(20):
        n, keys = int(rng.integers(1, 300)), int(rng.integers(1, 6))
        events = pd.DataFrame(
            {
                pt.KEY: rng.integers(0, keys, n),
                pt.TS: t0 + 100 * MINUTE + rng.integers(0, int(rng.integers(1, 200)) * MINUTE, n),
                "fx_v_raw_amount": rng.random(n),
            }
        )
        held = pt.Held.of(plan, int(rng.choice([1, 3, 7])) * MINUTE, [])
        pt.advance(held, events, None, t0 + 100 * MINUTE)
        asked = int(rng.integers(1, 30))
        key = np.sort(rng.integers(0, keys, asked))
        ends = t0 + rng.integers(0, 500, asked) * MINUTE // 2
        order = np.lexsort((ends, key))
        key, ends = key[order], ends[order]
        got = summaries.window_values(held, key, ends)
        want = values_at(plan, held.whole(), key, ends)
        for name, values in want.items():
            assert [repr(v) for v in got[name]] == [repr(v) for v in values], name
