"""The cluster file format: a pydantic schema that is also the YAML layout.

```yaml
name: my-gb300
gpu: gb300                      # catalog key or alias (topologies.gpus)
nodes:                          # hosts; ``name`` may be a hostlist expression
  - {name: "gb300-r01-t[01-18]", gpus: 4}
  - {name: "gb300-r02-t[01-18]", gpus: 4}
domains:                        # NVLink domains: which nodes share one NVLink fabric
  - {name: r01, nodes: "gb300-r01-t[01-18]"}
  - {name: r02, nodes: "gb300-r02-t[01-18]"}
tiers:                          # scale-out fabric, lowest first
  - {name: leaf, gbps_per_gpu: 800, latency_us: 0.6, oversubscription: 1, unit_gpus: 576}
  - {name: spine, gbps_per_gpu: 800, latency_us: 1.8, oversubscription: 1}
fabric: infiniband              # or roce; omitted = infiniband (the Slurm emitter's NCCL settings)
health:                         # excluded from planning
  failed_nodes: ["gb300-r02-t07"]
  failed_gpus: ["gb300-r01-t03:2"]     # host:local-index
  spare_trays: "gb300-r01-t[17-18]"    # healthy trays held back (spares), not broken
```

Rules: ``domains`` omitted means every node is its own domain (HGX); when given, every node is
in exactly one domain. A domain may not hold more GPUs than the GPU type's NVLink domain allows.
A tier's *unit* is the set of GPUs that reach each other through that tier's switches without
going higher: ``unit_gpus`` consecutive GPUs in physical order (failed GPUs count: they still
occupy ports), or explicit ``groups`` of nodes (from a Slurm tree). The last tier's unit is the
whole cluster. ``oversubscription`` of a tier divides the per-GPU bandwidth of traffic that has
to climb to that tier's switches (it multiplies with the tiers below).

Canonical GPU order (``Cluster.gpus()``): domain by domain as listed, node by node in the order of
``nodes``, local index ascending; failed GPUs left out. ``GPU.domain`` indexes
``Cluster.domain_sizes()`` (domains without a healthy GPU are dropped from both).
"""

from __future__ import annotations

from functools import lru_cache

from typing import Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from topologies.errors import InputError
from topologies.gpus import GPUSpec, get_gpu
from topologies.hostlist import HostlistError, compress, expand

__all__ = ["GPU", "Node", "Domain", "Tier", "Health", "Cluster", "Calibration", "NVLinkFit", "TierFit",
           "cluster_from_dict", "validation_line"]


class GPU(NamedTuple):
    index: int    # position in Cluster.gpus()
    node: str     # host name
    local: int    # local GPU index on the host (CUDA device ordinal)
    domain: int   # index into Cluster.domain_sizes()


def _names(value: Any, field: str) -> list[str]:
    """A hostlist string, or a list of names / hostlist strings -> list of names."""
    if value is None:
        return []
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    else:
        raise ValueError(f"{field}: expected a hostlist string or a list of host names, got {type(value).__name__}")
    try:
        return expand(items)
    except HostlistError as exc:
        raise ValueError(f"{field}: {exc}") from None


def host_name_problem(name: str) -> str | None:
    """Why ``name`` is not a host name Slurm and DNS accept (RFC 1123: labels of 1-63 ASCII letters,
    digits and hyphens, no hyphen first or last, dots between labels, 253 characters at most), or None."""
    if not name.isascii():
        return f"has a non-ASCII character {next(ch for ch in name if not ch.isascii())!r}"
    if len(name) > 253:
        return f"is {len(name)} characters long (at most 253)"
    for label in name.split("."):
        if not label:
            return "has an empty label (two dots, or a dot first or last)"
        if len(label) > 63:
            return f"has a label of {len(label)} characters (at most 63)"
        odd = [ch for ch in label if not (ch.isalnum() or ch == "-")]
        if odd:
            return f"has the character {odd[0]!r}"
        if label[0] == "-" or label[-1] == "-":
            return f"has a label {label!r} that starts or ends with a hyphen"
    return None


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="host name as the launcher sees it")
    gpus: int = Field(ge=1, le=72, description="GPUs on this host")


class Domain(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="domain name (rack, NVL72 clique, or the host for HGX)")
    nodes: list[str] = Field(description="member hosts (hostlist expressions allowed)")

    @field_validator("nodes", mode="before")
    @classmethod
    def _expand(cls, v):
        return _names(v, "nodes")


