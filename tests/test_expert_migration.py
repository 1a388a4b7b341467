"""solver.experts.bounded_migration prices each single-slot rewrite incrementally; it must choose
exactly what the full scan chooses. Oracle: the full scan, kept here verbatim as it was before the
incremental pricing (every trial placement priced from scratch with expert_metrics.gpu_loads)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.expert_metrics import gpu_loads
from solver.experts import _fallbacks, bounded_migration


def _score_ref(phy, rank_domain, K, load, dispatch, home):
    return min(gpu_loads(phy, rank_domain, K, load, dispatch, f).max()
               for f in _fallbacks(phy, rank_domain, K, home, len(load)))


def migration_ref(prev, target, rank_domain, K, load, dispatch, home, max_moves):
    cur = np.asarray(prev, dtype=np.int64).copy()
    E = len(load)
    P = len(cur) // K
    for _ in range(max_moves):
        base = _score_ref(cur, rank_domain, K, load, dispatch, home)
        counts = np.bincount(cur, minlength=E)
        best = None
        for g in range(P):
            have = list(cur[g * K:(g + 1) * K])
            want = list(target[g * K:(g + 1) * K])
            add = [x for x in want if x not in have]
            for pos, a in enumerate(have):
                if a in want or counts[a] <= 1:
                    continue
                for b in add:
                    trial = cur.copy()
                    trial[g * K + pos] = b
                    val = _score_ref(trial, rank_domain, K, load, dispatch, home)
                    if best is None or val < best[0]:
                        best = (val, trial)
        if best is None or best[0] >= base - 1e-12:
            break
        cur = best[1]
    return cur


def _placement(rng, E, P, K):
    """Every expert once, the spare slots filled with replicas, no expert twice on a GPU."""
    while True:
        slots = np.concatenate([rng.permutation(E), rng.integers(0, E, P * K - E)])
        rng.shuffle(slots)
        if all(len(set(slots[g * K:(g + 1) * K])) == K for g in range(P)):
            return slots.astype(np.int64)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), P=st.sampled_from([4, 8, 16]), D=st.sampled_from([1, 2, 4]),
       extra=st.integers(1, 2), dispatch=st.sampled_from(["home", "local", "even"]),
       max_moves=st.integers(1, 6), ties=st.booleans())
def test_same_choice_as_the_full_scan(seed, P, D, extra, dispatch, max_moves, ties):
    rng = np.random.default_rng(seed)
    K = extra + 1
    E = P * K - P * extra // 2 if P * K - P * extra // 2 >= K else P
    E = max(E, K)
    rank_domain = np.repeat(np.arange(D), P // D).astype(np.int64)
    load = np.ones(E) if ties else rng.gamma(0.6, 1.0, E)   # equal loads: many exactly tied trials
    load = load / load.sum()
    prev = _placement(rng, E, P, K)
    target = _placement(rng, E, P, K)
    home = rng.integers(0, D, E)
    got = bounded_migration(prev, target, rank_domain, K, load, dispatch, home, max_moves)
    want = migration_ref(prev, target, rank_domain, K, load, dispatch, home, max_moves)
    assert np.array_equal(got, want)


def test_moves_are_capped_and_help():
    rng = np.random.default_rng(3)
    P, K, D, E = 16, 3, 4, 32
    rank_domain = np.repeat(np.arange(D), P // D).astype(np.int64)
    load = rng.gamma(0.5, 1.0, E)
    load /= load.sum()
    prev, target = _placement(rng, E, P, K), _placement(rng, E, P, K)
    home = rng.integers(0, D, E)
    for cap in (0, 1, 3):
        got = bounded_migration(prev, target, rank_domain, K, load, "home", home, cap)
        assert int((got != prev).sum()) <= cap
        assert _score_ref(got, rank_domain, K, load, "home", home) <= _score_ref(prev, rank_domain, K, load, "home", home)
