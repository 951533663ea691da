"""The definition a stream's checkpoint was built with (`features-definition.json`): what its state holds (the
definition, its layout, the buckets, a change the buckets have yet to apply), written as a stream starts and read
without Spark by the commands that check a change against a running stream."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.atomic import write_whole
from features.kernel.migrate import Layout, layout_of
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash, describe

if TYPE_CHECKING:
    from features.engine.state_upgrade import PendingUpgrade

DEFINITION_FILE = "features-definition.json"
# The layout of a bucket's state (features.engine.stream_operator), saved with the checkpoint (3: no token;
# 2: DataSketches; 1: by key): a checkpoint of another format cannot continue.
STATE_FORMAT = 4


def save_definition(checkpoint: Path, description: dict[str, Any]) -> None:
    """Write the checkpoint's definition whole, by a rename: a stream killed while it writes (or a reader at that
    moment) finds the previous one, never a file cut short."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    write_whole(checkpoint / DEFINITION_FILE, json.dumps(description, indent=2, sort_keys=True))


def saved_definition(checkpoint: Path) -> dict[str, Any] | None:
    path = checkpoint / DEFINITION_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def layout(group: FeatureGroup, buckets: int) -> Layout:
    """The layout of the state a stream of `group` over `buckets` buckets holds."""
    return layout_of(describe(group), buckets)


def saved_layout(saved: dict[str, Any]) -> Layout:
    """The layout of a checkpoint's state (checkpoints from before layouts were saved: from their definition)."""
    return Layout.from_json(saved["layout"]) if "layout" in saved else layout_of(saved["definition"])


def save_state(
    checkpoint: Path,
    group: FeatureGroup,
    labels: list[int],
    partitions: int,
    nanoseconds: bool,
    upgrade: PendingUpgrade | None,
    stream_id: str | None = None,
    nulls: bool = True,
) -> dict[str, Any]:
    """Save what a checkpoint keeps beside Spark's files (`features-definition.json`, whole, by a rename) and
    return it: the definition and layout its state holds, its buckets, and a change its buckets have yet to
    apply."""
    record = {
        "definition_hash": definition_hash(group),
        "buckets": len(labels),
        "labels": labels,
        "partitions": partitions,
        "nanoseconds": nanoseconds,
        # Whether it reads files holding a column as Arrow's null type (features.engine.stream_source.read_stream).
        "nulls": nulls,
        "state_format": STATE_FORMAT,
        "definition": describe(group),
        "layout": layout(group, len(labels)).to_json(),
        "upgrade": None if upgrade is None else upgrade.to_json(),
        # Recorded in its offline commits, so that a restart finds its last batch; a new checkpoint, a new id.
        "stream_id": stream_id or uuid.uuid4().hex,
    }
    save_definition(checkpoint, record)
    return record
