"""Atomic writes: a file or a whole output directory appears complete or not at all.

Files are created with the permissions a plain ``open(path, "w")`` would give them (0666 minus the
process umask: 0644 under the usual umask 022), not the 0600 of a temporary file, so plan.json,
launch files and cluster files are readable by the team.

A path that cannot be written is bad input (exit 2): ``check_output`` tests it before any work is
done and names the option; the writers themselves turn an ``OSError`` into the same one-line
``InputError`` (``option`` names the option when the caller passes it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import yaml

from planner.errors import InputError

# libyaml's safe loader where PyYAML was built with it (several times faster on the shipped tables)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(text: str):
    """``yaml.safe_load(text)``, with libyaml's parser when PyYAML has it (the same documents)."""
    return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (/proc/self/status)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)   # elsewhere: the classic set-and-restore
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Permissions of a newly written file: 0666 & ~umask."""
    return 0o666 & ~current_umask()


def _cannot(path, exc: OSError, option: str | None) -> InputError:
    reason = exc.strerror or type(exc).__name__
    where = f"{option} {path}" if option else str(path)
    return InputError(f"{where}: cannot write there ({reason}); give a path in a writable directory")


def check_output(path: str | os.PathLike, option: str, *, directory: bool = False) -> Path:
    """Refuse, before any work, an output path that cannot be written: an existing entry of the wrong
    kind, a parent that is a file, or a directory where no file can be created (read-only, /proc).
    Nothing is left behind. Returns the path."""
    p = Path(path)
    if p.exists():
        if directory and not p.is_dir():
            raise InputError(f"{option} {p}: exists and is not a directory; give a directory path")
        if not directory and p.is_dir():
            raise InputError(f"{option} {p}: is a directory; give a file path")
    # atomic writes stage next to the target, so the nearest existing ancestor of the parent must
    # be a directory that accepts a new file
    anc = p.absolute().parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise InputError(f"{option} {p}: {anc} is not a directory; give a path whose parent is a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".topoplan-probe.", dir=anc)
    except OSError as exc:
        raise _cannot(p, exc, option) from None
    os.close(fd)
    os.unlink(probe)
    return p


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, option: str | None = None) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise _cannot(path, exc, option) from None
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _cannot(path, exc, option) from None
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str, *, option: str | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory and a rename."""
    return atomic_write_bytes(path, text.encode("utf-8"), option=option)


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike, *, option: str | None = None, replace: bool = False):
    """Yield a staging directory; on success its entries are moved into ``out``, on any error
    nothing in ``out`` changes.

    Entries already in ``out`` with the same names are replaced; other entries are kept, unless
    ``replace``: then ``out`` becomes the staging directory whole (two renames), its old entries gone.
    ``out`` (when it is created) and the entries get the usual umask permissions, not the staging
    directory's 0700.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{option + ' ' if option else ''}{out}: exists and is not a directory; give a directory path")
    try:
        parent = out.resolve().parent
        parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging.", dir=parent))
    except OSError as exc:
        raise _cannot(out, exc, option) from None
    try:
        yield stage
        if replace and out.is_dir():
            _replace_dir(out, stage, option)
            return
        created = not out.exists()
        try:
            out.mkdir(parents=True, exist_ok=True)
            for entry in stage.iterdir():
                dest = out / entry.name
                if dest.is_dir() and not dest.is_symlink():
                    shutil.rmtree(dest)
                elif dest.exists() or dest.is_symlink():
                    dest.unlink()
                os.replace(entry, dest)
        except OSError as exc:
            if created:
                with contextlib.suppress(OSError):
                    out.rmdir()   # only when still empty: a directory we made for nothing
            raise _cannot(out, exc, option) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _replace_dir(out: Path, stage: Path, option: str | None) -> None:
    """``out`` becomes ``stage``: the old directory is renamed aside, the stage renamed in, the old removed."""
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=stage.parent))
    try:
        os.chmod(stage, 0o777 & ~current_umask())
        os.replace(out, old / "dir")
        try:
            os.replace(stage, out)
        except OSError:
            os.replace(old / "dir", out)   # put the old directory back
            raise
    except OSError as exc:
        raise _cannot(out, exc, option) from None
    finally:
        shutil.rmtree(old, ignore_errors=True)
