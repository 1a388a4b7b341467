"""``replan``: a plan again after hosts fail, in seconds (issue 20 item 1).

Two cases, decided per failure:

* **Spares.** Every failed host that runs ranks gets a spare host of its NVLink domain
  (``planner.launch.spares``): the layout and the rank order stay, only the failed hosts' ranks move,
  each to the same local GPU index of its spare. The new document is the old plan with the new
  cluster health and ``rank_to_gpu`` (re-indexed: ``rank_to_gpu`` indexes the *healthy* GPUs, and
  the failure changes that list) and the prediction priced again on the new placement.
* **Re-plan.** Some domain lacks spares: ``planner.search.plan`` chooses again on what is left
  (the failed hosts broken, the degraded domains' spares in use, the other domains' spares kept as
  the healthy plan had them; and, as a second candidate, the job on the domains that lost nothing), with the same model, training and objective, the planner's GPUs-per-domain
  choices plus the aligned counts that fit the degraded domain. Among the plans found, the best one
  whose groups are domain-local wherever the healthy plan's groups (of more than one rank) were is taken
  (``planner.cost.placement.rank_groups`` on both placements); if none is, the best plan and a
  warning. The cost against the healthy plan is reported (TFLOP/s per GPU and tokens/s), and when
  the experts' sharding changes (EP, ETP or PP), the expert state each GPU loads again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from planner.cost.memory import expert_state_bytes_per_gpu
from planner.cost.placement import Placement, rank_groups
from planner.cost.predict import predict
from planner.errors import InfeasibleError, InputError
from planner.launch.spares import assign_spares, domain_of_hosts, rank_hosts, relocate, with_health
from planner.search.document import load_document
import planner.search.plan as search
from planner.search.plan import PlanEntry, PlanResult
from topologies.cluster import cluster_from_dict
from topologies.hostlist import HostlistError, compress, expand
from topologies.loader import Job

__all__ = ["Move", "ReplanResult", "failed_hosts", "local_axes", "replan"]

AXES = ("tp", "cp", "ep", "etp", "dp", "edp", "pp")
_OBJECTIVE = {"tokens_per_s": "throughput", "tokens_per_s_low": "robust", "tflops_per_gpu": "tflops-per-gpu"}


@dataclass
class Move:
    """The ranks of one failed host, now on its spare (same local GPU index)."""

    host: str
    spare: str
    domain: str
    ranks: list[int]


@dataclass
class ReplanResult:
    """What ``replan`` decided: ``case`` "spares" (ranks moved to spare hosts) or "replan" (a new
    layout); ``document`` the new plan.json; ``before`` / ``after`` the healthy and the new plan's
    figures; ``experts`` the expert re-sharding (re-plan case, MoE models) or None."""

    case: str
    failed: list[str]
    document: dict
    moves: list[Move] = field(default_factory=list)
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    experts: dict | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def moved_ranks(self) -> list[int]:
        return sorted(r for m in self.moves for r in m.ranks)

    def to_dict(self) -> dict:
        return {"case": self.case, "failed": list(self.failed),
                "moves": [{"host": m.host, "spare": m.spare, "domain": m.domain, "ranks": m.ranks}
                          for m in self.moves],
                "moved_ranks": len(self.moved_ranks), "before": self.before, "after": self.after,
                "change": change(self.before, self.after), "experts": self.experts, "notes": self.notes}


def failed_hosts(spec, cluster, option: str = "--failed") -> list[str]:
    """The hosts of ``spec`` (a hostlist such as ``gb200-r02-t[07-08]``, a file with one host or
    hostlist per line, or a list of those), in the cluster's order; InputError naming the option
    and the unknown host otherwise."""
    items = [spec] if isinstance(spec, (str, Path)) else list(spec)
    names: list[str] = []
    for item in items:
        text = str(item).strip()
        path = Path(text)
        lines = [text]
        if text and path.is_file():
            lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
        for ln in (x for x in lines if x):
            try:
                names += expand(ln)
            except HostlistError as exc:
                raise InputError(f"{option} {ln!r}: {exc}; give a hostlist like 'gb200-r02-t[07-08]' or a file "
                                 "with one host per line") from None
    if not names:
        raise InputError(f"{option}: no host given; name hosts (a hostlist or a file, one host per line)")
    known = {n.name: i for i, n in enumerate(cluster.nodes)}
    for h in names:
        if h not in known:
            raise InputError(f"{option}: host {h!r} is not in the plan's cluster {cluster.name!r} (hosts "
                             f"{compress(list(known))}); name hosts of plan.json's cluster")
    return sorted(set(names), key=known.__getitem__)


def local_axes(cluster, config, world: int, rank_to_gpu, order: str, groups_only: bool = False) -> set[str]:
    """The axes every group of which lies inside one NVLink domain on this placement;
    ``groups_only``: only axes whose groups have more than one rank (a degree of 1 keeps nothing
    together, so a re-plan may give that axis a degree that spans domains)."""
    dom = [g.domain for g in cluster.gpus()]
    rdom = [dom[g] for g in rank_to_gpu]
    out = set()
    for axis in AXES:
        groups = rank_groups(config, world, axis, order)
        if groups_only and len(groups[0]) == 1:
            continue
        if all(len({rdom[r] for r in grp}) == 1 for grp in groups):
            out.add(axis)
    return out


def figures(label: str, world: int, pred: dict, placement: dict) -> dict:
    """The figures the cost table compares."""
    return {"layout": label, "world": world, "gpus_per_domain": placement.get("gpus_per_domain"),
            "domains_used": placement.get("domains_used"), "tflops_per_gpu": pred["tflops_per_gpu"],
            "tokens_per_s": pred["tokens_per_s"], "fits": pred["fits"],
            "memory_gib_per_gpu": pred["memory_gib_per_gpu"]}


def change(before: dict, after: dict) -> dict:
    """The new plan against the healthy one: ratios less one (after / before - 1)."""
    if not before or not after:
        return {}
    return {k: after[k] / before[k] - 1.0 for k in ("tflops_per_gpu", "tokens_per_s", "world") if before[k]}


def _document(doc, cluster, config, gbs: int, placement: Placement, solver: dict, model, training,
              domains: dict | None = None) -> dict:
    """The plan document of one layout on ``cluster`` with ``placement`` (priced again by ``predict``)."""
    tr = training.model_copy(update={"global_batch": gbs})
    pred = predict(model, cluster, config, tr, placement=placement, profile=training.stack)
    out = PlanResult([PlanEntry(config, pred, placement, placement.world, gbs)], solver, model, cluster,
                     training).to_dict()
    if domains is not None:
        out["plans"][0]["placement"]["domains"] = dict(domains)
    if doc.header is not None:
        h = doc.header.model_dump(mode="json")
        h.update(cluster=cluster.name, gpus_used=placement.world)
        out["header"] = h
    return out


def replan(plan_doc, failed, *, index: int = 0, time_limit: float | None = None,
           allow_cross_domain: bool = False, spares=None) -> ReplanResult:
    """The plan after ``failed`` hosts fail (``plan_doc``: a plan.json dict, path or PlanDocument).
    ``allow_cross_domain``: when re-planning, take the fastest plan even if groups that were
    domain-local in the healthy plan now cross NVLink domains (default: keep them domain-local).
    ``spares``: for cluster files written before ``health.spare_trays`` existed, which hosts of
    ``health.failed_trays`` are spare trays (a hostlist, file or list): they move to ``spare_trays``,
    the others stay broken. Default: ``failed_trays`` are broken, ``spare_trays`` the spares."""
    doc = load_document(plan_doc)
    if not 0 <= index < len(doc.plans):
        raise InputError(f"--index {index}: plan.json holds plans 0..{len(doc.plans) - 1}; pick one of those")
    notes = []
    if spares is not None:
        doc = doc.model_copy(update={"cluster": _mark_spares(doc.cluster, failed_hosts(spares, doc.cluster,
                                                                                        "--spares"))})
    elif doc.cluster.health.failed_trays and not doc.cluster.health.spare_trays:
        notes.append(f"health.failed_trays ({compress(doc.cluster.health.failed_trays)}) are taken as broken; if "
                     "some are spare trays (a plan.json from before health.spare_trays), say which with --spares")
    cluster, entry = doc.cluster, doc.plans[index]
    hosts = failed_hosts(failed, cluster)
    placed = rank_hosts(cluster, entry.placement.rank_to_gpu)
    moves, short = assign_spares(cluster, placed, hosts)
    before = figures(entry.label, entry.config.world, entry.prediction.model_dump(), entry.placement.model_dump())
    if not short:
        res = _with_spares(doc, index, hosts, placed, moves, before)
    else:
        res = _replanned(doc, index, hosts, short, before, time_limit, allow_cross_domain)
    res.notes[:0] = notes
    return res


def _mark_spares(cluster, listed):
    """``cluster`` with the ``listed`` hosts of ``health.failed_trays`` moved to ``spare_trays``;
    InputError naming --spares for a listed host that is not under ``failed_trays`` or ``spare_trays``."""
    h = cluster.health
    trays, spare = set(h.failed_trays), set(h.spare_trays)
    for host in listed:
        if host not in trays | spare:
            raise InputError(f"--spares: host {host!r} is not under health.failed_trays or health.spare_trays of "
                             f"the plan's cluster; name trays listed there")
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    data = cluster.model_dump(mode="json", exclude_none=True)
    data["health"]["failed_trays"] = sorted(trays - set(listed), key=order.__getitem__)
    data["health"]["spare_trays"] = sorted(spare | set(listed), key=order.__getitem__)
    return cluster_from_dict(data, f"cluster {cluster.name!r}")


def _with_spares(doc, index, hosts, placed, moves, before) -> ReplanResult:
    entry = doc.plans[index]
    new, r2g = relocate(doc.cluster, placed, hosts, moves)
    p = entry.placement
    placement = Placement(world=len(r2g), order=p.order, gpus_per_domain=p.gpus_per_domain, rank_to_gpu=tuple(r2g))
    out = _document(doc, new, entry.config.parallel_config(), entry.config.gbs, placement,
                    doc.solver.model_dump(mode="json", exclude_none=True), doc.model.spec, doc.training,
                    domains=p.domains)
    dom = domain_of_hosts(doc.cluster)
    ranks: dict[str, list[int]] = {}
    for r, (h, _l) in enumerate(placed):
        if h in moves:
            ranks.setdefault(h, []).append(r)
    mv = [Move(h, s, dom[h], ranks[h]) for h, s in moves.items()]
    idle = [h for h in hosts if h not in moves]
    notes = [f"{h} runs no rank of the plan: marked failed, nothing moves" for h in idle]
    new_entry = out["plans"][0]
    after = figures(new_entry["label"], new_entry["config"]["world"], new_entry["prediction"], new_entry["placement"])
    return ReplanResult("spares", hosts, out, mv, before, after, None, notes)


def _gpd_extra(sizes: list[int], per_node: int) -> list[int]:
    """GPUs-per-domain counts that fit the smallest domain left: itself and its power-of-two-aligned
    roundings down (whole hosts, at least half of it)."""
    m = min(sizes)
    out, k = [], 0
    while 2 ** k <= m:
        g = m // 2 ** k * 2 ** k
        if g >= m // 2 and g % per_node == 0 and g not in out:
            out.append(g)
        k += 1
    return out


def _candidates(doc, index, hosts, short, time_limit, cross=False):
    """(cluster, PlanResult) of each cluster the job may run on after the failure."""
    cluster = doc.cluster
    offered = doc.header.gpus_offered if doc.header is not None and isinstance(doc.header.gpus_offered, int) \
        else doc.plans[index].config.world
    dom = domain_of_hosts(cluster)
    if not set(cluster.hosts()) - set(hosts) - cluster.health.broken_hosts():
        raise InfeasibleError(f"every host of cluster {cluster.name!r} has failed: nothing is left to plan on")
    degraded = {dom[h] for h in short}
    hold = {h for h, d in dom.items() if d in degraded}
    kept = {h for h in cluster.health.spare_trays if dom[h] not in degraded}   # intact racks keep their shape
    options = [with_health(cluster, hosts, kept)]              # the degraded domains' spares in use
    if set(cluster.hosts()) - hold - set(cluster.health.out_of_plan()):
        options.append(with_health(cluster, hosts, kept | hold))   # the job on the domains that lost nothing
    if cross and kept:
        options.append(with_health(cluster, hosts, set()))          # every spare in use
    training = doc.training
    objective = _OBJECTIVE[doc.solver.objective_name]
    out, last = [], None
    for c in options:
        job = Job(c, min(offered, c.num_gpus), None)
        extra = _gpd_extra(c.domain_sizes(), c.gpu_spec.gpus_per_node)
        try:
            res = search.plan(doc.model.spec, job, training, top=8, time_limit=time_limit, objective=objective,
                              include={"gpd": extra})
        except InfeasibleError as exc:
            last = exc
            continue
        out.append((c, res))
    if not out:
        raise InfeasibleError(f"no layout fits on what is left after {compress(hosts)} failed: {last}")
    return out


def _replanned(doc, index, hosts, short, before, time_limit, allow_cross_domain=False) -> ReplanResult:
    entry = doc.plans[index]
    old_cfg = entry.config.parallel_config()
    need = local_axes(doc.cluster, old_cfg, entry.config.world, entry.placement.rank_to_gpu, entry.placement.order,
                      groups_only=True)
    key = "tflops_per_gpu" if doc.solver.objective_name == "tflops_per_gpu" else "tokens_per_s"
    best, best_any = None, None
    for c, res in _candidates(doc, index, hosts, short, time_limit, allow_cross_domain):
        for e in res.plans:
            val = getattr(e.prediction, key)
            if best_any is None or val > best_any[0]:
                best_any = (val, c, res, e)
            ok = need <= local_axes(c, e.config, e.world, e.placement.rank_to_gpu, e.placement.order)
            if ok and (best is None or val > best[0]):
                best = (val, c, res, e)
    notes = [f"no spare host left in NVLink domain {d} for {h}"
             for h, d in ((h, domain_of_hosts(doc.cluster)[h]) for h in short)]
    if best is None or (allow_cross_domain and best_any[0] > best[0]):
        if best is None:
            notes.append("warning: no plan on what is left keeps every group domain-local where the healthy plan "
                         "did; the best plan is taken and its groups cross NVLink domains")
        else:
            notes.append(f"--allow-cross-domain: {best_any[3].label} on {best_any[3].world} GPUs crosses NVLink "
                         f"domains and is predicted {best_any[0] / best[0] - 1:+.1%} faster than the best "
                         f"domain-local plan ({best[3].label} on {best[3].world} GPUs)")
        best = best_any
    elif best_any[0] > best[0]:
        notes.append(f"a plan whose groups cross NVLink domains, {best_any[3].label} on {best_any[3].world} GPUs, is "
                     f"predicted {best_any[0] / best[0] - 1:+.1%} faster than this domain-local one; "
                     "--allow-cross-domain takes it")
    _, c, res, e = best
    out = PlanResult([e], res.solver, doc.model.spec, c, res.training).to_dict()
    if doc.header is not None:
        h = doc.header.model_dump(mode="json")
        h.update(cluster=c.name, gpus_offered=min(h["gpus_offered"], c.num_gpus) if isinstance(h["gpus_offered"], int)
                 else c.num_gpus, gpus_used=e.world)
        out["header"] = h
    ne = out["plans"][0]
    after = figures(ne["label"], ne["config"]["world"], ne["prediction"], ne["placement"])
    experts = _experts(doc, entry, e, res.training)
    return ReplanResult("replan", hosts, out, [], before, after, experts, notes)


def _experts(doc, entry, new, training) -> dict | None:
    """Expert re-sharding when EP, ETP or PP change (MoE models); None for dense models."""
    model = doc.model.spec
    if not model.is_moe:
        return None
    old = entry.config
    changed = (old.ep, old.etp, old.pp) != (new.config.ep, new.config.etp_eff, new.config.pp)
    out = {"ep_before": old.ep, "ep_after": new.config.ep, "etp_before": old.etp, "etp_after": new.config.etp_eff,
           "pp_before": old.pp, "pp_after": new.config.pp, "resharded": changed,
           "bytes_per_gpu": expert_state_bytes_per_gpu(model, new.config, training, new.world) if changed else 0.0}
    if changed:
        out["how"] = ("plan.json holds no expert placement: the trainer's checkpoint loader re-shards the experts "
                      "(Megatron's distributed checkpoint loads onto the new EP); bytes_per_gpu = expert "
                      "parameters per GPU x (weight bytes + optimizer-state bytes / EDP)")
    else:
        out["how"] = ("the experts keep their sharding; a placement from 'topoplan place-experts -o DIR' carries "
                      "over: refine it with 'place-experts --plan NEW/plan.json --previous DIR --max-moves K'")
    return out
