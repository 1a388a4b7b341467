"""The numpy engine: every assignment the allow/forbid tables admit (:func:`feasible_rows`), and the
program's nodes evaluated for many assignments at once (:func:`evaluate_many`, :func:`weights_of`,
:func:`table_mask`); exhaustive, so optimal by construction."""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from solver.program import Program


# -- exhaustive evaluation (vectorised) ------------------------------------------------------------

def _tuple_table(prog: Program, vars_, tuples) -> "np.ndarray":
    """Dense boolean table over ``vars_``'s domains, True at each of ``tuples`` (built once per
    tuple set and kept on the program)."""
    cache = prog.__dict__.setdefault("_tuple_tables", {})
    hit = cache.get(id(tuples))
    if hit is not None and hit[0] is tuples:
        return hit[1]
    dims = [prog.domains[u] for u in vars_]
    tab = np.zeros(int(np.prod(dims)), dtype=bool)
    if tuples:
        tarr = key_array(tuples, len(vars_))
        tab[np.ravel_multi_index(tarr.T, dims)] = True
    cache[id(tuples)] = (tuples, tab)
    return tab


def table_mask(prog: Program, rows) -> "np.ndarray":
    """Rows (R, n) that satisfy every allow/forbid table of ``prog`` (table nodes are checked by
    :func:`evaluate_many`)."""
    ok = np.ones(len(rows), dtype=bool)
    for checks, allowed in ((prog.allowed, True), (prog.forbidden, False)):
        for vars_, tuples in checks:
            if not vars_:
                continue
            tab = _tuple_table(prog, vars_, tuples)
            hit = tab[np.ravel_multi_index(rows[:, list(vars_)].T, [prog.domains[u] for u in vars_])]
            ok &= hit if allowed else ~hit
    return ok


def feasible_rows(prog: Program, order: Sequence[int] | None = None, chunk_limit: int = 50_000_000) -> "np.ndarray":
    """Every assignment that satisfies the allow/forbid tables and has an entry in every table
    node keyed by decision variables only, as an (R, n) int array. A vectorised join: variables
    are added in ``order`` and each table is applied as soon as all its variables are set."""
    n = len(prog.domains)
    order = list(range(n)) if order is None else list(order)
    checks = [(v, t, True) for v, t in prog.allowed] + [(v, t, False) for v, t in prog.forbidden]
    checks += [(nd.vars, nd.values, True) for nd in prog.nodes if nd.kind == "table" and not nd.keys]  # keys: the tuples
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
            mask_tab = _tuple_table(prog, vars_, tuples)
            idx = np.ravel_multi_index(rows[:, list(vars_)].T, dims)
            keep = mask_tab[idx] if allowed else ~mask_tab[idx]
            rows = rows[keep]
        if len(rows) > chunk_limit:
            raise MemoryError(f"{len(rows)} partial assignments after {step + 1} variables")
    return rows


def key_array(table, width: int) -> "np.ndarray":
    """The keys of ``table`` (tuples of ``width`` integers), in its order, as an (n, width) int64 array
    (one flat pass: several times faster than ``np.array`` of a list of tuples)."""
    flat = np.fromiter(itertools.chain.from_iterable(table), dtype=np.int64, count=len(table) * width)
    return flat.reshape(len(table), width)


