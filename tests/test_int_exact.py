"""Integers stay integers: int64 values are exact end to end, beyond 2^53 too and with nulls anywhere, and a value
is the same value whatever batch or file it arrived in.

Merchant ids 2^60 + 0..39 (doubles hold none of them but 2^60 itself) in a nullable int64 column, with nulls in
some batches (files, micro-batches, kernel calls) and not in others: first the kernel as each engine calls it (no
Spark), then a backfill and a stream over Parquet files written from pandas' `Int64`, against the reference
(tests/reference.py) and against each other. Feature rows are read back through Arrow as Python values: pandas'
own conversion of a nullable bigint column to float64 would round them in the test itself."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from reference import percentile_ok, reference_frame, to_micros

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, Tumble, agg
from features import kernel as pt
from features.demo import write_events
from features.engine.batch import BUCKET, END_US, LATEST, BucketJob, run_bucket
from features.spec import WINDOW_END, AggKind, DType

BIG = 2**60  # merchant ids BIG + 0..39: as float64, every one of them is BIG
MERCHANTS = 40
BASE = pd.Timestamp("2026-03-02 02:00", tz="UTC")
H = pd.Timedelta(hours=1)
FILES = 6  # nulls in the even-numbered files only

SOURCE = EventSource("transactions", path="data/transactions", timestamp="event_ts", watermark="30m")
HOP = Hop("1h", every="10m")
BY_USER = FeatureGroup(
    "merchants_by_user",
    Entity("user", join_keys=["user_id"]),
    SOURCE,
    [
        Feature("m_max", agg.max("merchant_id"), window=HOP),
        Feature("m_min", agg.min("merchant_id"), window=HOP),
        Feature("m_sum", agg.sum("merchant_id"), window=Tumble("10m")),  # at most 3 ids: the sum fits in int64
        Feature("m_first", agg.first("merchant_id"), window=HOP),
        Feature("m_last", agg.last("merchant_id"), window=Lifetime(every="10m")),
        Feature("m_last3", agg.last_k("merchant_id", 3), window=HOP),
        Feature("m_distinct", agg.count_distinct("merchant_id"), window=HOP),
        Feature("m_approx", agg.approx_count_distinct("merchant_id"), window=HOP),
        Feature("m_distinct_life", agg.count_distinct("merchant_id"), window=Lifetime(every="1h")),
        Feature("m_approx_life", agg.approx_count_distinct("merchant_id"), window=Lifetime(every="1h")),
        Feature("m_avg", agg.avg("merchant_id"), window=Tumble("30m")),
        Feature("m_p50", agg.approx_percentile("merchant_id", 0.5), window=HOP),
    ],
)
BY_ACCOUNT = FeatureGroup(  # an int64 key above 2^53
    "merchants_by_account",
    Entity("account", join_keys=["account_id"]),
    SOURCE,
    [
        Feature("n", agg.count(), window=HOP),
        Feature("m_max", agg.max("merchant_id"), window=HOP),
        Feature("m_distinct_life", agg.count_distinct("merchant_id"), window=Lifetime(every="1h")),
    ],
)
GROUPS = [BY_USER, BY_ACCOUNT]
TYPES = {
    "user_id": DType.STRING,
    "account_id": DType.INT64,
    "merchant_id": DType.INT64,
    "event_ts": DType.TIMESTAMP,
}


def make_events(users: int = 4, hours: int = 6, seed: int = 11) -> pd.DataFrame:
    """One event per user every 4 minutes, in time order; each user meets every merchant id. Nulls (30%) only in
    the rows that `write_events` puts in even-numbered files."""
    rng = np.random.default_rng(seed)
    per_user = hours * 15
    user = np.repeat(np.arange(users), per_user)
    j = np.tile(np.arange(per_user), users)
    offset_s = j * 240 + user * 37 + rng.integers(0, 30, len(j))
    events = pd.DataFrame(
        {
            "user_id": [f"u{u}" for u in user],
            "merchant_id": BIG + (j * 7 + user) % MERCHANTS,
            "event_ts": (BASE + pd.to_timedelta(offset_s, unit="s")).as_unit("us"),
        }
    )
    events = events.sort_values("event_ts", kind="stable", ignore_index=True)
    events["account_id"] = BIG + np.arange(len(events)) % 5
    merchant = pd.array(events["merchant_id"].to_numpy(), dtype="Int64")
    bounds = file_bounds(len(events))
    for f in range(0, FILES, 2):
        rows = np.arange(bounds[f], bounds[f + 1])
        merchant[rows[rng.random(len(rows)) < 0.3]] = pd.NA
    events["merchant_id"] = merchant
    return events[["user_id", "account_id", "merchant_id", "event_ts"]]


def file_bounds(n: int) -> list[int]:
    """Where `write_events` cuts n rows into FILES files."""
    return [i * n // FILES for i in range(FILES + 1)]


EVENTS = make_events()


# ---------------------------------------------------------------------------------------------------------
# What the engines hand the kernel, and checks against the reference


def kernel_input(plan: pt.Plan, group: FeatureGroup, events: pd.DataFrame) -> pa.Table:
    """The Arrow table a kernel call gets from Spark (features.engine.inputs): keys, `fx_ts` µs, value columns
    (bigint as they are, double where the kind casts)."""
    columns: dict[str, pa.Array] = {k: pa.array(events[k]) for k in group.join_keys}
    columns[pt.TS] = pa.array([to_micros(t) for t in events["event_ts"]], pa.int64())
    for calc in plan.calcs:
        if calc.value is None or calc.value in columns:
            continue
        source = events[group.feature(calc.name).aggregation.column]
        if calc.value_type is DType.FLOAT64:  # Spark's cast of each value (rounded to the nearest double)
            columns[calc.value] = pa.array(source.to_numpy(dtype=np.float64, na_value=np.nan), from_pandas=True)
        else:
            columns[calc.value] = pa.array(source, pa.int64())
    return pa.table(columns)


def python_rows(table: pa.Table | pd.DataFrame, group: FeatureGroup) -> list[dict[str, Any]]:
    """Feature rows as Python values (ints exact, lists as lists), `window_end` in µs, sorted by key and end."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    rows = table.to_pylist()
    for row in rows:
        end = row[WINDOW_END]
        row[WINDOW_END] = end if isinstance(end, int) else to_micros(pd.Timestamp(end))
    return sorted(rows, key=lambda r: (*(r[k] for k in group.join_keys), r[WINDOW_END]))


