"""Pipeline stage layout: which decoder layers, and the embedding, MTP layers and loss, each of the
``pp * vpp`` (virtual) pipeline stages holds, and Megatron's ``--pipeline-model-parallel-layout``
string for it.

Stage ``v * pp + r`` is pipeline rank ``r``'s ``v``-th model chunk (Megatron flattens its layout
list in that order: layers flow stage 0, 1, ..., pp*vpp-1). The embedding sits on stage 0; the MTP
layers and the loss sit on the last stage (rank pp-1's last chunk, as Megatron requires for MTP).

Balancing (``pipeline_layout``): each decoder layer weighs its forward FLOPs per token
(``flops.layer_costs`` at ``seq_len``, router included), the last stage also carries its MTP
layers and one output head per main model and MTP depth (``flops.logits_flops``); weights are
rounded to 1/20 of the mean decoder layer so that layers within a few per cent count as equal and
the split follows layer counts as NVIDIA's recipes do. The split minimises, in this order:

1. the heaviest stage (the pipeline's critical path);
2. the sum of squared stage costs (every other stage as even as it can be);
3. load on early stages (ties go to lighter early stages: in 1F1B the first rank holds the most
   micro-batches of activations, and it holds the embedding).

For DeepSeek-V3 this reproduces NVIDIA's Megatron-Bridge layouts: PP8 ``Et*8|(t*8|)*6t*5mL``,
PP4 VPP4 ``Et*4|(t*4|)*14tmL`` and PP8 VPP4 ``Et|(tt|)*30mL``.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from functools import lru_cache

from planner.errors import InputError
from planner.model.flops import layer_costs, logits_flops
from planner.model.spec import ModelSpec

_UNITS_PER_LAYER = 20  # weight resolution: 1/20 of the mean decoder layer


@dataclass(frozen=True)
class StageSpec:
    """One (virtual) pipeline stage: decoder layer indices, and whether it holds the embedding,
    the loss (with the output head), and how many MTP layers."""

    layers: tuple[int, ...]
    embedding: bool = False
    loss: bool = False
    mtp: int = 0

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def symbols(self) -> str:
        """The stage in Megatron's layout alphabet, unrolled: e.g. ``Etttt`` or ``tmL``."""
        return ("E" if self.embedding else "") + "t" * len(self.layers) + "m" * self.mtp + ("L" if self.loss else "")


@dataclass(frozen=True)
class PipelineLayout:
    """``stages[v * pp + r]`` is pipeline rank ``r``'s ``v``-th chunk."""

    pp: int
    vpp: int
    stages: tuple[StageSpec, ...]

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def layer_counts(self) -> tuple[int, ...]:
        return tuple(s.num_layers for s in self.stages)

    def stage_index(self, rank: int, chunk: int) -> int:
        return chunk * self.pp + rank

    def for_rank(self, rank: int) -> list[StageSpec]:
        """The chunks pipeline rank ``rank`` holds, in chunk order."""
        if not 0 <= rank < self.pp:
            raise ValueError(f"rank {rank} out of range for pp={self.pp}")
        return [self.stages[v * self.pp + rank] for v in range(self.vpp)]

    def rank_of_layer(self, layer: int) -> int:
        for i, s in enumerate(self.stages):
            if layer in s.layers:
                return i % self.pp
        raise ValueError(f"layer {layer} is on no stage")

    def to_list(self) -> list[list[str]]:
        """Megatron-Bridge's list form: ``[["embedding", "decoder", ...], ..., [..., "mtp", "loss"]]``."""
        names = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
        return [[names[c] for c in s.symbols()] for s in self.stages]

    def megatron_layout(self) -> str:
        """The layout in Megatron's ``--pipeline-model-parallel-layout`` syntax, compressed:
        runs of 3+ decoder layers as ``t*n``, runs of 2+ identical stages as ``(..|)*n``."""
        return compress_layout([s.symbols() for s in self.stages])

    def __str__(self) -> str:
        return self.megatron_layout()


# ----------------------------------------------------------------------------------------------
# Megatron's layout syntax


def _compress_stage(sym: str) -> str:
    def run(m: re.Match) -> str:
        n = len(m.group(0))
        return m.group(0) if n <= 2 else f"t*{n}"

    return re.sub(r"t+", run, sym)


