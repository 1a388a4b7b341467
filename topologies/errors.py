"""The two ways topoplan refuses a request, and the exit codes the CLI maps them to.

Every user-facing failure is one of these, raised with a one-line message that names the file,
field or option at fault and says what would fix it. The CLI prints ``error: <message>`` and exits
with ``exit_code``; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations


class TopoplanError(Exception):
    """Base class: a refusal with a one-line message and an exit code."""

    exit_code = 2


class InputError(TopoplanError):
    """Bad input: an option value, a file, a field. Exit code 2."""

    exit_code = 2


def not_utf8(path, exc: UnicodeDecodeError, what: str) -> InputError:
    """The refusal of a file that is not UTF-8 text: where the first bad byte is, and the fix."""
    byte = exc.object[exc.start:exc.start + 1].hex() if isinstance(exc.object, (bytes, bytearray)) else "?"
    return InputError(f"{path}: not UTF-8 text (byte 0x{byte} at offset {exc.start}); save the {what} as UTF-8")


class InfeasibleError(TopoplanError):
    """A well-formed request that nothing can satisfy (nothing fits in memory, no layout obeys the
    rules). Exit code 3. The message says the smallest shortfall and what would make it fit."""

    exit_code = 3


def pydantic_message(exc, source: str | None = None) -> str:
    """One line from a pydantic ``ValidationError``: the first failing field path and its message."""
    errors = exc.errors()
    if not errors:
        return f"{source or 'input'}: {exc}"
    first = errors[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    msg = first.get("msg", "invalid value")
    if msg.startswith("Value error, "):   # a validator's own message: it names its fields
        msg = msg[len("Value error, "):]
    prefix = f"{source}: " if source else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{prefix}field '{loc}': {msg}{more}" if loc else f"{prefix}{msg}{more}"
