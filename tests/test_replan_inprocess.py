"""The rank assignment ``topoplan replan`` writes for NVIDIA's in-process restart
(``resilience/inprocess_rank_assignment.py``), run by nvidia-resiliency-ext 0.4.1's own ``Tree``.

The library's ranks, hosts and racks come from a stand-in for its distributed store (the keys each
rank would send); the Tree is the library's. Oracles: ``planner.replan`` on the same failure (the
same ranks move, to a spare tray of the same rack), and two Trees without the rack-local settings
that the library then lets move ranks across racks (so the check can fail).
"""

from __future__ import annotations

import socket

import pytest

import planner
from planner.config import Training
from planner.launch.inprocess import rank_assignment_file
from topologies.loader import load_job

ra = pytest.importorskip("nvidia_resiliency_ext.inprocess.rank_assignment")
state_mod = pytest.importorskip("nvidia_resiliency_ext.inprocess.state")

pytestmark = [pytest.mark.trainers, pytest.mark.filterwarnings("ignore")]


@pytest.fixture(scope="module")
def job():
    doc = planner.plan(planner.load_model("qwen3-30b-a3b"), load_job("gb200-nvl72", gpus=128, usable_per_domain=64),
                       Training(seq_len=4096, global_batch=512), top=1).to_dict()
    ns: dict = {}
    exec(compile(rank_assignment_file(doc), "inprocess_rank_assignment.py", "exec"), ns)
    hosts = doc["plans"][0]["placement"]["hosts"]
    procs = hosts + [h for h in ns["SPARE_HOSTS"] for _ in range(ns["GPUS_PER_HOST"])]
    return doc, ns, hosts, procs


class _Store:
    """What each rank would have sent: its state and its keys (root, rack, host)."""

    def __init__(self, procs, rack_of):
        self.procs, self.rack_of = procs, rack_of

    def send_state(self, state, rank):
        pass

    def send_key(self, key, rank):
        pass

    def get_states(self, ranks):
        n = len(self.procs)
        return [state_mod.State(rank=r, world_size=n, initial_rank=r, initial_world_size=n) for r in ranks]

    def get_keys(self, ranks):
        return [["root", self.rack_of[self.procs[r]], self.procs[r]] for r in ranks]


def _after_failure(tree, procs, rack_of, failed, monkeypatch):
    """Active rank -> host after ``failed`` hosts die, or None when the library discards every rank."""
    monkeypatch.setattr(socket, "gethostname", lambda: procs[0])
    store, n = _Store(procs, rack_of), len(procs)
    tree(ra.RankAssignmentCtx(state_mod.State(rank=0, world_size=n, initial_rank=0, initial_world_size=n), store, set()))
    leaves = list(tree.tree.iter_leaves())
    dead = {leaf.state.rank for leaf in leaves if procs[leaf.state.initial_rank] in failed}
    alive = next(leaf.state for leaf in leaves if procs[leaf.state.initial_rank] not in failed)
    try:
        tree(ra.RankAssignmentCtx(state_mod.State(**vars(alive)), store, dead))
    except ra.RankDiscarded:
        return None
    return {leaf.state.active_rank: procs[leaf.state.initial_rank] for leaf in tree.tree.iter_leaves()
            if leaf.state.mode == state_mod.Mode.ACTIVE}


def test_one_failed_tray_the_library_moves_the_same_ranks_to_a_spare_of_the_rack(job, monkeypatch):
    doc, ns, hosts, procs = job
    failed = "gb200-r02-t07"
    after = _after_failure(ns["rank_assignment"](), procs, ns["RACK_OF"], {failed}, monkeypatch)
    assert after is not None and sorted(after) == list(range(len(hosts)))
    moved = sorted(r for r in after if after[r] != hosts[r])
    ours = planner.replan(doc, failed)
    assert moved == ours.moved_ranks
    assert all(ns["RACK_OF"][after[r]] == "gb200-r02" and after[r] in ns["SPARE_HOSTS"] for r in moved)


def test_three_failed_trays_in_one_rack_stop_the_job_for_a_replan(job, monkeypatch):
    doc, ns, hosts, procs = job
    three = {"gb200-r01-t02", "gb200-r01-t05", "gb200-r01-t11"}
    assert _after_failure(ns["rank_assignment"](), procs, ns["RACK_OF"], three, monkeypatch) is None
    assert planner.replan(doc, ",".join(sorted(three))).case == "replan"


def test_without_the_rack_settings_the_library_moves_ranks_across_racks(job, monkeypatch):
    doc, ns, hosts, procs = job
    three = {"gb200-r01-t02", "gb200-r01-t05", "gb200-r01-t11"}
    rack = ns["RACK_OF"]
    host_key = ra.Layer(min_ranks=4, max_ranks=4, key_or_fn=lambda _: socket.gethostname(), flag=ra.LayerFlag.RESERVE)
    for root_flag in (ra.LayerFlag.RESERVE, None):   # a spare from any rack; or ShiftRanks closing the gaps
        tree = ra.Tree([ra.Layer(min_ranks=1, max_ranks=len(hosts), key_or_fn="root", flag=root_flag),
                        ra.Layer(min_ranks=1, max_ranks=64, key_or_fn=lambda _: "r", flag=ra.LayerFlag.RESERVE),
                        host_key])
        after = _after_failure(tree, procs, rack, three, monkeypatch)
        assert any(rack[after[r]] != rack[hosts[r]] for r in after if r < len(hosts))
