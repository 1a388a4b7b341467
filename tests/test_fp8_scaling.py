"""FP8 delayed scaling's amax all-reduce (planner/cost/terms/fp8_scaling.py, docs/steptime.md): its seconds by
hand from NCCL's tuning.cc constants, where it is zero, its growth with the data-parallel size, retention on the
published FP8 scaling series, the recipe field's rule, emitters and read-back."""

from statistics import NormalDist

import pytest

import planner
from planner.cli import main
from planner.config import ParallelConfig, Recipe, Training
from planner.cost.terms import fp8_scaling as FP8S
from planner.cost.terms.sync import sync_factor
from planner.errors import InputError
from planner.model.spec import load_model
from planner.output.emit import load_context
from planner.rules import effective_recipe, violations
from planner.search.plan import plan
from planner.trainers.megatron.emit import megatron_args
from roundtrip_check import assert_round_trip
from topologies.loader import load_cluster

DELAYED = {"fp8_recipe": "delayed"}


def _blom(n: int) -> float:
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def _pair(gpus: int, cfg: ParallelConfig, gbs: int, model="llama3-8b", cluster="dgx-h100"):
    m, cl = load_model(model), load_cluster(cluster, gpus=gpus)
    on = Training(seq_len=8192, global_batch=gbs, precision="fp8", recipe=DELAYED)
    off = on.model_copy(update={"recipe": Recipe()})
    return planner.predict(m, cl, cfg, on), planner.predict(m, cl, cfg, off)


def test_amax_seconds_by_hand_on_two_dgx_h100():
    """Llama 3 8B TP2 on 16 H100 (2 nodes), GBS 64: dp 8, 8 micro-batches, one chunk: 16 all-reduces over the
    16 ranks of the stage. NCCL LL tree (tuning.cc: base 6.8 us, NVLink 0.6 us per intra step, network 5.0 us
    per tree level): 6.8 + 2 (7 x 0.6 + 1 x 5.0) = 25.2 us; LL ring 6.6 + 28 x 1.0 + 2 x 2.7 = 40.0 us. Plus the
    arrival wait 125 us x (e(16) - e(2))."""
    on, off = _pair(16, ParallelConfig(tp=2), 64)
    one = 25.2e-6 + 125e-6 * (_blom(16) - _blom(2))
    assert on.breakdown["fp8_amax"] == pytest.approx(16 * one, rel=1e-9)
    assert off.breakdown["fp8_amax"] == 0.0
    # the step grows by the term and the slowest-GPU share of it; nothing else moves
    assert on.step_time_s - off.step_time_s == pytest.approx(16 * one * (1 + sync_factor(16)), rel=1e-9)
    assert {k: v for k, v in on.breakdown.items() if k not in ("fp8_amax", "sync")} == pytest.approx(
        {k: v for k, v in off.breakdown.items() if k not in ("fp8_amax", "sync")})


@pytest.mark.parametrize("precision,recipe", [("bf16", {}), ("fp8", {}), ("fp8", {"fp8_recipe": "tensorwise"}),
                                              ("mxfp8", {})])
def test_no_amax_reduction_without_delayed_scaling(precision, recipe):
    m, cl = load_model("llama3-8b"), load_cluster("dgx-b200", gpus=16)
    p = planner.predict(m, cl, ParallelConfig(tp=2), Training(seq_len=8192, global_batch=64, precision=precision,
                                                                recipe=recipe))
    assert p.breakdown["fp8_amax"] == 0.0


def test_a_single_rank_stage_has_no_reduction():
    on, _ = _pair(8, ParallelConfig(tp=1, pp=8), 64)
    assert on.breakdown["fp8_amax"] == 0.0


def test_weak_scaling_grows_it_with_the_data_parallel_size():
    """At fixed work per GPU (GBS 8 per GPU, TP2), the micro-batches per step stay 8 while the stage's group
    grows: the per-step seconds grow strictly, by the tree's log2(nodes) and the arrival maximum."""
    seconds = [_pair(n, ParallelConfig(tp=2), 8 * n)[0].breakdown["fp8_amax"] for n in (16, 64, 256, 1024)]
    assert all(a < b for a, b in zip(seconds, seconds[1:]))


def test_more_chunks_more_reductions():
    """VPP 2 doubles the reductions (one autocast per model chunk and micro-batch)."""
    a = _pair(64, ParallelConfig(tp=2, pp=4, vpp=1), 256, "llama3-70b")[0].breakdown["fp8_amax"]
    b = _pair(64, ParallelConfig(tp=2, pp=4, vpp=2), 256, "llama3-70b")[0].breakdown["fp8_amax"]
    assert b == pytest.approx(2 * a, rel=1e-9)


