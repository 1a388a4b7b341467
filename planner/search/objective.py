"""The objective of ``plan``'s program (``planner.search.program``): tokens/s (or TFLOP/s per GPU, or
the uncertainty band's lower edge) as a weighted minimisation of the step node."""

from __future__ import annotations

import numpy as np

from planner.config import ParallelConfig
from planner.cost.predict import _flops_per_token
from planner.cost.terms import sync as SYNC
from planner.cost.uncertainty import band_for, classify
from solver.layout import evaluate_many

# robust: maximise the lower edge of the uncertainty band, tokens/s * exp(-h); h depends on the layout
# only through CP, FSDP and whether the EP group leaves its NVLink domain (planner.cost.uncertainty),
# so it enters the program as a factor table (exp(h) scaled by BAND_SCALE and rounded): exact.
BAND_SCALE = 1000


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
    if b.objective == "robust":   # tokens/s * exp(-h): minimise step * exp(h) / gbs
        total = P.product(total, _band_factor(b))
    # the step also waits for the slowest of its W GPUs: (1 + sync_factor(W)) x the program's total
    # (terms/sync.py; predict adds it as the breakdown's "sync"): a weight over tp, cp, pp, dp, exact
    sync = {ix: 1.0 + SYNC.sync_factor(a["tp"] * a["cp"] * a["pp"] * a["dp"])
            for ix, a in b.combos("tp", "cp", "pp", "dp", "gbs")}
    if b.objective in ("throughput", "robust"):
        # tokens/s = gbs * seq / step: minimise step * (1 + sync) / gbs
        ratios = {ix: f / vals["gbs"][ix[-1]] for ix, f in sync.items()}
    else:
        # tflops per GPU = gbs * seq * fpt(tp) / (world * step): minimise step * (1 + sync) * world / (gbs * fpt(tp))
        fpt = {t: _flops_per_token(b.model, tr.seq_len, t, b.profile.flops_formula) for t in vals["tp"]}
        ratios = {}
        for ix, a in b.combos("tp", "cp", "pp", "dp", "gbs"):
            w = a["tp"] * a["cp"] * a["pp"] * a["dp"]
            ratios[ix] = sync[ix] * w / (a["gbs"] * fpt[a["tp"]])
    lo = min(ratios.values())
    K = 10 ** 6 / lo
    P.minimize(total, b.idx("tp", "cp", "pp", "dp", "gbs"),
               {k: max(1, round(r * K)) for k, r in ratios.items()})
    b.notes.append("objective weights (global batch, world size, FLOPs) rounded to 1e-6 relative")
