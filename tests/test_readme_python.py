"""The README's Python example and the CLI give the same plan for the same request (issue 23 item 5).

The README's ```python block is run as written; its ``result`` must be the plan of the Quickstart command
(``topoplan plan --model deepseek-v3 --cluster gb300-nvl72 --gpus 256 --precision mxfp8 --seq-len 4096
--gbs 4096``, run here with ``--json`` in a subprocess), layout for layout and rank for rank, and its
``pred`` the figure of ``topoplan predict`` for the same layout on 64 GPUs of each rack. Before, the
block planned on ``load_cluster(..., gpus=256)`` (three full racks and 40 GPUs of a fourth) and returned
other layouts than the CLI."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cli(argv: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-m", "planner.cli", *argv, "--json"], capture_output=True, text=True,
                       cwd=ROOT, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT), TOPOPLAN_NO_PROGRESS="1"))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _plans(doc: dict) -> list[tuple]:
    return [(p["label"], p["config"], p["placement"]["rank_to_gpu"], p["prediction"]["tflops_per_gpu"])
            for p in doc["plans"]]


@pytest.mark.slow
def test_readme_python_block_plans_what_the_cli_plans():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "the README's Python example moved"
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)   # noqa: S102 - the README's own example, as a user runs it
    quick = next(line for line in text.splitlines() if "topoplan plan --model" in line)
    argv = shlex.split(quick.split("&&", 1)[1])[1:]
    cli = _cli(argv)
    assert _plans(scope["result"].to_dict()) == _plans(cli)
    pred = _cli(["predict", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus", "256",
                 "--usable-per-rack", "64", "--precision", "mxfp8", "--seq-len", "4096", "--gbs", "4096",
                 "--pp", "2", "--vpp", "8", "--ep", "32"])
    assert scope["pred"].tflops_per_gpu == pytest.approx(pred["tflops_per_gpu"], rel=1e-9)
