"""What the planner claims against NVIDIA's published layouts.

Run: ``python bench/claims.py [CSV] [--time-limit S] [--procs N] [--explain]`` (default: calibration.csv, 120 s
per plan, 2 processes; several minutes).

For every row of the CSV (a published run), the planner plans the same request: the same model,
GPU type and count (all of them used: ``min_world`` = the run's GPUs; on NVL72 racks the planner
chooses how many GPUs of each rack to use), global batch, sequence length, precision, stack and
execution regime (bench/accuracy.py EAGER_RECIPES), with the planner's default memory headroom
(5% of HBM, ``planner.config.DEFAULT_HEADROOM``: a plan that fills the whole HBM is not one the
planner would offer); NVIDIA's layout, which ran, is judged against the whole HBM. Printed per row: NVIDIA's layout with its
prediction (and band) and its measurement, the planner's best layout with its prediction (and
band), the claimed gain (planner / NVIDIA's layout, both predicted), and whether that gain lies
inside the planner's band (``planner.cost.uncertainty.lead``: then the claim is within the model's
uncertainty). Each plan has a time limit (``plan(time_limit=...)``: the best found so far, status
FEASIBLE, when it runs out).

``--explain`` adds, for every claim above ``EXPLAIN_ABOVE`` (10%), the three step-time breakdown
terms (``planner.cost.steptime``: compute, tp_comm, pp_bubble, pp_p2p, cp_comm, imbalance, ...) whose
seconds per step differ most between NVIDIA's layout and the planner's, each as seconds and as a
share of NVIDIA's step. Both layouts run the same global batch on the same GPUs, so the step-time
difference is the whole claim: the shares of all terms add up to ``1 - T_planner / T_nvidia`` =
``gain / (1 + gain)``. docs/uncertainty.md ("Claims above 10%") judges each one.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))   # after the packages: bench/solver.py must not shadow solver/
DEFAULT_CSV = ROOT / "planner" / "data" / "profiles" / "calibration.csv"
EXPLAIN_ABOVE = 0.10    # --explain: claims above this gain are broken down term by term


def _job(preset: str, n: int):
    try:
        from topologies.loader import load_job
    except ImportError:       # older trees: a plain preset cluster of n GPUs
        from topologies.loader import load_cluster

        return load_cluster(preset, gpus=n)
    return load_job(preset, gpus=n)


def claim(args) -> dict:
    """Plan one published run's request and price NVIDIA's layout (runs in a worker process)."""
    row, source, time_limit = args
    from accuracy import EAGER_RECIPES
    from planner.cost.profiles import load_profile, resolve_name
    from planner.cost.uncertainty import lead
    from planner.config import DEFAULT_HEADROOM, Training
    from planner.calibration.validate import GPU_PRESETS, predict_case, row_case
    from planner.errors import InfeasibleError, InputError
    from planner.search.plan import plan

    row = dict(row, cuda_graphs="false") if row["id"] in EAGER_RECIPES else row
    prof = load_profile(resolve_name((row.get("stack") or "megatron-26.08").strip()))
    case = row_case(row, row.get("stack"), source, profile=prof)
    nv = predict_case(case, prof)
    out = {"id": row["id"], "model": case.model.name, "gpus": f"{row['num_gpus']} {row['gpu']}",
           "precision": case.training.precision, "nvidia": nv.config.short(), "nvidia_pred": nv.tflops_per_gpu,
           "nvidia_low": nv.tflops_per_gpu_low, "nvidia_high": nv.tflops_per_gpu_high,
           "measured": case.measured_tflops, "nvidia_step": nv.step_time_s,
           "nvidia_breakdown": dict(nv.breakdown), "nvidia_mem": nv.memory_gib_per_gpu}
    n = int(row["num_gpus"])
    key = "".join(ch for ch in row["gpu"].upper() if ch.isalnum())
    preset = next(GPU_PRESETS[k] for k in ("GB300", "GB200", "B300", "B200", "H200", "H100") if key.startswith(k))
    # NVIDIA's layout ran, so it is judged against the whole HBM (row_case: headroom 0); the planner's
    # layout did not, so it is planned as `topoplan plan` plans it, with the default headroom
    training = Training.model_validate(case.training.model_dump() | {"memory_headroom": DEFAULT_HEADROOM})
    t0 = time.perf_counter()
    try:
        res = plan(case.model, _job(preset, n), training, top=1, time_limit=time_limit, min_world=n,
                   profile=prof, workers=1)
    except (InfeasibleError, InputError) as exc:
        out.update(error=str(exc).splitlines()[0], wall_s=time.perf_counter() - t0)
        return out
    best = res.plans[0].prediction
    gain, within = lead(best.tflops_per_gpu, best.band_half_width, nv.tflops_per_gpu)
    out.update(plan=res.plans[0].label, plan_pred=best.tflops_per_gpu, plan_low=best.tflops_per_gpu_low,
               plan_high=best.tflops_per_gpu_high, regime=best.regime, extrapolated=best.extrapolated,
               gain=gain, within=within, status=res.solver["status"], wall_s=time.perf_counter() - t0,
               plan_step=best.step_time_s, plan_breakdown=dict(best.breakdown), plan_mem=best.memory_gib_per_gpu,
               hbm=best.hbm_gib)
    return out


def term_differences(r: dict) -> list[tuple[str, float, float, float, float]]:
    """(term, NVIDIA s, planner s, planner - NVIDIA s, that difference over NVIDIA's step) for every
    breakdown term of a claim, largest absolute difference first."""
    nv, pl = r["nvidia_breakdown"], r["plan_breakdown"]
    rows = [(k, nv.get(k, 0.0), pl.get(k, 0.0)) for k in list(nv) + [k for k in pl if k not in nv]]
    out = [(k, a, b, b - a, (b - a) / r["nvidia_step"]) for k, a, b in rows]
    return sorted(out, key=lambda t: -abs(t[3]))


def explain(results: list[dict], above: float = EXPLAIN_ABOVE, top: int = 3) -> list[str]:
    """Lines breaking each claim above ``above`` into its ``top`` largest term differences."""
    lines = [f"claims above {100 * above:.0f}%: the {top} step-time terms that differ most (seconds per step, "
             "planner - NVIDIA, and that as a share of NVIDIA's step; negative: the planner's layout spends less)"]
    for r in sorted((r for r in results if "error" not in r and r["gain"] > above), key=lambda r: -r["gain"]):
        diffs = term_differences(r)
        lines.append(f"{r['id']} {r['model']} {r['gpus']} {r['precision']}: claim {100 * r['gain']:+.1f}%; "
                     f"NVIDIA {r['nvidia']} {r['nvidia_step']:.2f} s/step ({r['nvidia_mem']:.0f} GiB), "
                     f"planner {r['plan']} {r['plan_step']:.2f} s/step ({r['plan_mem']:.0f} of {r['hbm']:.0f} GiB)")
        for k, a, b, d, share in diffs[:top]:
            lines.append(f"    {k:12s} {a:8.3f} s -> {b:8.3f} s  {d:+8.3f} s  {100 * share:+6.1f}% of NVIDIA's step")
        rest = sum(t[3] for t in diffs[top:])
        lines.append(f"    {'the rest':12s} {'':25s} {rest:+8.3f} s  {100 * rest / r['nvidia_step']:+6.1f}%; in all "
                     f"{r['plan_step'] - r['nvidia_step']:+.3f} s = "
                     f"{100 * (r['plan_step'] / r['nvidia_step'] - 1):+.1f}% of NVIDIA's step")
    return lines


def main(argv: list[str]) -> int:
    from multiprocessing import get_context

    from planner.calibration.validate import read_rows

    opts = {"--time-limit": "120", "--procs": "2"}
    args, it = [], iter(argv)
    show_explain = "--explain" in argv
    for a in it:
        if a == "--explain":
            continue
        if a in opts:
            opts[a] = next(it, opts[a])
        else:
            args.append(a)
    time_limit, procs = float(opts["--time-limit"]), max(1, min(2, int(opts["--procs"])))
    path = Path(args[0]) if args else DEFAULT_CSV
    rows = [r for r in read_rows(path) if (r.get("model_tflops_per_gpu") or "").strip()]
    t0 = time.perf_counter()
    with get_context("spawn").Pool(procs) as pool:
        results = pool.map(claim, [(r, str(path), time_limit) for r in rows], chunksize=1)
    print(f"{len(rows)} published runs of {path.name}; plans limited to {time_limit:g} s each, {procs} processes, "
          f"{time.perf_counter() - t0:.0f} s in all")
    print(f"{'id':6s} {'model':16s} {'GPUs':>10s} {'prec':6s} {'NVIDIA layout':34s} {'pred':>6s} {'meas':>6s}  "
          f"{'planner layout':44s} {'pred':>6s} {'band':>11s} {'gain':>7s}  verdict")
    gains, outside = [], []
    for r in results:
        head = (f"{r['id']:6s} {r['model']:16s} {r['gpus']:>10s} {r['precision']:6s} {r['nvidia'][:34]:34s} "
                f"{r['nvidia_pred']:6.0f} {r['measured']:6.0f}  ")
        if "error" in r:
            print(head + f"no plan: {r['error']}")
            continue
        verdict = "within the model's uncertainty" if r["within"] else "outside the band"
        if r["status"] != "OPTIMAL":
            verdict += f" ({r['status']} at the time limit)"
        print(head + f"{r['plan'][:44]:44s} {r['plan_pred']:6.0f} {r['plan_low']:5.0f}-{r['plan_high']:<5.0f} "
              f"{100 * r['gain']:+6.1f}%  {verdict}")
        gains.append(r["gain"])
        if not r["within"]:
            outside.append(r)
    if gains:
        print()
        print(f"claimed gain over NVIDIA's layout (both predicted): median {100 * statistics.median(gains):+.1f}%, "
              f"max {100 * max(gains):+.1f}%, min {100 * min(gains):+.1f}%; {len(outside)} of {len(gains)} outside the "
              "planner's band: " + (", ".join(f"{r['id']} {100 * r['gain']:+.1f}%" for r in outside) or "none"))
    if show_explain:
        print()
        print("\n".join(explain(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
