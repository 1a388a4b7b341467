"""TorchTitan launch files: the 0.3 command line and, for 0.2 users, the TOML job file.

TorchTitan 0.3.0 picks a ``config_registry`` function with ``--module M --config C`` and overrides it
with tyro flags ``--section.key value``; activation checkpointing is the subcommand
``activation-checkpoint:{none,selective,full}``. Models with a flavour but no registry function
(Qwen3-235B-A22B) get a small ``topoplan_config.py`` registry next to the command. Its mesh is
``[pp, dp_replicate, dp_shard, cp, tp]`` (tp innermost) for dense layers and
``[pp, dp_replicate, efsdp, ep]`` for experts, so with dp_replicate = 1 its TP, CP, DP and PP
groups equal Megatron's (order tp-cp-ep-dp-pp) and its EP groups are Megatron's expert groups with
ETP = 1: EP borrows ranks from dp_shard * cp * tp. There is no expert tensor parallel degree.
Keys: ../shared/reference/trainers.md section 2.
"""

from __future__ import annotations

import shlex

from planner.output.emit import EmitContext
from planner.errors import InputError

# catalog model -> (module, config function or None, model_registry flavour)
MODELS = {
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", "671B"),
    "llama3.1-405b": ("llama3", "llama3_405b", "405B"),
    "llama3-70b": ("llama3", "llama3_70b", "70B"),
    "llama3-8b": ("llama3", "llama3_8b", "8B"),
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b", "30B-A3B"),
    "qwen3-235b-a22b": ("qwen3", None, "235B-A22B"),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b", "120b"),
    "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b", "20b"),
}
# a registry function of the same module whose recipe the custom flavour starts from
BASE_CONFIG = {"qwen3": "qwen3_30b_a3b"}
CUSTOM_MODULE = "topoplan_config"
# The low-precision recipe a built-in registry function already applies (torchtitan 0.3.0:
# llama3_405b carries a rowwise Float8Linear converter; the others train in BF16).
BASE_PRECISION = {"llama3.1-405b": "fp8-block"}
# model_registry keyword arguments the built-in functions pass besides the flavour
REGISTRY_KWARGS = {"deepseek_v3": 'attn_backend="flex", '}
# planner precision -> torchtitan 0.3.0 converters (torchtitan.components.quantization) for the
# Linear layers and, on MoE models, the grouped experts. FP8 tensorwise is torchao's recipe name
# (accepted though 0.3.0 documents only the rowwise ones); per-block FP8 has no torchao recipe, so
# fp8-block uses rowwise scaling, the nearest.
CONVERTERS = {
    "fp8": ('Float8LinearConverter.Config(recipe_name="tensorwise", filter_fqns=["lm_head", "router.gate"], '
            "model_compile_enabled=COMPILED)", "Float8GroupedExpertsConverter.Config(model_compile_enabled=COMPILED)"),
    "fp8-block": ('Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head", "router.gate"], '
                  "model_compile_enabled=COMPILED)",
                  "Float8GroupedExpertsConverter.Config(model_compile_enabled=COMPILED)"),
    "mxfp8": ("MXFP8LinearConverter.Config(fqns=FQNS, model_compile_enabled=COMPILED)",
              "MXFP8GroupedExpertsConverter.Config(pad_multiple=128, model_compile_enabled=COMPILED)"),
    "nvfp4": ("NVFP4LinearConverter.Config(model_compile_enabled=COMPILED)", None),
}


def model_entry(ctx: EmitContext) -> tuple[str, str | None, str]:
    key = ctx.model.name.lower()
    if key not in MODELS:
        raise InputError(f"--trainer torchtitan: torchtitan 0.3.0 has no model definition for {ctx.model.name!r} "
                         f"(it has {', '.join(sorted(MODELS))}); emit megatron or maxtext instead")
    return MODELS[key]


def batch(ctx: EmitContext) -> tuple[int, int, int]:
    """(local_batch_size, global_batch_size, pipeline microbatch size).

    Without PP a step of ``local_batch_size = mbs`` per DP rank is repeated (gradient accumulation)
    up to the global batch; with PP the whole per-rank batch enters the pipeline in micro-batches of
    ``mbs`` (TorchTitan asserts ``local_batch_size % pipeline_parallel_microbatch_size == 0``)."""
    c, gbs = ctx.config, ctx.training.global_batch
    if c.pp > 1:
        return gbs // ctx.dp, gbs, c.mbs
    return c.mbs, gbs, c.mbs


def ac_mode(ctx: EmitContext) -> str:
    r = ctx.config.recompute
    return "none" if r == "none" else ("full" if r == "full" else "selective")