def bucket_rows(group: FeatureGroup, events: pd.DataFrame, lo: int, hi: int) -> list[dict[str, Any]]:
    """The batch engine's kernel call (`run_bucket`) over all of `events`."""
    plan = pt.Plan.of(group, TYPES)
    table = kernel_input(plan, group, events)
    table = table.append_column(BUCKET, pa.array(np.zeros(len(table), np.int64)))
    outputs = group.output_types(TYPES)
    job = BucketJob(plan, lo, hi, {c: outputs[c] for c in (*group.join_keys, *(f.name for f in group.features))})
    out = run_bucket(table, job=job)
    out = (
        out.filter(pa.compute.invert(out[LATEST]))
        .drop_columns([LATEST])
        .rename_columns([WINDOW_END if c == END_US else c for c in out.column_names if c != LATEST])
    )
    return python_rows(out, group)


def same(feature: Feature, got: Any, want: Any) -> bool:
    if isinstance(got, float) and math.isnan(got):
        got = None
    if want is None or got is None:
        return want is None and got is None
    kind = feature.aggregation.kind
    if kind is AggKind.APPROX_PERCENTILE:
        return percentile_ok(got, want)
    if kind is AggKind.AVG:  # a float of exact integers: within float rounding
        return math.isclose(got, want, rel_tol=1e-12)
    if isinstance(got, np.ndarray | list | tuple):
        got = list(got)
    return type(got) is type(want) and got == want  # an int is an int, not a float that equals one


def assert_reference(group: FeatureGroup, rows: list[dict[str, Any]], events: pd.DataFrame) -> None:
    """Each row is its key's value at its window end; one microsecond before, the value is the key's previous
    row's (or the empty window's): the rows are the change points, exact."""
    keys = list(group.join_keys)
    lookups, expected = [], []
    previous: dict[tuple, dict[str, Any] | None] = {}
    for row in rows:
        key = tuple(row[k] for k in keys)
        end = row[WINDOW_END]
        before = previous.get(key)
        lookups += [(key, pd.Timestamp(end, unit="us", tz="UTC")), (key, pd.Timestamp(end - 1, unit="us", tz="UTC"))]
        expected += [row, before]
        previous[key] = row
    want = reference_frame(events, group, lookups)
    problems = []
    for i, ((key, t), got) in enumerate(zip(lookups, expected, strict=True)):
        for feat in group.features:
            exact = want[feat.name].iloc[i]
            exact = exact.item() if isinstance(exact, np.generic) else exact
            value = (0 if feat.aggregation.kind.empty_is_zero else None) if got is None else got[feat.name]
            if not same(feat, value, exact):
                problems.append(f"{feat.name} {key} {t}: got {value!r}, want {exact!r}")
    assert not problems, f"{len(problems)} of {len(lookups) * len(group.features)} values wrong:\n" + "\n".join(
        problems[:12]
    )


