"""The layer contract of docs/architecture.md, read from the source (every import, at module level or
inside a function): data flows topologies -> planner.model -> planner.cost -> planner.calibration ->
planner.search -> planner.output -> planner.launch -> planner.cli, and ``solver`` takes plain arrays from anyone
and imports none of them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from source_ast import parse

ROOT = Path(__file__).resolve().parents[1]

# Each layer, in the order data flows, and what it may import of the project's own packages. The
# planner's shared vocabulary (config values, trainer rules, errors, atomic writes) sits under model.
BASE = ("planner.config", "planner.rules", "planner.errors", "planner.io")
# A trainer package (planner/trainers/<name>/) spans layers, module by module: its registry entry, rules
# and families are vocabulary, its log parser is cost (calibration reads it), its emitters and read-back
# are output. The Trainer object loads the heavier parts by name on first use (planner/trainers/base.py).
TRAINERS = "planner.trainers"
TRAINER_PARTS = {"recipe": "planner.base", "rules": "planner.base", "families": "planner.base", "logs": "planner.cost",
                 "emit": "planner.output", "bridge": "planner.output", "readback": "planner.output"}
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("solver", ("solver",)),
    ("topologies", ("topologies",)),
    ("planner.base", ("topologies",) + BASE),
    ("planner.model", ("topologies", "planner.model") + BASE),
    ("planner.cost", ("topologies", "planner.model", "planner.cost") + BASE),
    ("planner.calibration", ("topologies", "planner.model", "planner.cost", "planner.calibration") + BASE),
    ("planner.search", ("topologies", "solver", "planner.model", "planner.cost", "planner.calibration",
                        "planner.search") + BASE),
    ("planner.output", ("topologies", "solver", "planner.model", "planner.cost", "planner.calibration",
                        "planner.search", "planner.output") + BASE),
    ("planner.launch", ("topologies", "solver", "planner.model", "planner.cost", "planner.calibration",
                        "planner.search", "planner.output", "planner.launch") + BASE),
    ("planner.cli", ("topologies", "solver", "planner")),
]
OWN = ("planner", "solver", "topologies")


def layer_of(module: str) -> str | None:
    if module in BASE:
        return "planner.base"
    if module == TRAINERS or module.startswith(TRAINERS + "."):
        return TRAINER_PARTS.get(module.rsplit(".", 1)[-1], "planner.base")
    if module == "planner":
        return "planner.cli"  # the package root binds the public API (plan, predict): the top layer
    for name, _ in LAYERS:
        if module == name or module.startswith(name + "."):
            return name
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` names, relative imports resolved against ``module``."""
    base = node.module or ""
    if node.level:
        pkg = module.split(".") if is_package else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    return base


