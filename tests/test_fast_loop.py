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


# -- the quick loop's hypothesis budget (tests/conftest.py) --------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from conftest import QUICK_MARKEXPR, is_quick_loop, quick_examples  # noqa: E402

@settings(max_examples=60, database=None)
@given(st.integers())
def test_a_hypothesis_test_asking_for_60_examples(x):
    assert isinstance(x, int)


@pytest.mark.parametrize("x", [1, 2])
@settings(max_examples=45, database=None)
@given(y=st.integers())
def test_a_parametrized_hypothesis_test_is_scaled_once(x, y):
    pass


def test_quick_loop_is_pyprojects_default_selection():
    import tomllib

    addopts = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert f"-m '{QUICK_MARKEXPR}'" in addopts


def test_quick_examples_is_a_third_and_keeps_small_budgets_whole():
    assert [quick_examples(n) for n in (1, 4, 10, 12, 25, 30, 40, 60, 100, 300)] == \
        [1, 4, 10, 10, 10, 10, 14, 20, 34, 100]


def test_the_quick_loop_runs_a_third_of_each_hypothesis_budget(request):
    """The budgets of the tests above as collected: a third in the quick loop, whole in any other
    selection (the README's command, CI). The private attribute is what conftest rewrites."""
    quick = is_quick_loop(request.config)
    want = (20, 15) if quick else (60, 45)
    got = (test_a_hypothesis_test_asking_for_60_examples._hypothesis_internal_use_settings.max_examples,
           test_a_parametrized_hypothesis_test_is_scaled_once._hypothesis_internal_use_settings.max_examples)
    assert got == want
