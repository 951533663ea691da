"""The phase-2 kernel (docs/internals.md, Two phases), shared by the batch and streaming engines: pure numpy/pandas, no
Spark. `plan` says what a group computes, `frames` how the engines' Arrow input becomes pandas with every integer
exact, `aggregations` how each aggregation is reduced, `table` the pane tables and their change points,
`microbatch` the stream's step over them, `held` and `summaries` how it holds them and reads their windows, `state`
how the stream stores them, `beside` how recomputed features join
the table's values of the others."""

from features.kernel.beside import beside
from features.kernel.frames import events_frame
from features.kernel.held import Held
from features.kernel.microbatch import Step, advance, prune, step
from features.kernel.plan import BASE, KEY, PANE, TS, Calc, Plan, text_cast, value_column
from features.kernel.state import chunk_length, chunk_of, from_bytes, is_pane_chunk, read_frame, to_bytes
from features.kernel.table import (
    KeyDictionary,
    Sorted,
    combine,
    combine_sorted,
    emit,
    empty_table,
    key_lasts,
    pane_columns,
    phase1,
    phase1_sorted,
    to_arrow,
)

__all__ = [
    "BASE",
    "KEY",
    "PANE",
    "TS",
    "Calc",
    "Held",
    "KeyDictionary",
    "Plan",
    "Sorted",
    "Step",
    "advance",
    "beside",
    "chunk_length",
    "chunk_of",
    "combine",
    "combine_sorted",
    "emit",
    "empty_table",
    "events_frame",
    "from_bytes",
    "is_pane_chunk",
    "key_lasts",
    "pane_columns",
    "phase1",
    "phase1_sorted",
    "prune",
    "read_frame",
    "step",
    "text_cast",
    "to_arrow",
    "to_bytes",
    "value_column",
]
