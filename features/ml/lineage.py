"""What a training set was built from, logged on the active MLflow run (features.ml.tracking) so that it can be
found and rebuilt later (`training_set(..., as_of_version=lineage.table_versions)`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd

from features.repo import Repo
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash, feature_hash
from features.stores.feature_refs import FeatureRef, offline_dates


@dataclass(frozen=True)
class Lineage:
    """What a training set was built from: logged on the active MLflow run (features.ml.tracking)."""

    features: list[str]  # "group:feature", in the order asked
    definition_hashes: dict[str, str]  # group -> features.spec.fingerprint.definition_hash
    feature_hashes: dict[str, str]  # "group:feature" -> feature_hash
    definitions: dict[str, dict[str, Any]]  # group -> features.spec.fingerprint.describe
    rows: int
    start: datetime | None  # the entity rows' earliest and latest timestamps (UTC)
    end: datetime | None
    timestamp_column: str
    offline_dates: dict[str, list[str]] = field(default_factory=dict)  # group -> [first, last] date partition
    # group -> the offline table's version read: `training_set(..., as_of_version=...)` rebuilds the same set
    table_versions: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "definition_hashes": dict(self.definition_hashes),
            "feature_hashes": dict(self.feature_hashes),
            "definitions": self.definitions,
            "entity_rows": {
                "rows": self.rows,
                "timestamp_column": self.timestamp_column,
                "start": self.start.isoformat() if self.start else None,
                "end": self.end.isoformat() if self.end else None,
            },
            "offline_dates": dict(self.offline_dates),
            "table_versions": dict(self.table_versions),
        }


def lineage_of(
    refs: Sequence[FeatureRef], times: pd.Series, timestamp_column: str, repo: Repo, versions: dict[str, int]
) -> Lineage:
    valid = times.dropna()
    start = valid.min().to_pydatetime() if len(valid) else None
    end = valid.max().to_pydatetime() if len(valid) else None
    return lineage_from(refs, len(times), start, end, timestamp_column, repo, versions)


def lineage_from(
    refs: Sequence[FeatureRef],
    rows: int,
    start: datetime | None,
    end: datetime | None,
    timestamp_column: str,
    repo: Repo,
    versions: dict[str, int],
) -> Lineage:
    """The lineage of a training set of `rows` rows with lookup times in [start, end] (UTC), read from the
    groups' offline tables at `versions`."""
    from features.spec.fingerprint import describe

    groups = {r.group.name: r.group for r in refs}
    return Lineage(
        features=[r.ref for r in refs],
        definition_hashes={name: definition_hash(g) for name, g in groups.items()},
        feature_hashes={r.ref: feature_hash(r.group, r.feature) for r in refs},
        definitions={name: describe(g) for name, g in groups.items()},
        rows=rows,
        start=start,
        end=end,
        timestamp_column=timestamp_column,
        offline_dates={name: _date_range(repo, g, versions.get(name)) for name, g in groups.items()},
        table_versions=dict(versions),
    )


def _date_range(repo: Repo, group: FeatureGroup, version: int | None) -> list[str]:
    dates = offline_dates(repo, group, version)
    return [dates[0].isoformat(), dates[-1].isoformat()] if dates else []
