"""Which MoE dispatchers a cluster's scale-out fabric can run (docs/cloud.md).

DeepEP's internode kernels and HybridEP's RDMA path post RDMA work requests from GPU threads
(NVSHMEM IBGDA), which only mlx5 NICs on InfiniBand or RoCE take (``topologies.fabrics``:
``gpu_initiated_rdma``). On AWS EFA and GCP GPUDirect-TCPXO the flex dispatchers run only while every
expert group (``etp x ep`` ranks) stays inside one NVLink domain, where they move tokens over NVLink
alone; NCCL's all-to-all (Megatron's ``alltoall``) runs everywhere. Sources: deepseek-ai/DeepEP#369
(no EFA), NVIDIA-NeMo/Megatron-Bridge#3343 (HybridEP traps without mlx5 NICs on EFA), and the patched
transports (UCCL-EP, NVSHMEM over libfabric) that stock Megatron does not ship.
"""

from __future__ import annotations

from topologies.fabrics import fabric_kind

from planner.cost.placement import rank_groups

FLEX = ("flex-deepep", "flex-hybridep")


def needs_gpu_rdma(cluster, dispatcher: str) -> bool:
    """True when ``dispatcher`` would need GPU-initiated RDMA that this cluster's fabric lacks."""
    return dispatcher in FLEX and not fabric_kind(getattr(cluster, "fabric", None)).gpu_initiated_rdma


def dispatcher_problem(cluster, config, world: int, order: str, rank_domains) -> str | None:
    """Why the fabric cannot run the layout's dispatcher (one line), or None. ``rank_domains[r]`` is the
    NVLink domain of global rank ``r``."""
    if config.ep <= 1 or not needs_gpu_rdma(cluster, config.dispatcher):
        return None
    for group in rank_groups(config, world, "etp-ep", order):
        doms = {rank_domains[r] for r in group}
        if len(doms) > 1:
            kind = cluster.fabric
            return (f"dispatcher {config.dispatcher}: its {len(group)}-rank expert group spans {len(doms)} NVLink "
                    f"domains and {cluster.name}'s {kind} fabric has no GPU-initiated RDMA (NVSHMEM IBGDA) for "
                    "DeepEP/HybridEP between domains; use --dispatcher alltoall or keep etp*ep inside one NVLink domain")
    return None


def fabric_note(cluster) -> str | None:
    """The one line the plan's solver notes carry when the fabric restricts the dispatchers."""
    kind = fabric_kind(getattr(cluster, "fabric", None))
    if kind.gpu_initiated_rdma:
        return None
    return (f"dispatchers: flex-deepep / flex-hybridep only with every expert group inside one NVLink domain: the "
            f"{kind.name} fabric has no GPU-initiated RDMA (NVSHMEM IBGDA); alltoall (NCCL) runs everywhere")
