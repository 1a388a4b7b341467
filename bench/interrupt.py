"""How fast Ctrl-C ends ``topoplan plan`` in the middle of a CP-SAT solve (issue 23 item 4).

Run: ``python bench/interrupt.py [REPEATS]``

Each repeat starts ``topoplan plan --method cp-sat --emit megatron --out DIR`` (DeepSeek-V3 on 1,024 GB300)
in a subprocess, waits for the line ``TOPOPLAN_SOLVER_DEBUG`` prints as a CP-SAT solve starts, sends SIGINT
and prints the seconds until the process exits, its exit code (130 expected) and whether DIR was written
(it must not be). tests/test_interrupt.py asserts the behaviour; this script only measures the delay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus", "1024", "--gbs", "8192",
        "--precision", "mxfp8", "--method", "cp-sat", "--emit", "megatron"]


def one(tmp: Path) -> tuple[float, int, bool, float]:
    out = tmp / "launch"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TOPOPLAN_SOLVER_DEBUG="1", TOPOPLAN_NO_PROGRESS="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "from planner.cli import run; run()", *PLAN, "--out", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stderr:
        if line.startswith("cp-sat solve started"):
            break
    started = time.perf_counter() - t0
    t1 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=600)
    return time.perf_counter() - t1, proc.returncode, out.exists(), started


def main(argv: list[str]) -> int:
    repeats = int(argv[0]) if argv else 3
    print(f"{'run':>3}  {'to solve (s)':>12}  {'SIGINT -> exit (s)':>18}  {'exit':>4}  written")
    for i in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            dt, rc, written, started = one(Path(d))
        print(f"{i:>3}  {started:>12.2f}  {dt:>18.2f}  {rc:>4}  {'yes' if written else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
