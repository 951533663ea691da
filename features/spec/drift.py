"""Drift thresholds of a group's features, which `features monitor` applies (flags override them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from features.errors import DefinitionError


@dataclass(frozen=True)
class Drift:
    """A feature's day drifts when its population stability index is above `psi` or its Jensen-Shannon distance
    (0 to 1) above `js`, both against the reference; days with fewer than `min_rows` rows are not judged.

    0.2 is the usual line of a significant PSI shift. Both defaults stay well above what sampling alone gives days
    of a thousand rows or more: at most 0.012 and 0.047 on the unshifted features of tests/test_statistics.py, whose
    shifted ones measure at least 0.37 and 0.26."""

    psi: float = 0.2
    js: float = 0.1
    min_rows: int = 100

    def __post_init__(self) -> None:
        for name, value, example in (("psi", self.psi, "0.2"), ("js", self.js, "0.1")):
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < math.inf:
                raise DefinitionError(
                    f"Drift.{name}", f"{value!r} is not a positive threshold", f"use e.g. {name}={example}"
                )
        if self.js > 1:
            raise DefinitionError("Drift.js", f"{self.js!r} is above 1, the largest distance", "use e.g. js=0.1")
        if not isinstance(self.min_rows, int) or isinstance(self.min_rows, bool) or self.min_rows < 1:
            raise DefinitionError(
                "Drift.min_rows", f"{self.min_rows!r} is not a positive number of rows", "use e.g. min_rows=100"
            )


DEFAULT_DRIFT = Drift()
