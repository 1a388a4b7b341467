"""calibrate: the shipped profiles come out of calibration.csv; a fit recovers a known profile."""

import csv
from pathlib import Path

import pytest

from planner.calibration.calibrate import calibrate_rows, fit_profile
from planner.calibration.priors import base_profile
from planner.cli import main
from planner.cost.profiles import CALIBRATION_CSV, PARAM_NAMES, MAX_PARAMS, load_profile, parse_profile, dump_profile
from planner.calibration.validate import read_rows, resolve_case, row_case, validate_rows

# the published Megatron-Bridge runs the megatron-* profiles are fitted to (planner/data/profiles/README.md)
CSV = CALIBRATION_CSV


# the TorchTitan team's published H100 runs, shipped next to the profile fitted to them
TT_CSV = Path(__file__).resolve().parents[1] / "planner" / "data" / "profiles" / "torchtitan-h100-2024-12.csv"


MX_CSV = TT_CSV.parent / "maxtext-h100-2025.csv"


@pytest.mark.parametrize("stack,csv_path", [
    # the Megatron fits (the most rows, 10-20 CPU s each under load) run in CI's full run; the quick
    # loop refits the TorchTitan and MaxText profiles the same way
    pytest.param("megatron-26.04", CSV, marks=pytest.mark.slow),
    pytest.param("megatron-26.08", CSV, marks=pytest.mark.slow),
    ("torchtitan", TT_CSV), ("maxtext", MX_CSV)])
def test_shipped_profile_is_reproduced_from_its_rows(stack, csv_path):
    shipped = load_profile(stack)
    fitted, info = calibrate_rows(read_rows(csv_path), stack, source=str(csv_path))
    assert info["rows"] == sum(1 for r in read_rows(csv_path) if r["stack"] == stack)
    assert fitted.fit_rows == shipped.fit_rows
    for key, p in shipped.params.items():
        assert fitted.params[key].value == pytest.approx(p.value, rel=0.01, abs=1e-3), key
    assert fitted.flops_formula == shipped.flops_formula and fitted.dispatcher == shipped.dispatcher


def test_profiles_are_small_and_sourced():
    for name in ("megatron-26.04", "megatron-26.08", "torchtitan", "maxtext"):
        prof = load_profile(name)
        assert len(prof.params) <= MAX_PARAMS
        assert all(len(p.source) > 10 for p in prof.params.values())
        assert set(PARAM_NAMES) <= set(prof.params)
        assert parse_profile(dump_profile(prof), name) == prof


TRUTH = {"gemm.mxfp8": 0.85, "ep.overlap": 0.7, "mem.elementwise": 2.0, "gpu.speed@blackwell": 0.9}


def _synthetic_26_08(truth: dict):
    """The 26.08 layouts of calibration.csv with the TFLOP/s a known profile predicts for them."""
    from dataclasses import replace

    from planner.cost.predict import predict

    rows = [r for r in read_rows(CSV) if r["stack"] == "megatron-26.08"]
    base = base_profile("megatron-26.08")
    known = base.with_values(truth)
    cases = [resolve_case(row_case(r, "megatron-26.08", profile=base), base) for r in rows]
    synth = [replace(c, measured_tflops=predict(c.model, c.cluster, c.config, c.training, profile=known).tflops_per_gpu)
             for c in cases]

    def mean_error(prof):
        return sum(abs(predict(c.model, c.cluster, c.config, c.training, profile=prof).tflops_per_gpu
                       / c.measured_tflops - 1) for c in synth) / len(synth)
    return base, synth, mean_error


def test_fit_recovers_a_known_profile(monkeypatch):
    # Identifiable case: the four parameters of the known profile are the free ones (the others held
    # at their priors) and the prior's pull is made negligible, so the fit is plain least squares on
    # 14 noiseless rows; it must land on the truth (0.5%: the profile stores 4 significant digits).
    import planner.calibration.calibrate as cal

    base, synth, mean_error = _synthetic_26_08(TRUTH)
    only = base.model_copy(update={"params": {k: p.model_copy(update={"fit": k in TRUTH})
                                              for k, p in base.params.items()}})
    monkeypatch.setattr(cal, "PRIOR_WEIGHT", 1e-4)
    fitted, info = fit_profile(synth, only)
    assert info["fitted"] == [k for k in base.params if k in TRUTH]
    for k, v in TRUTH.items():
        assert fitted.params[k].value == pytest.approx(v, rel=0.005), k
    assert mean_error(fitted) < 1e-3


