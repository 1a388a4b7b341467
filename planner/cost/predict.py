"""Predict one layout: throughput, step time with its breakdown, memory per GPU and the rule check.

``predict(model, cluster, config, training)`` places the ranks (``planner.cost.placement``), prices the
step (``planner.cost.steptime`` with the stack profile ``training.stack``), estimates memory
(``planner.cost.memory``) and reports model TFLOP/s per GPU in the Megatron-Bridge convention
(``planner.model.flops.flops_per_token`` with the profile's formula)::

    tokens_per_s          = gbs * seq_len / step_time
    tflops_per_gpu        = tokens_per_s / world * flops_per_token / 1e12

The result is the one ``planner.cost.prediction.Prediction``. Broken trainer rules do not raise: they
are listed in ``violations`` (the CLI exits 2 on them).
Per-(model, cluster, training) pieces are memoised, so a call takes about a millisecond.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache

from planner.config import ParallelConfig, Training
from planner.cost.dispatch_fabric import dispatcher_problem
from planner.cost.memory import memory_per_gpu, options_for, usable_hbm_gib
from planner.cost.placement import Placement, default_gpus_per_domain, group_shapes, make_placement
from planner.cost.prediction import Prediction
from planner.cost.profiles import load_profile
from planner.cost.steptime import TERMS, step_time
from planner.cost.uncertainty import band
from planner.errors import InputError
from planner.model.flops import flops_per_token
from planner.model.pipeline import pipeline_layout
from planner.rules import effective_recipe, violations as rule_violations


@lru_cache(maxsize=256)
def _flops_per_token(model, seq_len: int, tp: int, formula: str) -> float:
    return flops_per_token(model, seq_len, tp=tp, formula=formula)


_MEM_CACHE: dict = {}


def _memory(model, config, training, world, gpu_spec, layout, balance=None, profile=None, recipe=None):
    # every input of memory_per_gpu: the whole Training (the trainer sets gradient and state bytes)
    # and the profile's fitted memory terms (issue 13)
    opts = options_for(training, profile)
    key = (model, config, training, world, gpu_spec.name, gpu_spec.host_memory_gb, balance, opts)
    hit = _MEM_CACHE.get(key)
    if hit is None:
        hit = memory_per_gpu(model, config, training, world, gpu_spec, layout=layout, expert_balance=balance,
                             options=opts, recipe=recipe)
        if len(_MEM_CACHE) > 4096:
            _MEM_CACHE.clear()
        _MEM_CACHE[key] = hit
    return hit


def predict(model, cluster, config: ParallelConfig, training: Training, *, placement: Placement | None = None,
            profile=None, expert_balance=None) -> Prediction:
    """Predicted throughput, step time, breakdown and memory of ``config`` on ``cluster``.

    ``config.dispatcher = None`` takes the stack profile's dispatcher; ``Prediction.config`` (and
    ``to_dict()["dispatcher"]``) report the dispatcher that was priced.
    """
    prof = load_profile(profile if profile is not None else training.stack)
    stack_dispatcher = config.dispatcher is None
    if stack_dispatcher:  # None = the stack profile's default dispatcher
        config = config.model_copy(update={"dispatcher": prof.dispatcher})
    # the job's world: dp when set, else the ranks of a given placement, else every healthy GPU
    world = config.world(placement.world if placement is not None else cluster.num_gpus)
    if world > cluster.num_gpus:
        raise InputError(f"config needs {world} GPUs (dp={config.dp}) but cluster {cluster.name!r} has "
                         f"{cluster.num_gpus}; lower --dp or use --gpus {world}")
    viol = rule_violations(model, config, training, world)
    hard = [v for v in viol if v.rule in ("world_div_model_parallel", "dp_matches_world", "expert_grid_div_world",
                                          "pipeline_stages", "experts_div_ep")]
    gpu = cluster.gpu_spec
    empty = OrderedDict((t, 0.0) for t in TERMS)
    if hard:
        return Prediction(tflops_per_gpu=0.0, tokens_per_s_per_gpu=0.0, tokens_per_s=0.0, step_time_s=float("inf"),
                          memory_gib_per_gpu=0.0, hbm_gib=gpu.hbm_gib, fits=False, breakdown=empty, memory={},
                          config=config, world=world, placement=placement, violations=viol, stack=prof.name)
    if placement is None:
        gpd = default_gpus_per_domain(cluster.domain_sizes(), config, world)
        placement = make_placement(cluster, config, world, gpus_per_domain=gpd)
    gpus = cluster.gpus()
    problem = dispatcher_problem(cluster, config, world, placement.order,
                                 [gpus[g].domain for g in placement.rank_to_gpu])
    if problem and stack_dispatcher:   # the stack's flex dispatcher cannot cross this fabric: NCCL's all-to-all
        config = config.model_copy(update={"dispatcher": "alltoall"})
    elif problem:
        raise InputError(problem)
    shapes = group_shapes(cluster, config, placement)
    layout = pipeline_layout(model, config.pp, config.vpp, config.pp_first, config.pp_last, seq_len=training.seq_len)
    recipe = effective_recipe(model, config, training)   # resolved once; step time and memory read it
    st = step_time(model, cluster, config, training, world, placement, prof, shapes,
                   expert_balance=expert_balance, layout=layout, recipe=recipe)
    fpt = _flops_per_token(model, training.seq_len, config.tp, prof.flops_formula)
    tokens_per_s = training.global_batch * training.seq_len / st.step_time_s
    unc = band(model, cluster, config, training, prof.name, ep_domains=shapes["ep"].domains)
    low, high = unc.bounds(tokens_per_s / world * fpt / 1e12)
    bal = None if expert_balance is None else float(getattr(expert_balance, "balance", expert_balance))
    mem = _memory(model, config, training, world, gpu, layout, bal, prof, recipe)
    peak = float(mem.peak_gib)
    usable = usable_hbm_gib(gpu.hbm_gib, training)  # fits = within HBM less the memory headroom
    return Prediction(
        tflops_per_gpu=tokens_per_s / world * fpt / 1e12,
        tokens_per_s_per_gpu=tokens_per_s / world,
        tokens_per_s=tokens_per_s,
        step_time_s=st.step_time_s,
        memory_gib_per_gpu=peak,
        hbm_gib=gpu.hbm_gib,
        fits=bool(mem.fits(usable)),
        breakdown=st.breakdown,
        memory=dict(mem.components),
        config=config,
        world=world,
        placement=placement,
        violations=viol,
        stack=prof.name,
        details=st.details,
        tflops_per_gpu_low=low,
        tflops_per_gpu_high=high,
        regime=unc.regime.label(),
        extrapolated=unc.extrapolated,
        band_half_width=unc.half_width,
        band_runs=unc.runs,
        usable_gib=usable,
        host_gib_per_node=mem.host_gib_per_node or None,
        host_usable_gib=mem.host_usable_gib if mem.host_gib_per_node else None,
    )
