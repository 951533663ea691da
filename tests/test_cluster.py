"""The engines on `local-cluster[2,1,1024]`: executors in JVMs and Python workers of their own, as on a real
cluster, so that nothing relies on state only the driver has. A job of its own (a process, as a Databricks job
calls the Python API) runs a backfill of the example repo's mixed groups and a stream of the same groups there,
one after the other on one cluster; every row each writes is checked against the brute-force reference."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from reference import percentile_ok, reference_frame
from test_cli import EXAMPLE_REPO

from features.demo import generate_transactions, write_events
from features.pipelines.registration import apply
from features.repo import Repo
from features.spec import AggKind
from features.stores import offline

pytestmark = [pytest.mark.slow, pytest.mark.spark]
START = pd.Timestamp("2026-01-05", tz="UTC")


def _repo(root: Path, events: pd.DataFrame) -> Path:
    """A copy of the example repo with `events`, applied in this process (its `where` check parses in the tests'
    session, where a CLI call would start a JVM only for that)."""
    shutil.copytree(EXAMPLE_REPO, root, ignore=shutil.ignore_patterns("data", ".features", "__pycache__"))
    write_events(events, root / "data" / "transactions", n_files=2)
    apply(str(root))
    return root


def _check_rows(root: Path, events: pd.DataFrame, samples: int = 60) -> int:
    """A sample of each group's offline rows, each equal to the reference at its window end."""
    repo = Repo.load(root)
    checked = 0
    for group in repo.groups.values():
        rows = offline.read_pandas(repo.offline_path(group))
        assert len(rows) > 0, group.name
        picked = rows.sample(min(samples, len(rows)), random_state=1)
        pairs = [(tuple(r[k] for k in group.join_keys), r["window_end"]) for _, r in picked.iterrows()]
        want = reference_frame(events, group, pairs)
        for feat in group.features:
            for got, exact in zip(picked[feat.name], want[feat.name], strict=True):
                if isinstance(exact, list) or isinstance(got, list | np.ndarray):
                    assert list(got) == list(exact), feat.name
                elif feat.aggregation.kind is AggKind.APPROX_PERCENTILE and exact is not None:
                    assert percentile_ok(got, exact), feat.name
                elif isinstance(exact, float):
                    assert got == pytest.approx(exact, rel=1e-9), feat.name
                elif exact is None:
                    assert got is None or pd.isna(got), feat.name
                else:
                    assert got == exact, feat.name
                checked += 1
    return checked


# The job: the backfill of one repo, then the stream of the other, on the session FEATURES_SPARK_MASTER names.
JOB = """
import sys

from features.pipelines.backfill import backfill
from features.pipelines.stream import stream
from features.repo import Repo

batch, streamed, start, end = sys.argv[1:]
backfill(Repo.load(batch), start, end, progress=False)
run = stream(Repo.load(streamed), available_now=True, progress=False, tracking=False)
try:
    run.await_termination()
finally:
    run.stop()
"""


def test_backfill_and_stream_on_a_local_cluster(spark, tmp_path: Path) -> None:
    events = generate_transactions(4_000, 40, START.to_pydatetime(), 1.0, seed=5, late_fraction=0.0)
    batch, streamed = _repo(tmp_path / "batch", events), _repo(tmp_path / "stream", events)
    end = (START + pd.Timedelta(days=2)).date().isoformat()
    env = {**os.environ, "FEATURES_SPARK_MASTER": "local-cluster[2,1,1024]"}
    env.pop("SPARK_REMOTE", None)
    command = [sys.executable, "-c", JOB, str(batch), str(streamed), START.date().isoformat(), end]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for root in (batch, streamed):
        assert _check_rows(root, events) > 100, root.name
