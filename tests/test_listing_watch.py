"""A live file stream says when Spark's file source spends a share of each trigger listing the source folder (it
lists every file there every time: docs/streaming.md, "Running a stream for months"). No Spark."""

from __future__ import annotations

from features.pipelines.stream.batch_progress import LISTING_BATCHES, ListingWatch


def _progress(latest_offset_ms: float) -> dict[str, object]:
    return {"durationMs": {"latestOffset": latest_offset_ms, "triggerExecution": latest_offset_ms + 500}}


def test_a_listing_that_takes_a_share_of_the_trigger_in_batches_in_a_row_is_told_with_the_fix() -> None:
    watch = ListingWatch("fresh", "/data/events", 1.0)
    told = [watch.observe(_progress(400)) for _ in range(LISTING_BATCHES)]
    assert told[:-1] == [None] * (LISTING_BATCHES - 1)  # one slow listing is the machine's
    assert told[-1] is not None
    assert told[-1].startswith("fresh: finding new files took 0.4s of the last trigger (every 1s)")
    assert "/data/events" in told[-1] and "Fix: move files out of the folder" in told[-1]
    assert "Running a stream for months" in told[-1]
    assert watch.seconds == 0.4  # the metric `listing_seconds`
    watch.observe(None)
    assert watch.seconds is None  # no progress: no metric


def test_it_is_told_again_only_when_the_listing_has_doubled() -> None:
    watch = ListingWatch("fresh", "/data/events", 1.0)
    for _ in range(LISTING_BATCHES):
        first = watch.observe(_progress(400))
    assert first is not None
    assert [watch.observe(_progress(700)) for _ in range(5)] == [None] * 5
    again = watch.observe(_progress(800))
    assert again is not None and "took 0.8s" in again


def test_a_fast_listing_between_slow_ones_starts_the_count_again() -> None:
    watch = ListingWatch("fresh", "/data/events", 1.0)
    for _ in range(LISTING_BATCHES - 1):
        assert watch.observe(_progress(400)) is None
    assert watch.observe(_progress(50)) is None
    assert watch.observe(_progress(400)) is None  # the count starts again


def test_the_bound_is_a_share_of_the_trigger_with_a_floor() -> None:
    minute = ListingWatch("slow", "/data/events", 60.0)  # 18 s of listing before a minute's trigger says so
    assert all(minute.observe(_progress(10_000)) is None for _ in range(LISTING_BATCHES + 2))
    second = ListingWatch("fast", "/data/events", 0.1)  # the floor: 0.2 s, not 0.03
    assert all(second.observe(_progress(100)) is None for _ in range(LISTING_BATCHES + 2))
    assert all(second.observe(None) is None for _ in range(LISTING_BATCHES + 2))  # no progress yet
