"""Random full layouts of a search space, for tests that hold the rule tables to ``rules.violations``.

``drawn_layouts(space, training, data, n)`` draws ``n`` layouts with hypothesis' ``data`` strategy and
yields those that pass the structural checks as ``(idx, cfg, world, training)``: the value index of
every variable, the ParallelConfig, the world size, and the training at the layout's global batch.
``allowed(tables, idx)`` says whether every rule table admits the layout.
"""

from __future__ import annotations

from hypothesis import strategies as st

from planner.search.space import VARIABLES, config_of, structural_ok


def drawn_layouts(space, training, data, n: int):
    for _ in range(n):
        idx = {v: data.draw(st.integers(0, len(space.values[v]) - 1)) for v in VARIABLES}
        a = {v: space.values[v][i] for v, i in idx.items()}
        if not structural_ok(space, a):
            continue
        cfg, world, g, _ = config_of(space, a)
        yield idx, cfg, world, training.model_copy(update={"global_batch": g})


def allowed(tables, idx) -> bool:
    return all(tuple(idx[v] for v in vars_) in set(ok) for vars_, ok in tables)
