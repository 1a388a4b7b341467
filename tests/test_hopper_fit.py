"""Hopper fitted from Hopper runs (issue 21 item 3): the default stack's @hopper parameters are what
bench/hopper.py fits to the published Megatron H100 rows only, they change no other generation's
prediction, and they bring the H100 rows closer than the shared values did."""

from __future__ import annotations

import statistics

import pytest

from bench.hopper import HOPPER_PARAMS, errors, fit, hopper_rows, unfitted
from planner.cost.profiles import CALIBRATION_CSV, DEFAULT_STACK, load_profile
from planner.cost.validate import predict_case, read_rows, row_case


@pytest.mark.slow
def test_shipped_hopper_parameters_are_the_fit_to_hopper_rows():
    rows = hopper_rows()
    assert rows and {r["gpu"].strip().upper() for r in rows} == {"H100"}
    shipped = load_profile(DEFAULT_STACK)
    fitted, info = fit(rows)
    assert info["fitted"] == [f"{n}@hopper" for n in HOPPER_PARAMS]
    for key in info["fitted"]:
        assert shipped.params[key].value == pytest.approx(fitted.params[key].value, rel=0.01), key
    before = statistics.mean(abs(e) for _, e in errors(rows, unfitted(shipped)))
    after = statistics.mean(abs(e) for _, e in errors(rows, shipped))
    assert after < 0.8 * before


def test_hopper_parameters_move_no_other_generation():
    """Every non-Hopper row of calibration.csv is predicted identically with and without them."""
    prof = load_profile(DEFAULT_STACK)
    bare = unfitted(prof)
    assert any(k.endswith("@hopper") for k in prof.params) and not any(k.endswith("@hopper") for k in bare.params)
    n = 0
    for r in read_rows(CALIBRATION_CSV):
        if r["stack"] != DEFAULT_STACK or r["gpu"].strip().upper() in ("H100", "H200", "H800"):
            continue
        a = predict_case(row_case(r, DEFAULT_STACK, "calibration.csv", profile=prof), prof).tflops_per_gpu
        b = predict_case(row_case(r, DEFAULT_STACK, "calibration.csv", profile=bare), bare).tflops_per_gpu
        assert a == b, r["id"]
        n += 1
    assert n >= 10
