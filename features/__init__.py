"""Declarative windowed features on Spark, served by Feast.

Definitions (this module's names) import no Spark, Feast, MLflow or Great Expectations; the engines and
stores are imported only where they are used.
"""

from features.errors import ConfigError, DataError, DefinitionError, FeaturesError, SchemaError, ValidationFailed
from features.spec import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, Tumble, agg

__all__ = [
    "ConfigError",
    "DataError",
    "DefinitionError",
    "Entity",
    "EventSource",
    "Feature",
    "FeatureGroup",
    "FeaturesError",
    "Hop",
    "Lifetime",
    "SchemaError",
    "Tumble",
    "ValidationFailed",
    "agg",
    "to_feast",
    "training_set",
]


def to_feast(group: FeatureGroup, **kwargs: object) -> list[object]:
    """Feast objects (Entity, FileSource, FeatureView) for a group; see `features.feast_objects.to_feast`."""
    from features.feast_objects import to_feast as _to_feast

    return _to_feast(group, **kwargs)  # type: ignore[arg-type]


def training_set(entity_rows: object, features: object, repo: object = "feature_repo", **kwargs: object) -> object:
    """Point-in-time correct features for labelled entity rows; see `features.training.training_set`."""
    from features.training import training_set as _training_set

    return _training_set(entity_rows, features, repo, **kwargs)  # type: ignore[arg-type]
