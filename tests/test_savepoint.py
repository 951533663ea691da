"""Savepoints (docs/streaming.md, "Savepoints"): a stream's state written to a folder, and a stream started from it
in a new checkpoint, with another definition and another number of buckets; after more events land, its offline
rows equal the batch engine's over all events, and nothing before the savepoint was read again."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import build_feast_repo
from test_batch_reference import BASE, H, make_events
from test_stream import arrival_order, assert_batch_engine_rows, land, offline_rows
from test_stream_upgrade import AFTER, BEFORE, assert_online_reference, define

from features.cli import main
from features.engine.query_log import committed_position
from features.errors import ConfigError
from features.pipelines.stream import savepoint, stream
from features.repo import Repo
from features.spec import WINDOW_END
from features.spec.fingerprint import describe


@pytest.mark.spark
def test_a_savepoint_starts_a_new_checkpoint_on_a_changed_definition_and_more_buckets(spark, tmp_path, capsys):
    events = make_events()
    cut = BASE + 16 * H
    first, rest = events[events["event_ts"] < cut], events[events["event_ts"] >= cut]
    root = tmp_path / "repo"
    land(root, arrival_order(first, pd.Timedelta(minutes=20), seed=1), 3)
    repo = define(root, BEFORE)
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    checkpoint = Path(repo.checkpoint_path(BEFORE, None))
    saved = json.loads((checkpoint / "features-definition.json").read_text())
    position = committed_position(checkpoint / "query")

    sp = tmp_path / "sp"
    capsys.readouterr()
    assert main(["savepoint", "--repo", str(root), "--group", BEFORE.name, "--to", str(sp)]) == 0  # this session
    out = capsys.readouterr().out
    assert f"{BEFORE.name}: savepoint of batch {position.batch}" in out and f"written to {sp}" in out
    assert f"features stream --repo {root} --group {BEFORE.name} --from-savepoint {sp}" in out
    manifest = json.loads((sp / "savepoint.json").read_text())
    assert manifest["format"] == savepoint.FORMAT and manifest["group"] == BEFORE.name
    assert manifest["watermark_us"] == position.watermark_us and manifest["batch"] == position.batch
    assert sorted(manifest["source"]["files"]) == sorted(p.name for p in (root / "data" / "transactions").iterdir())
    panes = pq.read_table(sp / "panes").to_pandas()  # plain Parquet rows: keys, pane, partials
    assert {"user_id", "fx_pane", "amount_max_4h.v"} <= set(panes.columns)
    assert (
        panes["user_id"].nunique() == manifest["keys"] == first["user_id"].nunique() and len(panes) == manifest["rows"]
    )
    with pytest.raises(ConfigError, match=r"--to: .* already holds files; name a new folder"):
        savepoint.take(spark, repo, BEFORE, str(sp))

    # Restored elsewhere (a new checkpoint root), on the changed definition, with twice the buckets.
    repo = define(root, AFTER)
    land(root, arrival_order(rest, pd.Timedelta(minutes=20), seed=2), 3, start_index=3)
    capsys.readouterr()
    other = str(tmp_path / "elsewhere")
    run = stream(
        repo,
        available_now=True,
        checkpoint_root=other,
        from_savepoint=str(sp),
        buckets=2 * saved["buckets"],
        progress=False,
        tracking=False,
    )
    run.await_termination()
    line = capsys.readouterr().err
    assert f"started from the savepoint {sp} (batch {position.batch}" in line
    assert f"--buckets {saved['buckets']} -> {2 * saved['buckets']}" in line
    assert "kept amount_sum_1h, status_last" in line and "built failed_4h, qty_sum_2h, n_lifetime" in line
    assert "dropped amount_max_4h" in line
    # Only the files landed after the savepoint were streamed: the three before it are in its position.
    assert sum(p.events for p in run.history if p.group == AFTER.name) == len(rest)

    rows = offline_rows(spark, repo, AFTER)
    changed_at = pd.Timestamp(position.watermark_us, unit="us", tz="UTC")
    after = rows[rows[WINDOW_END] > changed_at].reset_index(drop=True)
    assert_batch_engine_rows(spark, AFTER, after, events, rows[WINDOW_END].max(), since=changed_at)
    assert_online_reference(repo, AFTER, events, after["user_id"].unique(), [f.name for f in AFTER.features])
    restored = json.loads((Path(other) / AFTER.name / "features-definition.json").read_text())
    assert restored["buckets"] == 2 * saved["buckets"] and restored["upgrade"] is None  # every bucket took its state

    with pytest.raises(ConfigError, match=r"already holds stream state; a savepoint starts a new checkpoint"):
        stream(repo, checkpoint_root=other, from_savepoint=str(sp), progress=False, tracking=False)


def _savepoint(folder: Path, **changes) -> Path:
    folder.mkdir(parents=True)
    manifest = {"format": savepoint.FORMAT, "group": BEFORE.name, "definition": describe(BEFORE), **changes}
    (folder / "savepoint.json").write_text(json.dumps(manifest))
    return folder


def test_a_savepoint_that_cannot_start_the_group_says_why(tmp_path):
    repo = Repo.load(build_feast_repo(tmp_path / "repo", [BEFORE], apply=False))
    checkpoint = tmp_path / "checkpoint"
    cases = [
        (tmp_path / "nothing", r"is not a savepoint \(no savepoint.json in it\)"),
        (_savepoint(tmp_path / "newer", format=savepoint.FORMAT + 1), r"this version reads formats up to 1"),
        (_savepoint(tmp_path / "other", group="card_merchant"), r"not of 'user_changing'; pass --group card_merchant"),
    ]
    rekeyed = describe(BEFORE)
    rekeyed["entity"]["join_keys"] = ["card_id"]
    cases.append((_savepoint(tmp_path / "rekeyed", definition=rekeyed), r"keyed by card_id, and the group by user_id"))
    for path, message in cases:
        with pytest.raises(ConfigError, match=message):
            savepoint.restore(None, repo, BEFORE, checkpoint, None, str(path), None)
    (checkpoint).mkdir()
    (checkpoint / "features-definition.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"already holds stream state.*delete that folder"):
        savepoint.restore(None, repo, BEFORE, checkpoint, None, str(_savepoint(tmp_path / "good")), None)
    with pytest.raises(ConfigError, match=r"no stream state in .* to save.*features stream --repo"):
        savepoint.take(None, repo, BEFORE)
    with pytest.raises(ConfigError, match=r"a savepoint starts one group in a new checkpoint: name it with --group"):
        stream(repo, reset=True, from_savepoint=str(tmp_path / "good"), tracking=False)


def test_a_restore_that_stopped_midway_is_refused_until_run_again(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / savepoint.RESTORING).write_text("/backups/sp")
    with pytest.raises(ConfigError, match=r"being made from the savepoint /backups/sp.*--from-savepoint /backups/sp"):
        savepoint.check_restored(checkpoint, BEFORE)
    (checkpoint / savepoint.RESTORING).unlink()
    savepoint.check_restored(checkpoint, BEFORE)
