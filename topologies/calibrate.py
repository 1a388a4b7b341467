r"""Fit a cluster's link figures to nccl-tests and DeepEP runs (``topoplan topology calibrate``).

Each result row becomes an *observation*: which collective, on which group shape (the hosts and GPUs
nccl-tests lists, placed on the cluster file's NVLink domains and tiers), how many bytes, and the
measured time. ``topologies.collectives.Fabric`` prices the same call; the fit moves the figures it
prices with, the ones a ``topologies.cluster.Calibration`` holds:

    nvlink: busbw_gbps (ring), nvls_busbw_gbps, deepep_gbps, base_us, nvls_base_us, pipe_us
    tiers[t]: busbw_gbps (NCCL per GPU), deepep_gbps (RDMA), step_us, pipe_us

to minimise  sum_rows log(t_model / t_measured)^2 + (0.01 log(p / p_before))^2  per parameter
(``scipy.optimize.least_squares``, parameters in log space so they stay positive). Only the figures the
rows constrain are fitted: a parameter whose change moves no row's time (at the start or at the
solution of a first pass) keeps its value and is not written. The small pull towards the figures the
fit started from keeps directions the rows cannot tell apart (say NVLS and ring latency when only
all_reduce ran) where they were.

The latency terms are fitted with the bandwidths, so every row counts, small messages included: the
target (docs/cluster.md, "Calibrating the fabric") is that the fitted Fabric reproduces every
nccl-tests row it was given within 10% (``TARGET``); ``Fit.worst`` names the row furthest off.
DeepEP rows are compared in DeepEP's own accounting (``topologies.measured.deepep_bytes``) and reported;
the target is held on the nccl-tests rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from topologies.cluster import Calibration, Cluster, NVLinkFit, TierFit
from topologies.collectives import NET_EFF_DEEPEP, NET_EFF_NCCL, Fabric, GroupShape, shape_of
from topologies.errors import InputError
from topologies.importers.deepep import DeepEPResult, looks_like_deepep, parse_deepep
from topologies.importers.nccl_tests import NcclRun, bus_factor, looks_like_nccl_tests, parse_nccl_tests
from topologies.measured import ELEMENT_BYTES, deepep_bytes

__all__ = ["Observation", "Fit", "observations", "fit_fabric", "read_results", "TARGET", "PRIOR"]

TARGET = 0.10      # every nccl-tests row within 10% after the fit
PRIOR = 0.01       # weight of the pull towards the starting figures (log space)


@dataclass(frozen=True)
class Observation:
    source: str                 # "file:line"
    kind: str                   # all_reduce, all_gather, reduce_scatter, all_to_all, p2p, deepep-dispatch, ...
    shape: GroupShape
    size: int                   # bytes as the benchmark counts them
    seconds: float              # measured time (DeepEP: counted bytes / its bandwidth)
    factor: float               # GB/s shown = size * factor / seconds / 1e9 (busbw; DeepEP: its bandwidth)
    nccl: bool                  # an nccl-tests row (held to TARGET)
    links: tuple[float, float] = (0.0, 0.0)   # DeepEP: bytes over NVLink and through the NIC

    def gbps(self, seconds: float) -> float:
        return self.size * self.factor / seconds / 1e9

    @property
    def label(self) -> str:
        s = self.shape
        where = f"{s.size} GPUs" + (f" on {s.domains} domains" if s.domains > 1 else "")
        return f"{self.kind} {where}"


def predict(fab: Fabric, ob: Observation) -> float:
    """Seconds the Fabric gives for an observation."""
    if ob.kind.startswith("deepep"):
        return fab.ep_dispatch(ob.shape, ob.links[0], ob.links[1], impl="deepep")
    if ob.kind == "p2p":
        return fab.p2p(ob.size, ob.shape.tier if ob.shape.domains > 1 else -1)
    return fab.time(ob.kind, ob.shape, ob.size)


# ---- reading -------------------------------------------------------------------------------------

def read_results(spec: str) -> tuple[str, list[NcclRun] | list[DeepEPResult], int | None]:
    """``PATH`` or ``PATH@RANKS`` -> (path, parsed runs, ranks). Which program wrote the file is read
    from its content."""
    path, ranks = spec, None
    head, sep, tail = spec.rpartition("@")
    if sep and tail.isdigit() and not Path(spec).exists():
        path, ranks = head, int(tail)
        if ranks < 1:
            raise InputError(f"{spec}: @{tail}: the number of ranks must be positive")
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc}); RESULTS are nccl-tests or DeepEP "
                         "output files (PATH, or PATH@RANKS for DeepEP)") from None
    if looks_like_deepep(text):
        return path, parse_deepep(text, path), ranks
    if looks_like_nccl_tests(text):
        if ranks is not None:
            raise InputError(f"{spec}: @RANKS is for DeepEP logs; nccl-tests lists its ranks itself")
        return path, parse_nccl_tests(text, path), None
    raise InputError(f"{path}:1: neither nccl-tests output ('#  Rank ... on HOST device D' and the size/time/"
                     "algbw/busbw table) nor a DeepEP test log ('[tuning] Best dispatch ...')")


def _place_ranks(cluster: Cluster, run: NcclRun, notes: list[str]) -> list[int]:
    """Cluster GPU indices of a run's ranks: by host name and device, or, when no host of the run is
    in the cluster file, the run's hosts in order onto the file's first hosts."""
    where = f"{run.path}:{run.line}"
    index = {(g.node, g.local): g.index for g in cluster.gpus()}
    nodes = [n.name for n in cluster.nodes if cluster.node_healthy_gpus(n.name)]
    hosts = run.hosts
    known = [h for h in hosts if h in set(cluster.hosts())]
    if known and len(known) < len(hosts):
        missing = next(h for h in hosts if h not in set(cluster.hosts()))
        raise InputError(f"{where}: host {missing!r} ran but is not a node of {cluster.name}; give the cluster "
                         "file of the hosts that ran")
    if not known:
        if len(hosts) > len(nodes):
            raise InputError(f"{where}: {len(hosts)} hosts ran, {cluster.name} has {len(nodes)}; give a cluster "
                             "with at least as many hosts")
        mapping = dict(zip(hosts, nodes))
        notes.append(f"{run.path}: hosts {', '.join(hosts)} are not in {cluster.name}; placed on its first hosts "
                     f"({', '.join(nodes[:len(hosts)])}) in that order")
    else:
        mapping = {h: h for h in hosts}
    out = []
    for rank, host, dev, _ in sorted(run.ranks):
        key = (mapping[host], dev)
        if key not in index:
            raise InputError(f"{where}: rank {rank} ran on {host} device {dev}, which {cluster.name} does not "
                             f"list as a healthy GPU of {mapping[host]}")
        out.append(index[key])
    spec = cluster.gpu_spec
    names = {name for _, _, _, name in run.ranks if name}
    for name in names:
        if spec.name.lower() not in name.lower().replace(" ", ""):
            notes.append(f"{run.path}: ran on {name!r}; the cluster file says {spec.display}")
    return out


def observations(cluster: Cluster, specs: list[str]) -> tuple[list[Observation], list[str]]:
    """Every usable result row of the files, and notes on what was assumed or skipped."""
    obs: list[Observation] = []
    notes: list[str] = []
    for spec in specs:
        path, runs, ranks = read_results(spec)
        if runs and isinstance(runs[0], NcclRun):
            for run in runs:
                idx = _place_ranks(cluster, run, notes)
                shape = shape_of(cluster, idx)
                n = len(idx)
                for row in run.rows:
                    if row.wrong:
                        notes.append(f"{path}:{row.line}: {row.wrong:g} wrong elements; row skipped")
                        continue
                    if row.size <= 0 or row.time_us <= 0:
                        continue
                    obs.append(Observation(f"{path}:{row.line}", run.kind, shape, row.size, row.time_us * 1e-6,
                                           bus_factor(run.test, n), True))
        else:
            obs.extend(_deepep_observations(cluster, path, runs, ranks, notes))
    if not obs:
        raise InputError(f"{', '.join(specs)}: no usable result rows")
    return obs, notes


def _deepep_observations(cluster: Cluster, path: str, results: list[DeepEPResult], ranks: int | None,
                         notes: list[str]) -> list[Observation]:
    internode = any(r.internode for r in results)
    if ranks is None:
        if internode:
            raise InputError(f"{path}: DeepEP's internode test does not print how many ranks ran; give "
                             f"{path}@RANKS (8 per node, e.g. {path}@32 for 4 nodes)")
        ranks = 8   # test_intranode.py --num-processes default
        notes.append(f"{path}: 8 ranks assumed (test_intranode.py's default; give {path}@RANKS otherwise)")
    if ranks > cluster.num_gpus:
        raise InputError(f"{path}@{ranks}: {cluster.name} has {cluster.num_gpus} GPUs")
    if internode and ranks % 8:
        raise InputError(f"{path}@{ranks}: DeepEP's internode test runs 8 ranks per node; give a multiple of 8")
    shape = shape_of(cluster, range(ranks))
    out = []
    for r in results:
        if r.internode:
            domains, metric, measured = [8] * (ranks // 8), "rdma", r.rdma_gbps
        else:
            domains, metric, measured = [ranks], "nvlink", r.nvl_gbps
        if not measured:
            continue
        row = {"topk": r.topk, "hidden": r.hidden, "tokens": r.tokens, "domains": domains, "metric": metric,
               "version": "v1", "topk_groups": r.topk_groups}
        logical, nvl, net = deepep_bytes(row, r.phase)
        scale = r.element_bytes / ELEMENT_BYTES[r.phase]
        size = logical * scale
        out.append(Observation(f"{path}:{r.line}", f"deepep-{r.phase}-{r.dtype.lower()}", shape, int(size),
                               size / (measured * 1e9), 1.0, False, (nvl * scale, net * scale)))
    return out


# ---- the fit -------------------------------------------------------------------------------------

@dataclass
class Fit:
    calibration: Calibration
    observations: list[Observation]
    before: list[float]                       # seconds, the cluster as given
    after: list[float]                        # seconds, with the fitted figures
    parameters: list[tuple[str, float | None, float]]   # (name, before (None: a new branch), after)
    notes: list[str] = field(default_factory=list)

    def errors(self, which: str = "after") -> list[float]:
        pred = self.after if which == "after" else self.before
        # in GB/s terms: predicted bandwidth / measured bandwidth - 1 = t_measured / t_model - 1
        return [ob.seconds / t - 1.0 for ob, t in zip(self.observations, pred)]

    @property
    def worst(self) -> int | None:
        """Index of the nccl-tests row furthest off after the fit (None: no nccl-tests row)."""
        err = self.errors()
        cand = [i for i, ob in enumerate(self.observations) if ob.nccl]
        return max(cand, key=lambda i: abs(err[i])) if cand else None

    @property
    def worst_error(self) -> float | None:
        i = self.worst
        return None if i is None else self.errors()[i]


def _tier_names(cluster: Cluster) -> list[str]:
    return [t.name for t in cluster.fabric_tiers]


def _parameters(fab: Fabric, cluster: Cluster, obs: list[Observation]) -> list[tuple[str, str, str, float, float]]:
    """(group, field, display name, starting value, upper bound) of every figure the fit may move
    (lower bound: start / 100; upper: start x 100 unless given)."""
    p = fab._p
    big = float("inf")

    def ll(level: int, busbw_gbps: float, group: str):
        """The low-latency branch of a level: starts at 0.8 x the level's fastest nccl-tests row and a
        tenth of the main bandwidth, and stays below the main bandwidth."""
        rows = [ob.seconds for ob in obs if ob.nccl and (ob.shape.tier if ob.shape.domains > 1 else -1) == level]
        if not rows:
            return []
        have = fab._ll.get(level)
        base, bw = (have[0] * 1e6, have[1] / 1e9) if have else (0.8 * min(rows) * 1e6, 0.1 * busbw_gbps)
        # the line from the smallest row to the largest one that takes at most 3x as long: far enough
        # apart that a few % of noise does not tilt it, close enough to stay on the small-message line
        pts = sorted((ob.size * ob.factor, ob.seconds) for ob in obs
                     if ob.nccl and (ob.shape.tier if ob.shape.domains > 1 else -1) == level)
        near = [q for q in pts if q[1] <= 3.0 * pts[0][1]]
        a, b = pts[0], near[-1]
        if not have and b[1] > a[1] and b[0] > a[0]:
            slope = (b[0] - a[0]) / (b[1] - a[1]) / 1e9   # GB/s
            if slope < 0.9 * busbw_gbps:
                bw = slope
                base = max(a[1] - a[0] / (slope * 1e9), 0.1 * a[1]) * 1e6
        return [(group, "ll_base_us", f"{group}.ll_base_us", base, big),
                (group, "ll_busbw_gbps", f"{group}.ll_busbw_gbps", bw, 0.9 * busbw_gbps)]

    out = [("nvlink", "busbw_gbps", "nvlink.busbw_gbps", fab.b_ring / 1e9, big),
           ("nvlink", "deepep_gbps", "nvlink.deepep_gbps", fab.b_deepep_nvl / 1e9, big),
           ("nvlink", "base_us", "nvlink.base_us", p["nvl_base_us"] * 1e6, big),
           ("nvlink", "pipe_us", "nvlink.pipe_us", p["pipe_nvl_us"] * 1e6, big)]
    if fab.b_nvls:
        out += [("nvlink", "nvls_busbw_gbps", "nvlink.nvls_busbw_gbps", fab.b_nvls / 1e9, big),
                ("nvlink", "nvls_base_us", "nvlink.nvls_base_us", p["nvls_base_us"] * 1e6, big)]
    out += ll(-1, fab.b_ring / 1e9, "nvlink")
    names = _tier_names(cluster)
    for t in sorted({ob.shape.tier for ob in obs if ob.shape.domains > 1}):
        t = min(max(t, 0), len(names) - 1)
        name = names[t]
        out += [(name, "busbw_gbps", f"{name}.busbw_gbps", fab.net_bw(t, NET_EFF_NCCL) / 1e9, big),
                (name, "deepep_gbps", f"{name}.deepep_gbps", fab.net_bw(t, NET_EFF_DEEPEP) / 1e9, big),
                (name, "step_us", f"{name}.step_us", fab._step(t) * 1e6, big),
                (name, "pipe_us", f"{name}.pipe_us", fab._pipe_net(t) * 1e6, big)]
        out += ll(t, fab.net_bw(t, NET_EFF_NCCL) / 1e9, name)
    return out


def _calibration(params, values, base: Calibration | None) -> Calibration:
    """A Calibration with ``values`` for ``params`` over the figures of ``base``."""
    nv = dict(base.nvlink.model_dump(exclude_none=True)) if base and base.nvlink else {}
    tiers = {t.tier: t.model_dump(exclude_none=True) for t in base.tiers} if base else {}
    for (group, fld, *_), v in zip(params, values):
        if group == "nvlink":
            nv[fld] = float(v)
        else:
            tiers.setdefault(group, {"tier": group})[fld] = float(v)
    return Calibration(nvlink=NVLinkFit(**nv) if nv else None, tiers=[TierFit(**t) for t in tiers.values()],
                       sources=list(base.sources) if base else [])


def _times(cluster: Cluster, cal: Calibration | None, obs: list[Observation]) -> list[float]:
    fab = Fabric(cluster)
    if cal is not None:
        fab.apply_calibration(cal, _tier_names(cluster))
    return [predict(fab, ob) for ob in obs]


def fit_fabric(cluster: Cluster, obs: list[Observation], notes: list[str] | None = None,
               sources: list[str] | None = None) -> Fit:
    """Fit the cluster's link figures to the observations (see the module docstring)."""
    from scipy.optimize import least_squares

    base = cluster.calibration
    fab0 = Fabric(cluster)
    params = _parameters(fab0, cluster, obs)
    x0 = np.log([max(v, 1e-9) for _, _, _, v, _ in params])
    lo = x0 - math.log(100.0)
    hi = np.minimum(x0 + math.log(100.0), np.log([h for *_, h in params]))
    x0 = np.minimum(x0, hi - 1e-6)
    meas = np.log([ob.seconds for ob in obs])
    allidx = np.arange(len(params))

    def times(x_full):
        return np.log(_times(cluster, _calibration(params, np.exp(x_full), base), obs))

    def solve(start, rows, family):
        """Least squares on ``rows`` over the parameters of ``family`` (a mask) that move them, from
        ``start``; a second pass takes in the figures that only matter at the first solution (a
        low-latency branch that starts out slower than the main line)."""
        x_full = start.copy()

        def residuals(x, active):
            xf = x_full.copy()
            xf[active] = x
            return np.concatenate([(times(xf) - meas)[rows], PRIOR * (x - x0[active])])

        def sensitive() -> np.ndarray:
            """Parameters of the family whose change (x1.5) moves one of the rows."""
            r0 = times(x_full)[rows]
            keep = []
            for i in allidx[family]:
                x = x_full.copy()
                x[i] += math.log(1.5)
                if np.max(np.abs(times(x)[rows] - r0)) > 1e-9:
                    keep.append(i)
            return np.array(keep, dtype=int)

        active = sensitive()
        for _ in range(3):
            if active.size == 0:
                break
            sol = least_squares(residuals, x_full[active], args=(active,), method="trf", x_scale=1.0,
                                bounds=(lo[active], hi[active]))
            x_full[active] = sol.x
            more = sensitive()
            if set(more.tolist()) <= set(active.tolist()):
                break
            active = np.union1d(active, more)
        r = (times(x_full) - meas)[rows]
        worst = float(np.max(np.abs(np.expm1(-r))))
        return worst, float(np.sum(r ** 2)), x_full, active

    # nccl-tests rows fit the NCCL figures; then DeepEP rows fit the DeepEP bandwidths with those fixed
    # (a DeepEP row must not move NCCL's latencies). For the nccl-tests rows, several starts: the
    # main line's latencies as they are and 4x, 16x, 64x larger (fabrics whose large-message latency
    # is far above the catalog's are common: EFA, RoCE); the best by the worst row
    nccl = np.array([ob.nccl for ob in obs])
    is_deepep = np.array([params[i][1] == "deepep_gbps" for i in allidx])
    latency = np.array([params[i][1] in ("base_us", "nvls_base_us", "step_us") for i in allidx])
    x_full, active = x0.copy(), np.array([], dtype=int)
    if nccl.any():
        best = None
        for m in (1.0, 4.0, 16.0, 64.0):
            start = np.minimum(x0 + latency * math.log(m), hi - 1e-6)
            cand = solve(start, nccl, ~is_deepep)
            if best is None or cand[:2] < best[:2]:
                best = cand
            if best[0] <= TARGET / 2:
                break
        _, _, x_full, active = best
    if (~nccl).any():
        _, _, x_full, more = solve(x_full, ~nccl, is_deepep)
        active = np.union1d(active, more).astype(int)
    fitted = [params[i] for i in active]
    cal = _calibration(fitted, [float(f"{math.exp(x_full[i]):.4g}") for i in active], base)
    src = list(dict.fromkeys([*(base.sources if base else []), *(sources or [])]))
    before = _times(cluster, None, obs)
    after = _times(cluster, cal, obs)
    had = {(t.tier, k) for t in (base.tiers if base else []) for k, v in t.model_dump().items() if v is not None}
    nv_had = base.nvlink.model_dump().items() if base and base.nvlink else []
    had |= {("nvlink", k) for k, v in nv_had if v is not None}
    rows = []
    for i in active:
        group, fld, name, start, _ = params[i]
        new_branch = fld.startswith("ll_") and (group, fld) not in had
        rows.append((name, None if new_branch else start, float(f"{math.exp(x_full[i]):.4g}")))
    result = Fit(cal, obs, before, after, rows, list(notes or []))
    cal = cal.model_copy(update={"sources": src, "worst_error": None if result.worst_error is None
                                 else round(result.worst_error, 4)})
    result.calibration = cal
    return result
