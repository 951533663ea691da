"""Request-time features in training sets: each label row's value, from its own request columns and the stored
values at its time, computed by the one function (features.kernel.request_time, through
features.stores.request_inputs) that the logged model and the feature server call.

    frame = training_set(rows, ["user_transactions"], repo="feature_repo", request_features=["amount_vs_max_24h"])

The stored features they read are looked up with the asked ones (those not asked are dropped afterwards); the
request time is the row's timestamp, or the column `request_time_column` names. pandas rows are computed on the
driver; Spark rows in Spark's Python workers, a batch of rows at a time (an Arrow UDF over the columns the features
read), never through the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa

from features.errors import ConfigError
from features.repo import Repo
from features.spec.request import RequestFeature
from features.stores.feature_refs import FeatureColumn, FeatureRef, resolve_features
from features.stores.request_inputs import (
    input_refs,
    request_columns,
    request_features_of,
    request_fields,
    with_request_features,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame as SparkDataFrame


class RequestPlan:
    """What a training set with request-time features looks up and adds: the stored inputs (as refs), those among
    them no one asked for (dropped at the end), and where each row's request time is."""

    def __init__(
        self,
        repo: Repo,
        asked: Sequence[FeatureRef],
        wanted: Sequence[str | RequestFeature],
        time_column: str,
        full_feature_names: bool,
    ) -> None:
        self.features = request_features_of(repo, wanted)
        needed = resolve_features(repo, input_refs(self.features)) if input_refs(self.features) else []
        asked_refs = {r.ref for r in asked}
        self.extra = [r for r in needed if r.ref not in asked_refs]
        self.stored: dict[str, FeatureColumn] = {r.ref: r.as_column(full_feature_names) for r in [*asked, *needed]}
        self.stored = {ref: self.stored[ref] for ref in input_refs(self.features)}
        self.time_column = time_column
        self.full_feature_names = full_feature_names

    @property
    def extra_columns(self) -> list[str]:
        return [r.column(self.full_feature_names) for r in self.extra]

    def check(self, columns: Sequence[str], feature_columns: Sequence[str]) -> None:
        """The rows have each request field and the time column; no request-time feature is named like a column."""
        for field in request_fields(self.features):
            if field not in columns:
                users = [f.name for f in self.features if field in f.request]
                raise ConfigError(
                    f"entity_rows: no column {field!r}, the request field {users[0]!r} reads. Fix: add it to the "
                    f"rows (each row's value as the request would send it), or leave out {users[0]!r}"
                )
        if self.time_column not in columns and any(f.wants_request_time for f in self.features):
            raise ConfigError(
                f"request_time_column: the rows have no column {self.time_column!r}. Fix: name the column with each "
                "row's request time, or leave request_time_column out (the row's timestamp is taken)"
            )
        taken = set(columns) | set(feature_columns)
        for feature in self.features:
            if feature.name in taken:
                raise ConfigError(
                    f"request_features: {feature.name!r} is also a column of the rows or a feature asked for. Fix: "
                    "rename or drop that column"
                )

    def apply(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The joined rows (pandas) with the request-time features, without the inputs no one asked for."""
        times = frame[self.time_column] if self.time_column in frame.columns else None
        out = with_request_features(frame, self.features, self.stored, times)
        out = out.drop(columns=self.extra_columns)
        out.attrs = dict(frame.attrs)
        return out

    def apply_in_spark(self, frame: SparkDataFrame) -> SparkDataFrame:
        """The joined rows (Spark) with the request-time features: the same function on each Arrow batch of the
        columns it reads, in Spark's Python workers (an Arrow UDF, classic and Connect); the other columns stay in
        the JVM."""
        from pyspark.sql import functions as F
        from pyspark.sql.functions import arrow_udf

        from features.engine.inputs import SPARK_TYPES

        names = set(frame.columns)
        read = [c.name for c in self.stored.values()] + list(request_fields(self.features))
        read += [self.time_column] if any(f.wants_request_time for f in self.features) else []
        read = [c for c in dict.fromkeys(read) if c in names]
        added = ", ".join(f"`{f.name}` {SPARK_TYPES[f.dtype]}" for f in self.features)
        computed = arrow_udf(request_batch(self), f"struct<{added}>")(F.struct(*[frame[c] for c in read]))
        out = frame.select("*", computed.alias(COMPUTED))
        kept = [out[c] for c in frame.columns if c not in set(self.extra_columns)]
        return out.select(*kept, *[out[COMPUTED][f.name].alias(f.name) for f in self.features])


COMPUTED = "__features_request_time"  # the UDF's struct, a reserved name no feature or row column may take


def request_batch(plan: RequestPlan) -> Callable[[pa.Array], pa.Array]:
    """What the Arrow UDF runs on each Arrow batch of the columns the features read (a struct of them): the
    request-time features, by the function `plan.apply` calls (the plan is pickled to the workers with the
    functions, by value). Arrow's columns are made pandas columns here rather than by PySpark's pandas UDF, which
    made the same ones by a slower way and converted the answer back the same (about a third of the workers' time
    in a training set of the example repo's five)."""

    def compute(rows: pa.Array) -> pa.Array:  # a StructArray in and out; PySpark takes its kind from these hints
        index = pd.RangeIndex(len(rows))
        columns = {field.name: column_of_arrow(rows.field(i)) for i, field in enumerate(rows.type)}
        times = columns.get(plan.time_column)
        out = request_columns(columns, plan.features, plan.stored, times, index)
        names = [f.name for f in plan.features]
        return pa.StructArray.from_arrays([arrow_of(out[name]) for name in names], names=names)

    return compute


def column_of_arrow(values: pa.Array) -> pd.Series:
    """An Arrow column as pandas, in the forms PySpark's pandas UDFs give (an integer column with nulls as Python
    integers, so that none is rounded through a float; a time with its time zone)."""
    return values.to_pandas(date_as_object=True, coerce_temporal_nanoseconds=True, integer_object_nulls=True)


def arrow_of(values: pd.Series) -> pa.Array:
    """A request-time feature's column as Arrow, nulls as nulls (a float's NaN too, as PySpark has it); Spark's
    Arrow UDF casts it to the feature's Spark type."""
    return pa.Array.from_pandas(values)
