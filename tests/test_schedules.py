"""Pipeline schedules that run: the micro-batch rules of planner/rules.py, and plans that obey them.

M = GBS / (MBS * DP) micro-batches per step enter each pipeline.

* megatron-core 0.19.2, interleaved schedule (VPP > 1): PP <= N <= M and M % N in {0} U [PP, N), with
  N = microbatch_group_size_per_vp_stage (topoplan leaves it at its default, PP). Oracles: the closed
  form "M >= PP and M % PP == 0" by hand here; megatron's own schedule function, driven with the
  emitted arguments, in tests/test_emit_trainers.py (tests/trainers/megatron_check.py, step 5).
* torchtitan 0.3.0 (torch.distributed.pipelining): 1F1B needs M >= PP; Interleaved1F1B needs
  M % max(1, M // PP) == 0. Oracle: torchtitan's own ``_build_pipeline_schedule``, which constructs
  torch's schedule (and its whole per-rank order) on real PipelineStages over a fake process group.
* Property: no plan ``plan()`` returns breaks them (hypothesis over random small requests), and
  without the rules the search does return such plans (so the property can fail).
"""

from __future__ import annotations

import contextlib
import io
import logging

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from planner import rules
from planner.trainers.megatron import rules as megatron_rules
from planner.trainers.torchtitan.rules import torchtitan_schedule_problem
from planner.config import ParallelConfig, Training
from planner.errors import InfeasibleError, InputError
from planner.model.spec import load_model
from planner.search.plan import plan
from trainers.plans import hgx_cluster

SCHEDULE_RULES = ("megatron_interleaved_microbatches", "torchtitan_pipeline_microbatches")


# --- the rules by hand --------------------------------------------------------------------------

@pytest.mark.parametrize("pp,m,n,ok", [
    (2, 1, None, False),    # Qwen3-30B PP2 VPP8 DP512 MBS2 GBS1024: M = 1 < PP
    (6, 1, None, False),    # DeepSeek-V3 PP6 VPP8 DP8 GBS8
    (4, 4, None, True),
    (4, 8, None, True),
    (4, 6, None, False),    # remainder 6 % 4 = 2 in (0, 4)
    (4, 6, 6, True),        # N = M: one group, no remainder
    (4, 9, 5, True),        # 9 % 5 = 4 >= PP
    (4, 9, 6, False),       # 9 % 6 = 3 < PP
    (4, 8, 3, False),       # N < PP
    (4, 8, 9, False),       # N > M
    (3, 5, 3, False),       # the example of ModelParallelConfig's docstring with PP3: 5 % 3 = 2
    (2, 5, 3, True),        # ModelParallelConfig docstring: PP2 VP2 N3 M5 (5 % 3 = 2 >= PP)
])
def test_megatron_interleaved_rule_by_hand(pp, m, n, ok):
    msg = megatron_rules.megatron_interleaved_problem(pp, m, n)
    assert (msg is None) == ok, msg
    if not ok:
        assert "should range in" in msg or "remainder of M" in msg


def test_megatron_rule_with_default_group_is_m_ge_pp_and_multiple():
    for pp in range(2, 17):
        for m in range(1, 5 * pp):
            assert (megatron_rules.megatron_interleaved_problem(pp, m) is None) == (m >= pp and m % pp == 0), (pp, m)


@pytest.mark.parametrize("pp,vpp,m,ok", [
    (4, 1, 3, False), (4, 1, 4, True), (4, 1, 5, True),           # 1F1B: M >= PP
    (4, 2, 3, True), (4, 2, 6, True), (4, 2, 9, False),            # rounds 1, 1, 2 (9 % 2)
    (4, 2, 12, True), (4, 2, 13, False), (2, 8, 1, True), (1, 1, 1, True),
])
def test_torchtitan_rule_by_hand(pp, vpp, m, ok):
    assert (torchtitan_schedule_problem(pp, vpp, m) is None) == ok


def test_rules_read_m_from_the_layout():
    qwen = load_model("qwen3-30b-a3b")
    # the plan topoplan gave before: TP1 PP2 VPP8 EP2 DP512 MBS2 at GBS 1024 -> M = 1
    bad = ParallelConfig(tp=1, pp=2, vpp=8, ep=2, mbs=2)
    tr = Training(global_batch=1024, precision="fp8")
    v = rules.violations(qwen, bad, tr, 1024)
    assert [x.rule for x in v] == ["megatron_interleaved_microbatches"] and "M=1" in v[0].message
    assert rules.violations(qwen, bad.model_copy(update={"vpp": 1}), tr, 1024) == []   # plain 1F1B runs M=1
    good = ParallelConfig(tp=1, pp=4, vpp=4, ep=2, mbs=1)                              # M = 4
    assert rules.violations(qwen, good, tr, 1024) == []
    tt = tr.model_copy(update={"trainer": "torchtitan"})
    assert [x.rule for x in rules.violations(qwen, bad.model_copy(update={"vpp": 1, "etp": 1}), tt, 1024)] == [
        "torchtitan_pipeline_microbatches"]


