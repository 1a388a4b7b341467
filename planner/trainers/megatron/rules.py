"""Megatron-LM's own rules (megatron-core 0.19.2) and its effective recipe.

Layout rules beyond the shared ones (``planner.rules``): the expert grid, ETP on dense models, expert biases
with ETP, the interleaved schedule's micro-batch checks. Recipe settings (planner.config.Recipe):
megatron-core 0.19.2's rules that tie CUDA graphs, the all-to-all overlap, TP overlap, expert bias, CPU
offloading and FP8/FP4 parameters to the layout (validate_args and TransformerConfig.__post_init__;
combined_1f1b.py and transformer_layer.py for the runtime ones). Each predicate returns why a setting cannot
be on for the layout (None: it can). A setting the user *required* (an explicit True) that a predicate
forbids is a broken rule; an auto setting (None) is switched off for that layout by ``effective_recipe``,
and the step time prices that.
"""

from __future__ import annotations

from planner.config import Recipe
from planner.rules import (SHARED_DEGREES, SHARED_HEADS_EXPERTS, SHARED_SCHEDULE, Rule, aux_loss_free, num_microbatches,
                           offload_layers, optimizer_offload, optimizer_offload_overlap)
from planner.trainers import RECIPE_OFF
from planner.trainers.megatron import NAME


def _kv_heads_tp_megatron(m, c, t, world):
    # megatron-core 0.19.2 transformer_config.py: the KV groups are split over TP, or each TP rank
    # holds a replica of one group (TP a multiple of the groups, as AWS's Qwen3 TP8 runs use)
    if m.num_kv_heads % c.tp and c.tp % m.num_kv_heads:
        return (f"num_query_groups ({m.num_kv_heads}) must be a multiple or divisor of "
                f"tensor_model_parallel_size ({c.tp})")


def _expert_grid(m, c, t, world):
    g = c.etp_eff * c.ep * c.pp
    if world % g:
        return (f"world_size ({world}) is not divisible by expert_tensor_model_pipeline_parallel size ({g}) "
                f"[etp({c.etp_eff}) * ep({c.ep}) * pp({c.pp})]")


def _etp_only_for_moe(m, c, t, world):
    if c.etp is not None and c.etp != c.tp and not m.num_experts:
        return f"expert_tensor_parallel_size ({c.etp}) is set on a dense model"


# topoplan emits no --microbatch-group-size-per-virtual-pipeline-stage, so megatron-core's
# ModelParallelConfig.__post_init__ sets it to PP (the depth-first schedule the step-time model prices).
MEGATRON_MICROBATCH_GROUP: int | None = None


def megatron_interleaved_problem(pp: int, m: int, group: int | None = None) -> str | None:
    """megatron-core 0.19.2's first-step checks of the interleaved schedule, written out
    (pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving), for PP ranks,
    M micro-batches and N = ``group`` contiguous micro-batches per virtual stage (None: N = PP):
    PP <= N <= M (ValueError), and the last group M % N is 0 or at least PP (RuntimeError).
    With N = PP both say: M >= PP and M % PP == 0."""
    n = pp if group is None else group
    if n > m or n < pp:
        return (f"The number of contiguous micro-batches in a virtual pipeline stage should range in "
                f"[PP={pp} , M={m}] (N={n}; M = global batch / (micro batch * data parallel))")
    final = m % n
    if 0 < final < pp:
        return (f"The remainder of M (the total micro-batches, {m}) divided by N (number of contiguous "
                f"micro-batches in a virtual pipeline stage, {n}) should be 0, or larger than or equal to "
                f"the pipeline-parallel size ({pp}), but it is {final}")
    return None


def _mg_interleaved(m, c, t, world):
    # Only the interleaved schedule checks M; the plain 1F1B schedule (vpp 1) runs any M >= 1.
    if c.pp < 2 or c.vpp < 2:
        return None
    mb = num_microbatches(c, t, world)
    if mb is None:
        return None
    msg = megatron_interleaved_problem(c.pp, mb, MEGATRON_MICROBATCH_GROUP)
    if msg:
        unit = c.pp * c.mbs * c.dp_for(world)
        msg += f"; use a global batch that is a multiple of pp*mbs*dp = {unit}, fewer data-parallel replicas, or vpp 1"
    return msg


