"""Scaling retention, predicted against measured, per published series (bench/data/scaling/scaling.csv).

Run: ``python bench/scaling.py [CSV]``

For every series (one model, GPU, stack and layout at several GPU counts; the ``series`` column) it
prints the GPU counts, the measured and the predicted retention (per-GPU throughput against the smallest
count) at the largest count, and their difference in points; then the mean |difference| and how many
series are off by more than 4 points. No parameter is fitted per series (``planner.cost.retention``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_CSV = ROOT / "bench" / "data" / "scaling" / "scaling.csv"


def main(argv: list[str]) -> int:
    from planner.cost.retention import series_retention, summary
    from planner.cost.validate import read_rows

    path = Path(argv[0]) if argv else DEFAULT_CSV
    series = series_retention(read_rows(path), source=str(path))
    print(f"{'series':34s} {'GPU':6s} {'GPUs':>12s} {'measured':>9s} {'predicted':>9s} {'diff':>6s}")
    for s in series:
        span = f"{s.gpus[0]}-{s.gpus[-1]}"
        print(f"{s.series:34s} {s.gpu:6s} {span:>12s} {100 * s.measured[-1]:8.1f}% {100 * s.predicted[-1]:8.1f}% "
              f"{s.error_points:+6.1f}")
    sm = summary(series)
    print(f"\n{sm['series']} series: mean |predicted - measured| {sm['mean_abs_points']:.2f} points, "
          f"{sm['over']} off by more than {sm['far_points']:.0f}; mean retention measured "
          f"{sm['mean_measured']:.1f}%, predicted {sm['mean_predicted']:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
