"""Scaling retention: predicted against measured, per series of one layout at several GPU counts.

A series is the rows of a measured-runs CSV (``planner.calibration.validate`` schema) that share a ``series``
value: one model, GPU, stack and layout, run at several GPU counts (weak scaling: the global batch grows
with the GPUs; strong scaling: it does not). Retention at N GPUs is the per-GPU throughput at N over the
per-GPU throughput at the series' smallest count, for the measured rows and for the step-time model's
predictions of the same rows (``planner.calibration.validate.validate_rows``). ``bench/scaling.py`` prints it;
tests/test_scale_terms.py asserts it on ``bench/data/scaling/scaling.csv``.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.calibration.validate import validate_rows


@dataclass(frozen=True)
class SeriesRetention:
    series: str
    model: str
    gpu: str
    stack: str
    gpus: tuple[int, ...]
    measured: tuple[float, ...]     # retention at each GPU count, 1.0 at the first
    predicted: tuple[float, ...]
    gbs: tuple[int, ...] = ()       # global batch (sequences) at each GPU count

    @property
    def scaling(self) -> str:
        """``strong`` (the global batch is the same at every count: fewer micro-batches per pipeline as
        the GPUs grow), ``weak`` (it grows with the GPUs: the micro-batches per pipeline stay), else
        ``mixed``."""
        if len(set(self.gbs)) == 1:
            return "strong"
        if all(b * self.gpus[0] == self.gbs[0] * n for b, n in zip(self.gbs, self.gpus)):
            return "weak"
        return "mixed"

    @property
    def error_points(self) -> float:
        """Predicted minus measured retention at the largest count, in percentage points."""
        return 100.0 * (self.predicted[-1] - self.measured[-1])


def _per_gpu(rows: list[dict], measured: bool) -> list[float]:
    """Per-GPU throughput of validated rows, measured or predicted: tokens/s when every row states it,
    else model TFLOP/s (one model and sequence length per series: the ratio is the same)."""
    kind = "tokens_per_s_per_gpu" if all(r["measured_tokens_per_s_per_gpu"] for r in rows) else "tflops_per_gpu"
    return [r[("measured_" if measured else "predicted_") + kind] for r in rows]


def series_retention(rows: list[dict], profile=None, source: str = "CSV") -> list[SeriesRetention]:
    """Retention per series of ``rows`` (CSV dicts with a ``series`` column), in the order series first
    appear; a series needs two or more GPU counts."""
    order: list[str] = []
    groups: dict[str, list[dict]] = {}
    for r in rows:
        s = (r.get("series") or "").strip()
        if not s:
            continue
        if s not in groups:
            order.append(s)
        groups.setdefault(s, []).append(r)
    out = []
    for s in order:
        group = sorted(groups[s], key=lambda r: int(r["num_gpus"]))
        if len(group) < 2:
            continue
        res = validate_rows(group, profile=profile, source=source)["rows"]
        if any(r["refused"] for r in res):
            continue   # a layout its trainer would not run: no prediction (validate's "refused")
        meas, pred = _per_gpu(res, True), _per_gpu(res, False)
        out.append(SeriesRetention(
            s, res[0]["model"], res[0]["gpu"], res[0]["stack"], tuple(r["num_gpus"] for r in res),
            tuple(m / meas[0] for m in meas), tuple(p / pred[0] for p in pred), tuple(int(r["gbs"]) for r in group)))
    return out


def by_scaling(series: list[SeriesRetention]) -> dict[str, list[SeriesRetention]]:
    """The series split by ``SeriesRetention.scaling`` (weak, strong, mixed), in their order."""
    out: dict[str, list[SeriesRetention]] = {}
    for s in series:
        out.setdefault(s.scaling, []).append(s)
    return out


def summary(series: list[SeriesRetention], far: float = 4.0) -> dict:
    """Mean |predicted - measured| retention at each series' largest count (points), and how many series
    are off by more than ``far`` points."""
    errs = [abs(s.error_points) for s in series]
    return {"series": len(series), "mean_abs_points": sum(errs) / len(errs) if errs else 0.0,
            "over": sum(e > far for e in errs), "far_points": far,
            "mean_measured": 100.0 * sum(s.measured[-1] for s in series) / max(len(series), 1),
            "mean_predicted": 100.0 * sum(s.predicted[-1] for s in series) / max(len(series), 1)}
