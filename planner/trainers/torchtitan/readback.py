"""TorchTitan 0.3.0's launch files read back into a layout and a training setup: the inverse of
``planner.trainers.torchtitan.emit`` (its command.txt, and the registry module next to it when the
launch names one).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError

from planner.config import ParallelConfig, Recipe, Training
from planner.errors import InputError, pydantic_message
from planner.output.emit.readback import _one, _split_of, parse_flags
from planner.trainers import RECIPE_OFF
from planner.trainers.torchtitan import NAME
from planner.trainers.torchtitan.emit import (
    BASE_COMPILE,
    BASE_PRECISION,
    CONVERTERS,
    CUSTOM_MODULE,
    DEFAULT_COMPILE,
    MODELS,
    custom_stem,
    parse_command,
)


def _tt_precision(registry_text: str | None, config_fn: str, model) -> str:
    """The precision a TorchTitan launch trains in: the converters of the emitted registry
    (``planner.trainers.torchtitan.emit.CONVERTERS``), or the built-in registry function's own recipe."""
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
        training = Training(seq_len=seq, global_batch=gbs, precision=precision, trainer=NAME, stack=stack,
                            recipe=Recipe(**{**RECIPE_OFF,   # the other trainers' settings off, as it runs
                                             "cuda_graph_impl": "transformer_engine" if graphs else "none",
                                             "torch_compile": compiled}))
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, source)) from None
    return config, training, "tp-cp-ep-dp-pp"


def read_torchtitan(path: Path, model, world: int, *, stack: str | None = None):
    """``torchtitan/command.txt`` (or its directory) -> setup; its topoplan_config.py is read when used."""
    path = Path(path)
    if path.is_dir():
        path = path / "command.txt" if (path / "command.txt").is_file() else path / NAME / "command.txt"
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


def claims(path: Path) -> bool:
    """``path`` is TorchTitan's: command.txt, or a directory holding it or a torchtitan/ folder."""
    path = Path(path)
    return path.name == "command.txt" or (path.is_dir() and (
        (path / "command.txt").is_file() or (path / NAME).is_dir()))


def read(path: Path, model, world: int | None = None, *, stack: str | None = None):
    """The Trainer object's read-back (``Trainer.read_back``): a command line does not say the world size."""
    if world is None:
        raise InputError(f"--from {path}: a TorchTitan command line does not say the world size; give --gpus")
    return read_torchtitan(path, model, world, stack=stack)
