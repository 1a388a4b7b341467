"""The CLI loads a command's module only when that command runs (planner.cli.COMMANDS): the table
must name every command with its module and its own help, and --help must import none of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

from planner import cli

ROOT = Path(__file__).resolve().parents[1]


def _commands_of(module: str) -> dict:
    sub = typer.Typer(rich_markup_mode=None)
    sub.callback()(lambda: None)
    cli.command_module(module).register(sub)
    return typer.main.get_group(sub).commands


def test_the_table_names_every_command_with_its_module_and_help():
    modules = [p.stem for p in (ROOT / "planner" / "cli").glob("*.py") if not p.stem.startswith("_")]
    found = {}
    for mod in modules:
        if hasattr(cli.command_module(mod), "register"):
            for name, cmd in _commands_of(mod).items():
                found[name] = (mod, cmd.get_short_help_str(10 ** 6))
    assert found == cli.COMMANDS


def test_the_table_check_sees_a_wrong_line(monkeypatch):
    """Mutant: a help line that differs from the command's own is caught by the comparison above."""
    bad = dict(cli.COMMANDS)
    bad["plan"] = ("plan", "Plan something.")
    monkeypatch.setattr(cli, "COMMANDS", bad)
    found = {name: ("plan", cmd.get_short_help_str(10 ** 6)) for name, cmd in _commands_of("plan").items()}
    assert found["plan"] != cli.COMMANDS["plan"]


def _loaded_after(argv: list[str]) -> set[str]:
    code = ("import sys\nfrom planner.cli import main\n"
            f"rc = main({argv!r})\nprint(rc, ' '.join(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    rc, mods = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert rc == "0", proc.stderr
    return set(mods.split())


def test_help_imports_no_command_and_no_cost_model():
    mods = _loaded_after(["--help"])
    heavy = {"numpy", "ortools", "networkx", "planner.config", "planner.cost.predict", "planner.search.plan",
             "topologies.cluster"} | {f"planner.cli.{m}" for m, _ in cli.COMMANDS.values()}
    assert mods & heavy == set()


def test_a_command_loads_its_own_module_only():
    mods = _loaded_after(["models", "list"])
    assert "planner.cli.models" in mods
    assert {"planner.cli.plan", "planner.cli.experts", "planner.cli.trial"} & mods == set()
