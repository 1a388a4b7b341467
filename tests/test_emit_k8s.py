"""The Kubernetes manifests (``--emit k8s``, ``--emit k8s-cluster``) checked without a cluster:

* every document validates strictly against the official CRDs pinned in tests/data/k8s and the
  Kubernetes core schemas (tests/k8s_check.py), and a typo'd field fails (mutants);
* the job asks for exactly the plan's GPUs, in NVLink-domain slices, with a ComputeDomain claim;
* FILL_ME: the placeholder namespace is refused by the API server's own name rule, and launch.sh exits 2
  while any env value reads FILL_ME; filled in, it starts torchrun with node rank JOB_COMPLETION_INDEX;
* Kueue's topology-aware slice assignment (KEP 2724) modelled on a bigger cluster, with hypothesis: the
  trainer's groups (planner.cost.placement.rank_groups, megatron-core's RankGenerator arithmetic) that the
  plan keeps inside one NVLink domain stay inside one clique, whatever cliques and nodes Kueue picks.
"""

from __future__ import annotations

import copy
import uuid
import json
import random
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_run import run_cli
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k8s_check import documents, problems
from planner.config import ParallelConfig, Training
from planner.cost.placement import AXES, rank_groups
from planner.errors import InputError
from planner.launch.place import place
from planner.output.emit import emit_plan, launch_shape_of, load_context
from planner.trainers.megatron import emit as megatron
from planner.trainers.torchtitan import emit as torchtitan
from topologies.loader import load_cluster
from topologies.presets import build_preset
from trainers.plans import hgx_cluster, nvl72_cluster, plan_doc

DSV3_GB300 = dict(model="deepseek-v3", cluster=lambda: build_preset("gb300-nvl72", 256, usable_per_domain=64),
                  config=ParallelConfig(tp=1, pp=2, vpp=8, ep=32, mbs=1, recompute="mla_up_proj+moe_act",
                                        dispatcher="flex-hybridep"),
                  training=Training(seq_len=4096, global_batch=4096, precision="mxfp8"), world=256)
LLAMA8_HGX = dict(model="llama3-8b", cluster=lambda: hgx_cluster("h100", 2),
                  config=ParallelConfig(tp=2, pp=1, mbs=1, recompute="none"),
                  training=Training(seq_len=4096, global_batch=64, precision="bf16"), world=16)
QWEN_GB200 = dict(model="qwen3-30b-a3b", cluster=lambda: nvl72_cluster("gb200", 3, trays_per_rack=18),
                  config=ParallelConfig(tp=1, pp=1, ep=8, mbs=1, recompute="none"),
                  training=Training(seq_len=4096, global_batch=192, precision="bf16"), world=192,
                  per_domain=64)   # 16 of each rack's 18 trays
CASES = {"gb300-dsv3-megatron": (DSV3_GB300, ["megatron", "k8s", "k8s-cluster"]),
         "gb300-dsv3-torchtitan": (DSV3_GB300, ["torchtitan", "k8s", "k8s-cluster"]),
         "hgx-llama8b": (LLAMA8_HGX, ["megatron", "torchtitan", "k8s", "k8s-cluster"]),
         "gb200-qwen3": (QWEN_GB200, ["megatron", "k8s", "k8s-cluster"])}
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")   # apimachinery IsDNS1123Label (namespaces)


def _doc(spec):
    return plan_doc(spec["model"], spec["cluster"](), spec["config"], spec["training"], world=spec["world"],
                    gpus_per_domain=spec.get("per_domain", "auto"))


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """Each case emitted once: name -> (plan doc, output directory)."""
    out = {}
    for name, (spec, trainers) in CASES.items():
        doc = _doc(spec)
        d = tmp_path_factory.mktemp(name) / "launch"
        emit_plan(doc, trainers, d)
        out[name] = (doc, d)
    return out


def _manifests(d):
    return {p.relative_to(d).as_posix(): documents(p) for p in sorted(d.glob("k8s*/*.yaml"))}


