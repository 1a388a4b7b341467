"""Memory per GPU: model state, activations of the micro-batches a pipeline rank holds in flight,
and a framework reserve, per pipeline rank; the worst rank sets the peak.

All sizes are bytes until the result, which is in GiB. Symbols: ``s`` sequence length, ``b``
micro-batch size, ``T = b*s`` tokens per micro-batch, ``h`` hidden size, ``tp cp ep etp`` the
parallel degrees, ``d = dp*cp`` the dense data-parallel group (Megatron's distributed optimizer
shards over data and context parallel ranks), ``e = edp`` the expert data-parallel group
(``world / (etp*ep*pp)``). Tensor parallelism always comes with sequence parallelism (NVIDIA's
recipes; Megatron forces SP off only at TP=1).

**Model state** (per parameter held on the GPU; ``P_dense`` and ``P_exp`` are the parameters of
the rank's stages after TP / EP / ETP splitting)::

    Megatron, distributed optimizer:
        weights  2 B (bf16)                 grads  g B (main_grad buffer: 4 fp32, 2 with
        optimizer (4 + 2*m) / d for dense,   grad_reduce_in_fp32=False as NVIDIA's perf recipes set)
                  (4 + 2*m) / e for experts  (fp32 master + two Adam moments of m bytes)
    Megatron FSDP (optim_grads_params): weights, grads and optimizer all / d (experts / e), plus
        the unsharded bf16 weights and grads of the two layers in flight (current + prefetch).
    TorchTitan / MaxText FSDP: fp32 weights and grads sharded (4 + 4 + 8) / d, plus the working set.

    Quantised weight copies (linear layers of the decoder and MTP layers; TE keeps a row-wise and a
    column-wise copy for the step): fp8 2 B, fp8-block 2 B + 2 fp32 scales per 128x128 block,
    mxfp8 2 * (1 + 1/32) B (one E8M0 scale per 32 values), nvfp4 2 * (0.5 + 1/16) B (one E4M3 scale
    per 16 values).

    FP8 parameters (Megatron ``--fp8-param-gather``, ``Recipe.fp8_param_gather``; auto on for fp8 and
    mxfp8 as NVIDIA's Megatron-Bridge recipes, ``planner.trainers.megatron.rules.fp8_param_gather_on``): the linear
    layers' parameters ARE the quantised tensors, so their 2 B BF16 weight goes
    (``linear_weight_bytes``) and the quantised copy above stays (tensorwise: the uint8 data lives
    in the distributed optimizer's parameter buffer, 1 B, plus TE's transpose, 1 B; MXFP8: the
    MXFP8Tensor's row-wise and column-wise data and scales). No parameter all-gather buffer is
    added: for FP8 the buffer is the uint8 parameter storage itself; for MXFP8 megatron-core maps the
    BF16 all-gather onto the gradient buffer (param_and_grad_buffer.py:1153-1171, shared_buffer, with
    ``--reuse-grad-buf-for-mxfp8-param-ag``). Norms, embeddings, the output head and the router stay
    BF16. Under Megatron-FSDP the gathered buffer of a layer loses its BF16 weight likewise.

    NVFP4 parameters (Megatron ``--fp4-param-gather``, ``Recipe.fp4_param_gather``; auto on for nvfp4
    as NVIDIA's bf16_with_nvfp4_mixed, ``planner.trainers.megatron.rules.fp4_param_gather_on``) do the same: the
    parameter is Transformer Engine's NVFP4Tensor (row-wise and column-wise packed 4-bit data, 0.5 B
    each, and their E4M3 scales, one per 16 values: the nvfp4 copy bytes above) and no BF16 weight
    stays; the packed row-wise data is the distributed optimizer's uint8 parameter buffer
    (param_and_grad_buffer.py:1080-1111, numel // 2), so no gather buffer is added.

Splitting: attention, dense MLP, shared experts and the MTP projection / tp; MLA's down
projections and latent norms are duplicated over TP; norms and the router are replicated; routed
experts: (n_experts / ep) experts / etp. The input embedding and the output head are
``V_pad * h / tp`` (V_pad: Megatron's padded vocabulary); the last stage holds the output head
(a copy of the embedding when tied and pp > 1) and, with MTP and pp > 1, a copy of the embedding.

**Activations per micro-batch** (Korthikanti et al. 2022, written per saved tensor for a modern
fused stack: flash attention keeps no s x s matrix, no dropout masks). Per token and layer, with
``q`` the bytes of a saved GEMM input (bf16 2, fp8 1, fp8-block 1 + 4/128, mxfp8 1 + 1/32,
nvfp4 0.5 + 1/16)::

    norms        2 * h * 2                           (inputs of the two RMSNorms)
    attn input   h * q                               (QKV GEMM input; MLA: q/kv down-proj input)
    GQA q,k,v    (n_h*d + 2*n_kv*d) * 2              (saved by flash attention)
    MLA latents  q_r*(2+q) + (kv_r+d_r)*2 + kv_r*q   (not split by TP)
    MLA q,k,v    n_h * (2*(d_n+d_r) + d_v) * 2       (up-projected; mla_up_proj drops them)
    attn out     n_h*d_v*q + n_h*4                   (o-proj input, softmax statistics)
    dense MLP    h*q + (2F or F)*2 + F*q             (fc1 input, fc1 output, fc2 input)
    MoE          h*2 + n_experts*4 + top_k*12        (router input, fp32 scores, probs + indices)
                 + shared: h*q + 2F_sh*2 + F_sh*q
    routed       per token copy: h*q + (2F_moe*2 + F_moe*q)/etp + 4,
                 copies per GPU = T/(tp*cp) * top_k * etp (balanced routing)

Everything except the routed copies and MLA latents is divided by tp (SP) and by cp. Recompute
drops what it recomputes: ``core_attn`` the softmax statistics (fused attention keeps nothing
else), ``mla_up_proj`` the MLA q,k,v, ``mlp`` the dense fc1 output and fc2 input, ``moe`` the whole
MoE block (router, routed, shared), ``moe_act`` the routed fc2 inputs, ``shared_experts`` the shared
expert's fc1 output and fc2 input, ``layernorm`` the GEMM inputs the norms feed; ``full`` keeps
each layer's input (h*2/(tp*cp) per token) and adds one layer's full activations as the
recompute working set. MTP layers add their norms and the eh_proj input (5h*2). The loss stage
adds the final-norm and head inputs and, per head (1 + MTP layers), the bf16 logits and the fp32
softmax kept by vocab-parallel cross entropy: V_pad/tp * 6 B per token, for one micro-batch.

**Micro-batches in flight** on pipeline rank r (M micro-batches per step): no PP 1; 1F1B
min(pp - r, M); interleaved: Megatron's warm-up ``(pp - r - 1)*2 + (vpp - 1)*pp`` plus one,
capped at M*vpp; which chunks those virtual micro-batches belong to changes during the step, so
``inflight_compositions`` simulates the schedule and the heaviest live set sets the peak.

**CUDA-graph static buffers** (``cuda_graphs``; Megatron with ``Training.cuda_graphs``). Megatron
captures each layer's graphed scopes per micro-batch with Transformer Engine
(``TECudaGraphHelper`` in NVIDIA/Megatron-LM ``megatron/core/transformer/cuda_graphs.py``):
``_get_sample_arguments`` allocates static inputs per (layer, micro-batch) and hands a buffer to a
new forward only once the backward of the micro-batch that held it has run; TE's
``make_graphed_callables`` (``_reuse_graph_input_output_buffers=True`` from TE 2.7, set by that
helper) keeps each graph's static outputs until that micro-batch's backward and shares the grad
buffers. ``Graphed.forward`` copies the caller's tensor into the static input, which the captured
layer then saves for its backward (the activation terms above count it once); the caller's tensor,
the previous graph's static output, stays allocated too until the backward. So each graphed layer
holds, per micro-batch in flight on its chunk, one hidden-state buffer beyond the saved
activations: ``T*h*2/(tp*cp)`` bytes (bf16, sequence parallel). Graphed layers are the decoder and
MTP layers (NVIDIA's recipes graph attention, the MoE router and preprocessing, or whole dense
layers, in every layer).

**Expert imbalance** (``expert_imbalance``). Routing is balanced in the activation terms above;
the busiest expert GPU receives ``balance`` times the mean routed tokens (the factor the step-time
model uses, ``ExpertBalance.balance``; 1.0 by default, as the published runs force-balance), so
it holds ``(balance - 1)`` times the routed activations more.

**CPU activation offloading** (``Recipe.cpu_offload_layers`` = k; Megatron's
``--cpu-offloading-num-layers``, Megatron-Bridge ``model.cpu_offloading_num_layers``; megatron-core
allows it only with pp 1 and no recompute, so one micro-batch is in flight). Megatron wraps every
decoder layer of the block in Transformer Engine's offload context (``get_cpu_offload_context``;
transformer_engine/pytorch/cpu_offload.py, ``DefaultOffloadSynchronizer``, TE 2.10 and later):
layers 0 .. k-1 are offloaded; layer i's copy to the host starts with the forward of layer i+1 and
its HBM is released before the forward of layer L-k+i; its reload starts before the backward of
layer L-1-k+i. TE's docstring states the resulting peak of saved activations, ``(L - k) * T`` for L
layers of T bytes each, which a count of the live layers at every forward and backward step
confirms: the layer in flight is the one the released layer makes room for. So the estimate drops
the saved bytes of layers 0 .. k-1 (``offloaded_layer_bytes``) from the rank's activations; for
layers of one kind (Llama) this is TE's bound exactly; for mixed kinds it assumes the live set
weighs what the non-offloaded layers weigh. The pinned host buffers are host memory, not HBM. The
per-layer CUDA-graph buffers are not counted with offloading (megatron-core refuses per-layer graphs
with it). Not counted: TE's older code path (``NVTE_CPU_OFFLOAD_V1=1``, double buffering).

**Optimizer CPU offload** (``Recipe.optimizer_offload_fraction`` = f; Megatron's ``--optimizer-cpu-offload
--optimizer-offload-fraction f`` with ``--use-precision-aware-optimizer``; megatron-core 0.19.2
``optimizer/cpu_offloading/hybrid_optimizer.py``). ``HybridDeviceOptimizer._get_sub_optimizer_param_groups``
walks the rank's distributed-optimizer shard and moves parameters to the host until f of its elements are
there; for each it keeps, in host memory, the FP32 master (``param_update_in_fp32=True``) and torch's CPU AdamW
keeps both FP32 moments: 12 B; ``_set_sub_optimizer_grads`` adds a pinned FP32 gradient copy (4 B,
``pin_cpu_grads``) and the pinned BF16 clone made on the way (2 B, ``pin_cpu_params``) stays in PyTorch's
caching host allocator: ``HOST_BYTES_PER_PARAM`` = 18 B per offloaded parameter. On the GPU the optimizer term
keeps ``(1 - f)`` of its bytes (``gpu_optimizer_bytes``); weights and gradients stay. Host memory is a limit:
the ranks of a node (``gpus_per_node`` of the GPU catalog; each holds at most the worst rank's shard) must fit
in ``HOST_USABLE_SHARE`` of the node's memory (``GPUSpec.host_memory_gb``), the rest left to the OS, the data
loader workers and checkpoint staging (an assumption, not a measurement).

**Reserve**: 3 GiB (CUDA context ~0.6, NCCL communicators and buffers ~1.5, cuBLAS/TE
workspaces and MoE dispatcher buffers ~0.9) plus 5 % of the activations for allocator
fragmentation.

**Headroom** (not part of the estimate): plans must fit in the usable HBM, HBM less
``Training.memory_headroom`` (default ``5%``: the share of HBM kept for what is not modelled:
CUDA-graph private pools beyond the static buffers, routing imbalance of real (not force-balanced)
data, allocator fragmentation beyond 5 % of the activations); ``usable_hbm_gib``.

Not modelled: other activation offloading (Megatron-Bridge's MoE paged stash, megatron-core's
fine-grained activation offloading of chosen modules), partial full-recompute (``--recompute-num-layers`` below the stage's layer count), the
combined-1F1B schedule of overlapped expert communication (one more micro-batch in flight), non-flash attention, variable-length
packing, dataloader and checkpointing buffers, and the transient peak of the optimizer step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from planner.config import ParallelConfig, Training
from planner.errors import InputError
from planner.model.flops import LayerCost, layer_costs
from planner.model.spec import ModelSpec
from planner.model.pipeline import PipelineLayout, StageSpec, pipeline_layout
from planner.rules import effective_recipe, offload_layers, optimizer_offload, quantised_params
from planner.trainers import get_trainer

GIB = float(1 << 30)

# Bytes of one saved GEMM input, and of the quantised weight copies per weight, by precision.
ACT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8-block": 1.0 + 4.0 / 128, "mxfp8": 1.0 + 1.0 / 32, "nvfp4": 0.5 + 1.0 / 16}
WEIGHT_COPY_BYTES = {
    "bf16": 0.0,
    "fp8": 2.0,
    "fp8-block": 2.0 + 2 * 4.0 / (128 * 128),
    "mxfp8": 2.0 * (1.0 + 1.0 / 32),
    "nvfp4": 2.0 * (0.5 + 1.0 / 16),
}

RESERVE_GIB = 3.0
HOST_BYTES_PER_PARAM = 12.0 + 4.0 + 2.0   # FP32 master + two FP32 moments, pinned FP32 gradient, pinned BF16 clone
HOST_USABLE_SHARE = 0.8                    # of a node's host memory, for the offloaded optimizer (assumption)
GDN_CHUNK = 64   # fla's chunk_gated_delta_rule chunk length (its WY matrix A is [T, H, 64])
FRAGMENTATION = 0.05


@dataclass(frozen=True)
class MemoryOptions:
    """Trainer conventions the estimate depends on (bytes per value)."""

    grad_bytes: float = 2.0       # Megatron main_grad buffer: 4 (fp32, Megatron-LM default) or 2
    moment_bytes: float = 4.0     # each Adam moment (precision-aware optimizer: 2)
    master_bytes: float = 4.0     # fp32 master weights
    reserve_gib: float = RESERVE_GIB
    fragmentation: float = FRAGMENTATION


def options_for(training: Training, profile=None) -> MemoryOptions:
    """Defaults per trainer. Megatron: NVIDIA's Megatron-Bridge performance recipes (the runs in
    calibration.csv) set ``grad_reduce_in_fp32=False``, so gradients are bf16; Adam moments fp32.
    TorchTitan / MaxText keep fp32 weights and gradients (sharded); see ``memory_per_gpu``.
    A stack profile with fitted memory terms (``Profile.memory``, written by ``topoplan calibrate``
    from measured peaks, issue 13) replaces the reserve and the fragmentation share."""
    fit = getattr(profile, "memory", None)
    extra = {} if fit is None else {"reserve_gib": fit.reserve_gib, "fragmentation": fit.fragmentation}
    return MemoryOptions(grad_bytes=get_trainer(training.trainer).pricing.grad_bytes, **extra)


@dataclass(frozen=True)
class RankMemory:
    """One pipeline rank (all its virtual stages), in GiB."""

    rank: int
    layers: int
    weights: float
    weight_copies: float
    grads: float
    optimizer: float
    fsdp_buffers: float
    activations: float
    logits: float
    reserve: float
    inflight: tuple[int, ...]   # micro-batches in flight per chunk
    cuda_graphs: float = 0.0        # CUDA-graph static input/output buffers
    expert_imbalance: float = 0.0   # routed activations above the mean on the busiest expert GPU
    host: float = 0.0               # host memory of the offloaded optimizer (not HBM: not in total)

    @property
    def total(self) -> float:
        return (self.weights + self.weight_copies + self.grads + self.optimizer + self.fsdp_buffers
                + self.activations + self.expert_imbalance + self.cuda_graphs + self.logits + self.reserve)

    def components(self) -> dict[str, float]:
        return {
            "weights": self.weights,
            "weight_copies": self.weight_copies,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "fsdp_buffers": self.fsdp_buffers,
            "activations": self.activations,
            "expert_imbalance": self.expert_imbalance,
            "cuda_graphs": self.cuda_graphs,
            "logits": self.logits,
            "reserve": self.reserve,
        }


@dataclass(frozen=True)
class MemoryEstimate:
    """``per_stage``: one entry per pipeline rank; ``components``: the worst rank's terms (GiB)."""

    per_stage: tuple[RankMemory, ...]
    worst_rank: int
    components: dict[str, float] = field(default_factory=dict)
    host_gib_per_node: float = 0.0          # the offloaded optimizer's host memory on one node (GiB)
    host_usable_gib: float | None = None    # what a node offers it (None: no limit known, or nothing offloaded)

    @property
    def peak_gib(self) -> float:
        return self.per_stage[self.worst_rank].total

    @property
    def host_fits(self) -> bool:
        return self.host_usable_gib is None or self.host_gib_per_node <= self.host_usable_gib

    def fits(self, hbm_gib: float) -> bool:
        """True when the peak is at most ``hbm_gib`` (pass ``usable_hbm_gib(...)`` to keep headroom) and the
        offloaded optimizer's host memory fits its node (``host_fits``)."""
        return self.peak_gib <= hbm_gib and self.host_fits

    def stage_components(self) -> list[dict[str, float]]:
        """Every pipeline rank's components (GiB), rank order."""
        return [r.components() for r in self.per_stage]

    def to_dict(self) -> dict:
        return {
            "peak_gib": round(self.peak_gib, 3),
            "worst_rank": self.worst_rank,
            "components": {k: round(v, 3) for k, v in self.components.items()},
            "per_stage": [round(r.total, 3) for r in self.per_stage],
            **({"host_gib_per_node": round(self.host_gib_per_node, 3)} if self.host_gib_per_node else {}),
        }


