"""The two ways to run the tests: the README's command (what .ci/run runs) selects everything, plain
``python -m pytest`` (pyproject's addopts) leaves out the tests marked ``slow`` and ``trainers``."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    first = ROOT.joinpath("README.md").read_text().split("\n## ")[1]  # the first section (Quickstart)
    blocks = re.findall(r"```bash\n(.*?)\n```", first, re.S)
    assert len(blocks) == 2, "the README's first section holds two commands (install + main job; tests)"
    return blocks[1].strip()


def test_ci_runs_the_readme_test_command():
    assert readme_test_command() in ROOT.joinpath(".ci/run").read_text()


def _collected(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-n", "0",
                          *args, "tests/test_examples.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


@pytest.mark.slow   # two pytest collections in subprocesses (~10 CPU s); CI's full run checks it
def test_the_readme_command_selects_what_the_default_leaves_out():
    cmd = readme_test_command().split("&&")[-1].strip()
    args = re.findall(r'"[^"]*"|\S+', cmd)
    assert args[:4] == ["python", "-m", "pytest", "-q"]
    extra = [a.strip('"') for a in args[4:]]
    default, everything = _collected(), _collected(*extra)
    slow = {t for t in everything if "test_expert_placement" in t}  # marked slow in test_examples.py
    assert slow and not slow & default
    assert default < everything
