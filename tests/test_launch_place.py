"""topoplan place: the plan on the hosts a scheduler granted (planner/launch).

Oracles: brute force over every slot -> domain map (the sorted pairing must fit exactly when some map
fits); the trainer's own rank groups (planner.cost.placement.rank_groups, checked against
megatron-core elsewhere; megatron-core's RankGenerator itself in test_launch_trainers.py) rebuilt on the
placed hostfile: every group touches as many NVLink domains as in the plan, so every group the plan
keeps in one domain stays in one, for allocations drawn in shuffled order with shuffled names."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_cli
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import planner
from planner.config import ParallelConfig, Training
from planner.cost.placement import AXES, rank_groups
from planner.errors import InfeasibleError, InputError
from planner.launch import core
from planner.launch.allocation import nodelist_pairs, read_allocation, topology_table
from planner.launch.place import granted_cluster, shape_of_document, write_placed
from planner.output.emit import emit_plan
from topologies.cluster import Cluster
from trainers.plans import hgx_cluster, nvl72_cluster, plan_doc

ROOT = Path(__file__).resolve().parents[1]
DSV3 = dict(config=ParallelConfig(tp=1, pp=2, vpp=8, ep=32, mbs=1, recompute="none"),
            training=Training(seq_len=4096, global_batch=4096, precision="mxfp8"))


def _dsv3_doc(gpu="gb200", racks=4):
    """DeepSeek-V3 TP1 PP2 EP32 on 4 racks x 16 trays (64 of 72 GPUs): EP32 groups stay in a rack."""
    return plan_doc("deepseek-v3", nvl72_cluster(gpu, racks), DSV3["config"], DSV3["training"],
                    world=64 * racks, gpus_per_domain=64)


# --- the assignment against brute force -----------------------------------------------------------

def _brute_fits(needs, caps):
    return any(all(caps[d] >= n for n, d in zip(needs, perm)) for perm in itertools.permutations(range(len(caps)),
                                                                                                  len(needs)))


@settings(max_examples=300, deadline=None)
@given(needs=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       caps=st.lists(st.integers(1, 7), min_size=0, max_size=6), seed=st.integers(0, 99))
def test_sorted_pairing_fits_exactly_when_some_map_fits(needs, caps, seed):
    shape = {"slots": [{"hosts": n, "gpus_per_host": 1} for n in needs], "multi_host_domains": True,
             "local_axes": {}, "ranks": [[s, h, 0] for s, n in enumerate(needs) for h in range(n)]}
    pairs = [(f"d{d}-h{h}", f"d{d}") for d, c in enumerate(caps) for h in range(c)]
    random.Random(seed).shuffle(pairs)
    fits = _brute_fits(needs, caps)
    if not fits:
        with pytest.raises(core.Shortfall):
            core.assign(shape, pairs)
        return
    got = core.assign(shape, pairs)
    doms = [s["domain"] for s in got["slots"]]
    assert len(set(doms)) == len(needs)                                     # a domain per slot, never split
    for s, slot in enumerate(got["slots"]):
        assert len(slot["hosts"]) == needs[s] and all(h.startswith(slot["domain"] + "-") for h in slot["hosts"])
    assert len(set(got["hosts"])) == sum(needs) and len(got["unused"]) == sum(caps) - sum(needs)


def test_the_issues_example_exits_3_naming_the_rack(tmp_path):
    """16/16/16/12/4 trays for a plan that needs 4 x 16: the 12-tray rack is named, exit 3, nothing written."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_dsv3_doc()))
    lines = [f"gb200-r{r:02d}-t{t:02d} gb200-r{r:02d}" for r, n in ((1, 16), (2, 16), (3, 16), (5, 12), (6, 4))
             for t in range(1, n + 1)]
    random.Random(1).shuffle(lines)
    granted = tmp_path / "granted.txt"
    granted.write_text("\n".join(lines) + "\n")
    p = run_cli("place", plan, "--allocation", granted, "--out", tmp_path / "run")
    assert p.returncode == 3, p.stderr
    assert p.stderr.startswith("error: rack gb200-r05 holds 12 of the 16 trays an EP32 group set needs")
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    # the same through the library call
    with pytest.raises(InfeasibleError, match="rack gb200-r05 holds 12 of the 16 trays"):
        planner.place(plan, granted)


