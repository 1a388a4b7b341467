"""Kubernetes launch manifests (``--emit k8s``): what a GB200/GB300 NVL72 (or HGX) cluster running
JobSet or Kubeflow Trainer v2, Kueue topology-aware scheduling and NVIDIA's DRA driver needs.

Files (docs/k8s.md walks through them; docs/emitters.md lists the fields):

* ``k8s/configmap.yaml``: the emitted trainer's files (megatron/args.txt, torchtitan/command.txt, ...)
  and ``launch.sh``, mounted at ``/topoplan`` in every pod.
* ``k8s/computedomain.yaml`` (multi-node NVLink only): a ComputeDomain (resource.nvidia.com/v1beta1);
  its ``spec.channel.resourceClaimTemplate.name`` is the ResourceClaimTemplate the pods claim their
  IMEX channel from.
* ``k8s/jobset.yaml``: a JobSet (jobset.x-k8s.io/v1alpha2), one replicated Job of ``nodes`` pods in
  Indexed completion mode, one pod per host.
* ``k8s/trainjob.yaml``: the same pods as a Kubeflow Trainer v2 TrainingRuntime + TrainJob
  (trainer.kubeflow.org/v1alpha1). Apply one of jobset.yaml and trainjob.yaml, not both.

Rank order. Pod ``i`` of the Job (``JOB_COMPLETION_INDEX``) is node rank ``i``; torchrun gives its
local rank ``l`` global rank ``i * gpus_per_node + l``, so the plan's ranks must be whole hosts of
consecutive ranks and every NVLink domain the plan uses a consecutive block of ``slice_hosts`` hosts
(:func:`k8s_shape` refuses other plans). Kueue's pod template annotations ask for slices of
``slice_hosts`` pods, each inside one ``nvidia.com/gpu.clique``; Kueue's rank-based ordering of
pods (KEP 2724; Kueue v0.19.2 pkg/controller/tas/topology_ungater.go, with the JobSet pod set's ranks
from ``batch.kubernetes.io/job-completion-index`` and ``jobset.sigs.k8s.io/job-index``,
pkg/controller/jobs/jobset/jobset_controller.go ``PodSets``) gives slice ``k`` the pods
``k * slice_hosts ...``, so every group the plan keeps inside a domain stays inside one clique, whichever
cliques and nodes Kueue picks (tests/test_emit_k8s.py models that assignment).

Placeholders. Every namespaced object names ``metadata.namespace: FILL_ME_namespace``, which is not a
valid namespace name (RFC 1123 label: lower case, no underscore), so ``kubectl apply`` rejects every
object until it is replaced; ``launch.sh`` exits 2 while any environment value still reads FILL_ME
(image, queue, data, trainer home, NCCL interfaces), as slurm/task.sh does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from planner.errors import InputError
from planner.output.emit import EmitContext, launch_shape_of, render_files
from planner.output.emit.k8s_network import MOUNT, PodNetwork, pod_network
from planner.output.emit.slurm import (FILL, IMEX_CHANNELS, MASTER_PORT, TRAINER_HOME, unlaunchable,
                                       multi_node_nvlink, nccl_env, placeholder, site_settings, trainer_shell)
from planner.trainers import LAUNCH

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
CLIQUE_LABEL = "nvidia.com/gpu.clique"            # the NVLink domain (GPU Feature Discovery / DRA driver)
BLOCK_LABEL = "network.topology.nvidia.com/spine"  # NVIDIA topograph's spine label: the preferred level
HOST_LABEL = "kubernetes.io/hostname"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SLICE_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
NAMESPACE = placeholder("namespace")   # FILL_ME_namespace, invalid on purpose: nothing applies until replaced
IMAGE = placeholder("image")
QUEUE = placeholder("queue")
REPLICATED_JOB = "workers"
TRAINER_NODE = "node"             # Kubeflow Trainer's replicated Job and container name (constants.Node)
TRAINER_PORT = 29400              # Kubeflow Trainer's PET_MASTER_PORT (constants.ContainerTrainerPort)
K8S_TRAINERS = tuple(t for t, launch in LAUNCH.items() if not launch.per_host)   # torchrun trainers, default first


@dataclass(frozen=True)
class K8sShape:
    """What the job asks Kubernetes for: ``nodes`` pods of ``gpus_per_node`` GPUs, in slices of
    ``slice_hosts`` consecutive pods that must share one NVLink domain (``mnnvl``: a domain spans
    hosts, so the pods need an IMEX channel)."""

    nodes: int
    gpus_per_node: int
    slice_hosts: int
    mnnvl: bool

    @property
    def slices(self) -> int:
        return self.nodes // self.slice_hosts


def k8s_shape(ctx: EmitContext) -> K8sShape:
    """The plan's shape (``planner.cost.shape``) as pods, or InputError (one line) when the pod order
    cannot be the plan's rank order: rank r must sit on node rank r // gpus_per_host, and domain slot k
    on node ranks k * hosts ... (k + 1) * hosts - 1, every slot the same number of hosts."""
    shape = launch_shape_of(ctx)
    sizes = sorted({s.hosts for s in shape.slots})
    if len(sizes) != 1:
        raise InputError(f"--emit k8s: the plan uses {' and '.join(map(str, sizes))} hosts in different NVLink "
                         "domains; Kueue's podset slices are all one size: plan with --usable-per-rack so that "
                         "every rack gives the same number")
    n, per = shape.gpus_per_host, sizes[0]
    if shape.world % n or any(r // n != slot * per + host for r, (slot, host, _) in enumerate(shape.ranks)):
        raise InputError("--emit k8s: the plan's ranks are not whole hosts of consecutive ranks, NVLink domain by "
                         "domain (pod i runs ranks i * gpus_per_host ...); emit slurm for this placement")
    return K8sShape(nodes=shape.hosts, gpus_per_node=n, slice_hosts=per, mnnvl=multi_node_nvlink(ctx))


def job_name(ctx: EmitContext) -> str:
    """``tp-<model>``: a DNS label short enough for the pods' host names (<name>-workers-0-<index>)."""
    slug = re.sub(r"[^a-z0-9]+", "-", ctx.model.name.lower()).strip("-")
    return ("tp-" + slug)[:40].rstrip("-")


