"""Bounds and the exhaustive search of ``plan``'s program (``planner.search.program``).

``bound_factors``: a separable lower bound of the objective, a product of factors each over a few
choices, that the block searches of ``solver.layout`` (``enumerate_bounded``, ``solve_bounded``) walk
in order. ``exhaustive``: every assignment the rule tables allow, in order of the exact CORE + P2P
lower bound, evaluated with numpy (the oracle the other methods are tested against).
"""

from __future__ import annotations

import time

import numpy as np

from planner.cost import compose as K
from planner.cost.compose import ARRAY
from planner.search.program import BUBBLE
from planner.search.space import VARIABLES
from solver.layout import LayoutResult, Solution, evaluate_many, feasible_rows, key_array, weights_of

# Choices the CP-SAT master leaves to the exact evaluation of each block (with fsdp, which no
# bound factor reads): the master's layer-time factor is the minimum over them.
_BLOCK_FREE = ("recompute", "dispatcher")


def _min_over_shape(values: dict) -> dict:
    """{var-index tuple: min over the shape-id key} of a table keyed by one shape node."""
    out = {}
    for k, v in values.items():
        kk = k[:-1]
        if kk not in out or v < out[kk]:
            out[kk] = v
    return out


def _gather(table: dict, cols: list) -> np.ndarray:
    """``table.get(key, 0)`` for the keys whose components are the arrays ``cols`` (a table keyed by
    tuples of non-negative integers: variable indices and shape ids)."""
    karr = key_array(table, len(cols))
    dims = [int(karr[:, j].max()) + 1 if len(karr) else 1 for j in range(len(cols))]
    flat = np.zeros(int(np.prod(dims)), dtype=np.int64)
    flat[np.ravel_multi_index(karr.T, dims)] = np.fromiter(table.values(), dtype=np.int64, count=len(table))
    inside = np.all([(c >= 0) & (c < d) for c, d in zip(cols, dims)], axis=0)
    out = np.zeros(len(cols[0]), dtype=np.int64)
    out[inside] = flat[np.ravel_multi_index([c[inside] for c in cols], dims)]
    return out


def _layer_minima(b) -> dict:
    """Per layer kind, {(tp, cp, ep, etp, mbs[, EP shape]): the least layer time} over recompute and
    the dispatcher (left to the exact evaluation of each block, ``_BLOCK_FREE``) and over the TP and
    CP group shapes; the expert all-to-all enters at its exact group shape (the EP shape node keys
    the factor): its price inside or across NVLink domains is most of what separates layouts.
    Every layer key of a kind at once (``compose.ARRAY``: the table entries are integers, so the
    arrays give exactly what the composition gives one key at a time); keys first seen first."""
    src, P, vals = b._src, b.prog, b.vals

    def tab(node):
        return P.nodes[node].values

    tpt, tpt1 = _min_over_shape(tab(src["TPT"])), _min_over_shape(tab(src["TPT1"]))
    cpt, cpt1 = _min_over_shape(tab(src["CPT"])), _min_over_shape(tab(src["CPT1"]))
    moe = "A" in src
    sids_of: dict = {}
    if moe:
        at, at1, avars = tab(src["A"]), tab(src["A1"]), src["avars"]
        for sid in b._shape_values(b.sh["ep"]):
            sids_of.setdefault(b.shape(sid).size, []).append(sid)
    assert src["lvars"] == ("tp", "cp", "ep", "etp", "mbs", "recompute")
    lks = list(tab(next(iter(src["per"].values()))["comp"]))   # (tp, cp, ep, etp, mbs, recompute) indices
    # (layer key, EP shape) pairs: each key of the bound is a layer key's first five choices and its EP shape
    row, sid_of_pair, kidx, key_index = [], [], [], {}
    for i, lk in enumerate(lks):
        for sid in (sids_of.get(vals["ep"][lk[2]], []) if moe else [None]):
            row.append(i)
            sid_of_pair.append(sid)
            kidx.append(key_index.setdefault(lk[:5] if sid is None else lk[:5] + (sid,), len(key_index)))
    row, kidx, keys = np.asarray(row, dtype=np.int64), np.asarray(kidx, dtype=np.int64), list(key_index)

    def col(table, key_of):
        return np.fromiter((table.get(key_of(lk), 0) for lk in lks), dtype=np.int64, count=len(lks))

    tp_t, tp_t1 = (col(t, lambda lk: (lk[1], lk[4], lk[5])) for t in (tpt, tpt1))
    cp_t, cp_t1 = (col(t, lambda lk: (lk[0], lk[1], lk[4])) for t in (cpt, cpt1))
    lmin = {}
    for kind, t in src["per"].items():
        ct = tab(t["comp"])
        have = np.fromiter((lk in ct for lk in lks), dtype=bool, count=len(lks))
        comp, g3, attn, wep = (col(tab(t[n]), lambda lk: lk) for n in ("comp", "g3", "attn", "wep"))
        tp_x, cp_x = K.exposed(ARRAY, tp_t, tp_t1, g3)[row], K.exposed(ARRAY, cp_t, cp_t1, attn)[row]
        if kind[0] != "moe":   # compose.layer_time without the host floor and sync (>= 0): a bound
            cands = [np.maximum(K.layer_time(ARRAY, comp[row], (tp_x, cp_x), src["launch"]), 1)]
        else:
            cands = []
            lk_arr, sid_arr = np.asarray(lks, dtype=np.int64)[row], np.asarray(sid_of_pair, dtype=np.int64)
            at_pos = [{"tp": 0, "cp": 1, "mbs": 4, "recompute": 5}.get(n_) for n_ in avars]   # None: dispatcher
            for dsp in range(len(vals["dispatcher"])):
                cols = [np.full(len(row), dsp) if j is None else lk_arr[:, j] for j in at_pos] + [sid_arr]
                a2a_x = K.exposed(ARRAY, _gather(at, cols), _gather(at1, cols), wep[row])
                cands.append(np.maximum(K.layer_time(ARRAY, comp[row], (tp_x, a2a_x, cp_x), src["launch"]), 1))
        live = have[row]
        best = np.full(len(keys), np.iinfo(np.int64).max, dtype=np.int64)
        for c in cands:
            np.minimum.at(best, kidx[live], c[live])
        _, first = np.unique(kidx[live], return_index=True)
        order = kidx[live][np.sort(first)]   # the keys in the order the layer keys first reach them
        lmin[kind] = {keys[j]: int(best[j]) for j in order}
    return lmin


