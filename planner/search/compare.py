"""``compare``: each hardware option priced with its own optimal plan (``topoplan compare``,
docs/compare.md). A candidate is ``CLUSTER:GPUS[:key=value...]``; each is planned with
``planner.search.plan.plan`` on its own cluster, its goodput priced (``planner.cost.goodput``) and its
run costed (``planner.cost.economics``). Every figure of a candidate follows from the others by the
formulas of ``economics`` and ``goodput``; the uncertainty band scales tokens/s by the plan's
TFLOP/s band (``tflops_per_gpu_low / tflops_per_gpu`` and ``high / tflops_per_gpu``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.config import Training
from planner.cost.economics import prices_for, run_cost
from planner.cost.goodput import Resilience
from planner.errors import InfeasibleError, InputError
from planner.search.plan import plan
from topologies.loader import load_job

KEYS = ("usd_per_gpu_hour", "kw_per_gpu", "precision", "usable_per_rack")
PRECISIONS = ("bf16", "fp8", "fp8-block", "mxfp8", "nvfp4")


@dataclass(frozen=True)
class Candidate:
    cluster: str
    gpus: int
    usd_per_gpu_hour: float | None = None
    kw_per_gpu: float | None = None
    precision: str | None = None
    usable_per_rack: int | None = None

    @property
    def label(self) -> str:
        return f"{self.cluster}:{self.gpus}"


def parse_candidate(text: str) -> Candidate:
    """``CLUSTER:GPUS[:usd_per_gpu_hour=X][:kw_per_gpu=Y][:precision=P][:usable_per_rack=K]``;
    InputError names the part at fault."""
    parts = [p.strip() for p in str(text).split(":")]
    fix = "use CLUSTER:GPUS[:usd_per_gpu_hour=X][:kw_per_gpu=Y], e.g. gb300-nvl72:256:usd_per_gpu_hour=6"
    if len(parts) < 2 or not parts[0]:
        raise InputError(f"--candidate {text!r}: {fix}")
    try:
        gpus = int(parts[1])
    except ValueError:
        raise InputError(f"--candidate {text!r}: GPUS {parts[1]!r} is not an integer; {fix}") from None
    if gpus < 1:
        raise InputError(f"--candidate {text!r}: GPUS must be at least 1")
    fields: dict = {}
    for kv in parts[2:]:
        key, sep, val = kv.partition("=")
        if not sep or key not in KEYS:
            raise InputError(f"--candidate {text!r}: {kv!r} is not key=value with a key of {', '.join(KEYS)}")
        if key == "precision":
            if val not in PRECISIONS:
                raise InputError(f"--candidate {text!r}: precision={val!r}; use one of {', '.join(PRECISIONS)}")
            fields[key] = val
            continue
        try:
            fields[key] = int(val) if key == "usable_per_rack" else float(val)
        except ValueError:
            raise InputError(f"--candidate {text!r}: {key}={val!r} is not a number") from None
        if fields[key] <= 0:
            raise InputError(f"--candidate {text!r}: {key} must be positive")
    return Candidate(parts[0], gpus, **fields)


def _band(pred) -> tuple[float, float]:
    """(low, high) factors of tokens/s from the plan's TFLOP/s band."""
    t = pred.tflops_per_gpu
    if not t:
        return 1.0, 1.0
    return (pred.tflops_per_gpu_low or t) / t, (pred.tflops_per_gpu_high or t) / t


