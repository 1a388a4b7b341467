r"""Collective costs: an alpha-beta model whose bandwidths come from the cluster graph.

Every collective costs

    t = alpha + x + 2 * sqrt(alpha_p * x)        x = bytes on the bottleneck link / its bandwidth

``x`` is the plain bandwidth term. The last term is the pipeline fill of a chunked collective:
NCCL moves a buffer in chunks through a pipeline whose per-chunk latency is ``alpha_p``; with the
best chunk size a pipelined transfer costs (sqrt(alpha_p) + sqrt(x))^2 - alpha_p. It makes the
achieved bus bandwidth climb slowly with size, as measured (hardware.md s2.2), and keeps t
monotone in the message size and never below x.

Inside one NVLink domain (n ranks, message S bytes as nccl-tests counts it):
    all-reduce       x = 2(n-1)/n * S / B        B = ring busbw, or NVLS busbw (min over the two)
    all-gather, reduce-scatter (S = whole array)   x = (n-1)/n * S / B_ring
    all-to-all (S = bytes one rank sends)          x = (n-1)/n * S / B_a2a
Across k domains with g ranks in the fullest domain (hierarchical, as NCCL runs it):
    all-reduce: intra reduce-scatter + intra all-gather   x_in  = 2(g-1)/g * S / B_nvl
                inter all-reduce of S/g on g NICs at once x_out = 2(k-1)/k * S/g / B_net(tier)
                the phases overlap:                       x = max(x_in, x_out)
    all-gather / reduce-scatter: x_in = (g-1)/g * S / B_ring, x_out = (k-1)/k * S/g / B_net(tier)
    all-to-all: NVLink bytes (g-1)/n * S, network bytes (n-g)/n * S, in parallel
A group that spans domains is never faster than the same ranks inside one domain, and pays at
least one network hop: t_cross = max(t_hierarchical, t_one_domain) + (net step + switch latency).
B_net(tier) = eff * line rate / (product of the oversubscription of the tiers crossed), with
eff = 0.74 (NCCL, measured 4x8 B200 at 400G, hardware.md s2.2) or 0.9 (DeepEP RDMA on the bytes
that leave the node, s2.3). DeepEP over NVLink uses ``deepep_gbps`` (0.78 of the
NVLink rate, measured on H800 and SM100).

alpha (latency floor) follows NCCL's structure (base latency + per-step hardware latency,
hardware.md s2.4): ring steps inside a domain, tree steps (log2 k) across domains plus the switch
latency of the highest tier crossed.

A cluster file's ``calibration`` block (``topoplan topology calibrate``: ``topologies.calibrate`` fits it
to nccl-tests and DeepEP runs) replaces these figures (NVLink ring/NVLS/DeepEP bandwidths and
latencies; per tier the NCCL and DeepEP bandwidths, the step and pipeline latencies) and may add a
low-latency protocol line per level, t = min(t, ll_base + S x busbw factor / ll_busbw) (NCCL's
LL/LL128 below a few MiB); ``Fabric.apply_calibration``. Uncalibrated clusters are priced as above.

``Fabric`` precomputes everything per cluster, so each call is O(1); ``fabric_for`` caches it on
the cluster. ``collective_time`` is the general query for any set of GPU indices.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from topologies.fabrics import fabric_kind

__all__ = [
    "GroupShape", "shape_of", "Fabric", "fabric_for", "collective_time", "distinct_destinations",
    "NET_EFF_NCCL", "NET_EFF_DEEPEP", "PARAMS",
    "nccl_latency_us", "nccl_choice",
]

# Efficiency of the scale-out link for NCCL collectives: busbw x (k-1)/(n-1) = 36.95 GB/s on
# 50 GB/s (400G) per GPU, 4x8 B200 (hardware.md s2.2, s6.2). 800G: assumed the same.
NET_EFF_NCCL = 0.74
# DeepEP internode (RDMA) bandwidth / line rate on the bytes that leave the node: each token crosses
# once to each remote node it reaches (hardware.md s2.3; DeepEP's tables count the rank's own node
# too, topologies.measured.deepep_bytes). The rows that RDMA bounds give 0.88-0.92: V1 H800 EP32
# 58 and EP64 51 GB/s, V2 SM90 EP8x4 61, V2 SM100 EP8x2 90 GB/s at a 50 GB/s line rate.
NET_EFF_DEEPEP = 0.9

# Latency parameters, microseconds. Structure from NCCL's tuning model (hardware.md s2.4); values
# chosen so that the model meets the measured small-message floors of s2.2 (see bench/collectives.py).
PARAMS = {
    "nvl_base_us": 8.4,       # NCCL baseLat Ring/Simple
    "nvl_step_us": 0.47,      # per ring step inside an NVLink domain (NCCL hwLat NVLink, ring LL)
    "nvls_base_us": 20.0,     # NVLS kernel launch + multimem setup (NCCL uses NVLS from ~2 MiB)
    "net_base_us": 14.0,      # newer NCCL baseLat (LL128/Simple)
    "net_step_us": 5.0,       # per network step (hwLat NET ring 2.7-9.6)
    "pipe_nvl_us": 7.0,       # pipeline per-chunk latency, NVLink
    "pipe_net_us": 45.0,      # pipeline per-chunk latency, network
    "a2a_base_us": 10.0,      # all-to-all / DeepEP kernel launch floor
    "a2a_ll_us": 40.0,        # DeepEP low-latency kernels: fixed cost, fitted to the V1 H800 LL table (s2.3)
    "a2a_net_us": 10.0,       # all-to-all that leaves the NVLink domain (per fabric kind: fabrics.yaml)
    "p2p_base_us": 5.0,       # a send/recv pair
}


@dataclass(frozen=True)
class GroupShape:
    size: int        # ranks in the group
    per_domain: int  # most ranks of the group in any one NVLink domain
    domains: int     # NVLink domains the group touches
    tier: int        # highest scale-out tier crossed: -1 none (one domain), 0 leaf/SU, 1 spine, 2 core

    @staticmethod
    def local(size: int) -> "GroupShape":
        """A group inside one NVLink domain."""
        return GroupShape(size=size, per_domain=size, domains=1, tier=-1)


def shape_of(cluster, gpu_indices) -> GroupShape:
    """The shape of a group of GPUs given by their indices in ``cluster.gpus()``."""
    idx = list(gpu_indices)
    if not idx:
        raise ValueError("shape_of: empty group")
    gpus = cluster._gpus
    counts: dict[int, int] = {}
    for i in idx:
        d = gpus[i].domain
        counts[d] = counts.get(d, 0) + 1
    if len(counts) == 1:
        return GroupShape(size=len(idx), per_domain=len(idx), domains=1, tier=-1)
    tiers = cluster.fabric_tiers
    tier = len(tiers) - 1
    for t in range(len(tiers)):
        row = cluster.tier_units(t)
        first = row[idx[0]]
        if all(row[i] == first for i in idx):
            tier = t
            break
    return GroupShape(size=len(idx), per_domain=max(counts.values()), domains=len(counts), tier=tier)


_MEMO_MAX = 1_000_000


@functools.lru_cache(maxsize=4096)
def distinct_destinations(num_experts: int, top_k: int, n_group: int, topk_group: int, unit_experts: int) -> float:
    """Expected number of distinct units a token's ``top_k`` experts lie on, under uniform
    group-limited routing; a unit is a block of ``unit_experts`` consecutive experts (an EP rank
    holds ``E/ep`` of them, an NVLink domain ``per_domain * E/ep``).

    Routing (DeepSeek-V3's node-limited gating, ``n_group``/``topk_group`` in HF configs): the token
    keeps the ``gk = topk_group`` of the ``G = n_group`` groups (``s = E/G`` consecutive experts each)
    with the highest sum of their top-2 affinities, then takes its top-k experts among the
    ``P = gk s`` pooled ones. A group kept for its top-2 holds at least one of the token's experts,
    so the model is: one expert uniformly in each kept group, the other ``k - gk`` uniformly among
    the rest of the pool. A unit meeting groups in ``a_1..a_q`` experts is missed with probability

        sum_{T subset of its q groups} C(G-q, gk-|T|)/C(G, gk) * prod_{i in T}(1 - a_i/s)
                                        * C(P - gk - sum_T a_i, k - gk) / C(P - gk, k - gk)

    and the expected distinct units is the sum over units of one minus that. Without a group limit
    (``topk_group >= n_group``) it is ``sum_u 1 - C(E - |u|, k)/C(E, k)`` (uniform k-subsets), the
    same formula with one group. tests/test_topo_collectives.py checks both against the sampled
    router (``planner.search.experts.sample_routing``).
    """
    E, k = int(num_experts), int(top_k)
    ue = max(1, min(int(unit_experts), E))
    G = max(1, int(n_group))
    gk = max(1, min(int(topk_group), G))
    if E % G or gk >= G:
        G = gk = 1
    size = E // G
    if k > gk * size:          # the router widens the group limit until k experts fit (as sample_routing)
        gk = min(G, -(-k // size))
    if k < gk:                 # fewer experts than kept groups: no group is sure to be used
        G = gk = 1
        size = E
    P = gk * size
    k = min(k, P)
    free, pool = k - gk, P - gk
    c_free = math.comb(pool, free)
    c_groups = math.comb(G, gk)
    total = 0.0
    memo: dict = {}
    for start in range(0, E, ue):
        end = min(E, start + ue)
        parts = tuple(min(end, (g + 1) * size) - max(start, g * size)
                      for g in range(start // size, (end - 1) // size + 1))
        if parts not in memo:
            q = len(parts)
            miss = 0.0
            if q <= 16:
                subsets = ((mask, [parts[i] for i in range(q) if mask >> i & 1]) for mask in range(1 << q))
                for _, chosen in subsets:
                    t = len(chosen)
                    if t > gk or gk - t > G - q:
                        continue
                    forced = math.prod(1.0 - a / size for a in chosen)
                    left = pool - sum(chosen)   # pooled experts outside the unit after the forced picks
                    if forced <= 0.0 or left < free:
                        continue
                    miss += (math.comb(G - q, gk - t) / c_groups * forced
                             * math.comb(left, free) / c_free)
            else:  # a unit spanning many groups covers them whole: any kept group of it is used
                miss = math.comb(G - q, gk) / c_groups
            memo[parts] = 1.0 - miss
        total += memo[parts]
    return total


def _memo(fn):
    """Cache a Fabric method's result per instance (the step-time model repeats the same queries)."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self, *args, **kw):
        key = (name, args, tuple(kw.items())) if kw else (name, args)
        memo = self._memo
        try:
            return memo[key]
        except KeyError:
            pass
        except TypeError:  # unhashable argument: compute without caching
            return fn(self, *args, **kw)
        value = fn(self, *args, **kw)
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[key] = value
        return value

    return wrapper


def _pipe(x: float, alpha_p: float) -> float:
    """Bandwidth term with the optimal-chunk pipeline fill: x + 2 sqrt(alpha_p x)."""
    return x + 2.0 * math.sqrt(alpha_p * x) if x > 0 else 0.0


# NCCL hwLat NVLINK, ring LL (hardware.md s2.4): the latency topologies.graph puts on an NVLink
# edge (``topologies.graph.NVLINK_HOP_US``; a test checks they agree). Kept here so that a Fabric
# is built without importing networkx.
NVLINK_HOP_US = 0.47


def _links_from_cluster(cluster):
    """(NVLink edge figures, tier-0 line rate GB/s, oversubscription and latency (us) per tier):
    what ``build_graph`` puts on a GPU's NVLink edge, its NIC-leaf edge and the uplinks above."""
    spec = cluster.gpu_spec
    tiers = cluster.fabric_tiers
    nvl = dict(capacity=spec.nvlink_gbps_uni, latency_us=NVLINK_HOP_US, ring_busbw=spec.ring_busbw_gbps,
               nvls_busbw=spec.nvls_busbw_gbps or 0.0, deepep_gbps=spec.deepep_nvlink_gbps)
    # every switch below the top tier has one uplink to the tier above, carrying that tier's
    # oversubscription and latency
    over = [1.0] + [t.oversubscription for t in tiers[1:]]
    lat = [t.latency_us for t in tiers]
    return nvl, tiers[0].gbps_per_gpu / 8.0, over, lat


def _links_from_graph(cluster, g):
    """The same figures read from a graph's edges (see ``topologies.graph``)."""
    first = cluster.gpus()[0]
    gnode = ("gpu", first.node, first.local)
    nvl = None
    net = None
    for nb in g.neighbors(gnode):
        e = g.edges[gnode, nb]
        if e["kind"] == "nvlink":
            nvl = e
        elif e["kind"] == "pcie":
            nic = nb
            for leaf in g.neighbors(nic):
                if g.edges[nic, leaf]["kind"] == "net":
                    net = g.edges[nic, leaf]
                    leaf0 = leaf
    assert nvl is not None and net is not None, "graph lacks nvlink / net edges"
    # walk the uplinks from the first leaf to read oversubscription and latency per tier
    tiers = cluster.fabric_tiers
    over = [1.0]
    lat = [net["latency_us"]]
    node = leaf0
    for t in range(1, len(tiers)):
        up = [nb for nb in g.neighbors(node) if g.nodes[nb].get("tier") == t]
        if up:
            e = g.edges[node, up[0]]
            over.append(e["oversubscription"])
            lat.append(e["latency_us"])
            node = up[0]
        else:  # a cluster smaller than one unit of this tier still has the tier's figures
            over.append(tiers[t].oversubscription)
            lat.append(tiers[t].latency_us)
    return nvl, net["capacity"], over, lat


class Fabric:
    """Collective times for one cluster; every method is O(1). Times in seconds, sizes in bytes."""

    def __init__(self, cluster, graph=None):
        """Read the link figures from the cluster: its GPU spec (NVLink) and its tiers (scale-out),
        the figures ``topologies.graph.build_graph`` puts on the edges. With ``graph``, read them
        from that graph's edges instead (the first GPU's NVLink and NIC links, then the uplinks
        above its leaf)."""
        GB = 1e9
        tiers = cluster.fabric_tiers
        if graph is None:
            nvl, net_cap, over, lat = _links_from_cluster(cluster)
        else:
            nvl, net_cap, over, lat = _links_from_graph(cluster, graph)
        self.cluster_name = cluster.name
        self.nvlink_uni = nvl["capacity"] * GB               # B/s, per direction
        self.b_ring = nvl["ring_busbw"] * GB
        self.b_nvls = nvl["nvls_busbw"] * GB if nvl["nvls_busbw"] else None
        self.b_deepep_nvl = nvl["deepep_gbps"] * GB
        self.nvl_hop_us = nvl["latency_us"]
        self.line = net_cap * GB                             # B/s per GPU at tier 0
        line_t = [t.gbps_per_gpu / 8 * GB for t in tiers]
        cum = []
        acc = 1.0
        for t, o in enumerate(over):
            acc *= o
            cum.append(min(line_t[: t + 1]) / acc)
        self.tier_bw = cum                                  # raw per-GPU B/s when crossing tier t
        self.tier_lat_us = lat
        self.tier_oversub = over
        self.domain_sizes = cluster.domain_sizes()
        self.num_tiers = len(tiers)
        # the fabric kind (InfiniBand, RoCE, EFA, TCPXO) replaces the network latency figures
        # (topologies/fabrics.py; InfiniBand's are PARAMS' own)
        self.kind = fabric_kind(getattr(cluster, "fabric", None))
        p = {**PARAMS, **self.kind.latency_us}
        self._p = {k: v * 1e-6 for k, v in p.items()}
        self._memo: dict = {}
        # per tier: fitted NCCL and DeepEP bandwidths (B/s), step and pipeline latencies (s); None = model
        self._fit_net = {NET_EFF_NCCL: [None] * self.num_tiers, NET_EFF_DEEPEP: [None] * self.num_tiers}
        self._fit_step = [None] * self.num_tiers
        self._fit_pipe = [None] * self.num_tiers
        # fitted low-latency protocol branch per level (-1 = inside a domain, t = crossing tier t):
        # (base latency s, bus bandwidth B/s); absent unless calibrated
        self._ll: dict[int, tuple[float, float]] = {}
        if getattr(cluster, "calibration", None) is not None:
            self.apply_calibration(cluster.calibration, [t.name for t in tiers])

    def apply_calibration(self, cal, tier_names) -> None:
        """Use the figures of a ``topologies.cluster.Calibration`` (fitted by ``topologies.calibrate``)
        in place of the catalog figures and model constants; fields left None keep the defaults."""
        GB, us = 1e9, 1e-6
        nv = cal.nvlink
        if nv is not None:
            if nv.busbw_gbps:
                self.b_ring = nv.busbw_gbps * GB
            if nv.nvls_busbw_gbps:
                self.b_nvls = nv.nvls_busbw_gbps * GB
            if nv.deepep_gbps:
                self.b_deepep_nvl = nv.deepep_gbps * GB
            for key, field in (("nvl_base_us", "base_us"), ("nvls_base_us", "nvls_base_us"),
                               ("pipe_nvl_us", "pipe_us")):
                if getattr(nv, field) is not None:
                    self._p[key] = getattr(nv, field) * us
            if nv.ll_base_us is not None and nv.ll_busbw_gbps:
                self._ll[-1] = (nv.ll_base_us * us, nv.ll_busbw_gbps * GB)
        for fit in cal.tiers:
            t = tier_names.index(fit.tier)
            if fit.busbw_gbps:
                self._fit_net[NET_EFF_NCCL][t] = fit.busbw_gbps * GB
            if fit.deepep_gbps:
                self._fit_net[NET_EFF_DEEPEP][t] = fit.deepep_gbps * GB
            if fit.step_us is not None:
                self._fit_step[t] = fit.step_us * us
            if fit.pipe_us is not None:
                self._fit_pipe[t] = fit.pipe_us * us
            if fit.ll_base_us is not None and fit.ll_busbw_gbps:
                self._ll[t] = (fit.ll_base_us * us, fit.ll_busbw_gbps * GB)
        self._memo.clear()

    # ---- helpers --------------------------------------------------------------------------
    def net_bw(self, tier: int, eff: float = NET_EFF_NCCL) -> float:
        """Achievable per-GPU scale-out bandwidth (B/s) for traffic that climbs to ``tier``."""
        t = min(max(tier, 0), self.num_tiers - 1)
        fit = self._fit_net.get(eff)
        if fit is not None and fit[t] is not None:
            return fit[t]
        return eff * self.tier_bw[t]

    def _net_lat(self, tier: int) -> float:
        t = min(max(tier, 0), self.num_tiers - 1)
        return self.tier_lat_us[t] * 1e-6

    def _step(self, tier: int) -> float:
        """Latency of one network step through ``tier``: NCCL's per-step latency plus the switch's,
        or the fitted figure."""
        t = min(max(tier, 0), self.num_tiers - 1)
        fit = self._fit_step[t]
        return fit if fit is not None else self._p["net_step_us"] + self._net_lat(t)

    def _pipe_net(self, tier: int) -> float:
        t = min(max(tier, 0), self.num_tiers - 1)
        fit = self._fit_pipe[t]
        return fit if fit is not None else self._p["pipe_net_us"]

    def _intra_alpha(self, steps: int) -> float:
        p = self._p
        return p["nvl_base_us"] + steps * p["nvl_step_us"]

    def _inter_alpha(self, shape: GroupShape, intra_steps: int, phases: int) -> float:
        p = self._p
        k = shape.domains
        tree = math.ceil(math.log2(k)) if k > 1 else 0
        return (p["net_base_us"] + intra_steps * p["nvl_step_us"]
                + phases * tree * self._step(shape.tier))

    def _low_latency(self, t: float, shape: GroupShape, busbytes: float) -> float:
        """``t``, or the fitted low-latency protocol branch when that is faster: NCCL's tuner takes the
        fastest protocol (LL/LL128 below a few MiB: low latency, a fraction of the bandwidth), which a
        single alpha-beta line cannot follow. ``busbytes`` = size x nccl-tests' busbw factor, so the
        branch is ``base + busbytes / busbw``. Only a calibrated Fabric has it."""
        if not self._ll:
            return t
        level = -1 if shape.domains <= 1 else min(max(shape.tier, 0), self.num_tiers - 1)
        ll = self._ll.get(level)
        return t if ll is None else min(t, ll[0] + busbytes / ll[1])

    # ---- collectives ----------------------------------------------------------------------
    def _hop(self, tier: int) -> float:
        """Latency a group pays at least once for leaving its NVLink domain."""
        return self._step(tier)

    def _ar_local(self, n: int, S: float, nvls: bool = True) -> float:
        p = self._p
        vol = 2.0 * (n - 1) / n * S
        t = self._intra_alpha(2 * (n - 1)) + _pipe(vol / self.b_ring, p["pipe_nvl_us"])
        if nvls and self.b_nvls and n > 2:
            t = min(t, p["nvls_base_us"] + _pipe(vol / self.b_nvls, p["pipe_nvl_us"]))
        return t

    @_memo
    def all_reduce(self, shape: GroupShape, nbytes: float, algo: str = "auto") -> float:
        """All-reduce of an ``nbytes`` buffer per rank (nccl-tests S). ``algo``: "auto" (the faster
        of ring and NVLS, as NCCL's tuner picks) or "ring" (NVLS disabled)."""
        n = shape.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        S = float(nbytes)
        bus = 2.0 * (n - 1) / n * S
        if shape.domains <= 1:
            return self._low_latency(self._ar_local(n, S, nvls=algo != "ring"), shape, bus)
        g, k = shape.per_domain, shape.domains
        b_in = max(self.b_ring, self.b_nvls or 0.0)
        x_in = 2.0 * (g - 1) / g * S / b_in if g > 1 else 0.0
        x_out = 2.0 * (k - 1) / k * (S / g) / self.net_bw(shape.tier)
        t = self._inter_alpha(shape, 2 * (g - 1), 2) + _pipe(max(x_in, x_out), self._pipe_net(shape.tier))
        # never faster than the same ranks inside one domain, plus one network hop
        return self._low_latency(max(t, self._ar_local(n, S)) + self._hop(shape.tier), shape, bus)

    def _gather_local(self, n: int, S: float) -> float:
        return self._intra_alpha(n - 1) + _pipe((n - 1) / n * S / self.b_ring, self._p["pipe_nvl_us"])

    def _gather_like(self, shape: GroupShape, nbytes: float) -> float:
        n = shape.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        S = float(nbytes)
        bus = (n - 1) / n * S
        if shape.domains <= 1:
            return self._low_latency(self._gather_local(n, S), shape, bus)
        g, k = shape.per_domain, shape.domains
        x_in = (g - 1) / g * S / self.b_ring if g > 1 else 0.0
        x_out = (k - 1) / k * (S / g) / self.net_bw(shape.tier)
        t = self._inter_alpha(shape, g - 1, 1) + _pipe(max(x_in, x_out), self._pipe_net(shape.tier))
        return self._low_latency(max(t, self._gather_local(n, S)) + self._hop(shape.tier), shape, bus)

    @_memo
    def all_gather(self, shape: GroupShape, nbytes: float) -> float:
        """All-gather; ``nbytes`` is the full gathered array (nccl-tests S)."""
        return self._gather_like(shape, nbytes)

    @_memo
    def reduce_scatter(self, shape: GroupShape, nbytes: float) -> float:
        """Reduce-scatter; ``nbytes`` is the full input array (nccl-tests S)."""
        return self._gather_like(shape, nbytes)

    def a2a_volumes(self, shape: GroupShape, nbytes: float) -> tuple[float, float]:
        """(bytes over NVLink, bytes over the NIC) that one rank sends in an all-to-all of ``nbytes``
        spread evenly over the group (self chunk included, as nccl-tests counts)."""
        n, g = shape.size, min(shape.per_domain, shape.size)
        S = float(nbytes)
        return S * (g - 1) / n, S * (n - g) / n

    def _a2a_local(self, n: int, S: float, impl: str) -> float:
        p = self._p
        if impl == "nccl":
            return p["a2a_base_us"] + _pipe(S * (n - 1) / n / self.b_ring, p["pipe_nvl_us"])
        base = p["a2a_ll_us"] if impl == "deepep-ll" else p["a2a_base_us"]
        return base + S * (n - 1) / n / self.b_deepep_nvl

    def _a2a_net(self, shape: GroupShape) -> tuple[float, float]:
        """(bandwidth B/s through the NIC, pipeline fill s) of NCCL's all-to-all across domains.

        A fabric kind with its own all-to-all sweep (fabrics.yaml ``a2a_net_eff``, ``a2a_peer_pipe_us``;
        EFA) prices it from that: NCCL runs an all-to-all as one send/recv pair per peer, each its own
        chunked stream through the NIC, so every one of the ``n - g`` remote peers adds its pipeline
        fill, ``alpha_p = (n - g) a2a_peer_pipe_us``, at ``a2a_net_eff`` of the line rate (a calibrated
        tier scales by ``a2a_net_eff / NET_EFF_NCCL``). Other kinds: the all-reduce's figures."""
        a2a = self.kind.a2a
        bw = self.net_bw(shape.tier)
        if "a2a_net_eff" in a2a:
            bw *= a2a["a2a_net_eff"] / NET_EFF_NCCL
        if "a2a_peer_pipe_us" not in a2a:
            return bw, self._pipe_net(shape.tier)
        remote = shape.size - min(shape.per_domain, shape.size)
        return bw, remote * a2a["a2a_peer_pipe_us"] * 1e-6

    @_memo
    def all_to_all(self, shape: GroupShape, nbytes: float, impl: str = "nccl") -> float:
        """All-to-all; ``nbytes`` = bytes one rank sends. ``impl``: "nccl"; "deepep" (DeepEP normal
        dispatch/combine: measured effective bandwidths, no pipeline-fill term since DeepEP's
        figures are already effective bandwidths of its streaming kernels); "deepep-ll" (DeepEP
        low-latency kernels: the same bandwidths plus a fixed ``a2a_ll_us``)."""
        n = shape.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        if impl not in ("nccl", "deepep", "deepep-ll"):
            raise ValueError(f"all_to_all impl {impl!r}: use 'nccl', 'deepep' or 'deepep-ll'")
        S = float(nbytes)
        if shape.domains <= 1:
            t = self._a2a_local(n, S, impl)
            return self._low_latency(t, shape, (n - 1) / n * S) if impl == "nccl" else t
        p = self._p
        v_nvl, v_net = self.a2a_volumes(shape, S)
        if impl != "nccl":
            x = max(v_nvl / self.b_deepep_nvl, v_net / self.net_bw(shape.tier, NET_EFF_DEEPEP))
            t = (p["a2a_ll_us"] if impl == "deepep-ll" else p["a2a_base_us"]) + x
        else:
            bw, pipe = self._a2a_net(shape)
            t = p["a2a_net_us"] + _pipe(max(v_nvl / self.b_ring, v_net / bw), pipe)
        t = max(t, self._a2a_local(n, S, impl)) + self._hop(shape.tier)
        return self._low_latency(t, shape, (n - 1) / n * S) if impl == "nccl" else t

    @_memo
    def ep_dispatch(self, shape: GroupShape, nvl_bytes: float, net_bytes: float, impl: str = "deepep") -> float:
        """One expert dispatch or combine whose bytes are already split by the link they take: a
        rank sends ``nvl_bytes`` over NVLink and ``net_bytes`` through its NIC, both streams at once
        (DeepEP's normal kernels and HybridEP: a token crosses to each remote NVLink domain once
        over RDMA and is forwarded over NVLink inside it; ``topologies`` does not know the routing,
        ``planner.cost.terms.expert_a2a`` counts the bytes). ``impl``: "deepep" (normal kernels) or
        "deepep-ll" (low-latency kernels: fixed ``a2a_ll_us``)."""
        if impl not in ("deepep", "deepep-ll"):
            raise ValueError(f"ep_dispatch impl {impl!r}: use 'deepep' or 'deepep-ll'")
        if shape.size <= 1 or (nvl_bytes <= 0 and net_bytes <= 0):
            return 0.0
        p = self._p
        base = p["a2a_ll_us"] if impl == "deepep-ll" else p["a2a_base_us"]
        x = max(nvl_bytes, 0.0) / self.b_deepep_nvl
        if shape.domains > 1 and net_bytes > 0:
            x = max(x, net_bytes / self.net_bw(shape.tier, NET_EFF_DEEPEP))
            return base + x + self._hop(shape.tier)
        return base + x

    @_memo
    def p2p(self, nbytes: float, tier: int) -> float:
        """One send/recv of ``nbytes`` between two GPUs; ``tier`` -1 = inside an NVLink domain."""
        if nbytes <= 0:
            return 0.0
        p = self._p
        if tier < 0:
            t = p["p2p_base_us"] + self.nvl_hop_us * 1e-6 + _pipe(nbytes / self.b_ring, p["pipe_nvl_us"])
            return self._low_latency(t, GroupShape.local(2), nbytes)
        t = p["p2p_base_us"] + self._step(tier) + _pipe(nbytes / self.net_bw(tier), self._pipe_net(tier))
        return self._low_latency(t, GroupShape(size=2, per_domain=1, domains=2, tier=tier), nbytes)

    def nccl_latency(self, coll: str, shape: GroupShape, small: bool = False) -> float:
        """Seconds of NCCL latency for one latency-bound ``coll`` over ``shape`` on this fabric
        (``nccl_choice``): NCCL's own constants, each network step longer by what this fabric kind's
        step latency exceeds InfiniBand's (EFA, TCPXO: fabrics.yaml ``net_step_us``). ``small``: a message
        of a few KiB, which NCCL runs in its least-latency protocol (LL) rather than Simple."""
        extra = max(0.0, self.kind.latency_us.get("net_step_us", PARAMS["net_step_us"]) - PARAMS["net_step_us"])
        return nccl_choice(coll, shape, net_extra_us=extra, protos=NCCL_PROTOCOLS if small else ("simple",))[1]

    # ---- by name --------------------------------------------------------------------------
    def time(self, kind: str, shape: GroupShape, nbytes: float, **kw) -> float:
        kinds = {
            "all_reduce": self.all_reduce, "all_gather": self.all_gather,
            "reduce_scatter": self.reduce_scatter, "all_to_all": self.all_to_all,
        }
        key = kind.replace("-", "_").lower()
        if key == "p2p":
            return self.p2p(nbytes, shape.tier)
        if key not in kinds:
            raise ValueError(f"unknown collective {kind!r}; use {', '.join(kinds)} or p2p")
        return kinds[key](shape, nbytes, **kw)


def fabric_for(cluster) -> Fabric:
    """The Fabric of a cluster, built once and cached on the cluster object."""
    fab = cluster._fabric
    if fab is None:
        fab = Fabric(cluster)
        cluster._fabric = fab
    return fab


def collective_time(cluster, kind: str, gpu_indices, nbytes: float, **kw) -> float:
    """Seconds for collective ``kind`` (all_reduce, all_gather, reduce_scatter, all_to_all, p2p)
    among the GPUs ``gpu_indices`` (indices into ``cluster.gpus()``) with message ``nbytes``."""
    idx = list(gpu_indices)
    shape = shape_of(cluster, idx)
    return fabric_for(cluster).time(kind, shape, nbytes, **kw)


# ---- NCCL's algorithm latencies (its tuning model) -------------------------------------------------
# NCCL prices each (collective, algorithm, protocol) as latency + bytes / bandwidth and runs the fastest
# (src/graph/tuning.cc, ncclTopoTuneModel; constants ncclTunerConstantsDefaults, NVIDIA/nccl@5067397).
# Base latencies (us) per algorithm and protocol (LL, LL128, Simple):
NCCL_BASE_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "collnet": (0.0, 0.0, 0.0),
                "nvls": (0.0, 0.0, 0.0), "pat": (8.0, 8.0, 8.0)}
