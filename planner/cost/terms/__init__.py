"""Cost terms of the step-time model, one module per term, each a pure function returning seconds.

``compute`` (GEMMs, attention core, elementwise work, recompute), ``tensor_parallel``,
``expert_a2a``, ``pipeline`` (bubble and point-to-point), ``data_parallel``, ``context_parallel``,
``optimizer``, ``host`` (the host floor), ``offload`` (CPU activation offload copies), ``cpu_optimizer``
(Megatron's optimizer CPU offload: a ``compose.EXTRA_TERMS`` term). ``planner.cost.steptime`` adds them up. Overlap of a communication term with compute is
modelled per term with :func:`exposed`.
"""

from __future__ import annotations


def exposed(t_comm: float, overlap: float, window: float) -> float:
    """Exposed part of a communication that overlaps independent compute.

    ``exposed = max((1 - overlap) * t_comm, t_comm - window)``: the stack hides at most the fraction
    ``overlap`` of the transfer, and never more than the compute ``window`` that runs alongside it.
    """
    if t_comm <= 0.0:
        return 0.0
    return max((1.0 - overlap) * t_comm, t_comm - max(window, 0.0), 0.0)
