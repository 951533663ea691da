"""The JVM's stderr as this process passes it on (features.engine.jvm_output): the worker chatter out, all
else unchanged and at once."""

from __future__ import annotations

import os
import threading

from features.engine.jvm_output import copy_lines

CHATTER = (
    b"Starting Streaming TransformWithStateInPandas Python worker.\n\n"
    b"Streaming TransformWithStateInPandas Python worker finish init stage of Python runner. Received UDF\n\n"
)


def passed_on(*chunks: bytes, at_once: bool = False) -> bytes:
    """What copy_lines writes for `chunks` written one after another; with `at_once`, each chunk must have been
    passed on whole before the next is written."""
    source_r, source_w = os.pipe()
    target_r, target_w = os.pipe()
    thread = threading.Thread(target=copy_lines, args=(source_r, target_w))
    thread.start()
    seen = b""
    for chunk in chunks:
        os.write(source_w, chunk)
        if at_once:
            seen += os.read(target_r, 65536)
            assert seen.endswith(chunk), (seen, chunk)
    os.close(source_w)
    thread.join(10)
    os.close(target_w)
    while part := os.read(target_r, 65536):
        seen += part
    os.close(source_r)
    os.close(target_r)
    return seen


def test_worker_chatter_and_the_incubator_warning_are_left_out() -> None:
    log = b"26/11/27 07:12:12 ERROR Executor: a real error\n"
    got = passed_on(b"WARNING: Using incubator modules: jdk.incubator.vector\n", CHATTER, log, b"\nend\n")
    assert got == log + b"\nend\n"  # an empty line of Spark's own stays


def test_lines_split_across_reads_are_judged_whole() -> None:
    got = passed_on(CHATTER[:20], CHATTER[20:70], CHATTER[70:], b"Traceback (most recent call last):\n")
    assert got == b"Traceback (most recent call last):\n"


def test_a_line_being_written_passes_at_once() -> None:
    """Spark's console progress bar redraws one line with carriage returns: each redraw shows when written, and
    the rest of a line already shown is never judged as noise."""
    bars = [b"\r[Stage 1:>  (0 + 2) / 2]", b"\r[Stage 1:>  (1 + 1) / 2]"]
    rest = b"Starting Streaming TransformWithStateInPandas Python worker.\n"
    got = passed_on(*bars, rest, at_once=True)
    assert got == b"".join(bars) + rest
