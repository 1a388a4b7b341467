"""The trainers' own rules for a parallel layout, said once, shared by the solver and the emitters.

Each rule is a named predicate over (model, layout, training, world size). Messages follow the
trainer's wording where it has one (megatron-core 0.19.2 ``validate_args`` / ``TransformerConfig`` /
``initialize_model_parallel``; torchtitan 0.3.0 ``ParallelDims``), with the numbers involved, so a
refusal reads like the trainer's own. Sources: megatron-core 0.19.2 ``megatron/training/arguments.py::validate_args``,
``megatron/core/transformer/transformer_config.py`` and ``megatron/core/parallel_state.py::initialize_model_parallel``;
torchtitan 0.3.0 ``torchtitan/distributed/parallel_dims.py`` (``ParallelDims._validate``, ``build_mesh``).

The model only needs these attributes: ``num_layers``, ``num_attention_heads``, ``num_kv_heads``,
``num_experts`` (0 for dense) and ``mtp_layers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from planner.config import ParallelConfig, Recipe, Training
from planner.errors import InputError


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str


@dataclass(frozen=True)
class Rule:
    name: str
    trainers: tuple[str, ...]
    check: Callable[..., str | None]  # returns a message when violated, None when satisfied


def _world_div_model_parallel(m, c, t, world):
    mp = c.tp * c.pp * c.cp
    if world % mp:
        return f"world size ({world}) is not divisible by total_model_size (total_model_size={mp}) [tp*pp*cp]"


def _dp_matches(m, c, t, world):
    if c.dp is not None and c.tp * c.pp * c.cp * c.dp != world:
        return f"tp({c.tp}) * pp({c.pp}) * cp({c.cp}) * dp({c.dp}) != world size ({world})"


def _heads_div_tp(m, c, t, world):
    if m.num_attention_heads % c.tp:
        return f"num_attention_heads ({m.num_attention_heads}) must be a multiple of tensor_model_parallel_size ({c.tp})"


def _kv_heads_div_tp(m, c, t, world):
    if m.num_kv_heads % c.tp:
        return f"num_query_groups ({m.num_kv_heads}) must be a multiple of tensor_model_parallel_size ({c.tp})"


def _mixer_heads_div_tp(m, c, t, world):
    """Gated DeltaNet and Mamba-2 split their heads over TP and CP (megatron-core 0.19.2
    transformer_config.py:1375-1380 for GDN; ssm/mamba_mixer.py:260-268 and mamba_context_parallel.py:106
    for Mamba). Models without these mixers pass."""
    g, mb = getattr(m, "gdn", None), getattr(m, "mamba", None)
    if g is not None:
        for name, n in (("linear_num_key_heads", g.num_key_heads), ("linear_num_value_heads", g.num_value_heads)):
            if n % (c.tp * c.cp):
                return f"{name}={n} must be a multiple of tensor_model_parallel_size * context_parallel_size ({c.tp * c.cp})"
    if mb is not None:
        if mb.num_heads % (c.tp * c.cp):
            return f"nheads ({mb.num_heads}) must be evenly divisible by tp_size * cp_size ({c.tp * c.cp})"
        if mb.n_groups % c.tp:
            return f"ngroups ({mb.n_groups}) must be evenly divisible by tp_size ({c.tp})"
        local = mb.n_groups // c.tp
        if c.cp > 1 and (c.cp % local if local < c.cp else local % c.cp):
            return f"ngroups/tp_size ({local}) and cp_size ({c.cp}) must divide one another"


def _kv_heads_tp_megatron(m, c, t, world):
    # megatron-core 0.19.2 transformer_config.py: the KV groups are split over TP, or each TP rank
    # holds a replica of one group (TP a multiple of the groups, as AWS's Qwen3 TP8 runs use)
    if m.num_kv_heads % c.tp and c.tp % m.num_kv_heads:
        return (f"num_query_groups ({m.num_kv_heads}) must be a multiple or divisor of "
                f"tensor_model_parallel_size ({c.tp})")


def _experts_div_ep(m, c, t, world):
    if c.ep > 1 and not m.num_experts:
        return f"expert_model_parallel_size ({c.ep}) > 1 needs a MoE model (num_moe_experts is not set)"
    if c.ep > 1 and m.num_experts % c.ep:
        return f"Number of experts ({m.num_experts}) should be a multiple of expert model parallel_size ({c.ep})"


def _expert_grid(m, c, t, world):
    g = c.etp_eff * c.ep * c.pp
    if world % g:
        return (f"world_size ({world}) is not divisible by expert_tensor_model_pipeline_parallel size ({g}) "
                f"[etp({c.etp_eff}) * ep({c.ep}) * pp({c.pp})]")


def _etp_only_for_moe(m, c, t, world):
    if c.etp is not None and c.etp != c.tp and not m.num_experts:
        return f"expert_tensor_parallel_size ({c.etp}) is set on a dense model"


def _pipeline_stages(m, c, t, world):
    stages = c.pp * c.vpp
    layers = m.num_layers
    # A Megatron layout may give the embedding and the loss a stage of their own
    # (E|(t|)*126L: Llama3.1-405B PP16 VPP8 in Megatron-Bridge 26.04-26.08), so up to layers + 2.
    if stages > layers + 2:
        return (f"pipeline stages pp*vpp ({c.pp}*{c.vpp}={stages}) exceed the decoder layers ({layers}) "
                f"plus the embedding and loss stages")
    if c.pp_first is not None or c.pp_last is not None:
        first = c.pp_first or 0
        last = c.pp_last or 0
        if c.pp < 2:
            return "pp_first/pp_last need pp >= 2"
        if first + last > layers:
            return f"pp_first ({first}) + pp_last ({last}) exceed the decoder layers ({layers})"


def _seq_div_cp(m, c, t, world):
    if c.cp > 1 and t.seq_len % (2 * c.cp):
        return f"seq_length ({t.seq_len}) must be divisible by 2 * context_parallel_size ({2 * c.cp})"


def _gbs_div(m, c, t, world):
    dp = c.dp_for(world) if world % c.model_parallel == 0 else None
    if dp and t.global_batch % (c.mbs * dp):
        return (f"global batch size ({t.global_batch}) is not divisible by micro batch size ({c.mbs}) "
                f"times data parallel size ({dp})")


def num_microbatches(c, t, world) -> int | None:
    """Micro-batches per step and pipeline, ``M = GBS / (MBS * DP)`` with ``DP = world / (tp*pp*cp)``:
    megatron-core's ConstantNumMicroBatchesCalculator and torchtitan's ``local_batch_size //
    pipeline_parallel_microbatch_size`` (local_batch_size = GBS / DP). None where it is not a whole
    number (rule ``gbs_div_mbs_dp`` refuses that layout)."""
    if world % c.model_parallel:
        return None
    dp = c.dp_for(world)
    if not dp or t.global_batch % (c.mbs * dp):
        return None
    return t.global_batch // (c.mbs * dp)


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


def torchtitan_schedule_problem(pp: int, vpp: int, m: int) -> str | None:
    """The pipeline-schedule constructors torchtitan 0.3.0 builds in Trainer.__init__ (torch
    ``torch.distributed.pipelining.schedules``), for the schedule topoplan emits: ``1F1B`` (vpp 1)
    needs M >= PP; ``Interleaved1F1B`` (vpp > 1) splits M into rounds = max(1, M // PP) and needs
    M % rounds == 0. (torchtitan only warns when M < PP * stages per rank.)"""
    if pp < 2:
        return None
    if vpp == 1:
        if m < pp:
            return (f"Number of microbatches ({m}) must be greater than or equal to the number of stages ({pp}) "
                    f"[1F1B; M = global batch / (micro batch * data parallel)]")
        return None
    rounds = max(1, m // pp)
    if m % rounds:
        return (f"Interleaved 1F1B requires the number of microbatches to be a multiple of the number of "
                f"rounds ({rounds}), but got {m} [rounds = max(1, M // pp={pp})]")
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


def _tt_schedule(m, c, t, world):
    mb = num_microbatches(c, t, world)
    if mb is None:
        return None
    msg = torchtitan_schedule_problem(c.pp, c.vpp, mb)
    if msg:
        msg += "; use a larger global batch, fewer data-parallel replicas or a smaller micro-batch"
    return msg


def _fsdp_recompute(m, c, t, world):
    return None


def _tt_no_etp(m, c, t, world):
    # torchtitan 0.3.0 has no expert tensor parallelism: with EP > 1 the EP mesh borrows the TP ranks
    # (efsdp = dp_shard * cp * tp / ep), so experts run unsharded, which is ETP = 1. A layout that
    # asks for experts sharded over TP (ETP = TP > 1, the Megatron default) is not what would run.
    if c.ep > 1 and c.etp_eff != 1:
        return (f"torchtitan has no expert tensor parallel degree: with ep={c.ep} experts run with etp=1, "
                f"not etp={c.etp_eff}; set etp=1")


def _tt_ep_divides(m, c, t, world):
    # ParallelDims.build_mesh: efsdp = dp_shard * cp * tp / ep must be a positive integer.
    if c.ep > 1:
        dp_shard = c.dp_for(world) if world % c.model_parallel == 0 else 0
        prod = dp_shard * c.cp * c.tp
        if prod == 0 or prod % c.ep:
            return (f"expert_parallel_degree ({c.ep}) must divide dp_shard({dp_shard}) * cp({c.cp}) * tp({c.tp}) "
                    f"= {prod}")


def _moe_bias_etp1(m, c, t, world):
    # megatron-core TransformerConfig: "Bias in Moe is only supported when ETP==1" (GPT-OSS expert biases)
    if m.num_experts and getattr(m, "mlp_bias", False) and c.etp_eff != 1:
        return (f"Bias in Moe is only supported when ETP==1: expert_tensor_parallel_size is {c.etp_eff} "
                "(set etp=1 for a model with expert biases)")


def _maxtext_ep_in_dp(m, c, t, world):
    # MaxText's mesh axes are orthogonal: 'expert' sits beside data/fsdp (it cannot borrow TP ranks as
    # Megatron's folded expert grid does), so EP must divide the data-parallel degree.
    if c.ep > 1 and world % (c.tp * c.pp * c.cp) == 0:
        dp = c.dp_for(world)
        if dp % c.ep:
            return (f"maxtext: ici/dcn_expert_parallelism ({c.ep}) must divide the data-parallel degree ({dp}); "
                    "its expert axis cannot borrow tensor-parallel ranks")


# ----------------------------------------------------------------------------------------------
# Recipe settings (planner.config.Recipe): megatron-core 0.19.2's rules that tie CUDA graphs, the
# all-to-all overlap, TP overlap and expert bias to the layout (research notes: validate_args and
# TransformerConfig.__post_init__; combined_1f1b.py and transformer_layer.py for the runtime ones).
# Each predicate returns why a setting cannot be on for the layout (None: it can). A setting the
# user *required* (an explicit True) that a predicate forbids is a broken rule; an auto setting
# (None) is switched off for that layout by ``effective_recipe``, and the step time prices that.

# Model families whose router is aux-loss-free (DeepSeek-V3's noaux_tc: sigmoid scores plus a
# per-expert bias updated outside the optimizer); HF DeepseekV3 has no other routing method.
# The partial scope NVIDIA's perf recipes capture for dropless MoE models, and for dense models.
GRAPH_MODULES_MOE = ("attn", "moe_router", "moe_preprocess")
GRAPH_MODULES_DENSE = ("attn", "mlp")
# Recipe knobs each trainer has (the rest is priced as the trainer runs without them).
TRAINER_KNOBS = {
    "megatron": ("cuda_graph_impl", "cuda_graph_modules", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
                 "tp_comm_overlap", "moe_permute_fusion", "moe_router_fusion", "cross_entropy_loss_fusion",
                 "moe_router_enable_expert_bias", "fsdp_impl", "cpu_offload_layers", "fp8_param_gather",
                 "fp4_param_gather"),
    # TorchTitan: training.disable_cuda_graphs. Its MoE routers always carry the aux-loss-free expert
    # bias (MoE.Config.load_balance_coeff = 1e-3 in every flavour), with no switch to write.
    "torchtitan": ("cuda_graph_impl", "torch_compile"),
    "maxtext": (),
}


def aux_loss_free(model) -> bool:
    """The model routes with an aux-loss-free expert bias: its config's ``topk_method: noaux_tc`` with a
    sigmoid router (ModelSpec.expert_bias; DeepSeek-V3, Kimi-K2, GLM-4.5)."""
    return bool(getattr(model, "num_experts", 0)) and bool(getattr(model, "expert_bias", False))


def _has_dense_layers(m) -> bool:
    layers = getattr(m, "moe_layers", ()) or ()
    return not m.num_experts or not all(layers)


def offload_layers(training) -> int:
    """Decoder layers whose activations Megatron offloads to the CPU (``Recipe.cpu_offload_layers``; 0 = off)."""
    return int(getattr(training.recipe, "cpu_offload_layers", None) or 0)


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
    if c.fsdp and t.recipe.fsdp_impl == "torch":
        return ("FSDP2 FP8 param gather is not supported yet in TE 2.0, will fallback to bf16all_gather instead, "
                "turning off fp8_param_gather (--use-torch-fsdp2)")
    return None


# TorchTitan 0.3.0 model compile (config.compile.enable and "model" in config.compile.components, the test its
# parallelize functions apply: models/llama3/parallelize.py:54-55). The catalog models whose registry function
# compiles the model: llama3_405b (models/llama3/config_registry.py:295-299, CompileConfig(enable=True,
# enable_async_tensor_parallel=True), default components ["model", "loss"]). llama3_8b, llama3_70b, qwen3_14b,
# qwen3_30b_a3b, gpt_oss_20b/120b keep the default CompileConfig(enable=False); deepseek_v3_671b compiles only the
# loss (deepseek_v3/config_registry.py:241). Every other model (a user's config.json, Qwen3-235B-A22B) starts from
# one of those uncompiled functions (planner.output.emit.torchtitan.BASE_CONFIG, USER_FAMILIES).
TORCHTITAN_COMPILED = frozenset({"llama3.1-405b"})


def torch_compile_on(m, c, t) -> bool:
    """Whether TorchTitan compiles the model's transformer blocks (``Recipe.torch_compile`` resolved: an
    explicit value as given, None as the model's TorchTitan 0.3.0 registry function). TorchTitan validates
    compile against no layout: only async TP (config/configs.py:303-310, CompileConfig.__post_init__) and
    memory-budget activation checkpointing (trainer.py:168-177) need it, and topoplan emits neither except the
    async TP llama3_405b's registry function carries, which the emitter switches off with compile. False for
    other trainers. The one resolution the step time and the TorchTitan emitter read."""
    if t.trainer != "torchtitan":
        return False
    v = getattr(t.recipe, "torch_compile", None)
    if v is None:
        return m.name.lower() in TORCHTITAN_COMPILED
    return bool(v)


def fp8_param_gather_on(m, c, t) -> bool:
    """Whether Megatron keeps the linear layers' parameters in FP8 for ``c`` (``Recipe.fp8_param_gather``
    resolved: an explicit value as given, auto per precision as NVIDIA's recipes and off where the layout forbids
    it). The one resolution that memory, step time and the emitters read."""
    if t.trainer != "megatron":
        return False
    v = getattr(t.recipe, "fp8_param_gather", None)
    if v is None:
        return t.precision in FP8_PARAM_GATHER_AUTO and _fp8_param_problem(m, c, t) is None
    return bool(v)


# FP4 parameter gather (--fp4-param-gather; megatron/training/argument_utils.py:313 sets TransformerConfig.fp4_param
# from it; its help: "Keep the compute param in fp4 (do not use any other intermediate dtype) and perform the param
# all-gather in fp4."). Auto follows the same precision configs: nvfp4 -> bf16_with_nvfp4_mixed (mixed_precision.py:
# 411-423 at c810129341a8, fp4_param_gather=True); every other precision has no FP4 parameters.
FP4_PARAM_GATHER_AUTO = frozenset({"nvfp4"})


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
    explicit value as given, auto on for nvfp4 as NVIDIA's bf16_with_nvfp4_mixed)."""
    if t.trainer != "megatron":
        return False
    v = getattr(t.recipe, "fp4_param_gather", None)
    if v is None:
        return t.precision in FP4_PARAM_GATHER_AUTO and _fp4_param_problem(m, c, t) is None
    return bool(v)


