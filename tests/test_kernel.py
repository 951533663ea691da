"""The kernel (features.kernel) as the stream runs it, against the brute-force reference,
without Spark: events delivered in shuffled micro-batches behind a moving watermark, the emitted change
points looked up as-of, at every change point and between them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import reference_frame, to_micros, where_mask
from test_batch_reference import (
    BASE,
    GROUP_AGGS,
    GROUP_COMPOSITE,
    GROUP_EDGE,
    GROUP_MIXED,
    GROUP_NEWER,
    GROUP_SESSIONS,
    SMALL_KEYS,
    US,
    H,
    M,
    as_of,
    compare_value,
    found_flags,
    make_events,
    small_events,
)

from features import Feature, Hop, Session, Tumble, agg
from features import kernel as pt
from features.kernel import partials
from features.spec import AggKind, DType, FeatureGroup

EVENTS = make_events()
TYPES = {
    "user_id": DType.STRING,
    "card_id": DType.STRING,
    "merchant_id": DType.INT64,
    "amount": DType.FLOAT64,
    "qty": DType.INT64,
    "status": DType.STRING,
    "ok": DType.BOOL,
}


def processor_input(plan: pt.Plan, group: FeatureGroup, events: pd.DataFrame) -> pd.DataFrame:
    """What Spark hands the processor: keys, `_ts` µs, one truth column per `where`, cast value columns."""
    frame = events[list(group.join_keys)].copy()
    frame[pt.TS] = [to_micros(t) for t in events["event_ts"]]
    for i, cond in enumerate(plan.conditions):
        if cond is not None:
            frame[f"fx_c{i}"] = where_mask(events, cond)
    for calc in plan.calcs:
        if calc.value is None:
            continue
        column = group.feature(calc.name).aggregation.column
        values = events[column]
        if calc.value_type is DType.FLOAT64:
            values = values.astype("float64")
        elif calc.value_type is DType.STRING and TYPES[column] is DType.BOOL:
            values = values.map(lambda v: None if v is None else str(v).lower())
        frame[calc.value] = values.to_numpy(dtype=object) if calc.value_type is not DType.FLOAT64 else values
    return frame


def run_stream(
    group: FeatureGroup, events: pd.DataFrame, batches: int, lateness: pd.Timedelta, seed: int, coded: bool = False
):
    """Deliver events in batches ordered by time but shuffled within `lateness`; return all emitted rows,
    the late events and the final watermark. `coded`: keys as the stream's key dictionary codes, as the
    stream's processor hands them to `step` (the rows are decoded back)."""
    plan = pt.Plan.of(group, TYPES)
    keys = pt.KeyDictionary(group.join_keys)
    if coded:
        plan = replace(plan, keys=(pt.KEY,))
    rng = np.random.default_rng(seed)
    jitter = rng.integers(0, int(lateness / pd.Timedelta(microseconds=1)), len(events))
    arrival = np.array([to_micros(t) for t in events["event_ts"]]) + jitter
    order = np.argsort(arrival, kind="stable")
    table, after, emitted, late = pt.empty_table(plan), None, [], []
    max_seen = None

    def encoded(batch: pd.DataFrame) -> pd.DataFrame:
        if not coded:
            return batch
        codes, _ = keys.encode(batch)
        return batch.drop(columns=list(group.join_keys)).assign(**{pt.KEY: codes})

    for part in np.array_split(order, batches):
        batch = processor_input(pt.Plan.of(group, TYPES), group, events.iloc[part])
        watermark = None if max_seen is None else max_seen - int(lateness / pd.Timedelta(microseconds=1))
        upto = watermark if watermark is not None else np.iinfo(np.int64).min + 1
        out = pt.step(plan, table, encoded(batch), after, upto)
        # through the state store's bytes, as the stream keeps its tables between batches
        table, after = pt.from_bytes(plan, pt.to_bytes(out.table)), upto if watermark is not None else None
        emitted.append(out.rows)
        late.append(out.late)
        seen = int(batch[pt.TS].max())
        max_seen = seen if max_seen is None else max(max_seen, seen)
    final = max_seen + 10**15  # everything expires
    out = pt.step(plan, table, encoded(processor_input(plan, group, events.iloc[:0])), after, final)
    emitted.append(out.rows)
    rows = pd.concat(emitted, ignore_index=True)
    if coded:
        decoded = keys.decode(rows[pt.KEY].to_numpy())
        rows = rows.drop(columns=[pt.KEY]).assign(**{k: v.to_pandas() for k, v in decoded.items()})
    return rows, pd.concat(late), out.next_change


