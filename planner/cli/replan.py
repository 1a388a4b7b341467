"""CLI command ``topoplan replan``: the plan again after hosts fail (``planner.launch.replan``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from planner.io import atomic_dir, check_output, current_umask
from planner.launch.inprocess import rank_assignment_file
from planner.launch.replan import replan
from planner.output.emit import EMITTERS, load_context, parse_trainers, render_files
from planner.output.explain import compact_table
from planner.trainers import DEFAULT
from topologies.hostlist import compress

RESILIENCE_FILE = "resilience/inprocess_rank_assignment.py"


def write_outputs(result, out: Path, trainers: list[str]) -> list[str]:
    """DIR/plan.json, DIR/hostfile, DIR/cluster.yaml, DIR/replan.json, the in-process rank assignment
    and the launch files of ``trainers``; all at once (nothing changes in ``out`` on an error)."""
    doc = result.document
    ctx = load_context(doc, 0)
    files = {"plan.json": json.dumps(doc, indent=1) + "\n",
             "hostfile": "".join(h + "\n" for h in ctx.hosts),
             "cluster.yaml": ctx.cluster.to_yaml(),
             "replan.json": json.dumps(result.to_dict(), indent=1) + "\n",
             RESILIENCE_FILE: rank_assignment_file(doc)}
    files.update(render_files(ctx, trainers))
    with atomic_dir(out, option="--out") as stage:
        for rel, text in files.items():
            path = stage / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if rel.endswith(".sh"):
                path.chmod(0o777 & ~current_umask())
    return sorted(files)


def default_trainers(doc: dict) -> list[str]:
    """The plan's trainer and Slurm, and k8s when that emitter exists."""
    names = [doc["training"].get("trainer", DEFAULT), "slurm"] + (["k8s"] if "k8s" in EMITTERS else [])
    return list(dict.fromkeys(names))


def render(result, out: Path, written: list[str], console: Console) -> None:
    d = result.to_dict()
    console.print(f"failed: {compress(result.failed)}", highlight=False)
    if result.case == "spares":
        console.print(f"spare hosts take the failed hosts' ranks; layout and rank order kept "
                      f"({d['moved_ranks']} ranks moved)", highlight=False)
        for m in result.moves:
            console.print(f"  {m.host} -> {m.spare} ({m.domain}): ranks {_ranks(m.ranks)}", highlight=False)
    else:
        console.print("no spare left in a degraded NVLink domain: planned again on what is left", highlight=False)
    for line in result.notes:
        console.print(f"  {line}", style="yellow" if line.startswith("warning") else None, highlight=False)
    console.print(cost_table(d))
    ex = d.get("experts")
    if ex and ex["resharded"]:
        console.print(f"experts: EP{ex['ep_before']} -> EP{ex['ep_after']} (ETP{ex['etp_before']}->{ex['etp_after']}, "
                      f"PP{ex['pp_before']}->{ex['pp_after']}): {ex['bytes_per_gpu'] / 1e9:.1f} GB of expert state "
                      "per GPU re-sharded by the checkpoint loader", highlight=False)
    elif ex:
        console.print(f"experts: {ex['how']}", highlight=False)
    console.print(f"wrote {out}/: " + ", ".join(written), highlight=False)


def _ranks(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else ",".join(map(str, ranks))


def cost_table(d: dict):
    t = compact_table(title="healthy plan vs now",
                      caption="TFLOP/s: model TFLOP/s per GPU; tokens/s of the job; change = now / healthy - 1")
    for col in ("", "layout", "GPUs", "TFLOP/s/GPU", "tokens/s"):
        t.add_column(col, no_wrap=col != "layout", overflow="fold")
    for name, f in (("healthy", d["before"]), ("now", d["after"])):
        t.add_row(name, f["layout"], f"{f['world']:,}", f"{f['tflops_per_gpu']:,.0f}", f"{f['tokens_per_s']:,.0f}")
    c = d["change"]
    t.add_row("change", "", f"{c.get('world', 0):+.1%}", f"{c.get('tflops_per_gpu', 0):+.1%}",
              f"{c.get('tokens_per_s', 0):+.1%}")
    return t


def register(app: typer.Typer) -> None:
    """Add ``replan`` to the root app."""

    @app.command("replan")
    def replan_cmd(
        plan_path: Path = typer.Argument(..., help="plan.json written by 'topoplan plan --save-plan' (or a replan's)"),
        failed: str = typer.Option(..., "--failed", help="failed hosts: a hostlist like 'gb200-r02-t[07-08]' or a "
                                   "file with one host per line"),
        out: Path = typer.Option(..., "--out", help="directory for plan.json, hostfile and the launch files"),
        spares: str = typer.Option(None, "--spares", help="old cluster files: which hosts under health.failed_trays are "
                                   "spare trays (default: none; health.spare_trays are the spares, failed_trays broken)"),
        index: int = typer.Option(0, "--index", min=0, help="which plan of plan.json runs (default the best, 0)"),
        emit: str = typer.Option(None, "--emit", help="launch files to write (default: the plan's trainer and slurm)"),
        time_limit: float = typer.Option(None, "--time-limit", min=0.01, help="solver time limit when re-planning"),
        allow_cross_domain: bool = typer.Option(False, "--allow-cross-domain",
                                                help="when re-planning, take the fastest plan even if groups the healthy "
                                                     "plan kept in one NVLink domain now cross domains"),
        as_json: bool = typer.Option(False, "--json", help="print what changed as JSON"),
    ):
        """Put a plan on what is left after hosts fail: spare hosts of the same rack take the failed hosts'
        ranks (layout and rank order kept), or, where a rack has too few spares, a new plan.

        Example: topoplan replan plan.json --failed gb200-r02-t07 --out replanned/
        """
        check_output(out, "--out", directory=True)
        result = replan(plan_path, failed, index=index, time_limit=time_limit, allow_cross_domain=allow_cross_domain,
                        spares=spares)
        trainers = parse_trainers(emit) if emit else default_trainers(result.document)
        written = write_outputs(result, out, trainers)
        if as_json:
            d = result.to_dict()
            d["out"], d["files"] = str(out), written
            sys.stdout.write(json.dumps(d, indent=2) + "\n")
            return
        render(result, out, written, Console())
