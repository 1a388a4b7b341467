"""One composition: the solver's program (planner/search/program.py) tabulates the functions that
``predict``'s step time composes (planner/cost/steptime.py and its terms), so a cost change made once, in
planner.cost, reaches both. Each test changes a cost constant that only planner.cost reads, plans, and
checks (1) that the change moves the predicted figures (the control: undoing it gives another step time)
and (2) that the program still equals ``predict`` on every returned plan.
"""

from __future__ import annotations

import pytest

import planner.cost.steptime as steptime
import planner.cost.terms.data_parallel as data_parallel
import planner.cost.terms.host as host
import planner.cost.terms.optimizer as optimizer
from planner.config import Training
from planner.cost.predict import predict
from planner.model.spec import load_model
from planner.search.plan import plan
from topologies.loader import load_cluster

CASES = {
    # a dense model with full recompute at TP > 1 and FSDP: the recomputed TP collectives, FSDP's
    # gathers per micro-batch and the optimizer step
    "dense": ("llama3-70b", "dgx-h100", 16, 64, "bf16",
              {"recompute": ["full"], "tp": [4, 8], "fsdp": [True]},
              [(steptime, "RECOMPUTE_COMM", 2.5), (data_parallel, "FSDP_GATHERS", 3),
               (optimizer, "ADAM_BYTES_PER_PARAM", 300.0)]),
    # a MoE model with many local experts: the host floor (CUDA graphs do not capture the experts)
    "moe": ("qwen3-30b-a3b", "dgx-h100", 8, 64, "bf16", {"ep": [2, 4]},
            [(host, "CALLS_PER_EXPERT", 200)]),
    # selective recompute of the MoE block repeats the all-to-all; full recompute at TP 2 the TP
    # collectives: the all-to-all table is keyed by recompute only when the repeat differs
    "moe-recompute": ("qwen3-30b-a3b", "dgx-h100", 8, 64, "bf16",
                      {"recompute": ["full", "moe"], "ep": [2, 4], "tp": [2]},
                      [(steptime, "RECOMPUTE_COMM", 2.5)]),
}
# kept during the control too: the host floor off, so that the all-to-all is on the critical path
SETTINGS = {"moe-recompute": [(host, "CALLS_PER_EXPERT", 0)]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cost_change_made_once_reaches_the_program(monkeypatch, case):
    model_name, preset, gpus, gbs, precision, restrict, patches = CASES[case]
    model, cluster = load_model(model_name), load_cluster(preset, gpus=gpus)
    training = Training(seq_len=4096, global_batch=gbs, precision=precision, stack="megatron-26.08")
    for module, name, value in SETTINGS.get(case, []) + patches:
        assert getattr(module, name) != value
        monkeypatch.setattr(module, name, value)
    res = plan(model, cluster, training, top=3, restrict=restrict, include={"recompute": restrict.get("recompute", [])})
    assert res.plans
    if "recompute" in restrict:
        assert {e.config.recompute for e in res.plans} <= set(restrict["recompute"])
    for e in res.plans:
        assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6), e.label
    assert res.solver["program_vs_predict_max_rel_err"] < 1e-6
    # the control: without the change the same layout has another step time
    best = res.plans[0]
    monkeypatch.undo()
    for module, name, value in SETTINGS.get(case, []):
        monkeypatch.setattr(module, name, value)
    tr = training.model_copy(update={"global_batch": best.gbs})
    before = predict(model, cluster, best.config, tr, placement=best.placement)
    assert abs(before.step_time_s - best.prediction.step_time_s) > 1e-3 * best.prediction.step_time_s
