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
