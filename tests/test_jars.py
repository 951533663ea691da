"""The Java packages a local session adds (features.engine.jars): taken from the cache folder when there, fetched
by Spark's own resolver otherwise, and a fetch that fails says what is missing and how to provide it."""

from __future__ import annotations

from pathlib import Path

import pytest

from features.engine import jars
from features.errors import EnvironmentProblem


def test_a_spark_without_listed_packages_names_the_fix() -> None:
    with pytest.raises(EnvironmentProblem, match=r"Spark 9\.9 .*pip install 'windowed-features\[local\]'"):
        jars.packages_for((9, 9))


def test_jars_in_the_folder_are_used_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jars.ENV, str(tmp_path))
    (tmp_path / "jars").mkdir()
    for package in jars.PACKAGES[(4, 2)]:
        (tmp_path / "jars" / package.file_name).write_bytes(b"PK")
    assert jars.class_path((4, 2)) == [tmp_path / "jars" / p.file_name for p in jars.PACKAGES[(4, 2)]]
    assert sorted(p.name for p in (tmp_path / "jars").iterdir()) == sorted(p.file_name for p in jars.PACKAGES[(4, 2)])


@pytest.mark.spark  # starts a JVM of its own (Spark's resolver), beside the shared session's
def test_a_package_the_resolver_cannot_find_is_an_error_with_the_fix(tmp_path: Path) -> None:
    missing = jars.Package("io.delta", "no-such-artifact_2.13", "0.0.1")
    with pytest.raises(EnvironmentProblem) as info:
        jars.fetch((missing,), tmp_path)
    message = str(info.value)
    assert "io.delta:no-such-artifact_2.13:0.0.1" in message and jars.ENV in message
    assert "Maven Central" in message and "not found" in message.lower()
