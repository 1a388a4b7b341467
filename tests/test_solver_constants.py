"""solver/experts.py states where its thresholds come from: every tuning number is a named module
constant with its source in a comment; function bodies and defaults hold only 0, 1, 1/2, the
numerical tolerances (below 1e-6) and integer arithmetic."""

import ast
import re
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "solver" / "experts.py"
PLAIN = {0.0, 0.5, 1.0, 2.0}


def bare_numbers(tree) -> list[str]:
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        defaults = fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None]
        for d in defaults:
            if isinstance(d, ast.Constant) and isinstance(d.value, float) and d.value not in (0.0, 1.0):
                found.append(f"{fn.name}: default {d.value!r} (line {d.lineno})")
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    for c in ast.walk(side):
                        if isinstance(c, ast.Constant) and isinstance(c.value, float) \
                                and c.value not in PLAIN and abs(c.value) >= 1e-6:
                            found.append(f"{fn.name}: threshold {c.value!r} (line {c.lineno})")
    return found


CONSTANT = re.compile(r"[A-Z][A-Z0-9_]* = ")


def undocumented_constants(text: str) -> list[str]:
    """Module-level numeric constants with no comment: none on their line, and none directly above the
    run of constant assignments they belong to (one comment may explain a few related constants)."""
    lines = text.splitlines()
    tree = ast.parse(text)
    missing = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.isupper()):
            continue
        if not any(isinstance(c, ast.Constant) and isinstance(c.value, (int, float)) and not isinstance(c.value, bool)
                   for c in ast.walk(node.value)):
            continue
        i = node.lineno - 1
        if "#" in lines[i]:
            continue
        j = i - 1
        while j >= 0 and CONSTANT.match(lines[j]) and "#" not in lines[j]:
            j -= 1
        if j < 0 or not lines[j].lstrip().startswith("#"):
            missing.append(node.targets[0].id)
    return missing


def test_thresholds_are_named_constants_with_a_source():
    text = SOURCE.read_text()
    assert not bare_numbers(ast.parse(text))
    names = set(re.findall(r"^([A-Z][A-Z0-9_]*) = ", text, re.M))
    assert {"BALANCE_TARGET", "REMOTE_WEIGHT", "BALANCE_KNEE", "CPSAT_MIN_GAP", "HOT_DOMAIN", "SWAP_TARGET"} <= names
    assert undocumented_constants(text) == []


def test_the_comment_check_is_not_blind():
    text = ("# the benchmark's acceptance line\nA = 1.05\nB = 0.15\n\nC = 2.0\nD = 3  # chosen\n"
            "def f():\n    pass\nE = 0.5\nNAME = 'x'\n")
    assert undocumented_constants(text) == ["C", "E"]


def test_the_scan_finds_what_the_old_code_had():
    """The check is not blind: the thresholds written inline before they were named are caught."""
    old = ast.parse("def f(gl, b, lw=0.05):\n    if gl > b * 1.002:\n        return 1\n    return gl <= 1.05\n")
    assert bare_numbers(old) == ["f: default 0.05 (line 1)", "f: threshold 1.002 (line 2)", "f: threshold 1.05 (line 4)"]
