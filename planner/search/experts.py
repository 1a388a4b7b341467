"""Expert loads, the routing model and the placement metrics; ``ExpertBalance`` for the step-time model.

Vocabulary (DeepSeek EPLB's): a placement of one MoE layer is ``physical_to_logical[slots]``; slot
``s`` lives on EP rank ``s // slots_per_gpu``; ``logical_to_physical[experts, max_count]`` (padded
with -1) and ``logical_count[experts]`` are derived from it. ``rank_domain[ep]`` is the NVLink domain
of each EP rank, from the topology.

**Routing model** (what a token does). Tokens come from the group-limited router with the given
loads (DeepSeek-V3 style: group score = sum of the group's top-2 expert scores, the token keeps its
``topk_group`` best groups, then its ``top_k`` best experts inside them). Expert scores are
``logit_e + Gumbel noise``; the logits are calibrated (iterative proportional fitting on fixed,
seeded noise) so the sampled expert frequencies match the given loads. Recorded top-k selections
can be used instead of samples.

**Dispatch model** (which replica serves a token; tokens start evenly on the EP ranks):

* ``"home"`` (topoplan's default): a token is served by a replica in its own NVLink domain when the
  expert has one there (evenly over those), otherwise by the replicas in the expert's *fallback
  domain* (its home, written out with the placement; by default the domain with most replicas).
  A runtime implements it as a per-rank logical-to-physical dispatch map (SGLang's
  ``logical_to_rank_dispatch_physical_map``).
* ``"local"``: own domain first, otherwise evenly over all the expert's replicas (the
  locality-first choice of SGLang's static EPLB dispatch).
* ``"even"``: every replica of an expert gets an equal share of its tokens, wherever the token
  starts (EPLB's own assumption).

**Metrics** per layer:

* ``balance``: max over EP ranks of the assigned load / mean load (1.0 is perfect);
* ``domains_per_token``: expected distinct NVLink domains a token's top-k experts touch
  (eplb.md's locality metric);
* ``remote_domains_per_token``: the same, not counting the token's own domain (0 inside one
  NVLink domain); the scale-out fan-out of a dispatch with DeepEP-style per-domain deduplication;
* ``cross_domain_fraction``: share of (token, expert) pairs served outside the token's domain;
* ``cross_domain_bytes_per_step``: tokens per step x remote domains per token x hidden x
  bytes per element x 2 (dispatch + combine) x 2 (forward + backward), summed over MoE layers.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from planner.errors import InfeasibleError, InputError
from planner.model.spec import ModelSpec, load_model
from solver.expert_metrics import (  # noqa: F401  (re-exported: the metrics are part of this API)
    DISPATCH_MODELS,
    replica_counts,
    domain_weights,
    primary_domains,
    domain_share,
    slot_loads,
    gpu_loads,
    balance_of,
    locality,
    moves_between,
    layer_metrics,
)
from solver.experts import load_cpsat, logical_maps, solve_layer
from topologies.loader import load_cluster


# --------------------------------------------------------------------------------------- loads
def load_loads(path: str | os.PathLike, num_layers: int | None = None,
               num_experts: int | None = None) -> np.ndarray:
    """Read ``loads[MoE layers, experts]`` from ``.npy`` or JSON (``{"loads": [[...], ...]}`` or a
    bare list of lists). Checks the shape against the model when the counts are given."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--loads {p}: file not found; give a .npy or JSON file of shape [MoE layers, experts]")
    try:
        if p.suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
        else:
            doc = json.loads(p.read_text())
            if isinstance(doc, dict):
                if "loads" not in doc:
                    raise InputError(f"--loads {p}: JSON object has no 'loads' field; write {{\"loads\": [[...], ...]}}")
                doc = doc["loads"]
            arr = np.asarray(doc, dtype=float)
    except InputError:
        raise
    except (ValueError, OSError) as exc:
        raise InputError(f"--loads {p}: cannot read ({str(exc).splitlines()[0]}); "
                         "give a .npy array or JSON {\"loads\": [[...], ...]}") from None
    if arr.dtype == object or arr.ndim != 2:
        raise InputError(f"--loads {p}: expected a 2-D array [MoE layers, experts], got shape {tuple(arr.shape)}")
    arr = arr.astype(float)
    if num_layers is not None and arr.shape[0] != num_layers:
        raise InputError(f"--loads {p}: {arr.shape[0]} rows but the model has {num_layers} MoE layers; "
                         "give one row of expert loads per MoE layer")
    if num_experts is not None and arr.shape[1] != num_experts:
        raise InputError(f"--loads {p}: {arr.shape[1]} columns but the model has {num_experts} routed experts; "
                         "give one column per expert")
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise InputError(f"--loads {p}: loads must be finite and non-negative")
    if (arr.sum(axis=1) <= 0).any():
        bad = int(np.flatnonzero(arr.sum(axis=1) <= 0)[0])
        raise InputError(f"--loads {p}: row {bad} sums to zero; every MoE layer needs some load")
    return arr


