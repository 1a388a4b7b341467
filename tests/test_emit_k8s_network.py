"""The cloud scale-out network in the k8s pods (planner/output/emit/k8s_network.py, docs/k8s.md): EFA devices and
hugepages on AWS, GKE multi-networking with TCPXO or the gIB RDMA plug-in on GCP, nothing extra elsewhere.

The device counts are written here from the clouds' own pages (the oracle), not read from the presets:
EC2 User Guide efa-acc-inst-types (network cards, one EFA each): p5.48xlarge 32, p5en.48xlarge 16 (200 Gb/s
EFAv3 each), p6-b200.48xlarge 8, p6-b300.48xlarge 16 (cards 1-16 EFA-only), p6e-gb200.36xlarge 4 x 400 Gb/s
(awsome-distributed-ai nccl-tests-gb200.yaml asks vpc.amazonaws.com/efa: 4); GKE
(GoogleCloudPlatform/container-engine-accelerators): A3 Mega eth1-eth8 on vpc1-vpc8, A3 Ultra / A4 eth2-eth9 on
rdma-0..7, A4X eth2-eth5 on rdma-0..3.
Azure (Azure/aks-rdma-infiniband@700dabb): configs/nicclusterpolicy/sriov-device-plugin/sriov.yaml advertises
``resourcePrefix: rdma``, ``resourceName: ib``; tests/scenarios/test.sh sriov_nic_policy_gpu claims
``rdma/ib=${GPU_PER_NODE_NUMBER}`` with ``capabilities.add={IPC_LOCK}``; tests/scenarios/k8s/values.yaml
``ncclEnvVars``: NCCL_NET_GDR_LEVEL SYS, NCCL_IB_DISABLE "0". learn.microsoft.com nd-h100-v5-series: 8 GPUs,
one NIC each; nd-gb200-v6-series: 4 GPUs and 4 NICs per VM.
OCI (oracle-quickstart/oci-hpc-oke@61d210a manifests/nccl-tests/kueue/BM.GPU.H100.8.yaml, BM.GPU.B200.8.yaml, the
worker template and the launcher's ``-x`` list): hostNetwork, ClusterFirstWithHostNet, /dev/infiniband hostPath,
privileged with IPC_LOCK, and the NCCL_IB_* values below.
"""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from k8s_check import documents, problems
from planner.config import ParallelConfig, Training
from planner.output.emit import emit_plan
from topologies.presets import build_preset
from trainers.plans import plan_doc

EFA = {"aws-p5": 32, "aws-p5en": 16, "aws-p6-b200": 8, "aws-p6-b300": 16, "aws-p6e-gb200": 4}
GKE = {"gcp-a3-mega": ("gke-tcpxo", [f"vpc{i}" for i in range(1, 9)], 1),
       "gcp-a3-ultra": ("gke-rdma", [f"rdma-{i}" for i in range(8)], 2),
       "gcp-a4": ("gke-rdma", [f"rdma-{i}" for i in range(8)], 2),
       "gcp-a4x": ("gke-rdma", [f"rdma-{i}" for i in range(4)], 2)}
PLAIN = ("dgx-h100",)
AKS = {"azure-nd-h100-v5": 8, "azure-nd-gb200-v6": 4}
NDV5_TOPO_SHA256 = "c26ff47f1decf03d44ee6e90c4a8afd3bddeec334c5545008f33af2a297e2834"
AKS_ENV = {"NCCL_NET_GDR_LEVEL": "SYS", "NCCL_IB_DISABLE": "0"}
OKE_ENV = {"NCCL_IB_SPLIT_DATA_ON_QPS": "0", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_TC": "41", "NCCL_IB_SL": "0",
           "NCCL_IB_TIMEOUT": "22", "NCCL_SOCKET_IFNAME": "eth0"}
