"""Goodput in words: the lines ``plan`` prints under its plans and the explanation of the
``--objective goodput`` choice (docs/resilience.md has the formulas)."""

from __future__ import annotations

from collections.abc import Mapping


def _dur(seconds: float) -> str:
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def goodput_line(entry: Mapping, index: int) -> str:
    """One plan's goodput and what makes it: interruptions, checkpoint, interval, loss per failure."""
    g = entry.get("goodput")
    if not g:
        return ""
    spares = g["spare_hosts_per_domain"]
    line = (f"#{index + 1} goodput {g['goodput_tokens_per_s']:,.0f} tokens/s = {g['tokens_per_s']:,.0f} x "
            f"{g['effective_fraction']:.1%} effective: {g['interruptions_per_day']:.2f} interruptions/day "
            f"(MTBF {g['mtbf_h']:.1f} h), checkpoint {g['checkpoint_gb']:,.0f} GB in {_dur(g['checkpoint_write_s'])} "
            f"every {_dur(g['interval_s'])} ({g['interval_rule']}), {_dur(g['lost_per_failure_s'])} lost per "
            f"interruption; {spares} spare host{'s' if spares != 1 else ''} per domain")
    if g["no_spare_share"] > 0.005:
        line += f", {g['no_spare_share']:.0%} of hardware failures find no spare (repair {g['repair_h']:g} h)"
    return line


def goodput_notes(entry: Mapping) -> list[str]:
    """Where the goodput's inputs come from: carried-over rates and assumed figures."""
    g = entry.get("goodput")
    if not g:
        return []
    out = []
    if g.get("carried_over"):
        out.append(f"failure rates '{g['rates']}' were observed on another GPU generation and are carried over")
    if g.get("assumed"):
        out.append("assumed, not published: " + ", ".join(g["assumed"])
                   + " (set --restart-min, --repair-hours, --failure-rates)")
    return out


def options_lines(solver: Mapping) -> list[str]:
    """``--objective goodput``: each GPUs-per-domain option's best plan, throughput against goodput."""
    out = []
    for o in solver.get("goodput_options") or []:
        gpd = "all" if o["gpus_per_domain"] is None else o["gpus_per_domain"]
        out.append(f"GPUs per domain {gpd}: {o['label']} on {o['world']:,} GPUs, {o['tokens_per_s']:,.0f} tokens/s, "
                   f"goodput {o['goodput_tokens_per_s']:,.0f} ({o['effective_fraction']:.1%}, "
                   f"{o['spare_hosts_per_domain']} spare hosts per domain)")
    return out