class Tier(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="leaf, spine, core, ...")
    gbps_per_gpu: float = Field(gt=0, description="per-GPU line rate into this tier, Gb/s")
    latency_us: float = Field(ge=0, description="one-way switch latency of a path through this tier, us")
    oversubscription: float = Field(1.0, gt=0, description="downlink:uplink ratio into this tier (1 = non-blocking)")
    unit_gpus: int | None = Field(None, ge=1, description="GPUs per non-blocking unit of this tier; None = all")
    groups: list[list[str]] | None = Field(None, description="explicit units as lists of hosts (Slurm tree)")

    @field_validator("groups", mode="before")
    @classmethod
    def _expand(cls, v):
        if v is None:
            return None
        if not isinstance(v, (list, tuple)):
            raise ValueError("groups: expected a list of hostlists")
        return [_names(g, "groups") for g in v]


class Health(BaseModel):
    """What planning leaves out. ``failed_*`` is broken hardware; ``spare_trays`` are healthy NVL72 trays
    held back as spares (``--usable-per-rack``): out of the plan's world like a failed tray, but a
    replan (``planner.launch.spares``) and goodput's spare count may use them."""
    model_config = ConfigDict(extra="forbid")
    failed_nodes: list[str] = Field(default_factory=list, description="broken hosts, excluded from planning")
    failed_trays: list[str] = Field(default_factory=list, description="broken NVL72 compute trays (= hosts), "
                                    "excluded from planning; a replan never uses them")
    spare_trays: list[str] = Field(default_factory=list, description="healthy NVL72 compute trays (= hosts) held "
                                   "back as spares: excluded from planning, still in their rack and fabric ports; "
                                   "a replan moves a failed tray's ranks onto them")
    failed_gpus: list[str] = Field(default_factory=list, description="'host:local' GPUs excluded")

    @field_validator("failed_nodes", "failed_trays", "spare_trays", mode="before")
    @classmethod
    def _expand(cls, v, info):
        return _names(v, info.field_name)

    def out_of_plan(self) -> list[str]:
        """Hosts excluded from planning whole: failed nodes and trays, and spare trays."""
        return [*self.failed_nodes, *self.failed_trays, *self.spare_trays]

    def broken_hosts(self) -> set[str]:
        """Hosts that are broken (never a spare): failed nodes and failed trays."""
        return {*self.failed_nodes, *self.failed_trays}


class NVLinkFit(BaseModel):
    """NVLink-domain figures fitted to measurements (``topoplan topology calibrate``); each replaces the
    catalog figure or model constant ``topologies.collectives.Fabric`` would use. None = the default."""
    model_config = ConfigDict(extra="forbid")
    busbw_gbps: float | None = Field(None, gt=0, description="NCCL ring bus bandwidth inside a domain, GB/s per GPU")
    nvls_busbw_gbps: float | None = Field(None, gt=0, description="NVLS all-reduce bus bandwidth, GB/s per GPU")
    deepep_gbps: float | None = Field(None, gt=0, description="DeepEP dispatch/combine bandwidth over NVLink, GB/s")
    base_us: float | None = Field(None, ge=0, description="ring collective base latency inside a domain, us")
    nvls_base_us: float | None = Field(None, ge=0, description="NVLS all-reduce base latency, us")
    pipe_us: float | None = Field(None, ge=0, description="pipeline per-chunk latency over NVLink, us")
    ll_base_us: float | None = Field(None, ge=0, description="low-latency protocol branch: base latency, us")
    ll_busbw_gbps: float | None = Field(None, gt=0, description="low-latency protocol branch: bus bandwidth, GB/s")


class TierFit(BaseModel):
    """Scale-out figures fitted to measurements for the traffic that climbs to one tier."""
    model_config = ConfigDict(extra="forbid")
    tier: str = Field(description="name of a tier in ``tiers``")
    busbw_gbps: float | None = Field(None, gt=0, description="NCCL bandwidth per GPU through this tier, GB/s "
                                     "(replaces 0.74 x line rate / oversubscription)")
    deepep_gbps: float | None = Field(None, gt=0, description="DeepEP RDMA bandwidth per GPU through this tier, GB/s")
    step_us: float | None = Field(None, ge=0, description="latency of one network step through this tier, us "
                                  "(replaces NCCL's per-step latency plus the switch latency)")
    pipe_us: float | None = Field(None, ge=0, description="pipeline per-chunk latency over the network, us")
    ll_base_us: float | None = Field(None, ge=0, description="low-latency protocol branch: base latency, us")
    ll_busbw_gbps: float | None = Field(None, gt=0, description="low-latency protocol branch: bus bandwidth, GB/s")


