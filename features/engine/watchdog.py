"""No silent hang: a thread that watches this process's Spark jobs and ends a command whose jobs stop moving
(docs/operations.md, "A command that stops making progress").

Every two seconds it reads the active stages from Spark's status store. Progress is any change there: a task
started, finished or failed, a stage submitted or done, bytes or records read, shuffled, written or spilled
(running tasks report theirs with the executors' heartbeats, every 10 s). No active stage is not quiet: the
driver is doing its own work (a Delta commit, the online write) or a stream waits for data.

Quiet for the stall limit, the command is stalled: the watchdog prints what it knows (the stages, every Python
thread's stack), cancels the jobs, and the command ends with one `error:` line (`JobStalled`). A command that has
not ended GRACE_S after the cancellation (a call the cancellation cannot reach) is ended by the watchdog itself,
with the same line and status.

A stream's run shows its quiet in its checkpoint's marker (features.pipelines.stream.handoff), so that
`features status` says "stuck since" while a stream hangs, from any process. On Spark Connect the client sees no
status store: the watchdog sees no stage there, and the server's own limits apply.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from features.errors import ConfigError, DefinitionError, JobStalled
from features.spec.durations import format_duration, parse_duration

STALL_ENV = "FEATURES_STALL_TIMEOUT"
DEFAULT_STALL = "10m"
POLL_S = 2.0
GRACE_S = 60.0  # after the cancellation, how long the command has to end by itself
STUCK_AFTER_S = 30.0  # quiet this long, a stream's marker says it is stuck (or half the limit, when shorter)
EXIT_STALLED = 4


@dataclass(frozen=True)
class StallLimit:
    """How long Spark may make no progress before the command is ended; 0: never."""

    seconds: int
    named: str  # how it was set, for the error's fix

    @staticmethod
    def parse(flag_value: str | None, flag: str = "--stall-timeout") -> StallLimit:
        """From the command's flag, else FEATURES_STALL_TIMEOUT, else 10 minutes; "0" or "off" turns it off."""
        if flag_value is not None:
            value, named = flag_value, flag
        elif os.environ.get(STALL_ENV):
            value, named = os.environ[STALL_ENV], STALL_ENV
        else:
            value, named = DEFAULT_STALL, f"{flag} (default {DEFAULT_STALL})"
        if value.strip().lower() in ("0", "off"):
            return StallLimit(0, named)
        try:
            return StallLimit(parse_duration(value, named), named)
        except DefinitionError as exc:
            raise ConfigError(f"{named}: {exc.problem}. Fix: {exc.fix}, or 0 to turn the watchdog off") from None


@dataclass(frozen=True)
class StageView:
    """An active stage as the status store shows it."""

    stage: int
    attempt: int
    name: str
    tasks: int
    running: int
    done: int
    failed: int
    moved: tuple[int, ...]  # records read, shuffled and written, bytes spilled

    def describe(self) -> str:
        return f"stage {self.stage} ({self.name}): {self.running} of {self.tasks} tasks running, {self.done} done" + (
            f", {self.failed} failed" if self.failed else ""
        )


@dataclass(frozen=True)
class Quiet:
    """Since when the active stages have not moved."""

    since: float  # seconds since the epoch
    stages: tuple[StageView, ...]

    def describe(self) -> str:
        return "; ".join(stage.describe() for stage in self.stages)

    def since_text(self) -> str:
        return datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Quietness:
    """Told the active stages at each look, says since when they have not moved (None: no stage active)."""

    def __init__(self) -> None:
        self._seen: tuple[StageView, ...] = ()
        self._since = 0.0

    def look(self, stages: tuple[StageView, ...], now: float) -> Quiet | None:
        if not stages:
            self._seen = ()
            return None
        if stages != self._seen:
            self._seen, self._since = stages, now
        return Quiet(self._since, stages)


_CONVERTERS: dict[int, Any] = {}
_NAMES: dict[int, dict[int, str]] = {}  # per context, the active stages' names (a name never changes)


def active_stages(context: Any) -> tuple[StageView, ...]:
    """The active stages of a classic SparkContext, from its status store (the listener Spark's UI reads, kept
    whether the UI runs or not)."""
    jsc = getattr(context, "_jsc", None)
    if jsc is None:  # still being made (PySpark names the context active first), or stopped
        return ()
    # Two calls when no stage is active (most looks of a stream between batches); each name the JVM resolves is a
    # call of its own, so the converter is looked up once.
    if not jsc.statusTracker().getActiveStageIds():
        return ()
    converters = _CONVERTERS.get(id(context))
    if converters is None:
        converters = _CONVERTERS[id(context)] = context._jvm.scala.jdk.javaapi.CollectionConverters
    views, known, names = [], _NAMES.get(id(context), {}), {}
    for s in converters.asJava(jsc.sc().statusStore().activeStages()):
        # Records, not bytes: both move together, and each getter is a call to the JVM.
        moved = (
            s.inputRecords(),
            s.outputRecords(),
            s.shuffleReadRecords(),
            s.shuffleWriteRecords(),
            s.memoryBytesSpilled(),
        )
        stage, attempt = s.stageId(), s.attemptId()
        name = names[stage] = known.get(stage) or s.name()
        done, failed = s.numCompleteTasks(), s.numFailedTasks() + s.numKilledTasks()
        views.append(StageView(stage, attempt, name, s.numTasks(), s.numActiveTasks(), done, failed, moved))
    _NAMES[id(context)] = names  # only the active ones: a stream runs stages for months
    return tuple(sorted(views, key=lambda v: (v.stage, v.attempt)))