def _moe_bias_etp1(m, c, t, world):
    # megatron-core TransformerConfig: "Bias in Moe is only supported when ETP==1" (GPT-OSS expert biases)
    if m.num_experts and getattr(m, "mlp_bias", False) and c.etp_eff != 1:
        return (f"Bias in Moe is only supported when ETP==1: expert_tensor_parallel_size is {c.etp_eff} "
                "(set etp=1 for a model with expert biases)")


# The partial scope NVIDIA's perf recipes capture for dropless MoE models, and for dense models.
GRAPH_MODULES_MOE = ("attn", "moe_router", "moe_preprocess")
GRAPH_MODULES_DENSE = ("attn", "mlp")


def _has_dense_layers(m) -> bool:
    layers = getattr(m, "moe_layers", ()) or ()
    return not m.num_experts or not all(layers)


# megatron-core 0.19.2's checks of CPU offloading (cpu_offloading is set by megatron/training/arguments.py:1869-1870
# when --cpu-offloading-num-layers > 0), in megatron/core/transformer/transformer_config.py
# TransformerConfig.__post_init__, in its order: 1707-1712 the layer bound, 1714-1717 pipeline parallelism,
# 1719-1722 recompute; 2465-2468 CUDA graphs (only full_iteration graphs coexist with offloading).
OFFLOAD_GRAPH_MESSAGE = "CUDA graphs not supported with CPU offloading."


def _offload_problem(m, c, t) -> str | None:
    k = offload_layers(t)
    if not k:
        return None
    if k < 0 or k >= m.num_layers:
        return f"CPU offloading can be done only for layers less than {m.num_layers} (cpu_offload_layers={k})"
    if c.pp > 1:
        return f"Currently there is no support for Pipeline parallelism with CPU offloading (pp={c.pp})"
    if c.recompute != "none":
        return f"CPU offloading does not work when activation recomputation is enabled (recompute={c.recompute})"
    return None


# Optimizer CPU offload (--optimizer-cpu-offload, --optimizer-offload-fraction; megatron-core 0.19.2). Its checks:
# megatron/training/arguments.py:1803-1811 (validate_args) -- it needs --use-precision-aware-optimizer, which the
# emitter always writes beside it, and --fp8-param-gather only with --fp8-recipe delayed, which no topoplan precision
# emits (tensorwise, blockwise, mxfp8: _fp8_param_problem below); optimizer_config.py:455-457 -- the
# precision-aware optimizer needs the distributed optimizer; optimizer/__init__.py:510-512 -- AdamW mode
# (decoupled_weight_decay, megatron's default). The distributed optimizer wraps the HybridDeviceOptimizer
# (distrib_optimizer.py:778-781); topoplan prices the offload on that path only, not under FSDP.
OPTIMIZER_OFFLOAD_FP8_MESSAGE = ("When `--fp8-param-gather` is enabled, the optimizer cpu offload must be used in "
                                 "conjunction with `--fp8-recipe delayed`.")


def _optimizer_offload_problem(m, c, t) -> str | None:
    if not optimizer_offload(t):
        return None
    if c.fsdp:
        return ("optimizer CPU offload (optimizer_offload_fraction) is planned with the distributed optimizer only "
                "(megatron-core wraps its HybridDeviceOptimizer in DistributedOptimizer); this layout shards "
                "parameters with FSDP: set optimizer_offload_fraction 0 or use a layout without FSDP")
    return None


