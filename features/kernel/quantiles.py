"""approx_percentile's representation and queries, in numpy.

Values are kept as counts per logarithmic bucket (as DDSketch does): a value x > 0 falls in bucket
i = ceil(log_gamma(x)), gamma = (1 + ALPHA) / (1 - ALPHA), whose representative 2 gamma^i / (gamma + 1) is within
ALPHA of every value in it (negative values mirror the positive ones, and zero has a bucket of its own). Bucket
counts add exactly, in any order, so a window's sketch does not depend on how its panes were merged: the batch
and the stream return the same value to the bit. The q-quantile is the value of rank ceil(q n) (numpy's
"inverted_cdf"); the estimate is within ALPHA (1%) of it, relative.

A window's q-quantile is the weighted k-th smallest bucket among the (bucket, count) entries of a contiguous
range of pane rows. `WaveletMatrix` answers that for many ranges at once, one vectorized step per bit of the
bucket codes: O((entries + queries) * bits), whatever the window length.
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.01
GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LOG_GAMMA = math.log(GAMMA)
_LOG_MIDDLE = math.log(2 / (GAMMA + 1))  # a bucket (gamma^(i-1), gamma^i] is represented by 2 gamma^i / (gamma + 1)
_OFFSET = 40_000  # > |ceil(log_gamma(x))| for every positive double x: bucket codes of x > 0 are positive
BITS = 18  # codes + SHIFT < 2**18
SHIFT = 2 * _OFFSET


def bucket_codes(values: np.ndarray) -> np.ndarray:
    """Order-preserving bucket codes of finite float values: 0 for zero, +-(OFFSET + i) for +-x."""
    magnitude = np.abs(values)
    positive = magnitude > 0
    with np.errstate(divide="ignore"):
        index = np.ceil(np.log(np.where(positive, magnitude, 1.0)) / _LOG_GAMMA).astype(np.int64)
    codes = np.where(positive, _OFFSET + index, 0)
    return np.where(values < 0, -codes, codes).astype(np.int32)


def bucket_values(codes: np.ndarray) -> np.ndarray:
    """The representative value of each bucket code. Computed with scalar math for each distinct code: numpy's
    vectorized exp may round the last bit differently by an element's position in the array, and every engine
    must return the same bits. (exp of a sum of logs: gamma^i alone overflows for the largest doubles' bucket.)"""
    distinct, inverse = np.unique(np.abs(codes.astype(np.int64)), return_inverse=True)
    values = [0.0 if c == 0 else math.exp((c - _OFFSET) * _LOG_GAMMA + _LOG_MIDDLE) for c in distinct.tolist()]
    value = np.array(values, dtype=np.float64)[inverse.reshape(-1)]
    return np.where(codes < 0, -value, value)


class WaveletMatrix:
    """Weighted order statistics over contiguous ranges of a sequence of small non-negative integers."""

    def __init__(self, values: np.ndarray, weights: np.ndarray, bits: int) -> None:
        self.bits = bits
        self.zero_counts: list[np.ndarray] = []  # per level: zeros among the first i items
        self.zero_weights: list[np.ndarray] = []  # per level: weight of the zeros among the first i items
        self.zeros: list[int] = []
        v, w = values.astype(np.int64), weights.astype(np.int64)
        for level in range(bits - 1, -1, -1):
            zero = ((v >> level) & 1) == 0
            self.zero_counts.append(np.r_[0, np.cumsum(zero)])
            self.zero_weights.append(np.r_[0, np.cumsum(np.where(zero, w, 0))])
            self.zeros.append(int(zero.sum()))
            order = np.r_[np.flatnonzero(zero), np.flatnonzero(~zero)]  # stable: zeros first
            v, w = v[order], w[order]
        self.total_weights = np.r_[0, np.cumsum(weights.astype(np.int64))]

    def weight(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return self.total_weights[hi] - self.total_weights[lo]

    def kth(self, lo: np.ndarray, hi: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The value of weighted rank k (0-based) among items [lo, hi), for each query (k < weight)."""
        out = np.zeros(len(lo), dtype=np.int64)
        lo, hi, k = lo.astype(np.int64), hi.astype(np.int64), k.astype(np.int64)
        for i, level in enumerate(range(self.bits - 1, -1, -1)):
            zc, zw = self.zero_counts[i], self.zero_weights[i]
            zero_weight = zw[hi] - zw[lo]
            left = k < zero_weight
            out |= np.where(left, 0, 1 << level)
            k = np.where(left, k, k - zero_weight)
            lo = np.where(left, zc[lo], self.zeros[i] + lo - zc[lo])
            hi = np.where(left, zc[hi], self.zeros[i] + hi - zc[hi])
        return out


def window_quantiles(codes: np.ndarray, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, q: float):
    """The q-quantile estimate of the entries [lo, hi) of each query, and how many values each holds."""
    matrix = WaveletMatrix(codes.astype(np.int64) + SHIFT, counts, BITS)
    n = matrix.weight(lo, hi)
    rank = np.maximum(np.ceil(q * n).astype(np.int64) - 1, 0)
    has = n > 0
    found = np.zeros(len(lo), dtype=np.int64)
    if has.any():
        found[has] = matrix.kth(lo[has], hi[has], rank[has]) - SHIFT
    return bucket_values(found), n
