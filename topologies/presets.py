"""Built-in clusters: NVIDIA's DGX SuperPOD reference architectures (hardware.md s5) and the cloud
instances users train on (``CLOUD_PRESETS``: AWS, GCP, Azure, OCI; docs/cloud.md), each with its fabric
kind (InfiniBand, RoCE, EFA, TCPXO: topologies/fabrics.py).

| preset        | GPU   | host names              | NVLink domain        | scale-out per GPU | SU (non-blocking) |
|---------------|-------|-------------------------|----------------------|-------------------|-------------------|
| dgx-h100      | h100  | h100-n0001 ..           | 8 (one node)         | 400 Gb/s NDR      | 256 GPUs (32 nodes) |
| dgx-h200      | h200  | h200-n0001 ..           | 8                    | 400 Gb/s          | 256 GPUs          |
| h800          | h800  | h800-n0001 ..           | 8, NVLink ~160 GB/s  | 400 Gb/s CX7      | 256 GPUs; two-layer multi-plane fat tree above |
| dgx-b200      | b200  | b200-n0001 ..           | 8                    | 400 Gb/s          | 256 GPUs; core beyond 8 SU |
| dgx-b300      | b300  | b300-n0001 ..           | 8                    | 800 Gb/s XDR      | 576 GPUs (72 nodes) |
| gb200-nvl72   | gb200 | gb200-r01-t01 ..        | 72 (rack, 18 trays)  | 400 Gb/s NDR      | 576 GPUs (8 racks) |
| gb300-nvl72   | gb300 | gb300-r01-t01 ..        | 72                   | 800 Gb/s CX8      | 576 GPUs (8 racks) |

Sizing: ``gpus`` whole nodes (HGX: multiples of 8); on NVL72 whole 4-GPU trays, filled rack by
rack with ``usable_per_domain`` GPUs per rack (default 72; e.g. 64 leaves 2 spare trays per rack,
listed under ``health.spare_trays`` so they still occupy their rack and fabric ports and a replan
can move a failed tray's ranks onto them). The last
rack may be partial. Default size: one scalable unit.

Fabric: tier 0 = the rail-optimised leaf layer, non-blocking inside a scalable unit (SU); the tier
above it carries ``oversubscription`` (default 1 = non-blocking like the SuperPOD; Meta's H100
clusters run 7:1 above their pods); a core tier above 8 SUs where the reference designs add one.
Switch latency: 0.6 us per IB switch hop (HDR; NDR/XDR publish none) -> 1 hop through a leaf,
3 through a spine, 5 through a core.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topologies.errors import InputError
from topologies.cluster import Cluster, NodeNetwork, Tier
from topologies.gpus import get_gpu

__all__ = ["PRESETS", "Preset", "build_preset", "preset_names", "is_preset_host"]

HOP_US = 0.6  # IB switch hop (HDR figure, hardware.md s2.4; none published for NDR/XDR)


# Ports per scale-out switch (primary sources: NVIDIA's product pages).
NDR_PORTS = 64    # Quantum-2 QM9700: 64 ports of NDR 400 Gb/s, nvidia.com/en-us/networking/infiniband/qm9700/
XDR_PORTS = 144   # Quantum-X800 Q3400: 144 ports of XDR 800 Gb/s,
                  # nvidia.com/en-us/networking/products/infiniband/quantum-x800/


def fat_tree_endpoints(ports: int, levels: int, planes: int = 1) -> int:
    """Endpoints (one per GPU NIC) a non-blocking fat tree of ``levels`` switch layers of ``ports``-port
    switches connects: 2 (k/2)^levels, k^2/2 for two layers and k^3/4 for three (Al-Fares, Loukissas,
    Vahdat, "A Scalable, Commodity Data Center Network Architecture", SIGCOMM 2008, s3.1), times the
    independent planes of a multi-plane fabric."""
    return planes * 2 * (ports // 2) ** levels


@dataclass(frozen=True)
class Preset:
    name: str
    gpu: str
    nvl72: bool
    su_gpus: int                 # non-blocking scalable unit
    spine_unit: int | None       # GPUs under one spine layer; None = no core tier
    description: str
    source: str
    switch_ports: int = NDR_PORTS   # ports of the fabric's switches
    planes: int = 1                 # independent fabric planes (h800: one per NIC)
    fabric: str | None = None       # Cluster.fabric (None = infiniband); topologies/fabrics.py
    nic_gbps: float | None = None   # scale-out Gb/s per GPU when the instance differs from the GPU catalog
    network: NodeNetwork | None = None   # Cluster.network: the devices a Kubernetes pod claims per host

    @property
    def max_gpus(self) -> int:
        """The most GPUs the preset's fabric connects: its tiers (leaf + spine, + core when
        ``spine_unit`` is set) as a fat tree of ``switch_ports``-port switches, one NIC per GPU."""
        return fat_tree_endpoints(self.switch_ports, 2 if self.spine_unit is None else 3, self.planes)


_SP = "hardware.md s5"   # tests/data/reference/hardware.md: DGX SuperPOD reference architectures, DeepSeek-V3 paper
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("dgx-h100", "h100", False, 256, 2048, "DGX H100 SuperPOD: 8 GPUs/node, NDR 400G, SU 32 nodes",
               f"{_SP}: DGX H100 SuperPOD SU = 32 nodes / 256 GPUs, rail-aligned, non-blocking"),
        Preset("dgx-h200", "h200", False, 256, 2048, "DGX H200 (H100 SuperPOD shape): 8 GPUs/node, 400G",
               f"{_SP}: same fabric as the DGX H100 SuperPOD"),
        Preset("h800", "h800", False, 256, None,
               "DeepSeek-style H800: 8 GPUs/node, NVLink ~160 GB/s, 8x 400G CX7, two-layer multi-plane fat tree",
               f"{_SP}: DeepSeek 2,048 H800 in a multi-plane two-layer fat tree; 8x 400G CX7 per node; "
               "8 planes of 64-port switches reach 16,384 GPUs (arXiv 2505.09343)", planes=8),
        Preset("dgx-b200", "b200", False, 256, 2048, "DGX B200 SuperPOD: 8 GPUs/node, 400G, SU 32 nodes, core > 8 SU",
               f"{_SP}: DGX B200 SuperPOD 32 nodes per SU, core layer beyond 8 SU, equal cable counts"),
        Preset("dgx-b300", "b300", False, 576, None, "DGX B300 SuperPOD: 8 GPUs/node, XDR 800G, SU 72 nodes",
               f"{_SP}: DGX B300 XDR SU = 72 nodes / 576 GPUs, 8 leaf + 4 spine per SU, non-blocking",
               switch_ports=XDR_PORTS),
        Preset("gb200-nvl72", "gb200", True, 576, 4608, "DGX GB200 NVL72 racks, NDR 400G per GPU, SU 8 racks",
               f"{_SP}: DGX GB200 SuperPOD SU = 8 NVL72 racks (576 GPUs), NDR 400G IB"),
        Preset("gb300-nvl72", "gb300", True, 576, 4608, "GB300 NVL72 racks, CX8 800G per GPU, SU 8 racks",
               f"{_SP} and s1: 72 CX8 800 Gb/s per rack; SU of 8 racks as for GB200", switch_ports=XDR_PORTS),
    )
}


# Cloud instances (docs/cloud.md). Each network figure is the cloud's own page; no cloud publishes its
# non-blocking unit or switch radix, so the tiers are those of the DGX SuperPOD of the same GPU (assumed).
_AWS_P5 = "aws.amazon.com/ec2/instance-types/p5/"
_AWS_P6 = "aws.amazon.com/ec2/instance-types/p6/"
_GCP_NET = "cloud.google.com/compute/docs/gpus/gpu-network-bandwidth"
_AZ = "learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/"
_OCI = "docs.oracle.com/iaas/Content/Compute/References/computeshapes.htm (bare metal GPU shapes)"
_TIERS = "; tiers as the DGX SuperPOD of the GPU (assumed: unpublished)"
_EC2_NICS = "docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html (network cards, one EFA each)"
_GKE = "github.com/GoogleCloudPlatform/container-engine-accelerators@992db81"


def _efa(n: int, what: str) -> NodeNetwork:
    return NodeNetwork(nics_per_node=n, kubernetes="eks-efa", source=f"{_EC2_NICS}: {what}")


def _gke(n: int, kind: str, what: str) -> NodeNetwork:
    return NodeNetwork(nics_per_node=n, kubernetes=kind, source=f"{_GKE} {what}")


_AKS_IB = "github.com/Azure/aks-rdma-infiniband@700dabb"
_OKE = "github.com/oracle-quickstart/oci-hpc-oke@61d210a"


def _aks(n: int, what: str, topo_file: str = "") -> NodeNetwork:
    """AKS: one pod per VM claims every InfiniBand NIC as ``rdma/ib`` (the SR-IOV device plugin; the repo's
    "maximum performance" recommendation, website/docs/configurations/01-network-operator.md), as many as the
    VM has GPUs (tests/scenarios/test.sh sriov_nic_policy_gpu: rdma/ib=${GPU_PER_NODE_NUMBER})."""
    return NodeNetwork(nics_per_node=n, kubernetes="aks-ib", topo_file=topo_file,
                       source=f"{_AZ}{what}; {_AKS_IB} tests/scenarios/test.sh sriov_nic_policy_gpu (rdma/ib = GPUs "
                       f"per node){'; topology file: topologies/data/nccl_topo/README.md' if topo_file else ''}")


def _oke(hcas: str, shape: str) -> NodeNetwork:
    """OKE: the host's RDMA devices through the host network; NCCL_IB_HCA is the shape's nccl-tests manifest's."""
    names = tuple(hcas.split(","))
    return NodeNetwork(nics_per_node=len(names), kubernetes="oke-rdma", hcas=names,
                       source=f"{_OKE} manifests/nccl-tests/kueue/{shape}.yaml (NCCL_IB_HCA, {len(names)} devices)")


