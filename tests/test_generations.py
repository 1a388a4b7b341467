"""Bands off the GPU generations a profile was fitted on (issue 21 item 3): the published H100 runs
predicted with the default stack (fitted on Blackwell rows only) against their band, the lookup rule on
a hand-written table, and the generations the shipped table records against the rows it was built from."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from planner.calibration.bands import half_width
from planner.cost import uncertainty as U
from planner.cost.profiles import DEFAULT_STACK, load_profile
from planner.calibration.validate import predict_case, read_rows, row_case
from topologies.gpus import get_gpu

ROOT = Path(__file__).resolve().parents[1]
TABLES = sorted((ROOT / "bench" / "data").glob("*.csv")) + [ROOT / "planner" / "data" / "profiles" / "calibration.csv"]


def _published_h100_rows():
    out = []
    for path in TABLES:
        for r in read_rows(path):
            if (r["gpu"].strip() == "H100" and (r.get("stack") or "").startswith("megatron")
                    and (r.get("model_tflops_per_gpu") or "").strip()):
                out.append(pytest.param(path, r, id=f"{path.stem}:{r['id']}"))
    return out


H100_ROWS = _published_h100_rows()


def test_there_are_published_h100_rows():
    assert len(H100_ROWS) >= 10


@pytest.mark.parametrize("path,row", H100_ROWS)
def test_default_stack_h100_predictions_of_published_runs_lie_in_their_band(path, row):
    prof = load_profile(DEFAULT_STACK)
    p = predict_case(row_case(row, DEFAULT_STACK, str(path), profile=prof), prof)
    # in tokens/s per GPU where the row has them: the tables up to the 26.04 containers count model FLOPs with the
    # legacy formula, the default stack with the current one (GPT-OSS differs by 15%, planner/model/flops.py)
    tok = (row.get("tokens_per_s_per_gpu") or "").strip()
    scale = p.tokens_per_s_per_gpu / p.tflops_per_gpu if tok else 1.0
    measured = float(tok) if tok else float(row["model_tflops_per_gpu"])
    low, high = p.tflops_per_gpu_low * scale, p.tflops_per_gpu_high * scale
    assert low <= measured <= high, f"{row['id']}: {measured} outside {low:.0f}-{high:.0f}"
    # the default stack has no fitted Hopper run: the band says so
    assert "no measured Hopper run of megatron-26.08" in (p.extrapolated or "")


def test_blackwell_prediction_of_the_default_stack_is_not_a_generation_extrapolation():
    prof = load_profile(DEFAULT_STACK)
    rows = [r for r in read_rows(TABLES[-1]) if r["id"] == "mb188"]   # DeepSeek-V3 on 256 GB300
    p = predict_case(row_case(rows[0], DEFAULT_STACK, "calibration.csv", profile=prof), prof)
    assert "run of megatron-26.08" not in (p.extrapolated or "")


def _table(fitted, generations):
    core = "hgx dense"
    runs = [{"core": core, "log_error": e, "fsdp": False, "cp": False, "precision": "fp8", "arch": "blackwell"}
            for e in (0.02, -0.04, 0.06, 0.01, -0.03)]
    pool = {"regimes": {core: {"half_width": half_width([r["log_error"] for r in runs], 0.8, 0.05), "runs": 5}},
            "runs": runs, "fitted_archs": fitted, "generations": generations}
    return {"quantile": 0.8, "floor": 0.05, "min_runs": 5, "default_half_width": 0.7, "extrapolation_step": 0.1,
            "pools": {"megatron-x": pool}}


def test_generation_rule_on_a_hand_table():
    t = _table(["blackwell"], {"hopper": {"hgx dense": {"half_width": 0.4, "runs": 3}}})
    on = {a: U.band_for(U.Regime("hgx", "dense", None, False, False, "fp8", a), "megatron-x", table=t)
          for a in ("blackwell", "hopper", "blackwell-ultra")}
    # |e| 0.01 0.02 0.03 0.04 0.06: q0.8 at 3.2 = 0.04 + 0.2 * 0.02 = 0.044, floor 0.05
    assert on["blackwell"].half_width == pytest.approx(0.05) and on["blackwell"].extrapolated is None
    # Hopper: the widest residual of the stack's Hopper predictions (0.4) plus one step
    assert on["hopper"].half_width == pytest.approx(0.4 + 0.1)
    assert "no measured Hopper run of megatron-x" in on["hopper"].extrapolated
    assert "off by up to 49%" in on["hopper"].extrapolated          # exp(0.4) - 1
    # no run of that generation at all: the default half-width plus one step
    assert on["blackwell-ultra"].half_width == pytest.approx(0.7 + 0.1)
    # a generation residual narrower than the core figure never narrows the band
    t = _table(["blackwell"], {"hopper": {"hgx dense": {"half_width": 0.01, "runs": 3}}})
    b = U.band_for(U.Regime("hgx", "dense", None, False, False, "fp8", "hopper"), "megatron-x", table=t)
    assert b.half_width == pytest.approx(0.05 + 0.1)
    # a table without fitted_archs (older tables, other stacks) checks nothing
    t["pools"]["megatron-x"].pop("fitted_archs")
    assert U.band_for(U.Regime("hgx", "dense", None, False, False, "fp8", "hopper"), "megatron-x",
                      table=t).extrapolated is None


def test_shipped_generations_follow_from_the_rows():
    """fitted_archs of the default stack = the generations of its own rows in calibration.csv (an
    independent read of the CSV); its Hopper cells count the published Hopper runs of the family."""
    t = U.load_table()
    pool = t["pools"][DEFAULT_STACK]
    own = {get_gpu(r["gpu"].strip()).arch for r in read_rows(TABLES[-1]) if r["stack"].strip() == DEFAULT_STACK}
    assert set(pool["fitted_archs"]) == own and "hopper" not in own
    hopper = pool["generations"]["hopper"]
    assert sum(c["runs"] for c in hopper.values()) >= len(H100_ROWS) - 2   # a few id+figure repeats count once
    for cell in hopper.values():
        assert cell["half_width"] >= t["floor"] and math.isfinite(cell["half_width"])
