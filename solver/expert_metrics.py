"""Expert placement metrics on plain arrays: replica counts per NVLink domain, the dispatch models'
share of each expert's tokens per domain, per-GPU loads and balance, locality of sampled routings,
and weight moves between two placements.

Vocabulary and the dispatch models (``home``, ``local``, ``even``) are described in
:mod:`planner.search.experts`, which re-exports these functions; the solver in :mod:`solver.experts`
optimises them. Plain numpy in, plain numbers out.
"""

from __future__ import annotations

import numpy as np

DISPATCH_MODELS = ("home", "local", "even")


def replica_counts(phy2log: np.ndarray, rank_domain: np.ndarray, slots_per_gpu: int,
                   num_experts: int, num_domains: int) -> np.ndarray:
    """n[expert, domain]: replicas of each expert in each domain."""
    dom_of_slot = np.asarray(rank_domain)[np.arange(len(phy2log)) // slots_per_gpu]
    n = np.zeros((num_experts, num_domains), dtype=np.int64)
    np.add.at(n, (np.asarray(phy2log), dom_of_slot), 1)
    return n


def domain_weights(rank_domain: np.ndarray, num_domains: int) -> np.ndarray:
    """Share of tokens that start in each domain (tokens start evenly on the EP ranks)."""
    return np.bincount(rank_domain, minlength=num_domains) / len(rank_domain)


def primary_domains(n: np.ndarray) -> np.ndarray:
    """Default fallback domain of every expert: the domain holding most of its replicas (lowest index on ties)."""
    return np.argmax(np.asarray(n), axis=1)


def domain_share(n: np.ndarray, w: np.ndarray, dispatch: str = "home",
                 primary: np.ndarray | None = None) -> np.ndarray:
    """share[e, d]: fraction of expert e's tokens served in domain d under the dispatch model."""
    n = np.asarray(n, dtype=float)
    if dispatch == "even":
        return n / n.sum(axis=1, keepdims=True)
    if dispatch not in DISPATCH_MODELS:
        raise ValueError(f"dispatch model {dispatch!r}: use one of {', '.join(DISPATCH_MODELS)}")
    has = n > 0
    w0 = (w[None, :] * ~has).sum(axis=1, keepdims=True)      # tokens whose domain lacks a replica
    if dispatch == "local":
        return has * w[None, :] + w0 * n / n.sum(axis=1, keepdims=True)
    if primary is None:
        primary = primary_domains(n)
    share = has * w[None, :]
    share[np.arange(len(n)), primary] += w0[:, 0]        # the fallback domain serves the rest
    return share


def slot_loads(phy2log: np.ndarray, rank_domain: np.ndarray, slots_per_gpu: int, load: np.ndarray,
               dispatch: str = "home", primary: np.ndarray | None = None) -> np.ndarray:
    """Load carried by every slot (a replica of e in domain d carries load_e * share[e, d] / n[e, d])."""
    rank_domain = np.asarray(rank_domain)
    D = int(rank_domain.max()) + 1
    n = replica_counts(phy2log, rank_domain, slots_per_gpu, len(load), D)
    share = domain_share(n, domain_weights(rank_domain, D), dispatch, primary)
    per = np.asarray(load, dtype=float)[:, None] * share / np.maximum(n, 1)
    dom_of_slot = rank_domain[np.arange(len(phy2log)) // slots_per_gpu]
    return per[np.asarray(phy2log), dom_of_slot]


def gpu_loads(phy2log, rank_domain, slots_per_gpu, load, dispatch="home", primary=None) -> np.ndarray:
    return slot_loads(phy2log, rank_domain, slots_per_gpu, load, dispatch, primary).reshape(-1, slots_per_gpu).sum(axis=1)


def balance_of(phy2log, rank_domain, slots_per_gpu, load, dispatch="home", primary=None) -> float:
    g = gpu_loads(phy2log, rank_domain, slots_per_gpu, load, dispatch, primary)
    return float(g.max() / g.mean())


def locality(tokens: np.ndarray, n: np.ndarray, w: np.ndarray, dispatch: str = "home",
             primary: np.ndarray | None = None) -> dict:
    """Expected domains per token, remote domains per token and cross-domain pair fraction for the
    sampled (or recorded) selections ``tokens[T, k]`` and replica counts ``n[e, d]``.

    The expectation over replica choice is exact: with q(d) the chance an expert's token is served
    in d, a token touches d with probability 1 - prod_j (1 - q_j(d)); the token's own domain d0 is
    drawn with probability w[d0].
    """
    n = np.asarray(n, dtype=float)
    if dispatch == "home":
        return _home_locality(tokens, n, w, primary_domains(n) if primary is None else primary)
    return _chance_locality(tokens, n, w, dispatch, primary)


def _chance_locality(tokens: np.ndarray, n: np.ndarray, w: np.ndarray, dispatch: str,
                     primary: np.ndarray | None = None) -> dict:
    """:func:`locality` from each (token, expert)'s chance of being served in each domain (any
    dispatch model; the home dispatch is counted exactly by :func:`_home_locality`)."""
    D = n.shape[1]
    c = n.sum(axis=1, keepdims=True)
    even_q = n / c
    if dispatch == "home":
        even_q = np.zeros_like(n)
        even_q[np.arange(len(n)), primary_domains(n) if primary is None else primary] = 1.0
    doms = remote = cross = 0.0
    touch_even = None
    for d0 in range(D):
        if w[d0] == 0:
            continue
        if dispatch == "even":
            if touch_even is None:
                qt_even = even_q[tokens]
                touch_even = 1.0 - np.prod(1.0 - qt_even, axis=1)
            qt, touch = qt_even, touch_even
        else:
            local = n[:, d0] > 0
            q = np.where(local[:, None], np.eye(D)[d0][None, :], even_q)
            qt = q[tokens]                                    # [T, k, D]
            touch = 1.0 - np.prod(1.0 - qt, axis=1)           # [T, D]
        td = touch.sum(axis=1).mean()
        doms += w[d0] * td
        remote += w[d0] * (td - touch[:, d0].mean())
        cross += w[d0] * (1.0 - qt[:, :, d0]).mean()
    return {"domains_per_token": float(doms), "remote_domains_per_token": float(remote),
            "cross_domain_fraction": float(cross)}


def _home_locality(tokens: np.ndarray, n: np.ndarray, w: np.ndarray, primary: np.ndarray) -> dict:
    """:func:`locality` under the home dispatch, where every (token, expert) is served in one domain
    (its own when the expert has a replica there, else the expert's fallback): the chances are 0 or
    1, so the domains a token touches are counted as integers (the same figures, exactly)."""
    D = n.shape[1]
    own = np.arange(D)
    served = np.where(n.T > 0, own[:, None], np.asarray(primary)[None, :])[:, tokens]   # [D, T, k]
    s = np.sort(served, axis=-1)
    touched = 1 + (np.diff(s, axis=-1) != 0).sum(axis=-1)                              # [D, T]
    at_own = (served == own[:, None, None])
    doms = remote = cross = 0.0
    for d0 in range(D):
        if w[d0] == 0:
            continue
        td = touched[d0].mean()
        doms += w[d0] * td
        remote += w[d0] * (td - at_own[d0].any(axis=-1).mean())
        cross += w[d0] * (~at_own[d0]).mean()
    return {"domains_per_token": float(doms), "remote_domains_per_token": float(remote),
            "cross_domain_fraction": float(cross)}


def moves_between(prev: np.ndarray, new: np.ndarray, slots_per_gpu: int) -> int:
    """Expert weights copied: (expert, GPU) pairs in ``new`` that ``prev`` lacks (slot order inside a
    GPU is free; a replica that stays on its GPU costs nothing)."""
    P = len(new) // slots_per_gpu
    a = np.asarray(prev).reshape(P, slots_per_gpu)
    b = np.asarray(new).reshape(P, slots_per_gpu)
    moved = 0
    for g in range(P):
        before = list(a[g])
        for e in b[g]:
            if e in before:
                before.remove(e)
            else:
                moved += 1
    return moved


def layer_metrics(phy2log: np.ndarray, rank_domain: np.ndarray, slots_per_gpu: int, load: np.ndarray,
                  tokens: np.ndarray, dispatch: str = "home", primary: np.ndarray | None = None) -> dict:
    """Balance and locality of one layer's placement."""
    rank_domain = np.asarray(rank_domain)
    D = int(rank_domain.max()) + 1
    n = replica_counts(phy2log, rank_domain, slots_per_gpu, len(load), D)
    out = {"balance": balance_of(phy2log, rank_domain, slots_per_gpu, load, dispatch, primary)}
    out.update(locality(tokens, n, domain_weights(rank_domain, D), dispatch, primary))
    return out
