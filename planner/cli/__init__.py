"""The ``topoplan`` command line: one typer app; each command group lives in a module of ``planner/cli``.

Failures leave through one exit path: ``TopoplanError`` (and pydantic / click usage errors) become
one line on stderr with exit code 2 (bad input) or 3 (infeasible); Ctrl-C is one line and exit code 130
(``solver.interrupt`` stops a running CP-SAT solve so that no half-searched plan is used); ``--debug``
re-raises with the traceback.

Start-up: a command's module (and the cost model, solver, numpy... it imports) loads only when that
command runs. ``COMMANDS`` names each command's module and its one-line help, so ``topoplan --help``
imports none of them (tests/test_cli_lazy.py keeps the lines equal to the commands' own help).
"""

from __future__ import annotations

import importlib
import sys

import typer
import typer.core
from pydantic import ValidationError

try:  # typer >= 0.20 vendors click as typer._click
    from typer._click import exceptions as _cx
    from typer._click.utils import make_default_short_help
except ImportError:  # pragma: no cover - older typer on real click
    from click import exceptions as _cx
    from click.utils import make_default_short_help

from planner.errors import TopoplanError, pydantic_message
from solver import interrupt

# Every command, in --help order (typer lists commands before groups): its module in planner/cli
# (whose ``register(app)`` adds it) and the first paragraph of its help.
COMMANDS: dict[str, tuple[str, str]] = {
    "predict": ("predict", "Predict throughput, step-time breakdown and memory of one parallel layout."),
    "validate": ("predict", "Predict every row of a CSV and compare with the measured model TFLOP/s per GPU."),
    "calibrate": ("predict", "Fit a stack profile to measured rows (least squares on log error, with bounds and "
                             "priors)."),
    "plan": ("plan", "Choose the parallel layout and its placement that maximise predicted throughput."),
    "scale": ("plan", "Plan each GPU count and show throughput, TFLOP/s per GPU and per-GPU retention, with goodput."),
    "compare": ("compare", "Price hardware options, each with its own optimal plan: tokens/s, goodput, days, $ and kWh "
                           "per million tokens, with the model's uncertainty band."),
    "emit": ("emit", "Write launch configs for one plan: Megatron-LM args, Megatron-Bridge overrides, TorchTitan "
                     "command, MaxText mesh overrides, and the Slurm hostfile that puts every group on its NVLink "
                     "domain."),
    "place": ("place", "Put a plan on the hosts the scheduler granted: each NVLink-domain slot of the plan on its "
                       "own granted domain, so every group the plan keeps in one domain stays in one."),
    "replan": ("replan", "Put a plan on what is left after hosts fail: spare hosts of the same rack take the failed "
                         "hosts' ranks (layout and rank order kept), or, where a rack has too few spares, a new plan."),
    "place-experts": ("experts", "Replicate and place experts on the EP group's GPUs: balanced GPUs and few NVLink "
                                 "domains per token."),
    "trial": ("trial", "Write launch files that run each of the plan's top layouts for a few iterations, with the "
                       "logging topoplan reads back, and one script that submits them all."),
    "trial-report": ("trial", "Predicted against measured throughput per trial (and the refitted prediction with "
                              "--profile)."),
    "topology": ("topology", "Clusters: built-in presets, cluster files, and imports of Slurm / NCCL / Kubernetes "
                             "topologies."),
    "models": ("models", "The built-in model catalog and any Hugging Face config.json."),
    "schema": ("schema", "JSON Schemas of the documents topoplan writes."),
}
_LOADED: dict[str, dict] = {}   # module -> {command name: click command}


def command_module(module: str):
    """``planner.cli.<module>``, imported on demand (importlib: the module is named in ``COMMANDS``)."""
    return importlib.import_module(f"planner.cli.{module}")


def _load(module: str) -> dict:
    """The click commands that ``planner.cli.<module>``'s ``register`` adds, built once per process."""
    if module not in _LOADED:
        sub = typer.Typer(rich_markup_mode=None, add_completion=False, pretty_exceptions_enable=False)
        sub.callback()(lambda: None)   # a group even when the module adds one command
        command_module(module).register(sub)
        _LOADED[module] = dict(typer.main.get_group(sub).commands)
    return _LOADED[module]


class _LazyGroup(typer.core.TyperGroup):
    """The root group: lists ``COMMANDS`` without importing them; loads a command's module when the
    command is looked up (to run it or print its own help)."""

    def list_commands(self, ctx) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *self.commands]))

    def get_command(self, ctx, cmd_name: str):
        cmd = self.commands.get(cmd_name)
        if cmd is None and cmd_name in COMMANDS:
            cmd = _load(COMMANDS[cmd_name][0]).get(cmd_name)
        return cmd

    def format_commands(self, ctx, formatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, make_default_short_help(COMMANDS[n][1], limit) if n in COMMANDS
                 else self.get_command(ctx, n).get_short_help_str(limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(
    cls=_LazyGroup,
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
    """Register every command on ``app`` now (tools that walk the whole command tree); the CLI itself
    loads each command when it runs. Once per process: commands must not pile up."""
    if _STATE.get("registered"):
        return
    for mod in dict.fromkeys(m for m, _ in COMMANDS.values()):
        command_module(mod).register(app)
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
