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


def ensure_mcore() -> Path:
    """The unpacked megatron-core (downloaded on first use; pytest.fail when it cannot be had)."""
    if os.environ.get("TOPOPLAN_MCORE_DIR"):
        return Path(os.environ["TOPOPLAN_MCORE_DIR"])
    target = CACHE / f"megatron-core-{MCORE}"
    if (target / "megatron" / "training" / "arguments.py").exists():
        return target
    CACHE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--python-version", "3.12",
                            "--only-binary=:all:", "-d", tmp, f"megatron-core=={MCORE}"],
                           capture_output=True, text=True)
        if p.returncode:
            pytest.fail(f"could not download megatron-core {MCORE} (needed to check the Megatron configs; set "
                        f"TOPOPLAN_MCORE_DIR to an unpacked wheel when offline): {p.stderr.strip()[-400:]}")
        wheel = next(Path(tmp).glob("megatron_core-*.whl"))
        stage = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(stage)
        try:
            os.replace(stage, target)
        except OSError:  # another worker got there first
            shutil.rmtree(stage, ignore_errors=True)
    return target
