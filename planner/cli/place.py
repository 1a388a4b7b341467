"""CLI command: ``topoplan place PLAN.json --allocation FILE --out DIR`` (or ``--nodelist EXPR``)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from planner.errors import InputError
from planner.io import check_output
from planner.launch.allocation import domain_table, nodelist_pairs, topology_table
from planner.launch.place import place, plan_document, shape_of_document, write_placed
from planner.search.document import load_launch
from topologies.loader import load_cluster


def _granted(doc: dict, allocation, nodelist, topology, cluster):
    """What was granted: the --allocation file, or --nodelist with domains from --topology / --cluster / the plan."""
    if (allocation is None) == (nodelist is None):
        raise InputError("place: give exactly one of --allocation FILE and --nodelist EXPR (e.g. \"$SLURM_JOB_NODELIST\")")
    if nodelist is None:
        if topology is not None:
            raise InputError("--topology: only with --nodelist (an --allocation file names its own domains)")
        return allocation
    launch = load_launch(doc)
    if topology is not None:
        shape = shape_of_document(doc)
        table = topology_table(topology, launch.cluster.gpu, shape.gpus_per_host)
    else:
        table = domain_table(load_cluster(str(cluster)) if cluster else launch.cluster)
    return nodelist_pairs(nodelist, table)


def register(app: typer.Typer) -> None:
    """Add ``place`` to the root app."""

    @app.command("place")
    def place_cmd(
        plan_file: Path = typer.Argument(..., help="plan document (topoplan plan --save-plan, or OUT/plan.json of --emit)"),
        allocation: Path = typer.Option(None, "--allocation", "-a",
                                        help="granted hosts: 'HOST [DOMAIN]' lines, 'pdsh nvidia-smi -q' output, "
                                             "or a directory of per-host nvidia-smi -q files"),
        nodelist: str = typer.Option(None, "--nodelist", help="granted hosts as a Slurm hostlist (\"$SLURM_JOB_NODELIST\")"),
        topology: Path = typer.Option(None, "--topology", help="Slurm topology.conf / topology.yaml giving the "
                                                               "--nodelist hosts' NVLink domains (blocks)"),
        cluster: str = typer.Option(None, "--cluster", help="cluster file naming each host's domain "
                                                            "(default: the plan's own cluster)"),
        out: Path = typer.Option(..., "--out", "-o", help="output directory: hostfile, local_gpus, placement.json"),
        index: int = typer.Option(0, "--index", "-i", help="which plan of the document (0 = best)"),
        degrade: bool = typer.Option(False, "--degrade", help="when the allocation cannot hold the plan, plan "
                                                              "again on what was granted (writes OUT/plan.json)"),
        time_limit: float = typer.Option(None, "--time-limit", min=0.01, help="solver seconds for --degrade"),
        as_json: bool = typer.Option(False, "--json", help="print the rank -> host mapping as JSON"),
    ):
        """Put a plan on the hosts the scheduler granted: each NVLink-domain slot of the plan on its own
        granted domain, so every group the plan keeps in one domain stays in one. Writes OUT/hostfile
        (host of rank r on line r, for SLURM_HOSTFILE). Exit 3 when the allocation cannot hold the plan.

        Example: topoplan place launch/plan.json --allocation granted.txt --out run/
        """
        check_output(out, "--out", directory=True)
        doc = plan_document(plan_file)
        granted = _granted(doc, allocation, nodelist, topology, cluster)
        placed = place(doc, granted, index=index, cluster=cluster if nodelist is None else None, degrade=degrade,
                       time_limit=time_limit)
        paths = write_placed(placed, out)
        if as_json:
            print(json.dumps({"out": str(out), **placed.to_dict(), "files": [str(p) for p in paths]}))
            return
        doms = ", ".join(f"{s['domain']} ({len(s['hosts'])})" for s in placed.slots)
        head = (f"degraded: {placed.reason}; planned again on the granted hosts\n" if placed.degraded else "")
        print(f"{head}placed {placed.shape.world} ranks on {sum(len(s['hosts']) for s in placed.slots)} hosts "
              f"in {len(placed.slots)} NVLink domains: {doms}")
        if placed.unused:
            print(f"  unused granted hosts: {len(placed.unused)}")
        for p in paths:
            print(f"  {p}")
