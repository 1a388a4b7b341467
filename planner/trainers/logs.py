"""What the trainers' rank-log parsers share (``planner.trainers.<name>.logs``): the warm-up iterations
dropped, the median of what is left, the GPU named in a log."""

from __future__ import annotations

import math
import statistics

from planner.errors import InputError

MIN_ITERS = 3
GPU_KEYS = ("GB300", "GB200", "B300", "B200", "H200", "H100")


def warmup_iters(last: int) -> int:
    """Iterations dropped at the start of a run of ``last`` iterations."""
    return max(2, math.ceil(last / 5))


def median_after_warmup(points: list[tuple[int, float]], source: str, what: str) -> tuple[float, int, int]:
    """(median value, points used, iterations skipped) of ``(iteration, value)`` after the warm-up."""
    if not points:
        raise InputError(f"{source}: no {what} lines; log every iteration (Megatron --log-interval 1, TorchTitan "
                         "--metrics.log_freq 1) and run at least 10 iterations")
    last = max(i for i, _ in points)
    skip = warmup_iters(last)
    used = [v for i, v in points if i > skip and math.isfinite(v)]
    if len(used) < MIN_ITERS:
        raise InputError(f"{source}: {len(used)} {what} lines after the {skip}-iteration warm-up (of {last}); "
                         f"need {MIN_ITERS}: run more iterations (topoplan trial --iters 20)")
    return statistics.median(used), len(used), skip


def gpu_key(name: str | None) -> str | None:
    if not name:
        return None
    up = "".join(ch for ch in name.upper() if ch.isalnum() or ch == " ")
    for k in GPU_KEYS:
        if any(tok.startswith(k) for tok in up.split()):
            return k
    return None
