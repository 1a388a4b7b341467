"""Slurm ``topology.conf`` and ``topology.yaml`` -> Cluster.

topology/tree (``SwitchName=s0 Nodes=dev[0-5]``, ``SwitchName=s3 Switches=s[0-2]``): every host is
its own NVLink domain; each switch level becomes a scale-out tier whose units are the hosts under
each switch (leaf switches first). A tier exists only where the file has that switch level: when no
switch reaches every host, no tier is added above the file's top level (Slurm itself then runs no
job across them) and the import says so. A switch under two parents, a host on two switches and a
switch with both ``Nodes=`` and ``Switches=`` are refused (file:line), as Slurm refuses or warns.

``LinkSpeed=`` has no unit (topology.conf(5): "the units used are arbitrary"; Slurm reads it as an
integer, 1 when absent, and does not use it). It is read only as a ratio between switch levels:
tier L's per-GPU rate = the leaf tier's rate (the GPU's NIC rate) x min LinkSpeed of level L / min
LinkSpeed of the leaf level. Levels without it keep the NIC rate; without it on every leaf switch
it is ignored. Every such reading is listed in the import's ``assumed`` lines.

topology/block (``BlockName=b1 Nodes=node[1-18]``, ``BlockSizes=18,72``): a block whose GPUs fit
in one NVLink domain of the GPU type *is* an NVLink domain (NVL72: 18 trays x 4 GPUs = 72);
larger blocks (HGX SuperPOD blocks) are scale-out units and each host is its own domain. Every
higher ``BlockSizes`` level (in nodes) groups consecutive blocks into a tier unit.

topology/ring (``RingName=``) rings become tier-0 units.

Semantics from the Slurm man pages topology.conf(5) and topology.yaml(5) (hardware.md s4.1-4.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from topologies.errors import InputError
from topologies.hostlist import HostlistError, expand
from topologies.importers.common import TIER_NAMES, Imported, build_cluster, gpus_per_host, resolve_gpu

__all__ = ["Topo", "parse_topology_conf", "parse_topology_yaml", "topo_to_cluster",
           "import_slurm_conf", "import_slurm_yaml"]

CONF_KEYS = {
    "switchname": "SwitchName", "switches": "Switches", "nodes": "Nodes", "linkspeed": "LinkSpeed",
    "blockname": "BlockName", "blocksizes": "BlockSizes", "ringname": "RingName",
}


@dataclass
class Topo:
    """A parsed Slurm topology, independent of the file syntax."""
    kind: str = ""                                                  # tree | block | ring
    switches: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # name -> (nodes, children)
    blocks: list[tuple[str, list[str]]] = field(default_factory=list)
    block_sizes: list[int] = field(default_factory=list)
    rings: list[tuple[str, list[str]]] = field(default_factory=list)
    where: dict[str, str] = field(default_factory=dict)            # element -> "file:line" for messages
    link_speed: dict[str, float] = field(default_factory=dict)     # switch -> LinkSpeed (no unit)


class _LineLoader(yaml.SafeLoader):
    """A safe YAML loader whose mappings remember their line (for file:line messages)."""


class _LDict(dict):
    line: int = 0


def _mapping(loader, node):
    d = _LDict(loader.construct_mapping(node, deep=True))
    d.line = node.start_mark.line + 1
    return d


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _at(source: str, obj, fallback: str) -> str:
    line = getattr(obj, "line", 0)
    return f"{source}:{line}" if line else fallback


def _speed(value, where: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = -1.0
    if not v > 0:
        raise InputError(f"{where}: LinkSpeed={value!r} is not a positive number (Slurm reads an integer; "
                         "only ratios between switch levels are used)")
    return v


def _hl(expr: str, where: str, key: str) -> list[str]:
    try:
        return expand(expr)
    except HostlistError as exc:
        raise InputError(f"{where}: {key}: {exc}") from None


def parse_topology_conf(text: str, source: str) -> Topo:
    topo = Topo()
    lines = text.splitlines()
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for i, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].rstrip()
        if not buf:
            start = i
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            logical.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        logical.append((start, buf.strip()))
    for lineno, line in logical:
        where = f"{source}:{lineno}"
        pairs: dict[str, str] = {}
        for tok in line.split():
            key, sep, val = tok.partition("=")
            canon = CONF_KEYS.get(key.lower())
            if not sep:
                raise InputError(f"{where}: {tok!r} is not Key=Value; topology.conf lines look like "
                                 "'SwitchName=s0 Nodes=dev[0-5]'")
            if canon is None:
                raise InputError(f"{where}: unknown key {key!r}; topology.conf keys are "
                                 f"{', '.join(sorted(set(CONF_KEYS.values())))}")
            if canon in pairs:
                raise InputError(f"{where}: key {canon} given twice on one line")
            pairs[canon] = val
        if "SwitchName" in pairs:
            _kind(topo, "tree", where)
            bad = set(pairs) - {"SwitchName", "Switches", "Nodes", "LinkSpeed"}
            if bad:
                raise InputError(f"{where}: {sorted(bad)[0]} does not belong on a SwitchName line")
            name = pairs["SwitchName"]
            if name in topo.switches:
                raise InputError(f"{where}: switch {name!r} is defined twice")
            nodes = _hl(pairs.get("Nodes", ""), where, "Nodes")
            children = _hl(pairs.get("Switches", ""), where, "Switches")
            _add_switch(topo, name, nodes, children, where, "Nodes=", "Switches=")
            if "LinkSpeed" in pairs:
                topo.link_speed[name] = _speed(pairs["LinkSpeed"], where)
        elif "BlockName" in pairs:
            _kind(topo, "block", where)
            bad = set(pairs) - {"BlockName", "Nodes", "LinkSpeed"}
            if bad:
                raise InputError(f"{where}: {sorted(bad)[0]} does not belong on a BlockName line")
            nodes = _hl(pairs.get("Nodes", ""), where, "Nodes")
            if not nodes:
                raise InputError(f"{where}: block {pairs['BlockName']!r} has no Nodes=")
            topo.blocks.append((pairs["BlockName"], nodes))
            topo.where[pairs["BlockName"]] = where
        elif "BlockSizes" in pairs:
            _kind(topo, "block", where)
            if set(pairs) != {"BlockSizes"}:
                raise InputError(f"{where}: BlockSizes= goes on a line of its own")
            topo.block_sizes = _sizes(pairs["BlockSizes"], where)
        elif "RingName" in pairs:
            _kind(topo, "ring", where)
            nodes = _hl(pairs.get("Nodes", ""), where, "Nodes")
            if not nodes:
                raise InputError(f"{where}: ring {pairs['RingName']!r} has no Nodes=")
            topo.rings.append((pairs["RingName"], nodes))
            topo.where[pairs["RingName"]] = where
        else:
            raise InputError(f"{where}: a line must start with SwitchName=, BlockName=, BlockSizes= or RingName=")
    if not topo.kind:
        raise InputError(f"{source}: no SwitchName=, BlockName= or RingName= lines; nothing to import")
    return topo


def _add_switch(topo: Topo, name: str, nodes: list[str], children: list[str], where: str, nk: str, ck: str) -> None:
    if not nodes and not children:
        raise InputError(f"{where}: switch {name!r} has neither {nk} nor {ck}")
    if nodes and children:
        raise InputError(f"{where}: switch {name!r} has both {nk} and {ck}; Slurm refuses that (topology.conf(5)): "
                         "hang the hosts off a leaf switch of their own")
    for items, what in ((nodes, "node"), (children, "switch")):
        if len(set(items)) != len(items):
            dup = next(x for x in items if items.count(x) > 1)
            raise InputError(f"{where}: {what} {dup!r} is named twice on switch {name!r}; list each {what} once")
    topo.switches[name] = (nodes, children)
    topo.where[name] = where


def _kind(topo: Topo, kind: str, where: str) -> None:
    if topo.kind and topo.kind != kind:
        raise InputError(f"{where}: mixes topology/{topo.kind} and topology/{kind} lines; keep one plugin per file")
    topo.kind = kind


def _sizes(value, where: str) -> list[int]:
    items = value if isinstance(value, list) else str(value).split(",")
    try:
        sizes = [int(str(v).strip()) for v in items if str(v).strip()]
    except ValueError:
        raise InputError(f"{where}: BlockSizes={value!r}: expected comma-separated integers like 18,72") from None
    if not sizes or any(s <= 0 for s in sizes):
        raise InputError(f"{where}: BlockSizes={value!r}: sizes must be positive")
    for a, b in zip(sizes, sizes[1:]):
        r = b / a
        if b <= a or r != int(r) or int(r) & (int(r) - 1):
            raise InputError(f"{where}: BlockSizes {b} after {a}: each size must be a power of two times the "
                             "previous one (Slurm topology.conf(5))")
    return sizes


def parse_topology_yaml(text: str, source: str, topology: str | None = None) -> Topo:
    try:
        doc = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{source}{where}: malformed YAML ({getattr(exc, 'problem', None) or exc}); fix the syntax") from None
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list) or not doc:
        raise InputError(f"{source}: expected a list of '- topology: NAME' entries (Slurm topology.yaml(5))")
    chosen = None
    names = []
    for k, entry in enumerate(doc):
        if not isinstance(entry, dict) or "topology" not in entry:
            raise InputError(f"{source}: entry {k}: expected a mapping with 'topology: NAME'")
        names.append(str(entry["topology"]))
        if topology is not None and str(entry["topology"]) == topology:
            chosen = entry
    if topology is not None and chosen is None:
        raise InputError(f"{source}: no topology named {topology!r}; the file has {', '.join(names)}")
    if chosen is None:
        defaults = [e for e in doc if e.get("cluster_default")]
        chosen = defaults[0] if defaults else doc[0]
    name = chosen["topology"]
    allowed = {"topology", "cluster_default", "tree", "block", "flat", "torus3d"}
    bad = set(chosen) - allowed
    if bad:
        raise InputError(f"{source}: topology {name!r}: unknown key {sorted(bad)[0]!r}; use tree, block or flat")
    topo = Topo()
    if "tree" in chosen:
        topo.kind = "tree"
        tree = chosen["tree"] or {}
        switches = tree.get("switches") if isinstance(tree, dict) else None
        if not isinstance(switches, list) or not switches:
            raise InputError(f"{source}: topology {name!r}: tree.switches must be a non-empty list")
        for k, sw in enumerate(switches):
            where = _at(source, sw, f"{source}: topology {name!r} tree.switches[{k}]")
            if not isinstance(sw, dict) or "switch" not in sw:
                raise InputError(f"{where}: expected a mapping with 'switch: NAME'")
            bad = set(sw) - {"switch", "nodes", "children", "link_speed"}
            if bad:
                raise InputError(f"{where}: unknown key {sorted(bad)[0]!r}; use switch, nodes, children, link_speed")
            nodes = _hl(_join(sw.get("nodes")), where, "nodes")
            children = _hl(_join(sw.get("children")), where, "children")
            if str(sw["switch"]) in topo.switches:
                raise InputError(f"{where}: switch {sw['switch']!r} is defined twice")
            _add_switch(topo, str(sw["switch"]), nodes, children, where, "nodes", "children")
            if sw.get("link_speed") is not None:
                topo.link_speed[str(sw["switch"])] = _speed(sw["link_speed"], where)
    elif "block" in chosen:
        topo.kind = "block"
        block = chosen["block"] or {}
        where0 = f"{source}: topology {name!r} block"
        if not isinstance(block, dict) or not isinstance(block.get("blocks"), list) or not block["blocks"]:
            raise InputError(f"{where0}: block.blocks must be a non-empty list")
        bad = set(block) - {"block_sizes", "blocks"}
        if bad:
            raise InputError(f"{where0}: unknown key {sorted(bad)[0]!r}; use block_sizes and blocks")
        if block.get("block_sizes") is not None:
            topo.block_sizes = _sizes(block["block_sizes"], f"{where0}.block_sizes")
        for k, b in enumerate(block["blocks"]):
            where = _at(source, b, f"{where0}.blocks[{k}]")
            if not isinstance(b, dict) or "block" not in b:
                raise InputError(f"{where}: expected a mapping with 'block: NAME' and 'nodes'")
            bad = set(b) - {"block", "nodes"}
            if bad:
                raise InputError(f"{where}: unknown key {sorted(bad)[0]!r}; use block and nodes")
            nodes = _hl(_join(b.get("nodes")), where, "nodes")
            if not nodes:
                raise InputError(f"{where}: block {b['block']!r} has no nodes")
            topo.blocks.append((str(b["block"]), nodes))
            topo.where[str(b["block"])] = where
    elif chosen.get("flat"):
        raise InputError(f"{source}: topology {name!r} is flat and lists no nodes; choose another with --topology "
                         f"({', '.join(n for n in names if n != name) or 'none'})")
    else:
        raise InputError(f"{source}: topology {name!r} has no tree or block section (torus3d is not supported)")
    return topo


def _join(v) -> str:
    if v is None:
        return ""
    if isinstance(v, list):
        return ",".join(str(x) for x in v)
    return str(v)


def _tree_levels(topo: Topo, source: str) -> tuple[list[str], list[list[list[str]]], list[list[str]]]:
    """Hosts in file order, the node groups of each switch level (leaves first) and the switch
    names of each level. Refuses a switch under two parents and a host on two switches."""
    sw = topo.switches
    parent: dict[str, str] = {}
    for name, (_, children) in sw.items():
        for c in children:
            if c not in sw:
                raise InputError(f"{topo.where[name]}: switch {name!r} lists unknown child switch {c!r}")
            if c in parent:
                raise InputError(f"{topo.where[name]}: switch {c!r} is listed under two parents ({parent[c]!r} at "
                                 f"{topo.where[parent[c]]} and {name!r}); in topology/tree a switch has one parent")
            parent[c] = name
    level: dict[str, int] = {}

    def lev(name: str, stack: tuple[str, ...] = ()) -> int:
        if name in stack:
            raise InputError(f"{topo.where[name]}: switch {name!r} is its own ancestor (a loop)")
        if name not in level:
            nodes, children = sw[name]
            level[name] = max([0] + [lev(c, stack + (name,)) + 1 for c in children])
        return level[name]

    below: dict[str, list[str]] = {}

    def under(name: str) -> list[str]:
        if name not in below:
            nodes, children = sw[name]
            out = list(nodes)
            for c in children:
                out.extend(under(c))
            below[name] = out
        return below[name]

    hosts: list[str] = []
    owner: dict[str, str] = {}
    for name, (nodes, _) in sw.items():
        lev(name)
        for n in nodes:
            if n in owner:
                raise InputError(f"{topo.where[name]}: node {n!r} hangs off two switches ({owner[n]!r} at "
                                 f"{topo.where[owner[n]]} and {name!r}); list each host under one leaf switch")
            owner[n] = name
            hosts.append(n)
    top = max(level.values())
    levels, names = [], []
    for L in range(top + 1):
        at = [n for n in sw if level[n] == L and under(n)]
        names.append(at)
        levels.append([under(n) for n in at])
    return hosts, levels, names


def _level_rates(topo: Topo, names: list[list[str]], nic: float, assumed: list[str]) -> list[float | None]:
    """Per-GPU rate of each switch level from LinkSpeed ratios (None: the NIC rate); see module doc."""
    given = [[topo.link_speed[n] for n in level if n in topo.link_speed] for level in names]
    if not any(given):
        return [None] * len(names)
    if len(given[0]) < len(names[0]):
        assumed.append("LinkSpeed ignored: Slurm's LinkSpeed has no unit and not every leaf switch gives one, so "
                       "there is no base for a ratio; every tier at the NIC rate")
        return [None] * len(names)
    base = min(given[0])
    rates: list[float | None] = [None]
    if len(set(given[0])) > 1:
        assumed.append(f"leaf switches give different LinkSpeed values ({min(given[0]):g}..{max(given[0]):g}); "
                       f"the lowest, {base:g}, is the base of the ratio")
    for L in range(1, len(names)):
        tname = TIER_NAMES[min(L, len(TIER_NAMES) - 1)]
        if len(given[L]) < len(names[L]):
            assumed.append(f"tier '{tname}': not every switch of that level gives LinkSpeed; at the NIC rate "
                           f"({nic:g} Gb/s per GPU)")
            rates.append(None)
            continue
        lo = min(given[L])
        rate = nic * lo / base
        spread = f" (the lowest of {min(given[L]):g}..{max(given[L]):g})" if len(set(given[L])) > 1 else ""
        assumed.append(f"tier '{tname}': {rate:g} Gb/s per GPU = NIC rate {nic:g} x LinkSpeed {lo:g}{spread} / "
                       f"leaf LinkSpeed {base:g}: Slurm's LinkSpeed has no unit, so only its ratio between "
                       "switch levels is read")
        rates.append(rate)
    return rates


def topo_to_cluster(topo: Topo, *, gpu: str | None, gpus_per_node: int | None, source: str,
                    name: str, failed: str | None = None) -> Imported:
    spec = resolve_gpu(gpu, source)
    assumed: list[str] = []
    per = gpus_per_host(spec, gpus_per_node, assumed)
    if topo.kind == "tree":
        hosts, levels, names = _tree_levels(topo, source)
        assumed.append("every host is its own NVLink domain: topology/tree says nothing of NVLink")
        rates = _level_rates(topo, names, spec.nic_gbps, assumed)
        if len(levels[-1]) > 1:
            tname = TIER_NAMES[min(len(levels) - 1, len(TIER_NAMES) - 1)]
            shown = ", ".join(names[-1][:4]) + (", ..." if len(names[-1]) > 4 else "")
            assumed.append(f"no switch reaches all {len(hosts)} hosts (top-level switches {shown} have no common "
                           "parent; Slurm then runs no job across them); traffic between them is costed as "
                           f"crossing the top tier '{tname}', and no higher tier is added")
        c = build_cluster(name=name, spec=spec, nodes=[(h, per) for h in hosts], domains=None, levels=levels,
                          level_gbps=rates, join_top=False, failed=failed, assumed=assumed, source=source)
        return Imported(c, assumed)
    if topo.kind == "ring":
        hosts: list[str] = []
        seen: dict[str, str] = {}
        for rname, nodes in topo.rings:
            for n in nodes:
                if n in seen:
                    raise InputError(f"{topo.where[rname]}: node {n!r} is in two rings ({seen[n]!r} and {rname!r}); "
                                     "list each host once")
                seen[n] = rname
                hosts.append(n)
        assumed.append("every host is its own NVLink domain: topology/ring says nothing of NVLink")
        c = build_cluster(name=name, spec=spec, nodes=[(h, per) for h in hosts], domains=None,
                          levels=[[nodes for _, nodes in topo.rings]], failed=failed, assumed=assumed,
                          source=source)
        return Imported(c, assumed)
    # block
    hosts = []
    seen = {}
    for bname, nodes in topo.blocks:
        for n in nodes:
            if n in seen:
                if seen[n] == bname:
                    raise InputError(f"{topo.where[bname]}: node {n!r} is named twice in block {bname!r}; list each host once")
                raise InputError(f"{topo.where[bname]}: node {n!r} is in two blocks ({seen[n]!r} at "
                                 f"{topo.where[seen[n]]} and {bname!r})")
            seen[n] = bname
            hosts.append(n)
    sizes = topo.block_sizes
    fits = all(len(nodes) * per <= spec.nvlink_domain_max for _, nodes in topo.blocks)
    levels: list[list[list[str]]] = []
    if fits:
        domains = [(b, nodes) for b, nodes in topo.blocks]
        assumed.append(f"each block is one NVLink domain (its GPUs fit the {spec.name}'s {spec.nvlink_domain_max}-GPU "
                       "domain): topology/block says nothing of NVLink")
    else:
        domains = None
        levels.append([nodes for _, nodes in topo.blocks])
        assumed.append(f"every host is its own NVLink domain (a block holds more than the {spec.name}'s "
                       f"{spec.nvlink_domain_max}-GPU domain); blocks are scale-out units")
    base = sizes[0] if sizes else None
    for higher in sizes[1:]:
        # consecutive blocks, in file order, make up a higher-level block of `higher` nodes
        per_group = higher // base
        groups = []
        for i in range(0, len(topo.blocks), per_group):
            groups.append([n for _, nodes in topo.blocks[i:i + per_group] for n in nodes])
        levels.append(groups)
        assumed.append(f"BlockSizes level {higher}: {per_group} consecutive blocks (in file order) share one unit")
    c = build_cluster(name=name, spec=spec, nodes=[(h, per) for h in hosts], domains=domains, levels=levels,
                      failed=failed, assumed=assumed, source=source)
    return Imported(c, assumed)


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text; is it the topology file?") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def import_slurm_conf(path, gpu: str | None, gpus_per_node: int | None = None, name: str | None = None,
                      failed: str | None = None) -> Imported:
    """topology.conf -> ``Imported(cluster, assumed)``; ``failed``: a hostlist marked failed."""
    text = _read(path)
    topo = parse_topology_conf(text, str(path))
    return topo_to_cluster(topo, gpu=gpu, gpus_per_node=gpus_per_node, source=str(path),
                           name=name or Path(path).stem, failed=failed)


def import_slurm_yaml(path, gpu: str | None, gpus_per_node: int | None = None, name: str | None = None,
                      topology: str | None = None, failed: str | None = None) -> Imported:
    """topology.yaml -> ``Imported(cluster, assumed)``; ``failed``: a hostlist marked failed."""
    text = _read(path)
    topo = parse_topology_yaml(text, str(path), topology)
    return topo_to_cluster(topo, gpu=gpu, gpus_per_node=gpus_per_node, source=str(path),
                           name=name or Path(path).stem, failed=failed)
