"""The program of ``plan``: ``planner.cost.steptime``'s step time as a ``solver.layout`` Program over
the declared space (``planner.search.space``).

Every cost term is a table over the few choices (or derived quantities: the world size, each axis's
worst group shape on the topology) it depends on, filled by calling the same functions that
``predict``'s ``step_time`` composes (``planner.cost.steptime``: ``kind_time``, ``windows``,
``tp_layer_time``, ``a2a_layer_time``, ``cp_layer_time``, ``kind_host_time``, ``head_time``,
``p2p_bytes``, ``rank_inventory``, and the terms' ``dp_time``, ``p2p_transfers``, ``bubble_factor``,
``optimizer_time``); no cost formula is restated here. The composition is not restated either: the
tables are the leaves of ``planner.cost.compose``, run with ``planner.search.nodeops.NodeOps``, which
builds its sums, maxima, products, the slowest pipeline rank (first argmax) and the element picks.
The program's step time equals ``steptime``'s up to rounding each table entry to a nanosecond
(1/840 ns for terms that carry the bubble factor, ``quantisation_bound``); ``plan`` checks it against
``predict`` on every plan it returns and refuses a larger gap as a bug.

Memory: a lower bound (model state averaged over the pipeline ranks) prunes inside the program;
``plan`` checks the exact peak lazily. Objective: tokens/s (or TFLOP/s per GPU, or the band's lower
edge) as a weighted minimisation of the step.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from planner.config import ParallelConfig, Training, parallel_config
from planner.cost import compose as K
from planner.cost.placement import axis_strides, domain_slots
from planner.cost.steptime import (
    LOW_PRECISION,
    a2a_layer_time,
    a2a_recompute_factor,
    cp_layer_time,
    dispatch_bytes,
    efficiencies,
    head_time,
    host_call_us,
    host_regime,
    kind_host_time,
    kind_sync_time,
    kind_time,
    kinds_of,
    layer_kinds,
    offload_time,
    p2p_bytes,
    profile_fabric,
    rank_inventory,
    recipe_pricing,
    recompute_arg,
    tp_layer_time,
    windows,
)
from planner.cost.terms import data_parallel as DPc
from planner.cost.terms import expert_a2a as EA
from planner.cost.terms import optimizer as OPT
from planner.cost.terms import pipeline as PPL
from planner.cost.terms import sync as SYNC
from planner.errors import InfeasibleError, InputError
from planner.model.pipeline import pipeline_layout
from planner.rules import effective_recipe, offload_layers, quantised_params
from planner.search.memory_bound import add_memory_bound
from planner.search.nodeops import NodeOps, Val, Var
from planner.search.objective import add_objective
from planner.search.space import VARIABLES, Space, rule_tables, split_layers, structural_ok, structural_tables
from solver.groups import RankMap
from solver.layout import Program
from topologies.collectives import GroupShape

NS = 1e-9                 # table unit: one nanosecond
BUBBLE = 840              # lcm(1..8): (pp-1)/vpp * 840 is an integer for every vpp candidate


def in_bubble_units(x: float, at) -> int:
    """``x`` (micro-batches or passes: a multiple of 1/vpp) in units of 1/BUBBLE, exactly: the program's tables are
    integers and must equal what ``predict`` computes (tests/test_one_composition.py); ``at`` names the layout."""
    n = int(round(BUBBLE * x))
    assert abs(BUBBLE * x - n) < 1e-6, (at, x)   # BUBBLE is a multiple of every vpp candidate
    return n


@functools.lru_cache(maxsize=None)
def _rc_arg(recompute: str):
    """What the compute and communication terms read of a recompute choice (``steptime.recompute_arg``)."""
    return recompute_arg(ParallelConfig(recompute=recompute))


def _rank_map(cluster, gpd) -> RankMap:
    sizes = cluster.domain_sizes()
    slots = domain_slots(sizes, gpd)
    r2g = np.concatenate([np.arange(st, st + n, dtype=np.int64) for st, n in slots if n > 0])
    dom_all = np.fromiter((g.domain for g in cluster.gpus()), dtype=np.int64)
    units = [np.asarray(cluster.tier_units(t), dtype=np.int64)[r2g] for t in range(len(cluster.fabric_tiers))]
    return RankMap(dom_all[r2g], units)


# The variables each axis's worst group reads in the default rank order (tp-cp-ep-dp-pp), the rest
# being what is left of the world; the solver's "dp" is Megatron's dp-cp group (dense gradients).
AXIS_VARS = {"tp": ("tp",), "cp": ("tp", "cp"), "dp": ("tp", "cp", "dp"), "pp": ("pp",),
             "ep": ("tp", "etp", "ep"), "edp": ("tp", "etp", "ep", "pp")}


def _strides_at(axis: str, a: dict, world: int, pps=None):
    """(stride, size) of ``axis`` (``planner.cost.placement.axis_strides``) for the values ``a`` of its
    ``AXIS_VARS`` on ``world`` ranks; the variables it does not read are 1, except pp under "dp", which
    is what the dense grid leaves of the world (and must be one of ``pps``). None when the grids do not
    fill ``world``. tests/test_one_composition.py checks it against the whole layout's strides."""
    tp, cp, ep = a.get("tp", 1), a.get("cp", 1), a.get("ep", 1)
    etp = tp if a.get("etp") is None else a["etp"]
    pp = a.get("pp", 1)
    if "dp" in a:
        dense = tp * cp * a["dp"]
        if world % dense or (pps is not None and world // dense not in pps):
            return None
        pp = world // dense
    if world % (tp * cp * pp) or world % (etp * ep * pp):
        return None
    parts = axis_strides(tp, cp, ep, etp, pp, world, "dp-cp" if axis == "dp" else axis)
    return parts[0]


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


class ProgramBuilder:
    """Builds the solver.layout Program that mirrors planner.cost.steptime for one request."""

    def __init__(self, model, cluster, training: Training, space: Space, profile, objective: str,
                 min_world: int):
        self.model, self.cluster, self.training, self.space = model, cluster, training, space
        self.profile, self.objective = profile, objective
        self.vals = space.values
        self.vi = {v: i for i, v in enumerate(VARIABLES)}
        self.prog = Program([len(self.vals[v]) for v in VARIABLES], names=list(VARIABLES))
        prog = self.prog
        prog.table_t = lambda vars_, values, nodes=(): prog.table(vars_, values, nodes, trusted=True)
        self.ops = NodeOps(prog)
        self._shape_cache: dict = {}
        self._combos: dict = {}
        self._host: dict = {}
        gpu = cluster.gpu_spec
        self.gpu = gpu
        self.arch = gpu.arch
        self.ep_sms = EA.sm_share(gpu.name)   # SMs the dispatch kernels hold (steptime.step_time)
        self.eff = efficiencies(gpu, training.precision, profile, training.cuda_graphs)
        self.fabric = profile_fabric(cluster, profile)
        self.lp = training.precision in LOW_PRECISION
        self.min_world = min_world
        self.n_gpus = cluster.num_gpus
        self.shape_ids = _Ids()
        self.notes: list[str] = []
        self.GroupShape = GroupShape

    # -- small utilities -------------------------------------------------------------------
    def par(self, name):
        return self.profile.param(name, self.arch)

    def idx(self, *names):
        return [self.vi[n] for n in names]

    def combos(self, *names) -> tuple:
        """(index tuple, value dict) for every combination of the named variables that the
        canonical-form constraints allow; walked once per tuple of names (the tables over the layer
        variables walk the same combinations per layer kind), so callers must not change the dicts."""
        hit = self._combos.get(names)
        if hit is None:
            hit = self._combos[names] = tuple(
                (ix, a) for ix in itertools.product(*(range(len(self.vals[n])) for n in names))
                for a in ({n: self.vals[n][i] for n, i in zip(names, ix)},) if structural_ok(self.space, a))
        return hit

    def host_regime(self, ep: int, recompute: str) -> tuple:
        """``steptime.host_regime`` of a layout: it reads only EP and recompute (through the effective
        recipe), so it is computed once per pair, not once per table entry."""
        key = (ep, recompute)
        hit = self._host.get(key)
        if hit is None:
            hit = self._host[key] = host_regime(self.model, ParallelConfig(ep=ep, recompute=recompute), self.training)
        return hit

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
        # 6. memory lower bound (planner.search.memory_bound)
        add_memory_bound(self)
        # 7. objective (planner.search.objective)
        add_objective(self, total)
        return P

    # -- shapes ---------------------------------------------------------------------------
    def _axis_table(self, axis, names):
        """Shape-id node of ``axis`` (its ``AXIS_VARS``): a table over ``names`` + gpd, keyed by the world
        node; each entry the worst group of the axis's rank-order strides (``axis_strides``)."""
        P, vals = self.prog, self.vals
        table = {}
        rms = [(gi, self.rank_maps[gi]) for gi in range(len(vals["gpd"]))]
        for ix, a in self.combos(*names):
            for w in self.worlds:
                st = _strides_at(axis, a, w, vals["pp"])
                if st is None:
                    continue
                for gi, rm in rms:
                    if w <= rm.capacity:
                        table[ix + (gi, w)] = self.shape_ids(rm.worst_shape(st[0], st[1], w))
        return P.table_t(self.idx(*names, "gpd"), table, nodes=[self.W])

    def _shape_nodes(self):
        axes = ("tp", "cp", "dp", "pp") + (("ep", "edp") if self.model.is_moe else ())
        self.sh = {axis: self._axis_table(axis, AXIS_VARS[axis]) for axis in axes}

    def _shape_values(self, node):
        return sorted(set(self.prog.nodes[node].values.values()))

    # -- step time --------------------------------------------------------------------------
    # Every table below is filled by the function of planner.cost.steptime (or its terms) that
    # step_time calls for the same quantity; only the composition (nodes) is written here.
    def _step_time(self) -> int:
        """The step as ``planner.cost.compose`` composes it, run with ``NodeOps`` on the tables below:
        returns the total's node (unit 1/840 ns)."""
        ops = self.ops
        self._pricing()
        per = self._kind_tables()
        comm = self._comm_tables()
        L = self._layer_nodes(per, comm)
        H, MX, H_b, MX_b = self._head_nodes()
        self.offload = self._offload_table()
        slots_of, slot_nodes = self._slot_nodes(L, H, MX)
        self.crit, TMAX = K.critical(ops, [Val(n["t"]) for n in slot_nodes], [Val(n["present"]) for n in slot_nodes])
        M, mt, b1, M840, B840 = self._pipeline_tables()
        core, p2p = K.pipeline(ops, Val(M840, BUBBLE), Val(B840, BUBBLE), TMAX, *self._p2p_tables())
        # core + p2p is a lower bound of the step (the DP and optimizer terms are >= 0)
        self.lb_node = ops.add(core, p2p).node
        # sources of the separable lower bound (planner.search.bounds)
        self._src = dict(per=per, TPT=comm["TPT"], TPT1=comm["TPT1"], CPT=comm["CPT"], CPT1=comm["CPT1"],
                         launch=self.launch, H=H_b, MX=MX_b, slots_of=slots_of, kind_list=self.kind_list,
                         mt=mt, b1=b1, lvars=self.lvars)
        if self.model.is_moe:
            self._src.update(A=comm["A"], A1=comm["A1"], avars=comm["avars"])
        for si, node in enumerate(slot_nodes):
            self._slot_windows(si, node, per, H, MX)
        dpx, opt = self._dp_optimizer(slot_nodes, M)
        unpaired = self._unpaired_a2a()
        total = K.step(ops, core, p2p, dpx, opt, ([unpaired] if unpaired is not None else [])
                       + [Val(n) for n in self._extra_terms()])
        assert total.den == BUBBLE
        return total.node

    def _unpaired_a2a(self):
        """``compose.unpaired_a2a``: the unpaired passes (``expert_a2a.unpaired_passes``, in units of 1/840) over
        (gbs, mbs, dp, pp, vpp) times the first pipeline rank's (slot 0's) hidden all-to-all per micro-batch;
        None without MoE layers."""
        if not self.hidden:
            return None
        P = self.prog
        parts = []
        for kj, kind in enumerate(self.kind_list):
            cnts = self._slot_col(0, lambda v, kj=kj: v[0][kj])
            if kind in self.hidden and any(cnts.values()):
                parts.append((Val(P.table_t(self.lay_vars, cnts)), self.hidden[kind]))
        if not parts:
            return None
        u = {}
        for ix, a in self.combos("gbs", "mbs", "dp", "pp", "vpp"):
            if a["gbs"] % (a["mbs"] * a["dp"]) == 0:
                u[ix] = in_bubble_units(EA.unpaired_passes(a["pp"], a["vpp"], a["gbs"] // (a["mbs"] * a["dp"])), a)
        U = Val(P.table_t(self.idx("gbs", "mbs", "dp", "pp", "vpp"), u), BUBBLE)
        return K.unpaired_a2a(self.ops, U, K.rank_time(self.ops, parts))

    def _extra_terms(self) -> list[int]:
        """A table node per ``compose.EXTRA_TERMS`` term over the variables it reads (and the world); none for a
        term that is zero on every layout of the request."""
        ctx = K.TermContext(self.model, self.cluster, self.training, self.profile, self.fabric)
        out = []
        for term in K.EXTRA_TERMS:
            names = tuple(n for n in term.reads if n != "world")
            worlds = self.worlds if "world" in term.reads else [None]
            table = {}
            for ix, a in self.combos(*names):
                for w in worlds:
                    key = ix if w is None else ix + (w,)
                    table[key] = self.q(term.seconds(ctx, dict(a, world=w) if w is not None else a))
            if not any(table.values()):
                continue   # the term costs nothing for this request (e.g. fp8_amax without delayed scaling)
            out.append(self.prog.table_t(self.idx(*names), table, nodes=[self.W] if worlds != [None] else []))
        return out

    def _pricing(self):
        """The recipe as each layout runs it (``steptime.recipe_pricing``): TP overlap is on for every
        TP > 1 or for none; CUDA graphs follow recompute (one ``Efficiencies`` per recompute choice);
        the all-to-all overlap is chosen per layout by the OV node of ``_comm_tables``."""
        model, tr = self.model, self.training

        def pricing(**kw):
            return recipe_pricing(model, ParallelConfig(**kw), tr, self.profile, self.arch)

        self.pricing = pricing
        self.o_tp = pricing(tp=2)[0]
        self.eff_rc = {rc: efficiencies(self.gpu, tr.precision, self.profile, pricing(recompute=rc)[2])
                       for rc in self.vals["recompute"]}
        self.rc_priced = len(set(self.eff_rc.values())) > 1   # graphs on or off depends on recompute
        self.launch = self.q(self.par("other.layer_us") * 1e-6)
        self.call_us = host_call_us(self.cluster, self.par)
        self.kind_list = list(kinds_of(model))
        self.lvars = ("tp", "cp", "ep", "etp", "mbs", "recompute")

    def _kind_tables(self) -> dict:
        """Per layer kind: compute, forward, backward and the windows communication hides behind
        (``steptime.kind_time`` and ``steptime.windows``), over the layer variables."""
        P, model, q, s = self.prog, self.model, self.q, self.training.seq_len
        per = {}
        self.sync_any = {}
        for kind in self.kind_list:
            tabs = {n: {} for n in ("comp", "fwd", "bwd", "attn", "g3", "wep", "sync")}
            for ix, a in self.combos(*self.lvars):
                etp = a["tp"] if a["etp"] is None else a["etp"]
                lt = kind_time(self.eff_rc[a["recompute"]], model, kind, s, a["mbs"], a["tp"], a["cp"], a["ep"],
                               etp, self.lp, _rc_arg(a["recompute"]))
                w_tp, w_ep, w_cp = windows(lt, self.ep_sms)
                launched = self.host_regime(a["ep"], a["recompute"])[1]
                sync = kind_sync_time(model, kind, a["ep"], lt, launched, _rc_arg(a["recompute"]), self.call_us)
                for n, v in (("comp", lt.total), ("fwd", lt.fwd), ("bwd", lt.bwd), ("attn", w_cp), ("g3", w_tp),
                             ("wep", w_ep), ("sync", sync)):
                    tabs[n][ix] = q(v)
            nodes = {}
            for n, t in tabs.items():   # one node per distinct table (the EP window is the layer's total)
                same = next((m for m in nodes if tabs[m] == t), None)
                nodes[n] = nodes[same] if same is not None else P.table_t(self.idx(*self.lvars), t)
            self.sync_any[kind] = any(tabs["sync"].values())
            per[kind] = nodes
        return per

    def _offload_table(self):
        """CPU activation offload per micro-batch (``steptime.offload_time``) over the layer variables, or
        None when the recipe offloads nothing (the rules then allow only pp 1 and no recompute)."""
        model, tr, q, s = self.model, self.training, self.q, self.training.seq_len
        if not offload_layers(tr):
            return None
        kinds = set(layer_kinds(model))
        table = {}
        for ix, a in self.combos(*self.lvars):
            etp = a["tp"] if a["etp"] is None else a["etp"]
            lts = {k: kind_time(self.eff_rc[a["recompute"]], model, k, s, a["mbs"], a["tp"], a["cp"], a["ep"], etp,
                                self.lp, _rc_arg(a["recompute"])) for k in kinds}
            cfg = ParallelConfig(tp=a["tp"], cp=a["cp"], ep=a["ep"], etp=a["etp"], mbs=a["mbs"], recompute=a["recompute"])
            table[ix] = q(offload_time(model, cfg, tr, self.gpu.host_link_gbps_uni, lts))
        return self.prog.table_t(self.idx(*self.lvars), table)

    def _comm_pair(self, vars_, axis, fn, keep=lambda a, shp: True):
        """Two table nodes over ``vars_`` and the worst group shape of ``axis``: the time ``fn(a, shape)``
        and its part the stack cannot overlap, (1 - o) t (o: the term's overlap, set by the caller)."""
        P, q = self.prog, self.q
        t, t1 = {}, {}
        for ix, a in self.combos(*vars_):
            for sid in self._shape_values(self.sh[axis]):
                shp = self.shape(sid)
                if not keep(a, shp):
                    continue
                v, o = fn(a, shp)
                t[ix + (sid,)] = q(v)
                t1[ix + (sid,)] = q((1.0 - o) * v)
        return (P.table_t(self.idx(*vars_), t, nodes=[self.sh[axis]]),
                P.table_t(self.idx(*vars_), t1, nodes=[self.sh[axis]]))

    def _comm_tables(self) -> dict:
        """TP collectives, expert all-to-all and CP exchange of one layer and micro-batch
        (``steptime.tp_layer_time``, ``a2a_layer_time``, ``cp_layer_time``) at each group shape."""
        P, model, tr = self.prog, self.model, self.training
        s, h, fab = tr.seq_len, model.hidden_size, self.fabric
        out = {}
        out["TPT"], out["TPT1"] = self._comm_pair(
            ("cp", "mbs", "recompute"), "tp",
            lambda a, shp: (tp_layer_time(fab, shp, a["mbs"], s, a["cp"], h, _rc_arg(a["recompute"])), self.o_tp))
        o_cp = self.par("cp.overlap")
        out["CPT"], out["CPT1"] = self._comm_pair(
            ("tp", "cp", "mbs"), "cp",
            lambda a, shp: (cp_layer_time(fab, shp.tier, model, a["cp"], a["mbs"], s, a["tp"]), o_cp),
            keep=lambda a, shp: shp.size == a["cp"])
        if model.is_moe:
            disp_b = dispatch_bytes(tr.precision, self.profile, self.arch)
            o_ep = EA.overlap_with_sms(self.par("ep.overlap"), self.ep_sms)   # as steptime.step_time
            # recompute reaches the all-to-all only through steptime.a2a_recompute_factor: a key of the
            # table when that differs between the candidates
            rcs = self.vals["recompute"]
            by_rc = len({a2a_recompute_factor(_rc_arg(r)) for r in rcs}) > 1
            avars = ("tp", "cp", "mbs", "dispatcher") + (("recompute",) if by_rc else ())
            out["avars"] = avars
            A, A1 = out["A"], out["A1"] = self._comm_pair(
                avars, "ep",
                lambda a, shp: (a2a_layer_time(fab, shp, model, a["mbs"], s, a["cp"], a["tp"], a["dispatcher"],
                                               disp_b, _rc_arg(a.get("recompute", rcs[0]))), o_ep))
            # 1 where the recipe overlaps the all-to-all for this layout (EP > 1 assumed: with EP = 1
            # the all-to-all costs nothing either way), else 0: the exposed time is then A itself
            ovars = ("dispatcher", "recompute", "pp", "vpp", "fsdp")
            ov = {ix: int(self.pricing(ep=2, dispatcher=a["dispatcher"], recompute=a["recompute"], pp=a["pp"],
                                       vpp=a["vpp"], fsdp=a["fsdp"])[1] > 0)
                  for ix, a in self.combos(*ovars)}
            out["A1x"] = A1 if all(ov.values()) else P.element(P.table_t(self.idx(*ovars), ov), [A, A1],
                                                                 index_is_node=True)
        return out

    def _layer_nodes(self, per, comm) -> dict:
        """Per kind, the layer time (``compose.layer_time``): compute, exposed TP, EP and CP, the host
        floor (``steptime.host_regime``, ``kind_host_time``) and the dropless router's sync
        (``steptime.kind_sync_time``)."""
        ops, model, q = self.ops, self.model, self.q

        def exposed(t, t1, window):
            return K.exposed(ops, Val(t), Val(t1), Val(window))

        L = {}
        self.hidden = {}   # per MoE kind: the all-to-all the EP overlap hides (compose.unpaired_a2a)
        for kind, t in per.items():
            c = [exposed(comm["TPT"], comm["TPT1"], t["g3"])]
            if kind[0] == "moe":
                c.append(exposed(comm["A"], comm["A1x"], t["wep"]))
                self.hidden[kind] = ops.sub(Val(comm["A"]), c[-1])
            c.append(exposed(comm["CPT"], comm["CPT1"], t["attn"]))
            hk = {}
            for ix, a in self.combos("ep", "recompute"):
                graphed, launched = self.host_regime(a["ep"], a["recompute"])
                hk[ix] = q(kind_host_time(model, kind, a["ep"], graphed, launched, self.call_us,
                                          _rc_arg(a["recompute"])))
            host = Val(self.prog.table_t(self.idx("ep", "recompute"), hk)) if any(hk.values()) else None
            sync = Val(t["sync"]) if self.sync_any[kind] else None
            L[kind] = K.layer_time(ops, Val(t["comp"]), c, self.launch, host, sync).node
        return L

    def _head_nodes(self):
        """Output head and MTP extras (``steptime.head_time``) over (tp, cp, mbs), and recompute where it
        switches CUDA graphs; the bound reads the (tp, cp, mbs) tables at the cheapest regime."""
        P, model, s, q = self.prog, self.model, self.training.seq_len, self.q

        def head_tables(hvars, eff_of):
            head = {n: {} for n in ("total", "fwd", "bwd")}
            mtpx = {n: {} for n in ("total", "fwd", "bwd")}
            for ix, a in self.combos(*hvars):
                e_ = eff_of(a)
                for mtp, out in ((False, head), (True, mtpx)):
                    if mtp and not model.mtp_layers:
                        continue
                    lt = head_time(e_, model, s, a["mbs"], a["tp"], a["cp"], mtp)
                    for n, v in (("total", lt.total), ("fwd", lt.fwd), ("bwd", lt.bwd)):
                        out[n][ix] = q(v)
            return ({n: P.table_t(self.idx(*hvars), t) for n, t in head.items()},
                    {n: P.table_t(self.idx(*hvars), t) for n, t in mtpx.items()} if model.mtp_layers else None)

        H, MX = head_tables(("tp", "cp", "mbs"), lambda a: min(self.eff_rc.values(), key=lambda e_: e_.elem_factor))
        H_b, MX_b = H, MX
        if self.rc_priced:
            H, MX = head_tables(("tp", "cp", "mbs", "recompute"), lambda a: self.eff_rc[a["recompute"]])
        return H, MX, H_b, MX_b

    def _slot_nodes(self, L, H, MX):
        """Pipeline ranks grouped into slots: distinct per-rank inventories (``steptime.rank_inventory``)
        in first-occurrence order, so the first argmax is ``step_time``'s max over ranks. Each slot's
        micro-batch time t_s = sum_k n_sk L_k + mtp_s MTP + loss_s HEAD."""
        P, model, s = self.prog, self.model, self.training.seq_len
        kind_list = self.kind_list
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
        self.slots_of = slots_of
        self.lay_vars = self.idx("pp", "vpp", "split")
        self.dl_ids, self.ex_ids = _Ids(), _Ids()
        slot_nodes = []
        for si in range(max(len(v) for v in slots_of.values())):
            node = {"present": P.table_t(self.lay_vars, self._slot_col(si, lambda v: 1))}
            extra = []
            if si == 0 and self.offload is not None:   # the rank that holds the block at pp 1
                one = P.table_t(self.lay_vars, {ix: int(a["pp"] == 1) for ix, (a, _, _) in self.layouts.items()})
                extra = [(one, self.offload)]
            node["t"] = self._slot_sum(si, L, MX and MX["total"], H["total"], extra)
            slot_nodes.append(node)
        return slots_of, slot_nodes

    def _slot_col(self, si, fn, default=0):
        return {ix: (fn(v[si]) if si < len(v) else default) for ix, v in self.slots_of.items()}

    def _slot_sum(self, si, per_kind, mtp_node, head_node, extra=()):
        """``compose.rank_time`` of slot ``si``: sum_k n_sk per_kind[k] + mtp_s mtp_node + loss_s head_node
        (+ the (count node, value node) pairs ``extra``), the counts tabulated over the layout."""
        P = self.prog
        parts = []
        for kj, kind in enumerate(self.kind_list):
            cnts = self._slot_col(si, lambda v, kj=kj: v[0][kj])
            if any(cnts.values()):
                parts.append((P.table_t(self.lay_vars, cnts), per_kind[kind]))
        mt = self._slot_col(si, lambda v: v[1])
        if mtp_node is not None and any(mt.values()):
            parts.append((P.table_t(self.lay_vars, mt), mtp_node))
        ls = self._slot_col(si, lambda v: v[2])
        if any(ls.values()):
            parts.append((P.table_t(self.lay_vars, ls), head_node))
        return K.rank_time(self.ops, [(Val(n), Val(t)) for n, t in list(parts) + list(extra)]).node

    def _slot_windows(self, si, node, per, H, MX):
        """Forward, backward and compute of slot ``si`` and its parameter classes (the DP and optimizer
        terms read them)."""
        for qty, hq in (("fwd", "fwd"), ("bwd", "bwd"), ("comp", "total")):
            node[qty] = self._slot_sum(si, {k: t[qty] for k, t in per.items()}, MX and MX[hq], H[hq])
        dl, ex = self.dl_ids, self.ex_ids
        node["dl"] = self.prog.table_t(self.lay_vars, self._slot_col(si, lambda v: dl((v[3], v[4])), dl((0.0, 0))))
        node["ex"] = self.prog.table_t(self.lay_vars, self._slot_col(si, lambda v: ex(v[5]), ex(0.0)))

    def _pipeline_tables(self):
        """Micro-batches m = gbs / (mbs dp) (M, and M840 = 840 m) and B840 = 840 bubble_factor(pp, vpp)."""
        P, tr = self.prog, self.training
        mt, b1 = {}, {}
        for ix, a in self.combos("gbs", "mbs", "dp"):
            if a["gbs"] % (a["mbs"] * a["dp"]) == 0:
                mt[ix] = a["gbs"] // (a["mbs"] * a["dp"])
        if not mt:
            raise InfeasibleError(f"no micro-batch size and data-parallel degree divide the global batch {tr.global_batch}")
        M = P.table_t(self.idx("gbs", "mbs", "dp"), mt)
        M840 = P.table_t(self.idx("gbs", "mbs", "dp"), {k: BUBBLE * v for k, v in mt.items()})
        for ix, a in self.combos("pp", "vpp"):
            b1[ix] = in_bubble_units(PPL.bubble_factor(a["pp"], a["vpp"]), a)
        return M, mt, b1, M840, P.table_t(self.idx("pp", "vpp"), b1)

    def _p2p_tables(self):
        """Pipeline point-to-point: one transfer (``steptime.p2p_bytes``, the mean over the PP group's hops:
        ``terms.pipeline.hop_p2p``, ns) and
        the exposed transfers per step (``terms.pipeline.p2p_transfers``, in units of 1/840)."""
        P, tr, h = self.prog, self.training, self.model.hidden_size
        o_pp = self.par("pp.overlap")
        p1, pb = {}, {}
        for ix, a in self.combos("tp", "cp", "mbs", "vpp"):
            nbytes = p2p_bytes(a["mbs"], tr.seq_len, a["cp"], a["tp"], h)
            for sid in self._shape_values(self.sh["pp"]):
                p1[ix + (sid,)] = self.q(PPL.hop_p2p(self.fabric, nbytes, self.shape(sid), a["vpp"]))
        ONE = P.table_t(self.idx("tp", "cp", "mbs", "vpp"), p1, nodes=[self.sh["pp"]])
        for ix, a in self.combos("gbs", "mbs", "dp", "pp", "vpp"):
            g, b, d = a["gbs"], a["mbs"], a["dp"]
            if g % (b * d):
                continue
            pb[ix] = int(math.floor(BUBBLE * PPL.p2p_transfers(a["pp"], a["vpp"], g // (b * d), o_pp) + 0.5))
        return Val(ONE), Val(P.table_t(self.idx("gbs", "mbs", "dp", "pp", "vpp"), pb), BUBBLE)

    def _dp_optimizer(self, slot_nodes, M):
        """Data parallel and optimizer of each slot (``terms.data_parallel.dp_time``, ``dp_exposed`` /
        ``fsdp_exposed``'s composition, ``terms.optimizer.optimizer_time``); the critical slot's are
        charged. Returns the DP and optimizer nodes (seconds / 840 units: weighted by BUBBLE)."""
        P, vals, model, ops = self.prog, self.vals, self.model, self.ops
        EE = P.table_t(self.idx("tp", "ep", "etp"), {ix: a["ep"] * (a["tp"] if a["etp"] is None else a["etp"])
                                                     for ix, a in self.combos("tp", "ep", "etp")})
        # Which (tp, dp-shape) and (ep*etp, edp-shape) pairs occur with each pp: a slot's parameter
        # sums depend on the layout (pp, vpp, split), so only pairs with the same pp can meet.
        dp_by_pp: dict = {}
        for key, sid in P.nodes[self.sh["dp"]].values.items():
            t_, c_, d_ = vals["tp"][key[0]], vals["cp"][key[1]], vals["dp"][key[2]]
            dp_by_pp.setdefault(key[-1] // (t_ * c_ * d_), set()).add((key[0], sid))
        edp_by_pp: dict = {}
        if model.is_moe:
            for key, sid in P.nodes[self.sh["edp"]].values.items():
                t_, e_, p_ = vals["tp"][key[0]], vals["etp"][key[1]], vals["ep"][key[2]]
                edp_by_pp.setdefault(vals["pp"][key[3]], set()).add((p_ * (t_ if e_ is None else e_), sid))
        ids_by_pp: dict = {}
        for lix, (la, _, _) in self.layouts.items():
            ids_by_pp.setdefault(la["pp"], []).append(lix)
        o_dp, grad_b, q = self.par("dp.overlap"), self.par("dp.grad_bytes"), self.q
        # bytes per gathered parameter (terms.data_parallel.param_gather_bytes): quantised parameters depend
        # on the layout only through FSDP (planner.rules.quantised_params: torch FSDP2 turns FP8 ones off)
        pb_of = {f: DPc.param_gather_bytes(self.training.precision, quantised_params(
                     effective_recipe(model, ParallelConfig(fsdp=f), self.training)))
                 for f in vals["fsdp"]}

        @functools.lru_cache(maxsize=None)
        def dpt(sid, nparams, pb):
            rs, ag = DPc.dp_time(self.fabric, self.shape(sid), nparams, grad_bytes=grad_b, param_bytes=pb)
            return q(rs), q(ag), q((1 - o_dp) * rs), q((1 - o_dp) * ag)

        dpx_nodes, opt_nodes = [], []
        g = DPc.FSDP_GATHERS
        # the all-gather's window in forward passes (terms.data_parallel.gather_window_passes), in 1/840
        GW = Val(P.table_t(self.idx("pp", "vpp"), {ix: in_bubble_units(DPc.gather_window_passes(a["pp"], a["vpp"]), a)
                                                  for ix, a in self.combos("pp", "vpp")}), BUBBLE)
        for node in slot_nodes:
            exposed_by_pb = {}
            for pb in sorted(set(pb_of.values())):
                dpt_pb = functools.partial(dpt, pb=pb)
                parts = self._slot_dense_dp(node, dpt_pb, ids_by_pp, dp_by_pp)
                if model.is_moe:
                    for lst, extra in zip(parts, self._slot_expert_dp(node, dpt_pb, ids_by_pp, edp_by_pp, EE)):
                        lst.append(extra)
                RS, AG, RS1, AG1, OPTS = (Val(P.sum(p)) for p in parts)
                dpx = K.dp_exposed(ops, RS, AG, RS1, AG1, Val(node["bwd"]), ops.mul(GW, Val(node["fwd"])))
                fsx = K.fsdp_exposed(ops, RS, AG, RS1, AG1, Val(node["comp"]), Val(M), g)
                exposed_by_pb[pb] = (dpx, Val(ops.mul(dpx.den // fsx.den, fsx).node, dpx.den))   # one unit
            dpx_nodes.append(ops.pick(Var(self.vi["fsdp"]), [exposed_by_pb[pb_of[f]][1 if f else 0] for f in vals["fsdp"]]))
            opt_nodes.append(OPTS)
        return ops.pick(self.crit, dpx_nodes), ops.pick(self.crit, opt_nodes)

    def _slot_dense_dp(self, node, dpt, ids_by_pp, dp_by_pp):
        """[RS], [AG], [RS1], [AG1], [OPT] of a slot's dense parameters (lists, for the expert parts)."""
        P, vals, q, hbm = self.prog, self.vals, self.q, self.eff.hbm_bps
        dl_tab = P.nodes[node["dl"]].values
        od: dict = {}
        pairs = set()
        for pp_, lixs in ids_by_pp.items():
            dids = {dl_tab[lx] for lx in lixs}
            for (ti, sid) in dp_by_pp.get(pp_, ()):
                for did in dids:
                    pairs.add((ti, did, sid))
        entries = {(ti, did, sid): (sid, self.dl_ids.values[did][0] / vals["tp"][ti]) for ti, did, sid in pairs}
        for ix, a in self.combos("tp", "cp", "dp"):
            for did in sorted(set(dl_tab.values())):
                dense_p = self.dl_ids.values[did][0] / a["tp"]
                od[ix + (did,)] = q(OPT.optimizer_time(dense_p / max(a["dp"] * a["cp"], 1), hbm))
        tables = self._dp_tables(entries, ("tp",), [node["dl"], self.sh["dp"]], dpt)
        return [[t] for t in tables] + [[P.table_t(self.idx("tp", "cp", "dp"), od, nodes=[node["dl"]])]]

    def _slot_expert_dp(self, node, dpt, ids_by_pp, edp_by_pp, EE):
        """RS, AG, RS1, AG1, OPT nodes of a slot's expert parameters over the expert-data-parallel group."""
        P, q, hbm = self.prog, self.q, self.eff.hbm_bps
        ex_tab = P.nodes[node["ex"]].values
        oe: dict = {}
        triples = set()
        for pp_, lixs in ids_by_pp.items():
            xids = {ex_tab[lx] for lx in lixs}
            for (e, sid) in edp_by_pp.get(pp_, ()):
                for xid in xids:
                    triples.add((e, xid, sid))
        entries = {(e, xid, sid): (sid, self.ex_ids.values[xid] / e) for e, xid, sid in triples}
        for ix, a in self.combos("pp"):
            for xid in sorted(set(ex_tab.values())):
                exs = self.ex_ids.values[xid]
                for w in self.worlds:
                    # expert_p / edp = (EX / (ep*etp)) / (W / (ep*etp*pp)) = EX * pp / W
                    oe[ix + (xid, w)] = q(OPT.optimizer_time(exs * a["pp"] / w, hbm))
        tables = self._dp_tables(entries, (), [EE, node["ex"], self.sh["edp"]], dpt)
        return tables + [P.table_t(self.idx("pp"), oe, nodes=[node["ex"], self.W])]

    def _dp_tables(self, entries, vars_, keys, dpt) -> list[int]:
        """RS, AG, RS1, AG1 table nodes over ``vars_`` and the nodes ``keys``, from
        {key: (group shape id, parameters per GPU)} and ``dpt`` (``terms.data_parallel.dp_time``, rounded)."""
        tabs: tuple = ({}, {}, {}, {})
        for key, (sid, nparams) in entries.items():
            for t, v in zip(tabs, dpt(sid, nparams)):
                t[key] = v
        return [self.prog.table_t(self.idx(*vars_), t, nodes=keys) for t in tabs]

    # -- reading a solution ----------------------------------------------------------------------
    def assignment(self, choice) -> dict:
        return {v: self.vals[v][i] for v, i in zip(VARIABLES, choice)}

    def config_of(self, choice):
        a = self.assignment(choice)
        _, lay, sp = self.layouts[tuple(choice[self.vi[v]] for v in ("pp", "vpp", "split"))]
        cfg = parallel_config(a["tp"], a["pp"], a["vpp"], a["cp"], a["ep"], a["etp"], a["dp"], a["mbs"], a["fsdp"],
                              a["recompute"], a["dispatcher"], sp[0], sp[1])
        world = a["tp"] * a["cp"] * a["pp"] * a["dp"]
        return cfg, world, a["gbs"], a["gpd"], lay


def step_seconds(node_value: int, band_scale: int = 1, world: int = 1) -> float:
    """The step, seconds, of the program's objective node value (1/840 ns, times the band factor), with
    the wait for the slowest of its ``world`` GPUs (``terms/sync.py``: a factor of the step, which the
    program carries in the objective's weights, ``planner.search.objective``)."""
    return node_value / band_scale / BUBBLE * NS * (1.0 + SYNC.sync_factor(world))


def quantisation_bound(model, config: ParallelConfig, gbs: int, world: int, o_pp: float, p2p_s: float) -> float:
    """Seconds: the most the program's step can differ from ``step_time``'s at one layout, from
    rounding each table entry to the nanosecond (0.5 ns each; an exposure max(kept, t - window, 0)
    of rounded entries is off by at most 1 ns, a layer (compute, three exposures, launch, host or
    sync) by 5.5 ns). The slowest rank holds at most every layer: TMAX is off by at most
    ``6 (layers + MTP) + 2`` ns and the core by ``(m + bubble)`` times that. The p2p term (``p2p_s``
    seconds, predict's) is one transfer, off by 0.5 ns, times the exposed transfers, rounded to
    1/840: off by ``p2p_s / transfers * 0.5 / 840`` more. The DP exposure is off by 2 ns (m times
    under FSDP), the optimizer by 1 ns."""
    m = gbs / (config.mbs * config.dp_for(world))
    layers = model.num_layers + (model.mtp_layers or 0)
    core = (m + PPL.bubble_factor(config.pp, config.vpp)) * (6.0 * layers + 2.0)
    transfers = PPL.p2p_transfers(config.pp, config.vpp, int(round(m)), o_pp)
    p2p = 0.5 * transfers + (p2p_s / NS / transfers * 0.5 / BUBBLE if transfers > 0 else 0.0) + 1.0
    return NS * (core + p2p + 2.0 * (m + 1) + 1.0) * (1.0 + SYNC.sync_factor(world))   # the step's sync share


def used_per_domain(cluster, gpd, world) -> list[int]:
    """GPUs of each NVLink domain the first ``world`` ranks use (placement fills domains in order)."""
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
    return len(set(used_per_domain(cluster, gpd, world))) == 1