def check_against_reference(group: FeatureGroup, rows: pd.DataFrame, events: pd.DataFrame) -> None:
    keys = list(group.join_keys)
    assert not rows.duplicated([*keys, "window_end"]).any()
    rows = rows.sort_values([*keys, "window_end"], ignore_index=True)
    times = sorted({int(e) for e in rows["window_end"]})
    rng = np.random.default_rng(3)
    probe = sorted(set(rng.choice(times, min(20, len(times)), replace=False).tolist()))
    lookups, by_key = [], {}
    groups = list(rows.groupby(keys))
    for i in sorted(rng.choice(len(groups), min(80, len(groups)), replace=False)):  # the reference is slow
        key, part = groups[i]
        key = key if isinstance(key, tuple) else (key,)
        by_key[key] = part
        for t in probe:
            for delta in (0, -1):
                lookups.append((key, pd.Timestamp(t + delta, unit="us", tz="UTC")))
    want = reference_frame(events, group, lookups)
    for (key, t), (_, expect) in zip(lookups, want.iterrows(), strict=True):
        mine = by_key[key]
        at = int(np.searchsorted(mine["window_end"].to_numpy(), to_micros(t), side="right"))
        got = None if at == 0 else mine.iloc[at - 1]
        for feat in group.features:
            value = None if got is None else got[feat.name]
            problem = compare_value(feat, got is not None, None if value is pd.NA else value, expect[feat.name])
            assert problem is None, f"{feat.name} {key} {t}: {problem}"


def check_rows_sample(
    group: FeatureGroup, rows: pd.DataFrame, events: pd.DataFrame, n: int = 30, at: int | None = None
) -> None:
    """A sample of `rows` (keys, `window_end` µs, features) against the reference: each row's values are the
    values at its window end (or at `at`). Comparisons of two engines call it too: both can be wrong alike."""
    assert len(rows) > 0
    sample = rows.iloc[np.random.default_rng(0).choice(len(rows), min(n, len(rows)), replace=False)]
    keys = list(zip(*(sample[k] for k in group.join_keys), strict=True))
    ends = [int(e) if at is None else at for e in sample["window_end"]]
    times = [pd.Timestamp(e, unit="us", tz="UTC") for e in ends]
    want = reference_frame(events, group, list(zip(keys, times, strict=True)))
    for feat in group.features:
        for key, end, got, exact in zip(keys, ends, sample[feat.name], want[feat.name], strict=True):
            problem = compare_value(feat, True, None if got is pd.NA else got, exact)
            assert problem is None, f"{feat.name} {key} at {end}: {problem}"


@pytest.mark.parametrize(
    "group", [GROUP_AGGS, GROUP_MIXED, GROUP_COMPOSITE, GROUP_NEWER, GROUP_SESSIONS], ids=lambda g: g.name
)
def test_stream_steps_match_the_reference(group: FeatureGroup) -> None:
    rows, late, _ = run_stream(group, EVENTS, batches=7, lateness=H, seed=1)
    assert late.empty  # every event arrived within the watermark
    check_against_reference(group, rows, EVENTS)


@pytest.mark.parametrize("group", [GROUP_AGGS, GROUP_NEWER], ids=lambda g: g.name)
def test_pairs_sorted_by_index_give_the_reference_values(group: FeatureGroup, monkeypatch) -> None:
    """Where pairs would not fit one integer (a distinct count's (key, value) and rank, a change point's key and
    window end), they are sorted by index instead: the same values (the packed sort is what the tests above take)."""
    monkeypatch.setattr(partials, "PACKED_BOUND", 0)
    rows, late, _ = run_stream(group, EVENTS, batches=7, lateness=H, seed=1)
    assert late.empty
    check_against_reference(group, rows, EVENTS)


