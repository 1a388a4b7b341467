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

Ways to search: :func:`solve` (OR-Tools CP-SAT, with lazy constraints through a callback;
``solver.cpsat``), :func:`feasible_rows` + :func:`evaluate_many` (every assignment the allow/forbid
tables admit, evaluated with numpy; exhaustive, so optimal by construction; ``solver.numpy_engine``),
and the bounded search over blocks in order of a separable lower bound (:func:`enumerate_bounded`,
:func:`solve_bounded`; ``solver.bounded``), which ``planner.search.plan`` uses by default: on the full
layout space CP-SAT alone did not find a first solution within a minute (docs/solver.md).
"""

from __future__ import annotations

# One module each (docs/solver.md): the program and its plain-Python semantics (solver.program), the
# CP-SAT engine (solver.cpsat), the numpy engine (solver.numpy_engine) and the bounded search
# (solver.bounded, its CP-SAT twin solver.bounded_cpsat). This module keeps the public names that
# callers and tests import from here. The CP-SAT ones load on first use (module ``__getattr__``):
# OR-Tools takes about 0.4 s to import (it loads pandas), and the default search never runs it.
from solver.program import LayoutResult, Program, Solution, brute_force, evaluate
from solver.numpy_engine import evaluate_many, feasible_rows, key_array, table_mask, weights_of
from solver.bounded import LOG_SCALE, BoundedResult, bound_many, enumerate_bounded, feasible_blocks

_CPSAT_NAMES = ("solve", "scale_to_int", "solve_bounded")


def __getattr__(name: str):
    """``solve``, ``scale_to_int`` and ``solve_bounded``, imported when first asked for."""
    if name in ("solve", "scale_to_int"):
        from solver import cpsat
        return getattr(cpsat, name)
    if name == "solve_bounded":
        from solver import bounded_cpsat
        return bounded_cpsat.solve_bounded
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Program", "Solution", "LayoutResult", "brute_force", "evaluate", "solve", "scale_to_int",
           "evaluate_many", "feasible_rows", "key_array", "table_mask", "weights_of", "LOG_SCALE", "BoundedResult",
           "bound_many", "enumerate_bounded", "feasible_blocks", "solve_bounded"]
