"""Two pieces of one step side by side: Spark's work in a thread while this one does Python's."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def beside(background: Callable[[], object] | None, foreground: Callable[[], T] | None) -> T | None:
    """Run `background` in a thread while `foreground` runs in this one, and wait for both (a running Spark job
    cannot be called back); either may be None. Raises `foreground`'s error (noting `background`'s too) or else
    `background`'s."""
    if background is None:
        return foreground() if foreground is not None else None
    if foreground is None:
        background()
        return None
    with ThreadPoolExecutor(1, thread_name_prefix="features-beside") as pool:
        future = pool.submit(background)
        try:
            result = foreground()
        except BaseException as exc:
            if (also := future.exception()) is not None:
                exc.add_note(f"The work beside it failed too: {type(also).__name__}: {also}")
            raise
        if (error := future.exception()) is not None:
            raise error
        return result
