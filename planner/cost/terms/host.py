"""Host-side floor of a layer: the CPU must issue a layer's kernels before the GPU can run them.

A training step runs a Python program that launches each kernel; PyTorch, Transformer Engine and
Megatron spend host time per launched op (20-30 us per call unless overlapped, hardware.md s2.4).
The CPU normally runs ahead of the GPU and the cost hides, but not when the host issues more
seconds of launches per layer than the GPU spends on the layer, or when a device-to-host sync
(Megatron's dropless token dispatch reads the tokens per expert back to size its buffers) stops it
from running ahead. Per layer and micro-batch, forward and backward::

    t_host = t_call * ([n_expert * E_local if the experts are launched] [+ n_layer if the layer runs eagerly])
    exposed = max(0, t_host - t_gpu)        (t_gpu: the layer's compute and exposed communication)

``n_expert``: the grouped expert GEMMs launch per local expert (Transformer Engine's GroupedLinear
issues one GEMM per expert for fc1 and fc2 and quantises per expert: forward quantise + GEMM twice,
backward two GEMMs and a gradient quantise twice), 12 calls per expert. Partial CUDA graphs
(attn, moe_router, moe_preprocess) do not capture them in dropless training, whose expert shapes
change every step; a full-iteration graph, or a graph of the whole MoE block, does.
``n_layer``: the rest of an eager layer (norms, attention, router, permutation, dispatch and
combine, residuals: about 50 calls forward, twice that backward), replaced by graph replays when the
recipe captures CUDA graphs. ``t_call`` = 25 us (hardware.md s2.4). Dense layers count ``n_layer``
only. Which parts a recipe launches: ``planner.cost.steptime.host_regime`` (Megatron only; the
counts are Megatron's and Transformer Engine's).

Where the floor binds: layouts that leave each GPU little work per layer and micro-batch and many
local experts (Qwen3-30B-A3B at MBS 1 on 8 B200: 16 experts per GPU, 8.6 ms of host time against
about 3 ms of GPU work; measured 8.8-9.2 ms per layer and micro-batch, Megatron-Bridge 26.02 and
25.11 tables). On NVL72 racks at the published batch sizes the GPU work per layer is several times
the floor.
"""

from __future__ import annotations

CALL_US = 25.0            # host seconds per launched op, hardware.md s2.4 (PyTorch 20-30 us per call)
CALLS_PER_EXPERT = 12     # per local expert, forward + backward (see above)
CALLS_PER_LAYER = 150     # the rest of an eager layer, forward + backward
# Dropless MoE: kernels the host launches after the device-to-host sync of one MoE forward pass
CALLS_AFTER_SYNC_PER_EXPERT = 4   # forward of a local expert: quantise + GEMM for fc1 and for fc2
CALLS_AFTER_SYNC = 8              # dispatch, permute, activation, unpermute, combine, unpermute, probs, residual


def host_time(kind: str, local_experts: float, eager: bool, experts_launched: bool,
              call_us: float = CALL_US) -> float:
    """Host seconds to issue one layer's kernels for one micro-batch (forward + backward)."""
    calls = CALLS_PER_EXPERT * local_experts if (kind == "moe" and experts_launched) else 0.0
    if eager:
        calls += CALLS_PER_LAYER
    return calls * call_us * 1e-6


def host_exposed(t_host: float, t_gpu: float) -> float:
    """The part of the host time the GPU work of the layer does not cover."""
    return max(0.0, t_host - t_gpu)


def sync_exposed(local_experts: float, syncs: int, g_post: float, call_us: float = CALL_US) -> float:
    """GPU idle time a dropless MoE layer's host syncs cause, one micro-batch: after each sync
    (megatron-core 0.19.2 token_dispatcher.py: ``d2h_event.synchronize()`` for alltoall, ``.item()`` of
    the token counts for DeepEP/HybridEP) the launch queue is empty and the host launches the rest of
    the MoE block while the GPU waits, until its GPU work ``g_post`` (seconds) covers the launches."""
    calls = CALLS_AFTER_SYNC_PER_EXPERT * local_experts + CALLS_AFTER_SYNC
    return syncs * max(0.0, calls * call_us * 1e-6 - g_post)