def quantised_params_on(m, c, t) -> bool:
    """Whether the linear layers' parameters ARE their quantised tensors (FP8 or NVFP4 parameters: no BF16 weight,
    a low-precision parameter all-gather). The one question memory, step time and the plan program ask; the two
    recipe settings exist apart because megatron-core and Megatron-Bridge spell them apart."""
    return fp8_param_gather_on(m, c, t) or fp4_param_gather_on(m, c, t)


def reuse_grad_buf_for_mxfp8(m, c, t) -> bool:
    """--reuse-grad-buf-for-mxfp8-param-ag: with MXFP8 parameters the all-gather goes through the gradient buffer
    (Megatron-Bridge mixed_precision.py:106-111 requires it with fp8_param_gather and mxfp8; megatron-core
    arguments.py:1114 turns it off under Megatron-FSDP, distributed_data_parallel_config.py:253-254 needs
    fp8_param_gather)."""
    return t.precision == "mxfp8" and fp8_param_gather_on(m, c, t) and not c.fsdp


def _graphs_problem(m, c, t, impl) -> str | None:
    if impl in (None, "none"):
        return None
    if t.trainer == "megatron" and offload_layers(t) and impl != "full_iteration":
        return OFFLOAD_GRAPH_MESSAGE
    if t.trainer == "torchtitan":
        if c.pp > 1:
            return "CUDA graphs do not support pipeline parallelism yet. Set --training.disable_cuda_graphs."
        if m.num_experts and c.ep > 1:
            return "torchtitan CUDA graphs do not support the all-to-all EP dispatcher (set --training.disable_cuda_graphs)"
        return None
    if c.recompute == "full" and impl != "full_iteration":
        return "full recompute is only supported with full iteration CUDA graph."
    return None