def _kinds(d) -> dict[str, dict]:
    return {doc["kind"]: doc for docs in _manifests(d).values() for doc in docs}


def _workers(jobset: dict) -> tuple[int, dict]:
    rj = jobset["spec"]["replicatedJobs"]
    assert len(rj) == 1
    job = rj[0]["template"]["spec"]
    return rj[0]["replicas"] * job["parallelism"], job


# --- schemas --------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_every_manifest_passes_the_official_schemas_strictly(emitted, case):
    _, d = emitted[case]
    files = _manifests(d)
    want = {"k8s/configmap.yaml", "k8s/jobset.yaml", "k8s/trainjob.yaml", "k8s-cluster/kueue.yaml"}
    assert want <= set(files)
    kinds = []
    for rel, docs in files.items():
        for doc in docs:
            kinds.append(doc["kind"])
            assert problems(doc) == [], (rel, doc["kind"])
    assert {"ConfigMap", "JobSet", "TrainingRuntime", "TrainJob", "Topology", "ResourceFlavor", "ClusterQueue",
            "LocalQueue"} <= set(kinds)


MUTANTS = [  # (kind, path to a mapping, typo'd key): each is a field the CRD or core schema does not know
    ("JobSet", ["spec", "replicatedJobs", 0, "template", "spec"], "paralelism"),
    ("JobSet", ["spec", "replicatedJobs", 0, "template", "spec", "template", "spec", "containers", 0], "imagePullPolcy"),
    ("JobSet", ["spec", "replicatedJobs", 0, "template", "spec", "template", "spec"], "resourceClaim"),
    ("JobSet", ["metadata"], "label"),
    ("TrainJob", ["spec", "trainer"], "numNode"),
    ("TrainingRuntime", ["spec", "mlPolicy", "torch"], "numProcPerNode"),   # moved to TrainJob in Trainer v2.3
    ("ComputeDomain", ["spec", "channel"], "resourceClaimTemplates"),
    ("Topology", ["spec", "levels", 0], "nodeLable"),
    ("ResourceFlavor", ["spec"], "topology"),
    ("ClusterQueue", ["spec", "resourceGroups", 0, "flavors", 0, "resources", 0], "quota"),
    ("ConfigMap", [], "datas"),
    ("Configuration", ["resources", "deviceClassMappings", 0], "deviceClassName"),
]


@pytest.mark.parametrize("kind,path,key", MUTANTS, ids=[f"{k}.{key}" for k, _, key in MUTANTS])
def test_a_typod_field_fails_validation(emitted, kind, path, key):
    doc = copy.deepcopy(_kinds(emitted["gb300-dsv3-megatron"][1])[kind])
    assert problems(doc) == []
    node = doc
    for p in path:
        node = node[p]
    node[key] = 1
    found = problems(doc)
    assert found and any(key in f for f in found), found


def test_a_wrong_type_fails_validation(emitted):
    js = copy.deepcopy(_kinds(emitted["gb300-dsv3-megatron"][1])["JobSet"])
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = "64"   # an integer field
    assert problems(js)


