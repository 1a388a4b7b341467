"""CLI commands: ``predict`` (one layout), ``validate`` (predicted against measured rows) and
``calibrate`` (fit a stack profile to measured rows)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from planner.cli.checks import check_inputs
from planner.calibration.crosscheck import crosscheck, warning_lines
from planner.cli.plan import header, header_line, memory_warnings
from planner.cli.progress import progress
from planner.config import ParallelConfig, Training
from planner.cost.placement import make_placement
from planner.cost.predict import predict
from planner.cost.profiles import dump_profile, load_profile
from planner.calibration.memfit import fit_memory
from planner.calibration.validate import read_rows, validate_rows
from planner.errors import InfeasibleError, InputError, pydantic_message
from planner.io import atomic_write_text, check_output
from planner.model.spec import load_model
from planner.output.emit.readback import read_files
from planner.output.explain import (
    MEMORY_LABELS,
    TERM_LABELS,
    breakdown_bar,
    compact_table,
    first_that_fits,
    longest_token,
    memory_bar,
)
from planner.rules import check
from planner.search.plan import gpd_options
from topologies.loader import load_cluster, load_job


def _config(tp, pp, vpp, cp, ep, etp, dp, mbs, fsdp, recompute, dispatcher):
    try:
        return ParallelConfig(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=dp, mbs=mbs, fsdp=fsdp,
                              recompute=recompute, dispatcher=dispatcher)
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, "options")) from None


def predict_cmd(
    model: str = typer.Option(..., "--model", help="catalog name or config.json path"),
    cluster: str = typer.Option(..., "--cluster", help="cluster preset (gb300-nvl72, dgx-h100, ...) or YAML path"),
    gpus: int = typer.Option(None, "--gpus", min=1, help="GPUs the job uses (NVL72 presets: on whole racks)"),
    usable_per_rack: int = typer.Option(None, "--usable-per-rack", min=1,
                                        help="NVL72 presets: GPUs used per rack (default: the best for the layout)"),
    memory_headroom: str = typer.Option(None, "--memory-headroom",
                                        help="HBM kept free: a share (5%), GiB (8GiB) or both (5%,4GiB: the larger); "
                                             "default 5%"),
    stack: str = typer.Option(None, "--stack", help="stack profile name or profile YAML path "
                              "(its trainer: megatron-*, torchtitan, maxtext; default megatron-26.08, or the "
                              "files' trainer's own with --from)"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp8 | fp8-block | mxfp8 | nvfp4"),
    seq_len: int = typer.Option(4096, "--seq-len", min=1, help="sequence length"),
    gbs: int = typer.Option(None, "--gbs", min=1, help="global batch size (sequences); needed unless --from"),
    mbs: int = typer.Option(1, "--mbs", min=1, help="micro-batch size"),
    tp: int = typer.Option(1, "--tp", min=1), pp: int = typer.Option(1, "--pp", min=1),
    vpp: int = typer.Option(1, "--vpp", min=1), cp: int = typer.Option(1, "--cp", min=1),
    ep: int = typer.Option(1, "--ep", min=1),
    etp: int = typer.Option(None, "--etp", min=1, help="expert tensor parallel (default: TP)"),
    dp: int = typer.Option(None, "--dp", min=1, help="data parallel (default: all GPUs)"),
    fsdp: bool = typer.Option(False, "--fsdp", help="fully sharded data parallel"),
    recompute: str = typer.Option("none", "--recompute", help="none | full | selective | modules joined by +"),
    dispatcher: str = typer.Option(None, "--dispatcher", help="alltoall | allgather | flex-deepep | flex-hybridep (default: the stack's)"),
    gpus_per_domain: int = typer.Option(None, "--gpus-per-domain", min=1, help="GPUs used per NVLink domain (default: keep EP/TP groups whole)"),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                     help="the recipe captures CUDA graphs and fuses elementwise ops (default) or runs eagerly"),
    cpu_offload_layers: int = typer.Option(None, "--cpu-offload-layers", min=0,
                                           help="Megatron: offload the activations of the first N decoder layers "
                                                "to the CPU (--cpu-offloading-num-layers; pp 1, no recompute)"),
    fp8_param_gather: bool = typer.Option(None, "--fp8-param-gather/--no-fp8-param-gather",
                                          help="Megatron: keep FP8 parameters (--fp8-param-gather; default: on for "
                                               "fp8 and mxfp8 as NVIDIA's recipes, where the layout allows)"),
    fp4_param_gather: bool = typer.Option(None, "--fp4-param-gather/--no-fp4-param-gather",
                                          help="Megatron: keep NVFP4 parameters (--fp4-param-gather; default: on for "
                                               "nvfp4 as NVIDIA's recipes)"),
    fp8_recipe: str = typer.Option(None, "--fp8-recipe", help="Megatron, precision fp8: delayed (Transformer "
                                   "Engine's delayed scaling: an amax all-reduce over each pipeline stage per "
                                   "micro-batch) or tensorwise (current scaling; the default, what topoplan writes)"),
    optimizer_offload_fraction: float = typer.Option(None, "--optimizer-offload-fraction", min=0.0, max=1.0,
                                                     help="Megatron: share of the optimizer state kept and updated "
                                                          "on the CPU (--optimizer-cpu-offload; default 0 = off)"),
    torch_compile: bool = typer.Option(None, "--torch-compile/--no-torch-compile",
                                       help="TorchTitan: torch.compile the model's blocks (--compile.enable with "
                                            "'model' in --compile.components; default: as the model's TorchTitan "
                                            "registry function)"),
    json_out: bool = typer.Option(False, "--json", help="print JSON"),
    from_files: Path = typer.Option(None, "--from", help="price emitted launch files instead of the layout options: "
                                    "megatron/args.txt (WORLD_SIZE from env.sh next to it) or "
                                    "torchtitan/command.txt (with --gpus), or their directory"),
) -> None:
    """Predict throughput, step-time breakdown and memory of one parallel layout.

    Example: topoplan predict --model deepseek-v3 --cluster gb300-nvl72 --gpus 256 --precision mxfp8
    --gbs 4096 --pp 2 --vpp 8 --ep 32
    """
    m, prof, cfg, training, order = _layout_and_training(
        model, stack, precision, seq_len, gbs, from_files, gpus, memory_headroom,
        (tp, pp, vpp, cp, ep, etp, dp, mbs, fsdp, recompute, dispatcher), cuda_graphs,
        {"cpu_offload_layers": cpu_offload_layers or None, "fp8_param_gather": fp8_param_gather,
         "fp4_param_gather": fp4_param_gather, "torch_compile": torch_compile, "fp8_recipe": fp8_recipe,
         "optimizer_offload_fraction": optimizer_offload_fraction or None})
    # issue 11 item 5: the same job as plan's (topologies.loader.load_job); GPUs per NVLink domain:
    # --gpus-per-domain, else the fixed --usable-per-rack, else the best of the plan's choices
    if gpus and cfg.dp is None:
        check(m, cfg, training, cfg.world(gpus))  # a broken rule is named before the racks are sized
    job = load_job(cluster, gpus=gpus, usable_per_domain=usable_per_rack)
    cl = job.cluster
    world = cfg.world(job.gpus)
    check(m, cfg, training, world)
    p = None
    custom = order is not None and order != "tp-cp-ep-dp-pp"
    for g in ([gpus_per_domain] if gpus_per_domain else gpd_options(job)):
        try:
            placement = make_placement(cl, cfg, world, g, order=order) if custom else make_placement(cl, cfg, world, g)
        except InfeasibleError:
            continue
        q = predict(m, cl, cfg, training, placement=placement, profile=prof)
        if p is None or (q.fits, q.tokens_per_s) > (p.fits, p.tokens_per_s):
            p = q
    if p is None:  # no choice holds the world: the one-line reason
        make_placement(cl, cfg, world, gpus_per_domain)
    h = header(training, m.name, cl.name, gpus or cl.num_gpus, p.world)
    if json_out:
        d = p.to_dict()
        d.pop("placement", None)
        d["header"] = h
        print(json.dumps(d, indent=2))
    else:
        Console().print(header_line(h), highlight=False)
        _render(p, m, cl, training)
    if not p.fits:  # the prediction is shown (JSON too, with fits false); the exit code says infeasible
        raise InfeasibleError(shortfall(p))


def _layout_and_training(model, stack, precision, seq_len, gbs, from_files, gpus, memory_headroom, layout, cuda_graphs,
                         recipe):
    """(model spec, profile, ParallelConfig, Training, rank order or None) from predict's options:
    the layout options (``layout``: tp, pp, vpp, cp, ep, etp, dp, mbs, fsdp, recompute, dispatcher)
    or, with ``--from``, the emitted files."""
    prof = load_profile(stack or "megatron-26.08")
    check_inputs(model, precision=precision, seq_len=seq_len, gbs=gbs, range_flag=False)
    m = load_model(model)
    order = None
    if from_files is not None:   # the layout, batch, precision and recipe come from the files
        cfg, training, order = read_files(from_files, m, gpus, stack=None if stack is None else prof.name)
        prof = load_profile(training.stack)
        if cfg.dp is None and gpus:
            cfg = cfg.model_copy(update={"dp": gpus // cfg.model_parallel})
    else:
        if gbs is None:
            raise InputError("--gbs: give the global batch (or --from megatron/args.txt of an emitted plan)")
        cfg = _config(*layout)  # dispatcher None: the stack's, or alltoall where the fabric cannot run it (predict)
        try:
            training = Training(seq_len=seq_len, global_batch=gbs, precision=precision.lower(), stack=prof.name,
                                trainer=prof.trainer, cuda_graphs=cuda_graphs, recipe=recipe,
                                **({} if memory_headroom is None else {"memory_headroom": memory_headroom}))
        except ValidationError as exc:
            raise InputError(pydantic_message(exc, "options")) from None
    if memory_headroom is not None and from_files is not None:
        try:
            training = training.model_copy(update={"memory_headroom": Training(
                global_batch=1, memory_headroom=memory_headroom).memory_headroom})
        except ValidationError as exc:
            raise InputError(pydantic_message(exc, "options")) from None
    return m, prof, cfg, training, order


def shortfall(p) -> str:
    """One line: the layout, its peak memory per GPU, what it must fit in and by how much it misses."""
    usable = p.usable_gib if getattr(p, "usable_gib", None) is not None else p.hbm_gib
    within = f"{p.hbm_gib:.0f} GiB HBM" if usable >= p.hbm_gib else f"{usable:.1f} GiB usable of {p.hbm_gib:.0f} GiB HBM"
    if p.memory_gib_per_gpu == float("inf") or not p.memory:
        return f"{p.config.short()} cannot run: {'; '.join(v.message for v in p.violations) or 'no memory estimate'}"
    if p.memory_gib_per_gpu <= usable and p.host_gib_per_node:   # HBM holds it: the offloaded optimizer overflows
        return (f"{p.config.short()} does not fit: {p.memory_gib_per_gpu:.1f} GiB per GPU fits in {within}, but the "
                f"offloaded optimizer state of a node's ranks needs {p.host_gib_per_node:,.0f} GiB of host memory, "
                f"over the {p.host_usable_gib:,.0f} GiB usable; lower --optimizer-offload-fraction or use more GPUs")
    return (f"{p.config.short()} does not fit: {p.memory_gib_per_gpu:.1f} GiB per GPU > {within} "
            f"(short by {p.memory_gib_per_gpu - usable:.1f} GiB); try recompute, more PP/EP or a smaller micro-batch")


def _render(p, model, cluster, training) -> None:
    con = Console()
    con.print(f"[bold]{model.name}[/] on {cluster.name} ({p.world} x {cluster.gpu_spec.name.upper()}), "
              f"{training.precision}, seq {training.seq_len}, gbs {training.global_batch}, stack {p.stack}")
    con.print(f"layout  {p.config.short()}")
    t = Table(show_header=False, box=None)
    t.add_row("model TFLOP/s per GPU", f"[bold]{p.tflops_per_gpu:,.0f}[/]")
    t.add_row("uncertainty band", f"{p.tflops_per_gpu_low:,.0f} - {p.tflops_per_gpu_high:,.0f} TFLOP/s  (regime "
              f"{p.regime}; {p.band_runs} measured runs)" if p.band_runs else
              f"{p.tflops_per_gpu_low:,.0f} - {p.tflops_per_gpu_high:,.0f} TFLOP/s  (regime {p.regime}; default width)")
    t.add_row("tokens/s per GPU", f"{p.tokens_per_s_per_gpu:,.0f}")
    t.add_row("tokens/s", f"{p.tokens_per_s:,.0f}")
    t.add_row("step time", f"{p.step_time_s:.3f} s")
    t.add_row("memory per GPU", f"{p.memory_gib_per_gpu:.1f} GiB of {p.hbm_gib:.0f} GiB"
              + ("" if p.fits else "  [bold red]does not fit[/]"))
    if p.host_gib_per_node:   # Megatron's optimizer CPU offload (docs/memory.md 4d)
        t.add_row("host memory per node", f"{p.host_gib_per_node:,.0f} GiB of {p.host_usable_gib:,.0f} GiB usable "
                  "(offloaded optimizer)")
    con.print(t)
    if p.extrapolated:
        con.print(f"[yellow]note:[/] {p.extrapolated} (band widened; docs/uncertainty.md)")
    bd = Table(title="step-time breakdown (exposed seconds)", box=None)
    bd.add_column("term")
    bd.add_column("seconds", justify="right")
    bd.add_column("share", justify="right")
    for k, v in p.breakdown.items():   # prose names, as in the bar below (--json keeps the keys)
        bd.add_row(TERM_LABELS.get(k, k), f"{v:.4f}", f"{100 * v / p.step_time_s:5.1f}%")
    con.print(bd)
    con.print(breakdown_bar(dict(p.breakdown), p.step_time_s, line_width=con.width))
    if p.memory:
        mt = Table(title="memory per GPU (GiB, worst stage)", box=None)
        mt.add_column("component")
        mt.add_column("GiB", justify="right")
        for k, v in p.memory.items():
            mt.add_row(MEMORY_LABELS.get(k, k), f"{v:.1f}")
        con.print(mt)
    con.print(memory_bar(p.memory_gib_per_gpu, p.hbm_gib))
    usable = p.usable_gib if p.usable_gib is not None else p.hbm_gib
    if not p.fits:
        over = f"{p.hbm_gib:.0f} GiB" if usable >= p.hbm_gib else f"{usable:.1f} GiB usable ({p.hbm_gib:.0f} GiB less the memory headroom)"
        con.print(f"[bold red]does not fit:[/] {p.memory_gib_per_gpu:.1f} GiB > {over}; "
                  "try recompute, more PP/EP or a smaller micro-batch")
    for line in memory_warnings([("", p)], p.hbm_gib):
        con.print(line, style="bold yellow")


def validate_cmd(
    csv_path: Path = typer.Argument(..., help="CSV in the schema of calibration.csv (optional columns cuda_graphs, "
                                    "dispatcher, log), or a trainer log, or a directory of logs"),
    stack: str = typer.Option(None, "--stack", help="predict every row with this profile (default: the row's stack column)"),
    model: str = typer.Option(None, "--model", help="logs: the model when the log cannot tell (catalog name or config.json)"),
    cluster: str = typer.Option(None, "--cluster", help="logs: the GPU (a preset such as dgx-h100, or H100, GB200, ...)"),
    usable_per_rack: int = typer.Option(None, "--usable-per-rack", min=1,
                                        help="NVL72 rows: GPUs used per rack where the row's usable_per_rack column "
                                             "is empty (default: keep the inner groups whole)"),
    json_out: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Predict every row of a CSV and compare with the measured model TFLOP/s per GPU.

    Example: topoplan validate planner/data/profiles/calibration.csv
    """
    rows = read_rows(csv_path, model=model, cluster=cluster, stack=stack)
    with progress("validating rows", total=len(rows), json_output=json_out) as bar:
        res = validate_rows(rows, stack=stack, source=str(csv_path), progress=bar, usable_per_rack=usable_per_rack)
    if json_out:
        keep = ("id", "predicted_tflops_per_gpu", "predicted_tokens_per_s_per_gpu", "measured_tflops_per_gpu",
                "error_pct", "fits", "refused")
        print(json.dumps({"rows": [{k: r[k] for k in keep} for r in res["rows"]], "mape_pct": res["mape_pct"]},
                         indent=2))
        return
    con = Console()
    con.print(validate_table(res["rows"], str(csv_path), con.width))
    for line in refused_lines(res["rows"]):
        con.print(line, highlight=False, markup=False)
    if res["mape_pct"] is not None:
        con.print(mape_line(res), highlight=False)


