"""No silent hang (features.engine.watchdog; docs/operations.md, "A command that stops making progress").

Without Spark: when the watchdog calls a process quiet, stuck and stalled, on a simulated clock. With Spark: a stall
injected for real (every task slot held by a job that sleeps, so the command's own jobs never get a task, as in the
hang of issue 71), under which `features backfill` and `features stream` end with their `error:` line and status 4
within the limit, `features status` says the stream is stuck meanwhile, and the session works afterwards."""

from __future__ import annotations

import io
import threading
import time

import pandas as pd
import pytest
from test_batch_reference import make_events
from test_failed_commit import repo_with
from test_stream import PAIR_GROUP, arrival_order, land

from features.engine import watchdog
from features.engine.watchdog import Quietness, StageView, StallLimit, Watchdog, watching
from features.errors import ConfigError, JobStalled
from features.pipelines.stream import handoff


def stage(done: int = 0, read: int = 0, number: int = 7) -> StageView:
    return StageView(number, 0, "collect at offline.py:12", 4, 0, done, 0, (read,))


class Clock:
    """Seconds that pass only when the watchdog looks."""

    def __init__(self, step: float = 1.0) -> None:
        self.now, self.step = 1_000_000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_quiet_is_counted_from_the_last_change_of_the_active_stages() -> None:
    quietness = Quietness()
    assert quietness.look((), 10.0) is None  # no job: the driver's own work, or a stream waiting for data
    assert quietness.look((stage(),), 11.0).since == 11.0
    assert quietness.look((stage(),), 20.0).since == 11.0
    assert quietness.look((stage(done=1),), 25.0).since == 25.0  # a task finished
    assert quietness.look((stage(done=1, read=10),), 26.0).since == 26.0  # bytes read by a running task
    assert quietness.look((stage(done=1, read=10), stage(number=8)), 27.0).since == 27.0  # a stage submitted
    assert quietness.look((), 28.0) is None
    assert quietness.look((stage(),), 29.0).since == 29.0


def test_a_stall_cancels_the_jobs_and_ends_the_command_with_the_stage_and_the_setting() -> None:
    cancelled = threading.Event()
    out = io.StringIO()
    options = {"stages": lambda: (stage(),), "cancel": cancelled.set, "clock": Clock(), "poll_s": 0.001, "out": out}
    with pytest.raises(JobStalled) as raised, watching("backfill", StallLimit(60, "--stall-timeout"), **options):
        assert cancelled.wait(10)
        raise RuntimeError("Job 3 cancelled")  # what the cancelled call raises
    message = str(raised.value)
    assert "features backfill: Spark made no progress for 1m" in message
    assert "stage 7 (collect at offline.py:12): 0 of 4 tasks running, 0 done" in message
    assert "--stall-timeout sets how long" in message and "Fix: run it again" in message
    assert isinstance(raised.value.__cause__, RuntimeError)
    dump = out.getvalue()
    assert "no progress since" in dump and "stage 7" in dump
    assert "thread MainThread" in dump and "test_watchdog.py" in dump  # every Python thread's stack
    assert watchdog.current() is None


def test_a_failure_absorbed_on_the_way_still_ends_the_command() -> None:
    cancelled = threading.Event()
    options = {"stages": lambda: (stage(),), "cancel": cancelled.set, "clock": Clock(), "poll_s": 0.001}
    with (
        pytest.raises(JobStalled),
        watching("verify", StallLimit(5, "FEATURES_STALL_TIMEOUT"), out=io.StringIO(), **options),
    ):
        assert cancelled.wait(10)


def test_a_command_the_cancellation_cannot_reach_is_ended_by_the_watchdog(monkeypatch) -> None:
    exited = threading.Event()
    codes: list[int] = []
    monkeypatch.setattr(watchdog.os, "_exit", lambda code: codes.append(code) or exited.set())
    out = io.StringIO()
    dog = Watchdog("stream", StallLimit(5, "--stall-timeout"), stages=lambda: (stage(),), cancel=lambda: None,
                   clock=Clock(), poll_s=0.001, grace_s=0.05, out=out).start()  # fmt: skip
    try:
        assert exited.wait(10)
    finally:
        dog.stop()
    assert codes == [watchdog.EXIT_STALLED]
    assert out.getvalue().splitlines()[-1].startswith("error: features stream: Spark made no progress for 5s")


