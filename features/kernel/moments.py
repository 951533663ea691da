"""stddev, variance, skew and kurtosis: a pane's partial is its count, mean and central moment sums (M2, and M3,
M4 for the higher moments), plus its smallest and largest value for skew and kurtosis, which are 0 exactly when
all values are equal (a merged M2 of equal values is a rounding residue, not 0)."""

from __future__ import annotations

import numpy as np

from features.kernel.frames import column_values
from features.kernel.partials import Kind, bincount, first_per_key, nullable, ranges_add, ranges_extreme
from features.spec import DType


class Moments(Kind):
    """Central moments up to `order` (2, 3 or 4), merged as power sums around a per-key shift (the first pane
    mean of each key), so that sums over long windows lose no digits to cancellation (Chan et al., Pébay)."""

    def __init__(self, order: int, finish: str) -> None:
        self.order, self.finish = order, finish
        extra = ("lo", "hi") if order > 2 else ()
        self.parts = ("n", "mean", *(f"m{p}" for p in range(2, order + 1)), *extra)

    def phase1(self, calc, codes, groups, mask, frame):
        values, valid = column_values(frame[calc.value], DType.FLOAT64)
        ok = mask & valid
        c, v = codes[ok], values[ok]
        n = bincount(c, groups)
        mean = bincount(c, groups, v) / np.maximum(n, 1)
        dev = v - mean[c]
        out = {"n": n.astype(np.int64), "mean": mean}
        for p in range(2, self.order + 1):
            out[f"m{p}"] = bincount(c, groups, dev**p)
        if self.order > 2:
            present = n > 0
            for part, smallest in (("lo", True), ("hi", False)):
                picked = np.full(groups, np.inf if smallest else -np.inf)
                (np.minimum if smallest else np.maximum).at(picked, c, v)
                out[part] = np.where(present, picked, 0.0)
        return out

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        n, mean = cols["n"], cols["mean"]
        present = n > 0
        shift = first_per_key(mean, present, key_of_row)
        d = np.where(present, mean - shift, 0.0)
        m = {p: np.where(present, cols[f"m{p}"], 0.0) for p in range(2, self.order + 1)}
        # Each pane's power sums around the shift: sum((x - shift)^p) from its central sums.
        power = {1: n * d, 2: m[2] + n * d * d}
        if self.order > 2:
            power[3] = m[3] + 3 * d * m[2] + n * d**3
        if self.order > 3:
            power[4] = m[4] + 4 * d * m[3] + 6 * d**2 * m[2] + n * d**4
        total = ranges_add(n, starts, ends)
        s = {p: ranges_add(power[p], starts, ends) for p in power}
        safe = np.maximum(total, 1)
        delta = s[1] / safe  # the range's mean minus the shift
        row_shift = shift[np.minimum(starts, len(shift) - 1)] if len(shift) else np.zeros(len(starts))
        out = {"n": total, "mean": np.where(total > 0, row_shift + delta, 0.0), "m2": s[2] - s[1] * delta}
        if self.order > 2:
            out["m3"] = s[3] - 3 * delta * s[2] + 2 * total * delta**3
        if self.order > 3:
            out["m4"] = s[4] - 4 * delta * s[3] + 6 * delta**2 * s[2] - 3 * total * delta**4
        if self.order > 2:
            out["lo"] = ranges_extreme(cols["lo"], present, starts, ends, smallest=True)[0]
            out["hi"] = ranges_extreme(cols["hi"], present, starts, ends, smallest=False)[0]
        return out

    def finalize(self, calc, cols):
        n = cols["n"].astype(np.float64)
        m2 = np.maximum(cols["m2"], 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.finish in ("variance", "stddev"):
                value = m2 / np.maximum(n - 1, 1)
                return nullable(np.sqrt(value) if self.finish == "stddev" else value, n > 1)
            equal = cols["lo"] == cols["hi"]
            if self.finish == "skew":
                value = n * np.sqrt(n - 1) / (n - 2) * cols["m3"] / m2**1.5
                return nullable(np.where(equal, 0.0, value), n > 2)
            # excess kurtosis, bias-corrected as pandas' Series.kurt()
            value = n * (n + 1) * (n - 1) * cols["m4"] / ((n - 2) * (n - 3) * m2**2)
            value -= 3 * (n - 1) ** 2 / ((n - 2) * (n - 3))
            return nullable(np.where(equal, 0.0, value), n > 3)
