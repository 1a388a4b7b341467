"""Importers: the examples of hardware.md section 4 import; bad input gives one line and no file."""

import json

import pytest
import yaml

from planner.cli import main
from planner.errors import InputError
from topologies.importers import import_k8s, import_nccl_xml, import_slurm_conf, import_slurm_yaml
from topologies.loader import load_cluster

# verbatim from hardware.md s4.1 (Slurm topology.conf(5) man page)
TREE = """# topology/tree
SwitchName=s0 Nodes=dev[0-5]
SwitchName=s1 Nodes=dev[6-11]
SwitchName=s2 Nodes=dev[12-17]
SwitchName=s3 Switches=s[0-2]
"""
BLOCK = """# topology/block
BlockName=block1 Nodes=node[1-32]
BlockName=block2 Nodes=node[33-64]
BlockName=block3 Nodes=node[65-96]
BlockName=block4 Nodes=node[97-128]
BlockSizes=30,120
"""
RING = """# topology/ring (newer; max 16 nodes per ring)
RingName=ring0 Nodes=node[01-08]
RingName=ring1 Nodes=node[09-16]
"""
# AWS HyperPod GB200 UltraServers: 18 nodes x 4 GPUs per block
ULTRA = """BlockName=us1 Nodes=ultraserver1-[0-17]
BlockName=us2 Nodes=ultraserver2-[0-17]
BlockName=us3 Nodes=ultraserver3-[0-17]
BlockName=us4 Nodes=ultraserver4-[0-17]
BlockSizes=18,72
"""
# verbatim from hardware.md s4.2 (topology.yaml(5))
TOPO_YAML = """- topology: topo1
  cluster_default: True
  tree:
    switches:
    - switch: sw_root
      nodes: node[01-04]
- topology: topo2
  cluster_default: False
  block:
    block_sizes:
      - 4
      - 16
    blocks:
    - block: b1
      nodes: node[01-04]
    - block: b2
      nodes: node[05-08]
    - block: b3
      nodes: node[09-12]
    - block: b4
      nodes: node[13-16]
- topology: topo3
  cluster_default: False
  flat: True
"""
TREE_YAML = """- topology: fat
  tree:
    switches:
    - switch: root
      children: leaf[1-2]
    - switch: leaf1
      nodes: n[01-02]
    - switch: leaf2
      nodes: n[03-04]
"""
# hardware.md s4.3: Azure ND H100 v5 (PCI only, abridged) and a dump-style H100 fragment
AZURE = """<system version="1">
  <cpu numaid="0" affinity="ffffffff,ffff0000,00000000" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="ffff:ff:01.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0001:00:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"/>
      <pci busid="0101:00:00.0" class="0x020700" link_speed="32.0 GT/s PCIe" link_width="16"/>
    </pci>
    <!-- 3 more GPU+HCA pairs; cpu numaid="1" holds the other 4 pairs -->
  </cpu>
</system>
"""
GPU_XML = """<system version="1"><cpu numaid="0">
<pci busid="0000:1b:00.0" class="0x030200">
<gpu dev="{dev}" sm="90" rank="{dev}" gdr="1">
  <nvlink target="0000:07:00.0" count="5" tclass="0x068000"/>
  <nvlink target="0000:06:00.0" count="5" tclass="0x068000"/>
  <nvlink target="0000:05:00.0" count="4" tclass="0x068000"/>
  <nvlink target="0000:08:00.0" count="4" tclass="0x068000"/>
</gpu></pci>
<nic>
  <net name="mlx5_{dev}" dev="{dev}" speed="400000" port="1" latency="0.000000" guid="0xa87cb10003e1a258" maxconn="131072" gdr="1"/>
</nic></cpu></system>
"""