# FP8 parameter gather (--fp8-param-gather; megatron/training/argument_utils.py:312 sets TransformerConfig.fp8_param
# from it). Auto follows NVIDIA's Megatron-Bridge performance recipes (Megatron-Bridge@c810129341a8 = v0.4.2,
# scripts/performance/utils/precision.py:26-44
# get_precision_config, src/megatron/bridge/training/mixed_precision.py): fp8_cs -> bf16_with_fp8_current_scaling_mixed
# (:291-309, fp8_param_gather=True), fp8_mx -> bf16_with_mxfp8_mixed (:261-272, fp8_param_gather=True and
# reuse_grad_buf_for_mxfp8_param_ag=True), fp8_sc -> bf16_with_fp8_subchannel_scaling_mixed (:379-391, False),
# nvfp4 -> bf16_with_nvfp4_mixed (:411-423, fp8_param_gather=False, fp4_param_gather=True: below), bf16 off.
# Only Kimi-K2 with the Muon optimizer turns it off (scripts/performance/configs/kimi/kimi_llm_pretrain.py:35-44);
# topoplan prices Adam.
FP8_PARAM_GATHER_AUTO = frozenset({"fp8", "mxfp8"})
FP8_PARAM_PRECISIONS = frozenset({"fp8", "fp8-block", "mxfp8"})


def _fp8_param_problem(m, c, t) -> str | None:
    """megatron-core 0.19.2's checks of --fp8-param-gather, in megatron/training/arguments.py validate_args unless
    named: transformer_config.py:1439-1440 needs an FP8 recipe; 1017-1022 torch FSDP2 turns it off (a plan
    that says it runs would lie); 1060-1062 needs the distributed optimizer or an FSDP, which every layout topoplan
    emits has (--use-distributed-optimizer / --use-megatron-fsdp)."""
    if t.precision not in FP8_PARAM_PRECISIONS:
        return f"fp8_param must be used together with fp8 mode (precision {t.precision}; use fp8, fp8-block or mxfp8)"
    if optimizer_offload(t):   # arguments.py:1808-1811; topoplan's FP8 precisions emit no delayed recipe
        return (f"{OPTIMIZER_OFFLOAD_FP8_MESSAGE} (optimizer_offload_fraction={optimizer_offload(t):g}; precision "
                f"{t.precision} runs no delayed-scaling recipe: set fp8_param_gather false)")
    if c.fsdp and t.recipe.fsdp_impl == "torch":
        return ("FSDP2 FP8 param gather is not supported yet in TE 2.0, will fallback to bf16all_gather instead, "
                "turning off fp8_param_gather (--use-torch-fsdp2)")
    return None


# FP4 parameter gather (--fp4-param-gather; megatron/training/argument_utils.py:313 sets TransformerConfig.fp4_param
# from it; its help: "Keep the compute param in fp4 (do not use any other intermediate dtype) and perform the param
# all-gather in fp4."). Auto follows the same precision configs: nvfp4 -> bf16_with_nvfp4_mixed (mixed_precision.py:
# 411-423 at c810129341a8, fp4_param_gather=True); every other precision has no FP4 parameters.
FP4_PARAM_GATHER_AUTO = frozenset({"nvfp4"})


def fp8_param_gather_on(m, c, t) -> bool:
    """Whether Megatron keeps the linear layers' parameters in FP8 for ``c`` (``Recipe.fp8_param_gather``
    resolved: an explicit value as given, auto per precision as NVIDIA's recipes and off where the layout forbids
    it). The one resolution that memory, step time and the emitters read (False for other trainers)."""
    if t.trainer != NAME:
        return False
    v = getattr(t.recipe, "fp8_param_gather", None)
    if v is None:
        return t.precision in FP8_PARAM_GATHER_AUTO and _fp8_param_problem(m, c, t) is None
    return bool(v)


def _fp4_param_problem(m, c, t) -> str | None:
    """megatron-core 0.19.2's checks of --fp4-param-gather (megatron/training/arguments.py validate_args unless
    named): 1069-1070 and transformer_config.py:1451-1452 need FP4 mode (--fp4-format, topoplan's nvfp4). Torch
    FSDP2 keeps it (1024-1029 turn it off only below Transformer Engine 2.7.0.dev0, which --fp4-format itself refuses,
    1072-1073), and it needs no distributed optimizer, so the layout never turns it off."""
    if t.precision not in FP4_PARAM_GATHER_AUTO:
        return (f"--fp4-param-gather must be used together with --fp4-format (precision {t.precision}; use nvfp4, "
                "or recipe.fp8_param_gather for the FP8 precisions)")
    return None


