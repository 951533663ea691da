"""Backfill end to end: Spark change points -> offline Parquet table and SQLite online store -> Feast's own API.

One generated data set and one applied repo serve the whole module. Values read back through
`FeatureStore.get_historical_features` and `get_online_features` must equal the brute-force reference; re-runs
and sub-range rewrites leave the same table; an earlier backfill never moves the online store back in time.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from groups import SOURCE, user_transactions
from reference import reference_frame, to_micros

from features import Entity, Feature, FeatureGroup, Hop, Lifetime, agg
from features.pipelines.backfill import BackfillResult, backfill
from features.repo import Repo
from features.spec import WINDOW_END, AggKind
from features.spec.aggregations import Empty
from features.stores import offline

pytestmark = pytest.mark.spark

US = pd.Timedelta(microseconds=1)
MICROS = 1_000_000
START = pd.Timestamp("2026-01-01", tz="UTC")  # the data starts here too
END = pd.Timestamp("2026-01-03 06:00", tz="UTC")  # six hours after the last event
MID = pd.Timestamp("2026-01-02 07:30", tz="UTC")  # inside a date partition

USER_GROUP = user_transactions(
    # what request-time features read: a timestamp and a set (a list), through both stores
    Feature("last_seen", agg.last_event_time(), window=Lifetime(every="5m")),
    Feature("last_failed_1h", agg.last_event_time(), window=Hop("1h", every="5m"), where="status = 'FAILED'"),
    Feature("merchant_set_24h", agg.distinct_values("merchant_id"), window=Hop("24h", every="1h")),
)
CARD_MERCHANT_GROUP = FeatureGroup(
    name="card_merchant",
    entity=Entity("card_merchant", join_keys=["card_id", "merchant_id"]),
    source=SOURCE,
    features=[
        Feature("txn_count_1h", agg.count(), window=Hop("1h", every="5m")),
        Feature("amount_sum_24h", agg.sum("amount"), window=Hop("24h", every="1h")),
        Feature("last_status", agg.last("status"), window=Lifetime(every="5m")),
    ],
)
GROUPS = [USER_GROUP, CARD_MERCHANT_GROUP]


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    from features.demo import generate_transactions

    return generate_transactions(3_000, 20, START, 2, seed=5)


@pytest.fixture(scope="module")
def repo_root(tmp_path_factory: pytest.TempPathFactory, feast_repo_factory, events: pd.DataFrame) -> Path:
    return feast_repo_factory(tmp_path_factory.mktemp("backfill") / "repo", GROUPS, events, n_files=3)


def run_backfill(spark, root: Path, start: pd.Timestamp, end: pd.Timestamp, groups=None) -> list[BackfillResult]:
    return backfill(Repo.load(root), start.to_pydatetime(), end.to_pydatetime(), groups, spark=spark, progress=False)


@pytest.fixture(scope="module")
def full(spark, repo_root: Path) -> list[BackfillResult]:
    """The first backfill of the whole range, both groups."""
    return run_backfill(spark, repo_root, START, END)


# ---------------------------------------------------------------------------------------------------------
# Helpers


def store_of(root: Path):
    from feast import FeatureStore

    return FeatureStore(repo_path=str(root))


def refs(group: FeatureGroup) -> list[str]:
    return [f"{group.name}:{f.name}" for f in group.features]


def historical(root: Path, group: FeatureGroup, lookups: pd.DataFrame) -> pd.DataFrame:
    """Feast's point-in-time join for (keys, t) lookups, in the lookups' order."""
    entity_df = lookups[list(group.join_keys)].copy()
    entity_df["event_timestamp"] = lookups["t"].astype("datetime64[us, UTC]").to_numpy()
    entity_df["row_id"] = np.arange(len(lookups))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = store_of(root).get_historical_features(entity_df=entity_df, features=refs(group)).to_df()
    assert len(out) == len(lookups)
    return out.sort_values("row_id").reset_index(drop=True)


def online(root: Path, group: FeatureGroup, keys: list[tuple]) -> pd.DataFrame:
    rows = [dict(zip(group.join_keys, key, strict=True)) for key in keys]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values = store_of(root).get_online_features(features=refs(group), entity_rows=rows).to_dict()
    columns = [*group.join_keys, *(f.name for f in group.features)]
    return pd.DataFrame({c: [tuple(v) if isinstance(v, list) else v for v in values[c]] for c in columns})


def _is_null(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float | np.floating) and math.isnan(value)


def _native(value: Any) -> Any:
    if isinstance(value, np.ndarray | list | tuple):
        return [_native(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def mismatch(feature: Feature, got: Any, want: Any) -> str | None:
    """None if Feast's value is the reference value (null where Feast found no row: nothing happened yet)."""
    kind = feature.aggregation.kind
    got = None if _is_null(got) else _native(got)
    want = None if _is_null(want) else _native(want)
    if got is None and kind.op.empty is not Empty.NULL:
        got = kind.op.empty.make()  # no row before t: an empty window (0, or [] for distinct_values)
    if isinstance(want, pd.Timestamp) and got is not None:  # last_event_time: Feast's datetimes, maybe naive
        got = pd.Timestamp(got)
        got = got.tz_localize("UTC") if got.tzinfo is None else got.tz_convert("UTC")
    if want is None or got is None:
        return None if want is got else f"got {got!r}, want {want!r}"
    if kind is AggKind.APPROX_COUNT_DISTINCT:
        ok = got == want if want <= 100 else abs(got - want) <= 0.03 * want
    elif isinstance(want, float):
        ok = math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-7)
    else:
        ok = got == want
    return None if ok else f"got {got!r}, want {want!r}"