OKE_HCA = {"oci-h100": "=mlx5_0,mlx5_1,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_8,mlx5_9,mlx5_10,mlx5_12,mlx5_13,"
                       "mlx5_14,mlx5_15,mlx5_16,mlx5_17",
           "oci-b200": "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11"}


def _emit(preset: str, tmp_path) -> tuple[dict, dict, str]:
    """(JobSet, TrainJob, launch.sh) for Llama 3 8B TP2 on two hosts' worth of the preset (one NVL72 rack's 8
    trays on the GB200 presets)."""
    nvl = preset in ("aws-p6e-gb200", "gcp-a4x", "azure-nd-gb200-v6")
    cluster = build_preset(preset, 32 if nvl else 16, usable_per_domain=32 if nvl else None)
    world = cluster.num_gpus
    doc = plan_doc("llama3-8b", cluster, ParallelConfig(tp=2, mbs=1, recompute="none"),
                   Training(seq_len=4096, global_batch=2 * world, precision="bf16"), world=world)
    d = tmp_path / preset
    emit_plan(doc, ["megatron", "k8s"], d)
    kinds = {x["kind"]: x for p in sorted((d / "k8s").glob("*.yaml")) for x in documents(p)}
    for x in kinds.values():
        assert problems(x) == [], (preset, x["kind"])   # strict schemas, incl. the pod templates
    return kinds["JobSet"], kinds["TrainJob"], kinds["ConfigMap"]["data"]["launch.sh"]


