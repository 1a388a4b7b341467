"""Host-side floor of a layer: the CPU must issue a layer's kernels before the GPU can run them.

A training step runs a Python program that launches each kernel; PyTorch, Transformer Engine and
Megatron spend host time per launched op (20-30 us per call unless overlapped, hardware.md s2.4).
The CPU normally runs ahead of the GPU and the cost hides, but not when the host issues more
seconds of launches per layer than the GPU spends on the layer, or when a device-to-host sync
(Megatron's dropless token dispatch reads the tokens per expert back to size its buffers) stops it
from running ahead. Per layer and micro-batch, forward and backward::

    t_host = t_call * ([n_expert * E_local if the experts are launched] + [the layer's calls no graph captures])
    exposed = max(0, t_host - t_gpu)        (t_gpu: the layer's compute and exposed communication)

``n_expert``: the grouped expert GEMMs launch per local expert (Transformer Engine's GroupedLinear
issues one GEMM per expert for fc1 and fc2 and quantises per expert: forward quantise + GEMM twice,
backward two GEMMs and a gradient quantise twice), 12 calls per expert. Partial CUDA graphs
(attn, moe_router, moe_preprocess) do not capture them in dropless training, whose expert shapes
change every step; a full-iteration graph, or a graph of the whole MoE block, does.
The layer's other calls (norms, attention, router, permutation, dispatch and combine, residuals:
about 50 calls forward, twice that backward, 150 in all) count by the CUDA-graph module that would
capture them (``MODULE_CALLS``); a captured module is replaced by its replays. The default partial
graphs (attn, moe_router, moe_preprocess) leave the dispatch, permutation, combine and shared expert
to the host (48 calls), a recipe that graphs only the router (moe_router, moe_preprocess: the
Qwen3 recipes on HGX B200) also the attention block (60). ``t_call``: the profile's
``host.launch_us`` (prior 25 us, hardware.md s2.4). Which parts a recipe launches:
``planner.cost.steptime.host_regime`` (Megatron only; the counts are Megatron's and Transformer
Engine's, estimated, not traced).

A recomputed forward launches its kernels again during the backward pass: full recompute adds the
forward's third of the layer's uncaptured calls and the experts' forward (4 per local expert), a
recomputed MoE block the block's (``recompute_calls``).

Where the floor binds: layouts that leave each GPU little work per layer and micro-batch and many
local experts (Qwen3-30B-A3B at MBS 1 on 8 B200: 16 experts per GPU, 8.6 ms of host time against
about 3 ms of GPU work; measured 8.8-9.2 ms per layer and micro-batch, Megatron-Bridge 26.02 and
25.11 tables). On NVL72 racks at the published batch sizes the GPU work per layer is several times
the floor.
"""

from __future__ import annotations

CALL_US = 25.0            # host seconds per launched op, hardware.md s2.4 (PyTorch 20-30 us per call)
CALLS_PER_EXPERT = 12     # per local expert, forward + backward (see above)
# The rest of an eager layer, forward + backward (about 50 calls forward, twice that backward), by the
# CUDA-graph module that captures it (Megatron's --cuda-graph-modules): attention block (norm, QKV,
# RoPE, core attention, projection, residual); MoE: the router (norm, router GEMM, top-k, aux loss),
# its preprocessing (token counts, permutation map) and the rest of the block (dispatch, permute,
# unpermute, combine, shared expert, residual), which no partial graph captures; dense: the MLP.
MODULE_CALLS = {"moe": {"attn": 60, "moe_router": 24, "moe_preprocess": 18, "": 48},
                "dense": {"attn": 60, "mlp": 90}}
CALLS_PER_LAYER = 150     # every module of an eager layer (the sum of MODULE_CALLS of a kind)
FORWARD_SHARE = 1.0 / 3.0   # of a module's calls, the forward's (about 50 of 150: backward launches twice as many)
REPLAY_CALLS = 2          # a captured module is one graph replay forward and one backward
WHOLE_LAYER = ("*",)      # graphed: the whole layer is captured (full-iteration graph, or the layer's graph)
# Dropless MoE: kernels the host launches after the device-to-host sync of one MoE forward pass
CALLS_AFTER_SYNC_PER_EXPERT = 4   # forward of a local expert: quantise + GEMM for fc1 and for fc2
CALLS_AFTER_SYNC = 8              # dispatch, permute, activation, unpermute, combine, unpermute, probs, residual


def layer_calls(kind: str, graphed) -> float:
    """Host calls of one layer of ``kind`` beyond the expert GEMMs, forward + backward: the modules a
    CUDA graph does not capture, plus one replay per captured module and pass. ``graphed``: the
    captured modules (``()`` or ``True``: none, an eager layer; ``WHOLE_LAYER`` or ``False``: all);
    ``moe`` captures the whole MoE block (router, preprocessing and the rest)."""
    if graphed is True:
        graphed = ()
    if graphed is False or tuple(graphed) == WHOLE_LAYER:
        return 0.0
    mods = MODULE_CALLS["moe" if kind == "moe" else "dense"]
    captured = set(graphed)
    if "moe" in captured:
        captured |= {"moe_router", "moe_preprocess", ""}
    calls = sum(n for m, n in mods.items() if m not in captured)
    return float(calls + REPLAY_CALLS * sum(1 for m in set(graphed) if m in mods or (m == "moe" and kind == "moe")))


def recompute_calls(kind: str, local_experts: float, graphed, experts_launched: bool, recompute) -> float:
    """Host calls a recomputed forward launches again in the backward pass, one layer and micro-batch:
    full recompute re-runs the layer's forward (a third of its uncaptured calls, ``FORWARD_SHARE``, and
    the experts' forward, ``CALLS_AFTER_SYNC_PER_EXPERT`` each); a "moe" module recompute re-runs the MoE
    block's (megatron-core 0.19.2 ``CheckpointWithoutOutput`` around the MoE layer). Other module
    recomputes (core_attn, moe_act, layernorms, mla_up_proj) re-run a few fused kernels: not counted."""
    graphed = () if graphed is True else graphed
    if graphed is False or tuple(graphed) == WHOLE_LAYER or (kind != "moe" and recompute != "full"):
        return 0.0
    moe_block = kind == "moe" and (recompute == "full" or "moe" in (recompute or ()))
    if recompute == "full":
        calls = FORWARD_SHARE * layer_calls(kind, graphed)
    elif moe_block:
        captured = set(graphed)
        calls = FORWARD_SHARE * sum(n for m, n in MODULE_CALLS["moe"].items() if m != "attn" and m not in captured)
    else:
        return 0.0
    if moe_block and experts_launched:
        calls += CALLS_AFTER_SYNC_PER_EXPERT * local_experts
    return calls


def host_time(kind: str, local_experts: float, graphed, experts_launched: bool,
              call_us: float = CALL_US, recompute=()) -> float:
    """Host seconds to issue one layer's kernels for one micro-batch (forward + backward, and the forward
    again where it is recomputed: ``recompute_calls``); ``graphed`` as ``layer_calls`` (``True``: an
    eager layer, ``False``: graph-captured)."""
    calls = CALLS_PER_EXPERT * local_experts if (kind == "moe" and experts_launched) else 0.0
    calls += recompute_calls(kind, local_experts, graphed, experts_launched, recompute)
    return (calls + layer_calls(kind, graphed)) * call_us * 1e-6


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
