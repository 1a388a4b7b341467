"""The three report pages: each builds its figures into a staging directory and returns the HTML."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from planner.cost.prediction import Prediction
from planner.output import explain
from planner.output.goodput import goodput_line, goodput_notes
from planner.output.report import data as rd
from planner.output.report import figures as fg
from planner.search.document import load_document

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:.9em}table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:.3em .6em;text-align:right}th{background:#f4f4f4}
td.l,th.l{text-align:left}figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.85em}ul.why li{font-family:monospace;font-size:.9em}
.bad{color:#b00}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _page(title: str, subtitle: str, body: Sequence[str]) -> str:
    try:
        ver = version("topoplan")
    except PackageNotFoundError:  # running from a source tree
        ver = "source"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n"
        f"<h1>{_e(title)}</h1><p class=\"meta\">{_e(subtitle)}<br>topoplan {_e(ver)}, {when}</p>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _figure(name: str, alt: str, caption: str) -> str:
    return (f"<figure><img src=\"{_e(name)}\" alt=\"{_e(alt)}\">"
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _table(headers: Sequence[str], rows: Sequence[Sequence], left: int = 1) -> str:
    head = "".join(f"<th class=\"l\">{_e(h)}</th>" if i < left else f"<th>{_e(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td class=\"l\">{_e(c)}</td>" if i < left else f"<td>{_e(c)}</td>"
                         for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def validate(kind: str, data) -> None:
    if kind == "plan":
        load_document(data, "plan document")
    elif kind == "scale":
        rd.scale_points(data)
    else:
        rd.expert_series(data)


def _model_cluster(doc: Mapping) -> tuple[str, str]:
    model = doc.get("model") or {}
    mname = model.get("name") if isinstance(model, Mapping) else str(model)
    cluster = doc.get("cluster") or {}
    cname = cluster.get("name") if isinstance(cluster, Mapping) else str(cluster)
    return str(mname or "model"), str(cname or "cluster")


def _training_line(doc: Mapping) -> str:
    t = doc.get("training") or {}
    if not isinstance(t, Mapping) or not t:
        return ""
    keys = (("seq_len", "sequence"), ("global_batch", "global batch"), ("precision", "precision"),
            ("stack", "stack"), ("trainer", "trainer"))
    return ", ".join(f"{label} {t[k]}" for k, label in keys if k in t)


def _plan_rows(plans: Sequence[Mapping], preds: Sequence[Prediction], cap: float | None) -> list[list]:
    rows = []
    for i, (pr, label) in enumerate(zip(preds, explain.plan_labels(plans))):
        mem = pr.memory_gib_per_gpu
        rows.append([
            f"#{i + 1} {label}",
            f"{pr.tflops_per_gpu:,.0f}",
            f"{pr.tokens_per_s_per_gpu:,.0f}",
            f"{pr.step_time_s:.3f}",
            f"{mem:.1f} / {cap:.0f}" if cap else f"{mem:.1f}",
            explain.band_text(pr.document()),
        ])
    return rows


def _uncertainty_section(doc: Mapping) -> str:
    """The band of each plan, its lead and the extrapolation notes, as the terminal prints them."""
    lines = explain.uncertainty_lines(doc)
    if not lines:
        return ""
    items = "".join(f"<li>{_e(line)}" + (f"<br><span class=\"bad\">note: {_e(note)}</span>" if note else "") + "</li>"
                    for line, note in lines)
    return ("<h2>Uncertainty</h2><p>The band is the model's TFLOP/s uncertainty for the plan's regime "
            "(docs/uncertainty.md); * in the table marks a regime outside the measured runs.</p>"
            f"<ul>{items}</ul>")


def plan_page(doc: Mapping, stage: Path) -> tuple[str, list[Path]]:
    plans = doc["plans"]   # validated by ``validate`` (a PlanDocument's JSON)
    top = plans[:8]
    preds = [e.prediction for e in load_document(doc, "plan document").plans[:8]]   # planner.cost.prediction
    cap = explain.hbm_of(doc)
    mname, cname = _model_cluster(doc)
    world = len((plans[0].get("placement") or {}).get("rank_to_gpu") or [])
    figs: list[Path] = []
    body = [f"<p>{_e(_training_line(doc))}</p>" if _training_line(doc) else ""]
    body.append("<h2>Top plans</h2>")
    body.append(_table(["layout", "TFLOP/s per GPU", "tokens/s per GPU", "step (s)",
                        "memory GiB / HBM", "band (TFLOP/s)"], _plan_rows(top, preds, cap)))
    body.append(_uncertainty_section(doc))
    figs.append(fg.breakdown_figure(top, stage / "breakdown.png"))
    body.append(_figure("breakdown.png", "step-time breakdown",
                        "Step time of each plan split into compute, exposed tensor-parallel, context-parallel "
                        "and expert all-to-all communication, expert imbalance, pipeline bubble and P2P, "
                        "exposed data-parallel traffic, the optimizer step and other time."))
    stages = rd.stage_memory(preds[0])
    if stages:
        figs.append(fg.memory_figure(stages, cap, stage / "memory.png",
                                     f"Memory per GPU, fullest pipeline stage: #1 {explain.config_label(plans[0]['config'])}"))
        body.append(_figure("memory.png", "memory per GPU",
                            "Memory per GPU on the fullest pipeline stage of the best plan (the peak the plan "
                            "is checked against), by component, against the HBM capacity (dashed)."))
    sizes = explain.domain_sizes_of(doc)
    if world and sizes:
        word = explain.domain_word(sizes)
        sgrid = explain.gpu_stage_grid(plans[0], sizes)
        is_moe = int(plans[0]["config"].get("ep") or 1) > 1
        egrid = explain.gpu_ep_grid(plans[0], sizes) if is_moe else None
        figs.append(fg.placement_figure(sgrid, egrid, word[:-1], stage / "placement.png",
                                        f"Placement of #1 on {len(sizes)} {word}",
                                        names=explain.domain_names_of(doc)))
        doms = (plans[0].get("placement") or {}).get("domains") or {}
        spans = ", ".join(f"{k.upper()} groups span {v} {word if int(v) != 1 else word[:-1]}"
                          for k, v in doms.items())
        body.append(_figure("placement.png", "placement map",
                            f"Each row is an NVLink domain ({word[:-1]}), each cell a GPU, coloured by the "
                            f"pipeline stage{' and the EP group' if is_moe else ''} its rank belongs to; grey "
                            f"cells are unused or failed. {spans}"))
    goodput = [goodput_line(p, i) for i, p in enumerate(top) if p.get("goodput")]
    if goodput:
        notes = goodput_notes(plans[0])
        body.append("<h2>Goodput</h2><ul class=\"why\">" + "".join(f"<li>{_e(s)}</li>" for s in goodput + notes)
                    + "</ul><p class=\"meta\">tokens/s once interruptions, checkpoint writes and restarts are "
                    "counted (docs/resilience.md)</p>")
    offload = explain.offload_line(doc.get("solver") or {})
    if offload:   # the optimizer on the host: why, as the terminal says it
        body.append(f"<h2>Optimizer CPU offload</h2><p class=\"why\">{_e(offload)}</p>")
    lines = explain.why_not_lines(doc, n=5)
    if lines:
        body.append("<h2>Why not the others</h2><ul class=\"why\">"
                    + "".join(f"<li>{_e(s)}</li>" for s in lines) + "</ul>")
    solver = doc.get("solver") or {}
    if solver:
        def g(x):
            return f"{x:,.6g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else ("-" if x is None else x)

        name = solver.get("objective_name")
        body.append("<h2>Solver</h2>" + _table(
            ["status", "wall (s)", "objective" + (f" ({name})" if name else ""), "proven bound"], [[
                solver.get("status", "?"), f"{float(solver.get('wall_s') or 0):.2f}",
                g(solver.get("objective")), g(solver.get("bound"))]]))
    subtitle = f"{mname} on {cname}" + (f", {world} GPUs" if world else "")
    return _page(f"topoplan plan: {mname}", subtitle, body), figs


def scale_page(doc, stage: Path) -> tuple[str, list[Path]]:
    points = rd.scale_points(doc)
    mname, cname = str(doc["model"]), str(doc["cluster"])
    figs = [fg.scaling_figure(points, stage / "scaling.png", f"{mname} on {cname}")]
    line = _training_line({"training": doc.get("header") or {}})   # the header names the training setup
    body = [f"<p>{_e(line)}</p>" if line else "", "<h2>Scaling</h2>"]
    body.append(_table(["GPUs", "layout", "tokens/s", "tokens/s per GPU", "TFLOP/s per GPU", "retention"], [
        [p["gpus"], p["label"], f"{p['tokens_per_s']:,.0f}", f"{p['tokens_per_s_per_gpu']:,.0f}",
         f"{p['tflops_per_gpu']:,.0f}", "-" if p["retention"] is None else f"{p['retention']:.1%}"]
        for p in points], left=2))
    body.append(_figure("scaling.png", "scaling curve",
                        "Left: predicted cluster tokens/s against GPUs, with the linear extrapolation from "
                        "the smallest size. Right: model TFLOP/s per GPU; labels give the per-GPU throughput "
                        "retained against the smallest size."))
    # stacked breakdown of each size's best plan
    entries = [{"config": {}, "label": p["label"],
                "prediction": {"breakdown": p["breakdown"], "step_time_s": p["step_time_s"],
                               "tflops_per_gpu": p["tflops_per_gpu"]}} for p in points]
    figs.append(fg.breakdown_figure(entries, stage / "breakdown.png",
                                    [f"{p['gpus']} GPUs: {p['label']}" for p in points],
                                    "Step-time breakdown at each size"))
    body.append(_figure("breakdown.png", "step-time breakdown per size",
                        "Step-time breakdown of the best plan at each size (bars in the order of the table)."))
    return _page(f"topoplan scale: {mname}", f"{mname} on {cname}, {points[0]['gpus']} to "
                 f"{points[-1]['gpus']} GPUs", body), figs


def experts_page(doc: Mapping, stage: Path) -> tuple[str, list[Path]]:
    series = rd.expert_series(doc)
    mname, cname = _model_cluster(doc)
    figs = [fg.experts_figure(series, stage / "experts.png")]

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    rows = [["topoplan", f"{mean(series['balance']):.3f}", f"{max(series['balance']):.3f}",
             "-" if series["remote"] is None else f"{mean(series['remote']):.2f}"]]
    for name, b in series["baselines"].items():
        rows.append([name, f"{mean(b['balance']):.3f}", f"{max(b['balance']):.3f}",
                     "-" if b["remote"] is None else f"{mean(b['remote']):.2f}"])
    body = ["<h2>Summary over MoE layers</h2>",
            _table(["placement", "balance (mean)", "balance (worst layer)", "remote domains per token"], rows)]
    scalars = []
    for key in ("summary", "metrics"):
        src = doc.get(key) if isinstance(doc.get(key), Mapping) else {}
        for k, v in src.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                scalars.append([k, f"{v:,.4g}"])
            elif isinstance(v, str):
                scalars.append([k, v])
    for key in ("routing", "dispatch"):
        if isinstance(doc.get(key), str):
            scalars.append([key, doc[key]])
    if scalars:
        body.append(_table(["metric", "value"], scalars))
    body.append(_figure("experts.png", "expert-load balance per layer",
                        "Busiest GPU's load over the mean per MoE layer (1.0 is perfect) for topoplan's "
                        "placement and, where given, DeepSeek's EPLB; below, the expected number of remote "
                        "NVLink domains a token's experts touch."))
    if series["slots"]:
        k = doc.get("slots_per_gpu")
        if not k and series["ep_rank_domain"]:
            k = len(series["slots"][0]) // max(1, len(series["ep_rank_domain"]))
        if k:
            figs.append(fg.expert_slots_figure(series["slots"], int(k), series["ep_rank_domain"],
                                               stage / "expert_slots.png"))
            body.append(_figure("expert_slots.png", "replica slots per GPU",
                                "For each layer and EP rank, the slots that hold a replicated (hot) expert; red "
                                "lines mark NVLink domain borders."))
    if not series["baselines"]:
        body.append("<p class=\"meta\">The document carries no EPLB baseline ('eplb' key); "
                    "only topoplan's placement is shown.</p>")
    return _page(f"topoplan place-experts: {mname}", f"{mname} on {cname}", body), figs


