"""The noise band of a delta (METRICS.md): the spread of zero-change comparisons, from
repeated runs of one build when there are several, else from resampling stable steps
within each run. A delta inside the band is `within_noise`."""

from __future__ import annotations

import itertools

import numpy as np

FASTER, SLOWER, WITHIN_NOISE = "faster", "slower", "within_noise"
#: No verdict: a run of one step has no step period, so no ITL to compare.
NO_PERIOD = "n/a"
RESAMPLES = 400


def from_repeats(old_medians: list[float], new_medians: list[float]) -> float | None:
    """Largest |difference| between two runs of the same build (old-old and new-new pairs)."""
    pairs = [abs(a - b) for runs in (old_medians, new_medians) for a, b in itertools.combinations(runs, 2)]
    return max(pairs) if pairs else None


def from_resampling(old_steps: np.ndarray, new_steps: np.ndarray, seed: int = 0) -> float | None:
    """Half-width of the central 95% interval of the bootstrap delta of medians."""
    if len(old_steps) < 5 or len(new_steps) < 5:
        return None
    rng = np.random.default_rng(seed)
    a = np.median(rng.choice(old_steps, size=(RESAMPLES, len(old_steps))), axis=1)
    b = np.median(rng.choice(new_steps, size=(RESAMPLES, len(new_steps))), axis=1)
    lo, hi = np.percentile(b - a, [2.5, 97.5])
    return float(hi - lo) / 2


def verdict(delta: float | None, band: float | None) -> str:
    if delta is None:
        return NO_PERIOD
    if band is not None and abs(delta) <= band:
        return WITHIN_NOISE
    if band is None and delta == 0:
        return WITHIN_NOISE
    return FASTER if delta < 0 else SLOWER
