"""The `features` command line, end to end, as a user runs it: a subprocess on a fresh copy of the example repo.

The demo runs the whole loop (generate, apply, backfill, read back from Feast). Mistakes a user can make
print one line that says what is wrong and how to fix it, and exit non-zero without a traceback.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from features.cli import main
from features.demo import generate_transactions, write_events

EXAMPLE_REPO = Path(__file__).resolve().parents[1] / "feature_repo"
USER_FEATURES = ["failed_count_24h", "amount_sum_1h", "amount_max_24h", "merchants_24h", "txn_count_lifetime"]
GROUPS = ["user_transactions", "card_activity", "card_merchant"]


def features_command() -> list[str]:
    """The installed `features` entry point next to this interpreter, else the module."""
    script = Path(sys.executable).with_name("features")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "features.cli"]


def run(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*features_command(), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the example repo as it is in a clean checkout: definitions and configuration, no data."""
    copy = tmp_path / "feature_repo"
    shutil.copytree(
        EXAMPLE_REPO, copy, ignore=shutil.ignore_patterns("data", ".features", "__pycache__", ".ipynb_checkpoints")
    )
    return copy


def table_after(stdout: str, marker: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the table printed after the line containing `marker` (up to a blank line)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    body = lines[start + 1 :]
    body = [line for line in body if not line.lstrip().startswith("each row:")]
    table = []
    for line in body:
        if not line.strip():
            break
        table.append(line)
    header, *rows = table
    return header.split(), [row.split() for row in rows]


def offline_dates(repo: Path, group: str) -> list[str]:
    from features.stores.offline import rows_by_date

    return [f"date={day.isoformat()}" for day in rows_by_date(str(repo / "data" / "offline" / group))]


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


# --- the demo --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_runs_end_to_end_and_again(repo: Path, tmp_path: Path, spark, capsys, monkeypatch):
    result = run("demo", "--repo", str(repo), "--events", "6000", "--users", "200", "--days", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    out = result.stdout

    # Every step reports, and each group's backfill summary is printed.
    for step in range(1, 6):
        assert f"[{step}/5]" in out, out
    for group in GROUPS:
        assert f"{group}: 6,000 events in" in out, out

    # Online values of 5 users, with every feature of the user_transactions view.
    header, rows = table_after(out, "get_online_features")
    assert header == ["user_id", *USER_FEATURES]
    assert len(rows) == 5 and all(row[0].startswith("u") and len(row) == len(header) for row in rows), rows

    # A point-in-time training set of about 10 labelled transactions, both labels present.
    header, rows = table_after(out, "get_historical_features")
    assert header == ["user_id", "event_timestamp", "is_fraud", *USER_FEATURES]
    assert 5 <= len(rows) <= 10, rows
    labels = {row[3] for row in rows}  # event_timestamp prints as two words: date and time
    assert labels == {"0", "1"}, rows

    # The data landed where docs/operations.md says: source files, and the offline table partitioned by date.
    assert len(list((repo / "data" / "transactions").glob("*.parquet"))) > 1
    for group in GROUPS:
        assert offline_dates(repo, group) == ["date=2026-01-01", "date=2026-01-02"]
    assert (repo / "data" / "online_store.db").is_file()

    # Re-runnable: a second, smaller run regenerates the data and replaces every earlier result. In this process
    # (the same `main` the command runs), which spares a second cold start.
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["demo", "--repo", str(repo), "--events", "3000", "--users", "50", "--days", "1"]) == 0
    again = capsys.readouterr().out
    assert "user_transactions: 3,000 events in" in again, again
    for group in GROUPS:
        assert offline_dates(repo, group) == ["date=2026-01-01"]
    _, rows = table_after(again, "get_online_features")
    assert len(rows) == 5 and all(int(row[0][1:]) < 50 for row in rows), rows  # only this run's users


# --- mistakes a user can make ----------------------------------------------------------------------------------


BACKFILL_DAY = ["--start", "2026-01-01", "--end", "2026-01-02"]


@pytest.mark.parametrize(
    "args",
    [["apply"], ["backfill", *BACKFILL_DAY], ["demo", "--events", "100"]],
    ids=["apply", "backfill", "demo"],
)
def test_missing_repo_folder(args, tmp_path: Path):
    missing = tmp_path / "no_such_repo"
    result = run(*args[:1], "--repo", str(missing), *args[1:], cwd=tmp_path)
    assert_one_line_error(result, "--repo", str(missing), "feature_store.yaml")
    assert not missing.exists()  # nothing was created on the way


def test_folder_without_feature_store_yaml(tmp_path: Path):
    folder = tmp_path / "just_a_folder"
    folder.mkdir()
    (folder / "fraud.py").write_text("x = 1\n")
    result = run("apply", "--repo", str(folder), cwd=tmp_path)
    assert_one_line_error(result, "--repo", "no feature_store.yaml", "point --repo at a Feast feature repository")


def test_default_repo_is_feature_repo_in_the_working_directory(tmp_path: Path):
    result = run("backfill", *BACKFILL_DAY, cwd=tmp_path)
    assert_one_line_error(result, str(tmp_path / "feature_repo"), "feature_store.yaml")


def test_unknown_group(repo: Path, tmp_path: Path):
    result = run("backfill", "--repo", str(repo), *BACKFILL_DAY, "--group", "user_transactoins", cwd=tmp_path)
    assert_one_line_error(result, "--group", "'user_transactoins'", "card_merchant, user_transactions")


def test_start_after_end(repo: Path, tmp_path: Path):
    result = run("backfill", "--repo", str(repo), "--start", "2026-01-02", "--end", "2026-01-01", cwd=tmp_path)
    assert_one_line_error(result, "--start", "is not before --end", "swap them")


def test_start_equal_to_end(repo: Path, tmp_path: Path):
    result = run(
        "backfill", "--repo", str(repo), "--start", "2026-01-01T06:00", "--end", "2026-01-01T06:00", cwd=tmp_path
    )
    assert_one_line_error(
        result, "--start and --end are both 2026-01-01T06:00:00+00:00", "is empty", "give an --end after"
    )
    assert "swap" not in result.stderr


BROKEN_CONFIGS = {
    "bad_yaml": ("project: [fraud\n", ["not valid YAML at line", "Fix: correct the YAML"]),
    "a_list": ("- project: fraud\n", ["the file is a list, not a mapping of settings"]),
    "no_project": ("provider: local\n", ["project: missing", "add a line `project: <name>`"]),
    "unknown_store": (
        "project: fraud\nonline_store:\n  type: cassandra_x\n",
        ["online_store.type: 'cassandra_x' is not an online store", "type: sqlite", "type: redis"],
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_CONFIGS))
def test_broken_feature_store_yaml(repo: Path, tmp_path: Path, case: str):
    text, needles = BROKEN_CONFIGS[case]
    (repo / "feature_store.yaml").write_text(text)
    result = run("apply", "--repo", str(repo), cwd=tmp_path)
    assert_one_line_error(result, str(repo / "feature_store.yaml"), *needles)
    assert result.returncode == 2  # a configuration error, not a data failure (1)


def test_unexpected_crash_exits_3_with_an_error_line(repo: Path, tmp_path: Path):
    (repo / "data").mkdir()
    (repo / "data" / "registry.db").write_bytes(b"\xff not a Feast registry \x00" * 8)  # a bug's stand-in
    result = run("apply", "--repo", str(repo), cwd=tmp_path)
    assert result.returncode == 3, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: features apply failed unexpectedly: "), last


def test_definitions_module_that_fails_to_import(repo: Path, tmp_path: Path):
    (repo / "broken.py").write_text("x = 1\ny = 1 / 0\n")
    result = run("apply", "--repo", str(repo), cwd=tmp_path)
    assert_one_line_error(result, "broken.py, line 2: ZeroDivisionError: division by zero")
    assert result.returncode == 2


@pytest.mark.parametrize(
    ("option", "value"),
    [("--start", "yesterday"), ("--end", "2026-13-01"), ("--start", "01/02/2026")],
)
def test_bad_iso_time(repo: Path, tmp_path: Path, option: str, value: str):
    times = {"--start": "2026-01-01", "--end": "2026-01-02", option: value}
    result = run("backfill", "--repo", str(repo), "--start", times["--start"], "--end", times["--end"], cwd=tmp_path)
    assert_one_line_error(result, option, repr(value), "ISO-8601", "2026-01-31")


@pytest.mark.parametrize(("option", "value"), [("--events", "0"), ("--users", "0"), ("--days", "0"), ("--days", "-1")])
def test_demo_sizes(repo: Path, tmp_path: Path, option: str, value: str):
    sizes = {"--events": "100", "--users": "10", "--days": "1", option: value}
    args = [item for pair in sizes.items() for item in pair]
    result = run("demo", "--repo", str(repo), *args, cwd=tmp_path)
    assert_one_line_error(result, option, value)
    assert not (repo / "data").exists()  # refused before touching the repo


@pytest.mark.slow
def test_backfill_before_apply(repo: Path, tmp_path: Path):
    events = generate_transactions(2_000, 50, "2026-01-01", 1, seed=3)
    write_events(events, repo / "data" / "transactions", n_files=2)
    result = run("backfill", "--repo", str(repo), *BACKFILL_DAY, "--group", "user_transactions", cwd=tmp_path)
    assert_one_line_error(result, "features apply --repo")
