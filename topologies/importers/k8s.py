"""Kubernetes node list (``kubectl get nodes -o json`` or YAML) -> Cluster.

NVLink domain key: the ``nvidia.com/gpu.clique`` label (``<fabric cluster UUID>.<clique id>``, set by
GPU Feature Discovery / the DRA driver); hosts with the same value share one NVLink domain, hosts
without it are a domain of their own (hardware.md s4.5). ``domain_label`` picks another key (e.g.
CoreWeave's ``ds.coreweave.com/nvlink.domain``).

GPUs per host: ``status.capacity["nvidia.com/gpu"]`` (or ``allocatable``), else the
``nvidia.com/gpu.count`` label, else ``--gpus-per-node``. GPU type: ``--gpu`` or the
``nvidia.com/gpu.product`` label (``NVIDIA-H100-80GB-HBM3``, ``NVIDIA-GB200`` ...).
AWS ``topology.k8s.aws/network-node-layer-1..N`` labels (layer N nearest the host) become scale-out
tiers with explicit units. Hosts that advertise ``vpc.amazonaws.com/efa`` (the EFA device plugin's extended
resource, EKS user guide device-management-efa) make the cluster's fabric ``efa`` and its ``network`` the
EFA devices of a host (the fewest any GPU host advertises), which ``--emit k8s`` pods then claim; hosts that
advertise ``rdma/ib`` (the NVIDIA Network Operator's SR-IOV device plugin as Azure/aks-rdma-infiniband configures
it, configs/nicclusterpolicy/sriov-device-plugin/sriov.yaml: one per InfiniBand NIC) make it ``infiniband`` with
``network`` ``aks-ib`` the same way. ``rdma/shared_ib`` (the RDMA shared device plugin) counts pod slots, not
NICs: hosts that advertise it and no ``rdma/ib`` get no ``aks-ib`` network (its pods would ask for ``rdma/ib``,
which no host has), said in the assumptions. A cloud
instance type in ``node.kubernetes.io/instance-type`` (one for all GPU hosts: p5.48xlarge, a3-megagpu-8g,
a4x-highgpu-4g, ... ``topologies.presets.INSTANCE_TYPES``) gives the fabric and network of its preset.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from topologies.cluster import Cluster
from topologies.errors import InputError
from topologies.gpus import get_gpu
from topologies.importers.common import Imported, build_cluster
from topologies.presets import preset_of_instance

__all__ = ["CLIQUE_LABEL", "import_k8s", "nodes_from_document"]

CLIQUE_LABEL = "nvidia.com/gpu.clique"
AWS_LAYER = re.compile(r"^topology\.k8s\.aws/network-node-layer-(\d+)$")
EFA_RESOURCE = "vpc.amazonaws.com/efa"
IB_RESOURCE = "rdma/ib"
SHARED_IB_RESOURCE = "rdma/shared_ib"   # Azure/aks-rdma-infiniband rdma-shared-device-plugin/rdma.yaml (rdmaHcaMax 63)
# extended resource -> (fabric, network kind) of hosts that advertise it (module docstring)
NIC_RESOURCES = {EFA_RESOURCE: ("efa", "eks-efa"), IB_RESOURCE: ("infiniband", "aks-ib")}
INSTANCE_LABEL = "node.kubernetes.io/instance-type"


def nodes_from_document(doc, source: str) -> list[dict]:
    """The node objects of a ``kind: List`` / ``NodeList`` document or a plain list."""
    if isinstance(doc, dict):
        if "items" in doc:
            doc = doc["items"]
        elif doc.get("kind") == "Node":
            doc = [doc]
        else:
            raise InputError(f"{source}: expected a NodeList ({{items: [...]}}) or a list of nodes")
    if not isinstance(doc, list):
        raise InputError(f"{source}: expected a list of nodes")
    for k, n in enumerate(doc):
        if not isinstance(n, dict) or not isinstance(n.get("metadata"), dict) or not n["metadata"].get("name"):
            raise InputError(f"{source}: items[{k}]: a node needs metadata.name")
    return doc


def _product_gpu(product: str) -> str | None:
    p = product.lower()
    for key in ("gb300", "gb200", "b300", "b200", "h800", "h200", "h100"):
        if key in p:
            return key
    return None


def _resource(status: dict, name: str):
    """A node's capacity (or allocatable) of resource ``name``, or None."""
    for part in ("capacity", "allocatable"):
        val = (status.get(part) or {}).get(name)
        if val is not None:
            return val
    return None


