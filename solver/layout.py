"""The layout integer program: discrete choices, table constraints and tabulated cost terms.

Plain data in, plain result out. A :class:`Program` holds

* **decision variables** ``x_i`` in ``{0, ..., n_i - 1}`` (indices into the caller's candidate
  lists: TP degree, PP degree, GPUs used per NVLink domain, ...), each one-hot encoded;
* **compatibility tables**: the tuples a subset of variables may take (``allow``) or must not take
  (``forbid``); trainer rules and memory limits arrive this way;
* **cost nodes**, integers built from

  - ``table(vars, values)``: the value of a term as a function of a few variables, given as a
    dict ``{tuple of indices: int}``; a tuple missing from the dict is infeasible (so a term
    that is only defined where memory fits carries that constraint with it),
  - ``sum(nodes, weights, const)``, ``max(nodes)``, ``product(a, b)``, ``const(c)``;

* an **objective**: minimise ``weight(x) * node(x)``, where ``weight`` is an optional positive
  integer table over a few variables. That covers "minimise time per sequence" when the global
  batch is free (weight = L / gbs) and "maximise TFLOP/s per GPU" (weight proportional to
  world / gbs) while keeping the program linear in the objective: for every distinct weight
  value w_j there is a copy y_j of the node that equals it when the weight is w_j and 0
  otherwise, and the objective is sum_j w_j y_j.

Every nonlinear function of the cost model enters as a table over the discrete choices (CP-SAT
table constraints on the one-hot-decoded indices), sums, maxima and products of integer
variables are exact in CP-SAT, so the optimum of the program is the optimum of the tabulated
model over the declared space, not an approximation of it.

Top-K: after the optimum is found, a no-good cut forbids that exact assignment of the decision
variables and the program is solved again; the k-th solve proves the k-th best. :func:`evaluate`
computes a node for one assignment in plain Python, the oracle the tests compare against.

Two ways to search: :func:`solve` (OR-Tools CP-SAT, with lazy constraints through a callback) and
:func:`feasible_rows` + :func:`evaluate_many` (every assignment the allow/forbid tables admit,
evaluated with numpy; exhaustive, so optimal by construction). ``planner.search.plan`` uses the second by
default: on the full layout space CP-SAT did not find a first solution within a minute
(docs/solver.md).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

from ortools.sat.python import cp_model

__all__ = ["Program", "Solution", "LayoutResult", "solve", "evaluate", "brute_force"]


@dataclass
class _Node:
    kind: str                      # "table" | "sum" | "max" | "product" | "const" | "element" | "argmax"
    vars: tuple[int, ...] = ()     # table: decision variables
    values: dict | None = None     # table: {tuple: int} keyed by (vars..., node values...)
    keys: tuple[int, ...] = ()     # table: earlier nodes whose values also key the table
    args: tuple[int, ...] = ()     # sum/max/product: child node ids
    weights: tuple[int, ...] = ()  # sum
    const: int = 0                 # sum / const


@dataclass
class Program:
    """Decision variables with ``domains[i]`` choices each, constraints and cost nodes."""

    domains: Sequence[int]
    names: Sequence[str] | None = None
    allowed: list = field(default_factory=list)     # (vars, frozenset of tuples)
    forbidden: list = field(default_factory=list)   # (vars, frozenset of tuples)
    nodes: list = field(default_factory=list)
    objective: int | None = None
    weight: tuple | None = None                     # (vars, {tuple: positive int})
    limits: list = field(default_factory=list)      # (node, upper bound)

    def __post_init__(self):
        self.domains = [int(d) for d in self.domains]
        if any(d < 1 for d in self.domains):
            raise ValueError("every decision variable needs at least one choice")
        if self.names is None:
            self.names = [f"x{i}" for i in range(len(self.domains))]

    # -- constraints -----------------------------------------------------------------------
    def _check_vars(self, vars_):
        vars_ = tuple(int(v) for v in vars_)
        if len(set(vars_)) != len(vars_) or any(v < 0 or v >= len(self.domains) for v in vars_):
            raise ValueError(f"bad variable list {vars_}")
        return vars_

    def allow(self, vars_, tuples) -> None:
        """Only these tuples of choices are allowed for ``vars_``."""
        vars_ = self._check_vars(vars_)
        self.allowed.append((vars_, frozenset(tuple(int(a) for a in t) for t in tuples)))

    def forbid(self, vars_, tuples) -> None:
        """These tuples of choices are not allowed for ``vars_``."""
        vars_ = self._check_vars(vars_)
        self.forbidden.append((vars_, frozenset(tuple(int(a) for a in t) for t in tuples)))

    # -- cost nodes --------------------------------------------------------------------------
    def _add(self, node: _Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def table(self, vars_, values: dict, nodes=(), trusted: bool = False) -> int:
        """A term tabulated over ``vars_``: ``values[(a_0, a_1, ...)]`` is its integer value when
        ``x[vars_[k]] == a_k``; tuples missing from ``values`` are infeasible.

        ``nodes``: earlier nodes whose values follow the decision variables in each key, so a
        table can read a derived quantity (the world size, a group's shape class) instead of every
        variable that quantity depends on."""
        vars_ = self._check_vars(vars_) if vars_ else ()
        nodes = tuple(int(n) for n in nodes)
        if any(n < 0 or n >= len(self.nodes) for n in nodes):
            raise ValueError(f"bad node list {nodes}")
        if not vars_ and not nodes:
            raise ValueError("a table needs at least one variable or node")
        # trusted: the caller promises keys are tuples of ints and values ints (skips a copy)
        vals = values if trusted else {tuple(int(a) for a in k): int(v) for k, v in values.items()}
        if not vals:
            raise ValueError("a table needs at least one feasible entry")
        return self._add(_Node("table", vars=vars_, values=vals, keys=nodes))

    def const(self, c: int) -> int:
        return self._add(_Node("const", const=int(c)))

    def sum(self, nodes, weights=None, const: int = 0) -> int:
        nodes = tuple(int(n) for n in nodes)
        weights = tuple(int(w) for w in (weights or [1] * len(nodes)))
        if len(weights) != len(nodes):
            raise ValueError("one weight per node")
        return self._add(_Node("sum", args=nodes, weights=weights, const=int(const)))

    def max(self, nodes) -> int:
        nodes = tuple(int(n) for n in nodes)
        if not nodes:
            raise ValueError("max of nothing")
        return self._add(_Node("max", args=nodes))

    def product(self, a: int, b: int) -> int:
        return self._add(_Node("product", args=(int(a), int(b))))

    def element(self, index: int, options, index_is_node: bool = False) -> int:
        """``options[i]`` where i is decision variable ``index`` (or node ``index`` when
        ``index_is_node``); an index outside the options is infeasible."""
        options = tuple(int(o) for o in options)
        if not options:
            raise ValueError("element of nothing")
        if index_is_node:
            return self._add(_Node("element", keys=(int(index),), args=options))
        return self._add(_Node("element", vars=self._check_vars([index]), args=options))

    def argmax(self, keys, present) -> int:
        """Index of the first ``keys[i]`` that is largest among those with ``present[i] != 0``
        (Python's ``max`` tie rule); infeasible when nothing is present. ``present`` nodes take
        values 0 or 1."""
        keys = tuple(int(k) for k in keys)
        present = tuple(int(p) for p in present)
        if len(keys) != len(present) or not keys:
            raise ValueError("argmax needs as many present flags as keys")
        return self._add(_Node("argmax", args=keys + present))

    def at_most(self, node: int, bound: int) -> None:
        """Constraint: ``node <= bound``."""
        self.limits.append((int(node), int(bound)))

    def minimize(self, node: int, weight_vars=None, weight_values: dict | None = None) -> None:
        """Objective: minimise ``weight(x) * node(x)``; weight defaults to 1."""
        self.objective = int(node)
        if weight_vars is not None:
            wv = self._check_vars(weight_vars)
            vals = {tuple(int(a) for a in k): int(v) for k, v in weight_values.items()}
            if any(v <= 0 for v in vals.values()):
                raise ValueError("objective weights must be positive integers")
            self.weight = (wv, vals)
        else:
            self.weight = None


@dataclass
class Solution:
    choice: tuple[int, ...]     # index chosen for each decision variable
    objective: int              # weight * node, as evaluated by the program
    node_value: int             # the objective node alone


@dataclass
class LayoutResult:
    status: str                 # "OPTIMAL" | "FEASIBLE" | "INFEASIBLE" | "UNKNOWN" | "MODEL_INVALID"
    objective: int | None       # best objective found (minimised)
    bound: float | None         # proven lower bound on the objective
    wall_s: float
    solutions: list[Solution]   # best first; solutions[k] is proven k-th best when status_k OPTIMAL
    statuses: list[str] = field(default_factory=list)  # status of each top-K solve
    num_vars: int = 0
    num_constraints: int = 0
    rejected: int = 0           # solutions cut off by the ``accept`` callback (lazy constraints)

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None or self.objective == 0:
            return None
        return max(0.0, (self.objective - self.bound) / abs(self.objective))


# -- plain-Python semantics (the oracle) ----------------------------------------------------------

def _feasible(prog: Program, x: Sequence[int]) -> bool:
    for vars_, tuples in prog.allowed:
        if tuple(x[v] for v in vars_) not in tuples:
            return False
    for vars_, tuples in prog.forbidden:
        if tuple(x[v] for v in vars_) in tuples:
            return False
    return True


def _node_values(prog: Program, x: Sequence[int]) -> list[int] | None:
    out: list[int] = []
    for nd in prog.nodes:
        if nd.kind == "table":
            key = tuple(x[v] for v in nd.vars) + tuple(out[n] for n in nd.keys)
            if key not in nd.values:
                return None
            out.append(nd.values[key])
        elif nd.kind == "const":
            out.append(nd.const)
        elif nd.kind == "sum":
            out.append(nd.const + sum(w * out[a] for a, w in zip(nd.args, nd.weights)))
        elif nd.kind == "max":
            out.append(max(out[a] for a in nd.args))
        elif nd.kind == "product":
            out.append(out[nd.args[0]] * out[nd.args[1]])
        elif nd.kind == "element":
            i = x[nd.vars[0]] if nd.vars else out[nd.keys[0]]
            if not 0 <= i < len(nd.args):
                return None
            out.append(out[nd.args[i]])
        elif nd.kind == "argmax":
            n = len(nd.args) // 2
            ks, ps = nd.args[:n], nd.args[n:]
            if any(out[p] not in (0, 1) for p in ps):
                return None
            live = [i for i in range(n) if out[ps[i]]]
            if not live:
                return None
            best = max(out[ks[i]] for i in live)
            out.append(next(i for i in live if out[ks[i]] == best))
        else:  # pragma: no cover
            raise ValueError(nd.kind)
    return out


def evaluate(prog: Program, x: Sequence[int]) -> int | None:
    """Objective of one assignment in plain Python; None when it breaks a constraint."""
    x = tuple(int(a) for a in x)
    if not _feasible(prog, x):
        return None
    vals = _node_values(prog, x)
    if vals is None:
        return None
    if any(vals[n] > b for n, b in prog.limits):
        return None
    w = 1
    if prog.weight is not None:
        wv, table = prog.weight
        key = tuple(x[v] for v in wv)
        if key not in table:
            return None
        w = table[key]
    return w * vals[prog.objective]


def brute_force(prog: Program) -> tuple[int | None, list[tuple[int, ...]]]:
    """Best objective and every assignment achieving it, by enumerating all assignments."""
    best, arg = None, []
    for x in itertools.product(*(range(d) for d in prog.domains)):
        v = evaluate(prog, x)
        if v is None:
            continue
        if best is None or v < best:
            best, arg = v, [x]
        elif v == best:
            arg.append(x)
    return best, arg


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
        nv.append(t)

    for n, bnd in prog.limits:
        m.Add(nv[n] <= bnd)

    # Objective: weight(x) * node(x), linearised over the distinct weight values.
    obj_node = nv[prog.objective]
    olo, ohi = bounds[prog.objective]
    if prog.weight is None:
        m.Minimize(obj_node)
    else:
        wvars, wtable = prog.weight
        distinct = sorted(set(wtable.values()))
        terms = []
        sel = []
        for w in distinct:
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


# -- exhaustive evaluation (vectorised) ------------------------------------------------------------

def table_mask(prog: Program, rows) -> "np.ndarray":
    """Rows (R, n) that satisfy every allow/forbid table of ``prog`` (table nodes are checked by
    :func:`evaluate_many`)."""
    import numpy as np

    ok = np.ones(len(rows), dtype=bool)
    for checks, allowed in ((prog.allowed, True), (prog.forbidden, False)):
        for vars_, tuples in checks:
            if not vars_:
                continue
            dims = [prog.domains[u] for u in vars_]
            tab = np.zeros(int(np.prod(dims)), dtype=bool)
            if tuples:
                tarr = np.array(sorted(tuples), dtype=np.int64).reshape(len(tuples), len(vars_))
                tab[np.ravel_multi_index(tarr.T, dims)] = True
            hit = tab[np.ravel_multi_index(rows[:, list(vars_)].T, dims)]
            ok &= hit if allowed else ~hit
    return ok


def feasible_rows(prog: Program, order: Sequence[int] | None = None, chunk_limit: int = 50_000_000) -> "np.ndarray":
    """Every assignment that satisfies the allow/forbid tables and has an entry in every table
    node keyed by decision variables only, as an (R, n) int array. A vectorised join: variables
    are added in ``order`` and each table is applied as soon as all its variables are set."""
    import numpy as np

    n = len(prog.domains)
    order = list(range(n)) if order is None else list(order)
    checks = [(v, t, True) for v, t in prog.allowed] + [(v, t, False) for v, t in prog.forbidden]
    checks += [(nd.vars, frozenset(nd.values), True) for nd in prog.nodes if nd.kind == "table" and not nd.keys]
    pos = {v: i for i, v in enumerate(order)}
    # each check runs when its last variable (in order) is added
    by_step: dict[int, list] = {}
    for vars_, tuples, allowed in checks:
        if not vars_:
            continue
        step = max(pos[v] for v in vars_)
        by_step.setdefault(step, []).append((vars_, tuples, allowed))
    dt = np.int16 if max(prog.domains) < 2 ** 15 else np.int64
    rows = np.zeros((1, n), dtype=dt)
    for step, v in enumerate(order):
        d = prog.domains[v]
        rows = np.repeat(rows, d, axis=0)
        rows[:, v] = np.tile(np.arange(d, dtype=dt), len(rows) // d)
        for vars_, tuples, allowed in by_step.get(step, []):
            dims = [prog.domains[u] for u in vars_]
            mask_tab = np.zeros(int(np.prod(dims)), dtype=bool)
            if tuples:
                tarr = np.array(sorted(tuples), dtype=np.int64).reshape(len(tuples), len(vars_))
                mask_tab[np.ravel_multi_index(tarr.T, dims)] = True
            idx = np.ravel_multi_index(rows[:, list(vars_)].T, dims)
            keep = mask_tab[idx] if allowed else ~mask_tab[idx]
            rows = rows[keep]
        if len(rows) > chunk_limit:
            raise MemoryError(f"{len(rows)} partial assignments after {step + 1} variables")
    return rows


def evaluate_many(prog: Program, rows, upto: int | None = None) -> tuple["np.ndarray", "np.ndarray", list]:
    """(objective, feasible mask, node values) for every row of ``rows`` (R, n): the vectorised
    twin of :func:`evaluate`. Infeasible rows get objective 0 and mask False.

    ``upto``: evaluate only nodes ``0..upto`` (nodes are in creation order, so a node's inputs come
    before it) and return that node's values as the objective, unweighted and without limits; the
    mask then covers only the tables met so far (a partial check, for lower bounds)."""
    import numpy as np

    R = len(rows)
    ok = np.ones(R, dtype=bool)
    out: list = []
    for ni, nd in enumerate(prog.nodes):
        if upto is not None and ni > upto:
            break
        if nd.kind == "table":
            dims, cols = [], []
            for v in nd.vars:
                dims.append(prog.domains[v])
                cols.append(rows[:, v])
            keys = list(nd.values.keys())
            karr = np.array(keys, dtype=np.int64).reshape(len(keys), len(nd.vars) + len(nd.keys))
            kidx = [karr[:, j] for j in range(len(nd.vars))]
            for j, src in enumerate(nd.keys):
                col = karr[:, len(nd.vars) + j]
                uniq = np.unique(col)
                dims.append(len(uniq))
                kidx.append(np.searchsorted(uniq, col))
                val = out[src]
                pos = np.clip(np.searchsorted(uniq, val), 0, len(uniq) - 1)
                ok &= uniq[pos] == val
                cols.append(pos)
            flat = np.zeros(int(np.prod(dims)), dtype=np.int64)
            have = np.zeros(int(np.prod(dims)), dtype=bool)
            fi = np.ravel_multi_index(kidx, dims)
            flat[fi] = np.fromiter(nd.values.values(), dtype=np.int64, count=len(keys))
            have[fi] = True
            ri = np.ravel_multi_index(cols, dims)
            ok &= have[ri]
            out.append(flat[ri])
        elif nd.kind == "const":
            out.append(np.full(R, nd.const, dtype=np.int64))
        elif nd.kind == "sum":
            acc = np.full(R, nd.const, dtype=np.int64)
            for a, w in zip(nd.args, nd.weights):
                acc = acc + w * out[a]
            out.append(acc)
        elif nd.kind == "max":
            acc = out[nd.args[0]]
            for a in nd.args[1:]:
                acc = np.maximum(acc, out[a])
            out.append(acc)
        elif nd.kind == "product":
            out.append(out[nd.args[0]] * out[nd.args[1]])
        elif nd.kind == "element":
            i = rows[:, nd.vars[0]] if nd.vars else out[nd.keys[0]]
            ok &= (i >= 0) & (i < len(nd.args))
            acc = out[nd.args[0]].copy()
            for j, a in enumerate(nd.args[1:], 1):
                np.copyto(acc, out[a], where=(i == j))
            out.append(acc)
        elif nd.kind == "argmax":
            k = len(nd.args) // 2
            keys = np.stack([out[a] for a in nd.args[:k]])
            pres = np.stack([out[a] for a in nd.args[k:]])
            ok &= np.all((pres == 0) | (pres == 1), axis=0) & np.any(pres == 1, axis=0)
            masked = np.where(pres == 1, keys, np.iinfo(np.int64).min)
            out.append(np.argmax(masked, axis=0).astype(np.int64))   # first maximal, as Python's max
    if upto is not None:
        return np.where(ok, out[upto], 0), ok, out
    for n_, b in prog.limits:
        ok &= out[n_] <= b
    obj = out[prog.objective].copy()
    if prog.weight is not None:
        wts, have = weights_of(prog, rows)
        ok &= have
        # weight * node can exceed int64 for slow layouts: order them in float64 (53-bit mantissa)
        obj = obj.astype(np.float64) * wts
    return np.where(ok, obj, 0), ok, out


def weights_of(prog: Program, rows) -> tuple["np.ndarray", "np.ndarray"]:
    """(objective weight, defined mask) for every row (weight 1 when the objective has none)."""
    import numpy as np

    R = len(rows)
    if prog.weight is None:
        return np.ones(R, dtype=np.int64), np.ones(R, dtype=bool)
    wv, table = prog.weight
    dims = [prog.domains[v] for v in wv]
    flat = np.zeros(int(np.prod(dims)), dtype=np.int64)
    have = np.zeros(int(np.prod(dims)), dtype=bool)
    karr = np.array(list(table.keys()), dtype=np.int64).reshape(len(table), len(wv))
    fi = np.ravel_multi_index(karr.T, dims)
    flat[fi] = np.fromiter(table.values(), dtype=np.int64, count=len(table))
    have[fi] = True
    ri = np.ravel_multi_index(rows[:, list(wv)].T, dims)
    return flat[ri], have[ri]


# -- CP-SAT over a separable lower bound, with exact lazy evaluation ---------------------------------

import os as _os
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
    import numpy as np

    out = np.ones(len(rows), dtype=np.float64)
    for f in factors:
        vars_, nodes, values = _factor_parts(f)
        cols = [rows[:, v].astype(np.int64) for v in vars_] + [np.asarray(vals[n], dtype=np.int64) for n in nodes]
        keys = np.array(list(values.keys()), dtype=np.int64).reshape(len(values), len(cols))
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
    return tuple(vars_[j] for j in idx), frozenset(tuple(t[j] for j in idx) for t in tuples)


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


def feasible_blocks(prog: Program, master: Sequence[int]) -> "np.ndarray":
    """Every assignment of the ``master`` variables that satisfies the program's tables projected
    onto them (a relaxation: each feasible assignment of the whole program projects onto one), as
    an (R, n) array whose other columns are 0."""
    import numpy as np

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
        import numpy as np

        weighted = prog.weight is not None
        self.objs = np.zeros(0, dtype=np.float64 if weighted else np.int64)
        self.nodes = np.zeros(0, dtype=np.int64)
        self.rows = np.zeros((0, len(prog.domains)), dtype=np.int64)
        self.conv = float if weighted else int
        self.accept, self.checked, self.rejected = accept, {}, 0

    def add(self, obj, node, rows) -> None:
        import numpy as np

        self.objs = np.concatenate([self.objs, obj])
        self.nodes = np.concatenate([self.nodes, node])
        self.rows = np.concatenate([self.rows, np.asarray(rows, dtype=np.int64)])

    def top(self, k: int) -> list:
        """[(objective, node value, choice)] of the k best rows that fit, best first."""
        import numpy as np

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
    import numpy as np

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
        part = blocks[pos: pos + chunk]
        pos += len(part)
        chunk = min(chunk * 2, 1 << 14)
        rows = np.repeat(part, len(fgrid), axis=0)
        if free:
            rows[:, free] = np.tile(fgrid, (len(part), 1))
        rows = rows[table_mask(prog, rows)]
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


class _Collect(cp_model.CpSolverSolutionCallback):
    def __init__(self, xs, limit):
        super().__init__()
        self.xs, self.limit, self.rows, self.full = xs, limit, [], False

    def on_solution_callback(self):
        self.rows.append([self.Value(x) for x in self.xs])
        if len(self.rows) >= self.limit:
            self.full = True
            self.StopSearch()


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
    import numpy as np

    t0 = time.perf_counter()
    n = len(prog.domains)
    keep = list(range(n)) if master is None else sorted(set(int(v) for v in master))
    free = [v for v in range(n) if v not in set(keep)]
    m, xs, B, (blo, bhi) = _cpsat_master(prog, factors, keep)
    mx = [xs[v] for v in keep]
    cpsat = 0.0
    # every completion of a block over the free variables, as columns to tile under its rows
    fgrid = np.array(list(itertools.product(*(range(prog.domains[v]) for v in free))), dtype=np.int64)
    fgrid = fgrid.reshape(len(fgrid), len(free))

    def expand(block_rows):
        b = np.asarray(block_rows, dtype=np.int64)
        rows = np.zeros((len(b) * len(fgrid), n), dtype=np.int64)
        rows[:, keep] = np.repeat(b, len(fgrid), axis=0)
        if free:
            rows[:, free] = np.tile(fgrid, (len(b), 1))
        return rows[table_mask(prog, rows)]

    def run(model, enumerate_all=False, limit=None):
        nonlocal cpsat
        s = cp_model.CpSolver()
        s.parameters.num_workers = 1 if enumerate_all else max(1, int(workers))
        if enumerate_all:
            s.parameters.enumerate_all_solutions = True
        if time_limit is not None:
            s.parameters.max_time_in_seconds = max(0.05, time_limit - (time.perf_counter() - t0))
        cb = _Collect(mx, limit or batch) if enumerate_all else None
        t = time.perf_counter()
        st = s.Solve(model, cb) if cb is not None else s.Solve(model)
        cpsat += time.perf_counter() - t
        if _DEBUG:
            print(f"cp-sat {'enum' if enumerate_all else 'min'} {time.perf_counter() - t:.2f}s "
                  f"{s.StatusName(st)} rows={len(cb.rows) if cb else '-'}", flush=True)
        return s, st, cb

    m.Minimize(B)
    s, st, _ = run(m)
    nvars, ncons = len(m.Proto().variables), len(m.Proto().constraints)
    done = lambda status, sols, bound, **kw: BoundedResult(  # noqa: E731
        status=status, objective=sols[0].objective if sols else None, bound=bound,
        wall_s=time.perf_counter() - t0, solutions=sols, statuses=[status] * len(sols), num_vars=nvars,
        num_constraints=ncons, cpsat_s=cpsat, **kw)
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