def _modules_problem(m, c, t, impl, modules) -> str | None:
    if impl in (None, "none") or t.trainer != "megatron":
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
    if t.trainer != "megatron":
        return "only Megatron has the 1F1B all-to-all overlap (--overlap-moe-expert-parallel-comm)"
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
    if t.trainer != "megatron":
        return "only Megatron has --tp-comm-overlap"
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
    if t.trainer == "maxtext":
        return "none", ()
    impl = r.cuda_graph_impl
    if impl is None:
        impl = "transformer_engine"
        if _graphs_problem(m, c, t, impl):
            impl = "none"
    if impl == "none" or t.trainer != "megatron":
        return impl, ()
    if r.cuda_graph_modules is not None or impl == "full_iteration":
        return impl, tuple(r.cuda_graph_modules or ())
    mods = list(GRAPH_MODULES_MOE if m.num_experts else GRAPH_MODULES_DENSE)
    if impl == "transformer_engine" and "moe" in c.recompute_modules:
        mods = [x for x in mods if x not in ("moe_router", "moe_preprocess")]
    return impl, tuple(mods)


def effective_recipe(model, config, training):
    """The recipe as the trainer runs ``config``: every auto field resolved, knobs the trainer lacks
    off (False / none), settings the layout makes meaningless normalised (no MoE fusions on a dense
    model, no FSDP flavour without FSDP). Deterministic and idempotent: the effective recipe of a
    Training holding an effective recipe is itself. Explicit settings are kept as given (the rules
    refuse the layouts they do not fit)."""
    m, c, t = model, config, training
    r = t.recipe
    knobs = TRAINER_KNOBS.get(t.trainer, ())
    impl, modules = _graph_setting(m, c, t)

    def auto(value, problem):
        return (problem is None) if value is None else bool(value)

    a2a = False
    if "overlap_moe_expert_parallel_comm" in knobs:
        a2a = auto(r.overlap_moe_expert_parallel_comm, _a2a_overlap_problem(m, c, t, impl, modules))
    dw = False
    if "delay_wgrad_compute" in knobs:
        dw = auto(r.delay_wgrad_compute, _delay_wgrad_problem(m, c, t, a2a, impl, modules))
    tpo = auto(r.tp_comm_overlap, _tp_overlap_problem(m, c, t)) if "tp_comm_overlap" in knobs else False
    moe = bool(m.num_experts)
    bias = auto(r.moe_router_enable_expert_bias, _expert_bias_problem(m, c, t)) \
        if "moe_router_enable_expert_bias" in knobs else False
    mega = t.trainer == "megatron"
    return Recipe(
        cuda_graph_impl=impl, cuda_graph_modules=modules, overlap_moe_expert_parallel_comm=a2a,
        delay_wgrad_compute=dw, tp_comm_overlap=tpo,
        moe_permute_fusion=bool(r.moe_permute_fusion and moe and mega),
        moe_router_fusion=bool(r.moe_router_fusion and moe and mega),
        cross_entropy_loss_fusion=bool(r.cross_entropy_loss_fusion and mega),
        moe_router_enable_expert_bias=bias,
        fsdp_impl=r.fsdp_impl if (c.fsdp and mega) else "megatron",
        cpu_offload_layers=(offload_layers(t) or None) if mega else None,
        fp8_param_gather=fp8_param_gather_on(m, c, t),
        torch_compile=torch_compile_on(m, c, t) if t.trainer == "torchtitan" else None,
        fp4_param_gather=fp4_param_gather_on(m, c, t),
    )


