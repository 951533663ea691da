"""Module paths of earlier versions (before the layers) still import, as the module at the new path, with a
DeprecationWarning naming it (features.compat); no Spark."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

from features.compat import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_module_at_its_new_one(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is now {MOVED[old]}: import it from there"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_what_an_earlier_version_pickled_loads() -> None:
    """An object pickled where its class lived at an old path (a logged model, say) loads."""
    from features.stores.manifest import Manifest

    # Protocol 0 names a class by its module's path as text, without lengths to adjust.
    data = pickle.dumps(Manifest("g"), protocol=0).replace(b"features.stores.manifest", b"features.manifest")
    assert b"features.manifest\n" in data
    sys.modules.pop("features.manifest", None)
    with pytest.warns(DeprecationWarning):
        assert pickle.loads(data) == Manifest("g")


def test_old_imports_in_a_fresh_process() -> None:
    code = "from features.backfill import backfill; from features.offline import read_table; print('ok')"
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:__main__", "-c", code],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode != 0 and "features.backfill is now features.pipelines.backfill" in done.stderr
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