def parallelism(ctx: EmitContext) -> dict[str, object]:
    c = ctx.config
    p: dict[str, object] = {
        "data_parallel_replicate_degree": 1,
        "data_parallel_shard_degree": ctx.dp,
        "tensor_parallel_degree": c.tp,
        "pipeline_parallel_degree": c.pp,
        "context_parallel_degree": c.cp,
        "expert_parallel_degree": c.ep if ctx.model.num_experts else 1,
    }
    if c.tp > 1:
        p["enable_sequence_parallel"] = True
    if c.pp > 1:
        p["pipeline_parallel_schedule"] = "Interleaved1F1B" if c.vpp > 1 else "1F1B"
        p["pipeline_parallel_microbatch_size"] = c.mbs
        # the plan's own split, stage by stage (stage v*pp + r runs on rank r, as in Megatron):
        # pipeline_parallel_layers_per_stage cannot say it (TorchTitan adds one layer's weight for the
        # embedding and one for the output, so an even split gets one stage too many) and without
        # it looped schedules get 2 stages per rank whatever the plan's VPP
        p["module_fqns_per_model_part"] = stage_fqns(ctx)
    return p


def stage_fqns(ctx: EmitContext) -> list[list[str]]:
    """TorchTitan module names per pipeline stage, from planner.model.pipeline's layout."""
    from planner.model.pipeline import pipeline_layout

    c = ctx.config
    layout = pipeline_layout(ctx.model, c.pp, c.vpp, c.pp_first, c.pp_last, seq_len=ctx.training.seq_len)
    out = []
    for st in layout.stages:
        names = (["tok_embeddings"] if st.embedding else []) + [f"layers.{i}" for i in st.layers]
        if st.loss:
            names += ["norm", "lm_head"]
        out.append(names)
    return out


def command_args(ctx: EmitContext) -> list[str]:
    """Arguments after ``-m torchtitan.train`` (0.3.0)."""
    module, config, _ = model_entry(ctx)
    if config is None or needs_converters(ctx):
        module, config = CUSTOM_MODULE, _custom_name(ctx)
    local, gbs, _ = batch(ctx)
    a = ["--module", module, "--config", config]
    for k, v in parallelism(ctx).items():
        if isinstance(v, bool):  # tyro booleans are flags: --x / --no-x
            a.append(f"--parallelism.{k}" if v else f"--parallelism.no_{k}")
        elif isinstance(v, list):  # list[list[str]]: stages space-separated, modules comma-separated
            a += [f"--parallelism.{k}", *(",".join(stage) for stage in v)]
        else:
            a += [f"--parallelism.{k}", str(v)]
    a += ["--training.local_batch_size", str(local), "--training.global_batch_size", str(gbs),
          "--training.seq_len", str(ctx.training.seq_len)]
    # explicit both ways: some registry functions (deepseek_v3_671b) switch graphs off themselves
    a.append("--training.no_disable_cuda_graphs" if cuda_graphs(ctx) else "--training.disable_cuda_graphs")
    a.append(f"activation-checkpoint:{ac_mode(ctx)}")
    return a


def cuda_graphs(ctx: EmitContext) -> bool:
    """TorchTitan captures CUDA graphs (``training.disable_cuda_graphs`` off): the recipe as TorchTitan
    runs the layout (planner.rules.effective_recipe with trainer torchtitan). Trainer.Config.
    _validate_cuda_graphs refuses graphs with PP or with the all-to-all EP dispatcher, so those layouts
    run without them whatever the plan's recipe asked for."""
    from planner.rules import _graphs_problem, effective_recipe

    tr = ctx.training.model_copy(update={"trainer": "torchtitan"})
    impl = effective_recipe(ctx.model, ctx.config, tr).cuda_graph_impl
    return impl != "none" and _graphs_problem(ctx.model, ctx.config, tr, impl) is None


def needs_converters(ctx: EmitContext) -> bool:
    """The plan's precision differs from what the built-in registry function trains in."""
    return ctx.training.precision != BASE_PRECISION.get(ctx.model.name.lower(), "bf16")


def _custom_name(ctx: EmitContext) -> str:
    name = ctx.model.name.lower().replace("-", "_").replace(".", "_")
    return name if not needs_converters(ctx) else f"{name}_{ctx.training.precision.replace('-', '_')}"


def converters(ctx: EmitContext) -> list[str]:
    """The converter constructors (Python source) the plan's precision needs."""
    if ctx.training.precision == "bf16":
        return []
    linear, experts = CONVERTERS[ctx.training.precision]
    out = [linear]
    if ctx.model.num_experts:
        if experts is None:
            raise InputError(f"--trainer torchtitan: torchtitan 0.3.0 has no {ctx.training.precision} converter for "
                             "grouped experts; plan this MoE model with --precision mxfp8 or fp8")
        out.append(experts)
    return out


