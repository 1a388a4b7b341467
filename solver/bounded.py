"""The bounded search: blocks of the master variables walked in order of a separable lower bound of
the objective (a product of factors over a few variables), each block's completions evaluated
exactly with numpy; numpy enumerates the blocks (:func:`enumerate_bounded`, the default of
``plan``) or CP-SAT does, band by band under every rule table (``solver.bounded_cpsat``: this
module loads no OR-Tools, so the default search and the CLI start without it)."""

from __future__ import annotations

import itertools
import math
import operator
import os as _os
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from solver.numpy_engine import key_array, evaluate_many, feasible_rows, limit_mask, table_mask
from solver.program import LayoutResult, Program, Solution


_DEBUG = bool(_os.environ.get("TOPOPLAN_SOLVER_DEBUG"))
LOG_SCALE = 2_000       # bound terms enter CP-SAT as floor(LOG_SCALE * ln(value)) - 1 (0.05% steps)


@dataclass
class BoundedResult(LayoutResult):
    """:class:`LayoutResult` of :func:`solve_bounded`, with the work it did."""

    evaluated: int = 0          # assignments evaluated exactly (numpy program)
    cpsat_s: float = 0.0        # wall seconds inside CP-SAT
    bands: int = 0              # enumeration rounds
    min_bound: float | None = None   # the smallest separable bound over the space (CP-SAT optimum)


def _log_table(values: dict) -> dict:
    out = {}
    for k, v in values.items():
        if v <= 0:
            raise ValueError("bound factors must be positive")
        out[k] = int(math.floor(LOG_SCALE * math.log(v))) - 1
    return out


def _factor_parts(f):
    """``(vars, nodes, values)`` of a bound factor given as ``(vars, values)`` or ``(vars, nodes, values)``."""
    if len(f) == 2:
        return tuple(f[0]), (), f[1]
    return tuple(f[0]), tuple(f[1]), f[2]


def bound_many(prog: Program, factors, rows, vals) -> "np.ndarray":
    """``prod_j factor_j(x)`` for every row (``inf`` where a factor has no entry): the separable
    bound of :func:`solve_bounded` evaluated in numpy. ``vals``: node values of the rows, from
    :func:`evaluate_many` (only the nodes that key a factor are read)."""
    out = np.ones(len(rows), dtype=np.float64)
    for f in factors:
        vars_, nodes, values = _factor_parts(f)
        cols = [rows[:, v].astype(np.int64) for v in vars_] + [np.asarray(vals[n], dtype=np.int64) for n in nodes]
        keys = key_array(values, len(cols))
        dims, kidx, ridx = [], [], []
        for j, c in enumerate(cols):
            uniq = np.unique(np.concatenate([keys[:, j], c]))
            dims.append(len(uniq))
            kidx.append(np.searchsorted(uniq, keys[:, j]))
            ridx.append(np.searchsorted(uniq, c))
        flat = np.full(int(np.prod(dims)), np.inf)
        flat[np.ravel_multi_index(kidx, dims)] = np.fromiter(values.values(), dtype=np.float64, count=len(values))
        out *= flat[np.ravel_multi_index(ridx, dims)]
    return out


def _project(vars_, tuples, keep):
    """(kept variables, tuples projected onto them) of a table; (None, None) if none is kept."""
    idx = [j for j, v in enumerate(vars_) if v in keep]
    if not idx:
        return None, None
    if len(idx) == len(vars_):
        return tuple(vars_), tuples
    get = operator.itemgetter(*idx)
    proj = map(get, tuples) if len(idx) > 1 else ((get(t),) for t in tuples)
    return tuple(vars_[j] for j in idx), frozenset(proj)


def _projected_tables(prog: Program, keep: set) -> tuple[dict, list]:
    """The program's constraints on the variables in ``keep`` (a relaxation): every allow table and
    every table node keyed by decision variables only, projected onto ``keep`` and intersected per
    variable tuple; the forbid tables that read only ``keep`` (a forbid over a projected-out
    variable cannot be projected). Returns ({vars: allowed tuples}, [(vars, forbidden tuples)])."""
    inter: dict = {}

    def add(vars_, tuples):
        vars_, tuples = _project(vars_, tuples, keep)
        if vars_ is not None:
            inter[vars_] = tuples if vars_ not in inter else inter[vars_] & tuples

    for vars_, tuples in prog.allowed:
        add(vars_, tuples)
    for nd in prog.nodes:
        if nd.kind == "table" and not nd.keys and nd.vars:
            add(nd.vars, frozenset(nd.values))
    forbidden = [(v, t) for v, t in prog.forbidden if t and all(u in keep for u in v)]
    return inter, forbidden


def feasible_blocks(prog: Program, master: Sequence[int]) -> "np.ndarray":
    """Every assignment of the ``master`` variables that satisfies the program's tables projected
    onto them (a relaxation: each feasible assignment of the whole program projects onto one), as
    an (R, n) array whose other columns are 0."""
    keep = set(int(v) for v in master)
    sub = Program([prog.domains[v] if v in keep else 1 for v in range(len(prog.domains))], names=prog.names)
    inter, sub.forbidden = _projected_tables(prog, keep)
    sub.allowed = list(inter.items())
    order = [v for v in range(len(prog.domains)) if v in keep] + [v for v in range(len(prog.domains)) if v not in keep]
    return feasible_rows(sub, order).astype(np.int64)


def _reads(prog: Program, n: int, free: set) -> bool:
    nd = prog.nodes[n]
    return any(u in free for u in nd.vars) or any(_reads(prog, k, free) for k in nd.keys) or any(
        _reads(prog, a, free) for a in nd.args)


