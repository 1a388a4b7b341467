"""Megatron-LM's recipe settings: the ``planner.config.Recipe`` fields this package owns, each named as
megatron-core 0.19.2 names its flag (without the leading ``--``). ``planner.config.Recipe`` is assembled
from every trainer package's ``FIELDS`` (planner.trainers.RECIPE_FIELDS), so a Megatron flag is added here,
next to the rules that judge it (``rules``), the emitter that writes it (``emit``) and the read-back
(``readback``): docs/architecture.md, "Adding a recipe flag".
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

# megatron-core 0.19.2 CudaGraphModule names (--cuda-graph-modules); empty = the whole layer.
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")


def _graph_modules(v):
    if v is None:
        return None
    items = v.replace(",", " ").split() if isinstance(v, str) else list(v)
    bad = [x for x in items if x not in CUDA_GRAPH_MODULES]
    if bad:
        raise ValueError(f"unknown CUDA graph module {bad[0]!r}; use {', '.join(CUDA_GRAPH_MODULES)}")
    return tuple(x for x in CUDA_GRAPH_MODULES if x in items)


FIELDS = {
    "cuda_graph_impl": (Literal["none", "local", "transformer_engine", "full_iteration"] | None, Field(
        None, description="--cuda-graph-impl; None = transformer_engine where the layout allows graphs, else none")),
    "cuda_graph_modules": (Annotated[tuple[str, ...] | None, BeforeValidator(_graph_modules)], Field(
        None, description="--cuda-graph-modules (attn, mlp, moe, moe_router, moe_preprocess); () = whole layer; "
                          "None = attn+moe_router+moe_preprocess (MoE) / attn+mlp (dense), less what the layout forbids")),
    "overlap_moe_expert_parallel_comm": (bool | None, Field(
        None, description="--overlap-moe-expert-parallel-comm (1F1B all-to-all overlap); priced with ep.overlap, "
                          "0 when off")),
    "delay_wgrad_compute": (bool | None, Field(None, description="--delay-wgrad-compute (needs the all-to-all overlap)")),
    "tp_comm_overlap": (bool | None, Field(None, description="--tp-comm-overlap (needs sequence parallelism, TP > 1); "
                                                           "priced with tp.overlap, 0 when off")),
    "moe_permute_fusion": (bool, Field(True, description="--moe-permute-fusion")),
    "moe_router_fusion": (bool, Field(True, description="--moe-router-fusion")),
    "cross_entropy_loss_fusion": (bool, Field(True, description="--cross-entropy-loss-fusion (impl native)")),
    "moe_router_enable_expert_bias": (bool | None, Field(
        None, description="--moe-router-enable-expert-bias (aux-loss-free routing); None = the model's routing "
                          "(DeepSeek-V3 / Kimi-K2 noaux_tc)")),
    "fsdp_impl": (Literal["megatron", "torch"], Field("megatron", description="FSDP flavour when the layout shards "
                                                    "parameters: megatron (--use-megatron-fsdp) | torch (--use-torch-fsdp2)")),
    "cpu_offload_layers": (int | None, Field(
        None, ge=0, description="--cpu-offloading-num-layers: the first N decoder layers keep their saved activations "
                                "in host memory between forward and backward (Transformer Engine's CPU offload; "
                                "Megatron-Bridge model.cpu_offloading*); None or 0 = off. Megatron only, with pp 1, "
                                "no recompute, N < num_layers and no per-layer CUDA graphs (planner.rules); priced "
                                "by planner.cost.memory and planner/cost/terms/offload.py")),
    "fp8_param_gather": (bool | None, Field(
        None, description="--fp8-param-gather (with MXFP8 and the distributed optimizer also "
                          "--reuse-grad-buf-for-mxfp8-param-ag): the parameters of the linear layers are the FP8 / "
                          "MXFP8 tensors (no BF16 copy; FP32 master weights stay in the optimizer) and the "
                          "data-parallel all-gather moves FP8 (tensorwise, blockwise) or BF16 through the gradient "
                          "buffer (MXFP8). None = as NVIDIA's Megatron-Bridge performance recipes: on for fp8 and "
                          "mxfp8, off for fp8-block, nvfp4 and bf16 and where the layout forbids it (planner.rules); "
                          "Megatron only")),
    "fp4_param_gather": (bool | None, Field(
        None, description="--fp4-param-gather: the parameters of the linear layers are Transformer Engine's NVFP4 "
                          "tensors (no BF16 copy; FP32 master weights stay in the optimizer) and the data-parallel "
                          "all-gather moves the packed 4-bit row-wise data (0.5 B per parameter). None = as NVIDIA's "
                          "Megatron-Bridge bf16_with_nvfp4_mixed: on for nvfp4, off otherwise; True needs nvfp4 "
                          "(planner.rules). Megatron only; the FP8 precisions use fp8_param_gather")),
    "optimizer_offload_fraction": (float | None, Field(
        None, ge=0.0, le=1.0, description="--optimizer-cpu-offload --optimizer-offload-fraction F (with "
                                          "--use-precision-aware-optimizer, which megatron-core requires): the first "
                                          "F of each rank's distributed-optimizer shard keeps its FP32 master weights "
                                          "and Adam moments in host memory and is updated by torch's CPU Adam "
                                          "(megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py). None = auto: "
                                          "off, unless no layout fits in HBM without it (topoplan plan then chooses "
                                          "the smallest of 0.25, 0.5, 0.75, 1.0 that fits); 0 = off. Megatron only, "
                                          "distributed optimizer (no FSDP), no FP8 parameters (planner.rules); priced "
                                          "by planner.cost.memory (HBM and host) and planner/cost/terms/cpu_optimizer.py")),
    "overlap_cpu_optimizer_d2h_h2d": (bool | None, Field(
        None, description="--overlap-cpu-optimizer-d2h-h2d: the offloaded optimizer copies gradients to the host, "
                          "steps on the CPU and copies parameters back on side streams, one parameter after "
                          "another, so the three overlap. None = on whenever optimizer_offload_fraction > 0")),
    "fp8_recipe": (Literal["delayed", "tensorwise"] | None, Field(
        None, description="--fp8-recipe of precision fp8 (per-tensor FP8): delayed (Transformer Engine's "
                          "DelayedScaling, megatron-core's default and NeMo 2's bf16_with_fp8_mixed: every micro-batch "
                          "all-reduces the amax of each model chunk over tensor x data x context parallel ranks, "
                          "planner/cost/terms/fp8_scaling.py) or tensorwise (current scaling, as Megatron-Bridge's "
                          "bf16_with_fp8_current_scaling_mixed). None = tensorwise, what topoplan writes; "
                          "needs precision fp8 (planner.rules). Megatron only")),
}

# Each field as a trainer without the knob runs it (planner.trainers.RECIPE_OFF): the effective recipe of
# TorchTitan and MaxText holds these values.
OFF = {"cuda_graph_impl": "none", "cuda_graph_modules": (), "overlap_moe_expert_parallel_comm": False,
       "delay_wgrad_compute": False, "tp_comm_overlap": False, "moe_permute_fusion": False, "moe_router_fusion": False,
       "cross_entropy_loss_fusion": False, "moe_router_enable_expert_bias": False, "fsdp_impl": "megatron",
       "cpu_offload_layers": None, "fp8_param_gather": False, "fp4_param_gather": False,
       "optimizer_offload_fraction": None, "overlap_cpu_optimizer_d2h_h2d": False, "fp8_recipe": None}

