"""FP8 parameters (``Recipe.fp8_param_gather``, Megatron ``--fp8-param-gather`` and, for MXFP8 under the
distributed optimizer, ``--reuse-grad-buf-for-mxfp8-param-ag``): the auto value NVIDIA's Megatron-Bridge
performance recipes run, megatron-core 0.19.2's checks as rules, the BF16 weights the memory estimate
drops (by hand), the FP8 parameter all-gather of the step time, the emitted and read-back flags, the
CSV column, and megatron-core's own parser on the emitted arguments (tests/trainers/megatron_check.py).
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
from planner.trainers.megatron.rules import fp8_param_gather_on
from planner.search.plan import plan
from roundtrip_check import assert_round_trip
from topologies.loader import load_cluster

CALIBRATION = str(CALIBRATION_CSV)
GATHER = "--fp8-param-gather"
REUSE = "--reuse-grad-buf-for-mxfp8-param-ag"
# megatron-core 0.19.2 words (file:line)
MCORE_WORDS = {
    "precision": "fp8_param must be used together with fp8 mode",          # transformer_config.py:1439-1440
    "torch_fsdp2": "FSDP2 FP8 param gather is not supported yet in TE 2.0",  # arguments.py:1017-1022 (turns it off)
}


def _row(rid):
    return next(r for r in csv.DictReader(open(CALIBRATION)) if r["id"] == rid)


# ---------------------------------------------------------------------------------------------- rules

# NVIDIA's performance precision configs (Megatron-Bridge v0.4.2 scripts/performance/utils/precision.py and
# mixed_precision.py): fp8_cs and fp8_mx on, fp8_sc and nvfp4 off; bf16 has no FP8 parameters.
BRIDGE_PERF = {"bf16": False, "fp8": True, "fp8-block": False, "mxfp8": True, "nvfp4": False}


@settings(max_examples=80, deadline=None)
@given(prec=st.sampled_from(sorted(BRIDGE_PERF)), fsdp=st.booleans(), impl=st.sampled_from(["megatron", "torch"]),
       value=st.sampled_from([None, True, False]))
def test_auto_is_nvidias_recipe_and_explicit_values_follow_megatron_cores_checks(prec, fsdp, impl, value):
    model = load_model("llama3-8b")
    cfg = ParallelConfig(fsdp=fsdp, mbs=1)
    tr = Training(seq_len=4096, global_batch=64, precision=prec, recipe={"fsdp_impl": impl, "fp8_param_gather": value})
    torch2 = fsdp and impl == "torch"
    on = fp8_param_gather_on(model, cfg, tr)
    assert effective_recipe(model, cfg, tr).fp8_param_gather == on
    msg = {v.rule: v.message for v in violations(model, cfg, tr, 8)}.get("fp8_param_gather_recipe")
    if value is None:
        assert on == (BRIDGE_PERF[prec] and not torch2) and msg is None   # auto never breaks a rule
    elif value is False:
        assert not on and msg is None
    else:
        assert on
        want = "precision" if prec in ("bf16", "nvfp4") else ("torch_fsdp2" if torch2 else None)
        assert (msg is None) == (want is None), msg
        if want:
            assert MCORE_WORDS[want] in msg


def test_other_trainers_refuse_an_explicit_true(capsys):
    for stack, word in (("torchtitan", "enable_fsdp_float8_all_gather"), ("maxtext", "no FP8 parameter gather")):
        code = main(["predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64",
                     "--fsdp", "--stack", stack, "--precision", "fp8", "--fp8-param-gather"])
        err = capsys.readouterr().err
        assert code == 2 and "recipe.fp8_param_gather=True" in err and word in err and "leave it unset" in err
        assert len(err.strip().splitlines()) == 1
        # auto is off for them: nothing to refuse
        tr = Training(seq_len=4096, global_batch=64, precision="fp8", trainer=stack)
        assert not fp8_param_gather_on(load_model("llama3-8b"), ParallelConfig(fsdp=True), tr)


# --------------------------------------------------------------------------------------------- memory

def _l8_linear_params() -> int:
    """Llama 3 8B's quantised linear weights, by hand: 32 layers of q/k/v/o and the gated MLP."""
    h, kv, f = 4096, 8 * 128, 14336
    return 32 * (h * (h + 2 * kv) + h * h + 3 * h * f)


