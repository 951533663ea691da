"""A live stream takes up `features apply` of a changed definition between micro-batches, in the same process.

`features apply` records each group's definition hash (features.pipelines.registration.APPLIED). A live run
(`features stream` without `--available-now`) looks at that record four times a second; when a group it runs was
applied with another definition, it loads the repo's definitions again, stops that group's query between two batches and
starts it again on the new definition, exactly as a restart would (features.pipelines.stream.upgrade: unchanged
features keep their state, an added one is built over its lookback), with the JVM, the session and the MLflow
run it already has. What a restart costs beyond that (a new JVM, imports, a new query's first batch on a cold
JVM) is not paid. A change a start would refuse (a key column changed: `--reset` is the least it takes) is said
with the same error, and the group goes on with the definition it ran.

The same thread takes up a rescale another process hands the run (features.pipelines.stream.handoff): the state
moved to the new buckets between two batches, as a restart with `--buckets` would, and the answer written back. A
thread of its own, in every run, keeps the run's mark on its groups' checkpoints fresh."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from features.engine import watchdog
from features.engine.stream_definition import saved_definition
from features.errors import FeaturesError
from features.pipelines.backfill import ready_writer
from features.pipelines.registration import APPLIED, read_applied
from features.pipelines.stream import handoff
from features.repo import Repo
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from features.pipelines.stream.sink import BatchSink
    from features.pipelines.stream.starter import GroupStarter
    from features.pipelines.stream.upgrade import Carried
    from features.stores.online import OnlineWriter


class StreamRun(Protocol):
    """What a swap changes of the run (features.pipelines.stream.runner.StreamRun)."""

    queries: dict[str, StreamingQuery]
    sinks: dict[str, BatchSink]
    errors: dict[str, BaseException]
    stopping: bool
    swapping: threading.Lock


POLL_S = 0.25  # how often a live run looks at the applied definitions and for a rescale asked of it
BATCH_END_WAIT_S = 60.0  # how long a swap waits for a batch under way to end before it stops the query in it


def watch(run: StreamRun, starter: GroupStarter, live: bool) -> None:
    """Start the thread that keeps the run's checkpoints marked as streamed by it and, in a `live` run, the one that
    takes up applied definition changes and rescales handed to it while the run goes on. Apart, so that a take-up
    that runs long (a Lifetime feature built over all of history) does not let the marks go stale."""
    threading.Thread(target=_keep_marked, args=(run,), name="features-stream-mark", daemon=True).start()
    if live:
        threading.Thread(target=_watch, args=(run, starter), name="features-stream-reload", daemon=True).start()


def _keep_marked(run: StreamRun) -> None:
    idle = 0
    noted: tuple[str, str] | None = None
    while not run.stopping and not run.errors:
        time.sleep(POLL_S)
        # A swap holds the lock from before it stops a query to after its new one started: twice in a row with
        # neither, the run has ended.
        busy = run.swapping.locked() or any(q.isActive for q in list(run.queries.values()))
        idle = 0 if busy else idle + 1
        if idle >= 2:
            return
        dog = watchdog.current()
        quiet = None if dog is None else dog.stuck()
        stuck = None if quiet is None else (quiet.since_text(), quiet.describe())
        for checkpoint in _checkpoints(run).values():
            if stuck != noted:
                handoff.note_stuck(checkpoint, stuck)
            handoff.refresh(checkpoint)
        noted = stuck


def _watch(run: StreamRun, starter: GroupStarter) -> None:
    seen = _stamp(starter)
    while not run.stopping and not run.errors and any(q.isActive for q in run.queries.values()):
        time.sleep(POLL_S)
        for name, checkpoint in _checkpoints(run).items():
            if (request := handoff.pending(checkpoint)) is not None:
                rescale(run, starter, name, checkpoint, request)
        stamp = _stamp(starter)
        if stamp == seen:
            continue
        seen = stamp
        applied = read_applied(starter.repo.root)
        running = {name: definition_hash(sink.group) for name, sink in run.sinks.items()}
        changed = [name for name, known in running.items() if applied.get(name, known) != known]
        if changed:
            take_up(run, starter, changed, applied)


def _stamp(starter: GroupStarter) -> tuple[int, int] | None:
    try:
        status = (starter.repo.root / APPLIED).stat()
    except FileNotFoundError:
        return None
    return status.st_mtime_ns, status.st_size


def take_up(
    run: StreamRun,
    starter: GroupStarter,
    names: list[str],
    applied: dict[str, str],
) -> None:
    """Continue each named group on the definition applied for it (`applied`: group -> definition hash). A repo
    whose definitions no longer load, or no longer match what was applied (edited since), is reported and the groups
    go on as they are, until the next apply."""
    try:
        repo = Repo.load(starter.repo.root)
    except FeaturesError as exc:
        for name in names:
            _not_taken_up(name, str(exc))
        return
    for name in names:
        group = repo.groups.get(name)
        if group is None or definition_hash(group) != applied[name]:
            _not_taken_up(name, "the repo's definitions changed since `features apply` (or no longer define it)")
            continue
        try:
            writer = ready_writer(repo, group) if starter.options.online else None
        except FeaturesError as exc:
            _not_taken_up(name, str(exc))
            continue
        with run.swapping:
            if run.stopping:
                return
            _say(f"{name}: a changed definition was applied; the stream continues with it from its checkpoint")
            try:
                _swap(run, starter, name, repo, group, writer)
            except _Refused as exc:
                _not_taken_up(name, str(exc))
            except _RunEnded:
                return


def _checkpoints(run: StreamRun) -> dict[str, Path]:
    return {name: sink.checkpoint for name, sink in list(run.sinks.items()) if sink.checkpoint is not None}


def release(run: StreamRun) -> None:
    """The run's groups no longer marked as streamed by it (the run has ended)."""
    for checkpoint in _checkpoints(run).values():
        handoff.release(checkpoint)


