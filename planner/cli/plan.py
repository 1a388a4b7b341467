"""CLI commands ``topoplan plan`` (the best layouts and their placement) and ``topoplan scale``
(the best layout at each of several GPU counts, with per-GPU retention)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from planner.cli import goodput_options as gopt
from planner.cli.checks import check_inputs
from planner.cli.progress import progress
from planner.config import ParallelConfig, Training
from planner.cost.predict import predict
from planner.cost.uncertainty import lead
from planner.errors import InfeasibleError, InputError, TopoplanError, pydantic_message
from planner.io import atomic_write_text, check_output
from planner.model.spec import load_model
from planner.output.emit import check_out, emit_plan, parse_trainers
from planner.output.emit.support import check_family
from planner.output.goodput import goodput_line, goodput_notes, options_lines
from planner.output.explain import (compact_table, first_that_fits, idle_note, longest_token, render_plan,
                                     uncertainty_lines)
from planner.output.report import write_report
from planner.rules import check, violations
from planner.search.plan import plan, scale
from planner.trainers import DEFAULT, needs_equal_slices
from topologies.loader import load_job

_OBJECTIVES = ("throughput", "tflops-per-gpu", "robust", "goodput")
_LAYOUT_KEYS = {"TP": "tp", "PP": "pp", "VPP": "vpp", "CP": "cp", "EP": "ep", "ETP": "etp", "DP": "dp", "MBS": "mbs"}


def parse_layout(text: str):
    """``TP1,PP2,VPP8,EP32`` (commas or spaces; also CP, ETP, DP, MBS, FSDP, RC:<recompute>, the
    tokens of ``ParallelConfig.short()``) -> ParallelConfig; InputError names the token at fault."""
    fields: dict = {}
    for tok in [t for t in re.split(r"[,\s]+", text or "") if t]:
        up = tok.upper()
        m = re.fullmatch(r"(VPP|ETP|MBS|TP|PP|CP|EP|DP)(\d+)", up)
        if m:
            fields[_LAYOUT_KEYS[m.group(1)]] = int(m.group(2))
        elif up == "FSDP":
            fields["fsdp"] = True
        elif up.startswith("RC:"):
            fields["recompute"] = tok[3:]
        else:
            raise InputError(f"--compare {text!r}: unknown token {tok!r}; use e.g. TP1,PP2,VPP8,EP32 "
                             "(TP, PP, VPP, CP, EP, ETP, DP, MBS with a number; FSDP; RC:<recompute>)")
    if not fields:
        raise InputError("--compare: give a layout, e.g. TP1,PP2,VPP8,EP32")
    try:
        return ParallelConfig(**fields)
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, f"--compare {text!r}")) from None


def compare_entry(text: str, model, cluster, result, gpus: int | None = None) -> dict:
    """The layout of ``--compare`` priced on the plan's cluster and training (the best plan's batch)
    on the GPUs the job offers (``gpus``, default every GPU of the cluster; DP fills them unless the
    layout gives it), and the best plan's lead over it with the uncertainty verdict
    (``planner.cost.uncertainty.lead``)."""
    cfg = parse_layout(text)
    best = result.plans[0]
    tr = result.training.model_copy(update={"global_batch": best.gbs})
    world = cfg.world(gpus or cluster.num_gpus)
    if cfg.dp is None:   # every offered GPU, as a published run of this layout uses them
        cfg = cfg.model_copy(update={"dp": max(1, world // cfg.model_parallel)})
    check(model, cfg, tr, world)
    p = predict(model, cluster, cfg, tr)
    key = "tflops_per_gpu" if result.solver.get("objective_name") == "tflops_per_gpu" else "tokens_per_s"
    gap, within = lead(getattr(best.prediction, key), best.prediction.band_half_width, getattr(p, key))
    return {"label": p.config.short(), "world": p.world, "prediction": p.document(),
            "plan_lead": gap, "within_uncertainty": within}


def _gbs_range(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        lo, hi = (int(p) for p in text.split(":"))
    except ValueError:
        raise InputError(f"--gbs-range {text!r}: use A:B with integers, e.g. 2048:8192") from None
    if not 1 <= lo <= hi:
        raise InputError(f"--gbs-range {text!r}: need 1 <= A <= B")
    return lo, hi


def _training(seq_len, gbs, precision, stack, trainer, cuda_graphs=True, memory_headroom=None, recipe=None):
    try:
        return Training(seq_len=seq_len, global_batch=gbs, precision=precision, stack=stack,
                        trainer=trainer or DEFAULT, cuda_graphs=cuda_graphs,
                        **({} if memory_headroom is None else {"memory_headroom": memory_headroom}),
                        **({"recipe": recipe} if recipe else {}))
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, "training options").replace("memory_headroom", "--memory-headroom")) from None


OFFLOAD_HELP = ("Megatron: share of the optimizer state kept and updated on the CPU (--optimizer-cpu-offload "
                "--optimizer-offload-fraction; 0 = off). Default: off, unless no layout fits in HBM without it (plan "
                "then chooses the smallest of 0.25, 0.5, 0.75, 1 that fits)")
def _offload_recipe(fraction):
    """--optimizer-offload-fraction as recipe settings (None: auto, planner.search.offload)."""
    return None if fraction is None else {"optimizer_offload_fraction": fraction}


HEADROOM_HELP = ("HBM each GPU keeps free for what the memory model leaves out: a share (5%), GiB (8GiB) or both "
                 "(5%,4GiB: the larger); default 5%")
WARN_SHARE = 0.95  # the terminal output warns when a plan fills more of HBM than this


def memory_warnings(plans, hbm_gib: float) -> list[str]:
    """One line per plan whose estimate fills more than 95% of HBM (possible with a small headroom);
    ``plans``: (label, Prediction) pairs."""
    out = []
    for label, pred in plans:
        used = pred.memory_gib_per_gpu
        if hbm_gib and used > WARN_SHARE * hbm_gib:
            out.append(f"warning: {label + ': ' if label else ''}{used:.1f} of {hbm_gib:.0f} GiB HBM "
                       f"({used / hbm_gib:.1%}) per GPU; CUDA-graph pools, expert imbalance and fragmentation "
                       "are only partly modelled: keep a --memory-headroom")
    return out


def header(training, model_name: str, cluster_name: str, offered: int, used) -> dict:
    """What a plan / scale / predict answer is for: one dict, printed as the header line and in --json."""
    return {"stack": training.stack, "trainer": training.trainer, "model": model_name, "cluster": cluster_name,
            "gpus_offered": offered, "gpus_used": used, "precision": training.precision,
            "seq_len": training.seq_len, "global_batch": training.global_batch}


def header_line(h: dict) -> str:
    used = h["gpus_used"] if not isinstance(h["gpus_used"], (list, tuple)) else ",".join(map(str, h["gpus_used"]))
    offered = h["gpus_offered"]
    offered = ",".join(map(str, offered)) if isinstance(offered, (list, tuple)) else offered
    return (f"stack {h['stack']} | trainer {h['trainer']} | model {h['model']} | cluster {h['cluster']} | "
            f"GPUs offered {offered}, used {used} | {h['precision']} | seq {h['seq_len']} | "
            f"gbs {h['global_batch']}")


def smallest_fitting(plan_at, offered: int, step: int, cap: int = 65536):
    """The fewest GPUs (``offered`` plus whole units of ``step``, the GPUs of a host) on which ``plan_at(n)`` finds a
    layout: doubling until one fits, then bisection between the last count that did not and the
    first that did. Returns (n, the best layout there, n less the largest count found not to fit) or
    None when nothing up to ``cap`` fits or the cluster cannot be sized (a cluster file of fixed size)."""
    step = max(1, int(step))

    def fits(n):
        try:
            return plan_at(n).plans[0].label
        except TopoplanError:
            return None

    lo, hi = offered, None
    n = (offered // step + 1) * step            # the next count of whole allocation units
    while n <= cap:
        lab = fits(n)
        if lab:
            hi = (n, lab)
            break
        lo, n = n, 2 * n
    if hi is None:
        return None
    while hi[0] - lo > step:   # invariant: lo does not fit, hi fits
        mid = lo + (hi[0] - lo) // step // 2 * step
        if mid <= lo:
            break
        lab = fits(mid)
        if lab:
            hi = (mid, lab)
        else:
            lo = mid
    return hi[0], hi[1], hi[0] - lo


def _objective(value: str) -> str:
    if value not in _OBJECTIVES:
        raise InputError(f"--objective {value!r}: use one of {', '.join(_OBJECTIVES)}")
    return value


def register(app: typer.Typer) -> None:
    """Add ``plan`` and ``scale`` to the root app."""
    app.command("plan")(plan_cmd)
    app.command("scale")(scale_cmd)


def plan_cmd(
    model: str = typer.Option(..., "--model", help="catalog name (topoplan models list) or config.json path"),
    cluster: str = typer.Option(..., "--cluster", help="cluster preset (gb300-nvl72, dgx-h100, ...) or YAML path"),
    gpus: int = typer.Option(None, "--gpus", min=1, help="GPUs offered (the plan may use fewer)"),
    usable_per_rack: int = typer.Option(None, "--usable-per-rack", min=1,
                                        help="NVL72 presets: GPUs used per rack (default: the planner chooses)"),
    memory_headroom: str = typer.Option(None, "--memory-headroom", help=HEADROOM_HELP),
    stack: str = typer.Option(None, "--stack", help="software stack profile (default: the trainer's own: megatron-26.08, torchtitan, maxtext)"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp8 | fp8-block | mxfp8 | nvfp4"),
    seq_len: int = typer.Option(4096, "--seq-len", min=1, help="sequence length in tokens"),
    gbs: int = typer.Option(None, "--gbs", min=1, help="global batch in sequences (required unless --gbs-range)"),
    gbs_range: str = typer.Option(None, "--gbs-range", help="let the solver choose the global batch in A:B"),
    trainer: str = typer.Option(None, "--trainer", help="megatron | torchtitan | maxtext (default: megatron)"),
    top: int = typer.Option(3, "--top", min=1, max=20, help="how many layouts to show"),
    time_limit: float = typer.Option(None, "--time-limit", min=0.01, help="solver time limit in seconds"),
    objective: str = typer.Option("throughput", "--objective", help="throughput (cluster tokens/s) | tflops-per-gpu | "
                                  "robust (the lower edge of the uncertainty band of tokens/s) | goodput "
                                  "(tokens/s once failures are counted: chooses GPUs per rack and spares)"),
    failure_rates: str = gopt.failure_rates_opt(),
    storage_bw: float = gopt.storage_bw_opt(),
    restart_min: float = gopt.restart_opt(),
    repair_hours: float = gopt.repair_opt(),
    checkpoint_interval: str = gopt.interval_opt(),
    compare: str = typer.Option(None, "--compare", help="also price this layout, e.g. TP1,PP2,VPP8,EP32, and show "
                                "the plan's lead over it and whether it is within the model's uncertainty"),
    as_json: bool = typer.Option(False, "--json", help="print the plan document as JSON"),
    save_plan: Path = typer.Option(None, "--save-plan", help="write the plan document (plan.json) here"),
    emit: str = typer.Option(None, "--emit", help="launch configs to write: megatron,bridge,torchtitan,maxtext,slurm,k8s,k8s-cluster"),
    out: Path = typer.Option(None, "--out", help="directory for --emit (and plan.json)"),
    force: bool = typer.Option(False, "--force", help="replace --out whole when it holds another plan's files"),
    report: Path = typer.Option(None, "--report", help="directory for an HTML report with figures"),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                     help="plan for a recipe with CUDA graphs and fused ops (default) or an eager one"),
    method: str = typer.Option("enumerate", "--method",
                               help="search engine, all exact: enumerate (default: bounded block search) | "
                                    "cp-sat (the same blocks enumerated by CP-SAT) | exhaustive | cp-sat-full"),
    offload: float = typer.Option(None, "--optimizer-offload-fraction", min=0.0, max=1.0, help=OFFLOAD_HELP),
):
    """Choose the parallel layout and its placement that maximise predicted throughput.

    Example: topoplan plan --model deepseek-v3 --cluster gb300-nvl72 --gpus 256 --precision mxfp8 --gbs 4096
    """
    obj = _objective(objective)
    rng = _gbs_range(gbs_range)
    if gbs is None:   # --gbs-range alone: the solver chooses in A:B (the request starts from A)
        if rng is None:
            raise InputError("--gbs: give the global batch in sequences, or --gbs-range A:B to let the planner "
                             "choose it")
        gbs = rng[0]
    if emit and out is None:
        raise InputError("--emit needs --out DIR (the directory the launch configs go to)")
    for path, opt, is_dir in ((save_plan, "--save-plan", False), (out, "--out", True), (report, "--report", True)):
        if path is not None:
            check_output(path, opt, directory=is_dir)   # refused before the search runs
    if emit:
        check_out(out, None, force)   # a directory of other files: refused before the search too
    check_inputs(model, precision=precision, trainer=trainer, seq_len=seq_len, gbs=gbs, gpus=gpus, gbs_range=gbs_range)
    training = _training(seq_len, gbs, precision, stack, trainer, cuda_graphs, memory_headroom, _offload_recipe(offload))
    res_opts = gopt.resilience(failure_rates, storage_bw, restart_min, repair_hours, checkpoint_interval)
    m = load_model(model)
    for t in parse_trainers(emit) if emit else ():
        check_family(m, t, training.seq_len)   # a trainer that cannot build the family: before the search
    job = load_job(cluster, gpus=gpus, usable_per_domain=usable_per_rack)
    c = job.cluster
    emits = [t.strip().lower() for t in (emit or "").split(",") if t.strip()]
    # a trainer's equal slices (MaxText's mesh) are a constraint of the search when that trainer runs the plan
    eq = needs_equal_slices(trainer or training.trainer, emits)
    try:
        result = plan(m, job, training, top=top, time_limit=time_limit, objective=obj, gbs_range=rng,
                      trainer=trainer, method=method, equal_slices=eq, resilience=res_opts)
    except InfeasibleError as exc:
        if "no layout fits" not in str(exc) and "memory lower bound" not in str(exc):
            raise
        n = smallest_fitting(lambda k: plan(m, load_job(cluster, gpus=k, usable_per_domain=usable_per_rack),
                                            training, top=1, time_limit=time_limit, gbs_range=rng,
                                            trainer=trainer, equal_slices=eq),
                             job.gpus, min(node.gpus for node in c.nodes))   # the allocation unit
        if n is None:
            raise
        raise InfeasibleError(f"{exc}: {n[0]} GPUs fit ({n[1]}), {n[0] - n[2]} do not") from None
    doc = result.to_dict()
    if compare:
        doc["compare"] = compare_entry(compare, m, c, result, gpus=job.gpus)
    doc["header"] = header(result.training, m.name, c.name, job.gpus,
                           result.plans[0].world if result.plans else None)
    text = json.dumps(doc, indent=2)
    # the outputs most likely to refuse go first; each is written atomically
    if emit:
        trainers = [t.strip() for t in emit.split(",") if t.strip()]
        emit_plan(doc, trainers, out, force=force)
    if report is not None:
        write_report("plan", doc, report)
    if save_plan is not None:
        atomic_write_text(save_plan, text + "\n", option="--save-plan")
    if as_json:
        sys.stdout.write(text + "\n")
        return
    _render(doc, c, result, replan=lambda g: plan(m, job, training.model_copy(update={"global_batch": g}), top=1,
                                                  time_limit=time_limit, objective=obj, trainer=trainer,
                                                  method=method, equal_slices=eq, resilience=res_opts))

def scale_cmd(
    model: str = typer.Option(..., "--model", help="catalog name or config.json path"),
    cluster: str = typer.Option(..., "--cluster", help="cluster preset or YAML path"),
    gpus: str = typer.Option(..., "--gpus", help="comma-separated GPU counts, e.g. 256,512,1024"),
    usable_per_rack: int = typer.Option(None, "--usable-per-rack", min=1,
                                        help="NVL72 presets: GPUs used per rack (default: the planner chooses)"),
    memory_headroom: str = typer.Option(None, "--memory-headroom", help=HEADROOM_HELP),
    stack: str = typer.Option(None, "--stack", help="software stack profile (default: the trainer's own: megatron-26.08, torchtitan, maxtext)"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp8 | fp8-block | mxfp8 | nvfp4"),
    seq_len: int = typer.Option(4096, "--seq-len", min=1, help="sequence length in tokens"),
    gbs: int = typer.Option(None, "--gbs", min=1, help="global batch (default: 16 sequences per GPU of the smallest size)"),
    gbs_range: str = typer.Option(None, "--gbs-range", help="let the solver choose the global batch in A:B"),
    weak: bool = typer.Option(False, "--weak", help="weak scaling: the global batch grows with the GPUs (--gbs at the "
                                                     "smallest size); default: it stays fixed (strong scaling)"),
    trainer: str = typer.Option(None, "--trainer", help="megatron | torchtitan | maxtext"),
    time_limit: float = typer.Option(None, "--time-limit", min=0.01, help="solver time limit per size"),
    objective: str = typer.Option("throughput", "--objective", help="throughput | tflops-per-gpu | goodput"),
    failure_rates: str = gopt.failure_rates_opt(),
    storage_bw: float = gopt.storage_bw_opt(),
    restart_min: float = gopt.restart_opt(),
    repair_hours: float = gopt.repair_opt(),
    checkpoint_interval: str = gopt.interval_opt(),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    report: Path = typer.Option(None, "--report", help="directory for an HTML report with the scaling curve"),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                     help="plan for a recipe with CUDA graphs and fused ops (default) or an eager one"),
):
    """Plan each GPU count and show throughput, TFLOP/s per GPU and per-GPU retention, with goodput.

    Example: topoplan scale --model deepseek-v3 --cluster gb300-nvl72 --gpus 256,512,1024 --precision mxfp8
    """
    try:
        sizes = [int(s) for s in gpus.split(",") if s.strip()]
    except ValueError:
        raise InputError(f"--gpus {gpus!r}: use comma-separated integers, e.g. 256,512,1024") from None
    if not sizes or any(s < 1 for s in sizes):
        raise InputError(f"--gpus {gpus!r}: give at least one positive GPU count")
    obj = _objective(objective)
    rng = _gbs_range(gbs_range)
    if weak and rng is not None:
        raise InputError("--weak with --gbs-range: weak scaling grows --gbs with the GPUs; give one of the two")
    if report is not None:
        check_output(report, "--report", directory=True)   # refused before the sizes are planned
    training = _training(seq_len, gbs or 16 * min(sizes), precision, stack, trainer, cuda_graphs,
                         memory_headroom)
    res_opts = gopt.resilience(failure_rates, storage_bw, restart_min, repair_hours, checkpoint_interval)
    m = load_model(model)
    with progress("planning sizes", total=len(sizes), json_output=as_json) as bar:
        rows = scale(m, lambda n: load_job(cluster, gpus=n, usable_per_domain=usable_per_rack), sizes, training,
                     time_limit=time_limit,
                     objective=obj, gbs_range=rng, trainer=trainer, on_done=lambda n: bar.advance(),
                     resilience=res_opts, weak=weak)
    doc = {"model": m.name, "cluster": cluster, "rows": rows,
           "header": header(training if trainer is None else training.model_copy(update={"trainer": trainer}),
                            m.name, cluster, sizes, [r["world"] for r in rows])}
    if report is not None:
        write_report("scale", doc, report)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    con = Console()
    con.print(header_line(doc["header"]), highlight=False)
    _render_scale(rows, con)


def _render(doc, cluster, result, replan=None) -> None:
    console = Console()
    console.print(header_line(doc["header"]), highlight=False)
    render_plan(doc, console=console, hbm_gib=cluster.gpu_spec.hbm_gib)
    _render_uncertainty(doc, console)
    _render_goodput(doc, console)
    # the solver line and the NVLink domains per group are printed by render_plan (once)
    offered = doc["header"]["gpus_offered"]
    spares = _spares_note(doc, offered)
    note = spares or idle_note(doc, offered, idle_reason(result, offered, replan) if replan else "")
    if note:
        console.print(note, style="yellow", highlight=False)
    t = result.training
    hbm = cluster.gpu_spec.hbm_gib
    console.print(f"memory headroom {t.memory_headroom}: plans fit in {hbm - t.headroom_gib(hbm):.1f} of {hbm:.0f} GiB "
                  "per GPU")
    for line in memory_warnings([(e.label, e.prediction) for e in result.plans], hbm):
        console.print(line, style="bold yellow")


def idle_reason(result, offered: int, replan) -> str:
    """Why the best plan leaves GPUs idle and what to try. The layout's data-parallel degree must
    divide the global batch (with the micro-batch) and meet the trainer's rules: the line says whether
    a larger DP of the same TP, CP, PP and EP could have used more GPUs with this batch, then plans
    (``replan(gbs)``) the nearest batch that a larger DP divides; when that plan uses more GPUs and
    gives more tokens/s the line names the batch and the gain."""
    best = result.plans[0]
    cfg, tr = best.config, result.training
    mp, gbs, mbs = cfg.model_parallel, best.gbs, cfg.mbs
    dp = cfg.dp_for(best.world)
    shape = " ".join(w for w in cfg.short().split() if not w.startswith(("DP", "MBS")))

    def allowed(d: int, g: int) -> bool:
        return not violations(result.model, cfg.model_copy(update={"dp": d}),
                              tr.model_copy(update={"global_batch": g}), d * mp)

    larger = [d for d in range(dp + 1, offered // mp + 1) if gbs % (d * mbs) == 0 and allowed(d, gbs)]
    if larger:
        why = (f"DP{larger[-1]} of {shape} would divide the global batch {gbs} and meet the rules, but the "
               "solver predicts fewer tokens/s there")
    else:
        why = (f"no data-parallel degree of {shape} above DP{dp} divides the global batch {gbs} "
               f"(with MBS{mbs}) and meets the rules on these GPUs")
    for d in range(offered // mp, dp, -1):
        g = max(1, round(gbs / (d * mbs))) * d * mbs
        if g == gbs or not allowed(d, g):
            continue
        try:
            other = replan(g).plans[0]
        except TopoplanError:
            break
        p0, p1 = best.prediction, other.prediction
        if other.world > best.world and p1.tokens_per_s > p0.tokens_per_s:
            return (f"{why}; with --gbs {g} the best plan ({other.label}) uses {other.world} GPUs for "
                    f"{p1.tokens_per_s / p0.tokens_per_s - 1:+.1%} tokens/s")
        break
    return why


def _spares_note(doc, offered) -> str:
    """Under --objective goodput the GPUs a plan leaves idle are its spares: say so."""
    best = doc["plans"][0] if doc["plans"] else {}
    g = best.get("goodput") or {}
    world = best.get("config", {}).get("world") or 0
    if (doc.get("solver") or {}).get("objective_name") != "goodput_tokens_per_s" or not world or world >= offered:
        return ""
    return (f"note: {offered - world} of {offered} GPUs kept as spares ({g.get('spare_hosts_per_domain', 0)} hosts "
            "per NVLink domain): --objective goodput found spares worth more than the GPUs they take")


def _render_goodput(doc, console) -> None:
    """Each plan's goodput line, where its inputs come from, and the --objective goodput options."""
    for i, entry in enumerate(doc["plans"]):
        line = goodput_line(entry, i)
        if line:
            console.print(line, highlight=False)
    if doc["plans"]:
        for note in goodput_notes(doc["plans"][0]):
            console.print(f"   note: {note}", style="dim", highlight=False)
    opts = options_lines(doc.get("solver") or {})
    if opts:
        console.print("--objective goodput: the best plan of each GPUs-per-domain option", highlight=False)
        for line in opts:
            console.print(f"   {line}", highlight=False)


