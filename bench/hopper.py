"""Hopper fitted from Hopper runs (issue 21 item 3): the default stack's ``@hopper`` parameters fitted to
the published Megatron H100 rows only (bench/data/*.csv and calibration.csv), and the leave-one-table-out
error of that fit (each container's table predicted by a fit to the other tables).

    python bench/hopper.py            # in-sample and leave-one-table-out errors, the fitted values
    python bench/hopper.py --rows     # and each row's error, in sample and held out
    python bench/hopper.py --candidates   # leave-one-table-out error of each candidate parameter set

Rows are compared in tokens/s per GPU (``measured``): the tables up to the 26.04 containers count model
FLOPs with the legacy formula, the default stack with the current one.

The fit starts from the shipped profile, fits only the parameters the Hopper rows inform, each as its
``name@hopper`` variant (``calibrate_rows(identify=True, by_generation=True)``), so no Blackwell
prediction moves. Its output is what planner/data/profiles/megatron-26.08.yaml carries.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from planner.calibration.calibrate import F_SCALE, LOSS
from planner.cost.profiles import CALIBRATION_CSV, DEFAULT_STACK, load_profile
from planner.calibration.validate import predict_case, read_rows, row_case

ROOT = Path(__file__).resolve().parents[1]
# the fitted Hopper parameters: the GPU's sustained speed and the host's launch cost (chosen by leave-one-table-out
# error among the candidates main() prints with --candidates)
HOPPER_PARAMS = ("gpu.speed", "host.launch_us")
# the HBM bandwidth of the GPUs whose runs fitted the shared eager multiplier (megatron-26.08's eager rows: B300
# and GB200/GB300, all 8 TB/s, topologies/gpus.py), against which eager_hopper() scales its extra
EAGER_FITTED_ON = "B300"
CANDIDATES = (("gpu.speed",), ("host.launch_us",), ("ep.overlap", "host.launch_us"), ("gpu.speed", "gemm.grouped_m_half"),
              ("gpu.speed", "host.launch_us"), ("gpu.speed", "ep.overlap"), ("gpu.speed", "mem.elementwise"),
              ("gpu.speed", "host.launch_us", "mem.elementwise_eager"),   # the eager multiplier fitted, not derived
              ("gpu.speed", "host.launch_us", "ep.overlap"), ("gpu.speed", "host.launch_us", "attn.eff"),
              ("gpu.speed", "host.launch_us", "net.bw"))
PRIOR_WEIGHT = 0.1


def hopper_rows() -> list[dict]:
    """Every published Megatron H100 row, tagged with its table, as the default stack's rows."""
    out = []
    for path in sorted((ROOT / "bench" / "data").glob("*.csv")) + [Path(CALIBRATION_CSV)]:
        for r in read_rows(path):
            if r["gpu"].strip().upper() == "H100" and (r.get("stack") or "").startswith("megatron"):
                out.append(dict(r, table=f"{path.stem}:{r['stack']}", stack=DEFAULT_STACK))
    return out


def measured(r: dict) -> tuple[str, float]:
    """The row's measured throughput in the unit it is compared in: tokens/s per GPU where the row has it (what
    ran, independent of the FLOP convention: the tables up to the 26.04 containers count model FLOPs with the
    legacy formula, the default stack with the current one, and GPT-OSS differs by its sliding-window layers
    and activation, planner/model/flops.py), else model TFLOP/s."""
    tok = (r.get("tokens_per_s_per_gpu") or "").strip()
    return ("tokens", float(tok)) if tok else ("tflops", float(r["model_tflops_per_gpu"]))


def ratio(p, r: dict) -> float:
    """predicted / measured of a row's prediction ``p`` (``measured``'s unit)."""
    unit, meas = measured(r)
    return (p.tokens_per_s_per_gpu if unit == "tokens" else p.tflops_per_gpu) / meas


def errors(rows: list[dict], prof) -> list[tuple[str, float]]:
    """(id, predicted/measured - 1 in %) of each row under ``prof``."""
    out = []
    for r in rows:
        p = predict_case(row_case(r, DEFAULT_STACK, r["table"], profile=prof), prof)
        out.append((f"{r['table']}/{r['id']}", 100 * (ratio(p, r) - 1)))
    return out


def unfitted(prof):
    """``prof`` without its ``@hopper`` variants: every Hopper prediction from the shared values."""
    return prof.model_copy(update={"params": {k: v for k, v in prof.params.items() if not k.endswith("@hopper")}})


def eager_hopper(prof, gpu: str = "H100") -> float:
    """``mem.elementwise_eager@hopper``, derived, not fitted: the eager regime's extra over the graph-captured
    one (``mem.elementwise_eager - mem.elementwise``, fitted on 8 TB/s Blackwell runs) is time per launched kernel
    (launch gaps between small dependent kernels, no CUDA graph to replay them) that the profile expresses as HBM
    bytes; the same time is fewer bytes on a GPU whose HBM is slower, by the bandwidth ratio (H100 3.35 against
    8 TB/s: 0.42)."""
    from topologies.gpus import get_gpu

    graph, eager = prof.params["mem.elementwise"].value, prof.params["mem.elementwise_eager"].value
    return graph + (eager - graph) * get_gpu(gpu).hbm_tbps / get_gpu(EAGER_FITTED_ON).hbm_tbps


