"""Read emitted launch files back into a layout and a training setup: the inverse of the emitters.

``megatron_setup(args, model, world)`` turns a Megatron-LM argument list (``megatron/args.txt``, the
flag names of ``planner.output.emit.megatron``: ``LAYOUT_FLAGS``, ``RECIPE_FLAGS``,
``PRECISION_FLAGS``, ``DISPATCHER_FLAGS``) into ``(ParallelConfig, Training, order)`` without
megatron-core: a plain reading of ``--flag value...`` tokens, so that the product needs no trainer
installed. The trainer tests check that megatron-core's own ``parse_args`` reads the same values.
``read_megatron(path, model)`` reads ``args.txt`` (and ``WORLD_SIZE`` from the ``env.sh`` next to it).
``topoplan predict --from megatron/args.txt`` prices what the files run.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError

from planner.config import ParallelConfig, Recipe, Training
from planner.errors import InputError, pydantic_message
from planner.model.pipeline import layout_from_string, pipeline_layout
from planner.output.emit.megatron import (
    DISPATCHER_FLAGS,
    LAYOUT_FLAGS as F,
    PRECISION_FLAGS,
    RECIPE_BOOLS,
    REUSE_GRAD_BUF_FLAG,
    RECIPE_FLAGS,
    HYBRID_FLAG,
    MIXER_FLAGS,
    hybrid_args,
    hybrid_pattern,
    parse_args_file,
    rotary_base,
)
from planner.output.emit.torchtitan import (
    BASE_COMPILE,
    BASE_PRECISION,
    CONVERTERS,
    CUSTOM_MODULE,
    DEFAULT_COMPILE,
    MODELS,
    custom_stem,
    parse_command,
)


def parse_flags(args: list[str]) -> dict[str, list[str]]:
    """``--flag v1 v2 --other`` -> ``{"--flag": ["v1", "v2"], "--other": []}`` (the last one wins)."""
    out: dict[str, list[str]] = {}
    cur = None
    for tok in args:
        if tok.startswith("--") and not _is_number(tok):
            cur = tok
            out[cur] = []
        elif re.fullmatch(r"[a-z][a-z0-9-]*:[a-z0-9-]+", tok):
            cur = None   # a tyro subcommand such as activation-checkpoint:full (TorchTitan)
        elif cur is not None:
            out[cur].append(tok)
    return out


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _one(flags, flag, default=None, kind=str, source="args"):
    vals = flags.get(flag)
    if vals is None:
        return default
    if len(vals) != 1:
        raise InputError(f"{source}: {flag} takes one value, got {vals!r}")
    try:
        return kind(vals[0])
    except ValueError:
        raise InputError(f"{source}: {flag} {vals[0]!r} is not a valid {kind.__name__}") from None


def _pipeline(model, pp: int, text: str | None, seq_len: int, source: str):
    """(vpp, pp_first, pp_last) whose planned layout is exactly ``text`` (Megatron's layout string)."""
    if pp == 1 or not text:
        return 1, None, None
    given = layout_from_string(text, model, pp)
    vpp = given.num_stages // pp
    want = given.megatron_layout()
    counts = given.layer_counts
    for first, last in ((None, None), (counts[0], counts[-1]), (counts[0], None), (None, counts[-1])):
        try:
            if pipeline_layout(model, pp, vpp, first, last, seq_len=seq_len).megatron_layout() == want:
                return vpp, first, last
        except InputError:
            continue
    raise InputError(f"{source}: --pipeline-model-parallel-layout {text!r} is not a split topoplan's pipeline model "
                     f"makes (pp={pp}, vpp={vpp}); predict it with --pp/--vpp instead")


def _hybrid_split(flags, model, pp: int, seq_len: int, source: str):
    """(vpp, pp_first, pp_last) of a ``--hybrid-layer-pattern`` (its ``|`` segments are the pipeline stages);
    the pattern must be the model's own."""
    text = _one(flags, HYBRID_FLAG, "", str, source)
    if text.replace("|", "") != (hybrid_pattern(model) or ""):
        raise InputError(f"{source}: {HYBRID_FLAG} {text!r} is not --model {model.name}'s block pattern "
                         f"{hybrid_pattern(model)!r}; give the model the files were written for")
    if pp == 1 or "|" not in text:
        return 1, None, None
    return _split_of(model, pp, [len(seg) for seg in text.split("|")], seq_len, source)


def _split_of(model, pp: int, counts: list[int], seq_len: int, source: str):
    """(vpp, pp_first, pp_last) whose planned layout has exactly these decoder layers per stage."""
    if len(counts) % pp:
        raise InputError(f"{source}: {len(counts)} pipeline stages do not divide over pp={pp} ranks")
    vpp = len(counts) // pp
    for first, last in ((None, None), (counts[0], counts[-1]), (counts[0], None), (None, counts[-1])):
        try:
            if list(pipeline_layout(model, pp, vpp, first, last, seq_len=seq_len).layer_counts) == counts:
                return vpp, first, last
        except InputError:
            continue
    raise InputError(f"{source}: the stage split {counts} is not one topoplan's pipeline model makes "
                     f"(pp={pp}, vpp={vpp})")


def megatron_setup(args: list[str], model, world: int | None = None, *, stack: str | None = None,
                   source: str = "megatron/args.txt") -> tuple[ParallelConfig, Training, str]:
    """The layout, training setup (recipe included) and rank order a Megatron argument list runs."""
    flags = parse_flags(args)
    for flag, have in (("--num-layers", model.num_layers), ("--hidden-size", model.hidden_size),
                       ("--num-experts", model.num_experts or None)):
        given = _one(flags, flag, None, int, source)
        if given != have:
            raise InputError(f"{source}: {flag} is {given} but --model {model.name} has {have}; give the model the "
                             "files were written for")
    _check_hyperparams(flags, model, source)
    tp = _one(flags, F["tp"], 1, int, source)
    pp = _one(flags, F["pp"], 1, int, source)
    cp = _one(flags, F["cp"], 1, int, source)
    ep = _one(flags, F["ep"], 1, int, source)
    etp = _one(flags, F["etp"], None, int, source)
    mbs = _one(flags, F["mbs"], 1, int, source)
    gbs = _one(flags, F["gbs"], None, int, source)
    seq = _one(flags, F["seq_len"], None, int, source)
    if gbs is None or seq is None:
        raise InputError(f"{source}: {F['gbs']} and {F['seq_len']} are needed to price a step; add them")
    vpp, first, last = _hybrid_split(flags, model, pp, seq, source) if HYBRID_FLAG in flags else \
        _pipeline(model, pp, _one(flags, F["layout"], None, str, source), seq, source)
    gran = _one(flags, F["recompute_granularity"], None, str, source)
    recompute = "full" if gran == "full" else (
        "+".join(flags.get(F["recompute_modules"], ["core_attn"])) if gran == "selective" else "none")
    fsdp = F["megatron_fsdp"] in flags or F["torch_fsdp2"] in flags
    dispatcher = None
    if model.num_experts:
        wanted = [flags.get(f, [None])[0] for f in (F["dispatcher"], F["flex_backend"])]
        for name, fl in DISPATCHER_FLAGS.items():
            vals = fl[1::2]
            if wanted[0] == vals[0] and (len(vals) == 1 or wanted[1] == vals[1]):
                dispatcher = name
                break
        if dispatcher is None:
            raise InputError(f"{source}: MoE dispatcher {wanted[0]!r}/{wanted[1]!r} is not one topoplan prices; "
                             f"use {', '.join(DISPATCHER_FLAGS)}")
    precision = "bf16"
    for name, fl in PRECISION_FLAGS.items():
        if fl and all(fl[i + 1] == _one(flags, fl[i], None, str, source) for i in range(0, len(fl), 2)):
            precision = name
    rec = {"cuda_graph_impl": _one(flags, RECIPE_FLAGS["cuda_graph_impl"], "none", str, source),
           "cuda_graph_modules": tuple(flags.get(RECIPE_FLAGS["cuda_graph_modules"], ())),
           "fsdp_impl": "torch" if F["torch_fsdp2"] in flags else "megatron"}
    for name in RECIPE_BOOLS:
        rec[name] = RECIPE_FLAGS[name] in flags
    rec["cpu_offload_layers"] = _one(flags, RECIPE_FLAGS["cpu_offload_layers"], 0, int, source) or None
    reuse = REUSE_GRAD_BUF_FLAG in flags
    if reuse and not rec["fp8_param_gather"]:   # distributed_data_parallel_config.py:253-254
        raise InputError(f"{source}: {REUSE_GRAD_BUF_FLAG} needs {RECIPE_FLAGS['fp8_param_gather']} (\"Reuse grad "
                         "buffer only when keeping params in MXFP8.\"); add it or drop the reuse flag")
    if precision == "mxfp8" and rec["fp8_param_gather"] and not fsdp and not reuse:
        raise InputError(f"{source}: {RECIPE_FLAGS['fp8_param_gather']} with --fp8-recipe mxfp8 needs "
                         f"{REUSE_GRAD_BUF_FLAG} (Megatron-Bridge mixed_precision.py:106-111; the MXFP8 parameters "
                         "are gathered through the gradient buffer); add it")
    try:
        config = ParallelConfig(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs=mbs, fsdp=fsdp, recompute=recompute,
                                dispatcher=dispatcher, pp_first=first, pp_last=last,
                                dp=None if world is None else world // (tp * pp * cp))
        training = Training(seq_len=seq, global_batch=gbs, precision=precision, trainer="megatron", stack=stack,
                            recipe=Recipe(**rec))
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, source)) from None
    order = "tp-cp-ep-pp-dp" if F["tp_pp_dp"] in flags else "tp-cp-ep-dp-pp"
    return config, training, order