def fp4_param_gather_on(m, c, t) -> bool:
    """Whether Megatron keeps the linear layers' parameters in NVFP4 (``Recipe.fp4_param_gather`` resolved: an
    explicit value as given, auto on for nvfp4 as NVIDIA's bf16_with_nvfp4_mixed; False for other trainers)."""
    if t.trainer != NAME:
        return False
    v = getattr(t.recipe, "fp4_param_gather", None)
    if v is None:
        return t.precision in FP4_PARAM_GATHER_AUTO and _fp4_param_problem(m, c, t) is None
    return bool(v)


def reuse_grad_buf_for_mxfp8(m, c, t) -> bool:
    """--reuse-grad-buf-for-mxfp8-param-ag: with MXFP8 parameters the all-gather goes through the gradient buffer
    (Megatron-Bridge mixed_precision.py:106-111 requires it with fp8_param_gather and mxfp8; megatron-core
    arguments.py:1114 turns it off under Megatron-FSDP, distributed_data_parallel_config.py:253-254 needs
    fp8_param_gather)."""
    return t.precision == "mxfp8" and fp8_param_gather_on(m, c, t) and not c.fsdp


def _graphs_problem(m, c, t, impl) -> str | None:
    if impl in (None, "none"):
        return None
    if offload_layers(t) and impl != "full_iteration":
        return OFFLOAD_GRAPH_MESSAGE
    if c.recompute == "full" and impl != "full_iteration":
        return "full recompute is only supported with full iteration CUDA graph."
    return None


def _modules_problem(m, c, t, impl, modules) -> str | None:
    if impl in (None, "none"):
        return None
    if impl == "full_iteration":
        return "--cuda-graph-modules must be empty when --cuda-graph-impl=full_iteration." if modules else None
    mods = set(modules)
    if "moe" in mods and "moe_router" in mods:
        return "cuda_graph_modules must not contain both moe and moe_router."
    if "moe_preprocess" in mods and "moe_router" not in mods:
        return "moe_preprocess cuda graph is only supported with moe_router cuda graph."
    if not m.num_experts and mods & {"moe", "moe_router"}:
        return "moe cuda graph is only supported for MoE."
    if m.num_experts and "mlp" in mods and not _has_dense_layers(m):
        return "mlp cuda graph is only supported for dense layers, but not found in the model."
    if m.num_experts and "moe" in mods:
        return "moe cuda graph is only supported with drop-padding MoE."
    if impl == "transformer_engine" and "moe" in c.recompute_modules and "moe_router" in mods:
        return "moe recompute is not supported with moe_router CUDA graph with: --cuda-graph-impl transformer_engine."
    return None


def _a2a_overlap_problem(m, c, t, impl, modules) -> str | None:
    if not m.num_experts or c.ep < 2:
        return "overlap_moe_expert_parallel_comm is only supported with expert model parallelism"
    if c.dispatcher is not None and c.dispatcher not in ("alltoall", "flex-deepep", "flex-hybridep"):
        return "overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher"
    if c.recompute == "full":
        return "disable full recomputation when enabling overlap_moe_expert_parallel_comm"
    if "moe" in c.recompute_modules:
        return "disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm"
    if c.pp > 1 and c.vpp < 2:
        return ("If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified when "
                f"pipeline_model_parallel_size > 1 (pp={c.pp}, vpp=1)")
    if (getattr(m, "mtp_layers", 0) or 0) > 1:
        return "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm."
    if c.fsdp and c.vpp > 1:
        return "EP overlap 1F1B with FSDP is not supported for interleaved pipeline parallelism"
    if impl in ("local", "transformer_engine") and (not modules or {"moe", "mlp"} & set(modules)):
        return "EP overlap must be disabled when CUDA graph captures the whole MLP/MoE part."
    return None


def _delay_wgrad_problem(m, c, t, a2a, impl, modules) -> str | None:
    if not a2a:
        return "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute"
    if impl in ("local", "transformer_engine") and "attn" in modules and (
            getattr(m, "attention_bias", False) or getattr(m, "mlp_bias", False)):
        return "CUDA graph with delay_wgrad_compute doesn't support attn bias for now."
    return None