def _explicit(t, name):
    return getattr(t.recipe, name) is True


def _r_graphs(m, c, t, world):
    impl = t.recipe.cuda_graph_impl
    if impl not in (None, "none"):
        return _graphs_problem(m, c, t, impl)


def _r_graph_modules(m, c, t, world):
    impl, modules = _graph_setting(m, c, t)
    return _modules_problem(m, c, t, impl, modules)


def _r_full_iteration_nan(m, c, t, world):
    return None  # the emitter writes --no-check-for-nan-in-loss-and-grad with full_iteration graphs


def _r_a2a_overlap(m, c, t, world):
    if _explicit(t, "overlap_moe_expert_parallel_comm"):
        impl, modules = _graph_setting(m, c, t)
        return _a2a_overlap_problem(m, c, t, impl, modules)


def _r_delay_wgrad(m, c, t, world):
    if _explicit(t, "delay_wgrad_compute"):
        e = effective_recipe(m, c, t)
        return _delay_wgrad_problem(m, c, t, e.overlap_moe_expert_parallel_comm, e.cuda_graph_impl,
                                    e.cuda_graph_modules)


def _r_tp_overlap(m, c, t, world):
    if _explicit(t, "tp_comm_overlap"):
        return _tp_overlap_problem(m, c, t)


