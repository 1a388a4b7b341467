"""bench/eplb.py (our EPLB implementation) against hand cases, brute force and eplb.md's table."""

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.eplb import balanced_packing, rebalance_experts, replicate  # noqa: E402
from planner.search.experts import evaluate_placement, sample_routing, synthetic_loads  # noqa: E402


def test_replicate_hand_case():
    # loads 6, 3, 1 with 5 slots: 6->2 (3 each), then max ratio is 3 (expert 0 first) -> 6/3=2
    assert replicate(np.array([6.0, 3.0, 1.0]), 5).tolist() == [3, 1, 1]


def test_replicate_minimises_largest_share_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(20):
        w = rng.random(4) * 10
        got = (w / replicate(w, 7)).max()
        best = min((w / np.array(c)).max() for c in itertools.product(range(1, 5), repeat=4) if sum(c) == 7)
        assert got == pytest.approx(best)


def test_balanced_packing_equal_counts_and_greedy_order():
    w = np.array([5.0, 4, 3, 2, 2, 1])
    packs = balanced_packing(w, 2)
    assert np.bincount(packs).tolist() == [3, 3]
    # 5->p0, 4->p1, 3->p1 (7) , 2->p0 (7), 2->p0? p0 full at 3? p0 has 5,2 -> 2 goes to lighter p0 (7 vs 7: p0)
    loads = np.bincount(packs, weights=w)
    assert sorted(loads.tolist()) == [8.0, 9.0]


def test_hierarchical_keeps_groups_on_their_node():
    w = np.random.default_rng(0).random((1, 16)) + 0.1
    p2l, l2p, cnt = rebalance_experts(w, 24, 4, 2, 4, "hierarchical")   # 2 nodes x 2 GPUs x 6 slots
    node_of_slot = np.arange(24) // 12
    for g in range(4):
        nodes = {int(node_of_slot[s]) for s in range(24) if p2l[0, s] // 4 == g}
        assert len(nodes) == 1
    assert cnt[0].sum() == 24 and (cnt[0] >= 1).all()
    for e in range(16):
        slots = [s for s in l2p[0, e] if s >= 0]
        assert sorted(slots) == sorted(np.flatnonzero(p2l[0] == e).tolist())


def test_reproduces_eplb_md_table_zipf():
    """eplb.md: Zipf s=0.8, EP64 over 8 nodes, one spare slot: hierarchical 1.78 (worst 2.24), 3.97
    domains/token; global 1.003, 5.33. Our seeds differ, so a few layers and a tolerance."""
    L = 12
    loads = synthetic_loads("zipf", L, 256, seed=0)
    routing = [sample_routing(loads[i], 8, 4, 8, seed=i) for i in range(L)]
    rd = np.repeat(np.arange(8), 8)
    h, _, _ = rebalance_experts(loads, 320, 8, 8, 64, "hierarchical")
    g, _, _ = rebalance_experts(loads, 320, 8, 8, 64, "global")
    mh = evaluate_placement(h, rd, 5, loads, routing, "even")
    mg = evaluate_placement(g, rd, 5, loads, routing, "even")
    assert np.mean([m["balance"] for m in mh]) == pytest.approx(1.78, abs=0.15)
    assert np.mean([m["domains_per_token"] for m in mh]) == pytest.approx(3.97, abs=0.05)
    assert np.mean([m["balance"] for m in mg]) == pytest.approx(1.003, abs=0.01)
    assert np.mean([m["domains_per_token"] for m in mg]) == pytest.approx(5.33, abs=0.12)
