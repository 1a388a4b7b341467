"""The whole program in OR-Tools CP-SAT: one-hot variables, table constraints, exact integer sums,
maxima and products, the weighted objective; top-K by no-good cuts and lazy constraints through
``accept`` (:func:`solve`). Practical for small spaces (``plan --method cp-sat-full``)."""

from __future__ import annotations

import math
import time
from typing import Sequence

from ortools.sat.python import cp_model

from solver.interrupt import stoppable
from solver.program import LayoutResult, Program, Solution


# -- the CP-SAT model -----------------------------------------------------------------------------

def _bounds(prog: Program) -> list[tuple[int, int]]:
    b: list[tuple[int, int]] = []
    for nd in prog.nodes:
        if nd.kind == "table":
            vs = nd.values.values()
            b.append((min(vs), max(vs)))
        elif nd.kind == "const":
            b.append((nd.const, nd.const))
        elif nd.kind == "sum":
            lo = hi = nd.const
            for a, w in zip(nd.args, nd.weights):
                l, h = b[a]
                lo += min(w * l, w * h)
                hi += max(w * l, w * h)
            b.append((lo, hi))
        elif nd.kind == "max":
            b.append((max(b[a][0] for a in nd.args), max(b[a][1] for a in nd.args)))
        elif nd.kind == "product":
            (l1, h1), (l2, h2) = b[nd.args[0]], b[nd.args[1]]
            c = (l1 * l2, l1 * h2, h1 * l2, h1 * h2)
            b.append((min(c), max(c)))
        elif nd.kind == "element":
            b.append((min(b[a][0] for a in nd.args), max(b[a][1] for a in nd.args)))
        elif nd.kind == "argmax":
            b.append((0, len(nd.args) // 2 - 1))
    return b


def _argmax(m, k: int, nd, nv, bounds):
    """The index variable of an argmax node: the first present key that equals the max of the present keys."""
    n = len(nd.args) // 2
    ks, ps = [nv[a] for a in nd.args[:n]], [nv[a] for a in nd.args[n:]]
    klo = min(bounds[a][0] for a in nd.args[:n])
    khi = max(bounds[a][1] for a in nd.args[:n])
    top = m.NewIntVar(klo, khi, f"n{k}_max")
    pres = []
    for i in range(n):
        p = m.NewBoolVar(f"n{k}_p{i}")
        m.Add(ps[i] == 1).OnlyEnforceIf(p)
        m.Add(ps[i] == 0).OnlyEnforceIf(p.Not())
        pres.append(p)
    m.AddBoolOr(pres)
    # top = max over present keys; attain[i] <=> present_i and key_i == top
    attain = []
    for i in range(n):
        m.Add(top >= ks[i]).OnlyEnforceIf(pres[i])
        a = m.NewBoolVar(f"n{k}_a{i}")
        m.Add(ks[i] == top).OnlyEnforceIf(a)
        m.AddImplication(a, pres[i])
        m.Add(ks[i] <= top - 1).OnlyEnforceIf([pres[i], a.Not()])
        attain.append(a)
    m.AddBoolOr(attain)
    # first[i] <=> attain[i] and no earlier attain: the first maximal key wins
    t = m.NewIntVar(0, n - 1, f"n{k}")
    seen = None
    firsts = []
    for i in range(n):
        f = m.NewBoolVar(f"n{k}_f{i}")
        if seen is None:
            m.Add(f == attain[i])
        else:
            m.AddBoolAnd([attain[i], seen.Not()]).OnlyEnforceIf(f)
            m.AddBoolOr([attain[i].Not(), seen, f])
            m.AddImplication(f, attain[i])
        nseen = m.NewBoolVar(f"n{k}_s{i}")
        if seen is None:
            m.Add(nseen == attain[i])
        else:
            m.AddMaxEquality(nseen, [seen, attain[i]])
        seen = nseen
        firsts.append(f)
        m.Add(t == i).OnlyEnforceIf(f)
    m.AddExactlyOne(firsts)
    return t


def _objective(m, prog: Program, xs, zs, obj_node, obj_bounds) -> None:
    """Objective: weight(x) * node(x), linearised over the distinct weight values."""
    olo, ohi = obj_bounds
    if prog.weight is None:
        m.Minimize(obj_node)
        return
    wvars, wtable = prog.weight
    terms = []
    sel = []
    for w in sorted(set(wtable.values())):
        b = m.NewBoolVar(f"w={w}")
        keys = [k for k, v in wtable.items() if v == w]
        # b <=> the weight variables take one of the tuples with weight w
        if len(wvars) == 1:
            lits = [zs[wvars[0]][k[0]] for k in keys]
            m.Add(sum(lits) == b)
        else:
            m.AddAllowedAssignments([xs[v] for v in wvars] + [b],
                                    [k + (1,) for k in keys]
                                    + [k + (0,) for k, v in wtable.items() if v != w])
        y = m.NewIntVar(min(0, olo), max(0, ohi), f"obj_w{w}")
        m.Add(y == obj_node).OnlyEnforceIf(b)
        m.Add(y == 0).OnlyEnforceIf(b.Not())
        terms.append(w * y)
        sel.append(b)
    m.AddExactlyOne(sel)
    m.Minimize(sum(terms))


def _build(prog: Program):
    if prog.objective is None:
        raise ValueError("the program has no objective")
    m = cp_model.CpModel()
    # Decision variables, one-hot encoded: z[i][v] <=> (x_i == v). The channel is written as
    # reified equalities: the linear form x_i == sum_v v * z[i][v] next to a table constraint
    # makes OR-Tools 9.15's presolve return a wrong optimum (reproduced in tests/test_solver_layout.py).
    xs, zs = [], []
    for i, d in enumerate(prog.domains):
        x = m.NewIntVar(0, d - 1, prog.names[i])
        z = [m.NewBoolVar(f"{prog.names[i]}={v}") for v in range(d)]
        m.AddExactlyOne(z)
        for v, zv in enumerate(z):
            m.Add(x == v).OnlyEnforceIf(zv)
            m.Add(x != v).OnlyEnforceIf(zv.Not())
        xs.append(x)
        zs.append(z)

    def lit_tuple_constraint(vars_, tuples, allowed: bool):
        if len(vars_) == 1:
            # One variable: fix the forbidden one-hot literals directly.
            v = vars_[0]
            keep = {t[0] for t in tuples}
            for a in range(prog.domains[v]):
                if (a in keep) != allowed:
                    m.Add(zs[v][a] == 0)
            return
        if allowed:
            m.AddAllowedAssignments([xs[v] for v in vars_], sorted(tuples))
        else:
            m.AddForbiddenAssignments([xs[v] for v in vars_], sorted(tuples))

    # Compatibility tables (trainer rules, memory, placement).
    for vars_, tuples in prog.allowed:
        lit_tuple_constraint(vars_, tuples, True)
    for vars_, tuples in prog.forbidden:
        if tuples:
            lit_tuple_constraint(vars_, tuples, False)

    # Cost nodes.
    bounds = _bounds(prog)
    nv = []
    for k, nd in enumerate(prog.nodes):
        lo, hi = bounds[k]
        if nd.kind == "table":
            t = m.NewIntVarFromDomain(cp_model.Domain.FromValues(sorted(set(nd.values.values()))), f"n{k}")
            if len(nd.vars) == 1 and not nd.keys:
                v = nd.vars[0]
                # Linear over the one-hot literals; missing entries are infeasible.
                for a in range(prog.domains[v]):
                    if (a,) not in nd.values:
                        m.Add(zs[v][a] == 0)
                m.Add(t == sum(nd.values[(a,)] * zs[v][a] for a in range(prog.domains[v]) if (a,) in nd.values))
            else:
                m.AddAllowedAssignments([xs[v] for v in nd.vars] + [nv[n] for n in nd.keys] + [t],
                                        [key + (val,) for key, val in sorted(nd.values.items())])
        elif nd.kind == "const":
            t = m.NewConstant(nd.const)
        elif nd.kind == "sum":
            t = m.NewIntVar(lo, hi, f"n{k}")
            m.Add(t == nd.const + sum(w * nv[a] for a, w in zip(nd.args, nd.weights)))
        elif nd.kind == "max":
            t = m.NewIntVar(lo, hi, f"n{k}")
            m.AddMaxEquality(t, [nv[a] for a in nd.args])
        elif nd.kind == "product":
            t = m.NewIntVar(lo, hi, f"n{k}")
            m.AddMultiplicationEquality(t, [nv[nd.args[0]], nv[nd.args[1]]])
        elif nd.kind == "element":
            t = m.NewIntVar(lo, hi, f"n{k}")
            idx = xs[nd.vars[0]] if nd.vars else nv[nd.keys[0]]
            m.Add(idx < len(nd.args))
            m.AddElement(idx, [nv[a] for a in nd.args], t)
        elif nd.kind == "argmax":
            t = _argmax(m, k, nd, nv, bounds)
        nv.append(t)

    for n, bnd in prog.limits:
        m.Add(nv[n] <= bnd)

    _objective(m, prog, xs, zs, nv[prog.objective], bounds[prog.objective])
    return m, xs, zs, nv


_STATUS = {
    cp_model.OPTIMAL: "OPTIMAL",
    cp_model.FEASIBLE: "FEASIBLE",
    cp_model.INFEASIBLE: "INFEASIBLE",
    cp_model.UNKNOWN: "UNKNOWN",
    cp_model.MODEL_INVALID: "MODEL_INVALID",
}


def solve(prog: Program, top: int = 1, time_limit: float | None = None, workers: int = 2,
          hint: Sequence[int] | None = None, seed: int = 0, accept=None,
          max_rejections: int = 10_000) -> LayoutResult:
    """Solve ``prog``; return up to ``top`` best assignments, best first.

    ``time_limit`` (seconds) bounds the whole call, top-K re-solves included. With a limit the
    first solve may end FEASIBLE: the best assignment found, and ``bound`` the proven bound.

    ``accept(choice)`` (optional) checks a solution against a constraint the program does not
    hold (a lazy constraint). It returns None to accept, or a list of variable indices: the
    solution is rejected and every assignment that agrees with it on those variables is cut off
    (so the cut must be valid for all of them). The program is then solved again; the final
    optimum is optimal among the assignments that were never cut. ``rejected`` counts the cuts.
    """
    t0 = time.perf_counter()
    m, xs, zs, nv = _build(prog)
    proto = m.Proto()
    nvars, ncons = len(proto.variables), len(proto.constraints)
    if hint is not None:
        for x, a in zip(xs, hint):
            m.AddHint(x, int(a))
    sols: list[Solution] = []
    statuses: list[str] = []
    first_obj = first_bound = None
    first_status = "UNKNOWN"
    rejected = 0
    k = 0
    while k < max(1, top):
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = max(1, int(workers))
        solver.parameters.random_seed = seed
        if time_limit is not None:
            left = time_limit - (time.perf_counter() - t0)
            if left <= 0 and (k > 0 or rejected > 0):
                break
            solver.parameters.max_time_in_seconds = max(0.01, left)
        with stoppable(solver):
            st = solver.Solve(m)
        status = _STATUS.get(st, "UNKNOWN")
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if k == 0:
                first_status = status
                first_obj = first_bound = None
            break
        choice = tuple(int(solver.Value(x)) for x in xs)
        cut = accept(choice) if accept is not None else None
        if cut is not None:
            # Lazy constraint: forbid every assignment agreeing with this one on ``cut``.
            m.AddBoolOr([zs[i][choice[i]].Not() for i in cut])
            rejected += 1
            if k == 0:
                first_obj = first_bound = None
                first_status = "UNKNOWN"
            if rejected >= max_rejections:
                break
            continue
        if k == 0:
            first_status = status
            first_obj = int(round(solver.ObjectiveValue()))
            first_bound = float(solver.BestObjectiveBound())
        statuses.append(status)
        sols.append(Solution(choice=choice, objective=int(round(solver.ObjectiveValue())),
                             node_value=int(solver.Value(nv[prog.objective]))))
        # No-good cut: this exact assignment is not allowed in the next solve.
        m.AddBoolOr([zs[i][a].Not() for i, a in enumerate(choice)])
        m.ClearHints()
        k += 1
        if status != "OPTIMAL":
            break   # the next solve could not prove anything the first did not
    return LayoutResult(status=first_status, objective=first_obj, bound=first_bound,
                        wall_s=time.perf_counter() - t0, solutions=sols, statuses=statuses,
                        num_vars=nvars, num_constraints=ncons, rejected=rejected)


def scale_to_int(values, unit: float) -> dict:
    """Round a dict of floats to integers in units of ``unit`` (e.g. 1e-9 s = ns)."""
    return {k: int(math.floor(v / unit + 0.5)) for k, v in values.items()}
