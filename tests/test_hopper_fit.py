"""Hopper fitted from Hopper runs (issue 21 item 3): the default stack's @hopper parameters are what
bench/hopper.py fits to the published Megatron H100 rows only, they change no other generation's
prediction, and they bring the H100 rows closer than the shared values did."""

from __future__ import annotations

import statistics

import pytest

from bench.hopper import HOPPER_PARAMS, errors, fit, hopper_rows, unfitted
from planner.cost.profiles import CALIBRATION_CSV, DEFAULT_STACK, load_profile
from planner.calibration.validate import predict_case, read_rows, row_case


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


def test_gpt_oss_h100_rows_count_legacy_flops_so_the_fit_compares_tokens():
    """The published GPT-OSS H100 rows (26.02, 26.04.01 and 25.11 tables) divide to the legacy formula's FLOPs per
    token (Megatron-Bridge <= v0.4.x), which is 20% below the current formula the default stack reports; the Hopper
    fit and the band check therefore compare tokens/s (bench.hopper.ratio), which no FLOP convention changes."""
    from bench.hopper import ratio
    from planner.model.flops import flops_per_token
    from planner.model.spec import load_model

    model = load_model("gpt-oss-120b")
    legacy, current = (flops_per_token(model, 4096, 1, f) for f in ("legacy", "current"))
    assert current / legacy == pytest.approx(1.20, abs=0.01)
    oss = [r for r in hopper_rows() if r["model"] == "gpt-oss-120b"]
    assert len(oss) == 3
    prof = load_profile(DEFAULT_STACK)
    for r in oss:
        per_token = float(r["model_tflops_per_gpu"]) * 1e12 / float(r["tokens_per_s_per_gpu"])
        assert per_token == pytest.approx(legacy, rel=0.01), r["id"]   # the table's own convention
        p = predict_case(row_case(r, DEFAULT_STACK, r["table"], profile=prof), prof)
        assert ratio(p, r) == pytest.approx(p.tokens_per_s_per_gpu / float(r["tokens_per_s_per_gpu"]))
        assert p.tflops_per_gpu / float(r["model_tflops_per_gpu"]) == pytest.approx(1.20 * ratio(p, r), rel=0.01)


def test_hopper_rows_within_20_percent_but_the_unexplained_qwen3_30b_of_25_11():
    """With their recipes, every published H100 row but one is predicted within 20% in sample (6.1% mean) and the
    held-out MAPE stays below 16% (15.2% at the refit). The exception, h100-q30 (25.11: 121 TFLOP/s dropless, the
    same layout ran 241 with token dropping in the 25.09 table), is over-predicted twice: docs/steptime.md, Hopper."""
    from bench.hopper import leave_one_table_out

    rows = hopper_rows()
    errs = dict(errors(rows, load_profile(DEFAULT_STACK)))
    odd = [k for k in errs if k.endswith("megatron-25.11/h100-q30")]
    assert len(odd) == 1 and errs[odd[0]] > 60
    rest = [abs(e) for k, e in errs.items() if k not in odd]
    assert max(rest) < 20 and statistics.mean(rest) < 7
    assert statistics.mean(abs(e) for _, e in leave_one_table_out(rows)) < 16
