"""Cluster-side Kueue objects (``--emit k8s-cluster``): what an administrator applies once so that
the pods of ``--emit k8s`` can be admitted with topology-aware scheduling.

``k8s-cluster/kueue.yaml`` holds, for the plan's cluster (e.g. one read by ``topoplan topology import
k8s nodes.json``):

* a Topology (kueue.x-k8s.io/v1beta2) with the levels the job's annotations name: the spine/block
  level (``network.topology.nvidia.com/spine``, NVIDIA topograph's label), the NVLink domain
  (``nvidia.com/gpu.clique``; left out on HGX, where the host is the domain) and the host
  (``kubernetes.io/hostname``: the lowest level, so Kueue assigns pods to nodes);
* a ResourceFlavor naming that Topology (``spec.topologyName``) for the GPU nodes
  (``nvidia.com/gpu.present: "true"``, set by GPU Feature Discovery);
* a ClusterQueue with a ``nvidia.com/gpu`` quota of the cluster's healthy GPUs (and of the scale-out devices,
  hugepages and memory each pod asks on a cloud network, one pod per host: :func:`network_quota`), and a
  LocalQueue in the user's namespace (``FILL_ME_namespace``: kubectl apply refuses it until it is replaced).

On NVL72 the pods also claim an IMEX channel through DRA. Kueue (0.18+, ``KueueDRAIntegration`` on by
default) charges a claimed DeviceClass against the quota of the logical resource its Configuration maps
it to, and refuses a workload whose DeviceClass is not mapped (pkg/dra/claims.go: "DeviceClass ... is not
mapped in DRA configuration"). So ``k8s-cluster/kueue-config.yaml`` holds the
``resources.deviceClassMappings`` entry for the DRA driver's channel class
(``compute-domain-default-channel.nvidia.com``, NVIDIA k8s-dra-driver-gpu v25.12.0,
deployments/helm/nvidia-dra-driver-gpu/templates/deviceclass-compute-domain-default-channel.yaml) to merge
into Kueue's Configuration, and the ClusterQueue covers that resource too (one channel per pod, so one
per host). TAS places pods by their containers' requests (``nvidia.com/gpu``), not by the DRA resource.

The names tie together: the JobSet's ``kueue.x-k8s.io/queue-name`` is the LocalQueue's name.
"""

from __future__ import annotations

import re

from planner.cost.shape import multi_host_cluster
from planner.output.emit import EmitContext
from planner.output.emit.k8s import (BLOCK_LABEL, CLIQUE_LABEL, HOST_LABEL, NAMESPACE, render)
from planner.output.emit.k8s_network import pod_network

KUEUE_API = "kueue.x-k8s.io/v1beta2"
KUEUE_CONFIG_API = "config.kueue.x-k8s.io/v1beta2"
GPU_NODE_LABEL = {"nvidia.com/gpu.present": "true"}
IMEX_RESOURCE = "nvidia.com/imex-channel"                   # the logical name Kueue charges channels to
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"  # the DRA driver's DeviceClass of a channel


def cluster_name(ctx: EmitContext) -> str:
    """The cluster file's name as a DNS label (``topoplan-<cluster>``)."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(ctx.cluster.name).lower()).strip("-") or "cluster"
    return ("topoplan-" + slug)[:50].rstrip("-")


def levels(ctx: EmitContext) -> list[str]:
    """Node labels of the Topology's levels, highest first."""
    if multi_host_cluster(ctx.cluster):
        return [BLOCK_LABEL, CLIQUE_LABEL, HOST_LABEL]
    return [BLOCK_LABEL, HOST_LABEL]


def _times(value, n: int):
    """A Kubernetes quantity (an integer, or digits with a binary suffix: ``5120Mi``) times n."""
    if isinstance(value, int):
        return value * n
    m = re.fullmatch(r"(\d+)([KMGT]i)?", str(value))
    if m is None:
        raise ValueError(f"quantity {value!r}: not an integer with an optional binary suffix")
    return f"{int(m.group(1)) * n}{m.group(2) or ''}"


def network_quota(ctx: EmitContext, hosts: int) -> dict:
    """The quota of what every pod asks beside its GPUs (``k8s_network``: EFA devices, hugepages and memory on
    EKS, ``rdma/ib`` on AKS), for one pod per healthy host: Kueue admits no workload that requests a resource its
    ClusterQueue does not cover ("resource ... unavailable in ClusterQueue", kubernetes-sigs/kueue
    pkg/scheduler/flavorassigner/flavorassigner.go ``findFlavorForPodSetResource``)."""
    gpus = max(1, ctx.cluster.num_gpus // max(1, hosts))
    net = pod_network(ctx.cluster, gpus)
    if net is None:
        return {}
    return {k: _times(v, hosts) for k, v in (net.limits | net.requests).items()}


def objects(ctx: EmitContext) -> list[dict]:
    name = cluster_name(ctx)
    topo = {"apiVersion": KUEUE_API, "kind": "Topology", "metadata": {"name": name},
            "spec": {"levels": [{"nodeLabel": lab} for lab in levels(ctx)]}}
    flavor = {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": f"{name}-gpu"},
              "spec": {"nodeLabels": dict(GPU_NODE_LABEL), "topologyName": name}}
    hosts = len({g.node for g in ctx.cluster.gpus()})
    quota = {"nvidia.com/gpu": ctx.cluster.num_gpus} | network_quota(ctx, hosts)
    if multi_host_cluster(ctx.cluster):
        quota[IMEX_RESOURCE] = hosts
    cq = {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": name},
          "spec": {"namespaceSelector": {},
                   "resourceGroups": [{"coveredResources": list(quota),
                                       "flavors": [{"name": f"{name}-gpu", "resources": [
                                           {"name": k, "nominalQuota": v} for k, v in quota.items()]}]}]}}
    lq = {"apiVersion": KUEUE_API, "kind": "LocalQueue", "metadata": {"name": name, "namespace": NAMESPACE},
          "spec": {"clusterQueue": name}}
    return [topo, flavor, cq, lq]


def files(ctx: EmitContext) -> dict[str, str]:
    name = cluster_name(ctx)
    head = [f"Kueue objects for cluster {ctx.cluster.name}: {ctx.cluster.num_gpus} {ctx.gpu} GPUs "
            f"(written by topoplan; see docs/k8s.md).",
            "Apply once per cluster, as an administrator. Node labels the levels need: "
            + ", ".join(levels(ctx)) + ".",
            f"{NAMESPACE}: the namespace jobs run in (kubectl apply refuses the placeholder). The job's",
            f"kueue.x-k8s.io/queue-name is the LocalQueue {name}."]
    out = {"k8s-cluster/kueue.yaml": render(head, objects(ctx))}
    if multi_host_cluster(ctx.cluster):
        out["k8s-cluster/kueue-config.yaml"] = render(
            ["Merge into Kueue's Configuration (ConfigMap kueue-manager-config in kueue-system, key",
             "controller_manager_config.yaml; or the Helm chart's managerConfig), then restart kueue-controller-manager.",
             f"It maps the DRA driver's IMEX channel DeviceClass to the quota resource {IMEX_RESOURCE} that the",
             "ClusterQueue in kueue.yaml covers; without it Kueue refuses the jobs' ComputeDomain claims."],
            [{"apiVersion": KUEUE_CONFIG_API, "kind": "Configuration",
              "resources": {"deviceClassMappings": [{"name": IMEX_RESOURCE, "deviceClassNames": [CHANNEL_CLASS]}]}}])
    return out
