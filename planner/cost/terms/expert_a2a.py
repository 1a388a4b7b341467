"""Expert-parallel token dispatch and combine (all-to-all), forward and backward.

Per MoE layer and micro-batch each EP rank holds ``T_r = mbs * s / (cp * tp)`` tokens (sequence
parallel shards them over TP). Dispatch sends every token to the ranks hosting its top-k experts,
combine returns the weighted outputs: forward dispatch + combine and their backward mirror give 4
all-to-alls. Bytes one rank sends::

    dispatch: T_r * c * h * b_d,   combine: T_r * c * h * 2,   c = copies per token

``c = top_k`` for the plain all-to-all dispatcher; DeepEP / HybridEP (flex dispatchers) send a token
once per destination rank: ``c = ep * (1 - (1 - 1/ep)^top_k)`` under uniform routing. ``b_d`` is 1
(FP8 dispatch) for low-precision runs when the stack dispatches in FP8, else 2. With an
``ExpertBalance`` the cross-domain share of the traffic and the busiest rank's load scale the time.
The fabric prices it (``Fabric.all_to_all`` on the worst EP group's shape: inside one NVLink domain
or across domains through the NICs). Overlap: ``ep.overlap`` of it hides behind the other micro-batch's
compute (Megatron's 1F1B A2A overlap) or the shared experts, bounded by the layer's compute.
"""

from __future__ import annotations

from planner.cost.terms import exposed


def copies_per_token(top_k: int, ep: int, dedup: bool) -> float:
    """Expected ranks a token is sent to (uniform routing); top_k without de-duplication."""
    if ep <= 1:
        return 0.0
    if not dedup:
        return float(top_k)
    return ep * (1.0 - (1.0 - 1.0 / ep) ** top_k)


def a2a_bytes(tokens_per_rank: float, hidden: int, copies: float, dispatch_bytes: float,
              combine_bytes: float = 2.0) -> tuple[float, float]:
    """(dispatch, combine) bytes one rank sends for one micro-batch and layer."""
    base = tokens_per_rank * copies * hidden
    return base * dispatch_bytes, base * combine_bytes


def a2a_time(fabric, shape, dispatch_bytes: float, combine_bytes: float, impl: str = "nccl",
             cross_domain_scale: float = 1.0) -> float:
    """Seconds of forward + backward dispatch and combine of one MoE layer and micro-batch.

    ``cross_domain_scale`` multiplies the time when the group spans NVLink domains (an
    ``ExpertBalance`` whose cross-domain traffic differs from uniform routing).
    """
    if shape is None or shape.size <= 1:
        return 0.0
    t = 2.0 * (fabric.all_to_all(shape, dispatch_bytes, impl=impl) + fabric.all_to_all(shape, combine_bytes, impl=impl))
    if shape.domains > 1:
        t *= cross_domain_scale
    return t


def a2a_exposed(t_a2a: float, overlap: float, t_compute: float) -> float:
    return exposed(t_a2a, overlap, t_compute)
