"""No function in planner/, solver/ or topologies/ is over 100 lines (issue 22 item 7).

A function's length is its source span, ``def`` line to last line, as ``ast`` reports it (docstring,
comments and nested functions included: what a reader scrolls through). Functions that were already
longer when the rule came in are listed in ``OVER`` with their length then: each may only shrink, and
the entry must go once the function is split (the test says so), so the list can only get shorter.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
from source_ast import parse

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "solver", "topologies")
LIMIT = 100

# (file, qualified name) -> its length in lines when the rule came in; to be split, never to grow.
# They sit in code other branches were changing when the rule came in (issue 22):
# the solver and search (speed), the CLI commands.
OVER = {
}


def function_lengths(source: str) -> dict[str, int]:
    """Qualified name (``outer.inner``, ``Class.method``) -> lines from ``def`` to its last line."""
    return dict(_function_lengths(source))


# the nodes a def or class can sit in or under: statements, ``except`` handlers, ``case`` blocks
_HOLDS_DEFS = (ast.stmt, ast.excepthandler, ast.match_case)


@functools.lru_cache(maxsize=None)   # both tests walk every module: once per source text per process
def _function_lengths(source: str) -> tuple[tuple[str, int], ...]:
    out: dict[str, int] = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _HOLDS_DEFS):
                continue   # an expression: a def or class is a statement, never inside one
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(parse(source), "")
    return tuple(out.items())


def long_functions() -> dict[tuple[str, str], int]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, n in function_lengths(path.read_text()).items():
                if n > LIMIT:
                    found[(rel, name)] = n
    return found


def test_no_new_function_over_100_lines():
    new = {k: n for k, n in long_functions().items() if k not in OVER}
    assert not new, f"functions over {LIMIT} lines (split them into named steps): {new}"


def test_the_long_ones_only_shrink_and_leave_the_list_when_split():
    found = long_functions()
    grew = {k: (OVER[k], n) for k, n in found.items() if k in OVER and n > OVER[k]}
    assert not grew, f"grew (listed length, now): {grew}"
    split = [k for k in OVER if k not in found]
    assert not split, f"now at most {LIMIT} lines: remove from OVER in tests/test_function_length.py: {split}"


def _def(name: str, body: int, indent: str = "") -> str:
    return f"{indent}def {name}():\n" + "".join(f"{indent}    x = {i}\n" for i in range(body))


@pytest.mark.parametrize("source,expected", [
    (_def("f", 99), {}),                                                  # 100 lines: allowed
    (_def("f", 100), {"f": 101}),                                         # 101 lines: refused
    ("class C:\n" + _def("m", 150, "    "), {"C.m": 151}),                  # methods by class
    ("def outer():\n" + _def("inner", 120, "    "), {"outer": 122, "outer.inner": 121}),   # nested: both
])
def test_the_count_is_def_to_last_line(source, expected):
    assert {k: n for k, n in function_lengths(source).items() if n > LIMIT} == expected