def _r_expert_bias(m, c, t, world):
    if _explicit(t, "moe_router_enable_expert_bias"):
        return _expert_bias_problem(m, c, t)


def _r_torch_fsdp2(m, c, t, world):
    if c.fsdp and t.recipe.fsdp_impl == "torch":
        return _torch_fsdp2_problem(m, c, t)


def _r_cpu_offload(m, c, t, world):
    return _offload_problem(m, c, t)


def _r_fp8_param_gather(m, c, t, world):
    if _explicit(t, "fp8_param_gather"):
        return _fp8_param_problem(m, c, t)


def _r_fp4_param_gather(m, c, t, world):
    if _explicit(t, "fp4_param_gather"):
        return _fp4_param_problem(m, c, t)


RECIPE_RULES = (
    ("fp8_param_gather_recipe", ("megatron",), _r_fp8_param_gather),
    ("fp4_param_gather_recipe", ("megatron",), _r_fp4_param_gather),
    ("cpu_offloading_layout", ("megatron",), _r_cpu_offload),
    ("cuda_graphs_vs_recompute", ("megatron", "torchtitan"), _r_graphs),
    ("cuda_graph_modules", ("megatron",), _r_graph_modules),
    ("moe_a2a_overlap_layout", ("megatron",), _r_a2a_overlap),
    ("delay_wgrad_needs_a2a_overlap", ("megatron",), _r_delay_wgrad),
    ("tp_comm_overlap_needs_sp", ("megatron",), _r_tp_overlap),
    ("expert_bias_needs_sigmoid_router", ("megatron",), _r_expert_bias),
    ("torch_fsdp2_layout", ("megatron",), _r_torch_fsdp2),
)


