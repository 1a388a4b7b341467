"""FP8 delayed scaling: the amax all-reduce over every rank of a pipeline stage, twice per micro-batch and chunk.

Transformer Engine's delayed scaling (``DelayedScaling``, megatron-core's default ``--fp8-recipe delayed``
and NeMo 2's ``bf16_with_fp8_mixed``, fp8_amax_history_len 1024) scales each FP8 tensor by the amax history of
that tensor on *every* rank of its amax group, so each rank's new amaxes are reduced (MAX) across the group:

* megatron-core 0.19.2 ``fp8_utils.get_fp8_context`` opens one ``fp8_autocast(fp8_group=...)`` around the whole
  forward of a model chunk when the recipe is delayed (``transformer_block.py``: "If fp8_recipe is delayed,
  wrap the entire pass with get_fp8_context()"), and its group is
  ``parallel_state.get_amax_reduction_group(with_context_parallel=True)``: the tensor x data x context
  parallel ranks (``_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP``), i.e. every rank of one pipeline stage,
  unless ``--tp-only-amax-red`` narrows it to TP x CP;
* Transformer Engine (``transformer_engine/pytorch/fp8.py``, ``FP8GlobalStateManager.reduce_and_update_fp8_tensors``)
  all-reduces the forward amax buffer when the outermost ``fp8_autocast`` exits and the backward buffer when
  the backward of the region's first FP8 module ends: two blocking all-reduces of a few KiB per micro-batch
  and model chunk, on the compute stream's path (the scale update that follows needs the result).

NVIDIA's launch scripts of these recipes still export ``NVTE_DP_AMAX_REDUCE_INTERVAL=0`` and
``NVTE_ASYNC_AMAX_REDUCTION=1`` (reduce over TP only, asynchronously). Transformer Engine read them only up to
v1.5; from v1.6 (May 2024) the global amax buffer above reads neither (git history of fp8.py), so in the NeMo
24.09-25.04 containers the reduction is blocking and spans the stage.

The reduction is also a barrier of the whole stage: the all-reduce ends when its last rank arrives. Without
it, ranks of different data-parallel replicas meet once a step (the gradient reduction) and only the
TP x CP group meets per layer, so the per-reduction wait is the expected maximum of the ranks' arrival
times beyond the TP x CP group's own, ``ARRIVAL_SPREAD_S * (e(tp cp dp) - e(tp cp))`` with ``e`` the
expected maximum of n normal draws (terms/sync.py). Hoefler, Schneider and Lumsdaine, "Characterizing the
Influence of System Noise on Large-Scale Applications by Simulation" (SC'10) show this amplification: a
collective waits for the noisiest of its ranks, so its cost grows with the ranks at a fixed noise.

The messages are tiny, so each all-reduce costs NCCL's latency for the group in its least-latency protocol
(``Fabric.nccl_latency(small=True)``: tuning.cc's LL tree / ring latency, which grows with the nodes the group
spans), and nothing hides it::

    t_amax = 2 m vpp * (nccl_latency(all_reduce, G) + ARRIVAL_SPREAD_S (e(G) - e(tp cp)))
             G = tp x cp x dp ranks of one stage, m micro-batches per step, vpp model chunks per rank

The group grows with the data-parallel size, so this is a term that grows with N at fixed work per GPU:
weak-scaling FP8 series lose retention that BF16 series of the same layout keep (bench/scaling.py). Current
scaling (``tensorwise``: each tensor's amax is its own; sequence-parallel inputs reduce over TP only), the block
recipes (fp8-block, mxfp8, nvfp4) and BF16 have no such reduction; nor does ``--tp-only-amax-red``, which
topoplan does not write. The latency is NCCL's constants and the fabric's step latency; the spread is fitted.
"""

from __future__ import annotations

from planner.cost.terms.sync import expected_max
from topologies.collectives import GroupShape

REDUCTIONS_PER_CHUNK = 2   # forward (autocast exit) and backward (first module's backward), per micro-batch
# Spread (one standard deviation) of the ranks' arrival at one reduction: the only fitted figure of the term,
# one value for every stack and GPU, fitted to the FP8 series of bench/data/scaling/scaling.csv
# (``python bench/scaling.py --fit``: 125 us; leave-one-series-out in docs/steptime.md). It is about 1% of
# the ~15 ms between two reductions of those runs: the transient spread of kernel and launch times
# (Sinha et al. SC'22 and Meta's PRISM measure 1-2% of a GPU's pace, terms/sync.py).
ARRIVAL_SPREAD_S = 125e-6


def amax_group(cluster, tp: int, cp: int, dp: int) -> GroupShape:
    """The amax reduction group of one pipeline stage: ``tp * cp * dp`` consecutive ranks (pipeline is the
    outermost rank axis), filling NVLink domains of the cluster's largest healthy size."""
    size = max(int(tp) * int(cp) * int(dp), 1)
    per = max(min(size, max(cluster.domain_sizes() or [1])), 1)
    domains = -(-size // per)
    return GroupShape(size=size, per_domain=per, domains=domains, tier=-1 if domains == 1 else 0)


def delayed(training, recipe=None) -> bool:
    """Whether the step runs FP8 delayed scaling (precision fp8 with ``fp8_recipe`` delayed)."""
    r = recipe if recipe is not None else training.recipe
    return training.precision == "fp8" and getattr(r, "fp8_recipe", None) == "delayed"


def amax_time(fabric, cluster, tp: int, cp: int, dp: int, vpp: int, microbatches: float,
              spread: float | None = None) -> float:
    """Seconds per step of the delayed-scaling amax all-reduces (module docstring): each costs NCCL's
    latency plus the wait for the last of its ranks to arrive, beyond the TP x CP group's own."""
    shape = amax_group(cluster, tp, cp, dp)
    if shape.size <= 1:
        return 0.0
    s = ARRIVAL_SPREAD_S if spread is None else spread
    one = fabric.nccl_latency("all_reduce", shape, small=True) + s * (expected_max(shape.size) - expected_max(tp * cp))
    return REDUCTIONS_PER_CHUNK * microbatches * max(int(vpp), 1) * one


def seconds(ctx, v: dict) -> float:
    """The ``compose.StepTerm`` of this term: ``ctx`` a ``TermContext``, ``v`` the layout's values."""
    if not delayed(ctx.training):
        return 0.0
    m = v["gbs"] / (v["mbs"] * v["dp"])
    return amax_time(ctx.fabric, ctx.cluster, v["tp"], v["cp"], v["dp"], v["vpp"], m)