def _compiled_table(prog: Program, ni: int, nd) -> tuple:
    """(dims, sorted values of each key node, dense values, defined mask) of table node ``ni``: the
    lookup arrays :func:`evaluate_many` indexes, built once per node and kept on the program (a
    search evaluates the same program chunk by chunk)."""
    cache = prog.__dict__.setdefault("_compiled_tables", {})
    hit = cache.get(ni)
    if hit is not None and hit[0] is nd and hit[1] == len(nd.values):
        return hit[2]
    width = len(nd.vars) + len(nd.keys)
    karr = key_array(nd.values, width)
    dims = [prog.domains[v] for v in nd.vars]
    kidx = [karr[:, j] for j in range(len(nd.vars))]
    uniqs = []
    for j in range(len(nd.keys)):
        col = karr[:, len(nd.vars) + j]
        uniq = np.unique(col)
        uniqs.append(uniq)
        dims.append(len(uniq))
        kidx.append(np.searchsorted(uniq, col))
    flat = np.zeros(int(np.prod(dims)), dtype=np.int64)
    have = np.zeros(int(np.prod(dims)), dtype=bool)
    fi = np.ravel_multi_index(kidx, dims)
    flat[fi] = np.fromiter(nd.values.values(), dtype=np.int64, count=len(nd.values))
    have[fi] = True
    cache[ni] = (nd, len(nd.values), (dims, uniqs, flat, have))
    return dims, uniqs, flat, have


def ancestors(prog: Program, targets) -> set[int]:
    """The nodes ``targets`` are computed from, themselves included (kept on the program)."""
    key = (tuple(targets), len(prog.nodes))
    cache = prog.__dict__.setdefault("_ancestors", {})
    if key not in cache:
        seen: set[int] = set()
        stack = list(targets)
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(prog.nodes[n].keys)
                stack.extend(prog.nodes[n].args)
        cache[key] = seen
    return cache[key]


def limit_mask(prog: Program, rows) -> "np.ndarray":
    """Rows whose limits hold (and whose tables among the limits' inputs have an entry), computing
    only the nodes the limits read: a row it drops is one :func:`evaluate_many` marks infeasible."""
    if not prog.limits or not len(rows):
        return np.ones(len(rows), dtype=bool)
    nodes = ancestors(prog, [n for n, _ in prog.limits])
    _, ok, out = evaluate_many(prog, rows, upto=max(nodes), only=nodes)
    for n, b in prog.limits:
        ok &= out[n] <= b
    return ok


def evaluate_many(prog: Program, rows, upto: int | None = None,
                  only: set | None = None) -> tuple["np.ndarray", "np.ndarray", list]:
    """(objective, feasible mask, node values) for every row of ``rows`` (R, n): the vectorised
    twin of :func:`evaluate`. Infeasible rows get objective 0 and mask False.

    ``upto``: evaluate only nodes ``0..upto`` (nodes are in creation order, so a node's inputs come
    before it) and return that node's values as the objective, unweighted and without limits; the
    mask then covers only the tables met so far (a partial check, for lower bounds). ``only``: compute
    just these nodes (with ``upto``; the others are None), e.g. the :func:`ancestors` of a node."""
    R = len(rows)
    ok = np.ones(R, dtype=bool)
    out: list = []
    for ni, nd in enumerate(prog.nodes):
        if upto is not None and ni > upto:
            break
        if only is not None and ni not in only:
            out.append(None)
            continue
        if nd.kind == "table":
            dims, uniqs, flat, have = _compiled_table(prog, ni, nd)
            cols = [rows[:, v] for v in nd.vars]
            for uniq, src in zip(uniqs, nd.keys):
                val = out[src]
                pos = np.minimum(np.searchsorted(uniq, val), len(uniq) - 1)   # searchsorted is >= 0
                ok &= uniq[pos] == val
                cols.append(pos)
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
    R = len(rows)
    if prog.weight is None:
        return np.ones(R, dtype=np.int64), np.ones(R, dtype=bool)
    wv, table = prog.weight
    dims = [prog.domains[v] for v in wv]
    flat = np.zeros(int(np.prod(dims)), dtype=np.int64)
    have = np.zeros(int(np.prod(dims)), dtype=bool)
    karr = key_array(table, len(wv))
    fi = np.ravel_multi_index(karr.T, dims)
    flat[fi] = np.fromiter(table.values(), dtype=np.int64, count=len(table))
    have[fi] = True
    ri = np.ravel_multi_index(rows[:, list(wv)].T, dims)
    return flat[ri], have[ri]
