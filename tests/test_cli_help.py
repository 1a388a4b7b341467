"""A command group without its subcommand prints its help on stdout and exits 0 (issue 23 item 4):
``topoplan``, ``topoplan models``, ``topoplan topology``. Before, the two groups exited 2 and nothing
was printed at all (typer's no-args help was swallowed by the non-standalone entry point)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from planner.cli import app, main

ROOT = Path(__file__).resolve().parents[1]


def _subcommands(argv: list[str]) -> list[str]:
    """The group's subcommands, from typer's own command tree (the oracle for what the help must list)."""
    cmd = typer.main.get_command(app)   # the root group loads a command's module when it is looked up
    for name in argv:
        cmd = cmd.get_command(None, name)
    return sorted(cmd.list_commands(None))


@pytest.mark.parametrize("argv", [[], ["models"], ["topology"]], ids=["topoplan", "models", "topology"])
def test_group_without_subcommand_prints_its_help(argv, capsys):
    assert main(list(argv)) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("Usage: topoplan" + "".join(" " + a for a in argv) + " [OPTIONS] COMMAND")
    subs = _subcommands(argv)
    assert subs and all(s in out for s in subs)


def test_console_script_prints_help_with_exit_0():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", "from planner.cli import run; run()", "models"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("Usage: topoplan models") and r.stderr == ""
