"""Launch configs from a plan: the files a user runs with Megatron-LM, Megatron-Bridge, TorchTitan,
MaxText, Slurm and Kubernetes (JobSet / Kubeflow TrainJob with Kueue, and the cluster-side Kueue objects).

``emit_plan(plan_doc, trainers, out, index)`` reads one entry of a ``plan.json`` document (see
docs/architecture.md), builds an :class:`EmitContext` (model spec, layout, training setup, and for
every global rank the host, local GPU and NVLink domain the plan chose) and asks each trainer's
module for its files. Everything is staged and moved into ``out`` at once (``planner.io.atomic_dir``):
on any error nothing in ``out`` changes. docs/emitters.md lists the files and flags.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from planner.config import ParallelConfig, Training
from planner.cost.profiles import load_profile
from planner.cost.shape import LaunchShape, launch_shape, multi_host_cluster
from planner.errors import InputError, pydantic_message
from planner.io import atomic_dir, current_umask
from planner.output.emit.support import check_family
from planner.rules import violations
from planner.search.document import load_launch
from planner.trainers import EMITTER_ALIASES, EMITTER_OWNER, owner_of

# the launchers here: they start a trainer's files (the trainers' own emitters live in planner.trainers)
LAUNCHERS = ("slurm", "k8s", "k8s-cluster")
EMITTERS = tuple(EMITTER_OWNER) + LAUNCHERS
# what ``all`` names: every trainer and Slurm; the Kubernetes manifests (k8s, k8s-cluster) are asked for by name
ALL = tuple(EMITTER_OWNER) + LAUNCHERS[:1]


@dataclass(frozen=True)
class EmitContext:
    """Everything an emitter needs, resolved once from the plan document."""

    doc: dict
    index: int
    model: object            # planner.model.spec.ModelSpec
    config: ParallelConfig
    training: Training
    world: int
    gpu: str                 # GPU catalog key ("h100", "gb300", ...)
    sm: int                  # compute capability x10 (90, 100, 103)
    hosts: tuple[str, ...]   # hosts[r]: host of global rank r
    local: tuple[int, ...]   # local[r]: GPU index on that host
    domains: tuple[int, ...]  # domains[r]: NVLink domain of global rank r
    order: str               # Megatron rank order the placement assumes
    domain_size: int         # GPUs per NVLink domain in the cluster (largest domain)
    gpus_per_node: int       # GPUs per host the job uses (largest)
    cluster: object = None   # topologies.cluster.Cluster of the plan document
    trainers: tuple[str, ...] = ()  # the emitters render_files runs, in order (the Slurm task launches one)

    @property
    def layout(self):
        """The layout on this world (``planner.config.Layout``): every derived degree."""
        return self.config.on(self.world)

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def edp(self) -> int:
        return self.layout.edp

    @property
    def plan(self) -> dict:
        return self.doc["plans"][self.index]

    @property
    def host_order(self) -> list[str]:
        """Hosts in order of their first global rank."""
        seen: dict[str, None] = {}
        for h in self.hosts:
            seen.setdefault(h, None)
        return list(seen)


def launch_shape_of(ctx: EmitContext) -> LaunchShape:
    """The plan's shape (``planner.cost.shape``): domain slots, GPUs per host, domain-local axes, rank map."""
    names = dict(enumerate(ctx.cluster.domain_names())) if ctx.cluster is not None else None
    multi = multi_host_cluster(ctx.cluster) if ctx.cluster is not None else None
    return launch_shape(ctx.config, ctx.hosts, ctx.local, ctx.domains, order=ctx.order, domain_names=names,
                        multi_host=multi)


PLAN_VERSION = 1  # the plan.json document version written by planner.search.plan (docs/architecture.md)


