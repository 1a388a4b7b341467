"""``topologies.collectives.Fabric`` reads its link figures straight from the cluster (GPU spec and
tiers) instead of building the networkx graph. The oracle is the graph itself: a Fabric read from
``topologies.graph.build_graph`` (the first GPU's NVLink and NIC edges, the uplinks above its leaf)
must hold exactly the same figures, for every preset and for files with several oversubscribed
tiers and failed hardware."""

from __future__ import annotations

import subprocess
import sys

import pytest

from topologies import graph as G
from topologies.cluster import cluster_from_dict
from topologies.collectives import NVLINK_HOP_US, Fabric, GroupShape
from topologies.loader import load_cluster
from topologies.presets import PRESETS


def _figures(f: Fabric) -> dict:
    return {k: v for k, v in vars(f).items() if k != "_memo"}


def _three_tier_file(failed_nodes=(), failed_gpus=()):
    return cluster_from_dict({
        "name": "three-tier",
        "gpu": "gb200",
        "nodes": [{"name": f"r{r:02d}-t[01-18]", "gpus": 4} for r in range(1, 5)],
        "domains": [{"name": f"r{r:02d}", "nodes": f"r{r:02d}-t[01-18]"} for r in range(1, 5)],
        "tiers": [
            {"name": "leaf", "gbps_per_gpu": 800, "latency_us": 0.6, "oversubscription": 1, "unit_gpus": 72},
            {"name": "spine", "gbps_per_gpu": 400, "latency_us": 1.7, "oversubscription": 2.5, "unit_gpus": 144},
            {"name": "core", "gbps_per_gpu": 800, "latency_us": 3.1, "oversubscription": 3},
        ],
        "health": {"failed_nodes": list(failed_nodes), "failed_gpus": list(failed_gpus)},
    })


CLUSTERS = [(name, dict(gpus=g)) for name in PRESETS for g in (8, 1024)] + [
    ("dgx-h100", dict(gpus=1024, oversubscription=4)),
    ("gb300-nvl72", dict(gpus=144, usable_per_domain=64)),
    ("gb200-nvl72", dict(gpus=100, usable_per_domain=64)),
]


@pytest.mark.parametrize("name,kw", CLUSTERS)
def test_fabric_from_the_cluster_equals_the_fabric_from_its_graph(name, kw):
    c = load_cluster(name, **kw)
    assert _figures(Fabric(c)) == _figures(Fabric(c, graph=G.build_graph(c)))


@pytest.mark.parametrize("failed", [dict(), dict(failed_nodes=["r01-t01"]),
                                    dict(failed_nodes=["r01-t[01-18]"], failed_gpus=["r02-t01:0"])])
def test_three_oversubscribed_tiers_and_failed_hardware(failed):
    c = _three_tier_file(**failed)
    direct, via_graph = Fabric(c), Fabric(c, graph=G.build_graph(c))
    assert _figures(direct) == _figures(via_graph)
    # by hand: above the leaf the 400G spine links limit, divided by 2.5, then by 2.5 x 3 at the core
    assert direct.tier_bw == pytest.approx([100e9, 50e9 / 2.5, 50e9 / 7.5])
    assert direct.tier_lat_us == [0.6, 1.7, 3.1]
    # and the collectives priced on both agree
    shape = GroupShape(size=16, per_domain=4, domains=4, tier=2)
    assert direct.all_reduce(shape, 1e8) == via_graph.all_reduce(shape, 1e8)


def test_nvlink_hop_latency_is_the_graphs():
    assert NVLINK_HOP_US == G.NVLINK_HOP_US


def test_building_a_fabric_does_not_import_networkx():
    code = ("import sys\n"
            "from topologies.loader import load_cluster\n"
            "from topologies.collectives import fabric_for\n"
            "fabric_for(load_cluster('gb300-nvl72', gpus=256))\n"
            "print('networkx' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
