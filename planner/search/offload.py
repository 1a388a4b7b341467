"""Megatron's optimizer CPU offload as a choice of ``plan``: off unless nothing fits without it.

The offload fraction is a recipe setting (``Recipe.optimizer_offload_fraction``), fixed for one search. With
the setting on auto (None) and a trainer that has the knob, ``plan`` searches without offload first; only
when no layout fits in memory does it search again with the smallest fraction of ``FRACTIONS`` that can
fit, then the next. The step-time model never makes offload pay otherwise: the host's optimizer step
(``planner/cost/terms/cpu_optimizer.py``) adds to the step and the freed HBM buys nothing the search does
not already reach (it could, in principle, let a layout drop recompute: not searched; say so).

A fraction is skipped without a search when even the even split of the model over every GPU offered
cannot hold it (``necessary``): in HBM, the weights (none with NVFP4 parameters), gradients and the optimizer's
GPU share of ``P / W`` parameters per GPU (``planner.cost.memory``'s bytes; activations and the reserve left out); on
the host, the node's ranks at ``memory.host_bytes`` each. Both are what every layout needs at least (the
worst rank holds at least the average), so a skipped fraction has no layout that fits.
"""

from __future__ import annotations

from planner.cost.memory import GIB, gpu_optimizer_bytes, host_bytes, host_usable_gib, options_for, state_bytes, \
    usable_hbm_gib
from planner.errors import InfeasibleError
from planner.model.flops import param_counts
from planner.trainers import get_trainer

FRACTIONS = (0.25, 0.5, 0.75, 1.0)
NO_BF16_WEIGHTS = frozenset({"nvfp4"})   # precisions whose parameters may be the quantised tensors under offload
KNOB = "optimizer_offload_fraction"


def auto(training, trainer: str | None) -> bool:
    """Whether ``plan`` may choose the offload: the recipe leaves it unset and the trainer has the knob."""
    t = get_trainer(trainer or training.trainer)
    return KNOB in t.knobs and getattr(training.recipe, KNOB, None) is None


def with_fraction(training, f: float):
    """``training`` with the recipe's offload fraction set to ``f``."""
    return training.model_copy(update={"recipe": training.recipe.model_copy(update={KNOB: f})})


def necessary(model, cluster, training, gpus: int, f: float) -> str | None:
    """Why no layout on at most ``gpus`` GPUs of ``cluster`` can fit with fraction ``f`` (module docstring),
    or None when one may."""
    gpu = cluster.gpu_spec
    per_gpu = float(param_counts(model).total) / max(gpus, 1)
    wb, gb, ob = state_bytes(options_for(training), get_trainer(training.trainer).pricing.master_weights)
    if training.precision in NO_BF16_WEIGHTS:   # NVFP4 parameters may replace the BF16 linear weights
        wb = 0.0
    hbm = (wb + gb + gpu_optimizer_bytes(ob, f)) * per_gpu / GIB
    room = usable_hbm_gib(gpu.hbm_gib, training)   # no reserve: a profile may fit a smaller one
    if hbm > room:
        return f"the even split needs {hbm:.1f} GiB of model state per GPU, over the {room:.1f} GiB usable"
    host = gpu.gpus_per_node * host_bytes(per_gpu, f) / GIB
    cap = host_usable_gib(gpu)
    if host > cap:
        return (f"its optimizer state needs {host:,.0f} GiB of host memory per node, over the {cap:,.0f} GiB usable "
                f"of {gpu.host_memory_gb:,.0f} GB")
    return None


def choose(run, model, cluster, gpus: int, training, trainer: str | None):
    """``run(training)`` (one search) without offload; when it finds no layout that fits in memory and the
    offload is on auto, again with each fraction that ``necessary`` allows, smallest first. The result's
    solver notes say when the offload was needed to fit. Raises the first refusal, extended with why the
    offload did not help, when nothing fits."""
    try:
        return run(training)
    except InfeasibleError as exc:
        if not (getattr(exc, "memory", False) and auto(training, trainer)):
            raise
        first = exc
    tr = training.model_copy(update={"trainer": trainer or training.trainer})
    why = "no fraction fits"
    for f in FRACTIONS:
        skip = necessary(model, cluster, tr, gpus, f)
        if skip is not None:
            why = f"with optimizer CPU offload {f:g}, {skip}"
            continue
        try:
            res = run(with_fraction(training, f))
        except InfeasibleError as exc:
            if not getattr(exc, "memory", False):
                raise
            why = f"with optimizer CPU offload {f:g}: {exc}"
            continue
        res.solver["optimizer_offload"] = {"fraction": f, "needed_to_fit": True, "without": str(first)}
        res.solver.setdefault("notes", []).append(offload_line(res.solver))
        return res
    head, sep, remedy = str(first).rpartition(". Use ")   # the offload's reason before the remedies
    err = InfeasibleError(f"{head}; {why}. Use {remedy}" if sep else f"{first}; {why}")
    err.memory = True
    raise err


def offload_line(solver) -> str:
    """The line that says why a plan offloads the optimizer (``solver["optimizer_offload"]``), or ""."""
    o = (solver or {}).get("optimizer_offload")
    if not o:
        return ""
    return (f"optimizer CPU offload {o['fraction']:g} (--optimizer-offload-fraction {o['fraction']:g}): needed to fit; "
            f"without it {str(o.get('without') or 'no layout fits').split(': ', 1)[-1]}. The host's Adam step is the "
            "cpu_optimizer term (extrapolated: no measured run)")
