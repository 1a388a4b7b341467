"""``topoplan`` run in the test's own process, as the console script runs it.

``run_cli(*argv, cwd=..., env=...)`` calls ``planner.cli.main`` (what ``topoplan`` and
``python -m planner.cli`` call) with stdout and stderr captured, in ``cwd`` and with ``env`` set for the
call, and returns a ``subprocess.CompletedProcess`` (``returncode``, ``stdout``, ``stderr``) like the
subprocess it replaces: the same exit code and streams, without a Python start-up and the imports
(~1 CPU s) per call. Tests of the process itself (start-up imports, signals, a TTY, the installed
console script) keep a real subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from unittest import mock


def run_cli(*argv, cwd=None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """(exit code, stdout, stderr) of ``topoplan *argv`` in this process."""
    from planner.cli import main

    args = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(mock.patch.dict(os.environ, env or {}))   # restored after the call
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        rc = main(args)
    return subprocess.CompletedProcess(["topoplan", *args], rc, out.getvalue(), err.getvalue())