# ---------------------------------------------------------------------------------------------------------
# The kernel as the engines call it (no Spark)


def test_the_reference_sums_python_ints_with_nulls_exactly() -> None:
    """The reference over merchant ids as Python ints and None (an object column, not an integer dtype): sums
    stay ints, as over the nullable `Int64` column."""
    ids = [None if pd.isna(v) else int(v) for v in EVENTS["merchant_id"]]
    as_objects = EVENTS.assign(merchant_id=pd.Series(ids, dtype=object))
    assert as_objects["merchant_id"].dtype == object
    lookups = [((f"u{u}",), BASE + k * H) for u in range(4) for k in range(1, 7)]
    nullable = reference_frame(EVENTS, BY_USER, lookups)
    objects = reference_frame(as_objects, BY_USER, lookups)
    assert objects["m_sum"].dtype == np.int64 and objects["m_sum"].tolist() == nullable["m_sum"].tolist()
    assert nullable["m_sum"].map(lambda s: s % 2**60 != 0).any()  # not all of them multiples of 2^60


def test_events_frame_keeps_integers_with_nulls_as_integers() -> None:
    table = pa.table(
        {
            "key": pa.array([BIG + 1, BIG + 2, BIG + 3], pa.int64()),
            "nullable": pa.array([BIG + 1, None, BIG + 3], pa.int64()),
            "small": pa.array([7, None, -7], pa.int32()),
            "amount": pa.array([1.5, None, 2.5]),
            "status": pa.array(["a", None, "b"]),
        }
    )
    frame = pt.events_frame(table)
    assert list(frame.columns) == table.column_names
    assert frame["key"].dtype == np.int64 and frame["key"].tolist() == [BIG + 1, BIG + 2, BIG + 3]  # as to_pandas
    assert frame["nullable"].dtype == "Int64" and frame["nullable"].tolist() == [BIG + 1, pd.NA, BIG + 3]
    assert frame["small"].dtype == "Int64" and frame["small"].tolist() == [7, pd.NA, -7]
    plain = table.to_pandas()
    for name in ("amount", "status"):
        pd.testing.assert_series_equal(frame[name], plain[name])


def test_a_batch_kernel_call_is_exact_with_nulls_in_its_events() -> None:
    """Before: the bucket's merchant ids became float64 (a null among them): max = min = BIG, 1 distinct."""
    events = EVENTS
    lo, hi = to_micros(BASE - H), to_micros(BASE + 8 * H)
    for group in GROUPS:
        rows = bucket_rows(group, events, lo, hi)
        assert rows
        assert_reference(group, rows, events)
    life = [r["m_distinct_life"] for r in bucket_rows(BY_USER, events, lo, hi)]
    assert max(life) == MERCHANTS


def stream_steps(group: FeatureGroup, batches: list[pd.DataFrame], watermark: pd.Timedelta) -> list[dict[str, Any]]:
    """The stream's processor, without Spark: each batch converted as it converts one (`events_frame`), its keys
    coded by a KeyDictionary, one `step` each, the pane table and the dictionary stored as bytes in between."""
    plan = pt.Plan.of(group, TYPES)
    coded_plan = replace(plan, keys=(pt.KEY,))
    stored, dictionary = pt.to_bytes(pt.empty_table(coded_plan)), None
    after, newest, out = None, None, []
    for batch in [*batches, None]:
        keys = pt.KeyDictionary(plan.keys, None if dictionary is None else pt.read_frame(dictionary))
        if batch is None:  # the end of the stream: every window closes
            coded, upto = pd.DataFrame({pt.KEY: np.zeros(0, np.int64), pt.TS: np.zeros(0, np.int64)}), 2**62
        else:
            events = pt.events_frame(kernel_input(plan, group, batch))
            codes, _ = keys.encode(events)
            coded = events.drop(columns=list(plan.keys)).assign(**{pt.KEY: codes})
            newest = max(newest or 0, int(coded[pt.TS].max()))
            upto = max(after or 0, newest - int(watermark / pd.Timedelta(microseconds=1)))
        step = pt.step(coded_plan, pt.from_bytes(coded_plan, stored), coded, after, upto)
        assert step.late.empty
        decoded = keys.decode(step.rows[pt.KEY].to_numpy())
        rows = pa.table({**decoded, **{c: pt_column(step.rows[c]) for c in step.rows.columns if c != pt.KEY}})
        out += python_rows(rows, group)
        stored, dictionary, after = pt.to_bytes(step.table), pt.to_bytes(keys.frame), upto
    return sorted(out, key=lambda r: (*(r[k] for k in group.join_keys), r[WINDOW_END]))


