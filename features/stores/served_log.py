"""The served log: what the feature server answered, a sample of it, as a Delta table at data/served beside the
offline tables (`features serve --log-served`; features.stores.served_logging writes it off the request path).

One row per entity row of a sampled `POST /get-online-features` answered 200:
- `date` (the partition, UTC) and `served_at`: when the server received the request;
- `request_id`: the same for the rows of one request, and `row`, the entity row's place in it;
- `model`: what the client named in the request's `X-Model` header, else null; `feature_service`: the feature
  service the request asked for, else null;
- `entity_key`: the row's join keys as a JSON object (`{"user_id": "u1"}`);
- `values`: the row's served values as a JSON object, each under its reference `group:feature` (a request-time
  feature under its name), in the JSON forms the server answered (null for no value, times as epoch seconds, maps as
  objects).

features.pipelines.served_skew reads it back per group and feature for `features monitor --served`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa

SERVED_DIR = Path("data") / "served"
COMMIT_TRIES = 5  # appends tried when other workers' appends commit first

SERVED_SCHEMA = pa.schema(
    [
        ("date", pa.date32()),
        ("served_at", pa.timestamp("us", "UTC")),
        ("request_id", pa.string()),
        ("row", pa.int32()),
        ("model", pa.string()),
        ("feature_service", pa.string()),
        ("entity_key", pa.string()),
        ("values", pa.string()),
    ]
)


def served_table(repo_root: str | Path) -> str:
    return str((Path(repo_root) / SERVED_DIR).resolve())


def append_served(table: str, rows: Sequence[dict[str, Any]]) -> None:
    """Rows of SERVED_SCHEMA appended in one commit. Every worker of a server appends: a commit another made
    first is tried again (appends never conflict in what they hold), up to COMMIT_TRIES times."""
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError

    batch = pa.Table.from_pylist(list(rows), schema=SERVED_SCHEMA)
    Path(table).mkdir(parents=True, exist_ok=True)
    for attempt in range(COMMIT_TRIES):
        try:
            write_deltalake(table, batch, mode="append", partition_by=["date"])
            return
        except CommitFailedError:  # another worker's commit (or its creation of the table) came first
            if attempt == COMMIT_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


def read_served(table: str, first: date | None = None, end: date | None = None) -> pa.Table | None:
    """The rows served on the days [first, end) (all by default), None when nothing was ever logged."""
    if not (Path(table) / "_delta_log").is_dir():
        return None
    from deltalake import DeltaTable

    filters = [f for f in (("date", ">=", first), ("date", "<", end)) if f[2] is not None]
    return DeltaTable(table).to_pyarrow_table(filters=filters or None)
