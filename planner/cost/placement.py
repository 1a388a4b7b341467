"""Where each rank of a parallel layout runs: Megatron's rank groups and the rank -> GPU map.

``rank_groups`` re-implements Megatron Core's ``RankGenerator`` /
``generate_masked_orthogonal_rank_groups`` (megatron-core 0.19.2, ``parallel_state.py``): the
parallel axes are laid out in ``order`` (default ``"tp-cp-ep-dp-pp"``), the leftmost axis has the
smallest stride, and a group of an axis is the set of ranks that differ only in that axis. Two grids
share the ranks: the dense (attention) grid ``tp x cp x dp x pp`` and, for MoE layers, the expert grid
``etp x ep x edp x pp`` (MoE parallel folding; ``edp = world / (etp * ep * pp)``). Axis names
"tp", "cp", "dp", "pp" refer to the dense grid and "etp", "ep", "edp" to the expert grid; combined
names such as "tp-pp" or "etp-ep" give the product groups, as ``RankGenerator.get_ranks`` does.
Verified against megatron-core 0.19.2's own ``megatron/core/parallel_state.py`` ``RankGenerator`` (its
outputs for world 16 with tp 2, ep 4, pp 2, and for DeepSeek-V3 on 256 GPUs, are the expectations of
tests/test_placement.py).

``make_placement`` maps global rank r onto the healthy GPUs of a cluster: it fills
``gpus_per_domain`` GPUs of each NVLink domain in the cluster's canonical order (domain by domain,
node by node, local index ascending), which is what a launcher does when consecutive global ranks are
given consecutive GPUs of a Slurm block / NVL72 rack. Running 64 of the 72 GPUs of each rack keeps an
EP64 group inside one NVLink domain.
"""

from __future__ import annotations

import weakref
from functools import lru_cache

import numpy as np
from pydantic import BaseModel, ConfigDict

