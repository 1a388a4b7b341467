"""Uncertainty bands (planner.cost.uncertainty): the statistic by hand, the regime of hand-placed
layouts, the lookup rules on a hand-written table, the shipped table against its own runs and against
fresh predictions of the never-fitted tables, the band on predictions and plans, the robust objective
against a brute force over predict, and the CLI (--compare, --objective robust, the predict band)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml

from planner.config import ParallelConfig, Training
from planner.calibration.bands import half_width
from planner.cost import uncertainty as U
from planner.cost.predict import predict
from planner.errors import InfeasibleError
from planner.model.spec import load_model
from planner.rules import violations
from planner.search.plan import plan
from planner.search.space import split_layers
from topologies.loader import load_cluster

ROOT = Path(__file__).resolve().parents[1]


def test_half_width_is_the_interpolated_quantile_with_a_floor():
    # sorted |e| = 0.01 0.02 0.03 0.04 0.10; q0.8 at position 0.8 * 4 = 3.2: 0.04 + 0.2 * 0.06 = 0.052
    assert half_width([0.03, -0.01, 0.10, -0.04, 0.02], 0.8, 0.05) == pytest.approx(0.052)
    assert half_width([0.01, -0.02], 0.8, 0.05) == 0.05          # the floor
    assert half_width([-0.3], 0.8, 0.05) == pytest.approx(0.3)    # one run: itself
    with pytest.raises(ValueError):
        half_width([], 0.8, 0.05)


def test_classify_by_hand():
    moe, dense = load_model("qwen3-30b-a3b"), load_model("llama3-8b")
    hgx = load_cluster("dgx-h100", gpus=16)
    tr = Training(seq_len=4096, global_batch=64, precision="mxfp8")
    # EP8 in rank order tp-cp-ep-dp-pp fills one 8-GPU node; EP16 spans both nodes
    r8 = U.classify(moe, hgx, ParallelConfig(ep=8), tr)
    r16 = U.classify(moe, hgx, ParallelConfig(ep=16, fsdp=True), tr)
    assert (r8.system, r8.kind, r8.ep, r8.fsdp, r8.cp, r8.precision) == ("hgx", "moe", "ep-in-domain", False, False, "fp8")
    assert (r16.ep, r16.fsdp) == ("ep-across-domains", True)
    assert r16.label() == "hgx moe ep-across-domains fsdp fp8"
    # an NVL72 rack of 72: EP64 stays inside it; a dense model has no EP feature
    nvl = load_cluster("gb200-nvl72", gpus=72)
    r = U.classify(load_model("gpt-oss-120b"), nvl, ParallelConfig(ep=64, dp=64), tr.model_copy(update={"precision": "bf16"}))
    assert (r.system, r.ep, r.precision) == ("nvl72", "ep-in-domain", "bf16")
    r = U.classify(dense, hgx, ParallelConfig(tp=2, cp=2), tr.model_copy(update={"precision": "nvfp4"}))
    assert (r.kind, r.ep, r.cp, r.precision, r.core) == ("dense", None, True, "fp4", "hgx dense")


def _table(runs_stack, runs_family, min_runs=3):
    """A hand-written table: pool 'megatron-x' (the stack) and 'megatron' (its family)."""
    def pool(runs):
        regimes = {}
        for r in runs:
            errs = [x["log_error"] for x in runs if x["core"] == r["core"]]
            regimes[r["core"]] = {"half_width": half_width(errs, 0.8, 0.05), "runs": len(errs)}
        return {"regimes": regimes, "runs": runs}

    return {"quantile": 0.8, "floor": 0.05, "min_runs": min_runs, "default_half_width": 0.7,
            "extrapolation_step": 0.1, "pools": {"megatron-x": pool(runs_stack), "megatron": pool(runs_family)}}


def _run(core, err, fsdp=False, cp=False, precision="fp8"):
    return {"core": core, "log_error": err, "fsdp": fsdp, "cp": cp, "precision": precision}


def test_band_lookup_rules_on_a_hand_table():
    core = "nvl72 moe ep-in-domain"
    stack_runs = [_run(core, e) for e in (0.02, -0.04, 0.06)]
    family_runs = stack_runs + [_run(core, 0.30), _run("hgx dense", 0.1, fsdp=True), _run("hgx dense", -0.2),
                                _run("hgx dense", 0.15)]
    t = _table(stack_runs, family_runs)
    reg = U.Regime("nvl72", "moe", "ep-in-domain", False, False, "fp8")
    b = U.band_for(reg, "megatron-x", table=t)
    # the stack's own three runs: |e| 0.02 0.04 0.06, q0.8 at 1.6: 0.04 + 0.6 * 0.02 = 0.052
    assert (b.half_width, b.runs, b.source, b.extrapolated) == (pytest.approx(0.052), 3, "megatron-x", None)
    assert b.bounds(100.0) == (pytest.approx(100 * math.exp(-0.052)), pytest.approx(100 * math.exp(0.052)))
    # another release of the family: the family's four runs
    b = U.band_for(reg, "megatron-99.01", table=t)
    assert (b.runs, b.source) == (4, "megatron")
    # FSDP and FP4 never measured in this regime: extrapolated, widened by one step each
    b = U.band_for(reg.__class__("nvl72", "moe", "ep-in-domain", True, False, "fp4"), "megatron-x", table=t)
    assert b.half_width == pytest.approx(0.052 + 2 * 0.1)
    assert "no measured FP4+FSDP+MoE run (NVL72, EP inside NVLink domains)" in b.extrapolated
    # no run at all in the core regime: the default, extrapolated
    b = U.band_for(U.Regime("nvl72", "moe", "ep-across-domains", False, False, "fp8"), "megatron-x", table=t)
    assert (b.half_width, b.runs, b.source) == (0.7, 0, "default")
    assert b.extrapolated.startswith("no measured MoE run (NVL72, EP across NVLink domains)")
    # fewer than min_runs: the default too, and the message says how many there are
    b = U.band_for(U.Regime("hgx", "dense", None, False, False, "fp8"), "megatron-x",
                   table=_table(stack_runs, family_runs, min_runs=4))
    assert b.half_width == 0.7 and "only 3 measured" in b.extrapolated


def test_lead_inside_the_band_by_hand():
    assert U.lead(110.0, math.log(1.2), 100.0) == (pytest.approx(0.1), True)    # 100 >= 110 / 1.2
    assert U.lead(130.0, math.log(1.2), 100.0) == (pytest.approx(0.3), False)   # 100 < 130 / 1.2
    assert U.lead(90.0, 0.05, 100.0)[1] is True                                  # the runner-up is ahead


def test_shipped_table_figures_follow_from_its_runs():
    t = U.load_table()
    widest = 0.0
    for name, pool in t["pools"].items():
        for core, cell in pool["regimes"].items():
            errs = [r["log_error"] for r in pool["runs"] if r["core"] == core]
            assert cell["runs"] == len(errs), (name, core)
            assert cell["half_width"] == pytest.approx(half_width(errs, t["quantile"], t["floor"]), abs=1e-3)
            if cell["runs"] >= t["min_runs"]:
                widest = max(widest, cell["half_width"])
    assert t["default_half_width"] >= widest - 1e-9   # no measured regime is wider than the default


def test_shipped_residuals_match_fresh_predictions_of_the_never_fitted_tables():
    """The table is stale if a profile was refitted without rerunning bench/uncertainty.py --write."""
    from planner.cost.profiles import load_profile, resolve_name
    from planner.calibration.validate import predict_case, read_rows, row_case

    stored = {r["id"]: r for pool in U.load_table()["pools"].values() for r in pool["runs"]
              if r["how"] == "not fitted"}
    checked = 0
    for path in sorted((ROOT / "bench" / "data").glob("megatron-bridge-*.csv"))[:2]:
        for row in read_rows(path)[:8]:
            prof = load_profile(resolve_name(row["stack"]))
            case = row_case(row, row["stack"], str(path), profile=prof)
            p = predict_case(case, prof)
            err = math.log(p.tflops_per_gpu / float(row["model_tflops_per_gpu"]))
            assert stored[row["id"]]["log_error"] == pytest.approx(err, abs=0.01), \
                f"{row['id']}: rerun python bench/uncertainty.py --write"
            reg = U.classify(case.model, case.cluster, p.config, case.training, placement=p.placement)
            assert stored[row["id"]]["core"] == reg.core
            checked += 1
    assert checked >= 8


def test_prediction_carries_its_band():
    m = load_model("deepseek-v3")
    c = load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    tr = Training(seq_len=4096, global_batch=4096, precision="mxfp8", stack="megatron-26.08")
    cfg = ParallelConfig(pp=2, vpp=8, ep=32)
    p = predict(m, c, cfg, tr)
    b = U.band(m, c, p.config, tr, "megatron-26.08", placement=p.placement)
    assert p.regime == b.regime.label() == "nvl72 moe ep-in-domain fp8"
    assert p.band_half_width == b.half_width and p.band_runs == b.runs >= 5 and p.extrapolated is None
    assert p.tflops_per_gpu_low == pytest.approx(p.tflops_per_gpu * math.exp(-b.half_width))
    assert p.tflops_per_gpu_high == pytest.approx(p.tflops_per_gpu * math.exp(b.half_width))
    d = p.to_dict()
    assert d["tflops_per_gpu_low"] < d["tflops_per_gpu"] < d["tflops_per_gpu_high"]
    # FSDP with MoE was never measured on NVL72: extrapolated and wider
    q = predict(m, c, cfg.model_copy(update={"fsdp": True}), tr)
    assert "FSDP+MoE" in q.extrapolated and q.band_half_width > p.band_half_width


# -- the robust objective -----------------------------------------------------------------------


def _brute_force(model, cluster, training, space_values, min_world, key):
    """The best layout of the space by ``key(prediction)``, from predict/rules/placement only."""
    from planner.cost.placement import make_placement

    best = None
    names = list(space_values)
    for combo in itertools.product(*(space_values[n] for n in names)):
        a = dict(zip(names, combo))
        if (a["vpp"] > 1 and a["pp"] < 2) or (a["etp"] == 1 and a["tp"] == 1):
            continue
        sp = split_layers(model.num_layers, a["pp"], a["vpp"], a["split"])
        world = a["tp"] * a["cp"] * a["pp"] * a["dp"]
        if sp is None or not (min_world <= world <= cluster.num_gpus):
            continue
        cfg = ParallelConfig(tp=a["tp"], pp=a["pp"], vpp=a["vpp"], cp=a["cp"], ep=a["ep"], etp=a["etp"],
                             dp=a["dp"], mbs=a["mbs"], fsdp=a["fsdp"], recompute=a["recompute"],
                             dispatcher=a["dispatcher"], pp_first=sp[0], pp_last=sp[1])
        tr = training.model_copy(update={"global_batch": a["gbs"]})
        if violations(model, cfg, tr, world):
            continue
        try:
            pl = make_placement(cluster, cfg, world, gpus_per_domain=a["gpd"])
            p = predict(model, cluster, cfg, tr, placement=pl)
        except (InfeasibleError, ValueError):
            continue
        if p.fits and (best is None or key(p) > best[0]):
            best = (key(p), p)
    return best


@pytest.fixture
def skewed_table(tmp_path, monkeypatch):
    """A table in which EP across nodes is very uncertain and EP inside a node is not, so that the
    robust plan must differ from the throughput plan (which sends EP across the two nodes)."""
    t = yaml.safe_load(U.TABLE_PATH.read_text())
    runs = [dict(_run("hgx moe ep-in-domain", 0.01), fsdp=f) for f in (False, True)] + \
           [dict(_run("hgx moe ep-across-domains", 0.9), fsdp=f) for f in (False, True)]
    t["min_runs"] = 2
    t["pools"] = {"megatron": {"regimes": {"hgx moe ep-in-domain": {"half_width": 0.05, "runs": 2},
                                           "hgx moe ep-across-domains": {"half_width": 0.9, "runs": 2}},
                               "runs": runs}}
    path = tmp_path / "uncertainty.yaml"
    path.write_text(yaml.safe_dump(t))
    monkeypatch.setattr(U, "TABLE_PATH", path)
    return path


def test_robust_plan_equals_brute_force_of_the_lower_edge(skewed_table):
    m = load_model("qwen3-30b-a3b")
    c = load_cluster("dgx-h100", gpus=16)
    tr = Training(seq_len=4096, global_batch=64, precision="fp8")
    restrict = dict(tp=[1], cp=[1], pp=[1, 2], vpp=[1], ep=[4, 8, 16], mbs=[1, 2], recompute=["none", "full"],
                    fsdp=[False, True])
    thr = plan(m, c, tr, top=1, restrict=restrict)
    for method in ("enumerate", "exhaustive"):
        rob = plan(m, c, tr, top=3, restrict=restrict, objective="robust", method=method)
        assert rob.solver["status"] == "OPTIMAL"
        best = _brute_force(m, c, tr, rob.solver["space"], rob.solver["min_world"],
                            key=lambda p: p.tokens_per_s * math.exp(-p.band_half_width))
        top = rob.plans[0].prediction
        assert top.tokens_per_s * math.exp(-top.band_half_width) == pytest.approx(best[0], rel=1e-6)
        assert rob.solver["objective"] == pytest.approx(best[0], rel=1e-6)
        lows = [e.prediction.tokens_per_s * math.exp(-e.prediction.band_half_width) for e in rob.plans]
        assert lows == sorted(lows, reverse=True)
        for e in rob.plans:
            assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)
    # the skew moves the plan: the throughput one sends EP across nodes, the robust one does not
    assert thr.plans[0].prediction.regime.startswith("hgx moe ep-across-domains")
    assert top.regime.startswith("hgx moe ep-in-domain")
    assert thr.plans[0].prediction.tokens_per_s >= top.tokens_per_s


def test_plan_document_carries_bands_and_leads():
    m = load_model("qwen3-30b-a3b")
    c = load_cluster("dgx-h100", gpus=16)
    tr = Training(seq_len=4096, global_batch=64, precision="fp8")
    res = plan(m, c, tr, top=3, restrict=dict(tp=[1], cp=[1], pp=[1, 2], vpp=[1], mbs=[1], recompute=["none"]))
    doc = res.to_dict()
    plans = doc["plans"]
    for a, b in zip(plans, plans[1:]):
        pa, pb = a["prediction"], b["prediction"]
        assert a["lead_over_next"] == pytest.approx(pa["tokens_per_s"] / pb["tokens_per_s"] - 1)
        assert a["within_uncertainty"] == (pb["tokens_per_s"] >= pa["tokens_per_s"] * math.exp(-pa["band_half_width"]))
        assert pa["tflops_per_gpu_low"] < pa["tflops_per_gpu"] < pa["tflops_per_gpu_high"]
    assert "lead_over_next" not in plans[-1]


# -- CLI ------------------------------------------------------------------------------------------


def test_cli_plan_compare_and_robust(capsys):
    from planner.cli import main

    args = ["plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "64",
            "--precision", "fp8", "--top", "2"]
    assert main(args + ["--compare", "TP1,PP2,EP8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cmp_ = doc["compare"]
    ref = predict(load_model("qwen3-30b-a3b"), load_cluster("dgx-h100", gpus=16), ParallelConfig(pp=2, ep=8),
                  Training(seq_len=4096, global_batch=64, precision="fp8"))
    assert cmp_["label"] == "TP1 PP2 EP8 DP8 MBS1"
    assert cmp_["prediction"]["tflops_per_gpu"] == pytest.approx(ref.tflops_per_gpu)
    best = doc["plans"][0]["prediction"]
    assert cmp_["plan_lead"] == pytest.approx(best["tokens_per_s"] / ref.tokens_per_s - 1)
    assert main(args + ["--compare", "TP1 PP2 EP8"]) == 0
    out = capsys.readouterr().out
    assert "compare TP1 PP2 EP8 DP8 MBS1" in out and "plan #1 leads by" in out and "band" in out
    assert main(args + ["--compare", "TP1,PQ2"]) == 2
    assert "unknown token 'PQ2'" in capsys.readouterr().err
    assert main(args + ["--compare", "TP3,EP8"]) == 2          # a broken trainer rule, named
    assert main(args + ["--objective", "robust", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["solver"]["objective_name"] == "tokens_per_s_low"


def test_cli_plan_compare_uses_the_offered_gpus(capsys):
    """256 GPUs on 72-GPU racks: the compared layout runs on the 256 offered, not on four whole racks."""
    from planner.cli import main

    rc = main(["plan", "--model", "qwen3-30b-a3b", "--cluster", "gb200-nvl72", "--gpus", "128", "--gbs", "256",
               "--precision", "mxfp8", "--top", "1", "--compare", "TP1,PP2,EP32", "--json"])
    assert rc == 0
    cmp_ = json.loads(capsys.readouterr().out)["compare"]
    assert cmp_["world"] == 128 and cmp_["label"] == "TP1 PP2 EP32 DP64 MBS1"


def test_cli_predict_prints_band_and_extrapolation(capsys):
    from planner.cli import main

    rc = main(["predict", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "64",
               "--precision", "fp8", "--ep", "8", "--fsdp"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "uncertainty band" in out and "FSDP+MoE" in out and "extrapolated" in out