def _pod(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


@pytest.mark.parametrize("preset", list(EFA))
def test_aws_pods_claim_every_efa_device_and_hugepages(preset, tmp_path):
    jobset, trainjob, launch = _emit(preset, tmp_path)
    pod = _pod(jobset)
    res = pod["spec"]["containers"][0]["resources"]
    gpus = build_preset(preset, 32 if preset == "aws-p6e-gb200" else 16).gpu_spec.gpus_per_node
    assert res["limits"] == {"nvidia.com/gpu": gpus, "vpc.amazonaws.com/efa": EFA[preset], "hugepages-2Mi": "5120Mi"}
    assert res["requests"] == {"memory": "32000Mi"}   # hugepages need a memory (or cpu) request
    # the TrainJob's override asks the same (the IMEX channel claim of an NVL72 rack stays in the template)
    assert trainjob["spec"]["trainer"]["resourcesPerNode"] == {k: v for k, v in res.items() if k != "claims"}
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["FI_PROVIDER"] == "efa"
    assert "networking.gke.io/interfaces" not in pod["metadata"]["annotations"]


@pytest.mark.parametrize("preset", list(GKE))
def test_gcp_pods_get_their_nics_as_interfaces(preset, tmp_path):
    kind, nets, first = GKE[preset]
    jobset, trainjob, launch = _emit(preset, tmp_path)
    pod = _pod(jobset)
    ann = pod["metadata"]["annotations"]
    nics = json.loads(ann["networking.gke.io/interfaces"])
    assert nics[0] == {"interfaceName": "eth0", "network": "default"}
    assert [n["network"] for n in nics[1:]] == nets
    assert [n["interfaceName"] for n in nics[1:]] == [f"eth{first + i}" for i in range(len(nets))]
    c = pod["spec"]["containers"][0]
    assert set(c["resources"]["limits"]) == {"nvidia.com/gpu"}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    if kind == "gke-tcpxo":
        (daemon,) = pod["spec"]["initContainers"]
        assert daemon["name"] == "tcpxo-daemon" and daemon["restartPolicy"] == "Always"   # a native sidecar
        assert f"--num_nics={len(nets)}" in daemon["args"][0]
        devices = ann["devices.gke.io/container.tcpxo-daemon"].split("\n")
        assert [x for x in devices if "/dev/nvidia" in x and x[-1].isdigit()] == [
            f"- path: /dev/nvidia{i}" for i in range(8)]
        assert "/dev/aperture_devices" in mounts and 'source "$NCCL_LIB_DIR/nccl-env-profile.sh"' in launch
    else:
        assert "initContainers" not in pod["spec"]
        assert "/usr/local/gib" in mounts and "source /usr/local/gib/scripts/set_nccl_env.sh" in launch
    subprocess.run(["bash", "-n"], input=launch, text=True, check=True)


def _env(container: dict) -> dict:
    return {e["name"]: e["value"] for e in container["env"]}


@pytest.mark.parametrize("preset", list(AKS))
def test_azure_pods_claim_every_infiniband_nic(preset, tmp_path):
    jobset, trainjob, launch = _emit(preset, tmp_path)
    pod = _pod(jobset)
    c = pod["spec"]["containers"][0]
    gpus = 4 if preset == "azure-nd-gb200-v6" else 8
    assert c["resources"]["limits"] == {"nvidia.com/gpu": gpus, "rdma/ib": AKS[preset]}
    assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}   # not privileged (SR-IOV plug-in)
    env = _env(c)
    assert {k: env[k] for k in AKS_ENV} == AKS_ENV
    assert env["NCCL_IB_HCA"].startswith("FILL_ME")   # NCCL_IB_HCA stays the user's (the source sets none)
    assert trainjob["spec"]["trainer"]["resourcesPerNode"]["limits"] == c["resources"]["limits"]
    assert "hostNetwork" not in pod["spec"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    # ND H100 v5: the VM's NCCL topology file, byte for byte the source's (sha256 of Azure/aks-rdma-infiniband
    # @700dabb tests/scenarios/nvidia-topology/ndv5-topo.xml), in the ConfigMap at the path NCCL_TOPO_FILE names
    items = {i["path"]: i["key"] for v in pod["spec"]["volumes"] if "configMap" in v for i in v["configMap"]["items"]}
    if preset == "azure-nd-h100-v5":
        assert env["NCCL_TOPO_FILE"] == "/topoplan/nccl/ndv5-topo.xml"
        (cm,) = documents(tmp_path / preset / "k8s" / "configmap.yaml")
        text = cm["data"][items["nccl/ndv5-topo.xml"]]
        assert hashlib.sha256(text.encode()).hexdigest() == NDV5_TOPO_SHA256
        assert text.count('class="0x030200"') == 8 and text.count('class="0x020700"') == 8   # 8 GPUs, 8 IB NICs
    else:   # none published for ND GB200 v6
        assert "NCCL_TOPO_FILE" not in env and not any(p.startswith("nccl/") for p in items)
    subprocess.run(["bash", "-n"], input=launch, text=True, check=True)


@pytest.mark.parametrize("preset", list(OKE_HCA))
def test_oci_pods_use_the_host_rdma_devices_with_the_shape_settings(preset, tmp_path):
    jobset, trainjob, launch = _emit(preset, tmp_path)
    pod = _pod(jobset)
    c = pod["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert c["securityContext"] == {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}}
    assert {"name": "devinf", "hostPath": {"path": "/dev/infiniband"}} in pod["spec"]["volumes"]
    assert {"name": "devinf", "mountPath": "/dev/infiniband"} in c["volumeMounts"]
    env = _env(c)
    assert env["NCCL_IB_HCA"] == OKE_HCA[preset]
    assert len(OKE_HCA[preset].split(",")) == (16 if preset == "oci-h100" else 8)   # dual-port H100, single B200
    assert {k: env[k] for k in OKE_ENV} == OKE_ENV
    assert "NCCL_CUMEM_ENABLE" not in env   # the source's =0 would turn NVLink SHARP off (module docstring)
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names))   # no FILL_ME duplicate beside the shape's values
    assert not any(v.startswith("FILL_ME") for k, v in env.items() if k.startswith("NCCL_"))
    rt = trainjob["spec"]["trainer"]
    assert rt["resourcesPerNode"] == c["resources"]
    subprocess.run(["bash", "-n"], input=launch, text=True, check=True)


