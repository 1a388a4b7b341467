"""The ops of ``planner.cost.compose`` on the nodes of a ``solver.layout`` Program.

A value is a ``Val``: a node of the program and its unit, ``1/den`` nanoseconds (or ``1/den`` of a
count: the bubble and the micro-batches are tabulated in 1/840, ``planner.search.program.BUBBLE``, so
that every entry is an integer). ``add`` brings its arguments to a common unit with integer weights,
``mul`` multiplies the units, so the composition needs no unit of its own. Python numbers are
constants (``add``) or integer factors (``mul``, ``lin``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Val:
    node: int
    den: int = 1


class NodeOps:
    """``compose``'s ops building nodes of ``prog``; constants are rounded to the unit."""

    def __init__(self, prog):
        self.prog = prog
        self.zero = Val(prog.const(0))

    def _sum(self, pairs, const: float = 0.0) -> Val:
        """sum w * v over (w, Val) pairs plus ``const`` nanoseconds, in the common unit."""
        den = math.lcm(*(v.den for _, v in pairs)) if pairs else 1
        nodes = [v.node for _, v in pairs]
        weights = [int(w) * (den // v.den) for w, v in pairs]
        c = int(round(const * den))
        if len(nodes) == 1 and weights == [1] and c == 0:
            return pairs[0][1]
        return Val(self.prog.sum(nodes, weights, const=c), den)

    def add(self, *xs) -> Val:
        return self._sum([(1, x) for x in xs if isinstance(x, Val)], sum(x for x in xs if not isinstance(x, Val)))

    def sub(self, a: Val, b: Val) -> Val:
        return self._sum([(1, a), (-1, b)])

    def lin(self, pairs) -> Val:
        return self._sum(list(pairs))

    def mul(self, a, b) -> Val:
        if not isinstance(a, Val):
            return self._sum([(a, b)])
        if not isinstance(b, Val):
            return self._sum([(b, a)])
        return Val(self.prog.product(a.node, b.node), a.den * b.den)

    def max(self, *xs: Val) -> Val:
        den = math.lcm(*(x.den for x in xs if x is not self.zero))
        # a value in another unit is rescaled to the common one (den // x.den times its node)
        nodes = [x.node if x is self.zero or x.den == den else self.prog.sum([x.node], [den // x.den]) for x in xs]
        return Val(self.prog.max(nodes), den)

    def argmax(self, xs, present) -> int:
        """The index node (a count, not a time) of the first largest present value."""
        assert len({x.den for x in xs}) == 1
        return self.prog.argmax([x.node for x in xs], [p.node for p in present])

    def pick(self, i, xs) -> Val:
        """``xs[i]``, ``i`` an index node (``argmax``) or a decision variable (``Var``)."""
        assert len({x.den for x in xs}) == 1
        if isinstance(i, Var):
            return Val(self.prog.element(i.index, [x.node for x in xs]), xs[0].den)
        return Val(self.prog.element(i, [x.node for x in xs], index_is_node=True), xs[0].den)


@dataclass(frozen=True)
class Var:
    """A decision variable used as an index (``NodeOps.pick``)."""

    index: int