def _slot_factors(b, lmin, keys) -> tuple[dict, dict]:
    """(lref, slot factor): the reference kind's least layer time, and per (pp, vpp, split) the
    heaviest pipeline rank in units of it, sum_k n_sk rho_k + mtp_s rho_mtp + loss_s rho_head."""
    src, P = b._src, b.prog
    kl = src["kind_list"]
    counts = {k: 0 for k in kl}
    for v in next(iter(src["slots_of"].values())):
        for kj, k in enumerate(kl):
            counts[k] += v[0][kj]
    ref = max(lmin, key=lambda k: counts.get(k, 0) * float(np.mean(list(lmin[k].values()))))
    lref = {k: lmin[ref][k] for k in keys}
    rho = {k: min(lmin[k][x] / lref[x] for x in keys) for k in lmin}
    pos = {v: i for i, v in enumerate(src["lvars"][:5])}
    sub = {x: tuple(x[pos[n]] for n in ("tp", "cp", "mbs")) for x in keys}   # each key's (tp, cp, mbs)

    def rho_of(table):   # a (tp, cp, mbs) table in units of the reference layer
        if table is None:
            return 0.0
        t = P.nodes[table].values
        return min(t[sub[x]] / lref[x] for x in keys if sub[x] in t)

    rho_head = rho_of(src["H"]["total"])
    rho_mtp = rho_of(src["MX"]["total"]) if src["MX"] is not None else 0.0
    slot_f = {}
    for ix, slots in src["slots_of"].items():
        best = max(sum(v[0][kj] * rho.get(k, 0.0) for kj, k in enumerate(kl)) + v[1] * rho_mtp + v[2] * rho_head
                   for v in slots)
        slot_f[ix] = max(best, 1e-9) * (1 - 1e-9)
    return lref, slot_f


def bound_factors(b):
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
    src, P = b._src, b.prog
    lmin = _layer_minima(b)
    keys = set.intersection(*(set(d) for d in lmin.values()))
    if not keys:
        return None
    lref, slot_f = _slot_factors(b, lmin, keys)
    pipe = {}
    for ix, a in b.combos("gbs", "mbs", "dp", "pp", "vpp"):
        m_, b_ = src["mt"].get(ix[:3]), src["b1"].get(ix[3:])
        if m_ is not None and b_ is not None:
            pipe[ix] = BUBBLE * m_ + b_
    lnodes = (b.sh["ep"],) if "A" in src else ()
    factors = [(tuple(b.idx(*src["lvars"][:5])), lnodes, {k: float(v) for k, v in lref.items()}),
               (tuple(b.idx("pp", "vpp", "split")), slot_f),
               (tuple(b.idx("gbs", "mbs", "dp", "pp", "vpp")), {k: float(v) for k, v in pipe.items()})]
    if P.weight is not None:
        wv, wt = P.weight
        factors.append((tuple(wv), {k: float(v) for k, v in wt.items()}))
    if getattr(b, "band_min", None) is not None:   # robust: the band factor, least over FSDP
        factors.append(b.band_min)
    b.master_vars = [i for i, v in enumerate(VARIABLES) if v not in _BLOCK_FREE + ("fsdp",)]
    return factors


def exhaustive(prog, b, top: int, accept, time_limit: float | None = None):
    """Exhaustive, vectorised evaluation of the program over every assignment the rule tables
    allow, in order of an exact lower bound; memory (the lazy constraint) is checked best-first.

    Every allowed assignment gets the lower bound ``CORE + P2P`` (the DP and optimizer terms are
    non-negative; times the objective weight). Rows are then fully evaluated in chunks, smallest
    bound first; the search stops when ``top`` fitting layouts are known and the next bound is no
    better than the worst of them (OPTIMAL), or at ``time_limit`` (FEASIBLE, and the next bound is
    the proven bound)."""
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