def _instance_network(types: set[str], source: str, assumed: list[str]) -> dict:
    """The fabric and network of the GPU hosts' one cloud instance type (``node.kubernetes.io/instance-type``,
    ``topologies.presets.INSTANCE_TYPES``), or {} when the hosts name none, several, or an unknown one."""
    if len(types) != 1:
        return {}
    (kind,) = types
    p = preset_of_instance(kind)
    if p is None:
        return {}
    assumed.append(f"fabric {p.fabric or 'infiniband'} of the {p.name} preset from the hosts' instance type {kind}")
    out = {"fabric": p.fabric} if p.fabric else {}
    if p.network is not None:
        out["network"] = p.network.model_dump()
    return out


def _cluster_network(types: set[str], nics: dict[str, list[int]], hosts: int, source: str, assumed: list[str]) -> dict:
    """The fabric and network fields from the hosts' instance type and advertised NIC resources (module docstring)."""
    shared = nics.pop(SHARED_IB_RESOURCE)
    net = _merge_networks(_instance_network(types, source, assumed), _nic_network(nics, hosts, source, assumed))
    if shared and not nics[IB_RESOURCE] and (net.get("network") or {}).get("kubernetes") == "aks-ib":
        net.pop("network")
        assumed.append(f"the hosts advertise {SHARED_IB_RESOURCE} (RDMA shared device plugin), not {IB_RESOURCE}: the "
                       f"k8s pods claim no RDMA device; add {SHARED_IB_RESOURCE}: 1 and IPC_LOCK to the pod template")
    return net


def _merge_networks(instance: dict, advertised: dict) -> dict:
    """The instance type's preset fields, then what the hosts advertise over them (the device count); the preset's
    NCCL topology file stays when both name the same kind of network."""
    out = instance | advertised
    a, b = instance.get("network"), advertised.get("network")
    if a and b and a["kubernetes"] == b["kubernetes"] and not a.get("hcas"):
        out["network"] = a | {"nics_per_node": b["nics_per_node"], "source": f"{b['source']}; {a['source']}"}
    return out


def _nic_network(counts: dict[str, list[int]], hosts: int, source: str, assumed: list[str]) -> dict:
    """The cluster fields for hosts advertising a NIC resource (:data:`NIC_RESOURCES`): its fabric and the devices
    a pod claims (the fewest any host has)."""
    for res, nics in counts.items():
        if not nics:
            continue
        fab, kind = NIC_RESOURCES[res]
        if len(nics) < hosts:
            assumed.append(f"{hosts - len(nics)} of {hosts} GPU hosts advertise no {res}: the fabric is taken as "
                           f"{fab} for all")
        n = min(nics)
        return {"fabric": fab, "network": {"nics_per_node": n, "kubernetes": kind,
                                           "source": f"{source}: {res} {n} per host (node status)"}}
    return {}