def _active_context() -> Any:
    """The active SparkContext, never importing PySpark: an import in this thread racing the command's own import
    of it fails with a partly initialized module. No context exists before PySpark is imported anyway."""
    module = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    spark_context = getattr(module, "SparkContext", None)
    return getattr(spark_context, "_active_spark_context", None)


def _spark_stages() -> tuple[StageView, ...]:
    context = _active_context()
    if context is None:  # no session yet, or Spark Connect
        return ()
    from py4j.protocol import Py4JError  # imported by then, with the context

    try:
        return active_stages(context)
    except Py4JError:  # the JVM is going away with the command's end
        return ()


def _cancel_jobs() -> None:
    context = _active_context()
    if context is not None and getattr(context, "_jsc", None) is not None:
        context.cancelAllJobs()


_current: Watchdog | None = None
_current_lock = threading.Lock()


def current() -> Watchdog | None:
    """The watchdog running in this process, if one is."""
    return _current


class Watchdog:
    """Watches the process's Spark jobs in a thread of its own (see the module's docstring). With a limit of 0 it
    only observes: a stream's marker still shows its quiet."""

    def __init__(
        self,
        command: str,
        limit: StallLimit,
        *,
        stages: Callable[[], tuple[StageView, ...]] = _spark_stages,
        cancel: Callable[[], None] = _cancel_jobs,
        clock: Callable[[], float] = time.time,
        poll_s: float = POLL_S,
        grace_s: float = GRACE_S,
        out: IO[str] | None = None,
    ) -> None:
        self.command, self.limit = command, limit
        self._stages, self._cancel, self._clock = stages, cancel, clock
        self._poll_s, self._grace_s = poll_s, grace_s
        self._out = out
        self._quietness = Quietness()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.quiet: Quiet | None = None
        self.stalled: JobStalled | None = None

    def start(self) -> Watchdog:
        global _current
        with _current_lock:
            if _current is None:
                _current = self
        self._thread = threading.Thread(target=self._watch, name="features-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        global _current
        self._done.set()
        with _current_lock:
            if _current is self:
                _current = None

    def stuck(self) -> Quiet | None:
        """The quiet under way when it has lasted long enough to call the process stuck."""
        quiet = self.quiet
        after = STUCK_AFTER_S if not self.limit.seconds else min(STUCK_AFTER_S, self.limit.seconds / 2)
        if quiet is None or self._clock() - quiet.since < after:
            return None
        return quiet

    def _watch(self) -> None:
        while not self._done.wait(self._poll_s):
            now = self._clock()
            self.quiet = self._quietness.look(self._stages(), now)
            if self.quiet is not None and self.limit.seconds and now - self.quiet.since >= self.limit.seconds:
                self._fire(self.quiet, now)
                return

    def _fire(self, quiet: Quiet, now: float) -> None:
        quiet_s = int(now - quiet.since)
        self.stalled = JobStalled(
            f"features {self.command}: Spark made no progress for {format_duration(max(quiet_s, 1))} (no task started "
            f"or finished, nothing read or written) in {quiet.describe()}; the command was stopped (what it was "
            "doing is printed above). Fix: run it again (a backfill resumes with the first day it did not finish, a "
            f"stream from its checkpoint); {self.limit.named} sets how long no progress is waited for (0 turns "
            "this off)"
        )
        out = self._out or sys.stderr
        print(f"features {self.command}: no progress since {quiet.since_text()}; active stages:", file=out)
        for stage in quiet.stages:
            print(f"  {stage.describe()}", file=out)
        print(python_stacks(), file=out, flush=True)
        self._cancel()
        if not self._done.wait(self._grace_s):  # the cancellation did not reach what waits
            print(f"error: {self.stalled}", file=out, flush=True)
            os._exit(EXIT_STALLED)


def python_stacks() -> str:
    """Every Python thread's stack, named."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = ["Python threads:"]
    for ident, frame in sys._current_frames().items():
        parts.append(f"  thread {names.get(ident, ident)}:")
        parts += ["    " + line for text in traceback.format_stack(frame) for line in text.rstrip().splitlines()]
    return "\n".join(parts)


@contextmanager
def watching(command: str, limit: StallLimit, **options: Any) -> Iterator[Watchdog]:
    """Run a command's body under a watchdog; a stall ends it with `JobStalled` (whatever the cancelled call
    raised is its cause)."""
    dog = Watchdog(command, limit, **options).start()
    try:
        yield dog
    except BaseException as exc:
        if dog.stalled is not None:
            raise dog.stalled from exc
        raise
    finally:
        dog.stop()
    if dog.stalled is not None:  # the cancelled call's failure was absorbed on the way
        raise dog.stalled


def observing(command: str) -> Watchdog | None:
    """A watchdog that only observes, for a stream's run started outside a watched command; None when one runs."""
    if current() is not None:
        return None
    return Watchdog(command, StallLimit(0, "--stall-timeout")).start()
