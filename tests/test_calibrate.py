"""calibrate: the shipped profiles come out of calibration.csv; a fit recovers a known profile."""

import csv
from pathlib import Path

import pytest

from planner.cost.calibrate import base_profile, calibrate_rows, fit_profile
from planner.cli import main
from planner.cost.profiles import PARAM_NAMES, MAX_PARAMS, load_profile, parse_profile, dump_profile
from planner.cost.validate import read_rows, resolve_case, row_case, validate_rows

# The shared reference folder sits next to the repository root: <repo>/../shared/reference.
CSV = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "calibration.csv"


# the TorchTitan team's published H100 runs, shipped next to the profile fitted to them
TT_CSV = Path(__file__).resolve().parents[1] / "planner" / "data" / "profiles" / "torchtitan-h100-2024-12.csv"


MX_CSV = TT_CSV.parent / "maxtext-h100-2025.csv"


@pytest.mark.parametrize("stack,csv_path", [("megatron-26.04", CSV), ("megatron-26.08", CSV),
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


def test_fit_recovers_a_known_profile():
    # Synthetic measurements from a profile with known efficiencies; the fit starts from the priors
    # and must explain them (the rows come from the 26.08 layouts in calibration.csv).
    rows = [r for r in read_rows(CSV) if r["stack"] == "megatron-26.08"]
    base = base_profile("megatron-26.08")
    truth = base.with_values({"gemm.mxfp8": 0.85, "ep.overlap": 0.7, "mem.elementwise": 2.0,
                              "gpu.speed@blackwell": 0.9})
    cases = [resolve_case(row_case(r, "megatron-26.08", profile=base), base) for r in rows]
    from dataclasses import replace

    from planner.cost.predict import predict

    synth = [replace(c, measured_tflops=predict(c.model, c.cluster, c.config, c.training, profile=truth).tflops_per_gpu)
             for c in cases]
    start = [abs(predict(c.model, c.cluster, c.config, c.training, profile=base).tflops_per_gpu / c.measured_tflops - 1)
             for c in synth]
    fitted, _ = fit_profile(synth, base)
    errs = [abs(predict(c.model, c.cluster, c.config, c.training, profile=fitted).tflops_per_gpu / c.measured_tflops - 1)
            for c in synth]
    assert sum(start) / len(start) > 0.05           # the priors are off ...
    assert sum(errs) / len(errs) < 0.015             # ... and the fit explains the synthetic rows
    assert fitted.param("gemm.mxfp8") < 0.97         # moved towards the truth (0.85) from the prior 1.0


def test_cli_writes_a_profile_that_predict_can_use(tmp_path, capsys):
    rows = [r for r in csv.DictReader(CSV.open()) if r["model"] == "qwen3-30b-a3b" and r["stack"] == "megatron-26.08"]
    sub = tmp_path / "rows.csv"
    with sub.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "mine.yaml"
    assert main(["calibrate", str(sub), "--stack", "megatron-26.08", "-o", str(out)]) == 0
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