def trainer_of(ctx: EmitContext) -> str:
    """The trainer the pods start: the first emitted of the torchrun trainers (:data:`K8S_TRAINERS`) that can
    start this plan (Megatron-Bridge needs a recipe: its emitter's ``unlaunchable``)."""
    for t in K8S_TRAINERS:
        if t in ctx.trainers and unlaunchable(ctx, t) is None:
            return t
    raise InputError("--emit k8s: the pods start a torchrun trainer emitted with them; add megatron or "
                     "torchtitan (or bridge for a model with a Megatron-Bridge recipe), e.g. --emit megatron,k8s")


def settings(ctx: EmitContext, trainer: str) -> list[tuple[str, str]]:
    """(variable, comment) of every value the user fills in the pod env (FILL_ME_<what> until then); not those
    the cluster's network sets (``k8s_network``)."""
    out = [("TOPOPLAN_DATA_ARGS", "mock (synthetic data, as emitted), or your trainer's data arguments as "
                                  "shell words, e.g. --data-path /data/tok/text_document ...")]
    if trainer in TRAINER_HOME:
        out.append((TRAINER_HOME[trainer][0], TRAINER_HOME[trainer][1] + " inside the image"))
    fixed = {e["name"] for e in network_of(ctx, k8s_shape(ctx)).env}   # the cloud's own (oke-rdma: NCCL_IB_HCA)
    out += [(v, c) for v, c in site_settings(ctx, []) if v.startswith("NCCL_") and v not in fixed]
    return out


def network_of(ctx: EmitContext, shape: K8sShape) -> PodNetwork:
    """The pods' additions for the cluster's scale-out devices (``k8s_network``); empty without them."""
    return pod_network(ctx.cluster, shape.gpus_per_node) or PodNetwork()


