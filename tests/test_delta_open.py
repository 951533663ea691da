"""Delta tables kept open between micro-batches (features.stores.delta_open): always the newest version, never a
table deleted and made anew at the same path."""

from __future__ import annotations

import shutil

import pyarrow as pa
from deltalake import write_deltalake

from features.stores.delta_open import newest


def _rows(*values: int) -> pa.Table:
    return pa.table({"v": pa.array(values, pa.int64())})


def test_an_open_table_sees_commits_made_by_others(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(1))
    first = newest(table)
    write_deltalake(table, _rows(2), mode="append")  # another writer, by path
    again = newest(table)
    assert again is first  # kept open, brought up to date
    assert again.version() == 1
    assert sorted(again.to_pyarrow_table()["v"].to_pylist()) == [1, 2]


def test_a_write_through_the_open_table_moves_it_on(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(1))
    write_deltalake(newest(table), _rows(2), mode="append")
    write_deltalake(newest(table), _rows(3), mode="append")
    assert newest(table).version() == 2
    assert sorted(newest(table).to_pyarrow_table()["v"].to_pylist()) == [1, 2, 3]


def test_a_table_made_anew_at_the_same_path_is_opened_afresh(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(table, _rows(1))
    write_deltalake(table, _rows(2), mode="append")
    held = newest(table)
    shutil.rmtree(table)  # a reset: the same path, the same number of commits, other rows
    write_deltalake(table, _rows(7))
    write_deltalake(table, _rows(8), mode="append")
    now = newest(table)
    assert now is not held
    assert sorted(now.to_pyarrow_table()["v"].to_pylist()) == [7, 8]
