"""DeepSeek's Expert Parallelism Load Balancer (EPLB), written from its description, for side-by-side
benchmarks (the algorithm of deepseek-ai/EPLB, ``eplb.py`` ``rebalance_experts`` with its hierarchical and global
policies, MIT; this is not DeepSeek's code).

Two policies, both greedy and load-only:

* **hierarchical** (when ``num_groups % num_nodes == 0``):
  1. groups to nodes: groups sorted by load, descending, each into the lightest node that still has
     room; every node gets ``num_groups / num_nodes`` groups;
  2. replicate inside each node: the node's ``num_replicas / num_nodes`` slots go one by one to the
     expert with the highest ``load / replica_count``; replicas never leave their node;
  3. replicas to GPUs inside the node: every replica carries ``load / count``; the same sorted greedy
     packing gives every GPU exactly ``slots_per_gpu`` replicas.
* **global**: the same steps with one group and one node.

Two replicas of one expert may share a GPU, the previous placement is ignored, and only two levels
(node, GPU) exist: that is the baseline topoplan's solver is measured against.

Outputs per layer, in EPLB's vocabulary: ``physical_to_logical[num_replicas]`` (slot ``s`` lives on
GPU ``s // slots_per_gpu``), ``logical_to_physical[experts, max_replicas]`` (padded with -1) and
``logical_count[experts]``.
"""

from __future__ import annotations

import heapq

import numpy as np

from solver.experts import logical_maps  # noqa: F401  (the one implementation of the EPLB output maps)


def balanced_packing(weights: np.ndarray, num_packs: int) -> np.ndarray:
    """Pack ``len(weights)`` items into ``num_packs`` packs of equal item count: items sorted by
    weight (heaviest first, stable), each into the lightest pack that still has room (lowest index
    on ties). Returns the pack of every item."""
    weights = np.asarray(weights, dtype=float)
    n = len(weights)
    if n % num_packs:
        raise ValueError(f"{n} items do not split evenly into {num_packs} packs")
    cap = n // num_packs
    pack_of = np.empty(n, dtype=np.int64)
    heap = [(0.0, p) for p in range(num_packs)]           # the open packs by (load, index)
    count = [0] * num_packs
    order = np.argsort(-weights, kind="stable")
    for i, wt in zip(order.tolist(), weights[order].tolist()):
        load, p = heapq.heappop(heap)
        pack_of[i] = p
        count[p] += 1
        if count[p] < cap:
            heapq.heappush(heap, (load + wt, p))
    return pack_of


def replicate(weights: np.ndarray, num_slots: int) -> np.ndarray:
    """Replica count per expert: one each, then every extra slot to the expert with the highest
    ``weight / count`` (lowest index on ties)."""
    weights = np.asarray(weights, dtype=float)
    if num_slots < len(weights):
        raise ValueError(f"{num_slots} slots cannot hold {len(weights)} experts")
    count = np.ones(len(weights), dtype=np.int64)
    heap = [(-x, e) for e, x in enumerate(weights.tolist())]     # by (-weight / count, index)
    heapq.heapify(heap)
    for _ in range(num_slots - len(weights)):
        _, e = heapq.heappop(heap)
        count[e] += 1
        heapq.heappush(heap, (-(weights[e] / count[e]), e))
    return count


def _layer(weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int):
    """One layer: returns physical_to_logical[num_replicas]."""
    E = len(weight)
    group_size = E // num_groups
    slots_per_gpu = num_replicas // num_gpus
    gpus_per_node = num_gpus // num_nodes
    slots_per_node = num_replicas // num_nodes
    group_load = weight.reshape(num_groups, group_size).sum(axis=1)
    node_of_group = balanced_packing(group_load, num_nodes)
    phy2log = np.empty(num_replicas, dtype=np.int64)
    for node in range(num_nodes):
        experts = np.concatenate([np.arange(g * group_size, (g + 1) * group_size)
                                  for g in np.flatnonzero(node_of_group == node)])
        count = replicate(weight[experts], slots_per_node)
        rep_expert = np.repeat(experts, count)                  # one entry per replica
        rep_load = np.repeat(weight[experts] / count, count)
        gpu_of_rep = balanced_packing(rep_load, gpus_per_node)
        order = np.argsort(-rep_load, kind="stable")            # packing order fixes slot order
        fill = np.zeros(gpus_per_node, dtype=np.int64)
        for r in order:
            g = gpu_of_rep[r]
            slot = (node * gpus_per_node + g) * slots_per_gpu + fill[g]
            phy2log[slot] = rep_expert[r]
            fill[g] += 1
    return phy2log


def rebalance_experts(weight, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int,
                      policy: str = "auto"):
    """EPLB for ``weight[layers, experts]``. ``policy``: "hierarchical", "global" or "auto"
    (hierarchical when ``num_groups % num_nodes == 0``, as EPLB chooses).

    Returns ``(physical_to_logical[layers, num_replicas], logical_to_physical[layers, experts, max],
    logical_count[layers, experts])``.
    """
    weight = np.atleast_2d(np.asarray(weight, dtype=float))
    L, E = weight.shape
    if num_replicas % num_gpus or num_gpus % num_nodes or E % num_groups:
        raise ValueError("num_replicas must be a multiple of num_gpus, num_gpus of num_nodes, experts of num_groups")
    if policy == "auto":
        policy = "hierarchical" if num_groups % num_nodes == 0 else "global"
    if policy == "hierarchical":
        if num_groups % num_nodes:
            raise ValueError(f"hierarchical policy needs num_groups ({num_groups}) divisible by num_nodes ({num_nodes})")
        args = (num_groups, num_nodes)
    elif policy == "global":
        args = (1, 1)
    else:
        raise ValueError(f"unknown policy {policy!r}")
    phy2log = np.stack([_layer(weight[i], num_replicas, args[0], args[1], num_gpus) for i in range(L)])
    l2p, counts = logical_maps(phy2log, E)
    return phy2log, l2p, counts