def pt_column(column: pd.Series) -> pa.Array:
    if isinstance(column.dtype, pd.ArrowDtype):
        return pa.array(column)
    return pa.array(column.to_numpy(), from_pandas=True)


def test_stream_steps_are_exact_and_equal_the_batch_kernel_call() -> None:
    """Micro-batches with and without nulls, state stored as bytes in between: the same rows as one kernel call.
    Before: the Lifetime approx_count_distinct counted 41 (BIG as a float hash, besides the 40 integer ones)."""
    bounds = file_bounds(len(EVENTS))
    batches = [EVENTS.iloc[bounds[i] : bounds[i + 1]] for i in range(FILES)]
    assert all(b["merchant_id"].isna().any() == (i % 2 == 0) for i, b in enumerate(batches))
    for group in GROUPS:
        streamed = stream_steps(group, batches, pd.Timedelta(minutes=30))
        assert_reference(group, streamed, EVENTS)
        batch = bucket_rows(group, EVENTS, to_micros(BASE - H), max(r[WINDOW_END] for r in streamed))
        assert streamed == batch
    life = [r["m_approx_life"] for r in stream_steps(BY_USER, batches, pd.Timedelta(minutes=30))]
    assert max(life) == MERCHANTS


def test_the_kernel_refuses_int64_values_held_as_floats() -> None:
    """A float column for an int64 input rounded its values already: the kernel says so rather than sum or hash
    them."""
    plan = pt.Plan.of(BY_USER, TYPES)
    events = pt.events_frame(kernel_input(plan, BY_USER, EVENTS.iloc[:20]))
    floated = events.assign(fx_v_raw_merchant_id=events["fx_v_raw_merchant_id"].astype("float64"))
    with pytest.raises(TypeError, match=r"fx_v_raw_merchant_id.*2\^53"):
        pt.phase1(plan, floated)


def test_integer_keys_and_partials_survive_the_state_bytes() -> None:
    """An int64 key above 2^53 through the stream's key dictionary, and int64 partials at both ends of the range,
    through `to_bytes` / `from_bytes` (which store integers as offsets in narrower types)."""
    keys = pt.KeyDictionary(["account_id"])
    frame = pd.DataFrame({"account_id": np.array([BIG + 3, BIG, BIG + 3, 2**63 - 1, -(2**63)], dtype=np.int64)})
    codes, fresh = keys.encode(frame)
    again = pt.KeyDictionary(["account_id"], pt.read_frame(pt.to_bytes(fresh)))
    assert again.decode(codes)["account_id"].to_pylist() == frame["account_id"].tolist()
    extremes = np.array([2**63 - 1, -(2**63), BIG + 1, BIG, 0], dtype=np.int64)
    read = pt.read_frame(pt.to_bytes(pd.DataFrame({"v": extremes, "near": BIG + np.arange(5, dtype=np.int64)})))
    assert read["v"].tolist() == extremes.tolist() and read["near"].tolist() == [BIG + i for i in range(5)]


# ---------------------------------------------------------------------------------------------------------
# A backfill and a stream over Parquet files (Spark)


def exact_rows(spark, path: str, group: FeatureGroup) -> list[dict[str, Any]]:
    """A group's offline table as Python values (Arrow, not pandas: no int64 goes through a float)."""
    table = spark.read.format("delta").load(path).drop("date").toArrow()
    return python_rows(table, group)


def land(root: Path) -> None:
    write_events(EVENTS, root / "data" / "transactions", n_files=FILES)


@pytest.fixture(scope="module")
def backfilled(spark, feast_repo_factory, tmp_path_factory):
    from features.pipelines.backfill import backfill
    from features.repo import Repo

    root = tmp_path_factory.mktemp("int_backfill") / "repo"
    land(root)
    feast_repo_factory(root, GROUPS)
    repo = Repo.load(root)
    start, end = BASE - H, BASE + 8 * H
    backfill(repo, start.to_pydatetime(), end.to_pydatetime(), spark=spark, progress=False, track=False)
    return repo