def test_bad_allocations_exit_2_naming_the_fix(tmp_path):
    doc = _dsv3_doc()
    twice = tmp_path / "twice.txt"
    twice.write_text("a r1\nb r1\na r2\n")
    with pytest.raises(InputError, match="host a is listed twice"):
        planner.place(doc, twice)
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("gb200-r01-t01\nnode-x\n")        # node-x: no domain given, not in the plan's cluster
    with pytest.raises(InputError, match="host node-x has no NVLink domain.*--cluster"):
        planner.place(doc, unknown)
    with pytest.raises(InputError, match="expected 'HOST \\[DOMAIN\\]'"):
        planner.place(doc, _write(tmp_path / "three.txt", "a b c\n"))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- allocation forms -------------------------------------------------------------------------------

def test_domains_from_the_plans_cluster_nvidia_smi_and_topology_conf(tmp_path):
    doc = _dsv3_doc()
    hosts = [f"gb200-r{r:02d}-t{t:02d}" for r in (4, 3, 2, 1) for t in range(18, 0, -1)]
    # HOST lines without a domain: the plan's cluster file names each tray's rack
    placed = planner.place(doc, _write(tmp_path / "a.txt", "\n".join(hosts) + "\n"))
    assert {s["domain"] for s in placed.slots} == {"r01", "r02", "r03", "r04"}
    # pdsh -w ... nvidia-smi -q: every GPU line prefixed with its host; ClusterUUID.CliqueId is the domain
    smi = "".join(f"{h}:     Fabric\n{h}:         CliqueId                          : {int(h[7:9]) + 7}\n"
                  f"{h}:         ClusterUUID                       : 50000000-0000-0000-0000-00000000000{h[8]}\n"
                  for h in hosts for _ in range(4))
    pairs = read_allocation(_write(tmp_path / "smi.txt", smi))
    assert dict(pairs)["gb200-r03-t07"] == "50000000-0000-0000-0000-000000000003.10"
    placed = planner.place(doc, tmp_path / "smi.txt")
    assert len({s["domain"] for s in placed.slots}) == 4
    # a directory of one nvidia-smi -q file per host
    d = tmp_path / "smi"
    d.mkdir()
    for h in hosts[:2]:
        (d / f"{h}.txt").write_text("GPU 00000000:04:00.0\n    Fabric\n        State : Completed\n"
                                    "        CliqueId                          : 5\n"
                                    "        ClusterUUID                       : abc\n" * 4)
    assert sorted(read_allocation(d)) == sorted([(hosts[0], "abc.5"), (hosts[1], "abc.5")])
    # a tray whose GPUs disagree is refused
    bad = smi.replace("CliqueId                          : 8\n", "CliqueId                          : 9\n", 1)
    with pytest.raises(InputError, match="different ClusterUUID.CliqueId"):
        read_allocation(_write(tmp_path / "bad.txt", bad))
    # Slurm: SLURM_JOB_NODELIST with topology.conf blocks (a block of 18 trays x 4 GPUs is one NVLink domain)
    conf = "".join(f"BlockName=blk{r} Nodes=gb200-r{r:02d}-t[01-18]\n" for r in range(1, 5)) + "BlockSizes=18\n"
    table = topology_table(_write(tmp_path / "topology.conf", conf), "gb200", 4)
    pairs = nodelist_pairs("gb200-r[01-04]-t[01-18]", table)
    assert {d for _, d in pairs} == {"blk1", "blk2", "blk3", "blk4"}
    # the same blocks from topology.yaml (topology.yaml(5): block.blocks[].block / nodes)
    doc_yaml = [{"topology": "t", "cluster_default": True,
                 "block": {"block_sizes": [18], "blocks": [{"block": f"yb{r}", "nodes": f"gb200-r{r:02d}-t[01-18]"}
                                                           for r in range(1, 5)]}}]
    table = topology_table(_write(tmp_path / "topology.yaml", yaml.safe_dump(doc_yaml)), "gb200", 4)
    assert dict(nodelist_pairs("gb200-r03-t[05-06]", table)) == {"gb200-r03-t05": "yb3", "gb200-r03-t06": "yb3"}


