"""The order of the test files under pytest-xdist (tests/suite_order.py): the longest files first, by the seconds
of a recorded run; a file the record lacks takes the median."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import suite_order

TESTS = Path(__file__).resolve().parent


def item(name: str, test: str = "t") -> SimpleNamespace:
    return SimpleNamespace(path=TESTS / name, name=test, nodeid=f"tests/{name}::{test}", duration=0.0)


def test_the_longest_files_go_first_each_one_s_tests_together_and_in_their_order() -> None:
    seconds = {"a.py": 10.0, "b.py": 300.0, "c.py": 5.0, "d.py": 40.0}  # median 25: new.py between d and a
    items = [item("a.py"), item("new.py"), item("b.py", "one"), item("c.py"), item("d.py"), item("b.py", "two")]
    items = sorted(items, key=lambda i: i.path.name)  # pytest collects a file's tests together
    ordered = [(i.path.name, i.name) for i in suite_order.longest_first(items, seconds)]  # type: ignore[arg-type]
    assert ordered == [("b.py", "one"), ("b.py", "two"), ("d.py", "t"), ("new.py", "t"), ("a.py", "t"), ("c.py", "t")]


def test_a_record_sums_each_file_s_reports_and_keeps_the_files_not_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(suite_order, "RECORD", tmp_path / "file_seconds.json")
    suite_order.RECORD.write_text('{"kept.py": 7.0, "gone.py": 9.0, "ran.py": 99.0}')
    reports = [item("ran.py"), item("ran.py"), item("other.py")]
    for report, seconds in zip(reports, (1.25, 2.0, 30.0), strict=True):
        report.duration = seconds
    suite_order.record(reports, ["kept.py", "ran.py", "other.py"])  # type: ignore[arg-type]
    assert suite_order.recorded() == {"other.py": 30.0, "kept.py": 7.0, "ran.py": 3.2}
    assert list(suite_order.recorded()) == ["other.py", "kept.py", "ran.py"]  # longest first, for a reader
