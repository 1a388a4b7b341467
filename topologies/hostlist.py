"""Slurm hostlist expressions: ``node[001-018,020],gpu-a[1-3]`` <-> a list of host names.

The grammar follows Slurm's ``hostlist`` (src/common/hostlist.c): comma-separated items at the top
level; each item is text with zero or more bracketed ranges, ``prefix[lo-hi,n,...]suffix``. A range
keeps the zero padding of its lower bound (``[001-018]`` -> ``001``..``018``). Several brackets in one
item expand as a cartesian product, left bracket outermost (``r[1-2]-t[1-2]`` -> ``r1-t1, r1-t2,
r2-t1, r2-t2``).

``compress`` is the inverse: it groups names that differ only in their last number, keeps the
order of first appearance, and writes runs of consecutive numbers with the same width as ``lo-hi``.
``expand(compress(names)) == names`` for any list of distinct names whose numbers are written the
way ``compress`` can reproduce (the property tests check it).
"""

from __future__ import annotations

import re

__all__ = ["HostlistError", "expand", "compress"]

MAX_HOSTS = 1_000_000


class HostlistError(ValueError):
    """A malformed hostlist expression; the message says where and what is wrong."""


def _split_top(expr: str) -> list[str]:
    """Split on commas outside brackets."""
    items, depth, cur = [], 0, []
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise HostlistError(f"nested '[' at position {i} in {expr!r}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"']' without '[' at position {i} in {expr!r}")
            depth = 0
        if ch == "," and not depth:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostlistError(f"unclosed '[' in {expr!r}")
    items.append("".join(cur))
    return items


def _expand_range(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise HostlistError(f"empty range in '[{body}]' in {expr!r}")
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise HostlistError(f"bad range {part!r} in {expr!r}; write numbers like [1-4,7]")
        lo_s, hi_s = m.group(1), m.group(2)
        if hi_s is None:
            out.append(lo_s)
            continue
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise HostlistError(f"range {part!r} runs backwards in {expr!r}")
        if hi - lo + 1 > MAX_HOSTS:
            raise HostlistError(f"range {part!r} in {expr!r} has more than {MAX_HOSTS} hosts")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        out.extend(str(v).zfill(width) for v in range(lo, hi + 1))
    return out


_SYNTAX = frozenset("[],")   # the characters that make an expression more than one plain name


def expand(expr: str | list[str] | tuple[str, ...]) -> list[str]:
    """All host names of a hostlist expression, in order. A list of expressions is expanded item
    by item. Raises ``HostlistError`` on malformed input (unbalanced brackets, bad ranges)."""
    if isinstance(expr, (list, tuple)):
        out: list[str] = []
        for e in expr:
            out.extend(expand(str(e)))
        return out
    expr = str(expr).strip()
    if not expr:
        return []
    if any(c.isspace() for c in expr):
        raise HostlistError(f"whitespace inside hostlist {expr!r}; separate hosts with ','")
    if not _SYNTAX.intersection(expr):   # one plain name (every host of a cluster file): itself
        return [expr]
    return _expand_items(expr)


def _expand_items(expr: str) -> list[str]:
    """``expand`` of a stripped expression without whitespace: its comma-separated items, each with
    its bracketed ranges multiplied out."""
    names: list[str] = []
    for item in _split_top(expr):
        if not item:
            raise HostlistError(f"empty host name in {expr!r} (doubled or trailing ',')")
        pieces = re.split(r"\[([^\]]*)\]", item)
        # pieces: text, range, text, range, ..., text
        combos = [""]
        for k, piece in enumerate(pieces):
            if k % 2 == 0:
                combos = [c + piece for c in combos]
            else:
                vals = _expand_range(piece, expr)
                combos = [c + v for c in combos for v in vals]
                if len(combos) > MAX_HOSTS:
                    raise HostlistError(f"{expr!r} expands to more than {MAX_HOSTS} hosts")
        names.extend(combos)
    return names


_TAIL = re.compile(r"^(.*?)(\d+)(\D*)$")


def _fmt_run(lo: int, hi: int, width: int) -> str:
    a = str(lo).zfill(width)
    return a if lo == hi else f"{a}-{str(hi).zfill(width)}"


def compress(names: list[str] | tuple[str, ...]) -> str:
    """A compact hostlist expression for ``names`` that expands back to the same list, in order.

    Consecutive names ``prefix<number>suffix`` with the same prefix, suffix and number width and
    increasing numbers share one bracket: ``["n01", "n02", "n03", "n07"]`` -> ``n[01-03,07]``
    (unless writing the names out is shorter: ``x0,x1``).
    """
    parts: list[str] = []
    i = 0
    names = list(names)
    while i < len(names):
        m = _TAIL.match(names[i])
        if not m:
            parts.append(names[i])
            i += 1
            continue
        prefix, num, suffix = m.group(1), m.group(2), m.group(3)
        width = len(num) if num.startswith("0") and len(num) > 1 else 0
        nums = [int(num)]
        j = i + 1
        while j < len(names):
            m2 = _TAIL.match(names[j])
            if not m2 or m2.group(1) != prefix or m2.group(3) != suffix:
                break
            n2 = m2.group(2)
            w2 = len(n2) if n2.startswith("0") and len(n2) > 1 else 0
            # same rendering width, strictly increasing (so the expansion keeps the order)
            if int(n2) <= nums[-1] or str(int(n2)).zfill(width) != n2 or (width == 0 and w2 != 0):
                break
            nums.append(int(n2))
            j += 1
        if len(nums) == 1:
            parts.append(names[i])
        else:
            runs, lo, prev = [], nums[0], nums[0]
            for v in nums[1:]:
                if v == prev + 1:
                    prev = v
                    continue
                runs.append(_fmt_run(lo, prev, width))
                lo = prev = v
            runs.append(_fmt_run(lo, prev, width))
            bracket = f"{prefix}[{','.join(runs)}]{suffix}"
            plain = ",".join(names[i:j])
            parts.append(bracket if len(bracket) <= len(plain) else plain)
        i = j
    return ",".join(parts)
