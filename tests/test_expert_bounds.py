"""solver.expert_bounds: every bound holds for every packing (the exhaustive optimum on small
instances) and the bounds are tight where the reasoning says they are (hand cases)."""

from itertools import combinations

import numpy as np
from hypothesis import assume, given, settings, strategies as st

from solver.expert_bounds import _pair_bound, _prefix_bound, packing_bound


def _best_packing(v, c, m, K):
    """The exhaustive optimum: every expert's replicas on a set of distinct GPUs, K per GPU."""
    best = [np.inf]
    order = np.argsort(-np.asarray(v), kind="stable")

    def go(k, fill, load):
        if k == len(order):
            best[0] = min(best[0], max(load))
            return
        i = order[k]
        for gs in combinations(range(m), int(c[i])):
            if all(fill[g] < K for g in gs):
                for g in gs:
                    fill[g] += 1
                    load[g] += v[i]
                if max(load) < best[0]:
                    go(k + 1, fill, load)
                for g in gs:
                    fill[g] -= 1
                    load[g] -= v[i]

    go(0, [0] * m, [0.0] * m)
    return best[0]


@st.composite
def _instances(draw):
    m = draw(st.integers(1, 3))
    K = draw(st.integers(1, 3))
    left, c = K * m, []
    while left:
        c.append(draw(st.integers(1, min(m, left))))
        left -= c[-1]
    v = draw(st.lists(st.integers(1, 40), min_size=len(c), max_size=len(c)))
    return np.array(v, dtype=float), np.array(c), m, K


@settings(max_examples=150, deadline=None)
@given(_instances())
def test_packing_bound_never_exceeds_the_exhaustive_optimum(inst):
    v, c, m, K = inst
    opt = _best_packing(v, c, m, K)
    assume(np.isfinite(opt))                       # a packing exists
    assert packing_bound(v, c, m, K) <= opt + 1e-9


def test_pair_bound_hand_case():
    """The shape that held EP64 over HGX (layer 57 of bench/speed.py's loads): expert A on 7 of 8
    GPUs, B once, C twice; C cannot sit twice on the one GPU without A, so some GPU holds A and C:
    0.911 + 0.259 + the three lightest others, above 1.0, which the mean and the heaviest replica
    with the four lightest both miss."""
    v = np.array([0.911, 0.379, 0.259] + [0.011] * 5 + [0.02] * 20)
    c = np.array([7, 1, 2] + [2] * 5 + [1] * 20)
    assert c.sum() == 40
    o = np.argsort(-v, kind="stable")
    assert _pair_bound(v[o], c[o], 8, 5) == 0.911 + 0.259 + 3 * 0.011
    assert packing_bound(v, c, 8, 5) >= 0.911 + 0.259 + 3 * 0.011 - 1e-12
    assert (v * c).sum() / 8 < 1.0 and 0.911 + 4 * 0.011 < 1.0


def test_prefix_bound_hand_case():
    """Two experts on every one of 3 GPUs (K = 2): each GPU holds both, 5 + 4; one on every GPU and
    one twice, with a third expert once: some GPU holds both heavy ones (j = ceil(5 / 3) = 2)."""
    assert _prefix_bound(np.array([5.0, 4.0]), np.array([3, 3]), 3, 2) == 9.0
    v, c = np.array([5.0, 4.0, 1.0]), np.array([3, 2, 1])
    assert _prefix_bound(v, c, 3, 2) == 9.0
    assert packing_bound(v, c, 3, 2) == 9.0 == _best_packing(v, c, 3, 2)
