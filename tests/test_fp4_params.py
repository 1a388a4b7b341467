"""NVFP4 parameters (``Recipe.fp4_param_gather``, Megatron ``--fp4-param-gather``): the auto value NVIDIA's
Megatron-Bridge NVFP4 precision config runs (bf16_with_nvfp4_mixed, fp4_param_gather=True), megatron-core
0.19.2's check as a rule, the BF16 weights the memory estimate drops (by hand), the packed 4-bit parameter
all-gather of the step time, the emitted and read-back flag, the CSV column, Megatron-Bridge's refusal of a
value its named recipe overrides, and megatron-core's own parser on the emitted arguments
(tests/trainers/megatron_check.py).
"""

from __future__ import annotations

import csv

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.config import ParallelConfig, Recipe, Training
from planner.cost.memory import GIB, WEIGHT_COPY_BYTES, memory_per_gpu
from planner.cost.predict import predict
from planner.cost.profiles import CALIBRATION_CSV
from planner.cost.terms import data_parallel as DP
from planner.calibration.validate import predict_case, row_case
from planner.errors import InputError
from planner.model.spec import load_model
from planner.output.emit import load_context
from planner.trainers.megatron.emit import megatron_args
from planner.rules import effective_recipe, violations
from planner.trainers.megatron.rules import fp4_param_gather_on, fp8_param_gather_on
from planner.search.plan import plan
from roundtrip_check import assert_round_trip
from topologies.loader import load_cluster

CALIBRATION = str(CALIBRATION_CSV)
GATHER = "--fp4-param-gather"
# megatron-core 0.19.2 words (file:line): megatron/training/arguments.py:1069-1070
MCORE_WORDS = "--fp4-param-gather must be used together with --fp4-format"
# Megatron-Bridge v0.4.2 mixed_precision.py: bf16_with_nvfp4_mixed sets fp4_param_gather=True (:422); the others
# keep bf16_mixed's default False (:66)
BRIDGE = {"bf16": False, "fp8": False, "fp8-block": False, "mxfp8": False, "nvfp4": True}


def _row(rid):
    return next(r for r in csv.DictReader(open(CALIBRATION)) if r["id"] == rid)


# ---------------------------------------------------------------------------------------------- rules

@settings(max_examples=80, deadline=None)
@given(prec=st.sampled_from(sorted(BRIDGE)), fsdp=st.booleans(), impl=st.sampled_from(["megatron", "torch"]),
       value=st.sampled_from([None, True, False]))
def test_auto_is_nvidias_recipe_and_explicit_values_follow_megatron_cores_check(prec, fsdp, impl, value):
    model = load_model("llama3-8b")
    cfg = ParallelConfig(fsdp=fsdp, mbs=1)
    tr = Training(seq_len=4096, global_batch=64, precision=prec, recipe={"fsdp_impl": impl, "fp4_param_gather": value})
    on = fp4_param_gather_on(model, cfg, tr)
    assert effective_recipe(model, cfg, tr).fp4_param_gather == on
    msg = {v.rule: v.message for v in violations(model, cfg, tr, 8)}.get("fp4_param_gather_recipe")
    if value is None:   # auto never breaks a rule; torch FSDP2 keeps it (arguments.py:1024-1029 need TE < 2.7)
        assert on == BRIDGE[prec] and msg is None
    elif value is False:
        assert not on and msg is None
    else:
        assert on and ((msg is None) == (prec == "nvfp4")), msg
        if msg:
            assert MCORE_WORDS in msg
    if prec == "nvfp4":   # FP8 parameters never auto-on beside NVFP4 (bf16_with_nvfp4_mixed: False)
        assert not fp8_param_gather_on(model, cfg, tr.model_copy(update={"recipe": Recipe()}))


def test_other_trainers_refuse_an_explicit_true(capsys):
    code = main(["predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64",
                 "--fsdp", "--stack", "torchtitan", "--precision", "bf16", "--fp4-param-gather"])
    err = capsys.readouterr().err
    assert code == 2 and "recipe.fp4_param_gather=True" in err and "leave it unset" in err
    assert len(err.strip().splitlines()) == 1


def test_predict_with_an_explicit_true_outside_nvfp4_is_refused_in_megatron_cores_words(capsys):
    code = main(["predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64",
                 "--precision", "fp8", "--fp4-param-gather"])
    err = capsys.readouterr().err
    assert code == 2 and MCORE_WORDS in err and "fp4_param_gather_recipe" in err, err
    assert len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------- memory

