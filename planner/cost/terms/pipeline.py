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

Hops between racks, priced per hop (``hop_p2p``): the transfers do not all cross the same link. A
micro-batch's lap visits every stage once, so the time it spends in transfers is the *sum* of its hops'
times, and a lap's micro-batches keep every rank busy for ``pp`` chunk times per lap (the interleaved
schedule runs micro-batches in groups of ``pp``: megatron-core ``schedules.py``
``microbatch_group_size_per_vp_stage`` defaults to pp; Narayanan et al. SC'21, s2.2.2): a transfer costs the
*mean* hop, not the worst. A pipeline group's stages are consecutive ranks ``base + k * stride`` (pipeline
is the outermost rank axis, Megatron's default order ``tp-cp-ep-dp-pp``), so its members fill NVLink domains
in order and ``domains - 1`` of its ``pp - 1`` forward hops leave a domain; the interleaved schedule's lap
also returns from the last stage to the first (chunk ``c`` on rank ``pp - 1`` feeds chunk ``c + 1`` on rank
0), one hop more that leaves a domain when the group spans two or more::

    hops  = pp - 1 (+ 1 with vpp > 1)          crossing = domains - 1 (+ 1 with vpp > 1 and domains > 1)
    p2p(A) = (crossing * p2p_net(A, tier) + (hops - crossing) * p2p_nvlink(A)) / hops

with ``tier`` the highest fabric tier the group crosses (a little pessimistic for hops that stay below
it). A placement that breaks the order (a replan that moves one stage onto a spare tray in another rack) can
leave and re-enter a domain, crossing more often than ``domains - 1``: there the count is a lower bound. On HGX nodes a stage of ``tp cp dp >= 8`` ranks fills a node, every hop leaves it and nothing changes;
on NVL72 racks the share of crossing hops grows with the data-parallel size: Llama 3.1 405B TP4 PP8 VPP8
CP2 has 2 of its 8 hops between racks on 128 GB200 and all 8 on 512.
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


def crossing_hops(pp: int, vpp: int, domains: int) -> tuple[int, int]:
    """(hops, crossing): the stage-to-stage hops of one lap of a micro-batch (``pp - 1``, plus the return
    from the last stage to the first when interleaved) and how many of them leave an NVLink domain, for a
    pipeline group that touches ``domains`` domains (module docstring)."""
    if pp <= 1:
        return 0, 0
    wrap = 1 if vpp > 1 else 0
    hops = pp - 1 + wrap
    crossing = 0 if domains <= 1 else domains - 1 + wrap
    return hops, min(crossing, hops)


def hop_p2p(fabric, nbytes: float, shape, vpp: int) -> float:
    """Seconds of one stage-to-stage transfer of ``nbytes``, the mean over the pipeline group's hops
    (``shape``: its ``GroupShape``; NVLink for the hops inside a domain, ``fabric.p2p`` at the group's tier
    for those that leave one). 0 without a pipeline."""
    if shape is None or shape.size <= 1:
        return 0.0
    hops, crossing = crossing_hops(shape.size, vpp, shape.domains)
    inside = fabric.p2p(nbytes, -1)
    if crossing == 0:
        return inside
    return (crossing * fabric.p2p(nbytes, shape.tier) + (hops - crossing) * inside) / hops
