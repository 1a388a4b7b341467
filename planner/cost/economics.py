"""What a training run costs in days, dollars and energy (``topoplan compare``, docs/compare.md).

The formulas, each in this one place (G: GPUs paid for and powered, the candidate's GPU count)::

    days                    = tokens / goodput_tokens_per_s / 86400
    gpu_hours               = G * days * 24
    usd_per_million_tokens  = usd_per_gpu_hour * G / (goodput_tokens_per_s * 3600) * 1e6
    kwh_per_million_tokens  = kw_per_gpu * pue * G / (goodput_tokens_per_s * 3600) * 1e6
    total_usd               = usd_per_million_tokens * tokens / 1e6
    total_mwh               = kwh_per_million_tokens * tokens / 1e9

Defaults (``planner/data/power.yaml``): kw_per_gpu = a system's maximum power over its GPUs (GPU TDP
plus its share of host, NICs and switches), PUE 1.2 and the prices are placeholders flagged
"assumed": the user sets them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from planner.errors import InputError

POWER_FILE = Path(__file__).resolve().parents[1] / "data" / "power.yaml"


@lru_cache(maxsize=1)
def _power() -> dict:
    return yaml.safe_load(POWER_FILE.read_text())


@dataclass(frozen=True)
class Prices:
    """The economic inputs of one candidate and where each came from ("user" or "assumed"/"catalog")."""

    usd_per_gpu_hour: float
    usd_source: str
    kw_per_gpu: float
    kw_source: str
    pue: float
    pue_source: str
    gpu_kw: float | None = None       # the GPU's TDP (power.yaml)
    host_share: float | None = None   # kw_per_gpu / gpu_kw - 1: the system's power beyond the GPU (default kW only)


def prices_for(gpu: str, usd_per_gpu_hour: float | None = None, kw_per_gpu: float | None = None,
               pue: float | None = None) -> Prices:
    """The candidate's prices: the user's where given, else the defaults of power.yaml."""
    p = _power()
    g = p["gpus"].get(gpu.lower())
    for opt, v in (("usd_per_gpu_hour", usd_per_gpu_hour), ("kw_per_gpu", kw_per_gpu), ("--pue", pue)):
        if v is not None and v <= 0:
            raise InputError(f"{opt}={v:g}: give a positive number")
    if pue is not None and pue < 1:
        raise InputError(f"--pue {pue:g}: a PUE is at least 1 (facility power over IT power)")
    if kw_per_gpu is None and g is None:
        raise InputError(f"GPU {gpu!r} has no power default; give kw_per_gpu=Y in its --candidate")
    if usd_per_gpu_hour is None and gpu.lower() not in p["usd_per_gpu_hour"]:
        raise InputError(f"GPU {gpu!r} has no price default; give usd_per_gpu_hour=X in its --candidate")
    kw = kw_per_gpu if kw_per_gpu is not None else g["system_kw"] / g["system_gpus"]
    return Prices(
        usd_per_gpu_hour=usd_per_gpu_hour if usd_per_gpu_hour is not None else p["usd_per_gpu_hour"][gpu.lower()],
        usd_source="user" if usd_per_gpu_hour is not None else "assumed",
        kw_per_gpu=kw, kw_source="user" if kw_per_gpu is not None else f"catalog: {g['source']}",
        pue=pue if pue is not None else p["pue"], pue_source="user" if pue is not None else "assumed",
        gpu_kw=g["gpu_kw"] if g else None,
        host_share=kw / g["gpu_kw"] - 1.0 if g and kw_per_gpu is None else None)


def run_cost(tokens: float, goodput_tokens_per_s: float, gpus: int, prices: Prices) -> dict:
    """Days, GPU-hours, $ and kWh per million tokens and totals (the formulas of the module doc)."""
    if goodput_tokens_per_s <= 0:
        inf = float("inf")
        return {"days": inf, "gpu_hours": inf, "usd_per_million_tokens": inf, "kwh_per_million_tokens": inf,
                "total_usd": inf, "total_mwh": inf}
    per_million_h = 1e6 / (goodput_tokens_per_s * 3600.0)   # hours to make a million tokens
    days = tokens / goodput_tokens_per_s / 86400.0
    usd = prices.usd_per_gpu_hour * gpus * per_million_h
    kwh = prices.kw_per_gpu * prices.pue * gpus * per_million_h
    return {"days": days, "gpu_hours": gpus * days * 24.0, "usd_per_million_tokens": usd,
            "kwh_per_million_tokens": kwh, "total_usd": usd * tokens / 1e6, "total_mwh": kwh * tokens / 1e9}
