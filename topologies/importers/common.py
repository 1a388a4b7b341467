"""Shared pieces of the importers: building a Cluster from hosts, NVLink domains and switch levels,
and the list of what an import assumed because the file does not say it.

Every importer returns an ``Imported``: the cluster and its ``assumed`` lines, one sentence each
("oversubscription 1 (non-blocking) at every tier: the file does not say"), which
``topoplan topology import`` prints on stderr as ``assumed: ...``.
"""

from __future__ import annotations

from typing import NamedTuple

from topologies.errors import InputError
from topologies.cluster import Cluster, cluster_from_dict
from topologies.gpus import GPUSpec, get_gpu
from topologies.hostlist import HostlistError, expand
from topologies.presets import HOP_US

__all__ = ["TIER_NAMES", "Imported", "build_cluster", "resolve_gpu", "gpus_per_host", "failed_hosts"]

TIER_NAMES = ("leaf", "spine", "core", "tier3", "tier4", "tier5", "tier6", "tier7")


class Imported(NamedTuple):
    """An imported cluster and what the import assumed (one sentence per item)."""

    cluster: Cluster
    assumed: list[str]


def resolve_gpu(gpu: str | None, source: str, hint: str = "") -> GPUSpec:
    if not gpu:
        raise InputError(f"{source}: the GPU type is not in the file; pass --gpu (one of h100, h200, h800, "
                         f"b200, b300, gb200, gb300){hint}")
    return get_gpu(gpu)


def gpus_per_host(spec: GPUSpec, gpus_per_node: int | None, assumed: list[str]) -> int:
    """``--gpus-per-node`` or the GPU type's count per host (and say so)."""
    if gpus_per_node:
        return gpus_per_node
    assumed.append(f"{spec.gpus_per_node} GPUs per host, the {spec.name} default: the file does not say "
                   "(pass --gpus-per-node)")
    return spec.gpus_per_node


def failed_hosts(failed: str | list[str] | None, hosts: list[str], source: str) -> list[str]:
    """The hosts of ``--failed`` (a hostlist), each checked to be a host of the imported file."""
    if not failed:
        return []
    try:
        names = expand(failed)
    except HostlistError as exc:
        raise InputError(f"--failed: {exc}") from None
    known = set(hosts)
    for n in names:
        if n not in known:
            raise InputError(f"--failed: {n!r} is not a host in {source}; name hosts the file lists")
    return list(dict.fromkeys(names))


def build_cluster(
    *,
    name: str,
    spec: GPUSpec,
    nodes: list[tuple[str, int]],
    domains: list[tuple[str, list[str]]] | None,
    levels: list[list[list[str]]] | None = None,
    level_gbps: list[float | None] | None = None,
    join_top: bool = True,
    nic_gbps: float | None = None,
    failed: str | list[str] | None = None,
    assumed: list[str],
    source: str,
) -> Cluster:
    """A validated Cluster. ``levels``: switch levels, lowest first, each a list of node groups
    (one per switch / block); they become tiers with explicit ``groups``. ``level_gbps``: a per-GPU
    line rate per level where the file gives one (else the NIC rate). With ``join_top`` a last tier
    spanning everything is added when the top level is not one group (the file has no level that
    joins them; said in ``assumed``); without it, the tiers are exactly the file's levels.
    Every figure the file does not give is appended to ``assumed``."""
    if not nodes:
        raise InputError(f"{source}: no nodes found; the file lists no hosts")
    if nic_gbps:
        gbps = float(nic_gbps)
    else:
        gbps = float(spec.nic_gbps)
        assumed.append(f"{gbps:g} Gb/s per GPU into the fabric, the {spec.name} NIC rate from the GPU catalog: "
                       "the file gives no line rate")
    levels = [lv for lv in (levels or []) if lv]
    rates = list(level_gbps or [])
    tiers = []
    for i, groups in enumerate(levels):
        rate = rates[i] if i < len(rates) and rates[i] else gbps
        tiers.append({"name": TIER_NAMES[min(i, len(TIER_NAMES) - 1)], "gbps_per_gpu": rate,
                      "latency_us": round((2 * i + 1) * HOP_US, 3), "oversubscription": 1.0,
                      "groups": groups})
    if not levels or (join_top and len(levels[-1]) > 1):
        i = len(levels)
        tname = TIER_NAMES[min(i, len(TIER_NAMES) - 1)]
        if levels:
            assumed.append(f"a '{tname}' tier joins the file's {len(levels[-1])} top-level units at {gbps:g} Gb/s "
                           "per GPU: the file has no level above them")
        else:
            assumed.append(f"one flat scale-out tier ('{tname}') joins all hosts at {gbps:g} Gb/s per GPU: the "
                           "file describes no switches")
        tiers.append({"name": tname, "gbps_per_gpu": gbps,
                      "latency_us": round((2 * i + 1) * HOP_US, 3), "oversubscription": 1.0})
    assumed.append("oversubscription 1 (non-blocking) at every tier: the file does not say; edit 'oversubscription' "
                   "in the written file if your fabric is tapered")
    hops = ", ".join(f"{t['name']} {t['latency_us']:g}" for t in tiers)
    assumed.append(f"switch latency {HOP_US:g} us per hop (IB, HDR figure), so one-way us per tier: {hops}")
    data = {
        "name": name,
        "gpu": spec.name,
        "nodes": [{"name": n, "gpus": g} for n, g in nodes],
        "tiers": tiers,
    }
    if domains is not None:
        data["domains"] = [{"name": d, "nodes": m} for d, m in domains]
    bad = failed_hosts(failed, [n for n, _ in nodes], source)
    if bad:
        data["health"] = {"failed_nodes": bad}
    return cluster_from_dict(data, source)