def synthetic_loads(kind: str, layers: int, experts: int, seed: int = 0, s: float = 0.8,
                    sigma: float = 0.6, tokens: float = 1.0e6) -> np.ndarray:
    """Seeded synthetic loads ``[layers, experts]``: ``"zipf"`` (rank r gets r**-s, ranks shuffled
    over the experts per layer) or ``"lognormal"`` (exp(sigma * N(0, 1))). Rows sum to ``tokens``."""
    rng = np.random.default_rng(seed)
    out = np.empty((layers, experts))
    for i in range(layers):
        if kind == "zipf":
            w = np.arange(1, experts + 1, dtype=float) ** -s
            w = w[rng.permutation(experts)]
        elif kind == "lognormal":
            w = np.exp(sigma * rng.standard_normal(experts))
        else:
            raise InputError(f"synthetic load kind {kind!r}: use zipf or lognormal")
        out[i] = tokens * w / w.sum()
    return out


# ------------------------------------------------------------------------------------- routing
def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries per row (k rounds of argmax; fast for small k)."""
    s = scores.copy()
    rows = np.arange(s.shape[0])
    out = np.empty((s.shape[0], k), dtype=np.int64)
    for j in range(k):
        i = s.argmax(axis=1)
        out[:, j] = i
        s[rows, i] = -np.inf
    return out


def _route(scores: np.ndarray, n_group: int, topk_group: int, top_k: int) -> np.ndarray:
    """Top-k experts per token under group-limited routing. scores[T, E] -> int[T, top_k]."""
    T, E = scores.shape
    if n_group > 1 and topk_group < n_group:
        size = E // n_group
        gs = scores.reshape(T, n_group, size)
        top2 = min(2, size)
        gscore = np.partition(gs, size - top2, axis=2)[:, :, size - top2:].sum(axis=2)
        keep = np.sort(_topk(gscore, topk_group), axis=1)            # [T, topk_group]
        sub = gs[np.arange(T)[:, None], keep].reshape(T, topk_group * size)
        local = _topk(sub, top_k)
        return keep[np.arange(T)[:, None], local // size] * size + local % size
    return _topk(scores, top_k)


def sample_routing(load: np.ndarray, n_group: int = 1, topk_group: int = 1, top_k: int = 8,
                   tokens: int = 2048, seed: int = 0, iters: int = 8) -> np.ndarray:
    """Sample ``tokens`` top-k selections (int[tokens, top_k]) from the group-limited router whose
    expert frequencies match ``load`` (calibrated logits, fixed seeded Gumbel noise)."""
    load = np.asarray(load, dtype=float)
    E = len(load)
    if E % max(n_group, 1):
        raise InputError(f"{E} experts do not split into {n_group} routing groups")
    if top_k > E:
        raise InputError(f"top_k={top_k} exceeds the {E} experts")
    if n_group > 1:
        per_group = E // n_group
        topk_group = max(1, min(topk_group, n_group))
        if top_k > topk_group * per_group:
            topk_group = -(-top_k // per_group)
    p = load / load.sum()
    rng = np.random.default_rng(seed)
    noise = rng.gumbel(size=(tokens, E)).astype(np.float32)
    logits = np.log(np.maximum(p, 1e-12)).astype(np.float32)
    target = p * top_k * tokens
    for _ in range(iters):
        sel = _route(logits + noise, n_group, topk_group, top_k)
        freq = np.bincount(sel.ravel(), minlength=E)
        logits = logits + (0.8 * np.log((target + 0.5) / (freq + 0.5))).astype(np.float32)
    return _route(logits + noise, n_group, topk_group, top_k)


# ------------------------------------------------------------------------------- ExpertBalance
@dataclass(frozen=True)
class ExpertBalance:
    """What an expert placement costs the step: the busiest EP rank's load over the mean (expert
    compute and the all-to-all wait for it) and the share of dispatched traffic that leaves the
    NVLink domain. Averages over MoE layers; ``worst_balance`` is the worst layer."""

    balance: float
    remote_domains_per_token: float
    cross_domain_fraction: float
    cross_domain_bytes_per_step: float = 0.0
    domains_per_token: float = 1.0
    worst_balance: float = 1.0
    policy: str = "topoplan"
    routing: str = "sampled"
    dispatch: str = "home"

    def to_dict(self) -> dict:
        return asdict(self)


def cross_domain_bytes(remote_per_layer: Sequence[float], tokens_per_step: float, hidden: int,
                       bytes_per_elem: float = 2.0) -> float:
    """Bytes that cross NVLink domains per step: every token sends its hidden state once to each
    remote domain it touches (dispatch) and receives it back (combine), forward and backward."""
    return float(tokens_per_step * np.sum(remote_per_layer) * hidden * bytes_per_elem * 2 * 2)


def ep_rank_domains(cluster, ep: int, gpu_indices: Sequence[int] | None = None) -> np.ndarray:
    """NVLink domain index (0-based, in order of first appearance) of each EP rank. The EP group is
    ``gpu_indices`` (cluster GPU indices) or the first ``ep`` GPUs of the cluster's canonical order."""
    gpus = cluster.gpus()
    if gpu_indices is None:
        if ep > len(gpus):
            raise InfeasibleError(f"--ep {ep}: the cluster has only {len(gpus)} healthy GPUs; use a smaller --ep or more --gpus")
        gpu_indices = range(ep)
    raw = [gpus[i].domain for i in gpu_indices]
    remap: dict = {}
    return np.array([remap.setdefault(d, len(remap)) for d in raw], dtype=np.int64)


