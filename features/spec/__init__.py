"""Inert feature definitions. Imports no Spark, Feast, MLflow or Great Expectations."""

from features.spec.aggregations import AggKind, Aggregation, agg
from features.spec.definitions import WINDOW_END, Entity, EventSource, Feature, FeatureGroup, KafkaTopic
from features.spec.drift import DEFAULT_DRIFT, Drift
from features.spec.request import REQUEST_TIME, RequestFeature
from features.spec.types import DType
from features.spec.windows import Hop, Lifetime, Session, Tumble, Window

__all__ = [
    "DEFAULT_DRIFT",
    "REQUEST_TIME",
    "WINDOW_END",
    "AggKind",
    "Aggregation",
    "DType",
    "Drift",
    "Entity",
    "EventSource",
    "Feature",
    "FeatureGroup",
    "Hop",
    "KafkaTopic",
    "Lifetime",
    "RequestFeature",
    "Session",
    "Tumble",
    "Window",
    "agg",
]
