"""Megatron's optimizer CPU offload: the optimizer step of the offloaded share, on the host.

With ``Recipe.optimizer_offload_fraction`` = f (``--optimizer-cpu-offload --optimizer-offload-fraction f``,
megatron-core 0.19.2 ``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``), the
``HybridDeviceOptimizer`` under the distributed optimizer keeps the first f of each rank's shard on the host
and, every step after the gradient reduction:

1. copies that share's gradients to pinned host memory (d2h; ``_set_sub_optimizer_grads``: a BF16 gradient
   crosses the link as BF16, ``grad_bytes`` per parameter, and is widened to FP32 on the host);
2. runs torch's fused CPU AdamW over it (FP32 master weights and both moments in host memory);
3. copies the updated parameters back into the GPU's BF16 parameters (h2d; ``param_copy_back_gpu_hook``:
   the FP32 master is narrowed on the host and 2 B per parameter cross the link).

The training step waits for all of it (the step hook makes the compute stream wait for the h2d copies), so
it is exposed. With ``n = f * P / W`` parameters per rank (the distributed optimizer's shard of the ``P``
parameters over the ``W`` ranks: dense / (tp pp dp cp) + experts / (ep etp pp edp) = P / W, as the memory
bound's shard, ``planner.search.memory_bound``; the embedding's pipeline-stage surplus is left out)::

    d2h  = n * grad_bytes / link          link: the GPU's host_link_gbps_uni (PCIe Gen5 x16 64 GB/s on HGX,
    h2d  = n * 2 / link                         NVLink-C2C 450 GB/s per direction on Grace)
    adam = n / CPU_ADAM_PARAMS_PER_S
    t    = d2h + adam + h2d               (serial: --overlap-cpu-optimizer-d2h-h2d off)
    t    = max(d2h, adam, h2d)            (overlapped: one CPU optimizer per parameter, copies on side streams,
                                           so parameter i+1's d2h and i-1's h2d run beside i's update; the
                                           first d2h and the last h2d, one tensor each, are left out)

``CPU_ADAM_PARAMS_PER_S``: the one measurement at hand, NVIDIA-NeMo/RL pull request #3628 (merged
2026-08-13, "support fractional optimizer CPU offload", megatron-core's HybridDeviceOptimizer): Qwen3-0.6B on
one H100 of a CoreWeave node, mean step over steps 11-100: 0.752 s without offload, 1.678 s with 100% offload
and overlap, i.e. 0.926 s for its ~0.6e9 parameters; 0.6e9 / 0.926 s = 0.65e9 parameters/s (1.54 ns per
parameter; the 50% row without overlap, 1.187 s, gives 0.3e9 / 0.435 s = 0.69e9 with its copies inside). That
is torch's CPU AdamW (fused=True) in one process; topoplan assumes every rank of a node gets the same rate
(eight ranks of a DGX share two CPUs of 56 cores and 16 DDR5 channels: the rate per rank may be lower), and
the same rate on Grace: both are assumptions, so plans with the offload are marked extrapolated
(``planner.cost.uncertainty``). The GPU's own Adam term (``terms/optimizer.py``) is charged on the whole shard
still: an upper bound of f x that term, small beside the CPU's.
"""

from __future__ import annotations

from planner.model.flops import param_counts
from planner.rules import optimizer_offload, optimizer_offload_overlap
from planner.trainers import get_trainer

CPU_ADAM_PARAMS_PER_S = 0.65e9   # NVIDIA-NeMo/RL#3628: Qwen3-0.6B, 100% offload with overlap, +0.926 s per step
PARAM_COPY_BYTES = 2.0           # the updated parameter goes back as the GPU's BF16 parameter


def cpu_optimizer_time(params: float, grad_bytes: float, link_gbps: float, overlap: bool) -> float:
    """Seconds of the host's optimizer step over ``params`` parameters: the gradients' d2h at ``grad_bytes``
    each, CPU Adam, the parameters' h2d, over a host link of ``link_gbps`` GB/s per direction."""
    if params <= 0.0:
        return 0.0
    d2h = params * grad_bytes / (link_gbps * 1e9)
    h2d = params * PARAM_COPY_BYTES / (link_gbps * 1e9)
    adam = params / CPU_ADAM_PARAMS_PER_S
    return max(d2h, adam, h2d) if overlap else d2h + adam + h2d


def offloaded_params_per_rank(model, training, world: int) -> float:
    """Parameters one rank updates on the CPU: ``f * P / W`` (module docstring)."""
    f = optimizer_offload(training)
    return f * float(param_counts(model).total) / max(int(world), 1) if f else 0.0


def seconds(ctx, values: dict) -> float:
    """The ``compose.StepTerm`` function: the exposed seconds of the offloaded optimizer step of a layout
    on ``values["world"]`` ranks (0 when the recipe offloads nothing)."""
    n = offloaded_params_per_rank(ctx.model, ctx.training, values["world"])
    if not n:
        return 0.0
    grad_bytes = get_trainer(ctx.training.trainer).pricing.grad_bytes
    return cpu_optimizer_time(n, grad_bytes, ctx.cluster.gpu_spec.host_link_gbps_uni,
                              optimizer_offload_overlap(ctx.training))