# Hardware latency (us) per step, inside a node (NVLink) and across nodes (NET):
NCCL_HW_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "collnet": (0.0, 0.0, 3.7),
               "nvls": (0.0, 0.0, 25.0), "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "collnet": (0.0, 0.0, 31.0),
            "nvls": (0.0, 0.0, 18.0), "pat": (0.0, 0.0, 14.0)},
}
NCCL_PROTOCOLS = ("ll", "ll128", "simple")
# getNetOverhead: 1 us per inter-node ring step on x86 Intel and Arm hosts (2 on AMD), x3 for Simple
NCCL_NET_OVERHEAD_US = 1.0


def _log2i(n: int) -> int:
    return max(int(n), 1).bit_length() - 1


def nccl_latency_us(coll: str, algo: str, ranks: int, nodes: int, proto: str = "simple",
                    net_extra_us: float = 0.0) -> float | None:
    """NCCL's latency (us) of one ``coll`` ("all_reduce", "reduce_scatter", "all_gather") by ``algo``
    ("ring", "tree", "collnet", "nvls", "pat") over ``ranks`` ranks on ``nodes`` nodes, as its tuning
    model prices it (None where NCCL does not run that algorithm for that collective)::

        ring       base + (steps - inter) * max(hw_intra, net overhead) + inter * hw_net
                   steps = 2(n-1) all-reduce, n-1 otherwise; inter = 2(nodes-1) resp. nodes-1
        tree       all-reduce only: base + 2 ((n/nodes - 1) hw_intra + log2(nodes) hw_net)
        collnet    all-reduce only (SHARP in the switch): 2 min(1, ppn-1) hw_intra + 0.8 (ppn-1) + hw_net
        nvls       all-reduce: hw_intra (+ hw_net across nodes)
        pat        all-gather / reduce-scatter with one rank per node: base + log2(nodes) hw_net/3.5 + 2.8 n

    Ring latency grows linearly with the ranks, tree's and PAT's (nearly) with their logarithm: what makes
    a bandwidth-sized bucket latency-bound on thousands of GPUs. With one rank per node NCCL prices the
    network step with the tree's NET latency (it is fully exposed). ``net_extra_us``: what the transport
    adds to every network step beyond the InfiniBand NCCL's constants assume (``Fabric.nccl_latency``:
    the fabric kind's step latency over InfiniBand's, topologies/fabrics.py)."""
    p = NCCL_PROTOCOLS.index(proto)
    n, k = max(int(ranks), 1), max(int(nodes), 1)
    ppn = max(n // k, 1)
    if n <= 1:
        return 0.0
    intra = NCCL_HW_US["nvlink"][algo][p]
    inter = NCCL_HW_US["net"]["tree" if ppn == 1 else algo][p] + net_extra_us
    base = NCCL_BASE_US[algo][p]
    if algo == "ring":
        steps = 2 * (n - 1) if coll == "all_reduce" else n - 1
        hops = 0 if k == 1 else (2 * (k - 1) if coll == "all_reduce" else k - 1)
        if k > 1:
            intra = max(intra, NCCL_NET_OVERHEAD_US * (3 if proto == "simple" else 1))
        return base + (steps - hops) * intra + hops * inter
    if algo == "tree":
        return base + 2 * ((ppn - 1) * intra + _log2i(k) * inter) if coll == "all_reduce" else None
    if algo == "collnet":
        return base + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter if coll == "all_reduce" else None
    if algo == "nvls":
        return intra + (inter if k > 1 else 0.0) if coll == "all_reduce" else None
    if algo == "pat":
        if coll == "all_reduce" or ppn != 1:
            return None
        return base + _log2i(k) * (inter / 3.5) + n * 2.8
    raise ValueError(f"unknown NCCL algorithm {algo!r}")


def nccl_choice(coll: str, shape: GroupShape, *, nvls: bool = False, collnet: bool = False,
                pat: bool = True, net_extra_us: float = 0.0, protos: tuple[str, ...] = ("simple",)) -> tuple[str, float]:
    """(algorithm, latency in seconds) NCCL takes for a latency-bound ``coll`` over the group ``shape``:
    the least latency among the algorithms it may run there (ring always; tree for all-reduce; NVLS where
    the NVLink domain has NVLink SHARP, ``nvls``; CollNet where the switches run SHARP, ``collnet``; PAT
    for all-gather / reduce-scatter with one rank per node, NCCL >= 2.23, ``pat``). An NVLink domain
    counts as NCCL's node, and the group spans ``ceil(size / per_domain)`` of them: the even split of
    its ranks (a worst group of an uneven placement may touch one more domain at its edges; the latency
    follows the ring's length, and the solver's shape tables and ``predict``'s shapes agree on it).
    ``protos``: the protocols it may run; a bandwidth-sized message runs Simple, a message of a few KiB
    whichever protocol has the least latency (NCCL's tuner adds size / bandwidth, negligible there: LL)."""
    if shape.size <= 1:
        return "none", 0.0
    nodes = -(-shape.size // max(shape.per_domain, 1))
    algos = ["ring", "tree"] + (["nvls"] if nvls else []) + (["collnet"] if collnet else []) + (["pat"] if pat else [])
    best = None
    for a in algos:
        for proto in protos:
            if NCCL_HW_US["nvlink"][a][NCCL_PROTOCOLS.index(proto)] == 0.0 and proto != "simple":
                continue   # the algorithm has no such protocol (a 0 in NCCL's hwLat table)
            lat = nccl_latency_us(coll, a, shape.size, nodes, proto=proto, net_extra_us=net_extra_us)
            if lat is not None and (best is None or lat < best[1]):
                best = (a, lat)
    return best[0], best[1] * 1e-6
