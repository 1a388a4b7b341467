"""The cloud scale-out network in the k8s pods (``--emit k8s``): what a pod claims to reach the host's NICs.

Without it a pod on a cloud GPU node gets the GPUs only, and NCCL falls back to TCP sockets on the pod's one
interface: the plan's collective times (EFA, TCPXO, RoCE in topologies/data/fabrics.yaml) would not hold. The
cluster's ``network`` (``topologies.cluster.NodeNetwork``, filled by the cloud presets with each source) says
how many devices a host has and how a pod reaches them:

* ``eks-efa`` (AWS p5, p5en, p6-b200, p6-b300, p6e-gb200): the EFA Kubernetes device plugin advertises each
  EFA device as ``vpc.amazonaws.com/efa``; a pod that owns the host asks for all of them, and for
  ``hugepages-2Mi: 5120Mi`` (the EFA driver pre-allocates 5,128 2 MiB pages; a pod asking hugepages must also
  ask memory or cpu), as the EKS user guide's node-efa training example does (docs.aws.amazon.com/eks/latest/
  userguide/node-efa.html: ``vpc.amazonaws.com/efa: 32``, ``hugepages-2Mi: 5120Mi``, ``memory: 32000Mi`` on a
  p5.48xlarge). ``FI_PROVIDER=efa`` and ``FI_EFA_FORK_SAFE=1`` as awslabs/awsome-distributed-ai's
  nccl-tests manifests set them.
* ``gke-tcpxo`` (GCP A3 Mega): GKE multi-networking puts the eight GPU NICs in the pod (``networking.gke.io/
  interfaces`` eth1-eth8 on vpc1-vpc8), the TCPXO receive-datapath manager runs beside the trainer
  (``tcpxo-daemon``, a native sidecar: an init container with ``restartPolicy: Always``, so the Job completes
  when the trainer does, GKE 1.29+), with the GPU device paths of ``devices.gke.io/container.tcpxo-daemon``;
  the trainer mounts the NCCL plug-in's libraries and ``/dev/aperture_devices`` and sources
  ``nccl-env-profile.sh`` before starting (GoogleCloudPlatform/container-engine-accelerators
  gpudirect-tcpxo/nccl-test-latest.yaml and best-practice.md).
* ``gke-rdma`` (GCP A3 Ultra, A4, A4X): the RDMA NICs as pod interfaces (eth2... on rdma-0...), the gIB NCCL
  plug-in from the host (``/home/kubernetes/bin/gib``) and its ``set_nccl_env.sh`` sourced before starting
  (gpudirect-rdma/nccl-test.yaml, nccl-test-a4.yaml, nccl-test-imex-a4x.yaml).

* ``aks-ib`` (Azure ND H100 v5, ND GB200 v6): the NVIDIA Network Operator's SR-IOV device plug-in advertises each
  InfiniBand NIC as ``rdma/ib`` (``resourcePrefix: rdma``, ``resourceName: ib``); one pod per VM claims them all
  (the "maximum performance" recommendation) with ``IPC_LOCK`` (else ``ulimit -l`` is 64 KiB and memory
  registration fails), and NCCL gets ``NCCL_IB_DISABLE=0``, ``NCCL_NET_GDR_LEVEL=SYS`` (Azure/aks-rdma-infiniband
  @700dabb: configs/nicclusterpolicy/sriov-device-plugin/sriov.yaml, website/docs/configurations/
  01-network-operator.md, tests/scenarios/test.sh ``sriov_nic_policy_gpu``, tests/scenarios/k8s/values.yaml
  ``ncclEnvVars``). The Network Operator and its SR-IOV policy are the cluster's; the pod only claims. On ND H100
  v5 the VM's NCCL topology file (the virtual PCI tree hides which NIC is beside which GPU) goes in the job's
  ConfigMap and ``NCCL_TOPO_FILE`` points at it, as the repo's mpi-job.yaml mounts it
  (topologies/data/nccl_topo/README.md).
* ``oke-rdma`` (OCI BM.GPU.H100.8, BM.GPU.B200.8): the pod runs in the host's network (``hostNetwork``,
  ``dnsPolicy: ClusterFirstWithHostNet``), mounts ``/dev/infiniband``, runs privileged with ``IPC_LOCK``, and
  sets the shape's NCCL settings: ``NCCL_IB_HCA`` (the cluster's ``network.hcas``, exact match), GID index 3
  (RoCE v2), traffic class 41, SL 0, timeout 22, no split on QPs, bootstrap on ``eth0``
  (oracle-quickstart/oci-hpc-oke@61d210a: docs/using-rdma-network-interfaces-in-manifests.md,
  manifests/nccl-tests/kueue/BM.GPU.H100.8.yaml and BM.GPU.B200.8.yaml). Left out of those manifests' list:
  ``NCCL_CUMEM_ENABLE=0`` (NCCL's NVLink SHARP needs cuMem, and the plan prices NVLS with
  ``NCCL_NVLS_ENABLE=2``), ``NCCL_IGNORE_CPU_AFFINITY`` (for mpirun's ``--bind-to numa``), ``UCX_*``/``HCOLL_*``
  (Open MPI's own transport) and ``NCCL_DEBUG``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import topologies

MOUNT = "/topoplan"   # where the pods mount the job's ConfigMap (the trainer's files, launch.sh, network files)
TOPO_DIR = Path(topologies.__file__).resolve().parent / "data" / "nccl_topo"   # NodeNetwork.topo_file's folder
EFA_RESOURCE = "vpc.amazonaws.com/efa"
EFA_HUGEPAGES = "5120Mi"     # EKS node-efa example (of 5,128 pre-allocated 2 MiB pages)
EFA_MEMORY = "32000Mi"       # the same example's memory request (hugepages need a memory or cpu request)
TCPXO_DAEMON = "tcpxo-daemon"
TCPXO_IMAGE = "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.21"
NVIDIA_LIB = "/usr/local/nvidia/lib64"
GIB = "/usr/local/gib"
AKS_IB_RESOURCE = "rdma/ib"     # the SR-IOV device plug-in's resourcePrefix/resourceName (sriov.yaml)
AKS_NCCL = {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "SYS"}   # tests/scenarios/k8s/values.yaml ncclEnvVars
OKE_NCCL = {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_TC": "41", "NCCL_IB_SL": "0", "NCCL_IB_TIMEOUT": "22",
            "NCCL_IB_SPLIT_DATA_ON_QPS": "0", "NCCL_SOCKET_IFNAME": "eth0"}   # BM.GPU.*.8 nccl-tests manifests


@dataclass
class PodNetwork:
    """Additions to the pod template: the trainer container's limits / requests / env / mounts, the pod's
    annotations, volumes and init (sidecar) containers, and shell lines launch.sh runs before the trainer."""

    limits: dict = field(default_factory=dict)
    requests: dict = field(default_factory=dict)
    env: list = field(default_factory=list)
    mounts: list = field(default_factory=list)
    annotations: dict = field(default_factory=dict)
    volumes: list = field(default_factory=list)
    init_containers: list = field(default_factory=list)
    prelude: list = field(default_factory=list)
    security: dict = field(default_factory=dict)   # the trainer container's securityContext
    pod: dict = field(default_factory=dict)        # pod spec fields (hostNetwork, dnsPolicy)
    files: dict = field(default_factory=dict)      # ConfigMap files under MOUNT: relative path -> text


def _interfaces(first: int, networks: list[str]) -> str:
    """The ``networking.gke.io/interfaces`` value: eth0 on the default network, then one NIC per network
    from eth<first> on."""
    nics = [{"interfaceName": "eth0", "network": "default"}]
    nics += [{"interfaceName": f"eth{first + i}", "network": net} for i, net in enumerate(networks)]
    return json.dumps(nics)


def _host(name: str, path: str) -> dict:
    return {"name": name, "hostPath": {"path": path}}


def _efa(n: int) -> PodNetwork:
    return PodNetwork(limits={EFA_RESOURCE: n, "hugepages-2Mi": EFA_HUGEPAGES}, requests={"memory": EFA_MEMORY},
                      env=[{"name": "FI_PROVIDER", "value": "efa"}, {"name": "FI_EFA_FORK_SAFE", "value": "1"}])


def _tcpxo(n: int, gpus: int) -> PodNetwork:
    devices = [f"/dev/nvidia{i}" for i in range(gpus)] + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/dmabuf_import_helper"]
    daemon = {"name": TCPXO_DAEMON, "image": TCPXO_IMAGE, "restartPolicy": "Always",
              "command": ["/bin/sh", "-c"],
              "args": ["set -ex\nchmod 755 /fts/entrypoint_rxdm_container.sh\n"
                       f"/fts/entrypoint_rxdm_container.sh --num_hops=2 --num_nics={n}\n"],
              "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_BIND_SERVICE"]}},
              "volumeMounts": [{"name": "nvidia", "mountPath": NVIDIA_LIB}, {"name": "sys", "mountPath": "/hostsysfs"},
                               {"name": "proc-sys", "mountPath": "/hostprocsysfs"}],
              "env": [{"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIB}]}
    return PodNetwork(
        env=[{"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIB}, {"name": "NCCL_LIB_DIR", "value": NVIDIA_LIB},
             {"name": "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY", "value": "/dev/aperture_devices"}],
        mounts=[{"name": "nvidia", "mountPath": NVIDIA_LIB},
                {"name": "aperture-devices", "mountPath": "/dev/aperture_devices"}],
        annotations={f"devices.gke.io/container.{TCPXO_DAEMON}": "".join(f"- path: {d}\n" for d in devices),
                     "networking.gke.io/default-interface": "eth0",
                     "networking.gke.io/interfaces": _interfaces(1, [f"vpc{i + 1}" for i in range(n)])},
        volumes=[_host("nvidia", "/home/kubernetes/bin/nvidia/lib64"), _host("sys", "/sys"),
                 _host("proc-sys", "/proc/sys"), _host("aperture-devices", "/dev/aperture_devices")],
        init_containers=[daemon],
        prelude=['source "$NCCL_LIB_DIR/nccl-env-profile.sh"   # GKE TCPXO: the NCCL plug-in\'s settings'])


def _rdma(n: int) -> PodNetwork:
    return PodNetwork(
        env=[{"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIB}],
        mounts=[{"name": "nvidia-host", "mountPath": "/usr/local/nvidia"}, {"name": "gib", "mountPath": GIB}],
        annotations={"networking.gke.io/default-interface": "eth0",
                     "networking.gke.io/interfaces": _interfaces(2, [f"rdma-{i}" for i in range(n)])},
        volumes=[_host("nvidia-host", "/home/kubernetes/bin/nvidia"), _host("gib", "/home/kubernetes/bin/gib")],
        prelude=[f"source {GIB}/scripts/set_nccl_env.sh   # GKE RDMA: the gIB NCCL plug-in's settings"])


def _env(values: dict) -> list[dict]:
    return [{"name": k, "value": v} for k, v in values.items()]


def _aks(n: int, topo_file: str) -> PodNetwork:
    net = PodNetwork(limits={AKS_IB_RESOURCE: n}, env=_env(AKS_NCCL),
                     security={"capabilities": {"add": ["IPC_LOCK"]}})
    if topo_file:   # the VM size's NCCL topology, in the ConfigMap (topologies/data/nccl_topo/README.md)
        net.files = {f"nccl/{topo_file}": (TOPO_DIR / topo_file).read_text()}
        net.env.append({"name": "NCCL_TOPO_FILE", "value": f"{MOUNT}/nccl/{topo_file}"})
    return net


def _oke(hcas: tuple[str, ...]) -> PodNetwork:
    return PodNetwork(env=_env({"NCCL_IB_HCA": "=" + ",".join(hcas)} | OKE_NCCL),
                      mounts=[{"name": "devinf", "mountPath": "/dev/infiniband"}],
                      volumes=[_host("devinf", "/dev/infiniband")],
                      security={"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}},
                      pod={"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"})


def pod_network(cluster, gpus_per_node: int) -> PodNetwork | None:
    """What the pods add for the cluster's scale-out devices (module docstring), or None."""
    net = getattr(cluster, "network", None)
    if net is None or net.kubernetes is None:
        return None
    if net.kubernetes == "eks-efa":
        return _efa(net.nics_per_node)
    if net.kubernetes == "gke-tcpxo":
        return _tcpxo(net.nics_per_node, gpus_per_node)
    if net.kubernetes == "aks-ib":
        return _aks(net.nics_per_node, net.topo_file)
    if net.kubernetes == "oke-rdma":
        return _oke(net.hcas)
    return _rdma(net.nics_per_node)