# --- the proof: shuffled whole-rack slices of a bigger cluster ----------------------------------------

def _renamed(cluster: Cluster, seed: int) -> dict[str, str]:
    """A new, random name for every host (names unrelated to the plan's and in no useful order)."""
    rng = random.Random(seed)
    return {h: f"n{rng.randrange(10**6):06d}-{i}" for i, h in enumerate(cluster.hosts())}


def _domain_counts(config, world, order, rank_dom):
    return {axis: sorted(len({rank_dom[r] for r in g}) for g in rank_groups(config, world, axis, order))
            for axis in AXES}


def check_placed(doc, placed, host_domain):
    """Every group of every axis touches as many domains on the allocation as in the plan; each host
    runs distinct GPUs; and every axis the shape calls domain-local is in one domain."""
    shape = shape_of_document(doc)
    config = ParallelConfig.model_validate({k: v for k, v in doc["plans"][0]["config"].items()
                                            if k in ParallelConfig.model_fields})
    cl = Cluster.model_validate(doc["cluster"])
    gpus = cl.gpus()
    plan_dom = [gpus[g].domain for g in doc["plans"][0]["placement"]["rank_to_gpu"]]
    new_dom = [host_domain[h] for h in placed.hosts]
    assert _domain_counts(config, shape.world, shape.order, new_dom) == \
        _domain_counts(config, shape.world, shape.order, plan_dom)
    for axis in shape.local_axes:
        assert all(len({new_dom[r] for r in g}) == 1 for g in rank_groups(config, shape.world, axis, shape.order))
    sites = list(zip(placed.hosts, placed.local))
    assert len(set(sites)) == shape.world
    return shape


def test_the_check_fails_on_a_placement_that_splits_a_group():
    """The oracle can fail: two trays of different racks swapped in the hostfile split EP32 groups."""
    doc = _dsv3_doc()
    pairs = [(f"h{r}-{t}", f"R{r}") for r in range(4) for t in range(16)]
    placed = planner.place(doc, pairs)
    check_placed(doc, placed, dict(pairs))
    a, b = placed.hosts[0], placed.hosts[-1]
    placed.hosts = [b if h == a else a if h == b else h for h in placed.hosts]
    with pytest.raises(AssertionError):
        check_placed(doc, placed, dict(pairs))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(racks=st.integers(2, 4), trays=st.sampled_from([16, 18]), ep=st.sampled_from([8, 16, 32, 64]),
       tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), extra=st.integers(0, 3), seed=st.integers(0, 10**6))
