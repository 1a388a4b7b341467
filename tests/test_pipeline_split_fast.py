"""The pipeline balancer ``planner.model.pipeline._split`` against two independent oracles.

1. Brute force (small n and stage counts): every composition of n layers into ``stages`` parts
   (empty parts allowed) that respects the fixed first / last counts, ranked by
   (max stage cost, sum of squared stage costs, -sum(stage_index * cost)) and, among full ties,
   by the stage starts read from the last stage back (smallest first) -- the order the
   documented dynamic program keeps.
2. A plain dynamic program without any pruning, binary search or memo (DeepSeek-V3 sizes: 61
   layers on up to 64 stages, where brute force is out of reach), with tuple keys.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InputError
from planner.model.spec import load_model
from planner.model.pipeline import _split, _weights


def _costs(w, counts, extra):
    out, a = [], 0
    for s, c in enumerate(counts):
        out.append(sum(w[a : a + c]) + (extra if s == len(counts) - 1 else 0))
        a += c
    return out


def brute_force(w, stages, extra, first, last):
    n = len(w)
    best, best_key = None, None
    for cuts in itertools.combinations_with_replacement(range(n + 1), stages - 1):
        starts = (0,) + cuts
        counts = [b - a for a, b in zip(starts, cuts + (n,))]
        if (first is not None and counts[0] != first) or (last is not None and counts[-1] != last):
            continue
        c = _costs(w, counts, extra)
        key = (max(c), sum(x * x for x in c), -sum(s * x for s, x in enumerate(c)), starts[::-1])
        if best_key is None or key < best_key:
            best, best_key = counts, key
    return best


def plain_dp(w, stages, extra, first, last):
    """Two passes over every (stage, layers placed) state, no pruning."""
    n = len(w)
    pre = [0]
    for x in w:
        pre.append(pre[-1] + x)

    def spans(s, i):
        for j in range(i, n + 1):
            if s == 0 and first is not None and j - i != first:
                continue
            if s == stages - 1 and (j != n or (last is not None and j - i != last)):
                continue
            yield j, pre[j] - pre[i] + (extra if s == stages - 1 else 0)

    inf = float("inf")
    best = [0] + [inf] * n
    for s in range(stages):
        new = [inf] * (n + 1)
        for i in range(n + 1):
            if best[i] < inf:
                for j, c in spans(s, i):
                    new[j] = min(new[j], max(best[i], c))
        best = new
    bound = best[n]
    if bound == inf:
        return None
    key = [(0, 0)] + [None] * n
    back = []
    for s in range(stages):
        new, arg = [None] * (n + 1), [None] * (n + 1)
        for i in range(n + 1):
            if key[i] is None:
                continue
            for j, c in spans(s, i):
                if c > bound:
                    continue
                k = (key[i][0] + c * c, key[i][1] - s * c)
                if new[j] is None or k < new[j]:  # ties: the smallest i
                    new[j], arg[j] = k, i
        key = new
        back.append(arg)
    counts, j = [], n
    for s in range(stages - 1, -1, -1):
        i = back[s][j]
        counts.append(j - i)
        j = i
    return counts[::-1]


def _pins(data, n, pin, stages):
    first = data.draw(st.integers(0, n)) if pin in ("first", "both") else None
    last = data.draw(st.integers(0, n - (first or 0))) if pin in ("last", "both") else None
    if stages == 2 and first is not None and last is not None:
        last = n - first  # two fixed stages must hold every layer
    return first, last


@settings(max_examples=60, deadline=None)
@given(
    w=st.lists(st.integers(0, 6), min_size=1, max_size=9),
    stages=st.integers(2, 5),
    extra=st.integers(0, 14),
    pin=st.sampled_from([None, None, "first", "last", "both"]),
    data=st.data(),
)
def test_split_equals_brute_force_including_ties(w, stages, extra, pin, data):
    first, last = _pins(data, len(w), pin, stages)
    want = brute_force(w, stages, extra, first, last)
    if want is None:  # no composition honours the pins: the balancer refuses too
        with pytest.raises(InputError):
            _split(w, stages, extra, first, last)
        return
    assert _split(w, stages, extra, first, last) == want


@settings(max_examples=30, deadline=None)
@given(
    w=st.lists(st.sampled_from([5, 19, 20, 20, 20, 21, 22]), min_size=8, max_size=61),
    stages=st.integers(2, 64),
    extra=st.sampled_from([0, 20, 78, 150]),
    pin=st.sampled_from([None, None, "first", "last", "both"]),
    data=st.data(),
)
def test_split_equals_a_plain_dynamic_program_at_deepseek_sizes(w, stages, extra, pin, data):
    first, last = _pins(data, len(w), pin, stages)
    want = plain_dp(w, stages, extra, first, last)
    if want is None:
        with pytest.raises(InputError):
            _split(w, stages, extra, first, last)
        return
    got = _split(w, stages, extra, first, last)
    assert got == want
    assert sum(got) == len(w)


@pytest.mark.parametrize("stages,first,last", [(4, None, None), (16, None, None), (16, 3, 2), (48, None, None),
                                              (64, None, None), (8, 7, 6)])
def test_deepseek_weights_match_the_plain_program(stages, first, last):
    w, extra = _weights(load_model("deepseek-v3"), 4096)
    assert _split(w, stages, extra, first, last) == plain_dp(w, stages, extra, first, last)


def test_memoised_result_is_a_fresh_list_each_call():
    w = [3, 1, 4, 1, 5, 9, 2, 6]
    a = _split(w, 3, 2, None, None)
    a[0] += 100  # callers may mutate what they get
    assert _split(w, 3, 2, None, None) == brute_force(w, 3, 2, None, None)
    assert _split(tuple(w), 3, 2, None, None) == brute_force(w, 3, 2, None, None)
