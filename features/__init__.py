"""Declarative windowed features on Spark, served by Feast.

Definitions (this module's names) import no Spark, Feast, MLflow or Great Expectations; the engines and
stores are imported only where they are used: the functions below import theirs when called.

Notebook calls: `spark_session()`, `load_repo(path)`, `apply(repo)`, `preview(group, events, start, end)`,
`training_set(...)`, `online_features(...)`; with the modules `features.pipelines.stream` (`stream(repo)`),
`features.ml.tracking`, `features.quality`, `features.ml.model` and `features.demo` (generated sample data).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from features import compat, feast_import
from features.errors import ConfigError, DataError, DefinitionError, FeaturesError, SchemaError, ValidationFailed
from features.spec import (
    Drift,
    Entity,
    EventSource,
    Feature,
    FeatureGroup,
    Hop,
    KafkaTopic,
    Lifetime,
    RequestFeature,
    Session,
    Tumble,
    agg,
)

compat.install()  # module paths of earlier versions still import (features.compat)
feast_import.install()  # Feast's import without typeguard's instrumentation (features.feast_import)

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from features.repo import Repo

__all__ = [
    "ConfigError",
    "DataError",
    "DefinitionError",
    "Drift",
    "Entity",
    "EventSource",
    "Feature",
    "FeatureGroup",
    "FeaturesError",
    "Hop",
    "KafkaTopic",
    "Lifetime",
    "RequestFeature",
    "SchemaError",
    "Session",
    "Tumble",
    "ValidationFailed",
    "agg",
    "apply",
    "load_repo",
    "online_features",
    "preview",
    "spark_session",
    "to_feast",
    "training_set",
]


def to_feast(group: FeatureGroup, **kwargs: object) -> list[object]:
    """Feast objects (Entity, FileSource, FeatureView) for a group; see `features.stores.feast_objects.to_feast`."""
    from features.stores.feast_objects import to_feast as _to_feast

    return _to_feast(group, **kwargs)  # type: ignore[arg-type]


def training_set(entity_rows: object, features: object, repo: object = "feature_repo", **kwargs: object) -> object:
    """Point-in-time correct features for labelled entity rows; see `features.ml.training.training_set`."""
    from features.ml.training import training_set as _training_set

    return _training_set(entity_rows, features, repo, **kwargs)  # type: ignore[arg-type]


def spark_session() -> SparkSession:
    """The SparkSession the package uses: the active one (a notebook's, Databricks' Spark Connect session,
    spark-submit's), else a Spark Connect session to `SPARK_REMOTE` when it is set, else a small local one."""
    from features.engine.session import get_spark

    return get_spark()


def load_repo(path: str | Path = "feature_repo") -> Repo:
    """The feature repository at `path`: its FeatureGroups (`.groups`), paths and Feast configuration."""
    from features.repo import Repo

    return Repo.load(path)


def apply(repo: str | Path | Repo = "feature_repo", *, prune: bool = False) -> list[str]:
    """Register the repo's FeatureGroups with Feast, as `features apply` does; returns the group names."""
    from features.pipelines.registration import apply as _apply

    root = getattr(repo, "root", repo)
    return _apply(str(root), prune=prune)


def preview(
    group: FeatureGroup,
    events: pd.DataFrame | DataFrame,
    start: str | datetime,
    end: str | datetime,
    *,
    spark: SparkSession | None = None,
) -> pd.DataFrame | DataFrame:
    """A group's change points with window ends in [start, end) from events in hand, nothing written; pandas or
    Spark in, the same kind out. See `features.explore.preview`."""
    from features.explore import preview as _preview

    return _preview(group, events, start, end, spark=spark)


def online_features(repo: object, group: str, keys: object, **kwargs: object) -> pd.DataFrame:
    """Each key's current values from the Feast online store; see `features.stores.serving.online_features`."""
    from features.stores.serving import online_features as _online_features

    return _online_features(repo, group, keys, **kwargs)  # type: ignore[arg-type]
