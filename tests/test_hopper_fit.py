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
    for key in info["fitted"] + ["mem.elementwise_eager@hopper"]:
        assert shipped.params[key].value == pytest.approx(fitted.params[key].value, rel=0.01), key
    assert not shipped.params["mem.elementwise_eager@hopper"].fit
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


def test_eager_multiplier_on_hopper_is_the_blackwell_extra_scaled_by_hbm_bandwidth():
    """mem.elementwise_eager@hopper by hand: 26.08's graph-captured 1.351 plus its eager extra (3.177 - 1.351, fitted
    on 8 TB/s B300/GB200/GB300 runs) times H100's 3.35 TB/s over 8: 1.351 + 1.826 x 0.41875 = 1.351 + 0.76464 = 2.1156."""
    from bench.hopper import eager_hopper

    prof = load_profile(DEFAULT_STACK)
    graph, eager = prof.params["mem.elementwise"].value, prof.params["mem.elementwise_eager"].value
    assert (graph, eager) == (1.351, 3.177)
    assert eager_hopper(prof) == pytest.approx(1.351 + (3.177 - 1.351) * 3.35 / 8.0, rel=1e-9)
    assert prof.params["mem.elementwise_eager@hopper"].value == pytest.approx(2.1156, abs=1e-4)


def test_hopper_rows_in_sample_and_held_out():
    """With their recipes, 15 of the 17 published H100 rows are predicted within 10% in sample and the held-out
    (leave-one-table-out) MAPE stays below 10% (9.95% at the refit with the unpaired-pass term, 9.4% in sample). The two beyond, documented in docs/steptime.md
    ("Hopper"): h100-q30 of 25.11 (121 TFLOP/s dropless; the same layout ran 241 with token dropping in the 25.09
    table), over-predicted by more than half, and mb201 (EP16 HybridEP, host-bound in the model), which the fitted
    host launch cost under-predicts because the 26.02 DeepEP run of the same model wants a higher one."""
    from bench.hopper import leave_one_table_out

    rows = hopper_rows()
    errs = dict(errors(rows, load_profile(DEFAULT_STACK)))
    beyond = sorted(k.rsplit("/", 1)[1] for k, e in errs.items() if abs(e) > 10)
    assert beyond == ["h100-q30", "mb201"], beyond
    assert errs[next(k for k in errs if k.endswith("megatron-25.11/h100-q30"))] > 50
    assert -25 < errs[next(k for k in errs if k.endswith("/mb201"))] < 0
    assert statistics.mean(abs(e) for _, e in leave_one_table_out(rows)) < 10