def test_fp8_scaling_series_lose_what_bf16_series_keep():
    """bench/data/scaling/scaling.csv: with the term, the NeMo delayed-scaling FP8 series are predicted to lose
    more than the BF16 series of the same layout and container, as measured (each pair, at its largest count)."""
    from pathlib import Path

    from planner.calibration.retention import series_retention
    from planner.calibration.validate import read_rows
    path = Path(__file__).resolve().parents[1] / "bench" / "data" / "scaling" / "scaling.csv"
    by = {s.series: s for s in series_retention(read_rows(path))}
    pairs = [(k, k.replace("-fp8", "-bf16")) for k in by if k.startswith("dgxc-24") and k.endswith("-fp8")
             and "-l8-" not in k]
    assert len(pairs) == 9     # Llama 3.1 70B and 405B in 24.09 and 24.12, Nemotron-4 340B in 24.11, GPT-3 175B
    #                            and Grok-1 314B in 24.11 and 24.12
    for f, b in pairs:
        assert by[f].predicted[-1] < by[b].predicted[-1], (f, b)
        assert by[f].measured[-1] < by[b].measured[-1], (f, b)


def test_recipe_rule_and_other_trainers(capsys):
    m = load_model("llama3-8b")
    tr = Training(seq_len=8192, global_batch=64, precision="bf16", recipe=DELAYED)
    assert "fp8_recipe_precision" in {v.rule for v in violations(m, ParallelConfig(dp=8), tr, 8)}
    fp8 = Training(seq_len=8192, global_batch=64, precision="fp8")
    assert effective_recipe(m, ParallelConfig(dp=8), fp8).fp8_recipe == "tensorwise"
    code = main(["predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64",
                 "--fsdp", "--stack", "torchtitan", "--precision", "fp8", "--fp8-recipe", "delayed"])
    err = capsys.readouterr().err
    assert code == 2 and "recipe.fp8_recipe=delayed" in err and len(err.strip().splitlines()) == 1
    code = main(["predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "64",
                 "--tp", "2", "--precision", "fp8", "--fp8-recipe", "delayed", "--json"])
    assert code in (0, None)
    import json
    assert json.loads(capsys.readouterr().out)["breakdown"]["fp8_amax"] > 0


@pytest.mark.parametrize("recipe,flag", [({}, "tensorwise"), (DELAYED, "delayed")])
def test_emitted_recipe_reads_back(recipe, flag):
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=16)
    tr = Training(seq_len=8192, global_batch=64, precision="fp8", recipe=recipe)
    doc = plan(m, cl, tr, top=1, restrict={"tp": [2], "pp": [1], "cp": [1], "fsdp": [False]}).to_dict()
    args = megatron_args(load_context(doc, 0))
    assert args[args.index("--fp8-recipe") + 1] == flag
    assert_round_trip(doc, 0, args)
    from planner.trainers.megatron.bridge import overrides
    want = "bf16_with_fp8_delayed_scaling_mixed" if recipe else "bf16_with_fp8_current_scaling_mixed"
    assert overrides(load_context(doc, 0))["mixed_precision"] == want


def test_csv_column_is_read_and_checked():
    from planner.calibration.validate import row_case
    row = {"id": "x", "stack": "megatron-24.09", "model": "llama3-8b", "gpu": "H100", "num_gpus": "16",
           "precision": "fp8", "seq_len": "8192", "gbs": "64", "mbs": "1", "tp": "2"}
    assert row_case(dict(row, fp8_recipe="delayed")).training.recipe.fp8_recipe == "delayed"
    assert row_case(row).training.recipe.fp8_recipe is None
    with pytest.raises(InputError, match="column 'fp8_recipe' = 'amax'"):
        row_case(dict(row, fp8_recipe="amax"))


def test_the_solver_prices_it_as_predict_does():
    """plan() searches with the term in its program (compose.EXTRA_TERMS): every returned plan's program step
    equals predict's (plan's own hard check raises otherwise), and delayed scaling never plans faster."""
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=32)
    on = Training(seq_len=8192, global_batch=256, precision="fp8", recipe=DELAYED)
    res = plan(m, cl, on, top=3)
    assert res.plans and res.solver["program_vs_predict_max_rel_err"] < 1e-6
    for e in res.plans:
        assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)
        assert e.prediction.breakdown["fp8_amax"] > 0
    off = plan(m, cl, on.model_copy(update={"recipe": Recipe()}), top=1)
    assert off.plans[0].prediction.step_time_s < res.plans[0].prediction.step_time_s


@pytest.mark.trainers
def test_megatron_core_parses_the_delayed_recipe(tmp_path):
    """megatron-core 0.19.2's own parse_args / validate_args on the emitted arguments: --fp8-recipe delayed
    becomes args.fp8_recipe 'delayed' (the recipe whose amax reduction the term prices)."""
    from test_emit_trainers import _run, mcore_dir
    from planner.trainers.megatron.emit import megatron_env

    root = mcore_dir.__wrapped__()
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=16)
    jobs = []
    for rec in ({}, DELAYED):
        tr = Training(seq_len=8192, global_batch=64, precision="fp8", recipe=rec)
        ctx = load_context(plan(m, cl, tr, top=1, restrict={"tp": [2], "pp": [1], "cp": [1], "fsdp": [False]})
                           .to_dict(), 0)
        jobs.append({"id": rec.get("fp8_recipe", "tensorwise"), "args": megatron_args(ctx), "env": megatron_env(ctx),
                     "sm": ctx.sm})
    res = {r["id"]: r for r in _run("megatron_check.py", jobs, tmp_path, str(root))["results"]}
    for want in ("tensorwise", "delayed"):
        assert res[want]["ok"], res[want]
        assert res[want]["args"]["fp8_recipe"] == want