class Calibration(BaseModel):
    """Link figures fitted to nccl-tests / DeepEP runs on this cluster (``topoplan topology calibrate``)."""
    model_config = ConfigDict(extra="forbid")
    nvlink: NVLinkFit | None = None
    tiers: list[TierFit] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list, description="the result files the figures were fitted to")
    worst_error: float | None = Field(None, description="largest |predicted/measured - 1| over the fitted "
                                      "nccl-tests rows")


class NodeNetwork(BaseModel):
    """The scale-out network devices of one host as a Kubernetes pod must claim them (``--emit k8s``,
    planner/output/emit/k8s_network.py; docs/k8s.md): the cloud presets fill it from the clouds' pages."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    nics_per_node: int = Field(ge=1, le=64, description="scale-out RDMA devices per host (AWS EFA devices, "
                               "GCP GPU NICs): a pod that owns the host claims them all")
    kubernetes: Literal["eks-efa", "gke-tcpxo", "gke-rdma", "aks-ib", "oke-rdma"] | None = Field(
        None, description="how a pod reaches them: eks-efa (the EFA device plugin's vpc.amazonaws.com/efa and "
        "hugepages), gke-tcpxo (GKE multi-networking with the TCPXO receive-datapath sidecar), gke-rdma (GKE "
        "multi-networking with the gIB NCCL plug-in), aks-ib (AKS: the NVIDIA Network Operator's SR-IOV device "
        "plugin's rdma/ib, IPC_LOCK), oke-rdma (OKE: host network, /dev/infiniband, privileged with IPC_LOCK, the "
        "shape's NCCL_IB_* settings); None = the emitted pods ask for nothing beyond the GPUs")
    hcas: tuple[str, ...] = Field((), description="the RDMA devices NCCL uses (NCCL_IB_HCA, exact names) where the "
                                  "cloud's manifests fix them (oke-rdma); empty = NCCL_IB_HCA is the user's")
    topo_file: str = Field("", description="an NCCL topology file of the VM size in topologies/data/nccl_topo "
                           "(aks-ib on ND H100 v5: ndv5-topo.xml) that the pods get as NCCL_TOPO_FILE; empty = none")
    source: str = Field("", description="where the device count comes from")

    @model_validator(mode="after")
    def _hcas_are_the_nics(self):
        if self.hcas and len(self.hcas) != self.nics_per_node:
            raise ValueError(f"network.hcas: {len(self.hcas)} devices for nics_per_node {self.nics_per_node}")
        return self


def default_tiers(spec: GPUSpec) -> list[Tier]:
    """A flat non-blocking fabric at the GPU's NIC rate (used when a file has no ``tiers``)."""
    return [Tier(name="leaf", gbps_per_gpu=spec.nic_gbps, latency_us=0.6, oversubscription=1.0)]


