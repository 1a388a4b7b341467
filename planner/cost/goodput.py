"""Goodput: tokens/s once failures, checkpoints and restarts are counted (docs/resilience.md).

The formulas, each in this one place::

    lambda      = sum over components of rate * units        interruptions per second of the job
                  (units: the job's GPUs, hosts, or NVLink switch trays of the domains it uses)
    M           = 1 / lambda                                 mean time between interruptions
    delta       = checkpoint_bytes / (storage_GB/s_per_GPU * GPUs)     checkpoint write time
    tau         = sqrt(2 delta M)                            Young (1974), the default interval, or
                  sqrt(2 delta M) [1 + sqrt(delta/2M)/3 + (delta/2M)/9] - delta  (delta < 2M; else M)
                                                             Daly (2006), the higher-order form
    waste(tau)  = delta / tau + lambda (tau / 2 + R) + extra          the share of time lost:
                  writing checkpoints, half an interval of lost work and the restart R per interruption,
                  and ``extra``, the repair cost of failures that find no spare host:
    extra       = sum over used domains d of lambda_hw(d) P(no spare in d) (repair * u_d / GPUs + R)
                  + lambda_switch(d) (repair * u_d / GPUs + R)
                  (the job runs without domain d, u_d of its GPUs, until the repair, then restarts once
                  more to take it back; P(no spare) = P(N >= s_d), N ~ Poisson(lambda_hw(d) * repair):
                  the hosts of d still in repair when a failure comes, s_d its spare hosts)
    effective   = max(0, 1 - waste(tau))
    goodput     = tokens_per_s * effective

Young's tau minimises waste(tau) exactly (d waste / d tau = 0), which tests/test_goodput.py checks
by brute force. Spare hosts: on NVL72 racks a replacement must sit in the failed tray's rack (the
NVLink domain), so spares are the whole trays a rack leaves unused (72 - 64 = 8 GPUs: 2 trays);
where the NVLink domain is the host (HGX), any idle host of the cluster replaces it (one pool).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

from planner.config import Training
from planner.cost.failures import FailureModel, carried_over, load_failure_model
from planner.cost.memory import options_for, state_bytes
from planner.errors import InputError
from planner.model.flops import param_counts
from planner.trainers import get_trainer

INTERVALS = ("young", "daly")


@dataclass(frozen=True)
class Resilience:
    """What the user may set (None = the failure-rate file's ``defaults``, each cited or marked
    assumed there): the rate set or file, storage bandwidth per GPU (GB/s), restart (minutes), repair
    (hours), and the checkpoint interval rule ("young", "daly") or a fixed interval in minutes."""

    rates: str | None = None
    storage_gb_s_per_gpu: float | None = None
    restart_min: float | None = None
    repair_hours: float | None = None
    interval: str = "young"

    def resolved(self) -> tuple[FailureModel, float, float, float]:
        """(failure model, storage B/s per GPU, restart s, repair s)."""
        fm = load_failure_model(self.rates)
        d = fm.defaults
        bw = self.storage_gb_s_per_gpu if self.storage_gb_s_per_gpu is not None else d.get("storage_gb_s_per_gpu", 0.122)
        restart = self.restart_min if self.restart_min is not None else d.get("restart_min", 10.0)
        repair = self.repair_hours if self.repair_hours is not None else d.get("repair_hours", 24.0)
        for opt, v in (("--storage-bw", bw), ("--restart-min", restart), ("--repair-hours", repair)):
            if v is None or v < 0 or (opt == "--storage-bw" and v <= 0):
                raise InputError(f"{opt} {v}: give a positive number")
        return fm, float(bw) * 1e9, float(restart) * 60.0, float(repair) * 3600.0


@dataclass(frozen=True)
class JobShape:
    """Where a job runs: GPUs used per NVLink domain, the domain size, GPUs per host, and the spare
    hosts each domain can restart on (``pooled``: one cluster-wide pool, HGX)."""

    used: tuple[int, ...]          # GPUs used in each NVLink domain the job touches
    domain_size: int
    gpus_per_host: int
    spares: tuple[int, ...]        # spare hosts per used domain, or one pool (pooled)
    pooled: bool

    @property
    def gpus(self) -> int:
        return sum(self.used)

    def hosts_in(self, u: int) -> int:
        return math.ceil(u / self.gpus_per_host)

    @property
    def hosts(self) -> int:
        return sum(self.hosts_in(u) for u in self.used)


def job_shape(cluster, rank_to_gpu) -> JobShape:
    """The shape of a placed job (``Placement.rank_to_gpu`` on ``cluster.gpus()``): GPUs used per
    domain and its spare hosts, pooled when a domain is a host. A domain's spares are the whole hosts
    the job leaves idle plus the trays it holds back under ``health.spare_trays`` (``--usable-per-rack
    64`` holds 2 per rack there) that have no failed GPU; ``failed_trays`` and ``failed_nodes`` are
    broken and never count."""
    gpus = cluster.gpus()
    spec = cluster.gpu_spec
    gph = spec.gpus_per_node
    used: dict[int, int] = {}
    for g in rank_to_gpu:
        used[gpus[g].domain] = used.get(gpus[g].domain, 0) + 1
    order = sorted(used)
    size = spec.nvlink_domain_max
    if size <= gph:   # the NVLink domain is the host: any idle host of the cluster is a spare
        idle = (len(gpus) - len(rank_to_gpu)) // gph
        return JobShape(tuple(used[d] for d in order), size, gph, (idle,), True)
    healthy = {g.domain: 0 for g in gpus}
    for g in gpus:
        healthy[g.domain] += 1
    held = Counter(cluster.node_domain(h) for h in held_spares(cluster))
    spares = tuple((healthy[d] - used[d]) // gph + held[d] for d in order)
    return JobShape(tuple(used[d] for d in order), size, gph, spares, False)


def held_spares(cluster) -> list[str]:
    """The trays under ``health.spare_trays`` that can replace a failed host: no failed GPU, in a
    domain that has healthy GPUs."""
    bad = {str(x).rpartition(":")[0] for x in cluster.health.failed_gpus}
    return [h for h in cluster.health.spare_trays if h not in bad and cluster.node_domain(h) is not None]


def checkpoint_bytes(model, training: Training) -> float:
    """Bytes of one checkpoint: every parameter's weight and optimizer state (gradients are not
    saved), with the trainer's bytes per parameter (``planner.cost.memory.state_bytes``)."""
    w, _, opt = state_bytes(options_for(training), get_trainer(training.trainer).pricing.master_weights)
    return float(param_counts(model).total) * (w + opt)


