"""Which process streams a group, and a rescale handed to it while it runs (docs/streaming.md, "Changing a running
group").

While a run streams a group, the group's checkpoint folder holds `live.json`: the host and process, since when, and
whether the run is live (`features stream` without `--available-now`). The run refreshes the file's time four times a
second and removes it when it ends; a file whose process is gone, or that has not been refreshed for FRESH_S, holds
nothing (a process killed without removing it). That freshness says the process lives, not that it moves: a batch
may rightly take minutes. Whether it moves is the file's `stuck` entry, written from the process's watchdog
(features.engine.watchdog): since when its Spark jobs have made no progress, and in which stage, once that has
lasted long enough to call it stuck; removed when they move again.

Another process's `features stream` of a held group is refused: two processes writing one checkpoint would
corrupt it. One request is taken instead: `features stream --group G --buckets N` while a live run streams G asks
that run to rescale. The asking process writes `rescale-request.json` beside the marker and waits; the live run
sees it within a quarter of a second, moves the state to N buckets between two micro-batches, exactly as a restart with
`--buckets N` would (features.pipelines.stream.upgrade), and writes `rescale-answer.json` with the line a restart
prints, or the reason it refused. The JVM, the session and the queries' warm state stay: a rescale costs the move
and the next batch, not a new process (features.pipelines.stream.reload takes the request up).

No Spark here: the asking process starts none.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from features.atomic import write_whole
from features.errors import ConfigError, EnvironmentProblem
from features.repo import Repo

MARKER = "live.json"
REQUEST = "rescale-request.json"
ANSWER = "rescale-answer.json"
FRESH_S = 15.0  # a marker older than this is a process that ended without removing it
ANSWER_WAIT_S = 600.0  # the longest a rescale (a batch under way, the move) is waited for
ASK_POLL_S = 0.1


@dataclass(frozen=True)
class Holder:
    """The process streaming a group."""

    pid: int
    host: str
    since: str
    live: bool
    stuck: tuple[str, str] | None = None  # since when its Spark jobs have not moved, and where

    def describe(self) -> str:
        kind = "a live `features stream`" if self.live else "a `features stream --available-now` run"
        text = f"{kind} (process {self.pid} on {self.host}, since {self.since})"
        if self.stuck is not None:
            since, where = self.stuck
            text += f", stuck since {since} (no Spark task started or finished, nothing read) in {where}"
        return text


def hold(checkpoint: Path, live: bool) -> None:
    """Mark `checkpoint` as streamed by this process."""
    since = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": since, "live": live}
    checkpoint.mkdir(parents=True, exist_ok=True)
    write_whole(checkpoint / MARKER, json.dumps(record))


def note_stuck(checkpoint: Path, stuck: tuple[str, str] | None) -> None:
    """Record in this process's marker since when its Spark jobs have not moved and where (None: they move)."""
    record = _read(checkpoint / MARKER)
    if record is None or record.get("pid") != os.getpid():
        return
    record["stuck"] = None if stuck is None else list(stuck)
    write_whole(checkpoint / MARKER, json.dumps(record))


def refresh(checkpoint: Path) -> None:
    # Gone: a swap under way (a `--reset` removes the folder), whose start marks it again.
    with contextlib.suppress(FileNotFoundError):
        os.utime(checkpoint / MARKER)


def release(checkpoint: Path) -> None:
    """Remove the marker if this process wrote it."""
    marker = _read(checkpoint / MARKER)
    if marker is not None and marker.get("pid") == os.getpid() and marker.get("host") == socket.gethostname():
        (checkpoint / MARKER).unlink(missing_ok=True)


def holder(checkpoint: Path, include_self: bool = False) -> Holder | None:
    """The other process streaming this checkpoint, if one is (None: free, or held by this process unless
    `include_self`)."""
    path = checkpoint / MARKER
    marker = _read(path)
    if marker is None:
        return None
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
    pid, host = int(marker["pid"]), str(marker["host"])
    here = host == socket.gethostname()
    if age > FRESH_S or (here and ((pid == os.getpid() and not include_self) or not _alive(pid))):
        return None
    stuck = marker.get("stuck")
    return Holder(pid, host, str(marker["since"]), bool(marker["live"]), None if not stuck else (stuck[0], stuck[1]))