CLOUD_PRESETS = (
    Preset("aws-p5", "h100", False, 256, 2048, "AWS p5.48xlarge: 8 H100, 3,200 Gb/s EFA v2 (SRD) per node",
           f"{_AWS_P5}: p5.48xlarge 8 H100, 3,200 Gbps EFAv2 (400 Gb/s per GPU){_TIERS}", fabric="efa",
           network=_efa(32, "p5.48xlarge 32 network cards (EKS node-efa example: vpc.amazonaws.com/efa: 32)")),
    Preset("aws-p5en", "h200", False, 256, 2048, "AWS p5en.48xlarge: 8 H200, 3,200 Gb/s EFA v3 (SRD) per node",
           f"{_AWS_P5}: p5en.48xlarge 8 H200, 3,200 Gbps EFAv3{_TIERS}", fabric="efa",
           network=_efa(16, "p5en.48xlarge 16 network cards of 200 Gb/s EFAv3 (count not re-read this round)")),
    Preset("aws-p6-b200", "b200", False, 256, 2048, "AWS p6-b200.48xlarge: 8 B200, 3,200 Gb/s EFA v4 per node",
           f"{_AWS_P6}: p6-b200.48xlarge 8 B200, 3.2 Tbps EFAv4{_TIERS}", fabric="efa",
           network=_efa(8, "p6-b200.48xlarge 8 network cards, 400 Gb/s EFA each")),
    Preset("aws-p6-b300", "b300", False, 576, None, "AWS p6-b300.48xlarge: 8 B300, 6,400 Gb/s EFA v4 per node",
           f"{_AWS_P6}: p6-b300.48xlarge 8 B300, 6.4 Tbps EFAv4 (800 Gb/s per GPU; 16 EFA devices per node in "
           f"awslabs/awsome-distributed-ai qwen3-235b RESULTS.md){_TIERS}", switch_ports=XDR_PORTS, fabric="efa",
           network=_efa(16, "p6-b300.48xlarge 17 network cards, EFA-only on cards 1-16")),
    Preset("aws-p6e-gb200", "gb200", True, 576, 4608,
           "AWS P6e-GB200 UltraServers: 72 GB200 in one NVLink domain, 28.8 Tb/s EFA v4 per UltraServer",
           f"{_AWS_P6}: u-p6e-gb200x72 UltraServer, 72 GPUs, 28.8 Tbps EFAv4 (400 Gb/s per GPU){_TIERS}",
           fabric="efa", network=_efa(4, "p6e-gb200.36xlarge (4 GPUs): 4 EFA-only interfaces of 400 Gb/s, AWS's "
                                          "recommended layout; awsome-distributed-ai nccl-tests-gb200.yaml asks "
                                          "vpc.amazonaws.com/efa: 4")),
    Preset("gcp-a3-mega", "h100", False, 256, 2048, "GCP a3-megagpu-8g: 8 H100, 8 x 200 Gb/s GPUDirect-TCPXO",
           f"{_GCP_NET}: A3 Mega, eight NICs, 1,600 Gbps for GPU traffic with GPUDirect-TCPXO{_TIERS}",
           fabric="tcpxo", nic_gbps=200.0,
           network=_gke(8, "gke-tcpxo", "gpudirect-tcpxo/nccl-test-latest.yaml: eth1-eth8 on vpc1-vpc8")),
    Preset("gcp-a3-ultra", "h200", False, 256, 2048, "GCP a3-ultragpu-8g: 8 H200, 8 CX-7 RoCE, 3,200 Gb/s",
           f"{_GCP_NET}: A3 Ultra, eight ConnectX-7 NICs (RDMA over RoCE), 3,200 Gbps, one per GPU{_TIERS}",
           fabric="roce", network=_gke(8, "gke-rdma", "gpudirect-rdma/nccl-test.yaml: eth2-eth9 on rdma-0..7")),
    Preset("gcp-a4", "b200", False, 256, 2048, "GCP a4-highgpu-8g: 8 B200, 8 CX-7 RoCE, 3,200 Gb/s",
           f"{_GCP_NET}: A4, eight ConnectX-7 NICs (RoCE), 3,200 Gbps for GPU-to-GPU traffic{_TIERS}",
           fabric="roce", network=_gke(8, "gke-rdma", "gpudirect-rdma/nccl-test-a4.yaml: eth2-eth9 on rdma-0..7")),
    Preset("gcp-a4x", "gb200", True, 576, 4608, "GCP a4x-highgpu-4g: GB200 NVL72 racks, 4 CX-7 RoCE per 4 GPUs",
           f"{_GCP_NET}: A4X, four ConnectX-7 NICs, 1,600 Gbps per 4-GPU VM (400 Gb/s per GPU), "
           f"72-GPU NVLink domain{_TIERS}", fabric="roce",
           network=_gke(4, "gke-rdma", "gpudirect-rdma/nccl-test-imex-a4x.yaml: eth2-eth5 on rdma-0..3")),
    Preset("azure-nd-h100-v5", "h100", False, 256, 2048, "Azure ND H100 v5: 8 H100, 8 x 400 Gb/s NDR InfiniBand",
           f"{_AZ}nd-h100-v5-series: 8 H100, one 400 Gb/s ConnectX-7 NDR InfiniBand per GPU{_TIERS}",
           fabric="infiniband", network=_aks(8, "nd-h100-v5-series: 8 InfiniBand NICs, one per GPU", "ndv5-topo.xml")),
    Preset("azure-nd-gb200-v6", "gb200", True, 576, 4608, "Azure ND GB200 v6: GB200 NVL72 racks, 4 x 400 Gb/s NDR per VM",
           f"{_AZ}nd-gb200-v6-series: 4 B200 per VM, 4 x 400 Gb/s Quantum-2 CX7 InfiniBand, 18 VMs per NVL72 "
           f"rack{_TIERS}", fabric="infiniband",
           network=_aks(4, "nd-gb200-v6-series: 4 InfiniBand NICs per 4-GPU VM")),
    Preset("oci-h100", "h100", False, 256, 2048, "OCI BM.GPU.H100.8: 8 H100, 16 x 200 Gb/s RoCE (3,200 Gb/s)",
           f"{_OCI}: BM.GPU.H100.8, 8 H100, 16 x 200 Gb/s RDMA (RoCE v2), 3,200 Gb/s{_TIERS}", fabric="roce",
           network=_oke("mlx5_0,mlx5_1,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_8,mlx5_9,mlx5_10,mlx5_12,mlx5_13,"
                        "mlx5_14,mlx5_15,mlx5_16,mlx5_17", "BM.GPU.H100.8")),
    Preset("oci-b200", "b200", False, 256, 2048, "OCI BM.GPU.B200.8: 8 B200, 8 x 400 Gb/s RoCE (3,200 Gb/s)",
           f"{_OCI}: BM.GPU.B200.8, 8 B200, 8 x 400 Gb/s RDMA (RoCE v2), 3,200 Gb/s{_TIERS}", fabric="roce",
           network=_oke("mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11", "BM.GPU.B200.8")),
)
PRESETS.update({p.name: p for p in CLOUD_PRESETS})

