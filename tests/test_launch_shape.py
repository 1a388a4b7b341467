"""planner.cost.shape: the plan as a shape. Oracles: the trainer's own groups (rank_groups, checked
against megatron-core elsewhere) decide which axes are domain-local, and the rank map rebuilt on the
plan's own hosts gives back the plan's hosts and GPUs rank by rank."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Training
from planner.cost.placement import AXES, make_placement, rank_groups
from planner.cost.shape import LaunchShape, shape_of_placement
from planner.launch.core import need_text
from planner.output.emit import launch_shape_of, load_context
from planner.search.document import PlanDocument
from trainers.plans import hgx_cluster, nvl72_cluster, plan_doc


def _local_by_groups(config, world, rank_domain, order):
    """Every axis of size > 1 whose every rank_groups group lies in one domain (brute force)."""
    out = {}
    for axis in AXES:
        groups = rank_groups(config, world, axis, order)
        if len(groups[0]) > 1 and all(len({rank_domain[r] for r in g}) == 1 for g in groups):
            out[axis] = len(groups[0])
    return out


ORDERS = ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-pp-dp-cp-ep"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(racks=st.integers(1, 4), trays=st.sampled_from([8, 16, 18]), tp=st.sampled_from([1, 2, 4]),
       ep=st.sampled_from([1, 2, 4, 8, 16]), pp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]),
       gpd=st.sampled_from([None, 32, 48]), order=st.sampled_from(ORDERS), nvl=st.booleans())
def test_shape_matches_the_trainers_groups(racks, trays, tp, ep, pp, cp, gpd, order, nvl):
    cluster = nvl72_cluster("gb200", racks, trays) if nvl else hgx_cluster("h100", racks * 2)
    config = ParallelConfig(tp=tp, ep=ep, pp=pp, cp=cp, mbs=1, recompute="none")
    world = cluster.num_gpus if gpd is None or not nvl else min(gpd, trays * 4) * racks
    world -= world % math.lcm(tp * cp * pp, tp * ep * pp)
    assume(world > 0)
    placement = make_placement(cluster, config, world, gpus_per_domain=gpd if nvl else None, order=order)
    shape = shape_of_placement(cluster, config, placement)
    gpus = cluster.gpus()
    picked = [gpus[g] for g in placement.rank_to_gpu]
    assert shape.local_axes == _local_by_groups(config, world, [g.domain for g in picked], order)
    # the rank map on the plan's own hosts gives the plan back
    slot_hosts: dict[tuple[int, int], str] = {}
    for (s, h, local), g in zip(shape.ranks, picked):
        assert slot_hosts.setdefault((s, h), g.node) == g.node
        assert local == g.local
    assert len(set(slot_hosts.values())) == len(slot_hosts) == shape.hosts
    # each slot's hosts lie in one domain, and slots differ in domain
    dom = {}
    for (s, _), host in slot_hosts.items():
        dom.setdefault(s, set()).add(cluster.node_domain(host))
    assert all(len(v) == 1 for v in dom.values())
    assert len({next(iter(v)) for v in dom.values()}) == len(shape.slots)
    assert shape.multi_host_domains == nvl


def test_dsv3_on_four_racks_of_sixteen_trays():
    """DeepSeek-V3 TP1 PP2 EP32 on 256 GB300 (64 per rack): four slots of 16 trays; EP32 stays in a rack."""
    cluster = nvl72_cluster("gb300", 4)
    config = ParallelConfig(tp=1, pp=2, vpp=8, ep=32, mbs=1, recompute="none")
    doc = plan_doc("deepseek-v3", cluster, config, Training(seq_len=4096, global_batch=4096, precision="mxfp8"),
                   world=256, gpus_per_domain=64)
    ctx = load_context(doc)
    shape = launch_shape_of(ctx)
    assert [(s.hosts, s.gpus_per_host, s.name) for s in shape.slots] == [(16, 4, f"r0{i}") for i in range(1, 5)]
    assert shape.local_axes == {"ep": 32} and need_text(shape.model_dump()) == "an EP32 group set"
    assert shape.gpus_per_host == 4 and shape.world == 256 and shape.hosts == 64
    assert shape.ranks[4] == (0, 1, 0) and shape.ranks[64] == (1, 0, 0)
    # the shape survives JSON, and a placement without one (an older plan.json) still loads
    assert LaunchShape.model_validate_json(shape.model_dump_json()) == shape


def test_plan_document_carries_the_shape(tmp_path):
    import planner
    from planner import load_model, plan
    from topologies.loader import load_job
    result = plan(load_model("llama3-8b"), load_job("dgx-h100", 16),
                  Training(seq_len=4096, global_batch=64, precision="bf16"), top=1)
    doc = result.to_dict()
    placement = doc["plans"][0]["placement"]
    shape = LaunchShape.model_validate(placement["shape"])
    assert shape.world == len(placement["rank_to_gpu"])
    old = {**doc, "plans": [{**doc["plans"][0], "placement": {k: v for k, v in placement.items() if k != "shape"}}]}
    assert PlanDocument.model_validate(old).plans[0].placement.shape is None
    # the library call takes the PlanResult itself; on the plan's own hosts it gives the plan's hosts back
    # (hosts in name order inside a domain: HGX hosts are their own domains, so the order is the plan's)
    assert planner.place(result, list(dict.fromkeys(placement["hosts"]))).hosts == placement["hosts"]
    assert planner.place(old, list(dict.fromkeys(placement["hosts"]))).shape == shape
