"""Request-time features in the logged model (features.ml.model): at `predict`, each row's values from its own
input columns (the request fields) and the key's online values, by the one function training sets and the feature
server call (features.kernel.request_time, through features.stores.request_inputs).

The stored features they read and the model was not fitted on are read online too, under columns of their own,
and left out of what the wrapped model sees. The request time is the moment `predict` is called, or a row's
`request_time` column when the input has one (to replay past requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from features.repo import Repo
from features.spec.request import REQUEST_TIME, RequestFeature
from features.stores.feature_refs import FeatureColumn, FeatureRef, resolve_features
from features.stores.request_inputs import input_refs, request_features_of, with_request_features

INPUT_PREFIX = "__features_input__"  # the columns of stored inputs the wrapped model was not fitted on


def input_specs(
    repo: Repo, wanted: Sequence[str | RequestFeature], refs: Sequence[FeatureRef]
) -> tuple[list[RequestFeature], list[dict[str, Any]]]:
    """The request-time features asked for, and the specs (as `feature_model` writes them) of the stored inputs
    they read that are not among `refs`."""
    features = request_features_of(repo, wanted)
    asked = {r.ref for r in refs}
    needed = input_refs(features)
    extra = [r for r in resolve_features(repo, needed) if r.ref not in asked] if needed else []
    specs = [
        {
            "ref": r.ref,
            "group": r.group.name,
            "feature": r.feature.name,
            "column": f"{INPUT_PREFIX}{r.group.name}__{r.feature.name}",
            "dtype": r.dtype.value,
            "empty": r.feature.aggregation.kind.op.empty.name,
        }
        for r in extra
    ]
    return features, specs


def with_model_request_features(
    filled: pd.DataFrame,
    rows: pd.DataFrame,
    features: Sequence[RequestFeature],
    stored: dict[str, FeatureColumn],
) -> pd.DataFrame:
    """`filled` (the features read online, filled) with the request-time features of `rows` (the model's input,
    in the same order) added; `stored`: each input's ref -> its column in `filled`."""
    fields = [name for f in features for name in f.request if name not in filled.columns]
    frame = pd.concat([filled, rows[list(dict.fromkeys(fields))].reset_index(drop=True)], axis=1)
    times: pd.Series | datetime = datetime.now(UTC)
    if REQUEST_TIME in rows.columns:
        times = rows[REQUEST_TIME].reset_index(drop=True)
    return with_request_features(frame, features, stored, times)


def request_field_names(features: Sequence[RequestFeature]) -> list[str]:
    """The request fields the model's input must hold, in order of first use."""
    return list(dict.fromkeys(name for f in features for name in f.request))
