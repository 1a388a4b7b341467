"""Synchronisation of N ranks: a step waits for its slowest GPU.

Identical GPUs do not run at identical speed: manufacturing spread and power management give each its
own clocks under load. Sinha et al., "Not All GPUs Are Created Equal: Characterizing Variability in
Large-Scale, Accelerator-Rich Systems" (SC'22, arXiv:2208.11035v3) measured over 90% of the GPUs of five
clusters (Summit, Vortex, Frontera, Longhorn, Corona; thousands of GPUs each) running the same kernels:
8% average performance variation between the fastest and slowest GPU of a cluster (max 22%), outliers
aside. For n normal draws the expected range is about ``2 sqrt(2 ln n)`` standard deviations; with
n ~ 4,000 GPUs that is 8.1 sigma, so sigma ~ 8% / 8.1 = 1.0% of a GPU's speed. Golden et al., "PRISM:
Probabilistic Runtime Insights and Scalable Performance Modeling for Large-Scale Distributed Training"
(Meta, arXiv:2510.15596) measured up to 14% variation in GPU performance on GEMM workloads across current
training hardware and deployments and 9% GPU time variability at 64K GPUs: sigma ~ 1-2%. ``SIGMA_GPU`` =
1.5%, between the two (not fitted to the scaling series; bench/scaling.py would prefer 2.0%).

Synchronous training joins every rank at least once a step (the data-parallel reduction, the pipeline's
send/receive chain, TP and EP collectives inside each group), so the step runs at the pace of the slowest
of the ``N`` GPUs. The expected maximum of N standard normal draws is ``e(N)`` (Blom's approximation of
the largest order statistic, ``Phi^-1((N - 0.375) / (N + 0.25))``; it grows as ``sqrt(2 ln N)``)::

    t_sync = SIGMA_GPU * e(N) * t_step          (the step's other terms, one GPU's pace)

It is 0 for one GPU and grows with the logarithm of N, not with the work per GPU: the term that bends
retention for layouts whose communication is all hidden. Approximation: the share applies to the whole
step, exposed communication included (a slow GPU delays the collectives it joins, but the transfer itself
does not run slower); for communication-bound layouts it is a little pessimistic. It keeps the term a
factor of the step, which the solver prices exactly as an objective weight over the world size. The step-time model's other terms are fitted at
some N; retention compares e(N) with e(N0).
"""

from __future__ import annotations

from functools import lru_cache
from statistics import NormalDist

SIGMA_GPU = 0.015   # relative spread of one GPU's pace: between Sinha et al. (1.0%) and PRISM (~2%)


@lru_cache(maxsize=4096)
def expected_max(n: int) -> float:
    """E[max of n standard normal draws] (Blom), 0 for n <= 1."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def sync_factor(world: int, sigma: float = SIGMA_GPU) -> float:
    """``t_sync / t_step``: the share the slowest of ``world`` GPUs adds to a step."""
    return sigma * expected_max(int(world))


def sync_time(t_step: float, world: int, sigma: float = SIGMA_GPU) -> float:
    """Seconds a step of ``t_step`` (its other terms) waits for the slowest of ``world`` GPUs."""
    return t_step * sync_factor(world, sigma)
