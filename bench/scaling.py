"""Scaling retention, predicted against measured, per published series (bench/data/scaling/scaling.csv).

Run: ``python bench/scaling.py [CSV]``; the summary is given for all series and for the weak (global batch
grows with the GPUs) and strong (global batch fixed) ones apart; ``--regimes`` adds the mean error per regime
(weak or strong scaling, precision, GPU, stack, pipeline hops across racks, data-parallel size, growth); ``python bench/scaling.py --fit [CSV]`` also fits the one fitted figure
of the scale terms, the ranks' arrival spread at an FP8 delayed-scaling amax reduction
(``planner/cost/terms/fp8_scaling.py`` ARRIVAL_SPREAD_S), on a grid, and prints the mean error in sample and
leave-one-series-out (the spread refitted without each series, that series then judged).

For every series (one model, GPU, stack and layout at several GPU counts; the ``series`` column) it
prints the GPU counts, the measured and the predicted retention (per-GPU throughput against the smallest
count) at the largest count, and their difference in points; then the mean |difference| and how many
series are off by more than 4 points. No parameter is fitted per series (``planner.calibration.retention``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_CSV = ROOT / "bench" / "data" / "scaling" / "scaling.csv"


GRID_US = tuple(range(0, 401, 25))


def fit(rows) -> None:
    """The arrival spread on ``GRID_US``: mean |error| per value, the best, and leave-one-series-out."""
    from planner.calibration.retention import series_retention, summary
    from planner.cost.terms import fp8_scaling as FP8S

    kept = FP8S.ARRIVAL_SPREAD_S
    errs = {}
    try:
        for us in GRID_US:
            FP8S.ARRIVAL_SPREAD_S = us * 1e-6
            errs[us] = {s.series: s.error_points for s in series_retention(rows)}
    finally:
        FP8S.ARRIVAL_SPREAD_S = kept
    names = list(errs[GRID_US[0]])
    mean = {us: sum(abs(v) for v in e.values()) / len(e) for us, e in errs.items()}
    print("arrival spread (us): mean |error| (points)  " + "  ".join(f"{us}: {mean[us]:.3f}" for us in GRID_US))
    best = min(GRID_US, key=mean.get)
    held = []
    for n in names:
        b = min(GRID_US, key=lambda us: sum(abs(v) for k, v in errs[us].items() if k != n))
        held.append(abs(errs[b][n]))
    print(f"in sample: best {best} us, mean {mean[best]:.2f} points, {sum(abs(v) > 4 for v in errs[best].values())} "
          f"off by > 4; leave-one-series-out: mean {sum(held) / len(held):.2f} points, "
          f"{sum(h > 4 for h in held)} off by > 4 (shipped: {kept * 1e6:.0f} us)")


SCALING_LABEL = {"strong": "strong (global batch fixed)", "weak": "weak (global batch grows)"}


def regime_of(rows: list[dict], scaling: str) -> dict[str, str]:
    """The regimes one series belongs to (its rows in the CSV, smallest count first): weak or strong scaling
    (``scaling``: ``SeriesRetention.scaling``), precision (FP8 delayed scaling apart), GPU, stack, whether a
    pipeline hop crosses NVLink domains at the largest count, and the data-parallel size reached there."""
    first, last = rows[0], rows[-1]
    n, tp, pp, cp = (int(last[k] or 1) for k in ("num_gpus", "tp", "pp", "cp"))
    nvl72 = last["gpu"].upper().startswith("GB")
    stage = n // max(pp, 1)
    dp = n // (tp * pp * cp)
    prec = last["precision"] + (" delayed" if (last.get("fp8_recipe") or "").strip() == "delayed" else "")
    cross = "pp=1" if pp <= 1 else ("pp crosses racks" if nvl72 and stage >= 64 else
                                    "pp within a rack" if nvl72 else "pp across nodes")
    return {"scaling": SCALING_LABEL.get(scaling, scaling), "precision": prec, "gpu": last["gpu"], "stack": last["stack"].split("-")[0],
            "pipeline": cross,
            "dp at the largest count": "dp <= 16" if dp <= 16 else "dp 17-128" if dp <= 128 else "dp > 128",
            "GPUs grown": f"x{n // int(first['num_gpus'])}" if n // int(first["num_gpus"]) <= 4 else "x8 or more"}


def regimes(rows: list[dict], series) -> None:
    """Mean signed and absolute error (points) per regime (``regime_of``)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault((r.get("series") or "").strip(), []).append(r)
    table: dict[tuple[str, str], list[float]] = {}
    for s in series:
        g = sorted(groups[s.series], key=lambda r: int(r["num_gpus"]))
        for axis, value in regime_of(g, s.scaling).items():
            table.setdefault((axis, value), []).append(s.error_points)
    print(f"\n{'regime':44s} {'series':>6s} {'mean':>6s} {'mean |e|':>8s}")
    for (axis, value), errs in sorted(table.items()):
        print(f"{axis + ': ' + value:44s} {len(errs):6d} {sum(errs) / len(errs):+6.2f} "
              f"{sum(abs(e) for e in errs) / len(errs):8.2f}")


def main(argv: list[str]) -> int:
    from planner.calibration.retention import by_scaling, series_retention, summary
    from planner.calibration.validate import read_rows

    do_fit, by_regime = "--fit" in argv, "--regimes" in argv
    argv = [a for a in argv if a not in ("--fit", "--regimes")]
    path = Path(argv[0]) if argv else DEFAULT_CSV
    series = series_retention(read_rows(path), source=str(path))
    print(f"{'series':34s} {'GPU':6s} {'GPUs':>12s} {'scaling':>7s} {'measured':>9s} {'predicted':>9s} {'diff':>6s}")
    for s in series:
        span = f"{s.gpus[0]}-{s.gpus[-1]}"
        print(f"{s.series:34s} {s.gpu:6s} {span:>12s} {s.scaling:>7s} {100 * s.measured[-1]:8.1f}% "
              f"{100 * s.predicted[-1]:8.1f}% {s.error_points:+6.1f}")
    print()
    for label, group in [("all", series)] + sorted(by_scaling(series).items()):
        sm = summary(group)
        print(f"{label + ':':7s} {sm['series']} series: mean |predicted - measured| {sm['mean_abs_points']:.2f} points, "
              f"{sm['over']} off by more than {sm['far_points']:.0f}; mean retention measured "
              f"{sm['mean_measured']:.1f}%, predicted {sm['mean_predicted']:.1f}%")
    if by_regime:
        regimes(read_rows(path), series)
    if do_fit:
        fit(read_rows(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