def _l8_linear_params() -> int:
    """Llama 3 8B's quantised linear weights, by hand: 32 layers of q/k/v/o and the gated MLP."""
    h, kv, f = 4096, 8 * 128, 14336
    return 32 * (h * (h + 2 * kv) + h * h + 3 * h * f)


@pytest.mark.parametrize("fsdp", [False, True])
def test_nvfp4_parameters_drop_exactly_the_bf16_linear_weights(fsdp):
    model = load_model("llama3-8b")
    cfg = ParallelConfig(dp=8, mbs=1, fsdp=fsdp)
    on = Training(seq_len=4096, global_batch=64, precision="nvfp4")
    off = on.model_copy(update={"recipe": Recipe(fp4_param_gather=False)})
    assert fp4_param_gather_on(model, cfg, on)
    a, b = memory_per_gpu(model, cfg, on, 8).components, memory_per_gpu(model, cfg, off, 8).components
    shard = 8 if fsdp else 1
    assert (b["weights"] - a["weights"]) * GIB == pytest.approx(2 * _l8_linear_params() / shard, rel=1e-9)
    # TE's NVFP4Tensor stays: row- and column-wise packed 4-bit data (0.5 B each) with an E4M3 scale per 16
    assert WEIGHT_COPY_BYTES["nvfp4"] == 2 * (0.5 + 1 / 16)
    assert a["weight_copies"] == b["weight_copies"]
    assert a["weight_copies"] * GIB == pytest.approx(1.125 * _l8_linear_params() / shard, rel=1e-9)
    if fsdp:   # the two gathered layers lose their BF16 weight too
        assert a["fsdp_buffers"] < b["fsdp_buffers"]
    for k in ("grads", "optimizer", "activations", "logits"):
        assert a[k] == b[k]


@pytest.mark.parametrize("rid", ["mb176", "mb186", "mb223", "mb226"])
def test_published_nvfp4_runs_are_priced_with_nvfp4_parameters(rid):
    """NVIDIA's NVFP4 rows ran bf16_with_nvfp4_mixed (fp4_param_gather=True): auto prices that, and the
    memory is lower than with BF16 weights by 2 B per local linear parameter."""
    case = row_case(_row(rid))
    assert case.training.precision == "nvfp4" and fp4_param_gather_on(case.model, case.config, case.training)
    on = predict_case(case)
    off_tr = case.training.model_copy(update={"recipe": case.training.recipe.model_copy(
        update={"fp4_param_gather": False})})
    off = predict(case.model, case.cluster, on.config, off_tr)
    assert on.memory_gib_per_gpu < off.memory_gib_per_gpu


def test_csv_column_is_read_and_checked():
    row = _row("mb186")
    assert row_case(dict(row, fp4_param_gather="false")).training.recipe.fp4_param_gather is False
    assert row_case(dict(row, fp4_param_gather="")).training.recipe.fp4_param_gather is None
    with pytest.raises(InputError, match="column 'fp4_param_gather' = 'x'"):
        row_case(dict(row, fp4_param_gather="x"))


# ------------------------------------------------------------------------------------------ step time

def test_param_all_gather_moves_half_a_byte():
    assert DP.param_gather_bytes("nvfp4", True) == 0.5 and DP.param_gather_bytes("nvfp4", False) == 2.0
    # Llama 3 70B TP8 x DP8 on eight DGX B200 nodes: the DP all-gather crosses the 400 Gb/s fabric
    model = load_model("llama3-70b")
    cl = load_cluster("dgx-b200", gpus=64)
    cfg = ParallelConfig(tp=8, pp=1, dp=8)
    tr = Training(seq_len=8192, global_batch=128, precision="nvfp4")
    on = predict(model, cl, cfg, tr)
    off = predict(model, cl, cfg, tr.model_copy(update={"recipe": Recipe(fp4_param_gather=False)}))
    assert 0 < on.breakdown["dp_comm"] < off.breakdown["dp_comm"]
    # only the DP term can move
    # only dp_comm moves (and the slowest-GPU wait, a share of the whole step: terms/sync.py)
    assert {k: v for k, v in on.breakdown.items() if k not in ("dp_comm", "sync")} == pytest.approx(
        {k: v for k, v in off.breakdown.items() if k not in ("dp_comm", "sync")})
    assert on.memory_gib_per_gpu < off.memory_gib_per_gpu