def rescale(run: StreamRun, starter: GroupStarter, name: str, checkpoint: Path, request: handoff.Request) -> None:
    """Move the group's state to the buckets another process asked for, between two batches, and answer it: the
    line a restart with `--buckets` prints, or why not (the group then goes on as it ran)."""
    sink = run.sinks[name]
    if (saved_definition(checkpoint) or {}).get("buckets") == request.buckets:
        line = f"{name}: already in {request.buckets} buckets; nothing moved"
        handoff.answer(checkpoint, request, line=line)
        return
    with run.swapping:
        if run.stopping:
            handoff.answer(checkpoint, request, error=f"{name}: the stream is stopping; nothing moved")
            return
        _say(f"{name}: --buckets {request.buckets} was asked for; the stream moves its state between batches")
        try:
            carried = _swap(run, starter, name, sink.repo, sink.group, sink.writer, request.buckets)
        except _Refused as exc:
            handoff.answer(checkpoint, request, error=str(exc))
            _say(f"{name}: --buckets {request.buckets} is not taken up; the stream goes on as it ran: {exc}")
            return
        except _RunEnded as exc:
            handoff.answer(checkpoint, request, error=f"{name}: the stream failed in the rescale: {exc}")
            return
    line = carried.line() if carried is not None else f"{name}: now in {request.buckets} buckets (no state to move)"
    handoff.answer(checkpoint, request, line=line)


class _Refused(Exception):
    """The new start refused (as a restart would stop); the group runs on as it ran."""


class _RunEnded(Exception):
    """A start failed otherwise: the run ends with the error (in its `errors`, which a wait raises)."""


def _swap(
    run: StreamRun,
    starter: GroupStarter,
    name: str,
    repo: Repo,
    group: FeatureGroup,
    writer: OnlineWriter | None,
    buckets: int | None = None,
) -> Carried | None:
    """Stop the group's query between two batches and start it again on `group` of `repo` (and `buckets`), under
    the run's swap lock. A refusal starts the group again as it ran."""
    sink = run.sinks[name]
    _stop_between_batches(run.queries[name], sink)
    try:
        sink.end_rounds()  # the new query's sink starts its own
        starter.repo = repo
        try:
            return starter.start(group, writer, buckets=buckets)
        except FeaturesError as exc:
            starter.repo = sink.repo
            starter.start(sink.group, sink.writer)
            raise _Refused(str(exc)) from None
    except _Refused:
        raise
    except Exception as exc:
        run.errors[name] = exc
        raise _RunEnded(str(exc)) from exc


def _stop_between_batches(query: StreamingQuery, sink: BatchSink) -> None:
    """Stop `query` once no batch is under way (or after BATCH_END_WAIT_S: a batch cut short runs again in the new
    query, as after any stop; its sink then ends it as a stop, not a failure)."""
    deadline = time.monotonic() + BATCH_END_WAIT_S
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    sink.retiring = True
    query.stop()


def _not_taken_up(name: str, why: str) -> None:
    _say(f"{name}: the applied definition is not taken up; the stream goes on with the one it runs: {why}")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