def _render_uncertainty(doc, console) -> None:
    """Each plan's band, its lead over the next, the extrapolation notes and the --compare layout
    (planner.output.explain.uncertainty_lines: the HTML report shows the same lines)."""
    for line, note in uncertainty_lines(doc):
        console.print(line, highlight=False)
        if note:
            console.print(f"   note: {note}", style="yellow", highlight=False)


def _render_scale(rows, console=None) -> None:
    console = console or Console()
    console.print(scale_table(rows, console.width))


def _goodput_cell(row, key) -> str:
    v = row.get(key)
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if key == "goodput_retention" else f"{v:,.0f}"


def scale_table(rows, width: int | None = None):
    """The scaling table: figures never wrap; the layout and the solver cell wrap between tokens."""
    cells = [[f"{r['gpus']:,}", f"{r['world']:,}", r["layout"], f"{r['tokens_per_s']:,.0f}",
              f"{r['tflops_per_gpu']:,.0f}", f"{100 * r['retention']:.1f}%", _goodput_cell(r, "goodput_tokens_per_s"),
              _goodput_cell(r, "goodput_retention"), f"{r['status']} {r['wall_s']:.1f} s"]
             for r in rows]
    cols = ("GPUs", "used", "layout", "tokens/s", "TFLOP/s", "retained", "goodput", "g.retained", "solver")
    wrap = {"layout", "solver"}

    def build(wide: bool) -> Table:
        t = compact_table(title="scaling",
                  caption="tokens/s of the cluster; TFLOP/s: model TFLOP/s per GPU; retained: per-GPU throughput "
                          "against the smallest size; goodput: tokens/s once failures, checkpoints and restarts are "
                          "counted (docs/resilience.md); g.retained: goodput per GPU against the smallest size")
        for k, col in enumerate(cols):
            if col in wrap and not wide:
                t.add_column(col, overflow="fold", min_width=longest_token(c[k] for c in cells))
            else:
                t.add_column(col, justify="left" if col in wrap else "right", no_wrap=True)
        for c in cells:
            t.add_row(*c)
        return t

    return first_that_fits([build(True), build(False)], width)
