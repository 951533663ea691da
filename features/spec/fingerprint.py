"""A group's definition as plain JSON, and hashes of it: what changed since a table or a state was computed.

The hashes cover what decides the values (keys, source timestamp, filters, aggregations, windows), not names
of files or descriptions, so that moving a source folder does not make a table stale.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from features.spec.definitions import Feature, FeatureGroup


def describe_feature(feature: Feature) -> dict[str, Any]:
    agg = feature.aggregation
    window: dict[str, Any] = {"size_s": feature.window.size_s, "every_s": feature.window.every_s}
    if feature.window.gap_s is not None:  # only sessions have one: other windows keep the hashes they had
        window["gap_s"] = feature.window.gap_s
    return {
        "name": feature.name,
        "aggregation": agg.kind.value,
        "column": agg.column,
        "quantile": agg.quantile,
        "k": agg.k,
        "window": window,
        "where": feature.where,
    }


def describe(group: FeatureGroup) -> dict[str, Any]:
    """Everything that defines the group's rows, as JSON-ready data (logged with runs, saved with state)."""
    return {
        "name": group.name,
        "entity": {"name": group.entity.name, "join_keys": list(group.join_keys)},
        "source": {
            "name": group.source.name,
            "path": group.source.path,
            "format": group.source.format,
            "timestamp": group.source.timestamp,
            "watermark_s": group.source.watermark_s,
        },
        "features": [describe_feature(f) for f in group.features],
        "on_invalid": group.on_invalid,
    }


def _hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def feature_hash(group: FeatureGroup, feature: Feature) -> str:
    """Changes when anything deciding this feature's values changes (including the group's keys)."""
    return _hash({"keys": list(group.join_keys), "ts": group.source.timestamp, **describe_feature(feature)})


def feature_hashes(group: FeatureGroup) -> dict[str, str]:
    return {f.name: feature_hash(group, f) for f in group.features}


def definition_hash(group: FeatureGroup) -> str:
    """One hash of the whole group's values: the sorted feature hashes (order of features does not matter)."""
    return _hash(sorted(feature_hashes(group).items()))
