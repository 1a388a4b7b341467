"""Megatron-LM's launch files read back into a layout and a training setup: the inverse of
``planner.trainers.megatron.emit``.

``megatron_setup(args, model, world)`` turns a Megatron-LM argument list (``megatron/args.txt``, the
flag names of ``planner.trainers.megatron.emit``: ``LAYOUT_FLAGS``, ``RECIPE_FLAGS``,
``PRECISION_FLAGS``, ``DISPATCHER_FLAGS``) into ``(ParallelConfig, Training, order)`` without
megatron-core. The trainer tests check that megatron-core's own ``parse_args`` reads the same values.
``read_megatron(path, model)`` reads ``args.txt`` (and ``WORLD_SIZE`` from the ``env.sh`` next to it).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from planner.config import ParallelConfig, Recipe, Training
from planner.errors import InputError, pydantic_message
from planner.output.emit.readback import _one, _pipeline, _split_of, parse_flags
from planner.trainers.megatron import NAME
from planner.trainers.megatron.emit import (
    DISPATCHER_FLAGS,
    LAYOUT_FLAGS as F,
    OPTIMIZER_OFFLOAD_FLAGS,
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
    precision, fp8_recipe = "bf16", None
    for name, fl in PRECISION_FLAGS.items():
        if fl and all(fl[i + 1] == _one(flags, fl[i], None, str, source) for i in range(0, len(fl), 2)):
            precision = name
    delayed = [f if f != "tensorwise" else "delayed" for f in PRECISION_FLAGS["fp8"]]   # emit.precision_args
    if all(delayed[i + 1] == _one(flags, delayed[i], None, str, source) for i in range(0, len(delayed), 2)):
        precision, fp8_recipe = "fp8", "delayed"
    rec = {"cuda_graph_impl": _one(flags, RECIPE_FLAGS["cuda_graph_impl"], "none", str, source),
           "cuda_graph_modules": tuple(flags.get(RECIPE_FLAGS["cuda_graph_modules"], ())),
           "fsdp_impl": "torch" if F["torch_fsdp2"] in flags else "megatron",
           "fp8_recipe": fp8_recipe or ("tensorwise" if precision == "fp8" else None)}
    for name in RECIPE_BOOLS:
        rec[name] = RECIPE_FLAGS[name] in flags
    rec["cpu_offload_layers"] = _one(flags, RECIPE_FLAGS["cpu_offload_layers"], 0, int, source) or None
    rec.update(_optimizer_offload(flags, source))
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
        training = Training(seq_len=seq, global_batch=gbs, precision=precision, trainer=NAME, stack=stack,
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
        path = path / "args.txt" if (path / "args.txt").is_file() else path / NAME / "args.txt"
    return megatron_setup(read_args_file(path), model, env_world(path), stack=stack, source=str(path))


def claims(path: Path) -> bool:
    """``path`` is Megatron's: args.txt, or a directory holding it or a megatron/ folder."""
    path = Path(path)
    return path.name == "args.txt" or (path.is_dir() and ((path / "args.txt").is_file() or (path / NAME).is_dir()))


def read(path: Path, model, world: int | None = None, *, stack: str | None = None):
    """The Trainer object's read-back (``Trainer.read_back``); the world size comes from env.sh."""
    return read_megatron(path, model, stack=stack)


def _optimizer_offload(flags: dict, source: str) -> dict:
    """The optimizer CPU offload settings of args.txt: off without --optimizer-cpu-offload; with it, the fraction
    (argparse's default 1.0, arguments.py:2785) and the overlap flag; megatron-core's assertion that the
    precision-aware optimizer comes with it (arguments.py:1803-1807) refuses the file otherwise."""
    on, aware = OPTIMIZER_OFFLOAD_FLAGS
    if on not in flags:
        return {"optimizer_offload_fraction": None, "overlap_cpu_optimizer_d2h_h2d": False}
    if aware not in flags:
        raise InputError(f"{source}: {on} needs {aware} (\"The optimizer cpu offload must be used in conjunction "
                         f"with `--use-precision-aware-optimizer`\", megatron-core arguments.py:1803-1807); add it")
    f = _one(flags, RECIPE_FLAGS["optimizer_offload_fraction"], 1.0, float, source)
    if not 0.0 <= f <= 1.0:
        raise InputError(f"{source}: {RECIPE_FLAGS['optimizer_offload_fraction']} {f:g}: use a share of the "
                         "optimizer state between 0 and 1")
    return {"optimizer_offload_fraction": f or None,
            "overlap_cpu_optimizer_d2h_h2d": RECIPE_FLAGS["overlap_cpu_optimizer_d2h_h2d"] in flags}
