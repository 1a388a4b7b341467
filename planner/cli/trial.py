"""CLI commands ``trial`` (launch files for short runs of a plan's leading layouts) and
``trial-report`` (predicted against measured per trial, and the refitted prediction)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


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
    from planner.errors import InputError
    from planner.io import check_output
    from planner.output.trial import write_trials

    if not plan_json.is_file():
        raise InputError(f"{plan_json}: no such file; write one with topoplan plan ... --save-plan plan.json")
    try:
        doc = json.loads(plan_json.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{plan_json}: not JSON ({exc.msg}, line {exc.lineno})") from None
    check_output(out, "--out")
    from planner.cli.plan import parse_layout

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
    from planner.cost.profiles import load_profile
    from planner.errors import InputError
    from planner.output.trial import MANIFEST, report

    if not (out / MANIFEST).is_file():
        raise InputError(f"{out}: no {MANIFEST}; give a directory written by topoplan trial")
    doc = report(out, load_profile(profile) if profile else None)
    if json_out:
        print(json.dumps(doc, indent=2))
        return
    for t in doc["trials"]:
        line = f"{t['id']:40s} {t['label']:28s} predicted {t['predicted_tflops_per_gpu']:7.1f}"
        if "measured_tflops_per_gpu" in t:
            line += f"  measured {t['measured_tflops_per_gpu']:7.1f} ({t['error_pct']:+.1f}%, {t['iters_used']} iters)"
        else:
            line += "  (no log yet)"
        if "refitted_tflops_per_gpu" in t:
            line += f"  refitted {t['refitted_tflops_per_gpu']:7.1f} ({t['refitted_error_pct']:+.1f}%)"
        print(line)
    if doc["mape_pct"] is not None:
        print(f"MAPE as planned {doc['mape_pct']:.2f}%" + (f", refitted {doc['refitted_mape_pct']:.2f}%"
                                                            if doc["refitted_mape_pct"] is not None else ""))


def register(app: typer.Typer) -> None:
    app.command("trial")(trial_cmd)
    app.command("trial-report")(trial_report_cmd)
