"""Pipeline point-to-point priced per hop (planner/cost/terms/pipeline.py ``crossing_hops``, ``hop_p2p``):
the hops that leave an NVLink domain counted against brute force over Megatron's rank groups, the mean
transfer by hand, and predict on NVL72 racks (more racks: more hops between them) and on HGX (unchanged)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Training
from planner.cost.placement import group_shapes, make_placement, rank_groups
from planner.cost.predict import predict
from planner.cost.profiles import load_profile
from planner.cost.steptime import profile_fabric
from planner.cost.terms import pipeline as PPL
from planner.model.spec import load_model
from topologies.collectives import GroupShape, fabric_for
from topologies.loader import load_cluster


def brute_crossing(domains_of_stages: list[int], vpp: int) -> tuple[int, int]:
    """Walk one lap of a micro-batch: stage k -> k+1, and back to stage 0 when interleaved."""
    pp = len(domains_of_stages)
    lap = list(range(pp)) + ([0] if vpp > 1 else [])
    hops = list(zip(lap, lap[1:]))
    return len(hops), sum(domains_of_stages[a] != domains_of_stages[b] for a, b in hops)


def test_hand_cases():
    assert PPL.crossing_hops(1, 1, 1) == (0, 0)
    assert PPL.crossing_hops(8, 8, 1) == (8, 0)        # one rack: every hop on NVLink
    assert PPL.crossing_hops(8, 8, 2) == (8, 2)        # two racks, interleaved: 3->4 and the return 7->0
    assert PPL.crossing_hops(8, 1, 2) == (7, 1)        # two racks, plain 1F1B: 3->4 only
    assert PPL.crossing_hops(8, 8, 8) == (8, 8)        # a rack per stage
    assert PPL.crossing_hops(2, 1, 2) == (1, 1)


@settings(max_examples=200, deadline=None)
@given(pp=st.integers(2, 16), vpp=st.integers(1, 4), stage=st.integers(1, 64), per_domain=st.integers(1, 72))
def test_crossing_hops_match_megatron_rank_groups(pp, vpp, stage, per_domain):
    """Pipeline groups as megatron-core builds them (pipeline outermost: rank = base + k * stage), ranks
    filling domains of ``per_domain`` GPUs in order: the worst group's crossing hops are
    ``crossing_hops(pp, vpp, its domains)``."""
    world = pp * stage
    config = ParallelConfig(tp=1, pp=pp)
    worst = None
    for g in rank_groups(config, world, "pp"):
        doms = [r // per_domain for r in g]
        brute = brute_crossing(doms, vpp)
        formula = PPL.crossing_hops(pp, vpp, len(set(doms)))
        assert formula == brute, (g, doms)
        worst = brute if worst is None or brute[1] > worst[1] else worst
    assert worst[0] == pp - 1 + (vpp > 1)


class FakeFabric:
    """p2p: 1 s inside a domain, 10 s per tier level above it (tier 0 = 10 s, tier 1 = 20 s)."""

    def p2p(self, nbytes, tier):
        return 1.0 if tier < 0 else 10.0 * (tier + 1)


def test_hop_p2p_is_the_mean_over_the_lap():
    f = FakeFabric()
    # 8 stages, 2 racks, interleaved: 2 of 8 hops at 10 s, 6 at 1 s
    assert PPL.hop_p2p(f, 1.0, GroupShape(size=8, per_domain=4, domains=2, tier=0), vpp=8) == pytest.approx((2 * 10 + 6) / 8)
    # plain 1F1B over 2 racks: 1 of 7 hops
    assert PPL.hop_p2p(f, 1.0, GroupShape(size=8, per_domain=4, domains=2, tier=0), vpp=1) == pytest.approx((10 + 6) / 7)
    # every stage in its own domain, across the spine: the worst hop, as before
    assert PPL.hop_p2p(f, 1.0, GroupShape(size=4, per_domain=1, domains=4, tier=1), vpp=2) == pytest.approx(20.0)
    assert PPL.hop_p2p(f, 1.0, GroupShape.local(4), vpp=2) == 1.0
    assert PPL.hop_p2p(f, 1.0, GroupShape.local(1), vpp=1) == 0.0
    assert PPL.hop_p2p(f, 1.0, None, vpp=1) == 0.0


L405 = load_model("llama3.1-405b")


def test_nvl72_more_racks_more_crossing_hops():
    """Llama 3.1 405B TP4 PP8 VPP8 CP2 (NVIDIA's GB200 recipe) weak-scaled 128 -> 512 GB200 at 64 GPUs a rack:
    2 of its 8 hops between racks, then all 8; predict's pp_p2p is the mean of the hops' p2p times the
    exposed transfers."""
    cfg = ParallelConfig(tp=4, pp=8, vpp=8, cp=2)
    out = {}
    for n, crossing in ((128, 2), (512, 8)):
        cluster = load_cluster("gb200-nvl72", gpus=n, usable_per_domain=64)
        p = predict(L405, cluster, cfg, Training(seq_len=8192, global_batch=n // 2, precision="bf16"))
        shape = group_shapes(cluster, cfg, make_placement(cluster, cfg, n, 64))["pp"]
        assert (shape.domains, PPL.crossing_hops(8, 8, shape.domains)) == (crossing, (8, crossing))
        f = profile_fabric(cluster, load_profile(p.stack))
        nbytes = 8192 / (2 * 4) * L405.hidden_size * 2
        one = (crossing * f.p2p(nbytes, shape.tier) + (8 - crossing) * f.p2p(nbytes, -1)) / 8
        m = p.details["microbatches"]
        transfers = PPL.p2p_transfers(8, 8, int(round(m)), load_profile(p.stack).param("pp.overlap", "blackwell"))
        assert p.breakdown["pp_p2p"] == pytest.approx(one * transfers, rel=1e-9)
        out[n] = p.breakdown["pp_p2p"]
    assert out[512] > 2 * out[128]


def test_hgx_every_hop_leaves_the_node_so_nothing_changes():
    """On DGX H100 a TP8 stage fills a node: every hop is a network hop, the mean is the worst hop."""
    cfg = ParallelConfig(tp=8, pp=4, vpp=2)
    cluster = load_cluster("dgx-h100", gpus=64)
    shape = group_shapes(cluster, cfg, make_placement(cluster, cfg, 64))["pp"]
    f = fabric_for(cluster)
    assert PPL.hop_p2p(f, 1e8, shape, 2) == pytest.approx(f.p2p(1e8, shape.tier))
