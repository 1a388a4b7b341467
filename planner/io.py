"""Atomic writes: a file or a whole output directory appears complete or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory and a rename."""
    return atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike):
    """Yield a staging directory; on success its entries are moved into ``out``, on any error
    nothing in ``out`` changes.

    Entries already in ``out`` with the same names are replaced; other entries are kept.
    """
    out = Path(out)
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging.", dir=parent))
    try:
        yield stage
        out.mkdir(parents=True, exist_ok=True)
        for entry in stage.iterdir():
            dest = out / entry.name
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            elif dest.exists() or dest.is_symlink():
                dest.unlink()
            os.replace(entry, dest)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
