"""Shared pieces of the importers: building a Cluster from hosts, NVLink domains and switch levels."""

from __future__ import annotations

from topologies.errors import InputError
from topologies.cluster import Cluster, cluster_from_dict
from topologies.gpus import GPUSpec, get_gpu
from topologies.presets import HOP_US

__all__ = ["TIER_NAMES", "build_cluster", "resolve_gpu"]

TIER_NAMES = ("leaf", "spine", "core", "tier3", "tier4", "tier5", "tier6", "tier7")


def resolve_gpu(gpu: str | None, source: str, hint: str = "") -> GPUSpec:
    if not gpu:
        raise InputError(f"{source}: the GPU type is not in the file; pass --gpu (one of h100, h200, h800, "
                         f"b200, b300, gb200, gb300){hint}")
    return get_gpu(gpu)


def build_cluster(
    *,
    name: str,
    spec: GPUSpec,
    nodes: list[tuple[str, int]],
    domains: list[tuple[str, list[str]]] | None,
    levels: list[list[list[str]]] | None = None,
    nic_gbps: float | None = None,
    source: str,
) -> Cluster:
    """A validated Cluster. ``levels``: switch levels, lowest first, each a list of node groups
    (one per switch / block); they become tiers with explicit ``groups``. A last tier spanning
    everything is added unless the top level already is one group."""
    if not nodes:
        raise InputError(f"{source}: no nodes found; the file lists no hosts")
    gbps = float(nic_gbps or spec.nic_gbps)
    tiers = []
    levels = [lv for lv in (levels or []) if lv]
    for i, groups in enumerate(levels):
        tiers.append({"name": TIER_NAMES[min(i, len(TIER_NAMES) - 1)], "gbps_per_gpu": gbps,
                      "latency_us": round((2 * i + 1) * HOP_US, 3), "oversubscription": 1.0,
                      "groups": groups})
    if not levels or len(levels[-1]) > 1:
        i = len(levels)
        tiers.append({"name": TIER_NAMES[min(i, len(TIER_NAMES) - 1)], "gbps_per_gpu": gbps,
                      "latency_us": round((2 * i + 1) * HOP_US, 3), "oversubscription": 1.0})
    data = {
        "name": name,
        "gpu": spec.name,
        "nodes": [{"name": n, "gpus": g} for n, g in nodes],
        "tiers": tiers,
    }
    if domains is not None:
        data["domains"] = [{"name": d, "nodes": m} for d, m in domains]
    return cluster_from_dict(data, source)
