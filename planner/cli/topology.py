"""``topoplan topology``: list the presets, show a cluster, import topology files to cluster YAML."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from planner.errors import InputError
from planner.io import atomic_write_text
from planner.output.explain import figure_table
from planner.search.plan import gpd_options
from topologies import importers
from topologies.calibrate import TARGET, fit_fabric, observations, predict
from topologies.fabrics import fabric_kind
from topologies.cluster import cluster_from_dict
from topologies.collectives import fabric_for
from topologies.gpus import GPUS
from topologies.loader import load_cluster, load_job
from topologies.presets import PRESETS

topology_app = typer.Typer(
    name="topology",
    help="Clusters: built-in presets, cluster files, and imports of Slurm / NCCL / Kubernetes topologies.\n\n"
    "Example: topoplan topology show gb300-nvl72 --gpus 288 --json",
    no_args_is_help=True,
    rich_markup_mode=None,  # click's plain help: no truncated option names
)


def cluster_summary(cluster) -> dict:
    """The JSON document ``topology show --json`` prints."""
    spec = cluster.gpu_spec
    nodes = [
        {"name": n.name, "domain": cluster.node_domain(n.name), "gpus": cluster.node_healthy_gpus(n.name)}
        for n in cluster.nodes
    ]
    return {
        "name": cluster.name,
        "gpu": spec.name,
        "gpu_display": spec.display,
        "num_gpus": cluster.num_gpus,
        "nvlink_domains": cluster.domain_sizes(),
        "domain_names": cluster.domain_names(),
        "nodes": nodes,
        "tiers": [t.model_dump(exclude_none=True, exclude={"groups"}) | ({"units": len(t.groups)} if t.groups else {})
                  for t in cluster.fabric_tiers],
        "health": cluster.health.model_dump(),
        "health_counts": {k: len(v) for k, v in cluster.health.model_dump().items()},
        "nvlink_gbps_uni": spec.nvlink_gbps_uni,
        "nic_gbps": spec.nic_gbps,
        "fabric": cluster.fabric or "infiniband",
    }


def job_summary(job) -> dict:
    """How many GPUs the racks (nodes) hold, how many the job uses, and who picks the GPUs per domain."""
    opts = [o for o in gpd_options(job) if o is not None]
    if job.per_domain is not None:
        how = f"{job.per_domain} GPUs per NVLink domain (--usable-per-rack)"
    elif opts:
        how = ("the planner chooses the GPUs per NVLink domain: all of them or "
               + " or ".join(str(o) for o in opts) + " (topoplan plan / predict)")
    else:
        how = "every GPU of each NVLink domain"
    text = (f"the racks/nodes hold {job.racks_gpus} GPUs; the job uses {job.gpus}" + ("" if job.gpus == job.racks_gpus
            else " of them") + f"; {how}")
    return {"job_gpus": job.gpus, "racks_gpus": job.racks_gpus, "usable_per_domain": job.per_domain,
            "gpus_per_domain_options": [None] + opts if job.per_domain is None else [job.per_domain],
            "job_text": text}


@topology_app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables")) -> None:
    """List the built-in cluster presets and the GPU catalog.

    Example: topoplan topology list
    """
    presets = [
        {"name": p.name, "gpu": p.gpu, "nvlink_domain": GPUS[p.gpu].nvlink_domain_max,
         "nic_gbps": p.nic_gbps or GPUS[p.gpu].nic_gbps, "fabric": p.fabric or "infiniband",
         "su_gpus": p.su_gpus, "description": p.description, "source": p.source}
        for p in PRESETS.values()
    ]
    gpus = [
        {"name": s.name, "display": s.display, "bf16_tflops": s.bf16_tflops, "fp8_tflops": s.fp8_tflops,
         "fp4_tflops": s.fp4_tflops, "hbm_gib": s.hbm_gib, "hbm_tbps": s.hbm_tbps,
         "nvlink_gbps_uni": s.nvlink_gbps_uni, "nvlink_domain_max": s.nvlink_domain_max, "nic_gbps": s.nic_gbps}
        for s in GPUS.values()
    ]
    if as_json:
        print(json.dumps({"presets": presets, "gpus": gpus}, indent=2))
        return
    con = Console()
    t = figure_table("Cluster presets (topoplan topology show NAME --gpus N)",
                     ("preset", "GPU", "domain", "NIC Gb/s", "fabric", "description"),
                     [(p["name"], p["gpu"], str(p["nvlink_domain"]), f"{p['nic_gbps']:g}", p["fabric"],
                       p["description"]) for p in presets],
                     wrap=("description",), right=("domain", "NIC Gb/s"),
                     caption="domain: GPUs per NVLink domain; NIC Gb/s per GPU; fabric: infiniband, roce, efa (AWS "
                             "SRD), tcpxo (GCP GPUDirect-TCPXO); sources: --json, docs/cloud.md")
    con.print(t)
    g = figure_table("GPU catalog (dense peaks; NVLink per direction)",
                     ("GPU", "BF16 TF", "FP8 TF", "FP4 TF", "HBM GiB", "HBM TB/s", "NVLink GB/s", "domain", "NIC Gb/s"),
                     [(s["name"], f"{s['bf16_tflops']:g}", f"{s['fp8_tflops']:g}",
                       "-" if s["fp4_tflops"] is None else f"{s['fp4_tflops']:g}", f"{s['hbm_gib']:g}",
                       f"{s['hbm_tbps']:g}", f"{s['nvlink_gbps_uni']:g}", str(s["nvlink_domain_max"]),
                       f"{s['nic_gbps']:g}") for s in gpus],
                     wrap=("BF16 TF", "FP8 TF", "FP4 TF", "HBM GiB", "HBM TB/s", "NVLink GB/s", "NIC Gb/s"),
                     right=("BF16 TF", "FP8 TF", "FP4 TF", "HBM GiB", "HBM TB/s", "NVLink GB/s", "domain", "NIC Gb/s"))
    con.print(g)


@topology_app.command("show")
def show_cmd(
    cluster: str = typer.Argument(..., help="a preset name (see 'topology list') or a cluster YAML path"),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs to use (presets: whole nodes / trays)"),
    usable_per_rack: Optional[int] = typer.Option(
        None, "--usable-per-rack", help="NVL72 presets: GPUs used per rack, whole trays (e.g. 64 of 72)"),
    oversubscription: Optional[float] = typer.Option(
        None, "--oversubscription", help="presets: oversubscription above the scalable unit (1 = non-blocking)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON (gpu, num_gpus, nvlink_domains, nodes, tiers)"),
    as_yaml: bool = typer.Option(False, "--yaml", help="print the cluster file (YAML) instead"),
) -> None:
    """Show a cluster: GPUs, NVLink domains, hosts and the scale-out tiers.

    Example: topoplan topology show gb300-nvl72 --gpus 288 --json
    """
    job = load_job(cluster, gpus=gpus, usable_per_domain=usable_per_rack, oversubscription=oversubscription)
    c = job.cluster
    if as_yaml:
        print(c.to_yaml(), end="")
        return
    doc = cluster_summary(c)
    doc.update(job_summary(job))
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    con = Console()
    sizes = Counter(doc["nvlink_domains"])
    dom = ", ".join(f"{n} x {s}" for s, n in sorted(sizes.items(), reverse=True))
    con.print(f"[bold]{doc['name']}[/bold]: {doc['num_gpus']} healthy {c.gpu_spec.display} GPUs on "
              f"{len(c.nodes)} hosts; NVLink domains: {dom} GPUs "
              f"({c.gpu_spec.nvlink_gbps_uni:g} GB/s per GPU per direction)")
    rows = []
    for tier in c.fabric_tiers:
        unit = f"{len(tier.groups)} groups" if tier.groups else (f"{tier.unit_gpus} GPUs" if tier.unit_gpus else "all")
        rows.append((tier.name, f"{tier.gbps_per_gpu:g}", f"{tier.latency_us:g}", f"{tier.oversubscription:g}", unit))
    con.print(figure_table("scale-out tiers (lowest first)",
                           ("tier", "Gb/s per GPU", "latency us", "oversubscription", "unit"), rows,
                           wrap=("tier",), right=("Gb/s per GPU", "latency us", "oversubscription")))
    kind = fabric_kind(c.fabric)
    lat = kind.latency_us
    con.print(f"fabric: {kind.name} ({kind.status}: base {lat['net_base_us']:g} us, {lat['net_step_us']:g} us per "
              f"network step, all-to-all floor {lat['a2a_net_us']:g} us; docs/cloud.md)"
              + ("" if kind.gpu_initiated_rdma else "; no GPU-initiated RDMA: DeepEP/HybridEP only inside one NVLink domain"))
    con.print(doc["job_text"])
    h = c.health
    failed = len(h.failed_nodes) + len(h.failed_trays) + len(h.spare_trays) + len(h.failed_gpus)
    if failed:
        con.print(f"health: {len(h.failed_nodes)} failed nodes, {len(h.failed_trays)} failed trays, "
                  f"{len(h.spare_trays)} spare trays, {len(h.failed_gpus)} failed GPUs excluded")


@topology_app.command("import")
def import_cmd(
    fmt: str = typer.Argument(..., metavar="FORMAT", help="slurm | slurm-yaml | nccl-xml | k8s"),
    file: Path = typer.Argument(..., metavar="FILE", help="topology.conf, topology.yaml, NCCL XML, or a node list (JSON/YAML)"),
    out: Path = typer.Option(..., "-o", "--out", help="cluster YAML to write"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU type (h100, h200, h800, b200, b300, gb200, gb300)"),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="GPUs per host (default: the GPU type's)"),
    name: Optional[str] = typer.Option(None, "--name", help="cluster name (default: the file name)"),
    topology: Optional[str] = typer.Option(None, "--topology", help="slurm-yaml: which named topology"),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="nccl-xml: hostlist of hosts with this layout"),
    domain_nodes: Optional[int] = typer.Option(None, "--domain-nodes", help="nccl-xml: hosts per NVLink domain"),
    domain_label: str = typer.Option("nvidia.com/gpu.clique", "--domain-label",
                                     help="k8s: node label that names the NVLink domain"),
    failed: Optional[str] = typer.Option(None, "--failed", metavar="HOSTLIST",
                                         help="drained or failed hosts (hostlist, e.g. 'dev[3,7]'): written "
                                              "as health.failed_nodes, left out of planning"),
) -> None:
    """Import a topology description to a cluster YAML (written atomically; nothing on error).

    Example: topoplan topology import slurm topology.conf --gpu gb200 --gpus-per-node 4 -o cluster.yaml
    """
    if gpus_per_node is not None and gpus_per_node <= 0:
        raise InputError(f"--gpus-per-node {gpus_per_node}: must be positive")
    key = fmt.strip().lower()
    if key == "slurm":
        c, assumed = importers.import_slurm_conf(file, gpu, gpus_per_node, name, failed=failed)
    elif key == "slurm-yaml":
        c, assumed = importers.import_slurm_yaml(file, gpu, gpus_per_node, name, topology, failed=failed)
    elif key == "nccl-xml":
        c, assumed = importers.import_nccl_xml(file, gpu, gpus_per_node, hosts, domain_nodes, name, failed=failed)
    elif key == "k8s":
        c, assumed = importers.import_k8s(file, gpu, gpus_per_node, domain_label, name, failed=failed)
    else:
        raise InputError(f"import format {fmt!r}: use one of {', '.join(importers.FORMATS)}")
    atomic_write_text(out, c.to_yaml(), option="--out")
    sizes = c.domain_sizes()
    down = f", {len(c.health.failed_nodes)} hosts marked failed" if c.health.failed_nodes else ""
    print(f"wrote {out}: {c.num_gpus} {c.gpu_spec.name} GPUs on {len(c.nodes)} hosts{down}, "
          f"{len(sizes)} NVLink domains (largest {max(sizes)}), {len(c.fabric_tiers)} tiers")
    for line in assumed:
        typer.echo(f"assumed: {line}", err=True)


@topology_app.command("calibrate")
def calibrate_cmd(
    cluster: str = typer.Argument(..., help="a preset name or a cluster YAML path: the cluster the runs were on"),
    results: list[str] = typer.Argument(..., metavar="RESULTS...",
                                        help="nccl-tests output files (all_reduce_perf, all_gather_perf, "
                                             "reduce_scatter_perf, alltoall_perf, sendrecv_perf) and DeepEP "
                                             "test_intranode / test_internode logs, the latter as FILE@RANKS"),
    out: Path = typer.Option(..., "-o", "--out", help="cluster YAML to write, with the fitted figures"),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="presets: GPUs of the cluster (whole nodes)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON (rows, parameters, worst row) instead of tables"),
) -> None:
    """Fit the cluster's link figures (NVLink, NVLS and each tier's bandwidth and latency) to nccl-tests and
    DeepEP runs, print measured against predicted before and after, and write the cluster file with them.

    Example: topoplan topology calibrate cluster.yaml all_reduce_perf.txt alltoall_perf.txt -o cluster.yaml
    """
    c = load_cluster(cluster, gpus=gpus)
    obs, notes = observations(c, results)
    fit = fit_fabric(c, obs, notes, sources=[r.rpartition("@")[0] if "@" in r and not Path(r).exists() else r
                                             for r in results])
    data = c.to_dict()
    data["calibration"] = fit.calibration.model_dump(exclude_none=True)
    written = cluster_from_dict(data, str(out))
    # the written file prices the rows as the fit did (Fabric reads the calibration block)
    fab = fabric_for(written)
    check = [predict(fab, ob) for ob in obs]
    if any(abs(a - b) > 1e-9 * max(a, b) for a, b in zip(check, fit.after)):
        raise RuntimeError("the written calibration does not reproduce the fitted times")
    atomic_write_text(out, written.to_yaml(), option="--out")
    err0, err1 = fit.errors("before"), fit.errors("after")
    worst = fit.worst
    rows = [{"source": ob.source, "kind": ob.kind, "gpus": ob.shape.size, "domains": ob.shape.domains,
             "bytes": ob.size, "measured_gbps": round(ob.gbps(ob.seconds), 3),
             "measured_us": round(ob.seconds * 1e6, 3),
             "before_gbps": round(ob.gbps(b), 3), "after_gbps": round(ob.gbps(a), 3),
             "before_error": round(e0, 4), "after_error": round(e1, 4), "nccl_tests": ob.nccl}
            for ob, b, a, e0, e1 in zip(obs, fit.before, fit.after, err0, err1)]
    nccl_before = [abs(e) for ob, e in zip(obs, err0) if ob.nccl]
    doc = {
        "cluster": c.name, "out": str(out), "rows": rows,
        "parameters": [{"name": n, "before": b, "after": a} for n, b, a in fit.parameters],
        "worst": None if worst is None else rows[worst],
        "worst_before": max(nccl_before) if nccl_before else None,
        "target": TARGET,
        "within_target": None if worst is None else abs(err1[worst]) <= TARGET,
        "notes": fit.notes,
    }
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _print_calibration(doc)
    for line in fit.notes:
        typer.echo(f"assumed: {line}", err=True)


def _size(n: int) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n / f:.4g} {unit}"
    return f"{n} B"


def _print_calibration(doc: dict) -> None:
    con = Console()
    cols = ("row", "collective", "GPUs", "size", "measured", "before", "err", "after", "err ")
    con.print(figure_table(
        f"{doc['cluster']}: measured against predicted (busbw GB/s; DeepEP: its own bandwidth)", cols,
        [(Path(r["source"]).name, r["kind"], f"{r['gpus']}" + (f"/{r['domains']}d" if r["domains"] > 1 else ""),
          _size(r["bytes"]), f"{r['measured_gbps']:.2f}", f"{r['before_gbps']:.2f}",
          f"{r['before_error']:+.1%}", f"{r['after_gbps']:.2f}", f"{r['after_error']:+.1%}") for r in doc["rows"]],
        wrap=("row", "collective"), right=cols[2:],
        caption="GPUs/Nd: over N NVLink domains; before, after: predicted before and after the fit"))
    con.print(figure_table(
        "fitted figures (written under calibration: in the cluster file)", ("figure", "before", "after"),
        [(row["name"], "-" if row["before"] is None else f"{row['before']:.4g}", f"{row['after']:.4g}")
         for row in doc["parameters"]], wrap=("figure",), right=("before", "after")))
    w = doc["worst"]
    if w is not None:
        verdict = "within" if doc["within_target"] else "OUTSIDE"
        con.print(f"worst nccl-tests row: {w['source']} {w['kind']} {w['gpus']} GPUs {_size(w['bytes'])}: measured "
                  f"{w['measured_gbps']:.2f}, fitted {w['after_gbps']:.2f} GB/s ({w['after_error']:+.1%}; "
                  f"{verdict} the {doc['target']:.0%} target; before the fit the worst was "
                  f"{doc['worst_before']:.1%})", soft_wrap=True)
    con.print(f"wrote {doc['out']}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``topology`` to the root app."""
    app.add_typer(topology_app, name="topology")
