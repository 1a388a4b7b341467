"""Fit the memory model's reserve terms to measured peaks (issue 13 item 4).

The memory model (``planner.cost.memory``) predicts the worst rank's peak as modelled tensors
``S_i`` (weights, gradients, optimizer, buffers, activations, logits, CUDA-graph buffers) plus::

    reserve_gib  +  fragmentation * A_i        (A_i: activations + expert imbalance + logits)

Given runs whose logs print memory, the two terms are fitted by bounded linear least squares on
``measured_i - S_i = reserve + fragmentation * A_i`` (GiB), with a weak pull towards the defaults
(``PRIOR_WEIGHT``: with one run, or runs of one activation size, the data fix only the sum and the
prior decides the split). The measured peak is the whole device when the log prints it (Megatron
``--log-device-memory-used``; the trial files set it), else the allocator's max reserved plus
``NON_ALLOCATOR_GIB`` (CUDA context and NCCL buffers, which the allocator does not see; the shares of
the default reserve in planner/cost/memory.py's docstring).
"""

from __future__ import annotations

import numpy as np

from planner.cost.memory import FRAGMENTATION, RESERVE_GIB
from planner.cost.profiles import MemoryFit
from planner.calibration.validate import predict_case, row_case

NON_ALLOCATOR_GIB = 0.6 + 1.5   # CUDA context ~0.6 GiB, NCCL communicators and buffers ~1.5 GiB
PRIOR_WEIGHT = 0.1               # GiB of residual worth one default-sized step of a term
BOUNDS = ((0.0, 64.0), (0.0, 1.0))


def measured_peak_gib(row: dict) -> float | None:
    """The measured peak per GPU of a row (``device_used_gib``, else ``peak_reserved_gib`` + the
    non-allocator share), or None when the run printed no memory."""
    dev, res = _num(row.get("device_used_gib")), _num(row.get("peak_reserved_gib"))
    if dev is not None:
        return dev
    return None if res is None else res + NON_ALLOCATOR_GIB


def _num(v) -> float | None:
    text = "" if v is None else str(v).strip()
    return float(text) if text else None


def fit_memory(rows: list[dict], profile, source: str = "runs"):
    """A ``planner.cost.profiles.MemoryFit`` for the rows with a measured peak (None when none has one).

    Each row is predicted with ``profile`` (its recompute resolved as validate does) and split into
    the modelled tensors and the activation total the fragmentation share applies to."""
    from scipy.optimize import lsq_linear

    a_rows, b_rows = [], []
    for r in rows:
        peak = measured_peak_gib(r)
        if peak is None:
            continue
        case = row_case(r, profile.name, source, profile=profile)
        p = predict_case(case, profile)
        comp = p.memory
        if not comp:
            continue
        acts = comp["activations"] + comp.get("expert_imbalance", 0.0) + comp["logits"]
        modelled = sum(v for k, v in comp.items() if k != "reserve")
        a_rows.append([1.0, acts])
        b_rows.append(peak - modelled)
    if not a_rows:
        return None
    a = np.array(a_rows + [[PRIOR_WEIGHT, 0.0], [0.0, PRIOR_WEIGHT / FRAGMENTATION]])
    b = np.array(b_rows + [PRIOR_WEIGHT * RESERVE_GIB, PRIOR_WEIGHT])
    res = lsq_linear(a, b, bounds=tuple(zip(*BOUNDS)))
    reserve, frag = (float(x) for x in res.x)
    return MemoryFit(reserve_gib=round(reserve, 3), fragmentation=round(frag, 4), runs=len(b_rows), source=source)
