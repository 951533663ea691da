"""Keep each benchmark's latest output as one `## <title>` section of bench/RESULTS.md."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = (
    "# Benchmark results\n\nThe latest output of each benchmark under `bench/`. "
    "Only ratios measured within one run compare: the machines are shared and noisy.\n"
)


def update_section(title: str, body: str) -> None:
    """Replace (or append) the section `## title` with `body` and the time and commit it was measured at,
    leaving the other sections as they are."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    section = f"## {title}\n\n{body.strip()}\n\n{stamp()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    RESULTS.write_text(text.rstrip() + "\n")


def load() -> str:
    """The machine's load average, to print beside timings taken on a shared machine."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1/5/15 min)"


def stamp() -> str:
    """When and at which commit a section was measured (with a note when the checkout had changes)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=RESULTS.parent, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"_Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit {commit}{changed}._"
