"""A repo's definitions are read again when their file changed: an edit made from a notebook's kernel (which
imported the old module) takes effect at the next load. No Spark."""

from __future__ import annotations

import os

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.repo import Repo

GROUP = FeatureGroup(
    "reloaded",
    Entity("user", join_keys=["user_id"]),
    EventSource("events", path="data/events", timestamp="event_ts"),
    [Feature("n_1h", agg.count(), window=Hop("1h", every="5m"))],
)


def test_an_edited_definition_file_is_read_again(feast_repo) -> None:
    root = feast_repo([GROUP], apply=False)
    [module] = [p for p in root.glob("test_definitions_*.py")]
    assert [f.name for f in Repo.load(root).groups["reloaded"].features] == ["n_1h"]
    assert Repo.load(root).groups["reloaded"] is Repo.load(root).groups["reloaded"]  # unchanged: not re-run
    text = module.read_text().replace(
        "Feature('n_1h', agg.count(), window=Hop('1h', every='5m')),",
        "Feature('n_1h', agg.count(), window=Hop('1h', every='5m')),\n"
        "        Feature('n_2h', agg.count(), window=Hop('2h', every='5m')),",
    )
    assert "n_2h" in text
    module.write_text(text)
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a later edit, whatever the clock
    assert [f.name for f in Repo.load(root).groups["reloaded"].features] == ["n_1h", "n_2h"]
