"""What a cold command pays before its work: loading a repo imports none of Feast, MLflow or Great Expectations
(seconds each), and a module's `to_feast` exports, deferred while `Repo.load` imports it, become the very
objects `to_feast` makes once used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLE_REPO

from features import to_feast
from features.repo import DeferredExport, Repo

HEAVY = ("feast", "mlflow", "great_expectations", "pyspark")


def test_loading_a_repo_with_exports_imports_no_heavy_library() -> None:
    code = (
        "import json, sys\n"
        "from features.repo import Repo\n"
        f"repo = Repo.load({str(EXAMPLE_REPO)!r})\n"
        f"print(json.dumps({{'groups': sorted(repo.groups), 'loaded': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.splitlines()[-1])
    assert out == {"groups": ["card_activity", "card_merchant", "user_transactions"], "loaded": []}


def test_a_deferred_export_becomes_the_object_to_feast_makes() -> None:
    sys.modules.pop("fraud", None)  # imported afresh by Repo.load, whatever an earlier test did
    repo = Repo.load(EXAMPLE_REPO)
    module = sys.modules["fraud"]
    assert isinstance(module.user_transactions_view, DeferredExport)
    made = to_feast(repo.groups["user_transactions"], repo_root=Path(module.__file__).parent)
    assert module.user_transactions_view.name == made[-1].name == "user_transactions"
    assert module.user_transactions_view.features == made[-1].features
    assert module.user_transactions_source.path == made[-2].path
    assert module.user_entity.join_key == made[0].join_key == "user_id"
