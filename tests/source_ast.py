"""One parse per source text per test process: the source checks (layers, import cycles, function
lengths, class names, trainer names, the one Prediction type) each walk every module's syntax tree,
and parsing the tree ~300 times per check was most of their time. The trees are only read."""

from __future__ import annotations

import ast
import functools


@functools.lru_cache(maxsize=None)
def parse(source: str) -> ast.Module:
    return ast.parse(source)