@pytest.mark.parametrize(
    "group", [GROUP_AGGS, GROUP_MIXED, GROUP_COMPOSITE, GROUP_NEWER, GROUP_SESSIONS], ids=lambda g: g.name
)
def test_stream_steps_on_key_codes_in_small_batches_match_the_reference(group: FeatureGroup) -> None:
    """As the stream's processor steps: key codes, and batches small beside the panes held, which `step` puts
    in place in the sorted table instead of sorting the two together."""
    rows, late, _ = run_stream(group, EVENTS, batches=60, lateness=H, seed=2, coded=True)
    assert late.empty
    check_against_reference(group, rows, EVENTS)


@pytest.mark.parametrize(
    "group", [GROUP_AGGS, GROUP_MIXED, GROUP_COMPOSITE, GROUP_NEWER, GROUP_SESSIONS], ids=lambda g: g.name
)
def test_a_small_table_put_in_place_in_a_sorted_one_is_the_same_as_both_sorted_together(
    group: FeatureGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Panes of a batch, some of a (key, pane) the table holds and some new, inserted into the table: exactly
    the table the sort of both gives, row for row."""
    plan = replace(pt.Plan.of(group, TYPES), keys=(pt.KEY,))
    keys = pt.KeyDictionary(group.join_keys)
    events = processor_input(pt.Plan.of(group, TYPES), group, EVENTS.sort_values("event_ts"))
    codes, _ = keys.encode(events)
    coded = events.drop(columns=list(group.join_keys)).assign(**{pt.KEY: codes})
    held = pt.phase1(plan, coded.iloc[: len(coded) * 9 // 10])
    rng = np.random.default_rng(4)
    batch = pt.phase1(plan, coded.iloc[rng.choice(len(coded), len(held) // 10, replace=False)])
    same = pd.MultiIndex.from_frame(batch[[pt.KEY, pt.PANE]]).isin(pd.MultiIndex.from_frame(held[[pt.KEY, pt.PANE]]))
    assert 0 < same.sum() < len(batch)  # both kinds of row
    assert pt.table.inserted(plan, held, batch) is not None  # the table is sorted: it is put in place
    inserted = pt.combine_sorted(plan, [held, batch])
    monkeypatch.setattr(pt.table, "INSERT_RATIO", 10**12)  # always the sort
    sorted_together = pt.combine_sorted(plan, [held, batch])
    pd.testing.assert_frame_equal(inserted.table, sorted_together.table)
    np.testing.assert_array_equal(inserted.position, sorted_together.position)
    np.testing.assert_array_equal(inserted.key_code, sorted_together.key_code)
    assert (inserted.origin, inserted.span) == (sorted_together.origin, sorted_together.span)


def test_integer_range_sums_are_exact_when_the_running_sum_wraps() -> None:
    from features.kernel.partials import ranges_add

    big = np.iinfo(np.int64).max // 2
    values = np.array([big, big, big, -big, -big, 5], dtype=np.int64)  # running sums pass int64's maximum
    starts, ends = np.array([0, 1, 2, 3, 2, 0]), np.array([1, 2, 4, 6, 2, 6])
    assert ranges_add(values, starts, ends).tolist() == [big, big, 0, 5 - 2 * big, 0, big + 5]


def test_a_clamped_range_start_gets_one_row_per_key_with_its_value_there() -> None:
    """The batch engine's `clamp_us`: ends before an (unaligned) range start move to it, one row per key there."""
    plan = pt.Plan.of(GROUP_MIXED, TYPES)
    panes = pt.phase1(plan, processor_input(plan, GROUP_MIXED, EVENTS))
    start = to_micros(EVENTS["event_ts"].min() + 7 * H + pd.Timedelta(seconds=30.5))
    upto = to_micros(EVENTS["event_ts"].max() + 2 * H)
    clamped = pt.emit(plan, panes, None, upto, clamp_us=start)
    after = pt.emit(plan, panes, start, upto)
    assert not clamped.duplicated(["user_id", "window_end"]).any()
    at_start = clamped[clamped["window_end"] == start]
    assert len(at_start) > 0 and at_start["user_id"].is_unique
    later = clamped[clamped["window_end"] > start].reset_index(drop=True)
    pd.testing.assert_frame_equal(later, after.reset_index(drop=True), check_dtype=False)
    check_rows_sample(GROUP_MIXED, later, EVENTS)
    t = pd.Timestamp(start, unit="us", tz="UTC")
    want = reference_frame(EVENTS, GROUP_MIXED, [((k,), t) for k in at_start["user_id"]])
    for name in ("n_1h", "n_life", "failed_24h", "qty_life"):
        assert at_start[name].tolist() == want[name].tolist(), name


def test_eager_values_are_the_values_of_the_events_so_far_ahead_of_the_watermark() -> None:
    plan = pt.Plan.of(GROUP_MIXED, TYPES)
    so_far = EVENTS.sort_values("event_ts").iloc[: len(EVENTS) // 2]
    newest = to_micros(so_far["event_ts"].max())
    eager_at = newest - newest % plan.pane_us
    watermark = newest - to_micros(pd.Timestamp(0, tz="UTC") + 2 * H)
    out = pt.step(
        plan, pt.empty_table(plan), processor_input(plan, GROUP_MIXED, so_far), None, watermark, eager_at=eager_at
    )
    touched = sorted(set(so_far["user_id"]))
    assert sorted(out.eager["user_id"]) == touched and (out.eager["window_end"] == eager_at).all()
    t = pd.Timestamp(eager_at, unit="us", tz="UTC")
    want = reference_frame(so_far, GROUP_MIXED, [((k,), t) for k in out.eager["user_id"]])
    for name in ("n_1h", "n_life", "failed_24h", "qty_life", "amount_max_1h", "merchants_24h"):
        got = [None if pd.isna(v) else v for v in out.eager[name]]
        exact = [None if pd.isna(v) else v for v in want[name]]
        assert got == exact, name
    assert out.rows["window_end"].max() <= watermark  # the change points stay behind the watermark


def test_the_streams_key_codes_give_the_same_step_as_the_keys() -> None:
    """The stream hands `step` its key dictionary's codes instead of the keys (and then tells `values_at` in
    advance which keys the rows and the eager values read): the same rows and eager values."""
    plan = pt.Plan.of(GROUP_MIXED, TYPES)
    so_far = EVENTS.sort_values("event_ts").iloc[: len(EVENTS) // 2]
    newest = to_micros(so_far["event_ts"].max())
    eager_at = newest - newest % plan.pane_us
    watermark = newest - to_micros(pd.Timestamp(0, tz="UTC") + 2 * H)
    events = processor_input(plan, GROUP_MIXED, so_far)
    plain = pt.step(plan, pt.empty_table(plan), events, None, watermark, eager_at=eager_at)
    codes, users = pd.factorize(events["user_id"])
    coded_plan = replace(plan, keys=(pt.KEY,))
    coded_events = events.drop(columns=["user_id"]).assign(**{pt.KEY: codes})
    coded = pt.step(coded_plan, pt.empty_table(coded_plan), coded_events, None, watermark, eager_at=eager_at)
    assert len(plain.rows) and len(plain.eager)
    for got, want in ((coded.rows, plain.rows), (coded.eager, plain.eager)):
        got = got.assign(user_id=users[got[pt.KEY].to_numpy()]).drop(columns=[pt.KEY])[list(want.columns)]
        order = ["user_id", "window_end"]
        pd.testing.assert_frame_equal(
            got.sort_values(order).reset_index(drop=True),
            want.sort_values(order).reset_index(drop=True),
            check_dtype=False,
        )
    check_rows_sample(GROUP_MIXED, plain.rows, so_far)
    check_rows_sample(GROUP_MIXED, plain.eager, so_far)


def test_an_eager_value_follows_a_closed_pane_of_a_key_without_new_events() -> None:
    """A key's events in a pane still open at one batch's eager end count online once a later batch moves event
    time past that pane, though the later batch has no event of the key (and a key whose events leave a window
    gets its lower value then too)."""
    plan = pt.Plan.of(GROUP_MIXED, TYPES)
    names = ("n_1h", "n_life", "failed_24h", "qty_life", "amount_max_1h", "merchants_24h")
    events = EVENTS.sort_values("event_ts")
    first = events.iloc[: len(events) // 2]
    newest = to_micros(first["event_ts"].max())
    eager_1 = newest - newest % plan.pane_us
    watermark = eager_1 - to_micros(pd.Timestamp(0, tz="UTC") + 2 * H)
    out_1 = pt.step(
        plan, pt.empty_table(plan), processor_input(plan, GROUP_MIXED, first), None, watermark, eager_at=eager_1
    )
    later = first.iloc[:1].copy()
    later["user_id"] = "someone_else"
    later["event_ts"] = first["event_ts"].max() + pd.Timedelta(minutes=90)
    newest = to_micros(later["event_ts"].max())
    eager_2 = newest - newest % plan.pane_us
    out_2 = pt.step(
        plan,
        out_1.table,
        processor_input(plan, GROUP_MIXED, later),
        watermark,
        watermark,
        eager_at=eager_2,
        eager_after=eager_1,
    )
    so_far = pd.concat([first, later])
    users = sorted(set(so_far["user_id"]))
    at = {
        e: reference_frame(so_far, GROUP_MIXED, [((k,), pd.Timestamp(e, unit="us", tz="UTC")) for k in users])
        for e in (eager_1, eager_2)
    }

    def values(frame: pd.DataFrame, i: int) -> tuple:
        return tuple(None if pd.isna(frame[n].iloc[i]) else frame[n].iloc[i] for n in names)

    changed = {u for i, u in enumerate(users) if values(at[eager_1], i) != values(at[eager_2], i)}
    assert len(changed) > 1  # more than the one key of the later batch
    assert changed <= set(out_2.eager["user_id"])
    assert (out_2.eager["window_end"] == eager_2).all()
    want = at[eager_2].set_index(pd.Index(users))
    for i, user in enumerate(out_2.eager["user_id"]):
        assert values(out_2.eager, i) == values(want, users.index(user)), user


@pytest.mark.parametrize("group", [GROUP_MIXED, GROUP_COMPOSITE], ids=["one key", "two keys"])
def test_the_batch_kernel_call_copies_each_keys_newest_row_for_the_online_store(group: FeatureGroup) -> None:
    """features.engine.batch.run_bucket: its change points, then one copy of each key's newest row marked LATEST."""
    import pyarrow as pa

    from features.engine.batch import BUCKET, END_US, LATEST, BucketJob, run_bucket

    plan = pt.Plan.of(group, TYPES)
    events = processor_input(plan, group, EVENTS).assign(**{BUCKET: 0})
    lo = int(events[pt.TS].min())
    hi = int(events[pt.TS].max()) + 4 * 3600 * 1_000_000
    types = group.output_types({**TYPES, "event_ts": DType.TIMESTAMP})
    output = {c: types[c] for c in (*group.join_keys, *(f.name for f in group.features))}
    job = BucketJob(plan, lo, hi, output)
    out = run_bucket(pa.Table.from_pandas(events, preserve_index=False), job=job).to_pandas()
    keys = list(group.join_keys)
    rows, copies = out[~out[LATEST]], out[out[LATEST]]
    assert len(copies) == len(rows.drop_duplicates(keys)) > 1
    newest = rows.sort_values(END_US).drop_duplicates(keys, keep="last").sort_values(keys)
    want = newest.reset_index(drop=True).assign(**{LATEST: True})
    pd.testing.assert_frame_equal(copies.sort_values(keys).reset_index(drop=True), want)
    # Each copy is the key's value as of the range end, what the online store serves then.
    check_rows_sample(group, copies.rename(columns={END_US: "window_end"}), EVENTS, at=hi)


def test_an_out_of_order_event_within_the_watermark_merges_two_sessions() -> None:
    """Two sessions 25 minutes apart (gap 20m), each still behind the watermark's emitted rows only in part; an
    event that lands later, between them and within the watermark, joins them as if it had come in order."""
    group = FeatureGroup(
        "merge",
        GROUP_SESSIONS.entity,
        GROUP_SESSIONS.source,
        [
            Feature("n", agg.count(), window=Session("20m", every="5m")),
            Feature("started", agg.session_start(), window=Session("20m", every="5m")),
            Feature("amount_sum", agg.sum("amount"), window=Session("20m", every="5m")),
        ],
    )
    plan = pt.Plan.of(group, TYPES)
    t0 = pd.Timestamp("2026-03-02 10:00", tz="UTC")
    minutes = [0, 4, 29, 33]  # sessions [10:00, 10:04] and [10:29, 10:33]: 25 minutes apart
    first = pd.DataFrame(
        {"user_id": "u", "event_ts": [t0 + m * pd.Timedelta(minutes=1) for m in minutes], "amount": 1.0}
    ).astype({"event_ts": "datetime64[us, UTC]"})
    watermark = to_micros(t0 + pd.Timedelta(minutes=15))  # rows up to 10:15 are final; the first session is open
    out = pt.step(plan, pt.empty_table(plan), processor_input(plan, group, first), None, watermark)
    assert list(out.rows["n"]) == [2]  # at 10:05, the first session's pane; it would close at 10:25
    bridge = first.iloc[:1].assign(
        event_ts=t0 + pd.Timedelta(minutes=17), amount=5.0
    )  # 13m after 10:04, 12m before 10:29
    late = pt.step(plan, out.table, processor_input(plan, group, bridge), watermark, 10**18)
    assert late.late.empty  # after the last closed end: used, not set aside
    everything = pd.concat([first, bridge], ignore_index=True)
    rows = pd.concat([out.rows, late.rows], ignore_index=True)
    check_rows_sample(group, rows, everything, n=len(rows))
    at = {pd.Timestamp(int(e), unit="us", tz="UTC"): n for e, n in zip(rows["window_end"], rows["n"], strict=True)}
    assert at[t0 + pd.Timedelta(minutes=35)] == 5  # one session of all five events
    assert at[t0 + pd.Timedelta(minutes=55)] == 0  # closed 20 minutes after its last event (10:33 -> 10:55)
    started = rows.loc[rows["window_end"] == to_micros(t0 + pd.Timedelta(minutes=35)), "started"].iloc[0]
    assert started == to_micros(t0)


@pytest.mark.parametrize("group", [GROUP_AGGS, GROUP_NEWER, GROUP_SESSIONS], ids=lambda g: g.name)
def test_a_pane_table_has_each_column_once(group: FeatureGroup) -> None:
    columns = pt.pane_columns(pt.Plan.of(group, TYPES))
    assert len(columns) == len(set(columns))
    assert list(pt.empty_table(pt.Plan.of(group, TYPES)).columns) == columns


def test_every_aggregation_has_one_entry_everywhere_and_the_reference_checks_it() -> None:
    """An aggregation is an Operation (spec), a Kind (kernel) and a reference fold: the three registries hold the
    same kinds, and the groups the engines are checked on use every one of them."""
    from features.kernel.kinds import KINDS
    from features.spec.aggregations import OPERATIONS

    assert set(KINDS) == set(OPERATIONS) == set(AggKind)
    checked = {f.aggregation.kind for g in (GROUP_AGGS, GROUP_NEWER, GROUP_SESSIONS) for f in g.features}
    assert checked == set(AggKind), f"no engine test uses {set(AggKind) - checked}"


def test_maps_and_lists_of_windows_without_a_value() -> None:
    """Keys whose rows hold no value for a feature (all null, or filtered out): empty maps and null lists."""
    group = FeatureGroup(
        "no_values",
        GROUP_NEWER.entity,
        GROUP_NEWER.source,
        [
            Feature("hist", agg.histogram("status"), window=Hop("1h", every="5m"), where="amount > 1e9"),
            Feature("top", agg.top_frequent("qty", 2), window=Session("10m", every="5m"), where="amount > 1e9"),
            Feature("best", agg.top_k("amount", 2), window=Hop("1h", every="5m"), where="amount > 1e9"),
            Feature("n", agg.count(), window=Hop("1h", every="5m")),
        ],
    )
    plan = pt.Plan.of(group, TYPES)
    events = EVENTS[EVENTS["user_id"].isin(["u1", "u_null"])]
    rows = pt.emit(plan, pt.phase1_sorted(plan, processor_input(plan, group, events)), None, 10**18)
    assert len(rows) and all(len(m) == 0 for m in rows["hist"]) and all(len(m) == 0 for m in rows["top"])
    assert rows["best"].isna().all()
    check_rows_sample(group, rows, events)


def test_a_stream_keeps_every_open_session_whichever_key_it_belongs_to() -> None:
    """Two keys in session: the first key's session started late, the second's hours earlier. Pruning after
    the first batch must keep the second key's panes since its session started (it is still open)."""
    session = Session("20m", every="5m")
    group = FeatureGroup(
        "open_sessions",
        GROUP_SESSIONS.entity,
        GROUP_SESSIONS.source,
        [
            Feature("n", agg.count(), window=session),
            Feature("since", agg.session_start(), window=session),
            Feature("n_1h", agg.count(), window=Hop("1h", every="5m")),
        ],
    )
    plan = pt.Plan.of(group, TYPES)
    day = pd.Timestamp("2026-03-02", tz="UTC")
    times = {
        "late_start": pd.date_range(day + 10 * H, day + 14 * H, freq="5min", inclusive="left"),
        "early_start": pd.date_range(day + 6 * H, day + 14 * H, freq="5min", inclusive="left"),
    }
    events = pd.concat(
        [pd.DataFrame({"user_id": user, "event_ts": ts, "amount": 1.0}) for user, ts in times.items()],
        ignore_index=True,
    ).astype({"event_ts": "datetime64[us, UTC]"})
    first = events[events["event_ts"] < day + 12 * H]
    out = pt.step(plan, pt.empty_table(plan), processor_input(plan, group, first), None, to_micros(day + 12 * H))
    table = pt.from_bytes(plan, pt.to_bytes(out.table))
    rest = events[events["event_ts"] >= day + 12 * H]
    end = pt.step(plan, table, processor_input(plan, group, rest), to_micros(day + 12 * H), 10**18)
    rows = pd.concat([out.rows, end.rows], ignore_index=True)
    check_rows_sample(group, rows, events, n=len(rows))
    early = rows[(rows["user_id"] == "early_start") & (rows["window_end"] == to_micros(day + 14 * H))]
    assert early["n"].iloc[0] == 96  # one session of 8 hours of events every 5 minutes


@pytest.mark.parametrize("group", [GROUP_AGGS, GROUP_NEWER, GROUP_SESSIONS], ids=lambda g: g.name)
def test_pane_tables_written_as_parquet_rows_come_back_as_they_were(group: FeatureGroup, tmp_path) -> None:
    """A savepoint's rows (features.kernel.state.panes_to_arrow, through a Parquet file) give back the pane table
    and every change point it gives, for every aggregation's partials."""
    import pyarrow.parquet as pq

    from features.kernel.state import panes_from_arrow, panes_to_arrow

    plan = pt.Plan.of(group, TYPES)
    panes = pt.phase1(plan, processor_input(plan, group, EVENTS))
    pq.write_table(panes_to_arrow(panes), tmp_path / "panes.parquet")
    back = panes_from_arrow(pq.read_table(tmp_path / "panes.parquet"))
    assert list(back.columns) == list(panes.columns) and len(back) == len(panes)
    end = int(panes[pt.PANE].max()) + 48 * 3600 * 1_000_000
    want, got = (pt.emit(plan, t, None, end) for t in (panes, back))
    pd.testing.assert_frame_equal(got, want)


def test_a_step_of_a_bucket_whose_panes_were_all_pruned_gives_no_eager_value() -> None:
    """A bucket without events in a batch that moves event time on, its every pane pruned long before (events
    resumed after a gap longer than every window): no key holds a value, and nothing fails on the empty table
    (its list partial columns hold no Arrow type to read)."""
    plan = pt.Plan.of(GROUP_NEWER, TYPES)
    assert any(c.kind is AggKind.TOP_K for c in plan.calcs)
    nothing = processor_input(plan, GROUP_NEWER, EVENTS.iloc[:0])
    end = to_micros(EVENTS["event_ts"].max() + 48 * H)
    end -= end % plan.pane_us
    out = pt.step(
        plan,
        pt.empty_table(plan),
        nothing,
        end - H // pd.Timedelta(microseconds=1),
        end,
        eager_at=end,
        eager_after=end - plan.pane_us,
    )
    assert out.eager is None and len(out.rows) == 0 and len(out.table) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=small_events(), batches=st.integers(1, 5), seed=st.integers(0, 1000))
def test_randomized_small_cases_through_the_streams_steps(events: pd.DataFrame, batches: int, seed: int) -> None:
    """The batch engine's randomized small cases (events on and 1 µs around every pane boundary), delivered to
    the stream's steps in shuffled micro-batches: the value at every boundary, and 1 µs before it, is the
    reference's."""
    rows, late, _ = run_stream(GROUP_EDGE, events, batches=min(batches, len(events)), lateness=5 * M, seed=seed)
    assert late.empty
    ends = pd.to_datetime(rows["window_end"].to_numpy(dtype=np.int64), unit="us", utc=True)
    rows = rows.assign(window_end=ends.astype("datetime64[us, UTC]"))
    times = sorted(
        {t for k in range(-3, 30) for step in (3 * M, 5 * M) for t in (BASE + k * step, BASE + k * step - US)}
    )
    want = reference_frame(events, GROUP_EDGE, [((k,), t) for k in SMALL_KEYS for t in times])
    got = as_of(rows, GROUP_EDGE, want[["user_id", "t"]])
    found = found_flags(got)
    for feat in GROUP_EDGE.features:
        for i in range(len(want)):
            problem = compare_value(feat, found[i], got.loc[i, feat.name], want.loc[i, feat.name])
            assert problem is None, f"{feat.name} {want.loc[i, 'user_id']} t={want.loc[i, 't']}: {problem}"


def test_last_event_time_and_distinct_values_at_window_edges() -> None:
    """By hand: a key with one event 1 µs before a pane's end, one with an event exactly on a window end and a
    repeated value; the batch call and the stream's steps give the same values, the reference's."""
    window = Hop("10m", every="5m")
    group = FeatureGroup(
        "request_time",
        GROUP_NEWER.entity,
        GROUP_NEWER.source,
        [
            Feature("seen", agg.last_event_time(), window=window),
            Feature("merchants", agg.distinct_values("merchant_id"), window=window),
            Feature("statuses", agg.distinct_values("status"), window=Tumble("5m"), where="amount > 1e9"),
        ],
    )
    events = pd.DataFrame(
        {
            "user_id": ["one", "edge", "edge", "edge"],
            "merchant_id": [7, 3, 3, 11],
            "status": ["OK", "OK", None, "B"],
            "amount": [1.0, 2.0, 3.0, 4.0],
            "event_ts": [
                BASE + 5 * M - US,
                BASE + 5 * M,
                BASE + 90 * pd.Timedelta(seconds=1) + 250_000 * US,
                BASE + 2 * M,
            ],
        }
    )
    events["event_ts"] = events["event_ts"].astype("datetime64[us, UTC]")
    # (key, t) -> (seen, merchants); statuses is [] throughout (no row passes its where)
    want = {
        ("one", BASE + 5 * M - US): (None, []),  # the window ending at 5m - 1µs's E (0m) is empty
        ("one", BASE + 5 * M): (BASE + 4 * M + 59 * pd.Timedelta(seconds=1), [7]),  # rounded down to the second
        ("one", BASE + 15 * M - US): (BASE + 4 * M + 59 * pd.Timedelta(seconds=1), [7]),
        ("one", BASE + 15 * M): (None, []),  # it left the window
        ("edge", BASE + 5 * M): (BASE + 2 * M, [3, 11]),  # the event on 5m counts from the next window on
        ("edge", BASE + 10 * M): (BASE + 5 * M, [3, 11]),
        ("edge", BASE + 15 * M): (BASE + 5 * M, [3]),
        ("edge", BASE + 20 * M): (None, []),
    }
    reference = reference_frame(events, group, [((k,), t) for k, t in want])
    plan = pt.Plan.of(group, TYPES)
    batch = pt.emit(plan, pt.phase1_sorted(plan, processor_input(plan, group, events)), None, 10**18)
    streamed, late, _ = run_stream(group, events, batches=3, lateness=H, seed=4)
    assert late.empty
    for rows in (batch, streamed):
        rows = rows.sort_values(["user_id", "window_end"])
        for i, ((key, t), (seen, merchants)) in enumerate(want.items()):
            mine = rows[(rows["user_id"] == key) & (rows["window_end"] <= to_micros(t))]
            got = None if mine.empty else mine.iloc[-1]
            got_seen = None if got is None or got["seen"] is None else pd.Timestamp(got["seen"], unit="us", tz="UTC")
            got_merchants = [] if got is None else list(got["merchants"])
            assert (got_seen, got_merchants) == (seen, merchants), (key, t)
            assert got is None or list(got["statuses"]) == []
            assert (reference.loc[i, "seen"], reference.loc[i, "merchants"]) == (seen, merchants)