def load_context(plan_doc: dict, index: int = 0) -> EmitContext:
    """Resolve plan entry ``index`` of ``plan_doc`` into an :class:`EmitContext` (InputError on bad input).

    The document is read through ``planner.search.document.LaunchDocument`` (the model spec, cluster
    and training setup as their own pydantic models); the layout must agree with its placement."""
    launch = load_launch(plan_doc)
    if not 0 <= index < len(launch.plans):
        raise InputError(f"--index {index}: plan.json holds plans 0..{len(launch.plans) - 1}; pick one of those")
    entry = launch.plans[index]
    model, cluster, training = launch.model.spec, launch.cluster, launch.training
    cfg_raw = dict(entry.config)
    known = set(ParallelConfig.model_fields)
    try:
        config = ParallelConfig.model_validate({k: v for k, v in cfg_raw.items() if k in known})
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, f"plan.json plans[{index}].config")) from None
    if config.dispatcher is None:  # absent or null in plan.json: the stack profile's dispatcher
        config = config.model_copy(update={"dispatcher": load_profile(training.stack).dispatcher})
    gbs = cfg_raw.get("gbs")
    if gbs is not None and gbs != training.global_batch:  # the solver chose the batch (--gbs-range)
        if not isinstance(gbs, int) or gbs < 1:
            raise InputError(f"plan.json plans[{index}].config.gbs: must be a positive integer, got {gbs!r}")
        training = training.model_copy(update={"global_batch": gbs})
    placement = entry.placement
    rank_to_gpu = list(placement.rank_to_gpu)
    world = len(rank_to_gpu)
    gpus = cluster.gpus()
    if len(set(rank_to_gpu)) != world or any(not (0 <= g < len(gpus)) for g in rank_to_gpu):
        raise InputError(f"plan.json plans[{index}].placement.rank_to_gpu: must name {world} distinct healthy GPUs "
                         f"out of {len(gpus)}")
    try:
        config.on(world)   # the layout fills the placement's ranks on both grids
    except ValueError as exc:
        raise InputError(f"plan.json plans[{index}]: {exc} (the placement has {world} ranks)") from None
    hosts = tuple(gpus[g].node for g in rank_to_gpu)
    local = tuple(gpus[g].local for g in rank_to_gpu)
    domains = tuple(gpus[g].domain for g in rank_to_gpu)
    for key, derived in (("hosts", hosts), ("local_ranks", local)):
        given = getattr(placement, key)
        if given is not None and tuple(given) != derived:
            raise InputError(f"plan.json plans[{index}].placement.{key} disagrees with rank_to_gpu on the cluster; "
                             "write the plan again with 'topoplan plan --save-plan'")
    per_node: dict[str, int] = {}
    for h in hosts:
        per_node[h] = per_node.get(h, 0) + 1
    sizes = cluster.domain_sizes()
    spec = cluster.gpu_spec
    return EmitContext(
        doc=plan_doc, index=index, model=model, config=config, training=training, world=world,
        gpu=spec.name, sm=int(spec.sm), hosts=hosts, local=local, domains=domains,
        order=placement.order,
        domain_size=max(sizes) if sizes else 1, gpus_per_node=max(per_node.values()), cluster=cluster,
    )


