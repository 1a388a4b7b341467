"""The EP overlap hides an all-to-all only in paired 1F1B passes (``compose.unpaired_a2a``,
``expert_a2a.unpaired_passes``), checked against megatron-core's own schedule rule and by hand."""

from __future__ import annotations

import math
from unittest import mock

import pytest

from planner.cost.terms import expert_a2a as EA


def _megatron_warmup(pp: int, rank: int, vpp: int, m: int, group: int | None = None) -> int:
    """megatron-core core_v0.17.1 pipeline_parallel/schedules.py get_pp_rank_microbatches (lines 786-842), with
    overlap_moe_expert_parallel_comm=True and forward_only=False, transcribed branch by branch; vpp=None stands for
    the non-interleaved schedule, which transformer_config.py:2099-2103 forbids with the overlap when pp > 1."""
    group = pp if group is None else group          # model_parallel_config.py:444-445
    chunks = vpp or 1
    total = m * chunks
    if pp > 1:
        if vpp is None:
            warm = pp - rank - 1
        else:
            warm = (pp - rank - 1) * 2 + (chunks - 1) * group + 1   # "+ 1": the overlap's extra forward
    else:
        warm = 0
    return min(warm, total)


def _unpaired_passes_by_schedule(pp: int, vpp: int, m: int, rank: int = 0) -> int:
    """Walk the schedule and count the forward and backward chunk passes that run alone (no partner whose
    compute hides their all-to-all). Interleaved (schedules.py forward_backward_pipelining_with_interleaving):
    forward k alone for k < W (:1439), forward k + W with backward k for the rest (:1594-1596, :1746-1748),
    backward k alone for the last W (:1827-1868). No pipelining (combined_1f1b.py
    combined_1f1b_schedule_for_no_pipelining): forward 0 alone, forward i + 1 with backward i, last backward alone."""
    steps = []
    if pp == 1:
        steps.append(("F0", None))
        steps += [(f"F{i + 1}", f"B{i}") for i in range(m - 1)]
        steps.append((None, f"B{m - 1}"))
    else:
        total, warm = m * vpp, _megatron_warmup(pp, rank, vpp, m)
        steps += [(f"F{k}", None) for k in range(warm)]
        steps += [(f"F{k + warm}", f"B{k}") for k in range(total - warm)]
        steps += [(None, f"B{k}") for k in range(total - warm, total)]
    fwd = [f for f, _ in steps if f]
    bwd = [b for _, b in steps if b]
    assert len(fwd) == len(set(fwd)) == len(bwd) == len(set(bwd)) == m * (vpp if pp > 1 else 1)   # every pass once
    return sum(1 for f, b in steps if (f is None) != (b is None))


def test_unpaired_passes_match_megatron_schedule_brute_force():
    """W forwards and W backwards of a rank's chunks run alone: unpaired_passes is their count over 2 vpp
    (micro-batches' worth of the rank's forward + backward all-to-all), for every small pp, vpp, m."""
    for pp in range(1, 9):
        for vpp in ((1,) if pp == 1 else range(1, 5)):
            for m in range(1, 41):
                counted = _unpaired_passes_by_schedule(pp, vpp, m)
                assert EA.unpaired_passes(pp, vpp, m) == pytest.approx(counted / (2 * vpp)), (pp, vpp, m)
                # rank 0 warms up longest: the step's exposure is priced there
                assert all(_unpaired_passes_by_schedule(pp, vpp, m, r) <= counted for r in range(pp))


def test_unpaired_passes_by_hand():
    # PP8 VPP2 m 16 (the B300 EFA cells): W = 2*7 + 1*8 + 1 = 23 of 32 chunk passes -> 11.5 micro-batches
    assert EA.unpaired_passes(8, 2, 16) == 11.5
    # PP2 VPP8 m 32 (DeepSeek-V3 on 256 GB300, GBS 4096 at DP128 MBS1): W = 2 + 7*2 + 1 = 17 -> 17/8
    assert EA.unpaired_passes(2, 8, 32) == pytest.approx(2.125)
    assert EA.unpaired_passes(4, 2, 16) == 5.5          # W = 6 + 4 + 1 = 11
    assert EA.unpaired_passes(8, 2, 4) == 4.0           # 8 chunk passes, all in warm-up: every pass unpaired
    assert EA.unpaired_passes(1, 1, 8) == 1.0           # no pipelining: first forward and last backward alone
    assert EA.unpaired_passes(1, 1, 1) == 1.0


def _dsv3_b300_overlap_on():
    from bench.ab_efa import rows
    return next(r for r in rows() if r["group"] == "p6-b300-dsv3-256" and r["a2a_overlap"] == "on"
                and r["dispatcher"] == "alltoall")


def test_predict_breakdown_shows_the_unpaired_all_to_all():
    """The term lands in breakdown["ep_a2a"] and in the step, linear in the unpaired passes: with them set to 0
    the model is the one before the term; with 1 it adds one micro-batch's hidden all-to-all of rank 0, which is
    positive and at most the rank's raw all-to-all; the shipped value adds unpaired_passes times that."""
    from bench.ab_efa import predicted

    r = _dsv3_b300_overlap_on()
    assert (r["pp"], r["vpp"]) == ("8", "2")
    p = predicted(r)
    m = p.details["microbatches"]
    passes = EA.unpaired_passes(8, 2, m)
    assert m == 16 and passes == 11.5        # GBS 256 over DP4 (256 / TP8 PP8) x MBS 4; W = 23 of 32 chunk passes

    def with_passes(v):
        with mock.patch.object(EA, "unpaired_passes", lambda pp, vpp, mm: v):
            return predicted(r)

    p0, p1 = with_passes(0.0), with_passes(1.0)
    hidden = p1.breakdown["ep_a2a"] - p0.breakdown["ep_a2a"]
    moe_layers_rank0 = math.ceil(61 / 8)      # DeepSeek-V3's 61 layers over 8 stages: at most 8 MoE layers on rank 0
    assert 0 < hidden <= moe_layers_rank0 * p.details["a2a_layer_s"]
    assert p.breakdown["ep_a2a"] - p0.breakdown["ep_a2a"] == pytest.approx(passes * hidden, rel=1e-9)
    for k in p.breakdown:
        if k not in ("ep_a2a", "sync"):
            assert p.breakdown[k] == pytest.approx(p0.breakdown[k], rel=1e-12), k
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s)
    assert p.step_time_s > p0.step_time_s + passes * hidden * 0.999


def test_no_term_without_the_overlap():
    """With overlap_moe_expert_parallel_comm off nothing is hidden, so the unpaired passes cost nothing."""
    from bench.ab_efa import predicted

    r = dict(_dsv3_b300_overlap_on(), a2a_overlap="off", vpp="1")
    p = predicted(r)
    with mock.patch.object(EA, "unpaired_passes", lambda pp, vpp, mm: 0.0):
        p0 = predicted(r)
    assert p.step_time_s == p0.step_time_s