@dataclass
class ExpertPlacement:
    """A placement of every MoE layer plus its metrics (what ``place-experts`` prints and writes)."""

    physical_to_logical: np.ndarray           # [layers, slots]
    slots_per_gpu: int
    rank_domain: np.ndarray                   # [ep]
    metrics: list[dict]                       # per layer
    policy: str = "topoplan"
    routing: str = "sampled"
    dispatch: str = "home"

    num_experts: int = 0
    fallback_domain: np.ndarray | None = None  # [layers, experts] for the "home" dispatch
    selections: list[np.ndarray] | None = None  # per layer, the top-k selections [tokens, top_k] measured on

    def logical_maps(self):
        """(logical_to_physical[layers, experts, max], logical_count[layers, experts])."""
        return logical_maps(self.physical_to_logical, self.num_experts)

    def expert_balance(self, hidden: int, tokens_per_step: float, moe_layers: int | None = None) -> ExpertBalance:
        """Summary for the step-time model; bytes scale to ``moe_layers`` when the placement covers
        a subset of the model's MoE layers."""
        s = self.summary()
        remote = [x["remote_domains_per_token"] for x in self.metrics]
        scale = (moe_layers or len(remote)) / len(remote)
        return ExpertBalance(balance=s["balance"], remote_domains_per_token=s["remote_domains_per_token"],
                             cross_domain_fraction=s["cross_domain_fraction"],
                             cross_domain_bytes_per_step=cross_domain_bytes(remote, tokens_per_step, hidden) * scale,
                             domains_per_token=s["domains_per_token"], worst_balance=s["worst_balance"],
                             policy=self.policy, routing=self.routing, dispatch=self.dispatch)

    def summary(self) -> dict:
        m = self.metrics
        keys = ("balance", "domains_per_token", "remote_domains_per_token", "cross_domain_fraction")
        out = {k: float(np.mean([x[k] for x in m])) for k in keys}
        out["worst_balance"] = float(max(x["balance"] for x in m))
        for k in ("moves", "solve_s"):
            vals = [x[k] for x in m if x.get(k) is not None]
            out[k] = (float(np.sum(vals)) if k == "solve_s" else int(np.sum(vals))) if vals else None
        return out


def evaluate_placement(phy2log: np.ndarray, rank_domain: np.ndarray, slots_per_gpu: int,
                       loads: np.ndarray, routing: Sequence[np.ndarray], dispatch: str = "even") -> list[dict]:
    """Per-layer metrics of any placement (topoplan's or EPLB's) under one routing/dispatch model."""
    return [layer_metrics(phy2log[i], rank_domain, slots_per_gpu, loads[i], routing[i], dispatch)
            for i in range(len(loads))]


# ------------------------------------------------------------------------------ placing layers
def _routing_label(recorded: bool, n_group: int, topk_group: int, top_k: int, tokens: int, seed: int) -> str:
    if recorded:
        return "recorded top-k selections"
    lim = f"{n_group} groups, top-{topk_group} groups, " if n_group > 1 else ""
    return f"sampled from the group-limited router ({lim}top-{top_k}), {tokens} tokens per layer, seed {seed}"


def _place_one(args):
    (i, load, group_of, rank_domain, K, prev, max_moves, time_limit, seed, dispatch, routing,
     n_group, topk_group, top_k, tokens) = args
    sel = routing if routing is not None else sample_routing(load, n_group, topk_group, top_k, tokens, seed + i)
    res = solve_layer(load, group_of, rank_domain, K, dispatch=dispatch, prev=prev, max_moves=max_moves,
                      time_limit=time_limit, seed=seed, tokens=sel)
    met = layer_metrics(res.physical_to_logical, rank_domain, K, load, sel, dispatch, res.stats["home"])
    met.update(moves=res.moves, solve_s=res.solve_s, solver_status=res.cpsat_status,
               greedy_balance=res.greedy_balance, lower_bound=res.lower_bound,
               warm_start=res.stats.get("warm_start"))
    return res.physical_to_logical, res.stats["home"], met, sel


