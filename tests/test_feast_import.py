"""Feast imported after `features` skips typeguard's instrumentation of its classes (features.feast_import), unless
FEATURES_FEAST_TYPECHECKS=1 or Feast was imported first. Each case runs in a fresh interpreter: Feast loads once
per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys, importlib.resources
{first}
import typeguard
from typeguard import _decorators
from feast import FeatureView
import feast
print(json.dumps({{
    "checked": "typeguard._functions" in FeatureView.__init__.__code__.co_names,
    "decorator_restored": typeguard.typechecked is _decorators.typechecked,
    "loader": type(feast.__spec__.loader).__name__,
    "resources": any(importlib.resources.files("feast").iterdir()),
}}))
"""


@pytest.mark.parametrize(
    ("first", "env", "checked"),
    [
        ("import features", {}, False),
        ("import features", {"FEATURES_FEAST_TYPECHECKS": "1"}, True),
        ("import feast\nimport features", {}, True),  # Feast imported first: left as it was
    ],
)
def test_feast_after_features_is_loaded_without_run_time_type_checks(first: str, env: dict, checked: bool) -> None:
    environment = {k: v for k, v in os.environ.items() if k != "FEATURES_FEAST_TYPECHECKS"} | env
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"checked": checked, "decorator_restored": True, "loader": "SourceFileLoader", "resources": True}


DUCKDB_PROBE = """
{first}
import feast.infra.offline_stores.duckdb as store
print(getattr(store._read_data_source, "__features_resolves_against_repo__", False),
      getattr(store._write_data_source, "__features_resolves_against_repo__", False),
      type(store.__spec__.loader).__name__)
"""


@pytest.mark.parametrize(
    "first",
    ["import features", "import feast.infra.offline_stores.duckdb\nimport features"],
    ids=["features-first", "duckdb-store-first"],
)
def test_feast_duckdb_store_resolves_relative_paths_against_the_repo(first: str) -> None:
    """Whichever is imported first, the DuckDB store reads a relative FileSource path against the store's repo
    (features.stores.feast_paths), and keeps its own loader."""
    done = subprocess.run(
        [sys.executable, "-c", DUCKDB_PROBE.format(first=first)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-3:] == ["True", "True", "SourceFileLoader"], done.stdout