def _tp_overlap_problem(m, c, t) -> str | None:
    if c.tp < 2:
        return ("Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled "
                f"(tp={c.tp}: Megatron turns sequence parallelism off)")
    return None


def _expert_bias_problem(m, c, t) -> str | None:
    if not m.num_experts:
        return "--moe-router-enable-expert-bias needs a MoE model"
    if not aux_loss_free(m):
        return ("Expert bias for aux-loss-free routing only supports 'sigmoid' and 'sqrtsoftplus' score functions "
                f"({m.name} routes without it)")
    return None


def _torch_fsdp2_problem(m, c, t) -> str | None:
    if c.pp > 1:
        return "--use-torch-fsdp2 is not supported with pipeline parallelism"
    if c.ep > 1:
        return "--use-torch-fsdp2 is not supported with expert parallelism"
    if getattr(m, "tied_embeddings", False):
        return "--use-torch-fsdp2 needs --untie-embeddings-and-output-weights (the model ties them)"
    return None


def _graph_setting(m, c, t):
    """(impl, modules) as the layout runs them: an explicit impl stays (its rules judge it), auto
    is transformer_engine where the layout allows graphs, else none."""
    r = t.recipe
    impl = r.cuda_graph_impl
    if impl is None:
        impl = "transformer_engine"
        if _graphs_problem(m, c, t, impl):
            impl = "none"
    if impl == "none":
        return impl, ()
    if r.cuda_graph_modules is not None or impl == "full_iteration":
        return impl, tuple(r.cuda_graph_modules or ())
    mods = list(GRAPH_MODULES_MOE if m.num_experts else GRAPH_MODULES_DENSE)
    if impl == "transformer_engine" and "moe" in c.recompute_modules:
        mods = [x for x in mods if x not in ("moe_router", "moe_preprocess")]
    return impl, tuple(mods)


def _auto(value, problem) -> bool:
    return (problem is None) if value is None else bool(value)


def effective_recipe(model, config, training) -> Recipe:
    """The recipe as Megatron runs ``config`` (``planner.rules.effective_recipe``): auto settings on where
    its rules allow them, MoE fusions only on MoE models, the FSDP flavour only with FSDP."""
    m, c, t = model, config, training
    r = t.recipe
    impl, modules = _graph_setting(m, c, t)
    a2a = _auto(r.overlap_moe_expert_parallel_comm, _a2a_overlap_problem(m, c, t, impl, modules))
    moe = bool(m.num_experts)
    own = dict(
        cuda_graph_impl=impl, cuda_graph_modules=modules, overlap_moe_expert_parallel_comm=a2a,
        delay_wgrad_compute=_auto(r.delay_wgrad_compute, _delay_wgrad_problem(m, c, t, a2a, impl, modules)),
        tp_comm_overlap=_auto(r.tp_comm_overlap, _tp_overlap_problem(m, c, t)),
        moe_permute_fusion=bool(r.moe_permute_fusion and moe),
        moe_router_fusion=bool(r.moe_router_fusion and moe),
        cross_entropy_loss_fusion=bool(r.cross_entropy_loss_fusion),
        moe_router_enable_expert_bias=_auto(r.moe_router_enable_expert_bias, _expert_bias_problem(m, c, t)),
        fsdp_impl=r.fsdp_impl if c.fsdp else "megatron",
        cpu_offload_layers=offload_layers(t) or None,
        fp8_param_gather=fp8_param_gather_on(m, c, t),
        fp4_param_gather=fp4_param_gather_on(m, c, t),
        optimizer_offload_fraction=optimizer_offload(t) or None,
        overlap_cpu_optimizer_d2h_h2d=optimizer_offload_overlap(t),
        fp8_recipe=(r.fp8_recipe or "tensorwise") if t.precision == "fp8" else None,
    )
    return Recipe(**{**RECIPE_OFF, **own})   # the other trainers' settings off


def _explicit(name):
    """``Rule.applies`` of a rule on a recipe setting: it reads the layout only when the recipe asks for
    the setting explicitly (True); auto (None) and False pass every layout."""
    def applies(m, t) -> bool:
        return getattr(t.recipe, name) is True
    return applies