def refused_lines(rows: list[dict]) -> list[str]:
    """One line per row whose layout its trainer refuses, naming the rule (never predicted, never fitted)."""
    return [f"refused {r['id']} ({r['config']}): rule {r['refused']}" for r in rows if r.get("refused")]


def mape_line(res: dict) -> str:
    """``MAPE 5.87% over 24 rows; worst row mb196 (gpt-oss-120b, 64 H100): +49.5%``."""
    rows = [r for r in res["rows"] if r.get("error_pct") is not None]
    line = f"MAPE {res['mape_pct']:.2f}% over {len(rows)} rows"
    if rows:
        w = max(rows, key=lambda r: abs(r["error_pct"]))
        line += f"; worst row {w['id']} ({w['model']}, {w['num_gpus']} {w['gpu']}, {w['config']}): {w['error_pct']:+.1f}%"
    return line


def validate_table(rows: list[dict], source: str, width: int | None = None):
    """Predicted against measured TFLOP/s per row. Figures and names never wrap or truncate: at
    narrow widths the stack goes to the caption (or under the model) and the layout under the model."""
    def err(r):
        return "" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"

    def figs(r):
        meas = "" if r["measured_tflops_per_gpu"] is None else f"{r['measured_tflops_per_gpu']:,.0f}"
        if r.get("refused"):   # the trainer refuses the layout: no prediction (the rule is listed below)
            return ["-", meas, "", "[red]refused[/]"]
        return [f"{r['predicted_tflops_per_gpu']:,.0f}", meas, err(r), "yes" if r["fits"] else "[red]no[/]"]

    stacks = sorted({r["stack"] for r in rows})
    caption = "pred, meas: model TFLOP/s per GPU; error: pred / meas - 1; fits: in HBM"

    def wide() -> Table:
        t = compact_table(title=f"predicted vs measured: {source}", caption=caption)
        for col in ("id", "stack", "model", "GPUs", "prec", "layout", "pred", "meas", "error", "fits"):
            t.add_column(col, justify="right" if col in ("GPUs", "pred", "meas", "error") else "left",
                         no_wrap=col != "layout", overflow="fold" if col == "layout" else "ellipsis",
                         min_width=longest_token(r["config"] for r in rows) if col == "layout" else None)
        for r in rows:
            t.add_row(r["id"], r["stack"], r["model"], f"{r['num_gpus']} {r['gpu']}", r["precision"], r["config"],
                      *figs(r))
        return t

    def narrow(id_apart: bool) -> Table:
        """Model, layout (and stack) in one folding cell; the id in a column of its own, or (narrowest)
        joined to that cell."""
        one = len(stacks) == 1
        cap = caption + (f"; stack {stacks[0]}" if one and stacks else "")
        t = compact_table(title=f"predicted vs measured: {source}", caption=cap)
        cells = [f"{r['model']}\n{r['config']}" + ("" if one else f"\n{r['stack']}") for r in rows]
        if id_apart:
            t.add_column("id", no_wrap=True)
        t.add_column(("model, layout" if id_apart else "id, model, layout") + ("" if one else ", stack"),
                     overflow="fold", min_width=max(longest_token(cells), 13))
        t.add_column("GPUs", justify="right", overflow="fold", min_width=longest_token(
            f"{r['num_gpus']} {r['gpu']}" for r in rows))
        for col in ("prec", "pred", "meas", "error", "fits"):
            t.add_column(col, justify="left" if col in ("prec", "fits") else "right", no_wrap=True)
        for r, cell in zip(rows, cells):
            lead = [r["id"], cell] if id_apart else [f"{r['id']}\n{cell}"]
            t.add_row(*lead, f"{r['num_gpus']} {r['gpu']}", r["precision"], *figs(r))
        return t

    return first_that_fits([wide(), narrow(True), narrow(False)], width)


