"""NCCL topology XML (``NCCL_TOPO_FILE`` / ``NCCL_TOPO_DUMP_FILE``) -> Cluster.

One XML describes one host: its GPUs (``<gpu dev sm ...>`` or PCI devices of class 0x030200), its
NICs (``<net speed=Mb/s>`` or PCI class 0x020700 IB / 0x020000 Ethernet) and NVLinks
(``<nvlink target count tclass>``; tclass 0x068000 = NVSwitch). The cluster replicates that host
over ``hosts`` (a hostlist; default one host named after the file). Every host is an NVLink domain
unless the GPUs reach NVSwitches and ``domain_nodes`` says how many hosts share them (NVL72 trays).

Checks: the XML's SM version must match ``--gpu`` (sm 90 = Hopper, 100 = Blackwell, 103 =
Blackwell Ultra); NIC line rate per GPU = sum of ``<net speed>`` / GPUs when the file has speeds.
Element and class codes: NVIDIA/nccl src/graph/topo.cc and xml.cc (hardware.md s4.3).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from topologies.errors import InputError
from topologies.gpus import GPUS, get_gpu
from topologies.hostlist import HostlistError, expand
from topologies.importers.common import Imported, build_cluster

__all__ = ["NcclHost", "parse_nccl_xml", "import_nccl_xml"]

GPU_CLASS = "0x030200"
NIC_CLASSES = ("0x020700", "0x020000")
NVSWITCH_CLASS = "0x068000"


class NcclHost:
    def __init__(self):
        self.gpus: list[dict] = []          # {dev, sm, busid, nvlinks}
        self.nics: list[dict] = []          # {name, speed_mbps, busid}
        self.pci_gpus = 0
        self.pci_nics = 0
        self.nvswitch_links = 0

    @property
    def num_gpus(self) -> int:
        return len(self.gpus) + self.pci_gpus

    @property
    def sm(self) -> int | None:
        sms = {g["sm"] for g in self.gpus if g["sm"] is not None}
        return sms.pop() if len(sms) == 1 else None


def parse_nccl_xml(text: str, source: str) -> NcclHost:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        line, col = exc.position
        raise InputError(f"{source}:{line}: malformed XML at column {col} ({exc.msg}); fix the markup") from None
    if root.tag != "system":
        raise InputError(f"{source}: root element is <{root.tag}>; an NCCL topology file starts with <system version=...>")
    host = NcclHost()
    for el in root.iter():
        if el.tag == "pci":
            cls = (el.get("class") or "").lower()
            has_gpu_child = any(c.tag == "gpu" for c in el)
            if cls == GPU_CLASS and not has_gpu_child:
                host.pci_gpus += 1
            elif cls in NIC_CLASSES and not any(c.tag == "nic" for c in el):
                host.pci_nics += 1
        elif el.tag == "gpu":
            sm = el.get("sm")
            links = []
            for nv in el.findall("nvlink"):
                try:
                    count = int(nv.get("count", "1"))
                except ValueError:
                    raise InputError(f"{source}: <nvlink count={nv.get('count')!r}> is not an integer") from None
                links.append({"target": nv.get("target"), "count": count, "tclass": (nv.get("tclass") or "").lower()})
                if (nv.get("tclass") or "").lower() == NVSWITCH_CLASS:
                    host.nvswitch_links += count
            try:
                host.gpus.append({"dev": el.get("dev"), "sm": int(sm) if sm else None, "nvlinks": links})
            except ValueError:
                raise InputError(f"{source}: <gpu sm={sm!r}> is not an integer") from None
        elif el.tag == "net":
            speed = el.get("speed")
            try:
                mbps = float(speed) if speed else None
            except ValueError:
                raise InputError(f"{source}: <net name={el.get('name')!r} speed={speed!r}> is not a number (Mb/s)") from None
            host.nics.append({"name": el.get("name"), "speed_mbps": mbps})
    # a <pci class=GPU> that wraps a <gpu> is counted once, through <gpu>
    if host.num_gpus == 0:
        raise InputError(f"{source}: no GPU found (no <gpu> element and no <pci class=\"{GPU_CLASS}\">)")
    return host


def import_nccl_xml(path, gpu: str | None, gpus_per_node: int | None = None, hosts: str | None = None,
                    domain_nodes: int | None = None, name: str | None = None,
                    failed: str | None = None) -> Imported:
    """One host's NCCL XML -> ``Imported(cluster, assumed)``; ``failed``: a hostlist marked failed."""
    source = str(path)
    assumed: list[str] = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    host = parse_nccl_xml(text, source)
    sm = host.sm
    if gpu:
        spec = get_gpu(gpu)
        if sm is not None and sm != spec.sm:
            raise InputError(f"{source}: the XML's GPUs are sm {sm} but --gpu {spec.name} is sm {spec.sm}; "
                             "pass the matching --gpu")
    else:
        matches = [s for s in GPUS.values() if s.sm == sm]
        if sm is None or not matches:
            raise InputError(f"{source}: cannot tell the GPU type from the XML; pass --gpu")
        # sm alone does not separate h100/h200/h800 or b200/gb200: take the HGX part and say so in docs
        spec = matches[0]
        others = [s.name for s in matches[1:]]
        assumed.append(f"GPU type {spec.name}: the XML says sm {sm}" +
                       (f", which {', '.join(others)} share; pass --gpu for those" if others else ""))
    per = gpus_per_node or host.num_gpus
    speeds = [n["speed_mbps"] for n in host.nics if n["speed_mbps"]]
    nic_gbps = (sum(speeds) / 1000.0 / per) if speeds else None
    if nic_gbps:
        assumed.append(f"{nic_gbps:g} Gb/s per GPU into the fabric = the XML's {len(speeds)} <net speed> summed over "
                       f"{per} GPUs")
    try:
        names = expand(hosts) if hosts else [Path(path).stem]
    except HostlistError as exc:
        raise InputError(f"--hosts: {exc}") from None
    if hosts:
        assumed.append(f"all {len(names)} hosts of --hosts have this XML's layout")
    else:
        assumed.append(f"one host, named {names[0]!r} after the file: pass --hosts for more")
    domains = None
    if domain_nodes and domain_nodes > 1:
        domains = []
        for i in range(0, len(names), domain_nodes):
            domains.append((f"nvl{i // domain_nodes + 1:02d}", names[i:i + domain_nodes]))
        assumed.append(f"{domain_nodes} consecutive hosts share one NVLink domain (--domain-nodes)")
    else:
        assumed.append("every host is its own NVLink domain: pass --domain-nodes for NVL72 trays")
    c = build_cluster(name=name or Path(path).stem, spec=spec, nodes=[(h, per) for h in names],
                      domains=domains, nic_gbps=nic_gbps, failed=failed, assumed=assumed, source=source)
    return Imported(c, assumed)
