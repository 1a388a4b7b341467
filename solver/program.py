"""The layout integer program as plain data: decision variables, allowed/forbidden tuple tables, cost
nodes (table, sum, max, product, element, argmax), limits and the weighted objective; and its
plain-Python semantics (:func:`evaluate`, :func:`brute_force`), the oracle the engines are tested
against. ``solver.layout`` documents the whole and re-exports the public names."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence


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
