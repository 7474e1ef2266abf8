"""Shapley values of a set function evaluated in batches (METRICS.md: an edit's contribution
is the mean, over orders of applying the edits, of the change it makes when applied).

Exact over all 2^P subsets for few players; otherwise sampled over random orders, each
order paired with its reverse (antithetic: the pair's mean cancels much of the order
noise), with the standard error of each value across pairs. Either way the values sum
exactly to value(all) - value(none): every order's marginal changes telescope to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

#: Up to this many players the values are exact (2^P evaluations).
EXACT_MAX = 10
#: Evaluations the sampled estimate may spend at most (orders x (P + 1)).
BUDGET = 12_000
#: Orders per sampling round (half of them the reverses of the other half).
MIN_ORDERS = 16

Value = Callable[[np.ndarray], np.ndarray]   # applied bool [V, P] -> value [V]
Tolerance = Callable[[float, float], float]   # (value(none), value(all)) -> tolerance


@dataclass(frozen=True)
class ShapleyValues:
    values: np.ndarray        # [P]
    stderr: np.ndarray        # [P]; zeros when exact
    exact: bool
    orders: int               # sampled orders (0 when exact)
    evaluations: int
    none: float               # value with no player applied
    all: float                # value with every player applied


def shapley(value: Value, players: int, *, exact_max: int = EXACT_MAX, budget: int = BUDGET,
            seed: int = 0, tolerance: float | Tolerance = 0.0) -> ShapleyValues:
    """`tolerance`: sampling stops once every value's standard error is within it (same unit
    as the value); 0 spends the whole budget. Or a function of (value(none), value(all)),
    called once the first round has evaluated both (every order starts and ends there), so
    the caller needs no evaluation of its own for a tolerance relative to the change."""
    if players == 0:
        v = value(np.zeros((1, 0), dtype=bool))
        return ShapleyValues(np.zeros(0), np.zeros(0), True, 0, 1, float(v[0]), float(v[0]))
    if players <= exact_max:
        return _exact(value, players)
    return _sampled(value, players, budget=budget, seed=seed, tolerance=tolerance)


def _exact(value: Value, p: int) -> ShapleyValues:
    masks = np.arange(1 << p)
    applied = ((masks[:, None] >> np.arange(p)) & 1).astype(bool)
    v = value(applied)
    sizes = applied.sum(axis=1)
    weight = np.array([math.factorial(s) * math.factorial(p - s - 1) / math.factorial(p) for s in range(p)])
    phi = np.zeros(p)
    for i in range(p):
        without = masks[~applied[:, i]]
        phi[i] = float(np.sum(weight[sizes[without]] * (v[without | (1 << i)] - v[without])))
    return ShapleyValues(phi, np.zeros(p), True, 0, len(masks), float(v[0]), float(v[-1]))


def _sampled(value: Value, p: int, *, budget: int, seed: int, tolerance: float | Tolerance) -> ShapleyValues:
    """Rounds of antithetic orders until every value's standard error is within `tolerance`
    (or the evaluation budget is spent)."""
    rng = np.random.default_rng(seed)
    per_round = max(MIN_ORDERS // 2, 1)
    max_pairs = max(per_round, budget // (2 * (p + 1)))
    pair_means: list[np.ndarray] = []
    none = every = None
    while len(pair_means) < max_pairs:
        orders = []
        for _ in range(min(per_round, max_pairs - len(pair_means))):
            perm = rng.permutation(p)
            orders += [perm, perm[::-1]]
        rank = np.empty((len(orders), p), dtype=np.int64)   # rank[o, player]: its place in order o
        for o, perm in enumerate(orders):
            rank[o, perm] = np.arange(p)
        # Row k of an order's block: its first k players applied.
        applied = (rank[:, None, :] < np.arange(p + 1)[None, :, None]).reshape(-1, p)
        v = value(applied).reshape(len(orders), p + 1)
        none, every = float(v[0, 0]), float(v[0, -1])
        if callable(tolerance):
            tolerance = tolerance(none, every)
        contrib = np.take_along_axis(np.diff(v, axis=1), rank, axis=1)  # [orders, player]
        pair_means += list(contrib.reshape(-1, 2, p).mean(axis=1))
        if len(pair_means) >= 2 and _stderr(pair_means).max() <= tolerance:
            break
    per_pair = np.array(pair_means)
    # Every order starts from none and ends at all: the values telescope exactly.
    return ShapleyValues(per_pair.mean(axis=0), _stderr(pair_means), False, 2 * len(pair_means),
                         2 * len(pair_means) * (p + 1), none, every)


def _stderr(pair_means: list[np.ndarray]) -> np.ndarray:
    a = np.array(pair_means)
    return a.std(axis=0, ddof=1) / math.sqrt(len(a)) if len(a) > 1 else np.zeros(a.shape[1])
