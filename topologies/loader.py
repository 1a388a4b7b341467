"""``load_cluster``: the CLUSTER argument every command takes -- a preset name or a YAML path."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from topologies.cluster import Cluster, cluster_from_dict
from topologies.errors import InputError, not_utf8
from topologies.gpus import get_gpu
from topologies.presets import PRESETS, build_preset

__all__ = ["Job", "load_cluster", "load_job", "read_cluster_file", "restrict"]


def read_cluster_file(path: str | Path) -> Cluster:
    """Parse and validate a cluster YAML (or JSON) file; one-line InputError naming file and field."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; give a cluster YAML path or a preset ({', '.join(PRESETS)})") from None
    except UnicodeDecodeError as exc:
        raise not_utf8(path, exc, "cluster file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise InputError(f"{path}:{where}: {problem}; fix the YAML syntax") from None
    if data is None:
        raise InputError(f"{path}: empty file; a cluster file needs gpu and nodes (see docs/cluster.md)")
    return cluster_from_dict(data, str(path))


def restrict(cluster: Cluster, gpus: int, source: str) -> Cluster:
    """The first ``gpus`` healthy GPUs of a cluster file, in whole nodes (canonical order)."""
    if gpus <= 0:
        raise InputError(f"--gpus {gpus}: must be positive")
    if gpus > cluster.num_gpus:
        raise InputError(f"--gpus {gpus}: {source} has only {cluster.num_gpus} healthy GPUs")
    if gpus == cluster.num_gpus:
        return cluster
    keep: list[str] = []
    total = 0
    seen: set[str] = set()
    for g in cluster.gpus():
        if g.node in seen:
            continue
        seen.add(g.node)
        if total >= gpus:
            break
        keep.append(g.node)
        total += cluster.node_healthy_gpus(g.node)
    if total != gpus:
        raise InputError(
            f"--gpus {gpus}: {source} cannot be cut to {gpus} GPUs in whole nodes (the first nodes give {total}); "
            "pick a count that ends on a node boundary"
        )
    keep_set = set(keep)
    data = cluster.model_dump(exclude_none=True)
    data["nodes"] = [n for n in data["nodes"] if n["name"] in keep_set]
    if data.get("domains") is not None:
        data["domains"] = [
            {"name": d["name"], "nodes": [m for m in d["nodes"] if m in keep_set]}
            for d in data["domains"]
            if any(m in keep_set for m in d["nodes"])
        ]
    h = data.get("health", {})
    for key in ("failed_nodes", "failed_trays", "spare_trays"):
        if key in h:
            h[key] = [m for m in h[key] if m in keep_set]
    if "failed_gpus" in h:
        h["failed_gpus"] = [x for x in h["failed_gpus"] if x.rpartition(":")[0] in keep_set]
    for t in data.get("tiers") or []:
        if t.get("groups"):
            t["groups"] = [[m for m in g if m in keep_set] for g in t["groups"]]
            t["groups"] = [g for g in t["groups"] if g]
    data["name"] = f"{cluster.name}-{gpus}"
    return cluster_from_dict(data, source)


def load_cluster(name_or_path: str, gpus: int | None = None, usable_per_domain: int | None = None,
                 oversubscription: float | None = None) -> Cluster:
    """A cluster from a preset name (``gb300-nvl72``) or a YAML path.

    ``gpus``: presets are built with that many GPUs; a file is cut to its first ``gpus`` healthy
    GPUs in whole nodes. ``usable_per_domain``: NVL72 presets only (GPUs used per rack).
    ``oversubscription``: presets only, the ratio above the scalable unit.
    """
    if isinstance(name_or_path, Cluster):
        if gpus is not None and int(gpus) != name_or_path.num_gpus:
            return restrict(name_or_path, int(gpus), name_or_path.name)
        return name_or_path
    text = str(name_or_path).strip()
    if text.lower() in PRESETS:
        return build_preset(text, gpus=gpus, usable_per_domain=usable_per_domain,
                            oversubscription=1.0 if oversubscription is None else oversubscription)
    path = Path(text)
    looks_like_file = path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists() or "/" in text
    if not looks_like_file:
        raise InputError(f"unknown cluster {text!r}; use a preset ({', '.join(PRESETS)}) or a cluster YAML path")
    if usable_per_domain is not None:
        raise InputError(
            f"--usable-per-rack applies to NVL72 presets; for {text} list spare trays under health.spare_trays"
        )
    if oversubscription is not None:
        raise InputError(f"--oversubscription applies to presets; for {text} set tiers[].oversubscription in the file")
    cluster = read_cluster_file(path)
    if gpus is not None:
        cluster = restrict(cluster, int(gpus), text)
    return cluster


@dataclass(frozen=True)
class Job:
    """What ``--cluster C --gpus N [--usable-per-rack K]`` means on every command (plan, predict,
    scale, validate, topology show): the hardware a job of ``gpus`` GPUs runs on.

    ``cluster``: on an NVL72 preset, ceil(N/72) whole racks (every GPU healthy) -- the job uses N
    of them and the planner chooses how many of each rack (e.g. 4 x 64 or 72+72+72+40 for 256);
    with ``--usable-per-rack K``, ceil(N/K) racks of K usable GPUs (spare trays under
    ``health.spare_trays``) and K per rack is fixed. HGX presets: N/8 nodes. A cluster file: its
    first N healthy GPUs in whole nodes (``restrict``), as the file lays them out.
    ``gpus``: GPUs the job uses (at most ``cluster.num_gpus``). ``per_domain``: the fixed GPUs per
    NVLink domain (``--usable-per-rack``), or None when the planner chooses.
    """

    cluster: Cluster
    gpus: int
    per_domain: int | None = None

    @property
    def racks_gpus(self) -> int:
        """Healthy GPUs of the racks / nodes the job runs on."""
        return self.cluster.num_gpus


def load_job(name_or_path, gpus: int | None = None, usable_per_domain: int | None = None,
             oversubscription: float | None = None) -> Job:
    """The one function every command uses to turn its cluster options into a ``Job``."""
    if isinstance(name_or_path, Job):
        return name_or_path
    if isinstance(name_or_path, Cluster):
        c = load_cluster(name_or_path, gpus)
        return Job(c, c.num_gpus)
    text = str(name_or_path).strip()
    p = PRESETS.get(text.lower())
    if p is None or not p.nvl72 or usable_per_domain is not None:
        c = load_cluster(text, gpus=gpus, usable_per_domain=usable_per_domain, oversubscription=oversubscription)
        return Job(c, c.num_gpus, usable_per_domain if p is not None and p.nvl72 else None)
    # NVL72 preset, the planner chooses GPUs per rack: whole racks, N must be whole trays
    n = p.su_gpus if gpus is None else int(gpus)
    build_preset(text, gpus=n, oversubscription=1.0 if oversubscription is None else oversubscription)  # checks N
    dmax = get_gpu(p.gpu).nvlink_domain_max
    racks = math.ceil(n / dmax)
    c = build_preset(text, gpus=racks * dmax, oversubscription=1.0 if oversubscription is None else oversubscription)
    return Job(c, n, None)
