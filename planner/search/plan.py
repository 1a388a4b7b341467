"""``plan``: the parallel layout and its placement that maximise predicted throughput, proven optimal
for the step-time model over the declared space (``planner.search.space``).

How (docs/solver.md has the whole argument):

1. ``planner.search.space`` lists the candidates of every choice (TP, CP, PP, VPP, pipeline split, EP,
   ETP, DP, MBS, recompute, FSDP, dispatcher, global batch, GPUs per NVLink domain) and turns the
   trainer's rules into allowed-tuple tables over the few choices each rule reads.
2. ``planner.search.program``: the step time of ``planner.cost.steptime`` rebuilt as a program of ``solver.layout``: every cost
   term is a table over the few choices (or derived quantities: the world size, each axis's worst
   group shape on the topology) it depends on, computed with the same cost functions
   (``planner.cost.terms``) that ``predict`` uses; ``steptime``'s composition (sums, exposed =
   max((1-o) t, t - window, 0), the slowest pipeline rank, bubble and micro-batch products, the DP
   and optimizer terms of the slowest rank) is written with sums, maxima, products, an element and a
   first-argmax node. The program's step time equals ``steptime``'s up to rounding each table entry
   to a nanosecond (1/840 ns for terms that carry the bubble factor); the tests check it against
   ``predict`` on enumerated layouts.
3. Memory: a lower bound (model state averaged over the pipeline ranks) prunes inside the program;
   the exact ``planner.cost.memory`` peak is a lazy constraint: a solution that does not fit is cut off
   together with every layout that agrees with it on the choices memory depends on, and the
   program is solved again.
4. Winners are re-checked: ``rules.violations`` must be empty, and ``predict`` (with the chosen
   placement) gives the reported figures.

Placement: ranks fill ``gpd`` GPUs of each NVLink domain in the cluster's canonical order
(``planner.cost.placement.make_placement``) in Megatron's rank order ``tp-cp-ep-dp-pp``; ``gpd`` is a
choice of the program, so degrees and placement are chosen together.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from planner.config import ParallelConfig, Training
from planner.cost.goodput import Resilience, plan_goodput
from planner.cost.dispatch_fabric import dispatcher_problem, fabric_note
from planner.cost.hybridep import hybridep_runs
from planner.cost.memory import memory_per_gpu, options_for, usable_hbm_gib
from planner.cost.placement import axis_stride_size, make_placement
from planner.cost.predict import predict
from planner.cost.prediction import Prediction
from planner.cost.profiles import load_profile
from planner.cost.shape import shape_of_placement
from planner.cost.uncertainty import lead, safe_order
from planner.errors import InfeasibleError, InputError
from planner.model.flops import param_counts
from planner.rules import violations
from planner.search.bounds import bound_factors, exhaustive
from planner.search import offload as OFFLOAD
from planner.search.document import PlanDocument
from planner.search.objective import band_scale_of
from planner.search.program import ProgramBuilder, quantisation_bound, step_seconds, used_per_domain
from planner.search.space import VARIABLES, build_space, gpd_candidates
from planner.trainers import get_trainer
from solver import layout as engines   # engines.solve / solve_bounded load OR-Tools on first use
from solver.layout import enumerate_bounded, evaluate_many, feasible_rows
from solver.numpy_engine import ancestors
from topologies.loader import Job

OBJECTIVES = ("throughput", "tflops-per-gpu", "robust", "goodput")
# the quantity each objective maximises, as the plan document names it
OBJECTIVE_NAMES = {"throughput": "tokens_per_s", "robust": "tokens_per_s_low", "tflops-per-gpu": "tflops_per_gpu",
                   "goodput": "goodput_tokens_per_s"}
# Search engines over the same program (docs/solver.md): "enumerate" (default) and "cp-sat" walk
# blocks in order of one separable lower bound, numpy or CP-SAT enumerating the blocks under the
# rules; "exhaustive" evaluates every assignment (the oracle); "cp-sat-full" is the whole
# nonlinear program in CP-SAT (small spaces).
METHODS = ("enumerate", "cp-sat", "exhaustive", "cp-sat-full")
# Choices the memory estimate does not read (a memory cut may cover every value of these).
_MEMORY_FREE = ("dispatcher", "gpd")


@dataclass
class PlanEntry:
    config: ParallelConfig
    prediction: Prediction
    placement: object             # planner.cost.placement.Placement
    world: int
    gbs: int
    shapes: dict = field(default_factory=dict)
    program_step_s: float | None = None
    goodput: object | None = None  # planner.cost.goodput.Goodput

    @property
    def label(self) -> str:
        return self.config.short()


@dataclass
class PlanResult:
    plans: list[PlanEntry]
    solver: dict
    model: object
    cluster: object
    training: Training

    def document(self):
        """The plan document as its typed value (``planner.search.document.PlanDocument``)."""
        return PlanDocument.model_validate(self.to_dict())

    def to_dict(self) -> dict:
        """The plan.json document (docs/architecture.md; ``document()`` is the same, typed)."""
        gpus = self.cluster.gpus()
        plans = []
        for e in self.plans:
            c = e.config
            cfg = {"tp": c.tp, "pp": c.pp, "vpp": c.vpp, "cp": c.cp, "ep": c.ep, "etp": c.etp_eff,
                   "dp": c.dp, "mbs": c.mbs, "gbs": e.gbs, "fsdp": c.fsdp, "recompute": c.recompute,
                   "dispatcher": c.dispatcher, "pp_first": c.pp_first, "pp_last": c.pp_last,
                   "edp": c.edp_for(e.world), "world": e.world}
            r2g = list(e.placement.rank_to_gpu)
            placement = {"order": e.placement.order, "gpus_per_domain": e.placement.gpus_per_domain,
                         "rank_to_gpu": r2g,
                         "hosts": [gpus[g].node for g in r2g],
                         "local_ranks": [gpus[g].local for g in r2g],
                         "domains": {ax: sh[2] for ax, sh in e.shapes.items()},
                         "domains_used": len({gpus[g].domain for g in r2g}),
                         "shape": shape_of_placement(self.cluster, c, e.placement).model_dump(mode="json")}
            entry = {"label": e.label, "config": cfg, "prediction": e.prediction.document(),
                     "placement": placement}
            if e.goodput is not None:
                entry["goodput"] = e.goodput.to_dict()
            plans.append(entry)
        _mark_leads(plans, self.solver.get("objective_name"))
        t = self.training
        return {
            "version": 1,
            "model": {"name": self.model.name, "spec": self.model.model_dump(mode="json")},
            "cluster": self.cluster.model_dump(mode="json"),
            "training": {"seq_len": t.seq_len, "global_batch": t.global_batch, "precision": t.precision,
                         "stack": t.stack, "trainer": t.trainer, "cuda_graphs": t.cuda_graphs,
                         "memory_headroom": t.memory_headroom,
                         "recipe": t.recipe.model_dump(mode="json")},
            "plans": plans,
            "solver": dict(self.solver),
        }


# ----------------------------------------------------------------------------------------------


# -- issue 11 item 5: GPUs per NVLink domain of a job -------------------------------------------------


def even_per_domain(domain_sizes: list[int], gpus: int, per_node: int) -> int | None:
    """The even split of a job of ``gpus`` over the fewest domains that hold it, rounded up to whole
    nodes (256 on 72-GPU racks: 64 each); None when it is the full domain or domains are nodes."""
    if not domain_sizes or max(domain_sizes) <= per_node:
        return None
    dmax = max(domain_sizes)
    racks = math.ceil(gpus / dmax)
    even = math.ceil(math.ceil(gpus / racks) / per_node) * per_node
    return even if even < dmax else None


def gpd_options(job) -> list[int | None]:
    """The GPUs-per-domain choices ``plan`` offers for a ``topologies.loader.Job`` (None = all)."""
    if job.per_domain is not None:
        return [None]
    out = gpd_candidates(job.cluster.domain_sizes())
    even = even_per_domain(job.cluster.domain_sizes(), job.gpus, job.cluster.gpu_spec.gpus_per_node)
    return out + ([even] if even is not None and even not in out else [])


def _maxtext_mesh_ok(cluster, model, cfg, world, gpd) -> bool:
    """MaxText's mesh rule as ``planner.trainers.maxtext.emit.split_mesh`` applies it: the axes
    (tensor, context, expert, fsdp = dp / ep, stage) fill a slice innermost-first by gcd, and the
    ICI part must be the slice and the DCN part the number of slices."""
    used = used_per_domain(cluster, gpd, world)
    if len(set(used)) != 1:
        return False
    per_slice, n_slices = used[0], len(used)
    dp = cfg.dp_for(world)
    ep = cfg.ep if model.is_moe else 1
    if dp % ep:
        return False
    room, ici = per_slice, 1
    for d in (cfg.tp, cfg.cp, ep, dp // ep, cfg.pp):
        inside = math.gcd(d, room)
        ici *= inside
        room //= inside
    return ici == per_slice and world // ici == n_slices


def plan(model, cluster, training: Training, top: int = 3, time_limit: float | None = None,
         objective: str = "throughput", gbs_range: tuple[int, int] | None = None, trainer: str | None = None,
         *, workers: int = 2, min_world: int | None = None, include: dict | None = None,
         profile=None, method: str = "enumerate", restrict: dict | None = None,
         equal_slices: bool | None = None, resilience: Resilience | None = None) -> PlanResult:
    """The ``top`` best layouts with their placement, best first, and the solver's proof status.

    ``min_world``: the fewest GPUs a plan may use (default: half of those offered; a plan may use
    any count from there up to ``cluster.num_gpus``). ``include``: extra candidate values per
    variable (e.g. a published layout) so that they are inside the declared space. ``restrict``:
    keep only these candidate values of some variables (a smaller declared space).
    ``cluster`` may be a ``topologies.loader.Job``: the plan uses at most ``job.gpus`` of its racks'
    GPUs and chooses the GPUs per NVLink domain (the even split is a candidate) unless the job fixes
    them. ``equal_slices`` (default: trainer is maxtext): every NVLink domain used holds the same
    number of GPUs and the layout factors into MaxText's ICI/DCN mesh, so ``emit maxtext`` accepts it.
    ``method`` (all four are exact for the program; docs/solver.md):
    "enumerate" (default): a block is an assignment of every choice but recompute, dispatcher and
    FSDP; each feasible block gets a separable lower bound of the objective (``bound_factors``:
    pipeline factor x heaviest pipeline rank x layer time with the expert all-to-all priced at its
    group shape), and blocks are expanded and evaluated exactly with numpy in bound order until
    the next bound is no better than the top-th fitting layout (OPTIMAL).
    "cp-sat": the same bound and blocks, CP-SAT enumerating the blocks band by band under every
    rule table (logic-based Benders; slower, an independent search of the rules).
    "exhaustive": every assignment the rule tables allow, ordered by the exact CORE + P2P bound
    (the oracle the others are tested against).
    "cp-sat-full": the whole nonlinear program in CP-SAT; practical for small spaces only.
    Every plan carries its goodput (``planner.cost.goodput``, with ``resilience``'s settings);
    ``objective="goodput"`` plans each GPUs-per-domain option for throughput and keeps the plans of
    best goodput (``_plan_by_goodput``: spares against GPUs used; the solver's program is the same).
    """
    if objective == "goodput":
        return _plan_by_goodput(model, cluster, training, top, resilience, dict(
            time_limit=time_limit, gbs_range=gbs_range, trainer=trainer, workers=workers, min_world=min_world,
            include=include, profile=profile, method=method, restrict=restrict, equal_slices=equal_slices))
    job_gpus = cluster.gpus if isinstance(cluster, Job) else cluster.num_gpus
    hardware = cluster.cluster if isinstance(cluster, Job) else cluster

    def run(tr):   # one search; planner.search.offload retries it with the optimizer offloaded if nothing fits
        return _plan_layouts(model, cluster, tr, top, time_limit, objective, gbs_range, trainer, workers, min_world,
                             include, profile, method, restrict, equal_slices, resilience)
    return OFFLOAD.choose(run, model, hardware, job_gpus, training, trainer)


def _plan_layouts(model, cluster, training, top, time_limit, objective, gbs_range, trainer, workers, min_world,
                  include, profile, method, restrict, equal_slices, resilience) -> PlanResult:
    """``plan``'s search for one recipe (its docstring)."""
    if method not in METHODS:
        raise InputError(f"--method {method!r}: use one of {', '.join(METHODS)}")
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise InputError(f"objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    t_build0 = time.perf_counter()
    req, b = program_for(model, cluster, training, objective, trainer=trainer, profile=profile, gbs_range=gbs_range,
                         min_world=min_world, include=include, restrict=restrict, equal_slices=equal_slices)
    t_build = time.perf_counter() - t_build0
    cluster, training, prog = req.cluster, req.training, b.prog

    accept, shortfalls = _acceptor(b, model, cluster, training, req.profile, req.equal_slices,
                                   cheap_first=method != "cp-sat-full")
    factors = bound_factors(b) if method in ("cp-sat", "enumerate") else None
    pool = max(top, SAFE_POOL) if objective in ("throughput", "tflops-per-gpu") else top   # _safe_rank's pool
    res = _search(prog, b, method, factors, pool, accept, time_limit, workers)
    if not res.solutions:
        _refuse(res, b, prog, accept, shortfalls, model, cluster, training, time_limit)

    entries, max_err = _entries(res, b, model, cluster, training, req.trainer, req.profile)
    fastest = entries[0]    # the solver's best: the proven bound is relative to it
    entries, safe = _safe_rank(entries, objective, top)
    _price_goodput(entries, model, cluster, training, resilience)
    best = entries[0].prediction
    if objective == "robust":   # the band's lower edge of the cluster's tokens/s
        obj_val = best.tokens_per_s * math.exp(-best.band_half_width)
    elif objective == "throughput":
        obj_val = best.tokens_per_s
    else:
        obj_val = best.tflops_per_gpu
    bound = _bound_value(res, b, training, fastest, objective)
    solver_info = {
        "status": res.status,
        "wall_s": time.perf_counter() - t0,
        "solve_s": res.wall_s,
        "build_s": t_build,
        "objective": obj_val,
        "objective_name": OBJECTIVE_NAMES[objective],
        "bound": bound,
        "gap": None if bound is None or not obj_val else max(0.0, (bound - obj_val) / obj_val),
        "method": method if factors is not None or method in ("cp-sat-full", "exhaustive") else "exhaustive",
        "evaluated_exactly": getattr(res, "evaluated", res.num_constraints),
        "cpsat_s": getattr(res, "cpsat_s", res.wall_s if method == "cp-sat-full" else 0.0),
        "bands": getattr(res, "bands", 0),
        "statuses": res.statuses,
        "memory_cuts": res.rejected,
        "layouts_in_space": float(req.space.size()),
        "variables": res.num_vars,
        "constraints": res.num_constraints,
        "program_vs_predict_max_rel_err": max_err,
        "min_world": req.min_world,
        "space": {k: list(v) for k, v in req.space.values.items()},
        "layouts": sorted([b.vals["pp"][k[0]], b.vals["vpp"][k[1]], b.vals["split"][k[2]]] for k in b.layouts),
        "notes": b.notes,
        "safe_order": safe,
    }
    return PlanResult(entries, solver_info, model, cluster, training)


def program_for(model, cluster, training: Training, objective: str = "throughput", *, trainer=None, profile=None,
                gbs_range=None, min_world=None, include=None, restrict=None, equal_slices=None):
    """(the request, the built ``ProgramBuilder``) that ``plan`` searches for these arguments."""
    req = _request(model, cluster, training, trainer, profile, gbs_range, min_world, include, restrict,
                   equal_slices)
    b = ProgramBuilder(model, req.cluster, req.training, req.space, req.profile, objective, req.min_world)
    b.n_gpus, b.equal_slices = req.n, req.equal_slices  # issue 11 item 5: the job's GPUs; MaxText slices
    b.build()
    return req, b


def _search(prog, b, method, factors, pool, accept, time_limit, workers):
    """The ``pool`` best layouts by the engine ``method`` names (``METHODS``)."""
    if method == "cp-sat-full":
        return engines.solve(prog, top=pool, time_limit=time_limit, workers=workers, accept=accept)
    if factors is not None and method == "cp-sat":
        return engines.solve_bounded(prog, factors, top=pool, accept=accept, time_limit=time_limit, workers=workers,
                                     master=b.master_vars)
    if factors is not None:
        return enumerate_bounded(prog, factors, b.master_vars, top=pool, accept=accept, time_limit=time_limit)
    # "exhaustive", or no bound could be formed: every assignment, by its exact CORE + P2P bound
    return exhaustive(prog, b, pool, accept, time_limit)


SAFE_POOL = 5   # plans the safe ranking looks at when fewer are asked for (a covered runner-up to promote)


def _safe_rank(entries: list[PlanEntry], objective: str, top: int) -> tuple[list[PlanEntry], list[dict]]:
    """The safe default (``planner.cost.uncertainty.safe_order``; docs/uncertainty.md): an extrapolated
    plan whose lead over a covered one lies inside its band ranks below it. The robust objective
    already prices the band. Returns the ``top`` entries (the solver's fastest among them, last if it
    was pushed further down, when ``top`` >= 2) and, per promotion among them, the ranks (0-based, in
    the new order) of the covered plan and of the extrapolated plan it now ranks above."""
    if objective not in ("throughput", "tflops-per-gpu"):
        return entries[:top], []
    val = (lambda p: p.tokens_per_s) if objective == "throughput" else (lambda p: p.tflops_per_gpu)  # noqa: E731
    preds = [e.prediction for e in entries]
    order, promoted = safe_order([val(p) for p in preds], [p.band_half_width for p in preds],
                                 [p.extrapolated for p in preds])
    keep = order[:top]
    if top >= 2 and 0 not in keep:   # the solver's fastest stays listed (last), so "why not" can say why
        keep = keep[:-1] + [0]
    rank = {i: k for k, i in enumerate(keep)}
    notes = [{"covered": rank[c], "extrapolated": rank[x], "lead": val(preds[x]) / val(preds[c]) - 1.0,
              "why": preds[x].extrapolated} for c, x in promoted if c in rank and x in rank]
    return [entries[i] for i in keep], notes


def _price_goodput(entries, model, cluster, training, resilience) -> None:
    """Each entry's goodput (``planner.cost.goodput``) at its own global batch and placement; the
    spares it counts are the cluster's idle hosts and ``health.spare_trays``."""
    for e in entries:
        e.goodput = plan_goodput(model, cluster, training.model_copy(update={"global_batch": e.gbs}),
                                 e.prediction.tokens_per_s, e.placement.rank_to_gpu, resilience)


def _plan_by_goodput(model, cluster, training, top, resilience, kw) -> PlanResult:
    """``objective="goodput"``: plan for throughput at each GPUs-per-domain option of the job (all of a
    rack, or fewer with whole spare trays: 72 or 64 of 72), price each plan's goodput, and keep the
    ``top`` plans of best goodput. The options' best plans are listed in ``solver["goodput_options"]``."""
    job = cluster if isinstance(cluster, Job) else Job(cluster, cluster.num_gpus, None)
    t0 = time.perf_counter()
    runs, refusal = [], None
    for opt in gpd_options(job):
        restrict = {**(kw.get("restrict") or {}), "gpd": [opt]}
        include = {**(kw.get("include") or {}), "gpd": [opt]}
        try:
            res = plan(model, job, training, top, objective="throughput", resilience=resilience,
                       **{**kw, "restrict": restrict, "include": include})
        except InfeasibleError as exc:
            refusal = exc
            continue
        runs.append((opt, res))
    if not runs:
        raise refusal or InfeasibleError(f"{model.name}: no GPUs-per-domain option has a layout")
    seen, pool = set(), []
    for _, res in runs:
        for e in res.plans:
            key = (e.label, e.world, e.placement.rank_to_gpu)
            if key not in seen:
                seen.add(key)
                pool.append((e, res))
    pool.sort(key=lambda x: -x[0].goodput.goodput_tokens_per_s)
    best_entry, best_run = pool[0]
    solver = dict(best_run.solver)
    solver.update(objective=best_entry.goodput.goodput_tokens_per_s, objective_name="goodput_tokens_per_s",
                  bound=None, gap=None, wall_s=time.perf_counter() - t0, goodput_options=[
                      {"gpus_per_domain": opt, "label": r.plans[0].label, "world": r.plans[0].world,
                       "tokens_per_s": r.plans[0].prediction.tokens_per_s,
                       "goodput_tokens_per_s": r.plans[0].goodput.goodput_tokens_per_s,
                       "effective_fraction": r.plans[0].goodput.effective_fraction,
                       "spare_hosts_per_domain": r.plans[0].goodput.spare_hosts_per_domain,
                       "status": r.solver["status"]} for opt, r in runs])
    return PlanResult([e for e, _ in pool[:top]], solver, model, best_run.cluster, best_run.training)


@dataclass
class _Request:
    """What ``plan`` searches: the cluster, the training (trainer and global batch settled), the
    profile, the declared space, the GPUs offered and the fewest a plan may use."""

    cluster: object
    training: Training
    trainer: str
    profile: object
    space: object
    n: int
    min_world: int
    equal_slices: bool


def _request(model, cluster, training, trainer, profile, gbs_range, min_world, include, restrict,
             equal_slices) -> _Request:
    trainer = trainer or training.trainer
    if trainer != training.trainer:   # priced with the trainer's own profile unless a stack was chosen
        update = {"trainer": trainer}
        if training.stack == get_trainer(training.trainer).default_stack:
            update["stack"] = get_trainer(trainer).default_stack
        training = training.model_copy(update=update)
    prof = load_profile(profile if profile is not None else training.stack)
    # issue 11 item 5: a topologies.loader.Job is the cluster's racks and the GPUs the job uses;
    # the planner chooses the GPUs per NVLink domain unless the job fixes them (--usable-per-rack)
    max_world = None
    if isinstance(cluster, Job):
        job, cluster, max_world = cluster, cluster.cluster, cluster.gpus
        if job.per_domain is not None:
            restrict = {**(restrict or {}), "gpd": [None]}
    n = max_world or cluster.num_gpus
    if equal_slices is None:
        equal_slices = get_trainer(trainer).search.equal_slices
    include = dict(include or {})
    even = even_per_domain(cluster.domain_sizes(), n, cluster.gpu_spec.gpus_per_node)
    if even is not None and not (restrict or {}).get("gpd"):
        include["gpd"] = list(include.get("gpd", [])) + [even]
    if min_world is None:
        min_world = max(1, n // 2)
    if gbs_range is not None and not (gbs_range[0] <= training.global_batch <= gbs_range[1]):
        training = training.model_copy(update={"global_batch": gbs_range[0]})
    total_params = float(getattr(param_counts(model), "total", 0) or 0)
    offered = None
    if get_trainer(trainer).search.flex_dispatchers:  # the plain all-to-all and the stack's own (flex) one
        offered = tuple(dict.fromkeys(("alltoall", prof.dispatcher or "alltoall")))
    space = build_space(model, training, n, cluster.domain_sizes(), gbs_range=gbs_range, trainer=trainer,
                        dispatchers=offered, nvlink_domain=max(cluster.domain_sizes()), total_params=total_params,
                        extra=include)
    for var, keep in (restrict or {}).items():
        if var not in space.values:
            raise InputError(f"restrict: unknown variable {var!r}; use one of {', '.join(VARIABLES)}")
        kept = [v for v in space.values[var] if v in set(keep)]
        if not kept:
            raise InputError(f"restrict: no candidate of {var} among {list(keep)}")
        space.values[var] = kept
    return _Request(cluster, training, trainer, prof, space, n, min_world, equal_slices)


class _Shortfalls:
    """The memory shortfalls (HBM GiB short, label, host GiB short) of the layouts the search refused,
    for a refusal's closest layout. A layout that a cheaper check refused first waits in ``deferred``
    and is priced only when the refusal asks (``all``): the list then holds what pricing every refused
    layout gives, and ``min`` of it does not depend on the order."""

    def __init__(self):
        self.items: list[tuple[float, str, float]] = []
        self.deferred: list[tuple] = []
        self.price = None   # memory_accept of ``_acceptor``

    def all(self) -> list[tuple[float, str, float]]:
        deferred, self.deferred = self.deferred, []
        for choice in deferred:
            self.price(choice)
        return self.items


def _acceptor(b, model, cluster, training, prof, equal_slices, cheap_first: bool = True):
    """The lazy constraints: the exact ``planner.cost.memory`` peak must fit in HBM less the headroom
    (a cut covers every layout that agrees on the choices memory reads), the MoE dispatcher must run
    on the placement, and with ``equal_slices`` MaxText's mesh must factor into its slices. Returns
    (accept, shortfalls). ``cheap_first``: the cached dispatcher and mesh checks run before the
    exact memory peak (a layout they refuse is priced only for a refusal, ``_Shortfalls``); the
    searches other than "cp-sat-full" read only whether a layout passes, not the cut."""
    gpu = cluster.gpu_spec
    mem_vars = [b.vi[v] for v in VARIABLES if v not in _MEMORY_FREE]
    mesh_vars = [b.vi[v] for v in ("tp", "cp", "pp", "dp", "ep", "gpd")]
    usable = usable_hbm_gib(gpu.hbm_gib, training)  # issue 11 item 6: plans fit in HBM less the headroom
    shortfalls = _Shortfalls()
    checked: dict = {}

    def memory_accept(choice):
        key = tuple(choice[i] for i in mem_vars)
        hit = checked.get(key)
        if hit is None:
            cfg, world, gbs, _, lay = b.config_of(choice)
            tr = training.model_copy(update={"global_batch": gbs})
            est = memory_per_gpu(model, cfg, tr, world, gpu, layout=lay, options=options_for(tr, prof))
            host_over = 0.0 if est.host_fits else est.host_gib_per_node - est.host_usable_gib
            hit = (est.fits(usable), est.peak_gib, cfg.short(), host_over)
            checked[key] = hit
        if hit[0]:
            return None
        shortfalls.items.append((max(hit[1] - usable, 0.0), hit[2], hit[3]))   # (HBM GiB short, label, host GiB short)
        return mem_vars

    shortfalls.price = memory_accept

    hybridep_vars = [b.vi[v] for v in ("tp", "cp", "pp", "dp", "ep", "etp", "dispatcher", "gpd")]
    hybridep_ok: dict = {}

    def hybridep_accept(choice):  # issue 23 item 3: HybridEP needs the same ranks of each EP group per domain
        cfg, world, _, gpd, _ = b.config_of(choice)
        if cfg.dispatcher != "flex-hybridep" or not model.num_experts:
            return None
        key = tuple(choice[i] for i in hybridep_vars)
        if key not in hybridep_ok:
            placement = make_placement(cluster, cfg, world, gpus_per_domain=gpd)
            gpus = cluster.gpus()
            hybridep_ok[key] = hybridep_runs(cfg, world, placement.order,
                                             [gpus[g].domain for g in placement.rank_to_gpu])
        return None if hybridep_ok[key] else hybridep_vars

    rdma_ok: dict = {}
    note = fabric_note(cluster)
    if note and any(d.startswith("flex") for d in b.vals.get("dispatcher", ())):
        b.notes.append(note)

    def rdma_accept(choice):  # issue 21 item 2: DeepEP / HybridEP across domains need GPU-initiated RDMA
        cfg, world, _, gpd, _ = b.config_of(choice)
        if not note or not cfg.dispatcher.startswith("flex") or not model.num_experts:
            return None
        key = tuple(choice[i] for i in hybridep_vars)
        if key not in rdma_ok:
            placement = make_placement(cluster, cfg, world, gpus_per_domain=gpd)
            gpus = cluster.gpus()
            rdma_ok[key] = dispatcher_problem(cluster, cfg, world, placement.order,
                                              [gpus[g].domain for g in placement.rank_to_gpu]) is None
        return None if rdma_ok[key] else hybridep_vars

    def mesh_accept(choice):  # issue 11 item 5: MaxText's mesh must factor into its slices
        if not equal_slices:
            return None
        cfg, world, _, gpd, _ = b.config_of(choice)
        return None if _maxtext_mesh_ok(cluster, model, cfg, world, gpd) else mesh_vars

    def accept(choice):
        if not cheap_first:
            return memory_accept(choice) or hybridep_accept(choice) or rdma_accept(choice) or mesh_accept(choice)
        cut = hybridep_accept(choice) or rdma_accept(choice) or mesh_accept(choice)
        if cut is not None:
            shortfalls.deferred.append(choice)
            return cut
        return memory_accept(choice)

    return accept, shortfalls


def _refuse(res, b, prog, accept, shortfalls, model, cluster, training, time_limit):
    """No layout: the one-line InfeasibleError naming the closest layout and its shortfall."""
    if res.status in ("UNKNOWN",) and time_limit is not None:
        raise InfeasibleError(f"no layout found within --time-limit {time_limit:g} s; raise the limit")
    if not shortfalls.all() and prog.limits:
        # the memory bound dropped every layout: price exactly the few it rates closest
        rows = feasible_rows(prog)
        if len(rows):
            for i in _closest_by_bound(prog, rows, prog.limits[0][0], 8):
                accept(tuple(int(a) for a in rows[i]))
    err = InfeasibleError(_nothing_fits(model, cluster, training, shortfalls.all(), b))
    err.memory = True   # nothing fits in memory: planner.search.offload may try the optimizer on the host
    raise err


def _closest_by_bound(prog, rows, lim: int, k: int) -> list[int]:
    """The first ``k`` rows in order of the limit node ``lim`` (then row order) among those that every
    table up to ``lim`` admits. The bound is computed on the few nodes it reads for every row; rows
    are then checked in full, in that order, only until ``k`` pass."""
    lbv, okv, _ = evaluate_many(prog, rows, upto=lim, only=ancestors(prog, [lim]))
    order = np.argsort(np.where(okv, lbv, np.iinfo(np.int64).max), kind="stable")
    order = order[okv[order]]
    picked: list[int] = []
    for start in range(0, len(order), 256):
        idx = order[start:start + 256]
        _, ok_full, _ = evaluate_many(prog, rows[idx], upto=lim)
        picked += [int(i) for i in idx[ok_full]]
        if len(picked) >= k:
            break
    return picked[:k]


def _entries(res, b, model, cluster, training, trainer, prof):
    """The solutions as PlanEntry (rules re-checked, ``predict`` with the chosen placement) and the
    largest relative gap between the program's step time and predict's."""
    entries = []
    max_err = 0.0
    for sol in res.solutions:
        cfg, world, gbs, gpd, lay = b.config_of(sol.choice)
        tr = training.model_copy(update={"global_batch": gbs})
        viol = violations(model, cfg, tr, world, trainer)
        if viol:  # the rule tables are tested to equal the rules; this would be a bug
            raise RuntimeError(f"plan broke rule {viol[0].rule}: {viol[0].message}")
        placement = make_placement(cluster, cfg, world, gpus_per_domain=gpd)
        pred = predict(model, cluster, cfg, tr, placement=placement, profile=prof)
        rm = b.rank_maps[b.vals["gpd"].index(gpd)]
        shapes = {ax: rm.worst_shape(*axis_stride_size(cfg, world, ax), world)
                  for ax in ("tp", "cp", "dp", "pp") + (("ep", "edp") if model.is_moe else ())}
        step_prog = step_seconds(sol.node_value, band_scale_of(b, sol.choice), world)
        # one composition (planner.cost.compose): the program is step_time up to its rounding
        gap = abs(step_prog - pred.step_time_s)
        bound = quantisation_bound(model, cfg, gbs, world, b.par("pp.overlap"), pred.breakdown["pp_p2p"])
        if gap > bound + 1e-9 * pred.step_time_s:
            raise RuntimeError(f"{cfg.short()}: the solver's program gives {step_prog:.9g} s per step, predict "
                               f"{pred.step_time_s:.9g} s: more than rounding apart (a bug)")
        if pred.step_time_s > 0:
            max_err = max(max_err, gap / pred.step_time_s)
        entries.append(PlanEntry(cfg, pred, placement, world, gbs, shapes, step_prog))
    return entries, max_err


def _bound_value(res, b, training, entry: PlanEntry, objective: str):
    """The solver's proven bound converted to the reported objective's unit (an upper bound on
    tokens/s or TFLOP/s per GPU), scaled by the best plan's predict/program ratio."""
    if res.bound is None or res.objective is None or res.objective <= 0:
        return None
    pred = entry.prediction
    val = pred.tokens_per_s if objective == "throughput" else pred.tflops_per_gpu
    if objective == "robust":
        val = pred.tokens_per_s * math.exp(-pred.band_half_width)
    if res.bound <= 0:
        return None
    # objective is minimised time-like; the reported objective is its inverse
    return val * res.objective / res.bound


def _mark_leads(plans: list[dict], objective_name: str | None) -> None:
    """Each plan's lead over the next (in the objective's quantity, central predictions) and whether
    it lies inside the leader's uncertainty band (``planner.cost.uncertainty.lead``)."""
    key = "tflops_per_gpu" if objective_name == "tflops_per_gpu" else "tokens_per_s"

    def value(p):
        if objective_name == "goodput_tokens_per_s" and p.get("goodput"):
            return p["goodput"]["goodput_tokens_per_s"]
        return p["prediction"][key]

    for a, b in zip(plans, plans[1:]):
        gap, within = lead(value(a), a["prediction"].get("band_half_width") or 0.0, value(b))
        a["lead_over_next"], a["within_uncertainty"] = gap, within


def _nothing_fits(model, cluster, training, shortfalls, b) -> str:
    gpu = cluster.gpu_spec
    n = getattr(b, "n_gpus", cluster.num_gpus)   # the GPUs the job offers
    space = getattr(b, "vals", {})
    if shortfalls:
        short, label, host_short = min(shortfalls)
        if short <= 0.0:   # it fits in HBM; its offloaded optimizer does not fit in the node's host memory
            return (f"{model.name} on {n} {gpu.name.upper()} GPUs: no layout fits; the closest ({label}) fits in HBM "
                    f"but its offloaded optimizer state needs {host_short:,.0f} GiB more host memory per node than "
                    f"the usable share of {gpu.host_memory_gb:,.0f} GB. Use more GPUs (--gpus) or a smaller "
                    "optimizer offload fraction")
        # only remedies the search did not already try (every layout of its space was refused)
        fixes = ["more GPUs (--gpus)"]
        if "full" not in space.get("recompute", ()) and "RC:full" not in label:
            fixes.append("full recompute")
        if True not in space.get("fsdp", ()) and "FSDP" not in label:
            fixes.append("FSDP")
        if min(space.get("mbs", ()) or (2,)) > 1 and "MBS1" not in label.split():
            fixes.append("a smaller micro-batch")
        room = usable_hbm_gib(gpu.hbm_gib, training)
        kept = "" if room >= gpu.hbm_gib else f" ({gpu.hbm_gib:.0f} GiB less the --memory-headroom {training.memory_headroom})"
        return (f"{model.name} on {n} {gpu.name.upper()} GPUs: no layout fits in {room:.1f} GiB{kept}; "
                f"the closest ({label}) needs {short:.1f} GiB more per GPU. Use " + ", ".join(fixes[:-1])
                + (" or " if len(fixes) > 1 else "") + fixes[-1])
    fsdp = "" if True in space.get("fsdp", ()) else ", FSDP"
    return (f"{model.name} on {n} {gpu.name.upper()} GPUs: no layout satisfies the {training.trainer} "
            f"rules and the memory lower bound (model state per GPU exceeds {gpu.hbm_gib:.0f} GiB HBM); use more GPUs "
            f"(--gpus){fsdp} or a larger global batch")


def scale(model, cluster_for, sizes, training: Training, *, time_limit=None, objective="throughput",
          gbs_range=None, trainer=None, on_done=None, resilience: Resilience | None = None,
          weak: bool = False) -> list[dict]:
    """Plan each GPU count; rows with throughput, TFLOP/s per GPU and retention vs the smallest size,
    and goodput (``planner.cost.goodput``): goodput tokens/s, the effective share and goodput per GPU
    retained against the smallest size. ``weak``: the global batch grows with the GPU count (``training``'s
    at the smallest size, ``round(gbs * n / n0)`` at n), as weak-scaling series run; else it stays fixed."""
    rows = []
    n0 = min(sizes) if sizes else 1
    for n in sorted(sizes):
        cluster = cluster_for(n)
        tr = training.model_copy(update={"global_batch": max(1, round(training.global_batch * n / n0))}) if weak else training
        res = plan(model, cluster, tr, top=1, time_limit=time_limit, objective=objective,
                   gbs_range=gbs_range, trainer=trainer, resilience=resilience)
        e = res.plans[0]
        p = e.prediction
        rows.append({"gpus": n, "world": e.world, "layout": e.label, "gbs": e.gbs,
                     "tokens_per_s": p.tokens_per_s, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
                     "tflops_per_gpu": p.tflops_per_gpu, "step_time_s": p.step_time_s,
                     "breakdown": dict(p.breakdown),
                     "goodput_tokens_per_s": e.goodput.goodput_tokens_per_s,
                     "effective_fraction": e.goodput.effective_fraction,
                     "interruptions_per_day": e.goodput.interruptions_per_day,
                     "status": res.solver["status"], "wall_s": res.solver["wall_s"]})
        if on_done:
            on_done(n)
    base = rows[0]["tflops_per_gpu"] if rows else 0.0
    gbase = rows[0]["goodput_tokens_per_s"] / rows[0]["world"] if rows and rows[0]["goodput_tokens_per_s"] else 0.0
    for r in rows:
        r["retention"] = r["tflops_per_gpu"] / base if base else 0.0
        r["goodput_retention"] = r["goodput_tokens_per_s"] / r["world"] / gbase if gbase else 0.0
    return rows