def _check_hyperparams(flags: dict, model, source: str) -> None:
    """The files train the model's config: rope base, norm eps and router score function as ModelSpec says
    (files written before topoplan carried them, or for another config, are refused, naming the flag)."""
    checks = [("--rotary-base", float(rotary_base(model)), "rope_theta"), ("--norm-epsilon", model.norm_eps, "rms_norm_eps")]
    for flag, have, field in checks:
        given = _one(flags, flag, None, float, source)
        if given is not None and abs(given - have) > 1e-9 * max(abs(have), 1e-30):
            raise InputError(f"{source}: {flag} is {given:g} but --model {model.name} has {field} {have:g}; the files "
                             "train another model: emit them again for this model, or give the model they were "
                             "written for")
    score = _one(flags, "--moe-router-score-function", None, str, source)
    if model.num_experts and score is not None and score != model.router_score:
        raise InputError(f"{source}: --moe-router-score-function is {score} but --model {model.name} routes with "
                         f"{model.router_score} (scoring_func); emit the files again for this model")
    _check_mixers(flags, model, source)


def _check_mixers(flags: dict, model, source: str) -> None:
    """The files build the model's token mixers: every mixer flag (``megatron.MIXER_FLAGS``) as the
    emitter writes it for this model, none it would not write."""
    want = {f: v for f, v in parse_flags(hybrid_args(model)).items() if f in MIXER_FLAGS}
    for flag in MIXER_FLAGS:
        given = flags.get(flag)
        if given != want.get(flag):
            def say(v):
                return "absent" if v is None else (" ".join(v) or "set")
            raise InputError(f"{source}: {flag} is {say(given)} but --model {model.name} needs {say(want.get(flag))}; "
                             "the files build other token mixers: emit them again for this model")