def parse_trainers(value: str | list[str]) -> list[str]:
    """``"megatron,slurm"`` -> ``["megatron", "slurm"]``; ``all`` gives every trainer and slurm (:data:`ALL`)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [s.strip().lower() for s in items if s and s.strip()]
    if not names:
        raise InputError("--trainer: name at least one of " + ", ".join(EMITTERS) + " (or all)")
    out: list[str] = []
    for n in names:
        n = {**EMITTER_ALIASES, "kubernetes": "k8s", "k8s_cluster": "k8s-cluster"}.get(n, n)
        if n == "all":
            out.extend(e for e in ALL if e not in out)
        elif n in EMITTERS:
            if n not in out:
                out.append(n)
        else:
            raise InputError(f"--trainer {n!r}: unknown; use one or more of {', '.join(EMITTERS)} (comma-separated) or all")
    return out


def for_trainer(ctx: EmitContext, name: str) -> EmitContext:
    """``ctx`` as emitter ``name``'s trainer runs it: a plan made for another trainer gets its training
    setup re-validated for this one (its auto recipe settings resolve by this trainer's rules), and the
    layout is checked against this trainer's rules (planner.rules): InputError naming the first broken
    rule, so no file is written that the trainer would refuse."""
    check_family(ctx.model, name, ctx.training.seq_len)
    owner = owner_of(name)   # the trainer whose rules the files must satisfy (Slurm launches the others')
    if owner is None:
        return ctx
    target = owner.name
    made, training = ctx.training.trainer, ctx.training
    where = f"--trainer {name}: plan {ctx.index} was made for {made}"
    if target != made:
        try:
            training = Training.model_validate({**training.model_dump(), "trainer": target})
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise InputError(f"{where}; {target} refuses its training setup: {msg}; "
                             f"plan again with --trainer {target}") from None
    broken = violations(ctx.model, ctx.config, training, ctx.world, target)
    if broken:
        again = f"; plan again with --trainer {target}" if target != made else "; plan again"
        raise InputError(f"{where}; {target} refuses {ctx.config.short()}: {broken[0].message} "
                         f"(rule {broken[0].rule}){again}")
    return dataclasses.replace(ctx, training=training)


def render_files(ctx: EmitContext, trainers: list[str]) -> dict[str, str]:
    """The files each trainer needs, as ``{relative path: text}``, each from the plan as that trainer
    runs it (:func:`for_trainer`)."""
    ctx = dataclasses.replace(ctx, trainers=tuple(trainers))
    files: dict[str, str] = {}
    for name in trainers:
        owner = owner_of(name)
        if owner is not None:
            files.update(owner.emit(for_trainer(ctx, name), name))
        else:
            mod = importlib.import_module(f"planner.output.emit.{name.replace('-', '_')}")
            files.update(mod.files(for_trainer(ctx, name)))
    return files


# What makes two plan documents the same plan (their solver statistics and timings may differ).
PLAN_IDENTITY = ("version", "model", "cluster", "training", "plans")


def _same_plan(old: dict, new: dict) -> bool:
    return isinstance(old, dict) and all(old.get(k) == new.get(k) for k in PLAN_IDENTITY)


def check_out(out: Path, plan_doc: dict | None, force: bool = False) -> None:
    """Refuse to mix launch files of two plans: ``out`` must be absent, empty, or hold the files of this
    same plan (its ``plan.json``), unless ``force`` (then it is replaced whole). ``plan_doc`` None (before a
    search): refuse only what no plan can match, a directory of other files."""
    out = Path(out)
    if force or not out.is_dir() or not any(out.iterdir()):
        return
    old = out / "plan.json"
    what = "files that are not topoplan's launch files (no plan.json)"
    if old.is_file() and plan_doc is None:
        return
    if old.is_file():
        try:
            if _same_plan(json.loads(old.read_bytes()), json.loads(json.dumps(plan_doc))):
                return
        except (ValueError, UnicodeDecodeError):
            pass
        what = "another plan's launch files (its plan.json differs)"
    raise InputError(f"--out {out}: holds {what}; give an empty or new directory, or --force to replace "
                     "its contents whole")


def emit_plan(plan_doc: dict, trainers: list[str] | str, out: Path, index: int = 0, force: bool = False) -> list[Path]:
    """Write ``plan.json`` and each trainer's launch files for plan ``index`` into ``out`` (atomic).

    ``out`` may hold the files of this same plan (they are replaced, others kept); another plan's files,
    or anything else, are refused unless ``force``, which replaces the directory whole (:func:`check_out`).
    Returns the written paths (under ``out``), sorted.
    """
    names = parse_trainers(trainers)
    out = Path(out)
    check_out(out, plan_doc, force)
    ctx = load_context(plan_doc, index)
    files = {"plan.json": json.dumps(plan_doc, indent=1) + "\n"}
    files.update(render_files(ctx, names))
    with atomic_dir(out, option="--out", replace=force) as stage:
        for rel, text in files.items():
            path = stage / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if rel.endswith(".sh"):
                path.chmod(0o777 & ~current_umask())   # executable, as the umask allows
    return sorted(out / rel for rel in files)