# The cloud's instance-type name (a node's ``node.kubernetes.io/instance-type`` label) of each cloud preset:
# the k8s node importer takes the fabric and the pods' network from it (topologies/importers/k8s.py).
INSTANCE_TYPES = {
    "p5.48xlarge": "aws-p5", "p5en.48xlarge": "aws-p5en", "p6-b200.48xlarge": "aws-p6-b200",
    "p6-b300.48xlarge": "aws-p6-b300", "p6e-gb200.36xlarge": "aws-p6e-gb200",
    "a3-megagpu-8g": "gcp-a3-mega", "a3-ultragpu-8g": "gcp-a3-ultra", "a4-highgpu-8g": "gcp-a4",
    "a4x-highgpu-4g": "gcp-a4x",
    "standard_nd96isr_h100_v5": "azure-nd-h100-v5", "standard_nd128isr_ndr_gb200_v6": "azure-nd-gb200-v6",
    "bm.gpu.h100.8": "oci-h100", "bm.gpu.b200.8": "oci-b200",
}


def preset_of_instance(instance_type: str) -> Preset | None:
    """The cloud preset of an instance type name (case-insensitive), or None."""
    name = INSTANCE_TYPES.get(str(instance_type).strip().lower())
    return PRESETS[name] if name else None


def preset_names() -> list[str]:
    return list(PRESETS)