def test_moving_or_idle_jobs_never_stall() -> None:
    seen = iter(range(10**9))
    moving = Watchdog("backfill", StallLimit(3, "x"), stages=lambda: (stage(done=next(seen)),), cancel=pytest.fail,
                      clock=Clock(), poll_s=0.001).start()  # fmt: skip
    idle = Watchdog("backfill", StallLimit(3, "x"), stages=tuple, cancel=pytest.fail, clock=Clock(), poll_s=0.001)
    idle.start()
    time.sleep(0.3)
    for dog in (moving, idle):
        dog.stop()
        assert dog.stalled is None
    assert moving.quiet is not None and idle.quiet is None


def test_stuck_is_said_after_half_the_limit_or_thirty_seconds() -> None:
    clock = Clock(step=0.0)
    dog = Watchdog("stream", StallLimit(20, "x"), clock=clock)
    dog.quiet = Quietness().look((stage(),), clock.now)
    clock.now += 9
    assert dog.stuck() is None
    clock.now += 1
    assert dog.stuck() is dog.quiet
    observing = Watchdog("stream", StallLimit(0, "x"), clock=clock)  # a stream's run outside a watched command
    observing.quiet = dog.quiet
    assert observing.stuck() is None
    clock.now += 20
    assert observing.stuck() is observing.quiet


def test_the_stall_limit_comes_from_the_flag_then_the_environment_then_ten_minutes(monkeypatch) -> None:
    monkeypatch.delenv(watchdog.STALL_ENV, raising=False)
    assert StallLimit.parse(None) == StallLimit(600, "--stall-timeout (default 10m)")
    monkeypatch.setenv(watchdog.STALL_ENV, "15m")
    assert StallLimit.parse(None) == StallLimit(900, "FEATURES_STALL_TIMEOUT")
    assert StallLimit.parse("90s") == StallLimit(90, "--stall-timeout")
    assert StallLimit.parse("off").seconds == StallLimit.parse("0").seconds == 0


@pytest.mark.parametrize("value", ["10", "-5m", "soon"])
def test_a_stall_limit_that_is_no_duration_is_refused_with_the_fix(value) -> None:
    with pytest.raises(ConfigError, match=r"^--stall-timeout: .*Fix: write a whole number and one unit.*or 0 to turn"):
        StallLimit.parse(value)


def test_the_marker_says_since_when_and_where_a_stream_is_stuck(tmp_path) -> None:
    handoff.hold(tmp_path, live=True)
    held = handoff.holder(tmp_path, include_self=True)
    assert held is not None and "stuck" not in held.describe()
    handoff.note_stuck(tmp_path, ("2026-12-06 17:40:02 UTC", "stage 7 (collect at offline.py:12)"))
    held = handoff.holder(tmp_path, include_self=True)
    assert held is not None
    assert held.describe().endswith(
        "stuck since 2026-12-06 17:40:02 UTC (no Spark task started or finished, nothing read) in stage 7 "
        "(collect at offline.py:12)"
    )
    handoff.note_stuck(tmp_path, None)
    held = handoff.holder(tmp_path, include_self=True)
    assert held is not None and held.stuck is None
    handoff.release(tmp_path)


# ---------------------------------------------------------------------------------------------------------
# A real stall: every task slot held by a job that sleeps