@pytest.mark.slow   # a full refit of every parameter (~20 s under load); CI's full run
def test_fit_with_every_parameter_and_the_priors_moves_the_informed_ones_towards_the_truth():
    # The shipped setting: every parameter free and the priors pulling (a MAP fit). 14 rows cannot
    # pin 24 parameters, so exact recovery is not expected: the rows must be explained, each parameter
    # the fit reports as informed by the rows must move most of the way from its prior to the truth,
    # and ep.overlap, which these rows do not inform (few of them expose the all-to-all), must be
    # reported as not informed rather than silently "fitted".
    base, synth, mean_error = _synthetic_26_08(TRUTH)
    assert mean_error(base) > 0.05                   # the priors are off ...
    fitted, info = fit_profile(synth, base)
    assert mean_error(fitted) < 0.015                # ... and the fit explains the synthetic rows
    informed = [k for k in TRUTH if k in info["informed"]]
    assert informed == ["gemm.mxfp8", "mem.elementwise", "gpu.speed@blackwell"]
    assert "ep.overlap" not in info["informed"]
    for k in informed:
        prior = base.params[k].value
        moved = (fitted.params[k].value - prior) / (TRUTH[k] - prior)
        assert 0.6 < moved < 1.2, (k, prior, fitted.params[k].value, TRUTH[k])


def test_cli_writes_a_profile_that_predict_can_use(tmp_path, capsys):
    rows = [r for r in csv.DictReader(CSV.open()) if r["model"] == "qwen3-30b-a3b" and r["stack"] == "megatron-26.08"]
    sub = tmp_path / "rows.csv"
    with sub.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "mine.yaml"
    # three rows from the priors inform no parameter on their own (the default keeps them all: see
    # test_calibrate_safety.py); --fit-all fits every one, the prior term holding what the rows miss
    assert main(["calibrate", str(sub), "--stack", "megatron-26.08", "-o", str(tmp_path / "kept.yaml")]) == 0
    assert "the rows inform 0 of" in capsys.readouterr().out
    assert main(["calibrate", str(sub), "--stack", "megatron-26.08", "-o", str(out), "--fit-all"]) == 0
    prof = load_profile(str(out))
    assert prof.fit_rows.startswith("rows.csv: 3 rows")
    res = validate_rows(read_rows(sub), stack=str(out))
    assert res["mape_pct"] < 5.0
    capsys.readouterr()
    assert main(["calibrate", str(sub), "--stack", "nope", "-o", str(tmp_path / "x.yaml")]) == 2
    assert "no rows of stack 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_profile_written_before_dp_grad_bytes_still_loads():
    # profiles written before dp.grad_bytes existed (users' own fits) load with the BF16 default of 2
    shipped = (Path(__file__).resolve().parents[1] / "planner" / "data" / "profiles" / "megatron-26.08.yaml").read_text()
    old = "\n".join(line for line in shipped.splitlines() if "dp.grad_bytes" not in line)
    prof = parse_profile(old, "old.yaml")
    assert "dp.grad_bytes" not in prof.params and prof.param("dp.grad_bytes", "hopper") == 2.0
    assert load_profile("megatron-26.08").params["dp.grad_bytes"].value == 2.0
    assert load_profile("maxtext").param("dp.grad_bytes") == 4.0


def test_eager_regime_is_26_08_with_26_04_elementwise_traffic():
    # the eager regime of megatron-26.08 (Training.cuda_graphs=False) starts from the elementwise traffic
    # megatron-26.04 fitted to its eager recipes (the prior) and is fitted on the 26.06 rows whose
    # recipe ran without CUDA graphs (planner/data/published_recipes.yaml: the 405B rows and mb234)
    new, old = load_profile("megatron-26.08"), load_profile("megatron-26.04")
    assert new.params["mem.elementwise_eager"].prior == pytest.approx(old.param("mem.elementwise"), rel=1e-5)
    eager = [c for c in (row_case(r) for r in read_rows(CSV) if r["stack"] == "megatron-26.08")
             if not c.training.cuda_graphs]
    assert {c.id for c in eager} >= {"mb234", "mb223"}
    assert new.param("mem.elementwise_eager") != pytest.approx(old.param("mem.elementwise"), rel=1e-3)
    assert new.param("mem.elementwise_eager") > new.param("mem.elementwise")
    assert len(new.params) <= MAX_PARAMS