def test_shuffled_whole_rack_slices_of_a_bigger_nvl72_cluster(racks, trays, ep, tp, pp, extra, seed):
    per = trays * 4
    world = racks * per
    assume(world % (tp * ep * pp) == 0 and per % (tp * ep) == 0)
    config = ParallelConfig(tp=tp, ep=ep, pp=pp, mbs=1, recompute="none")
    doc = plan_doc("deepseek-v3", nvl72_cluster("gb300", racks, trays), config, DSV3["training"], world=world,
                   gpus_per_domain=per)
    # the site: racks + extra racks of 18 trays, renamed; grant `racks` of them (>= trays each), shuffled
    site = nvl72_cluster("gb300", racks + extra, 18)
    new = _renamed(site, seed)
    rng = random.Random(seed)
    chosen = rng.sample(range(racks + extra), racks)
    host_domain, lines = {}, []
    for r in chosen:
        rack = f"rk{rng.randrange(10**6)}-{r}"
        members = [h for h in site.hosts() if h.startswith(f"gb300-r{r + 1:02d}-")]
        for h in rng.sample(members, rng.randint(trays, 18)):
            host_domain[new[h]] = rack
            lines.append((new[h], rack))
    rng.shuffle(lines)
    placed = planner.place(doc, lines)
    shape = check_placed(doc, placed, host_domain)
    if ep * tp <= per:
        assert "ep" in shape.local_axes or ep == 1


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(2, 6), tp=st.sampled_from([2, 4, 8]), pp=st.sampled_from([1, 2]), seed=st.integers(0, 10**6))
def test_hgx_with_topology_block_and_a_shuffled_nodelist(tmp_path_factory, nodes, tp, pp, seed):
    """HGX H100 hosts (each its own NVLink domain) under Slurm topology/block (blocks of 32 hosts are
    scale-out units, not NVLink domains): any granted hosts hold the plan; TP stays inside a host."""
    world = nodes * 8
    assume(world % (tp * pp) == 0)
    config = ParallelConfig(tp=tp, pp=pp, mbs=1, recompute="none")
    doc = plan_doc("llama3-70b", hgx_cluster("h100", nodes), config,
                   Training(seq_len=4096, global_batch=world, precision="bf16"), world=world)
    rng = random.Random(seed)
    conf = "BlockName=b0 Nodes=dgx-0-[000-031]\nBlockName=b1 Nodes=dgx-1-[000-031]\nBlockSizes=32\n"
    path = tmp_path_factory.mktemp("topo") / "topology.conf"
    path.write_text(conf)
    table = topology_table(path, "h100", 8)
    granted = rng.sample(sorted(table), nodes + rng.randint(0, 3))
    pairs = nodelist_pairs(",".join(granted), table)
    assert all(d == h for h, d in pairs)                       # 32 x 8 GPUs > an HGX domain: each host its own
    placed = planner.place(doc, pairs)
    shape = check_placed(doc, placed, dict(pairs))
    assert "tp" in shape.local_axes


# --- the files, the CLI and the full flow ----------------------------------------------------------

