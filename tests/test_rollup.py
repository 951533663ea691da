"""A long stream's batch metrics reach MLflow rolled up, one point per interval (features.pipelines.rollup);
no Spark."""

from __future__ import annotations

import pytest

from features.pipelines.rollup import MetricRollup


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _rollup(interval_s: float = 60.0) -> tuple[MetricRollup, list[tuple[dict[str, float], int, str | None]], _Clock]:
    logged: list[tuple[dict[str, float], int, str | None]] = []
    clock = _Clock()
    rollup = MetricRollup(lambda m, step, group: logged.append((dict(m), step, group)), interval_s, clock)
    return rollup, logged, clock


def test_a_day_at_one_second_triggers_is_one_point_per_minute_and_metric() -> None:
    rollup, logged, clock = _rollup()
    batches = 24 * 3600
    for batch in range(batches):
        clock.now = float(batch)
        rollup.add({"events": 10, "state_rows": batch, "batch_seconds": 0.5 + (batch % 2)}, batch, "g")
    rollup.flush()
    assert len(logged) == batches // 60
    assert sum(points["events"] for points, _, _ in logged) == 10 * batches  # counts add up exactly
    steps = [step for _, step, _ in logged]
    assert steps == sorted(steps) and steps[-1] == batches - 1
    assert logged[-1][0]["state_rows"] == batches - 1  # a level keeps its last value
    assert all(points["batch_seconds"] == pytest.approx(1.0, abs=0.02) for points, _, _ in logged)
    assert all(points["batch_seconds_max"] == 1.5 for points, _, _ in logged)


def test_a_failed_validation_shows_in_its_interval() -> None:
    rollup, logged, clock = _rollup(interval_s=10)
    for batch, success in enumerate([1.0, 1.0, 0.0, 1.0]):
        clock.now = batch * 2.0
        rollup.add({"success": success, "rows": 5}, batch, "g.validation")
    rollup.flush()
    assert logged == [({"success": 0.0, "rows": 20.0}, 3, "g.validation")]


def test_flush_logs_only_what_is_pending() -> None:
    rollup, logged, _ = _rollup()
    rollup.flush()
    assert logged == []
    rollup.add({"late": 2, "freshness_seconds": None}, 7, None)
    rollup.flush()
    rollup.flush()
    assert logged == [({"late": 2.0}, 7, None)]
