"""One composition: the solver's program (planner/search/program.py) tabulates the functions that
``predict``'s step time composes (planner/cost/steptime.py and its terms), so a cost change made once, in
planner.cost, reaches both. Each test changes a cost constant that only planner.cost reads, plans, and
checks (1) that the change moves the predicted figures (the control: undoing it gives another step time)
and (2) that the program still equals ``predict`` on every returned plan.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import planner.cost.steptime as steptime
import planner.cost.terms.cpu_optimizer as cpu_optimizer
import planner.cost.terms.data_parallel as data_parallel
import planner.cost.terms.host as host
import planner.cost.terms.optimizer as optimizer
from planner.config import Training
from planner.cost.placement import make_placement
from planner.cost.predict import predict
from planner.errors import InfeasibleError, InputError
from planner.model.spec import load_model
from planner.search.plan import plan, program_for
from planner.search.program import quantisation_bound, step_seconds
from solver.layout import evaluate_many, feasible_rows
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
    # Megatron's optimizer CPU offload: the host's Adam step (a compose.EXTRA_TERMS term over the world size)
    "optimizer-offload": ("llama3-70b", "dgx-h100", 8, 64, "bf16", {"tp": [4, 8]},
                          [(cpu_optimizer, "CPU_ADAM_PARAMS_PER_S", 0.1e9)]),
}
RECIPES = {"optimizer-offload": {"optimizer_offload_fraction": 0.75}}
# kept during the control too: the host floor off, so that the all-to-all is on the critical path
SETTINGS = {"moe-recompute": [(host, "CALLS_PER_EXPERT", 0)]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cost_change_made_once_reaches_the_program(monkeypatch, case):
    model_name, preset, gpus, gbs, precision, restrict, patches = CASES[case]
    model, cluster = load_model(model_name), load_cluster(preset, gpus=gpus)
    training = Training(seq_len=4096, global_batch=gbs, precision=precision, stack="megatron-26.08",
                        recipe=RECIPES.get(case, {}))
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


# --- the program is predict at every layout (hypothesis) ------------------------------------------
# planner.cost.compose is run twice: on numbers by step_time (predict) and on the program's nodes by
# ProgramBuilder. At any layout of the declared space, the program's step must be predict's step up to
# the rounding of its table entries (planner.search.program.quantisation_bound), over random models,
# clusters, precisions, trainers and layouts.

MODELS = ["llama3-8b", "qwen3-30b-a3b", "gpt-oss-20b", "mixtral-8x7b", "deepseek-v3", "llama4-scout", "glm-4.5-air"]
CLUSTERS = [("dgx-h100", 8), ("dgx-h100", 16), ("dgx-b200", 32), ("gb200-nvl72", 36), ("gb200-nvl72", 144),
            ("gb300-nvl72", 72), ("aws-p5", 32), ("gcp-a4x", 144)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), where=st.sampled_from(CLUSTERS),
       precision=st.sampled_from(["bf16", "fp8", "mxfp8"]), trainer=st.sampled_from(["megatron", "torchtitan"]),
       gbs=st.sampled_from([64, 256, 1024]), seq=st.sampled_from([2048, 4096]), objective=st.sampled_from(
           ["throughput", "robust"]), pick=st.lists(st.integers(0, 10 ** 9), min_size=4, max_size=4),
       offload=st.sampled_from([None, 0.5]))
def test_the_program_is_predict_at_every_layout(model, where, precision, trainer, gbs, seq, objective, pick, offload):
    preset, gpus = where
    cluster = load_cluster(preset, gpus=gpus)
    if precision == "mxfp8" and cluster.gpu_spec.arch == "hopper":
        precision = "fp8"
    m = load_model(model)
    training = Training(seq_len=seq, global_batch=gbs, precision=precision, trainer=trainer,
                        recipe={"optimizer_offload_fraction": offload if trainer == "megatron" else None})
    try:
        req, b = program_for(m, cluster, training, objective, restrict={"mbs": [1, 2]})
    except (InfeasibleError, InputError):   # nothing of this model fits the space: no layout to compare
        return
    rows = feasible_rows(b.prog)
    if not len(rows):
        return
    chosen = rows[[p % len(rows) for p in pick]]
    _, ok, vals = evaluate_many(b.prog, chosen)
    for row, good, value in zip(chosen, ok, vals[b.total]):
        if not good:
            continue
        choice = tuple(int(x) for x in row)
        cfg, world, g, gpd, _ = b.config_of(choice)
        tr = req.training.model_copy(update={"global_batch": g})
        try:
            pred = predict(m, req.cluster, cfg, tr, placement=make_placement(req.cluster, cfg, world, gpus_per_domain=gpd),
                           profile=req.profile)
        except InputError:   # a layout plan's lazy checks cut (DeepEP across EFA): predict refuses it
            continue
        prog_s = step_seconds(int(value), world=world)
        bound = quantisation_bound(m, cfg, g, world, b.par("pp.overlap"), pred.breakdown["pp_p2p"])
        assert abs(prog_s - pred.step_time_s) <= bound + 1e-9 * pred.step_time_s, (cfg.short(), prog_s, pred.step_time_s)


def test_a_program_that_drifts_from_predict_is_refused(monkeypatch):
    """The control of the hard check: a program whose total is off by more than rounding (one term
    priced 1 ms dearer by the program alone) makes ``plan`` refuse, naming both step times."""
    import planner.search.program as program

    real = program.ProgramBuilder._extra_terms

    def drift(self):
        return real(self) + [self.prog.table_t(self.idx("tp"), {(i,): 10 ** 6 for i in range(len(self.vals["tp"]))})]

    monkeypatch.setattr(program.ProgramBuilder, "_extra_terms", drift)
    with pytest.raises(RuntimeError, match="more than rounding apart"):
        plan(load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8),
             Training(seq_len=4096, global_batch=32, precision="bf16"), top=1)


def test_a_new_step_term_is_written_once(monkeypatch):
    """A term registered in ``compose.EXTRA_TERMS`` alone (no other code) reaches predict's step and
    breakdown and the solver's program: the plan's program step still equals predict's (the hard
    check), and each plan's step grows by the term's value at its layout, computed here by hand."""
    import math

    import planner.cost.compose as compose
    from planner.cost.terms.sync import sync_factor

    model, cluster = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100", gpus=16)
    training = Training(seq_len=4096, global_batch=64, precision="bf16")
    restrict = {"ep": [2, 4, 8], "mbs": [1, 2]}
    before = plan(model, cluster, training, top=3, restrict=restrict)

    def jitter(ctx, v):   # a synchronisation jitter growing with the ranks and the pipeline stages
        return 2e-3 * math.log2(v["world"]) * v["pp"] * (2 if v["recompute"] == "full" else 1)

    monkeypatch.setattr(compose, "EXTRA_TERMS", [compose.StepTerm("other", ("world", "pp", "recompute"), jitter)])
    after = plan(model, cluster, training, top=3, restrict=restrict)
    for e in after.plans:
        assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)
        tr = training.model_copy(update={"global_batch": e.gbs})
        monkeypatch.setattr(compose, "EXTRA_TERMS", [])
        plain = predict(model, cluster, e.config, tr, placement=e.placement)
        monkeypatch.undo()
        monkeypatch.setattr(compose, "EXTRA_TERMS", [compose.StepTerm("other", ("world", "pp", "recompute"), jitter)])
        added = 2e-3 * math.log2(e.world) * e.config.pp * (2 if e.config.recompute == "full" else 1)
        # the step grows by the term and the slowest-GPU wait's share of it (terms/sync.py)
        assert e.prediction.step_time_s - plain.step_time_s == pytest.approx(added * (1 + sync_factor(e.world)), rel=1e-9)
        assert e.prediction.breakdown["other"] - plain.breakdown["other"] == pytest.approx(added, rel=1e-9)
    # the control: the term moved the answer
    assert after.plans[0].prediction.step_time_s != pytest.approx(before.plans[0].prediction.step_time_s, rel=1e-4)


# --- rank-order strides, derived once ----------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 3, 4]),
       dp=st.sampled_from([1, 2, 4, 6, 8]), ep=st.sampled_from([1, 2, 4, 8, 16]), etp=st.sampled_from([None, 1, 2]))
def test_strides_are_megatrons_groups_and_the_program_reads_them(tp, cp, pp, dp, ep, etp):
    """``placement.axis_strides`` gives Megatron's groups (``rank_groups``, the RankGenerator
    re-implementation, is the oracle), and the solver's shape tables, which see only each axis's
    ``AXIS_VARS``, get the same (stride, size) as the whole layout."""
    from planner.config import ParallelConfig
    from planner.cost.placement import axis_parts, rank_groups
    from planner.search.program import AXIS_VARS, _strides_at

    world = tp * cp * pp * dp
    cfg = ParallelConfig(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)
    if world % (cfg.etp_eff * ep * pp):
        return
    for axis in ("tp", "cp", "dp", "pp", "ep", "etp", "edp", "dp-cp"):
        offsets = [0]
        for stride, size in axis_parts(cfg, world, axis):
            offsets = [o + k * stride for o in offsets for k in range(size)]
        groups = sorted(sorted(r + o for o in offsets) for r in range(world)
                        if all((r // s) % n == 0 for s, n in axis_parts(cfg, world, axis)))
        assert groups == sorted(sorted(g) for g in rank_groups(cfg, world, axis)), axis
    a = dict(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp)
    for axis, names in AXIS_VARS.items():
        seen = _strides_at(axis, {n: a[n] for n in names}, world, [pp])
        assert seen == axis_parts(cfg, world, "dp-cp" if axis == "dp" else axis)[0], axis