class Cluster(BaseModel):
    """A cluster: GPU type, hosts, NVLink domains, scale-out tiers and health."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("cluster", description="a label for reports")
    gpu: str = Field(description="GPU type (catalog key or alias)")
    nodes: list[Node] = Field(description="hosts with their GPU counts")
    domains: list[Domain] | None = Field(None, description="NVLink domains; omitted = one per node "
                                         "(always a list after validation)")
    tiers: list[Tier] | None = Field(None, description="scale-out tiers, lowest first; omitted = one flat "
                                     "non-blocking tier at the GPU's NIC rate (always a list after validation)")
    health: Health = Field(default_factory=Health)
    fabric: Literal["infiniband", "roce", "efa", "tcpxo"] | None = Field(
        None, description="scale-out network kind: infiniband, roce (RDMA over Converged Ethernet), efa (AWS "
        "Elastic Fabric Adapter, SRD) or tcpxo (GCP GPUDirect-TCPXO); omitted = infiniband. Sets the collective "
        "latencies (topologies/data/fabrics.yaml), the MoE dispatchers the search offers and the Slurm NCCL settings")
    network: NodeNetwork | None = Field(
        None, description="the hosts' scale-out devices as Kubernetes pods claim them (EFA, GKE GPU NICs); "
        "omitted = the k8s manifests request GPUs only")
    calibration: Calibration | None = Field(
        None, description="link figures fitted to nccl-tests / DeepEP runs (topoplan topology calibrate); "
        "topologies.collectives.Fabric uses them in place of the catalog figures")
    host_memory_gb: float | None = Field(
        None, gt=0, description="host (CPU) memory of one node, GB, where it differs from the GPU catalog's figure "
        "(DGX: 2,000; NVL72 tray: 960): the limit of Megatron's optimizer CPU offload; omitted = the catalog's")
    host_launch_us: float | None = Field(
        None, gt=0, le=1000, description="host time per launched kernel on these hosts, microseconds: the CPU's cost of "
        "pushing one kernel (PyTorch, Transformer Engine and Megatron per op), as NVIDIA's CPU-overhead "
        "microbenchmark measures it per platform (dgxc-benchmarking microbenchmarks/cpu_overhead: kernel launch "
        "latency). It prices the host floor of eager layers (planner/cost/terms/host.py); omitted = the stack "
        "profile's host.launch_us for the GPU generation")

    _gpus: list[GPU] = PrivateAttr(default_factory=list)
    _domain_sizes: list[int] = PrivateAttr(default_factory=list)
    _phys: list[int] = PrivateAttr(default_factory=list)          # physical GPU position per healthy GPU
    _node_domain: dict[str, int | None] = PrivateAttr(default_factory=dict)
    _node_healthy: dict[str, int] = PrivateAttr(default_factory=dict)
    _units: list[list[int]] = PrivateAttr(default_factory=list)   # per tier, unit id per healthy GPU
    _dom_names: list[str] = PrivateAttr(default_factory=list)      # names of the non-empty domains
    _every: list[tuple] = PrivateAttr(default_factory=list)         # every physical GPU, canonical order
    _all_units: list[list[int]] = PrivateAttr(default_factory=list)  # per tier, unit id per physical GPU
    _fabric: Any = PrivateAttr(None)                                 # topologies.collectives cache

    @field_validator("gpu")
    @classmethod
    def _gpu_known(cls, v: str) -> str:
        try:
            return get_gpu(v).name
        except InputError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("nodes", mode="before")
    @classmethod
    def _expand_nodes(cls, v):
        if v is None:
            return v
        if not isinstance(v, (list, tuple)):
            raise ValueError("expected a list of {name, gpus} entries")
        out = []
        for k, item in enumerate(v):
            if isinstance(item, str):
                item = {"name": item}
            if not isinstance(item, dict):
                raise ValueError(f"nodes[{k}]: expected {{name, gpus}}, got {item!r}")
            if "name" not in item:
                raise ValueError(f"nodes[{k}]: missing 'name'")
            for name in _names(item["name"], f"nodes[{k}].name"):
                bad = host_name_problem(name)
                if bad:
                    raise ValueError(f"nodes[{k}].name: host {name!r} {bad}; Slurm and DNS need RFC 1123 names "
                                     "(letters, digits, hyphens; dots between labels)")
                out.append({**item, "name": name})
        return out

    @model_validator(mode="before")
    @classmethod
    def _fill_gpus(cls, data):
        # nodes without 'gpus' take the GPU type's per-host count
        if isinstance(data, dict) and isinstance(data.get("nodes"), list):
            try:
                per = get_gpu(data.get("gpu", "")).gpus_per_node
            except InputError:
                per = None
            if per is not None:
                nodes = []
                for item in data["nodes"]:
                    if isinstance(item, str):
                        item = {"name": item}
                    if isinstance(item, dict) and item.get("gpus") is None:
                        item = {**item, "gpus": per}
                    nodes.append(item)
                data = {**data, "nodes": nodes}
        return data

    @model_validator(mode="after")
    def _check(self) -> "Cluster":
        """Validate the cluster (nodes, domains, health, tiers, calibration) and build the canonical
        GPU order with its caches; each step raises ValueError naming the field."""
        by_name = self._nodes_by_name()
        dom_nodes, dom_names = self._check_domains(by_name)
        failed_nodes, failed_gpus = self._check_health(by_name)
        self._check_tiers(by_name)
        self._index_gpus(by_name, dom_nodes, dom_names, failed_nodes, failed_gpus)
        return self

    def _nodes_by_name(self) -> dict[str, Node]:
        if not self.nodes:
            raise ValueError("nodes: the cluster has no nodes; list at least one {name, gpus}")
        by_name: dict[str, Node] = {}
        for k, n in enumerate(self.nodes):
            if n.name in by_name:
                raise ValueError(f"nodes[{k}]: node {n.name!r} is named twice; give each host once")
            by_name[n.name] = n
        return by_name

    def _check_domains(self, by_name: dict[str, Node]) -> tuple[list[list[str]], list[str]]:
        """(node names per domain in node order, domain names); one domain per node when none are given."""
        spec = self.gpu_spec
        if self.domains is None:
            for k, n in enumerate(self.nodes):
                if n.gpus > spec.nvlink_domain_max:
                    raise ValueError(
                        f"nodes[{k}].gpus: {n.gpus} GPUs on {n.name!r} exceed the {spec.name} NVLink domain "
                        f"of {spec.nvlink_domain_max}"
                    )
            # the contract: ``domains`` and ``tiers`` are always lists after validation
            self.domains = [Domain(name=n.name, nodes=[n.name]) for n in self.nodes]
            return [[n.name] for n in self.nodes], [n.name for n in self.nodes]
        if not self.domains:
            raise ValueError("domains: empty list; omit 'domains' for one domain per node")
        order = {n.name: k for k, n in enumerate(self.nodes)}
        seen: dict[str, str] = {}
        names_seen: set[str] = set()
        dom_nodes, dom_names = [], []
        for k, d in enumerate(self.domains):
            if d.name in names_seen:
                raise ValueError(f"domains[{k}].name: domain {d.name!r} is named twice")
            names_seen.add(d.name)
            if not d.nodes:
                raise ValueError(f"domains[{k}].nodes: domain {d.name!r} has no nodes")
            for nm in d.nodes:
                if nm not in by_name:
                    raise ValueError(f"domains[{k}].nodes: {nm!r} is not in 'nodes'; add it there or drop it here")
                if nm in seen:
                    raise ValueError(
                        f"domains[{k}].nodes: node {nm!r} is in two domains ({seen[nm]!r} and {d.name!r}); "
                        "a host belongs to one NVLink domain"
                    )
                seen[nm] = d.name
            phys = sum(by_name[nm].gpus for nm in d.nodes)
            if phys > spec.nvlink_domain_max:
                raise ValueError(
                    f"domains[{k}]: domain {d.name!r} has {phys} GPUs but a {spec.name} NVLink domain holds at "
                    f"most {spec.nvlink_domain_max}; split it"
                )
            dom_nodes.append(sorted(d.nodes, key=order.__getitem__))
            dom_names.append(d.name)
        missing = [n.name for n in self.nodes if n.name not in seen]
        if missing:
            raise ValueError(
                f"domains: node {missing[0]!r} is in no domain; add it to one (or omit 'domains' "
                "for one domain per node)"
            )
        return dom_nodes, dom_names

    def _check_health(self, by_name: dict[str, Node]) -> tuple[set[str], set[tuple[str, int]]]:
        """(failed nodes, failed (node, local index) GPUs) from ``health``."""
        failed_nodes: dict[str, str] = {}
        for field in ("failed_nodes", "failed_trays", "spare_trays"):
            for nm in getattr(self.health, field):
                if nm not in by_name:
                    raise ValueError(f"health.{field}: {nm!r} is not a node of this cluster")
                if field == "spare_trays" and failed_nodes.get(nm, field) != field:
                    raise ValueError(f"health.spare_trays: {nm!r} is also under health.{failed_nodes[nm]}; a "
                                     "tray is either broken or a healthy spare: drop it from one of the two")
                failed_nodes.setdefault(nm, field)
        failed_gpus: set[tuple[str, int]] = set()
        for item in self.health.failed_gpus:
            host, sep, idx = str(item).rpartition(":")
            if not sep or not idx.isdigit():
                raise ValueError(f"health.failed_gpus: {item!r} is not 'host:local-index' (e.g. 'node01:3')")
            if host not in by_name:
                raise ValueError(f"health.failed_gpus: {host!r} is not a node of this cluster")
            if int(idx) >= by_name[host].gpus:
                raise ValueError(
                    f"health.failed_gpus: {item!r}: {host!r} has GPUs 0..{by_name[host].gpus - 1}"
                )
            failed_gpus.add((host, int(idx)))
        return set(failed_nodes), failed_gpus

    def _check_tiers(self, by_name: dict[str, Node]) -> None:
        """Tiers (the GPU's default fabric when none are given) and the calibration's tier names."""
        if self.tiers is None:
            self.tiers = default_tiers(self.gpu_spec)
        if not self.tiers:
            raise ValueError("tiers: empty list; omit 'tiers' for a flat non-blocking fabric")
        prev = 0
        tier_names: set[str] = set()
        for k, t in enumerate(self.tiers):
            if t.name in tier_names:
                raise ValueError(f"tiers[{k}].name: tier {t.name!r} is named twice")
            tier_names.add(t.name)
            if t.unit_gpus is not None:
                if t.unit_gpus < prev:
                    raise ValueError(f"tiers[{k}].unit_gpus: {t.unit_gpus} is smaller than the tier below ({prev})")
                prev = t.unit_gpus
            for g in t.groups or []:
                for nm in g:
                    if nm not in by_name:
                        raise ValueError(f"tiers[{k}].groups: {nm!r} is not a node of this cluster")
        if self.calibration is not None:
            for k, fit in enumerate(self.calibration.tiers):
                if fit.tier not in tier_names:
                    raise ValueError(f"calibration.tiers[{k}].tier: {fit.tier!r} is not a tier of this cluster "
                                     f"({', '.join(sorted(tier_names))})")

    def _index_gpus(self, by_name, dom_nodes, dom_names, failed_nodes, failed_gpus) -> None:
        """The canonical order (domain by domain, node by node) of the healthy GPUs and its caches."""
        gpus: list[GPU] = []
        sizes: list[int] = []
        phys_of: list[int] = []
        node_dom: dict[str, int | None] = {}
        node_ok: dict[str, int] = {}
        every: list[tuple[str, int, int, str]] = []   # (node, local, healthy index or -1, domain name)
        pos = 0
        for members, dname in zip(dom_nodes, dom_names):
            count = 0
            dom_idx = len(sizes)
            for nm in members:
                ok = 0
                for local in range(by_name[nm].gpus):
                    if nm not in failed_nodes and (nm, local) not in failed_gpus:
                        every.append((nm, local, len(gpus), dname))
                        gpus.append(GPU(len(gpus), nm, local, dom_idx))
                        phys_of.append(pos)
                        ok += 1
                    else:
                        every.append((nm, local, -1, dname))
                    pos += 1
                node_ok[nm] = ok
                count += ok
            for nm in members:
                node_dom[nm] = dom_idx if count else None
            if count:
                sizes.append(count)
        if not gpus:
            raise ValueError("health: every GPU is marked failed; the cluster has no GPU to plan on")
        all_units = self._tier_units(every)
        self._every, self._all_units = every, all_units
        self._gpus, self._domain_sizes, self._phys = gpus, sizes, phys_of
        self._node_domain, self._node_healthy = node_dom, node_ok
        self._units = [[row[p] for p in phys_of] for row in all_units]
        self._dom_names = [
            nm for nm, members in zip(dom_names, dom_nodes) if any(node_ok[m] for m in members)
        ]

    def _tier_units(self, every: list[tuple[str, int, int, str]]) -> list[list[int]]:
        """Per tier, the unit of every physical GPU: its group (hosts outside every group a unit of
        their own), or its block of ``unit_gpus``, or one unit."""
        all_units: list[list[int]] = []
        for t in self.tiers:
            if t.groups:
                gid: dict[str, int] = {}
                for k, g in enumerate(t.groups):
                    for nm in g:
                        gid.setdefault(nm, k)
                nxt = len(t.groups)
                for nm, _, _, _ in every:
                    if nm not in gid:
                        gid[nm] = nxt
                        nxt += 1
                all_units.append([gid[nm] for nm, _, _, _ in every])
            elif t.unit_gpus:
                all_units.append([p // t.unit_gpus for p in range(len(every))])
            else:
                all_units.append([0] * len(every))
        return all_units

    # ---- derived views -------------------------------------------------------------------
    @property
    def gpu_spec(self) -> GPUSpec:
        """The catalog's GPU, with this cluster's ``host_memory_gb`` where the file sets it."""
        if self.host_memory_gb is None:
            return get_gpu(self.gpu)
        return _with_host_memory(self.gpu, self.host_memory_gb)

    @property
    def num_gpus(self) -> int:
        """Healthy GPUs."""
        return len(self._gpus)

    @property
    def fabric_tiers(self) -> list[Tier]:
        """The tiers in effect (``tiers``, filled with the flat default when the file has none)."""
        return self.tiers

    def gpus(self) -> list[GPU]:
        """Healthy GPUs in canonical order (domain by domain, node by node, local index ascending)."""
        return list(self._gpus)

    def domain_sizes(self) -> list[int]:
        """Healthy GPUs per NVLink domain, in order; domains without a healthy GPU are dropped."""
        return list(self._domain_sizes)

    def node_domain(self, name: str) -> int | None:
        """Index (into domain_sizes) of a host's NVLink domain; None if its domain has no healthy GPU."""
        return self._node_domain[name]

    def node_healthy_gpus(self, name: str) -> int:
        return self._node_healthy[name]

    def tier_units(self, tier: int) -> list[int]:
        """Unit id of each healthy GPU (canonical order) at a scale-out tier."""
        return self._units[tier]

    def physical_gpus(self) -> list[tuple[str, int, int, str]]:
        """Every GPU, failed ones included, in canonical order: (host, local, healthy index or -1,
        domain name). Position in this list = physical position (fabric ports)."""
        return list(self._every)

    def physical_unit(self, tier: int, position: int) -> int:
        return self._all_units[tier][position]

    def physical_positions(self) -> list[int]:
        return list(self._phys)

    def domain_names(self) -> list[str]:
        """Names of the domains in domain_sizes() order."""
        return list(self._dom_names)

    def hosts(self) -> list[str]:
        return [n.name for n in self.nodes]

    # ---- export --------------------------------------------------------------------------
    def to_dict(self, compact: bool = True) -> dict:
        """The YAML document; with ``compact`` runs of hosts become hostlist expressions."""
        data = self.model_dump(exclude_none=True)
        if not compact:
            return data
        nodes: list[dict] = []
        run: list[str] = []
        run_gpus = None
        for n in self.nodes:
            if run and n.gpus != run_gpus:
                nodes.append({"name": compress(run), "gpus": run_gpus})
                run = []
            run.append(n.name)
            run_gpus = n.gpus
        if run:
            nodes.append({"name": compress(run), "gpus": run_gpus})
        data["nodes"] = nodes
        if all(len(d.nodes) == 1 and d.name == d.nodes[0] for d in self.domains):
            data.pop("domains", None)      # one domain per host (HGX): the default, left implicit
        else:
            data["domains"] = [{"name": d.name, "nodes": compress(d.nodes)} for d in self.domains]
        if self.tiers is not None:
            tiers = []
            for t in self.tiers:
                td = t.model_dump(exclude_none=True)
                if t.groups:
                    td["groups"] = [compress(g) for g in t.groups]
                tiers.append(td)
            data["tiers"] = tiers
        h = {}
        if self.health.failed_nodes:
            h["failed_nodes"] = compress(self.health.failed_nodes)
        if self.health.failed_trays:
            h["failed_trays"] = compress(self.health.failed_trays)
        if self.health.spare_trays:
            h["spare_trays"] = compress(self.health.spare_trays)
        if self.health.failed_gpus:
            h["failed_gpus"] = list(self.health.failed_gpus)
        data["health"] = h
        if not h:
            data.pop("health")
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=120)