@pytest.mark.parametrize("prec", ["fp8", "mxfp8", "fp8-block"])
def test_fp8_parameters_drop_exactly_the_bf16_linear_weights(prec):
    model = load_model("llama3-8b")
    cfg = ParallelConfig(dp=8, mbs=1)
    on = Training(seq_len=4096, global_batch=64, precision=prec, recipe={"fp8_param_gather": True})
    off = on.model_copy(update={"recipe": Recipe(fp8_param_gather=False)})
    a, b = memory_per_gpu(model, cfg, on, 8).components, memory_per_gpu(model, cfg, off, 8).components
    assert (b["weights"] - a["weights"]) * GIB == pytest.approx(2 * _l8_linear_params(), rel=1e-9)
    # the quantised storage stays: FP8 data + transpose, MXFP8 row- and column-wise data with E8M0 scales
    assert a["weight_copies"] == b["weight_copies"]
    assert a["weight_copies"] * GIB == pytest.approx(WEIGHT_COPY_BYTES[prec] * _l8_linear_params(), rel=1e-9)
    for k in ("grads", "optimizer", "activations", "logits"):
        assert a[k] == b[k]


def test_fsdp_drops_the_bf16_weight_from_shards_and_gathered_buffers():
    model = load_model("llama3-8b")
    cfg = ParallelConfig(dp=8, mbs=1, fsdp=True)
    on = Training(seq_len=4096, global_batch=64, precision="fp8")
    off = on.model_copy(update={"recipe": Recipe(fp8_param_gather=False)})
    assert fp8_param_gather_on(model, cfg, on)   # Megatron-FSDP keeps it (arguments.py:1060-1062)
    a, b = memory_per_gpu(model, cfg, on, 8).components, memory_per_gpu(model, cfg, off, 8).components
    assert (b["weights"] - a["weights"]) * GIB == pytest.approx(2 * _l8_linear_params() / 8, rel=1e-9)
    assert a["fsdp_buffers"] < b["fsdp_buffers"]


@pytest.mark.parametrize("rid", ["mb182", "mb222"])
def test_published_405b_mxfp8_runs_fit_without_recompute(rid):
    """NVIDIA ran Llama 3.1 405B MXFP8 on 256 GB300 (TP2 PP8 VPP4 CP2) with no recompute and FP8 parameters
    (bf16_with_mxfp8_mixed); with them counted the layout fits, without them it needs a recompute."""
    case = row_case(_row(rid))
    assert case.training.precision == "mxfp8" and fp8_param_gather_on(case.model, case.config, case.training)
    p = predict_case(case)
    assert p.config.recompute == "none" and p.fits, (p.memory_gib_per_gpu, p.hbm_gib)
    off = case.training.model_copy(update={"recipe": case.training.recipe.model_copy(
        update={"fp8_param_gather": False})})
    assert not predict(case.model, case.cluster, case.config.model_copy(update={"recompute": "none"}), off).fits


def test_csv_column_is_read_and_checked():
    row = _row("mb182")
    assert row_case(dict(row, fp8_param_gather="false")).training.recipe.fp8_param_gather is False
    assert row_case(dict(row, fp8_param_gather="")).training.recipe.fp8_param_gather is None
    with pytest.raises(InputError, match="column 'fp8_param_gather' = 'x'"):
        row_case(dict(row, fp8_param_gather="x"))


# ------------------------------------------------------------------------------------------ step time

def _dense_dp(prec, **recipe):
    tr = Training(seq_len=8192, global_batch=128, precision=prec, recipe=recipe)
    # B200 (sm100): MXFP8 runs on Blackwell only (topologies.gpus refuses it on Hopper)
    return load_model("llama3-70b"), load_cluster("dgx-b200", gpus=64), ParallelConfig(tp=8, pp=1, dp=8), tr


def test_param_all_gather_moves_one_byte_for_fp8_and_bf16_for_mxfp8():
    assert DP.param_gather_bytes("fp8", True) == DP.param_gather_bytes("fp8-block", True) == 1.0
    assert DP.param_gather_bytes("mxfp8", True) == DP.param_gather_bytes("fp8", False) == 2.0
    model, cl, cfg, tr = _dense_dp("fp8")
    on = predict(model, cl, cfg, tr)
    off = predict(model, cl, cfg, tr.model_copy(update={"recipe": Recipe(fp8_param_gather=False)}))
    assert 0 < on.breakdown["dp_comm"] < off.breakdown["dp_comm"]
    # only the DP term can move
    # only dp_comm moves (and the slowest-GPU wait, a share of the whole step: terms/sync.py)
    assert {k: v for k, v in on.breakdown.items() if k not in ("dp_comm", "sync")} == pytest.approx(
        {k: v for k, v in off.breakdown.items() if k not in ("dp_comm", "sync")})
    model, cl, cfg, tr = _dense_dp("mxfp8")
    a = predict(model, cl, cfg, tr)
    b = predict(model, cl, cfg, tr.model_copy(update={"recipe": Recipe(fp8_param_gather=False)}))
    assert a.breakdown == pytest.approx(b.breakdown)   # MXFP8 gathers BF16 through the grad buffer
    assert a.memory_gib_per_gpu < b.memory_gib_per_gpu


