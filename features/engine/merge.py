"""Some features of a group recomputed beside the values the offline table holds for the others
(docs/operations.md, "Changing a group's definition"): what a backfill writes after features were added or
changed, without computing the unchanged ones again.

A group's change points are the union of its features' own change points: a row wherever some feature's value may
change, each feature's value there being its value as of that time. So the rows of the recomputed features (from
`features.engine.batch.change_points` of those features alone) and the table's rows of the others, put in one
series per key, give every feature its value as of each row: the last value its own side had at or before the
row's window end (the empty value before its first). Rows of both sides at the same window end become one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from features.engine.inputs import SPARK_TYPES
from features.spec import WINDOW_END, DType, Feature, FeatureGroup
from features.spec.aggregations import Empty
from features.stores.offline import LATEST

SIDE = "fx_side"
NEXT = "fx_next"  # the window end of the key's next row
KEPT, REBUILT = 0, 1


def with_table_rows(
    group: FeatureGroup,
    rebuilt: DataFrame,
    table_rows: DataFrame,
    names: Sequence[str],
    start: datetime,
    end: datetime,
    types: Mapping[str, DType],
) -> DataFrame:
    """The group's change points for window ends in [start, end], and a copy of each key's newest one flagged
    `LATEST` (as `change_points(...).with_latest` gives them), from `rebuilt` (the change points of the features
    `names`, window ends in [start, end]) and `table_rows` (the table's rows of the group, window ends up to
    `end`, from far enough back to hold each key's last row before `start`). `types`: each feature's DType."""
    keys = list(group.join_keys)
    kept = [f for f in group.features if f.name not in names]
    fresh = [f for f in group.features if f.name in names]
    end_ts = F.lit(end).cast("timestamp")
    old = table_rows.where(F.col(WINDOW_END) <= end_ts).select(
        *keys, WINDOW_END, *[f.name for f in kept], F.lit(KEPT).alias(SIDE)
    )
    new = rebuilt.select(*keys, WINDOW_END, *[f.name for f in fresh], F.lit(REBUILT).alias(SIDE))
    both = old.unionByName(new, allowMissingColumns=True)
    # One pass over each key's rows in time order, a window end's kept row before its rebuilt one: the last row at
    # each window end has seen every value up to it, and is the one kept; a key's last row is its newest.
    order = Window.partitionBy(*keys).orderBy(WINDOW_END, SIDE)
    upto = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    columns = {
        f.name: _as_of(f, side, upto, types[f.name]) for side, fs in ((KEPT, kept), (REBUILT, fresh)) for f in fs
    }
    following = F.lead(WINDOW_END).over(order)
    filled = both.select(*keys, WINDOW_END, *[columns[f.name] for f in group.features], following.alias(NEXT))
    last_at_its_end = F.col(NEXT).isNull() | (F.col(NEXT) != F.col(WINDOW_END))
    rows = filled.where((F.col(WINDOW_END) >= F.lit(start).cast("timestamp")) & last_at_its_end)
    # The newest row once more, flagged LATEST, from the same pass.
    copies = F.when(F.col(NEXT).isNull(), F.array(F.lit(False), F.lit(True))).otherwise(F.array(F.lit(False)))
    return rows.select(*keys, WINDOW_END, *[f.name for f in group.features], F.explode(copies).alias(LATEST))


def _as_of(feature: Feature, side: int, frame: object, dtype: DType) -> Column:
    """The feature's last value on its own side at or before each row (its empty value before the first)."""
    mine = F.when(F.col(SIDE) == side, F.struct(F.col(feature.name).alias("v")))
    held = F.last(mine, ignorenulls=True).over(frame)  # type: ignore[arg-type]
    return F.when(held.isNull(), _empty(feature, dtype)).otherwise(held["v"]).alias(feature.name)


def _empty(feature: Feature, dtype: DType) -> Column:
    spark_type = SPARK_TYPES[dtype]
    empty = feature.aggregation.kind.op.empty
    if empty is Empty.EMPTY_MAP:
        return F.create_map().cast(spark_type)
    return F.lit(empty.make()).cast(spark_type)
