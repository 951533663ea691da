"""The README as a new user follows it, in order, in a copy of the checkout: its first command (`./dev demo`)
prints what the README says it prints, and its "Reading features" example then reads that demo's features with
Feast's own API. (Its second command is the test suite itself; its definitions are the newcomer test's.)"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FEAST_NOTE = "Created "
ELIDED = re.compile(r"(\b\d+\.\ds\b|\[\.\.\.\))")  # a step's seconds (they differ from run to run), or "[...)"


def readme_block(after: str, language: str) -> str:
    """The first `language` code block after the text `after` in the README."""
    section = README.split(after, 1)[1]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match is not None, f"the README lost its {language} block after {after!r}"
    return match.group(1)


def checkout_copy(into: Path) -> Path:
    """The checkout's files as a clone has them, sharing this checkout's .venv (its install stamp matches, so
    ./dev installs nothing)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True)
    for name in listed.stdout.splitlines():
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    (into / ".venv").symlink_to(ROOT / ".venv")
    return into


def install_is_current() -> bool:
    """Whether ./dev would install nothing: this checkout's .venv holds the package for this pyproject.toml."""
    stamp = ROOT / ".venv" / ".features-install-stamp"
    wanted = f"{hashlib.sha256((ROOT / 'pyproject.toml').read_bytes()).hexdigest()} {platform.python_version()}"
    return stamp.is_file() and stamp.read_text().strip() == wanted and Path(sys.prefix) == (ROOT / ".venv").resolve()


def line_pattern(line: str) -> re.Pattern[str]:
    """A README output line as a pattern: its seconds any seconds, "[...)" any rest of a range."""
    parts = ELIDED.split(line.rstrip())  # the text, then each elided part and the text after it
    regex = "".join(
        re.escape(part) if i % 2 == 0 else (".*" if part == "[...)" else r"\d+\.\ds") for i, part in enumerate(parts)
    )
    return re.compile(regex)


def matches_expected(shown: str, printed: str) -> list[str]:
    """The README's lines that the printed output lacks. The README abbreviates: every line it shows is printed,
    in its order, with others between them (a line "..." says so where it matters); "[...)" stands for the rest
    of a range, and seconds may differ. Feast's "Created ..." lines come in an order of Feast's own (a set's), so
    a run of them matches in any order."""
    actual = [line.rstrip() for line in printed.splitlines()]
    runs: list[list[str]] = []
    for line in shown.splitlines():
        if line.strip() == "...":
            continue
        if runs and line.startswith(FEAST_NOTE) and runs[-1][0].startswith(FEAST_NOTE):
            runs[-1].append(line)
        else:
            runs.append([line])
    missing, at = [], 0
    for run in runs:
        found = []
        for line in run:
            pattern = line_pattern(line)
            index = next((i for i in range(at, len(actual)) if pattern.fullmatch(actual[i])), None)
            if index is None:
                missing.append(line)
            else:
                found.append(index)
        at = max(found, default=at - 1) + 1
    return missing


@pytest.mark.slow
def test_the_readme_in_order(tmp_path: Path):
    if not install_is_current():
        pytest.skip("runs under ./dev test (it needs this checkout's .venv as ./dev made it)")
    copy = checkout_copy(tmp_path / "checkout")
    commands = readme_block("## Quickstart", "bash").splitlines()
    assert commands[0].split("#")[0].split() == ["./dev", "demo"], commands
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYSPARK_", "SPARK_"))}
    done = subprocess.run(
        ["./dev", "demo"], cwd=copy, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    expected = readme_block("prints (abbreviated):", "text")
    missing = matches_expected(expected, done.stdout)
    assert not missing, "README lines not printed:\n" + "\n".join(missing) + "\n\nprinted:\n" + done.stdout

    # The nightly command the demo points to next finds nothing to do: the demo's backfill recorded its days, and
    # the days after its data wait for data instead of being computed empty.
    features = str(copy / ".venv" / "bin" / "features")
    nightly = subprocess.run(
        [features, "backfill", "--repo", "feature_repo", "--since-last", "--dry-run"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert nightly.returncode == 0, nightly.stdout + nightly.stderr
    assert "backfill --since-last: 0 partitions to compute, up to 2026-01-02" in nightly.stdout, nightly.stdout
    assert "user_transactions: waiting for data: the source ends 2026-01-03 23:59 UTC" in nightly.stdout
    shown = subprocess.run(
        [features, "status", "--repo", "feature_repo"], cwd=copy, env=env, capture_output=True, text=True, check=False
    )
    assert "user_transactions: 2 days completed (2026-01-01 .. 2026-01-02)" in shown.stdout, shown.stdout + shown.stderr

    # "Reading features", as printed, from the folder the README's commands run in.
    reading = readme_block("## Reading features", "python")
    script = reading + "\nprint(len(online), len(training), int(online['failed_count_24h'].notna().sum()))\n"
    read = subprocess.run(
        [sys.executable, "-c", script], cwd=copy, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert read.returncode == 0, read.stderr[-3000:]
    assert read.stdout.split()[-3:] == ["2", "2", "2"], read.stdout