def calibrate_cmd(
    csv_path: Path = typer.Argument(..., help="CSV of measured rows in the schema of calibration.csv (optional "
                                    "columns cuda_graphs, dispatcher, log), or a trainer log, or a directory of "
                                    "logs (a trial directory after its runs)"),
    stack: str = typer.Option(..., "--stack", help="profile name to fit (rows of this stack are used)"),
    out: Path = typer.Option(..., "-o", "--out", help="profile YAML to write"),
    model: str = typer.Option(None, "--model", help="logs: the model when the log cannot tell (catalog name or config.json)"),
    cluster: str = typer.Option(None, "--cluster", help="logs: the GPU (a preset such as dgx-h100, or H100, GB200, ...)"),
    start: str = typer.Option(None, "--from", help="start from this known profile's values (name or YAML), or 'priors' "
                              "(the published priors); default: a stack with a shipped profile of its name from the "
                              "priors, any other from the newest shipped profile of its trainer (docs/calibration.md)"),
    informed_only: bool = typer.Option(True, "--informed-only/--fit-all", help="fit only the parameters the rows "
                                       "inform, the rest keep their start (default), or all (docs/calibration.md)"),
    by_generation: bool = typer.Option(True, "--per-generation/--shared", help="fit a shared parameter the rows "
                                       "inform per GPU generation of the rows (name@arch), so other generations keep "
                                       "their predictions (default), or fit it for all (docs/calibration.md)"),
    json_out: bool = typer.Option(False, "--json", help="print the fitted values as JSON"),
) -> None:
    """Fit a stack profile to measured rows (least squares on log error, with bounds and priors).

    Example: topoplan calibrate planner/data/profiles/calibration.csv --stack megatron-26.08 -o my.yaml
    """
    check_output(out, "--out")   # before the fit runs
    rows = read_rows(csv_path, model=model, cluster=cluster, stack=stack)
    from planner.calibration.calibrate import calibrate_rows  # lazy: loads scipy.optimize (~0.3 s), for calibrate only

    with progress(f"fitting {stack}", total=None, json_output=json_out) as bar:
        prof, info = calibrate_rows(rows, stack, source=str(csv_path), progress=bar,
                                    start=start if start in (None, "priors") else load_profile(start),
                                    identify=informed_only, by_generation=by_generation)
    moved = crosscheck(info["base"], prof, set(info["arches"]))
    skipped = {x["id"] for x in info["refused"]}
    mine = [r for r in rows if (r.get("stack") or stack).strip() == stack and (r.get("id") or "?") not in skipped]
    mem = fit_memory(mine, prof, source=str(csv_path))
    if mem is not None:
        prof = prof.model_copy(update={"memory": mem})
    atomic_write_text(out, dump_profile(prof), option="--out")
    res = validate_rows(mine, stack=stack, profile=prof, source=str(csv_path))
    doc = {"profile": str(out), "rows": info["rows"], "start": info["start"], "informed": info["informed"],
           "kept": info["kept"], "refused": info["refused"], "mape_pct": res["mape_pct"],
           "max_abs_error_pct": res["max_abs_error_pct"],
           "params": {k: p.value for k, p in prof.params.items() if p.fit or k in info["fitted"]},
           "per_generation": info["per_generation"],
           "references": [m.to_dict() for m in moved], "warnings": warning_lines(moved),
           "memory": None if mem is None else mem.model_dump()}
    if json_out:
        print(json.dumps(doc, indent=2))
    else:
        print(f"wrote {out}: {info['rows']} rows fitted, starting from "
              + ("the published priors" if info["start"] == "priors" else f"{info['start']}'s values") + "; " + mape_line(res))
        print(f"  the rows inform {len(info['informed'])} of {len(info['reduction'])} free parameters: " + (", ".join(info["informed"]) or "none")
              + (f"; kept at the start: {', '.join(info['kept'])}" if info["kept"] else ""))
        for x in info["refused"]:
            print(f"  not fitted: row {x['id']} breaks rule {x['refused']}")
        for k, v in doc["params"].items():
            print(f"  {k:28s} {v:.4g}")
        if mem is not None:
            print(f"  memory: reserve {mem.reserve_gib:.2f} GiB, fragmentation {mem.fragmentation:.3f} of the "
                  f"activations ({mem.runs} measured peaks)")
        if info["per_generation"]:
            print(f"  fitted per generation ({', '.join(info['arches'])}; other generations keep the start's value): "
                  + ", ".join(info["per_generation"]))
        print("  reference predictions, model TFLOP/s per GPU (start -> fitted; * a generation of the rows):")
        for m in moved:
            print(f"    {m.what:58s} {m.before:7,.0f} -> {m.after:7,.0f} {100 * m.change:+6.1f}%"
                  + ("  *" if m.covered else ""))
    for line in doc["warnings"]:
        print(line, file=sys.stderr)


def register(app: typer.Typer) -> None:
    """Add ``predict``, ``validate`` and ``calibrate`` to the root app."""
    app.command("predict")(predict_cmd)
    app.command("validate")(validate_cmd)
    app.command("calibrate")(calibrate_cmd)
