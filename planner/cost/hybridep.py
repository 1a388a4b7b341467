"""HybridEP's ranks per NVLink domain: the value of ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``.

Megatron's flex dispatcher with the ``hybridep`` backend builds one ``HybridEPBuffer`` per expert
tensor-and-expert-parallel group (``tp_ep_group``: ``etp x ep`` ranks, megatron-core 0.19.2
``MoEFlexTokenDispatcher``). DeepEP's ``hybrid-ep`` branch (``deep_ep/hybrid_ep_buffer.py``, lines 74-83
at commit 94a9f8f) reads the environment variable as ``n`` and asserts ``group_size % n == 0``; group rank
``r`` is then local rank ``r % n`` of "node" (NVLink domain) ``r // n``. So ``n`` is the number of the
group's ranks that one NVLink domain holds in this plan (64 on NVL72 racks of which the job uses 64),
not the size of the domain (72), and each block of ``n`` consecutive group ranks must sit in one domain.
The planner offers HybridEP only on placements where this holds (``planner.search.plan``'s lazy
constraint), and the Megatron emitter writes the value (``planner.trainers.megatron.emit.megatron_env``).
"""

from __future__ import annotations

from planner.cost.placement import rank_groups
from planner.errors import InputError


def hybridep_runs(config, world: int, order: str, domains) -> bool:
    """Whether HybridEP can run the layout on this placement (:func:`hybrid_ep_ranks_per_domain` finds a value)."""
    try:
        hybrid_ep_ranks_per_domain(config, world, order, domains)
    except InputError:
        return False
    return True


def hybrid_ep_ranks_per_domain(config, world: int, order: str, domains) -> int:
    """Ranks of each ``etp x ep`` group per NVLink domain, as the plan places them.

    ``domains[r]`` is the NVLink domain of global rank ``r``. Group ranks follow ascending global rank
    (``torch.distributed.new_group`` sorts them). Raises InputError when no ``n`` satisfies HybridEP:
    the group's ranks must fill whole domains in blocks of the same size."""
    found: set[int] = set()
    for group in rank_groups(config, world, "etp-ep", order):
        members = sorted(group)
        doms = [domains[r] for r in members]
        n = doms.count(doms[0])
        blocks = [doms[i:i + n] for i in range(0, len(doms), n)]
        if len(doms) % n or any(len(set(b)) != 1 for b in blocks) or len({b[0] for b in blocks}) != len(blocks):
            raise InputError(
                f"dispatcher flex-hybridep: the {len(members)}-rank expert group {members[:4]}... spreads unevenly "
                "over NVLink domains (HybridEP needs the same number of its ranks in each domain, consecutively); "
                "plan with --usable-per-rack dividing etp*ep, or another dispatcher")
        found.add(n)
    if len(found) != 1:
        raise InputError(f"dispatcher flex-hybridep: the expert groups hold {sorted(found)} ranks per NVLink domain; "
                         "HybridEP takes one value for the job: plan with --usable-per-rack dividing etp*ep")
    return found.pop()
