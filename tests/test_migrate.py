"""A stream's state carried over a definition change (features.kernel.migrate): streamed on one definition, changed
(features added, removed, widened, a new `where`, a new pane length), streamed on: every change point after the
change equals those of a stream that ran the new definition from the start. No Spark."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_batch_reference import GROUP_AGGS, GROUP_COMPOSITE, GROUP_MIXED, GROUP_NEWER, GROUP_SESSIONS, make_events
from test_kernel import TYPES, processor_input

from features import Feature, Hop, Lifetime, agg
from features import kernel as pt
from features.kernel.migrate import Change, carry, layout_of
from features.kernel.panes import lookback_start
from features.spec import FeatureGroup
from features.spec.fingerprint import describe

EVENTS = make_events().sort_values("event_ts", kind="stable", ignore_index=True)
NEVER = np.iinfo(np.int64).min + 1
LAG = 30 * 60 * 10**6  # the watermark: 30 minutes behind the newest event, as a stream's is


def _with(group: FeatureGroup, features: list[Feature]) -> FeatureGroup:
    return replace(group, features=features)


def _stream(group: FeatureGroup, events: pd.DataFrame, state: tuple, batches: int) -> tuple:
    """Step `events` (in time order) through the kernel in `batches`, the watermark LAG behind the newest event."""
    plan = pt.Plan.of(group, TYPES)
    table, after, newest = state
    rows = []
    for part in np.array_split(np.arange(len(events)), batches):
        upto = NEVER if newest is None else newest - LAG
        out = pt.step(plan, table, processor_input(plan, group, events.iloc[part]), after, upto)
        table = pt.from_bytes(plan, pt.to_bytes(out.table))
        after = None if newest is None else upto
        rows.append(out.rows)
        newest = max(newest or NEVER, int(pd.Timestamp(events["event_ts"].iloc[part].max()).value // 1000))
    return (table, after, newest), rows


def _finish(group: FeatureGroup, state: tuple) -> pd.DataFrame:
    plan = pt.Plan.of(group, TYPES)
    table, after, newest = state
    return pt.step(plan, table, processor_input(plan, group, EVENTS.iloc[:0]), after, newest + 10**15).rows


def _changed(before: FeatureGroup, after: FeatureGroup) -> tuple[pd.DataFrame, int]:
    """Stream half the events on `before`, carry the state over to `after`, stream the rest: the rows emitted
    after the change, and the watermark the change happened at."""
    half = len(EVENTS) // 2
    state, _ = _stream(before, EVENTS.iloc[:half], (pt.empty_table(pt.Plan.of(before, TYPES)), None, None), 5)
    table, emitted_upto, newest = state
    change = Change(layout_of(describe(before)), layout_of(describe(after)))
    plan = pt.Plan.of(after, TYPES)
    built_features = change.features(change.built)
    since = lookback_start([f.window for f in after.features if f.name in built_features], emitted_upto)
    read = EVENTS.iloc[:half]
    if since is not None:
        read = read[[t.value // 1000 >= since for t in read["event_ts"]]]
    built = pt.phase1(plan, processor_input(plan, after, read))
    if not all(c.bounded for c in plan.calcs):  # as the built panes are stored: Lifetime panes folded
        built = pt.prune(plan, built, emitted_upto)
    state = (carry(plan, change, table, built), emitted_upto, newest)
    state, rows = _stream(after, EVENTS.iloc[half:], state, 4)
    return _concat([*rows, _finish(after, state)]), emitted_upto


def _scratch(group: FeatureGroup) -> pd.DataFrame:
    state, rows = _stream(group, EVENTS, (pt.empty_table(pt.Plan.of(group, TYPES)), None, None), 9)
    return _concat([*rows, _finish(group, state)])


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat([f for f in frames if len(f)], ignore_index=True)


def _same_rows(group: FeatureGroup, mine: pd.DataFrame, want: pd.DataFrame) -> None:
    order = [*group.join_keys, "window_end"]
    mine = mine.sort_values(order, ignore_index=True)
    want = want.sort_values(order, ignore_index=True)
    assert len(mine) == len(want) > 0
    for column in [*order, *(f.name for f in group.features)]:
        for a, b in zip(mine[column], want[column], strict=True):
            if isinstance(a, float | np.floating) or isinstance(b, float | np.floating):
                assert a == pytest.approx(b, rel=1e-9, nan_ok=True), column
            else:
                assert repr(a) == repr(b), (column, a, b)


AGGS = GROUP_AGGS.features
MIXED = {f.name: f for f in GROUP_MIXED.features}
REQUEST_TIME_AFTER = {
    *("status_hist", "merchant_hist"),  # what the state held before
    *("last_seen", "last_failed_seen", "merchant_set", "status_set", "qty_set_life"),
}
FAILED_2H = Feature("failed_2h", agg.count(), window=Hop("2h", every="20m"), where="status = 'FAILED'")
CHANGES = {
    # Three removed, four added (one with a `where` no feature had).
    "added_and_removed": (_with(GROUP_AGGS, AGGS[:10]), _with(GROUP_AGGS, AGGS[3:14])),
    # A window widened (same name), a Lifetime feature added, one removed.
    "widened_and_lifetime": (
        _with(GROUP_MIXED, [MIXED["n_1h"], FAILED_2H, MIXED["amount_max_1h"], MIXED["n_life"]]),
        _with(
            GROUP_MIXED,
            [
                MIXED["n_1h"],
                Feature("failed_2h", agg.count(), window=Hop("3h", every="20m"), where="status = 'FAILED'"),
                MIXED["n_life"],
                Feature("amount_life", agg.sum("amount"), window=Lifetime(every="1h")),
            ],
        ),
    ),
    # Session features added to a group that had none.
    "sessions_added": (
        _with(GROUP_SESSIONS, [f for f in GROUP_SESSIONS.features if f.window.gap_s is None][:4]),
        GROUP_SESSIONS,
    ),
    # A shorter `every`: a new pane length, so every feature is built again.
    "new_pane_length": (
        _with(GROUP_AGGS, AGGS[:4]),
        _with(GROUP_AGGS, [*AGGS[:4], Feature("n_1h", agg.count(), window=Hop("1h", every="5m"))]),
    ),
    "composite_keys_renamed": (
        GROUP_COMPOSITE,
        _with(GROUP_COMPOSITE, [replace(f, name=f"{f.name}_v2") for f in GROUP_COMPOSITE.features]),
    ),
    # The aggregations request-time features read, added to a state that had none (a Lifetime and hops, with
    # and without a `where`): the state of the group before loads and goes on, their columns are built.
    "request_time_added": (
        _with(GROUP_NEWER, [f for f in GROUP_NEWER.features if f.name in ("status_hist", "merchant_hist")]),
        _with(GROUP_NEWER, [f for f in GROUP_NEWER.features if f.name in REQUEST_TIME_AFTER]),
    ),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_a_changed_definition_continues_as_if_it_had_run_from_the_start(name: str) -> None:
    before, after = CHANGES[name]
    rows, at = _changed(before, after)
    want = _scratch(after)
    _same_rows(after, rows, want[want["window_end"] > at])


def test_what_a_change_keeps_builds_and_drops() -> None:
    before, after = CHANGES["widened_and_lifetime"]
    change = Change(layout_of(describe(before)), layout_of(describe(after)))
    assert change.features(change.built) == ["failed_2h", "amount_life"]
    assert change.features(list(change.kept)) == ["n_1h", "n_life"]
    assert change.features(change.dropped) == ["failed_2h", "amount_max_1h"]
    renamed = Change(*(layout_of(describe(g)) for g in CHANGES["composite_keys_renamed"]))
    assert renamed.built == []
    assert all(new.split(".")[0] == f"{old.split('.')[0]}_v2" for new, old in renamed.kept.items() if "." in new)
    repaned = Change(*(layout_of(describe(g)) for g in CHANGES["new_pane_length"]))
    assert repaned.kept == {}


@pytest.mark.parametrize(
    "group", [GROUP_AGGS, GROUP_MIXED, GROUP_SESSIONS, GROUP_COMPOSITE, GROUP_NEWER], ids=lambda g: g.name
)
def test_a_layout_names_every_column_of_the_pane_table(group: FeatureGroup) -> None:
    plan = pt.Plan.of(group, TYPES)
    layout = layout_of(describe(group))
    assert [c for c, _ in layout.columns] == pt.pane_columns(plan)[len(plan.keys) + 1 :]
    assert layout.pane_us == plan.pane_us


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("keys", r"keys its state by user_id, and the group is now keyed by card_id.*every key is new"),
        ("timestamp", r"another timestamp column: every event's time changed"),
        ("pending", r"still applying the previous definition change"),
    ],
)
def test_a_change_the_state_cannot_be_carried_over_says_why_and_how_to_start_over(change: str, message: str) -> None:
    from types import SimpleNamespace

    from features import Entity, EventSource
    from features.errors import ConfigError
    from features.pipelines.stream.upgrade import check_carriable

    group = GROUP_AGGS
    saved = {"definition": describe(group), "upgrade": {"before": {}} if change == "pending" else None}
    if change == "keys":
        group = replace(group, entity=Entity("card", join_keys=["card_id"]))
    elif change == "timestamp":
        group = replace(group, source=EventSource("transactions", path="data/transactions", timestamp="created_at"))
    repo = SimpleNamespace(root="repo")
    with pytest.raises(ConfigError, match=f"{message}.*--group {group.name} --reset"):
        check_carriable(repo, group, Path("checkpoints/aggs"), saved)
