"""Scale-out fabric kinds (InfiniBand, RoCE, AWS EFA, GCP GPUDirect-TCPXO): the latency figures
``topologies.collectives.Fabric`` uses per kind and what each transport can run.

The figures live in ``topologies/data/fabrics.yaml``, each with its source and whether it was fitted
to a published sweep (``measured``) or borrowed from a kin (``extrapolated``); docs/cloud.md lists
them. A cluster names its kind in ``Cluster.fabric`` (omitted = infiniband).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

__all__ = ["FabricKind", "FABRIC_KINDS", "fabric_kind", "DEFAULT_KIND", "LATENCY_KEYS", "A2A_KEYS"]

DEFAULT_KIND = "infiniband"
FABRIC_KINDS = ("infiniband", "roce", "efa", "tcpxo")
# the keys of topologies.collectives.PARAMS a kind replaces (microseconds)
LATENCY_KEYS = ("net_base_us", "net_step_us", "pipe_net_us", "a2a_net_us")
# optional: NCCL's all-to-all through the NICs where a kind has its own measured sweep
# (``topologies.collectives.Fabric.all_to_all``); a kind without them prices it as its all-reduce
#   a2a_net_eff        bandwidth through the NIC / line rate at large per-peer messages
#   a2a_peer_pipe_us   pipeline fill per remote peer: each peer is its own send/recv stream
A2A_KEYS = ("a2a_net_eff", "a2a_peer_pipe_us")
_DATA = Path(__file__).parent / "data" / "fabrics.yaml"


@dataclass(frozen=True)
class FabricKind:
    name: str
    status: str                         # measured | extrapolated
    latency_us: dict[str, float]        # LATENCY_KEYS -> microseconds
    gpu_initiated_rdma: bool            # NVSHMEM IBGDA: DeepEP internode kernels, HybridEP RDMA
    sources: dict[str, str] = field(default_factory=dict)
    a2a: dict[str, float] = field(default_factory=dict)   # A2A_KEYS present in the data (may be empty)


@functools.lru_cache(maxsize=1)
def _kinds() -> dict[str, FabricKind]:
    data = yaml.safe_load(_DATA.read_text())
    out = {}
    for name in FABRIC_KINDS:
        d = data[name]
        out[name] = FabricKind(name=name, status=d["status"],
                               latency_us={k: float(d[k]) for k in LATENCY_KEYS},
                               gpu_initiated_rdma=bool(d["gpu_initiated_rdma"]), sources=dict(d["sources"]),
                               a2a={k: float(d[k]) for k in A2A_KEYS if k in d})
    return out


def fabric_kind(name: str | None) -> FabricKind:
    """The kind named ``name`` (None = infiniband); ValueError for an unknown name (the cluster
    schema refuses those first)."""
    key = (name or DEFAULT_KIND).lower()
    kinds = _kinds()
    if key not in kinds:
        raise ValueError(f"unknown fabric kind {name!r}; use one of {', '.join(FABRIC_KINDS)}")
    return kinds[key]