def read_args_file(path: Path) -> list[str]:
    try:
        return parse_args_file(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"--from {path}: cannot read it ({exc.strerror}); give megatron/args.txt of an emitted plan") \
            from None
    except ValueError as exc:
        raise InputError(f"--from {path}: not shell words ({exc})") from None


def env_world(path: Path) -> int | None:
    """``WORLD_SIZE`` exported by the env.sh next to args.txt (None when there is none)."""
    env = Path(path).with_name("env.sh")
    if not env.is_file():
        return None
    for line in env.read_text().splitlines():
        if line.startswith("export WORLD_SIZE="):
            try:
                return int(line.split("=", 1)[1].strip("'\""))
            except ValueError:
                raise InputError(f"{env}: WORLD_SIZE is not an integer") from None
    return None


def read_megatron(path: Path, model, *, stack: str | None = None) -> tuple[ParallelConfig, Training, str]:
    """``megatron/args.txt`` (or the directory holding it, or the --out directory) -> setup."""
    path = Path(path)
    if path.is_dir():
        path = path / "args.txt" if (path / "args.txt").is_file() else path / "megatron" / "args.txt"
    return megatron_setup(read_args_file(path), model, env_world(path), stack=stack, source=str(path))


# --- TorchTitan 0.3.0 -------------------------------------------------------------------------