def with_derived(prof):
    """``prof`` with ``mem.elementwise_eager@hopper`` set to ``eager_hopper`` (fixed: no fit moves it)."""
    key, p = "mem.elementwise_eager@hopper", prof.params["mem.elementwise_eager"]
    v = round(eager_hopper(prof), 4)
    src = ("derived (bench/hopper.py eager_hopper): mem.elementwise + (mem.elementwise_eager - mem.elementwise) x "
           "H100/B300 HBM bandwidth (3.35/8 TB/s): the eager regime's extra is time per launched kernel, which "
           "this multiplier expresses in HBM bytes; the shared values were fitted on 8 TB/s Blackwell runs")
    return prof.model_copy(update={"params": {**prof.params, key: p.model_copy(update={
        "value": v, "prior": v, "fit": False, "source": src})}})


def fit(rows: list[dict], names=HOPPER_PARAMS, start=None):
    """The default stack's profile with the ``names@hopper`` parameters fitted to ``rows`` (least squares
    on log error with the profile's bounds and a weak pull to the prior, as calibrate does), starting
    from the profile without any ``@hopper`` variant (so the shipped fit is reproduced from itself)."""
    base = with_derived(unfitted(start or load_profile(DEFAULT_STACK)))
    keys = [f"{n}@hopper" for n in names]
    params = dict(base.params)
    for n, k in zip(names, keys):
        if k not in params:
            params[k] = base.params[n].model_copy(update={"source": f"{base.params[n].source} [Hopper only]"})
    base = base.model_copy(update={"params": params})
    cases = [row_case(r, DEFAULT_STACK, r["table"], profile=base) for r in rows]
    lo = np.array([params[k].min for k in keys])
    hi = np.array([params[k].max for k in keys])
    prior = np.array([params[k].prior if params[k].prior is not None else params[k].value for k in keys])

    w_rows = 1.0 / np.sqrt(len(rows))

    def resid(x):
        prof = base.with_values(dict(zip(keys, x)))
        rat = np.array([ratio(predict_case(c, prof), r) for c, r in zip(cases, rows)])
        return np.concatenate([w_rows * np.log(rat), PRIOR_WEIGHT * np.log(x / prior)])

    # calibrate's robust loss (soft-L1, planner/calibration/calibrate.py LOSS, F_SCALE): one row whose recipe
    # the model does not explain (25.11 Qwen3-30B-A3B, docs/steptime.md "Hopper") cannot drag the fit. The loss
    # has more than one minimum (the host's launch cost and the eager multiplier trade against each other on the
    # host-bound MoE rows): start at the prior and, one parameter at a time, halfway (geometrically) to each of
    # its bounds; keep the lowest cost.
    x_prior = np.clip(prior, lo, hi)
    starts = [x_prior]
    for i in range(len(keys)):
        for bound in (lo[i], hi[i]):
            x = x_prior.copy()
            x[i] = np.sqrt(x_prior[i] * bound)
            starts.append(x)
    sol = min((least_squares(resid, x0=x0, bounds=(lo, hi), diff_step=1e-3, loss=LOSS, f_scale=F_SCALE)
               for x0 in starts), key=lambda r: r.cost)
    return base.with_values(dict(zip(keys, sol.x))), {"fitted": keys}


def leave_one_table_out(rows: list[dict], names=HOPPER_PARAMS, start=None) -> list[tuple[str, float]]:
    out = []
    for table in sorted({r["table"] for r in rows}):
        prof, _ = fit([r for r in rows if r["table"] != table], names, start)
        out += errors([r for r in rows if r["table"] == table], prof)
    return out


def main(argv: list[str]) -> int:
    rows = hopper_rows()
    if "--candidates" in argv:
        for names in CANDIDATES:
            e = [abs(x) for _, x in leave_one_table_out(rows, names)]
            print(f"{'+'.join(names):40s} leave-one-table-out MAPE {statistics.mean(e):6.2f}%  worst {max(e):6.1f}%")
        return 0
    names = [a for a in argv if not a.startswith("--")]
    start = load_profile(names[0]) if names else None
    base = unfitted(load_profile(DEFAULT_STACK) if start is None else start)
    prof, info = fit(rows, HOPPER_PARAMS, start)
    hopper = {k: v.value for k, v in prof.params.items() if k.endswith("@hopper")}
    print(f"{len(rows)} Hopper rows from {len({r['table'] for r in rows})} tables; fitted: {info.get('fitted')}")
    print("fitted @hopper values:", {k: round(v, 4) for k, v in hopper.items()})
    table = {}
    for name, errs in (("no @hopper parameter", errors(rows, base)), ("Hopper fitted (in sample)", errors(rows, prof)),
                       ("leave one table out", leave_one_table_out(rows, HOPPER_PARAMS, start))):
        e = [abs(x) for _, x in errs]
        worst = max(errs, key=lambda x: abs(x[1]))
        print(f"{name:28s} MAPE {statistics.mean(e):6.2f}%  worst {worst[0]} {worst[1]:+.1f}%  "
              f"rows off by > 20%: {sum(x > 20 for x in e)}")
        table[name] = dict(errs)
    if "--rows" in argv:
        print(f"{'row':56s} {'shared':>8s} {'fitted':>8s} {'held out':>8s}")
        for key in table["Hopper fitted (in sample)"]:
            print(f"{key:56s} " + " ".join(f"{t[key]:+7.1f}%" for t in table.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