@pytest.mark.parametrize("preset", PLAIN)
def test_other_clusters_ask_for_gpus_only(preset, tmp_path):
    jobset, _, launch = _emit(preset, tmp_path)
    pod = _pod(jobset)
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert "initContainers" not in pod["spec"] and "source /usr/local" not in launch
    assert not any(k.startswith("networking.gke.io") for k in pod["metadata"]["annotations"])


def test_a_cluster_file_can_state_its_network(tmp_path):
    """A user's cluster file with ``network`` gets the same requests as the preset (the field is the contract)."""
    from topologies.cluster import Cluster, NodeNetwork
    base = build_preset("dgx-h100", 16)
    mine = Cluster.model_validate(base.to_dict() | {"fabric": "efa", "network": {"nics_per_node": 4,
                                                                                 "kubernetes": "eks-efa"}})
    assert mine.network == NodeNetwork(nics_per_node=4, kubernetes="eks-efa")
    doc = plan_doc("llama3-8b", mine, ParallelConfig(tp=2, mbs=1, recompute="none"),
                   Training(seq_len=4096, global_batch=32, precision="bf16"), world=16)
    emit_plan(doc, ["megatron", "k8s"], tmp_path / "o")
    (js,) = [x for x in documents(tmp_path / "o" / "k8s" / "jobset.yaml")]
    assert _pod(js)["spec"]["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] == 4
    with pytest.raises(ValueError):
        NodeNetwork(nics_per_node=0)


@pytest.mark.parametrize("preset,expect", [("azure-nd-h100-v5", ("rdma/ib", 8)), ("oci-h100", ("hostNetwork", True))])
def test_a_preset_plan_through_the_cli_writes_the_pods_network(preset, expect, tmp_path):
    """`topoplan plan --cluster <preset> --gpus 64 --emit megatron,k8s --out DIR`: the written manifests parse as
    YAML, pass the strict schemas and carry the cloud's network (the JobSet and the TrainingRuntime alike)."""
    from cli_run import run_cli
    p = run_cli("plan", "--model", "llama3-8b", "--cluster", preset, "--gpus", "64", "--gbs", "512",
                "--emit", "megatron,k8s", "--out", str(tmp_path / "launch"))
    assert p.returncode == 0, p.stderr
    docs = [d for f in sorted((tmp_path / "launch" / "k8s").glob("*.yaml")) for d in documents(f)]
    assert docs and all(problems(d) == [] for d in docs)
    kinds = {d["kind"]: d for d in docs}
    pods = [_pod(kinds["JobSet"]), kinds["TrainingRuntime"]["spec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]]
    key, value = expect
    for pod in pods:
        c = pod["spec"]["containers"][0]
        got = c["resources"]["limits"].get(key) if "/" in key else pod["spec"].get(key)
        assert got == value
        assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]


@pytest.mark.parametrize("preset,hosts,want", [
    ("azure-nd-h100-v5", 2, {"nvidia.com/gpu": 16, "rdma/ib": 16}),
    ("aws-p5", 2, {"nvidia.com/gpu": 16, "vpc.amazonaws.com/efa": 64, "hugepages-2Mi": "10240Mi",
                   "memory": "64000Mi"}),
    ("oci-b200", 2, {"nvidia.com/gpu": 16}),
    ("azure-nd-gb200-v6", 8, {"nvidia.com/gpu": 32, "rdma/ib": 32, "nvidia.com/imex-channel": 8})])
def test_the_cluster_queue_covers_what_the_pods_ask(preset, hosts, want, tmp_path):
    """Kueue admits no workload asking a resource its ClusterQueue does not cover (flavorassigner.go
    findFlavorForPodSetResource: "resource ... unavailable in ClusterQueue"): the emitted queue covers the pods'
    NICs, hugepages and memory, one pod per host (hand products: 2 p5 hosts x 32 EFA, x 5120Mi, x 32000Mi)."""
    nvl = preset == "azure-nd-gb200-v6"
    cluster = build_preset(preset, 32 if nvl else 16, usable_per_domain=32 if nvl else None)
    world = cluster.num_gpus
    doc = plan_doc("llama3-8b", cluster, ParallelConfig(tp=2, mbs=1, recompute="none"),
                   Training(seq_len=4096, global_batch=2 * world, precision="bf16"), world=world)
    emit_plan(doc, ["megatron", "k8s", "k8s-cluster"], tmp_path)
    kinds = {d["kind"]: d for d in documents(tmp_path / "k8s-cluster" / "kueue.yaml")}
    assert all(problems(d) == [] for d in kinds.values())
    (group,) = kinds["ClusterQueue"]["spec"]["resourceGroups"]
    assert {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]} == want
    assert set(group["coveredResources"]) == set(want)
    (js,) = documents(tmp_path / "k8s" / "jobset.yaml")
    res = _pod(js)["spec"]["containers"][0]["resources"]
    assert set(res["limits"]) | set(res.get("requests", {})) <= set(want)   # every resource a pod asks is covered


@pytest.mark.parametrize("network,words", [
    ({"nics_per_node": 8, "kubernetes": "aks-ib", "topo_file": "ndv4-topo.xml"}, "topo_file: 'ndv4-topo.xml'"),
    ({"nics_per_node": 8, "kubernetes": "aks-ib", "topo_file": "../cluster.py"}, "topo_file: '../cluster.py'"),
    ({"nics_per_node": 8, "kubernetes": "eks-efa", "topo_file": "ndv5-topo.xml"}, "only kubernetes aks-ib"),
    ({"nics_per_node": 2, "kubernetes": "eks-efa", "hcas": ["mlx5_0", "mlx5_1"]}, "only kubernetes oke-rdma"),
    ({"nics_per_node": 2, "kubernetes": "oke-rdma", "hcas": ["mlx5_0,mlx5_1", "mlx5_2"]}, "'mlx5_0,mlx5_1'")])
def test_a_cluster_file_with_a_bad_network_field_gets_one_line(network, words, tmp_path):
    """A topo_file that is not one of topologies/data/nccl_topo (else emit read a missing or outside file and
    ended in a traceback), a topo_file or hcas on a kind that never uses them (silently dropped before), an hcas
    entry that is not one device name: exit 2, one line naming the file and the field, nothing written."""
    import yaml

    from cli_run import run_cli
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(build_preset("dgx-h100", 16).to_dict() | {"network": network}))
    p = run_cli("plan", "--model", "llama3-8b", "--cluster", f, "--gbs", "64", "--emit", "megatron,k8s",
                "--out", tmp_path / "o")
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert "mine.yaml" in line and "'network'" in line and words in line
    assert not (tmp_path / "o").exists()


def test_an_oke_cluster_file_without_hcas_leaves_nccl_ib_hca_to_the_user(tmp_path):
    """oke-rdma with no ``hcas`` (the field's 'empty = NCCL_IB_HCA is the user's'): the pods get the shape's other
    settings and NCCL_IB_HCA as a FILL_ME placeholder, not the empty list '=' (NCCL: no device matches, no IB)."""
    from topologies.cluster import Cluster
    mine = Cluster.model_validate(build_preset("dgx-h100", 16).to_dict()
                                  | {"fabric": "roce", "network": {"nics_per_node": 8, "kubernetes": "oke-rdma"}})
    doc = plan_doc("llama3-8b", mine, ParallelConfig(tp=2, mbs=1, recompute="none"),
                   Training(seq_len=4096, global_batch=32, precision="bf16"), world=16)
    emit_plan(doc, ["megatron", "k8s"], tmp_path / "o")
    (js,) = documents(tmp_path / "o" / "k8s" / "jobset.yaml")
    env = _env(_pod(js)["spec"]["containers"][0])
    assert env["NCCL_IB_HCA"].startswith("FILL_ME") and env["NCCL_IB_GID_INDEX"] == "3"
