"""CP-SAT over a separable lower bound, with exact lazy evaluation (:func:`solve_bounded`, ``plan
--method cp-sat``): the search of ``solver.bounded`` with CP-SAT enumerating the blocks band by band
under every rule table. Apart from ``solver.bounded`` so that the default numpy search does not load
OR-Tools (about 0.4 s: it imports pandas)."""

from __future__ import annotations

import itertools
import math
import time
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

from solver.bounded import _DEBUG, LOG_SCALE, BoundedResult, _BestFitting, _factor_parts, _log_table, _projected_tables
from solver.interrupt import stoppable
from solver.numpy_engine import evaluate_many, table_mask
from solver.program import Program, Solution


def _cpsat_master(prog: Program, factors, master=None):
    """CP-SAT model over the decision variables: every allow/forbid table, every table node keyed
    by decision variables only (its tuples are the only defined ones), the table nodes that key a
    bound factor or a limit (compiled on demand, with the tables they read), limits on sums of
    tables, and the log of the separable bound as a sum of table variables. Returns
    (model, xs, bound expression, (lo, hi) of the bound)."""
    m = cp_model.CpModel()
    keep = set(range(len(prog.domains))) if master is None else set(master)
    xs = [m.NewIntVar(0, d - 1, nm) if i in keep else None
          for i, (d, nm) in enumerate(zip(prog.domains, prog.names))]

    def add_table(cols, tuples, values=None):
        """Constrain ``cols`` to one of ``tuples``; with ``values``, return the chosen tuple's value."""
        tuples = list(tuples)
        if values is None:
            m.AddAllowedAssignments(cols, tuples)
            return None
        t = m.NewIntVar(min(values), max(values), "")
        m.AddAllowedAssignments(cols + [t], [k + (v,) for k, v in zip(tuples, values)])
        return t

    inter, forbidden = _projected_tables(prog, keep)
    for vars_, tuples in inter.items():
        if not tuples:
            m.AddBoolOr([])          # nothing allowed
            continue
        add_table([xs[v] for v in vars_], sorted(tuples))
    for vars_, tuples in forbidden:
        m.AddForbiddenAssignments([xs[v] for v in vars_], sorted(tuples))

    def table_expr(vars_, nodes, values):
        keys = list(values)
        return add_table([xs[v] for v in vars_] + [node_var(n) for n in nodes], keys, [values[k] for k in keys])

    compiled: dict = {}

    def node_var(n):
        """A CP-SAT variable equal to table node n (tables keyed by other tables only)."""
        if n in compiled:
            return compiled[n]
        nd = prog.nodes[n]
        if nd.kind != "table":
            raise ValueError(f"node {n} is a {nd.kind}; only table nodes key a bound factor or a limit")
        # a free variable is projected out with the table's minimum over it: a relaxation that is
        # sound for limits (upper bounds); a factor's key node must not read a free variable
        kv = [j for j, u in enumerate(nd.vars) if u in keep]
        nk = len(nd.vars)
        vals: dict = {}
        for k, val in nd.values.items():
            kk = tuple(k[j] for j in kv) + k[nk:]
            if kk not in vals or val < vals[kk]:
                vals[kk] = val
        dv = sorted(set(vals.values()))
        v = m.NewIntVarFromDomain(cp_model.Domain.FromValues(dv), f"n{n}")
        keys = list(vals)
        m.Add(v == add_table([xs[nd.vars[j]] for j in kv] + [node_var(k) for k in nd.keys], keys,
                             [vals[k] for k in keys]))
        compiled[n] = v
        return v

    def reads_free(n):
        nd = prog.nodes[n]
        return any(u not in keep for u in nd.vars) or any(reads_free(k) for k in nd.keys)

    def expressible(nd):
        return nd.kind == "table" and all(prog.nodes[k].kind == "table" and expressible(prog.nodes[k])
                                          and not reads_free(k) for k in nd.keys)

    for j, (node, bnd) in enumerate(prog.limits):
        nd = prog.nodes[node]
        parts = [node] if nd.kind == "table" else (
            list(nd.args) if nd.kind == "sum" and all(w == 1 for w in nd.weights) else None)
        if parts is None or not all(expressible(prog.nodes[p]) for p in parts):
            continue   # not expressible on table nodes alone: the exact evaluation checks it
        m.Add(sum(node_var(p) for p in parts) + (nd.const if nd.kind == "sum" else 0) <= bnd)
    terms, lo, hi = [], 0, 0
    for j, f in enumerate(factors):
        vars_, nodes, values = _factor_parts(f)
        if any(v not in keep for v in vars_) or any(reads_free(n) for n in nodes):
            raise ValueError(f"bound factor {j} reads a variable outside the master")
        lt = _log_table(values)
        terms.append(table_expr(vars_, nodes, lt))
        lo += min(lt.values())
        hi += max(lt.values())
    b = m.NewIntVar(lo, hi, "bound")
    m.Add(b == sum(terms))
    return m, xs, b, (lo, hi)


