"""Ctrl-C (issue 23 item 4): exit 130, nothing written, no traceback.

Before the fix CP-SAT caught SIGINT itself, returned the best layout found so far as if its time limit had
run out, and ``topoplan plan`` went on to write that plan (exit 0, a 104% gap) or to call the request
infeasible (exit 3). The test starts a real ``topoplan plan --method cp-sat --emit ... --out DIR`` in a
subprocess, waits until it has started solving (``TOPOPLAN_SOLVER_DEBUG`` prints a line as each CP-SAT solve
starts) and sends SIGINT, as a terminal does on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus", "256", "--gbs", "4096",
        "--precision", "mxfp8", "--method", "cp-sat"]


def _interrupt_mid_solve(tmp_path, extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TOPOPLAN_SOLVER_DEBUG="1", TOPOPLAN_NO_PROGRESS="1")
    # a fresh session, SIGINT at its default: as in a terminal (a script's background job ignores it)
    proc = subprocess.Popen([sys.executable, "-c", "from planner.cli import run; run()", *PLAN, *extra],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    deadline = time.monotonic() + 240
    for line in proc.stderr:     # blocks until the CLI reports its first solve (or exits)
        lines.append(line)
        if line.startswith("cp-sat solve started"):
            proc.send_signal(signal.SIGINT)
            break
        assert time.monotonic() < deadline, "".join(lines)
    else:
        pytest.fail("the plan ended before it solved:\n" + "".join(lines))
    _, rest = proc.communicate(timeout=240)
    return proc.returncode, "".join(lines) + rest


@pytest.mark.slow
def test_ctrl_c_mid_solve_exits_130_and_writes_nothing(tmp_path):
    out, saved = tmp_path / "launch", tmp_path / "plan.json"
    rc, err = _interrupt_mid_solve(tmp_path, ["--emit", "megatron,slurm", "--out", str(out),
                                              "--save-plan", str(saved)])
    shown = [ln for ln in err.splitlines() if not ln.startswith(("cp-sat", "   "))]
    assert rc == 130, err
    assert "Traceback" not in err
    assert shown == ["error: interrupted (Ctrl-C); nothing more was written"], err
    assert not out.exists() and not saved.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []     # no staging directory left behind either
