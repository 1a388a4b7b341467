"""MaxText overrides: the ``ici_*`` / ``dcn_*`` mesh axes and the batch, as a YAML file of keys that
``python -m maxtext.train base.yml KEY=VALUE ...`` (or ``pyconfig.initialize``) accepts.

MaxText's GPU convention: a *slice* is a set of devices joined by ICI (here: one NVLink domain) and
DCN joins the slices. The plan's layout becomes MaxText's mesh: tensor = TP, context = CP,
expert = EP, fsdp (or data) = the rest of data parallelism (MaxText's expert axis also shards the
batch, so fsdp = DP / EP) and stage = PP. Each axis is split into an ICI part inside a slice and a
DCN part across slices, filling the slice innermost-first in Megatron's order (tensor, context,
expert, fsdp, stage), which is where the plan keeps those groups. MaxText's rules (0.2.5,
``max_utils.fill_unspecified_mesh_axes`` and ``MaxTextConfig``): the product of the ICI axes equals
devices per slice, the product of the DCN axes equals the number of slices, at most one -1 per
group (topoplan writes none), and DCN parallelism needs more than one slice.
"""

from __future__ import annotations

from math import gcd
from pathlib import Path

from planner.output.emit import EmitContext
from planner.output.emit.slurm import node_blocks
from planner.errors import InputError
from planner.trainers.maxtext.families import maxtext_model_name
from planner.trainers.maxtext.model_keys import model_keys, refusal

# MaxText's Transformer Engine recipes (QuantizationType); it has no per-block FP8 recipe, so
# fp8-block uses current (per-tensor) scaling.
QUANTIZATION = {"bf16": None, "fp8": "te_fp8_currentscaling", "fp8-block": "te_fp8_currentscaling",
                "mxfp8": "te_mxfp8", "nvfp4": "te_nvfp4"}
# MaxText's remat policy that recomputes what the plan's recompute prices (planner/cost/terms/compute.py): the
# names each policy saves, AI-Hypercomputer/maxtext e591f30 src/maxtext/layers/decoders.py get_remat_policy and
# minimal_policy. minimal_with_context saves every projection and the attention context (nothing but elementwise
# work is recomputed); minimal saves every projection but not the context (the attention core is recomputed);
# save_dot_except_mlp saves the q/k/v and out projections (the attention core and the MLP are recomputed).
# save_qkv_proj, which this table once wrote for core_attn, also recomputes the out projection and the MLP.
REMAT_POLICY = {"none": "minimal_with_context", "core_attn": "minimal", "core_attn+mlp": "save_dot_except_mlp",
                "full": "full"}
# MaxText axis per planner axis, innermost (smallest stride) first
AXES = ("tensor", "context", "expert", "fsdp", "pipeline")


def slices(ctx: EmitContext) -> tuple[int, int]:
    """(num_slices, devices per slice): one slice per NVLink domain the job uses (all equal)."""
    per: dict[int, int] = {}
    for d in ctx.domains:
        per[d] = per.get(d, 0) + 1
    counts = set(per.values())
    if len(counts) != 1:
        raise InputError(f"--trainer maxtext: the plan uses {sorted(counts)} GPUs in different NVLink domains; "
                         "MaxText needs the same number of devices in every slice (plan with gpus_per_domain)")
    return len(per), counts.pop()


