"""Each class name means one thing: no two classes in planner/, solver/ or topologies/ share a name
(two ``Placement`` classes, ranks on GPUs and experts on slots, were confused in review)."""

import ast
from collections import defaultdict
from pathlib import Path
from source_ast import parse

ROOT = Path(__file__).resolve().parents[1]


def class_names() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for pkg in ("planner", "solver", "topologies"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    where[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return where


def test_no_two_public_classes_share_a_name():
    where = class_names()
    assert len(where) > 30  # the scan found the code
    dup = {name: places for name, places in where.items() if len(places) > 1}
    assert not dup, dup
