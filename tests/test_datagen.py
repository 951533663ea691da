"""The demo transaction generator and the event-file writer (no Spark)."""

from __future__ import annotations

import json
import re
from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.demo import generate_transactions, write_events

START = pd.Timestamp("2026-03-01", tz="UTC")
DAYS = 7
COLUMNS = ["txn_id", "user_id", "card_id", "merchant_id", "amount", "status", "event_ts", "is_fraud"]
MINUTE_US = 60 * 1_000_000


@pytest.fixture(scope="module")
def tx() -> pd.DataFrame:
    return generate_transactions(20_000, 300, "2026-03-01", DAYS, seed=11)


def lateness_us(frame: pd.DataFrame) -> np.ndarray:
    """How far each delivered row is behind the newest event delivered before it."""
    ts = frame["event_ts"].astype("int64").to_numpy()
    return np.maximum.accumulate(ts) - ts


def test_columns_and_dtypes(tx: pd.DataFrame) -> None:
    assert list(tx.columns) == COLUMNS
    for name in ("txn_id", "user_id", "card_id", "merchant_id", "status"):
        assert tx[name].dtype == object
        assert tx[name].map(type).eq(str).all(), name
    assert tx["amount"].dtype == np.float64
    assert str(tx["event_ts"].dtype) == "datetime64[us, UTC]"
    assert tx["is_fraud"].dtype == np.int64
    assert isinstance(tx.index, pd.RangeIndex)


def test_size_ids_and_range(tx: pd.DataFrame) -> None:
    assert len(tx) == 20_000
    assert tx["txn_id"].is_unique
    assert tx["user_id"].str.fullmatch(r"u\d{6}").all()
    assert tx["card_id"].str.fullmatch(r"c\d{7}").all()
    assert tx["merchant_id"].str.fullmatch(r"m\d{5}").all()
    assert tx["user_id"].nunique() <= 300
    assert tx["event_ts"].min() >= START
    assert tx["event_ts"].max() < START + pd.Timedelta(days=DAYS)
    assert set(tx["status"]) == {"APPROVED", "DECLINED", "FAILED"}
    assert (tx["status"] == "APPROVED").mean() > 0.9
    assert set(tx["is_fraud"]) == {0, 1}


def test_deterministic_per_seed() -> None:
    first = generate_transactions(3_000, 50, "2026-01-01", 2, seed=5)
    pd.testing.assert_frame_equal(first, generate_transactions(3_000, 50, "2026-01-01", 2, seed=5))
    assert not first.equals(generate_transactions(3_000, 50, "2026-01-01", 2, seed=6))


def test_each_user_owns_one_to_three_cards(tx: pd.DataFrame) -> None:
    assert (tx.groupby("card_id")["user_id"].nunique() == 1).all()
    cards_per_user = tx.groupby("user_id")["card_id"].nunique()
    assert cards_per_user.between(1, 3).all()
    assert cards_per_user.max() > 1


def test_amounts_are_positive_with_some_nulls(tx: pd.DataFrame) -> None:
    assert 0.005 < tx["amount"].isna().mean() < 0.016
    assert (tx["amount"].dropna() > 0).all()
    assert (tx["amount"].dropna().round(2) == tx["amount"].dropna()).all()  # cents
    assert generate_transactions(2_000, 20, START, 1, null_amount_rate=0.0)["amount"].notna().all()


def test_rows_arrive_out_of_order(tx: pd.DataFrame) -> None:
    late = lateness_us(tx)
    assert 0.005 < (late > 0).mean() < 0.03
    assert (late > 10 * MINUTE_US).sum() >= 1  # some beyond the default 10-minute watermark
    assert late.max() <= 30 * MINUTE_US
    in_order = generate_transactions(2_000, 20, START, 1, late_fraction=0.0)
    assert in_order["event_ts"].is_monotonic_increasing


def test_activity_is_skewed_and_seasonal(tx: pd.DataFrame) -> None:
    per_user = tx["user_id"].value_counts()
    assert per_user.iloc[:3].sum() / len(tx) > 0.05  # the top 1% of users, well above 1% of the events
    per_merchant = tx["merchant_id"].value_counts()
    assert per_merchant.iloc[0] > 10 * per_merchant.median()  # Zipf-like popularity
    per_hour = tx["event_ts"].dt.hour.value_counts().sort_index()
    assert per_hour.loc[14:18].sum() > 2 * per_hour.loc[2:6].sum()  # afternoon vs small hours


def test_fraud_rate_is_sensible(tx: pd.DataFrame) -> None:
    assert 0.001 < tx["is_fraud"].mean() < 0.02


