"""The objective of ``plan``'s program (``planner.search.program``): tokens/s (or TFLOP/s per GPU, or
the uncertainty band's lower edge) as a weighted minimisation of the step node."""

from __future__ import annotations

import math
from functools import reduce

import numpy as np

from planner.config import ParallelConfig
from planner.cost.predict import _flops_per_token
from planner.cost.uncertainty import band_for, classify
from solver.layout import evaluate_many

# robust: maximise the lower edge of the uncertainty band, tokens/s * exp(-h); h depends on the layout
# only through CP, FSDP and whether the EP group leaves its NVLink domain (planner.cost.uncertainty),
# so it enters the program as a factor table (exp(h) scaled by BAND_SCALE and rounded): exact.
BAND_SCALE = 1000


def _lcm(values) -> int:
    return reduce(lambda a, b: a * b // math.gcd(a, b), values, 1)


def _band_factor(b):
    """robust: a table node of BAND_SCALE * exp(h) over (cp, fsdp) and the EP shape (MoE), h the
    band of the layout's regime (``planner.cost.uncertainty.band_for``, the one predict reports);
    sets ``band_min`` (its least value over FSDP, a free variable of the block search) as a bound
    factor and ``lb_scale`` (its least value) for the exhaustive search's lower bound."""
    P, model, tr = b.prog, b.model, b.training

    def scaled(cp, fsdp, ep_domains):   # the regime predict classifies for such a layout
        reg = classify(model, b.cluster, ParallelConfig(cp=cp, fsdp=fsdp), tr, ep_domains=ep_domains)
        return int(round(BAND_SCALE * band_for(reg, b.profile.name, tr.trainer).factor()))

    table, least = {}, {}
    sids = b._shape_values(b.sh["ep"]) if model.is_moe else [None]
    for (ci, fi), a in b.combos("cp", "fsdp"):
        for sid in sids:
            v = scaled(a["cp"], a["fsdp"], 1 if sid is None else b.shape(sid).domains)
            key = (ci, fi) if sid is None else (ci, fi, sid)
            table[key] = v
            lk = (ci,) if sid is None else (ci, sid)
            least[lk] = min(v, least.get(lk, v))
    nodes = [] if sids == [None] else [b.sh["ep"]]
    b.band_node = P.table_t(b.idx("cp", "fsdp"), table, nodes=nodes)
    b.band_min = (tuple(b.idx("cp")), tuple(nodes), {k: float(v) for k, v in least.items()})
    b.lb_scale = min(table.values())
    b.notes.append(f"robust objective: band factors exp(h) rounded to 1/{BAND_SCALE}")
    return b.band_node


def band_scale_of(b, choice) -> int:
    """The band factor (BAND_SCALE * exp(h)) the objective node carries for a solution; 1 when not robust."""
    if getattr(b, "band_node", None) is None:
        return 1
    _, _, vals_ = evaluate_many(b.prog, np.asarray([choice], dtype=np.int64), upto=b.band_node)
    return int(vals_[b.band_node][0])


def add_objective(b, total) -> None:
    P, vals, tr = b.prog, b.vals, b.training
    gbs_vals = vals["gbs"]
    if b.objective == "robust":   # tokens/s * exp(-h): minimise step * exp(h) / gbs
        total = P.product(total, _band_factor(b))
    if b.objective in ("throughput", "robust"):
        # tokens/s = gbs * seq / step: minimise step / gbs, i.e. step * (L / gbs)
        if len(gbs_vals) == 1:
            P.minimize(total)
            return
        lcm = _lcm(gbs_vals)
        if lcm <= 10 ** 6:
            w = {(i,): lcm // g for i, g in enumerate(gbs_vals)}
        else:
            K = 10 ** 6 * max(gbs_vals)
            w = {(i,): max(1, round(K / g)) for i, g in enumerate(gbs_vals)}
            b.notes.append("global-batch weights rounded to 1e-6 relative")
        P.minimize(total, b.idx("gbs"), w)
        return
    # tflops per GPU = gbs * seq * fpt(tp) / (world * step): minimise step * world / (gbs * fpt(tp))
    fpt = {t: _flops_per_token(b.model, tr.seq_len, t, b.profile.flops_formula) for t in vals["tp"]}
    ratios = {}
    for ix, a in b.combos("tp", "cp", "pp", "dp", "gbs"):
        w = a["tp"] * a["cp"] * a["pp"] * a["dp"]
        ratios[ix] = w / (a["gbs"] * fpt[a["tp"]])
    lo = min(ratios.values())
    K = 10 ** 6 / lo
    P.minimize(total, b.idx("tp", "cp", "pp", "dp", "gbs"),
               {k: max(1, round(r * K)) for k, r in ratios.items()})
    b.notes.append("per-GPU objective weights rounded to 1e-6 relative")