def test_program_equals_predict_with_nvfp4_parameters():
    model = load_model("llama3-8b")
    cl = load_cluster("gb200-nvl72", gpus=16)
    for recipe in ({}, {"fp4_param_gather": False}):
        tr = Training(seq_len=8192, global_batch=128, precision="nvfp4", recipe=recipe)
        res = plan(model, cl, tr, top=4)
        assert res.plans
        for e in res.plans:
            assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)
        assert res.solver["program_vs_predict_max_rel_err"] < 1e-6


# ----------------------------------------------------------------------------------------------- emit

@pytest.mark.parametrize("prec,fsdp,value,flagged", [
    ("nvfp4", False, None, True), ("nvfp4", True, None, True), ("nvfp4", False, False, False),
    ("mxfp8", False, None, False), ("bf16", False, None, False)])
def test_emitted_flag_follows_the_recipe_and_reads_back(prec, fsdp, value, flagged):
    model = load_model("llama3-8b")
    cl = load_cluster("gb200-nvl72", gpus=8)
    tr = Training(seq_len=8192, global_batch=64, precision=prec, recipe={"fp4_param_gather": value})
    restrict = {"tp": [1], "pp": [1], "cp": [1], "fsdp": [fsdp], "dp": [8]}
    doc = plan(model, cl, tr, top=1, restrict=restrict, min_world=8).to_dict()
    args = megatron_args(load_context(doc, 0))
    assert (GATHER in args) == flagged
    assert_round_trip(doc, 0, args)
    if flagged:   # a file without the flag prices BF16 weights: the round trip fails
        with pytest.raises((AssertionError, InputError)):
            assert_round_trip(doc, 0, [a for a in args if a != GATHER])


def test_bridge_names_the_precision_recipe_and_refuses_what_it_cannot_express():
    from planner.trainers.megatron.bridge import BRIDGE_FP4_PARAM_GATHER, overrides

    assert BRIDGE_FP4_PARAM_GATHER == BRIDGE
    model = load_model("llama3-8b")
    cl = load_cluster("gb200-nvl72", gpus=8)
    tr = Training(seq_len=8192, global_batch=64, precision="nvfp4")
    o = overrides(load_context(plan(model, cl, tr, top=1).to_dict(), 0))
    assert o["mixed_precision"] == "bf16_with_nvfp4_mixed"
    off = tr.model_copy(update={"recipe": Recipe(fp4_param_gather=False)})
    with pytest.raises(InputError, match="recipe.fp4_param_gather=False.*bf16_with_nvfp4_mixed sets "
                                         "fp4_param_gather=True"):
        overrides(load_context(plan(model, cl, off, top=1).to_dict(), 0))


@pytest.mark.trainers
def test_megatron_core_accepts_the_flag_and_refuses_what_the_rule_refuses(tmp_path):
    from test_emit_trainers import _run, mcore_dir
    from planner.trainers.megatron.emit import megatron_env

    root = mcore_dir.__wrapped__()
    model = load_model("llama3-8b")
    cl = load_cluster("gb200-nvl72", gpus=8)
    tr = Training(seq_len=8192, global_batch=64, precision="nvfp4")
    ctx = load_context(plan(model, cl, tr, top=1, restrict={"fsdp": [False]}).to_dict(), 0)
    args = megatron_args(ctx)
    assert GATHER in args
    bf = [a for a in args if a not in ("--fp4-format", "e2m1", "--fp4-recipe", "nvfp4")]
    jobs = [{"id": i, "args": a, "env": megatron_env(ctx), "sm": ctx.sm} for i, a in (("nvfp4", args), ("bf16", bf))]
    data = _run("megatron_check.py", jobs, tmp_path, str(root))
    res = {r["id"]: r for r in data["results"]}
    assert res["nvfp4"]["ok"], res["nvfp4"]
    assert res["nvfp4"]["config"]["fp4_param"] is True and res["nvfp4"]["args"]["fp4_param_gather"] is True
    assert res["nvfp4"]["config"]["fp8_param"] is False
    assert not res["bf16"]["ok"] and MCORE_WORDS in res["bf16"]["error"], res["bf16"]
    tr = Training(seq_len=8192, global_batch=64, precision="bf16", recipe={"fp4_param_gather": True})
    assert MCORE_WORDS in {v.rule: v.message for v in violations(
        model, ParallelConfig(dp=8), tr, 8)}["fp4_param_gather_recipe"]
