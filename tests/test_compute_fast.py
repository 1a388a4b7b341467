"""``planner.cost.terms.compute.layer_time`` memoises the GEMM part of a layer per work object and
efficiencies: its figures must equal the documented formulas written out here (module docstring:
t_gemm = 2MNK / (peak * eff * d/(d+d_half) [* M_e/(M_e+m_half)]), backward = 2 x forward, attention
backward = 2.5 x forward), whatever order layers, recompute choices and efficiencies come in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from planner.cost.terms import compute as C

DS = planner.load_model("deepseek-v3")
LLAMA = planner.load_model("llama3-70b")

EFF = dict(peak_lp=5e15, peak_bf16=2.5e15, eff_lp=0.7, eff_bf16=0.75, dim_half=256.0, m_half=128.0,
           attn_eff=0.6, hbm_bps=7e12, elem_factor=1.2, quant_factor=1.1, quant_bytes=4.0)


def hand_layer(work, e, recompute):
    """fwd, bwd, expert, attention core, recompute and forward GEMM seconds from the formulas."""
    by_mod = {}
    for g in work.gemms:
        peak, eff = (e["peak_lp"], e["eff_lp"]) if g.low_precision else (e["peak_bf16"], e["eff_bf16"])
        d = min(g.m, g.n, g.k)
        f = eff * d / (d + e["dim_half"])
        if g.grouped_m is not None:
            f *= g.grouped_m / (g.grouped_m + e["m_half"])
        by_mod[g.module] = by_mod.get(g.module, 0.0) + 2 * g.m * g.n * g.k / (peak * f)
    gemm = sum(by_mod.values())
    attn = work.attn_flops / (e["peak_bf16"] * e["attn_eff"])
    per_elem = 2 * e["elem_factor"] / e["hbm_bps"]
    elem = work.elem_elements * per_elem
    quant = work.quant_elements * e["quant_bytes"] * e["quant_factor"] / e["hbm_bps"]
    fwd = gemm + attn + elem + quant / 2
    em = work.elem_by_module
    expert = by_mod.get("expert", 0.0) + (em.get("moe_act", 0.0) + em.get("moe_permute", 0.0)) * per_elem
    rc = {"full": fwd, (): 0.0, ("core_attn",): attn,
          ("moe_act",): em.get("moe_act", 0.0) * per_elem,
          ("mlp",): by_mod.get("mlp", 0.0) + em.get("mlp", 0.0) * per_elem,
          ("moe",): expert + by_mod.get("router", 0.0)}[recompute]
    bwd = 2 * gemm + 2.5 * attn + 2 * elem + quant / 2 + rc
    return fwd, bwd, 3 * expert, 3.5 * attn, rc, gemm


WORKS = [
    (DS, "moe", 4096, 1, 1, 8, True),
    (DS, "dense", 4096, 2, 1, 1, True),
    (DS, "moe", 4096, 2, 2, 32, False),
    (LLAMA, "dense", 8192, 1, 4, 1, False),
]


@settings(max_examples=40, deadline=None)
@given(
    picks=st.lists(st.tuples(st.sampled_from(range(len(WORKS))),
                             st.sampled_from(["full", (), ("core_attn",), ("moe_act",), ("mlp",), ("moe",)]),
                             st.sampled_from([1.0, 0.5, 2.0]),
                             st.sampled_from([128.0, 512.0])),
                   min_size=1, max_size=12),
)
def test_layer_time_matches_the_formulas_in_any_call_order(picks):
    for wi, rc, scale, dim_half in picks:
        model, kind, seq, mbs, tp, ep, lp = WORKS[wi]
        work = C.layer_work(model, kind, False, seq, mbs, tp, 1, ep, tp, lp)
        e = dict(EFF, peak_lp=EFF["peak_lp"] * scale, dim_half=dim_half)
        lt = C.layer_time(work, recompute=rc, **e)
        got = (lt.fwd, lt.bwd, lt.expert, lt.attn_core, lt.recompute, lt.gemm_fwd)
        assert got == pytest.approx(hand_layer(work, e, rc), rel=1e-12)


def test_a_work_with_the_same_modules_but_other_gemms_is_priced_afresh():
    work = C.layer_work(DS, "moe", False, 4096, 1, 1, 1, 8, 1, True)
    first = C.layer_time(work, **EFF)
    # the same module names, every GEMM twice as deep: a new object, twice the GEMM seconds
    deeper = C.LayerWork(tuple(C.Gemm(g.module, g.m, g.n, 2 * g.k, g.low_precision, g.grouped_m)
                               for g in work.gemms), work.attn_flops, work.elem_elements,
                         dict(work.elem_by_module), work.quant_elements)
    second = C.layer_time(deeper, **EFF)
    assert second.gemm_fwd > 1.5 * first.gemm_fwd
    assert second.gemm_fwd == pytest.approx(hand_layer(deeper, EFF, ())[5], rel=1e-12)
