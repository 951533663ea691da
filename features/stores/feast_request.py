"""Request-time features in Feast: each `RequestFeature` of a repo registered by `features apply` as an
`OnDemandFeatureView` of its name, holding one feature of its name, so that Feast users get the same values from
`get_online_features` and `get_historical_features` (docs/serving.md, "Request-time features in Feast").

The view's sources are projections of the groups' views on the stored features it reads and a `RequestSource`
(`<name>__request`) with its request fields, and `request_time` when the function takes it: Feast asks every
request for its request sources' fields, so a Feast client sends the request time, and a training set's rows
hold it as a column. Its transformation is a few lines of source that Feast keeps in its registry and runs where
it serves: they call `feast_request_values` with the feature pickled by value, which computes it by the one
function training sets, the logged model and `features serve` call (features.kernel.request_time, through
features.stores.request_inputs). Feast reads such a view back from its registry wherever this package is installed,
without the repo's modules. The view is in Feast's python mode: Feast hands it a list of values per column, which
are put in the one form as the feature server puts Feast's JSON (in pandas mode Feast converted its answer to Arrow,
then each view's inputs to pandas and its output back, for every view: 8.8x a request's time for five views).

A feature Feast cannot carry is left out of the registry with a warning naming it, why and the fix (our own
training sets, models and server still compute it): a function cloudpickle cannot pickle, one that fails on the
sample row Feast runs every new view on when it is applied, a name taken by a group (one registry namespace), or no
input at all (Feast's views need a source).
"""

from __future__ import annotations

import base64
import functools
import pickle
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from features.kernel.request_time import plain_values
from features.repo import Repo
from features.spec.request import REQUEST_TIME, RequestFeature
from features.spec.types import DType
from features.stores.feature_refs import FeatureColumn, resolve_features
from features.stores.request_inputs import request_columns_of_values, typed_field_values

if TYPE_CHECKING:
    from feast import FeatureView, OnDemandFeatureView

# The transformation as Feast's registry keeps it (and runs it again from there): the feature by value.
TRANSFORMATION = '''def {name}(inputs):
    """The request-time feature {name!r} of a features repo, computed by features.stores.feast_request."""
    from features.stores.feast_request import feast_request_values

    return feast_request_values(inputs, {packed!r})
'''


class NotCarried(Exception):
    """Why Feast cannot carry a request-time feature, and the fix."""

    def __init__(self, why: str, fix: str) -> None:
        super().__init__(f"{why}. Fix: {fix}")


def request_views(repo: Repo, views: Sequence[FeatureView]) -> tuple[list[OnDemandFeatureView], list[str]]:
    """An `OnDemandFeatureView` per request-time feature of the repo Feast can carry (`views`: the groups' feature
    views), and a warning for each one it cannot."""
    by_name = {view.name: view for view in views}
    made, warnings = [], []
    for feature in repo.request_features.values():
        try:
            made.append(request_view(repo, feature, by_name))
        except NotCarried as exc:
            warnings.append(
                f"request-time feature {feature.name!r} is not registered with Feast (features' own training "
                f"sets, models and server compute it): {exc}"
            )
    return made, warnings


