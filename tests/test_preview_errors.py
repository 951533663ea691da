"""`features.preview` refuses wrong arguments before any Spark starts, with a message naming the argument."""

from __future__ import annotations

import pandas as pd
import pytest

import features
from features import ConfigError, Entity, EventSource, Feature, FeatureGroup, Hop, agg

GROUP = FeatureGroup(
    "g",
    Entity("user", join_keys=["user_id"]),
    EventSource("transactions", path="data/transactions", timestamp="event_ts"),
    [Feature("n_1h", agg.count(), window=Hop("1h", every="5m"))],
)
EVENTS = pd.DataFrame({"user_id": ["u1"], "event_ts": pd.to_datetime(["2026-01-01 00:01"], utc=True)})


def test_an_end_not_after_start_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^end: 2026-01-01T00:00:00\+00:00 is not after start .*pass a later end"):
        features.preview(GROUP, EVENTS, "2026-01-01", "2026-01-01")


def test_a_time_that_is_not_iso_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^start: 'yesterday' is not an ISO-8601 time; write e\.g\. 2026-01-31"):
        features.preview(GROUP, EVENTS, "yesterday", "2026-01-02")


def test_events_that_are_not_a_dataframe_are_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"^events: a list is not a table of events; pass a pandas or Spark DataFrame"
    ):
        features.preview(GROUP, [{"user_id": "u1"}], "2026-01-01", "2026-01-02")
