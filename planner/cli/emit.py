"""CLI command: ``topoplan emit PLAN.json --trainer NAME[,NAME] --out DIR [--index I]``."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from planner.errors import InputError, not_utf8
from planner.io import check_output
from planner.output.emit import emit_plan, parse_trainers


def register(app: typer.Typer) -> None:
    """Add ``emit`` to the root app."""

    @app.command("emit")
    def emit(
        plan_file: Path = typer.Argument(..., help="plan document written by 'topoplan plan --save-plan'"),
        trainer: str = typer.Option(..., "--trainer", "-t",
                                    help="megatron, bridge, torchtitan, maxtext, slurm, k8s, k8s-cluster (comma-separated) "
                                         "or all (the trainers and slurm)"),
        out: Path = typer.Option(..., "--out", "-o", help="output directory (written atomically)"),
        index: int = typer.Option(0, "--index", "-i", help="which plan of the document (0 = best)"),
        force: bool = typer.Option(False, "--force", help="replace --out whole when it holds another plan's files"),
        as_json: bool = typer.Option(False, "--json", help="print the written files as JSON"),
    ):
        """Write launch configs for one plan: Megatron-LM args, Megatron-Bridge overrides, TorchTitan
        command, MaxText mesh overrides, and the Slurm hostfile that puts every group on its NVLink domain.

        Example: topoplan emit plan.json --trainer megatron,slurm --out launch/
        """
        names = parse_trainers(trainer)
        check_output(out, "--out", directory=True)
        try:
            text = plan_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise not_utf8(plan_file, exc, "plan document") from None
        except OSError as exc:
            raise InputError(f"{plan_file}: cannot read the plan ({exc.strerror}); write one with "
                             "'topoplan plan ... --save-plan plan.json'") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{plan_file}: not JSON (line {exc.lineno}: {exc.msg}); write it with "
                             "'topoplan plan ... --save-plan'") from None
        paths = emit_plan(doc, names, out, index=index, force=force)
        if as_json:
            print(json.dumps({"out": str(out), "index": index, "trainers": names,
                              "files": [str(p) for p in paths]}))
        else:
            print(f"wrote {len(paths)} files for plan {index} ({', '.join(names)}) to {out}/")
            for p in paths:
                print(f"  {p}")