RULES: tuple[Rule, ...] = (
    Rule("world_div_model_parallel", ("megatron", "torchtitan", "maxtext"), _world_div_model_parallel),
    Rule("dp_matches_world", ("megatron", "torchtitan", "maxtext"), _dp_matches),
    Rule("heads_div_tp", ("megatron", "torchtitan", "maxtext"), _heads_div_tp),
    Rule("kv_heads_div_tp", ("torchtitan", "maxtext"), _kv_heads_div_tp),
    Rule("kv_heads_tp_megatron", ("megatron",), _kv_heads_tp_megatron),
    Rule("mixer_heads_div_tp_cp", ("megatron", "torchtitan", "maxtext"), _mixer_heads_div_tp),
    Rule("experts_div_ep", ("megatron", "torchtitan", "maxtext"), _experts_div_ep),
    Rule("expert_grid_div_world", ("megatron",), _expert_grid),
    Rule("etp_only_for_moe", ("megatron",), _etp_only_for_moe),
    Rule("pipeline_stages", ("megatron", "torchtitan", "maxtext"), _pipeline_stages),
    Rule("seq_div_2cp", ("megatron", "torchtitan", "maxtext"), _seq_div_cp),
    Rule("gbs_div_mbs_dp", ("megatron", "torchtitan", "maxtext"), _gbs_div),
    Rule("torchtitan_no_etp", ("torchtitan",), _tt_no_etp),
    Rule("torchtitan_ep_divides", ("torchtitan",), _tt_ep_divides),
    Rule("moe_bias_needs_etp1", ("megatron",), _moe_bias_etp1),
    Rule("maxtext_ep_divides_dp", ("maxtext",), _maxtext_ep_in_dp),
    Rule("megatron_interleaved_microbatches", ("megatron",), _mg_interleaved),
    Rule("torchtitan_pipeline_microbatches", ("torchtitan",), _tt_schedule),
) + tuple(Rule(n, tr, f) for n, tr, f in RECIPE_RULES)


def violations(model, config: ParallelConfig, training: Training, world: int,
               trainer: str | None = None) -> list[Violation]:
    """Every rule of ``trainer`` (default: ``training.trainer``) that the layout breaks."""
    trainer = trainer or training.trainer
    out = []
    for rule in RULES:
        if trainer in rule.trainers:
            msg = rule.check(model, config, training, world)
            if msg:
                out.append(Violation(rule.name, msg))
    return out


def check(model, config: ParallelConfig, training: Training, world: int, trainer: str | None = None) -> None:
    """Raise ``InputError`` naming the first broken rule (exit code 2 on the CLI)."""
    v = violations(model, config, training, world, trainer)
    if v:
        raise InputError(f"{config.short()}: {v[0].message} (rule {v[0].rule})")
