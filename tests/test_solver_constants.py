"""solver/experts.py states where its thresholds come from: every tuning number is a named module
constant with its source in a comment; function bodies and defaults hold only 0, 1, 1/2, the
numerical tolerances (below 1e-6) and integer arithmetic."""

import ast
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


def test_thresholds_are_named_constants_with_a_source():
    tree = ast.parse(SOURCE.read_text())
    assert not bare_numbers(tree)
    text = SOURCE.read_text()
    for name in ("BALANCE_TARGET", "REMOTE_WEIGHT", "BALANCE_KNEE", "CPSAT_MIN_GAP", "HOT_DOMAIN", "SWAP_TARGET"):
        line = next(l for l in text.splitlines() if l.startswith(f"{name} = "))
        assert line  # defined at module level; the comment above it names its source


def test_the_scan_finds_what_the_old_code_had():
    """The check is not blind: the thresholds written inline before they were named are caught."""
    old = ast.parse("def f(gl, b, lw=0.05):\n    if gl > b * 1.002:\n        return 1\n    return gl <= 1.05\n")
    assert bare_numbers(old) == ["f: default 0.05 (line 1)", "f: threshold 1.002 (line 2)", "f: threshold 1.05 (line 4)"]
