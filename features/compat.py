"""Module paths from before the package was split into layers (features/stores, quality, ml, pipelines; see
docs/internals.md): importing one still works, and warns with the path to use instead, so that notebooks and
jobs written for an earlier version, and models pickled by one, keep loading after an upgrade."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

_LAYERS = {
    "stores": (
        "offline compaction manifest online online_config feast_codec feast_objects feature_refs serving "
        "serving_requests"
    ),
    "quality": "checks screen",
    "pipelines": ("backfill stream schedule stale verify retention rollup registration status"),
    "ml": "training lineage model tracking",
    "kernel": "panes",
}
MOVED = {f"features.{name}": f"features.{layer}.{name}" for layer, names in _LAYERS.items() for name in names.split()}
# Renamed since: the stream's stages are one package, and names are unique across the package.
MOVED["features.stream_sink"] = "features.pipelines.stream.sink"
MOVED["features.plan"] = "features.pipelines.apply_plan"


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and hands out the module at its new one (the same module object, not a copy)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} is now {new}: import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path is already executed."""


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
