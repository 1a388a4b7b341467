"""Every script in examples/ runs to completion and leaves the files it promises, with contents that
follow from its scenario (world size, rank order, excluded tray, trainer flags)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(name: str, out: Path, env: dict | None = None) -> str:
    import os

    res = subprocess.run([sys.executable, str(EXAMPLES / name), "--out", str(out)], capture_output=True, text=True,
                         timeout=600, cwd=out.parent, env={**os.environ, "TOPOPLAN_NO_PROGRESS": "1", **(env or {})})
    assert res.returncode == 0, f"{name} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert "Traceback" not in res.stderr
    return res.stdout


def test_every_example_has_a_test():
    scripts = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    tested = {"deepseek_v3_gb300_megatron.py", "llama405b_h100_torchtitan.py", "qwen3_gb200_failed_tray.py",
              "slurm_topology_plan.py", "expert_placement.py", "launcher_api.py", "calibrate_own_runs.py",
              "closed_loop.py", "replan_after_failure.py"}
    assert scripts == tested


@pytest.mark.slow
def test_deepseek_v3_gb300_megatron(tmp_path):
    out = tmp_path / "dsv3"
    stdout = _run("deepseek_v3_gb300_megatron.py", out)
    assert stdout.startswith("#1 ")
    args = (out / "megatron" / "args.txt").read_text()
    assert "--num-experts 256" in args and "--expert-model-parallel-size" in args
    hosts = (out / "slurm" / "hostfile").read_text().split()
    assert len(hosts) == 256
    # 64 GPUs used in each of the four racks: every rack's hosts carry 64 ranks (16 trays x 4)
    racks = {}
    for h in hosts:
        racks[h.rsplit("-", 1)[0]] = racks.get(h.rsplit("-", 1)[0], 0) + 1
    assert sorted(racks.values()) == [64, 64, 64, 64], racks
    assert (out / "report" / "index.html").stat().st_size > 0


@pytest.mark.slow
def test_llama405b_h100_torchtitan(tmp_path):
    out = tmp_path / "llama"
    _run("llama405b_h100_torchtitan.py", out)
    cmd = (out / "torchtitan" / "command.txt").read_text()
    assert "--parallelism." in cmd
    assert (out / "torchtitan" / "job.toml").stat().st_size > 0
    assert len((out / "slurm" / "hostfile").read_text().split()) == 1024


@pytest.mark.slow
def test_qwen3_gb200_failed_tray(tmp_path):
    out = tmp_path / "qwen3"
    stdout = _run("qwen3_gb200_failed_tray.py", out)
    failed = stdout.split("tray ", 1)[1].split(" failed", 1)[0]
    before = json.loads((out / "plan-healthy.json").read_text())
    after = json.loads((out / "plan-failed-tray.json").read_text())
    assert failed in before["plans"][0]["placement"]["hosts"]  # the tray was in use before...
    assert failed not in after["plans"][0]["placement"]["hosts"]  # ...and is not after
    assert len(after["plans"][0]["placement"]["rank_to_gpu"]) <= 252
    # the tray is broken, not a spare: a replan after another failure in its rack never runs on it
    from planner.launch.replan import replan

    assert after["cluster"]["health"]["failed_trays"] == [failed]
    victim = next(h for h in after["plans"][0]["placement"]["hosts"] if h.split("-t")[0] == failed.split("-t")[0])
    res = replan(after, victim)
    assert not {failed, victim} & set(res.document["plans"][0]["placement"]["hosts"])
    assert {failed, victim} <= set(res.document["cluster"]["health"]["failed_trays"])


@pytest.mark.slow
def test_replan_after_failure(tmp_path):
    out = tmp_path / "replan"
    stdout = _run("replan_after_failure.py", out)
    healthy = json.loads((out / "plan-healthy.json").read_text())["plans"][0]["placement"]["hosts"]
    one = (out / "one-tray" / "hostfile").read_text().split()
    changed = [r for r, (a, b) in enumerate(zip(healthy, one)) if a != b]
    assert len(one) == len(healthy) and len(changed) == 4                  # only the tray's 4 ranks moved
    assert {healthy[r] for r in changed} == {"gb200-r02-t07"} and {one[r] for r in changed} <= {"gb200-r02-t17",
                                                                                                "gb200-r02-t18"}
    assert "gb200-r02-t07: spares" in stdout and "gb200-r01-t[02-04]: replan" in stdout
    three = json.loads((out / "three-trays" / "plan.json").read_text())
    assert not {"gb200-r01-t02", "gb200-r01-t03", "gb200-r01-t04"} & set(three["plans"][0]["placement"]["hosts"])
    assert (out / "three-trays" / "megatron" / "args.txt").exists()


@pytest.mark.slow
def test_slurm_topology_plan(tmp_path):
    import yaml

    out = tmp_path / "slurm"
    _run("slurm_topology_plan.py", out)
    cluster = yaml.safe_load((out / "cluster.yaml").read_text())
    assert cluster["gpu"] in ("gb200", "GB200")
    doc = json.loads((out / "plan.json").read_text())
    assert doc["plans"] and len(doc["plans"][0]["placement"]["rank_to_gpu"]) <= 144
    hosts = set(doc["plans"][0]["placement"]["hosts"])
    assert hosts <= {f"gb200-{r}{i:02d}" for r in "ab" for i in range(1, 19)}


@pytest.mark.slow
def test_expert_placement(tmp_path):
    out = tmp_path / "experts"
    _run("expert_placement.py", out)
    assert (out / "loads.json").exists()
    assert any((out / "placement").iterdir())
    assert (out / "report" / "index.html").stat().st_size > 0


@pytest.mark.slow
def test_launcher_api(tmp_path):
    out = tmp_path / "launcher"
    stdout = _run("launcher_api.py", out, env={"SLURM_NNODES": "4", "RANK": "9", "SLURM_JOB_NODELIST": "dgx-[7-10]"})
    # rank 9 runs on a granted host, never on one of the plan's preset names
    assert re.search(r"^rank 9 runs on dgx-(7|8|9|10) GPU [0-7] \(the plan named h100-n\d{4}\)$", stdout, re.M)
    assert (out / "megatron" / "args.txt").stat().st_size > 0


@pytest.mark.slow
def test_calibrate_own_runs(tmp_path):
    import re

    from planner.cost.profiles import load_profile
    from planner.calibration.validate import read_rows

    out = tmp_path / "cal"
    stdout = _run("calibrate_own_runs.py", out)
    assert len(read_rows(out / "runs.csv")) == 7
    prof = load_profile(str(out / "my-gb200.yaml"))
    assert prof.name == "my-gb200" and prof.fit_rows.startswith("runs.csv: 7 rows")
    shipped, fitted = (float(x) for x in re.search(r"MAPE: shipped megatron-26.04 ([\d.]+)%, fitted ([\d.]+)%",
                                                    stdout).groups())
    assert fitted < shipped                      # the fit explains its own runs better than the shipped profile
    assert len(re.findall(r"^Qwen3-235B on 128 GB200 with ", stdout, re.M)) == 2


@pytest.mark.slow
def test_closed_loop(tmp_path):
    import re

    from planner.cost.profiles import load_profile

    logs = EXAMPLES / "logs"
    shipped = sorted(logs.glob("*.log"))
    assert len(shipped) == 6 and all(p.name.endswith(".synthesized.log") for p in shipped)
    assert all(p.read_text().startswith("# SYNTHESIZED") for p in shipped)
    out = tmp_path / "loop"
    stdout = _run("closed_loop.py", out)
    man = json.loads((out / "trials" / "trials.json").read_text())["trials"]
    assert len(man) == 3 and man[2]["compare"] and man[2]["label"].startswith("TP1 PP1 EP8")
    for t in man:   # every trial runs 20 iterations with per-iteration logging
        args = (out / "trials" / t["id"] / "megatron" / "args.txt").read_text()
        assert "--train-iters 20" in args and "--log-interval 1" in args and "--log-throughput" in args
    prof = load_profile(str(out / "my-megatron.yaml"))
    assert prof.name == "my-megatron" and prof.fit_rows.startswith("runs.csv: 6 rows")
    rep = json.loads((out / "trial-report.json").read_text())
    cmp_ = rep["trials"][2]
    assert abs(cmp_["refitted_error_pct"]) < abs(cmp_["error_pct"])   # the refit explains the measured trial better
    held = float(re.search(r"unseen runs of the stack: 12, MAPE ([\d.]+)%", stdout).group(1))
    assert held < 15.0
    assert json.loads((out / "plan-fitted.json").read_text())["training"]["stack"] == "my-megatron"
