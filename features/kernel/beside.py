"""Some features of a group recomputed beside the values the offline table holds for the others (docs/operations.md,
"Changing a group's definition"): what a backfill writes after features were added or changed, without computing
the unchanged ones again.

A group's change points are the union of its features' own change points: a row wherever some feature's value may
change, each feature's value there being its value as of that time. So the rows of the recomputed features and the
table's rows of the others, put in one series per key, give every feature its value as of each row: the last value
its own side had at or before the row's window end (the empty value before its first). Rows of both sides at the
same window end become one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.kernel.table import key_lasts

KEPT, REBUILT = 0, 1


def beside(
    keys: Sequence[str],
    end: str,
    kept: pa.Table,
    rebuilt: pa.Table,
    lo: int,
    empties: Mapping[str, pa.Array],
) -> tuple[pa.Table, np.ndarray]:
    """One bucket's merged series: the rows of `kept` (the table's, keys, `end` and the kept features' columns)
    and of `rebuilt` (keys, `end` and the recomputed features' columns) with window ends >= `lo`, one row per
    key and window end, every feature's value as of it; and a mask of each key's newest row among them.
    `empties`: each feature's empty value, an array of one (its value before its side's first row)."""
    spine_columns = [*keys, end]
    spine_schema = kept.select(spine_columns).schema
    spine = pa.concat_tables(
        [
            table.select(spine_columns)
            .cast(spine_schema)
            .append_column("side", pa.array(np.full(len(table), s, np.int8)))
            for s, table in ((KEPT, kept), (REBUILT, rebuilt))
        ]
    )
    order = pc.sort_indices(spine, [(k, "ascending") for k in (*keys, end, "side")]).to_numpy()
    spine = spine.take(order)
    n = len(order)
    lasts = key_lasts([spine[k] for k in keys])
    firsts = np.r_[True, lasts[:-1]][:n]
    where = np.arange(n)
    key_start = np.maximum.accumulate(np.where(firsts, where, 0))
    ends = spine[end].to_numpy()
    last_at_end = lasts.copy()
    last_at_end[:-1] |= ends[1:] != ends[:-1]
    chosen = last_at_end & (ends >= lo)
    side = spine["side"].to_numpy()
    columns = {k: spine[k].filter(pa.array(chosen)) for k in (*keys, end)}
    offset = {KEPT: 0, REBUILT: kept.num_rows}
    for s, table in ((KEPT, kept), (REBUILT, rebuilt)):
        held = np.maximum.accumulate(np.where(side == s, where, -1))[chosen]  # its side's last row up to here
        valid = held >= key_start[chosen]
        source = np.where(valid, order[np.where(valid, held, 0)] - offset[s], table.num_rows)
        for name in table.column_names:
            if name in columns:
                continue
            values = pa.concat_arrays([table[name].combine_chunks(), empties[name].cast(table[name].type)])
            columns[name] = values.take(pa.array(source))
    return pa.table(columns), lasts[chosen]