def _tt_precision(registry_text: str | None, config_fn: str, model) -> str:
    """The precision a TorchTitan launch trains in: the converters of the emitted registry
    (``planner.output.emit.torchtitan.CONVERTERS``), or the built-in registry function's own recipe."""
    if registry_text is None:
        return BASE_PRECISION.get(model.name.lower(), "bf16")
    line = next((ln for ln in registry_text.splitlines() if "converters=" in ln), "")
    if not line or "converters=None" in line:
        return "bf16"
    for name, (linear, _) in CONVERTERS.items():   # the class and its recipe name identify the precision
        recipe = re.search(r'recipe_name="\w+"', linear)
        if linear.split("(")[0] + "(" in line and (recipe is None or recipe.group(0) in line):
            return name
    raise InputError(f"torchtitan/{config_fn}: converters {line.strip()!r} are not a precision topoplan prices")


def torchtitan_setup(args: list[str], model, world: int, *, registry_text: str | None = None,
                     stack: str | None = None, source: str = "torchtitan/command.txt"):
    """The layout and training setup a TorchTitan 0.3.0 command line (and its topoplan_config.py) run."""
    flags = parse_flags(args)
    config_fn = _one(flags, "--config", "", str, source)
    module = _one(flags, "--module", "", str, source)
    known = MODELS.get(model.name.lower())
    base = custom_stem(model.name)   # torchtitan._custom_name's stem
    custom_ok = module == CUSTOM_MODULE and (config_fn == base or config_fn.startswith(base + "_"))
    if not (custom_ok or (known is not None and (module, config_fn) == known[:2])):
        raise InputError(f"{source}: --module {module} --config {config_fn} is not {model.name} "
                         f"({'torchtitan has no model for it' if known is None else f'--module {known[0]}'}); "
                         "give the model the files were written for")

    def par(key, default=None, kind=int):
        return _one(flags, f"--parallelism.{key}", default, kind, source)

    tp, pp, cp = par("tensor_parallel_degree", 1), par("pipeline_parallel_degree", 1), par("context_parallel_degree", 1)
    ep = par("expert_parallel_degree", 1)
    shard = par("data_parallel_shard_degree", -1)
    local = _one(flags, "--training.local_batch_size", None, int, source)
    gbs = _one(flags, "--training.global_batch_size", None, int, source)
    seq = _one(flags, "--training.seq_len", None, int, source)
    if None in (local, gbs, seq):
        raise InputError(f"{source}: --training.local_batch_size, global_batch_size and seq_len are needed")
    mbs = par("pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    vpp, first, last = 1, None, None
    schedule = par("pipeline_parallel_schedule", "1F1B", str)
    parts = flags.get("--parallelism.module_fqns_per_model_part")
    if pp > 1 and parts:
        counts = [sum(1 for m in part.split(",") if m.startswith("layers.")) for part in parts]
        vpp, first, last = _split_of(model, pp, counts, seq, source)
    elif pp > 1:
        lps = par("pipeline_parallel_layers_per_stage", None)
        multi = schedule.lower() not in ("1f1b", "gpipe")
        # TorchTitan's own split: ceil((L + 2) / lps) stages, or 1 (single-stage schedules) / 2 per rank
        stages = -(-(model.num_layers + 2) // lps) if lps else pp * (2 if multi else 1)
        vpp = max(1, stages // pp)
    ac = next((t.split(":", 1)[1] for t in args if t.startswith("activation-checkpoint:")), "none")
    recompute = {"none": "none", "full": "full", "selective": "core_attn"}.get(ac)
    if recompute is None:
        raise InputError(f"{source}: activation-checkpoint:{ac} is not a recompute topoplan prices")
    dp = shard if shard > 0 else world // (tp * pp * cp)
    precision = _tt_precision(registry_text, config_fn, model)
    graphs = "--training.no_disable_cuda_graphs" in flags
    compiled = None   # no compile flags: the registry function's own (Recipe.torch_compile None)
    if "--compile.enable" in flags or "--compile.no_enable" in flags or "--compile.components" in flags:
        on = "--compile.enable" in flags if ("--compile.enable" in flags or "--compile.no_enable" in flags) \
            else BASE_COMPILE.get(config_fn, DEFAULT_COMPILE)[0]
        given = [c for v in flags.get("--compile.components", []) for c in v.split(",") if c]
        components = given or list(BASE_COMPILE.get(config_fn, DEFAULT_COMPILE)[1])
        compiled = bool(on and "model" in components)
    try:
        config = ParallelConfig(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep if model.num_experts else 1,
                                etp=1 if (model.num_experts and ep > 1) else None, dp=dp, mbs=mbs, fsdp=True,
                                recompute=recompute, dispatcher="alltoall" if model.num_experts else None,
                                pp_first=first, pp_last=last)
        training = Training(seq_len=seq, global_batch=gbs, precision=precision, trainer="torchtitan", stack=stack,
                            recipe=Recipe(cuda_graph_impl="transformer_engine" if graphs else "none",
                                          moe_permute_fusion=False, moe_router_fusion=False,
                                          cross_entropy_loss_fusion=False, overlap_moe_expert_parallel_comm=False,
                                          delay_wgrad_compute=False, tp_comm_overlap=False,
                                          moe_router_enable_expert_bias=False, cuda_graph_modules=(),
                                          fp8_param_gather=False, fp4_param_gather=False, torch_compile=compiled))
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, source)) from None
    return config, training, "tp-cp-ep-dp-pp"


def read_torchtitan(path: Path, model, world: int, *, stack: str | None = None):
    """``torchtitan/command.txt`` (or its directory) -> setup; its topoplan_config.py is read when used."""
    path = Path(path)
    if path.is_dir():
        path = path / "command.txt" if (path / "command.txt").is_file() else path / "torchtitan" / "command.txt"
    try:
        args = parse_command(path.read_text())
    except OSError as exc:
        raise InputError(f"--from {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise InputError(f"--from {path}: {exc}; give torchtitan/command.txt of an emitted plan") from None
    reg = None
    if _one(parse_flags(args), "--module", None, str, str(path)) == CUSTOM_MODULE:
        reg_path = path.with_name(f"{CUSTOM_MODULE}.py")
        if not reg_path.is_file():
            raise InputError(f"--from {path}: it uses --module {CUSTOM_MODULE} but {reg_path} is missing")
        reg = reg_path.read_text()
    return torchtitan_setup(args, model, world, registry_text=reg, stack=stack, source=str(path))


def read_files(path: Path, model, world: int | None = None, *, stack: str | None = None):
    """Megatron (args.txt) or TorchTitan (command.txt) files -> (ParallelConfig, Training, order). A
    directory is read as Megatron's when it holds args.txt or megatron/, else as TorchTitan's."""
    path = Path(path)
    megatron_dir = path.is_dir() and ((path / "args.txt").is_file() or (path / "megatron").is_dir())
    titan = path.name == "command.txt" or (path.is_dir() and not megatron_dir and (
        (path / "command.txt").is_file() or (path / "torchtitan").is_dir()))
    if titan:
        if world is None:
            raise InputError(f"--from {path}: a TorchTitan command line does not say the world size; give --gpus")
        return read_torchtitan(path, model, world, stack=stack)
    return read_megatron(path, model, stack=stack)