def custom_registry(ctx: EmitContext) -> str | None:
    module, config, flavour = model_entry(ctx)
    if config is not None and not needs_converters(ctx):
        return None
    base = config or BASE_CONFIG[module]
    conv = converters(ctx)
    names = sorted({c.split(".", 1)[0] for c in conv})
    imports = f"from torchtitan.components.quantization import {', '.join(names)}\n" if names else ""
    why = (f"the plan trains in {ctx.training.precision}, so the model gets the converters below" if conv else
           "the plan trains in BF16, so the model is built without converters")
    # MX layers: the attention and MLP/expert projections (not the router gate or the output head,
    # torchtitan's deepseek_v3_debugmodel_mxfp8 choice)
    fqns = '["attention", "shared_experts", "feed_forward"]' if ctx.model.num_experts else '["attention", "feed_forward"]'
    conv_src = ("[" + ", ".join(c.replace("COMPILED", "compiled").replace("FQNS", fqns) for c in conv) + "]"
                if conv else "None")
    return f'''"""TorchTitan 0.3.0 config registry written by topoplan for {ctx.model.name} ({flavour!r} in
torchtitan.models.{module}): it starts from {base}() and rebuilds the model spec; {why}.
Put this directory on PYTHONPATH and pass --module {CUSTOM_MODULE} --config {_custom_name(ctx)}."""

{imports}from torchtitan.models.{module} import model_registry
from torchtitan.models.{module}.config_registry import {base}


def {_custom_name(ctx)}():
    config = {base}()
    compiled = config.compile.enable and "model" in config.compile.components
    config.model_spec = model_registry({flavour!r}, {REGISTRY_KWARGS.get(module, "")}converters={conv_src})
{"" if config is not None else f'    config.hf_assets_path = "./assets/hf/{_hf_dir(ctx)}"{chr(10)}'}    return config
'''


def _hf_dir(ctx: EmitContext) -> str:
    return {"qwen3-235b-a22b": "Qwen3-235B-A22B"}.get(ctx.model.name.lower(), ctx.model.name)


def toml_job(ctx: EmitContext) -> str:
    """TorchTitan 0.2 job file (``--job.config_file job.toml``)."""
    module, _, flavour = model_entry(ctx)
    local, gbs, _ = batch(ctx)
    lines = [f"# TorchTitan 0.2 job file written by topoplan (plan {ctx.index}: {ctx.config.short()}, "
             f"{ctx.world} x {ctx.gpu}).", "# torchrun ... -m torchtitan.train --job.config_file job.toml", "",
             "[job]", f'description = "topoplan plan {ctx.index} for {ctx.model.name}"', "",
             "[model]", f'name = "{module}"', f'flavor = "{flavour}"', "",
             "[training]", f"local_batch_size = {local}", f"global_batch_size = {gbs}",
             f"seq_len = {ctx.training.seq_len}", "", "[parallelism]"]
    for k, v in parallelism(ctx).items():
        lines.append(f"{k} = {_toml(v)}")
    if ctx.model.num_experts and ctx.config.ep > 1:
        lines.append("expert_tensor_parallel_degree = 1")
    lines += ["", "[activation_checkpoint]", f'mode = "{ac_mode(ctx)}"']
    return "\n".join(lines) + "\n"


def files(ctx: EmitContext) -> dict[str, str]:
    args = command_args(ctx)
    hdr = (f"# TorchTitan 0.3.0 launch for plan {ctx.index}: {ctx.model.name}, {ctx.config.short()}, "
           f"{ctx.world} x {ctx.gpu}.\n# Per node (see slurm/sbatch.sh for node ranks): torchrun --nnodes "
           f"{len(ctx.host_order)} --nproc-per-node {ctx.gpus_per_node} --node-rank $NODE_RANK -m torchtitan.train ARGS\n")
    out = {
        "torchtitan/command.txt": hdr + "python -m torchtitan.train " + " ".join(shlex.quote(a) for a in args) + "\n",
        "torchtitan/job.toml": toml_job(ctx),
    }
    reg = custom_registry(ctx)
    if reg:
        out[f"torchtitan/{CUSTOM_MODULE}.py"] = reg
    return out


def parse_command(text: str) -> list[str]:
    """The arguments after ``-m torchtitan.train`` from command.txt."""
    for line in text.splitlines():
        if line.startswith("python -m torchtitan.train "):
            return shlex.split(line)[3:]
    raise ValueError("no 'python -m torchtitan.train' line")


def _toml(v) -> str:
    if isinstance(v, list):
        import json

        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)
