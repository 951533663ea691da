"""The order in which `./dev test`'s two processes (pytest-xdist, `--dist loadfile`) take the test files.

xdist hands out whole files, those with the most tests first. The files that take longest hold few tests (one
soak, one README run), so they came last, and a run ended with one process on a long file while the other had
nothing left to do. Here the files that took longest in a whole run go first, longest first, and the rest after
them, those with the most tests first as before: the run ends on short files, both processes busy until then.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

# Longest first, by the sum of their tests' seconds in a whole `./dev test` (pytest --durations=0). A file left
# out only goes back to xdist's own order; test_suite_order.py checks that each one named here still exists.
# test_connect.py stands for the Spark Connect files, one unit of work (tests/conftest.py).
LONGEST = (
    "test_stream_upgrade.py",
    "test_stream.py",
    "test_connect.py",
    "test_soak.py",
    "test_offline_table.py",
    "test_quiet_output.py",
    "test_cli.py",
    "test_deployment.py",
    "test_notebooks.py",
    "test_newcomer.py",
    "test_stream_kafka.py",
    "test_schedule.py",
    "test_readme.py",
    "test_source_schema.py",
    "test_demo_kafka.py",
    "test_cluster.py",
    "test_stream_kafka_upgrade.py",
)


def longest_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """`items` with the files in LONGEST first, in its order, then the other files, most tests first; each file's
    tests stay together and in their order (a stable sort)."""
    tests = Counter(item.path.name for item in items)
    rank = {name: i for i, name in enumerate(LONGEST)}
    return sorted(items, key=lambda item: (rank.get(item.path.name, len(LONGEST)), -tests[item.path.name]))
