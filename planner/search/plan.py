"""``plan``: the parallel layout and its placement that maximise predicted throughput, proven optimal
for the step-time model over the declared space (``planner.search.space``).

How (docs/solver.md has the whole argument):

1. ``planner.search.space`` lists the candidates of every choice (TP, CP, PP, VPP, pipeline split, EP,
   ETP, DP, MBS, recompute, FSDP, dispatcher, global batch, GPUs per NVLink domain) and turns the
   trainer's rules into allowed-tuple tables over the few choices each rule reads.
2. The step time of ``planner.cost.steptime`` is rebuilt as a program of ``solver.layout``: every cost
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

import functools
import math
import time
from dataclasses import dataclass, field
from functools import reduce

import numpy as np

from planner.config import ParallelConfig, Training
from planner.errors import InfeasibleError, InputError
from planner.search.space import VARIABLES, Space, build_space, rule_tables, split_layers, structural_ok, structural_tables
from solver.groups import RankMap
from solver.layout import Program, enumerate_bounded, solve, solve_bounded

NS = 1e-9                 # table unit: one nanosecond
BUBBLE = 840              # lcm(1..8): (pp-1)/vpp * 840 is an integer for every vpp candidate
OBJECTIVES = ("throughput", "tflops-per-gpu", "robust")
# robust: maximise the lower edge of the uncertainty band, tokens/s * exp(-h); h depends on the layout
# only through CP, FSDP and whether the EP group leaves its NVLink domain (planner.cost.uncertainty),
# so it enters the program as a factor table (exp(h) scaled by BAND_SCALE and rounded): exact.
BAND_SCALE = 1000
# Search engines over the same program (docs/solver.md): "enumerate" (default) and "cp-sat" walk
# blocks in order of one separable lower bound, numpy or CP-SAT enumerating the blocks under the
# rules; "exhaustive" evaluates every assignment (the oracle); "cp-sat-full" is the whole
# nonlinear program in CP-SAT (small spaces).
METHODS = ("enumerate", "cp-sat", "exhaustive", "cp-sat-full")
# Choices the memory estimate does not read (a memory cut may cover every value of these).
_MEMORY_FREE = ("dispatcher", "gpd")
# Choices the CP-SAT master leaves to the exact evaluation of each block (with fsdp, which no
# bound factor reads): the master's layer-time factor is the minimum over them.
_BLOCK_FREE = ("recompute", "dispatcher")


@functools.lru_cache(maxsize=None)
def _rc_cfg(recompute: str) -> ParallelConfig:
    """A ParallelConfig that carries only this recompute choice (its normalised form)."""
    return ParallelConfig(recompute=recompute)


@dataclass
class PlanEntry:
    config: ParallelConfig
    prediction: object            # planner.cost.predict.Prediction
    placement: object             # planner.cost.placement.Placement
    world: int
    gbs: int
    shapes: dict = field(default_factory=dict)
    program_step_s: float | None = None

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
        from planner.search.document import PlanDocument

        return PlanDocument.model_validate(self.to_dict())

    def to_dict(self) -> dict:
        """The plan.json document (docs/architecture.md; ``document()`` is the same, typed)."""
        gpus = self.cluster.gpus()
        plans = []
        for e in self.plans:
            c = e.config
            pred = e.prediction
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
                         "domains_used": len({gpus[g].domain for g in r2g})}
            prediction = {"tflops_per_gpu": pred.tflops_per_gpu,
                          "tokens_per_s_per_gpu": pred.tokens_per_s_per_gpu,
                          "tokens_per_s": pred.tokens_per_s,
                          "step_time_s": pred.step_time_s,
                          "memory_gib_per_gpu": pred.memory_gib_per_gpu,
                          "hbm_gib": pred.hbm_gib,
                          "tflops_per_gpu_low": pred.tflops_per_gpu_low,
                          "tflops_per_gpu_high": pred.tflops_per_gpu_high,
                          "regime": pred.regime, "extrapolated": pred.extrapolated,
                          "band_half_width": pred.band_half_width, "band_runs": pred.band_runs,
                          "usable_gib": pred.usable_gib,   # issue 11 item 6: HBM less the headroom
                          "fits": pred.fits,
                          "breakdown": dict(pred.breakdown),
                          "memory": dict(pred.memory)}
            plans.append({"label": e.label, "config": cfg, "prediction": prediction, "placement": placement})
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
# helpers


def _lcm(values) -> int:
    return reduce(lambda a, b: a * b // math.gcd(a, b), values, 1)


def _rank_map(cluster, gpd) -> RankMap:
    from planner.cost.placement import domain_slots

    sizes = cluster.domain_sizes()
    slots = domain_slots(sizes, gpd)
    r2g = np.concatenate([np.arange(st, st + n, dtype=np.int64) for st, n in slots if n > 0])
    dom_all = np.fromiter((g.domain for g in cluster.gpus()), dtype=np.int64)
    units = [np.asarray(cluster.tier_units(t), dtype=np.int64)[r2g] for t in range(len(cluster.fabric_tiers))]
    return RankMap(dom_all[r2g], units)


def _layer_kinds(model):
    kinds = []
    for i in range(model.num_layers):
        moe = bool(model.moe_layers[i]) if model.moe_layers else False
        swa = bool(model.swa_layers[i]) if model.swa_layers else False
        kinds.append(("moe" if moe else "dense", swa))
    return kinds


class _Ids:
    """Dense integer ids for hashable values (shape tuples, parameter sums)."""

    def __init__(self):
        self.values: list = []
        self.index: dict = {}

    def __call__(self, v) -> int:
        i = self.index.get(v)
        if i is None:
            i = len(self.values)
            self.values.append(v)
            self.index[v] = i
        return i


# ----------------------------------------------------------------------------------------------
# the program


class _Builder:
    """Builds the solver.layout Program that mirrors planner.cost.steptime for one request."""

    def __init__(self, model, cluster, training: Training, space: Space, profile, objective: str,
                 min_world: int):
        from planner.cost.steptime import LOW_PRECISION, efficiencies, profile_fabric

        self.model, self.cluster, self.training, self.space = model, cluster, training, space
        self.profile, self.objective = profile, objective
        self.vals = space.values
        self.vi = {v: i for i, v in enumerate(VARIABLES)}
        self.prog = Program([len(self.vals[v]) for v in VARIABLES], names=list(VARIABLES))
        prog = self.prog
        prog.table_t = lambda vars_, values, nodes=(): prog.table(vars_, values, nodes, trusted=True)
        self._shape_cache: dict = {}
        gpu = cluster.gpu_spec
        self.gpu = gpu
        self.arch = gpu.arch
        self.eff = efficiencies(gpu, training.precision, profile, training.cuda_graphs)
        self.fabric = profile_fabric(cluster, profile)
        self.lp = training.precision in LOW_PRECISION
        self.min_world = min_world
        self.n_gpus = cluster.num_gpus
        self.shape_ids = _Ids()
        self.notes: list[str] = []
        from topologies.collectives import GroupShape

        self.GroupShape = GroupShape

    # -- small utilities -------------------------------------------------------------------
    def par(self, name):
        return self.profile.param(name, self.arch)

    def idx(self, *names):
        return [self.vi[n] for n in names]

    def combos(self, *names):
        """(index tuple, value dict) for every combination of the named variables that the
        canonical-form constraints allow."""
        import itertools

        for ix in itertools.product(*(range(len(self.vals[n])) for n in names)):
            a = {n: self.vals[n][i] for n, i in zip(names, ix)}
            if structural_ok(self.space, a):
                yield ix, a

    def q(self, seconds: float) -> int:
        return int(math.floor(seconds / NS + 0.5))

    def shape(self, sid: int):
        hit = self._shape_cache.get(sid)
        if hit is None:
            k, per, dom, tier = self.shape_ids.values[sid]
            hit = self.GroupShape(size=k, per_domain=per, domains=dom, tier=tier)
            self._shape_cache[sid] = hit
        return hit

    # -- build ---------------------------------------------------------------------------------
    def build(self):
        from planner.model.pipeline import pipeline_layout

        P, vals, model, tr = self.prog, self.vals, self.model, self.training
        s = tr.seq_len
        # 1. trainer rules and canonical form
        for vars_, allowed in rule_tables(self.space, model, tr) + structural_tables(self.space):
            P.allow(self.idx(*vars_), allowed)

        # 2. pipeline layouts: (pp, vpp, split) -> layout; uneven splits only when they differ
        self.layouts = {}
        base_counts = {}
        for ix, a in self.combos("pp", "vpp", "split"):
            if a["pp"] * a["vpp"] > model.num_layers:
                continue
            sp = split_layers(model.num_layers, a["pp"], a["vpp"], a["split"])
            if sp is None:
                continue
            try:
                lay = pipeline_layout(model, a["pp"], a["vpp"], sp[0], sp[1], seq_len=s)
            except (InputError, ValueError):
                continue
            key = (a["pp"], a["vpp"])
            if a["split"] == 0:
                base_counts[key] = lay.layer_counts
            self.layouts[ix] = (a, lay, sp)
        for ix in list(self.layouts):
            a, lay, _ = self.layouts[ix]
            if a["split"] and base_counts.get((a["pp"], a["vpp"])) == lay.layer_counts:
                del self.layouts[ix]
        if not self.layouts:
            raise InfeasibleError(f"{model.name}: no pipeline layout of its {model.num_layers} layers fits the "
                                  "candidate pp/vpp values")
        P.allow(self.idx("pp", "vpp", "split"), list(self.layouts))

        # 3. world size W = tp*cp*pp*dp, between min_world and the GPUs offered
        wt = {}
        for ix, a in self.combos("tp", "cp", "pp", "dp"):
            w = a["tp"] * a["cp"] * a["pp"] * a["dp"]
            if self.min_world <= w <= self.n_gpus:
                wt[ix] = w
        if not wt:
            raise InfeasibleError(f"no tp*cp*pp*dp between {self.min_world} and {self.n_gpus} GPUs divides the "
                                  f"global batch {tr.global_batch}; change --gbs or --gpus")
        self.W = P.table_t(self.idx("tp", "cp", "pp", "dp"), wt)
        self.worlds = sorted(set(wt.values()))

        # 4. placement: GPUs per domain and the worst group shape of every axis
        self.rank_maps = {}
        caps = {}
        for gi, g in enumerate(vals["gpd"]):
            rm = _rank_map(self.cluster, g)
            self.rank_maps[gi] = rm
            caps[gi] = rm.capacity
        # issue 11 item 5: MaxText's equal-slice rule (every NVLink domain the job uses holds as many GPUs)
        eq = getattr(self, "equal_slices", False)
        P.table_t(self.idx("gpd"), {(gi, w): 0 for gi in caps for w in self.worlds
                                    if w <= caps[gi] and (not eq or _equal_slices(self.cluster, vals["gpd"][gi], w))},
                  nodes=[self.W])
        self._shape_nodes()

        # 5. step time
        total = self._step_time()
        self.total = total
        # 6. memory lower bound
        self._memory_bound()
        # 7. objective
        self._objective(total)
        return P

    # -- shapes ---------------------------------------------------------------------------
    def _axis_table(self, names, stride_size):
        """Shape-id node of an axis: a table over ``names`` + gpd, keyed by the world node."""
        P, vals = self.prog, self.vals
        table = {}
        for ix, a in self.combos(*names):
            for gi in range(len(vals["gpd"])):
                rm = self.rank_maps[gi]
                for w in self.worlds:
                    if w > rm.capacity:
                        continue
                    ss = stride_size(a, w)
                    if ss is None:
                        continue
                    st, k = ss
                    if st < 1 or k < 1 or w % (st * k):
                        continue
                    table[ix + (gi, w)] = self.shape_ids(rm.worst_shape(st, k, w))
        return P.table_t(self.idx(*names, "gpd"), table, nodes=[self.W])

    def _shape_nodes(self):
        pp_vals = set(self.vals["pp"])

        def etp_eff(a):
            return a["tp"] if a["etp"] is None else a["etp"]

        def dp_axis(a, w):
            # the dense weights' replicas: dp x cp ranks at stride tp (rank order tp-cp-ep-dp-pp, the
            # expert axis has size 1 on the dense grid), over which Megatron reduces dense gradients
            mp = a["tp"] * a["cp"] * a["dp"]
            return (a["tp"], a["cp"] * a["dp"]) if w % mp == 0 and w // mp in pp_vals else None

        def edp_axis(a, w):
            g = etp_eff(a) * a["ep"] * a["pp"]
            return (etp_eff(a) * a["ep"], w // g) if w % g == 0 else None

        self.sh = {
            "tp": self._axis_table(("tp",), lambda a, w: (1, a["tp"])),
            "cp": self._axis_table(("tp", "cp"), lambda a, w: (a["tp"], a["cp"])),
            "dp": self._axis_table(("tp", "cp", "dp"), dp_axis),
            "pp": self._axis_table(("pp",), lambda a, w: (w // a["pp"], a["pp"]) if w % a["pp"] == 0 else None),
        }
        if self.model.is_moe:
            self.sh["ep"] = self._axis_table(("tp", "etp", "ep"), lambda a, w: (etp_eff(a), a["ep"]))
            self.sh["edp"] = self._axis_table(("tp", "etp", "ep", "pp"), edp_axis)

    def _shape_values(self, node):
        return sorted(set(self.prog.nodes[node].values.values()))

    # -- step time --------------------------------------------------------------------------
    def _step_time(self) -> int:
        from planner.cost.terms import compute as C
        from planner.cost.terms import context_parallel as CPc
        from planner.cost.terms import expert_a2a as EA
        from planner.cost.terms import host as HOST
        from planner.cost.steptime import host_regime
        from planner.cost.terms import pipeline as PPL
        from planner.cost.terms import tensor_parallel as TPc
        P, vals, model, tr = self.prog, self.vals, self.model, self.training
        s, h = tr.seq_len, model.hidden_size
        q = self.q
        o_tp, o_ep, o_cp, o_dp, o_pp = (self.par("tp.overlap"), self.par("ep.overlap"), self.par("cp.overlap"),
                                        self.par("dp.overlap"), self.par("pp.overlap"))
        # the recipe as each layout runs it (planner.cost.steptime.recipe_pricing): TP overlap is on
        # for every TP > 1 or for none; CUDA graphs follow recompute; the all-to-all overlap is
        # chosen per layout by the OV node below
        from planner.cost.steptime import efficiencies, recipe_pricing

        def pricing(**kw):
            return recipe_pricing(model, ParallelConfig(**kw), tr, self.profile, self.arch)

        o_tp = pricing(tp=2)[0]
        eff_rc = {rc: efficiencies(self.gpu, tr.precision, self.profile, pricing(recompute=rc)[2])
                  for rc in vals["recompute"]}
        rc_priced = len(set(eff_rc.values())) > 1   # graphs on or off depends on the recompute choice
        launch = q(self.par("other.layer_us") * 1e-6)
        kinds = _layer_kinds(model)
        kind_set = set(kinds) | ({(kinds[-1][0], False)} if model.mtp_layers else set())
        mtp_kind = (kinds[-1][0], False)
        zero = P.const(0)

        @functools.lru_cache(maxsize=None)
        def rc_arg(rc):
            c = _rc_cfg(rc)
            r = c.recompute if c.recompute in ("none", "full") else c.recompute_modules
            return () if r == "none" else r

        # per layer kind: compute, windows
        lvars = ("tp", "cp", "ep", "etp", "mbs", "recompute")
        per = {}
        for kind in sorted(kind_set):
            tabs = {n: {} for n in ("comp", "fwd", "bwd", "attn", "g3")}
            for ix, a in self.combos(*lvars):
                etp = a["tp"] if a["etp"] is None else a["etp"]
                work = C.layer_work(model, kind[0], kind[1], s, a["mbs"], a["tp"], a["cp"], a["ep"], etp, self.lp)
                lt = eff_rc[a["recompute"]].layer_time(work, rc_arg(a["recompute"]))
                tabs["comp"][ix] = q(lt.total)
                tabs["fwd"][ix] = q(lt.fwd)
                tabs["bwd"][ix] = q(lt.bwd)
                tabs["attn"][ix] = q(lt.attn_core)
                tabs["g3"][ix] = q(3.0 * lt.gemm_fwd)
            per[kind] = {n: P.table_t(self.idx(*lvars), t) for n, t in tabs.items()}

        # TP collectives of one layer: (cp, mbs, recompute) + tp shape
        tp_t, tp_t1 = {}, {}
        for ix, a in self.combos("cp", "mbs", "recompute"):
            act = TPc.activation_bytes(a["mbs"], s, a["cp"], h)
            for sid in self._shape_values(self.sh["tp"]):
                shp = self.shape(sid)
                t = TPc.tp_comm_time(self.fabric, shp, act) if shp.size > 1 else 0.0
                if _rc_cfg(a["recompute"]).recompute == "full" and shp.size > 1:
                    t *= 1.5
                tp_t[ix + (sid,)] = q(t)
                tp_t1[ix + (sid,)] = q((1.0 - o_tp) * t)
        TPT = P.table_t(self.idx("cp", "mbs", "recompute"), tp_t, nodes=[self.sh["tp"]])
        TPT1 = P.table_t(self.idx("cp", "mbs", "recompute"), tp_t1, nodes=[self.sh["tp"]])

        # expert all-to-all of one MoE layer: (tp, cp, mbs, dispatcher, recompute) + ep shape
        if model.is_moe:
            a_t, a_t1 = {}, {}
            disp_b = 1.0 if (self.lp and self.par("ep.dispatch_bytes_fp8") >= 0.5) else 2.0
            rc_moe = any("moe" in _rc_cfg(r).recompute_modules for r in vals["recompute"])
            avars = ("tp", "cp", "mbs", "dispatcher") + (("recompute",) if rc_moe else ())
            for ix, a in self.combos(*avars):
                a.setdefault("recompute", "none")
                dedup = a["dispatcher"].startswith("flex")
                impl = "deepep" if dedup else "nccl"
                moe_rc = "moe" in _rc_cfg(a["recompute"]).recompute_modules
                for sid in self._shape_values(self.sh["ep"]):
                    shp = self.shape(sid)
                    ep = shp.size
                    t = 0.0
                    if ep > 1:
                        tokens = a["mbs"] * s / (a["cp"] * a["tp"])
                        d_b, c_b = EA.a2a_bytes(tokens, h, EA.copies_per_token(model.top_k, ep, dedup), disp_b)
                        t = EA.a2a_time(self.fabric, shp, d_b, c_b, impl, 1.0)
                        if moe_rc:
                            t *= 1.5
                    a_t[ix + (sid,)] = q(t)
                    a_t1[ix + (sid,)] = q((1.0 - o_ep) * t)
            A = P.table_t(self.idx(*avars), a_t, nodes=[self.sh["ep"]])
            A1 = P.table_t(self.idx(*avars), a_t1, nodes=[self.sh["ep"]])
            # 1 where the recipe overlaps the all-to-all for this layout (EP > 1 assumed: with EP = 1
            # the all-to-all costs nothing either way), else 0: the exposed time is then A itself
            ovars = ("dispatcher", "recompute", "pp", "vpp", "fsdp")
            ov = {ix: int(pricing(ep=2, dispatcher=a["dispatcher"], recompute=a["recompute"], pp=a["pp"],
                                  vpp=a["vpp"], fsdp=a["fsdp"])[1] > 0)
                  for ix, a in self.combos(*ovars)}
            A1x = A1 if all(ov.values()) else P.element(P.table_t(self.idx(*ovars), ov), [A, A1], index_is_node=True)

        # context-parallel exchange: (tp, cp, mbs) + cp shape (its tier)
        c_t, c_t1 = {}, {}
        width = CPc.kv_width(model)
        for ix, a in self.combos("tp", "cp", "mbs"):
            for sid in self._shape_values(self.sh["cp"]):
                shp = self.shape(sid)
                if shp.size != a["cp"]:
                    continue
                t = CPc.cp_time(self.fabric, shp.tier, a["cp"], a["mbs"], s, width, a["tp"]) if a["cp"] > 1 else 0.0
                c_t[ix + (sid,)] = q(t)
                c_t1[ix + (sid,)] = q((1.0 - o_cp) * t)
        CPT = P.table_t(self.idx("tp", "cp", "mbs"), c_t, nodes=[self.sh["cp"]])
        CPT1 = P.table_t(self.idx("tp", "cp", "mbs"), c_t1, nodes=[self.sh["cp"]])

        # per-kind layer time L_k = compute + exposed TP + exposed EP + exposed CP + launch
        L = {}
        for kind, t in per.items():
            tpx = P.max([TPT1, P.sum([TPT, t["g3"]], [1, -1]), zero])
            parts = [t["comp"], tpx]
            if kind[0] == "moe":
                parts.append(P.max([A1x, P.sum([A, t["comp"]], [1, -1]), zero]))
            parts.append(P.max([CPT1, P.sum([CPT, t["attn"]], [1, -1]), zero]))
            # host floor (steptime.host_regime, terms/host.py): L_k = launch + max(layer, host time)
            hk = {}
            for ix, a in self.combos("ep", "recompute"):
                eager, launched = host_regime(model, ParallelConfig(ep=a["ep"], recompute=a["recompute"]), tr)
                hk[ix] = q(HOST.host_time(kind[0], model.num_experts / a["ep"] if model.is_moe else 0.0, eager, launched))
            if any(hk.values()):
                L[kind] = P.sum([P.max([P.sum(parts), P.table_t(self.idx("ep", "recompute"), hk)])], const=launch)
            else:
                L[kind] = P.sum(parts, const=launch)

        # output head and MTP extras: (tp, cp, mbs), and recompute where it switches CUDA graphs
        def head_tables(hvars, eff_of):
            head = {n: {} for n in ("total", "fwd", "bwd")}
            mtpx = {n: {} for n in ("total", "fwd", "bwd")}
            for ix, a in self.combos(*hvars):
                e_ = eff_of(a)
                ht = e_.layer_time(C.head_work(model, s, a["mbs"], a["tp"], a["cp"], False), ())
                for n, v in (("total", ht.total), ("fwd", ht.fwd), ("bwd", ht.bwd)):
                    head[n][ix] = q(v)
                if model.mtp_layers:
                    mt = e_.layer_time(C.head_work(model, s, a["mbs"], a["tp"], a["cp"], True), ())
                    for n, v in (("total", mt.total), ("fwd", mt.fwd), ("bwd", mt.bwd)):
                        mtpx[n][ix] = q(v)
            return ({n: P.table_t(self.idx(*hvars), t) for n, t in head.items()},
                    {n: P.table_t(self.idx(*hvars), t) for n, t in mtpx.items()} if model.mtp_layers else None)

        # the bound (bound_factors) reads tables over (tp, cp, mbs): the cheapest regime, a lower bound
        H, MX = head_tables(("tp", "cp", "mbs"), lambda a: min(eff_rc.values(), key=lambda e_: e_.elem_factor))
        H_b, MX_b = H, MX
        if rc_priced:
            H, MX = head_tables(("tp", "cp", "mbs", "recompute"), lambda a: eff_rc[a["recompute"]])

        # pipeline ranks, grouped into slots: distinct per-rank inventories (steptime.rank_inventory)
        # in first-occurrence order, so the first argmax below is steptime's max over ranks
        from planner.cost.steptime import rank_inventory

        kind_list = sorted(kind_set)
        slots_of = {}
        for ix, (a, lay, _) in self.layouts.items():
            seen = []
            for inv in rank_inventory(model, lay, s, a["pp"]):
                cnt = dict(inv.kinds)
                vec = (tuple(cnt.get(k, 0) for k in kind_list), inv.mtp, int(inv.loss), inv.dense_params, 0,
                       inv.expert_params)
                if vec not in seen:
                    seen.append(vec)
            slots_of[ix] = seen
        S = max(len(v) for v in slots_of.values())
        lay_vars = self.idx("pp", "vpp", "split")
        dl_ids, ex_ids = _Ids(), _Ids()
        slot_nodes = []
        for si in range(S):
            def col(fn, default=0):
                return {ix: (fn(v[si]) if si < len(v) else default) for ix, v in slots_of.items()}

            present = P.table_t(lay_vars, col(lambda v: 1))
            node = {"present": present}
            for qty, hq, mq in (("t", None, None),):
                terms = []
                for kj, kind in enumerate(kind_list):
                    cnts = col(lambda v, kj=kj: v[0][kj])
                    if not any(cnts.values()):
                        continue
                    terms.append(P.product(P.table_t(lay_vars, cnts), L[kind]))
                mt = col(lambda v: v[1])
                if MX is not None and any(mt.values()):
                    terms.append(P.product(P.table_t(lay_vars, mt), MX["total"]))
                ls = col(lambda v: v[2])
                if any(ls.values()):
                    terms.append(P.product(P.table_t(lay_vars, ls), H["total"]))
                node[qty] = P.sum(terms) if terms else zero
            slot_nodes.append(node)

        def slot_rest(si, node):
            # windows and parameter classes of slot si (needed only by the DP and optimizer terms)
            def col(fn, default=0):
                return {ix: (fn(v[si]) if si < len(v) else default) for ix, v in slots_of.items()}

            for qty, hq, mq in (("fwd", "fwd", "fwd"), ("bwd", "bwd", "bwd"), ("comp", "total", "total")):
                terms = []
                for kj, kind in enumerate(kind_list):
                    cnts = col(lambda v, kj=kj: v[0][kj])
                    if not any(cnts.values()):
                        continue
                    terms.append(P.product(P.table_t(lay_vars, cnts), per[kind][qty]))
                mt = col(lambda v: v[1])
                if MX is not None and any(mt.values()):
                    terms.append(P.product(P.table_t(lay_vars, mt), MX[mq]))
                ls = col(lambda v: v[2])
                if any(ls.values()):
                    terms.append(P.product(P.table_t(lay_vars, ls), H[hq]))
                node[qty] = P.sum(terms) if terms else zero
            node["dl"] = P.table_t(lay_vars, col(lambda v: dl_ids((v[3], v[4])), dl_ids((0.0, 0))))
            node["ex"] = P.table_t(lay_vars, col(lambda v: ex_ids(v[5]), ex_ids(0.0)))

        crit = P.argmax([n["t"] for n in slot_nodes], [n["present"] for n in slot_nodes])
        TMAX = P.element(crit, [n["t"] for n in slot_nodes], index_is_node=True)
        self.crit = crit

        # micro-batches m and the pipeline factor 840 * (m + (pp-1)/vpp)
        mt, b1 = {}, {}
        for ix, a in self.combos("gbs", "mbs", "dp"):
            if a["gbs"] % (a["mbs"] * a["dp"]) == 0:
                mt[ix] = a["gbs"] // (a["mbs"] * a["dp"])
        if not mt:
            raise InfeasibleError(f"no micro-batch size and data-parallel degree divide the global batch {tr.global_batch}")
        M = P.table_t(self.idx("gbs", "mbs", "dp"), mt)
        M840 = P.table_t(self.idx("gbs", "mbs", "dp"), {k: BUBBLE * v for k, v in mt.items()})
        for ix, a in self.combos("pp", "vpp"):
            b1[ix] = 0 if a["pp"] <= 1 else (BUBBLE * (a["pp"] - 1)) // a["vpp"]
            assert a["pp"] <= 1 or (BUBBLE * (a["pp"] - 1)) % a["vpp"] == 0
        B840 = P.table_t(self.idx("pp", "vpp"), b1)
        CORE = P.product(P.sum([M840, B840]), TMAX)
        # sources of the separable lower bound (_bound_factors)
        self._src = dict(per=per, TPT=TPT, TPT1=TPT1, CPT=CPT, CPT1=CPT1, launch=launch, H=H_b, MX=MX_b,
                         slots_of=slots_of, kind_list=kind_list, mt=mt, b1=b1, lvars=lvars)
        if model.is_moe:
            self._src.update(A=A, A1=A1, avars=avars)

        # pipeline point-to-point
        p1, pb = {}, {}
        for ix, a in self.combos("tp", "cp", "mbs"):
            nbytes = a["mbs"] * s / (a["cp"] * a["tp"]) * h * 2.0
            for sid in self._shape_values(self.sh["pp"]):
                shp = self.shape(sid)
                p1[ix + (sid,)] = q(self.fabric.p2p(nbytes, shp.tier)) if shp.size > 1 else 0
        ONE = P.table_t(self.idx("tp", "cp", "mbs"), p1, nodes=[self.sh["pp"]])
        for ix, a in self.combos("gbs", "mbs", "dp", "pp", "vpp"):
            g, b, d = a["gbs"], a["mbs"], a["dp"]
            if g % (b * d):
                continue
            m = g // (b * d)
            f = 0.0 if a["pp"] <= 1 else 2 * (a["pp"] - 1) + (1.0 - o_pp) * 2 * m * a["vpp"]
            pb[ix] = int(math.floor(BUBBLE * f + 0.5))
        P2P = P.product(ONE, P.table_t(self.idx("gbs", "mbs", "dp", "pp", "vpp"), pb))
        # CORE + P2P is a lower bound of the step (the DP and optimizer terms are >= 0)
        self.lb_node = P.sum([CORE, P2P])
        for si, node in enumerate(slot_nodes):
            slot_rest(si, node)
        # p2p_time uses int(round(m)); m is an integer here, and PPL is imported for the docstring link
        del PPL

        # data parallel and optimizer of each slot; the critical slot's are charged
        from planner.cost.terms import data_parallel as DPc
        from planner.cost.terms import optimizer as OPT

        ee = {}
        for ix, a in self.combos("tp", "ep", "etp"):
            ee[ix] = a["ep"] * (a["tp"] if a["etp"] is None else a["etp"])
        EE = P.table_t(self.idx("tp", "ep", "etp"), ee)
        # Which (tp, dp-shape) and (ep*etp, edp-shape) pairs occur with each pp: a slot's parameter
        # sums depend on the layout (pp, vpp, split), so only pairs with the same pp can meet.
        tp_i = self.vi["tp"]
        dp_by_pp: dict = {}
        for key, sid in P.nodes[self.sh["dp"]].values.items():
            t_, c_, d_ = vals["tp"][key[0]], vals["cp"][key[1]], vals["dp"][key[2]]
            pp_ = key[-1] // (t_ * c_ * d_)
            dp_by_pp.setdefault(pp_, set()).add((key[0], sid))
        edp_by_pp: dict = {}
        if model.is_moe:
            for key, sid in P.nodes[self.sh["edp"]].values.items():
                t_, e_, p_ = vals["tp"][key[0]], vals["etp"][key[1]], vals["ep"][key[2]]
                pp_ = vals["pp"][key[3]]
                edp_by_pp.setdefault(pp_, set()).add((p_ * (t_ if e_ is None else e_), sid))
        ids_by_pp = {}
        for lix, (la, _, _) in self.layouts.items():
            ids_by_pp.setdefault(la["pp"], []).append(lix)
        del tp_i
        hbm = self.eff.hbm_bps
        dpx_nodes, opt_nodes = [], []
        fs_vals = vals["fsdp"]
        dp_memo: dict = {}
        grad_b = self.par("dp.grad_bytes")

        def dpt(sid, nparams):
            k = (sid, nparams)
            hit = dp_memo.get(k)
            if hit is None:
                rs, ag = DPc.dp_time(self.fabric, self.shape(sid), nparams, grad_bytes=grad_b)
                hit = (q(rs), q(ag), q((1 - o_dp) * rs), q((1 - o_dp) * ag))
                dp_memo[k] = hit
            return hit

        for si, node in enumerate(slot_nodes):
            dl_tab = P.nodes[node["dl"]].values
            ex_tab = P.nodes[node["ex"]].values
            dl_here = sorted(set(dl_tab.values()))
            ex_here = sorted(set(ex_tab.values()))
            rsd, agd, rsd1, agd1 = {}, {}, {}, {}
            od = {}
            pairs = set()
            for pp_, lixs in ids_by_pp.items():
                dids = {dl_tab[l] for l in lixs}
                for (ti, sid) in dp_by_pp.get(pp_, ()):
                    for did in dids:
                        pairs.add((ti, did, sid))
            for ti, did, sid in pairs:
                dsum, _ = dl_ids.values[did]
                dense_p = dsum / vals["tp"][ti]
                key = (ti, did, sid)
                rsd[key], agd[key], rsd1[key], agd1[key] = dpt(sid, dense_p)
            for ix, a in self.combos("tp", "cp", "dp"):
                for did in dl_here:
                    dsum, _ = dl_ids.values[did]
                    dense_p = dsum / a["tp"]
                    od[ix + (did,)] = q(OPT.optimizer_time(dense_p / max(a["dp"] * a["cp"], 1), hbm))
            RSd = P.table_t(self.idx("tp"), rsd, nodes=[node["dl"], self.sh["dp"]])
            AGd = P.table_t(self.idx("tp"), agd, nodes=[node["dl"], self.sh["dp"]])
            RSd1 = P.table_t(self.idx("tp"), rsd1, nodes=[node["dl"], self.sh["dp"]])
            AGd1 = P.table_t(self.idx("tp"), agd1, nodes=[node["dl"], self.sh["dp"]])
            OD = P.table_t(self.idx("tp", "cp", "dp"), od, nodes=[node["dl"]])
            rs_parts, ag_parts, rs1_parts, ag1_parts, opt_parts = [RSd], [AGd], [RSd1], [AGd1], [OD]
            if model.is_moe:
                rse, age, rse1, age1, oe = {}, {}, {}, {}, {}
                triples = set()
                for pp_, lixs in ids_by_pp.items():
                    xids = {ex_tab[l] for l in lixs}
                    for (e, sid) in edp_by_pp.get(pp_, ()):
                        for xid in xids:
                            triples.add((e, xid, sid))
                for e, xid, sid in triples:
                    key = (e, xid, sid)
                    rse[key], age[key], rse1[key], age1[key] = dpt(sid, ex_ids.values[xid] / e)
                for ix, a in self.combos("pp"):
                    for xid in ex_here:
                        exs = ex_ids.values[xid]
                        for w in self.worlds:
                            # expert_p / edp = (EX / (ep*etp)) / (W / (ep*etp*pp)) = EX * pp / W
                            oe[ix + (xid, w)] = q(OPT.optimizer_time(exs * a["pp"] / w, hbm))
                keys = [EE, node["ex"], self.sh["edp"]]
                rs_parts.append(P.table_t((), rse, nodes=keys))
                ag_parts.append(P.table_t((), age, nodes=keys))
                rs1_parts.append(P.table_t((), rse1, nodes=keys))
                ag1_parts.append(P.table_t((), age1, nodes=keys))
                opt_parts.append(P.table_t(self.idx("pp"), oe, nodes=[node["ex"], self.W]))
            RS, AG = P.sum(rs_parts), P.sum(ag_parts)
            RS1, AG1 = P.sum(rs1_parts), P.sum(ag1_parts)
            nx = P.sum([P.max([RS1, P.sum([RS, node["bwd"]], [1, -1]), zero]),
                        P.max([AG1, P.sum([AG, node["fwd"]], [1, -1]), zero])])
            y, y1 = P.sum([AG, RS], [2, 1]), P.sum([AG1, RS1], [2, 1])
            fx = P.product(M, P.max([y1, P.sum([y, node["comp"]], [1, -1]), zero]))
            dpx_nodes.append(P.element(self.vi["fsdp"], [fx if f else nx for f in fs_vals]))
            opt_nodes.append(P.sum(opt_parts))
        DPX = P.element(crit, dpx_nodes, index_is_node=True)
        OPTN = P.element(crit, opt_nodes, index_is_node=True)
        return P.sum([CORE, P2P, DPX, OPTN], [1, 1, BUBBLE, BUBBLE])

    # -- separable lower bound of the objective (CP-SAT master) ---------------------------------
    def bound_factors(self):
        """``[(vars, {index tuple: factor})]`` with ``objective(x) >= prod_j factor_j(x)`` for every
        assignment x of the program (solver.layout.solve_bounded).

        objective = weight * step, step >= CORE = (840 m + 840 (pp-1)/vpp) * TMAX (P2P, DP and
        optimizer terms are >= 0), TMAX = max over present slots t_s >= t_s for each slot, and
        t_s = sum_k n_sk L_k + mtp_s MTP + loss_s HEAD. Each exposed communication term of L_k is
        at least its minimum over the group shapes, so L_k >= Lmin_k(tp, cp, ep, etp, mbs,
        recompute, dispatcher); with the reference kind r (the most work) and rho_k = min Lmin_k /
        Lmin_r (rho_head, rho_mtp likewise), t_s >= Lmin_r * (sum_k n_sk rho_k + ...). Factors:
        840 (m + (pp-1)/vpp) over (gbs, mbs, dp, pp, vpp); max_s (sum_k n_sk rho_k + ...) over
        (pp, vpp, split); Lmin_r over the layer variables; the objective weight over its own."""
        import numpy as np

        src, P, vals = self._src, self.prog, self.vals

        def tab(node):
            return P.nodes[node].values

        def minshape(node):
            """{var-index tuple: min over the shape-id key} of a table keyed by one shape node."""
            out = {}
            for k, v in tab(node).items():
                kk = k[:-1]
                if kk not in out or v < out[kk]:
                    out[kk] = v
            return out

        def exposed(t, t1, key, work):
            # min over shapes of max(t1, t - work, 0) >= max(min t1, min t - work, 0)
            return max(t1.get(key, 0), t.get(key, 0) - work, 0)

        tpt, tpt1 = minshape(src["TPT"]), minshape(src["TPT1"])
        cpt, cpt1 = minshape(src["CPT"]), minshape(src["CPT1"])
        # the expert all-to-all enters at its exact group shape (the EP shape node keys the factor):
        # its price inside or across NVLink domains is most of what separates layouts
        moe = "A" in src
        if moe:
            at, at1 = tab(src["A"]), tab(src["A1"])
            avars = src["avars"]
            sids_of = {}
            for sid in self._shape_values(self.sh["ep"]):
                sids_of.setdefault(self.shape(sid).size, []).append(sid)
        # Each layer bound is keyed by (tp, cp, ep, etp, mbs) and the EP shape: the master
        # enumerates blocks, and recompute and the dispatcher are left to the exact evaluation of
        # each block's completions (_BLOCK_FREE), so the bound is the minimum over them.
        lvars = src["lvars"]
        assert lvars == ("tp", "cp", "ep", "etp", "mbs", "recompute")
        uvars = lvars[:5]
        pos = {v: i for i, v in enumerate(uvars)}
        launch = src["launch"]
        ep_vals = vals["ep"]
        disp = list(range(len(vals["dispatcher"]))) if moe else [None]
        lmin = {kind: {} for kind in src["per"]}
        tabs = [(kind, lmin[kind], tab(t["comp"]), tab(t["g3"]), tab(t["attn"])) for kind, t in src["per"].items()]
        for lk in tabs[0][2]:
            tp_i, cp_i, ep_i, _etp_i, mbs_i, rc_i = lk
            base = lk[:5]
            sids = sids_of.get(ep_vals[ep_i], []) if moe else [None]
            keys_ = [base if sid is None else base + (sid,) for sid in sids]
            for kind, d, ct, gt, att in tabs:
                comp = ct.get(lk)
                if comp is None:
                    continue
                v = (comp + launch + exposed(tpt, tpt1, (cp_i, mbs_i, rc_i), gt[lk])
                     + exposed(cpt, cpt1, (tp_i, cp_i, mbs_i), att[lk]))
                if kind[0] == "moe":
                    ctx = {"tp": tp_i, "cp": cp_i, "mbs": mbs_i, "recompute": rc_i}
                    for dsp in disp:
                        ctx["dispatcher"] = dsp
                        ak = tuple(ctx[n_] for n_ in avars)
                        for sid, key in zip(sids, keys_):
                            w = max(v + exposed(at, at1, ak + (sid,), comp), 1)
                            if w < d.get(key, w + 1):
                                d[key] = w
                else:
                    w = max(v, 1)
                    for key in keys_:
                        if w < d.get(key, w + 1):
                            d[key] = w
        kl = src["kind_list"]
        keys = set.intersection(*(set(d) for d in lmin.values()))
        if not keys:
            return None
        counts = {k: 0 for k in kl}
        for v in next(iter(src["slots_of"].values())):
            for kj, k in enumerate(kl):
                counts[k] += v[0][kj]
        ref = max(lmin, key=lambda k: counts.get(k, 0) * float(np.mean(list(lmin[k].values()))))
        lref = {k: lmin[ref][k] for k in keys}
        rho = {k: min(lmin[k][x] / lref[x] for x in keys) for k in lmin}
        tcm = [n for n in ("tp", "cp", "mbs")]

        def rho_of(table):
            if table is None:
                return 0.0
            t = tab(table)
            return min(t[tuple(x[pos[n]] for n in tcm)] / lref[x] for x in keys
                       if tuple(x[pos[n]] for n in tcm) in t)

        rho_head = rho_of(src["H"]["total"])
        rho_mtp = rho_of(src["MX"]["total"]) if src["MX"] is not None else 0.0
        slot_f = {}
        for ix, slots in src["slots_of"].items():
            best = 0.0
            for v in slots:
                c = sum(v[0][kj] * rho.get(k, 0.0) for kj, k in enumerate(kl)) + v[1] * rho_mtp + v[2] * rho_head
                best = max(best, c)
            slot_f[ix] = max(best, 1e-9) * (1 - 1e-9)
        pipe = {}
        for ix, a in self.combos("gbs", "mbs", "dp", "pp", "vpp"):
            m_ = src["mt"].get(ix[:3])
            b_ = src["b1"].get(ix[3:])
            if m_ is None or b_ is None:
                continue
            pipe[ix] = BUBBLE * m_ + b_
        lnodes = (self.sh["ep"],) if moe else ()
        factors = [(tuple(self.idx(*uvars)), lnodes, {k: float(v) for k, v in lref.items()}),
                   (tuple(self.idx("pp", "vpp", "split")), slot_f),
                   (tuple(self.idx("gbs", "mbs", "dp", "pp", "vpp")), {k: float(v) for k, v in pipe.items()})]
        if P.weight is not None:
            wv, wt = P.weight
            factors.append((tuple(wv), {k: float(v) for k, v in wt.items()}))
        if getattr(self, "band_min", None) is not None:   # robust: the band factor, least over FSDP
            factors.append(self.band_min)
        self.master_vars = [i for i, v in enumerate(VARIABLES) if v not in _BLOCK_FREE + ("fsdp",)]
        return factors

    # -- memory lower bound ---------------------------------------------------------------------
    def _memory_bound(self):
        """A lower bound of ``planner.cost.memory``'s peak, averaged over the pipeline ranks (the worst
        rank holds at least the average), that must fit in HBM less the reserve:

        - without FSDP: the weights and gradients of every parameter a replica holds (BF16 for
          Megatron; FP32, with the optimizer state, for TorchTitan and MaxText), spread over tp*pp
          (dense) or ep*etp*pp (experts), plus the low-precision copies of the expert weights;
        - with FSDP: the same state sharded over all W GPUs (dense / (tp*pp*dp*cp) and expert /
          (ep*etp*pp*edp) are both x / W), plus the gathered buffers of the biggest layer, at least
          one MoE layer's experts on a GPU, twice;
        - Megatron's distributed optimizer shard, (dense + expert) / W.
        Activations, logits, dense-weight copies and fragmentation are left out (they are >= 0).
        ``tests/test_plan.py`` checks that every layout it drops fails the exact estimate."""
        from planner.model.flops import layer_costs, param_counts
        from planner.cost.memory import WEIGHT_COPY_BYTES, options_for

        P, vals, model, tr = self.prog, self.vals, self.model, self.training
        opt = options_for(tr, self.profile)   # a fitted profile's reserve (issue 13) bounds memory too
        megatron = tr.trainer == "megatron"
        pc = param_counts(model)
        # MTP layers excluded and the vocabulary unpadded: both counts are at most what memory holds
        expert_total = float(pc.experts) if model.is_moe else 0.0
        dense_total = float(pc.dense)
        q = WEIGHT_COPY_BYTES[tr.precision]
        # one MoE layer's experts (all of them; a GPU holds ceil(n/ep) of them, each / etp)
        layer_experts = max((c.n_experts * c.expert_params for c in layer_costs(model, tr.seq_len)
                             if c.kind == "decoder" and c.n_experts), default=0.0)
        GiB = float(1 << 30)
        from planner.cost.memory import usable_hbm_gib  # issue 11 item 6: HBM less the headroom

        budget = math.ceil((usable_hbm_gib(self.gpu.hbm_gib, tr) - opt.reserve_gib) * GiB / 1e3)  # kB
        # bytes per parameter (planner.cost.memory): Megatron keeps BF16 weights and gradients and shards the
        # optimizer over data parallel; TorchTitan / MaxText keep FP32 weights and gradients and shard
        # everything only under FSDP
        state = (2.0 + opt.grad_bytes) if megatron else 8.0
        optb = (opt.master_bytes + 2 * opt.moment_bytes) if megatron else 2 * opt.moment_bytes
        buf = 2.0 + (opt.grad_bytes if megatron else 4.0) + q
        lb1, lb2 = {}, {}
        for ix, a in self.combos("tp", "pp", "ep", "etp", "fsdp"):
            etp = a["tp"] if a["etp"] is None else a["etp"]
            if a["fsdp"]:
                lb1[ix] = int(2 * buf * layer_experts / (a["ep"] * etp) / 1e3)
            else:
                per = state if megatron else state + optb
                lb1[ix] = int((per * dense_total / (a["tp"] * a["pp"])
                               + (per + q) * expert_total / (a["ep"] * etp * a["pp"])) / 1e3)
        # what is sharded over every GPU: dense / (tp*pp*dp*cp) + expert / (ep*etp*pp*edp) =
        # (dense + expert) / W, as tp*cp*pp*dp = W and the expert grid ep*etp*pp*edp covers the
        # same W GPUs: Megatron's optimizer always, and FSDP's weights and gradients
        for fi, f in enumerate(vals["fsdp"]):
            per = (optb if megatron else 0.0) + ((state + (0.0 if megatron else optb)) if f else 0.0)
            for w in self.worlds:
                lb2[(fi, w)] = int(per * (dense_total + expert_total) / w / 1e3)
        LB = P.sum([P.table_t(self.idx("tp", "pp", "ep", "etp", "fsdp"), lb1),
                    P.table_t(self.idx("fsdp"), lb2, nodes=[self.W])])
        P.at_most(LB, budget)
        self.notes.append("memory lower bound: model state and expert copies / (tp*pp, ep*etp*pp), or FSDP shards "
                          "and the biggest layer's buffers, + optimizer shard <= HBM - reserve")

    # -- objective ---------------------------------------------------------------------------------
    def _band_factor(self):
        """robust: a table node of BAND_SCALE * exp(h) over (cp, fsdp) and the EP shape (MoE), h the
        band of the layout's regime (``planner.cost.uncertainty.band_for``, the one predict reports);
        sets ``band_min`` (its least value over FSDP, a free variable of the block search) as a bound
        factor and ``lb_scale`` (its least value) for the exhaustive search's lower bound."""
        import dataclasses

        from planner.cost.uncertainty import band_for, classify

        P, vals, model = self.prog, self.vals, self.model
        base = classify(model, self.cluster, ParallelConfig(), self.training, ep_domains=1)

        def scaled(cp, fsdp, across):
            ep = ("ep-across-domains" if across else "ep-in-domain") if model.is_moe else None
            reg = dataclasses.replace(base, cp=cp > 1, fsdp=bool(fsdp), ep=ep)
            return int(round(BAND_SCALE * band_for(reg, self.profile.name, self.training.trainer).factor()))

        table, least = {}, {}
        sids = self._shape_values(self.sh["ep"]) if model.is_moe else [None]
        for (ci, fi), a in self.combos("cp", "fsdp"):
            for sid in sids:
                v = scaled(a["cp"], a["fsdp"], sid is not None and self.shape(sid).domains > 1)
                key = (ci, fi) if sid is None else (ci, fi, sid)
                table[key] = v
                lk = (ci,) if sid is None else (ci, sid)
                least[lk] = min(v, least.get(lk, v))
        nodes = [] if sids == [None] else [self.sh["ep"]]
        self.band_node = P.table_t(self.idx("cp", "fsdp"), table, nodes=nodes)
        self.band_min = (tuple(self.idx("cp")), tuple(nodes), {k: float(v) for k, v in least.items()})
        self.lb_scale = min(table.values())
        self.notes.append(f"robust objective: band factors exp(h) rounded to 1/{BAND_SCALE}")
        return self.band_node

    def band_scale_of(self, choice) -> int:
        """The band factor (BAND_SCALE * exp(h)) the objective node carries for a solution; 1 when not robust."""
        if getattr(self, "band_node", None) is None:
            return 1
        from solver.layout import evaluate_many

        _, _, vals_ = evaluate_many(self.prog, np.asarray([choice], dtype=np.int64), upto=self.band_node)
        return int(vals_[self.band_node][0])

    def _objective(self, total):
        P, vals, tr = self.prog, self.vals, self.training
        gbs_vals = vals["gbs"]
        if self.objective == "robust":   # tokens/s * exp(-h): minimise step * exp(h) / gbs
            total = P.product(total, self._band_factor())
        if self.objective in ("throughput", "robust"):
            # tokens/s = gbs * seq / step: minimise step / gbs, i.e. step * (L / gbs)
            if len(gbs_vals) == 1:
                P.minimize(total)
                return
            lcm = _lcm(gbs_vals)
            if lcm <= 10 ** 6:
                w = {(i,): lcm // g for i, g in enumerate(gbs_vals)}
            else:
                K = 10 ** 6 * max(gbs_vals)
                w = {(i,): max(1, round(K / g)) for i, g in enumerate(gbs_vals)}
                self.notes.append("global-batch weights rounded to 1e-6 relative")
            P.minimize(total, self.idx("gbs"), w)
            return
        # tflops per GPU = gbs * seq * fpt(tp) / (world * step): minimise step * world / (gbs * fpt(tp))
        from planner.cost.predict import _flops_per_token

        fpt = {t: _flops_per_token(self.model, tr.seq_len, t, self.profile.flops_formula) for t in vals["tp"]}
        ratios = {}
        for ix, a in self.combos("tp", "cp", "pp", "dp", "gbs"):
            w = a["tp"] * a["cp"] * a["pp"] * a["dp"]
            ratios[ix] = w / (a["gbs"] * fpt[a["tp"]])
        lo = min(ratios.values())
        K = 10 ** 6 / lo
        P.minimize(total, self.idx("tp", "cp", "pp", "dp", "gbs"),
                   {k: max(1, round(r * K)) for k, r in ratios.items()})
        self.notes.append("per-GPU objective weights rounded to 1e-6 relative")

    # -- reading a solution ----------------------------------------------------------------------
    def assignment(self, choice) -> dict:
        return {v: self.vals[v][i] for v, i in zip(VARIABLES, choice)}

    def config_of(self, choice):
        a = self.assignment(choice)
        _, lay, sp = self.layouts[tuple(choice[self.vi[v]] for v in ("pp", "vpp", "split"))]
        cfg = ParallelConfig(tp=a["tp"], pp=a["pp"], vpp=a["vpp"], cp=a["cp"], ep=a["ep"], etp=a["etp"], dp=a["dp"],
                             mbs=a["mbs"], fsdp=a["fsdp"], recompute=a["recompute"], dispatcher=a["dispatcher"],
                             pp_first=sp[0], pp_last=sp[1])
        world = a["tp"] * a["cp"] * a["pp"] * a["dp"]
        return cfg, world, a["gbs"], a["gpd"], lay


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
    from planner.search.space import gpd_candidates

    if job.per_domain is not None:
        return [None]
    out = gpd_candidates(job.cluster.domain_sizes())
    even = even_per_domain(job.cluster.domain_sizes(), job.gpus, job.cluster.gpu_spec.gpus_per_node)
    return out + ([even] if even is not None and even not in out else [])


def _used_per_domain(cluster, gpd, world) -> list[int]:
    """GPUs of each NVLink domain the first ``world`` ranks use (placement fills domains in order)."""
    from planner.cost.placement import domain_slots

    out, left = [], world
    for _, k in domain_slots(cluster.domain_sizes(), gpd):
        if left <= 0:
            break
        take = min(k, left)
        if take:
            out.append(take)
        left -= take
    return out


def _equal_slices(cluster, gpd, world) -> bool:
    return len(set(_used_per_domain(cluster, gpd, world))) == 1


def _maxtext_mesh_ok(cluster, model, cfg, world, gpd) -> bool:
    """MaxText's mesh rule as ``planner.output.emit.maxtext.split_mesh`` applies it: the axes
    (tensor, context, expert, fsdp = dp / ep, stage) fill a slice innermost-first by gcd, and the
    ICI part must be the slice and the DCN part the number of slices."""
    used = _used_per_domain(cluster, gpd, world)
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
         equal_slices: bool | None = None) -> PlanResult:
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
    """
    if method not in METHODS:
        raise InputError(f"--method {method!r}: use one of {', '.join(METHODS)}")
    from planner.cost.memory import memory_per_gpu, options_for
    from planner.cost.placement import make_placement
    from planner.cost.predict import predict
    from planner.cost.profiles import load_profile
    from planner.rules import violations

    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise InputError(f"objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    trainer = trainer or training.trainer
    if trainer != training.trainer:   # priced with the trainer's own profile unless a stack was chosen
        from planner.config import DEFAULT_STACKS

        update = {"trainer": trainer}
        if training.stack == DEFAULT_STACKS.get(training.trainer):
            update["stack"] = DEFAULT_STACKS[trainer]
        training = training.model_copy(update=update)
    prof = load_profile(profile if profile is not None else training.stack)
    # issue 11 item 5: a topologies.loader.Job is the cluster's racks and the GPUs the job uses;
    # the planner chooses the GPUs per NVLink domain unless the job fixes them (--usable-per-rack)
    from topologies.loader import Job

    max_world = None
    if isinstance(cluster, Job):
        job, cluster, max_world = cluster, cluster.cluster, cluster.gpus
        if job.per_domain is not None:
            restrict = {**(restrict or {}), "gpd": [None]}
    n = max_world or cluster.num_gpus
    if equal_slices is None:
        equal_slices = trainer == "maxtext"
    include = dict(include or {})
    even = even_per_domain(cluster.domain_sizes(), n, cluster.gpu_spec.gpus_per_node)
    if even is not None and not (restrict or {}).get("gpd"):
        include["gpd"] = list(include.get("gpd", [])) + [even]
    if min_world is None:
        min_world = max(1, n // 2)
    if min_world is None:
        min_world = max(1, n // 2)
    if gbs_range is not None and not (gbs_range[0] <= training.global_batch <= gbs_range[1]):
        training = training.model_copy(update={"global_batch": gbs_range[0]})
    from planner.model.flops import param_counts

    pc = param_counts(model)
    total_params = float(getattr(pc, "total", 0) or 0)
    offered = None
    if trainer == "megatron":  # the plain all-to-all and the stack's own (flex) dispatcher
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
    b = _Builder(model, cluster, training, space, prof, objective, min_world)
    b.n_gpus, b.equal_slices = n, equal_slices  # issue 11 item 5: the job's GPUs; MaxText slices
    t_build0 = time.perf_counter()
    prog = b.build()
    t_build = time.perf_counter() - t_build0

    gpu = cluster.gpu_spec
    mem_vars = [b.vi[v] for v in VARIABLES if v not in _MEMORY_FREE]
    shortfalls: list[tuple[float, str]] = []
    checked: dict = {}

    def accept(choice):
        key = tuple(choice[i] for i in mem_vars)
        hit = checked.get(key)
        if hit is None:
            cfg, world, gbs, _, lay = b.config_of(choice)
            tr = training.model_copy(update={"global_batch": gbs})
            est = memory_per_gpu(model, cfg, tr, world, gpu, layout=lay, options=options_for(tr, prof))
            hit = (est.fits(usable), est.peak_gib, cfg.short())
            checked[key] = hit
        if hit[0]:
            return None
        shortfalls.append((hit[1] - usable, hit[2]))
        return mem_vars

    from planner.cost.memory import usable_hbm_gib

    usable = usable_hbm_gib(gpu.hbm_gib, training)  # issue 11 item 6: plans fit in HBM less the headroom
    memory_accept = accept
    mesh_vars = [b.vi[v] for v in ("tp", "cp", "pp", "dp", "ep", "gpd")]

    def accept(choice):  # noqa: F811 - issue 11 item 5: MaxText's mesh must factor into its slices
        cut = memory_accept(choice)
        if cut is not None or not equal_slices:
            return cut
        cfg, world, _, gpd, _ = b.config_of(choice)
        return None if _maxtext_mesh_ok(cluster, model, cfg, world, gpd) else mesh_vars

    factors = b.bound_factors() if method in ("cp-sat", "enumerate") else None
    if method == "cp-sat-full":
        res = solve(prog, top=top, time_limit=time_limit, workers=workers, accept=accept)
    elif factors is not None and method == "cp-sat":
        res = solve_bounded(prog, factors, top=top, accept=accept, time_limit=time_limit, workers=workers,
                            master=b.master_vars)
    elif factors is not None:
        res = enumerate_bounded(prog, factors, b.master_vars, top=top, accept=accept, time_limit=time_limit)
    else:   # "exhaustive", or no bound could be formed: every assignment, by its exact CORE + P2P bound
        res = _enumerate(prog, b, top, accept, time_limit)
    if not res.solutions:
        if res.status in ("UNKNOWN",) and time_limit is not None:
            raise InfeasibleError(f"no layout found within --time-limit {time_limit:g} s; raise the limit")
        if not shortfalls and prog.limits:
            # the memory bound dropped every layout: price exactly the few it rates closest
            from solver.layout import evaluate_many, feasible_rows

            rows = feasible_rows(prog)
            if len(rows):
                lim = prog.limits[0][0]
                lbv, okv, _ = evaluate_many(prog, rows, upto=lim)
                lbv = np.where(okv, lbv, np.iinfo(np.int64).max)
                for i in np.argsort(lbv, kind="stable")[:8]:
                    if okv[i]:
                        accept(tuple(int(a) for a in rows[i]))
        raise InfeasibleError(_nothing_fits(model, cluster, training, shortfalls, b))

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
        gi = b.vals["gpd"].index(gpd)
        rm = b.rank_maps[gi]
        e = cfg.etp_eff
        shapes = {"tp": rm.worst_shape(1, cfg.tp, world), "cp": rm.worst_shape(cfg.tp, cfg.cp, world),
                  "dp": rm.worst_shape(cfg.tp * cfg.cp, cfg.dp_for(world), world),
                  "pp": rm.worst_shape(world // cfg.pp, cfg.pp, world)}
        if model.is_moe:
            shapes["ep"] = rm.worst_shape(e, cfg.ep, world)
            shapes["edp"] = rm.worst_shape(e * cfg.ep, cfg.edp_for(world), world)
        step_prog = sol.node_value / b.band_scale_of(sol.choice) / BUBBLE * NS
        if pred.step_time_s > 0:
            max_err = max(max_err, abs(step_prog - pred.step_time_s) / pred.step_time_s)
        entries.append(PlanEntry(cfg, pred, placement, world, gbs, shapes, step_prog))

    best = entries[0].prediction
    if objective == "robust":   # the band's lower edge of the cluster's tokens/s
        obj_val = best.tokens_per_s * math.exp(-best.band_half_width)
        bound = _bound_value(res, b, training, entries[0], objective)
    elif objective == "throughput":
        obj_val = best.tokens_per_s
        bound = _bound_value(res, b, training, entries[0], objective)
    else:
        obj_val = best.tflops_per_gpu
        bound = _bound_value(res, b, training, entries[0], objective)
    solver_info = {
        "status": res.status,
        "wall_s": time.perf_counter() - t0,
        "solve_s": res.wall_s,
        "build_s": t_build,
        "objective": obj_val,
        "objective_name": {"throughput": "tokens_per_s", "robust": "tokens_per_s_low"}.get(objective, "tflops_per_gpu"),
        "bound": bound,
        "gap": None if bound is None or not obj_val else max(0.0, (bound - obj_val) / obj_val),
        "method": method if factors is not None or method in ("cp-sat-full", "exhaustive") else "exhaustive",
        "evaluated_exactly": getattr(res, "evaluated", res.num_constraints),
        "cpsat_s": getattr(res, "cpsat_s", res.wall_s if method == "cp-sat-full" else 0.0),
        "bands": getattr(res, "bands", 0),
        "statuses": res.statuses,
        "memory_cuts": res.rejected,
        "layouts_in_space": float(space.size()),
        "variables": res.num_vars,
        "constraints": res.num_constraints,
        "program_vs_predict_max_rel_err": max_err,
        "min_world": min_world,
        "space": {k: list(v) for k, v in space.values.items()},
        "layouts": sorted([b.vals["pp"][k[0]], b.vals["vpp"][k[1]], b.vals["split"][k[2]]] for k in b.layouts),
        "notes": b.notes,
    }
    return PlanResult(entries, solver_info, model, cluster, training)


def _enumerate(prog, b: _Builder, top: int, accept, time_limit: float | None = None):
    """Exhaustive, vectorised evaluation of the program over every assignment the rule tables
    allow, in order of an exact lower bound; memory (the lazy constraint) is checked best-first.

    Every allowed assignment gets the lower bound ``CORE + P2P`` (the DP and optimizer terms are
    non-negative; times the objective weight). Rows are then fully evaluated in chunks, smallest
    bound first; the search stops when ``top`` fitting layouts are known and the next bound is no
    better than the worst of them (OPTIMAL), or at ``time_limit`` (FEASIBLE, and the next bound is
    the proven bound)."""
    from solver.layout import LayoutResult, Solution, evaluate_many, feasible_rows, weights_of

    t0 = time.perf_counter()
    order = [b.vi[v] for v in ("tp", "cp", "pp", "dp", "vpp", "split", "gbs", "mbs", "ep", "etp", "recompute",
                               "dispatcher", "gpd", "fsdp")]
    rows = feasible_rows(prog, order)
    n_rows = len(rows)
    sols: list = []
    rejected = 0
    status, bound = "INFEASIBLE", None
    if n_rows:
        # fsdp is the last variable and no table before the bound reads it (nor any rule), so the
        # rows come in runs of len(fsdp) that share the bound: evaluate one row per run.
        fv = b.vi["fsdp"]
        nf = prog.domains[fv]
        reads_fsdp = any(fv in v for v, _ in prog.allowed + prog.forbidden) or any(
            nd.kind == "table" and fv in nd.vars for nd in prog.nodes[: b.lb_node + 1]) or any(
            nd.kind == "element" and fv in nd.vars for nd in prog.nodes[: b.lb_node + 1])
        runs_ok = False
        if nf > 1 and not reads_fsdp and n_rows % nf == 0:
            r3 = rows.reshape(-1, nf, rows.shape[1])
            others = [c for c in range(rows.shape[1]) if c != fv]
            runs_ok = bool(np.all(r3[:, :, fv] == np.arange(nf)) and np.all(r3[:, :, others] == r3[:, :1, others]))
        if runs_ok:
            lb1, okb1, _ = evaluate_many(prog, rows[::nf], upto=b.lb_node)
            lb, okb = np.repeat(lb1, nf), np.repeat(okb1, nf)
        else:
            lb, okb, _ = evaluate_many(prog, rows, upto=b.lb_node)
        w, okw = weights_of(prog, rows)
        keep = np.flatnonzero(okb & okw)
        rows = rows[keep]
        lb = lb[keep] if prog.weight is None else lb[keep].astype(np.float64) * w[keep]
        lb = lb * getattr(b, "lb_scale", 1)   # robust: the objective carries the band factor (>= lb_scale)
        srt = np.argsort(lb, kind="stable")
        rows, lb = rows[srt], lb[srt]
        seen: list = []            # (objective, node value, choice) of evaluated feasible rows
        fitting: list = []
        checked: dict = {}
        chunk = 4096
        pos = 0
        status = "OPTIMAL"
        while True:
            # the top fitting among everything evaluated so far
            seen.sort()
            fitting = []
            for o, nvv, ch in seen:
                ok = checked.get(ch)
                if ok is None:
                    ok = accept(ch) is None
                    checked[ch] = ok
                    if not ok:
                        rejected += 1
                if ok:
                    fitting.append((o, nvv, ch))
                    if len(fitting) >= top:
                        break
            seen = [x for x in seen if checked.get(x[2]) is not False]
            nxt = lb[pos] if pos < len(rows) else None
            if nxt is None or (len(fitting) >= top and fitting[-1][0] <= nxt):
                bound = float(fitting[0][0]) if fitting else None
                break
            if time_limit is not None and time.perf_counter() - t0 > time_limit and fitting:
                status = "FEASIBLE"
                bound = float(min(nxt, fitting[0][0]))
                break
            part = rows[pos: pos + chunk]
            pos += len(part)
            chunk = min(chunk * 2, 1 << 18)
            obj, ok, vals = evaluate_many(prog, part)
            node = vals[prog.objective]
            conv = int if prog.weight is None else float
            for i in np.flatnonzero(ok):
                seen.append((conv(obj[i]), int(node[i]), tuple(int(a) for a in part[i])))
        sols = [Solution(choice=ch, objective=o, node_value=nvv) for o, nvv, ch in fitting[:top]]
        if not sols:
            status = "INFEASIBLE"
    best = sols[0].objective if sols else None
    return LayoutResult(status=status, objective=best, bound=bound,
                        wall_s=time.perf_counter() - t0, solutions=sols, statuses=[status] * len(sols),
                        num_vars=len(prog.domains), num_constraints=n_rows, rejected=rejected)


def _bound_value(res, b: _Builder, training, entry: PlanEntry, objective: str):
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
    from planner.cost.uncertainty import lead

    key = "tflops_per_gpu" if objective_name == "tflops_per_gpu" else "tokens_per_s"
    for a, b in zip(plans, plans[1:]):
        pa, pb = a["prediction"], b["prediction"]
        gap, within = lead(pa[key], pa.get("band_half_width") or 0.0, pb[key])
        a["lead_over_next"], a["within_uncertainty"] = gap, within


def _nothing_fits(model, cluster, training, shortfalls, b) -> str:
    gpu = cluster.gpu_spec
    if shortfalls:
        short, label = min(shortfalls)
        fixes = ["more GPUs (--gpus)"]
        if "RC:full" not in label:
            fixes.append("full recompute")
        if "FSDP" not in label:
            fixes.append("FSDP")
        if "MBS1" not in label.split():
            fixes.append("a smaller micro-batch")
        from planner.cost.memory import usable_hbm_gib

        room = usable_hbm_gib(gpu.hbm_gib, training)
        kept = "" if room >= gpu.hbm_gib else f" ({gpu.hbm_gib:.0f} GiB less the --memory-headroom {training.memory_headroom})"
        return (f"{model.name} on {cluster.num_gpus} {gpu.name.upper()} GPUs: no layout fits in {room:.1f} GiB{kept}; "
                f"the closest ({label}) needs {short:.1f} GiB more per GPU. Use " + ", ".join(fixes[:-1])
                + (" or " if len(fixes) > 1 else "") + fixes[-1])
    return (f"{model.name} on {cluster.num_gpus} {gpu.name.upper()} GPUs: no layout satisfies the {training.trainer} "
            f"rules and the memory lower bound (model state per GPU exceeds {gpu.hbm_gib:.0f} GiB HBM); use more GPUs "
            f"(--gpus), FSDP or a larger global batch")


def scale(model, cluster_for, sizes, training: Training, *, time_limit=None, objective="throughput",
          gbs_range=None, trainer=None, on_done=None) -> list[dict]:
    """Plan each GPU count; rows with throughput, TFLOP/s per GPU and retention vs the smallest size."""
    rows = []
    for n in sorted(sizes):
        cluster = cluster_for(n)
        res = plan(model, cluster, training, top=1, time_limit=time_limit, objective=objective,
                   gbs_range=gbs_range, trainer=trainer)
        e = res.plans[0]
        p = e.prediction
        rows.append({"gpus": n, "world": e.world, "layout": e.label, "gbs": e.gbs,
                     "tokens_per_s": p.tokens_per_s, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
                     "tflops_per_gpu": p.tflops_per_gpu, "step_time_s": p.step_time_s,
                     "status": res.solver["status"], "wall_s": res.solver["wall_s"]})
        if on_done:
            on_done(n)
    base = rows[0]["tflops_per_gpu"] if rows else 0.0
    for r in rows:
        r["retention"] = r["tflops_per_gpu"] / base if base else 0.0
    return rows
