"""solver/layout.py against brute-force enumeration on small random programs.

The oracle is itertools.product over every assignment, evaluated by ``evaluate`` (plain Python,
no CP-SAT). Properties: the optimum equals the enumerated minimum and the status is OPTIMAL;
every returned assignment satisfies every constraint and has the objective the solver claims;
top-K returns the K best distinct assignments in order; an infeasible program says INFEASIBLE.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

import numpy as np

from solver.layout import (Program, brute_force, enumerate_bounded, evaluate, evaluate_many, feasible_rows, solve,
                           solve_bounded)


def node_at(prog, node: int, x) -> int:
    """The value of ``node`` at assignment ``x`` (the program's own vectorised evaluator)."""
    return int(evaluate_many(prog, np.array([x], dtype=np.int64), upto=node)[0][0])


@st.composite
def programs(draw, witness: bool = False):
    """A small random program. ``witness``: every cost is positive and one drawn assignment ``w``
    satisfies every constraint, table and limit, so the program is feasible with a positive objective
    (what the bounded searches need) and no generated case is wasted."""
    n = draw(st.integers(1, 4))
    domains = [draw(st.integers(1, 4)) for _ in range(n)]
    prog = Program(domains)
    rnd = draw(st.randoms(use_true_random=False))
    w = tuple(rnd.randrange(d) for d in domains)
    low = 1 if witness else 0

    def at_w(vs):
        return tuple(w[v] for v in vs)

    def some_vars(k_max=3):
        k = rnd.randint(1, min(k_max, n))
        return tuple(sorted(rnd.sample(range(n), k)))

    def all_tuples(vs):
        return list(itertools.product(*(range(domains[v]) for v in vs)))

    # compatibility constraints
    for _ in range(draw(st.integers(0, 2))):
        vs = some_vars()
        tuples = [t for t in all_tuples(vs) if rnd.random() < 0.75]
        if draw(st.booleans()):
            prog.allow(vs, set(tuples) | ({at_w(vs)} if witness else set()))
        else:
            prog.forbid(vs, [t for t in tuples[: len(tuples) // 3] if not (witness and t == at_w(vs))])
    # cost tables (some entries missing = infeasible)
    tables = []
    for _ in range(draw(st.integers(1, 4))):
        vs = some_vars()
        vals = {t: rnd.randint(low, 50) for t in all_tuples(vs) if rnd.random() < 0.9 or (witness and t == at_w(vs))}
        if not vals:
            vals = {all_tuples(vs)[0]: 7}
        tables.append(prog.table(vs, vals))
    # derived tables: keyed by a variable and the value of an earlier table node
    for _ in range(draw(st.integers(0, 2))):
        src = rnd.choice(tables)
        src_vals = sorted(set(prog.nodes[src].values.values()))
        v = rnd.randrange(n)
        src_w = node_at(prog, src, w)   # the source's value at w
        vals = {(a, sv): rnd.randint(low, 40) for a in range(domains[v]) for sv in src_vals
                if rnd.random() < 0.9 or (witness and (a, sv) == (w[v], src_w))}
        if vals:
            tables.append(prog.table([v], vals, nodes=[src]))
    nodes = list(tables)
    # combinators
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["sum", "max", "product"]))
        a = rnd.choice(nodes)
        b = rnd.choice(nodes)
        if kind == "sum":
            nodes.append(prog.sum([a, b], [rnd.randint(1, 3), rnd.randint(1, 3)], const=rnd.randint(0, 5)))
        elif kind == "max":
            nodes.append(prog.max([a, b]))
        else:
            nodes.append(prog.product(a, b))
    # element over a decision variable, and the first argmax of some keys with 0/1 presence flags
    if draw(st.booleans()):
        v = rnd.randrange(n)
        opts = [rnd.choice(nodes) for _ in range(rnd.randint(w[v] + 1 if witness else 1, domains[v]))]
        nodes.append(prog.element(v, opts))
    if draw(st.booleans()):
        k = rnd.randint(1, 3)
        keys = [rnd.choice(nodes) for _ in range(k)]
        pres = []
        for i in range(k):
            vs = some_vars(2)
            # witness: the first key is present at w, so the argmax is defined there
            pres.append(prog.table(vs, {t: 1 if (witness and i == 0 and t == at_w(vs)) else rnd.randint(0, 1)
                                        for t in all_tuples(vs)}))
        am = prog.argmax(keys, pres)
        vals = [rnd.choice(nodes) for _ in range(k)]
        nodes.append(prog.element(am, vals, index_is_node=True))
    obj = nodes[-1]
    if draw(st.booleans()):
        lim = rnd.choice(tables)
        bound = max(prog.nodes[lim].values.values()) - rnd.randint(0, 10)
        if witness:
            bound = max(bound, node_at(prog, lim, w))
        prog.at_most(lim, bound)
    if draw(st.booleans()):
        vs = some_vars(2)
        weights = {t: rnd.randint(1, 6) for t in all_tuples(vs)}   # complete and positive
        prog.minimize(obj, vs, weights)
    else:
        prog.minimize(obj)
    return prog


@settings(max_examples=60, deadline=None)
@given(programs(), st.integers(1, 3))
def test_optimum_and_top_k_match_brute_force(prog, top):
    res = solve(prog, top=top, workers=1)
    every = {}
    for x in itertools.product(*(range(d) for d in prog.domains)):
        v = evaluate(prog, x)
        if v is not None:
            every[x] = v
    if not every:
        assert res.status == "INFEASIBLE"
        assert res.solutions == []
        return
    best = min(every.values())
    assert res.status == "OPTIMAL"
    assert res.objective == best
    assert res.bound == pytest.approx(best)
    ranked = sorted(every.values())
    want = ranked[:top]
    got = [s.objective for s in res.solutions]
    assert got == want
    # every returned assignment is feasible, distinct, and scored as the solver says
    assert len({s.choice for s in res.solutions}) == len(res.solutions)
    for s in res.solutions:
        assert s.choice in every
        assert every[s.choice] == s.objective


def test_brute_force_helper_agrees_with_solver_on_a_hand_example():
    # two variables: a in {0,1,2}, b in {0,1}; time = t(a) * n(b) + c(a, b); (2, 1) forbidden
    prog = Program([3, 2], names=["a", "b"])
    ta = prog.table([0], {(0,): 10, (1,): 6, (2,): 4})
    nb = prog.table([1], {(0,): 3, (1,): 2})
    c = prog.table([0, 1], {(0, 0): 1, (0, 1): 1, (1, 0): 2, (1, 1): 9, (2, 0): 20})  # (2,1) missing
    prog.minimize(prog.sum([prog.product(ta, nb), c]))
    # by hand: (0,0)=31 (0,1)=21 (1,0)=20 (1,1)=21 (2,0)=32
    res = solve(prog, top=3, workers=1)
    assert res.solutions[0].choice == (1, 0) and res.objective == 20
    assert [s.objective for s in res.solutions] == [20, 21, 21]
    assert brute_force(prog) == (20, [(1, 0)])


def test_argmax_takes_the_first_largest_present_key():
    # keys 5, 9, 9, 12 with the 12 absent: the first 9 (index 1) wins; the element reads value[1]
    prog = Program([1])
    keys = [prog.const(c) for c in (5, 9, 9, 12)]
    pres = [prog.table([0], {(0,): p}) for p in (1, 1, 1, 0)]
    am = prog.argmax(keys, pres)
    vals = [prog.const(c) for c in (100, 200, 300, 400)]
    prog.minimize(prog.element(am, vals, index_is_node=True))
    res = solve(prog, workers=1)
    assert res.objective == 200


def test_weighted_objective_by_hand():
    # minimise weight(b) * node: node = t(a); weights make the larger node win
    prog = Program([2, 2])
    t = prog.table([0], {(0,): 10, (1,): 30})
    prog.allow([0, 1], [(0, 0), (1, 1)])
    prog.minimize(t, [1], {(0,): 5, (1,): 1})
    res = solve(prog, workers=1)
    assert res.solutions[0].choice == (1, 1)
    assert res.objective == 30  # 1 * 30 < 5 * 10


def test_time_limit_reports_feasible_with_bound():
    # A program too large to prove in a few milliseconds: a sum of pairwise tables over
    # many variables. With a tiny limit the solver returns its best found and a bound <= it.
    import random

    rnd = random.Random(3)
    n = 14
    prog = Program([6] * n)
    terms = []
    for i in range(n):
        for j in range(i + 1, n):
            if rnd.random() < 0.5:
                vals = {(a, b): rnd.randint(0, 1000) for a in range(6) for b in range(6)}
                terms.append(prog.table([i, j], vals))
    prog.minimize(prog.sum(terms))
    res = solve(prog, time_limit=0.05, workers=1)
    assert res.status in ("FEASIBLE", "OPTIMAL", "UNKNOWN")
    if res.status == "FEASIBLE":
        assert res.bound is not None and res.bound <= res.objective
        assert res.gap is not None and res.gap >= 0
        assert evaluate(prog, res.solutions[0].choice) == res.objective


def test_presolve_regression_one_hot_channel_with_table():
    # Found by hypothesis: OR-Tools 9.15's presolve returned 1 here when the one-hot channel was
    # linear (x == sum v*z). (2, 3) is allowed and costs 0, so the optimum is 0.
    prog = Program([3, 4])
    prog.allow((0, 1), [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3), (2, 3)])
    prog.forbid((1,), [(0,)])
    prog.minimize(prog.table((0,), {(0,): 1, (2,): 0}))
    res = solve(prog, workers=1)
    assert res.objective == 0 and res.solutions[0].choice == (2, 3)


@settings(max_examples=40, deadline=None)
@given(programs(), st.integers(1, 3), st.data())
def test_lazy_constraints_by_callback_match_brute_force(prog, top, data):
    # A hidden set of "does not fit" assignments, checked only by the callback; the callback cuts
    # every assignment agreeing on a random subset of variables when that whole family is hidden.
    n = len(prog.domains)
    every = list(itertools.product(*(range(d) for d in prog.domains)))
    hidden = {x for x in every if data.draw(st.booleans(), label=f"hide{x}")} if len(every) <= 64 else set()
    cut_vars = tuple(range(n))

    def accept(choice):
        return cut_vars if choice in hidden else None

    res = solve(prog, top=top, workers=1, accept=accept)
    good = {x: evaluate(prog, x) for x in every if x not in hidden}
    good = {x: v for x, v in good.items() if v is not None}
    if not good:
        assert res.solutions == []
        return
    assert res.status == "OPTIMAL"
    assert [s.objective for s in res.solutions] == sorted(good.values())[:top]
    assert all(s.choice not in hidden for s in res.solutions)


@settings(max_examples=60, deadline=None)
@given(programs())
def test_vectorised_evaluation_equals_plain_evaluation(prog):
    rows = feasible_rows(prog)
    obj, ok, _ = evaluate_many(prog, rows) if len(rows) else (np.zeros(0), np.zeros(0, bool), [])
    got = {tuple(int(a) for a in r): int(o) for r, o, k in zip(rows, obj, ok) if k}
    want = {}
    for x in itertools.product(*(range(d) for d in prog.domains)):
        v = evaluate(prog, x)
        if v is not None:
            want[x] = v
    assert got == want


def _projection_factors(prog, every, rnd):
    """A valid separable bound built from the brute force: f_a(x_a) = sqrt(min obj | x_a) and
    f_b(x_b) = sqrt(min obj | x_b) multiply to at most obj(x) (both mins are <= obj(x))."""
    n = len(prog.domains)
    a, b = rnd.randrange(n), rnd.randrange(n)
    if a == b:
        groups = [((a,), 1.0)]
    else:
        groups = [((a,), 0.5), ((b,), 0.5)]
    factors = []
    for vars_, p in groups:
        mins = {}
        for x, v in every.items():
            k = tuple(x[i] for i in vars_)
            mins[k] = min(mins.get(k, v), v)
        factors.append((vars_, {k: float(v) ** p for k, v in mins.items()}))
    return factors


def _bounded_case(prog, data):
    """(every feasible assignment -> objective by brute force, hidden "does not fit" set, separable
    factors, master variables) for the bounded searches. The
    master decides the factors' variables and a random subset of the others; the rest are free,
    expanded block by block and checked against every table by numpy."""
    every = {}
    for x in itertools.product(*(range(d) for d in prog.domains)):
        v = evaluate(prog, x)
        if v is not None:
            every[x] = v
    # programs(witness=True) makes w feasible and every cost positive: the separable bound applies
    assert every and min(every.values()) > 0, "programs(witness=True) drew a program the bound cannot take"
    rnd = data.draw(st.randoms(use_true_random=False))
    hidden = {x for x in every if rnd.random() < 0.3}   # "does not fit": seen only by accept
    factors = _projection_factors(prog, every, rnd)
    read = {v for vars_, _ in factors for v in vars_}
    master = sorted(read | {v for v in range(len(prog.domains)) if rnd.random() < 0.5})
    return every, hidden, factors, master


def _assert_top_k_of_brute_force(res, every, hidden, top):
    good = {x: v for x, v in every.items() if x not in hidden}
    if not good:
        assert res.solutions == [] and res.status == "INFEASIBLE"
        return
    assert res.status == "OPTIMAL"
    assert [s.objective for s in res.solutions] == sorted(good.values())[:top]
    for s in res.solutions:
        assert s.choice in good and good[s.choice] == s.objective
    assert res.bound == pytest.approx(min(good.values()))


@settings(max_examples=50, deadline=None)
@given(programs(witness=True), st.integers(1, 3), st.data())
def test_bounded_cp_sat_with_lazy_evaluation_matches_brute_force(prog, top, data):
    every, hidden, factors, master = _bounded_case(prog, data)
    res = solve_bounded(prog, factors, top=top, workers=1, master=master,
                        accept=lambda ch: list(range(len(prog.domains))) if ch in hidden else None)
    _assert_top_k_of_brute_force(res, every, hidden, top)
    assert 1 <= res.evaluated <= len(feasible_rows(prog))   # disjoint bands: nothing twice


@settings(max_examples=50, deadline=None)
@given(programs(witness=True), st.integers(1, 3), st.data())
def test_numpy_block_search_matches_brute_force(prog, top, data):
    # enumerate_bounded (the default engine): the same bound and blocks as the CP-SAT search,
    # blocks enumerated by numpy; optimum and top-K equal brute force under a hidden memory rule
    every, hidden, factors, master = _bounded_case(prog, data)
    # chunk=1: blocks one by one at first, so the stopping rule is what ends the search
    res = enumerate_bounded(prog, factors, master, top=top, chunk=1,
                            accept=lambda ch: [0] if ch in hidden else None)
    _assert_top_k_of_brute_force(res, every, hidden, top)


def test_bounded_search_evaluates_only_layouts_below_the_incumbent():
    # x in 0..9, objective 100 + x; factor f(x) = objective: after the first band only x = 0 (and
    # the bound proves every other x worse), so few of the 10 assignments are evaluated exactly.
    prog = Program([10, 5])
    t = prog.table([0, 1], {(i, j): 100 + 10 * i + j for i in range(10) for j in range(5)})
    prog.minimize(t)
    factors = [((0,), {(i,): 100.0 + 10 * i for i in range(10)})]
    res = solve_bounded(prog, factors, top=2, workers=1)
    assert res.status == "OPTIMAL"
    assert [s.choice for s in res.solutions] == [(0, 0), (0, 1)]
    assert res.evaluated == 5          # only x0 = 0 has a bound below the 2nd best exact value
    assert res.min_bound == pytest.approx(100.0, rel=2e-3)


@settings(max_examples=80, deadline=None)
@given(programs())
def test_the_limit_prefilter_drops_only_rows_the_evaluation_rejects(prog):
    """solver.numpy_engine.limit_mask (the bounded search checks the limits on their few input nodes
    before evaluating a chunk): it keeps every row the full evaluation accepts, and drops only rows
    that break a limit, which the plain-Python oracle refuses."""
    from solver.numpy_engine import limit_mask

    rows = feasible_rows(prog)
    if not len(rows):
        return
    _, ok, _ = evaluate_many(prog, rows)
    keep = limit_mask(prog, rows)
    assert not (ok & ~keep).any()
    for r in rows[~keep]:
        assert evaluate(prog, tuple(int(a) for a in r)) is None
    if prog.limits:
        (node, bound), = prog.limits
        _, _, vals = evaluate_many(prog, rows)
        assert np.array_equal(keep[ok], (vals[node] <= bound)[ok])
