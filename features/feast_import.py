"""Feast, imported without typeguard's instrumentation of its classes.

Feast decorates some 40 of its modules' classes with typeguard's `@typechecked`, which at import time parses
each class's source, rewrites it to check every argument's type at run time and compiles it again: 3 of the 4.3 s
that `import feast` took (1.3 s without it, measured on 2 cores). Every command that writes or reads a Feast store
(`features apply`, `demo`, serving) paid it. This package calls Feast with objects it builds itself, whose types the
tests check; a wrong argument then fails where Feast uses it instead of at the call.

`install()` (called by `import features`) adds a finder that loads the top-level `feast` package, the first time
anything imports it, with typeguard's decorator turned into a no-op, and restores the decorator right after.
FEATURES_FEAST_TYPECHECKS=1 keeps Feast's checks (docs/operations.md). A Feast imported before `features` is left
as it was.

`install()` also corrects Feast modules as they are imported (`AFTER_IMPORT`), or at once if they were imported
already: the DuckDB offline store then resolves a relative `FileSource` path against the repo, as Feast's other stores
do, where it would take the working directory (features.stores.feast_paths)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

ENV = "FEATURES_FEAST_TYPECHECKS"
_LOCK = threading.Lock()  # typeguard's decorator is swapped while one thread imports Feast


def _unchecked(target: Any = None, **_: Any) -> Any:
    """typeguard's `typechecked`, checking nothing: `@typechecked` and `@typechecked(...)` both return the target."""
    return target if target is not None else (lambda later: later)


class _FeastLoader(importlib.abc.Loader):
    """Runs Feast's own loader with `typechecked` unchecked; the module keeps Feast's loader as its own."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # its resources are read through it
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        import typeguard

        with _LOCK:
            checked: Callable[..., Any] = typeguard.typechecked
            typeguard.typechecked = _unchecked  # type: ignore[assignment]
            try:
                self.loader.exec_module(module)  # type: ignore[attr-defined]
            finally:
                typeguard.typechecked = checked  # type: ignore[assignment]


class _FeastFinder(importlib.abc.MetaPathFinder):
    """Finds `feast` the first time, through the other finders, and hands it to `_FeastLoader`. It stays on
    sys.meta_path (removing it while Python walks that list would skip the next finder), answering nothing after."""

    def __init__(self) -> None:
        self.done = False

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "feast" or self.done:
            return None
        self.done = True  # also for the lookup below, which asks this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or importlib.util.find_spec("typeguard") is None:
            return spec
        spec.loader = _FeastLoader(spec.loader)
        return spec


# Feast module -> (module, function) of this package that corrects it once it is loaded.
AFTER_IMPORT = {"feast.infra.offline_stores.duckdb": ("features.stores.feast_paths", "resolve_against_repo")}


def _correct(module: ModuleType) -> None:
    owner, function = AFTER_IMPORT[module.__name__]
    getattr(importlib.import_module(owner), function)(module)


class _CorrectingLoader(importlib.abc.Loader):
    """Runs the module's own loader, then the correction; the module keeps its own loader."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)  # type: ignore[attr-defined]
        _correct(module)


class _CorrectingFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of `AFTER_IMPORT` through the finders after it and hands them to `_CorrectingLoader`."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in AFTER_IMPORT:
            return None
        later = sys.meta_path[sys.meta_path.index(self) + 1 :] if self in sys.meta_path else []
        for finder in later:
            spec = finder.find_spec(fullname, path, target)  # type: ignore[arg-type]
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _CorrectingLoader(spec.loader)
                return spec
        return None


def _install_corrections() -> None:
    for name in AFTER_IMPORT:
        if name in sys.modules:
            _correct(sys.modules[name])
    if not any(isinstance(f, _CorrectingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CorrectingFinder())


def install() -> None:
    _install_corrections()
    if os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes") or "feast" in sys.modules:
        return
    if not any(isinstance(f, _FeastFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _FeastFinder())
