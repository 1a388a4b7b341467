"""planner/io.py: atomic writes honour the umask, and an output path that cannot be written is a
one-line InputError naming the option (exit 2 on the CLI), with nothing left behind.

Oracles: ``os.stat`` of the written files against 0666 & ~umask (0644 under umask 022, 0640 under
027), computed by hand; the OS's own refusal (/proc and /sys take no new files, a path under a regular
file cannot exist).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

import pytest

from planner.cli import main
from planner.errors import InputError
from planner.io import atomic_dir, atomic_write_text, check_output, current_umask


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize("mask,want,want_sh", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750), (0o077, 0o600, 0o700)])
def test_files_get_the_umask_permissions(tmp_path, mask, want, want_sh):
    with umask(mask):
        assert current_umask() == mask
        f = atomic_write_text(tmp_path / "sub" / "plan.json", "{}\n")
        assert mode(f) == want
        atomic_write_text(f, "{\"again\": 1}\n")           # replacing keeps the umask mode too
        assert mode(f) == want and f.read_text() == "{\"again\": 1}\n"
        with atomic_dir(tmp_path / "launch") as stage:
            (stage / "megatron").mkdir()
            (stage / "megatron" / "args.txt").write_text("--tp 1\n")
            atomic_write_text(stage / "cluster.yaml", "name: x\n")
        assert mode(tmp_path / "launch" / "cluster.yaml") == want
        assert mode(tmp_path / "launch" / "megatron" / "args.txt") == want
        assert mode(tmp_path / "launch") == 0o777 & ~mask
        from trainers.plans import hgx_cluster, plan_doc
        from planner.config import ParallelConfig, Training
        from planner.output.emit import emit_plan

        doc = plan_doc("llama3-8b", hgx_cluster("h100", 1), ParallelConfig(tp=8), Training(global_batch=8), world=8)
        paths = emit_plan(doc, ["megatron", "slurm"], tmp_path / "emitted")
    for p in paths:
        assert mode(p) == (want_sh if p.suffix == ".sh" else want), p
    assert not [p for p in tmp_path.rglob(".*") if p.name.startswith(".")], "a temporary file was left behind"


def test_cli_writes_plan_json_readable_by_the_team(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOPOPLAN_NO_PROGRESS", "1")
    (tmp_path / "topo.conf").write_text("SwitchName=s0 Nodes=dev[0-3]\n")
    with umask(0o022):
        code = main(["topology", "import", "slurm", "topo.conf", "--gpu", "h100", "--gpus-per-node", "8",
                     "-o", "cluster.yaml"])
    capsys.readouterr()
    assert code == 0 and mode(tmp_path / "cluster.yaml") == 0o644


def _refused(path, option, directory=False) -> str:
    with pytest.raises(InputError) as exc:
        check_output(path, option, directory=directory)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{option} ")
    return msg


def test_unwritable_output_paths_are_named(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert "is not a directory" in _refused(tmp_path / "afile" / "plan.json", "--save-plan")
    assert "is not a directory" in _refused(tmp_path / "afile" / "deeper" / "launch", "--out", directory=True)
    assert "exists and is not a directory" in _refused(tmp_path / "afile", "--report", directory=True)
    assert "is a directory" in _refused(tmp_path, "--save-plan")
    assert "cannot write there" in _refused("/proc/topoplan-x", "--out")          # the kernel's: no new files
    if Path("/sys").is_dir():
        assert "cannot write there" in _refused("/sys/topoplan-x/plan.json", "--save-plan")
    # accepted: a new file in a new subdirectory; nothing is created by the check
    assert check_output(tmp_path / "new" / "plan.json", "--save-plan") == tmp_path / "new" / "plan.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):   # root ignores directory permissions: /sys above is the real refusal
            pytest.skip("running as root: a 0555 directory is writable")
        assert "Permission denied" in _refused(ro / "plan.json", "--save-plan")
        with pytest.raises(InputError, match="--out"):
            atomic_write_text(ro / "plan.json", "{}", option="--out")
    finally:
        ro.chmod(0o755)


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("old")

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(InputError, match=r"--save-plan .*No space left on device"):
        atomic_write_text(target, "new", option="--save-plan")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    with pytest.raises(InputError, match="--out"):
        with atomic_dir(tmp_path / "launch", option="--out") as stage:
            (stage / "a.txt").write_text("a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


@pytest.mark.parametrize("argv,option", [
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64",
      "--save-plan", "afile/plan.json"], "--save-plan"),
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64",
      "--emit", "megatron", "--out", "/proc/topoplan-launch"], "--out"),
    (["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64",
      "--report", "afile"], "--report"),
    (["scale", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8,16", "--report", "/proc/r"], "--report"),
    (["emit", "plan.json", "--trainer", "megatron", "--out", "afile/launch"], "--out"),
    (["topology", "import", "slurm", "topo.conf", "--gpu", "h100", "--gpus-per-node", "8", "-o", "/proc/c.yaml"],
     "--out"),
    (["calibrate", "rows.csv", "--stack", "mine", "-o", "afile/profile.yaml"], "--out"),
])
def test_cli_unwritable_output_exits_2(argv, option, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOPOPLAN_NO_PROGRESS", "1")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "plan.json").write_text(json.dumps({"version": 1}))
    (tmp_path / "topo.conf").write_text("SwitchName=s0 Nodes=dev[0-3]\n")
    (tmp_path / "rows.csv").write_text("id\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and err.startswith(f"error: {option} "), err
    assert "internal error" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