class Blocker:
    """A job holding every task slot of the session for up to `seconds`, cancelled by the watchdog (its tasks'
    threads interrupted, so that their Python workers go too)."""

    def __init__(self, spark, seconds: float = 120.0) -> None:
        self.spark, self.seconds = spark, seconds
        self.ended = threading.Event()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        context, seconds = self.spark.sparkContext, self.seconds
        context.setJobGroup("test-blocker", "holds every task slot", interruptOnCancel=True)
        slots = context.defaultParallelism
        try:
            context.parallelize(range(slots), slots).map(lambda x: time.sleep(seconds) or x).collect()
        except Exception as exc:  # cancelled, as it should be
            self.error = exc
        finally:
            self.ended.set()

    def __enter__(self) -> Blocker:
        self.thread.start()
        tracker = self.spark.sparkContext.statusTracker()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            if any(s is not None and s.numActiveTasks == self.spark.sparkContext.defaultParallelism for s in stages):
                return self
            time.sleep(0.1)
        raise AssertionError("the blocking job never held every slot")

    def __exit__(self, *exc: object) -> None:
        self.spark.sparkContext.cancelJobGroup("test-blocker")
        assert self.ended.wait(30)


@pytest.mark.spark
def test_a_backfill_whose_jobs_get_no_task_ends_with_its_error_line_within_the_limit(
    spark, feast_repo_factory, tmp_path, capsys
) -> None:
    from features.cli import main

    root = tmp_path / "repo"
    repo_with(root, make_events(), feast_repo_factory)
    args = ["backfill", "--repo", str(root), "--start", "2026-01-01", "--end", "2026-01-02", "--no-tracking"]
    with Blocker(spark) as blocker:
        started = time.monotonic()
        status = main([*args, "--stall-timeout", "4s"])
        took = time.monotonic() - started
        assert blocker.ended.wait(30) and blocker.error is not None  # cancelled with the command's jobs
    err = capsys.readouterr().err
    assert status == watchdog.EXIT_STALLED
    assert took < 4 + 30
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: features backfill: Spark made no progress for ")
    assert "--stall-timeout sets how long no progress is waited for" in last
    assert "stage" in last and "tasks running" in last
    assert "Python threads:" in err
    assert main(args) == 0  # the session goes on: the same backfill, run again, is done


@pytest.mark.spark
def test_a_stream_whose_batch_gets_no_task_is_said_stuck_then_ends_and_its_restart_writes_each_row_once(
    spark, feast_repo_factory, tmp_path, capsys
) -> None:
    from test_stream import assert_batch_engine_rows, offline_rows

    from features.cli import main
    from features.pipelines.status import status, status_lines
    from features.pipelines.stream import stream
    from features.repo import Repo

    events = make_events()
    cut = events["event_ts"].min() + (events["event_ts"].max() - events["event_ts"].min()) / 2
    root = tmp_path / "repo"
    repo = repo_with(root, events[events["event_ts"] < cut], feast_repo_factory)
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()  # a batch committed
    land(root, arrival_order(events[events["event_ts"] >= cut], pd.Timedelta(minutes=20), seed=6), 1, 2)
    said: list[str] = []

    def watch_status() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not said:
            lines = status_lines(status(Repo.load(root)))
            said.extend(line for line in lines if line.startswith("  stream ") and "stuck since" in line)
            time.sleep(0.5)

    with Blocker(spark):
        watcher = threading.Thread(target=watch_status, daemon=True)
        watcher.start()
        code = main(["stream", "--repo", str(root), "--available-now", "--no-tracking", "--stall-timeout", "8s"])
        watcher.join(5)
    err = capsys.readouterr().err
    assert code == watchdog.EXIT_STALLED
    assert err.strip().splitlines()[-1].startswith("error: features stream: Spark made no progress for ")
    assert said and "streamed now by" in said[0] and "tasks running" in said[0]
    run = stream(repo, available_now=True, progress=False, tracking=False)  # as the scheduler restarts it
    run.await_termination()
    watermark = pd.Timestamp(run.progress()[0].watermark)
    assert watermark >= cut  # the events of the stopped batch are in
    assert_batch_engine_rows(spark, PAIR_GROUP, offline_rows(spark, repo, PAIR_GROUP), events, watermark)


def test_a_context_still_being_made_has_no_stage() -> None:
    """PySpark names a SparkContext active before it has made its Java half: a look then sees no stage (it raised
    AttributeError in the watchdog's thread, whose traceback a stream printed before its first batch)."""

    class Unborn:
        pass

    assert watchdog.active_stages(Unborn()) == ()
