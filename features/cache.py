"""Where this package keeps what it makes once per machine and reuses across runs: the Java packages Spark
fetches (features.engine.jars), the JVM class archive (features.engine.jvm_archive), the wheels logged models
ship (features.ml.model) and the empty MLflow store new repositories start from (features.ml.sqlite_store)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache(name: str) -> Path:
    """The folder `name` in the user's cache (`$XDG_CACHE_HOME/features`, else `~/.cache/features`)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "features" / name