class _Collect(cp_model.CpSolverSolutionCallback):
    def __init__(self, xs, limit):
        super().__init__()
        self.xs, self.limit, self.rows, self.full = xs, limit, [], False

    def on_solution_callback(self):
        self.rows.append([self.Value(x) for x in self.xs])
        if len(self.rows) >= self.limit:
            self.full = True
            self.StopSearch()


def _expander(prog: Program, keep: list[int]):
    """``expand(block_rows)``: every completion of each block (rows over the ``keep`` variables)
    over the free variables, as full rows, keeping those that pass every rule table."""
    n = len(prog.domains)
    free = [v for v in range(n) if v not in set(keep)]
    fgrid = np.array(list(itertools.product(*(range(prog.domains[v]) for v in free))), dtype=np.int64)
    fgrid = fgrid.reshape(len(fgrid), len(free))

    def expand(block_rows):
        b = np.asarray(block_rows, dtype=np.int64)
        rows = np.zeros((len(b) * len(fgrid), n), dtype=np.int64)
        rows[:, keep] = np.repeat(b, len(fgrid), axis=0)
        if free:
            rows[:, free] = np.tile(fgrid, (len(b), 1))
        return rows[table_mask(prog, rows)]
    return expand


class _Runner:
    """One CP-SAT solve of a model (minimise, or enumerate every solution up to ``batch``) under
    the search's remaining time, stoppable by Ctrl-C; ``seconds`` sums the time spent in CP-SAT."""

    def __init__(self, mx, t0: float, time_limit: float | None, workers: int, batch: int):
        self.mx, self.t0, self.time_limit, self.workers, self.batch = mx, t0, time_limit, workers, batch
        self.seconds = 0.0

    def __call__(self, model, enumerate_all=False, limit=None):
        s = cp_model.CpSolver()
        s.parameters.num_workers = 1 if enumerate_all else max(1, int(self.workers))
        if enumerate_all:
            s.parameters.enumerate_all_solutions = True
        if self.time_limit is not None:
            s.parameters.max_time_in_seconds = max(0.05, self.time_limit - (time.perf_counter() - self.t0))
        cb = _Collect(self.mx, limit or self.batch) if enumerate_all else None
        t = time.perf_counter()
        with stoppable(s):
            st = s.Solve(model, cb) if cb is not None else s.Solve(model)
        self.seconds += time.perf_counter() - t
        if _DEBUG:
            print(f"cp-sat {'enum' if enumerate_all else 'min'} {time.perf_counter() - t:.2f}s "
                  f"{s.StatusName(st)} rows={len(cb.rows) if cb else '-'}", flush=True)
        return s, st, cb