def place(loads: np.ndarray, rank_domain: np.ndarray, slots_per_gpu: int, *, n_group: int = 1,
          topk_group: int = 1, top_k: int = 8, previous: np.ndarray | None = None,
          max_moves: int | None = None, time_limit: float = 0.1, seed: int = 0, dispatch: str = "home",
          routing: Sequence[np.ndarray] | None = None, tokens: int = 2048,
          workers: int | None = None, on_layer=None) -> ExpertPlacement:
    """Place every MoE layer (layers in parallel processes, ``workers`` default: the CPU count).
    ``loads[L, E]``; ``previous[L, slots]`` and ``max_moves`` (per layer) bound the migration.
    ``on_layer()`` is called as each layer is done (a progress bar's ``advance``)."""
    loads = np.asarray(loads, dtype=float)
    L, E = loads.shape
    rank_domain = np.asarray(rank_domain, dtype=np.int64)
    group_of = np.arange(E) // (E // n_group) if n_group > 1 else np.arange(E)
    jobs = [(i, loads[i], group_of, rank_domain, slots_per_gpu,
             None if previous is None else np.asarray(previous[i]), max_moves, time_limit, seed, dispatch,
             None if routing is None else np.asarray(routing[i]), n_group, topk_group, top_k, tokens)
            for i in range(L)]
    workers = min(workers or os.cpu_count() or 1, L)
    if workers > 1:
        if time_limit > 0:
            load_cpsat()        # forked workers inherit the import: one instead of one per worker
        with ProcessPoolExecutor(max_workers=workers) as pool:
            out = []
            for o in pool.map(_place_one, jobs):
                out.append(o)
                if on_layer:
                    on_layer()
    else:
        out = []
        for j in jobs:
            out.append(_place_one(j))
            if on_layer:
                on_layer()
    return ExpertPlacement(physical_to_logical=np.stack([o[0] for o in out]), slots_per_gpu=slots_per_gpu,
                     rank_domain=rank_domain, metrics=[o[2] for o in out], policy="topoplan",
                     routing=_routing_label(routing is not None, n_group, topk_group, top_k, tokens, seed),
                     dispatch=dispatch, num_experts=E, fallback_domain=np.stack([o[1] for o in out]),
                     selections=[o[3] for o in out])


def expert_balance_for(model, cluster, ep: int, loads, *, slots_per_gpu: int | None = None,
                       gpus: int | None = None, gpu_indices: Sequence[int] | None = None,
                       tokens_per_step: float | None = None, time_limit: float = 0.1, seed: int = 0,
                       workers: int | None = None) -> ExpertBalance:
    """What a (possibly skewed) expert load costs a plan: place the experts on the EP group's GPUs
    and summarise balance and cross-domain traffic for ``planner.predict(..., expert_balance=...)``.

    ``model``/``cluster``: specs or names; ``loads``: array ``[MoE layers, experts]`` or a file path.
    ``slots_per_gpu`` defaults to one spare slot per GPU; ``tokens_per_step`` (tokens the EP group
    routes per step) defaults to 4096 per EP rank."""
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    if not spec.is_moe:
        raise InputError(f"model {spec.name}: dense model, no experts to place")
    if not hasattr(cluster, "gpus"):
        cluster = load_cluster(cluster, gpus=gpus)
    moe_layers = int(sum(spec.moe_layers))
    if isinstance(loads, (str, os.PathLike)):
        loads = load_loads(loads, moe_layers, spec.num_experts)
    loads = np.asarray(loads, dtype=float)
    rank_domain = ep_rank_domains(cluster, ep, gpu_indices)
    if ep < 1:
        raise InputError(f"ep {ep}: the EP group needs at least 1 GPU")
    K = slots_per_gpu if slots_per_gpu is not None else -(-spec.num_experts // ep) + 1
    if K < 1 or K * ep < spec.num_experts:
        raise InputError(f"slots_per_gpu {K}: {K} x {ep} GPUs cannot hold {spec.num_experts} experts; "
                         f"use at least {-(-spec.num_experts // ep)}")
    pl = place(loads, rank_domain, K, n_group=spec.n_group, topk_group=spec.topk_group, top_k=spec.top_k,
               time_limit=time_limit, seed=seed, workers=workers)
    return pl.expert_balance(spec.hidden_size, tokens_per_step or 4096 * ep, len(loads))