def request_view(repo: Repo, feature: RequestFeature, views: Mapping[str, FeatureView]) -> OnDemandFeatureView:
    """The feature as an `OnDemandFeatureView`, checked as Feast checks it when it is applied; NotCarried if Feast
    cannot carry it."""
    from feast import Field, OnDemandFeatureView, RequestSource

    from features.stores.feast_objects import feast_type

    if feature.name in views:
        raise NotCarried(
            f"{feature.name!r} is also a feature group's name, and Feast names its views in one namespace",
            "rename the request-time feature",
        )
    fields = [Field(name=name, dtype=feast_type(dtype)) for name, dtype in feature.request.items()]
    if feature.wants_request_time:
        fields.append(Field(name=REQUEST_TIME, dtype=feast_type(DType.TIMESTAMP)))
    sources: list[Any] = [
        views[group][[s.feature for s in feature.features if s.group == group]]
        for group in dict.fromkeys(s.group for s in feature.features)
    ]
    if fields:
        sources.append(RequestSource(name=f"{feature.name}__request", schema=fields))
    if not sources:
        raise NotCarried("it reads no request field, stored feature or request_time", "give the function an input")
    refs = resolve_features(repo, [s.ref for s in feature.features]) if feature.features else []
    stored = {r.ref: FeatureColumn(r.ref, r.dtype, r.feature.aggregation.kind.op.empty) for r in refs}
    udf, source = transformation(feature, stored)
    view = OnDemandFeatureView(  # its field without the description: Feast's apply compares that too
        name=feature.name,
        sources=sources,
        schema=[Field(name=feature.name, dtype=feast_type(feature.dtype))],
        udf=udf,
        udf_string=source,
        mode="python",
        description=feature.description,
        tags={"features.request_feature": feature.name},
    )
    try:
        view.infer_features()  # what Feast's apply runs: the function on a sample row of each input's type
    except Exception as exc:  # the function's failure on Feast's sample row, whatever it is, is the reason given
        why = str(exc).partition(". Fix: ")[0]  # the kernel's fix is for rows of ours
        if isinstance(exc, ValueError) and "nonetype" in why.lower():  # Feast's python mode types it by that value
            why = "it gives null there, and Feast types the view by its value there"
        else:
            why = f"it fails: {type(exc).__name__}: {why}"
        raise NotCarried(
            f"on the sample row Feast computes every new view on when it is applied, {why}",
            "make the function give a value for any row of its input types (1.0, 1, 'hello world', True, now)",
        ) from exc
    return view


def transformation(feature: RequestFeature, stored: Mapping[str, FeatureColumn]) -> tuple[Any, str]:
    """The view's transformation and its source (the feature and its stored inputs' columns by value)."""
    try:
        packed = base64.b64encode(pickle.dumps((feature, dict(stored)))).decode()
    except Exception as exc:  # cloudpickle's many ways to refuse an object: the reason is its message
        raise NotCarried(
            f"its function cannot be pickled for Feast's registry ({type(exc).__name__}: {exc})",
            "define the function at a module's top level or as a lambda, without open files, locks or clients",
        ) from exc
    source = TRANSFORMATION.format(name=feature.name, packed=packed)
    namespace: dict[str, Any] = {"__name__": "feast_udf_rehydrate"}  # as Feast runs it from its registry
    exec(source, namespace)  # our own source, the one Feast keeps and runs
    return namespace[feature.name], source


@functools.lru_cache(maxsize=256)
def _unpacked(packed: str) -> tuple[RequestFeature, dict[str, FeatureColumn]]:
    return pickle.loads(base64.b64decode(packed))  # what transformation() wrote into the registry


def feast_request_values(inputs: Mapping[str, list[Any]], packed: str) -> dict[str, list[Any]]:
    """The feature's values for Feast's rows, a list per column as Feast's python mode gives them (its stored
    inputs as `<view>__<feature>`, the request fields, the request time), by the one function."""
    feature, stored = _unpacked(packed)
    values = {ref: inputs[ref.replace(":", "__")] for ref in stored}  # the ref is the column's name in `stored`
    values |= {name: inputs[name] for name in feature.request if name in inputs}
    rows = len(next(iter(inputs.values())))  # Feast gives the join keys too: never no column
    given = inputs.get(REQUEST_TIME) if feature.wants_request_time else None  # Feast gives every view all fields
    times = None if given is None else typed_field_values(given, REQUEST_TIME, DType.TIMESTAMP, pd.RangeIndex(rows))
    out = request_columns_of_values(values, [feature], stored, times, rows)[feature.name]
    return {feature.name: plain_values(out)}