# --- what the job asks for ---------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_job_asks_for_exactly_the_plans_gpus_in_domain_slices(emitted, case):
    doc, d = emitted[case]
    ctx = load_context(doc)
    shape = launch_shape_of(ctx)
    kinds = _kinds(d)
    pods, job = _workers(kinds["JobSet"])
    pod = job["template"]
    gpus = pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert pods * gpus == ctx.world == len(doc["plans"][0]["placement"]["rank_to_gpu"])
    assert (pods, gpus) == (shape.hosts, shape.gpus_per_host)
    assert job["completionMode"] == "Indexed" and job["completions"] == pods
    ann = pod["metadata"]["annotations"]
    assert ann["kueue.x-k8s.io/podset-preferred-topology"] == "network.topology.nvidia.com/spine"
    levels = [lv["nodeLabel"] for lv in kinds["Topology"]["spec"]["levels"]]
    assert ann["kueue.x-k8s.io/podset-preferred-topology"] in levels and levels[-1] == "kubernetes.io/hostname"
    assert kinds["ResourceFlavor"]["spec"]["topologyName"] == kinds["Topology"]["metadata"]["name"]
    group = kinds["ClusterQueue"]["spec"]["resourceGroups"][0]
    quota = {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]}
    assert quota["nvidia.com/gpu"] == ctx.cluster.num_gpus and set(group["coveredResources"]) == set(quota)
    if not shape.multi_host_domains:            # HGX: the host is the domain; no slices, no IMEX
        assert "kueue.x-k8s.io/podset-slice-size" not in ann and "ComputeDomain" not in kinds
        assert "Configuration" not in kinds and list(quota) == ["nvidia.com/gpu"]
        assert "resourceClaims" not in pod["spec"]
        return
    size = int(ann["kueue.x-k8s.io/podset-slice-size"])
    assert ann["kueue.x-k8s.io/podset-slice-required-topology"] == "nvidia.com/gpu.clique" == levels[1]
    assert pods % size == 0 and pods // size == len(shape.slots)
    assert all(s.hosts == size for s in shape.slots)
    # the pod claims the IMEX channel of the ComputeDomain
    cd = kinds["ComputeDomain"]
    rct = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    claims = pod["spec"]["resourceClaims"]
    assert [c["resourceClaimTemplateName"] for c in claims] == [rct]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": claims[0]["name"]}]
    # Kueue charges the claim's DeviceClass (the DRA driver's channel class) to a mapped, covered resource:
    # one channel per pod, so the cluster's hosts
    mapping = kinds["Configuration"]["resources"]["deviceClassMappings"]
    assert [m["deviceClassNames"] for m in mapping] == [["compute-domain-default-channel.nvidia.com"]]
    assert quota[mapping[0]["name"]] == len({g.node for g in ctx.cluster.gpus()})   # healthy hosts
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["NCCL_MNNVL_ENABLE"] == "1"
    # the TrainJob asks for the same pods
    rt = kinds["TrainingRuntime"]["spec"]
    assert (rt["mlPolicy"]["numNodes"], kinds["TrainJob"]["spec"]["trainer"]["numNodes"]) == (pods, pods)
    assert kinds["TrainJob"]["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == gpus
    tpod = rt["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert tpod["metadata"] == pod["metadata"] and tpod["spec"]["resourceClaims"] == claims


def test_nccl_settings_are_the_slurm_files(emitted, tmp_path):
    """The pod env carries the same NCCL values as slurm/sbatch.sh exports (one function makes both)."""
    doc, _ = emitted["gb300-dsv3-megatron"]
    out = tmp_path / "both"
    emit_plan(doc, ["megatron", "slurm", "k8s"], out)
    sb = (out / "slurm" / "sbatch.sh").read_text()
    exported = dict(re.findall(r"^export (NCCL_[A-Z_]+)=(\S+)$", sb, flags=re.M))
    pod = _workers(_kinds(out)["JobSet"])[1]["template"]
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"].startswith("NCCL_")}
    fixed = {k: v for k, v in env.items() if not v.startswith("FILL_ME")}
    assert fixed == exported and fixed == {"NCCL_NVLS_ENABLE": "2", "NCCL_MNNVL_ENABLE": "1"}
    filled_in = set(re.findall(r'^: "\$\{(NCCL_\w+):=FILL_ME', sb, flags=re.M))
    assert {k for k, v in env.items() if v.startswith("FILL_ME")} == filled_in


# --- placeholders and the launcher ----------------------------------------------------------------

def test_placeholder_namespace_is_refused_until_filled(emitted):
    _, d = emitted["gb300-dsv3-megatron"]
    namespaced = [doc for docs in _manifests(d).values() for doc in docs
                  if doc["kind"] not in ("Topology", "ResourceFlavor", "ClusterQueue", "Configuration")]
    assert len(namespaced) >= 6
    for doc in namespaced:
        ns = doc["metadata"]["namespace"]
        assert ns == "FILL_ME_namespace" and not DNS1123_LABEL.match(ns), doc["kind"]
    text = (d / "k8s" / "jobset.yaml").read_text().replace("FILL_ME_namespace", "team-a")
    assert DNS1123_LABEL.match(yaml.safe_load(text.split("\n---\n")[0])["metadata"]["namespace"])
    for rel in ("k8s/jobset.yaml", "k8s/trainjob.yaml"):
        body = (d / rel).read_text()
        assert "image: FILL_ME_image" in body and "kueue.x-k8s.io/queue-name: FILL_ME_queue" in body


def _launch(d, tmp_path, env):
    script = tmp_path / "launch.sh"
    cm = _kinds(d)["ConfigMap"]
    root = tmp_path / "root"
    for item in _workers(_kinds(d)["JobSet"])[1]["template"]["spec"]["volumes"][0]["configMap"]["items"]:
        f = root / item["path"]
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(cm["data"][item["key"]])
    script.write_text(cm["data"]["launch.sh"])
    chan = tmp_path / "imex"
    chan.mkdir(exist_ok=True)
    (chan / "channel0").write_text("")
    base = {"PATH": "/usr/bin:/bin", "TOPOPLAN_DIR": str(root), "TOPOPLAN_IMEX_CHANNELS": str(chan),
            "TOPOPLAN_DRY_RUN": "1"}
    return subprocess.run(["bash", str(script)], env={**base, **env}, capture_output=True, text=True)


@pytest.mark.parametrize("case", ["gb300-dsv3-megatron", "gb300-dsv3-torchtitan", "hgx-llama8b"])
def test_launch_script_parses_in_bash_and_passes_shellcheck(emitted, tmp_path, case):
    script = tmp_path / "launch.sh"
    script.write_text(_kinds(emitted[case][1])["ConfigMap"]["data"]["launch.sh"])
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck); bash -n passed")
    p = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def _pod_env(d) -> dict[str, str]:
    pod = _workers(_kinds(d)["JobSet"])[1]["template"]
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("case", ["gb300-dsv3-megatron", "gb300-dsv3-torchtitan"])
def test_launcher_refuses_placeholders_and_starts_torchrun_at_the_completion_index(emitted, tmp_path, case):
    doc, d = emitted[case]
    ctx = load_context(doc)
    env = _pod_env(d)
    p = _launch(d, tmp_path, {**env, "JOB_COMPLETION_INDEX": "5"})
    assert p.returncode == 2 and "TOPOPLAN_DATA_ARGS=FILL_ME_data_args" in p.stderr and not p.stdout
    filled = {k: ("mock" if k == "TOPOPLAN_DATA_ARGS" else "auto" if k.startswith("NCCL_") else "/opt/mlm")
              if v.startswith("FILL_ME") else v for k, v in env.items()}
    for k in [k for k, v in env.items() if v.startswith("FILL_ME")]:     # each one alone stops it
        p = _launch(d, tmp_path, {**filled, k: env[k], "JOB_COMPLETION_INDEX": "5"})
        assert p.returncode == 2 and k in p.stderr, k
    p = _launch(d, tmp_path, {**filled, "JOB_COMPLETION_INDEX": "5"})
    assert p.returncode == 0, p.stderr
    argv = shlex.split(p.stdout.replace("\\\n", " "))
    shape = launch_shape_of(ctx)
    assert argv[:11] == ["torchrun", "--nnodes", str(shape.hosts), "--nproc-per-node", str(shape.gpus_per_host),
                         "--node-rank", "5", "--master-addr", env["MASTER_ADDR"], "--master-port", "29500"]
    name = _kinds(d)["JobSet"]["metadata"]["name"]
    assert env["MASTER_ADDR"] == f"{name}-workers-0-0.{name}"   # JobSet's pod 0 on its headless service
    if "megatron" in case:
        assert argv[11:] == ["/opt/mlm/pretrain_gpt.py", *megatron.megatron_args(ctx)]
    else:
        assert argv[11:] == ["-m", "torchtitan.train", *torchtitan.command_args(ctx)]
    p = _launch(d, tmp_path, {**filled, "JOB_COMPLETION_INDEX": "5", "TOPOPLAN_IMEX_CHANNELS": str(tmp_path / "none")})
    assert p.returncode == 2 and "no IMEX channel" in p.stderr


def test_real_data_replaces_mock_data(emitted, tmp_path):
    doc, d = emitted["gb300-dsv3-megatron"]
    env = {k: ("auto" if k.startswith("NCCL_") else "/opt/mlm") if v.startswith("FILL_ME") else v
           for k, v in _pod_env(d).items()}
    env["TOPOPLAN_DATA_ARGS"] = "--data-path /d/text_document --tokenizer-model '/m/tok dir'"
    p = _launch(d, tmp_path, {**env, "JOB_COMPLETION_INDEX": "0"})
    assert p.returncode == 0, p.stderr
    argv = shlex.split(p.stdout.replace("\\\n", " "))
    want = [a for a in megatron.megatron_args(load_context(doc)) if a != "--mock-data"]
    assert argv[11:] == ["/opt/mlm/pretrain_gpt.py", *want, "--data-path", "/d/text_document",
                         "--tokenizer-model", "/m/tok dir"]


def test_bridge_pods_start_run_recipe_and_other_trainers_are_refused(tmp_path):
    doc = _doc(LLAMA8_HGX)
    d = tmp_path / "launch"
    emit_plan(doc, ["bridge", "k8s"], d)
    env = {k: ("auto" if k.startswith("NCCL_") else "mock" if k == "TOPOPLAN_DATA_ARGS" else "/opt/mb")
           if v.startswith("FILL_ME") else v for k, v in _pod_env(d).items()}
    assert env["TOPOPLAN_TRAINER"] == "bridge" and env["MEGATRON_BRIDGE"] == "/opt/mb"
    p = _launch(d, tmp_path, {**env, "JOB_COMPLETION_INDEX": "1"})
    assert p.returncode == 0, p.stderr
    argv = shlex.split(p.stdout)
    lines = [x for x in (d / "bridge" / "overrides.txt").read_text().splitlines() if x and x[0] != "#"]
    assert argv[11:] == ["/opt/mb/scripts/training/run_recipe.py", "--recipe", "llama3_8b_pretrain_config", *lines]
    assert argv[5:7] == ["--node-rank", "1"] and "model.tensor_model_parallel_size=2" in argv
    p = _launch(d, tmp_path, {**env, "JOB_COMPLETION_INDEX": "1", "TOPOPLAN_TRAINER": "megatron"})
    assert p.returncode == 2 and "files of bridge only" in p.stderr and not p.stdout


# --- refusals ---------------------------------------------------------------------------------------

def test_plan_without_whole_domain_rank_blocks_is_refused(tmp_path):
    doc = _doc(QWEN_GB200)
    r2g = doc["plans"][0]["placement"]
    # swap two hosts of different racks: domain blocks are no longer consecutive node ranks
    a, b = r2g["rank_to_gpu"][:4], r2g["rank_to_gpu"][-4:]
    r2g["rank_to_gpu"][:4], r2g["rank_to_gpu"][-4:] = b, a
    r2g["hosts"] = r2g["local_ranks"] = None
    with pytest.raises(InputError, match="not whole hosts of consecutive ranks, NVLink domain by domain"):
        emit_plan(doc, ["torchtitan", "k8s"], tmp_path / "o")   # megatron refuses first: its HybridEP groups split
    assert not (tmp_path / "o").exists()


def test_plan_with_unequal_domain_slots_is_refused(tmp_path):
    cluster = nvl72_cluster("gb200", 2, trays_per_rack=3)      # 3 + 3 trays: a 16-GPU plan uses 3 + 1
    doc = plan_doc("llama3-8b", cluster, ParallelConfig(tp=4, pp=1, mbs=1, recompute="none"),
                   Training(seq_len=4096, global_batch=16), world=16, gpus_per_domain=None)
    with pytest.raises(InputError, match=r"uses 1 and 3 hosts in different NVLink domains"):
        emit_plan(doc, ["megatron", "k8s"], tmp_path / "o")


def test_k8s_needs_a_torchrun_trainer(tmp_path):
    with pytest.raises(InputError, match="add megatron or torchtitan"):
        emit_plan(_doc(LLAMA8_HGX), ["k8s"], tmp_path / "o")


# --- Kueue's topology-aware slice assignment, modelled ------------------------------------------

def tas_assign(pods: int, slice_size: int, cliques: dict[str, list[str]], rng: random.Random) -> list[str]:
    """Node of each pod (index = JOB_COMPLETION_INDEX) under Kueue TAS with a required slice topology.

    KEP 2724 ("Two-level Topology Aware scheduling"): the PodSet is cut into slices of ``slice_size``
    pods and each slice lands on nodes of one domain of the required level (a domain may take several
    slices); which domains, and which nodes inside them, the algorithm (BestFit, LeastFreeCapacity, ...)
    picks is left open here: at random. The TopologyUngater's rank-based ordering (rank = completion
    index for a JobSet of one Job) hands out consecutive ranks domain by domain, so slice k is pods
    k*slice_size ... (k+1)*slice_size-1; inside its domain each pod may get any of the slice's nodes."""
    free = {c: rng.sample(nodes, len(nodes)) for c, nodes in cliques.items()}
    out: list[str] = []
    for _ in range(pods // slice_size):
        fits = [c for c, nodes in free.items() if len(nodes) >= slice_size]
        if not fits:
            raise AssertionError("the drawn cluster cannot hold the job")
        c = rng.choice(fits)
        take, free[c] = free[c][:slice_size], free[c][slice_size:]
        out += rng.sample(take, slice_size)
    return out


# (model, racks the plan uses, trays per rack it uses, tp, ep, pp): layouts the placement keeps in racks
LAYOUTS = [(m, racks, trays, tp, ep, pp)
           for m in ("qwen3-30b-a3b",) for racks in (1, 2, 3, 4) for trays in (2, 4, 8, 16)
           for tp in (1, 2, 4) for ep in (1, 8, 16, 32) for pp in (1, 2)
           if tp * ep > 1 and (trays * 4) % (tp * ep) == 0 and (racks * trays * 4) % (tp * pp) == 0
           and (racks * trays * 4 // pp) % (ep * tp) == 0]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.sampled_from(LAYOUTS), extra_racks=st.integers(0, 4), busy=st.integers(0, 2),
       seed=st.integers(0, 2**32 - 1))
def test_kueue_slices_keep_every_domain_local_group_in_one_clique(tmp_path, layout, extra_racks, busy, seed):
    model, racks, trays, tp, ep, pp = layout
    cluster = nvl72_cluster("gb200", racks, trays_per_rack=trays)
    config = ParallelConfig(tp=tp, ep=ep, pp=pp, mbs=1, recompute="none")
    world = racks * trays * 4
    doc = plan_doc(model, cluster, config, Training(seq_len=4096, global_batch=world), world=world)
    ctx = load_context(doc)
    shape = launch_shape_of(ctx)
    out = tmp_path / f"o{uuid.uuid4().hex}"   # a fresh directory per example (--out refuses another plan's files)
    emit_plan(doc, ["megatron", "k8s"], out)
    pods, job = _workers(_kinds(out)["JobSet"])
    tpl = job["template"]
    gpus = tpl["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    size = int(tpl["metadata"]["annotations"].get("kueue.x-k8s.io/podset-slice-size", 1))
    # a bigger cluster: the plan's racks and more, 18 trays each, some trays busy with other jobs
    rng = random.Random(seed)
    names = [f"clique-{rng.randrange(10**6):06d}-{i}" for i in range(racks + extra_racks)]
    cliques = {c: [f"{c}-node{t:02d}" for t in range(18 - rng.randint(0, busy))] for c in names}
    node_of_pod = tas_assign(pods, size, cliques, rng)
    clique_of = {n: c for c, nodes in cliques.items() for n in nodes}
    # rank -> node as the pods compute it: torchrun's rank = node rank (completion index) * gpus + local
    node_of_rank = [node_of_pod[r // gpus] for r in range(pods * gpus)]
    assert len(node_of_rank) == world
    assert shape.local_axes, layout          # every drawn layout keeps some group inside a domain
    for axis in shape.local_axes:
        for group in rank_groups(config, world, axis, order=ctx.order):
            assert len({clique_of[node_of_rank[r]] for r in group}) == 1, (axis, group)
    # the same grant through `place` (lines shuffled): when Kueue gave every slice its own clique, place
    # and the pods' own order give every group of every axis the plan's number of domains
    if len({clique_of[n] for n in node_of_pod}) == len(shape.slots):
        granted = [(n, clique_of[n]) for n in node_of_pod]
        rng.shuffle(granted)
        placed = place(doc, granted)
        plan_dom = [ctx.domains[r] for r in range(world)]
        for axis in AXES:
            for g in rank_groups(config, world, axis, order=ctx.order):
                want = len({plan_dom[r] for r in g})
                assert len({clique_of[node_of_rank[r]] for r in g}) == want, (axis, g)
                assert len({clique_of[placed.hosts[r]] for r in g}) == want, (axis, g)


def test_slice_model_has_teeth():
    """Without slices (any pod on any free node of the cluster) an EP group of the plan splits."""
    layout = ("qwen3-30b-a3b", 2, 8, 1, 32, 1)
    model, racks, trays, tp, ep, pp = layout
    config = ParallelConfig(tp=tp, ep=ep, pp=pp, mbs=1, recompute="none")
    world = racks * trays * 4
    rng = random.Random(1)
    cliques = {f"c{i}": [f"c{i}-n{t}" for t in range(18)] for i in range(4)}
    clique_of = {n: c for c, nodes in cliques.items() for n in nodes}
    everywhere = rng.sample([n for nodes in cliques.values() for n in nodes], world // 4)
    broken = [g for g in rank_groups(config, world, "ep")
              if len({clique_of[everywhere[r // 4]] for r in g}) > 1]
    assert broken
    good = tas_assign(world // 4, trays, cliques, rng)
    assert all(len({clique_of[good[r // 4]] for r in g}) == 1 for g in rank_groups(config, world, "ep"))


# --- from `topology import k8s` to the manifests, through the CLI ---------------------------------

def _cli(*argv):
    p = run_cli(*argv)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.slow   # three CLI runs, a plan among them
def test_topology_import_k8s_feeds_the_manifests(tmp_path):
    """kubectl's node list (clique labels) -> cluster.yaml -> plan -> emit k8s,k8s-cluster via the CLI."""
    cliques = [f"7f3c0d2e-aaaa-4bbb-8ccc-00000000000{r}.{r + 1}" for r in range(3)]
    items = [{"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": f"gb200-r{r}-t{t:02d}",
                           "labels": {"nvidia.com/gpu.clique": cliques[r], "nvidia.com/gpu.product": "NVIDIA-GB200"}},
              "status": {"capacity": {"nvidia.com/gpu": "4"}}} for r in range(3) for t in range(18)]
    items.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-0"}, "status": {"capacity": {}}})
    (tmp_path / "nodes.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    rc, _, err = _cli("topology", "import", "k8s", str(tmp_path / "nodes.json"), "-o", str(tmp_path / "cluster.yaml"))
    assert rc == 0, err
    cluster = load_cluster(str(tmp_path / "cluster.yaml"))
    assert cluster.domain_names() == cliques and cluster.num_gpus == 216
    doc = plan_doc("qwen3-30b-a3b", cluster, ParallelConfig(tp=1, pp=1, ep=16, mbs=1, recompute="none"),
                   Training(seq_len=4096, global_batch=192), world=192, gpus_per_domain=64)
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    rc, out, err = _cli("emit", str(tmp_path / "plan.json"), "--trainer", "megatron,k8s,k8s-cluster",
                        "--out", str(tmp_path / "launch"), "--json")
    assert rc == 0, err
    written = {Path(f).relative_to(tmp_path / "launch").as_posix() for f in json.loads(out)["files"]}
    assert {"k8s/jobset.yaml", "k8s/computedomain.yaml", "k8s-cluster/kueue.yaml"} <= written
    kinds = _kinds(tmp_path / "launch")
    assert all(problems(d) == [] for d in kinds.values())
    pods, job = _workers(kinds["JobSet"])
    assert pods == 48 and job["template"]["metadata"]["annotations"]["kueue.x-k8s.io/podset-slice-size"] == "16"
    assert [lv["nodeLabel"] for lv in kinds["Topology"]["spec"]["levels"]][1] == "nvidia.com/gpu.clique"
    assert kinds["ClusterQueue"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == 216
    rc, _, err = _cli("emit", str(tmp_path / "plan.json"), "--trainer", "k8s", "--out", str(tmp_path / "none"))
    assert rc == 2 and err.startswith("error: --emit k8s:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "none").exists()


@pytest.mark.trainers
def test_kueue_grant_keeps_megatron_cores_own_groups_in_their_cliques(tmp_path):
    """DeepSeek-V3 on GB300 (EP32 inside each 16-tray slice): a Kueue grant on a bigger cluster, the pods'
    completion-index order and place's hostfile, checked with megatron-core 0.19.2's RankGenerator."""
    from test_launch_trainers import _job, _megatron_groups
    doc = _doc(DSV3_GB300)
    out = tmp_path / "o"
    emit_plan(doc, ["megatron", "k8s"], out)
    pods, job = _workers(_kinds(out)["JobSet"])
    size = int(job["template"]["metadata"]["annotations"]["kueue.x-k8s.io/podset-slice-size"])
    rng = random.Random(7)
    cliques = {f"cl-{i}": [f"cl-{i}-n{t:02d}" for t in range(18 - i % 3)] for i in range(9)}
    clique_of = {n: c for c, nodes in cliques.items() for n in nodes}
    node_of_pod = tas_assign(pods, size, cliques, rng)
    granted = [(n, clique_of[n]) for n in node_of_pod]
    rng.shuffle(granted)
    placed = place(doc, granted)
    ctx = load_context(doc)
    groups = _megatron_groups([_job(doc, "dsv3")], tmp_path)["dsv3"]
    pods_dom = [clique_of[node_of_pod[r // 4]] for r in range(ctx.world)]
    placed_dom = [clique_of[h] for h in placed.hosts]
    assert launch_shape_of(ctx).local_axes.get("ep") == 32
    for axis, gs in groups.items():
        want = [len({ctx.domains[r] for r in g}) for g in gs]
        assert [len({pods_dom[r] for r in g}) for g in gs] == want, axis
        assert [len({placed_dom[r] for r in g}) for g in gs] == want, axis
    assert all(len({pods_dom[r] for r in g}) == 1 for g in groups["ep"])


@pytest.mark.slow   # the planner's search in a subprocess
def test_plan_emit_k8s_in_one_step(tmp_path):
    """The issue's flow: `topoplan plan ... --emit megatron,slurm,k8s,k8s-cluster --out launch/`: the chosen
    plan's manifests pass the schemas and ask for its GPUs in clique slices."""
    rc, _, err = _cli("plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus", "256",
                      "--usable-per-rack", "64", "--gbs", "4096", "--emit", "megatron,slurm,k8s,k8s-cluster",
                      "--out", str(tmp_path / "launch"))
    assert rc == 0, err
    doc = json.loads((tmp_path / "launch" / "plan.json").read_text())
    shape = launch_shape_of(load_context(doc))
    kinds = _kinds(tmp_path / "launch")
    assert all(problems(d) == [] for d in kinds.values())
    pods, job = _workers(kinds["JobSet"])
    tpl = job["template"]
    assert pods * tpl["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == shape.world == 256
    assert int(tpl["metadata"]["annotations"]["kueue.x-k8s.io/podset-slice-size"]) * len(shape.slots) == pods
    assert (tmp_path / "launch" / "slurm" / "sbatch.sh").exists() and "ComputeDomain" in kinds