def test_fraud_bursts_cluster_on_compromised_cards(tx: pd.DataFrame) -> None:
    fraud = tx[tx["is_fraud"] == 1]
    attempts = fraud[fraud["status"] != "APPROVED"].groupby("card_id")["event_ts"].agg(["count", "min", "max"])
    bursts = attempts[attempts["count"] >= 3]
    assert len(bursts) >= 3
    assert ((bursts["max"] - bursts["min"]) <= pd.Timedelta(minutes=30)).all()  # within minutes

    # A per-card "failed or declined in the last hour" count separates compromised cards from the others.
    def worst_hour(group: pd.DataFrame) -> int:
        ts = np.sort(group["event_ts"].astype("int64").to_numpy())
        return int((np.searchsorted(ts, ts + 60 * MINUTE_US) - np.arange(len(ts))).max())

    bad = tx[tx["status"] != "APPROVED"]
    worst = pd.Series({card: worst_hour(rows) for card, rows in bad.groupby("card_id")})
    compromised = worst.index.isin(bursts.index)
    assert worst[compromised].median() >= 4
    assert worst[~compromised].quantile(0.99) <= 2

    # The burst happens at merchants new to the user, and the cash-out is far above a normal spend.
    normal = tx[tx["is_fraud"] == 0]
    known = set(zip(normal["user_id"], normal["merchant_id"], strict=True))
    burst_rows = fraud[fraud["card_id"].isin(bursts.index)]
    new = [(u, m) not in known for u, m in zip(burst_rows["user_id"], burst_rows["merchant_id"], strict=True)]
    assert np.mean(new) > 0.8
    cash_out = burst_rows[burst_rows["status"] == "APPROVED"]["amount"]
    assert cash_out.median() > 5 * normal["amount"].median()


def test_small_and_invalid_inputs() -> None:
    empty = generate_transactions(0, 5, START, 1)
    assert list(empty.columns) == COLUMNS and len(empty) == 0
    assert str(empty["event_ts"].dtype) == "datetime64[us, UTC]"
    assert len(generate_transactions(10, 1, START, 0.01)) == 10
    assert generate_transactions(60, 3, START, 1)["is_fraud"].sum() >= 3  # even tiny sets get a burst
    with pytest.raises(ValueError, match="n_users"):
        generate_transactions(10, 0, START, 1)
    with pytest.raises(ValueError, match="days"):
        generate_transactions(10, 1, START, 0)
    with pytest.raises(ValueError, match="late_fraction"):
        generate_transactions(10, 1, START, 1, late_fraction=2.0)


# ----------------------------------------------------------------------------------------------------------
# write_events


def test_write_parquet_round_trips(tx: pd.DataFrame, tmp_path: Path) -> None:
    folder = tmp_path / "landing" / "tx"
    paths = write_events(tx, folder, n_files=3, start_index=5)
    assert [Path(p).name for p in paths] == ["part-00005.parquet", "part-00006.parquet", "part-00007.parquet"]
    assert sorted(p.name for p in folder.iterdir()) == [Path(p).name for p in paths]  # no hidden leftovers
    schema = pq.read_schema(paths[0])
    assert schema.field("event_ts").type == pa.timestamp("us", tz="UTC")
    back = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
    pd.testing.assert_frame_equal(back, tx, check_dtype=False)
    assert (back["event_ts"] == tx["event_ts"]).all()


def test_write_json_round_trips(tx: pd.DataFrame, tmp_path: Path) -> None:
    sample = tx.iloc[:3_000]
    paths = write_events(sample, tmp_path / "json", format="json", n_files=2)
    assert [Path(p).name for p in paths] == ["part-00000.json", "part-00001.json"]
    with open(paths[0], encoding="utf-8") as lines:
        first = json.loads(lines.readline())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", first["event_ts"])
    back = pd.concat([pd.read_json(p, lines=True, dtype=False, precise_float=True) for p in paths], ignore_index=True)
    assert list(back.columns) == COLUMNS
    stamps = pd.to_datetime(back["event_ts"], utc=True, format="ISO8601")
    assert (stamps.to_numpy() == sample["event_ts"].to_numpy()).all()
    for name in ("txn_id", "user_id", "card_id", "merchant_id", "status", "is_fraud"):
        assert back[name].tolist() == sample[name].tolist(), name
    amounts = back["amount"].astype(float)
    assert amounts.isna().equals(sample["amount"].isna())
    assert (amounts.dropna() == sample["amount"].dropna()).all()  # exact, not approximately


def test_write_events_edge_cases(tmp_path: Path) -> None:
    small = generate_transactions(2, 1, START, 1)
    paths = write_events(small, tmp_path / "pq", n_files=4)
    assert [len(pd.read_parquet(p)) for p in paths] == [0, 1, 0, 1]
    paths = write_events(small, tmp_path / "js", format="json", n_files=3)
    assert [Path(p).read_text().count("\n") for p in paths] == [0, 1, 1]
    with pytest.raises(ValueError, match="format"):
        write_events(small, tmp_path / "x", format="csv")


def test_files_are_delivered_in_name_order_however_fast_they_land(tmp_path: Path) -> None:
    """Spark's file source orders by modification time and leaves ties in listing order: every landed file,
    across calls, is at least a millisecond newer than the files before it."""
    small = generate_transactions(2, 1, START, 1)
    for start in range(0, 12, 3):
        write_events(small, tmp_path, n_files=3, start_index=start)
    stamps = [p.stat().st_mtime_ns for p in sorted(tmp_path.glob("part-*.parquet"))]
    assert len(stamps) == 12
    assert all(later - earlier >= 1_000_000 for earlier, later in pairwise(stamps))