def launch_script(ctx: EmitContext, shape: K8sShape, trainer: str) -> str:
    """``/topoplan/launch.sh``: refuse placeholders, check the IMEX channel, start torchrun with node rank
    ``JOB_COMPLETION_INDEX`` and the trainer command slurm/task.sh builds (``slurm.trainer_shell``).
    TOPOPLAN_DRY_RUN=1 prints the command instead."""
    return f"""#!/usr/bin/env bash
# Pod launcher written by topoplan for plan {ctx.index}: {ctx.model.name}, {ctx.config.short()},
# {ctx.world} x {ctx.gpu} as {shape.nodes} pods of {shape.gpus_per_node} GPUs ({trainer}). Node rank = the
# pod's JOB_COMPLETION_INDEX, global rank = node rank * {shape.gpus_per_node} + local rank (the plan's order).
set -euo pipefail
ROOT="${{TOPOPLAN_DIR:-{MOUNT}}}"
MNNVL={int(shape.mnnvl)}
TRAINER="${{TOPOPLAN_TRAINER:-{trainer}}}"
bad=0
for v in $(compgen -e); do
  case "${{!v}}" in
    *{FILL}*) echo "topoplan: $v=${{!v}} is a placeholder: fill it in (k8s/jobset.yaml or k8s/trainjob.yaml)" >&2; bad=1 ;;
  esac
done
[ "$bad" = 0 ] || exit 2
if [ "$TRAINER" != {trainer} ]; then
  echo "topoplan: TOPOPLAN_TRAINER=$TRAINER: these pods carry the files of {trainer} only; emit again with --trainer $TRAINER,k8s" >&2
  exit 2
fi
for v in NCCL_IB_HCA NCCL_SOCKET_IFNAME NCCL_IB_GID_INDEX; do
  if [ "${{!v:-}}" = auto ]; then unset "$v"; fi
done
NODE_RANK="${{JOB_COMPLETION_INDEX:?run as an Indexed Job pod (JobSet or TrainJob)}}"
MASTER_ADDR="${{MASTER_ADDR:-${{PET_MASTER_ADDR:?no MASTER_ADDR}}}}"
MASTER_PORT="${{MASTER_PORT:-${{PET_MASTER_PORT:-{MASTER_PORT}}}}}"
if [ "$MNNVL" = 1 ] && ! compgen -G "${{TOPOPLAN_IMEX_CHANNELS:-{IMEX_CHANNELS}}}/channel*" >/dev/null; then
  echo "topoplan: no IMEX channel in ${{TOPOPLAN_IMEX_CHANNELS:-{IMEX_CHANNELS}}}: the pod needs the ComputeDomain's claim (k8s/computedomain.yaml)" >&2
  exit 2
fi
{"".join(line + chr(10) for line in network_of(ctx, shape).prelude)}
{trainer_shell(ctx)}
topoplan_trainer_env "$TRAINER"
cmd=$(trainer_cmd "$TRAINER" "torchrun --nnodes {shape.nodes} --nproc-per-node {shape.gpus_per_node} --node-rank $NODE_RANK --master-addr $MASTER_ADDR --master-port $MASTER_PORT")
if [ "${{TOPOPLAN_DRY_RUN:-0}}" = 1 ]; then echo "$cmd"; exit 0; fi
eval "exec $cmd"
"""


def _key(path: str) -> str:
    """A ConfigMap key for a relative path (keys may not hold '/')."""
    return path.replace("/", "__")


def config_map(ctx: EmitContext, shape: K8sShape, name: str, trainer: str) -> tuple[dict, list[dict]]:
    """The ConfigMap of the trainer's files and launch.sh, and the volume items that mount them."""
    files = dict(render_files(ctx, [trainer]))
    files["launch.sh"] = launch_script(ctx, shape, trainer)
    files |= network_of(ctx, shape).files   # e.g. the VM's NCCL topology file (k8s_network)
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": f"{name}-files", "namespace": NAMESPACE},
          "data": {_key(p): text for p, text in sorted(files.items())}}
    items = [{"key": _key(p), "path": p} for p in sorted(files)]
    return cm, items


def pod_template(ctx: EmitContext, shape: K8sShape, name: str, trainer: str, items: list[dict], *,
                 container: str, master: str | None) -> dict:
    """The pod template shared by the JobSet and the TrainingRuntime."""
    env = [{"name": "TOPOPLAN_TRAINER", "value": trainer}]
    if master:   # Kubeflow Trainer injects PET_MASTER_ADDR/PORT itself (and refuses them in the template)
        env += [{"name": "MASTER_ADDR", "value": master}, {"name": "MASTER_PORT", "value": str(MASTER_PORT)}]
    env += [{"name": k, "value": v} for k, v in nccl_env(ctx).items()]
    env += [{"name": v, "value": placeholder(v)} for v, _ in settings(ctx, trainer)]
    net = network_of(ctx, shape)
    c = {"name": container, "image": IMAGE, "command": ["bash", f"{MOUNT}/launch.sh"], "env": env + net.env,
         "resources": node_resources(ctx, shape),
         "volumeMounts": [{"name": "topoplan", "mountPath": MOUNT, "readOnly": True},
                          {"name": "dshm", "mountPath": "/dev/shm"}] + net.mounts}
    spec = {"restartPolicy": "Never", "containers": [c],
            "volumes": [{"name": "topoplan", "configMap": {"name": f"{name}-files", "items": items}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}] + net.volumes}
    if net.security:
        c["securityContext"] = net.security
    spec |= net.pod
    if net.init_containers:   # native sidecars: they stop when the trainer container ends
        spec["initContainers"] = net.init_containers
    if shape.mnnvl:
        c["resources"]["claims"] = [{"name": "imex-channel"}]
        spec["resourceClaims"] = [{"name": "imex-channel", "resourceClaimTemplateName": f"{name}-imex-channel"}]
    ann = {PREFERRED_TOPOLOGY: BLOCK_LABEL}
    if shape.mnnvl:
        ann |= {SLICE_TOPOLOGY: CLIQUE_LABEL, SLICE_SIZE: str(shape.slice_hosts)}
    return {"metadata": {"annotations": ann | net.annotations}, "spec": spec}


