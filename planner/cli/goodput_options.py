"""The goodput options shared by ``plan``, ``scale`` and ``compare`` (docs/resilience.md): each a
function returning a fresh typer option, and ``resilience(...)`` turning their values into the
settings of ``planner.cost.goodput``."""

from __future__ import annotations

import typer

from planner.cost.goodput import INTERVALS, Resilience
from planner.errors import InputError


def failure_rates_opt():
    return typer.Option(None, "--failure-rates", help="failure-rate set (llama3 [default], kokolis-rsc1, "
                        "kokolis-rsc2) or a YAML file shaped like planner/data/failure_rates.yaml")


def storage_bw_opt():
    return typer.Option(None, "--storage-bw", help="checkpoint write bandwidth per GPU, GB/s (default 0.122: "
                        "Llama 3's 2 TB/s over 16,384 GPUs)")


def restart_opt():
    return typer.Option(None, "--restart-min", help="minutes from an interruption to training again, checkpoint "
                        "load included (default 10, assumed)")


def repair_opt():
    return typer.Option(None, "--repair-hours", help="hours until a failed tray or node is back (default 24, "
                        "assumed); without a spare the job runs without its NVLink domain meanwhile")


def interval_opt():
    return typer.Option("young", "--checkpoint-interval", help="young (default) | daly | minutes")


def resilience(failure_rates, storage_bw, restart_min, repair_hours, interval) -> Resilience:
    """The settings, checked: InputError names the option at fault."""
    text = str(interval).strip().lower()
    if text not in INTERVALS:
        try:
            if float(text) <= 0:
                raise ValueError
        except ValueError:
            raise InputError(f"--checkpoint-interval {interval!r}: use young, daly or a positive number of "
                             "minutes") from None
    for opt, v, positive in (("--storage-bw", storage_bw, True), ("--restart-min", restart_min, False),
                             ("--repair-hours", repair_hours, False)):
        if v is not None and (v < 0 or (positive and v == 0)):
            raise InputError(f"{opt} {v:g}: give a {'positive' if positive else 'non-negative'} number")
    s = Resilience(rates=failure_rates, storage_gb_s_per_gpu=storage_bw, restart_min=restart_min,
                   repair_hours=repair_hours, interval=text)
    s.resolved()   # reads the rate file now: a bad file is refused before any search runs
    return s
