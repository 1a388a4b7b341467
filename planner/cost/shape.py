"""The plan as a shape: what a plan needs from an allocation, independent of host names.

A plan's placement (``planner.cost.placement``) names hosts; a scheduler hands out others. What the
plan really needs is a *shape*: so many NVLink-domain **slots**, each some hosts of one domain using
so many GPUs per host, and a rank-order rule that says, for global rank r, which slot, which host of
that slot and which local GPU it runs on. Any allocation that gives each slot its own domain with
enough hosts reproduces every group's domain membership exactly: a group whose ranks sat in one
domain in the plan sits in one (other) domain on the allocation. ``local_axes`` names the parallel
axes whose every group lies inside one domain in the plan (derived from the placement, checked with
``rank_groups``, Megatron's own rank arithmetic); those are the groups the launch must keep whole.

Slots are numbered in order of their first global rank; hosts inside a slot likewise. The rank map
is stored as ``[slot, host slot, local GPU]`` per rank; ``planner/launch`` turns it into a hostfile.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner.config import ParallelConfig
from planner.cost.placement import AXES, DEFAULT_ORDER, axis_parts


class DomainSlot(BaseModel):
    """One NVLink domain the plan needs: ``hosts`` hosts of a single domain, ``gpus_per_host`` GPUs used on each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: int = Field(ge=1, description="hosts of one NVLink domain this slot needs")
    gpus_per_host: int = Field(ge=1, description="most GPUs the plan uses on one host of this slot")
    name: str | None = Field(None, description="the plan-time domain (rack/clique) name, for messages only")


class LaunchShape(BaseModel):
    """What a plan needs from an allocation (docs/launch.md): domain slots, GPUs per host, the axes
    that must stay inside one domain and the rank-order rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    world: int = Field(ge=1, description="global ranks")
    gpus_per_host: int = Field(ge=1, description="most GPUs the plan uses on one host")
    order: str = Field(DEFAULT_ORDER, description="Megatron rank order the rank map assumes")
    slots: list[DomainSlot] = Field(min_length=1, description="NVLink-domain slots, in order of first rank")
    local_axes: dict[str, int] = Field(
        default_factory=dict,
        description="axis -> group size, for every axis (size > 1) whose every group lies in one NVLink domain")
    multi_host_domains: bool = Field(description="an NVLink domain spans several hosts (NVL72 racks and trays)")
    ranks: list[tuple[int, int, int]] = Field(description="rank r -> [domain slot, host slot, local GPU]")

    @property
    def hosts(self) -> int:
        """Hosts the plan needs in all."""
        return sum(s.hosts for s in self.slots)



def domain_local_axes(config: ParallelConfig, world: int, rank_domains, order: str = DEFAULT_ORDER) -> dict[str, int]:
    """Axis -> group size for every axis of size > 1 whose every group lies in one domain
    (``rank_domains[r]``: any hashable domain key of rank r). Groups are the ``rank_groups`` ones,
    built from the axis stride (and ``dp-cp`` from both)."""
    out = {}
    for axis in AXES:
        parts = axis_parts(config, world, axis, order)
        size = 1
        for _, n in parts:
            size *= n
        if size <= 1:
            continue
        offsets = [0]
        for stride, n in parts:
            offsets = [o + k * stride for o in offsets for k in range(n)]
        if all(len({rank_domains[base + o] for o in offsets}) == 1
               for base in range(world) if all((base // s) % n == 0 for s, n in parts)):
            out[axis] = size
    return out


def launch_shape(config: ParallelConfig, hosts, local, domains, order: str = DEFAULT_ORDER,
                 domain_names=None, multi_host: bool | None = None) -> LaunchShape:
    """The shape of a placement given, per global rank r, its host ``hosts[r]``, local GPU
    ``local[r]`` and domain ``domains[r]`` (any hashable key; ``domain_names[key]`` names it).
    ``multi_host``: the cluster's domains span several hosts (NVL72 racks); None = true when the
    plan uses several hosts of one domain."""
    world = len(hosts)
    slot_of: dict = {}
    host_slot: dict[str, tuple[int, int]] = {}
    per_slot_hosts: list[list[str]] = []
    used: dict[str, int] = {}
    ranks = []
    for h, g, d in zip(hosts, local, domains):
        s = slot_of.setdefault(d, len(slot_of))
        if s == len(per_slot_hosts):
            per_slot_hosts.append([])
        if h not in host_slot:
            host_slot[h] = (s, len(per_slot_hosts[s]))
            per_slot_hosts[s].append(h)
        elif host_slot[h][0] != s:
            raise ValueError(f"host {h} lies in two NVLink domains")
        used[h] = used.get(h, 0) + 1
        ranks.append((s, host_slot[h][1], int(g)))
    names = {s: (domain_names or {}).get(d) for d, s in slot_of.items()}
    slots = [DomainSlot(hosts=len(hs), gpus_per_host=max(used[h] for h in hs),
                        name=None if names[s] is None else str(names[s]))
             for s, hs in enumerate(per_slot_hosts)]
    multi = any(s.hosts > 1 for s in slots) if multi_host is None else multi_host
    return LaunchShape(world=world, gpus_per_host=max(used.values()), order=order, slots=slots,
                       local_axes=domain_local_axes(config, world, domains, order),
                       multi_host_domains=multi, ranks=ranks)


def shape_of_placement(cluster, config: ParallelConfig, placement) -> LaunchShape:
    """The shape of ``placement`` (``planner.cost.placement.Placement``) on ``cluster``."""
    gpus = cluster.gpus()
    picked = [gpus[g] for g in placement.rank_to_gpu]
    return launch_shape(config, [g.node for g in picked], [g.local for g in picked], [g.domain for g in picked],
                        order=placement.order, domain_names=dict(enumerate(cluster.domain_names())),
                        multi_host=multi_host_cluster(cluster))


def host_domains(cluster) -> dict[str, str]:
    """Host -> NVLink-domain name of every host of a cluster (a host without a domain is its own)."""
    names = cluster.domain_names()
    out = {}
    for h in cluster.hosts():
        d = cluster.node_domain(h)
        out[h] = names[d] if d is not None and d < len(names) else h
    return out


def multi_host_cluster(cluster) -> bool:
    """True when a cluster's NVLink domains span several hosts (NVL72 racks of trays)."""
    per: dict[int, set[str]] = {}
    for g in cluster.gpus():
        per.setdefault(g.domain, set()).add(g.node)
    return any(len(s) > 1 for s in per.values())
