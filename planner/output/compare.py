"""``topoplan compare`` in the terminal: one row per candidate, the figures never wrapped (the
candidate and layout cells wrap between words), and the notes saying which inputs were assumed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.output.explain import figure_table, first_that_fits

CAPTION = ("tokens/s and goodput of the cluster; eff.: goodput / tokens/s (failures, checkpoints, restarts); "
           "days = tokens / goodput / 86400; $/Mtok = $/GPU-h x GPUs / (goodput x 3600) x 1e6; "
           "kWh/Mtok = kW/GPU x PUE x GPUs / (goodput x 3600) x 1e6; * assumed input; bands below "
           "(docs/compare.md)")


def _money(x: float) -> str:
    return f"{x:,.3f}" if x < 10 else f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def _cells(c: Mapping) -> dict:
    star_usd = "*" if c["usd_per_gpu_hour_source"] == "assumed" else ""
    star_kw = "*" if c["pue_source"] == "assumed" or c["kw_per_gpu_source"] != "user" else ""
    return {
        "candidate": c["candidate"],
        "layout": c["layout"],
        "used": f"{c['world']:,}",
        "tokens/s": f"{c['tokens_per_s']:,.0f}",
        "goodput": f"{c['goodput_tokens_per_s']:,.0f}",
        "eff.": f"{c['effective_fraction']:.1%}",
        "days": f"{c['days']:,.1f}",
        "$/Mtok": f"{_money(c['usd_per_million_tokens'])}{star_usd}",
        "kWh/Mtok": f"{c['kwh_per_million_tokens']:,.3f}{star_kw}",
    }


def compare_table(candidates: Sequence[Mapping], width: int | None = None):
    """The comparison table, widest form that fits ``width`` first (figures never wrap)."""
    rows = [_cells(c) for c in candidates]
    narrow = ("candidate", "used", "tokens/s", "goodput", "eff.", "days", "$/Mtok", "kWh/Mtok")
    wide = narrow[:1] + ("layout",) + narrow[1:]
    tables = [figure_table("compare", cols, [[r[k] for k in cols] for r in rows], wrap=("layout",),
                           right=[c for c in cols if c not in ("candidate", "layout")], caption=CAPTION)
              for cols in (wide, narrow)]
    return first_that_fits(tables, width)


def band_line(c: Mapping) -> str:
    """A candidate's uncertainty band, from the model's TFLOP/s band (docs/uncertainty.md)."""
    return (f"   band: tokens/s {c['tokens_per_s_low']:,.0f}-{c['tokens_per_s_high']:,.0f}, days "
            f"{c['days_low']:,.1f}-{c['days_high']:,.1f}, $/Mtok {_money(c['usd_per_million_tokens_low'])}-"
            f"{_money(c['usd_per_million_tokens_high'])}, kWh/Mtok {c['kwh_per_million_tokens_low']:,.3f}-"
            f"{c['kwh_per_million_tokens_high']:,.3f}")


def compare_notes(doc: Mapping) -> list[str]:
    """The layouts (when the table left them out), bands, and where each assumed input came from."""
    out = []
    for c in doc["candidates"]:
        out.append(f"{c['candidate']}: {c['layout']} on {c['world']:,} of {c['gpus']:,} GPUs ({c['precision']}), "
                   f"{c['goodput']['interruptions_per_day']:.2f} interruptions/day, "
                   f"{c['goodput']['spare_hosts_per_domain']} spare hosts per domain; "
                   f"${c['usd_per_gpu_hour']:g}/GPU-h ({c['usd_per_gpu_hour_source']}), "
                   f"{c['kw_per_gpu']:.3g} kW/GPU, PUE {c['pue']:g} ({c['pue_source']})")
        out.append(band_line(c))
        if c.get("extrapolated"):
            out.append(f"   note: {c['extrapolated']}")
    if any(c["usd_per_gpu_hour_source"] == "assumed" for c in doc["candidates"]):
        out.append("* prices are placeholders (planner/data/power.yaml): set usd_per_gpu_hour=X per --candidate")
    if any(c["pue_source"] == "assumed" for c in doc["candidates"]):
        out.append("* PUE 1.2 is assumed (--pue); kW per GPU is the system's maximum power over its GPUs "
                   "(power.yaml cites each) unless kw_per_gpu=Y")
    return out
