"""A progress bar for work that takes more than a second or two, shown only to a person.

The bar appears only when stdout is a terminal and the caller is not printing JSON; on a pipe, in a
file, under ``--json`` or when ``TOPOPLAN_NO_PROGRESS`` is set it prints nothing at all, so
machine-readable output stays clean. It draws on stderr, so even on a terminal the stdout stream
carries only results; when stderr itself goes to a file or pipe (a log), rich writes no escape
codes there either.

Usage (a scale sweep, calibration, placement over many layers)::

    from planner.cli.progress import progress

    with progress("planning sizes", total=len(sizes), json_output=json_flag) as bar:
        for n in sizes:
            results.append(plan_one(n))
            bar.advance()          # or bar.advance(k), bar.update(description="...")

    for layer in track(layers, "placing experts", json_output=json_flag):
        ...

``progress`` yields an object with ``advance(n=1)`` and ``update(description=None, completed=None)``
in both modes, so callers never branch on whether a bar is shown.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

T = TypeVar("T")


def enabled(json_output: bool = False, stream=None) -> bool:
    """True when a bar should be drawn: stdout is a TTY, no ``--json``, not disabled by env."""
    if json_output or os.environ.get("TOPOPLAN_NO_PROGRESS"):
        return False
    out = sys.stdout if stream is None else stream
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class _Silent:
    """The no-op handle used when no bar is shown; counts so callers and tests can check calls."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.completed = 0
        self.description = ""

    def advance(self, n: int = 1) -> None:
        self.completed += n

    def update(self, description: str | None = None, completed: int | None = None) -> None:
        if description is not None:
            self.description = description
        if completed is not None:
            self.completed = completed


class _Bar(_Silent):
    def __init__(self, prog, task, total):
        super().__init__(total)
        self._prog, self._task = prog, task

    def advance(self, n: int = 1) -> None:
        super().advance(n)
        self._prog.advance(self._task, n)

    def update(self, description: str | None = None, completed: int | None = None) -> None:
        super().update(description, completed)
        kwargs = {}
        if description is not None:
            kwargs["description"] = description
        if completed is not None:
            kwargs["completed"] = completed
        self._prog.update(self._task, **kwargs)


@contextlib.contextmanager
def progress(description: str, total: int | None = None, json_output: bool = False,
             stream=None) -> Iterator[_Silent]:
    """Context manager yielding a handle with ``advance``/``update``; draws only on a terminal.

    ``stream`` is the stream whose TTY-ness decides (stdout by default); the bar itself is drawn on
    stderr and removed when the block ends."""
    if not enabled(json_output, stream):
        yield _Silent(total)
        return
    prog = Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with prog:
        task = prog.add_task(description, total=total)
        yield _Bar(prog, task, total)


def track(items: Iterable[T], description: str, total: int | None = None, json_output: bool = False,
          stream=None) -> Iterator[T]:
    """Iterate over ``items`` with a bar (on a terminal only); ``total`` defaults to ``len(items)``."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with progress(description, total=total, json_output=json_output, stream=stream) as bar:
        for item in items:
            yield item
            bar.advance()
