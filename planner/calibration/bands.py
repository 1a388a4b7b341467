"""The uncertainty table's statistic, fitted from residuals of measured runs (``bench/uncertainty.py``
writes ``planner/data/uncertainty.yaml`` with it; ``planner.cost.uncertainty`` applies the table)."""

from __future__ import annotations

import math


def half_width(abs_log_errors, quantile: float, floor: float) -> float:
    """The band statistic: the ``quantile`` of |ln(pred/meas)| (linear interpolation between order
    statistics, numpy's default), at least ``floor``."""
    xs = sorted(abs(float(x)) for x in abs_log_errors)
    if not xs:
        raise ValueError("no residuals")
    pos = quantile * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    q = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return max(floor, q)
