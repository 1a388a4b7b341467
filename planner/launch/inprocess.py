"""The rank assignment for NVIDIA's in-process restart (nvidia-resiliency-ext) that keeps ranks
rack-local: ``resilience/inprocess_rank_assignment.py`` of ``topoplan replan`` (docs/resilience.md).

nvidia-resiliency-ext 0.4.1, ``inprocess/rank_assignment.py``: ``Tree(layers)`` builds a tree whose
levels group ranks by a key (root, then rack, then host). On a failure it (1) terminates every
subtree whose healthy ranks fall below its layer's ``min_ranks``, (2) replaces each terminated
active rank by an inactive (spare) rank found by walking up the ancestors while their layer has
``LayerFlag.RESERVE``, (3) backfills within ``LayerFlag.BACKFILL`` subtrees and (4) shifts every
later rank left to close the remaining gaps (``ShiftRanks``). Step 4 moves ranks across racks
(shifting by one tray's 4 ranks puts the first 4 ranks of every later rack on the rack before), and so
would RESERVE on the root (a spare of another rack). What keeps ranks rack-local:

* RESERVE on the rack and host layers, not on the root: spares come from the failed rank's rack;
* ``min_ranks`` = the ranks each rack runs on the rack layer: a rack that cannot refill itself is
  terminated whole, so nothing shifts by less than a rack; ``min_ranks`` = the GPUs of a host on the
  host layer: a tray with one bad GPU leaves whole (its 4 ranks go to one spare tray);
* ``min_ranks`` = the world on the root: when a rack cannot refill itself the job stops rather than
  run a layout the plan did not price; ``topoplan replan`` then re-plans.

This expresses racks that all run the same number of ranks (Layer limits are per layer, not per
key); otherwise the file says so and keeps only the root guard.
"""

from __future__ import annotations

import json

from topologies.hostlist import compress

HEADER = '''"""nvidia-resiliency-ext in-process restart: a rank assignment that keeps ranks rack-local.

Written by topoplan for cluster {cluster!r} ({world} ranks). Launch one process per GPU of the hosts in
../hostfile (rank order) followed by the spare hosts below (GPUs per host each), so the spares run as
inactive ranks; then wrap the training function:

    from inprocess_rank_assignment import rank_assignment
    train = nvidia_resiliency_ext.inprocess.Wrapper(rank_assignment=rank_assignment(), ...)(train)

A failed host's ranks go to a spare host of the same rack (as 'topoplan replan' moves them); a rack
without a spare stops the job: run 'topoplan replan plan.json --failed HOSTS --out DIR'.
See docs/resilience.md.
"""
import socket

from nvidia_resiliency_ext.inprocess import rank_assignment as ra

WORLD = {world}
GPUS_PER_HOST = {per_host}
RANKS_PER_RACK = {per_rack}   # None: the racks run different numbers of ranks (see UNIFORM)
UNIFORM = {uniform}
SPARE_HOSTS = {spares}
RACK_OF = {rack_of}


def _rack(state):
    return RACK_OF[socket.gethostname()]


def rank_assignment():
    layers = [ra.Layer(min_ranks=WORLD, max_ranks=WORLD, key_or_fn="root")]   # no RESERVE: never another rack
    if UNIFORM:
        layers.append(ra.Layer(min_ranks=RANKS_PER_RACK, max_ranks=RANKS_PER_RACK, key_or_fn=_rack,
                               flag=ra.LayerFlag.RESERVE))
        layers.append(ra.Layer(min_ranks=GPUS_PER_HOST, max_ranks=GPUS_PER_HOST,
                               key_or_fn=lambda _: socket.gethostname(), flag=ra.LayerFlag.RESERVE))
    return ra.Tree(layers)
'''


def rank_assignment_file(doc: dict, index: int = 0) -> str:
    """The text of ``resilience/inprocess_rank_assignment.py`` for plan ``index`` of ``doc``."""
    cluster_doc = doc["cluster"]
    placement = doc["plans"][index]["placement"]
    hosts = placement["hosts"]
    dom = {d["name"]: d for d in cluster_doc.get("domains") or []}
    rack_host = {h: name for name, d in dom.items() for h in d["nodes"]}
    used = dict.fromkeys(hosts)
    per_rack: dict[str, int] = {}
    for h in hosts:
        per_rack[rack_host.get(h, h)] = per_rack.get(rack_host.get(h, h), 0) + 1
    per_host = max(hosts.count(h) for h in used)
    health = cluster_doc.get("health") or {}
    broken = set(health.get("failed_nodes") or []) | set(health.get("failed_trays") or [])   # spare_trays are spares
    racks_used = set(per_rack)
    spares = [n["name"] for n in cluster_doc["nodes"] if n["name"] not in used and n["name"] not in broken
              and rack_host.get(n["name"], n["name"]) in racks_used and n["gpus"] == per_host]
    uniform = len(set(per_rack.values())) == 1 and all(hosts.count(h) == per_host for h in used)
    rack_of = {h: rack_host.get(h, h) for h in list(used) + spares}
    return HEADER.format(cluster=cluster_doc.get("name", "cluster"), world=len(hosts), per_host=per_host,
                         per_rack=next(iter(per_rack.values())) if uniform else None, uniform=uniform,
                         spares=json.dumps(spares), rack_of=json.dumps(rack_of, indent=1)) \
        + f"# spare hosts: {compress(spares) if spares else 'none'}\n"
