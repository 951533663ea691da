"""The order of the test files under pytest-xdist (tests/suite_order.py): the longest files first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from suite_order import LONGEST, longest_first

TESTS = Path(__file__).resolve().parent


def test_every_file_named_longest_is_a_test_file() -> None:
    assert len(set(LONGEST)) == len(LONGEST)
    assert [name for name in LONGEST if not (TESTS / name).is_file()] == []


def test_the_longest_files_go_first_then_the_files_with_most_tests() -> None:
    def item(name: str, test: str) -> SimpleNamespace:
        return SimpleNamespace(path=TESTS / name, name=test)

    items = [
        item("test_a.py", "one"),
        item("test_b.py", "one"),
        item("test_b.py", "two"),
        item(LONGEST[1], "one"),
        item(LONGEST[0], "one"),
        item(LONGEST[1], "two"),
    ]
    ordered = [(i.path.name, i.name) for i in longest_first(items)]  # type: ignore[arg-type]
    assert ordered == [
        (LONGEST[0], "one"),
        (LONGEST[1], "one"),
        (LONGEST[1], "two"),
        ("test_b.py", "one"),
        ("test_b.py", "two"),
        ("test_a.py", "one"),
    ]
