"""``place(plan, allocation)``: put a plan on the hosts a scheduler granted, at job start.

The plan's shape (``planner.cost.shape``; computed from the placement for plans written before it)
asks for NVLink-domain slots; ``planner.launch.core.assign`` (the stdlib-only implementation the Slurm
launcher also ships) maps each slot to its own granted domain and gives every global rank its host
and local GPU. A domain-local group of the plan is then domain-local on the allocation, whatever the
hosts' names or order. An allocation that cannot hold the shape raises ``InfeasibleError`` naming the
domain and its shortfall; with ``degrade=True`` the plan is made again on what was granted (the
plan's model, training setup, GPU and fabric, the granted hosts and domains).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from planner.config import Training
from planner.cost.shape import LaunchShape
from planner.errors import InfeasibleError, InputError
from planner.io import atomic_dir
from planner.launch.allocation import domain_table, fill_domains, read_allocation
from planner.launch.core import AllocationProblem, Shortfall, assign, group_domains, hostfile_text
from planner.output.emit import launch_shape_of, load_context
from planner.search.document import load_launch
from planner.search.plan import plan as make_plan
from topologies.cluster import Cluster
from topologies.loader import load_cluster


@dataclass
class Placed:
    """The plan on the granted hosts: ``hosts[r]``/``local[r]`` of every global rank, the domain each
    slot got, and (``degraded``) the new plan document when the plan was made again."""

    shape: LaunchShape
    slots: list[dict]
    hosts: list[str]
    local: list[int]
    unused: list[str]
    degraded: bool = False
    plan: dict | None = None
    reason: str | None = None       # the shortfall that made --degrade plan again

    def hostfile(self) -> str:
        return hostfile_text({"hosts": self.hosts})

    def to_dict(self) -> dict:
        return {"world": self.shape.world, "gpus_per_host": self.shape.gpus_per_host, "order": self.shape.order,
                "local_axes": dict(self.shape.local_axes), "slots": self.slots, "hosts": self.hosts,
                "local": self.local, "unused": self.unused, "degraded": self.degraded, "reason": self.reason}


def plan_document(plan) -> dict:
    if isinstance(plan, (str, Path)):
        path = Path(plan)
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: not a readable plan document ({exc}); write one with "
                             "'topoplan plan ... --save-plan plan.json' or --out DIR (DIR/plan.json)") from None
    if hasattr(plan, "dump"):
        return plan.dump()
    if hasattr(plan, "to_dict"):
        return plan.to_dict()
    if isinstance(plan, dict):
        return plan
    raise InputError("place: plan must be a plan.json path, a dict, a PlanDocument or a PlanResult")


def shape_of_document(doc: dict, index: int = 0) -> LaunchShape:
    """The shape stored in plan ``index`` of ``doc`` or, for older plans, the one its placement implies."""
    launch = load_launch(doc)
    if not 0 <= index < len(launch.plans):
        raise InputError(f"--index {index}: the plan document holds plans 0..{len(launch.plans) - 1}")
    stored = launch.plans[index].placement.shape
    return stored if stored is not None else launch_shape_of(load_context(doc, index))


def _pairs(allocation, table) -> list[tuple[str, str]]:
    if isinstance(allocation, (str, Path)):
        return read_allocation(allocation, table)
    pairs = [(a, None) if isinstance(a, str) else (str(a[0]), None if a[1] is None else str(a[1]))
             for a in allocation]
    return fill_domains(pairs, table, "allocation")


def place(plan, allocation, *, index: int = 0, cluster=None, degrade: bool = False,
          time_limit: float | None = None) -> Placed:
    """Place plan ``index`` of ``plan`` (path, dict, PlanDocument or PlanResult) on ``allocation``: a
    file (``HOST [DOMAIN]`` lines, ``nvidia-smi -q`` output, a directory of those), a list of host
    names or of ``(host, domain)`` pairs. Hosts without a domain take it from ``cluster`` (a Cluster
    or a cluster file), else from the plan's cluster. InfeasibleError (exit 3) when the allocation
    cannot hold the plan, unless ``degrade``."""
    doc = plan_document(plan)
    launch = load_launch(doc)
    own = launch.cluster
    if cluster is not None and not isinstance(cluster, Cluster):
        cluster = load_cluster(str(cluster))
    table = domain_table(cluster if cluster is not None else own)
    pairs = _pairs(allocation, table)
    shape = shape_of_document(doc, index)
    try:
        got = assign(shape.model_dump(mode="json"), pairs)
    except AllocationProblem as exc:
        raise InputError(f"--allocation: {exc}") from None
    except Shortfall as exc:
        if not degrade:
            raise InfeasibleError(f"{exc}; pass --degrade to plan again on what was granted") from None
        return _degrade(launch, pairs, own, str(exc), time_limit)
    return Placed(shape=shape, slots=got["slots"], hosts=got["hosts"], local=got["local"], unused=got["unused"])


def granted_cluster(own: Cluster, pairs) -> Cluster:
    """A cluster of the granted hosts (their GPUs per host from the plan's cluster), grouped in the
    granted domains, with the plan's GPU, tiers (explicit units cut to the granted hosts), fabric,
    calibration and broken hardware (a granted spare tray is planned on)."""
    gpus = {n.name: n.gpus for n in own.nodes}
    per = max(gpus.values())
    doms = group_domains(pairs)                      # domain -> its hosts in name order
    order = sorted(doms, key=lambda d: (-len(doms[d]), d))   # fullest racks first: placements fill in order
    keep = {h for h, _ in pairs}
    data = own.model_dump(mode="json", exclude_none=True)
    data["name"] = f"{own.name}-granted"
    data["nodes"] = [{"name": h, "gpus": gpus.get(h, per)} for d in order for h in doms[d]]
    data["domains"] = [{"name": d, "nodes": doms[d]} for d in order] if own.domains else None
    for tier in data.get("tiers") or []:
        if tier.get("groups"):
            tier["groups"] = [g for g in ([h for h in grp if h in keep] for grp in tier["groups"]) if g] or None
    health = data.get("health") or {}    # granted spare trays are the job's to use; broken hardware stays out
    data["health"] = {k: [x for x in v if x.split(":")[0] in keep] for k, v in health.items() if k != "spare_trays"}
    return Cluster.model_validate(data)


def _degrade(launch, pairs, own, reason: str, time_limit) -> Placed:
    cluster = granted_cluster(own, pairs)
    training = Training.model_validate(launch.training.model_dump())
    result = make_plan(launch.model.spec, cluster, training, top=1, time_limit=time_limit,
                       trainer=training.trainer)
    doc = result.to_dict()
    placement = doc["plans"][0]["placement"]
    shape = LaunchShape.model_validate(placement["shape"])
    hosts, local = placement["hosts"], placement["local_ranks"]   # the new plan's own (granted) hosts
    domain = dict(pairs)
    slots: list[dict] = [{"domain": None, "hosts": []} for _ in shape.slots]
    for h, (s, k, _) in zip(hosts, shape.ranks):
        if len(slots[s]["hosts"]) == k:
            slots[s]["hosts"].append(h)
            slots[s]["domain"] = domain[h]
    used = set(hosts)
    return Placed(shape=shape, slots=slots, hosts=hosts, local=local, unused=[h for h, _ in pairs if h not in used],
                  degraded=True, plan=doc, reason=reason)


def write_placed(placed: Placed, out) -> list[Path]:
    """Write ``out/hostfile`` (host of rank r on line r), ``out/local_gpus`` (its GPU), ``out/placement.json``
    and, when degraded, ``out/plan.json`` (the new plan): all at once (``planner.io.atomic_dir``)."""
    files = {"hostfile": placed.hostfile(), "local_gpus": "".join(f"{g}\n" for g in placed.local),
             "placement.json": json.dumps(placed.to_dict(), indent=1) + "\n"}
    if placed.degraded and placed.plan is not None:
        files["plan.json"] = json.dumps(placed.plan, indent=1) + "\n"
    out = Path(out)
    with atomic_dir(out) as stage:
        for rel, text in files.items():
            (stage / rel).write_text(text)
    return sorted(out / rel for rel in files)
