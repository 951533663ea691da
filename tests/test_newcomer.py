"""The newcomer's path, from an empty folder: the README's definitions as they are printed (no Feast exports),
events written with plain pandas (`to_parquet`, nanosecond timestamps), a stray file that is not Parquet, then
`features apply` and `features backfill` as commands, and the values read back through Feast's own API,
against the brute-force reference of DESIGN.md section 2."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from reference import reference_frame
from test_cli import EXAMPLE_REPO, run

from features.repo import Repo

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_definitions() -> str:
    """The first Python block of the README's "Defining features" section, verbatim."""
    section = README.read_text().split("## Defining features", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the README lost its definitions example"
    return match.group(1)


def pandas_events(n: int = 240, seed: int = 7) -> pd.DataFrame:
    """Transactions as a newcomer builds them in pandas: datetime64[ns] times with sub-microsecond digits."""
    rng = np.random.default_rng(seed)
    start = pd.Timestamp("2026-01-01", tz="UTC")
    offsets = np.sort(rng.integers(0, 86_400 * 10**9, n))
    amounts = rng.gamma(2.0, 30.0, n).round(2)
    amounts[5] = np.nan  # a NaN is a null (DESIGN.md section 2)
    return pd.DataFrame(
        {
            "txn_id": [f"t{i}" for i in range(n)],
            "user_id": rng.choice([f"u{i}" for i in range(6)], n),
            "merchant_id": rng.choice([f"m{i}" for i in range(9)], n),
            "amount": amounts,
            "status": rng.choice(["OK", "OK", "OK", "FAILED"], n),
            "event_ts": start + pd.to_timedelta(offsets, unit="ns"),
        }
    )


@pytest.mark.slow
def test_newcomer_path_from_an_empty_folder(tmp_path: Path):
    root = tmp_path / "my_features"
    root.mkdir()
    shutil.copy(EXAMPLE_REPO / "feature_store.yaml", root / "feature_store.yaml")
    (root / "definitions.py").write_text(readme_definitions())
    events = pandas_events()
    assert events["event_ts"].dtype == "datetime64[ns, UTC]"
    landing = root / "data" / "transactions"
    landing.mkdir(parents=True)
    events.iloc[:100].to_parquet(landing / "part-1.parquet")  # tz-aware nanoseconds
    naive = events.iloc[100:].assign(event_ts=events["event_ts"].iloc[100:].dt.tz_localize(None))
    naive.to_parquet(landing / "part-2.parquet")  # naive nanoseconds (taken as UTC)
    events.iloc[:0].to_parquet(landing / "part-0-empty.parquet")  # 0 rows: its string columns typed null
    (landing / "notes.parquet").write_text("not parquet: a stray file in the landing folder\n")

    applied = run("apply", "--repo", str(root), cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "user_transactions" in applied.stdout

    done = run(
        "backfill", "--repo", str(root), "--start", "2026-01-01", "--end", "2026-01-02", "--no-tracking", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"user_transactions: {len(events):,} events in" in done.stdout, done.stdout
    assert "1 unreadable_file" in done.stdout, done.stdout

    # The stray file is set aside with its reason; every good record was used (see the count above).
    quarantined = pd.read_parquet(next((root / "data" / "quarantine" / "user_transactions" / "records").iterdir()))
    assert len(quarantined) == 1, quarantined
    assert quarantined["source_file"].iloc[0].endswith("notes.parquet")
    assert quarantined["reason"].iloc[0].startswith("unreadable_file: "), quarantined["reason"].iloc[0]
    assert "not a Parquet file" in quarantined["reason"].iloc[0], quarantined["reason"].iloc[0]

    # Values through Feast, to the microsecond, against the reference.
    group = Repo.load(root).groups["user_transactions"]
    times = pd.date_range("2026-01-01 00:07", "2026-01-01 23:59", periods=9, tz="UTC")
    keys = sorted(events["user_id"].unique())
    lookups = [((k,), t) for k in keys for t in times]
    lookups.append(((events["user_id"].iloc[50],), events["event_ts"].iloc[50].ceil("us")))  # right at an event
    expected = reference_frame(events, group, lookups)
    entity_df = expected[["user_id"]].copy()
    entity_df["event_timestamp"] = expected["t"].to_numpy()
    from feast import FeatureStore

    refs = [f"user_transactions:{f.name}" for f in group.features]
    got = FeatureStore(repo_path=str(root)).get_historical_features(entity_df=entity_df, features=refs).to_df()
    got = got.sort_values(["user_id", "event_timestamp"]).reset_index(drop=True)
    expected = expected.sort_values(["user_id", "t"]).reset_index(drop=True)
    for feature in group.features:
        want = expected[feature.name].fillna(0).astype(float).to_numpy()
        have = got[feature.name].fillna(0).astype(float).to_numpy()
        np.testing.assert_allclose(have, want, rtol=1e-9, err_msg=feature.name)