# the host names build_preset makes up: "<gpu>-n0001" (HGX) and "<gpu>-r01-t01" (NVL72 rack, tray)
_PRESET_HOST = re.compile(r"^(?:%s)-(?:n\d{4,}|r\d{2,}-t\d{2})$" % "|".join(sorted({p.gpu for p in PRESETS.values()})))


def is_preset_host(name: str) -> bool:
    """True for a host name of the form ``build_preset`` invents (not a real machine's name)."""
    return bool(_PRESET_HOST.match(name))


def _tiers(p: Preset, nic_gbps: float, oversubscription: float) -> list[Tier]:
    tiers = [Tier(name="leaf", gbps_per_gpu=nic_gbps, latency_us=HOP_US, oversubscription=1.0, unit_gpus=p.su_gpus)]
    if p.spine_unit is None:
        tiers.append(Tier(name="spine", gbps_per_gpu=nic_gbps, latency_us=round(3 * HOP_US, 3),
                          oversubscription=oversubscription))
    else:
        tiers.append(Tier(name="spine", gbps_per_gpu=nic_gbps, latency_us=round(3 * HOP_US, 3),
                          oversubscription=oversubscription, unit_gpus=p.spine_unit))
        tiers.append(Tier(name="core", gbps_per_gpu=nic_gbps, latency_us=round(5 * HOP_US, 3), oversubscription=1.0))
    return tiers