# --- torchtitan's own schedule construction -----------------------------------------------------

def _torchtitan_accepts(pp: int, vpp: int, m: int) -> bool:
    """Build the schedule topoplan emits (1F1B / Interleaved1F1B) with torchtitan 0.3.0's
    ``_build_pipeline_schedule`` on rank 0 of a fake process group of PP ranks."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config.configs import ParallelismConfig
    from torchtitan.distributed import pipeline_parallel as ttpp

    name = "Interleaved1F1B" if vpp > 1 else "1F1B"
    par = ParallelismConfig(pipeline_parallel_degree=pp, pipeline_parallel_schedule=name,
                            pipeline_parallel_microbatch_size=1)
    dist.init_process_group("fake", rank=0, world_size=pp, store=FakeStore())
    try:
        idx = ttpp._get_pp_rank_to_stage_indices_mapping(0, pp, name, pp * vpp)
        stages = [PipelineStage(torch.nn.Linear(2, 2), i, pp * vpp, torch.device("cpu"), group=dist.group.WORLD)
                  for i in idx]
        with contextlib.redirect_stderr(io.StringIO()):
            logging.disable(logging.WARNING)
            try:
                ttpp._build_pipeline_schedule(parallelism=par, local_batch_size=m, stages=stages,
                                              loss_fn=lambda out, tgt: (out.sum(), None))
            finally:
                logging.disable(logging.NOTSET)
        return True
    except ValueError:
        return False
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_torchtitan_rule_equals_torchtitan_schedules():
    pytest.importorskip("torchtitan")
    seen = set()
    for pp in (2, 3, 4):
        for vpp in (1, 2):
            for m in range(1, 3 * pp + 2):
                want = _torchtitan_accepts(pp, vpp, m)
                seen.add(want)
                assert (torchtitan_schedule_problem(pp, vpp, m) is None) == want, (pp, vpp, m)
    assert seen == {True, False}


# --- plans that run -----------------------------------------------------------------------------

def _m(entry, training):
    return rules.num_microbatches(entry.config, training.model_copy(update={"global_batch": entry.gbs}), entry.world)


def _breaks_schedule(entry, training) -> bool:
    """Independent closed forms (not planner.rules): megatron interleaved M >= PP, M % PP == 0;
    torchtitan 1F1B M >= PP, Interleaved1F1B M % max(1, M // PP) == 0."""
    c, m = entry.config, _m(entry, training)
    if c.pp < 2:
        return False
    if training.trainer == "megatron":
        return c.vpp > 1 and (m < c.pp or m % c.pp != 0)
    if c.vpp == 1:
        return m < c.pp
    return m % max(1, m // c.pp) != 0


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(["llama3-8b", "qwen3-30b-a3b", "mixtral-8x7b"]), nodes=st.sampled_from([2, 4, 8]),
       gbs=st.sampled_from([4, 8, 12, 16, 24, 32, 64]), trainer=st.sampled_from(["megatron", "torchtitan"]),
       seq=st.sampled_from([4096, 8192]))
def test_no_plan_breaks_the_schedule_rules(model, nodes, gbs, trainer, seq):
    if trainer == "torchtitan" and model == "mixtral-8x7b":
        trainer = "megatron"
    training = Training(seq_len=seq, global_batch=gbs, precision="bf16", trainer=trainer)
    try:
        res = plan(load_model(model), hgx_cluster("h100", nodes), training, top=3)
    except (InputError, InfeasibleError):   # nothing fits (an honest answer, exit 3 on the CLI)
        return
    for e in res.plans:
        assert not _breaks_schedule(e, training), (e.config.short(), e.world, e.gbs, _m(e, training))


def test_without_the_rules_the_search_breaks_them(monkeypatch):
    """The qwen case of issue 11: with the two rules removed, the search returns interleaved schedules
    with too few micro-batches (before the rules its best was PP2 VPP8 DP512 MBS2, M = 1, which
    megatron-core refuses); with them, none of its top plans does."""
    qwen = load_model("qwen3-30b-a3b")
    from topologies.loader import load_cluster

    cluster = load_cluster("dgx-h100", gpus=1024)
    tr = Training(global_batch=1024, precision="fp8")
    kept = plan(qwen, cluster, tr, top=10).plans
    assert kept and not [e.config.short() for e in kept if _breaks_schedule(e, tr)]
    monkeypatch.setattr(megatron_rules, "RULES", tuple(r for r in megatron_rules.RULES if r.name not in SCHEDULE_RULES))
    loose = plan(qwen, cluster, tr, top=10).plans
    assert [e.config.short() for e in loose if _breaks_schedule(e, tr)]
