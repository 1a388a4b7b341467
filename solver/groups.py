"""Worst-group shapes of one parallel axis, from plain per-rank arrays (no cluster objects).

Megatron lays the axes of a grid out in order; an axis with stride ``s`` (the product of the
sizes of the axes before it) and size ``k`` has the groups ``{q*s*k + j + i*s : i < k}`` for each
block ``q`` and offset ``j < s``. Given, per rank, its NVLink domain and its unit at every
scale-out tier (arrays that grow with the rank), the shape of a group is

    (size k, most members in one domain, domains touched, tier)

with tier -1 inside one domain, else the first tier whose unit holds every member (else the top
tier), as ``topologies.collectives.shape_of`` defines it. The worst group maximises
(tier, domains, -per_domain), as ``planner.cost.placement.group_shapes`` does.

Large worlds: when the per-rank arrays repeat with a period of ``P`` ranks (every id shifted by a
constant, checked on the arrays, not assumed), a block ``q`` looks like block ``q mod cycle`` and a
group ``j`` like group ``j mod P`` shifted, so only ``min(s, P)`` offsets in ``P / gcd(P, s k)``
blocks need looking at. The result is the same; only the work shrinks.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["RankMap", "worst_shape"]


class RankMap:
    """Per-rank domain and tier-unit ids for the ranks in placement order (rank r = r-th usable GPU)."""

    def __init__(self, domain: np.ndarray, units: list[np.ndarray]):
        self.domain = np.asarray(domain, dtype=np.int64)
        self.units = [np.asarray(u, dtype=np.int64) for u in units]
        self.capacity = len(self.domain)
        self.period = self._find_period()
        self._cache: dict = {}

    def _shift_periodic(self, p: int) -> bool:
        n = self.capacity
        if p <= 0 or p >= n:
            return False
        for arr in [self.domain] + self.units:
            d = arr[p:] - arr[:-p]
            if d.size and not np.all(d == d[0]):
                return False
        return True

    def _find_period(self) -> int | None:
        # Candidates: the rank span of the first unit of every tier and of the first domain.
        cands = set()
        for arr in [self.domain] + self.units:
            first = np.flatnonzero(arr != arr[0])
            if first.size:
                cands.add(int(first[0]))
        for p in sorted(cands, reverse=True):
            if self._shift_periodic(p):
                # Every smaller candidate divides... not necessarily; take the largest verified one,
                # which is a multiple of each finer structure that repeats inside it.
                return p
        return None

    def worst_shape(self, stride: int, size: int, world: int) -> tuple[int, int, int, int]:
        key = (stride, size, world)
        hit = self._cache.get(key)
        if hit is None:
            hit = worst_shape(self, stride, size, world)
            self._cache[key] = hit
        return hit


def _shapes_of_groups(rm: RankMap, ranks: np.ndarray) -> np.ndarray:
    """(G, 3) array of (tier, domains, per_domain) for groups given as rows of increasing ranks."""
    G, k = ranks.shape
    dom = rm.domain[ranks]
    if k == 1:
        return np.column_stack([np.full(G, -1), np.ones(G, np.int64), np.ones(G, np.int64)])
    change = dom[:, 1:] != dom[:, :-1]
    ndom = 1 + change.sum(axis=1)
    # most members in one domain: longest run of equal domain ids (ids are non-decreasing in a row)
    flat = dom.ravel()
    start = np.ones(flat.size, dtype=bool)
    start[1:] = flat[1:] != flat[:-1]
    start[::k] = True
    idx = np.flatnonzero(start)
    runs = np.diff(np.append(idx, flat.size))
    row_first = np.searchsorted(idx, np.arange(G) * k)
    per = np.maximum.reduceat(runs, row_first)
    T = len(rm.units)
    tier = np.full(G, T - 1, dtype=np.int64)
    settled = np.zeros(G, dtype=bool)
    for t in range(T):
        u = rm.units[t][ranks]
        same = (u.min(axis=1) == u.max(axis=1)) & ~settled
        tier[same] = t
        settled |= same
    tier[ndom == 1] = -1
    return np.column_stack([tier, ndom, per])


def worst_shape(rm: RankMap, stride: int, size: int, world: int) -> tuple[int, int, int, int]:
    """(size, per_domain, domains, tier) of the worst group of the axis (stride, size) on ``world`` ranks."""
    s, k = int(stride), int(size)
    if world > rm.capacity:
        raise ValueError(f"world {world} exceeds the {rm.capacity} ranks of the map")
    if world % (s * k):
        raise ValueError(f"world {world} is not a multiple of stride*size {s * k}")
    if k == 1:
        return (1, 1, 1, -1)
    nblocks = world // (s * k)
    offsets = s
    P = rm.period
    if P is not None:
        nblocks = min(nblocks, P // math.gcd(P, s * k))
        offsets = min(s, P)
    q = np.arange(nblocks, dtype=np.int64)[:, None, None] * (s * k)
    j = np.arange(offsets, dtype=np.int64)[None, :, None]
    i = np.arange(k, dtype=np.int64)[None, None, :] * s
    ranks = (q + j + i).reshape(-1, k)
    sh = _shapes_of_groups(rm, ranks)
    order = np.lexsort((-sh[:, 2], sh[:, 1], sh[:, 0]))   # last key primary: tier, domains, -per
    w = sh[order[-1]]
    return (k, int(w[2]), int(w[1]), int(w[0]))
