"""CLI command ``place-experts``: topology-aware expert replication and placement."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from planner.cli.progress import progress
from planner.config import ParallelConfig
from planner.cost.placement import rank_groups
from planner.errors import InputError
from planner.io import atomic_dir, check_output
from planner.model.spec import load_model
from planner.output.report import write_report
from planner.search.eplb import rebalance_experts
from planner.search.experts import (
    cross_domain_bytes,
    ep_rank_domains,
    evaluate_placement,
    load_loads,
    moves_between,
    place,
    sample_routing,
)
from topologies.loader import load_cluster


def _read_previous(path: Path, layers: int, slots: int) -> np.ndarray:
    """A previous placement: ``physical_to_logical.npy``, a directory written by ``-o``, or the JSON
    that ``place-experts --json`` prints / ``-o`` writes."""
    p = Path(path)
    if p.is_dir():
        p = p / "physical_to_logical.npy"
    if not p.is_file():
        raise InputError(f"--previous {path}: not found; give physical_to_logical.npy, an -o directory or placement JSON")
    try:
        if p.suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
        else:
            doc = json.loads(p.read_text())
            if "layers" in doc:
                arr = np.array([x["physical_to_logical"] for x in doc["layers"]])
            else:
                arr = np.asarray(doc["physical_to_logical"])
    except (ValueError, KeyError, OSError) as exc:
        raise InputError(f"--previous {p}: cannot read a physical_to_logical array ({exc})") from None
    arr = np.asarray(arr)
    if arr.shape != (layers, slots):
        raise InputError(f"--previous {p}: shape {tuple(arr.shape)}, expected [{layers} MoE layers, {slots} slots] "
                         "(same --ep and --slots-per-gpu as the new placement)")
    return arr.astype(np.int64)


def _ep_gpus(plan_path: Path, ep: int) -> list[int]:
    """Cluster GPU indices of the first EP group of the first plan in a plan JSON."""
    try:
        doc = json.loads(Path(plan_path).read_text())
        entry = doc["plans"][0]
        fields = set(ParallelConfig.model_fields)
        cfg = ParallelConfig(**{k: v for k, v in entry["config"].items() if k in fields and k not in ("dp",)})
        r2g = entry["placement"]["rank_to_gpu"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise InputError(f"--plan {plan_path}: not a plan JSON with plans[0].config and placement.rank_to_gpu ({exc})") from None
    if cfg.ep != ep:
        raise InputError(f"--ep {ep}: the plan {plan_path} uses EP {cfg.ep}; drop --ep or make them agree")
    group = rank_groups(cfg, len(r2g), "ep", order=entry["placement"].get("order", "tp-cp-ep-dp-pp"))[0]
    return [int(r2g[r]) for r in group]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""

    @app.command("place-experts")
    def place_experts(
        model: str = typer.Option(..., "--model", help="catalog name or config.json of an MoE model"),
        cluster: str = typer.Option(..., "--cluster", help="cluster preset name or YAML file"),
        gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs of the cluster to use"),
        usable_per_rack: Optional[int] = typer.Option(None, "--usable-per-rack", min=1,
                                                      help="NVL72 presets: GPUs used per rack (as plan's)"),
        ep: int = typer.Option(..., "--ep", help="expert-parallel degree (the EP group)"),
        slots_per_gpu: Optional[int] = typer.Option(None, "--slots-per-gpu",
                                                    help="expert slots per GPU (default: experts/EP + 1 spare)"),
        loads: Path = typer.Option(..., "--loads", help=".npy or JSON {\"loads\": [[...]]}: tokens per expert, [MoE layers, experts]"),
        routing: Optional[Path] = typer.Option(None, "--routing", help=".npy of recorded top-k selections [MoE layers, tokens, top_k] (default: sample)"),
        previous: Optional[Path] = typer.Option(None, "--previous", help="previous placement (-o directory, .npy or JSON)"),
        max_moves: Optional[int] = typer.Option(None, "--max-moves", min=0, help="most expert copies per layer vs --previous"),
        plan: Optional[Path] = typer.Option(None, "--plan", help="plan JSON: the EP group is its first EP group's GPUs"),
        time_limit: float = typer.Option(0.1, "--time-limit", min=0.0, help="CP-SAT seconds per layer, spent only where the greedy packing is not proven within 0.2% of its lower bound (0: never)"),
        seed: int = typer.Option(0, "--seed", help="seed of the routing sample and the solver"),
        tokens_per_step: Optional[float] = typer.Option(None, "--tokens-per-step", help="tokens the EP group routes per step (default 4096 per EP rank)"),
        workers: Optional[int] = typer.Option(None, "--workers", min=1, help="processes (default: CPU count)"),
        as_json: bool = typer.Option(False, "--json", help="print the placement as JSON"),
        out: Optional[Path] = typer.Option(None, "-o", "--out", help="directory for .npy files and placement.json"),
        report: Optional[Path] = typer.Option(None, "--report", help="directory for an HTML report with figures"),
    ):
        """Replicate and place experts on the EP group's GPUs: balanced GPUs and few NVLink domains per token.

        Output per MoE layer in EPLB's vocabulary (physical_to_logical: slot s on EP rank s // K;
        logical_to_physical; logical_count) plus ep_rank_domain, fallback_domain and metrics.

        Example: topoplan place-experts --model deepseek-v3 --cluster dgx-h100 --gpus 64 --ep 64 --loads loads.npy --json
        """
        # options first: a bad value answers at once, before any file is read or layer solved
        _check_options(ep, slots_per_gpu, gpus, out, report)
        spec, cl, arr, K, rank_domain, rec, prev = _inputs(model, cluster, gpus, usable_per_rack, ep, slots_per_gpu,
                                                           loads, plan, routing, previous, max_moves)
        n_layers = len(arr)
        # a bar on stderr while a person watches it, even when stdout goes to a pipe or a file
        with progress(f"placing {n_layers} MoE layers", total=n_layers, stream=sys.stderr) as bar:
            pl = place(arr, rank_domain, K, n_group=spec.n_group, topk_group=spec.topk_group, top_k=spec.top_k,
                       previous=prev, max_moves=max_moves, time_limit=time_limit, seed=seed,
                       routing=None if rec is None else list(rec), workers=workers, on_layer=bar.advance)
        l2p, cnt = pl.logical_maps()
        doc = _document(spec, cl, ep, K, pl, l2p, cnt, tokens_per_step or 4096 * ep)
        doc["eplb"] = _eplb_baselines(arr, pl.rank_domain, K, spec, pl.selections, seed, previous=prev,
                                      max_moves=max_moves)
        if out is not None:
            with atomic_dir(out, option="--out") as stage:
                np.save(stage / "physical_to_logical.npy", pl.physical_to_logical)
                np.save(stage / "logical_to_physical.npy", l2p)
                np.save(stage / "logical_count.npy", cnt)
                np.save(stage / "fallback_domain.npy", pl.fallback_domain)
                np.save(stage / "ep_rank_domain.npy", pl.rank_domain)
                (stage / "placement.json").write_text(json.dumps(doc))
        if report is not None:
            write_report("place-experts", doc, report)
        if as_json:
            print(json.dumps(doc))
            return
        _print_text(doc, spec, cl, pl, max_moves, out)


def _check_options(ep: int, slots_per_gpu, gpus, out, report) -> None:
    """Refuse a bad option value before any file is read or layer solved."""
    if ep < 1:
        raise InputError(f"--ep {ep}: the EP group needs at least 1 GPU; give a positive --ep")
    if slots_per_gpu is not None and slots_per_gpu < 1:
        raise InputError(f"--slots-per-gpu {slots_per_gpu}: every GPU needs at least 1 expert slot; "
                         "give a positive value or drop it (default: experts/EP + 1 spare)")
    if gpus is not None and gpus < 1:
        raise InputError(f"--gpus {gpus}: give a positive GPU count")
    for path, opt in ((out, "--out"), (report, "--report")):
        if path is not None:
            check_output(path, opt, directory=True)


def _inputs(model, cluster, gpus, usable_per_rack, ep, slots_per_gpu, loads, plan, routing, previous, max_moves):
    """(model spec, cluster, loads[layers, experts], slots per GPU, EP rank domains, recorded routing or
    None, previous placement or None), each checked against the model and the options."""
    spec = load_model(model)
    if not spec.is_moe:
        raise InputError(f"--model {model}: dense model, no experts to place")
    cl = load_cluster(cluster, gpus=gpus, usable_per_domain=usable_per_rack)
    E = spec.num_experts
    n_layers = int(sum(spec.moe_layers))
    arr = load_loads(loads, n_layers, E)
    K = slots_per_gpu if slots_per_gpu is not None else -(-E // ep) + 1
    if K * ep < E:
        raise InputError(f"--slots-per-gpu {K}: {K} x {ep} GPUs = {K * ep} slots cannot hold {E} experts; "
                         f"use at least {-(-E // ep)}")
    if K > E:
        raise InputError(f"--slots-per-gpu {K}: more slots than the {E} experts (one replica of an expert per GPU)")
    gpu_idx = _ep_gpus(plan, ep) if plan else None
    rank_domain = ep_rank_domains(cl, ep, gpu_idx)
    rec = None
    if routing is not None:
        try:
            rec = np.load(routing, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"--routing {routing}: cannot read ({exc})") from None
        if rec.ndim != 3 or rec.shape[0] != n_layers or rec.min() < 0 or rec.max() >= E:
            raise InputError(f"--routing {routing}: expected expert ids in [0, {E}) of shape "
                             f"[{n_layers} MoE layers, tokens, top_k], got {tuple(rec.shape)}")
    prev = _read_previous(previous, n_layers, ep * K) if previous is not None else None
    if max_moves is not None and prev is None:
        raise InputError("--max-moves needs --previous (the placement the moves are counted against)")
    return spec, cl, arr, K, rank_domain, rec, prev


def _document(spec, cl, ep: int, K: int, pl, l2p, cnt, tokens: float) -> dict:
    """The placement document (what --json prints and -o writes), less the EPLB baselines."""
    summary = pl.summary()
    summary["cross_domain_bytes_per_step"] = cross_domain_bytes(
        [m["remote_domains_per_token"] for m in pl.metrics], tokens, spec.hidden_size)
    return {
        "model": spec.name, "cluster": cl.name, "ep": ep, "slots_per_gpu": K,
        "routing": pl.routing,
        "dispatch": "home: a token uses a replica in its own NVLink domain if there is one, "
                    "else the replicas in the expert's fallback_domain",
        "tokens_per_step": tokens,
        "ep_rank_domain": pl.rank_domain.tolist(),
        "summary": summary,
        "layers": [dict(layer=i, physical_to_logical=pl.physical_to_logical[i].tolist(),
                        logical_to_physical=l2p[i].tolist(), logical_count=cnt[i].tolist(),
                        fallback_domain=pl.fallback_domain[i].tolist(), **pl.metrics[i])
                   for i in range(len(pl.metrics))],
    }


def _print_text(doc: dict, spec, cl, pl, max_moves, out) -> None:
    """The terminal summary of a placement document."""
    s = doc["summary"]
    tokens = doc["tokens_per_step"]
    print(f"place-experts: {spec.name} on {cl.name}, EP{doc['ep']} x {doc['slots_per_gpu']} slots, "
          f"{len(pl.metrics)} MoE layers, {len(set(pl.rank_domain.tolist()))} NVLink domains")
    print(f"  balance (max/mean GPU load): {s['balance']:.3f} mean, {s['worst_balance']:.3f} worst layer")
    print(f"  domains per token: {s['domains_per_token']:.2f}   remote domains per token: "
          f"{s['remote_domains_per_token']:.2f}   cross-domain pairs: {100 * s['cross_domain_fraction']:.1f}%")
    print(f"  cross-domain bytes per step: {s['cross_domain_bytes_per_step'] / 1e9:.1f} GB "
          f"({tokens:.0f} tokens, bf16, dispatch+combine, fwd+bwd)")
    if s["moves"] is not None:
        print(f"  experts moved vs --previous: {s['moves']}" +
              (f" (at most {max_moves} per layer)" if max_moves is not None else ""))
    print(f"  solve time: {s['solve_s']:.1f} s (summed over layers); routing: {pl.routing}")
    for policy, b in doc["eplb"].items():
        if "balance" in b:
            moved = (f" (rebuilt from scratch, not move-capped: {b['moves']} moves vs --previous)"
                     if b.get("moves") is not None else "")
            print(f"  EPLB-{policy} on the same loads{moved}: balance {b['balance']:.3f}, "
                  f"remote domains per token {b['remote_domains_per_token']:.2f}")
    if out is not None:
        print(f"  wrote {out}/ (physical_to_logical.npy, logical_to_physical.npy, logical_count.npy, "
              "fallback_domain.npy, ep_rank_domain.npy, placement.json)")


def _eplb_baselines(loads, rank_domain, K: int, spec, recorded, seed: int, tokens: int = 2048,
                    previous=None, max_moves=None) -> dict:
    """EPLB's hierarchical and global placements of the same loads, measured on the same routing model
    (``recorded``: the selections place() measured on, sampled or recorded; None samples them) under EPLB's own even split of an
    expert's tokens over its replicas: the baseline printed beside topoplan's placement.

    EPLB ignores a previous placement: with ``previous`` each entry says so (``moves_capped``
    false, ``moves``: expert copies its placement needs against ``previous``, all layers), so a
    move-capped topoplan placement is not read as if EPLB had worked under the same cap."""
    ep = len(rank_domain)
    domains = int(rank_domain.max()) + 1
    L = loads.shape[0]
    routing = (list(recorded) if recorded is not None else
               [sample_routing(loads[i], spec.n_group, spec.topk_group, spec.top_k, tokens, seed + i)
                for i in range(L)])
    out = {}
    for policy in ("hierarchical", "global"):
        try:
            p2l, _, _ = rebalance_experts(loads, ep * K, spec.n_group, domains, ep, policy)
        except ValueError as exc:  # e.g. uneven domains or groups that do not split over domains
            out[policy] = {"skipped": str(exc)}
            continue
        metrics = evaluate_placement(p2l, rank_domain, K, loads, routing, "even")
        out[policy] = {"balance": float(np.mean([m["balance"] for m in metrics])),
                       "remote_domains_per_token": float(np.mean([m["remote_domains_per_token"] for m in metrics])),
                       "layers": metrics}
        if previous is not None:
            out[policy].update(moves=int(sum(moves_between(previous[i], p2l[i], K) for i in range(L))),
                               moves_capped=False,
                               note="EPLB rebuilds the placement from scratch; it is not held to "
                                    + (f"--max-moves {max_moves}" if max_moves is not None else "--previous"))
    return out