def node_resources(ctx: EmitContext, shape: K8sShape) -> dict:
    """The trainer container's resources: the host's GPUs, and its scale-out devices where the cluster's
    network says how a pod claims them (EFA devices and hugepages; ``k8s_network``)."""
    net = network_of(ctx, shape)
    out = {"limits": {"nvidia.com/gpu": shape.gpus_per_node} | net.limits}
    if net.requests:
        out["requests"] = dict(net.requests)
    return out


def compute_domain(name: str) -> dict:
    return {"apiVersion": COMPUTE_DOMAIN_API, "kind": "ComputeDomain",
            "metadata": {"name": f"{name}-imex", "namespace": NAMESPACE},
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-imex-channel"}}}}


def job_spec(shape: K8sShape, template: dict) -> dict:
    return {"completionMode": "Indexed", "completions": shape.nodes, "parallelism": shape.nodes,
            "backoffLimit": 0, "template": template}


def jobset(ctx: EmitContext, shape: K8sShape, name: str, trainer: str, items: list[dict]) -> dict:
    tpl = pod_template(ctx, shape, name, trainer, items, container="trainer",
                       master=f"{name}-{REPLICATED_JOB}-0-0.{name}")
    return {"apiVersion": JOBSET_API, "kind": "JobSet",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {QUEUE_LABEL: QUEUE}},
            "spec": {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                     "failurePolicy": {"maxRestarts": 0},
                     "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1,
                                         "template": {"spec": job_spec(shape, tpl)}}]}}


def trainjob(ctx: EmitContext, shape: K8sShape, name: str, trainer: str, items: list[dict]) -> list[dict]:
    tpl = pod_template(ctx, shape, name, trainer, items, container=TRAINER_NODE, master=None)
    runtime = {"apiVersion": TRAINER_API, "kind": "TrainingRuntime",
               "metadata": {"name": f"{name}-runtime", "namespace": NAMESPACE},
               "spec": {"mlPolicy": {"numNodes": shape.nodes, "torch": {}},   # v2.3: procs per node in the TrainJob
                        "template": {"spec": {
                            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                            "replicatedJobs": [{
                                "name": TRAINER_NODE, "replicas": 1,
                                "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step":
                                                                     "trainer"}},
                                             "spec": job_spec(shape, tpl)}}]}}}}
    job = {"apiVersion": TRAINER_API, "kind": "TrainJob",
           "metadata": {"name": name, "namespace": NAMESPACE, "labels": {QUEUE_LABEL: QUEUE}},
           "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                   "name": f"{name}-runtime"},
                    "trainer": {"numNodes": shape.nodes, "numProcPerNode": shape.gpus_per_node,
                                "resourcesPerNode": node_resources(ctx, shape)}}}
    return [runtime, job]


def render(header: list[str], docs: list[dict]) -> str:
    text = "".join("# " + line + "\n" for line in header)
    return text + "---\n".join(yaml.safe_dump(d, sort_keys=False, width=1000) for d in docs)


def header(ctx: EmitContext, shape: K8sShape, what: str) -> list[str]:
    return [f"{what}, written by topoplan for plan {ctx.index}: {ctx.model.name}, {ctx.config.short()},",
            f"{ctx.world} x {ctx.gpu} as {shape.nodes} pods x {shape.gpus_per_node} GPUs"
            + (f", {shape.slices} NVLink-domain slices of {shape.slice_hosts} pods." if shape.mnnvl else "."),
            f"{NAMESPACE} (not a valid namespace: kubectl apply refuses it) and every other {FILL}_* value",
            "must be replaced first; the pods exit 2 while an env value reads FILL_ME. See docs/k8s.md."]


def files(ctx: EmitContext) -> dict[str, str]:
    shape = k8s_shape(ctx)
    trainer = trainer_of(ctx)
    name = job_name(ctx)
    cm, items = config_map(ctx, shape, name, trainer)
    fill = [f"  {v}: {c}" for v, c in settings(ctx, trainer)]
    out = {"k8s/configmap.yaml": render(header(ctx, shape, "Trainer files and launch.sh"), [cm]),
           "k8s/jobset.yaml": render(header(ctx, shape, "JobSet") + [
               "Fill in: image, queue (the Kueue LocalQueue), and in env:"] + fill,
               [jobset(ctx, shape, name, trainer, items)]),
           "k8s/trainjob.yaml": render(header(ctx, shape, "Kubeflow Trainer v2 TrainingRuntime + TrainJob "
                                              "(instead of jobset.yaml)") + [
               "Fill in: image, queue (the Kueue LocalQueue), and in env:"] + fill,
               trainjob(ctx, shape, name, trainer, items))}
    if shape.mnnvl:
        out["k8s/computedomain.yaml"] = render(header(ctx, shape, "ComputeDomain (IMEX channel for multi-node "
                                                      "NVLink)"), [compute_domain(name)])
    return out
