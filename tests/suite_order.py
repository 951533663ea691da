"""The order in which `./dev test`'s two processes (pytest-xdist, `--dist loadfile`) take the test files.

xdist hands out whole files, those with the most tests first. The files that take longest hold few tests (one
soak, one README run), so they came last, and a run ended with one process on a long file while the other had
nothing left to do. Here the files go longest first, by their seconds in a recorded whole run (file_seconds.json:
`./dev test --record-file-seconds` writes it again), so that a run ends on short files, both processes busy until
then. A file the record lacks (a new one) takes the median of the recorded files' seconds.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().with_name("file_seconds.json")


def recorded() -> dict[str, float]:
    """Each test file's seconds (its tests' setup, call and teardown) in the recorded run, by file name."""
    return json.loads(RECORD.read_text(encoding="utf-8")) if RECORD.is_file() else {}


def longest_first(items: Sequence[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """`items` with the files that take longest first; each file's tests stay together and in their order (a
    stable sort, and a file's tests are collected together)."""
    unknown = statistics.median(seconds.values()) if seconds else 0.0
    return sorted(items, key=lambda item: -seconds.get(item.path.name, unknown))


def record(reports: Iterable[pytest.TestReport], existing: Iterable[str]) -> None:
    """Write to RECORD the seconds of each file the reports are of, keeping the recorded seconds of the files
    in `existing` (file names) that this run did not run."""
    seconds: Counter[str] = Counter()
    for report in reports:
        seconds[Path(report.nodeid.split("::")[0]).name] += report.duration
    kept = {name: s for name, s in recorded().items() if name in set(existing) and name not in seconds}
    merged = {**kept, **{name: round(s, 1) for name, s in seconds.items()}}
    ordered = dict(sorted(merged.items(), key=lambda item: -item[1]))
    RECORD.write_text(json.dumps(ordered, indent=0) + "\n", encoding="utf-8")