def test_place_writes_hostfile_and_mapping_and_the_cli_prints_json(tmp_path):
    plan = _write(tmp_path / "plan.json", json.dumps(_dsv3_doc()))
    lines = [f"x{r}-{t} R{r}" for r in range(5) for t in range(17)]
    granted = _write(tmp_path / "granted.txt", "\n".join(lines) + "\n")
    p = run_cli("place", plan, "--allocation", granted, "--out", tmp_path / "run", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    hostfile = (tmp_path / "run" / "hostfile").read_text().split()
    assert hostfile == out["hosts"] and len(hostfile) == 256 and len(set(hostfile)) == 64
    assert (tmp_path / "run" / "local_gpus").read_text().split() == [str(g) for g in out["local"]]
    assert len(out["unused"]) == 5 * 17 - 64 and out["local_axes"] == {"ep": 32}


def test_cli_nodelist_with_topology_conf_and_bad_options(tmp_path, capsys, monkeypatch):
    """--nodelist "$SLURM_JOB_NODELIST" with the racks from topology.conf blocks; the option rules exit 2
    (the CLI's main in this process, as the console script runs it)."""
    from planner.cli import main

    plan = _write(tmp_path / "plan.json", json.dumps(_dsv3_doc()))
    conf = _write(tmp_path / "topology.conf", "".join(f"BlockName=rack{r} Nodes=nv{r}-[01-18]\n" for r in range(6)))
    p = run_cli("place", plan, "--nodelist", "nv[0-3]-[01-16],nv5-[01-18]", "--topology", conf, "--out",
                tmp_path / "run", "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert sorted(s["domain"] for s in got["slots"]) == ["rack0", "rack1", "rack2", "rack5"]
    assert all(h.startswith(s["domain"].replace("rack", "nv") + "-") for s in got["slots"] for h in s["hosts"])
    for argv, what in ((["--out", "x"], "exactly one of --allocation FILE and --nodelist"),
                       (["--nodelist", "nv0-01", "--allocation", str(plan), "--out", "x"], "exactly one of"),
                       (["--nodelist", "nv[0-", "--topology", str(conf), "--out", "x"], "--nodelist 'nv[0-'"),
                       (["--allocation", str(plan), "--topology", str(conf), "--out", "x"], "--topology: only with")):
        monkeypatch.chdir(tmp_path)
        rc, err = main(["place", str(plan), *argv]), capsys.readouterr().err
        assert rc == 2 and what in err and "Traceback" not in err, (argv, err)
        assert len(err.strip().splitlines()) == 1


def test_degrade_plans_again_on_what_was_granted(tmp_path):
    doc = _dsv3_doc()
    pairs = [(f"gb200-r{r:02d}-t{t:02d}", f"r{r:02d}") for r, n in ((1, 16), (2, 16), (3, 16), (4, 12))
             for t in range(1, n + 1)]
    placed = planner.place(doc, pairs, degrade=True, time_limit=5)
    assert placed.degraded and "holds 12 of the 16 trays" in placed.reason
    new = placed.plan
    assert new["plans"][0]["placement"]["hosts"] == placed.hosts          # the new plan's own hosts
    assert set(placed.hosts) <= {h for h, _ in pairs}
    check_placed(new, placed, dict(pairs))
    paths = write_placed(placed, tmp_path / "run")
    assert tmp_path / "run" / "plan.json" in paths


def test_degrade_plans_on_a_granted_spare_tray_never_on_a_broken_one():
    """--degrade plans on the granted hosts: a granted spare tray (health.spare_trays) is the job's to use,
    a granted broken tray (health.failed_trays) stays out."""
    own = Cluster.model_validate({
        "name": "rack", "gpu": "gb200", "nodes": [{"name": f"r1-t{i:02d}", "gpus": 4} for i in range(1, 19)],
        "domains": [{"name": "r1", "nodes": [f"r1-t{i:02d}" for i in range(1, 19)]}],
        "health": {"failed_trays": ["r1-t05"], "spare_trays": ["r1-t17", "r1-t18"]}})
    assert own.num_gpus == 60
    pairs = [(f"r1-t{i:02d}", "r1") for i in (1, 2, 5, 17)]
    c = granted_cluster(own, pairs)
    assert c.health.failed_trays == ["r1-t05"] and c.health.spare_trays == []
    assert sorted({g.node for g in c.gpus()}) == ["r1-t01", "r1-t02", "r1-t17"] and c.num_gpus == 12


def test_core_is_standard_library_only_and_old_python_syntax():
    """slurm/place.py must run on any batch host: it imports only the standard library and parses as 3.7."""
    import ast
    tree = ast.parse((ROOT / "planner" / "launch" / "core.py").read_text(), feature_version=(3, 7))
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names


def test_the_shipped_launcher_is_the_core_module(tmp_path):
    """slurm/place.py is planner/launch/core.py byte for byte, and it runs on python3 -I (no topoplan)."""
    out = tmp_path / "o"
    emit_plan(_dsv3_doc(), ["slurm"], out)
    assert (out / "slurm" / "place.py").read_text() == (ROOT / "planner" / "launch" / "core.py").read_text()
    hosts = [f"t{r}-{i}" for r in range(4) for i in range(18)]
    _write(tmp_path / "granted", "\n".join(hosts) + "\n")
    _write(tmp_path / "domains", "".join(f"{h} rack{h[1]}\n" for h in hosts))
    p = subprocess.run(["python3", "-I", str(out / "slurm" / "place.py"), str(out / "slurm" / "shape.json"),
                        str(tmp_path / "granted"), str(tmp_path / "domains"), str(tmp_path / "hostfile"),
                        str(tmp_path / "local")], capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    placed = planner.place(_dsv3_doc(), [(h, f"rack{h[1]}") for h in hosts])
    assert (tmp_path / "hostfile").read_text().split() == placed.hosts
    _write(tmp_path / "domains", "".join(f"{h} rack{h[1] if int(h.split('-')[1]) < 15 else 'x'}\n" for h in hosts))
    p = subprocess.run(["python3", "-I", str(out / "slurm" / "place.py"), str(out / "slurm" / "shape.json"),
                        str(tmp_path / "granted"), str(tmp_path / "domains"), str(tmp_path / "hostfile2")],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 3 and "holds 15 of the 16 trays an EP32 group set needs" in p.stderr
    assert not (tmp_path / "hostfile2").exists()
    p = subprocess.run(["python3", "-I", str(out / "slurm" / "place.py"), str(tmp_path / "missing.json"),
                        str(tmp_path / "granted"), "-", str(tmp_path / "hostfile3")], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.splitlines()) == 1