def _w(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_tree_conf(tmp_path):
    c = import_slurm_conf(_w(tmp_path, "t.conf", TREE), "h100").cluster
    assert c.num_gpus == 18 * 8 and c.domain_sizes() == [8] * 18
    t = c.fabric_tiers
    assert [x.name for x in t] == ["leaf", "spine"]
    assert t[0].groups == [[f"dev{i}" for i in range(a, a + 6)] for a in (0, 6, 12)]
    # dev0 and dev5 share a leaf; dev0 and dev6 meet at the spine
    from topologies.collectives import shape_of
    assert shape_of(c, [0, 5 * 8]).tier == 0 and shape_of(c, [0, 6 * 8]).tier == 1


def test_block_conf_hgx_blocks_are_network_units(tmp_path):
    c = import_slurm_conf(_w(tmp_path, "b.conf", BLOCK), "h100").cluster
    assert c.num_gpus == 1024 and c.domain_sizes() == [8] * 128     # 32-node blocks exceed 8 GPUs
    assert len(c.fabric_tiers[0].groups) == 4 and len(c.fabric_tiers[1].groups) == 1


def test_block_sizes_18_with_4_gpus_is_72_gpu_domains(tmp_path):
    c = import_slurm_conf(_w(tmp_path, "u.conf", ULTRA), "gb200", gpus_per_node=4).cluster
    assert c.domain_sizes() == [72, 72, 72, 72]
    assert c.fabric_tiers[0].groups is not None and len(c.fabric_tiers[0].groups) == 1   # 72 nodes


def test_ring_conf(tmp_path):
    c = import_slurm_conf(_w(tmp_path, "r.conf", RING), "h100").cluster
    assert c.num_gpus == 128 and len(c.fabric_tiers[0].groups) == 2


def test_topology_yaml(tmp_path):
    p = _w(tmp_path, "topology.yaml", TOPO_YAML)
    c = import_slurm_yaml(p, "h100").cluster        # cluster_default: topo1 (tree)
    assert c.hosts() == ["node01", "node02", "node03", "node04"] and c.domain_sizes() == [8] * 4
    c = import_slurm_yaml(p, "gb200", 4, topology="topo2").cluster
    assert c.domain_sizes() == [16] * 4
    with pytest.raises(InputError, match="flat and lists no nodes"):
        import_slurm_yaml(p, "gb200", topology="topo3")
    with pytest.raises(InputError, match="no topology named 'x'"):
        import_slurm_yaml(p, "gb200", topology="x")
    c = import_slurm_yaml(_w(tmp_path, "tree.yaml", TREE_YAML), "b200").cluster
    assert c.fabric_tiers[0].groups == [["n01", "n02"], ["n03", "n04"]]


def test_nccl_xml(tmp_path):
    c = import_nccl_xml(_w(tmp_path, "ndv5.xml", AZURE), "h100", gpus_per_node=8, hosts="ndv5-[01-04]").cluster
    assert c.hosts() == ["ndv5-01", "ndv5-02", "ndv5-03", "ndv5-04"] and c.domain_sizes() == [8] * 4
    one = GPU_XML.format(dev=0)
    c = import_nccl_xml(_w(tmp_path, "h100.xml", one), None).cluster
    assert c.gpu == "h100" and c.num_gpus == 1 and c.fabric_tiers[0].gbps_per_gpu == 400
    with pytest.raises(InputError, match="sm 90 but --gpu b200 is sm 100"):
        import_nccl_xml(_w(tmp_path, "h100.xml", one), "b200")
    with pytest.raises(InputError, match=r"bad.xml:\d+: malformed XML"):
        import_nccl_xml(_w(tmp_path, "bad.xml", "<system><cpu></system>"), "h100")


def _node(name, clique=None, gpus=4, product="NVIDIA-GB200"):
    labels = {"nvidia.com/gpu.product": product}
    if clique:
        labels["nvidia.com/gpu.clique"] = clique
    return {"metadata": {"name": name, "labels": labels}, "status": {"capacity": {"nvidia.com/gpu": str(gpus)}}}


def test_k8s_clique_labels(tmp_path):
    uuid = "61248eac-4785-4fbf-9cbd-231635e37e9d"
    items = [_node(f"gb-{i:02d}", f"{uuid}.{20663 + i // 18}") for i in range(36)] + [
        {"metadata": {"name": "cpu-1", "labels": {}}, "status": {"capacity": {"cpu": "64"}}}]
    p = _w(tmp_path, "nodes.json", json.dumps({"kind": "List", "items": items}))
    c = import_k8s(p, None).cluster
    assert c.gpu == "gb200" and c.domain_sizes() == [72, 72] and "cpu-1" not in c.hosts()
    assert c.domain_names() == [f"{uuid}.20663", f"{uuid}.20664"]
    # YAML list; hosts without the label are a domain of their own
    p = _w(tmp_path, "nodes.yaml", yaml.safe_dump([_node("h-1", product="NVIDIA-H100-80GB-HBM3", gpus=8),
                                                     _node("h-2", product="NVIDIA-H100-80GB-HBM3", gpus=8)]))
    c = import_k8s(p, None).cluster
    assert c.gpu == "h100" and c.domain_sizes() == [8, 8]


def test_k8s_aws_layers(tmp_path):
    items = []
    for i in range(4):
        n = _node(f"p5-{i}", gpus=8, product="NVIDIA-H100-80GB-HBM3")
        n["metadata"]["labels"].update({"topology.k8s.aws/network-node-layer-1": "nn-top",
                                        "topology.k8s.aws/network-node-layer-3": f"nn-{i // 2}"})
        items.append(n)
    c = import_k8s(_w(tmp_path, "n.json", json.dumps({"items": items})), None).cluster
    assert c.fabric_tiers[0].groups == [["p5-0", "p5-1"], ["p5-2", "p5-3"]]


def test_k8s_efa_hosts_make_an_efa_cluster_whose_pods_claim_the_devices(tmp_path):
    """EKS nodes advertise vpc.amazonaws.com/efa (EFA device plugin): fabric efa, network eks-efa with the
    fewest devices a GPU host has; without the resource the cluster stays as it was."""
    items = []
    for i, efa in enumerate(("32", "32", "31")):
        n = _node(f"p5-{i}", gpus=8, product="NVIDIA-H100-80GB-HBM3")
        n["status"]["allocatable"] = {"vpc.amazonaws.com/efa": efa, "hugepages-2Mi": "10256Mi"}
        items.append(n)
    items.append({"metadata": {"name": "cpu-1", "labels": {}},
                  "status": {"capacity": {"cpu": "64", "vpc.amazonaws.com/efa": "1"}}})   # no GPU: not counted
    c, assumed = import_k8s(_w(tmp_path, "efa.json", json.dumps({"items": items})), None)
    assert c.fabric == "efa" and c.network.nics_per_node == 31 and c.network.kubernetes == "eks-efa"
    items[2]["status"].pop("allocatable")
    c, assumed = import_k8s(_w(tmp_path, "efa2.json", json.dumps({"items": items})), None)
    assert c.network.nics_per_node == 32 and any("advertise no vpc.amazonaws.com/efa" in a for a in assumed)
    plain = import_k8s(_w(tmp_path, "p.json", json.dumps({"items": [_node("h-1", gpus=8, product="NVIDIA-H100")]})),
                       None).cluster
    assert plain.fabric is None and plain.network is None


def test_k8s_rdma_ib_hosts_make_an_infiniband_cluster_whose_pods_claim_the_nics(tmp_path):
    """AKS nodes with the Network Operator's SR-IOV device plugin advertise rdma/ib, one per InfiniBand NIC
    (Azure/aks-rdma-infiniband@700dabb configs/nicclusterpolicy/sriov-device-plugin/sriov.yaml: resourcePrefix
    rdma, resourceName ib): fabric infiniband, network aks-ib with the fewest a GPU host has; rdma/shared_ib (pod
    slots, rdmaHcaMax 63) is no NIC count."""
    items = []
    for i, ib in enumerate(("8", "7")):
        n = _node(f"nd-{i}", gpus=8, product="NVIDIA-H100-80GB-HBM3")
        n["status"]["allocatable"] = {"rdma/ib": ib}
        items.append(n)
    c, assumed = import_k8s(_w(tmp_path, "ib.json", json.dumps({"items": items})), None)
    assert (c.fabric, c.network.nics_per_node, c.network.kubernetes) == ("infiniband", 7, "aks-ib")
    assert c.network.topo_file == ""   # an unnamed VM size: no NCCL topology file
    for n in items:   # ND H100 v5 by name: its topology file stays, the count is what the hosts advertise
        n["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "Standard_ND96isr_H100_v5"
    c, _ = import_k8s(_w(tmp_path, "ib2.json", json.dumps({"items": items})), None)
    assert (c.network.nics_per_node, c.network.topo_file) == (7, "ndv5-topo.xml")
    for n in items:
        n["status"]["allocatable"] = {"rdma/shared_ib": "63"}
    c, assumed = import_k8s(_w(tmp_path, "shared.json", json.dumps({"items": items})), None)
    assert c.network is None and c.fabric == "infiniband"   # ND H100 v5 by name, but no host has rdma/ib
    assert any("rdma/shared_ib" in a for a in assumed)


@pytest.mark.parametrize("itype,fabric,nics,kind", [
    ("a3-megagpu-8g", "tcpxo", 8, "gke-tcpxo"), ("a4-highgpu-8g", "roce", 8, "gke-rdma"),
    ("p5.48xlarge", "efa", 32, "eks-efa"), ("Standard_ND96isr_H100_v5", "infiniband", 8, "aks-ib"),
    ("BM.GPU.H100.8", "roce", 16, "oke-rdma"),
    ("n2-standard-8", None, None, None)])
def test_k8s_instance_type_gives_the_cloud_fabric(tmp_path, itype, fabric, nics, kind):
    """GKE / EKS / AKS nodes carry node.kubernetes.io/instance-type: the preset of that instance gives the
    fabric and the pods' network (the counts: tests/test_emit_k8s_network.py's sources); an unknown type
    leaves the cluster as it was."""
    items = []
    for i in range(2):
        n = _node(f"n-{i}", gpus=8, product="NVIDIA-H100-80GB-HBM3")
        n["metadata"]["labels"]["node.kubernetes.io/instance-type"] = itype
        items.append(n)
    c = import_k8s(_w(tmp_path, "n.json", json.dumps({"items": items})), None).cluster
    assert c.fabric == fabric
    assert (c.network.nics_per_node, c.network.kubernetes) == (nics, kind) if nics else c.network is None
    if kind == "oke-rdma":   # the shape's NCCL_IB_HCA list travels with the network (oci-hpc-oke BM.GPU.H100.8.yaml)
        assert c.network.hcas[:3] == ("mlx5_0", "mlx5_1", "mlx5_3") and len(c.network.hcas) == 16


@pytest.mark.parametrize("text,match", [
    ("SwitchName=s0 Nodes=dev[0-5] Speed=100\n", r"t.conf:1: unknown key 'Speed'"),
    ("# c\n\nSwitchName=s0 Nodes=dev[0-5\n", r"t.conf:3: Nodes: unclosed '\['"),
    ("SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Nodes=a2\n", r"t.conf:2: node 'a2' hangs off two switches"),
    ("BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n4\n", r"t.conf:2: node 'n4' is in two blocks"),
    ("BlockName=b1 Nodes=n[1-4]\nBlockSizes=4,12\n", r"t.conf:2: BlockSizes 12 after 4"),
    ("# nothing\n", r"t.conf: no SwitchName="),
    ("SwitchName=s0 Switches=s9\n", r"t.conf:1: switch 's0' lists unknown child switch 's9'"),
    ("SwitchName=s0\n", r"neither Nodes= nor Switches="),
])
def test_bad_slurm_conf(tmp_path, text, match):
    p = _w(tmp_path, "t.conf", text)
    with pytest.raises(InputError, match=match) as ei:
        import_slurm_conf(p, "h100", gpus_per_node=8)
    assert "\n" not in str(ei.value)


def test_cli_import_and_reexport_stable(tmp_path, capsys):
    src = _w(tmp_path, "topology.conf", ULTRA)
    out = tmp_path / "cluster.yaml"
    assert main(["topology", "import", "slurm", str(src), "--gpu", "gb200", "--gpus-per-node", "4",
                 "-o", str(out)]) == 0
    assert "4 NVLink domains (largest 72)" in capsys.readouterr().out
    # show -> JSON, then re-export the YAML and compare: import -> show -> re-export is stable
    assert main(["topology", "show", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nvlink_domains"] == [72] * 4 and doc["num_gpus"] == 288
    assert main(["topology", "show", str(out), "--yaml"]) == 0
    again = capsys.readouterr().out
    assert again == out.read_text()
    out2 = _w(tmp_path, "again.yaml", again)
    assert load_cluster(str(out2)).gpus() == load_cluster(str(out)).gpus()


@pytest.mark.parametrize("fmt,text,args,match", [
    ("slurm", "SwitchName=s0 Nodes=dev[0-5] Bogus=1\n", ["--gpu", "h100"], "topology.conf:1: unknown key 'Bogus'"),
    ("slurm", "SwitchName=s0 Nodes=dev[0-5]\n", ["--gpu", "a100"], "unknown GPU type 'a100'"),
    ("slurm", "SwitchName=s0 Nodes=dev[0-5]\n", [], "pass --gpu"),
    ("slurm", "SwitchName=s0 Nodes=dev[0-5,3]\n", ["--gpu", "h100"], "named twice"),
    ("slurm-yaml", "- topology: a\n  tree: [\n", ["--gpu", "h100"], "malformed YAML"),
    ("k8s", "[]", ["--gpu", "h100"], "no node with GPUs"),
    ("nope", "x", ["--gpu", "h100"], "import format 'nope'"),
])
def test_cli_import_errors_write_nothing(tmp_path, capsys, fmt, text, args, match):
    src = _w(tmp_path, "topology.conf", text)
    out = tmp_path / "out.yaml"
    assert main(["topology", "import", fmt, str(src), *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1 and err.startswith("error: ")
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["topology.conf"]


from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 18), min_size=1, max_size=8), st.sampled_from([None, 2, 4]),
       st.sampled_from(["conf", "yaml"]))
def test_block_import_reexport_stable(tmp_path_factory, blocks, group, fmt):
    """Random NVL72 block files: import -> YAML -> load -> YAML is a fixed point, domains match blocks."""
    tmp = tmp_path_factory.mktemp("blk")
    names, start = [], 1
    for b, size in enumerate(blocks):
        names.append((f"b{b + 1}", f"tray[{start:03d}-{start + size - 1:03d}]"))
        start += size
    base = 18
    sizes = [base] + ([base * group] if group else [])
    if fmt == "conf":
        text = "".join(f"BlockName={b} Nodes={n}\n" for b, n in names) + f"BlockSizes={','.join(map(str, sizes))}\n"
        c = import_slurm_conf(_w(tmp, "t.conf", text), "gb300", 4).cluster
    else:
        doc = [{"topology": "t", "cluster_default": True,
                "block": {"block_sizes": sizes, "blocks": [{"block": b, "nodes": n} for b, n in names]}}]
        c = import_slurm_yaml(_w(tmp, "t.yaml", yaml.safe_dump(doc)), "gb300", 4).cluster
    assert c.domain_sizes() == [4 * s for s in blocks]
    first = c.to_yaml()
    again = load_cluster(str(_w(tmp, "c.yaml", first)))
    assert again.to_yaml() == first and again.gpus() == c.gpus()
    if group:
        assert len(c.fabric_tiers[0].groups) == -(-len(blocks) // group)


# ---- what the file says, and what the import assumed ------------------------------------------

def _has(assumed, *words):
    """The one assumed line that holds every word (fails if none or several)."""
    hits = [a for a in assumed if all(w in a for w in words)]
    assert len(hits) == 1, (words, assumed)
    return hits[0]


def test_tree_tiers_are_the_files_levels_and_nothing_more(tmp_path):
    # two leaf switches and no parent: one tier, not an invented spine
    c, assumed = import_slurm_conf(_w(tmp_path, "t.conf", "SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Nodes=a[3-4]\n"),
                                   "h100")
    assert [t.name for t in c.fabric_tiers] == ["leaf"]
    assert c.fabric_tiers[0].groups == [["a1", "a2"], ["a3", "a4"]]
    _has(assumed, "no switch reaches all 4 hosts", "s0, s1", "no higher tier is added")
    # the man page's three-level example: leaf and spine, no core
    c, assumed = import_slurm_conf(_w(tmp_path, "t2.conf", TREE), "h100")
    assert [t.name for t in c.fabric_tiers] == ["leaf", "spine"]
    assert not [a for a in assumed if "no switch reaches" in a or "joins" in a]
    # three levels written: three tiers, rates and latencies 1, 3, 5 hops
    text = ("SwitchName=l1 Nodes=n[1-2]\nSwitchName=l2 Nodes=n[3-4]\nSwitchName=l3 Nodes=n[5-6]\n"
            "SwitchName=l4 Nodes=n[7-8]\nSwitchName=s1 Switches=l[1-2]\nSwitchName=s2 Switches=l[3-4]\n"
            "SwitchName=core Switches=s[1-2]\n")
    c, assumed = import_slurm_conf(_w(tmp_path, "t3.conf", text), "b200", 8)
    assert [(t.name, t.latency_us) for t in c.fabric_tiers] == [("leaf", 0.6), ("spine", 1.8), ("core", 3.0)]
    assert c.fabric_tiers[1].groups == [[f"n{i}" for i in range(1, 5)], [f"n{i}" for i in range(5, 9)]]
    assert not [a for a in assumed if "GPUs per host" in a]       # --gpus-per-node given


def test_tree_assumptions_listed(tmp_path):
    c, assumed = import_slurm_conf(_w(tmp_path, "t.conf", TREE), "h100")
    _has(assumed, "8 GPUs per host", "--gpus-per-node")
    _has(assumed, "own NVLink domain", "topology/tree")
    _has(assumed, "400 Gb/s per GPU", "NIC rate from the GPU catalog")
    _has(assumed, "oversubscription 1", "does not say")
    _has(assumed, "0.6 us per hop", "leaf 0.6, spine 1.8")
    assert all(t.oversubscription == 1 and t.gbps_per_gpu == 400 for t in c.fabric_tiers)


def test_linkspeed_read_as_a_ratio_between_levels(tmp_path):
    text = ("SwitchName=s0 Nodes=d[0-1] LinkSpeed=100\nSwitchName=s1 Nodes=d[2-3] LinkSpeed=100\n"
            "SwitchName=s2 Switches=s[0-1] LinkSpeed=50\n")
    c, assumed = import_slurm_conf(_w(tmp_path, "t.conf", text), "b300")     # NIC 800 Gb/s per GPU
    assert [t.gbps_per_gpu for t in c.fabric_tiers] == [800, 400]              # 800 x 50 / 100
    _has(assumed, "tier 'spine': 400 Gb/s per GPU", "x LinkSpeed 50", "leaf LinkSpeed 100", "no unit")
    # the collective model sees the slower spine: a 2-host all-reduce across the spine costs more
    from topologies.collectives import collective_time
    same_leaf = collective_time(c, "all_reduce", [0, 8], 1 << 30)
    across = collective_time(c, "all_reduce", [0, 16], 1 << 30)
    assert across > same_leaf
    # leaf switches without LinkSpeed: no base for a ratio, ignored and said so
    text2 = "SwitchName=s0 Nodes=d[0-1]\nSwitchName=s1 Nodes=d[2-3] LinkSpeed=100\nSwitchName=s2 Switches=s[0-1] LinkSpeed=50\n"
    c, assumed = import_slurm_conf(_w(tmp_path, "t2.conf", text2), "b300")
    assert [t.gbps_per_gpu for t in c.fabric_tiers] == [800, 800]
    _has(assumed, "LinkSpeed ignored", "not every leaf switch")
    # YAML link_speed, with different values on one level: the lowest is used
    doc = """- topology: t
  tree:
    switches:
    - {switch: top, children: 'l[1-2]', link_speed: 25}
    - {switch: l1, nodes: 'n[1-2]', link_speed: 100}
    - {switch: l2, nodes: 'n[3-4]', link_speed: 200}
"""
    c, assumed = import_slurm_yaml(_w(tmp_path, "t.yaml", doc), "h100")
    assert [t.gbps_per_gpu for t in c.fabric_tiers] == [400, 100]              # 400 x 25 / 100
    _has(assumed, "different LinkSpeed", "the lowest, 100")


@pytest.mark.parametrize("text,match", [
    # a switch under two parents (two spines listing the same leaves)
    ("SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Nodes=a[3-4]\nSwitchName=p1 Switches=s[0-1]\nSwitchName=p2 Switches=s[0-1]\n",
     "t.conf:4: switch 's0' is listed under two parents ('p1' at t.conf:3 and 'p2'); in topology/tree a switch has one parent"),
    ("SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Nodes=a[2-3]\n",
     "t.conf:2: node 'a2' hangs off two switches ('s0' at t.conf:1 and 's1')"),
    ("SwitchName=s0 Nodes=a[1-2]\nSwitchName=p Switches=s0,s0\n", "t.conf:2: switch 's0' is named twice on switch 'p'"),
    ("SwitchName=s0 Nodes=a[1-2]\nSwitchName=p Switches=s0 Nodes=a3\n", "t.conf:2: switch 'p' has both Nodes= and Switches="),
    ("SwitchName=s0 Nodes=a[1-2] LinkSpeed=fast\n", "t.conf:1: LinkSpeed='fast' is not a positive number"),
    ("RingName=r0 Nodes=a[1-2]\nRingName=r1 Nodes=a2\n", "t.conf:2: node 'a2' is in two rings ('r0' and 'r1')"),
    ("BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n4\n", "t.conf:2: node 'n4' is in two blocks ('b1' at t.conf:1 and 'b2')"),
])
def test_duplicates_refused_naming_file_and_line(tmp_path, text, match):
    with pytest.raises(InputError) as ei:
        import_slurm_conf(_w(tmp_path, "t.conf", text), "h100", 8)
    msg = str(ei.value)
    assert msg.startswith(str(tmp_path / "t.conf")) and match in msg.replace(str(tmp_path) + "/", "")
    assert "\n" not in msg


def test_yaml_duplicates_name_the_line(tmp_path):
    doc = """- topology: t
  tree:
    switches:
    - switch: top1
      children: leaf1
    - switch: top2
      children: leaf1
    - switch: leaf1
      nodes: n[1-2]
"""
    p = _w(tmp_path, "t.yaml", doc)
    with pytest.raises(InputError, match=r"t\.yaml:6: switch 'leaf1' is listed under two parents \('top1' at \S*t\.yaml:4"):
        import_slurm_yaml(p, "h100")


def test_block_and_ring_assumptions(tmp_path):
    c, assumed = import_slurm_conf(_w(tmp_path, "u.conf", ULTRA), "gb200", gpus_per_node=4)
    _has(assumed, "each block is one NVLink domain", "72-GPU")
    _has(assumed, "BlockSizes level 72", "4 consecutive blocks")
    c, assumed = import_slurm_conf(_w(tmp_path, "b.conf", BLOCK), "h100")
    _has(assumed, "own NVLink domain", "blocks are scale-out units")
    c, assumed = import_slurm_conf(_w(tmp_path, "r.conf", RING), "h100")
    _has(assumed, "joins the file's 2 top-level units")
    assert [t.name for t in c.fabric_tiers] == ["leaf", "spine"]


def test_nccl_and_k8s_assumptions(tmp_path):
    one = GPU_XML.format(dev=0)
    c, assumed = import_nccl_xml(_w(tmp_path, "h100.xml", one), None)
    _has(assumed, "GPU type h100", "sm 90", "h200", "pass --gpu")
    _has(assumed, "one host, named 'h100'", "--hosts")
    _has(assumed, "own NVLink domain", "--domain-nodes")
    _has(assumed, "400 Gb/s per GPU", "<net speed>")
    assert not [a for a in assumed if "NIC rate from the GPU catalog" in a]
    c, assumed = import_nccl_xml(_w(tmp_path, "ndv5.xml", AZURE), "gb200", 4, hosts="n[1-4]", domain_nodes=2)
    _has(assumed, "NIC rate from the GPU catalog")
    _has(assumed, "2 consecutive hosts share one NVLink domain")
    items = [_node("g-1", "u.1"), _node("g-2", "u.1"), _node("g-3"),
             {"metadata": {"name": "cpu-1", "labels": {}}, "status": {"capacity": {"cpu": "64"}}}]
    c, assumed = import_k8s(_w(tmp_path, "n.json", json.dumps({"items": items})), None)
    assert c.domain_sizes() == [8, 4]
    _has(assumed, "GPU type gb200", "NVIDIA-GB200")
    _has(assumed, "1 hosts without the nvidia.com/gpu.clique label")
    _has(assumed, "1 nodes without nvidia.com/gpu capacity (cpu-1)")


def test_cli_prints_assumptions_and_marks_failed_hosts(tmp_path, capsys):
    src = _w(tmp_path, "topology.conf", TREE)
    out = tmp_path / "c.yaml"
    assert main(["topology", "import", "slurm", str(src), "--gpu", "h100", "--failed", "dev[3,7]",
                 "-o", str(out)]) == 0
    cap = capsys.readouterr()
    assert "2 hosts marked failed" in cap.out
    lines = cap.err.strip().splitlines()
    assert lines and all(x.startswith("assumed: ") for x in lines)
    assert any("oversubscription 1" in x for x in lines)
    c = load_cluster(str(out))
    assert c.health.failed_nodes == ["dev3", "dev7"] and c.num_gpus == 16 * 8
    assert "dev3" not in {g.node for g in c.gpus()}
    # a host the file does not list: refused, naming the option, nothing written
    out2 = tmp_path / "d.yaml"
    assert main(["topology", "import", "slurm", str(src), "--gpu", "h100", "--failed", "dev99",
                 "-o", str(out2)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --failed: 'dev99' is not a host in {src}; name hosts the file lists\n"
    assert not out2.exists()