def degrees(ctx: EmitContext) -> dict[str, int]:
    c = ctx.config
    ep = c.ep if ctx.model.num_experts else 1
    if ctx.dp % ep:
        raise InputError(f"--trainer maxtext: EP ({ep}) must divide data parallelism ({ctx.dp}); MaxText's expert "
                         "axis is a mesh axis of its own beside fsdp")
    return {"tensor": c.tp, "context": c.cp, "expert": ep, "fsdp": ctx.dp // ep, "pipeline": c.pp}


def split_mesh(deg: dict[str, int], per_slice: int) -> tuple[dict[str, int], dict[str, int]]:
    """ICI and DCN degree per axis: fill a slice innermost-first (AXES order)."""
    ici, dcn, room = {}, {}, per_slice
    for axis in AXES:
        d = deg[axis]
        inside = gcd(d, room)
        ici[axis], dcn[axis] = inside, d // inside
        room //= inside
    return ici, dcn


def overrides(ctx: EmitContext) -> dict[str, object]:
    name = maxtext_model_name(ctx.model)
    n_slices, per_slice = slices(ctx)
    deg = degrees(ctx)
    ici, dcn = split_mesh(deg, per_slice)
    if _prod(ici.values()) != per_slice or _prod(dcn.values()) != n_slices:
        raise InputError(f"--trainer maxtext: layout {ctx.config.short()} does not factor into {n_slices} slices of "
                         f"{per_slice} devices (ICI {ici}, DCN {dcn}); choose degrees that divide the slice size")
    c, gbs = ctx.config, ctx.training.global_batch
    # MaxText's model keys for the config (model_keys), over MaxText's own file where it ships one; a model
    # MaxText builds only as its own file (families.MAXTEXT_BUILTIN) is named alone
    out: dict[str, object] = {"model_name": name} if refusal(ctx.model) else model_keys(ctx.model, name)
    out.update({"hardware": "gpu", "num_slices": n_slices, "max_target_length": ctx.training.seq_len})
    micro = c.mbs * ctx.dp                       # sequences per micro-step over the whole job
    if c.pp > 1:
        out["per_device_batch_size"] = _num(gbs / ctx.world)
        out["num_pipeline_microbatches"] = gbs // micro
        # the plan's chunks: pp stages x vpp repeats of equal layer groups (rules._maxtext_pipeline)
        out["pipeline_parallel_layers"] = ctx.model.num_layers
        out["num_layers_per_pipeline_stage"] = ctx.model.num_layers // (c.pp * c.vpp)
        out["num_pipeline_repeats"] = c.vpp
    else:
        out["per_device_batch_size"] = _num(micro / ctx.world)
        out["gradient_accumulation_steps"] = gbs // micro
    for axis in AXES:
        out[f"ici_{axis}_parallelism"] = ici[axis]
    for axis in AXES:
        out[f"dcn_{axis}_parallelism"] = dcn[axis]
    out["ici_data_parallelism"] = 1
    out["dcn_data_parallelism"] = 1
    out["remat_policy"] = remat_policy(c.recompute)
    q = QUANTIZATION[ctx.training.precision]
    if q:
        out["quantization"] = q
    return out


def remat_policy(recompute: str) -> str:
    """MaxText's ``remat_policy`` for a plan's ``recompute`` (``REMAT_POLICY``); InputError for a module set no
    MaxText policy recomputes exactly."""
    if recompute not in REMAT_POLICY:
        raise InputError(f"--trainer maxtext: recompute {recompute!r} has no MaxText remat_policy that recomputes "
                         f"exactly that; use one of {', '.join(REMAT_POLICY)}")
    return REMAT_POLICY[recompute]


def render(data: dict[str, object], ctx: EmitContext) -> str:
    lines = [f"# MaxText overrides written by topoplan for plan {ctx.index}: {ctx.model.name}, {ctx.config.short()}, "
             f"{ctx.world} x {ctx.gpu}.",
             "# One slice = one NVLink domain (ICI); slices talk over DCN. Pass as KEY=VALUE after base.yml."]
    for k, v in data.items():
        lines.append(f"{k}: {yaml_value(v)}")
    return "\n".join(lines) + "\n"


def yaml_value(v) -> str:
    """``v`` as YAML that PyYAML and MaxText's OmegaConf read alike: true/false, floats with a point
    (YAML 1.1 reads ``1e-06`` as a string), lists in flow style."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        text = repr(v)
        return text if "." in text or "e" not in text else text.replace("e", ".0e", 1)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    return str(v)


def files(ctx: EmitContext) -> dict[str, str]:
    return {"maxtext/overrides.yml": render(overrides(ctx), ctx)}


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= x
    return p


def _num(x: float):
    return int(x) if float(x).is_integer() else round(float(x), 6)


def for_trial(directory, iters: int) -> None:
    """``topoplan trial``: the emitted overrides under ``directory`` run ``iters`` steps."""
    p = Path(directory) / "maxtext" / "overrides.yml"
    p.write_text(p.read_text().rstrip("\n") + f"\nsteps: {iters}\n")


# -- slurm/task.sh (planner.output.emit.slurm.trainer_shell) -----------------------------------------------

def unlaunchable(ctx: EmitContext) -> str | None:
    """Why Slurm cannot start MaxText for this plan: one JAX process per host needs whole hosts of ranks."""
    if node_blocks(ctx) is None:
        return ("MaxText runs one JAX process per host and needs whole hosts of consecutive ranks, which this "
                "placement does not have (a host with fewer GPUs); emit megatron or torchtitan instead")
    return None


def task_env(ctx: EmitContext) -> str:
    return ""


def task_command(ctx: EmitContext) -> str:
    """The ``trainer_cmd`` case arm: prints MaxText's train command with the overrides as key=value words."""
    return """      printf '%s%s run_name=topoplan-%q %s\\n' "${MAXTEXT_TRAIN:?set MAXTEXT_TRAIN to the MaxText train command and its base.yml}" \\
        "$(sed -n 's/^\\([A-Za-z0-9_]*\\): \\(.*\\)$/\\1=\\2/p' "$ROOT/maxtext/overrides.yml" | topoplan_quote_lines)" \\
        "${SLURM_JOB_ID:-run}" "$data" ;;"""
