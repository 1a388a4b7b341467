"""``--out`` that already holds files (issue 23 item 4): another plan's launch files are refused (exit 2, one
line naming --out and --force) or, with --force, replaced whole; the same plan's files are refreshed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.config import ParallelConfig, Training
from planner.errors import InputError
from planner.output.emit import emit_plan
from trainers.plans import hgx_cluster, plan_doc

ROOT = Path(__file__).resolve().parents[1]
T = Training(seq_len=8192, global_batch=64, precision="bf16")


def _docs():
    a = plan_doc("llama3-8b", hgx_cluster("h100", 1), ParallelConfig(dp=8), T)
    b = plan_doc("llama3-8b", hgx_cluster("h100", 1), ParallelConfig(tp=2, dp=4), T)
    return a, b


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_another_plans_files_are_refused_and_left_as_they_were(tmp_path):
    a, b = _docs()
    out = tmp_path / "launch"
    emit_plan(a, ["megatron", "torchtitan"], out)
    before = _tree(out)
    with pytest.raises(InputError) as err:
        emit_plan(b, ["megatron"], out)
    msg = str(err.value)
    assert "--out" in msg and "--force" in msg and "another plan" in msg and "\n" not in msg
    assert _tree(out) == before
    # the same plan again (another trainer): allowed, the plan's other files stay
    emit_plan(a, ["slurm"], out)
    assert set(before) < set(_tree(out))


def test_force_replaces_the_directory_whole(tmp_path):
    a, b = _docs()
    out = tmp_path / "launch"
    emit_plan(a, ["megatron", "torchtitan"], out)
    (out / "notes.txt").write_text("mine")
    written = emit_plan(b, ["megatron"], out, force=True)
    assert sorted(_tree(out)) == sorted(str(p.relative_to(out)) for p in written)   # nothing of plan a is left
    assert json.loads((out / "plan.json").read_text())["plans"][0]["config"]["tp"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch"]               # no staging left behind


def test_a_directory_of_other_files_is_refused(tmp_path):
    a, _ = _docs()
    out = tmp_path / "launch"
    out.mkdir()
    (out / "data.bin").write_bytes(b"x")
    with pytest.raises(InputError, match=r"--out .*not topoplan's launch files.*--force"):
        emit_plan(a, ["megatron"], out)


def test_cli_exit_2_one_line(tmp_path):
    a, b = _docs()
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = lambda *args: subprocess.run([sys.executable, "-m", "planner.cli", "emit", *args],  # noqa: E731
                                       capture_output=True, text=True, env=env, timeout=120)
    out = str(tmp_path / "launch")
    assert run(str(pa), "--trainer", "megatron", "--out", out).returncode == 0
    r = run(str(pb), "--trainer", "megatron", "--out", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: --out ")
    assert "--force" in r.stderr and "Traceback" not in r.stderr
    assert run(str(pb), "--trainer", "megatron", "--out", out, "--force").returncode == 0
