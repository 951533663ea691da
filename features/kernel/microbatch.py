"""The stream's micro-batch over a held pane table (features.kernel.held): merge the batch's panes, emit the change
points the watermark passed, and drop the panes no later window reads. Pure numpy/pandas, no Spark; the meaning
of every value is docs/semantics.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from features.kernel.held import Held, folded_base, prune_cut
from features.kernel.plan import BASE, KEY, PANE, TS, Plan
from features.kernel.state import chunk_length
from features.kernel.summaries import value_rows
from features.kernel.table import KeyDictionary, Sorted, frame_of, pane_columns, phase1, renumbered


def prune(plan: Plan, table: pd.DataFrame, upto_us: int, align_us: int | None = None) -> pd.DataFrame:
    """Drop panes that no window ending after `upto` reads; fold those only Lifetime windows still read into
    each key's BASE row. With `align_us`, only whole stretches of that length go (stored chunks)."""
    cut = prune_cut(plan, (lambda: Sorted.of(plan, table)) if plan.session_conditions else None, upto_us, align_us)
    pane = table[PANE].to_numpy(dtype=np.int64)
    old = pane < cut  # BASE rows among them: each fold merges the newly old panes into them
    if not (old & (pane != BASE)).any():
        return table
    keep = table[~old]
    if all(c.bounded for c in plan.calcs):
        return renumbered(keep)
    return pd.concat([folded_base(plan, [], [table[old]]), keep], ignore_index=True)


@dataclass(frozen=True)
class Step:
    table: pd.DataFrame | None  # the pane table after the step (None when the step was on a `Held` table)
    rows: pd.DataFrame  # change points with window end in (after, upto]
    late: pd.DataFrame  # input events behind `after`: they would change rows already emitted
    next_change: int | None  # the first window end after `upto` where a value may change
    eager: pd.DataFrame | None = None  # the value at `eager_at` of each key the events touched
    folded: bool = False  # panes were folded into BASE rows: the keys' Lifetime partials changed
    changed: frozenset[int] = frozenset()  # the chunks whose rows changed, came or went


def advance(
    held: Held,
    events: pd.DataFrame,
    after: int | None,
    upto: int,
    align_us: int | None = None,
    eager_at: int | None = None,
    eager_after: int | None = None,
) -> Step:
    """One micro-batch for one bucket's keys (their codes, `fx_key`): merge the events' pane partials into the
    held table, emit the change points whose window end the watermark passed, and drop what no later window
    reads. The work grows with the chunks of panes the batch touches and the values it emits, not with the panes
    held (features.kernel.summaries).

    `after` is the watermark the previous step emitted up to: an event before the window end it closed
    (`Plan.closed_end`) is late (it would change a change point emitted already) and is returned instead of used;
    one between that end and `after` changes only rows still to come, and is used.

    `eager_at` (a window end ahead of the watermark): also the value there, from the events received so far, of
    each key the events touched and of each key whose value changes in (`eager_after`, `eager_at`] (a pane of an
    earlier batch closed, or left a window, since the previous eager value was written)."""
    plan = held.plan
    late = np.zeros(len(events), dtype=bool)
    if after is not None:
        late = events[TS].to_numpy(dtype=np.int64) < plan.closed_end(after)
    fresh = events[~late]
    changed = held.add(phase1(plan, fresh))
    key, end = held.changes(after, upto)  # only the window ends this step emits or brings eager values to
    rows = value_rows(held, key, end) if len(key) else _no_rows(plan)
    eager = None
    if eager_at is not None and held.chunks:  # an empty table (every pane pruned) has no value to give
        wanted = [fresh[KEY].to_numpy(dtype=np.int64)]
        if eager_after is not None and eager_after < eager_at:
            wanted.append(held.changes(eager_after, eager_at)[0])
        keys = np.unique(np.concatenate(wanted))
        eager = value_rows(held, keys, np.full(len(keys), eager_at, dtype=np.int64))
    folded, pruned = held.prune(upto, align_us)
    next_change = held.first_change(upto)  # (the panes `prune` dropped make no change after `upto`)
    return Step(None, rows, events[late], next_change, eager, folded, frozenset(changed | pruned))


def _no_rows(plan: Plan) -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in (KEY, "window_end", *(c.name for c in plan.calcs))})


def step(
    plan: Plan,
    table: pd.DataFrame | Sequence[pd.DataFrame],
    events: pd.DataFrame,
    after: int | None,
    upto: int,
    align_us: int | None = None,
    eager_at: int | None = None,
    eager_after: int | None = None,
) -> Step:
    """`advance` over a pane table given whole (or in chunks, in any order), keyed by the group's join keys or by
    the stream's key codes: the same step, and the pane table after it (`Step.table`)."""
    tables = [table] if isinstance(table, pd.DataFrame) else list(table)
    dictionary, given = None, events
    if plan.keys != (KEY,):  # the join keys as codes, as the stream's processor hands them
        dictionary = KeyDictionary(plan.keys)
        tables = [_coded(dictionary, t) for t in tables]
        events = _coded(dictionary, events)
    coded = replace(plan, keys=(KEY,))
    held = Held.of(coded, align_us or _chunk_of_step(coded, [*tables, events]), tables)
    out = advance(held, events, after, upto, align_us, eager_at, eager_after)
    after_step = held.frame()
    if dictionary is None:
        return replace(out, table=after_step)
    decoded = {k: v.to_numpy(zero_copy_only=False) for k, v in dictionary.decode(after_step[KEY].to_numpy()).items()}
    return replace(
        out,
        table=frame_of({**decoded, **{c: after_step[c] for c in pane_columns(coded)[1:]}}),
        rows=_decoded(dictionary, out.rows),
        late=given.loc[out.late.index],
        eager=None if out.eager is None else _decoded(dictionary, out.eager),
    )


STEP_CHUNKS = 8  # a table given whole (a test's, a rebuild's) is held in about this many chunks


def _chunk_of_step(plan: Plan, frames: list[pd.DataFrame]) -> int:
    """The chunk length to hold a table given whole in: the stream's, or an eighth of the time its panes and
    events span when longer (each chunk is a table of its own, which a table given at every step costs again)."""
    times = [f[c].to_numpy(dtype=np.int64) for f in frames for c in (PANE, TS) if c in f.columns]
    times = np.concatenate([np.zeros(0, np.int64), *times])
    times = times[times != BASE]
    span = int(times.max() - times.min()) if len(times) else 0
    return max(chunk_length(plan), -(-span // STEP_CHUNKS))


def _coded(dictionary: KeyDictionary, frame: pd.DataFrame) -> pd.DataFrame:
    codes, _ = dictionary.encode(frame)
    return frame.drop(columns=dictionary.keys).assign(**{KEY: codes})


def _decoded(dictionary: KeyDictionary, rows: pd.DataFrame) -> pd.DataFrame:
    """Rows keyed by codes, keyed by the join keys again (text as Arrow, as the batch engine's rows have it)."""
    out: dict[str, Any] = {}
    for k, values in dictionary.decode(rows[KEY].to_numpy(dtype=np.int64)).items():
        out[k] = (
            pd.arrays.ArrowExtensionArray(values)
            if pa.types.is_string(values.type)
            else values.to_numpy(zero_copy_only=False)
        )
    out.update({c: rows[c] for c in rows.columns if c != KEY})
    return frame_of(out)