def validation_line(exc: ValidationError, source: str | None) -> str:
    """One line naming the field at fault, from a pydantic ValidationError."""
    errors = exc.errors()
    prefix = f"{source}: " if source else ""
    if not errors:
        return f"{prefix}{exc}"
    first = errors[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    msg = str(first.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if first.get("type") == "missing":
        msg = "required field is missing"
    elif first.get("type") == "extra_forbidden":
        msg = "unknown field; check its spelling against docs/cluster.md"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    field = f"field '{loc}': " if loc else ""
    return f"{prefix}{field}{msg}{more}"


def cluster_from_dict(data: Any, source: str | None = None) -> Cluster:
    """Validate a cluster document; InputError with one line naming the file and field."""
    if not isinstance(data, dict):
        raise InputError(f"{source or 'cluster'}: expected a mapping with gpu, nodes, domains, tiers; "
                         f"got {type(data).__name__}")
    try:
        return Cluster.model_validate(data)
    except ValidationError as exc:
        raise InputError(validation_line(exc, source)) from None


@lru_cache(maxsize=64)
def _with_host_memory(gpu: str, host_memory_gb: float) -> GPUSpec:
    spec = get_gpu(gpu)
    return spec.model_copy(update={"host_memory_gb": host_memory_gb,
                                   "sources": {**spec.sources, "host_memory_gb": "the cluster file's host_memory_gb"}})
