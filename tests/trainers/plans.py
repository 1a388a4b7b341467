"""Plan documents for the emitter tests, built the way ``planner.search.plan`` builds them: a model from the
catalog, a cluster, a ParallelConfig, a Training, and ``make_placement`` for the rank -> GPU map."""

from __future__ import annotations

from planner.config import ParallelConfig, Training
from planner.model.spec import load_model
from planner.cost.placement import default_gpus_per_domain, make_placement
from topologies.cluster import Cluster


def nvl72_cluster(gpu: str, racks: int, trays_per_rack: int = 18, name: str | None = None) -> Cluster:
    """``racks`` NVL72 racks of ``trays_per_rack`` 4-GPU compute trays (one NVLink domain per rack)."""
    nodes, domains = [], []
    for r in range(1, racks + 1):
        hosts = [f"{gpu}-r{r:02d}-t{t:02d}" for t in range(1, trays_per_rack + 1)]
        nodes += [{"name": h, "gpus": 4} for h in hosts]
        domains.append({"name": f"r{r:02d}", "nodes": hosts})
    return Cluster.model_validate({"name": name or f"{gpu}-nvl72x{racks}", "gpu": gpu, "nodes": nodes,
                                   "domains": domains})


def hgx_cluster(gpu: str, nodes: int, name: str | None = None, failed_gpus: list[str] | None = None) -> Cluster:
    """``nodes`` HGX hosts of 8 GPUs (each host its own NVLink domain)."""
    data = {"name": name or f"{gpu}-hgx{nodes}", "gpu": gpu,
            "nodes": [{"name": f"{gpu}-n{i:04d}", "gpus": 8} for i in range(nodes)]}
    if failed_gpus:
        data["health"] = {"failed_gpus": failed_gpus}
    return Cluster.model_validate(data)


def plan_doc(model_name: str, cluster: Cluster, config: ParallelConfig, training: Training,
             world: int | None = None, gpus_per_domain: int | None = "auto") -> dict:
    """A one-entry plan.json document (docs/architecture.md) for ``config`` on ``cluster``."""
    model = load_model(model_name)
    world = world or config.world(cluster.num_gpus)
    if gpus_per_domain == "auto":
        gpus_per_domain = default_gpus_per_domain(cluster.domain_sizes(), config, world)
    placement = make_placement(cluster, config, world, gpus_per_domain=gpus_per_domain)
    gpus = cluster.gpus()
    dp = world // config.model_parallel
    cfg = config.model_dump()
    cfg["dp"] = dp
    cfg["gbs"] = training.global_batch
    return {
        "version": 1,
        "model": {"name": model.name, "spec": model.model_dump(mode="json")},
        "cluster": cluster.to_dict(),
        "training": training.model_dump(),
        "plans": [{
            "config": cfg,
            "prediction": {},
            "placement": {
                "order": placement.order, "gpus_per_domain": placement.gpus_per_domain,
                "rank_to_gpu": list(placement.rank_to_gpu),
                "hosts": [gpus[g].node for g in placement.rank_to_gpu],
                "local_ranks": [gpus[g].local for g in placement.rank_to_gpu],
            },
        }],
        "solver": {},
    }
