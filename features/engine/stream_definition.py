"""The definition a stream's checkpoint was built with (`features-definition.json`): what its state holds, read
without Spark by the commands that check a change against a running stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from features.atomic import write_whole

DEFINITION_FILE = "features-definition.json"


def save_definition(checkpoint: Path, description: dict[str, Any]) -> None:
    """Write the checkpoint's definition whole, by a rename: a stream killed while it writes (or a reader at that
    moment) finds the previous one, never a file cut short."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    write_whole(checkpoint / DEFINITION_FILE, json.dumps(description, indent=2, sort_keys=True))


def saved_definition(checkpoint: Path) -> dict[str, Any] | None:
    path = checkpoint / DEFINITION_FILE
    return json.loads(path.read_text()) if path.is_file() else None