def _graphs_set(m, t) -> bool:
    return t.recipe.cuda_graph_impl not in (None, "none")


def _r_graphs(m, c, t, world):
    return _graphs_problem(m, c, t, t.recipe.cuda_graph_impl)


def _r_graph_modules(m, c, t, world):
    impl, modules = _graph_setting(m, c, t)
    return _modules_problem(m, c, t, impl, modules)


def _r_a2a_overlap(m, c, t, world):
    impl, modules = _graph_setting(m, c, t)
    return _a2a_overlap_problem(m, c, t, impl, modules)


def _r_delay_wgrad(m, c, t, world):
    e = effective_recipe(m, c, t)
    return _delay_wgrad_problem(m, c, t, e.overlap_moe_expert_parallel_comm, e.cuda_graph_impl,
                                e.cuda_graph_modules)


def _r_tp_overlap(m, c, t, world):
    return _tp_overlap_problem(m, c, t)


def _r_expert_bias(m, c, t, world):
    return _expert_bias_problem(m, c, t)


def _r_torch_fsdp2(m, c, t, world):
    if c.fsdp and t.recipe.fsdp_impl == "torch":
        return _torch_fsdp2_problem(m, c, t)


def _r_cpu_offload(m, c, t, world):
    return _offload_problem(m, c, t)


def _r_optimizer_offload(m, c, t, world):
    return _optimizer_offload_problem(m, c, t)


def _r_fp8_param_gather(m, c, t, world):
    return _fp8_param_problem(m, c, t)


def _r_fp4_param_gather(m, c, t, world):
    return _fp4_param_problem(m, c, t)


def _r_fp8_recipe(m, c, t, world):
    """--fp8-recipe delayed / tensorwise are the per-tensor FP8 recipes (megatron-core 0.19.2 fp8_utils.py
    get_fp8_recipe); fp8-block, mxfp8 and nvfp4 name their own recipe, bf16 none."""
    if t.recipe.fp8_recipe is not None and t.precision != "fp8":
        return (f"recipe.fp8_recipe={t.recipe.fp8_recipe} is a per-tensor FP8 recipe, but the precision is "
                f"{t.precision}; use precision fp8 or leave fp8_recipe unset")


# the recipe rules, in the order they are checked (after the layout rules)
RECIPE_RULES: tuple[Rule, ...] = (
    Rule("fp8_param_gather_recipe", _r_fp8_param_gather, _explicit("fp8_param_gather")),
    Rule("fp4_param_gather_recipe", _r_fp4_param_gather, _explicit("fp4_param_gather")),
    Rule("cpu_offloading_layout", _r_cpu_offload),
    Rule("optimizer_offload_layout", _r_optimizer_offload),
    Rule("cuda_graphs_vs_recompute", _r_graphs, _graphs_set),
    Rule("cuda_graph_modules", _r_graph_modules),
    Rule("moe_a2a_overlap_layout", _r_a2a_overlap, _explicit("overlap_moe_expert_parallel_comm")),
    Rule("delay_wgrad_needs_a2a_overlap", _r_delay_wgrad, _explicit("delay_wgrad_compute")),
    Rule("tp_comm_overlap_needs_sp", _r_tp_overlap, _explicit("tp_comm_overlap")),
    Rule("expert_bias_needs_sigmoid_router", _r_expert_bias, _explicit("moe_router_enable_expert_bias")),
    Rule("torch_fsdp2_layout", _r_torch_fsdp2),
    Rule("fp8_recipe_precision", _r_fp8_recipe),
)

RULES: tuple[Rule, ...] = SHARED_DEGREES + (
    Rule("kv_heads_tp_megatron", _kv_heads_tp_megatron),
) + SHARED_HEADS_EXPERTS + (
    Rule("expert_grid_div_world", _expert_grid),
    Rule("etp_only_for_moe", _etp_only_for_moe),
) + SHARED_SCHEDULE + (
    Rule("moe_bias_needs_etp1", _moe_bias_etp1),
    Rule("megatron_interleaved_microbatches", _mg_interleaved),
) + RECIPE_RULES
