"""Megatron-Bridge (0.6.2) overrides: the recipe to start from and Hydra/OmegaConf dotted overrides.

Bridge keeps parallelism on the model provider (a TransformerConfig subclass): ``model.*`` keys are
TransformerConfig / ModelParallelConfig fields, ``ddp.*`` are DistributedDataParallelConfig fields,
``train.*`` the batch, ``mixed_precision`` a registered recipe name. Every value equals what the
Megatron-LM emitter passes on the command line, so both launch the same layout; the tests check
each ``model.*`` override against the TransformerConfig megatron-core builds from
megatron/args.txt. Keys: Megatron-Bridge 0.6.2's ``ConfigContainer`` (parallelism on the model provider,
``cfg.model.*``; batch ``cfg.train.*``; overrides parsed by
``src/megatron/bridge/training/utils/omegaconf_utils.py::process_config_with_overrides``).
"""

from __future__ import annotations

from pathlib import Path

from planner.errors import InputError
from planner.model.pipeline import pipeline_layout
from planner.output.emit import EmitContext
from planner.trainers.megatron.emit import (hybrid_pattern, hybrid_stages, megatron_env, mla_yarn_unexpressed,
                                           recipe_of)
from planner.trainers.megatron.emit import task_env as megatron_task_env

# catalog model -> Bridge recipe function (megatron.bridge.recipes)
RECIPES = {
    "deepseek-v3": "deepseek_v3_pretrain_config",
    "llama3.1-405b": "llama31_405b_pretrain_config",
    "llama3-70b": "llama3_70b_pretrain_config",
    "llama3-8b": "llama3_8b_pretrain_config",
    "qwen3-235b-a22b": "qwen3_235b_a22b_pretrain_config",
    "qwen3-30b-a3b": "qwen3_30b_a3b_pretrain_config",
}
MIXED_PRECISION = {
    "bf16": "bf16_mixed",
    "fp8": "bf16_with_fp8_current_scaling_mixed",
    "fp8-block": "bf16_with_fp8_subchannel_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}
DELAYED_FP8 = "bf16_with_fp8_delayed_scaling_mixed"   # precision fp8 with recipe.fp8_recipe delayed

# fp8_param_gather of each named recipe (Megatron-Bridge@c810129341a8 src/megatron/bridge/training/mixed_precision.py:
# 270-271 mxfp8 with reuse_grad_buf_for_mxfp8_param_ag, 308 current scaling, 390 subchannel, 421 nvfp4). Its setup()
# (:118-141) copies them onto model.fp8_param and ddp.fp8_param_gather, so a dotted override cannot change them.
BRIDGE_FP8_PARAM_GATHER = {"bf16": False, "fp8": True, "fp8-block": False, "mxfp8": True, "nvfp4": False}
# fp4_param_gather likewise (:422 nvfp4 True; bf16_mixed's default False, :66, in the others), copied onto
# model.fp4_param and ddp.fp4_param_gather.
BRIDGE_FP4_PARAM_GATHER = {p: p == "nvfp4" for p in BRIDGE_FP8_PARAM_GATHER}


def overrides(ctx: EmitContext) -> dict[str, object]:
    """Dotted key -> value (Python values; None means "unset")."""
    c, m = ctx.config, ctx.model
    o: dict[str, object] = {
        "model.tensor_model_parallel_size": c.tp,
        "model.pipeline_model_parallel_size": c.pp,
        "model.virtual_pipeline_model_parallel_size": c.vpp if c.vpp > 1 else None,
        "model.context_parallel_size": c.cp,
        "model.sequence_parallel": c.tp > 1,
        "model.seq_length": ctx.training.seq_len,
    }
    if m.num_experts:
        o["model.expert_model_parallel_size"] = c.ep
        o["model.expert_tensor_parallel_size"] = c.etp_eff
        disp = c.dispatcher
        o["model.moe_token_dispatcher_type"] = "flex" if disp.startswith("flex-") else disp
        if disp.startswith("flex-"):
            o["model.moe_flex_dispatcher_backend"] = disp.split("-", 1)[1]
    pattern = hybrid_pattern(m, hybrid_stages(ctx))
    if pattern:   # a hybrid layer pattern carries the pipeline split (megatron-core refuses a layout beside it)
        o["model.hybrid_layer_pattern"] = pattern
    elif c.pp > 1:
        o["model.pipeline_model_parallel_layout"] = pipeline_layout(
            m, c.pp, c.vpp, c.pp_first, c.pp_last, seq_len=ctx.training.seq_len).megatron_layout()
    if c.recompute == "full":
        o.update({"model.recompute_granularity": "full", "model.recompute_method": "uniform",
                  "model.recompute_num_layers": 1})
    elif c.recompute != "none":
        o.update({"model.recompute_granularity": "selective", "model.recompute_modules": list(c.recompute_modules)})
    else:
        o["model.recompute_granularity"] = None
    o.update({
        "train.global_batch_size": ctx.training.global_batch,
        "train.micro_batch_size": c.mbs,
        "dataset.sequence_length": ctx.training.seq_len,
        "ddp.use_distributed_optimizer": not c.fsdp,
        "ddp.use_megatron_fsdp": c.fsdp,
        "ddp.overlap_grad_reduce": True,
        "ddp.overlap_param_gather": True,
        "ddp.grad_reduce_in_fp32": False,   # bf16 gradients, as planner.cost.memory counts
        "mixed_precision": MIXED_PRECISION[ctx.training.precision],
    })
    if c.fsdp:
        o["ddp.data_parallel_sharding_strategy"] = "optim_grads_params"
        o["checkpoint.ckpt_format"] = "fsdp_dtensor"
    # the recipe settings, the same values megatron/args.txt passes (TransformerConfig field names;
    # comm_overlap.* is Bridge's CommOverlapConfig, which would otherwise re-decide the overlaps)
    r = recipe_of(ctx)
    if r.fp8_recipe == "delayed":   # mixed_precision.py bf16_with_fp8_delayed_scaling_mixed: fp8_param_gather True too
        o["mixed_precision"] = DELAYED_FP8
    for name, table, model_field in (("fp8_param_gather", BRIDGE_FP8_PARAM_GATHER, "fp8_param"),
                                     ("fp4_param_gather", BRIDGE_FP4_PARAM_GATHER, "fp4_param")):
        named = table[ctx.training.precision]
        if getattr(ctx.training.recipe, name) is not None and getattr(r, name) != named:
            raise InputError(f"recipe.{name}={getattr(r, name)}: Megatron-Bridge's "
                             f"{MIXED_PRECISION[ctx.training.precision]} sets {name}={named} and its setup() "
                             f"overrides model.{model_field} / ddp.{name}; leave recipe.{name} unset for "
                             "Bridge or launch megatron/args.txt")
    if r.optimizer_offload_fraction:   # megatron-core's OptimizerConfig fields (optimizer_config.py:344-366)
        o.update(_optimizer_offload(ctx, r))
    o["model.cuda_graph_impl"] = r.cuda_graph_impl
    o["model.cuda_graph_scope"] = list(r.cuda_graph_modules)
    o["comm_overlap.tp_comm_overlap"] = r.tp_comm_overlap
    o["comm_overlap.overlap_moe_expert_parallel_comm"] = r.overlap_moe_expert_parallel_comm
    o["comm_overlap.delay_wgrad_compute"] = r.delay_wgrad_compute
    o["model.cross_entropy_loss_fusion"] = r.cross_entropy_loss_fusion
    o["model.cross_entropy_fusion_impl"] = "native"
    # CPU activation offloading, as scripts/performance/utils/overrides.py _set_recompute_overrides sets it
    o["model.cpu_offloading"] = bool(r.cpu_offload_layers)
    if r.cpu_offload_layers:
        o["model.cpu_offloading_num_layers"] = r.cpu_offload_layers
        o["model.cpu_offloading_activations"] = True
        o["model.cpu_offloading_weights"] = False
    if m.num_experts:
        o["model.moe_permute_fusion"] = r.moe_permute_fusion
        o["model.moe_router_fusion"] = r.moe_router_fusion
        o["model.moe_router_enable_expert_bias"] = r.moe_router_enable_expert_bias
    o.update(model_overrides(m))
    return o


def _n(x: float):
    return int(x) if float(x).is_integer() else float(x)


def model_overrides(m) -> dict[str, object]:
    """The config.json's hyperparameters on the provider (GPTModelProvider / MLATransformerConfig fields), the
    values megatron/args.txt passes, plus the MLA YaRN settings pretrain_gpt.py has no flag for."""
    o: dict[str, object] = {"model.rotary_base": _n(m.rope_theta), "model.layernorm_epsilon": m.norm_eps,
                            "model.normalization": "LayerNorm" if m.layer_norm else "RMSNorm"}   # args.txt's
    if m.partial_rotary_factor < 1.0:
        o["model.rotary_percent"] = m.partial_rotary_factor
    rs = m.rope_scaling
    if m.attention == "mla" and rs is not None and rs.kind == "yarn":
        o["model.rotary_scaling_factor"] = float(rs.factor)
        o["model.mscale"] = float(1.0 if rs.mscale is None else rs.mscale)
        o["model.mscale_all_dim"] = float(0.0 if rs.mscale_all_dim is None else rs.mscale_all_dim)
        o.update({f"model.{k}": _n(v) for k, (v, _) in mla_yarn_unexpressed(m).items()})
    elif rs is not None and rs.kind == "llama3":
        o.update({"model.rope_scaling": True, "model.rope_scaling_factor": float(rs.factor)})
    if m.num_experts:
        o["model.moe_router_score_function"] = m.router_score
    o.update(mixer_overrides(m))
    return o


def mixer_overrides(m) -> dict[str, object]:
    """The hybrid mixers on the provider, the TransformerConfig fields megatron/args.txt sets
    (planner.trainers.megatron.emit.hybrid_args): Mamba-2 widths (the block pattern: ``overrides``), Gated DeltaNet
    layers and widths, Qwen3-Next's attention output gate, DSA's indexer."""
    o: dict[str, object] = {}
    if m.mamba is not None:
        mb = m.mamba
        o.update({"model.mamba_state_dim": mb.state_size,
                  "model.mamba_head_dim": mb.head_dim, "model.mamba_num_groups": mb.n_groups,
                  "model.mamba_num_heads": mb.num_heads})
    if m.position_embedding != "rope":   # "none" (Nemotron-H) or "learned_absolute" (GPT-2/3)
        o["model.position_embedding_type"] = m.position_embedding
    if m.gdn is not None:
        g = m.gdn
        o.update({"model.experimental_attention_variant": "gated_delta_net",
                  "model.linear_attention_freq": [1 if x == "gdn" else 0 for x in m.mixers],
                  "model.linear_key_head_dim": g.key_head_dim, "model.linear_value_head_dim": g.value_head_dim,
                  "model.linear_num_key_heads": g.num_key_heads, "model.linear_num_value_heads": g.num_value_heads,
                  "model.linear_conv_kernel_dim": g.conv_kernel})
    if m.attention_output_gate:
        o["model.attention_output_gate"] = True
    if m.shared_expert_gate:
        o["model.moe_shared_expert_gate"] = True
    if m.norm_zero_centered:
        o["model.layernorm_zero_centered_gamma"] = True
    if m.dsa is not None:
        o.update({"model.experimental_attention_variant": "dsa", "model.apply_rope_fusion": False,
                  "model.dsa_indexer_n_heads": m.dsa.n_heads, "model.dsa_indexer_head_dim": m.dsa.head_dim,
                  "model.dsa_indexer_topk": m.dsa.topk})
    return o


def render_value(v) -> str:
    """Hydra override syntax: null, true/false, numbers, bare strings, [a,b] lists."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(render_value(x) for x in v) + "]"
    s = str(v)
    if isinstance(v, str) and any(ch in s for ch in "|()*,[]{}= '\""):
        return "'" + s.replace("'", "\\'") + "'"
    return s


def files(ctx: EmitContext) -> dict[str, str]:
    recipe = RECIPES.get(ctx.model.name.lower())
    lines = [f"# Megatron-Bridge overrides written by topoplan for plan {ctx.index}: {ctx.model.name}, "
             f"{ctx.config.short()}, {ctx.world} x {ctx.gpu}.",
             f"# recipe: {recipe}" if recipe else
             f"# recipe: none known for {ctx.model.name}; start from its model provider (AutoBridge) and apply these",
             "# Apply with process_config_with_overrides(cfg, cli_overrides=[...]) or on the recipe's command line."]
    env = megatron_env(ctx)
    env.pop("WORLD_SIZE", None)
    if env:
        lines.append("# cfg.env_vars / launcher environment: " + " ".join(f"{k}={v}" for k, v in env.items()))
    lines += [f"{k}={render_value(v)}" for k, v in overrides(ctx).items()]
    return {"bridge/overrides.txt": "\n".join(lines) + "\n"}


def parse_overrides(text: str) -> dict[str, str]:
    """``key=value`` lines of overrides.txt (comments skipped), values as written."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    return out


def for_trial(directory, iters: int) -> None:
    """``topoplan trial``: the emitted overrides under ``directory`` run ``iters`` iterations, logging each one."""
    p = Path(directory) / "bridge" / "overrides.txt"
    p.write_text(p.read_text().rstrip("\n") + f"\ntrain.train_iters={iters}\nlogger.log_interval=1\n"
                 "logger.log_throughput=true\n")


# -- slurm/task.sh and the Kubernetes pods (planner.output.emit.slurm.trainer_shell) ----------------------

def unlaunchable(ctx: EmitContext) -> str | None:
    """Why the launchers cannot start Megatron-Bridge for this plan: it runs a recipe, and has none for the model."""
    if ctx.model.name.lower() not in RECIPES:
        return (f"Megatron-Bridge has no recipe for {ctx.model.name} (it has {', '.join(sorted(RECIPES))}); "
                "emit megatron,slurm instead")
    return None


def task_env(ctx: EmitContext) -> str:
    """The same environment as Megatron-LM's (megatron-core asserts it)."""
    return megatron_task_env(ctx)


def task_command(ctx: EmitContext) -> str:
    """The ``trainer_cmd`` case arm: prints run_recipe.py with the model's recipe and the overrides."""
    recipe = RECIPES[ctx.model.name.lower()] if "bridge" in ctx.trainers and unlaunchable(ctx) is None else ""
    return f"""      printf '%s %q --recipe {recipe}%s %s\\n' "$2" \\
        "${{MEGATRON_BRIDGE:?set MEGATRON_BRIDGE to a Megatron-Bridge checkout}}/scripts/training/run_recipe.py" \\
        "$(grep -v -e '^#' -e '^$' "$ROOT/bridge/overrides.txt" | topoplan_quote_lines)" "$data" ;;"""


def _optimizer_offload(ctx, r) -> dict:
    """The optimizer CPU offload as Megatron-Bridge's ``optimizer`` (megatron-core's OptimizerConfig) takes it.
    Bridge's FP8 mixed-precision recipes set fp8_param_gather themselves, which megatron-core's offload refuses
    without the delayed recipe (arguments.py:1808-1811): such a plan is launched from megatron/args.txt."""
    if BRIDGE_FP8_PARAM_GATHER[ctx.training.precision]:
        raise InputError(f"recipe.optimizer_offload_fraction={r.optimizer_offload_fraction:g}: Megatron-Bridge's "
                         f"{MIXED_PRECISION[ctx.training.precision]} sets fp8_param_gather=True, which megatron-core's "
                         "optimizer CPU offload accepts only with the delayed FP8 recipe; launch megatron/args.txt "
                         "(it writes no --fp8-param-gather) or plan another precision")
    return {"optimizer.optimizer_cpu_offload": True, "optimizer.use_precision_aware_optimizer": True,
            "optimizer.optimizer_offload_fraction": r.optimizer_offload_fraction,
            "optimizer.overlap_cpu_optimizer_d2h_h2d": bool(r.overlap_cpu_optimizer_d2h_h2d)}
