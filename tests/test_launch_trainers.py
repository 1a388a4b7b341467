"""The launch flow end to end, checked with megatron-core's own rank groups (RankGenerator, 0.19.2):
``topoplan plan ... --emit megatron,slurm --out launch/`` on a bigger NVL72 cluster, then
``topoplan place launch/plan.json --allocation granted.txt --out run/`` on shuffled whole-rack slices;
and seeded layouts on NVL72 and HGX clusters. On the placed hostfile every Megatron group touches as
many NVLink domains as in the plan, so every group the plan keeps in one domain stays in one."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import planner
from planner.config import ParallelConfig, Training
from planner.launch.place import shape_of_document
from topologies.cluster import Cluster
from trainers.mcore import ensure_mcore
from trainers.plans import hgx_cluster, nvl72_cluster, plan_doc

pytestmark = pytest.mark.trainers
HARNESS = Path(__file__).resolve().parent / "trainers" / "rank_generator_check.py"
ORDERS = ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-pp-dp-cp-ep"]


def _mcore() -> str:
    return str(ensure_mcore())   # downloaded on first use: this test never skips for want of it


def _megatron_groups(jobs: list[dict], tmp: Path) -> dict:
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": _mcore() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, str(HARNESS), str(tmp / "jobs.json"), str(tmp / "groups.json")],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((tmp / "groups.json").read_text())


def _job(doc: dict, name: str) -> dict:
    c = doc["plans"][0]["config"]
    shape = shape_of_document(doc)
    etp = ParallelConfig.model_validate({k: v for k, v in c.items() if k in ParallelConfig.model_fields}).etp_eff
    return {"id": name, "tp": c["tp"], "cp": c["cp"], "ep": c["ep"], "etp": etp, "pp": c["pp"],
            "world": shape.world, "order": shape.order}


def _plan_domains(doc: dict) -> list[int]:
    gpus = Cluster.model_validate(doc["cluster"]).gpus()
    return [gpus[g].domain for g in doc["plans"][0]["placement"]["rank_to_gpu"]]


def _check(groups: dict, plan_dom, placed_dom, local_axes) -> None:
    for axis, gs in groups.items():
        assert [len({plan_dom[r] for r in g}) for g in gs] == [len({placed_dom[r] for r in g}) for g in gs], axis
    for axis in local_axes:
        assert all(len({placed_dom[r] for r in g}) == 1 for g in groups[axis]), axis


def _grant(cluster: Cluster, racks: int, rng: random.Random, rename: bool):
    """Whole racks of ``cluster`` (``racks`` of them, drawn at random), lines shuffled; with ``rename`` the
    hosts and racks get new names (a site the plan never saw)."""
    table = {}
    names = cluster.domain_names()
    for h in cluster.hosts():
        table[h] = names[cluster.node_domain(h)]
    chosen = rng.sample(sorted(set(table.values())), racks)
    new_rack = {d: (f"rack-{rng.randrange(10**5)}-{i}" if rename else d) for i, d in enumerate(chosen)}
    pairs = [((f"z{rng.randrange(10**6)}-{i}" if rename else h), new_rack[d])
             for i, (h, d) in enumerate(table.items()) if d in new_rack]
    rng.shuffle(pairs)
    return pairs


def test_plan_emit_then_place_keeps_megatron_groups_in_their_domains(tmp_path):
    """The issue's "done when": plan on a bigger cluster, emit megatron+slurm, place on a shuffled
    allocation of whole-rack slices (some lines without a domain: the site's cluster file names it; the
    plan's own cluster holds only the racks the plan used)."""
    site = nvl72_cluster("gb300", 8, name="site")
    (tmp_path / "site.yaml").write_text(site.to_yaml())
    cli = [sys.executable, "-m", "planner.cli"]
    p = subprocess.run([*cli, "plan", "--model", "deepseek-v3", "--cluster", str(tmp_path / "site.yaml"),
                        "--gpus", "256", "--precision", "mxfp8", "--gbs", "4096",
                        "--top", "1", "--time-limit", "20", "--emit", "megatron,slurm", "--out",
                        str(tmp_path / "launch")], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "launch" / "plan.json").read_text())
    assert (tmp_path / "launch" / "slurm" / "place.py").exists()
    rng = random.Random(19)
    pairs = _grant(site, 5, rng, rename=False)
    lines = [f"{h} {d}" if i % 2 else h for i, (h, d) in enumerate(pairs)]
    (tmp_path / "granted.txt").write_text("\n".join(lines) + "\n")
    p = subprocess.run([*cli, "place", "launch/plan.json", "--allocation", "granted.txt", "--out", "run",
                        "--cluster", "site.yaml"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    hosts = (tmp_path / "run" / "hostfile").read_text().split()
    groups = _megatron_groups([_job(doc, "flow")], tmp_path)["flow"]
    table = dict(pairs)
    _check(groups, _plan_domains(doc), [table[h] for h in hosts], shape_of_document(doc).local_axes)


def test_seeded_layouts_on_shuffled_renamed_allocations(tmp_path):
    rng = random.Random(2026)
    cases, placed = [], {}
    training = Training(seq_len=4096, global_batch=4096, precision="bf16")
    for i in range(10):
        tp, pp, cp = rng.choice([1, 2, 4]), rng.choice([1, 2]), rng.choice([1, 2])
        order = rng.choice(ORDERS)
        if i % 2:       # NVL72: 16 of 18 trays per rack
            racks = rng.randint(2, 4)
            cluster, world, gpd = nvl72_cluster("gb200", racks), 64 * racks, 64
            ep = rng.choice([8, 16, 32])
            site = nvl72_cluster("gb200", racks + 3, name="site")
        else:           # HGX H100: each host its own domain
            nodes = rng.randint(2, 8)
            cluster, world, gpd = hgx_cluster("h100", nodes), 8 * nodes, None
            ep = rng.choice([1, 2, 8])
            site = hgx_cluster("h100", nodes + 4, name="site")
        cfg = ParallelConfig(tp=tp, pp=pp, cp=cp if ep == 1 else 1, ep=ep, mbs=1, recompute="none")
        if world % (tp * cfg.cp * pp) or world % (tp * ep * pp):
            continue
        doc = plan_doc("deepseek-v3", cluster, cfg, training, world=world, gpus_per_domain=gpd)
        doc["plans"][0]["placement"]["order"] = order
        racks_needed = len(shape_of_document(doc).slots)
        pairs = _grant(site, racks_needed + rng.randint(0, 2), rng, rename=True)
        result = planner.place(doc, pairs)
        placed[f"c{i}"] = (doc, [dict(pairs)[h] for h in result.hosts])
        cases.append(_job(doc, f"c{i}"))
    assert len(cases) >= 6
    groups = _megatron_groups(cases, tmp_path)
    for name, (doc, placed_dom) in placed.items():
        _check(groups[name], _plan_domains(doc), placed_dom, shape_of_document(doc).local_axes)
