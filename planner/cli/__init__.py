"""The ``topoplan`` command line: one typer app; each command group lives in a module of ``planner/cli``.

Failures leave through one exit path: ``TopoplanError`` (and pydantic / click usage errors) become
one line on stderr with exit code 2 (bad input) or 3 (infeasible); Ctrl-C is one line and exit code 130
(``solver.interrupt`` stops a running CP-SAT solve so that no half-searched plan is used); ``--debug``
re-raises with the traceback.
"""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError

try:  # typer >= 0.20 vendors click as typer._click
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover - older typer on real click
    from click import exceptions as _cx

from planner.cli import compare, emit, experts, models, place, plan, predict, replan, schema, topology
from planner.errors import TopoplanError, pydantic_message
from solver import interrupt

app = typer.Typer(
    name="topoplan",
    help="Topology-aware parallelism planner for large-model training.\n\n"
    "Example: topoplan plan --model deepseek-v3 --cluster gb300-nvl72 --gpus 256 --precision mxfp8 --gbs 4096",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: rich's option table truncates long option names at 80 columns
    rich_markup_mode=None,
)

_STATE = {"debug": False}


def debug_enabled() -> bool:
    return _STATE["debug"]


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="show tracebacks instead of one-line errors")):
    """Topology-aware parallelism planner for large-model training."""
    _STATE["debug"] = debug


def _register() -> None:
    # Each module adds its commands to ``app``; the import order is the order in --help.
    # Once per process: main() may run many times in-process (tests), commands must not pile up.
    if _STATE.get("registered"):
        return
    for mod in (topology, models, predict, plan, compare, emit, place, replan, experts, schema,
                __import__("planner.cli.trial").cli.trial):
        mod.register(app)
    _STATE["registered"] = True


def _echo_err(line: str) -> None:
    print(line, file=sys.stderr)


INTERRUPTED = 130   # the shell's exit status for SIGINT (128 + 2)


def _interrupted() -> int:
    _echo_err("error: interrupted (Ctrl-C); nothing more was written")
    return INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Returns the process exit code (``run`` exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _STATE["debug"] = "--debug" in argv
    _register()
    interrupt.install()   # Ctrl-C stops a CP-SAT solve and raises KeyboardInterrupt (no half-searched plan)
    try:
        rc = app(args=argv, prog_name="topoplan", standalone_mode=False)
        if rc == INTERRUPTED:   # typer returns Exit's code: 130 is its KeyboardInterrupt (no command exits so)
            return _interrupted()
        return rc if isinstance(rc, int) else 0
    except KeyboardInterrupt:   # typer's main turns it into Exit(130); kept for a Ctrl-C outside it
        return _interrupted()
    except TopoplanError as exc:
        if _STATE["debug"]:
            raise
        _echo_err(f"error: {exc}")
        return exc.exit_code
    except (typer.Exit,) as exc:
        return exc.exit_code
    except typer.Abort:
        _echo_err("error: aborted")
        return 1
    except _cx.NoArgsIsHelpError as exc:  # a group without its subcommand (topoplan, topoplan models): its help
        print(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
        return 0
    except _cx.UsageError as exc:
        if _STATE["debug"]:
            raise
        path = exc.ctx.command_path if getattr(exc, "ctx", None) else "topoplan"
        _echo_err(f"error: {exc.format_message()} (see '{path} --help')")
        return 2
    except _cx.ClickException as exc:
        if _STATE["debug"]:
            raise
        _echo_err(f"error: {exc.format_message()}")
        return exc.exit_code or 2
    except UnicodeDecodeError as exc:   # a reader without its own check: still one line, exit 2
        if _STATE["debug"]:
            raise
        _echo_err(f"error: an input file is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8 "
                  "(rerun with --debug to see which reader)")
        return 2
    except Exception as exc:  # noqa: BLE001 - last resort: one line, never a traceback without --debug
        if _STATE["debug"]:
            raise
        if isinstance(exc, ValidationError):
            _echo_err(f"error: {pydantic_message(exc)}")
            return 2
        _echo_err(f"error: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)")
        return 1


def run() -> None:  # pragma: no cover - thin wrapper
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
