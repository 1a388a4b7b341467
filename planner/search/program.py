"""The program of ``plan``: ``planner.cost.steptime``'s step time as a ``solver.layout`` Program over
the declared space (``planner.search.space``).

Every cost term is a table over the few choices (or derived quantities: the world size, each axis's
worst group shape on the topology) it depends on, filled by calling the same functions that
``predict``'s ``step_time`` composes (``planner.cost.steptime``: ``kind_time``, ``windows``,
``tp_layer_time``, ``a2a_layer_time``, ``cp_layer_time``, ``kind_host_time``, ``head_time``,
``p2p_bytes``, ``rank_inventory``, and the terms' ``dp_time``, ``p2p_transfers``, ``bubble_factor``,
``optimizer_time``); no cost formula is restated here. What the program adds is the composition
written with nodes: sums, exposed = max((1-o) t, t - window, 0), the slowest pipeline rank (first
argmax), the bubble and micro-batch products, and the DP and optimizer terms of the slowest rank.
The program's step time equals ``steptime``'s up to rounding each table entry to a nanosecond
(1/840 ns for terms that carry the bubble factor); tests/test_plan.py checks it against ``predict``.

Memory: a lower bound (model state averaged over the pipeline ranks) prunes inside the program;
``plan`` checks the exact peak lazily. Objective: tokens/s (or TFLOP/s per GPU, or the band's lower
edge) as a weighted minimisation of the step.
"""

from __future__ import annotations

import functools
import math
from functools import reduce

import numpy as np

from planner.config import ParallelConfig, Training
from planner.errors import InfeasibleError, InputError
from planner.search.space import VARIABLES, Space, rule_tables, split_layers, structural_ok, structural_tables
from solver.groups import RankMap
from solver.layout import Program

NS = 1e-9                 # table unit: one nanosecond
BUBBLE = 840              # lcm(1..8): (pp-1)/vpp * 840 is an integer for every vpp candidate
# robust: maximise the lower edge of the uncertainty band, tokens/s * exp(-h); h depends on the layout
# only through CP, FSDP and whether the EP group leaves its NVLink domain (planner.cost.uncertainty),
# so it enters the program as a factor table (exp(h) scaled by BAND_SCALE and rounded): exact.
BAND_SCALE = 1000


@functools.lru_cache(maxsize=None)
def _rc_cfg(recompute: str) -> ParallelConfig:
    """A ParallelConfig that carries only this recompute choice (its normalised form)."""
    return ParallelConfig(recompute=recompute)


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
