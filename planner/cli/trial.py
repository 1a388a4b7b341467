"""CLI commands ``trial`` (launch files for short runs of a plan's leading layouts) and
``trial-report`` (predicted against measured per trial, and the refitted prediction)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from planner.cli.plan import parse_layout
from planner.cost.profiles import load_profile
from planner.errors import InputError, not_utf8
from planner.io import check_output
from planner.output.explain import figure_table, first_that_fits
from planner.output.trial import MANIFEST, report, write_trials


def trial_cmd(
    plan_json: Path = typer.Argument(..., help="plan.json written by topoplan plan --save-plan"),
    top: int = typer.Option(3, "--top", min=1, max=20, help="how many of the plan's layouts to try"),
    iters: int = typer.Option(20, "--iters", min=1, help="iterations per trial (the first max(2, N/5) are warm-up)"),
    out: Path = typer.Option(..., "--out", help="directory for the trial files"),
    compare: str = typer.Option(None, "--compare", help="also try this layout, e.g. TP1,PP2,VPP8,EP32 (default: the "
                                "plan's --compare layout, if any)"),
    trainer: str = typer.Option(None, "--trainer", help="megatron | bridge | torchtitan | maxtext (default: the plan's)"),
) -> None:
    """Write launch files that run each of the plan's top layouts for a few iterations, with the
    logging topoplan reads back, and one script that submits them all.

    Example: topoplan trial plan.json --top 3 --iters 20 --out trials
    """
    if not plan_json.is_file():
        raise InputError(f"{plan_json}: no such file; write one with topoplan plan ... --save-plan plan.json")
    try:
        doc = json.loads(plan_json.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise not_utf8(plan_json, exc, "plan document") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{plan_json}: not JSON ({exc.msg}, line {exc.lineno})") from None
    check_output(out, "--out")
    text = compare or (doc.get("compare") or {}).get("label")
    trials = write_trials(doc, out, top=top, iters=iters, compare=parse_layout(text) if text else None,
                          trainer=trainer)
    for t in trials:
        p = t["predicted"]
        print(f"{out}/{t['id']}: {t['label']}{' (compare)' if t['compare'] else ''}, predicted "
              f"{p['tflops_per_gpu']:,.0f} TFLOP/s per GPU, step {p['step_time_s']:.2f} s")
    print(f"submit: bash {out}/submit_all.sh   then: topoplan trial-report {out}")


def trial_report_cmd(
    out: Path = typer.Argument(..., help="directory written by topoplan trial, after its runs"),
    profile: str = typer.Option(None, "--profile", help="a fitted profile (topoplan calibrate ... -o FILE): adds "
                                "the refitted prediction"),
    json_out: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Predicted against measured throughput per trial (and the refitted prediction with --profile).

    Example: topoplan trial-report trials --profile fitted.yaml
    """
    if not (out / MANIFEST).is_file():
        raise InputError(f"{out}: no {MANIFEST}; give a directory written by topoplan trial")
    doc = report(out, load_profile(profile) if profile else None)
    if json_out:
        print(json.dumps(doc, indent=2))
        return
    con = Console()
    con.print(trial_table(doc, con.width))
    if doc["mape_pct"] is not None:
        done = [t for t in doc["trials"] if t.get("error_pct") is not None]
        line = f"MAPE as planned {doc['mape_pct']:.2f}%" + (f", refitted {doc['refitted_mape_pct']:.2f}%"
                                                           if doc["refitted_mape_pct"] is not None else "")
        if done:
            w = max(done, key=lambda t: abs(t["error_pct"]))
            line += f"; worst trial {w['id']} ({w['label']}): {w['error_pct']:+.1f}%"
        con.print(line, highlight=False)


def trial_table(doc: dict, width: int | None = None):
    """One row per trial: predicted, measured and refitted model TFLOP/s per GPU; figures never wrap.
    At narrow widths the trial's directory is shown by its number (``trial-NN``, the rest of its
    name is the layout beside it) and then the iterations column is dropped."""
    refit = any("refitted_tflops_per_gpu" in t for t in doc["trials"])

    def build(full_id: bool, iters: bool):
        cols = (["trial", "layout", "predicted", "measured", "error"] + (["iters"] if iters else [])
                + (["refitted", "error "] if refit else []))
        rows = []
        for t in doc["trials"]:
            meas = "measured_tflops_per_gpu" in t
            r = [t["id"] if full_id else "-".join(t["id"].split("-")[:2]),
                 t["label"] + (" (compare)" if t.get("compare") else ""), f"{t['predicted_tflops_per_gpu']:,.1f}",
                 f"{t['measured_tflops_per_gpu']:,.1f}" if meas else "no log",
                 f"{t['error_pct']:+.1f}%" if meas else ""] + ([str(t.get("iters_used", "")) if meas else ""]
                                                              if iters else [])
            if refit:
                r += ([f"{t['refitted_tflops_per_gpu']:,.1f}", f"{t['refitted_error_pct']:+.1f}%"]
                      if "refitted_tflops_per_gpu" in t else ["", ""])
            rows.append(r)
        cap = ("model TFLOP/s per GPU; error: predicted / measured - 1" + ("; iters: steps averaged" if iters else "")
               + ("" if full_id else "; trial-NN: the directory trial-NN-<layout>"))
        return figure_table("trials: predicted against measured", cols, rows, wrap=("trial", "layout"),
                            right=[c for c in cols if c not in ("trial", "layout")], caption=cap)

    return first_that_fits([build(True, True), build(False, True), build(False, False)], width)


def register(app: typer.Typer) -> None:
    app.command("trial")(trial_cmd)
    app.command("trial-report")(trial_report_cmd)
