"""The composition of the step time, written once against a tiny ops interface.

The cost terms (``planner.cost.terms``) give the leaves: a layer's compute, its collectives at a group
shape, the host time to issue it, a transfer, a gradient reduction. How they combine into a step is
written here, once, as functions of an ``ops`` object:

    exposed   = max(kept, t - window, 0)                  kept = (1 - overlap) t: what cannot hide
    layer     = launch + max(gpu, host, gpu + sync)       gpu = compute + exposed TP + EP + CP
    rank      = sum_k n_k layer_k + n_mtp mtp + loss head (+ offload)      one micro-batch
    crit      = the first slowest rank;  tmax = its time
    core, p2p = (m + bubble) tmax, p2p_one * p2p_transfers
    step      = core + p2p + dp + optimizer + unpaired (+ ``EXTRA_TERMS``)
    unpaired  = passes(pp, vpp, m) hidden_0      the all-to-all the EP overlap hid on rank 0's MoE layers per
                                                 micro-batch, exposed in its unpaired warm-up / cool-down passes
    dp        = exposed(RS, RS kept, t_bwd) + exposed(AG, AG kept, t_fwd)          distributed optimizer
              = m exposed(g AG + RS, g AG kept + RS kept, t_mb)                    FSDP (g gathers)

Three ops run it. ``FLOAT`` (here): the leaves are seconds and ``planner.cost.steptime.step_time``
evaluates one layout. ``ARRAY`` (here): the leaves are numpy arrays of integer table entries, one
per layout (``planner.search.bounds``' layer-time minima). ``planner.search.nodeops.NodeOps``: the
leaves are table nodes of the solver's ``Program`` (the same term functions tabulated over the
decision variables) and the composition
builds its sum / max / product / argmax / element nodes, so the program ``plan`` searches is this
composition (docs/architecture.md, "One composition").

The ops interface: ``zero``; ``add(*xs)`` (numbers allowed: constants); ``sub(a, b)``;
``lin(pairs)`` (sum of integer weight times value); ``mul(a, b)``; ``max(*xs)``;
``argmax(xs, present)`` (index of the first largest present value); ``pick(i, xs)`` (``xs[i]``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner.cost.terms import cpu_optimizer as CPU_OPT
from planner.cost.terms import fp8_scaling as FP8S


class FloatOps:
    """The composition on numbers: one layout, seconds."""

    zero = 0.0

    @staticmethod
    def add(*xs):
        return sum(xs)

    @staticmethod
    def sub(a, b):
        return a - b

    @staticmethod
    def lin(pairs):
        return sum(w * x for w, x in pairs)

    @staticmethod
    def mul(a, b):
        return a * b

    @staticmethod
    def max(*xs):
        return max(xs)

    @staticmethod
    def argmax(xs, present=None):
        live = range(len(xs)) if present is None else [i for i in range(len(xs)) if present[i]]
        return max(live, key=lambda i: xs[i])   # the first of equals, as Program.argmax

    @staticmethod
    def pick(i, xs):
        return xs[i]


FLOAT = FloatOps()


class ArrayOps(FloatOps):
    """The composition on numpy arrays of integer table entries, element by element (the bounds of
    ``planner.search.bounds`` over many layouts at once): ``FloatOps`` with an elementwise max."""

    @staticmethod
    def max(*xs):
        return functools.reduce(np.maximum, xs)


ARRAY = ArrayOps()


def exposed(ops, t, kept, window):
    """The exposed part of a communication ``t`` that overlaps compute ``window``: at least ``kept``
    (the ``(1 - overlap) t`` the stack cannot hide), at least what the window leaves, at least 0."""
    return ops.max(kept, ops.sub(t, window), ops.zero)


def layer_time(ops, compute, comm, launch, host=None, sync=None):
    """One layer and micro-batch: its GPU time (compute and the exposed communication ``comm``), the
    host floor (``host``: seconds to issue its kernels, which the GPU time may cover) and the dropless
    router's sync (``sync``: GPU idle seconds after it), plus the fixed launch overhead ``launch``."""
    if host is None and sync is None:
        return ops.add(compute, *comm, launch)
    gpu = ops.add(compute, *comm)
    cands = [gpu] + ([host] if host is not None else []) + ([ops.add(gpu, sync)] if sync is not None else [])
    return ops.add(ops.max(*cands), launch)