def price_candidate(model, cand: Candidate, training: Training, tokens: float, *, pue=None,
                    resilience: Resilience | None = None, time_limit=None, trainer=None) -> dict:
    """One candidate: its best plan (for throughput), goodput, days, $ and kWh per million tokens,
    each with the band of the plan's prediction."""
    tr = training if cand.precision is None else training.model_copy(update={"precision": cand.precision})
    job = load_job(cand.cluster, gpus=cand.gpus, usable_per_domain=cand.usable_per_rack)
    try:
        res = plan(model, job, tr, top=1, time_limit=time_limit, trainer=trainer, resilience=resilience)
    except InfeasibleError as exc:
        raise InfeasibleError(f"--candidate {cand.label}: {exc}") from None
    e = res.plans[0]
    p, g = e.prediction, e.goodput
    gpu = job.cluster.gpu_spec
    prices = prices_for(gpu.name, cand.usd_per_gpu_hour, cand.kw_per_gpu, pue)
    lo, hi = _band(p)
    central = run_cost(tokens, g.goodput_tokens_per_s, cand.gpus, prices)
    fast = run_cost(tokens, g.goodput_tokens_per_s * hi, cand.gpus, prices)
    slow = run_cost(tokens, g.goodput_tokens_per_s * lo, cand.gpus, prices)
    out = {"candidate": cand.label, "cluster": job.cluster.name, "gpu": gpu.name, "gpus": cand.gpus,
           "world": e.world, "layout": e.label, "gbs": e.gbs, "precision": res.training.precision,
           "tokens_per_s": p.tokens_per_s, "tokens_per_s_low": p.tokens_per_s * lo,
           "tokens_per_s_high": p.tokens_per_s * hi, "tflops_per_gpu": p.tflops_per_gpu,
           "goodput_tokens_per_s": g.goodput_tokens_per_s, "effective_fraction": g.effective_fraction,
           "goodput_tokens_per_s_low": g.goodput_tokens_per_s * lo, "goodput_tokens_per_s_high": g.goodput_tokens_per_s * hi,
           "band_half_width": p.band_half_width, "regime": p.regime, "extrapolated": p.extrapolated,
           "usd_per_gpu_hour": prices.usd_per_gpu_hour, "usd_per_gpu_hour_source": prices.usd_source,
           "kw_per_gpu": prices.kw_per_gpu, "kw_per_gpu_source": prices.kw_source, "gpu_kw": prices.gpu_kw,
           "host_share": prices.host_share,
           "pue": prices.pue, "pue_source": prices.pue_source,
           "solver_status": res.solver["status"], "goodput": g.to_dict()}
    out.update(central)
    for key in ("days", "usd_per_million_tokens", "kwh_per_million_tokens"):
        out[key + "_low"], out[key + "_high"] = fast[key], slow[key]   # more tokens/s: fewer days, less $
    return out


def compare(model, candidates, training: Training, tokens: float, *, pue=None, resilience=None,
            time_limit=None, trainer=None, on_done=None) -> dict:
    """Every candidate priced with its own optimal plan; the document ``topoplan compare --json``
    prints (``candidates``: one dict per candidate with the keys of ``price_candidate``)."""
    if not (tokens > 0 and math.isfinite(tokens)):
        raise InputError(f"--tokens {tokens}: give a positive number of tokens, e.g. 15e12")
    cands = [c if isinstance(c, Candidate) else parse_candidate(c) for c in candidates]
    if not cands:
        raise InputError("--candidate: give at least one, e.g. --candidate gb300-nvl72:256 --candidate dgx-h100:1024")
    rows = []
    for c in cands:
        rows.append(price_candidate(model, c, training, tokens, pue=pue, resilience=resilience,
                                    time_limit=time_limit, trainer=trainer))
        if on_done:
            on_done(c)
    return {"model": model.name, "tokens": tokens, "candidates": rows,
            "formulas": {"days": "tokens / goodput_tokens_per_s / 86400",
                         "goodput_tokens_per_s": "tokens_per_s * effective_fraction",
                         "usd_per_million_tokens": "usd_per_gpu_hour * gpus / (goodput_tokens_per_s * 3600) * 1e6",
                         "kwh_per_million_tokens": "kw_per_gpu * pue * gpus / (goodput_tokens_per_s * 3600) * 1e6",
                         "band": "each figure at goodput * tflops_per_gpu_low / tflops_per_gpu (slow end, *_high) "
                                 "and * tflops_per_gpu_high / tflops_per_gpu (fast end, *_low)"}}
