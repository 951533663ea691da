"""A stream's pane tables carried over a definition change (docs/streaming.md, "Changing a running group").

A pane table's columns are named by feature and by `where` index, which a changed definition reuses for other
things (a widened window keeps its feature's name; removing a feature shifts the `where` indices). So each column
gets an identity from what decides its values: a feature's partial from the feature's aggregation, column,
parameters, window and `where` (not its name); a `where`'s counts and session bounds from the `where` text. A
`Layout` maps a definition's columns to their identities; two layouts say which columns of the new definition
the state already holds (kept, maybe renamed), which must be built from the source, and which go.

`carry` makes the new pane table from the old one and the built columns' pane rows (computed by a batch job over
the events the stream had read, over the lookback the new features need): both become tables of the new layout,
each with the other's columns empty, and one `combine` merges the rows of the same (key, pane).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import reduce
from math import gcd
from typing import Any

import numpy as np
import pandas as pd

from features.kernel import sessions
from features.kernel.kinds import KINDS
from features.kernel.panes import MICROS
from features.kernel.plan import PANE, Calc, Plan
from features.kernel.table import combine, frame_of, pane_columns
from features.spec import AggKind

WHERE, FEATURE = "where", "feature"  # the two sorts of column: a `where`'s counts and bounds, a feature's partial


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Layout:
    """A definition's pane-table columns (besides the keys and `fx_pane`) and what each holds, and its pane length."""

    pane_us: int
    columns: tuple[tuple[str, str], ...]  # (column, identity), in pane-table order
    buckets: int = 0  # how many buckets the stream's keys are spread over (0: not said)

    @property
    def id(self) -> str:
        return _digest([self.pane_us, list(self.columns), self.buckets])

    def to_json(self) -> dict[str, Any]:
        return {"pane_us": self.pane_us, "columns": [list(c) for c in self.columns], "buckets": self.buckets}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        columns = tuple((str(c), str(i)) for c, i in data["columns"])
        return cls(int(data["pane_us"]), columns, int(data.get("buckets", 0)))


def layout_of(description: dict[str, Any], buckets: int = 0) -> Layout:
    """The layout of a group as `features.spec.fingerprint.describe` gives it (saved with a stream's state), its
    keys spread over `buckets`."""
    features = description["features"]
    wheres: list[str | None] = []
    for feature in features:
        if feature["where"] not in wheres:
            wheres.append(feature["where"])
    gapped = sorted({wheres.index(f["where"]) for f in features if f["window"].get("gap_s") is not None})
    columns = [(f"fx_n{i}", _digest([WHERE, "n", w])) for i, w in enumerate(wheres)]
    for i in gapped:
        names = sessions.columns(i)
        columns += [(names[part], _digest([WHERE, part, wheres[i]])) for part in ("s0", "s1")]
    for feature in features:
        what = {k: v for k, v in feature.items() if k != "name"}
        for part in KINDS[AggKind(feature["aggregation"])].parts:
            columns.append((f"{feature['name']}.{part}", _digest([FEATURE, part, what])))
    pane_us = reduce(gcd, (int(f["window"]["every_s"]) for f in features)) * MICROS
    return Layout(pane_us, tuple(columns), buckets)


@dataclass(frozen=True)
class Change:
    """What a definition change does to a stream's state: the columns it keeps, builds and drops."""

    before: Layout
    after: Layout

    @property
    def kept(self) -> dict[str, str]:
        """New column -> the old column holding the same values. Nothing is kept when the pane length changed:
        panes of another length cannot be split or merged into the new ones."""
        if self.before.pane_us != self.after.pane_us:
            return {}
        old = {identity: column for column, identity in self.before.columns}
        return {column: old[identity] for column, identity in self.after.columns if identity in old}

    @property
    def built(self) -> list[str]:
        kept = self.kept
        return [column for column, _ in self.after.columns if column not in kept]

    @property
    def dropped(self) -> list[str]:
        kept = set(self.kept.values())
        return [column for column, _ in self.before.columns if column not in kept]

    def features(self, columns: list[str]) -> list[str]:
        """The features whose partials are among `columns`, in order."""
        return list(dict.fromkeys(c.split(".")[0] for c in columns if "." in c))


def carry(plan: Plan, change: Change, old: pd.DataFrame | None, built: pd.DataFrame) -> pd.DataFrame:
    """The pane table of `plan` (the new definition): `old` (a table of `change.before`'s columns) with its kept
    columns renamed and its dropped ones gone, merged with `built` (a table of `plan`'s columns, computed from the
    source over the new features' lookback) for the built columns.

    A `where`'s counts and session bounds come from `old` where it has the (key, pane), else from `built`: a new
    feature with a longer window reads panes the old state had already dropped, and its change points (a pane
    leaving the window) need their counts. A `where` that gains session bounds takes all of its columns from
    `built` (read from the beginning, as session features are). `old` None: the state held no panes."""
    keys = [*plan.keys, PANE]
    if old is None:
        old = built.iloc[:0][keys]
    kept = change.kept
    calcs: dict[str, tuple[Calc, str]] = {c.col(p): (c, p) for c in plan.calcs for p in KINDS[c.kind].parts}
    rebuilt = set()  # the columns of `where`s some of whose columns are built
    for i in range(len(plan.conditions)):
        names = [f"fx_n{i}"]
        if i in plan.session_conditions:
            names += [sessions.columns(i)[part] for part in ("s0", "s1")]
        if any(name not in kept for name in names):
            rebuilt.update(names)
    in_old = pd.MultiIndex.from_frame(built[keys]).isin(pd.MultiIndex.from_frame(old[keys]))
    a: dict[str, Any] = {k: old[k].to_numpy() for k in keys}
    b: dict[str, Any] = {k: built[k].to_numpy() for k in keys}
    for column in pane_columns(plan)[len(keys) :]:
        from_old = column in kept and column not in rebuilt and kept[column] in old.columns
        a[column] = old[kept[column]] if from_old else _empty(column, calcs, len(old))
        if not from_old:
            b[column] = built[column]
        elif column in calcs:
            b[column] = _empty(column, calcs, len(built))
        else:
            b[column] = np.where(in_old, 0, built[column].to_numpy(dtype=np.int64))
    return combine(plan, [frame_of(a), frame_of(b)])


def _empty(column: str, calcs: dict[str, tuple[Calc, str]], n: int) -> Any:
    """A column of `n` empty partials: no rows for a feature, zero counts and no bounds for a `where`."""
    if column not in calcs:
        return np.zeros(n, dtype=np.int64)
    calc, part = calcs[column]
    return KINDS[calc.kind].empty(calc, n)[part]
