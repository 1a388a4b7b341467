"""solver/groups.py against planner.cost.placement.group_shapes (the per-group walk over the cluster):
the worst group shape of every axis, for layouts on presets with a partial last domain, with fewer
GPUs per domain than the domain holds, and on HGX nodes; the periodicity shortcut must not change
the answer."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner.config import ParallelConfig
from planner.cost.placement import domain_slots, group_shapes, make_placement
from solver.groups import RankMap, worst_shape
from topologies.loader import load_cluster


def _rank_map(cluster, gpd):
    slots = domain_slots(cluster.domain_sizes(), gpd)
    r2g = np.concatenate([np.arange(st, st + n) for st, n in slots])
    dom = np.array([g.domain for g in cluster.gpus()])[r2g]
    units = [np.asarray(cluster.tier_units(t))[r2g] for t in range(len(cluster.fabric_tiers))]
    return RankMap(dom, units)


@pytest.mark.parametrize("name,gpus,gpd", [("gb300-nvl72", 256, None), ("gb300-nvl72", 1024, 64),
                                           ("dgx-h100", 512, None), ("gb200-nvl72", 144, 64)])
def test_worst_shapes_equal_group_shapes(name, gpus, gpd):
    cluster = load_cluster(name, gpus=gpus)
    rm = _rank_map(cluster, gpd)
    checked = 0
    for tp, cp, pp, ep, etp in itertools.product([1, 2, 4], [1, 2], [1, 2, 4], [1, 8, 16], [None, 1]):
        world = rm.capacity - rm.capacity % 64
        e = etp or tp
        if world % (tp * cp * pp) or world % (e * ep * pp):
            continue
        cfg = ParallelConfig(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)
        gs = group_shapes(cluster, cfg, make_placement(cluster, cfg, world, gpus_per_domain=gpd))
        dp, edp = world // (tp * cp * pp), world // (e * ep * pp)
        mine = {"tp": (1, tp), "cp": (tp, cp), "dp": (tp * cp, dp), "pp": (world // pp, pp),
                "ep": (e, ep), "edp": (e * ep, edp), "etp": (1, e)}
        for axis, (stride, size) in mine.items():
            g = gs[axis]
            assert rm.worst_shape(stride, size, world) == (g.size, g.per_domain, g.domains, g.tier), (axis, cfg)
            checked += 1
    assert checked > 50


def test_periodicity_shortcut_changes_nothing():
    cluster = load_cluster("dgx-h100", gpus=1024)
    rm = _rank_map(cluster, None)
    assert rm.period is not None
    plain = _rank_map(cluster, None)
    plain.period = None           # force the full walk over every group
    for stride, size in [(1, 8), (8, 16), (2, 64), (128, 8), (64, 16), (4, 4)]:
        world = 1024
        assert worst_shape(rm, stride, size, world) == worst_shape(plain, stride, size, world)
