"""Drift between two profiles of a feature (features.kernel.profile): population stability index and
Jensen-Shannon distance over the same bins, computed from the stored sketches alone.

The bins come from the reference: for numbers (and the sizes of lists), its deciles, read from its value sketch,
whose buckets are then counted on both sides, so both sides are binned by the same bucket boundaries; for
strings, booleans, maps (their keys) and string lists (their elements), the reference's values, the others as one
bin. Null share has a bin of its own everywhere: a feature that turns null in 30% of its rows drifts even when
its other values do not.

PSI = sum((c - r) ln(c / r)) over the bins' shares, each at least EPSILON (an empty bin would make it infinite);
the Jensen-Shannon distance is the square root of the divergence in bits, between 0 and 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from features.kernel.profile import CATEGORICAL, NUMERIC, FeatureProfile

EPSILON = 1e-4
DECILES = tuple(i / 10 for i in range(1, 10))
MOST_CATEGORIES = 50  # the reference's most frequent values that get bins of their own


@dataclass(frozen=True)
class DriftMeasure:
    psi: float
    js: float
    bins: int


def shares(reference: FeatureProfile, current: FeatureProfile) -> tuple[np.ndarray, np.ndarray]:
    """Both profiles' shares of rows in the reference's bins (the last bin: nulls)."""
    if reference.kind == CATEGORICAL or (reference.categories and reference.kind != NUMERIC):
        kept = sorted(reference.categories, key=lambda v: (-reference.categories[v], v))[:MOST_CATEGORIES]
        masses = [_category_masses(p, kept) for p in (reference, current)]
    else:
        edges = _edges(reference)
        masses = [_bucket_masses(p, edges) for p in (reference, current)]
    out = []
    for p, mass in zip((reference, current), masses, strict=True):
        row = np.append(mass, float(p.nulls))
        total = row.sum()
        out.append(row / total if total > 0 else row)
    return out[0], out[1]


def measure_drift(reference: FeatureProfile, current: FeatureProfile) -> DriftMeasure:
    r, c = shares(reference, current)
    return DriftMeasure(psi=psi(r, c), js=js_distance(r, c), bins=len(r))


def psi(reference: np.ndarray, current: np.ndarray) -> float:
    r, c = np.maximum(reference, EPSILON), np.maximum(current, EPSILON)
    return float(np.sum((c - r) * np.log(c / r)))


def js_distance(reference: np.ndarray, current: np.ndarray) -> float:
    p, q = reference / max(reference.sum(), 1e-300), current / max(current.sum(), 1e-300)
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        inside = a > 0
        return float(np.sum(a[inside] * np.log2(a[inside] / m[inside])))

    return math.sqrt(max((kl(p) + kl(q)) / 2, 0.0))


def _edges(reference: FeatureProfile) -> np.ndarray:
    """The bucket codes of the reference's deciles: bin i holds the codes in (edge i-1, edge i]."""
    total = int(reference.counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    cumulative = np.cumsum(reference.counts)
    ranks = [max(math.ceil(q * total), 1) for q in DECILES]
    at = np.searchsorted(cumulative, ranks)
    return np.unique(reference.codes[at].astype(np.int64))


def _bucket_masses(profile: FeatureProfile, edges: np.ndarray) -> np.ndarray:
    masses = np.zeros(len(edges) + 1)
    if len(profile.codes):
        np.add.at(masses, np.searchsorted(edges, profile.codes.astype(np.int64), side="left"), profile.counts)
    return masses


def _category_masses(profile: FeatureProfile, kept: list[str]) -> np.ndarray:
    counts = [float(profile.categories.get(v, 0)) for v in kept]
    rest = sum(profile.categories.values()) + profile.other - sum(counts)
    return np.array([*counts, float(rest)])
