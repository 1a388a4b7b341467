"""megatron-core 0.19.2 unpacked for the trainer tests: its wheel needs Python 3.12 per its metadata,
so it is downloaded once (``pip download --python-version 3.12``) into the repository's ``.cache/``
and unpacked there (it runs on 3.11 with the shims of tests/trainers/megatron_check.py).
``TOPOPLAN_MCORE_DIR`` names an unpacked copy instead (offline machines). Every trainers test asks
here, so none skips because another test module has not run first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

MCORE = "0.19.2"
CACHE = Path(__file__).resolve().parents[2] / ".cache"


def unpacked_wheels(target: Path, marker: str, specs: tuple[str, ...], env_var: str, *pip_args: str) -> Path:
    """``specs`` downloaded once as wheels (``pip download --no-deps``, plus ``pip_args``) and unpacked
    into ``target`` (kept while ``target/marker`` exists); ``env_var`` names an unpacked copy instead.
    pytest.fail when they cannot be had."""
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    if (target / marker).exists():
        return target
    target.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *pip_args,
                            "-d", tmp, *specs], capture_output=True, text=True)
        if p.returncode:
            pytest.fail(f"could not download {', '.join(specs)} (set {env_var} to the unpacked wheels when "
                        f"offline): {p.stderr.strip()[-400:]}")
        stage = Path(tmp) / "unpacked"
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(stage)
        try:
            os.replace(stage, target)
        except OSError:  # another worker got there first
            shutil.rmtree(stage, ignore_errors=True)
    return target


def ensure_mcore() -> Path:
    """The unpacked megatron-core (downloaded on first use; pytest.fail when it cannot be had)."""
    return unpacked_wheels(CACHE / f"megatron-core-{MCORE}", "megatron/training/arguments.py",
                           (f"megatron-core=={MCORE}",), "TOPOPLAN_MCORE_DIR", "--python-version", "3.12")


TORCHTITAN02 = "0.2.0"


def ensure_torchtitan02() -> Path:
    """torchtitan 0.2.0 unpacked (the installed torchtitan is 0.3.0): the job.toml form and its
    ``[experimental] custom_import``. ``TOPOPLAN_TORCHTITAN02_DIR`` names an unpacked copy instead."""
    return unpacked_wheels(CACHE / f"torchtitan-{TORCHTITAN02}", "torchtitan/train.py",
                           (f"torchtitan=={TORCHTITAN02}",), "TOPOPLAN_TORCHTITAN02_DIR")