# ----------------------------------------------------------------------------------------------
# Micro-batches in flight


def _warmup(pp: int, vpp: int, rank: int, m: int) -> int:
    """Megatron's warm-up forward count for the interleaved schedule (all of them when M == pp)."""
    total = m * vpp
    if m == pp:
        return total
    return min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)


def inflight_per_chunk(pp: int, vpp: int, rank: int, num_microbatches: int) -> list[int]:
    """Micro-batches in flight per model chunk at the first steady-state step (warm-up + 1):
    1F1B ``min(pp - rank, M)``; interleaved, virtual micro-batch k runs chunk ``(k // pp) % vpp``."""
    m = max(1, int(num_microbatches))
    if pp <= 1:
        return [1] * vpp
    if vpp <= 1:
        return [min(pp - rank, m)]
    total = m * vpp
    n = min(_warmup(pp, vpp, rank, m) + 1, total)
    if n == total:  # the whole step is warm-up: every micro-batch through every chunk
        return [m] * vpp
    group = min(pp, m)  # Megatron's microbatch_group_size_per_vp_stage (pp by default)
    counts = [0] * vpp
    for k in range(n):
        counts[(k // group) % vpp] += 1
    return counts


@lru_cache(maxsize=8192)
def inflight_compositions(pp: int, vpp: int, rank: int, num_microbatches: int) -> tuple[tuple[int, ...], ...]:
    """Every per-chunk count of live micro-batches that can be a memory peak on ``rank``.

    Simulates Megatron's interleaved schedule: W warm-up forwards, then one forward and one
    backward per step, then the cool-down backwards. Forward k runs chunk ``(k // g) % vpp`` and
    backward k chunk ``vpp - 1 - (k // g) % vpp`` of micro-batch ``(k // (g*vpp))*g + k % g``
    (``g = min(pp, M)``). Activations peak right after a forward; the compositions seen there
    repeat with period ``g*vpp``, so the simulation stops after one period of steady state.
    Returns the Pareto-maximal count vectors (1F1B and no-PP: one vector)."""
    m = max(1, int(num_microbatches))
    if pp <= 1 or vpp <= 1:
        return (tuple(inflight_per_chunk(pp, vpp, rank, m)),)
    g = min(pp, m)
    m_sim = -(-m // g) * g
    total = m_sim * vpp
    w = _warmup(pp, vpp, rank, m_sim)
    horizon = min(total, w + 2 * g * vpp)

    def mb(k: int) -> int:
        return (k // (g * vpp)) * g + k % g

    live: dict[tuple[int, int], None] = {}
    counts = [0] * vpp
    seen: set[tuple[int, ...]] = set()
    f = b = 0
    while f < horizon:
        c = (f // g) % vpp
        live[(mb(f), c)] = None
        counts[c] += 1
        f += 1
        seen.add(tuple(counts))
        if f > w and b < total:  # steady state: one backward after each forward
            cb = vpp - 1 - (b // g) % vpp
            del live[(mb(b), cb)]
            counts[cb] -= 1
            b += 1
    # the Pareto-maximal vectors: a vector another one covers has a smaller sum, and whatever covers it is
    # covered by a maximal one, so each vector (largest sum first) is checked against the maxima kept so far
    peaks: list[tuple[int, ...]] = []
    for v in sorted(seen, key=sum, reverse=True):
        if not any(all(x >= y for x, y in zip(o, v)) for o in peaks):
            peaks.append(v)
    return tuple(sorted(peaks, reverse=True))


# ----------------------------------------------------------------------------------------------
# Per-layer activation bytes per token (before dividing by the micro-batch token count)


def _attention_act_terms(model: ModelSpec, cfg: ParallelConfig, q: float) -> dict[str, float]:
    """Saved bytes per token of a softmax-attention mixer (module docstring)."""
    h, tp = model.hidden_size, cfg.tp
    t: dict[str, float] = {}
    n_h = model.num_attention_heads
    if model.attention == "mla":
        d_n, d_r, d_v = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
        q_r, kv_r = model.q_lora_rank or 0, model.kv_lora_rank
        t["attn_input"] = h * q  # gathered input of the duplicated down projections
        t["mla_latents"] = q_r * (2 + q) + (kv_r + d_r) * 2 + kv_r * q
        t["qkv"] = n_h * (2 * (d_n + d_r) + d_v) * 2 / tp
        t["attn_out"] = (n_h * d_v * q) / tp
        t["softmax_stats"] = n_h * 4 / tp
    else:
        d, n_kv = model.head_dim, model.num_kv_heads
        gate = n_h * d if model.attention_output_gate else 0
        t["attn_input"] = h * q / tp
        t["qkv"] = (n_h * d + 2 * n_kv * d + gate) * 2 / tp
        t["attn_out"] = n_h * d * q / tp
        t["softmax_stats"] = n_h * 4 / tp
    if model.dsa is not None:   # the indexer's q, k, weights (fp32) and top-k indices (int32), not split
        ix = model.dsa
        t["indexer"] = ix.n_heads * ix.head_dim * 2 + ix.head_dim * 2 + ix.n_heads * 4 + ix.topk * 4
    return t


def _recurrent_act_terms(model: ModelSpec, mixer: str, cfg: ParallelConfig, q: float, seq_len: int) -> dict[str, float]:
    """Saved bytes per token of a Gated DeltaNet or Mamba-2 mixer, heads split over TP. Neither kernel
    keeps its chunk states for the backward (both recompute them):

    * Gated DeltaNet (fla ``ChunkGatedDeltaRuleFunction.save_for_backward``: q, k, v, g, beta and the WY
      matrix A, [T, H, 64] in bf16): the in_proj input and output, the convolved q/k/v (bf16), A, g and
      beta (fp32) per value head, the rule's output (the gated norm's input) and the norm's output
      (out_proj input).
    * Mamba-2 (megatron-core's memory-efficient path, mamba_ssm ``MambaSplitConv1dScanCombinedFn``:
      zxbcdt, out_x, the norm's rstd; the convolution and states are recomputed): the in_proj input and
      output, the scan's output and the out_proj input.

    ``seq_len`` is unused: the saved bytes per token do not grow with the sequence."""
    h, tp = model.hidden_size, cfg.tp
    if mixer == "gdn":
        g = model.gdn
        return {"attn_input": h * q / tp,
                "recurrent": (g.in_width * 2 + g.conv_dim * 2 + g.num_value_heads * (GDN_CHUNK * 2 + 8)
                              + g.value_dim * 2) / tp,
                "attn_out": g.value_dim * q / tp}
    mb = model.mamba
    return {"attn_input": h * q / tp, "recurrent": (mb.in_width * 2 + mb.inner * 2) / tp,
            "attn_out": mb.inner * q / tp}


def _layer_act_terms(model: ModelSpec, c: LayerCost, cfg: ParallelConfig, q: float, seq_len: int = 0) -> dict[str, float]:
    """Saved activation bytes per token of the micro-batch, per GPU, by term."""
    h, tp, cp = model.hidden_size, cfg.tp, cfg.cp
    etp = cfg.etp_eff
    sp = tp  # sequence parallel with TP
    has_mlp = c.is_moe or c.mlp_dense > 0
    t: dict[str, float] = {"norms": ((c.mixer != "none") + has_mlp) * h * 2 / sp}
    if c.mixer == "attention":
        t.update(_attention_act_terms(model, cfg, q))
    elif c.mixer in ("gdn", "mamba"):
        t.update(_recurrent_act_terms(model, c.mixer, cfg, q, seq_len))
    glu = 2 if model.gated_mlp else 1
    if c.is_moe:
        t["router"] = (h * 2 + model.num_experts * 4 + model.top_k * 12) / sp
        if model.shared_ffn_hidden_size:
            fs = model.shared_ffn_hidden_size
            t["shared_input"] = h * q / sp
            t["shared"] = (glu * fs * 2 + fs * q) / tp
        f = model.moe_ffn_hidden_size
        copies = model.top_k * etp / (tp)  # per token of the micro-batch, per GPU (cp applied below)
        t["routed_input"] = copies * (h * q + 4)
        t["routed_fc1"] = copies * glu * f * 2 / etp
        t["routed_act"] = copies * f * q / etp
    elif has_mlp:
        f = model.ffn_hidden_size
        t["mlp_input"] = h * q / sp
        t["mlp"] = (glu * f * 2 + f * q) / tp
    if c.kind == "mtp":
        t["mtp"] = 5 * h * 2 / sp
    return {k: v / cp for k, v in t.items()}


_DROPS = {
    "core_attn": ("softmax_stats",),
    "mla_up_proj": ("qkv",),  # only for MLA (checked below)
    "mlp": ("mlp",),
    "moe": ("router", "shared_input", "shared", "routed_input", "routed_fc1", "routed_act"),
    "moe_act": ("routed_act",),
    "shared_experts": ("shared",),
    "layernorm": ("attn_input", "mlp_input", "shared_input"),
}


_ROUTED = ("routed_input", "routed_fc1", "routed_act")


def routed_activation_bytes(model: ModelSpec, c: LayerCost, cfg: ParallelConfig, training: Training) -> float:
    """Saved bytes per micro-batch of the routed-expert copies of one layer under cfg.recompute at
    balanced routing (0 for dense layers, and under ``full`` or ``moe`` recompute)."""
    if not c.is_moe or cfg.recompute == "full":
        return 0.0
    drop: set[str] = set()
    for mod in cfg.recompute_modules:
        drop.update(_DROPS[mod])
    terms = _layer_act_terms(model, c, cfg, ACT_BYTES[training.precision], training.seq_len)
    return sum(terms[k] for k in _ROUTED if k not in drop) * cfg.mbs * training.seq_len


def cuda_graph_bytes(model: ModelSpec, c: LayerCost, cfg: ParallelConfig, training: Training) -> float:
    """Static bytes one graphed layer keeps per micro-batch in flight beyond its saved activations
    (module docstring): one hidden-state buffer, ``T*h*2/(tp*cp)``."""
    return cfg.mbs * training.seq_len / (cfg.tp * cfg.cp) * model.hidden_size * 2.0


def graphs_apply(training: Training) -> bool:
    """CUDA-graph static buffers are counted for Megatron recipes that capture graphs per layer: not
    with CPU offloading, which megatron-core allows only beside full-iteration graphs
    (``planner.trainers.megatron.rules.OFFLOAD_GRAPH_MESSAGE``)."""
    if not training.cuda_graphs or not get_trainer(training.trainer).pricing.graph_buffers:
        return False
    return not (offload_layers(training) and training.recipe.cuda_graph_impl != "full_iteration")


def offloaded_layer_bytes(model: ModelSpec, config: ParallelConfig, training: Training) -> tuple[float, ...]:
    """Saved activation bytes per micro-batch, on one GPU, of each decoder layer whose activations
    Megatron offloads to the CPU (``Recipe.cpu_offload_layers`` = k: Transformer Engine offloads the
    block's layers 0 .. k-1; () when off). The one place the offloaded bytes are counted: the memory
    estimate removes them from HBM and the step-time term ``terms/offload.py`` moves them over the host
    link. Every saved tensor of such a layer is counted as offloaded (TE keeps on the GPU only tensors
    under 256 Ki elements, parameters and non-contiguous views: none of the per-token terms here)."""
    k = min(offload_layers(training), model.num_layers)
    if not k:
        return ()
    costs = [c for c in layer_costs(model, training.seq_len) if c.kind == "decoder"]
    return tuple(layer_activation_bytes(model, costs[i], config, training)[0] for i in range(k))


def state_bytes(opt: "MemoryOptions", master: bool) -> tuple[float, float, float]:
    """(weight, gradient, optimizer-state) bytes per parameter: Megatron keeps BF16 weights,
    ``opt.grad_bytes`` gradients and FP32 master weights + two Adam moments (the optimizer state is
    sharded over data parallel); TorchTitan / MaxText keep FP32 weights and gradients and two moments.
    ``master``: the trainer's ``Pricing.master_weights`` (planner.trainers)."""
    if master:
        return 2.0, opt.grad_bytes, opt.master_bytes + 2 * opt.moment_bytes
    return 4.0, 4.0, 2 * opt.moment_bytes


def gpu_optimizer_bytes(ob: float, offload: float) -> float:
    """Optimizer-state bytes per parameter of the shard that stay in HBM when the share ``offload`` of it
    lives on the host (Megatron's optimizer CPU offload): ``ob * (1 - offload)``. The one place the offload
    shrinks the GPU's optimizer state (the memory estimate and the search's memory bound call it)."""
    return ob * (1.0 - offload)


def host_bytes(shard_params: float, offload: float) -> float:
    """Host bytes of one rank's offloaded optimizer: ``offload`` of its ``shard_params`` parameters at
    ``HOST_BYTES_PER_PARAM`` each (module docstring)."""
    return HOST_BYTES_PER_PARAM * offload * shard_params


def host_usable_gib(gpu_spec) -> float:
    """GiB of a node's host memory the offloaded optimizer may fill: ``HOST_USABLE_SHARE`` of
    ``GPUSpec.host_memory_gb``."""
    return HOST_USABLE_SHARE * gpu_spec.host_memory_gb * 1e9 / GIB


def linear_weight_bytes(wb: float, quantised_params: bool) -> float:
    """Bytes per parameter of the high-precision weight a quantised linear layer keeps beside its quantised
    copy (``WEIGHT_COPY_BYTES``): ``wb`` (BF16, 2) normally; 0 with Megatron's FP8 or NVFP4 parameters
    (``--fp8-param-gather`` / ``--fp4-param-gather``, ``planner.rules.quantised_params``), where the
    parameter IS the quantised tensor (Transformer Engine's Float8Tensor / Float8BlockwiseQTensor /
    MXFP8Tensor / NVFP4Tensor, holding the row-wise and column-wise data the copy bytes count) and the FP32
    master weight lives in the distributed optimizer. The one place the BF16 weight of a linear layer is
    counted or dropped."""
    return 0.0 if quantised_params else wb


def fsdp_buffer_bytes(opt: "MemoryOptions", master: bool, weight_copy_bytes: float,
                      quantised_params: bool = False) -> float:
    """Bytes per parameter of FSDP's gathered buffers: the BF16 gathered weights (none with FP8 / NVFP4
    parameters: the gathered weight is the quantised one), their gradients and the low-precision
    weight copy."""
    _, gb, _ = state_bytes(opt, master)
    return linear_weight_bytes(2.0, quantised_params) + gb + weight_copy_bytes


def usable_hbm_gib(hbm_gib: float, training: Training) -> float:
    """HBM a plan may fill: ``hbm_gib`` less ``training``'s memory headroom."""
    return hbm_gib - training.headroom_gib(hbm_gib)


def layer_activation_bytes(model: ModelSpec, c: LayerCost, cfg: ParallelConfig, training: Training) -> tuple[float, float]:
    """(saved bytes per micro-batch under cfg.recompute, full bytes per micro-batch without
    recompute) for one layer on one GPU."""
    q = ACT_BYTES[training.precision]
    terms = _layer_act_terms(model, c, cfg, q, training.seq_len)
    tokens = cfg.mbs * training.seq_len
    full = sum(terms.values()) * tokens
    if cfg.recompute == "none":
        return full, full
    if cfg.recompute == "full":
        return model.hidden_size * 2 / (cfg.tp * cfg.cp) * tokens, full
    drop: set[str] = set()
    for mod in cfg.recompute_modules:
        if mod == "mla_up_proj" and model.attention != "mla":
            continue
        drop.update(_DROPS[mod])
    return sum(v for k, v in terms.items() if k not in drop) * tokens, full


# ----------------------------------------------------------------------------------------------
# Parameters per GPU


def _dup_attn_params(model: ModelSpec) -> int:
    """MLA parameters duplicated over TP: the down projections and latent norms."""
    if model.attention != "mla":
        return 0
    h = model.hidden_size
    q_r = model.q_lora_rank or 0
    return h * q_r + q_r + h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank


_SP_CACHE: dict = {}


def _stage_params(model: ModelSpec, stage: StageSpec, seq_len: int, tp: int, ep: int, etp: int):
    """(dense params, expert params, linear params that get quantised copies, largest layer's
    dense+expert params) on one GPU for one stage. A pure function of its arguments, cached by them
    (the frozen model hashes in under a microsecond), as the planner asks for the same stage under
    many layouts."""
    key = (model, stage, seq_len, tp, ep, etp)
    hit = _SP_CACHE.get(key)
    if hit is not None:
        return hit
    if len(_SP_CACHE) > 200_000:
        _SP_CACHE.clear()
    out = _SP_CACHE[key] = _stage_params_of(model, stage, seq_len, tp, ep, etp)
    return out


def _stage_params_of(model: ModelSpec, stage: StageSpec, seq_len: int, tp: int, ep: int, etp: int):
    costs = layer_costs(model, seq_len)
    costs_by_layer = [c for c in costs if c.kind == "decoder"]
    mtp_costs = [c for c in costs if c.kind == "mtp"]
    dup = _dup_attn_params(model)
    dense = expert = linear = 0.0
    biggest = 0.0
    layers = [costs_by_layer[i] for i in stage.layers] + list(mtp_costs[: stage.mtp])
    for c in layers:
        attn = dup + (c.attn_params - dup) / tp
        d = attn + c.mlp_dense_params / tp + c.shared_params / tp + c.norm_params + c.router_params + c.mtp_proj_params / tp
        e = math.ceil(c.n_experts / ep) * c.expert_params / etp if c.n_experts else 0.0
        dense += d
        expert += e
        linear += attn + c.mlp_dense_params / tp + c.shared_params / tp + e
        biggest = max(biggest, d + e)
    v = model.padded_vocab(tp) * model.hidden_size / tp
    if stage.embedding:
        dense += v
    if stage.loss:
        dense += model.hidden_size  # final norm
        if not (model.tied_embeddings and stage.embedding):
            dense += v  # output head (or the tied copy on the last stage)
        if stage.mtp and not stage.embedding:
            dense += v  # MTP needs the embedding on the last stage
    return dense, expert, linear, biggest


_CK_CACHE: dict = {}


def _chunk_kinds(chunk: StageSpec, dec, mtp) -> dict:
    """{(kind, is_moe, swa): (count, a layer of that kind)} of a chunk's layers, first seen first:
    layers of one kind have identical activations."""
    out: dict = {}
    for c in [dec[i] for i in chunk.layers] + mtp[: chunk.mtp]:
        k = (c.kind, c.is_moe, c.swa)
        n, first = out.get(k, (0, c))
        out[k] = (n + 1, first)
    return out


# ----------------------------------------------------------------------------------------------


def _logits_bytes_per_microbatch(model: ModelSpec, config: ParallelConfig, training: Training) -> float:
    """Bytes of the output head's activations per micro-batch on a rank holding the loss."""
    tp, cp = config.tp, config.cp
    v_local = model.padded_vocab(tp) / tp
    tokens = config.mbs * training.seq_len
    # per head: bf16 logits + fp32 softmax over the local vocabulary for the gathered sequence;
    # plus the final-norm input (sequence-parallel) and the gathered head input
    return (tokens / cp * v_local * 6.0 * (1 + model.mtp_layers)
            + tokens / (tp * cp) * model.hidden_size * 2 + tokens / cp * model.hidden_size * 2)


def _layer_activations(model, config, training, imbalanced: bool, graphs: bool):
    """``act(layer_cost)``: (saved, full, routed saved, CUDA-graph buffers) bytes per micro-batch of
    one layer, computed once per kind of layer (layers of one kind have identical activations)."""
    cache: dict[tuple, tuple[float, float, float, float]] = {}

    def act(c: LayerCost) -> tuple[float, float, float, float]:
        key = (c.kind, c.is_moe, c.swa)
        if key not in cache:
            saved, full = layer_activation_bytes(model, c, config, training)
            routed = routed_activation_bytes(model, c, config, training) if imbalanced else 0.0
            cache[key] = (saved, full, routed, cuda_graph_bytes(model, c, config, training) if graphs else 0.0)
        return cache[key]
    return act


def _chunk_activations(model, seq_len, chunk, dec, mtp, act, off_bytes) -> tuple[float, float, float, float]:
    """(saved, routed-imbalance, CUDA-graph, largest full-layer) activation bytes per micro-batch of
    one pipeline chunk; ``act(layer_cost)`` gives one layer's."""
    a = routed = graph = work = 0.0
    ck = (model, seq_len, chunk)
    kinds = _CK_CACHE.get(ck)
    if kinds is None:
        if len(_CK_CACHE) > 200_000:
            _CK_CACHE.clear()
        kinds = _CK_CACHE[ck] = tuple(_chunk_kinds(chunk, dec, mtp).values())
    for n_k, c in kinds:
        saved, full, rt, gb = act(c)
        a += n_k * saved
        routed += n_k * rt
        graph += n_k * gb
        work = max(work, full)
    if off_bytes:   # TE's CPU offload: the first k layers' activations wait in host memory
        a -= sum(off_bytes[i] for i in chunk.layers if i < len(off_bytes))
    return a, routed, graph, work


def _model_state(opt, master, fsdp, qparams, q, dense, expert, linear, biggest, d_dense, edp, offload=0.0):
    """(weights, low-precision weight copies, grads, optimizer, FSDP buffers) in bytes of one rank
    holding ``dense`` and ``expert`` parameters (``linear`` of them in GEMMs, ``biggest`` the largest
    layer), for the trainer's sharding (``master``: BF16 weights, FP32 masters in Megatron's distributed
    optimizer, sharded over data parallel; ``offload``: the share of that shard on the host)."""
    wb, gb, ob = state_bytes(opt, master)
    lin_drop = (wb - linear_weight_bytes(wb, qparams)) * linear   # FP8 / NVFP4 parameters: no BF16 linear weights
    if master and not fsdp:
        return (wb * (dense + expert) - lin_drop, q * linear, gb * (dense + expert),
                gpu_optimizer_bytes(ob, offload) * (dense / d_dense + expert / edp), 0.0)
    if master:
        return (wb * (dense / d_dense + expert / edp) - lin_drop / d_dense, q * linear / d_dense,
                gb * (dense / d_dense + expert / edp), ob * (dense / d_dense + expert / edp),
                2 * biggest * fsdp_buffer_bytes(opt, master, q, qparams))
    # TorchTitan / MaxText: fp32 params and grads, sharded when FSDP
    shard_d = d_dense if fsdp else 1
    shard_e = edp if fsdp else 1
    return (wb * (dense / shard_d + expert / shard_e), q * linear / shard_d, gb * (dense / shard_d + expert / shard_e),
            ob * (dense / shard_d + expert / shard_e),
            2 * biggest * fsdp_buffer_bytes(opt, master, q) if fsdp else 0.0)


def memory_per_gpu(
    model: ModelSpec,
    config: ParallelConfig,
    training: Training,
    world: int,
    gpu_spec=None,
    layout: PipelineLayout | None = None,
    options: MemoryOptions | None = None,
    expert_balance=None,
    recipe=None,
) -> MemoryEstimate:
    """Peak memory per GPU of ``config`` (see the module docstring for every formula).

    ``world`` sets the data-parallel degrees (dp = world / (tp*cp*pp), edp = world /
    (etp*ep*pp)) and, with ``training.global_batch``, the micro-batches per step. ``gpu_spec``: the HBM
    estimate does not depend on it; with the optimizer offloaded it gives the node's GPUs and host memory,
    which ``fits`` checks (without it the host is not checked).
    ``expert_balance``: busiest expert GPU / mean (a float or an ``ExpertBalance``; None = 1.0).
    ``recipe``: the effective recipe (``planner.rules.effective_recipe``) when the caller resolved it.
    """
    opt = options or options_for(training)
    pp, vpp, tp, cp = config.pp, config.vpp, config.tp, config.cp
    if layout is None:
        layout = pipeline_layout(model, pp, vpp, config.pp_first, config.pp_last, seq_len=training.seq_len)
    elif (layout.pp, layout.vpp) != (pp, vpp):
        raise InputError(f"pipeline layout has pp={layout.pp} vpp={layout.vpp} but the config has pp={pp} vpp={vpp}")
    dp = max(1, config.dp if config.dp is not None else config.dp_for(world))
    edp = max(1, config.edp_for(world))
    d_dense = dp * cp
    micro = max(1, math.ceil(training.global_batch / (config.mbs * dp)))

    costs = layer_costs(model, training.seq_len)
    dec = [c for c in costs if c.kind == "decoder"]
    mtp = [c for c in costs if c.kind == "mtp"]
    q = WEIGHT_COPY_BYTES[training.precision]
    master = get_trainer(training.trainer).pricing.master_weights
    qparams = quantised_params(recipe or effective_recipe(model, config, training))   # FP8 or NVFP4 parameters
    fsdp = config.fsdp
    graphs = graphs_apply(training)
    bal = 1.0 if expert_balance is None else float(getattr(expert_balance, "balance", expert_balance))
    bal = max(1.0, bal)

    act = _layer_activations(model, config, training, bal > 1.0, graphs)
    off_bytes = offloaded_layer_bytes(model, config, training)
    opt_off = optimizer_offload(training) if (master and not fsdp) else 0.0   # the rules allow it only so
    logits_per_mb = _logits_bytes_per_microbatch(model, config, training)

    ranks: list[RankMemory] = []
    for r in range(pp):
        dense, expert, linear, biggest, nlayers, work = 0.0, 0.0, 0.0, 0.0, 0, 0.0
        chunk_act: list[float] = []
        chunk_logits: list[float] = []
        chunk_routed: list[float] = []
        chunk_graph: list[float] = []
        for chunk in layout.for_rank(r):
            d, e, lin, big = _stage_params(model, chunk, training.seq_len, tp, config.ep, config.etp_eff)
            dense += d
            expert += e
            linear += lin
            biggest = max(biggest, big)
            nlayers += len(chunk.layers)
            a, routed, graph, full = _chunk_activations(model, training.seq_len, chunk, dec, mtp, act, off_bytes)
            work = max(work, full)
            chunk_act.append(a)
            chunk_routed.append(routed * (bal - 1.0))
            chunk_graph.append(graph)
            chunk_logits.append(logits_per_mb if chunk.loss else 0.0)
        # the heaviest set of live micro-batches the schedule produces on this rank
        comps = inflight_compositions(pp, vpp, r, micro)
        per_mb = [a + lg + rt + gb for a, lg, rt, gb in zip(chunk_act, chunk_logits, chunk_routed, chunk_graph)]
        inflight = max(comps, key=lambda v: sum(n * x for n, x in zip(v, per_mb)))
        acts = sum(n * a for n, a in zip(inflight, chunk_act))
        logits = sum(n * lg for n, lg in zip(inflight, chunk_logits))
        imbalance = sum(n * x for n, x in zip(inflight, chunk_routed))
        graph_buf = sum(n * x for n, x in zip(inflight, chunk_graph))
        if config.recompute == "full":
            acts += work  # one layer recomputed at a time during backward

        weights, copies, grads, optim, fsdp_buf = _model_state(opt, master, fsdp, qparams, q, dense, expert, linear,
                                                               biggest, d_dense, edp, opt_off)
        reserve = opt.reserve_gib * GIB + opt.fragmentation * (acts + imbalance + logits)
        ranks.append(
            RankMemory(
                rank=r,
                layers=nlayers,
                weights=weights / GIB,
                weight_copies=copies / GIB,
                grads=grads / GIB,
                optimizer=optim / GIB,
                fsdp_buffers=fsdp_buf / GIB,
                activations=acts / GIB,
                logits=logits / GIB,
                reserve=reserve / GIB,
                inflight=tuple(inflight),
                cuda_graphs=graph_buf / GIB,
                expert_imbalance=imbalance / GIB,
                host=host_bytes(dense / d_dense + expert / edp, opt_off) / GIB,
            )
        )
    return _estimate(ranks, opt_off, gpu_spec)


def _estimate(ranks: list[RankMemory], offload: float, gpu_spec) -> MemoryEstimate:
    """The estimate of the ranks: the worst one's peak and, with the optimizer offloaded, the host memory of
    a node whose every rank holds the worst rank's host share (pipeline stages may share a node)."""
    worst = max(range(len(ranks)), key=lambda i: ranks[i].total)
    host_node, host_cap = 0.0, None
    if offload:
        host_node = max(r.host for r in ranks) * (gpu_spec.gpus_per_node if gpu_spec is not None else 1)
        host_cap = host_usable_gib(gpu_spec) if gpu_spec is not None else None
    return MemoryEstimate(per_stage=tuple(ranks), worst_rank=worst, components=ranks[worst].components(),
                          host_gib_per_node=host_node, host_usable_gib=host_cap)


def expert_state_bytes_per_gpu(model: ModelSpec, config: ParallelConfig, training: Training, world: int) -> float:
    """Bytes of routed-expert state that one GPU (the heaviest pipeline rank) loads from a checkpoint:
    its expert parameters (``_stage_params``: ceil(experts / EP) experts per MoE layer, split by ETP)
    times the weight bytes plus the optimizer-state bytes sharded over expert data parallel
    (``state_bytes``; gradients are not checkpointed). What moves per GPU when the trainer's
    checkpoint loader re-shards the experts onto another EP / ETP / PP (``topoplan replan``)."""
    if not model.is_moe:
        return 0.0
    layout = pipeline_layout(model, config.pp, config.vpp, config.pp_first, config.pp_last, seq_len=training.seq_len)
    params = max(sum(_stage_params(model, st, training.seq_len, config.tp, config.ep, config.etp_eff)[1]
                     for st in layout.for_rank(r)) for r in range(config.pp))
    wb, _gb, ob = state_bytes(options_for(training), get_trainer(training.trainer).pricing.master_weights)
    return params * (wb + ob / max(1, config.edp_for(world)))
