"""``--out`` that already holds files (issue 23 item 4): another plan's launch files are refused (exit 2, one
line naming --out and --force) or, with --force, replaced whole; the same plan's files are refreshed."""

from __future__ import annotations

import contextlib
import io
import json
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
    from planner.cli import main   # the console script's entry point, in this process

    def run(*args):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            return main(["emit", *args]), err.getvalue()

    out = str(tmp_path / "launch")
    assert run(str(pa), "--trainer", "megatron", "--out", out)[0] == 0
    rc, err = run(str(pb), "--trainer", "megatron", "--out", out)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: --out ")
    assert "--force" in err and "Traceback" not in err
    assert run(str(pb), "--trainer", "megatron", "--out", out, "--force")[0] == 0
