"""Ctrl-C during a CP-SAT solve: stop the search at once and let Python raise KeyboardInterrupt.

By default CP-SAT catches SIGINT itself while it solves (``catch_sigint_signal``): the search stops and
``Solve`` returns its best solution so far as if the time limit had been hit, and Python never sees the
signal, so a caller would go on to report (and write) a half-searched answer as the plan. With
:func:`install` (the command line calls it once, on the main thread) SIGINT stays Python's:
``signal.set_wakeup_fd`` hands the signal number to a watcher thread, which stops every solve running
under :func:`stoppable` (``CpSolver.stop_search`` is safe from another thread); when ``Solve`` returns,
Python's own handler raises KeyboardInterrupt in the main thread, before any result is used. Without
``install`` (library use) a solver keeps CP-SAT's default.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = ["install", "installed", "stoppable"]

_LOCK = threading.Lock()
_ACTIVE: set = set()
_STATE = {"installed": False, "interrupted": False}


def installed() -> bool:
    return _STATE["installed"]


def _stop_all() -> None:
    with _LOCK:
        solvers = list(_ACTIVE)
    for s in solvers:
        s.stop_search()


def _watch(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            _stop_all()


def _on_sigint(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    with _LOCK:
        busy = bool(_ACTIVE)
    if not busy:
        raise KeyboardInterrupt
    _STATE["interrupted"] = True   # raised by stoppable() once Solve has returned
    _stop_all()


def install() -> None:
    """Route SIGINT to the running solves (idempotent; main thread only, else a no-op)."""
    if _STATE["installed"] or threading.current_thread() is not threading.main_thread():
        return
    _STATE["installed"] = True   # from now on CP-SAT leaves SIGINT alone (it would catch even an ignored one)
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        return   # SIGINT ignored (nohup, a background job of a script) or not Python's: leave it so
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.signal(signal.SIGINT, _on_sigint)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(r,), name="topoplan-sigint", daemon=True).start()


@contextlib.contextmanager
def stoppable(solver) -> Iterator[None]:
    """Run ``solver.Solve`` inside this block: with :func:`install`, SIGINT stops it and Python raises
    KeyboardInterrupt after it returns (CP-SAT's own SIGINT catching is switched off)."""
    if not _STATE["installed"]:
        yield
        return
    solver.parameters.catch_sigint_signal = False
    with _LOCK:
        _ACTIVE.add(solver)
    if os.environ.get("TOPOPLAN_SOLVER_DEBUG"):   # the mark tests/test_interrupt.py waits for
        print("cp-sat solve started", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE.discard(solver)
    if _STATE["interrupted"]:
        _STATE["interrupted"] = False
        raise KeyboardInterrupt