def compress_layout(stage_symbols: list[str]) -> str:
    """Write unrolled stages (``["Etttt", "tttt", ...]``) in Megatron's compact syntax.

    The result stays within what megatron-core's parser unrolls: ``(group)*n`` without nesting,
    then ``x*n`` on single characters."""
    parts = [_compress_stage(s) for s in stage_symbols]
    out: list[str] = []
    i, n = 0, len(parts)
    while i < n:
        j = i
        while j + 1 < n and parts[j + 1] == parts[i]:
            j += 1
        reps = j - i + 1
        if j == n - 1:  # the run ends the layout: its last stage closes without "|"
            reps -= 1
        if reps >= 2:
            out.append(f"({parts[i]}|)*{reps}")
        else:
            out.extend(p + "|" for p in parts[i : i + reps])
        if j == n - 1:
            out.append(parts[j])
        i = j + 1
    return "".join(out)


def parse_layout(text: str) -> list[str]:
    """Unroll a Megatron layout string into one symbol string per stage, the way megatron-core's
    ``PipelineParallelLayerLayout.parse_str_to_list`` does: drop commas, unroll ``(group)*n``,
    then ``x*n``, split on ``|``. Raises InputError on characters outside ``E t m L | ( ) * ,``
    and digits."""
    s = text.replace(",", "").replace(" ", "")
    bad = re.findall(r"[^Etml|()*0-9L]", s)
    if bad:
        raise InputError(f"pipeline layout {text!r}: invalid character {bad[0]!r}; use E, t, m, L, |, (..)*n, x*n")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    if re.search(r"[()*0-9]", s):
        raise InputError(f"pipeline layout {text!r}: unbalanced '(..)*n' or a '*' without a count")
    return s.split("|")