def young_interval(delta: float, mtbf: float) -> float:
    """Young (1974), "A first order approximation to the optimum checkpoint interval", CACM 17(9)."""
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps",
    FGCS 22(3), eq. 37: the minimiser of his expected wall time to higher order."""
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def waste(tau: float, delta: float, rate: float, restart: float, extra: float = 0.0) -> float:
    """The share of wall time lost at checkpoint interval ``tau`` (the formula of the module doc)."""
    return delta / tau + rate * (tau / 2.0 + restart) + extra


def p_no_spare(spares: int, mean_in_repair: float) -> float:
    """P(N >= spares) for N ~ Poisson(mean_in_repair): a failure finds every spare host taken."""
    if spares <= 0:
        return 1.0
    term, below = math.exp(-mean_in_repair), 0.0
    for k in range(spares):
        below += term
        term *= mean_in_repair / (k + 1)
    return max(0.0, 1.0 - below)


@dataclass(frozen=True)
class Goodput:
    goodput_tokens_per_s: float
    effective_fraction: float
    tokens_per_s: float
    interruptions_per_day: float
    mtbf_h: float
    checkpoint_gb: float
    checkpoint_write_s: float
    interval_s: float
    interval_rule: str
    restart_s: float
    repair_h: float
    lost_per_failure_s: float       # tau / 2 + R + extra / lambda
    checkpoint_share: float         # delta / tau
    failure_share: float            # lambda (tau / 2 + R) + extra
    spare_hosts_per_domain: int     # the fewest over the used domains (the pool when pooled)
    no_spare_share: float           # share of hardware interruptions that find no spare host
    rates: str
    carried_over: bool              # the rates were observed on another GPU generation
    assumed: tuple[str, ...]        # inputs that are assumptions, not published figures

    def to_dict(self) -> dict:
        d = asdict(self)
        d["assumed"] = list(self.assumed)
        return d


def _extra(fm: FailureModel, shape: JobShape, repair: float, restart: float) -> tuple[float, float, float]:
    """(extra share of time lost to failures that find no spare, rate of hardware failures, rate of
    those that find no spare), per second. Domains of the same (used, spares) are priced once."""
    gpu_hw, host_hw = fm.rate("gpu", "hardware") / 3600.0, fm.rate("host", "hardware") / 3600.0
    sw = fm.rate("switch_tray", "domain") * fm.switch_trays_per_domain.get(shape.domain_size, 0) / 3600.0
    extra = hw_rate = none_rate = 0.0
    total_hw = sum(gpu_hw * u + host_hw * shape.hosts_in(u) for u in shape.used)
    pool = p_no_spare(shape.spares[0], total_hw * repair) if shape.pooled else None
    kinds = Counter(zip(shape.used, shape.spares if not shape.pooled else [0] * len(shape.used)))
    for (u, spares), n in kinds.items():
        lam = gpu_hw * u + host_hw * shape.hosts_in(u)
        p = pool if shape.pooled else p_no_spare(spares, lam * repair)
        cost = repair * u / shape.gpus + restart
        extra += n * (lam * p * cost + sw * cost)
        hw_rate += n * lam
        none_rate += n * lam * p
    return extra, hw_rate, none_rate


def goodput(tokens_per_s: float, shape: JobShape, ckpt_bytes: float, settings: Resilience | None = None,
            gpu_name: str = "") -> Goodput:
    """Effective tokens/s of a job of this shape (the formulas of the module doc)."""
    s = settings or Resilience()
    fm, bw, restart, repair = s.resolved()
    units = {"gpu": shape.gpus, "host": shape.hosts,
             "switch_tray": len(shape.used) * fm.switch_trays_per_domain.get(shape.domain_size, 0)}
    rate = sum(c.rate_per_hour * units[c.per] for c in fm.components) / 3600.0
    delta = ckpt_bytes / (bw * shape.gpus)
    mtbf = 1.0 / rate if rate > 0 else math.inf
    tau, rule = _interval(s.interval, delta, mtbf)
    extra, hw_rate, none_rate = _extra(fm, shape, repair, restart)
    w = waste(tau, delta, rate, restart, extra) if math.isfinite(tau) and tau > 0 else 0.0
    eff = max(0.0, 1.0 - w)
    assumed = tuple(fm.assumed()) + tuple(k for k, v in (("restart_min", s.restart_min),
                                                         ("repair_hours", s.repair_hours)) if v is None)
    return Goodput(
        goodput_tokens_per_s=tokens_per_s * eff, effective_fraction=eff, tokens_per_s=tokens_per_s,
        interruptions_per_day=rate * 86400.0, mtbf_h=mtbf / 3600.0, checkpoint_gb=ckpt_bytes / 1e9,
        checkpoint_write_s=delta, interval_s=tau, interval_rule=rule, restart_s=restart, repair_h=repair / 3600.0,
        lost_per_failure_s=(tau / 2.0 + restart + extra / rate) if rate > 0 else 0.0,
        checkpoint_share=delta / tau if math.isfinite(tau) and tau > 0 else 0.0,
        failure_share=rate * (tau / 2.0 + restart) + extra if math.isfinite(tau) else 0.0,
        spare_hosts_per_domain=min(shape.spares) if shape.spares else 0,
        no_spare_share=none_rate / hw_rate if hw_rate > 0 else 0.0, rates=fm.name,
        carried_over=carried_over(fm, gpu_name) if gpu_name else False, assumed=assumed)


def _interval(rule: str | float, delta: float, mtbf: float) -> tuple[float, str]:
    if isinstance(rule, (int, float)) or str(rule).replace(".", "", 1).isdigit():
        minutes = float(rule)
        if minutes <= 0:
            raise InputError(f"--checkpoint-interval {rule}: give young, daly or a positive number of minutes")
        return minutes * 60.0, "fixed"
    if rule not in INTERVALS:
        raise InputError(f"--checkpoint-interval {rule!r}: use young, daly or a number of minutes")
    if not math.isfinite(mtbf):
        return math.inf, rule
    return (young_interval(delta, mtbf) if rule == "young" else daly_interval(delta, mtbf)), rule


def plan_goodput(model, cluster, training: Training, tokens_per_s: float, rank_to_gpu,
                 settings: Resilience | None = None) -> Goodput:
    """Goodput of a placed plan on ``cluster`` (the entry point ``plan`` and ``compare`` use)."""
    return goodput(tokens_per_s, job_shape(cluster, rank_to_gpu), checkpoint_bytes(model, training),
                   settings, cluster.gpu_spec.name)
