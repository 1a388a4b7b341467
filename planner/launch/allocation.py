"""Read what the scheduler granted: hosts and the NVLink domain of each, in the forms launchers have.

* ``HOST [DOMAIN]`` lines (``#`` comments). DOMAIN is the rack / NVLink clique; a host without one
  takes its domain from a cluster file (``--cluster``, or the plan's own cluster).
* A Slurm hostlist (``SLURM_JOB_NODELIST``, expanded by ``topologies.hostlist``) with the domains
  from Slurm's ``topology.conf`` / ``topology.yaml`` (``topologies.importers.slurm``: a block whose
  GPUs fit one NVLink domain is that domain) or from a cluster file.
* Per-node ``nvidia-smi -q`` output, as ``pdsh -w HOSTS nvidia-smi -q`` prints it (each line
  prefixed ``HOST:``; NVIDIA topograph reads the same form), or a directory of one file per host
  (file name = host). The domain is ``ClusterUUID.CliqueId``, the value GPU Feature Discovery gives
  the ``nvidia.com/gpu.clique`` label (docs/reference: hardware.md 4.5); a host whose fabric reads
  N/A (HGX) is its own domain.
"""

from __future__ import annotations

import re
from pathlib import Path

from planner.cost.shape import host_domains
from planner.errors import InputError
from planner.launch.core import AllocationProblem, read_pairs
from topologies.hostlist import HostlistError, expand
from topologies.importers.slurm import import_slurm_conf, import_slurm_yaml

_SMI = re.compile(r"^\s*(?:(?P<host>[^\s:]+):)?\s*(?P<key>ClusterUUID|CliqueId)\s*:\s*(?P<val>\S.*?)\s*$")


def domain_table(cluster) -> dict[str, str]:
    """Host -> NVLink-domain name of a ``topologies.cluster.Cluster`` (HGX: each host its own)."""
    return host_domains(cluster)


def fill_domains(pairs, table: dict[str, str] | None, where: str) -> list[tuple[str, str]]:
    """Every pair with a domain: those without take ``table[host]``; InputError naming the host otherwise."""
    out = []
    for host, dom in pairs:
        if not dom:
            if table is None or host not in table:
                raise InputError(f"{where}: host {host} has no NVLink domain and "
                                 f"{'no cluster file was given' if table is None else 'the cluster file does not list it'}; "
                                 "write 'HOST DOMAIN' lines or pass --cluster (a file that lists the host)")
            dom = table[host]
        out.append((host, dom))
    return out


def smi_pairs(text: str, where: str, host: str | None = None) -> list[tuple[str, str]]:
    """``(host, ClusterUUID.CliqueId)`` per host of ``nvidia-smi -q`` output (``HOST:``-prefixed lines,
    or one host's unprefixed output with ``host`` given). Every GPU of a host must agree."""
    seen: dict[str, dict[str, list[str]]] = {}
    for line in text.splitlines():
        m = _SMI.match(line)
        if not m:
            continue
        h = m.group("host") or host
        if h is None:
            raise InputError(f"{where}: nvidia-smi lines carry no host name; collect them with "
                             "'pdsh -w HOSTS nvidia-smi -q' (lines 'HOST: ...') or one file per host in a directory")
        seen.setdefault(h, {"ClusterUUID": [], "CliqueId": []})[m.group("key")].append(m.group("val"))
    out = []
    for h, vals in seen.items():
        doms = {f"{u}.{c}" for u, c in zip(vals["ClusterUUID"], vals["CliqueId"])}
        if len(vals["ClusterUUID"]) != len(vals["CliqueId"]) or len(doms) != 1:
            raise InputError(f"{where}: host {h}: its GPUs report {len(doms)} different ClusterUUID.CliqueId pairs "
                             f"({', '.join(sorted(doms)) or 'none'}); every GPU of a tray must be in one NVLink domain "
                             "(check the fabric state with nvidia-smi -q)")
        dom = doms.pop()
        out.append((h, h if "N/A" in dom else dom))
    if not out:
        raise InputError(f"{where}: no ClusterUUID/CliqueId lines found; pass 'nvidia-smi -q' output of every host")
    return out


def read_allocation(path, table: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """The granted ``(host, domain)`` pairs in ``path``: ``HOST [DOMAIN]`` lines, ``nvidia-smi -q``
    output, or a directory of per-host ``nvidia-smi -q`` files. ``table``: host -> domain for hosts
    listed without one."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file())
        if not files:
            raise InputError(f"--allocation {path}: empty directory; put one 'nvidia-smi -q' file per host in it")
        pairs = []
        for f in files:
            host = f.name[:-len(f.suffix)] if f.suffix in (".txt", ".log", ".out") else f.name
            pairs += smi_pairs(_read(f), str(f), host=host)
        return pairs
    text = _read(path)
    if "ClusterUUID" in text or "CliqueId" in text:
        return smi_pairs(text, str(path))
    try:
        pairs = read_pairs(text, str(path))
    except AllocationProblem as exc:
        raise InputError(f"--allocation {exc}") from None
    if not pairs:
        raise InputError(f"--allocation {path}: no hosts listed; write one 'HOST [DOMAIN]' line per granted host")
    return fill_domains(pairs, table, f"--allocation {path}")


def nodelist_pairs(expr: str, table: dict[str, str] | None) -> list[tuple[str, str]]:
    """A Slurm hostlist (``SLURM_JOB_NODELIST``) with each host's domain from ``table``."""
    try:
        hosts = expand(expr)
    except HostlistError as exc:
        raise InputError(f"--nodelist {expr!r}: {exc}") from None
    if not hosts:
        raise InputError("--nodelist: empty hostlist; pass the job's SLURM_JOB_NODELIST")
    return fill_domains([(h, None) for h in hosts], table, f"--nodelist {expr}")


def topology_table(path, gpu: str, gpus_per_node: int) -> dict[str, str]:
    """Host -> domain from Slurm's ``topology.conf`` or ``topology.yaml`` (block = NVLink domain when
    its GPUs fit one; tree/ring: each host its own)."""
    p = str(path)
    reader = import_slurm_yaml if p.endswith((".yaml", ".yml")) else import_slurm_conf
    return domain_table(reader(path, gpu, gpus_per_node).cluster)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise InputError(f"--allocation {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--allocation {path}: cannot read it ({exc}); pass a text file of 'HOST [DOMAIN]' lines") from None