def layout_from_string(text: str, model: ModelSpec, pp: int) -> PipelineLayout:
    """Parse and validate a Megatron layout string against ``model`` with the checks megatron-core
    applies (stages % PP, one E first, one L last, decoder count == num_layers, MTP count ==
    mtp_layers, decoders before MTP, MTP only in a rank's last virtual stage)."""
    stages = parse_layout(text)
    where = f"pipeline layout {text!r}"
    if pp < 1 or len(stages) % pp:
        raise InputError(f"{where}: {len(stages)} stages is not a multiple of pp={pp}")
    vpp = len(stages) // pp
    flat = "".join(stages)
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        raise InputError(f"{where}: the embedding E must appear exactly once, first")
    if flat[-1] != "L" or flat.count("L") != 1:
        raise InputError(f"{where}: the loss L must appear exactly once, last")
    if flat.count("t") != model.num_layers:
        raise InputError(f"{where}: has {flat.count('t')} decoder layers t, the model has {model.num_layers}")
    if flat.count("m") != model.mtp_layers:
        raise InputError(f"{where}: has {flat.count('m')} MTP layers m, the model has {model.mtp_layers}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise InputError(f"{where}: decoder layers must come before the MTP layers")
    for idx, st in enumerate(stages):
        if "m" in st and idx // pp != vpp - 1:
            raise InputError(f"{where}: MTP layers must be in a rank's last virtual stage (stage {idx})")
    out, nxt = [], 0
    for st in stages:
        n = st.count("t")
        out.append(StageSpec(layers=tuple(range(nxt, nxt + n)), embedding="E" in st, loss="L" in st, mtp=st.count("m")))
        nxt += n
    return PipelineLayout(pp=pp, vpp=vpp, stages=tuple(out))


# ----------------------------------------------------------------------------------------------
# Balancing


def _weights(model: ModelSpec, seq_len: int) -> tuple[list[int], int]:
    """Integer weights of the decoder layers and the last stage's extra (MTP layers + heads)."""
    costs = layer_costs(model, seq_len)
    dec = [c.flops_with_router for c in costs if c.kind == "decoder"]
    unit = sum(dec) / len(dec) / _UNITS_PER_LAYER
    w = [max(1, round(c / unit)) for c in dec]
    extra = sum(c.flops_with_router for c in costs if c.kind == "mtp")
    extra += logits_flops(model) * (1 + model.mtp_layers)
    return w, round(extra / unit)


def _even_counts(n: int, stages: int, first: int | None, last: int | None) -> list[int]:
    """Layer counts spread as evenly as possible around the fixed first/last counts."""
    fixed = {0: first, stages - 1: last}
    free = [s for s in range(stages) if fixed.get(s) is None]
    rest = n - sum(v for v in fixed.values() if v is not None)
    if rest < 0 or (not free and rest != 0):
        raise InputError(
            f"pipeline: pp_first={first} and pp_last={last} cannot hold {n} layers on {stages} stages"
        )
    counts = [0] * stages
    for s, v in fixed.items():
        if v is not None:
            counts[s] = v
    q, r = divmod(rest, len(free)) if free else (0, 0)
    for k, s in enumerate(free):
        counts[s] = q + (1 if k >= len(free) - r else 0)
    return counts


def _bounds(counts: list[int]) -> list[tuple[int, int]]:
    out, a = [], 0
    for c in counts:
        out.append((a, a + c))
        a += c
    return out


def _split(w: list[int], stages: int, last_extra: int, first: int | None, last: int | None) -> list[int]:
    """Layer counts per stage: lexicographic (max stage cost, sum of squares, early-light).

    ``w`` and ``last_extra`` are non-negative integers. The smallest achievable heaviest stage
    comes from a binary search over integer limits, each tested by a greedy walk from the last
    stage back (``_completable_starts``). A dynamic program over (stage, layers placed so far)
    then finds the split with the least sum of squared stage costs (ties: more load on later
    stages; then the earliest last-stage start, then the earliest start of the stage before, and
    so on) among those that respect it, visiting only states reachable from stage 0 from which
    the remaining stages can still place every layer. Memoised on the arguments."""
    # integers only (``_weights`` rounds): the keys below are exact integer arithmetic
    w = tuple(map(operator.index, w))
    return list(_split_cached(w, int(stages), operator.index(last_extra), first, last))


def _completable_starts(pre: list, stages: int, extra_last, first, last, limit) -> list[int] | None:
    """``low[s]``: the smallest layer index stage ``s`` may start at such that stages ``s..`` can
    hold the remaining layers with every stage costing at most ``limit`` (``low[stages] = n``);
    None if even the last stage cannot. Stages between the first and the last are free (any count,
    empty included), so the feasible starts of stage ``s >= 1`` are the interval
    ``[low[s], high]`` with ``high = n - last`` (or ``n``); stage 0 must start at 0."""
    n = len(pre) - 1
    low = [0] * (stages + 1)
    low[stages] = n
    if last is not None:
        i = n - last
        if pre[n] - pre[i] + extra_last > limit:
            return None
    else:
        if extra_last > limit:
            return None
        i = n
        floor = pre[n] + extra_last - limit  # stage cost pre[n] - pre[i] + extra <= limit
        while i > 0 and pre[i - 1] >= floor:
            i -= 1
    low[stages - 1] = i
    for s in range(stages - 2, (0 if first is None else 1) - 1, -1):
        floor = pre[i] - limit
        while i > 0 and pre[i - 1] >= floor:
            i -= 1
        low[s] = i
    if first is not None:
        low[0] = 0
    return low


@lru_cache(maxsize=4096)
def _split_cached(w: tuple, stages: int, last_extra: int, first: int | None, last: int | None) -> tuple:
    n = len(w)
    pre = [0]
    for x in w:
        pre.append(pre[-1] + x)
    # validates first/last (InputError) and gives an upper bound: the even split is feasible
    even = _bounds(_even_counts(n, stages, first, last))
    if stages == 1:  # (pipeline_layout never asks: a single stage holds every layer)
        if (last if last is not None else first) not in (None, n):
            raise InputError("no pipeline split satisfies the given first/last stage layer counts")
        return (n,)
    ub = max(pre[j] - pre[i] + (last_extra if st == stages - 1 else 0) for st, (i, j) in enumerate(even))
    high = n - last if last is not None else n  # the latest start of any stage 1 .. stages-1
    bound, low = _min_max_stage_cost(pre, stages, last_extra, first, last, ub, high)
    return _balanced_counts(pre, stages, last_extra, first, last, bound, low, high)


def _min_max_stage_cost(pre, stages, last_extra, first, last, ub, high) -> tuple[int, list[int]]:
    """Phase 1 of the split: the smallest achievable maximum stage cost, and the earliest stage
    starts from which that bound can still be met."""

    def feasible(limit) -> list[int] | None:
        low = _completable_starts(pre, stages, last_extra, first, last, limit)
        if low is None:
            return None
        if first is not None:
            # stage 0 holds [0, first); stage 1 must start inside [low[1], high]
            if not (low[1] <= first <= high) or pre[first] > limit:
                return None
        elif low[0] != 0:
            return None
        return low

    # the smallest integer limit that is feasible (feasibility grows with the limit; the even
    # split's maximum ub is feasible)
    lo_b, bound = 0, ub
    while lo_b < bound:
        mid = (lo_b + bound) // 2
        if feasible(mid) is not None:
            bound = mid
        else:
            lo_b = mid + 1
    low = feasible(bound)
    if low is None:  # pragma: no cover - the even split is always feasible
        raise InputError("no pipeline split satisfies the given first/last stage layer counts")
    return bound, low


def _balanced_counts(pre, stages, last_extra, first, last, bound, low, high) -> tuple:
    """Phase 2 of the split: layers per stage minimising (sum of squares, -sum(stage_index * cost))
    with every stage at most ``bound``."""
    n = len(pre) - 1
    # The pair is one integer, sumsq * W - sum(s * c), with W above any sum(s * c); ties keep the
    # smallest previous boundary (the first i in increasing order).
    W = (stages - 1) * (pre[n] + last_extra) + 1
    # Only states reachable from stage 0 (at most ``top``) and from which the remaining stages can
    # still place every layer (``low`` .. ``high``) are visited.
    key: list = [None] * (n + 1)
    back: list = []
    if first is not None:
        key[first] = pre[first] * pre[first] * W  # stage 0 costs pre[first] (weight 0 * c)
        back.append(None)  # stage 0 starts at 0
        s0, top = 1, first
    else:
        key[0] = 0
        s0, top = 0, 0
    last_s = stages - 1
    for s in range(s0, last_s):
        new = [None] * (n + 1)
        arg = [-1] * (n + 1)
        j_lo = low[s + 1]
        w_s = -s
        new_top = -1
        for i in range(low[s], (top if top < high else high) + 1):
            ki = key[i]
            if ki is None:
                continue
            pi = pre[i]
            j = i if i > j_lo else j_lo
            while j <= high:
                c = pre[j] - pi
                if c > bound:
                    break
                k = ki + c * (c * W + w_s)
                nj = new[j]
                if nj is None or k < nj:
                    new[j] = k
                    arg[j] = i
                j += 1
            if j - 1 > new_top:
                new_top = j - 1
        key, top = new, new_top
        back.append(arg)
    # the last stage ends at n
    arg = [-1] * (n + 1)
    best = None
    i_hi = n - last if last is not None else n
    for i in range(low[last_s], (top if top < i_hi else i_hi) + 1):
        ki = key[i]
        if ki is None:
            continue
        c = pre[n] - pre[i] + last_extra
        if c > bound:
            continue
        k = ki + c * (c * W - last_s)
        if best is None or k < best:
            best, arg[n] = k, i
    back.append(arg)
    counts = []
    j = n
    for s in range(stages - 1, s0 - 1, -1):
        i = back[s][j]
        counts.append(j - i)
        j = i
    if first is not None:
        counts.append(first)
    return tuple(counts[::-1])


@lru_cache(maxsize=4096)
def _cached_layout(model: ModelSpec, pp: int, vpp: int, pp_first, pp_last, seq_len: int) -> PipelineLayout:
    S = pp * vpp
    L = model.num_layers
    where = f"pipeline pp={pp} vpp={vpp}"
    for nm, v in (("pp_first", pp_first), ("pp_last", pp_last)):
        if v is not None and not 0 <= v <= L:
            raise InputError(f"{where}: {nm}={v} must be between 0 and num_layers={L}")
    if S == 1:
        for nm, v in (("pp_first", pp_first), ("pp_last", pp_last)):
            if v is not None and v != L:
                raise InputError(f"{where}: {nm}={v} but a single stage holds all {L} layers; drop {nm}")
        counts = [L]
    else:
        if pp_first is not None and pp_last is not None and pp_first + pp_last > L:
            raise InputError(f"{where}: pp_first + pp_last = {pp_first + pp_last} exceeds num_layers={L}")
        w, extra = _weights(model, seq_len)
        counts = _split(w, S, extra, pp_first, pp_last)
    stages, nxt = [], 0
    for s, c in enumerate(counts):
        stages.append(
            StageSpec(
                layers=tuple(range(nxt, nxt + c)),
                embedding=s == 0,
                loss=s == S - 1,
                mtp=model.mtp_layers if s == S - 1 else 0,
            )
        )
        nxt += c
    return PipelineLayout(pp=pp, vpp=vpp, stages=tuple(stages))


def pipeline_layout(
    model: ModelSpec,
    pp: int,
    vpp: int = 1,
    pp_first: int | None = None,
    pp_last: int | None = None,
    seq_len: int = 4096,
) -> PipelineLayout:
    """Distribute ``model``'s decoder layers over ``pp * vpp`` stages (see the module docstring).

    ``pp_first`` / ``pp_last`` fix the decoder layers of the first stage (rank 0, chunk 0) and the
    last stage (rank pp-1, last chunk); the rest are balanced. ``seq_len`` sets the attention
    share of each layer's weight.
    """
    if pp < 1 or vpp < 1:
        raise InputError(f"pipeline: pp ({pp}) and vpp ({vpp}) must be >= 1")
    if vpp > 1 and pp < 2:
        raise InputError(f"pipeline: vpp={vpp} needs pp >= 2")
    return _cached_layout(model, int(pp), int(vpp), pp_first, pp_last, int(seq_len))