class _BestFitting:
    """Exactly evaluated feasible rows, kept as arrays; :meth:`top` finds the best that pass the
    lazy ``accept`` (memory) best-first, checks each row once and drops those that do not fit."""

    def __init__(self, prog: Program, accept):
        weighted = prog.weight is not None
        self.objs = np.zeros(0, dtype=np.float64 if weighted else np.int64)
        self.nodes = np.zeros(0, dtype=np.int64)
        self.rows = np.zeros((0, len(prog.domains)), dtype=np.int64)
        self.conv = float if weighted else int
        self.accept, self.checked, self.rejected = accept, {}, 0

    def add(self, obj, node, rows) -> None:
        self.objs = np.concatenate([self.objs, obj])
        self.nodes = np.concatenate([self.nodes, node])
        self.rows = np.concatenate([self.rows, np.asarray(rows, dtype=np.int64)])

    def top(self, k: int) -> list:
        """[(objective, node value, choice)] of the k best rows that fit, best first."""
        fitting, drop = [], []
        for i in np.argsort(self.objs, kind="stable"):
            ch = tuple(int(a) for a in self.rows[i])
            ok = self.checked.get(ch)
            if ok is None:
                ok = self.accept is None or self.accept(ch) is None
                self.checked[ch] = ok
                self.rejected += not ok
            if ok:
                fitting.append((self.conv(self.objs[i]), int(self.nodes[i]), ch))
                if len(fitting) >= k:
                    break
            else:
                drop.append(i)
        if drop:   # rows that do not fit are never candidates again
            keep = np.ones(len(self.objs), dtype=bool)
            keep[drop] = False
            self.objs, self.nodes, self.rows = self.objs[keep], self.nodes[keep], self.rows[keep]
        return fitting


def enumerate_bounded(prog: Program, factors, master: Sequence[int] | None = None, top: int = 1, accept=None,
                      time_limit: float | None = None, chunk: int = 256) -> BoundedResult:
    """The search of :func:`solve_bounded` with numpy in place of CP-SAT: every feasible block
    (assignment of the ``master`` variables, :func:`feasible_blocks`) gets its separable bound
    (:func:`bound_many`); blocks are expanded over the free variables and evaluated exactly in
    increasing bound order, and the search stops when the next block's bound is no better than
    the ``top``-th best fitting objective (OPTIMAL: every block left has a bound, hence every
    completion an objective, at least that large), or at ``time_limit`` (FEASIBLE, with the next
    block's bound as the proven bound)."""
    t0 = time.perf_counter()
    n = len(prog.domains)
    keep = list(range(n)) if master is None else sorted(set(int(v) for v in master))
    free = [v for v in range(n) if v not in set(keep)]
    key_nodes = [nd_ for f in factors for nd_ in _factor_parts(f)[1]]
    if any(_reads(prog, k, set(free)) for k in key_nodes) or any(
            v in set(free) for f in factors for v in _factor_parts(f)[0]):
        raise ValueError("a bound factor reads a variable outside the master")
    blocks = feasible_blocks(prog, keep)
    if len(blocks) and key_nodes:
        _, _, vals = evaluate_many(prog, blocks, upto=max(key_nodes))
    else:
        vals = []
    bnd = bound_many(prog, factors, blocks, vals) if len(blocks) else np.zeros(0)
    live = np.isfinite(bnd)
    blocks, bnd = blocks[live], bnd[live]
    srt = np.argsort(bnd, kind="stable")
    blocks, bnd = blocks[srt], bnd[srt]
    fgrid = np.array(list(itertools.product(*(range(prog.domains[v]) for v in free))), dtype=np.int64)
    fgrid = fgrid.reshape(len(fgrid), len(free))
    best = _BestFitting(prog, accept)
    fitting: list = []
    evaluated = 0
    pos = 0
    status, bound = "OPTIMAL", None
    while True:
        nxt = float(bnd[pos]) if pos < len(blocks) else None
        if nxt is None or (len(fitting) >= top and fitting[top - 1][0] <= nxt):
            bound = float(fitting[0][0]) if fitting else None
            break
        if time_limit is not None and time.perf_counter() - t0 > time_limit and fitting:
            status, bound = "FEASIBLE", float(min(nxt, fitting[0][0]))
            break
        end = pos + chunk
        if len(fitting) >= top:   # a block whose bound reaches the top-th objective cannot enter the top
            end = min(end, int(np.searchsorted(bnd, fitting[top - 1][0], side="left")))
        part = blocks[pos: max(end, pos + 1)]
        pos += len(part)
        chunk = min(chunk * 2, 1 << 14)
        rows = np.repeat(part, len(fgrid), axis=0)
        if free:
            rows[:, free] = np.tile(fgrid, (len(part), 1))
        rows = rows[table_mask(prog, rows)]
        rows = rows[limit_mask(prog, rows)]     # the memory bound first: it reads a few tables only
        if not len(rows):
            continue
        obj, ok, vals_ = evaluate_many(prog, rows)
        evaluated += int(ok.sum())
        best.add(obj[ok], vals_[prog.objective][ok], rows[ok])
        fitting = best.top(top)
    rejected = best.rejected
    if not fitting:
        status = "INFEASIBLE"
    sols = [Solution(ch, o, nvv) for o, nvv, ch in fitting[:top]]
    return BoundedResult(status=status, objective=sols[0].objective if sols else None, bound=bound,
                         wall_s=time.perf_counter() - t0, solutions=sols, statuses=[status] * len(sols),
                         num_vars=n, num_constraints=len(blocks), rejected=rejected, evaluated=evaluated,
                         min_bound=float(bnd[0]) if len(bnd) else None)
