"""The commands' options as values (features.pipelines.options), without Spark: the command line builds each once,
a wrong one raises as it is built (before the repo loads or Spark starts) naming its flag, and a backfill's time is
split by its laps. tests/test_stream.py runs `features stream` with wrong options."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from features.cli import build_parser
from features.cli_backfill import backfill_options
from features.errors import FeaturesError
from features.pipelines import backfill
from features.pipelines.options import BackfillOptions, StreamOptions


def test_the_backfill_flags_become_one_options_value() -> None:
    args = build_parser().parse_args(
        ["backfill", "--since-last", "--no-online", "--no-tracking", "--on-invalid", "quarantine"]
    )
    assert backfill_options(args) == BackfillOptions(online=False, on_invalid="quarantine", track=False)
    assert backfill_options(build_parser().parse_args(["backfill", "--since-last"])) == BackfillOptions()
    with pytest.raises(FrozenInstanceError):
        BackfillOptions().online = False  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_files_per_trigger": 0}, "--max-files-per-trigger: 0 is not a positive number of files"),
        ({"buckets": 0}, "--buckets: 0 is not a positive number of hash buckets"),
        ({"trigger": "soon"}, "--trigger: cannot read the duration 'soon'"),
        ({"metrics_every": "0s"}, "--metrics-every: '0s' is zero"),
        ({"retention": "a month"}, "--retention: cannot read the duration 'a month'"),
    ],
)
def test_a_wrong_stream_option_raises_as_the_options_are_built(options: dict, message: str) -> None:
    with pytest.raises(FeaturesError) as raised:
        StreamOptions(**options)
    assert str(raised.value).startswith(message), raised.value


def test_stream_options_read_as_the_queries_take_them() -> None:
    assert StreamOptions(trigger="2m").spark_trigger == {"processingTime": "120 seconds"}
    assert StreamOptions(trigger="2m", available_now=True).spark_trigger == {"availableNow": True}
    assert StreamOptions(retention=None).keep_seconds is None
    assert StreamOptions().keep_seconds == 30 * 86_400 and StreamOptions().metrics_seconds == 60


def test_laps_add_the_time_since_the_last_lap_to_its_name(monkeypatch) -> None:
    clock = iter([10.0, 12.5, 13.0, 17.0, 20.0])
    monkeypatch.setattr(backfill.time, "perf_counter", lambda: next(clock))
    laps = backfill.Laps()  # 10.0
    laps.lap("plan")  # 12.5
    laps.lap("offline")  # 13.0
    laps.lap("plan")  # 17.0
    assert laps.seconds == {"plan": 6.5, "offline": 0.5}
    assert laps.total() == 10.0  # 20.0
