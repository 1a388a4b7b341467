"""CLI command ``topoplan compare``: hardware options priced with their own optimal plans
(``planner.search.compare``; docs/compare.md has the formulas)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import typer
from rich.console import Console

from planner.cli import goodput_options as gopt
from planner.cli.checks import check_inputs
from planner.cli.plan import HEADROOM_HELP, _training
from planner.cli.progress import progress
from planner.errors import InputError
from planner.io import check_output
from planner.model.spec import load_model
from planner.output.compare import compare_notes, compare_table
from planner.output.report import write_compare_html
from planner.search.compare import compare, parse_candidate

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_tokens(text: str) -> float:
    """``15e12``, ``15T``, ``800B``, ``2.5t`` -> tokens; InputError names the option."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"--tokens {text!r}: give a positive number of tokens, e.g. 15e12 or 15T")
    return float(m.group(1)) * _SUFFIX[m.group(2).lower()]


def _tokens_text(n: float) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= div:
            return f"{n / div:,.4g}{unit}"
    return f"{n:,.0f}"


def register(app: typer.Typer) -> None:
    """Add ``compare`` to the root app."""

    @app.command("compare")
    def compare_cmd(
        model: str = typer.Option(..., "--model", help="catalog name (topoplan models list) or config.json path"),
        tokens: str = typer.Option(..., "--tokens", help="tokens to train, e.g. 15e12 or 15T"),
        candidate: list[str] = typer.Option(..., "--candidate", help="CLUSTER:GPUS[:usd_per_gpu_hour=X]"
                                            "[:kw_per_gpu=Y][:precision=P][:usable_per_rack=K]; repeat per option"),
        gbs: int = typer.Option(None, "--gbs", min=1, help="global batch in sequences (default: 16 per GPU of the "
                                "smallest candidate)"),
        seq_len: int = typer.Option(4096, "--seq-len", min=1, help="sequence length in tokens"),
        precision: str = typer.Option("bf16", "--precision", help="bf16 | fp8 | fp8-block | mxfp8 | nvfp4 (a "
                                      "candidate's precision=P wins)"),
        stack: str = typer.Option(None, "--stack", help="software stack profile (default: the trainer's own)"),
        trainer: str = typer.Option(None, "--trainer", help="megatron | torchtitan | maxtext (default: megatron)"),
        memory_headroom: str = typer.Option(None, "--memory-headroom", help=HEADROOM_HELP),
        pue: float = typer.Option(None, "--pue", help="facility power over IT power (default 1.2, assumed)"),
        time_limit: float = typer.Option(None, "--time-limit", min=0.01, help="solver time limit per candidate"),
        failure_rates: str = gopt.failure_rates_opt(),
        storage_bw: float = gopt.storage_bw_opt(),
        restart_min: float = gopt.restart_opt(),
        repair_hours: float = gopt.repair_opt(),
        checkpoint_interval: str = gopt.interval_opt(),
        as_json: bool = typer.Option(False, "--json", help="print the comparison as JSON"),
        html: Path = typer.Option(None, "--html", help="write an HTML page with a plot to this file"),
    ):
        """Price hardware options, each with its own optimal plan: tokens/s, goodput, days, $ and kWh
        per million tokens, with the model's uncertainty band.

        Example: topoplan compare --model deepseek-v3 --tokens 15T --candidate gb300-nvl72:256:precision=mxfp8
        --candidate dgx-h100:1024:precision=fp8 --gbs 4096
        """
        n_tokens = parse_tokens(tokens)
        if pue is not None and pue < 1:
            raise InputError(f"--pue {pue:g}: a PUE is at least 1 (facility power over IT power)")
        cands = [parse_candidate(c) for c in candidate]
        if html is not None:
            check_output(html, "--html")
        g = gbs or 16 * min(c.gpus for c in cands)
        check_inputs(model, precision=precision, trainer=trainer, seq_len=seq_len, gbs=g)
        training = _training(seq_len, g, precision, stack, trainer, True, memory_headroom)
        res_opts = gopt.resilience(failure_rates, storage_bw, restart_min, repair_hours, checkpoint_interval)
        m = load_model(model)
        with progress("planning candidates", total=len(cands), json_output=as_json) as bar:
            doc = compare(m, cands, training, n_tokens, pue=pue, resilience=res_opts, time_limit=time_limit,
                          trainer=trainer, on_done=lambda c: bar.advance())
        doc["header"] = {"model": m.name, "tokens": n_tokens, "seq_len": seq_len, "global_batch": g,
                         "trainer": training.trainer, "stack": training.stack}
        if html is not None:
            write_compare_html(doc, html)
        if as_json:
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            return
        con = Console()
        con.print(f"model {m.name} | {_tokens_text(n_tokens)} tokens | seq {seq_len} | gbs {g} | trainer "
                  f"{training.trainer}", highlight=False)
        con.print(compare_table(doc["candidates"], con.width))
        for line in compare_notes(doc):
            con.print(line, highlight=False)