def assert_matches(group: FeatureGroup, got: pd.DataFrame, want: pd.DataFrame, what: str) -> None:
    problems = []
    for feat in group.features:
        for i, (g, w) in enumerate(zip(got[feat.name], want[feat.name], strict=True)):
            problem = mismatch(feat, g, w)
            if problem is not None:
                key = tuple(want.loc[i, k] for k in group.join_keys)
                at = f" t={want.loc[i, 't']}" if "t" in want else ""
                problems.append(f"{feat.name} key={key}{at}: {problem}")
    assert not problems, f"{what}: {len(problems)} mismatches, e.g.:\n" + "\n".join(problems[:15])


def _floor(t_us: int, step_us: int) -> int:
    return t_us - t_us % step_us


def lookup_pairs(
    events: pd.DataFrame, group: FeatureGroup, keys: list[tuple], per_key: int, seed: int
) -> list[tuple[tuple, pd.Timestamp]]:
    """Per key: exact window ends where its values change (entries and exits of its events' panes) and 1us
    before them, random multiples of 5m, random times; all in [START, END)."""
    rng = np.random.default_rng(seed)
    lo, hi = to_micros(START), to_micros(END)
    pairs = []
    for key in keys:
        mine = events
        for name, part in zip(group.join_keys, key, strict=True):
            mine = mine[mine[name] == part]
        stamps = [to_micros(t) for t in mine["event_ts"]]
        ends = set()
        for ts in rng.choice(stamps, min(len(stamps), per_key), replace=False):
            feat = group.features[int(rng.integers(len(group.features)))]
            every = feat.window.every_s * MICROS
            enter = _floor(int(ts), every) + every
            ends.update({enter, enter - 1})
            if feat.window.size_s is not None:
                ends.update({enter + feat.window.size_s * MICROS, enter + feat.window.size_s * MICROS - 1})
        ends.update(int(x) for x in rng.integers(lo // (300 * MICROS), hi // (300 * MICROS), per_key) * 300 * MICROS)
        ends.update(int(x) for x in rng.integers(lo, hi, per_key))
        ends.update({lo, hi - 1})
        pairs += [(key, pd.Timestamp(t, unit="us", tz="UTC")) for t in sorted(ends) if lo <= t < hi]
    return pairs


def keys_of(events: pd.DataFrame, group: FeatureGroup) -> list[tuple]:
    frame = events[list(group.join_keys)].drop_duplicates().sort_values(list(group.join_keys))
    return [tuple(row) for row in frame.itertuples(index=False)]


def table_path(root: Path, group: FeatureGroup) -> Path:
    return root / "data" / "offline" / group.name


def utc(values: pd.Series) -> pd.Series:
    """Window ends as UTC timestamps (Spark's default INT96 Parquet timestamps read back naive, in UTC)."""
    values = pd.to_datetime(values)
    return (values.dt.tz_localize("UTC") if values.dt.tz is None else values.dt.tz_convert("UTC")).astype(
        "datetime64[us, UTC]"
    )


def read_table(root: Path, group: FeatureGroup) -> pd.DataFrame:
    """Every row of the offline table (plus the partition it is in), sorted, lists as tuples."""
    table = offline.read_pandas(str(table_path(root, group)), with_date=True)
    table = table.assign(_partition="date=" + table.pop(offline.DATE).astype(str))
    table[WINDOW_END] = utc(table[WINDOW_END])
    for column in table.columns:
        if table[column].dtype == object:
            table[column] = [tuple(v) if isinstance(v, np.ndarray | list) else v for v in table[column]]
    return table.sort_values([*group.join_keys, WINDOW_END], ignore_index=True)


# ---------------------------------------------------------------------------------------------------------
# Values through Feast


def test_backfill_reports_what_it_did(full: list[BackfillResult], events: pd.DataFrame) -> None:
    by_group = {r.group: r for r in full}
    assert set(by_group) == {g.name for g in GROUPS}
    for result in full:
        assert result.rows_in == len(events)  # every event is in the range (and both groups have a Lifetime)
        assert result.rows_out > 0
    assert by_group["user_transactions"].online_rows == events["user_id"].nunique()
    assert by_group["card_merchant"].online_rows == len(keys_of(events, CARD_MERCHANT_GROUP))


def test_historical_features_match_reference(full, repo_root: Path, events: pd.DataFrame) -> None:
    keys = keys_of(events, USER_GROUP)
    pairs = lookup_pairs(events, USER_GROUP, keys, per_key=12, seed=1)
    want = reference_frame(events, USER_GROUP, pairs)
    got = historical(repo_root, USER_GROUP, want)
    assert len(got) > 20 * len(keys)
    assert_matches(USER_GROUP, got, want, "get_historical_features")
    # Exact window ends and the microsecond before them were among the lookups.
    t_us = want["t"].map(to_micros)
    assert (t_us % (300 * MICROS) == 0).sum() > 100 and (t_us % (300 * MICROS) == 300 * MICROS - 1).sum() > 50


def test_historical_features_composite_key(full, repo_root: Path, events: pd.DataFrame) -> None:
    counts = events.groupby(["card_id", "merchant_id"]).size().sort_values(ascending=False)
    keys = [tuple(k) for k in counts.index[:25]]
    pairs = lookup_pairs(events, CARD_MERCHANT_GROUP, keys, per_key=6, seed=2)
    want = reference_frame(events, CARD_MERCHANT_GROUP, pairs)
    got = historical(repo_root, CARD_MERCHANT_GROUP, want)
    assert_matches(CARD_MERCHANT_GROUP, got, want, "get_historical_features (card_id, merchant_id)")
    # Keys that share a card or a merchant with another key stay apart.
    card, merchant = keys[0]
    lookups = pd.DataFrame({"card_id": [card, "c-none"], "merchant_id": ["m-none", merchant], "t": [END - US] * 2})
    nothing = historical(repo_root, CARD_MERCHANT_GROUP, lookups)
    assert nothing["txn_count_1h"].isna().all() and nothing["last_status"].isna().all()


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_online_features_are_the_values_at_end(full, repo_root: Path, events: pd.DataFrame, group) -> None:
    keys = keys_of(events, group)
    got = online(repo_root, group, keys)
    want = reference_frame(events, group, [(key, END) for key in keys])
    assert_matches(group, got, want, "get_online_features")
    unknown = online(repo_root, group, [tuple("nobody" for _ in group.join_keys)])
    assert all(unknown[f.name].isna().all() for f in group.features)


# ---------------------------------------------------------------------------------------------------------
# The offline table: layout, re-runs, sub-ranges; the online store: never back in time


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_the_table_is_partitioned_by_date_with_few_files_each(full, repo_root: Path, group) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(str(table_path(repo_root, group)))
    assert table.metadata().partition_columns == [offline.DATE]
    files = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    per_day = Counter(str(d) for d in files[f"partition.{offline.DATE}"])
    assert sorted(per_day) == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert max(per_day.values()) <= offline.MAX_FILES  # a file per date and task of the pass: a few, never more
    rows = read_table(repo_root, group)
    assert (rows[WINDOW_END].dt.strftime("date=%Y-%m-%d") == rows["_partition"]).all()
    assert rows[WINDOW_END].min() >= START and rows[WINDOW_END].max() < END
    assert not rows.duplicated([*group.join_keys, WINDOW_END]).any()


@dataclass(frozen=True)
class History:
    """The offline table and online values after each backfill of a sequence over the user group."""

    tables: dict[str, pd.DataFrame]
    online: dict[str, pd.DataFrame]
    results: dict[str, list[BackfillResult]]


@pytest.fixture(scope="module")
def history(spark, full, repo_root: Path, events: pd.DataFrame) -> History:
    keys = keys_of(events, USER_GROUP)
    tables, values, results = {}, {}, {"full": full}

    def snapshot(name: str) -> None:
        tables[name] = read_table(repo_root, USER_GROUP)
        values[name] = online(repo_root, USER_GROUP, keys)

    snapshot("full")
    results["rerun"] = run_backfill(spark, repo_root, START, END, [USER_GROUP.name])
    snapshot("rerun")
    results["later"] = run_backfill(spark, repo_root, MID, END, [USER_GROUP.name])
    snapshot("later")
    results["earlier"] = run_backfill(spark, repo_root, START, MID, [USER_GROUP.name])
    snapshot("earlier")
    return History(tables, values, results)


def test_rerunning_the_same_range_is_idempotent(history: History) -> None:
    pd.testing.assert_frame_equal(history.tables["rerun"], history.tables["full"])
    pd.testing.assert_frame_equal(history.online["rerun"], history.online["full"])


def redundant_at(table: pd.DataFrame, group: FeatureGroup, at: pd.Timestamp) -> pd.Series:
    """Rows at window end `at` whose values equal the key's previous row (a no-op for as-of lookups)."""
    features = [f.name for f in group.features]
    previous = table.groupby(list(group.join_keys))[features].shift(1)
    same = pd.Series(True, index=table.index)
    for name in features:
        a, b = table[name], previous[name]
        same &= (a == b) | (a.isna() & b.isna())
    return same & (table[WINDOW_END] == at)


def assert_same_series(got: pd.DataFrame, want: pd.DataFrame, group: FeatureGroup, range_start: pd.Timestamp) -> None:
    """The same table, except that a range rewritten from `range_start` may hold, at exactly that window end,
    rows that repeat the key's previous value (the engine's start-of-range snapshot rows)."""
    extra = redundant_at(got, group, range_start)
    keys = [*group.join_keys, WINDOW_END]
    extra &= ~got.set_index(keys).index.isin(want.set_index(keys).index)
    pd.testing.assert_frame_equal(got[~extra].reset_index(drop=True), want)


def test_sub_range_rewrite_keeps_rows_outside_and_replaces_rows_inside(history: History, repo_root: Path) -> None:
    full, table = history.tables["full"], history.tables["later"]
    # Rows before MID are kept as they were, also in the rewritten 2026-01-02 partition.
    pd.testing.assert_frame_equal(
        table[table[WINDOW_END] < MID].reset_index(drop=True), full[full[WINDOW_END] < MID].reset_index(drop=True)
    )
    # Rows in [MID, END) are recomputed: the same change points (plus no-op snapshot rows at MID).
    assert_same_series(table, full, USER_GROUP, MID)
    [later] = history.results["later"]
    inside = table[(table[WINDOW_END] >= MID) & (table[WINDOW_END] < END)]
    assert later.rows_out >= len(inside) > 0  # rows_out counts the rewritten partitions' rows
    assert (table[WINDOW_END] < MID).any()  # rows before MID, also in the rewritten 2026-01-02 partition
    assert ((table[WINDOW_END] < MID) & (table["_partition"] == "date=2026-01-02")).any()


def test_earlier_backfill_never_moves_the_online_store_back(history: History, events: pd.DataFrame) -> None:
    [earlier] = history.results["earlier"]
    assert earlier.online_rows > 0  # it did write its (older) latest rows
    pd.testing.assert_frame_equal(history.online["earlier"], history.online["full"])
    pd.testing.assert_frame_equal(history.tables["earlier"], history.tables["later"])  # [MID, END) untouched
    assert_same_series(history.tables["earlier"], history.tables["full"], USER_GROUP, MID)
    # The guard mattered: the values as of MID differ from those as of END for most keys.
    keys = keys_of(events, USER_GROUP)
    at_mid = reference_frame(events, USER_GROUP, [(key, MID) for key in keys])
    at_end = reference_frame(events, USER_GROUP, [(key, END) for key in keys])
    assert (at_mid["txn_count_lifetime"] != at_end["txn_count_lifetime"]).sum() > len(keys) // 2


# ---------------------------------------------------------------------------------------------------------
# features verify


def test_verify_finds_the_stores_consistent(spark, full, repo_root: Path) -> None:
    from features.pipelines.verify import verify_group

    repo = Repo.load(repo_root)
    for group in GROUPS:
        report = verify_group(spark, repo, group, sample=8)
        assert report.ok, report.table()
        assert report.keys == 8
        assert all(t.match > 0 for t in report.tallies.values())


def _sqlite_online(root: Path, group: FeatureGroup):
    """The repo's SQLite online store, its table of `group`, and the entity key bytes of a key of it."""
    import sqlite3

    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    def entity_key(key: tuple) -> bytes:
        values = [Value(string_val=v) if isinstance(v, str) else Value(int64_val=int(v)) for v in key]
        proto = EntityKey(join_keys=list(group.join_keys), entity_values=values)
        return serialize_entity_key(proto, entity_key_serialization_version=3)

    return sqlite3.connect(root / "data" / "online_store.db"), f"{store_of(root).project}_{group.name}", entity_key


def test_verify_names_tampered_values_and_stale_rows(spark, full, repo_root: Path, tmp_path: Path, capsys) -> None:
    """An online value changed in SQLite by hand is a mismatch of that feature alone (its rate over the keys
    compared), an offline value changed by another Delta writer one of the offline check; a key whose online row is
    an older offline row (its later write lost) is stale in every feature, by the gap between the two window ends,
    and `--max-staleness` at that gap passes it."""
    import json
    import shutil

    from deltalake import DeltaTable
    from feast.protos.feast.types.Value_pb2 import Value

    from features.cli import main
    from features.pipelines.backfill import ready_writer
    from features.pipelines.verify import verify_group

    root = tmp_path / "repo"
    shutil.copytree(repo_root, root)
    repo = Repo.load(root)
    changed, behind, tampered = keys_of(read_table(root, USER_GROUP), USER_GROUP)[:3]
    conn, online_table, entity_key = _sqlite_online(root, USER_GROUP)
    with conn:
        [(blob,)] = conn.execute(
            f"SELECT value FROM {online_table} WHERE entity_key = ? AND feature_name = 'txn_count_lifetime'",
            (entity_key(changed),),
        )
        value = Value.FromString(blob)
        value.int64_val += 1
        conn.execute(
            f"UPDATE {online_table} SET value = ? WHERE entity_key = ? AND feature_name = 'txn_count_lifetime'",
            (value.SerializeToString(), entity_key(changed)),
        )
        conn.execute(f"DELETE FROM {online_table} WHERE entity_key = ?", (entity_key(behind),))
    conn.close()
    stored = offline.read_pandas(str(table_path(root, USER_GROUP)))
    rows = stored[stored["user_id"] == behind[0]].assign(**{WINDOW_END: lambda f: utc(f[WINDOW_END])})
    rows = rows.sort_values(WINDOW_END)
    ready_writer(repo, USER_GROUP).write(rows.iloc[[-2]])  # the key's online row: its next-to-last change point
    gap_s = (rows[WINDOW_END].iloc[-1] - rows[WINDOW_END].iloc[-2]).total_seconds()
    # Offline: the sum of another key's first row changed (by another Delta writer).
    moment = stored[stored["user_id"] == tampered[0]][WINDOW_END].min().strftime("%Y-%m-%d %H:%M:%S")
    DeltaTable(str(table_path(root, USER_GROUP))).update(
        predicate=f"user_id = '{tampered[0]}' AND {WINDOW_END} = '{moment}'",
        updates={"amount_sum_1h": "amount_sum_1h + 1.0"},
    )

    report = verify_group(spark, repo, USER_GROUP, sample=100)
    features = [f.name for f in USER_GROUP.features]
    online_tallies = {f: report.tallies["online", f] for f in features}
    assert [f for f, t in online_tallies.items() if t.mismatch or t.missing] == ["txn_count_lifetime"]
    counted = online_tallies["txn_count_lifetime"]
    assert counted.mismatch_rate == pytest.approx(1 / (counted.match + 1))
    assert [e for e in counted.examples if e.startswith("mismatch")] == [
        e for e in counted.examples if str(changed) in e
    ]
    assert all(t.stale == 1 and t.max_lag_s == gap_s for t in online_tallies.values())
    assert any(str(behind) in e and e.startswith("stale") for e in online_tallies["last_seen"].examples)
    offline_tallies = {f: t for (check, f), t in report.tallies.items() if check == "offline" and not t.ok}
    assert list(offline_tallies) == ["amount_sum_1h"] and offline_tallies["amount_sum_1h"].mismatch == 1
    assert str(tampered) in offline_tallies["amount_sum_1h"].examples[0]
    assert "mismatch%" in report.table() and f"{counted.mismatch_rate:.2%}" in report.table()

    tolerated = f"{int(gap_s)}s"
    args = ["verify", "--repo", str(root), "--group", USER_GROUP.name, "--no-tracking", "--json"]
    assert main([*args, "--max-staleness", tolerated]) == 1
    out, err = capsys.readouterr()
    by_feature = {t["feature"]: t for t in json.loads(out)["tallies"] if t["check"] == "online"}
    assert by_feature["txn_count_lifetime"]["mismatch_rate"] == counted.mismatch_rate
    assert all(t["stale"] == 0 and t["max_lag_s"] == gap_s for t in by_feature.values())
    errors = [line.split()[1:3] for line in err.splitlines() if line.startswith("error:")]
    assert errors == [
        [f"{USER_GROUP.name}.txn_count_lifetime", "(online):"],
        [f"{USER_GROUP.name}.amount_sum_1h", "(offline):"],
    ]


def test_a_range_before_the_data_starts_reads_no_events(
    spark, tmp_path: Path, feast_repo_factory, events: pd.DataFrame
) -> None:
    # Parquet statistics let Spark skip every row group here, which once failed the events count.
    root = feast_repo_factory(tmp_path / "repo", [USER_GROUP], events, n_files=3)
    [result] = run_backfill(spark, root, START - pd.Timedelta(days=3), START - pd.Timedelta(days=1))
    assert result.rows_in == 0
    assert result.rows_out == 0
