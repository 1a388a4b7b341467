"""Lower bounds on the busiest GPU when one NVLink domain's replicas are packed onto its GPUs.

The packing problem (:func:`solver.experts._pack_cpsat` solves it exactly): ``m`` GPUs with exactly
``K`` slots each; expert ``i`` has ``c[i] <= m`` replicas in the domain, each carrying ``v[i]``, and at
most one replica of an expert sits on a GPU. Every bound here holds for every such packing, so a
greedy packing within a small factor of the bound needs no CP-SAT (tests/test_expert_bounds.py checks
each against the exhaustive optimum on small instances).

* **mean**: some GPU carries at least the domain's total over ``m``.
* **prefix**: the ``t`` heaviest experts have ``S_t`` replicas on ``m`` GPUs, so some GPU holds at least
  ``j = ceil(S_t / m)`` of them, on distinct experts: at least the ``j`` lightest of those ``t``, plus
  the ``K - j`` lightest experts of the rest (all lighter); ``t = 1`` is the heaviest replica with the
  ``K - 1`` lightest experts.
* **pair**: two experts with ``c[i] + c[j] > m`` share a GPU (each has its replicas on distinct GPUs),
  with ``K - 2`` other experts: the heaviest such pair plus the ``K - 2`` lightest others.
* **two slots**: with ``K = 2`` and the distinctness dropped, pairing the heaviest replica with the
  lightest, the second heaviest with the second lightest, ... is the best packing
  (:func:`pair_sums`); its busiest GPU bounds every packing.
"""

from __future__ import annotations

import numpy as np


def pair_sums(vals: np.ndarray, m: int) -> np.ndarray:
    """Rows of 2m replica loads (free slots as 0): the GPU loads of the best packing with 2 slots
    per GPU, heaviest paired with lightest (optimal for the busiest GPU); returns [rows, m]."""
    a = np.sort(vals, axis=-1)
    return a[..., :m][..., ::-1] + a[..., m:]


def _prefix_bound(v: np.ndarray, c: np.ndarray, m: int, K: int) -> float:
    """The prefix bound over every ``t`` (``v`` sorted heaviest first, ``c`` in the same order)."""
    E = len(v)
    pre = np.concatenate([[0.0], np.cumsum(v)])
    t = np.arange(1, E + 1)
    j = -(-np.cumsum(c) // m)                       # replicas of the t heaviest that share a GPU
    a = np.maximum(j, K - (E - t))                  # K distinct experts: too few outside forces more in
    ok = a <= np.minimum(K, t)
    a = np.where(ok, a, 0)
    inside = pre[t] - pre[t - a]                    # the a lightest of the t heaviest
    outside = pre[E] - pre[E - (K - a)]             # the K - a lightest overall, all outside the t
    return float(np.where(ok, inside + outside, 0.0).max())


def _pair_bound(v: np.ndarray, c: np.ndarray, m: int, K: int) -> float:
    """The pair bound (``v`` sorted heaviest first)."""
    if K < 2 or len(v) < 2:
        return 0.0
    share = (c[:, None] + c[None, :]) > m
    np.fill_diagonal(share, False)
    if not share.any():
        return 0.0
    pv = np.where(share, v[:, None] + v[None, :], -np.inf)
    i, j = np.unravel_index(int(np.argmax(pv)), pv.shape)
    rest = np.sort(np.delete(v, [i, j]))
    return float(pv[i, j] + rest[:K - 2].sum())


def packing_bound(v: np.ndarray, c: np.ndarray, m: int, K: int) -> float:
    """A lower bound on the busiest GPU of any packing of ``c[i]`` replicas of load ``v[i]`` (one per
    GPU at most) onto ``m`` GPUs of exactly ``K`` slots (``sum(c) == K * m``): the largest of the
    mean, prefix, pair and (``K = 2``) two-slot bounds of this module's docstring."""
    v = np.asarray(v, dtype=float)
    c = np.asarray(c, dtype=np.int64)
    order = np.argsort(-v, kind="stable")
    v, c = v[order], c[order]
    bound = max(float((v * c).sum() / m), _prefix_bound(v, c, m, K), _pair_bound(v, c, m, K))
    if K == 2:
        bound = max(bound, float(pair_sums(np.repeat(v, c), m).max()))
    return bound
