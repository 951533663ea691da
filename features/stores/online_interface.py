"""What every online store's writer is (`OnlineWriter`): the rows it takes, the check of their columns, and
`write`, `close` and `only`, which the engines call whatever the store. The stores are one module each
(features.stores.online_sqlite, features.stores.online_redis); features.stores.online picks one for a repo."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

import pandas as pd

from features.errors import ConfigError, DataError
from features.spec import WINDOW_END, DType


class OnlineWriter(ABC):
    """Writes change-point rows of one FeatureView into an online store.

    Input rows: a pandas DataFrame with the join-key columns, `window_end` (UTC datetime64; naive values are
    taken as UTC) and one column per feature (scalars, None/NaN for null, lists or arrays for list features,
    dicts or (key, count) pairs for map features).
    """

    # Whether many processes may write at once; engines funnel the writes of a serial store into one task.
    parallel: ClassVar[bool] = False

    def __init__(self, view: str, join_keys: Mapping[str, DType], features: Mapping[str, DType]) -> None:
        self.view = view
        self.join_keys = dict(join_keys)
        self.features = dict(features)
        for name, dtype in self.join_keys.items():
            if dtype is DType.TIMESTAMP:
                raise ConfigError(
                    f"FeatureGroup({view!r}): join key {name!r} is a timestamp, which the online writer does not "
                    "store as a key; use a string, number or boolean key"
                )

    @abstractmethod
    def write(self, rows: pd.DataFrame) -> int:
        """Write the rows (newer-or-equal wins per key); return how many input rows were processed.

        When it returns, the store has acknowledged every row: the values are readable online from then on (the
        point a freshness measurement ends). Writing the same rows again changes nothing (idempotent).
        """

    @abstractmethod
    def close(self) -> None:
        """Release connections; the writer reopens them if used again."""

    def only(self, names: Sequence[str]) -> OnlineWriter:
        """A writer of these features alone, on connections of its own: the store's values of the others stay as
        they are."""
        narrowed = copy.copy(self)
        narrowed.__dict__.update(self.__getstate__())  # no connection shared with this writer
        narrowed.features = {n: self.features[n] for n in names}
        return narrowed

    def __enter__(self) -> OnlineWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def check_ready(self) -> None:
        """Raise a ConfigError now if the store cannot take writes (so jobs fail before any Spark work)."""

    def check_columns(self, rows: pd.DataFrame) -> None:
        missing = [c for c in [*self.join_keys, WINDOW_END, *self.features] if c not in rows.columns]
        if missing:
            raise DataError(
                f"rows for feature view {self.view!r}: missing column(s) {', '.join(map(repr, missing))}; "
                f"the writer needs the join keys, {WINDOW_END!r} and every feature of the group"
            )
