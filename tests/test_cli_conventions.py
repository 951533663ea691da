"""The command line's conventions (docs/commands.md): `--version`, `--repo` defaulting to the current folder,
`features status`, `features plan`, and `--log-level` / `--json` on the commands jobs run, with the exit
statuses unchanged."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from conftest import definitions_code
from groups import COUNT_1H, HOP, HOP_V1, TYPED_SOURCE, USER

from features import EventSource, Feature, FeatureGroup, Hop, agg
from features.cli import DEFAULT_REPO, build_parser, main, package_version
from features.demo import generate_transactions
from features.repo import Repo
from features.spec.fingerprint import definition_hash, feature_hashes
from features.stores.manifest import read_manifest, update

D1, D2, D3 = (date(2026, 3, d) for d in range(1, 4))
OTHER = FeatureGroup("other", USER, TYPED_SOURCE, [Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", "5m"))])
JOB_COMMANDS = ("apply", "backfill", "stream", "validate", "verify")


def events(days: int = 2, n: int = 600) -> object:
    return generate_transactions(n, 20, datetime(2026, 3, 1, tzinfo=UTC), days, seed=3)


def redefine(root: Path, groups: list[FeatureGroup]) -> None:
    """Replace the repo's definitions module, as a user editing it would (a new module name: sys.modules)."""
    for old in root.glob("test_definitions_*.py"):
        old.unlink()
    (root / f"test_definitions_{uuid.uuid4().hex[:12]}.py").write_text(definitions_code(groups))


def complete(root: Path, group: FeatureGroup, days: list[date], computed_with: FeatureGroup) -> None:
    """Record days as completed by a backfill of `computed_with` (the manifest, as the schedule writes it)."""
    table = Repo.load(root).offline_path(group)
    with update(table, group.name) as manifest:
        for day in days:
            manifest.record(day, definition_hash(computed_with), feature_hashes(computed_with), 10)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()  # what building the repo printed
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ---------------------------------------------------------------------------------------------------------
# --version, --repo, the job flags


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"features {package_version()}"
    assert package_version()[0].isdigit()