def is_module(name: str) -> bool:
    """``name`` is a module or package of the project's source tree."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _parse(source: str) -> ast.Module:
    """The syntax tree of a source (parsed once per process: tests/source_ast.py)."""
    return parse(source)


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every project module ``source`` imports (absolute or relative), with its line."""
    out = []
    for node in ast.walk(_parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = from_base(node, module, is_package)
            if base in OWN:  # ``from planner import x``: x is a submodule or the package's API
                out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
            else:   # ``from pkg import sub`` imports the module pkg.sub (a trainer package's emit, say)
                subs = [f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}")]
                out += [(node.lineno, m) for m in [base] + subs]
    return [(line, m) for line, m in out if m.split(".")[0] in OWN]


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    layer = layer_of(module)
    allowed = dict(LAYERS)[layer]
    bad = []
    for line, imported in imports_of(source, module, is_package):
        if imported in OWN and layer == "planner.cli":
            continue
        ok = any(imported == a or imported.startswith(a + ".") for a in allowed)
        if layer != "planner.cli" and (imported == TRAINERS or imported.startswith(TRAINERS + ".")):
            ok = layer_of(imported) in {layer_of(a) for a in allowed}
        if imported in ("planner",) and layer != "planner.cli":
            ok = False
        if not ok:
            bad.append(f"{module}:{line} imports {imported} ({layer} may import {', '.join(allowed)})")
    return bad


def project_modules():
    for pkg in OWN:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path


def test_every_module_belongs_to_a_layer():
    assert [module_name(p) for p in project_modules() if layer_of(module_name(p)) is None] == []


def test_no_import_runs_against_the_data_flow():
    bad = []
    for path in project_modules():
        bad += violations(path.read_text(), module_name(path), path.name == "__init__.py")
    assert bad == []


@pytest.mark.parametrize("module, source", [
    ("solver.layout", "from planner.cost.predict import predict"),
    ("solver.experts", "def f():\n    import planner.search.experts\n"),
    ("topologies.cluster", "from planner.errors import InputError"),
    ("planner.model.spec", "from planner.cost import memory"),
    ("planner.cost.predict", "from planner.search.plan import plan"),
    ("planner.cost.predict", "from planner import search"),
    ("planner.search.plan", "from planner.output.explain import render_plan"),
    ("planner.output.explain", "from planner.cli import progress"),
    ("planner.cost.memory", "import planner"),
    ("planner.config", "from planner.model.spec import ModelSpec"),
    ("planner.cost.steptime", "from ..search import plan"),
    ("planner.cost.memory", "from planner.trainers.megatron.emit import megatron_args"),
    ("planner.trainers.megatron.rules", "from planner.trainers.megatron.logs import parse"),
    ("planner.trainers.torchtitan.logs", "from planner.output.emit import EmitContext"),
    ("planner.trainers", "from planner.trainers.maxtext import emit"),
])
def test_the_checker_catches_a_wrong_way_import(module, source):
    """Mutants: one import against the flow in each layer, the checker names it."""
    assert violations(source, module)


def test_the_checker_accepts_the_flow():
    assert violations("from planner.cost.predict import predict\nimport numpy", "planner.search.plan") == []
    assert violations("from topologies.errors import InputError", "planner.model.spec") == []
    assert violations("from planner.trainers.megatron.rules import RULES", "planner.cost.memory") == []
    assert violations("from planner.output.emit import EmitContext", "planner.trainers.maxtext.emit") == []
    assert violations("from planner.trainers.logs import gpu_key", "planner.trainers.torchtitan.logs") == []


def test_importing_the_hardware_layer_loads_no_solver():
    code = ("import sys, topologies.cluster, topologies.loader, topologies.collectives\n"
            "bad = [m for m in ('ortools', 'planner', 'solver') if m in sys.modules]\n"
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# Imports inside functions hide dependency cycles, so every import in these packages sits at module
# level, except the ones below: (module, imported name) -> why it must stay lazy. A name is the
# absolute module for ``import x`` and ``module.name`` for ``from module import name``.
LAZY_IMPORTS = {
    ("planner.cli.predict", "planner.calibration.calibrate.calibrate_rows"):
        "calibrate loads scipy.optimize (~0.3 s), which only `topoplan calibrate` needs",
    ("planner.calibration.memfit", "scipy.optimize.lsq_linear"):
        "scipy.optimize (~0.3 s), for the memory fit of `topoplan calibrate` only",
    ("topologies.calibrate", "scipy.optimize.least_squares"):
        "scipy.optimize (~0.3 s), for `topoplan topology calibrate` only; the hardware layer stays light",
    ("solver.experts", "ortools.sat.python.cp_model"):
        "OR-Tools, for the CP-SAT expert packer only",
    ("planner", "planner.config"): "the public API binds on first use: the CLI starts without it",
    ("planner", "planner.model.spec"): "the public API binds on first use: the CLI starts without it",
    ("planner", "planner.cost.predict"): "the public API binds on first use: the CLI starts without it",
    ("planner", "planner.cost.prediction"): "the public API binds on first use: the CLI starts without it",
    ("planner", "planner.search.plan"): "the public API binds on first use: the CLI starts without it",
    ("planner", "planner.launch.place"): "the public API binds on first use: the CLI starts without it",
    ("planner", "planner.launch.replan"): "the public API binds on first use: the CLI starts without it",
    ("topologies", "topologies.loader"):
        "the cluster schema (pydantic, yaml) loads on first use: importing topologies.errors stays light",
    ("solver.layout", "solver.cpsat"):
        "OR-Tools (~0.4 s, it loads pandas), for plan --method cp-sat-full only",
    ("solver.layout", "solver.bounded_cpsat"):
        "OR-Tools (~0.4 s, it loads pandas), for plan --method cp-sat only",
    ("solver.experts", "scipy.optimize.linear_sum_assignment"):
        "scipy.optimize (~0.3 s), for aligning expert placements across layers only",
    ("planner.output.report", "planner.output.report.pages"):
        "the pages draw their figures with matplotlib (~0.3 s), for --report only",
    ("planner.output.report", "planner.output.report.compare.compare_page"):
        "the compare page draws its plot with matplotlib (~0.3 s), for compare --html only",
}


def function_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Every import inside a function body of ``source``, as (line, absolute imported name): one walk
    of the tree that knows whether it is inside a function."""
    out = set()
    stack = [(_parse(source), False)]
    while stack:
        node, inside = stack.pop()
        if inside and isinstance(node, ast.Import):
            out |= {(node.lineno, a.name) for a in node.names}
        elif inside and isinstance(node, ast.ImportFrom):
            base = from_base(node, module, is_package)
            out |= {(node.lineno, f"{base}.{a.name}") for a in node.names}
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        stack += [(child, inside) for child in ast.iter_child_nodes(node)]
    return sorted(out)


def lazy_import_violations(source: str, module: str, is_package: bool = False, found=None) -> list[str]:
    """``found``: function_imports of the source, when the caller has them already."""
    found = function_imports(source, module, is_package) if found is None else found
    return [f"{module}:{line} imports {name} inside a function; move it to module level or add "
            f"({module!r}, {name!r}) with its reason to LAZY_IMPORTS"
            for line, name in found if (module, name) not in LAZY_IMPORTS]


def test_imports_sit_at_module_level():
    bad, used = [], set()
    for path in project_modules():
        module, source = module_name(path), path.read_text()
        found = function_imports(source, module, path.name == "__init__.py")
        bad += lazy_import_violations(source, module, found=found)
        used |= {(module, name) for _, name in found}
    assert bad == []
    assert set(LAZY_IMPORTS) - used == set(), "allowlisted lazy imports that no longer exist"


@pytest.mark.parametrize("module, source", [
    ("planner.cost.memory", "def f():\n    import json\n    return json\n"),
    ("planner.search.plan", "class P:\n    def m(self):\n        from planner.cost.predict import predict\n"),
    ("planner.output.emit.slurm", "def f():\n    if True:\n        from .megatron import megatron_env\n"),
    ("solver.experts", "def f():\n    from ortools.sat.python import cp_model as m\n    def g():\n"
                       "        from scipy.optimize import linprog\n"),
])
def test_the_checker_catches_an_import_inside_a_function(module, source):
    """Mutants: an in-function import not on the list (a method's, a nested block's, a relative one,
    a nested function's next to an allowed one) is named."""
    assert lazy_import_violations(source, module)


def test_the_checker_accepts_module_level_and_listed_imports():
    assert lazy_import_violations("import json\nfrom planner.cost.predict import predict\n"
                                  "def f():\n    return json\n", "planner.search.plan") == []
    assert lazy_import_violations("def f():\n    from ortools.sat.python import cp_model\n",
                                  "solver.experts") == []
    assert lazy_import_violations("def write_report():\n    from . import pages\n",
                                  "planner.output.report", is_package=True) == []


def test_the_cli_loads_no_lazy_dependency():
    """The lazy imports stay lazy: starting the CLI loads neither matplotlib, scipy nor OR-Tools."""
    code = ("import sys, planner.cli\n"
            "bad = [m for m in ('matplotlib', 'scipy', 'torch', 'megatron', 'torchtitan', 'ortools', 'pandas')"
            " if m in sys.modules]\n"
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
