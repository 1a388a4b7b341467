"""``planner/`` (and ``solver/``, ``topologies/``) has no import cycle, inside a layer either.

The graph is read from the source, not from ``sys.modules``: a node per module, an edge from a module
to every project module it imports, at module level or inside a function (a lazy import hides a cycle
from Python, not from this test), ``from package import name`` resolved to the submodule ``name`` when
there is one. networkx finds the cycles; the mutants show that a cycle through two modules, three, or a
lazy import inside a function would be named.
"""

from __future__ import annotations

import ast
import functools

import networkx as nx
import pytest
from test_layers import OWN, from_base, module_name, project_modules
from source_ast import parse


def resolve(name: str, modules: set[str]) -> str | None:
    """The project module an imported name lands in: the longest dotted prefix that is a module."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


@functools.lru_cache(maxsize=None)   # every test builds the graph of the same sources: one walk per text per process
def imported_names(source: str, module: str, is_package: bool) -> tuple[str, ...]:
    """Every dotted name ``source`` imports, anywhere in it; ``from x import y`` gives ``x.y`` (a
    submodule, or a name that ``resolve`` takes back to ``x``)."""
    out = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = from_base(node, module, is_package)
            out += [f"{base}.{a.name}" for a in node.names]
    return tuple(n for n in out if n.split(".")[0] in OWN)


def import_graph(sources: dict[str, tuple[str, bool]]) -> nx.DiGraph:
    """module -> imported module, for ``sources``: {module: (source text, is a package)}."""
    graph = nx.DiGraph()
    modules = set(sources)
    graph.add_nodes_from(modules)
    for module, (text, is_package) in sources.items():
        for name in imported_names(text, module, is_package):
            target = resolve(name, modules)
            if target is not None and target != module:
                graph.add_edge(module, target)
    return graph


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.simple_cycles(graph))


def project_sources() -> dict[str, tuple[str, bool]]:
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in project_modules()}


def test_the_project_has_no_import_cycle():
    graph = import_graph(project_sources())
    assert graph.number_of_edges() > 300           # the graph was read (about 420 edges today)
    assert graph.has_edge("planner.calibration.calibrate", "planner.calibration.validate")
    assert graph.has_edge("planner.calibration.runs", "planner.calibration.priors")
    assert nx.is_directed_acyclic_graph(graph), cycles(graph)


def test_the_priors_do_not_close_the_old_cycle():
    """calibrate -> validate -> runs -> calibrate.base_profile was the cycle: the start of a fit now
    lives in ``planner.calibration.priors``, which imports none of them."""
    graph = import_graph(project_sources())
    assert not nx.has_path(graph, "planner.calibration.runs", "planner.calibration.calibrate")
    assert not nx.has_path(graph, "planner.calibration.priors", "planner.calibration.validate")


@pytest.mark.parametrize("module, source, cycle", [
    # the old cycle, put back lazily: runs reads base_profile from calibrate inside a function
    ("planner.calibration.runs", "def f():\n    from planner.calibration.calibrate import base_profile\n",
     ["planner.calibration.calibrate", "planner.calibration.runs", "planner.calibration.validate"]),
    # two modules of one layer importing each other (relative import)
    ("planner.cost.profiles", "from .predict import predict\n", ["planner.cost.predict", "planner.cost.profiles"]),
    # a package importing a submodule that imports it back by ``from package import name``
    ("planner.calibration.priors", "from planner.calibration import calibrate\n",
     ["planner.calibration.calibrate", "planner.calibration.priors"]),
])
def test_a_cycle_is_named(module, source, cycle):
    """Mutants: add one import to the real source and the test names the cycle it closes."""
    sources = project_sources()
    text, is_package = sources[module]
    sources[module] = (text + "\n" + source, is_package)
    graph = import_graph(sources)
    assert not nx.is_directed_acyclic_graph(graph)
    assert cycle in cycles(graph)