def solve_bounded(prog: Program, factors, top: int = 1, accept=None, time_limit: float | None = None,
                  workers: int = 2, batch: int = 200_000, master: Sequence[int] | None = None) -> BoundedResult:
    """Exact optimum (and top-K) of ``prog`` by CP-SAT over a separable lower bound plus exact lazy
    evaluation (logic-based Benders).

    ``factors``: ``[(vars, {tuple: positive float}), ...]`` (or ``(vars, nodes, {tuple: ...})``, keyed
    by the decision variables ``vars`` and then the values of the table nodes ``nodes``, as
    :meth:`Program.table`) such that for every assignment x the program's weighted objective
    satisfies ``objective(x) >= prod_j factors_j(x)`` (a tuple missing from a factor is infeasible).
    CP-SAT minimises ``B(x) = sum_j (floor(S ln f_j(x)) - 1)``, so ``B(x) < S ln objective(x)``.

    ``master``: the variables CP-SAT decides (default: all). The others are *free*: the master
    holds every rule table projected onto its variables (a relaxation), and each master solution
    is a block whose completions over the free variables numpy checks against every table and
    evaluates exactly. Factors read master variables only, so a block's bound is below each of its
    completions' objectives.

    1. CP-SAT proves ``B* = min B``. 2. Rounds: CP-SAT enumerates every block with
    ``lo < B <= hi`` (disjoint bands), numpy evaluates its completions exactly
    (:func:`evaluate_many`), and ``accept`` (memory, lazy) is checked best-first; ``T`` is the
    ``top``-th best fitting exact objective. 3. Stop when ``hi >= floor(S ln T)``: every block not
    enumerated has ``S ln objective(x) > B > hi >= S ln T`` for each completion x, so none can
    enter the top K (OPTIMAL). Bands grow geometrically; at ``time_limit`` the result is FEASIBLE
    with the bound ``exp(hi / S)``."""
    t0 = time.perf_counter()
    n = len(prog.domains)
    keep = list(range(n)) if master is None else sorted(set(int(v) for v in master))
    m, xs, B, (blo, bhi) = _cpsat_master(prog, factors, keep)
    expand = _expander(prog, keep)
    run = _Runner([xs[v] for v in keep], t0, time_limit, workers, batch)

    m.Minimize(B)
    s, st, _ = run(m)
    nvars, ncons = len(m.Proto().variables), len(m.Proto().constraints)
    done = lambda status, sols, bound, **kw: BoundedResult(  # noqa: E731
        status=status, objective=sols[0].objective if sols else None, bound=bound,
        wall_s=time.perf_counter() - t0, solutions=sols, statuses=[status] * len(sols), num_vars=nvars,
        num_constraints=ncons, cpsat_s=run.seconds, **kw)
    if st == cp_model.INFEASIBLE:
        return done("INFEASIBLE", [], None)
    if st != cp_model.OPTIMAL:
        return done("UNKNOWN", [], None)
    bmin = int(round(s.ObjectiveValue()))
    m.ClearObjective()
    best = _BestFitting(prog, accept)
    evaluated = bands = 0
    fitting: list = []
    lo, step = bmin - 1, LOG_SCALE // 50         # first band: bound within 2% of the smallest
    while True:
        target = None
        if len(fitting) >= top:
            target = int(math.floor(LOG_SCALE * math.log(fitting[top - 1][0]))) if fitting[top - 1][0] > 0 else bmin
        if target is not None and lo >= target:
            bound = float(fitting[0][0])
            return done("OPTIMAL", [Solution(ch, o, n_) for o, n_, ch in fitting[:top]], bound,
                        evaluated=evaluated, bands=bands, rejected=best.rejected, min_bound=math.exp(bmin / LOG_SCALE))
        hi = lo + step if target is None else min(lo + step, target)
        hi = min(hi, bhi)
        band = m.Clone()
        bb = band.GetIntVarFromProtoIndex(B.Index())
        band.Add(bb >= lo + 1)
        band.Add(bb <= hi)
        s, st, cb = run(band, enumerate_all=True)
        bands += 1
        if cb.full or st not in (cp_model.OPTIMAL, cp_model.INFEASIBLE):
            # band too large for one round or out of time: report what is proven
            if cb.full and (time_limit is None or time.perf_counter() - t0 < time_limit) and step > 1:
                step = max(1, step // 4)
                continue
            status = "FEASIBLE" if fitting else "UNKNOWN"
            return done(status, [Solution(ch, o, n_) for o, n_, ch in fitting[:top]],
                        math.exp(lo / LOG_SCALE), evaluated=evaluated, bands=bands, rejected=best.rejected,
                        min_bound=math.exp(bmin / LOG_SCALE))
        if cb.rows:
            rows = expand(cb.rows)
            obj, ok, vals = evaluate_many(prog, rows)
            evaluated += int(ok.sum())
            best.add(obj[ok], vals[prog.objective][ok], rows[ok])
            fitting = best.top(top)
        lo = hi
        if lo >= bhi:
            # every block is enumerated (no bound exceeds bhi)
            status = "OPTIMAL" if fitting else "INFEASIBLE"
            return done(status, [Solution(ch, o, n_) for o, n_, ch in fitting[:top]],
                        float(fitting[0][0]) if fitting else None, evaluated=evaluated, bands=bands,
                        rejected=best.rejected, min_bound=math.exp(bmin / LOG_SCALE))
        if target is None or len(cb.rows) < batch // 8:
            step *= 2