from planner.config import ParallelConfig, data_parallel, expert_data_parallel
from planner.errors import InfeasibleError, InputError
from topologies.collectives import fabric_for, shape_of

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
_DENSE_AXES = {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp"}
_EXPERT_AXES = {"etp": "tp", "ep": "ep", "edp": "dp", "pp": "pp"}


class Placement(BaseModel):
    """Rank r of the job runs on healthy GPU ``rank_to_gpu[r]`` (an index into ``cluster.gpus()``)."""

    model_config = ConfigDict(frozen=True)

    world: int
    order: str = DEFAULT_ORDER
    gpus_per_domain: int | None = None
    rank_to_gpu: tuple[int, ...]


def _prefix_product(a, init=1):
    out = [init]
    for v in a:
        init *= v
        out.append(init)
    return out


def _offsets(index: np.ndarray, axes: list[tuple[int, int]]) -> np.ndarray:
    """Rank offsets of ``index`` decomposed over ``axes`` ((size, stride) pairs, first axis fastest)."""
    out = np.zeros(len(index), dtype=np.int64)
    for size, stride in axes:
        out += (index % size) * stride
        index = index // size
    return out


def masked_orthogonal_groups(world: int, sizes: list[int], mask: list[bool]) -> list[list[int]]:
    """Megatron's ``generate_masked_orthogonal_rank_groups``: the groups spanned by the masked axes
    (group g's base from g decomposed over the unmasked axes, member r's offset from r over the masked
    ones, both first axis fastest, as Megatron's ``decompose``)."""
    stride = _prefix_product(sizes)
    masked = [(s, d) for s, d, m in zip(sizes, stride, mask) if m]
    unmasked = [(s, d) for s, d, m in zip(sizes, stride, mask) if not m]
    group_size = _prefix_product([s for s, _ in masked])[-1]
    base = _offsets(np.arange(world // group_size, dtype=np.int64), unmasked)
    offs = _offsets(np.arange(group_size, dtype=np.int64), masked)
    return (base[:, None] + offs[None, :]).tolist()


def _check_order(order: str) -> list[str]:
    tokens = order.split("-")
    if sorted(tokens) != sorted(["tp", "cp", "ep", "dp", "pp"]):
        raise InputError(f"order {order!r}: must be a permutation of tp-cp-ep-dp-pp (Megatron default tp-cp-ep-dp-pp)")
    return tokens


def _grid(tp: int, cp: int, ep: int, etp: int, pp: int, world: int, expert: bool) -> dict:
    """Sizes of the rank-order tokens on the dense grid (tp x cp x dp x pp, ep 1) or the expert grid
    (etp x ep x edp x pp, cp 1)."""
    if expert:
        return {"tp": etp, "cp": 1, "ep": ep, "dp": expert_data_parallel(world, etp, ep, pp), "pp": pp}
    return {"tp": tp, "cp": cp, "ep": 1, "dp": data_parallel(world, tp, cp, pp), "pp": pp}


@lru_cache(maxsize=4096)
def _groups_cached(tp, cp, ep, etp, pp, world, axis, order):
    tokens = _check_order(order)
    parts = axis.split("-")
    if all(p in _DENSE_AXES for p in parts):
        sizes = _grid(tp, cp, ep, etp, pp, world, expert=False)
        names = [_DENSE_AXES[p] for p in parts]
    elif all(p in _EXPERT_AXES for p in parts):
        sizes = _grid(tp, cp, ep, etp, pp, world, expert=True)
        names = [_EXPERT_AXES[p] for p in parts]
    else:
        raise InputError(f"axis {axis!r}: use tp, cp, dp, pp (dense grid) or etp, ep, edp, pp (expert grid)")
    ordered = [sizes[t] for t in tokens]
    if _prefix_product(ordered)[-1] != world:
        raise InputError(f"{'x'.join(map(str, ordered))} ({order}) does not multiply to the world size {world}")
    mask = [t in names for t in tokens]
    return tuple(tuple(g) for g in masked_orthogonal_groups(world, ordered, mask))


def rank_groups(config: ParallelConfig, world: int, axis: str, order: str = DEFAULT_ORDER) -> list[list[int]]:
    """The rank groups of ``axis`` (Megatron ``RankGenerator.get_ranks``) for ``config`` on ``world`` ranks."""
    mp = config.tp * config.cp * config.pp
    eg = config.etp_eff * config.ep * config.pp
    if world % mp or world % eg:
        raise InputError(f"world size {world} is not divisible by tp*cp*pp ({mp}) and etp*ep*pp ({eg})")
    return [list(g) for g in _groups_cached(config.tp, config.cp, config.ep, config.etp_eff, config.pp,
                                            world, axis, order)]


def domain_slots(domain_sizes: list[int], gpus_per_domain: int | None) -> list[tuple[int, int]]:
    """(first GPU index, usable count) per domain when ``gpus_per_domain`` of each are used."""
    out, start = [], 0
    for size in domain_sizes:
        use = size if gpus_per_domain is None else min(size, gpus_per_domain)
        out.append((start, use))
        start += size
    return out


def inner_block(config: ParallelConfig) -> int:
    """Ranks of the innermost axes that should share an NVLink domain: tp*cp (dense) and etp*ep (experts).

    With the default order tp-cp-ep-dp-pp a TP group is ``tp`` consecutive ranks and an EP group spans
    ``tp*cp*ep`` consecutive ranks when etp = tp (``etp*ep`` when etp differs on a folded grid).
    """
    dense = config.tp * config.cp
    expert = config.etp_eff * config.ep
    big, small = max(dense, expert), min(dense, expert)
    return big if big % small == 0 else big * small


def default_gpus_per_domain(domain_sizes: list[int], config: ParallelConfig, world: int) -> int | None:
    """The largest per-domain count that keeps the inner block (tp*cp, etp*ep) whole inside domains.

    Returns None (use every GPU) when that already keeps blocks whole or when nothing smaller works.
    """
    if not domain_sizes:
        return None
    block = inner_block(config)
    dmax = max(domain_sizes)

    def capacity(g):
        return sum(min(s, g) for s in domain_sizes)

    def aligned(g):
        return g % block == 0 or block % g == 0

    if all(aligned(s) for s in domain_sizes) and sum(domain_sizes) >= world:
        return None
    for g in range(dmax, 0, -1):
        if aligned(g) and capacity(g) >= world:
            return None if g >= dmax else g
    return None


def make_placement(cluster, config: ParallelConfig, world: int, gpus_per_domain: int | None = None,
                   order: str = DEFAULT_ORDER) -> Placement:
    """Rank r -> the r-th usable GPU, taking ``gpus_per_domain`` GPUs of each domain in canonical order.

    ``gpus_per_domain`` None uses every healthy GPU of each domain. Raises ``InfeasibleError`` when
    the usable GPUs are fewer than ``world``.
    """
    _check_order(order)
    if gpus_per_domain is not None and gpus_per_domain < 1:
        raise InputError(f"gpus_per_domain={gpus_per_domain}: must be at least 1")
    sizes = list(cluster.domain_sizes())
    slots = domain_slots(sizes, gpus_per_domain)
    usable = sum(n for _, n in slots)
    if usable < world:
        per = "all" if gpus_per_domain is None else str(gpus_per_domain)
        raise InfeasibleError(
            f"placement needs {world} GPUs but cluster {cluster.name!r} offers {usable} "
            f"({per} per NVLink domain over {len(sizes)} domains); use more GPUs or a larger gpus_per_domain")
    r2g = []
    for start, n in slots:
        take = min(n, world - len(r2g))
        r2g.extend(range(start, start + take))
        if len(r2g) == world:
            break
    return Placement(world=world, order=order, gpus_per_domain=gpus_per_domain, rank_to_gpu=tuple(r2g))


AXES = ("tp", "cp", "dp", "pp", "ep", "etp", "edp", "dp-cp")
# "dp-cp" (Megatron's own name for it): the ranks that hold the same dense weights, data parallel times context parallel: Megatron
# reduces dense gradients (and gathers parameters, and shards the optimizer) over this group.


def _worse(a, b):
    """True when GroupShape a is costlier than b: crosses a higher tier, more domains, fewer per domain."""
    return (a.tier, a.domains, -a.per_domain) > (b.tier, b.domains, -b.per_domain)


@lru_cache(maxsize=65536)
def axis_strides(tp: int, cp: int, ep: int, etp: int, pp: int, world: int, axis: str,
                 order: str = DEFAULT_ORDER) -> tuple[tuple[int, int], ...]:
    """The one derivation of the rank-order strides: ``((stride, size), ...)`` of ``axis`` (one of
    ``AXES``) on its grid, a group being ``base + sum_j k_j * stride_j`` for ``k_j < size_j``. A single
    axis has one part; ``dp-cp`` has cp's and dp's, merged into one when they are adjacent in
    ``order`` (the default: stride tp, size cp * dp). ``dp`` and ``edp`` are what is left of ``world``
    (``ParallelConfig.dp_for`` / ``edp_for``). Used by ``group_shapes``, ``rank`` groups of the launch
    shape (``planner.cost.shape``) and the solver's shape tables (``planner.search.program``)."""
    if axis == "dp-cp":
        (s1, n1), (s2, n2) = (axis_strides(tp, cp, ep, etp, pp, world, a, order)[0] for a in ("cp", "dp"))
        return ((s1, n1 * n2),) if s2 == s1 * n1 else ((s1, n1), (s2, n2))
    tokens = _check_order(order)
    if axis in _DENSE_AXES:
        sizes, name = _grid(tp, cp, ep, etp, pp, world, expert=False), _DENSE_AXES[axis]
    elif axis in _EXPERT_AXES:
        sizes, name = _grid(tp, cp, ep, etp, pp, world, expert=True), _EXPERT_AXES[axis]
    else:
        raise InputError(f"axis {axis!r}: use one of {', '.join(AXES)}")
    stride = 1
    for t in tokens:
        if t == name:
            return ((stride, sizes[t]),)
        stride *= sizes[t]
    raise AssertionError(axis)  # pragma: no cover


def axis_parts(config: ParallelConfig, world: int, axis: str, order: str = DEFAULT_ORDER) -> tuple[tuple[int, int], ...]:
    """``axis_strides`` of ``config`` on ``world`` ranks."""
    return axis_strides(config.tp, config.cp, config.ep, config.etp_eff, config.pp, world, axis, order)


def axis_stride_size(config: ParallelConfig, world: int, axis: str, order: str = DEFAULT_ORDER) -> tuple[int, int]:
    """(stride, size) of a single axis on its grid: a group is ``base + k * stride`` for k < size."""
    if axis == "dp-cp":
        raise InputError("axis 'dp-cp' has two strides: use axis_parts")
    return axis_parts(config, world, axis, order)[0]


def group_shapes(cluster, config: ParallelConfig, placement: Placement) -> dict:
    """The worst group (highest tier crossed, most domains, fewest ranks per domain) of every axis.

    Groups are built from the axis stride (the same groups as ``rank_groups``) with numpy; only the
    groups that touch the most NVLink domains are priced with ``topologies.collectives.shape_of``.
    """
    memo = _memo_of(cluster)
    key = ("shapes", config.tp, config.cp, config.ep, config.etp_eff, config.pp, placement.world,
           placement.order, placement.rank_to_gpu)
    hit = memo.get(key)
    if hit is not None:
        return hit
    dom = _domains_of(cluster)
    r2g = np.asarray(placement.rank_to_gpu)
    rdom = dom[r2g]
    world = placement.world
    ranks = np.arange(world)
    out = {}
    for axis in AXES:
        parts = axis_parts(config, world, axis, placement.order)
        base = np.ones(world, dtype=bool)
        offs = np.zeros(1, dtype=np.int64)
        for stride, size in parts:
            base &= (ranks // stride) % size == 0
            offs = (offs[:, None] + np.arange(size)[None, :] * stride).ravel()
        members = ranks[base][:, None] + offs[None, :]
        d = np.sort(rdom[members], axis=1)
        change = np.ones_like(d, dtype=bool)
        change[:, 1:] = d[:, 1:] != d[:, :-1]
        ndom = change.sum(axis=1)
        worst_rows = np.nonzero(ndom == ndom.max())[0]
        seen, worst = set(), None
        for i in worst_rows[:256]:
            sig = tuple(d[i])
            if sig in seen:
                continue
            seen.add(sig)
            shape = shape_of(cluster, [int(g) for g in r2g[members[i]]])
            if worst is None or _worse(shape, worst):
                worst = shape
        out[axis] = worst
    if len(memo) > 2048:
        memo.clear()
    memo[key] = out
    return out


def _domains_of(cluster):
    memo = _memo_of(cluster)
    hit = memo.get("domains")
    if hit is None:
        hit = memo["domains"] = np.array([g.domain for g in cluster.gpus()], dtype=np.int64)
    return hit


# Per-cluster memos. A Cluster is mutable, so not hashable; its Fabric (built once per cluster and
# cached on it, hashed by identity) keys the memo weakly: the entries die with the cluster, keep
# nothing alive, and no later object can find them.
_MEMOS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _memo_of(cluster) -> dict:
    fabric = fabric_for(cluster)
    memo = _MEMOS.get(fabric)
    if memo is None:
        memo = _MEMOS[fabric] = {}
    return memo
