"""Spare hosts for failed ones: the moves that keep a plan's layout and rank order.

A plan's rank r runs on (host, local GPU). When hosts fail, the plan survives unchanged if every
failed host that runs ranks gets a *spare*: a host the plan does not use, healthy, with the same
GPU count and a healthy GPU at every local index the failed host's ranks use, in the failed host's
NVLink domain (an NVL72 rack). Then only the failed hosts' ranks move, each to the same local index
on its spare, so every group that sat inside one domain still does. On HGX clusters every host is
its own NVLink domain; a failed host there moves whole onto a spare host that is itself a whole
domain (its NVLink groups stay inside one host), preferring the failed host's leaf (tier-0 unit).

Spares are the hosts of the domain that the placement leaves idle, including the healthy trays held
back under ``health.spare_trays`` (the presets list the spare trays of ``--usable-per-rack`` there,
docs/cluster.md); never a broken host: ``health.failed_nodes``, ``health.failed_trays`` or a host
with a failed GPU at a local index the ranks use. A replan takes the spares it uses off
``spare_trays`` and records the failed hosts as broken (``failed_trays`` for the trays of an NVL72
rack, ``failed_nodes`` for hosts that are their own NVLink domain).

Failed hosts are matched to spares by augmenting paths (bipartite matching), so a spare that only
some failed hosts can use is never taken by one that had another choice.
"""

from __future__ import annotations

from topologies.cluster import Cluster, cluster_from_dict

__all__ = ["assign_spares", "domain_of_hosts", "rank_hosts", "relocate", "with_health"]


def rank_hosts(cluster: Cluster, rank_to_gpu) -> list[tuple[str, int]]:
    """(host, local GPU index) of every rank of a placement on ``cluster``."""
    gpus = cluster.gpus()
    return [(gpus[g].node, gpus[g].local) for g in rank_to_gpu]


def domain_of_hosts(cluster: Cluster) -> dict[str, str]:
    """Host -> name of its NVLink domain (every host, failed ones included)."""
    return {h: d.name for d in cluster.domains for h in d.nodes}


def _broken_gpus(cluster: Cluster) -> set[tuple[str, int]]:
    out = set()
    for item in cluster.health.failed_gpus:
        host, _, idx = item.rpartition(":")
        out.add((host, int(idx)))
    return out


def _leaf_of(cluster: Cluster) -> dict[str, int]:
    """Host -> tier-0 unit of its first GPU (physical position; failed GPUs keep their ports)."""
    out: dict[str, int] = {}
    for pos, (host, _local, _idx, _dom) in enumerate(cluster.physical_gpus()):
        if host not in out:
            out[host] = cluster.physical_unit(0, pos) if cluster.tiers else 0
    return out


def candidates(cluster: Cluster, placed: list[tuple[str, int]], failed: set[str]) -> dict[str, list[str]]:
    """Failed host (that runs ranks) -> the spares it may take, in preference order."""
    dom = domain_of_hosts(cluster)
    members: dict[str, list[str]] = {}
    for h, d in dom.items():
        members.setdefault(d, []).append(h)
    gpus_of = {n.name: n.gpus for n in cluster.nodes}
    used = {h for h, _ in placed}
    locals_of: dict[str, set[int]] = {}
    for h, l in placed:
        locals_of.setdefault(h, set()).add(l)
    broken_hosts = cluster.health.broken_hosts() | failed
    broken = _broken_gpus(cluster)
    leaf = _leaf_of(cluster)
    order = {n.name: i for i, n in enumerate(cluster.nodes)}

    def usable(spare: str, need: set[int], size: int) -> bool:
        return (spare not in used and spare not in broken_hosts and gpus_of[spare] == size
                and not any((spare, l) in broken for l in need))

    out: dict[str, list[str]] = {}
    for h in dict.fromkeys(h for h, _ in placed):
        if h not in failed:
            continue
        need, size = locals_of[h], gpus_of[h]
        if len(members[dom[h]]) > 1:      # a multi-host NVLink domain (NVL72 rack): its own spares
            pool = members[dom[h]]
        else:                              # the host is a whole domain (HGX): any single-host domain
            pool = sorted((s for s in gpus_of if len(members[dom[s]]) == 1),
                          key=lambda s: (leaf[s] != leaf[h], order[s]))
        out[h] = [s for s in pool if usable(s, need, size)]
    return out


def assign_spares(cluster: Cluster, placed: list[tuple[str, int]], failed) -> tuple[dict[str, str], list[str]]:
    """(failed host -> spare host, failed hosts left without a spare). A maximum matching of failed
    hosts to their candidate spares; hosts that run no rank need none."""
    failed = set(failed)
    cand = candidates(cluster, placed, failed)
    taken: dict[str, str] = {}        # spare -> failed host

    def augment(h: str, seen: set[str]) -> bool:
        free = next((s for s in cand[h] if s not in taken and s not in seen), None)
        if free is not None:          # a free spare first: earlier hosts keep the spares they took
            taken[free] = h
            return True
        for s in cand[h]:
            if s in seen:
                continue
            seen.add(s)
            if s not in taken or augment(taken[s], seen):
                taken[s] = h
                return True
        return False

    short = [h for h in cand if not augment(h, set())]
    return {h: s for s, h in taken.items()}, short


def with_health(cluster: Cluster, broken, spare) -> Cluster:
    """``cluster`` with ``broken`` hosts recorded as broken (``health.failed_trays`` for a tray of a
    multi-host NVLink domain, ``health.failed_nodes`` for a host that is its own domain) and
    ``health.spare_trays`` set to ``spare`` (less every broken host); names in file order. Raises the
    cluster's own one-line error when nothing healthy is left."""
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    dom = domain_of_hosts(cluster)
    size = {d.name: len(d.nodes) for d in cluster.domains}
    new = set(broken) - cluster.health.broken_hosts()
    trays = {h for h in new if size[dom[h]] > 1}
    nodes = set(cluster.health.failed_nodes) | (new - trays)
    trays |= set(cluster.health.failed_trays)
    data = cluster.model_dump(mode="json", exclude_none=True)
    health = dict(data.get("health") or {})
    health["failed_nodes"] = sorted(nodes, key=order.__getitem__)
    health["failed_trays"] = sorted(trays, key=order.__getitem__)
    health["spare_trays"] = sorted(set(spare) - nodes - trays, key=order.__getitem__)
    data["health"] = health
    return cluster_from_dict(data, f"cluster {cluster.name!r}")


def relocate(cluster: Cluster, placed: list[tuple[str, int]], failed, moves: dict[str, str]) -> tuple[Cluster, list[int]]:
    """The cluster after the failure (failed hosts broken, the spares taken in use) and the new
    ``rank_to_gpu`` on it: every rank keeps its host and local index unless its host failed, then
    it runs on the same local index of that host's spare."""
    spare = set(cluster.health.spare_trays) - set(moves.values())
    new = with_health(cluster, failed, spare)
    index = {(g.node, g.local): g.index for g in new.gpus()}
    return new, [index[(moves.get(h, h), l)] for h, l in placed]
