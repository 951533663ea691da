"""Phase 2 of exact integer sums (counts, integer sums), vectorized with numpy over each key partition.

The panes arrive partitioned by key (events are shuffled by key before phase 1), so each partition holds all
panes of its keys. A pane adds its partial at the window end where it enters and subtracts it where it
leaves (DESIGN.md section 3); a key's value at an end is the running sum of the moves up to it. Here that
is one sort of the moves by (key, end), a sum per (key, end) and a cumulative sum per key, all in numpy: the
same rows and values as a Spark running-sum window, without Spark's sort and window operators.

Runs in Spark's Python workers (`DataFrame.mapInArrow`): numpy and pyarrow only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.errors import DataError

INT64_MAX = np.iinfo(np.int64).max
OVERFLOW_BOUND = 2.0**62  # a partition whose |partials| add up to less cannot overflow any running sum
_CHUNK = 1 << 16  # rows per Arrow batch handed back to Spark


@dataclass(frozen=True)
class SignedSpec:
    """What `signed_changes` computes: column names and the window shape, in microseconds."""

    keys: tuple[str, ...]
    pane: str  # pane start column
    flags: tuple[str, ...]  # row counts per `where`: a pane moves when any of them is > 0
    values: tuple[str, ...]  # the partials (int64, null = nothing)
    out: tuple[str, ...]  # output column names of the running sums, one per value
    features: tuple[str, ...]  # the feature of each value, for messages
    end: str  # output column of the window end
    every_us: int
    size_us: int | None  # None: Lifetime (a pane never leaves)
    lo: int  # first window end of the range: earlier moves are applied at `lo`
    hi: int  # last window end of the range (included)


def signed_changes(batches: Iterator[pa.RecordBatch], spec: SignedSpec) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the panes of one partition in, (keys, end, running sums) out."""
    received = list(batches)
    if not received:
        return
    table = pa.Table.from_batches(received).combine_chunks()
    if table.num_rows == 0:
        return
    out = _changes(table, spec)
    if out is not None:
        yield from out.to_batches(max_chunksize=_CHUNK)


def _key_codes(table: pa.Table, keys: tuple[str, ...]) -> np.ndarray:
    """An int64 code per row, equal exactly when all key columns are equal (dense in 0..keys-1)."""
    codes = None
    for name in keys:
        encoded = pc.dictionary_encode(table.column(name)).combine_chunks()
        code = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        if codes is None:
            codes = code
        else:
            codes = np.unique(codes * len(encoded.dictionary) + code, return_inverse=True)[1].astype(np.int64)
    assert codes is not None
    return codes


def _int64(table: pa.Table, name: str) -> np.ndarray:
    return pc.fill_null(table.column(name), 0).to_numpy().astype(np.int64, copy=False)


def _changes(table: pa.Table, spec: SignedSpec) -> pa.Table | None:
    """The change points of the partition's keys, or None when no pane holds rows."""
    pane = _int64(table, spec.pane)
    moving = np.zeros(len(pane), dtype=bool)
    for flag in spec.flags:
        moving |= _int64(table, flag) > 0
    rows = np.flatnonzero(moving)
    if len(rows) == 0:
        return None
    coarse = pane[rows] - np.mod(pane[rows], spec.every_us)
    enter = np.maximum(coarse + spec.every_us, spec.lo)
    leave = None if spec.size_us is None else np.maximum(coarse + spec.size_us + spec.every_us, spec.lo)
    moves = _sorted_moves(_key_codes(table, spec.keys)[rows], enter, leave, spec)

    # One output row per distinct (key, end); sums restart at each key.
    starts = np.flatnonzero(np.r_[True, moves.order[1:] != moves.order[:-1]])
    group_key = moves.key[starts]
    new_key = np.r_[True, group_key[1:] != group_key[:-1]]
    key_of_group = np.cumsum(new_key) - 1
    at = moves.at[starts]
    keep = at <= spec.hi  # every end is >= lo

    columns: dict[str, pa.Array] = {}
    picked = pa.array(rows[moves.pane[starts][keep]])
    for name in spec.keys:
        columns[name] = table.column(name).take(picked)
    columns[spec.end] = pa.array(at[keep], type=pa.int64())
    for value, name, feature in zip(spec.values, spec.out, spec.features, strict=True):
        partial = _int64(table, value)[rows]
        _check_range(partial, feature)
        moved = partial[moves.pane]
        if moves.leaving is not None:
            moved[moves.leaving] *= -1
        per_end = np.add.reduceat(moved, starts)
        total = np.cumsum(per_end)
        before_key = (total - per_end)[new_key]  # the running total before each key's first end
        columns[name] = pa.array((total - before_key[key_of_group])[keep], type=pa.int64())
    return pa.table(columns)