@pytest.fixture(scope="module")
def streamed(spark, feast_repo_factory, tmp_path_factory):
    from features.pipelines.stream import stream
    from features.repo import Repo

    root = tmp_path_factory.mktemp("int_stream") / "repo"
    land(root)
    feast_repo_factory(root, GROUPS)
    repo = Repo.load(root)
    run = stream(repo, available_now=True, max_files_per_trigger=1, progress=False, tracking=False)
    run.await_termination()
    return repo, {p.group: p for p in run.progress()}


@pytest.mark.spark
def test_the_files_hold_nulls_in_half_of_them(backfilled) -> None:
    import pyarrow.parquet as pq

    files = sorted((backfilled.root / "data" / "transactions").glob("part-*.parquet"))
    assert len(files) == FILES
    for i, path in enumerate(files):
        column = pq.read_table(path).column("merchant_id")
        assert column.type == pa.int64() and (column.null_count > 0) == (i % 2 == 0)


@pytest.mark.spark
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_a_backfill_is_exact(spark, backfilled, group) -> None:
    """Before: 1 distinct merchant where there are 40, and a max of exactly 2^60."""
    rows = exact_rows(spark, backfilled.offline_path(group), group)
    assert rows
    assert_reference(group, rows, EVENTS)


@pytest.mark.spark
def test_a_backfill_sees_every_merchant(spark, backfilled) -> None:
    rows = exact_rows(spark, backfilled.offline_path(BY_USER), BY_USER)
    assert max(r["m_distinct_life"] for r in rows) == MERCHANTS
    assert max(r["m_approx_life"] for r in rows) == MERCHANTS
    assert max(r["m_max"] for r in rows if r["m_max"] is not None) == BIG + MERCHANTS - 1


@pytest.mark.spark
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_the_stream_equals_the_backfill_and_the_reference(spark, backfilled, streamed, group) -> None:
    """Before: the stream's Lifetime approx_count_distinct said 41 (the same ids hashed as integers in the files
    without nulls, as floats in the others), and its values differed from the backfill's."""
    repo, progress = streamed
    watermark = to_micros(pd.Timestamp(progress[group.name].watermark))
    got = exact_rows(spark, repo.offline_path(group), group)
    want = [r for r in exact_rows(spark, backfilled.offline_path(group), group) if r[WINDOW_END] <= watermark]
    assert got and got == want
    assert_reference(group, got, EVENTS)
    if group is BY_USER:
        assert max(r["m_approx_life"] for r in got) == MERCHANTS


@pytest.mark.spark
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
@pytest.mark.parametrize("which", ["backfill", "stream"])
def test_online_values_are_exact(backfilled, streamed, group, which) -> None:
    """Each key's online value (through Feast, int keys and values above 2^53) is the reference's at its window
    end."""
    from features.stores.serving import online_features

    repo = backfilled if which == "backfill" else streamed[0]
    keys = EVENTS[list(group.join_keys)].drop_duplicates().reset_index(drop=True).astype(object)  # Python ints
    got = online_features(repo, group, keys, with_window_end=True)
    assert got[WINDOW_END].notna().all()
    rows = []
    for i in range(len(got)):
        row = {k: keys[k].iloc[i] for k in group.join_keys}
        row[WINDOW_END] = to_micros(got[WINDOW_END].iloc[i])
        for feat in group.features:
            value = got[feat.name].iloc[i]
            value = None if value is None or value is pd.NA else value
            row[feat.name] = value.item() if isinstance(value, np.generic) else value
        rows.append(row)
    assert_online(group, rows)


def assert_online(group: FeatureGroup, rows: list[dict[str, Any]]) -> None:
    lookups = [(tuple(r[k] for k in group.join_keys), pd.Timestamp(r[WINDOW_END], unit="us", tz="UTC")) for r in rows]
    want = reference_frame(EVENTS, group, lookups)
    problems = []
    for i, row in enumerate(rows):
        for feat in group.features:
            exact = want[feat.name].iloc[i]
            exact = exact.item() if isinstance(exact, np.generic) else exact
            if not same(feat, row[feat.name], exact):
                problems.append(f"{feat.name} {lookups[i]}: got {row[feat.name]!r}, want {exact!r}")
    assert not problems, "\n".join(problems[:12])
