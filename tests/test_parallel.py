"""features.parallel.beside: two pieces of a step side by side, both waited for, no error lost."""

from __future__ import annotations

import threading

import pytest

from features.parallel import beside


def test_both_run_at_once_and_the_foregrounds_result_comes_back() -> None:
    both = threading.Barrier(2, timeout=5)  # only passes when the two run at the same time
    assert beside(both.wait, lambda: (both.wait(), "done")[1]) == "done"
    assert beside(None, lambda: 3) == 3
    ran = []
    assert beside(lambda: ran.append(1), None) is None
    assert ran == [1]


def test_the_background_is_waited_for_and_its_error_raised() -> None:
    finished = threading.Event()

    def slow_failure() -> None:
        finished.wait(0.2)
        raise ValueError("commit refused")

    with pytest.raises(ValueError, match="commit refused"):
        beside(slow_failure, lambda: 1)


def test_a_foreground_error_notes_the_backgrounds_too() -> None:
    def background() -> None:
        raise ValueError("commit refused")

    def foreground() -> None:
        raise RuntimeError("online store down")

    with pytest.raises(RuntimeError, match="online store down") as raised:
        beside(background, foreground)
    assert "The work beside it failed too: ValueError: commit refused" in raised.value.__notes__
