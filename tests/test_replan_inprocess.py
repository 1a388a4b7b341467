"""The rank assignment ``topoplan replan`` writes for NVIDIA's in-process restart
(``resilience/inprocess_rank_assignment.py``), run by nvidia-resiliency-ext 0.4.1's own ``Tree``.

The library's ranks, hosts and racks come from a stand-in for its distributed store (the keys each
rank would send); the Tree is the library's. Oracles: ``planner.replan`` on the same failure (the
same ranks move, to a spare tray of the same rack), and two Trees without the rack-local settings
that the library then lets move ranks across racks (so the check can fail).
"""

from __future__ import annotations

import importlib
import json
import socket
import sys
from pathlib import Path

import pytest

import planner
from planner.config import Training
from planner.launch.inprocess import rank_assignment_file
from topologies.loader import load_job
from trainers.mcore import unpacked_wheels

pytestmark = [pytest.mark.trainers, pytest.mark.filterwarnings("ignore")]

# Not a dependency: installed beside megatron-core it changes what megatron-core imports (megatron-core
# 0.19.2 reads nvidia_resiliency_ext.__version__ when the package is importable), so the wheels are
# unpacked into .cache/ (TOPOPLAN_NVRX_DIR overrides) and put on sys.path of this test process only.
NVRX = ("nvidia-resiliency-ext==0.4.1", "psutil==7.2.2", "defusedxml==0.7.1")
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "nvidia-resiliency-ext-0.4.1"


def _nvrx_dir() -> Path:
    return unpacked_wheels(CACHE, "nvidia_resiliency_ext/inprocess/rank_assignment.py", NVRX, "TOPOPLAN_NVRX_DIR")


@pytest.fixture(scope="module")
def lib():
    """(rank_assignment module, state module) of nvidia-resiliency-ext 0.4.1."""
    sys.path.insert(0, str(_nvrx_dir()))
    return (importlib.import_module("nvidia_resiliency_ext.inprocess.rank_assignment"),
            importlib.import_module("nvidia_resiliency_ext.inprocess.state"))


@pytest.fixture(scope="module")
def job(lib):
    doc = planner.plan(planner.load_model("qwen3-30b-a3b"), load_job("gb200-nvl72", gpus=128, usable_per_domain=64),
                       Training(seq_len=4096, global_batch=512), top=1).to_dict()
    ns: dict = {}
    exec(compile(rank_assignment_file(doc), "inprocess_rank_assignment.py", "exec"), ns)
    hosts = doc["plans"][0]["placement"]["hosts"]
    procs = hosts + [h for h in ns["SPARE_HOSTS"] for _ in range(ns["GPUS_PER_HOST"])]
    return doc, ns, hosts, procs


class _Store:
    """What each rank would have sent: its state and its keys (root, rack, host)."""

    def __init__(self, procs, rack_of, state_mod):
        self.procs, self.rack_of, self.state_mod = procs, rack_of, state_mod

    def send_state(self, state, rank):
        pass

    def send_key(self, key, rank):
        pass

    def get_states(self, ranks):
        n = len(self.procs)
        return [self.state_mod.State(rank=r, world_size=n, initial_rank=r, initial_world_size=n) for r in ranks]

    def get_keys(self, ranks):
        return [["root", self.rack_of[self.procs[r]], self.procs[r]] for r in ranks]


def _after_failure(lib, tree, procs, rack_of, failed, monkeypatch):
    """Active rank -> host after ``failed`` hosts die, or None when the library discards every rank."""
    ra, state_mod = lib
    monkeypatch.setattr(socket, "gethostname", lambda: procs[0])
    store, n = _Store(procs, rack_of, state_mod), len(procs)
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


def test_one_failed_tray_the_library_moves_the_same_ranks_to_a_spare_of_the_rack(lib, job, monkeypatch):
    doc, ns, hosts, procs = job
    failed = "gb200-r02-t07"
    after = _after_failure(lib, ns["rank_assignment"](), procs, ns["RACK_OF"], {failed}, monkeypatch)
    assert after is not None and sorted(after) == list(range(len(hosts)))
    moved = sorted(r for r in after if after[r] != hosts[r])
    ours = planner.replan(doc, failed)
    assert moved == ours.moved_ranks
    assert all(ns["RACK_OF"][after[r]] == "gb200-r02" and after[r] in ns["SPARE_HOSTS"] for r in moved)


def test_three_failed_trays_in_one_rack_stop_the_job_for_a_replan(lib, job, monkeypatch):
    doc, ns, hosts, procs = job
    three = {"gb200-r01-t02", "gb200-r01-t05", "gb200-r01-t11"}
    assert _after_failure(lib, ns["rank_assignment"](), procs, ns["RACK_OF"], three, monkeypatch) is None
    assert planner.replan(doc, ",".join(sorted(three))).case == "replan"


def test_without_the_rack_settings_the_library_moves_ranks_across_racks(lib, job, monkeypatch):
    ra, _ = lib
    doc, ns, hosts, procs = job
    three = {"gb200-r01-t02", "gb200-r01-t05", "gb200-r01-t11"}
    rack = ns["RACK_OF"]
    host_key = ra.Layer(min_ranks=4, max_ranks=4, key_or_fn=lambda _: socket.gethostname(), flag=ra.LayerFlag.RESERVE)
    for root_flag in (ra.LayerFlag.RESERVE, None):   # a spare from any rack; or ShiftRanks closing the gaps
        tree = ra.Tree([ra.Layer(min_ranks=1, max_ranks=len(hosts), key_or_fn="root", flag=root_flag),
                        ra.Layer(min_ranks=1, max_ranks=64, key_or_fn=lambda _: "r", flag=ra.LayerFlag.RESERVE),
                        host_key])
        after = _after_failure(lib, tree, procs, rack, three, monkeypatch)
        assert any(rack[after[r]] != rack[hosts[r]] for r in after if r < len(hosts))


def test_spare_hosts_are_the_spare_trays_never_the_failed_ones(job):
    """The file's SPARE_HOSTS are the racks' idle healthy trays (health.spare_trays); a tray under
    health.failed_trays is broken and never launched as a spare."""
    doc, ns, hosts, _ = job
    assert set(ns["SPARE_HOSTS"]) == set(doc["cluster"]["health"]["spare_trays"]) and len(ns["SPARE_HOSTS"]) == 4
    broken = json.loads(json.dumps(doc))
    broken["cluster"]["health"]["spare_trays"].remove("gb200-r02-t17")
    broken["cluster"]["health"]["failed_trays"] = ["gb200-r02-t17"]
    again: dict = {}
    exec(compile(rank_assignment_file(broken), "inprocess_rank_assignment.py", "exec"), again)
    assert set(again["SPARE_HOSTS"]) == set(ns["SPARE_HOSTS"]) - {"gb200-r02-t17"}