def test_eager_rows_fit_the_eager_parameter_only():
    # Synthetic measurements: half the rows run eagerly with a known mem.elementwise_eager; the fit
    # recovers it, and the fused rows keep telling it nothing (mem.elementwise stays put)
    rows = [r for r in read_rows(CSV) if r["stack"] == "megatron-26.08" and r["model"] == "qwen3-30b-a3b"]
    rows = rows + [dict(r, id=r["id"] + "e", cuda_graphs="false") for r in rows]
    base = base_profile("megatron-26.08")
    truth = base.with_values({"mem.elementwise_eager": 5.0})
    cases = [resolve_case(row_case(r, "megatron-26.08", profile=base), base) for r in rows]
    assert [c.training.cuda_graphs for c in cases] == [True] * (len(rows) // 2) + [False] * (len(rows) // 2)
    from dataclasses import replace

    from planner.cost.predict import predict

    synth = [replace(c, measured_tflops=predict(c.model, c.cluster, c.config, c.training, profile=truth).tflops_per_gpu)
             for c in cases]
    fused = [predict(c.model, c.cluster, c.config, c.training, profile=base).tflops_per_gpu for c in synth]
    assert fused[0] == pytest.approx(synth[0].measured_tflops, rel=1e-9)    # fused rows do not read it
    assert fused[-1] > synth[-1].measured_tflops * 1.03                     # eager rows do
    fitted, _ = fit_profile(synth, base)
    assert abs(fitted.param("mem.elementwise_eager") - 5.0) < abs(base.param("mem.elementwise_eager") - 5.0) / 3


def test_validate_reads_the_cuda_graphs_column():
    from planner.errors import InputError

    row = next(r for r in read_rows(CSV) if r["id"] == "mb234")
    # absent: the recorded recipe of the published run (planner/data/published_recipes.yaml), else the
    # stack's usual regime; a row that only reuses the id is not that run
    assert row_case(row).training.cuda_graphs is False
    assert row_case(dict(row, id="mine")).training.cuda_graphs is True
    assert row_case(dict(row, num_gpus="128")).training.cuda_graphs is True
    assert row_case(dict(row, cuda_graphs="true")).training.cuda_graphs is True
    assert row_case(dict(row, cuda_graphs="false")).training.cuda_graphs is False
    assert row_case(dict(row, id="mine", cuda_graphs="")).training.cuda_graphs is True
    with pytest.raises(InputError, match="cuda_graphs"):
        row_case(dict(row, cuda_graphs="maybe"))


def test_posterior_reduction_against_the_closed_form():
    # linear rows r = J u: with one parameter the posterior variance is 1 / (|J|^2 / s_r^2 + 1 / s_p^2);
    # rows that carry exactly the prior's information halve the variance (reduction 1 - 1/sqrt(2))
    import math

    import numpy as np

    from planner.calibration.calibrate import MIN_REDUCTION, ROW_SIGMA, posterior_reduction

    sigma = np.array([0.3, 0.3, 0.5])
    col = ROW_SIGMA / sigma[0] / math.sqrt(2)            # two rows, |J_0|^2 = s_r^2 / s_p^2
    jac = np.array([[col, 0.0, 0.0], [col, 0.0, 0.0], [0.0, 0.0, 2.0]])   # parameter 1 is read by no row
    red = posterior_reduction(lambda u: jac @ u, np.zeros(3), np.full(3, 10.0), sigma)
    assert red[0] == pytest.approx(1 - 1 / math.sqrt(2), rel=1e-6) == pytest.approx(MIN_REDUCTION)
    assert red[1] == pytest.approx(0.0, abs=1e-12)
    post = 1 / (4.0 / ROW_SIGMA ** 2 + 1 / 0.5 ** 2)
    assert red[2] == pytest.approx(1 - math.sqrt(post) / 0.5, rel=1e-6)
    # two parameters the rows only see as a sum share what the rows tell: each is reduced less than alone
    pair = np.array([[1.0, 1.0], [1.0, 1.0]])
    alone = posterior_reduction(lambda u: pair[:, :1] @ u, np.zeros(1), np.full(1, 10.0), sigma[:1])
    both = posterior_reduction(lambda u: pair @ u, np.zeros(2), np.full(2, 10.0), sigma[:2])
    assert both[0] == pytest.approx(both[1]) and both[0] < alone[0]


@pytest.mark.slow   # a refit of the Megatron rows under a new stack name (~30 s under load); CI's full run
def test_unseen_stack_starts_from_the_newest_profile_of_its_trainer():
    from planner.calibration.priors import nearest_profile

    assert nearest_profile("megatron") == "megatron-26.08"
    assert nearest_profile("megatron", exclude=("megatron-26.08",)) == "megatron-26.04"
    assert nearest_profile("torchtitan") == "torchtitan" and nearest_profile("nope") is None
    rows = [dict(r, stack="mine") for r in read_rows(CSV) if r["stack"] == "megatron-26.08" and r["model"] == "qwen3-30b-a3b"]
    new = load_profile("megatron-26.08")
    fitted, info = calibrate_rows(rows, "mine", source="rows.csv")
    assert info["start"] == "megatron-26.08"
    for key, p in fitted.params.items():   # the priors are 26.08's fitted values
        assert p.prior == pytest.approx(new.params[key].value), key
    _, info = calibrate_rows(rows, "mine", source="rows.csv", start="priors")
    assert info["start"] == "priors"
    _, info = calibrate_rows(read_rows(CSV), "megatron-26.08", source=str(CSV))   # a shipped name: its priors
    assert info["start"] == "priors"


def test_informed_only_keeps_what_the_rows_do_not_exercise():
    # the MXFP8 rows of 26.08 on Blackwell (10 rows): no NVFP4 row, no Hopper row; with identify=True
    # those parameters keep their start exactly, and the ones the rows read are fitted
    rows = [r for r in read_rows(CSV) if r["stack"] == "megatron-26.08" and r["precision"].lower() == "mxfp8"
            and r["gpu"] not in ("H100", "H200")]
    assert len(rows) >= 8
    assert not any(r["precision"].lower() in ("nvfp4", "bf16") or r["gpu"] in ("H100", "H200") for r in rows)
    base = base_profile("megatron-26.08")
    fitted, info = calibrate_rows(rows, "megatron-26.08", source="rows.csv", identify=True)
    for key in ("gemm.nvfp4", "gemm.nvfp4@blackwell-ultra", "net.bw@hopper"):
        assert key in info["kept"] and info["reduction"][key] < 0.01, key
        assert fitted.params[key].value == base.params[key].value, key
    for key in ("gpu.speed@hopper", "host.launch_us@hopper", "mem.elementwise_eager@hopper"):   # fixed: fitted to the H100 rows (bench/hopper.py)
        assert not base.params[key].fit and fitted.params[key].value == base.params[key].value, key
    assert set(info["fitted"]) == set(info["informed"]) and info["fitted"]
    assert set(info["fitted"]) | set(info["kept"]) == {k for k, p in base.params.items() if p.fit}
    _, every = calibrate_rows(rows, "megatron-26.08", source="rows.csv")
    assert every["informed"] == info["informed"] and not every["kept"]


def test_cli_says_where_the_fit_started_and_what_the_rows_inform(tmp_path, capsys):
    import json

    rows = [dict(r, stack="mine") for r in csv.DictReader(CSV.open())
            if r["model"] == "qwen3-30b-a3b" and r["stack"] == "megatron-26.08"]
    sub = tmp_path / "rows.csv"
    with sub.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert main(["calibrate", str(sub), "--stack", "mine", "-o", str(tmp_path / "a.yaml")]) == 0
    out = capsys.readouterr().out
    assert "starting from megatron-26.08's values" in out and "the rows inform" in out
    assert main(["calibrate", str(sub), "--stack", "mine", "-o", str(tmp_path / "b.yaml"), "--from", "priors",
                 "--informed-only", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["start"] == "priors" and "gemm.nvfp4" in doc["kept"] and "gemm.nvfp4" not in doc["informed"]
    assert load_profile(str(tmp_path / "b.yaml")).param("gemm.nvfp4") == base_profile("mine").param("gemm.nvfp4")


def test_fit_jacobian_steps_absolutely_where_a_log_parameter_is_one():
    """The fit's one-sided differences step DIFF_STEP x max(1, |u|) in the fitted scale, as posterior_reduction
    does: at u = 0 (a log-scaled parameter at 1) scipy's relative diff_step would step by 1e-3 x 0. By hand, for
    f(u) = (3u + u^2, 5): df/du = 3 + h forwards, 3 - h backwards at the upper bound, and 0 for the constant."""
    import numpy as np

    from planner.calibration.calibrate import DIFF_STEP, _forward_jacobian

    f = lambda u: np.array([3 * u[0] + u[0] ** 2, 5.0])  # noqa: E731
    J = _forward_jacobian(f, np.array([1.0]))(np.array([0.0]))
    assert J[:, 0] == pytest.approx([3 + DIFF_STEP, 0.0], rel=1e-9, abs=1e-12)
    J = _forward_jacobian(f, np.array([0.0005]))(np.array([0.0]))     # bound closer than one step: backwards
    assert J[:, 0] == pytest.approx([3 - DIFF_STEP, 0.0], rel=1e-9, abs=1e-12)
    J = _forward_jacobian(f, np.array([10.0]))(np.array([4.0]))       # |u| > 1: the step is DIFF_STEP x 4
    assert J[0, 0] == pytest.approx(3 + 2 * 4 + 4 * DIFF_STEP, rel=1e-9)
