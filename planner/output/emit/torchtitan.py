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
        stages = c.pp * c.vpp
        if ctx.model.num_layers % stages == 0:
            p["pipeline_parallel_layers_per_stage"] = ctx.model.num_layers // stages
    return p


def command_args(ctx: EmitContext) -> list[str]:
    """Arguments after ``-m torchtitan.train`` (0.3.0)."""
    module, config, _ = model_entry(ctx)
    if config is None:
        module, config = CUSTOM_MODULE, _custom_name(ctx)
    local, gbs, _ = batch(ctx)
    a = ["--module", module, "--config", config]
    for k, v in parallelism(ctx).items():
        if isinstance(v, bool):  # tyro booleans are flags: --x / --no-x
            a.append(f"--parallelism.{k}" if v else f"--parallelism.no_{k}")
        else:
            a += [f"--parallelism.{k}", str(v)]
    a += ["--training.local_batch_size", str(local), "--training.global_batch_size", str(gbs),
          "--training.seq_len", str(ctx.training.seq_len)]
    if ctx.config.pp > 1 or (ctx.model.num_experts and ctx.config.ep > 1):
        # Trainer.Config._validate_cuda_graphs: CUDA graphs support neither PP nor the all-to-all EP dispatcher
        a.append("--training.disable_cuda_graphs")
    a.append(f"activation-checkpoint:{ac_mode(ctx)}")
    return a


def _custom_name(ctx: EmitContext) -> str:
    return ctx.model.name.lower().replace("-", "_").replace(".", "_")


def custom_registry(ctx: EmitContext) -> str | None:
    module, config, flavour = model_entry(ctx)
    if config is not None:
        return None
    base = BASE_CONFIG[module]
    return f'''"""TorchTitan 0.3.0 config registry written by topoplan: {ctx.model.name} has a model flavour
({flavour!r}) in torchtitan.models.{module} but no registry function. It starts from {base}() and swaps
the model; put this directory on PYTHONPATH and pass --module {CUSTOM_MODULE} --config {_custom_name(ctx)}."""

from torchtitan.models.{module} import model_registry
from torchtitan.models.{module}.config_registry import {base}


def {_custom_name(ctx)}():
    config = {base}()
    config.model_spec = model_registry({flavour!r})
    config.hf_assets_path = "./assets/hf/{_hf_dir(ctx)}"
    return config
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
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)