@dataclass(frozen=True)
class _Moves:
    """The moves of a partition sorted by (key, end): for each, its pane (index into the moving panes), key
    code, end, and a value equal exactly for equal (key, end); `leaving` marks the exits (None: none)."""

    pane: np.ndarray
    key: np.ndarray
    at: np.ndarray
    order: np.ndarray
    leaving: np.ndarray | None


def _sorted_moves(code: np.ndarray, enter: np.ndarray, leave: np.ndarray | None, spec: SignedSpec) -> _Moves:
    """Sort the moves by (key, end). Ends other than `lo` are multiples of `every`, so their index on that grid
    orders them, and with the key that usually fits one int64. The panes are sorted once by (key, entry);
    their exits, the entries shifted by the window size, are then in order too, and merging the two sorted
    runs is a single pass of numpy's run-adaptive stable sort."""
    n = len(code)
    slot_in = -((spec.lo - enter) // spec.every_us)  # ceil((end - lo) / every): lo -> 0, grid ends in order
    slot_out = None if leave is None else -((spec.lo - leave) // spec.every_us)
    slots = int((slot_in if slot_out is None else slot_out).max()) + 1
    if int(code.max()) >= INT64_MAX // slots:
        return _sorted_pairs(code, enter, leave)
    by_entry = np.argsort(code * slots + slot_in)
    entries = code[by_entry] * slots + slot_in[by_entry]
    if slot_out is None:
        combined, pane, leaving = entries, by_entry, None
    else:
        exits = code[by_entry] * slots + slot_out[by_entry]
        merged = np.argsort(np.r_[entries, exits], kind="stable")
        combined = np.r_[entries, exits][merged]
        pane = np.r_[by_entry, by_entry][merged]
        leaving = merged >= n
    slot = combined % slots
    first_grid_end = spec.lo // spec.every_us  # end = (slot + that) * every for every end after lo
    at = np.where(slot == 0, spec.lo, (slot + first_grid_end) * spec.every_us)
    return _Moves(pane, combined // slots, at, combined, leaving)


def _sorted_pairs(code: np.ndarray, enter: np.ndarray, leave: np.ndarray | None) -> _Moves:
    """`_sorted_moves` for (key, end) pairs that do not fit one int64: a lexicographic sort."""
    n = len(code)
    pane = np.arange(n) if leave is None else np.r_[np.arange(n), np.arange(n)]
    ends = enter if leave is None else np.r_[enter, leave]
    order = np.lexsort((ends, code[pane]))
    key, at = code[pane][order], ends[order]
    group = np.cumsum(np.r_[False, (key[1:] != key[:-1]) | (at[1:] != at[:-1])])
    return _Moves(pane[order], key, at, group, None if leave is None else order >= n)


def _check_range(partial: np.ndarray, feature: str) -> None:
    """numpy integers wrap around silently where Spark's sums fail: refuse partials that could overflow."""
    if len(partial) and float(np.abs(partial.astype(np.float64)).sum()) >= OVERFLOW_BOUND:
        raise DataError(
            f"Feature({feature!r}): its window sums could overflow a 64-bit integer (the values of one partition "
            f"add up to more than 2^62 in absolute value); sum a smaller unit or a float column"
        )