def check_free(repo: Repo, group: str, checkpoint: Path) -> None:
    """Refuse to stream a group another process streams."""
    other = holder(checkpoint)
    if other is None:
        return
    fix = "stop it first (Ctrl-C in its terminal, or SIGTERM)"
    if other.live:
        fix += (
            f"; to change its buckets while it runs, `features stream --repo {repo.root} --group {group} --buckets N` "
            "hands it the rescale"
        )
    else:
        fix = "run this again once it has ended (it stops once it has processed what landed)"
    raise ConfigError(f"{group}: its checkpoint {checkpoint} is being streamed by {other.describe()}: {fix}")


def live_holders(repo: Repo, names: list[str] | None, checkpoint_root: str | None) -> dict[str, Path] | None:
    """Each selected group's checkpoint when a live run streams every one of them, else None."""
    held = {}
    for group in repo.select(names):
        checkpoint = Path(repo.checkpoint_path(group, checkpoint_root))
        other = holder(checkpoint)
        if other is None or not other.live:
            return None
        held[group.name] = checkpoint
    return held


def check_buckets(buckets: int | None) -> None:
    if buckets is not None and buckets < 1:
        raise ConfigError(f"--buckets: {buckets} is not a positive number of hash buckets")


def ask_rescale(group: str, checkpoint: Path, buckets: int, wait_s: float = ANSWER_WAIT_S) -> str:
    """Hand `--buckets` to the live run streaming `group` and wait for its answer: the line it printed, or a
    ConfigError with the reason it refused."""
    check_buckets(buckets)
    other = holder(checkpoint)
    if other is None:
        raise EnvironmentProblem(f"{group}: no live stream runs it any more; start it with `--buckets {buckets}`")
    ask = uuid.uuid4().hex
    (checkpoint / ANSWER).unlink(missing_ok=True)
    write_whole(checkpoint / REQUEST, json.dumps({"id": ask, "buckets": buckets}))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        answer = _read(checkpoint / ANSWER)
        if answer is not None and answer.get("id") == ask:
            (checkpoint / ANSWER).unlink(missing_ok=True)
            if answer.get("error"):
                raise ConfigError(str(answer["error"]))
            return str(answer["line"])
        if holder(checkpoint) is None:
            break
        time.sleep(ASK_POLL_S)
    (checkpoint / REQUEST).unlink(missing_ok=True)
    raise EnvironmentProblem(
        f"{group}: the live stream ({other.describe()}) did not take `--buckets {buckets}` up within {wait_s:.0f}s or "
        "ended first: see its output; the state is as it was"
    )


@dataclass(frozen=True)
class Request:
    id: str
    buckets: int


def pending(checkpoint: Path) -> Request | None:
    """A rescale asked of this run for the group streamed in `checkpoint`, taken (removed) once read."""
    record = _read(checkpoint / REQUEST)
    if record is None:
        return None
    (checkpoint / REQUEST).unlink(missing_ok=True)
    return Request(str(record["id"]), int(record["buckets"]))


def answer(checkpoint: Path, request: Request, line: str | None = None, error: str | None = None) -> None:
    write_whole(checkpoint / ANSWER, json.dumps({"id": request.id, "line": line, "error": error}))


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # absent, or not written whole by another tool
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_running_streams_take(repo: Repo) -> None:
    """Refuse a definition change that a stream running now cannot take (a new join key or timestamp column):
    applied under it, Feast's registry would be keyed by the new columns while the stream keeps writing the old."""
    from features.engine.stream_definition import saved_definition

    for group in repo.groups.values():
        checkpoint = Path(repo.checkpoint_path(group))
        saved = saved_definition(checkpoint)
        running = holder(checkpoint, include_self=True) if saved is not None else None
        if running is None or saved is None:
            continue
        # The stream's own rule, and its Spark modules, imported only where a stream runs the group.
        from features.pipelines.stream.upgrade import replay_needed

        why = replay_needed(group, saved)
        if why is not None:
            raise ConfigError(
                f"{group.name}: {running.describe()} streams this group, and its saved state in {checkpoint} {why}. "
                f"Fix: stop that stream, then run `features apply --repo {repo.root}` and `features stream --repo "
                f"{repo.root} --group {group.name} --reset` (it rebuilds the state from the source); or give the "
                "changed group a new name, so that both run side by side"
            )
