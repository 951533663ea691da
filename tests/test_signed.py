"""The vectorized phase 2 of counts and integer sums (features.engine.signed), without Spark: against a
direct evaluation of the window sums at every window end."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from features.engine.signed import SignedSpec, signed_changes
from features.errors import DataError

EVERY = 10
SIZE = 30


def spec(lo: int, hi: int, size: int | None = SIZE, keys: tuple[str, ...] = ("k",)) -> SignedSpec:
    return SignedSpec(
        keys=keys,
        pane="pane",
        flags=("n",),
        values=("n", "s"),
        out=("n_out", "s_out"),
        features=("n", "s"),
        end="e",
        every_us=EVERY,
        size_us=size,
        lo=lo,
        hi=hi,
    )


def panes(rng: np.random.Generator, n: int) -> pa.Table:
    """Random (key, pane) rows with a count (sometimes 0: a pane whose rows all fail the condition) and a
    nullable sum; a second key column for composite keys; panes of half `every` (a gcd pane length)."""
    counts = rng.integers(0, 3, n)
    sums = [None if c == 0 or x % 4 == 0 else int(x) - 50 for c, x in zip(counts, rng.integers(0, 100, n), strict=True)]
    return pa.table(
        {
            "k": pa.array(rng.choice(["a", "b", "c", "d"], n)),
            "k2": pa.array(rng.integers(0, 2, n), type=pa.int64()),
            "pane": pa.array(rng.choice(np.arange(-5, 40), n, replace=False) * EVERY // 2, type=pa.int64()),
            "n": pa.array(counts, type=pa.int64()),
            "s": pa.array(sums, type=pa.int64()),  # a pane without counted rows has no sum
        }
    )


def run(table: pa.Table, s: SignedSpec) -> pa.Table:
    batches = table.to_batches(max_chunksize=7)  # several batches per partition, as Spark sends them
    out = list(signed_changes(iter(batches), s))
    return pa.Table.from_batches(out) if out else pa.table({})


def value_at(table: pa.Table, s: SignedSpec, key: tuple, end: int) -> tuple[int, int]:
    """The window sums of one key at window end `end`, straight from the definition."""
    rows = table.to_pylist()
    lo_ts = None if s.size_us is None else end - s.size_us
    n = total = 0
    for r in rows:
        if tuple(r[k] for k in s.keys) != key:
            continue
        if r["pane"] < end and (lo_ts is None or r["pane"] >= lo_ts):
            n += r["n"]
            total += r["s"] or 0
    return n, total


@pytest.mark.parametrize("size", [SIZE, None], ids=["hop", "lifetime"])
@pytest.mark.parametrize("keys", [("k",), ("k", "k2")], ids=["one-key", "two-keys"])
@pytest.mark.parametrize("lo", [-100, 0, 45, 120])
def test_as_of_values_match_the_window_sums(size: int | None, keys: tuple[str, ...], lo: int) -> None:
    rng = np.random.default_rng(lo + 1000 * len(keys) + (size or 0))
    table = panes(rng, 40)
    s = spec(lo, 400, size, keys)
    out = run(table, s).to_pylist()
    ends = [r["e"] for r in out]
    assert all(lo <= e <= 400 for e in ends)
    series: dict[tuple, list[dict]] = {}
    for r in out:
        series.setdefault(tuple(r[k] for k in keys), []).append(r)
    for rows in series.values():
        assert [r["e"] for r in rows] == sorted({r["e"] for r in rows}), "one row per (key, end), in order"
    all_keys = {tuple(r[k] for k in keys) for r in table.to_pylist()}
    for key in all_keys:
        rows = series.get(key, [])
        for t in range(lo, 401):
            before = [r for r in rows if r["e"] <= t]
            got = (before[-1]["n_out"], before[-1]["s_out"]) if before else (0, 0)
            # The value at t: the window ending at the last multiple of `every` <= t.
            want = value_at(table, s, key, t - t % EVERY)
            assert got == want, f"key={key} t={t}: got {got}, want {want}"


def test_panes_without_rows_make_no_rows() -> None:
    table = pa.table(
        {
            "k": ["a", "a"],
            "pane": pa.array([0, 10], type=pa.int64()),
            "n": pa.array([0, 0], type=pa.int64()),
            "s": pa.array([None, None], type=pa.int64()),
        }
    )
    assert run(table, spec(0, 100)).num_rows == 0


def test_rows_at_entry_and_exit() -> None:
    table = pa.table(
        {
            "k": ["a", "a", "b"],
            "pane": pa.array([0, 15, 0], type=pa.int64()),
            "n": pa.array([2, 1, 1], type=pa.int64()),
            "s": pa.array([5, None, -3], type=pa.int64()),
        }
    )
    out = run(table, spec(0, 100)).to_pylist()
    a = [(r["e"], r["n_out"], r["s_out"]) for r in out if r["k"] == "a"]
    # pane 0 enters at 10, leaves at 40; pane 15 (coarse 10) enters at 20, leaves at 50
    assert a == [(10, 2, 5), (20, 3, 5), (40, 1, 0), (50, 0, 0)]
    b = [(r["e"], r["n_out"], r["s_out"]) for r in out if r["k"] == "b"]
    assert b == [(10, 1, -3), (40, 0, 0)]


def test_earlier_moves_land_on_the_range_start() -> None:
    table = pa.table(
        {
            "k": ["a", "a"],
            "pane": pa.array([0, 20], type=pa.int64()),
            "n": pa.array([1, 1], type=pa.int64()),
            "s": pa.array([1, 1], type=pa.int64()),
        }
    )
    out = run(table, spec(25, 100)).to_pylist()
    # at 25: pane 0 (entered at 10) still in, pane 20 not yet; then 30: +1, 40: -1, 60: -1
    assert [(r["e"], r["n_out"]) for r in out] == [(25, 1), (30, 2), (40, 1), (60, 0)]


def test_sums_that_could_overflow_are_refused() -> None:
    big = 2**61
    table = pa.table(
        {
            "k": ["a", "a", "a"],
            "pane": pa.array([0, 10, 20], type=pa.int64()),
            "n": pa.array([1, 1, 1], type=pa.int64()),
            "s": pa.array([big, big, big], type=pa.int64()),
        }
    )
    with pytest.raises(DataError, match=r"Feature\('s'\): its window sums could overflow a 64-bit integer"):
        run(table, spec(0, 100))


def test_order_by_key_and_end_without_a_combined_code() -> None:
    """When (key, end slot) does not fit one int64, the moves are still ordered by key, then end."""
    from features.engine.signed import _sorted_moves

    code = np.array([3, 0, 1, 0], dtype=np.int64)
    enter = np.array([2**61, 5, 7, 1], dtype=np.int64)
    leave = enter + 2**61
    s = SignedSpec((), "p", (), (), (), (), "e", every_us=1, size_us=2**61, lo=0, hi=0)
    moves = _sorted_moves(code, enter, leave, s)
    assert list(zip(moves.key, moves.at, strict=True)) == [
        (0, 1),
        (0, 5),
        (0, 2**61 + 1),
        (0, 2**61 + 5),
        (1, 7),
        (1, 2**61 + 7),
        (3, 2**61),
        (3, 2**62),
    ]
    assert list(moves.pane) == [3, 1, 3, 1, 2, 2, 0, 0]
    assert list(moves.leaving) == [False, False, True, True, False, True, False, True]
    assert len(set(moves.order)) == 8
