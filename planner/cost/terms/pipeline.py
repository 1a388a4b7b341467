"""Pipeline parallelism: the schedule bubble and the stage-to-stage point-to-point transfers.

Bubble of 1F1B with ``m`` micro-batches and ``pp`` stages, interleaved over ``vpp`` virtual stages
per rank (Narayanan et al. 2021; Megatron's interleaved schedule)::

    t_bubble = (pp - 1) / vpp * (t_f + t_b)

where ``t_f + t_b`` is one micro-batch's forward + backward on the slowest rank (all its virtual
stages together), so the bubble fraction of the ideal time is ``(pp - 1) / (vpp * m)``.

Point-to-point: each virtual stage sends its output activation ``mbs * s/(cp*tp) * h * 2`` bytes
forward and receives a gradient of the same size backward. The warm-up and drain chain of
``2 (pp - 1)`` transfers is exposed; of the ``2 m vpp`` steady-state transfers the stack hides
``pp.overlap``::

    t_p2p = p2p(A) * (2 (pp - 1) + (1 - overlap) * 2 * m * vpp)
"""

from __future__ import annotations


def bubble_time(pp: int, vpp: int, t_microbatch: float) -> float:
    """Seconds of pipeline bubble per step."""
    return bubble_factor(pp, vpp) * t_microbatch


def bubble_factor(pp: int, vpp: int) -> float:
    """The bubble in units of the slowest rank's micro-batch: (pp - 1) / vpp."""
    return 0.0 if pp <= 1 else (pp - 1) / vpp


def bubble_fraction(pp: int, vpp: int, microbatches: int) -> float:
    """Bubble over ideal time: (pp - 1) / (vpp * m)."""
    return 0.0 if pp <= 1 else (pp - 1) / (vpp * microbatches)


def p2p_transfers(pp: int, vpp: int, microbatches: int, overlap: float) -> float:
    """Exposed transfers per step, in units of one transfer: ``2 (pp-1) + (1-overlap) 2 m vpp``."""
    if pp <= 1:
        return 0.0
    return 2 * (pp - 1) + (1.0 - overlap) * 2 * microbatches * vpp