def rank_time(ops, parts):
    """One pipeline rank's seconds per micro-batch: ``sum n_i t_i`` over ``parts`` (count, time):
    its layers by kind, its MTP layers, the loss head, the offload wait."""
    terms = [ops.mul(n, t) for n, t in parts]
    return ops.add(*terms) if terms else ops.zero


def critical(ops, times, present=None):
    """(index, time) of the first slowest pipeline rank among those ``present``."""
    i = ops.argmax(times, present)
    return i, ops.pick(i, times)


def dp_exposed(ops, rs, ag, rs_kept, ag_kept, t_bwd, t_fwd):
    """Distributed optimizer: the reduce-scatter hides behind the last micro-batch's backward ``t_bwd``, the
    all-gather behind ``t_fwd``: the first micro-batch's forward, times ``gather_window_passes`` with an
    interleaved pipeline (``terms/data_parallel.py``)."""
    return ops.add(exposed(ops, rs, rs_kept, t_bwd), exposed(ops, ag, ag_kept, t_fwd))


def fsdp_exposed(ops, rs, ag, rs_kept, ag_kept, t_mb, m, gathers: int):
    """FSDP: every micro-batch gathers the parameters ``gathers`` times and reduce-scatters the
    gradients, hidden behind that micro-batch's compute ``t_mb``; ``m`` micro-batches."""
    return ops.mul(m, exposed(ops, ops.lin([(gathers, ag), (1, rs)]), ops.lin([(gathers, ag_kept), (1, rs_kept)]),
                              t_mb))


def pipeline(ops, m, bubble, tmax, p2p_one, p2p_transfers):
    """(core, p2p): ``m`` micro-batches and ``bubble`` = (pp - 1) / vpp of the slowest rank's ``tmax``;
    ``p2p_transfers`` exposed stage-to-stage transfers of ``p2p_one`` seconds each. Their sum is a
    lower bound of the step (the rest is >= 0), which the solver's exhaustive search orders by."""
    return ops.mul(ops.add(m, bubble), tmax), ops.mul(p2p_one, p2p_transfers)


def unpaired_a2a(ops, passes, hidden):
    """The all-to-all the EP overlap hides in steady 1F1B but not in the warm-up and cool-down passes:
    ``passes`` micro-batches' worth of them (``expert_a2a.unpaired_passes``) times ``hidden``, the seconds
    the overlap hid on the first pipeline rank's MoE layers per micro-batch (``sum_k n_k (t_a2a - exposed)``)."""
    return ops.mul(passes, hidden)


def step(ops, core, p2p, dp, optimizer, extra=()):
    """Seconds per step: the pipeline's ``core`` and ``p2p``, the exposed DP time, the optimizer
    step and the ``EXTRA_TERMS`` values ``extra``."""
    return ops.add(core, p2p, dp, optimizer, *extra)


@dataclass(frozen=True)
class StepTerm:
    """A term added to the step as it is, a function of a few choices: ``seconds(ctx, values)`` with
    ``values`` a dict of the names in ``reads`` (any of tp, cp, pp, vpp, dp, ep, etp, mbs, gbs,
    recompute, dispatcher, fsdp: the solver's variables, ``planner.search.space.VARIABLES``; and "world") and
    ``ctx`` the ``TermContext``. Registered in ``EXTRA_TERMS``, it is in ``predict``'s step time and
    breakdown (under ``name``: a new name joins ``planner.cost.steptime.TERMS``, the plan document's
    ``Term`` and the report's categories; regenerate planner/data/plan.schema.json) and in the
    solver's program (tabulated over ``reads``): a new additive term is written in one place.
    tests/test_one_composition.py registers one and checks that it reaches both."""

    name: str
    reads: tuple[str, ...]
    seconds: Callable
    category: str = "other"   # where the report draws it (planner.output.explain.CATEGORIES)


@dataclass(frozen=True)
class TermContext:
    model: object
    cluster: object
    training: object
    profile: object
    fabric: object


EXTRA_TERMS: list[StepTerm] = [
    # Megatron's optimizer CPU offload: gradients to the host, CPU Adam, parameters back (terms/cpu_optimizer.py)
    StepTerm("cpu_optimizer", ("world",), CPU_OPT.seconds, category="optimizer"),
    # FP8 delayed scaling's amax all-reduce over a stage's tp x cp x dp ranks, per micro-batch and chunk
    StepTerm("fp8_amax", ("tp", "cp", "dp", "vpp", "mbs", "gbs"), FP8S.seconds, category="sync"),
]
