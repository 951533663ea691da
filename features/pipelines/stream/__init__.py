"""`features stream` (docs/streaming.md): a group's stream from its start to its end, one module a stage.

- runner: `stream(repo)` starts a query per group and returns the run (StreamRun) that waits for and stops them;
- starter: one group's query started: its source resolved, its checkpoint resumed or restored, its sink made;
- sink: each micro-batch validated and written to the stores, its progress reported (batch_progress);
- aside: late events, bad records and unreadable files set aside, and swept after their retention;
- upgrade: a checkpoint resumed, its state carried over a changed definition or another number of buckets;
- savepoint: the state written at a batch boundary, and a new checkpoint started from it;
- reload: a live run takes up `features apply` and a rescale handed to it (handoff: which process streams a group).

`stream`, `StreamRun` and `StreamProgress` are the runner's, imported when first asked for: the commands that only
ask which process streams a group (handoff) or how far it got (batch_progress) start no Spark."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from features.pipelines.stream.runner import StreamProgress, StreamRun, ValidationFailed, stream

__all__ = ["StreamProgress", "StreamRun", "ValidationFailed", "stream"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("features.pipelines.stream.runner"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