def test_program_equals_predict_with_fp8_parameters():
    model = load_model("llama3-8b")
    cl = load_cluster("dgx-h100", gpus=16)
    for recipe in ({}, {"fsdp_impl": "torch"}):
        tr = Training(seq_len=8192, global_batch=128, precision="fp8", recipe=recipe)
        res = plan(model, cl, tr, top=4)
        assert res.plans
        for e in res.plans:
            assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)
        assert res.solver["program_vs_predict_max_rel_err"] < 1e-6


# ----------------------------------------------------------------------------------------------- emit

@pytest.mark.parametrize("prec,fsdp,flags", [
    ("mxfp8", False, (GATHER, REUSE)), ("mxfp8", True, (GATHER,)), ("fp8", False, (GATHER,)),
    ("fp8-block", False, ()), ("nvfp4", False, ()), ("bf16", False, ())])
def test_emitted_flags_follow_the_recipe_and_read_back(prec, fsdp, flags):
    model = load_model("llama3-8b")
    cl = load_cluster("gb200-nvl72", gpus=8)
    tr = Training(seq_len=8192, global_batch=64, precision=prec)
    restrict = {"tp": [1], "pp": [1], "cp": [1], "fsdp": [fsdp], "dp": [8]}
    doc = plan(model, cl, tr, top=1, restrict=restrict, min_world=8).to_dict()
    args = megatron_args(load_context(doc, 0))
    assert tuple(f for f in (GATHER, REUSE) if f in args) == flags
    assert_round_trip(doc, 0, args)
    if GATHER in args:   # a file without the flag prices BF16 weights: the round trip fails
        with pytest.raises((AssertionError, InputError)):
            assert_round_trip(doc, 0, [a for a in args if a not in (GATHER, REUSE)])
    if REUSE in args:    # megatron-core / Bridge require the pair
        with pytest.raises(InputError, match=REUSE):
            assert_round_trip(doc, 0, [a for a in args if a != REUSE])
        with pytest.raises(InputError, match="needs --fp8-param-gather"):
            assert_round_trip(doc, 0, [a for a in args if a != GATHER])


def test_bridge_names_the_precision_recipe_and_refuses_what_it_cannot_express():
    from planner.trainers.megatron.bridge import BRIDGE_FP8_PARAM_GATHER, overrides

    assert BRIDGE_FP8_PARAM_GATHER == BRIDGE_PERF
    model = load_model("llama3-8b")
    cl = load_cluster("gb200-nvl72", gpus=8)
    tr = Training(seq_len=8192, global_batch=64, precision="mxfp8")
    o = overrides(load_context(plan(model, cl, tr, top=1).to_dict(), 0))
    assert o["mixed_precision"] == "bf16_with_mxfp8_mixed"
    off = tr.model_copy(update={"recipe": Recipe(fp8_param_gather=False)})
    with pytest.raises(InputError, match="recipe.fp8_param_gather=False"):
        overrides(load_context(plan(model, cl, off, top=1).to_dict(), 0))


@pytest.mark.trainers
def test_megatron_core_accepts_the_flags_and_refuses_what_the_rules_refuse(tmp_path):
    from test_emit_trainers import _run, mcore_dir
    from planner.trainers.megatron.emit import megatron_env

    root = mcore_dir.__wrapped__()
    model = load_model("llama3-8b")
    cl = load_cluster("gb200-nvl72", gpus=8)
    jobs, envs = {}, {}
    for prec in ("mxfp8", "fp8"):
        tr = Training(seq_len=8192, global_batch=64, precision=prec)
        ctx = load_context(plan(model, cl, tr, top=1, restrict={"fsdp": [False]}).to_dict(), 0)
        jobs[prec], envs[prec] = megatron_args(ctx), (megatron_env(ctx), ctx.sm)
    bf = [a for a in jobs["fp8"] if a not in ("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise")]
    jobs["bf16"], envs["bf16"] = bf, envs["fp8"]
    data = _run("megatron_check.py", [{"id": k, "args": a, "env": envs[k][0], "sm": envs[k][1]}
                                      for k, a in jobs.items()], tmp_path, str(root))
    res = {r["id"]: r for r in data["results"]}
    for prec in ("mxfp8", "fp8"):
        assert res[prec]["ok"], res[prec]
        assert res[prec]["config"]["fp8_param"] is True and res[prec]["args"]["fp8_param_gather"] is True
        assert res[prec]["args"]["reuse_grad_buf_for_mxfp8_param_ag"] is (prec == "mxfp8")
    assert not res["bf16"]["ok"] and MCORE_WORDS["precision"] in res["bf16"]["error"], res["bf16"]
    tr = Training(seq_len=8192, global_batch=64, precision="bf16", recipe={"fp8_param_gather": True})
    assert MCORE_WORDS["precision"] in {v.rule: v.message for v in violations(
        model, ParallelConfig(dp=8), tr, 8)}["fp8_param_gather_recipe"]
