"""NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN against HybridEP's own rules (issue 23 item 3).

The oracle is DeepEP's ``hybrid-ep`` branch, ``deep_ep/hybrid_ep_buffer.py`` lines 74-83 (commit 94a9f8f)::

    assert (
        self.group_size % self.num_of_hybrid_ep_ranks_per_nvlink_domain == 0
    ), f"The number of ranks {self.group_size} should be divisible by the number of ranks per node ..."
    self.local_rank = self.rank % self.num_of_hybrid_ep_ranks_per_nvlink_domain
    self.node_rank = self.rank // self.num_of_hybrid_ep_ranks_per_nvlink_domain

with ``group`` Megatron's ``tp_ep_group`` (megatron-core 0.19.2 ``MoEFlexTokenDispatcher``) and the ranks of
one ``node_rank`` sharing GPU memory over NVLink (``detect_accessible_ranks``). ``hybrid_ep_init`` below
replays those lines on the plan's own placement.
"""

from __future__ import annotations

import pytest

from planner.config import ParallelConfig, Training
from planner.cost.placement import rank_groups
from planner.errors import InputError
from planner.output.emit import load_context
from planner.cost.hybridep import hybrid_ep_ranks_per_domain
from planner.trainers.megatron.emit import megatron_env
from trainers.plans import hgx_cluster, nvl72_cluster, plan_doc

T = Training(seq_len=4096, global_batch=4096, precision="mxfp8")


def hybrid_ep_init(group: list[int], domains, n: int) -> None:
    """HybridEPBuffer.__init__'s checks for every rank of ``group`` (group rank = index in sorted ranks)."""
    size = len(group)
    assert size % n == 0, f"The number of ranks {size} should be divisible by the number of ranks per node {n}"
    nodes: dict[int, set] = {}
    for rank, g in enumerate(sorted(group)):
        nodes.setdefault(rank // n, set()).add(domains[g])
    # the ranks of one HybridEP node must share one NVLink domain, and two nodes are two domains
    assert all(len(d) == 1 for d in nodes.values()), nodes
    assert len({next(iter(d)) for d in nodes.values()}) == len(nodes)


def _env_and_ctx(cluster, config, world, per_domain="auto"):
    ctx = load_context(plan_doc("deepseek-v3", cluster, config, T, world=world, gpus_per_domain=per_domain), 0)
    return megatron_env(ctx), ctx


@pytest.mark.parametrize("config, per_domain, expected", [
    (ParallelConfig(pp=2, ep=128, dispatcher="flex-hybridep"), 64, 64),    # 2 racks, 64 of 72 used each
    (ParallelConfig(pp=1, ep=256, dispatcher="flex-hybridep"), 64, 64),    # 4 racks, 64 of 72
    (ParallelConfig(pp=2, vpp=8, ep=32, dispatcher="flex-hybridep"), 64, 32),   # NVIDIA's layout: one rack
    (ParallelConfig(pp=4, ep=64, dispatcher="flex-hybridep"), 64, 64),
    (ParallelConfig(tp=2, pp=2, ep=32, etp=2, dispatcher="flex-hybridep"), 64, 64),  # tp_ep = etp * ep
])
def test_ranks_per_domain_is_what_the_plan_uses_on_nvl72(config, per_domain, expected):
    env, ctx = _env_and_ctx(nvl72_cluster("gb300", 4), config, 256, per_domain)
    n = int(env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"])
    assert n == expected
    for group in rank_groups(ctx.config, ctx.world, "etp-ep", ctx.order):
        hybrid_ep_init(group, ctx.domains, n)


def test_ranks_per_domain_on_hgx():
    env, ctx = _env_and_ctx(hgx_cluster("h100", 8), ParallelConfig(pp=2, ep=32, dispatcher="flex-hybridep"), 64)
    n = int(env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"])
    assert n == 8
    for group in rank_groups(ctx.config, ctx.world, "etp-ep", ctx.order):
        hybrid_ep_init(group, ctx.domains, n)


def test_uneven_groups_are_refused_in_one_line():
    # 72 of 72 GPUs per rack with EP64 groups: the second group straddles two racks (8 + 56 ranks),
    # which no single value can describe; the emitter must refuse rather than write a value HybridEP asserts on
    cluster = nvl72_cluster("gb300", 2)
    doc = plan_doc("deepseek-v3", cluster, ParallelConfig(pp=1, ep=64, dispatcher="flex-hybridep"), T,
                   world=128, gpus_per_domain=None)
    ctx = load_context(doc, 0)
    with pytest.raises(InputError) as err:
        hybrid_ep_ranks_per_domain(ctx.config, ctx.world, ctx.order, ctx.domains)
    assert "flex-hybridep" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_the_planner_offers_hybridep_only_where_it_runs():
    # four full GB300 racks (72 GPUs each): an EP32 group at ranks 64..95 straddles two racks (8 + 24), which
    # HybridEP cannot run; before, such plans came first and their launch files asserted in HybridEP
    from planner.model.spec import load_model
    from planner.search.plan import plan
    from topologies.loader import load_job

    doc = plan(load_model("deepseek-v3"), load_job("gb300-nvl72", gpus=288),
               Training(seq_len=4096, global_batch=4608, precision="mxfp8"), top=5).to_dict()
    hybrid = [i for i, p in enumerate(doc["plans"]) if p["config"]["dispatcher"] == "flex-hybridep"]
    assert hybrid   # the control: HybridEP is still chosen where it runs
    for i in hybrid:
        ctx = load_context(doc, i)
        n = int(megatron_env(ctx)["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"])
        for group in rank_groups(ctx.config, ctx.world, "etp-ep", ctx.order):
            hybrid_ep_init(group, ctx.domains, n)
