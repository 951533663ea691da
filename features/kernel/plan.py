"""What the kernel knows of a group: its features as `Calc`s, the distinct `where`s, the pane length, and the
column names of pane tables and of the kernel's input events. Built on the driver, shipped to the workers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from features.kernel.panes import MICROS, pane_length_us
from features.spec import AggKind, DType, FeatureGroup

PANE = "fx_pane"
TS = "fx_ts"  # Spark renames pandas columns that start with "_", so the kernel's start with fx_
KEY = "fx_key"  # a join key's code in a KeyDictionary: what the stream keeps in state instead of the keys
BASE = np.iinfo(np.int64).min  # the `fx_pane` of a key's folded Lifetime partials


@dataclass(frozen=True)
class Calc:
    """One feature as the kernel computes it: which input columns it reads and its window in µs."""

    name: str
    kind: AggKind
    condition: int  # index into Plan.conditions
    value: str | None  # input column (already cast by Spark where the batch engine casts)
    value_type: DType | None
    output_type: DType
    size_us: int | None  # None: Lifetime or Session
    every_us: int
    k: int = 1
    quantile: float = 0.5
    gap_us: int | None = None  # a Session's gap

    @property
    def bounded(self) -> bool:
        """Reads a bounded stretch of panes (a Hop or a Session), not everything since the beginning."""
        return self.size_us is not None or self.gap_us is not None

    def col(self, part: str) -> str:
        return f"{self.name}.{part}"


@dataclass(frozen=True)
class Plan:
    """What the kernel needs to know about a group (built on the driver, shipped to the workers)."""

    keys: tuple[str, ...]
    conditions: tuple[str | None, ...]  # distinct `where`s; input column `fx_c<i>` holds each one's truth
    calcs: tuple[Calc, ...]
    pane_us: int

    @classmethod
    def of(cls, group: FeatureGroup, input_types: dict[str, DType]) -> Plan:
        conds: list[str | None] = []
        for feat in group.features:
            if feat.where not in conds:
                conds.append(feat.where)
        calcs = []
        for feat in group.features:
            agg = feat.aggregation
            column = agg.column
            calcs.append(
                Calc(
                    name=feat.name,
                    kind=agg.kind,
                    condition=conds.index(feat.where),
                    value=None if column is None else value_column(agg.kind, column, input_types[column]),
                    value_type=None if column is None else input_type(agg.kind, input_types[column]),
                    output_type=agg.output_type(None if column is None else input_types[column]),
                    size_us=None if feat.window.size_s is None else feat.window.size_s * MICROS,
                    every_us=feat.window.every_s * MICROS,
                    k=agg.k or 1,
                    quantile=agg.quantile if agg.quantile is not None else 0.5,
                    gap_us=None if feat.window.gap_s is None else feat.window.gap_s * MICROS,
                )
            )
        return cls(tuple(group.join_keys), tuple(conds), tuple(calcs), pane_length_us(f.window for f in group.features))

    def closed_end(self, t_us: int) -> int:
        """The latest window end, on any feature's grid, that event time `t_us` has passed. Once change points
        were emitted up to `t_us`, an event before this end would change one of them (it is late); an event at or
        after it changes only window ends not emitted yet."""
        return max(t_us - t_us % calc.every_us for calc in self.calcs)

    def condition_column(self, i: int) -> str | None:
        return None if self.conditions[i] is None else f"fx_c{i}"

    @property
    def session_conditions(self) -> tuple[int, ...]:
        """The `where`s that make some session feature's sessions: their panes keep first and last event times."""
        return tuple(sorted({c.condition for c in self.calcs if c.gap_us is not None}))


def value_column(kind: AggKind, column: str, source_type: DType) -> str:
    """The kernel's input column for a source column, named by how Spark casts it for this kind: aggregations
    that receive the same values share one column."""
    cast = "text" if text_cast(kind, source_type) else "double" if kind.op.cast == "double" else "raw"
    return f"fx_v_{cast}_{column}"


def input_type(kind: AggKind, source_type: DType) -> DType:
    """The type of the kernel's input column: `Operation.cast` applied to the source column's type."""
    cast = kind.op.cast
    if cast == "double":
        return DType.FLOAT64
    if cast == "text" and source_type not in (DType.INT64, DType.STRING):
        return DType.STRING  # floats and booleans are hashed by their text
    return source_type


def text_cast(kind: AggKind, source_type: DType) -> bool:
    """Whether Spark casts this kind's input to string before the kernel sees it."""
    return input_type(kind, source_type) is DType.STRING and source_type is not DType.STRING
