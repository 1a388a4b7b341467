"""planner/search/plan.py ``_acceptor``: running the cached dispatcher checks before the exact memory peak
(``cheap_first``, every search but "cp-sat-full") changes nothing a search or a refusal reads. Oracle:
the acceptor in the order it had before (memory first), replayed on the layouts a real plan checked."""

from __future__ import annotations

import planner.search.plan as PL
from planner.config import Training
from planner.model.spec import load_model
from planner.search.plan import _acceptor, plan, program_for
from topologies.loader import load_cluster


def test_cheap_checks_first_accept_the_same_and_refuse_with_the_same_shortfalls(monkeypatch):
    # DeepSeek-V3 on two GB300 racks: HybridEP's placement rule refuses some of the layouts it checks
    model, cluster = load_model("deepseek-v3"), load_cluster("gb300-nvl72", gpus=144)
    training = Training(seq_len=4096, global_batch=1024, precision="mxfp8")
    checked: list[tuple] = []
    real = PL._acceptor

    def recording(*args, **kwargs):
        accept, shortfalls = real(*args, **kwargs)
        return (lambda choice: checked.append(choice) or accept(choice)), shortfalls

    monkeypatch.setattr(PL, "_acceptor", recording)
    plan(model, cluster, training)
    monkeypatch.undo()
    req, b = program_for(model, cluster, training)
    fast, fast_short = _acceptor(b, model, req.cluster, req.training, req.profile, req.equal_slices, cheap_first=True)
    slow, slow_short = _acceptor(b, model, req.cluster, req.training, req.profile, req.equal_slices, cheap_first=False)
    assert [fast(c) is None for c in checked] == [slow(c) is None for c in checked]
    assert fast_short.deferred, "no layout was refused by a dispatcher check: the case tests nothing"
    assert len(fast_short.items) < len(slow_short.items)   # memory not priced for those (yet)
    assert sorted(fast_short.all()) == sorted(slow_short.items) and not fast_short.deferred
