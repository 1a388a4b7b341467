"""The cluster as a networkx graph: GPUs, NVLink switch domains, NICs and the scale-out switches.

Nodes (``kind`` attribute):
  ("gpu", host, local)        kind="gpu", healthy, index (position in Cluster.gpus() or None), domain
  ("nvs", domain)             kind="nvswitch": one node per NVLink domain (the switch trays of an
                              NVL72 rack, or the NVSwitches of an HGX board, taken together)
  ("nic", host, local)        kind="nic": one scale-out NIC per GPU
  ("leaf", unit, rail)        kind="switch", tier=0: the rail-optimised leaf of a tier-0 unit (the
                              same-index NIC of every host in the unit, hardware.md s5)
  (tier name, unit)           kind="switch", tier=t >= 1: the switches of a tier-t unit taken together

Edges carry ``kind`` and ``capacity`` (GB/s per direction) and ``latency_us``:
  gpu - nvs      kind="nvlink": capacity = NVLink per-GPU bandwidth, plus the achievable figures
                 ``ring_busbw``, ``nvls_busbw``, ``deepep_gbps`` (GB/s) that the collective model uses
  gpu - nic      kind="pcie": capacity = the NIC line rate (the NIC, not PCIe, limits)
  nic - leaf     kind="net": capacity = tier-0 line rate per GPU
  switch - switch kind="uplink": capacity = the sum of the lower switch's downlinks divided by the upper
                 tier's ``oversubscription``; ``oversubscription`` kept as an attribute

Queries are plain functions over the graph (``domain_of``, ``path_capacity``).
"""

from __future__ import annotations

import networkx as nx

__all__ = ["build_graph", "domain_of", "path_capacity", "NVLINK_HOP_US"]

NVLINK_HOP_US = 0.47   # NCCL hwLat NVLINK, ring LL (hardware.md s2.4)


def build_graph(cluster) -> nx.Graph:
    """The graph of a cluster (see module doc). Failed GPUs are present with healthy=False."""
    spec = cluster.gpu_spec
    tiers = cluster.fabric_tiers
    g = nx.Graph(name=cluster.name, gpu=spec.name, tiers=[t.name for t in tiers])
    nvl_attrs = dict(
        kind="nvlink", capacity=spec.nvlink_gbps_uni, latency_us=NVLINK_HOP_US,
        ring_busbw=spec.ring_busbw_gbps, nvls_busbw=spec.nvls_busbw_gbps or 0.0,
        deepep_gbps=spec.deepep_nvlink_gbps,
    )
    t0 = tiers[0]
    line = t0.gbps_per_gpu / 8.0
    leaf_down: dict[tuple, float] = {}
    leaf_parent: dict[tuple, tuple | None] = {}
    for pos, (host, local, idx, dname) in enumerate(cluster.physical_gpus()):
        gnode = ("gpu", host, local)
        g.add_node(gnode, kind="gpu", host=host, local=local, healthy=idx >= 0,
                   index=idx if idx >= 0 else None, domain=dname)
        nvs = ("nvs", dname)
        if nvs not in g:
            g.add_node(nvs, kind="nvswitch", domain=dname)
        g.add_edge(gnode, nvs, **nvl_attrs)
        nic = ("nic", host, local)
        g.add_node(nic, kind="nic", host=host, local=local, gbps=t0.gbps_per_gpu)
        g.add_edge(gnode, nic, kind="pcie", capacity=line, latency_us=0.0)
        leaf = ("leaf", cluster.physical_unit(0, pos), local)
        if leaf not in g:
            g.add_node(leaf, kind="switch", tier=0, name=t0.name)
        g.add_edge(nic, leaf, kind="net", capacity=line, latency_us=t0.latency_us)
        leaf_down[leaf] = leaf_down.get(leaf, 0.0) + line
        if len(tiers) > 1 and leaf not in leaf_parent:
            leaf_parent[leaf] = (tiers[1].name, cluster.physical_unit(1, pos))
    # uplinks, tier by tier
    lower_down = leaf_down
    lower_parent = leaf_parent
    for t in range(1, len(tiers)):
        tier = tiers[t]
        upper_down: dict[tuple, float] = {}
        upper_parent: dict[tuple, tuple] = {}
        for sw, down in lower_down.items():
            parent = lower_parent[sw]
            if parent not in g:
                g.add_node(parent, kind="switch", tier=t, name=tier.name)
            cap = down / tier.oversubscription
            g.add_edge(sw, parent, kind="uplink", capacity=cap, latency_us=tier.latency_us,
                       oversubscription=tier.oversubscription)
            upper_down[parent] = upper_down.get(parent, 0.0) + down
        if t + 1 < len(tiers):
            # the tier-(t+1) unit of a tier-t switch: that of any GPU below it
            first_pos: dict[tuple, int] = {}
            for pos in range(len(cluster.physical_gpus())):
                key = (tier.name, cluster.physical_unit(t, pos))
                first_pos.setdefault(key, pos)
            for sw in upper_down:
                upper_parent[sw] = (tiers[t + 1].name, cluster.physical_unit(t + 1, first_pos[sw]))
        lower_down, lower_parent = upper_down, upper_parent
    return g


def domain_of(graph: nx.Graph, host: str, local: int) -> str:
    """The NVLink domain name of a GPU."""
    return graph.nodes[("gpu", host, local)]["domain"]


def path_capacity(graph: nx.Graph, a, b) -> tuple[float, float]:
    """(bottleneck capacity GB/s, summed latency us) along the shortest path between two graph nodes."""
    path = nx.shortest_path(graph, a, b)
    cap = float("inf")
    lat = 0.0
    for u, v in zip(path, path[1:]):
        e = graph.edges[u, v]
        cap = min(cap, e["capacity"])
        lat += e.get("latency_us", 0.0)
    return cap, lat
