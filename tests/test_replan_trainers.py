"""The re-planned launch files, checked by megatron-core 0.19.2 itself (issue 20, done-when 2).

Three trays of one GB200 rack fail (more than its two spares): ``topoplan replan`` writes a new plan
and its Megatron arguments. tests/trainers/megatron_check.py runs megatron-core's own
``parse_args`` / ``validate_args`` / ``initialize_model_parallel`` on them and records every rank
list Megatron builds (its RankGenerator). Each TP and EP group must sit on one rack: ranks map to
hosts by the written hostfile (Slurm's rank order) and hosts to racks by the cluster file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import planner
from planner.cli import main
from planner.config import Training
from topologies.loader import load_job
from test_emit_trainers import _megatron_env
from trainers.mcore import ensure_mcore
from trainers.sites import bash_words

pytestmark = pytest.mark.trainers

HARNESS = Path(__file__).resolve().parent / "trainers" / "megatron_check.py"


def _mcore_dir() -> Path:
    return ensure_mcore()   # downloaded on first use: this test never skips for want of it


def _env(out: Path) -> dict:
    return _megatron_env(out)   # megatron/env.sh's exports, read as the other trainer checks read them


def test_megatron_core_groups_of_the_replanned_job_are_rack_local(tmp_path):
    training = Training(seq_len=4096, global_batch=4096, precision="mxfp8")
    doc = planner.plan(planner.load_model("deepseek-v3"), load_job("gb200-nvl72", gpus=256, usable_per_domain=64),
                       training, top=1).to_dict()
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert main(["replan", str(plan_path), "--failed", "gb200-r02-t[03-05]", "--out", str(out)]) == 0
    assert json.loads((out / "replan.json").read_text())["case"] == "replan"
    new = json.loads((out / "plan.json").read_text())
    jobs = [{"id": "replanned", "args": bash_words(out / "megatron" / "args.txt"), "env": _env(out), "sm": 100}]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_mcore_dir()) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, str(HARNESS), str(tmp_path / "jobs.json"), str(tmp_path / "res.json")],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    (res,) = json.loads((tmp_path / "res.json").read_text())["results"]
    assert res["ok"], res["error"]
    hosts = (out / "hostfile").read_text().split()
    assert len(hosts) == new["plans"][0]["config"]["world"]
    assert not {"gb200-r02-t03", "gb200-r02-t04", "gb200-r02-t05"} & set(hosts)
    rack = {h: d["name"] for d in new["cluster"]["domains"] for h in d["nodes"]}
    for axis in ("tp", "ep", "etp"):
        groups = res["groups"][axis]
        assert groups and sum(len(g) for g in groups) == len(hosts)
        assert all(len({rack[hosts[r]] for r in g}) == 1 for g in groups), axis