def import_k8s(path, gpu: str | None, gpus_per_node: int | None = None, domain_label: str = CLIQUE_LABEL,
               name: str | None = None, failed: str | None = None) -> Imported:
    """A node list -> ``Imported(cluster, assumed)``; ``failed``: a hostlist marked failed."""
    source = str(path)
    assumed: list[str] = []
    from_flag: list[str] = []
    skipped: list[str] = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            raise InputError(f"{source}{where}: neither JSON nor YAML ({getattr(exc, 'problem', None) or exc})") from None
    items = nodes_from_document(doc, source)
    products = set()
    nodes: list[tuple[str, int]] = []
    dom_of: dict[str, list[str]] = {}
    dom_order: list[str] = []
    layers: dict[int, dict[str, list[str]]] = {}
    nics: dict[str, list[int]] = {res: [] for res in NIC_RESOURCES | {SHARED_IB_RESOURCE: None}}
    types: set[str] = set()
    for k, n in enumerate(items):
        meta = n["metadata"]
        host = str(meta["name"])
        labels = meta.get("labels") or {}
        status = n.get("status") or {}
        count = _resource(status, "nvidia.com/gpu")
        if count is None:
            count = labels.get("nvidia.com/gpu.count")
        if count is None and gpus_per_node:
            count = gpus_per_node
            from_flag.append(host)
        try:
            count = int(count) if count is not None else None
        except (TypeError, ValueError):
            raise InputError(f"{source}: items[{k}] ({host}): GPU count {count!r} is not an integer") from None
        if not count:
            skipped.append(host)
            continue  # a CPU-only node: not part of the GPU cluster
        if labels.get("nvidia.com/gpu.product"):
            products.add(str(labels["nvidia.com/gpu.product"]))
        nodes.append((host, count))
        if labels.get(INSTANCE_LABEL):
            types.add(str(labels[INSTANCE_LABEL]))
        for res, got in nics.items():
            nic = _resource(status, res)
            if nic is not None and str(nic).isdigit() and int(nic) > 0:
                got.append(int(nic))
        key = labels.get(domain_label)
        key = str(key) if key not in (None, "") else f"host:{host}"
        if key not in dom_of:
            dom_of[key] = []
            dom_order.append(key)
        dom_of[key].append(host)
        for lab, val in labels.items():
            m = AWS_LAYER.match(str(lab))
            if m:
                layers.setdefault(int(m.group(1)), {}).setdefault(str(val), []).append(host)
    if not nodes:
        raise InputError(f"{source}: no node with GPUs (nvidia.com/gpu capacity); pass --gpus-per-node if the "
                         "list lacks capacities")
    if gpu:
        spec = get_gpu(gpu)
    else:
        guesses = {_product_gpu(p) for p in products}
        if len(guesses) != 1 or None in guesses:
            raise InputError(f"{source}: cannot tell the GPU type from nvidia.com/gpu.product "
                             f"({', '.join(sorted(products)) or 'absent'}); pass --gpu")
        spec = get_gpu(guesses.pop())
        assumed.append(f"GPU type {spec.name} (catalog figures) from nvidia.com/gpu.product "
                       f"{', '.join(sorted(products))}: pass --gpu if that is another variant")
    if from_flag:
        assumed.append(f"{gpus_per_node} GPUs on {len(from_flag)} hosts without a GPU count ({from_flag[0]}, ...): "
                       "from --gpus-per-node")
    if skipped:
        assumed.append(f"{len(skipped)} nodes without nvidia.com/gpu capacity ({', '.join(skipped[:3])}"
                       f"{', ...' if len(skipped) > 3 else ''}) are not part of the GPU cluster")
    domains = []
    lone = 0
    for key in dom_order:
        label = key[5:] if key.startswith("host:") else key
        lone += key.startswith("host:")
        domains.append((label, dom_of[key]))
    if lone:
        assumed.append(f"{lone} hosts without the {domain_label} label are each their own NVLink domain")
    # AWS layers: the highest layer number is nearest the host -> tier 0
    levels = [list(layers[L].values()) for L in sorted(layers, reverse=True)]
    c = build_cluster(name=name or Path(path).stem, spec=spec, nodes=nodes, domains=domains,
                      levels=levels, failed=failed, assumed=assumed, source=source)
    net = _cluster_network(types, nics, len(nodes), source, assumed)
    if net:
        c = Cluster.model_validate(c.to_dict() | net)
    return Imported(c, assumed)