def test_repo_defaults_to_the_current_folder_when_it_holds_feature_store_yaml(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert build_parser().parse_args(["status"]).repo == DEFAULT_REPO
    (tmp_path / "feature_store.yaml").write_text("project: x\n")
    for command in ("apply", "plan", "status", "backfill", "serve"):
        assert build_parser().parse_args([command]).repo == "."
    assert build_parser().parse_args(["status", "--repo", "elsewhere"]).repo == "elsewhere"


def test_status_works_from_inside_the_repo_folder(feast_repo, monkeypatch, capsys) -> None:
    root = feast_repo([HOP], events())
    monkeypatch.chdir(root)
    status, out, err = run(capsys, "status")
    assert status == 0, err
    assert out.startswith("hop: no day completed")


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_jobs_take_log_level_and_json(command: str) -> None:
    args = build_parser().parse_args([command, "--log-level", "DEBUG", "--json"])
    assert (args.log_level, args.json) == ("debug", True)
    assert build_parser().parse_args([command]).log_level is None


def test_apply_json_is_one_line_of_the_applied_groups(feast_repo, capsys: pytest.CaptureFixture[str]) -> None:
    root = feast_repo([HOP], events(), apply=False)
    status, out, err = run(capsys, "apply", "--repo", str(root), "--json")
    assert status == 0, err
    assert out.startswith("{"), out
    assert json.loads(out) == {"applied": ["hop"]}  # stdout holds the JSON line alone


def test_a_bad_log_level_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["backfill", "--log-level", "loud", "--since-last"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--log-level: invalid choice: 'loud'" in err and "debug" in err and "error" in err


def test_log_level_with_a_missing_repo_fails_in_one_line_before_spark(tmp_path: Path, capsys) -> None:
    status, out, err = run(capsys, "verify", "--repo", str(tmp_path / "nowhere"), "--log-level", "info")
    assert status == 2 and out == ""
    assert err.startswith("error: --repo: ") and "no feature_store.yaml" in err


# ---------------------------------------------------------------------------------------------------------
# features status


def test_status_on_a_repo_with_nothing_run(feast_repo, capsys: pytest.CaptureFixture[str]) -> None:
    root = feast_repo([HOP], events())
    status, out, err = run(capsys, "status", "--repo", str(root))
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "hop: no day completed"
    assert "`features backfill --since-last` computes every day from the source's first" in out
    assert lines[-1].startswith("runs: no runs recorded yet") and "mlflow.db does not exist" in lines[-1]
    assert not (root / "data" / "mlflow.db").exists()  # status creates no tracking store

    status, out, _ = run(capsys, "status", "--repo", str(root), "--json")
    [group] = json.loads(out)["groups"]
    assert group["group"] == "hop" and group["completed"] == 0 and group["first"] is None
    assert group["stale"] == {} and group["set_aside"] == {} and group["stream"] is None and group["runs"] == []


def test_status_counts_completed_stale_and_set_aside_days(feast_repo, capsys: pytest.CaptureFixture[str]) -> None:
    root = feast_repo([HOP], events(days=5))  # data up to 03-05: the days up to 03-04 are complete
    complete(root, HOP, [D1], computed_with=HOP_V1)  # before amount_sum_1h was added
    complete(root, HOP, [D3], computed_with=HOP)
    with update(Repo.load(root).offline_path(HOP), "hop") as manifest:
        manifest.note_set_aside(D3, files=1, events=40, records=2)
    status, out, err = run(capsys, "status", "--repo", str(root), "--group", "hop")
    assert status == 0, err
    assert out.splitlines()[:2] == [
        "hop: 2 days completed (2026-03-01 .. 2026-03-03)",
        "  stale      2026-03-01 (definition changed: added feature 'amount_sum_1h')",
    ]
    # the gap, then every day after the last completed whose data is in
    assert "  to compute 2026-03-02, 2026-03-04 (not computed yet)" in out
    assert "  health     last event 2026-03-05 23:" in out and ", last backfill 20" in out
    assert "  waiting    the source ends 2026-03-05 23:" in out and "2026-03-05 is complete once" in out
    assert "  set aside  42 events on 2026-03-03" in out

    status, out, _ = run(capsys, "status", "--repo", str(root), "--json")
    [group] = json.loads(out)["groups"]
    assert (group["completed"], group["first"], group["last"]) == (2, "2026-03-01", "2026-03-03")
    assert group["stale"] == {"2026-03-01": "definition changed: added feature 'amount_sum_1h'"}
    assert group["to_compute"] == [["2026-03-02", "2026-03-02"], ["2026-03-04", "2026-03-04"]]
    assert group["last_complete"] == "2026-03-04" and group["newest_event"].startswith("2026-03-05T23:")
    assert group["set_aside"]["2026-03-03"]["files"] == 1 and group["set_aside"]["2026-03-03"]["records"] == 2


def test_status_of_an_unknown_group_is_a_usage_error(feast_repo, capsys: pytest.CaptureFixture[str]) -> None:
    root = feast_repo([HOP], events())
    status, out, err = run(capsys, "status", "--repo", str(root), "--group", "nope")
    assert status == 2 and out == ""
    assert err.startswith("error: --group: no feature group named 'nope'")


# ---------------------------------------------------------------------------------------------------------
# features plan


def test_plan_after_a_definition_change_shows_the_added_feature_and_the_stale_days(feast_repo, capsys) -> None:
    root = feast_repo([HOP_V1], events())
    status, out, err = run(capsys, "plan", "--repo", str(root))
    assert status == 0, err
    assert out.startswith("no changes: ")

    complete(root, HOP_V1, [D1, D2], computed_with=HOP_V1)
    redefine(root, [HOP, OTHER])
    manifest_before = read_manifest(Repo.load(root).offline_path(HOP), "hop")
    status, out, err = run(capsys, "plan", "--repo", str(root))
    assert status == 0, err
    lines = out.splitlines()
    assert "group changed: hop: added amount_sum_1h (against the offline table's manifest)" in lines
    assert "group added: other: added amount_max_1h" in lines
    assert (
        "stale: hop 2026-03-01..2026-03-02 (definition changed: added feature 'amount_sum_1h'); "
        "`features backfill --since-last` recomputes them"
    ) in lines
    assert any(line.startswith("feast update: feature view hop (") and "features" in line for line in lines)
    assert "feast create: feature view other" in lines

    status, out, _ = run(capsys, "plan", "--repo", str(root), "--json")
    the_plan = json.loads(out)  # stdout holds the JSON document alone (Feast's notes go to stderr)
    assert {(g["group"], g["change"]) for g in the_plan["groups"]} == {("hop", "changed"), ("other", "added")}
    assert [(s["day"], s["group"]) for s in the_plan["stale"]] == [("2026-03-01", "hop"), ("2026-03-02", "hop")]
    # Planning changed nothing: the registry still has the old view, the manifest its days.
    [view] = Repo.load(root).feature_store().list_feature_views(allow_cache=False)
    assert [f.name for f in view.features] == ["txn_count_1h"]
    assert read_manifest(Repo.load(root).offline_path(HOP), "hop") == manifest_before


def test_plan_compares_with_the_registry_before_any_backfill_and_names_removed_groups(feast_repo, capsys) -> None:
    root = feast_repo([HOP, OTHER], events())
    redefine(root, [HOP_V1])
    status, out, err = run(capsys, "plan", "--repo", str(root))
    assert status == 0, err
    lines = out.splitlines()
    assert "group changed: hop: removed amount_sum_1h (against the Feast registry)" in lines
    assert "group removed: other" in lines
    assert "feast delete: feature view other" in lines
    assert any("`features apply --prune` removes them" in line for line in lines)


def test_apply_and_plan_leave_out_feasts_project_note_and_nothing_else(feast_repo, capsys) -> None:
    root = feast_repo([HOP], events(), apply=False)
    status, out, err = run(capsys, "apply", "--repo", str(root))
    assert status == 0, err
    assert "Created feature view hop" in out  # Feast's own notes stay
    assert "No project found" not in out + err
    redefine(root, [HOP, OTHER])
    for json_flag in ([], ["--json"]):
        status, out, err = run(capsys, "plan", "--repo", str(root), *json_flag)
        assert status == 0, err
        assert "No project found" not in out + err


def test_the_project_note_is_left_out_whole_lines_only() -> None:
    from contextlib import redirect_stdout
    from io import StringIO

    from features.pipelines.registration import PROJECT_NOTE, without_project_note

    out, note = StringIO(), PROJECT_NOTE.format("p")
    with redirect_stdout(out), without_project_note("p"):
        print("before")
        print(note[:10], end="")  # a line written in parts
        print(note[10:] + "\nafter")
        print(PROJECT_NOTE.format("another project"))
        print(note + " and more")
        print("last, no newline", end="")
    other = PROJECT_NOTE.format("another project")
    assert out.getvalue() == f"before\nafter\n{other}\n{note} and more\nlast, no newline"


@pytest.mark.spark
def test_plan_refuses_a_where_apply_would_refuse_with_apply_s_error(spark, feast_repo, capsys) -> None:
    from features.pipelines.registration import WHERE_CHECKS

    root = feast_repo([HOP], events())
    good = Feature("big_count_1h", agg.count(), window=Hop("1h", every="5m"), where="amount > 100")
    redefine(root, [FeatureGroup("hop", USER, TYPED_SOURCE, [*HOP.features, good])])
    status, out, err = run(capsys, "plan", "--repo", str(root))
    assert status == 0, err
    assert "group changed: hop: added big_count_1h (against the Feast registry)" in out.splitlines()
    assert not (root / WHERE_CHECKS).exists()  # planning records nothing, the checks neither

    typo = Feature("big_count_1h", agg.count(), window=Hop("1h", every="5m"), where="amout > 100")
    redefine(root, [FeatureGroup("hop", USER, TYPED_SOURCE, [*HOP.features, typo])])
    status, out, planned = run(capsys, "plan", "--repo", str(root))
    assert status == 2 and out == ""
    assert planned.startswith("error: Feature('big_count_1h').where: Spark cannot use 'amout > 100': "), planned
    assert "`amout` cannot be resolved" in planned and "Fix: write a Spark SQL condition" in planned
    status, _, applied = run(capsys, "apply", "--repo", str(root))
    assert status == 2 and applied == planned


@pytest.mark.spark
def test_a_where_that_fails_on_every_row_is_refused_before_any_backfill(spark, feast_repo, capsys) -> None:
    """`amount = 'x'` on a double column parses and resolves, then fails at the first row under ANSI casts:
    plan and apply evaluate each `where` on a row of plain values and refuse it, naming the feature."""
    root = feast_repo([HOP], events())
    bad = Feature("odd_1h", agg.count(), window=Hop("1h", every="5m"), where="amount = 'x'")
    redefine(root, [FeatureGroup("hop", USER, TYPED_SOURCE, [*HOP.features, bad])])
    status, out, planned = run(capsys, "plan", "--repo", str(root))
    assert status == 2 and out == ""
    assert planned.startswith("error: Feature('odd_1h').where: Spark cannot evaluate \"amount = 'x'\": "), planned
    assert "[CAST_INVALID_INPUT]" in planned and "Fix: compare each column with a value of its type" in planned
    assert len(planned.strip().splitlines()) == 1
    status, _, applied = run(capsys, "apply", "--repo", str(root))
    assert status == 2 and applied == planned
    # A division by the column is fine on real data that holds no zero: no false alarm.
    fine = Feature("odd_1h", agg.count(), window=Hop("1h", every="5m"), where="1000 / amount > 2")
    redefine(root, [FeatureGroup("hop", USER, TYPED_SOURCE, [*HOP.features, fine])])
    status, _, err = run(capsys, "apply", "--repo", str(root))
    assert status == 0, err


@pytest.mark.spark
def test_plan_checks_a_where_against_the_schema_apply_would_record(spark, feast_repo, capsys) -> None:
    """A source that declares no schema: apply infers it from all the files and records it before it checks the
    `where`s, so a column that only newer files have is known to the check; plan infers it alike."""
    from features.pipelines.registration import WHERE_CHECKS

    inferred = EventSource("transactions", path="data/transactions", timestamp="event_ts", watermark="10m")
    root = feast_repo([FeatureGroup("hop", USER, inferred, [COUNT_1H])], events())
    newer = events(days=1, n=40).assign(country="FR")
    newer.to_parquet(root / "data" / "transactions" / "part-99999.parquet")
    by_country = Feature("fr_count_1h", agg.count(), window=Hop("1h", every="5m"), where="country = 'FR'")
    redefine(root, [FeatureGroup("hop", USER, inferred, [COUNT_1H, by_country])])
    status, out, err = run(capsys, "plan", "--repo", str(root))
    assert status == 0, err
    assert "group changed: hop: added fr_count_1h (against the Feast registry)" in out.splitlines()
    status, _, err = run(capsys, "apply", "--repo", str(root))
    assert status == 0, err
    assert (root / WHERE_CHECKS).exists()


# ---------------------------------------------------------------------------------------------------------
# --json of the jobs without Spark: a dry run


def test_backfill_json_dry_run_prints_json_lines_and_the_plan_on_stderr(feast_repo, capsys) -> None:
    root = feast_repo([HOP], events())
    status, out, err = run(
        capsys, "backfill", "--repo", str(root), "--start", "2026-03-01", "--end", "2026-03-02", "--dry-run", "--json"
    )
    assert status == 0, err
    [line] = out.splitlines()
    days = {"2026-03-01": "the requested range"}
    assert json.loads(line) == {"group": "hop", "dry_run": True, "days": days, "notes": []}
    assert "backfill --start 2026-03-01T00:00:00+00:00" in err


def test_backfill_json_keeps_the_exit_status_of_a_usage_error(feast_repo, capsys) -> None:
    root = feast_repo([HOP], events())
    status, out, err = run(capsys, "backfill", "--repo", str(root), "--json", "--start", "2026-03-02", "--end", "2026")
    assert status == 2 and out == ""
    assert err.startswith("error: ")


# ---------------------------------------------------------------------------------------------------------
# Spark: the jobs' --json, and what status reports after them


@pytest.mark.spark
def test_jobs_json_then_status_shows_days_runs_and_the_stream(spark, feast_repo, capsys) -> None:
    root = feast_repo([HOP], events(days=2))
    args = ["--repo", str(root), "--log-level", "warning", "--json"]
    status, out, err = run(capsys, "backfill", *args, "--date", "2026-03-01", "--no-online")
    assert status == 0, err
    [result] = [json.loads(line) for line in out.splitlines()]
    assert result["group"] == "hop" and result["start"] == "2026-03-01T00:00:00+00:00"
    assert result["rows_in"] > 0 and result["rows_out"] > 0 and "timings" in result
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager
    assert str(log4j.getRootLogger().getLevel().toString()) == "WARN"  # --log-level reached Spark

    status, out, err = run(capsys, "stream", *args, "--available-now", "--no-online")
    assert status == 0, err
    [progress] = [json.loads(line) for line in out.splitlines()]
    assert progress["group"] == "hop" and progress["rows_total"] > 0 and progress["watermark"] is not None

    status, out, err = run(capsys, "verify", *args, "--sample", "3")
    assert status in (0, 1), err
    [report] = [json.loads(line) for line in out.splitlines()]
    assert report["group"] == "hop" and {t["check"] for t in report["tallies"]} == {"online", "offline"}

    status, out, err = run(capsys, "status", "--repo", str(root), "--json")
    assert status == 0, err
    [group] = json.loads(out)["groups"]
    assert (group["completed"], group["first"]) == (1, "2026-03-01")
    stream = group["stream"]
    assert stream["watermark"] is not None and stream["newest_event"] is not None
    assert stream["lag_seconds"] is not None and stream["lag_seconds"] >= 0
    assert stream["streamed_by"] is None  # the stream has ended
    health = group["health"]
    assert health["stream"] == "stopped" and health["last_batch"] == stream["last_batch"] >= 0
    assert health["lag_seconds"] == stream["lag_seconds"] and health["last_event"] == stream["newest_event"]
    assert health["last_backfill"] is not None
    assert [r["kind"] for r in group["runs"]][:3] == ["verify", "stream", "backfill"]
    assert all(r["status"] == "FINISHED" and r["seconds"] >= 0 for r in group["runs"])
    status, out, _ = run(capsys, "status", "--repo", str(root))
    assert "  stream     watermark 2026-03-0" in out and "behind the newest event" in out
    assert f"stream stopped (no process streams it), last batch {stream['last_batch']} at 20" in out
    assert "; no process streams it now" in out
    assert "  run        backfill FINISHED" in out