def build_preset(name: str, gpus: int | None = None, usable_per_domain: int | None = None,
                 oversubscription: float = 1.0) -> Cluster:
    """A preset cluster with ``gpus`` GPUs (default one scalable unit)."""
    key = name.strip().lower()
    p = PRESETS.get(key)
    if p is None:
        raise InputError(f"unknown cluster preset {name!r}; use one of {', '.join(PRESETS)} or a cluster YAML path")
    spec = get_gpu(p.gpu)
    if oversubscription <= 0:
        raise InputError(f"--oversubscription {oversubscription}: must be > 0 (1 = non-blocking)")
    n = p.su_gpus if gpus is None else int(gpus)
    per = spec.gpus_per_node
    if n <= 0:
        raise InputError(f"--gpus {n}: must be a positive number of GPUs")
    if n > p.max_gpus:   # checked before any per-GPU list is built
        layers = "two" if p.spine_unit is None else "three"
        planes = f", {p.planes} planes" if p.planes > 1 else ""
        raise InputError(f"--gpus {n}: the {p.name} preset's fabric ({layers} switch layers of {p.switch_ports} "
                         f"ports{planes}) connects at most {p.max_gpus:,} GPUs; use --gpus {p.max_gpus} or fewer, "
                         "or describe a larger cluster in a cluster file")
    if n % per:
        lo, hi = n - n % per, n - n % per + per
        what = "4-GPU trays" if p.nvl72 else f"{per}-GPU nodes"
        alt = f"{lo} or {hi}" if lo else f"{hi}"
        raise InputError(f"--gpus {n}: {p.name} is sized in whole {what}; use {alt}")
    tiers = _tiers(p, p.nic_gbps or spec.nic_gbps, oversubscription)
    if not p.nvl72:
        if usable_per_domain is not None and usable_per_domain != per:
            raise InputError(
                f"--usable-per-rack {usable_per_domain}: {p.name} nodes are planned whole ({per} GPUs); "
                "mark failed GPUs in a cluster file's health section instead"
            )
        prefix = f"{p.gpu}-n"
        width = max(4, len(str(n // per)))
        nodes = [{"name": f"{prefix}{str(i + 1).zfill(width)}", "gpus": per} for i in range(n // per)]
        return Cluster(name=f"{p.name}-{n}", gpu=p.gpu, nodes=nodes, domains=None, tiers=tiers, fabric=p.fabric,
                       network=p.network)
    dmax = spec.nvlink_domain_max
    k = dmax if usable_per_domain is None else int(usable_per_domain)
    if k <= 0 or k > dmax or k % per:
        raise InputError(
            f"--usable-per-rack {k}: must be a multiple of {per} (whole trays) between {per} and {dmax}"
        )
    trays_per_rack = dmax // per
    used_per_rack = k // per
    total_trays = n // per
    nodes, domains, spare = [], [], []
    rack = 0
    left = total_trays
    while left > 0:
        rack += 1
        use = min(used_per_rack, left)
        names = [f"{p.gpu}-r{rack:02d}-t{t:02d}" for t in range(1, trays_per_rack + 1)]
        listed = names if use == used_per_rack else names[:use]
        spare.extend(names[use:len(listed)])
        nodes.extend({"name": nm, "gpus": per} for nm in listed)
        domains.append({"name": f"{p.gpu}-r{rack:02d}", "nodes": listed})
        left -= use
    return Cluster(
        name=f"{p.name}-{n}" + (f"-u{k}" if k != dmax else ""),
        gpu=p.gpu, nodes=nodes, domains=domains, tiers=tiers, fabric=p.fabric, network=p.network,
        health={"spare_trays": spare},
    )
