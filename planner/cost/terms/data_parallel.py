"""Data-parallel gradient reduce-scatter and parameter all-gather (distributed optimizer or FSDP).

Distributed optimizer (Megatron ``--use-distributed-optimizer`` with overlapped grad reduce and
param gather): once per step, each rank reduce-scatters its gradients (``P_rank * b_g`` bytes, ``b_g = 2``: BF16) over the
data-parallel group and all-gathers the updated parameters (``P_rank * b_p`` bytes). Dense parameters
use the dense DP x CP group, expert parameters the expert-data-parallel group. Gradient accumulation
defers the reduce-scatter to the last micro-batch, so only that micro-batch's backward (and the
all-gather only the first micro-batch's forward) can hide it::

    exposed = max((1-o) RS, RS - t_b) + max((1-o) AG, AG - t_f)

With an interleaved pipeline (``vpp > 1``) the all-gather is gathered chunk by chunk ahead of use: megatron-core's
interleaved schedule gathers the first two model chunks' parameters when the step starts and chunk ``k+1``'s when
chunk ``k`` runs its first micro-batch (``megatron/core/pipeline_parallel/schedules.py``@d98e8a64, lines 1219-1221
and 1341-1353), and the schedule's warm-up is forward passes only, ``pp`` micro-batches of a chunk before the next
chunk's first (``microbatch_group_size_per_vp_stage``, default ``pp``). Chunk ``k+1``'s gather therefore has
``k pp`` chunk-forwards of ``t_f / vpp`` to hide behind, and the whole gather::

    window_AG = t_f (1 + (vpp - 1) pp) / vpp          (gather_window_passes; t_f at vpp = 1 or pp = 1)

The reduce-scatter keeps one backward: the same reasoning on the cool-down (chunk ``c``'s gradients are reduced
after its last backward, lines 1445-1454) priced the same way made the published scaling series worse
(docs/steptime.md, "Strong scaling").

FSDP (Megatron-FSDP / ZeRO-3): parameters are all-gathered before every micro-batch's forward and
backward and gradients reduce-scattered after every backward; each micro-batch's transfers hide behind
that micro-batch's compute::

    exposed = m * max((1-o) (2 AG + RS), 2 AG + RS - (t_f + t_b))

This module gives the transfers (``dp_time``, ``param_gather_bytes``); how they are exposed is part of
the step's composition, ``planner.cost.compose`` (``dp_exposed``, ``fsdp_exposed``).

Buckets and NCCL latency: megatron-core reduces and gathers in buckets of ``max(40M, 1M x dp)``
parameters (``distributed_data_parallel.py``: "larger DP sizes need larger buckets" so that NCCL's ring
stays bandwidth-bound), one NCCL call each. Every call pays NCCL's latency for the group, which grows with
its ranks (``topologies.collectives.nccl_latency_us``: a ring reduce-scatter over k nodes takes k-1
network steps of ~14 us; PAT, one rank per node, log2 k): ``RS += buckets x latency(RS)``, the same for AG.
At 64 nodes a ring step chain is ~0.9 ms a bucket; this is the DP cost that grows with N rather than with
the work per GPU.
"""

from __future__ import annotations

import math

from topologies.collectives import nccl_choice

# Megatron-Bridge's performance recipes reduce gradients in BF16: they set
# cfg.ddp.grad_reduce_in_fp32 = False (and mixed_precision.grad_reduce_in_fp32 = False) in the
# DeepSeek-V3, Qwen3 and GPT-OSS perf configs (scripts/performance/configs/*), so the reduce-scatter
# moves 2 bytes per gradient, as planner.cost.memory assumes for the gradient buffer. Parameters are
# gathered in BF16 unless the recipe keeps FP8 or NVFP4 parameters (fp8_param_gather, on in the recipes' FP8
# current-scaling and MXFP8 precision configs; fp4_param_gather, on in their NVFP4 one; param_gather_bytes).
GRAD_BYTES = 2.0
PARAM_BYTES = 2.0
FSDP_GATHERS = 2   # FSDP gathers each micro-batch's parameters twice (forward, backward)
# megatron-core distributed_data_parallel.py: bucket_size = max(40000000, 1000000 * dp_group.size())
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PARAMS_PER_RANK = 1_000_000


def gather_window_passes(pp: int, vpp: int) -> float:
    """Forward passes of one micro-batch (all the rank's layers) the distributed optimizer's parameter all-gather
    hides behind: 1 without an interleaved pipeline, ``(1 + (vpp - 1) pp) / vpp`` with one (module docstring)."""
    if vpp <= 1 or pp <= 1:
        return 1.0
    return (1 + (vpp - 1) * pp) / vpp


def ddp_buckets(param_count: float, dp_size: int) -> int:
    """Buckets megatron-core splits ``param_count`` parameters into for the DP reduction."""
    if param_count <= 0:
        return 0
    return math.ceil(param_count / max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_RANK * dp_size))


def bucket_latency(shape, param_count: float, fabric=None) -> tuple[float, float]:
    """(reduce-scatter, all-gather) seconds of NCCL latency over all buckets of ``param_count``
    parameters on the group ``shape``: ``fabric.nccl_latency`` (the fabric kind's network steps), or
    NCCL's own constants without a fabric (``topologies.collectives.nccl_choice``)."""
    if shape is None or shape.size <= 1 or param_count <= 0:
        return 0.0, 0.0
    b = ddp_buckets(param_count, shape.size)
    lat = fabric.nccl_latency if fabric is not None else (lambda c, sh: nccl_choice(c, sh)[1])
    return b * lat("reduce_scatter", shape), b * lat("all_gather", shape)


def param_gather_bytes(precision: str, quantised_params: bool) -> float:
    """Bytes per parameter of the data-parallel parameter all-gather. With quantised parameters
    (``planner.rules.quantised_params``) megatron-core gathers the uint8 storage of tensorwise and
    blockwise FP8 parameters (param_and_grad_buffer.py:888-916, param_dtype torch.uint8): 1 B; of NVFP4
    parameters it gathers the packed row-wise data, two 4-bit values a byte (param_and_grad_buffer.py:
    1080-1111, 1176: the uint8 buffer has nvfp4_packed_numel = numel // 2, 1494), the scales and the
    column-wise copy being rebuilt after the gather (fp4_utils.py:135-170, quantize_master_weights with
    manual post-all-gather processing): 0.5 B. MXFP8
    parameters are gathered as BF16 through the gradient buffer (param_and_grad_buffer.py:1153-1171:
    param_data is a BF16 view of the shared buffer; _post_param_sync quantises into the MXFP8 storage):
    2 B, as without FP8 parameters. Approximation: the first and last layers' non-linear parameters
    (norms, embedding, router) gather in BF16 even with quantised parameters; they are counted at the
    quantised width too."""
    if not quantised_params:
        return PARAM_BYTES
    return {"fp8": 1.0, "fp8-block": 1.0, "nvfp4": 0.5}.get(precision, PARAM_BYTES)


def dp_time(fabric, shape, param_count: float, grad_bytes: float = 2.0, param_bytes: float = 2.0) -> tuple[float, float]:
    """(reduce-scatter, all-gather) seconds for ``param_count`` parameters over the group ``shape``."""
    if shape is None or shape.size <= 1 or param_count <= 0:
        return 0.0, 0.0
    lat_rs, lat_ag = bucket_latency(shape, param_count, fabric)
    return (fabric.reduce_scatter(shape, param_count * grad_bytes) + lat_rs,
            fabric.all_gather(shape, param_count * param_bytes) + lat_ag)
