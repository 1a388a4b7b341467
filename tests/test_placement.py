"""Rank groups against Megatron Core's verified RankGenerator outputs (megatron-core 0.19.2
megatron/core/parallel_state.py, run on CPU: world 16 with tp 2, ep 4, pp 2, and DeepSeek-V3 on 256 GPUs),
and the rank -> GPU map against hand-built expectations."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from planner.config import ParallelConfig
from planner.errors import InfeasibleError
from planner.cost.placement import default_gpus_per_domain, make_placement, rank_groups


def test_rank_groups_match_megatron_world16():
    # trainers.md 1.4(a): world=16, tp=2, ep=4, pp=2 (cp=1, etp=tp=2 => dp=4, edp=1), VERIFIED output.
    c = ParallelConfig(tp=2, ep=4, pp=2)
    assert rank_groups(c, 16, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert rank_groups(c, 16, "pp") == [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]]
    assert rank_groups(c, 16, "dp") == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert rank_groups(c, 16, "tp-pp") == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    assert rank_groups(c, 16, "etp") == rank_groups(c, 16, "tp")
    assert rank_groups(c, 16, "ep") == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert rank_groups(c, 16, "etp-ep") == [list(range(8)), list(range(8, 16))]
    assert rank_groups(c, 16, "edp") == [[r] for r in range(16)]


def test_rank_groups_match_megatron_deepseek_256():
    # trainers.md 1.4(b): DeepSeek-V3 TP2 PP8 EP32 ETP1 on 256 ranks, groups of rank 0.
    c = ParallelConfig(tp=2, pp=8, ep=32, etp=1)
    def of0(axis):
        return next(g for g in rank_groups(c, 256, axis) if 0 in g)
    assert of0("tp") == [0, 1]
    assert of0("pp") == [0, 32, 64, 96, 128, 160, 192, 224]
    assert of0("dp") == list(range(0, 32, 2))
    assert of0("ep") == list(range(32))
    assert of0("etp") == [0]
    assert of0("edp") == [0]


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]),
       ep=st.sampled_from([1, 2, 4, 8]), etp=st.sampled_from([1, 2]), dp_mult=st.sampled_from([1, 2, 4]))
def test_groups_partition_the_world(tp, cp, pp, ep, etp, dp_mult):
    # every axis partitions the ranks; a group's size is its degree; pp groups agree on both grids
    import math
    base = math.lcm(tp * cp * pp, etp * ep * pp)
    world = base * dp_mult
    c = ParallelConfig(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)
    sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": world // (tp * cp * pp), "ep": ep, "etp": etp,
             "edp": world // (etp * ep * pp)}
    for axis, size in sizes.items():
        groups = rank_groups(c, world, axis)
        assert sorted(r for g in groups for r in g) == list(range(world))
        assert all(len(g) == size for g in groups)
    # brute force: two ranks share a dense tp group iff their coordinates differ only in tp
    for g in rank_groups(c, world, "tp"):
        assert g == list(range(g[0], g[0] + tp))


def _cluster(sizes):
    return SimpleNamespace(name="fake", domain_sizes=lambda: list(sizes))


def test_make_placement_fills_domains_in_order():
    cl = _cluster([72, 72, 72, 72])
    p = make_placement(cl, ParallelConfig(ep=64), 256, gpus_per_domain=64)
    assert p.rank_to_gpu[:64] == tuple(range(64))
    assert p.rank_to_gpu[64:128] == tuple(range(72, 136))
    assert p.rank_to_gpu[-1] == 3 * 72 + 63
    full = make_placement(cl, ParallelConfig(ep=64), 256)
    assert full.rank_to_gpu == tuple(range(256))


def test_make_placement_refuses_too_few_gpus():
    with pytest.raises(InfeasibleError):
        make_placement(_cluster([72, 72, 72]), ParallelConfig(), 256, gpus_per_domain=64)


def test_default_gpus_per_domain_keeps_ep_groups_whole():
    # EP64 on 4 racks of 72: 64 per rack keeps every EP group in one rack
    assert default_gpus_per_domain([72] * 4, ParallelConfig(ep=64), 256) == 64
    # EP32 on racks of 72 also packs whole groups with 64 per rack (2 groups per rack)
    assert default_gpus_per_domain([72] * 4, ParallelConfig(ep=32), 256) == 64
    # 8-GPU nodes already align with EP8
    assert default_gpus_per_domain([8] * 8, ParallelConfig(ep=8), 64) is None
    # not enough room at 64 per rack for 256 ranks on 3 racks+: falls back to every GPU
    assert default_gpus_per_domain([72, 72, 72, 40], ParallelConfig(ep=32), 256) is None


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 4, 8, 16, 32]),
       gpd=st.sampled_from([None, 32, 48, 64]))
def test_group_shapes_match_brute_force(tp, pp, ep, gpd):
    # the worst group per axis equals the worst of shape_of over every group from rank_groups
    from topologies.collectives import shape_of
    from topologies.loader import load_cluster

    from planner.cost.placement import AXES, group_shapes

    cl = load_cluster("gb300-nvl72", gpus=288)
    world = 128
    cfg = ParallelConfig(tp=tp, pp=pp, ep=ep, etp=1)
    if world % (tp * pp) or world % (ep * pp):
        return
    pl = make_placement(cl, cfg, world, gpus_per_domain=gpd)
    got = group_shapes(cl, cfg, pl)
    for axis in AXES:
        shapes = [shape_of(cl, [pl.rank_to_gpu[r] for r in g]) for g in rank_groups(cfg, world, axis)]
        worst = max(shapes, key=lambda s: (s.tier, s.domains, -s.per_domain))
        assert (got[axis].tier, got[axis].domains, got[axis].per_domain, got[axis].size) == \
            (worst.tier, worst.domains, worst.per_domain, worst.size), axis
