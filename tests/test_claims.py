"""bench/claims.py --explain: the term differences by hand, which claims are explained, and on a
published run that the step-time difference is the whole claim (same global batch, same GPUs)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _claims():
    spec = importlib.util.spec_from_file_location("bench_claims", ROOT / "bench" / "claims.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _result(rid, nv, pl):
    t_nv, t_pl = sum(nv.values()), sum(pl.values())
    return {"id": rid, "model": "m", "gpus": "8 GB300", "precision": "fp8", "nvidia": "TP4", "plan": "TP1 CP4",
            "nvidia_step": t_nv, "plan_step": t_pl, "nvidia_breakdown": nv, "plan_breakdown": pl,
            "nvidia_mem": 100.0, "plan_mem": 120.0, "hbm": 288.0, "gain": t_nv / t_pl - 1.0}


def test_term_differences_by_hand():
    c = _claims()
    r = _result("x", {"compute": 8.0, "tp_comm": 1.5, "pp_bubble": 0.2, "cp_comm": 0.0},
                {"compute": 8.1, "tp_comm": 0.0, "pp_bubble": 0.6, "cp_comm": 0.3})
    diffs = c.term_differences(r)
    # 9.7 s -> 9.0 s: tp_comm -1.5, pp_bubble +0.4, cp_comm +0.3, compute +0.1
    assert [d[0] for d in diffs] == ["tp_comm", "pp_bubble", "cp_comm", "compute"]
    assert diffs[0][1:4] == pytest.approx((1.5, 0.0, -1.5))
    assert diffs[0][4] == pytest.approx(-1.5 / 9.7)
    # the shares add up to the whole claim: 1 - T_planner / T_nvidia = gain / (1 + gain)
    assert sum(d[4] for d in diffs) == pytest.approx(-(r["gain"] / (1 + r["gain"])))


def test_explain_lists_only_claims_above_the_threshold_largest_first():
    c = _claims()
    small = _result("small", {"compute": 10.0}, {"compute": 9.5})              # +5.3%
    big = _result("big", {"compute": 10.0, "tp_comm": 3.0}, {"compute": 10.0})  # +30%
    mid = _result("mid", {"compute": 10.0, "ep_a2a": 1.5}, {"compute": 10.0})   # +15%
    lines = c.explain([small, {"id": "bad", "error": "infeasible"}, mid, big])
    heads = [ln.split()[0] for ln in lines[1:] if not ln.startswith(" ")]
    assert heads == ["big", "mid"]
    start = lines.index(next(ln for ln in lines if ln.startswith("big"))) + 1
    block = lines[start:lines.index(next(ln for ln in lines if ln.startswith("mid")))]
    assert len(block) == 3    # its two terms (fewer than three) and the rest
    assert block[0].split()[0] == "tp_comm" and "-3.000 s" in block[0] and "-23.1%" in block[0]   # -3 / 13 s
    assert block[1].split()[0] == "compute" and "+0.000 s" in block[1]
    assert block[2].split()[:2] == ["the", "rest"] and "in all -3.000 s = -23.1% of NVIDIA's step" in block[2]


def test_a_published_claim_is_its_step_time_difference():
    from planner.cost.profiles import CALIBRATION_CSV as csv
    from planner.calibration.validate import read_rows

    c = _claims()
    row = next(r for r in read_rows(csv) if r["id"] == "mb223")
    r = c.claim((row, str(csv), 60.0))
    assert "error" not in r
    for side in ("nvidia", "plan"):
        assert sum(r[f"{side}_breakdown"].values()) == pytest.approx(r[f"{side}_step"], rel=1e-9)
    # same global batch and sequence on the same GPUs: the TFLOP/s ratio is the step-time ratio
    assert math.isclose(r["gain"], r["nvidia_step"] / r["plan_step"] - 1.0, rel_tol=1e-4)
    assert r["plan_mem"] <= r["hbm"] * 0.95 + 1e-6   # planned with the default 5% headroom
