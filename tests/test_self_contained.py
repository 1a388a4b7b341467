"""The repository is self-contained: no tracked file names a path outside it.

A fresh clone with nothing beside it must run every test, bench script and example, so no file may
point at a sibling folder (the team's reference folder beside the checkout, spelled as a relative path
or joined onto the parent of the repository root) or at a path of one machine (a work or home
directory). Fake install
directories that tests hand to emitted launch scripts (``/opt/mlm``) are the user's paths, not ours,
and are allowed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# what points outside the repository; each alternative with the reason it is refused
OUTSIDE = re.compile(
    r"\.\.[/]shared"                                 # the team's reference folder beside the checkout
    r"|shared/reference"                             # the same, spelled from anywhere
    r"|[\"']shared[\"']\s*/\s*[\"']reference[\"']"   # the same, joined with pathlib
    r"|(?<![\w.~-])/(?:work|home(?!/kubernetes/bin/)|Users|root|mnt|scratch)/"   # one machine's absolute paths
)   # (/home/kubernetes/bin/ is every GKE node's NVIDIA and NCCL plug-in directory, which GKE's own pod
    # manifests mount and the k8s emitter mounts on GCP: planner/output/emit/k8s_network.py)
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()
# Third-party files kept byte for byte (their sha256 pinned in the folder's README): the paths they name
# are paths inside the containers they describe (the Kubeflow Trainer CRD's default ``/root/.ssh``, MaxText's
# base.yml comment on gcsfuse mounts).
VERBATIM = ("tests/data/k8s/", "tests/data/maxtext/")


def tracked_files() -> list[str]:
    """The files git tracks (a checkout), else every file under the root but caches (an sdist copy)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
    if not names:
        skip = {".git", ".cache", "__pycache__", ".pytest_cache", ".hypothesis", "out"}
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    return sorted(names)


def offending_lines(files: list[str], root: Path = ROOT) -> list[str]:
    bad = []
    for name in files:
        path = root / name
        if name == THIS or name.startswith(VERBATIM) or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:   # binary data cannot name a path we would follow
            continue
        for no, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{name}:{no}: {line.strip()[:120]}")
    return bad


def test_no_file_names_a_path_outside_the_repository():
    files = tracked_files()
    assert len(files) > 100, "found too few files: the walk itself is broken"
    bad = offending_lines(files)
    assert not bad, "files naming a path outside the repository:\n" + "\n".join(bad)


@pytest.mark.parametrize("line", [
    "see ../sha" + "red/reference/hardware.md",   # (split so that this file does not name it itself)
    'CSV = ROOT.parent / "shared" / "reference" / "calibration.csv"',
    "Run: /" + "work/venv/bin/python bench/accuracy.py",
    "cd /home/alice/topoplan",
    "cd /home/kubernetes/topoplan",   # only GKE's bin directory is a node path
])
def test_the_pattern_catches_each_kind(line, tmp_path):
    # the check must be able to fail: a file holding one of these lines is reported
    (tmp_path / "x.py").write_text(f"ok = 1\n{line}\n")
    assert offending_lines(["x.py"], tmp_path) == [f"x.py:2: {line}"]


@pytest.mark.parametrize("line", ["MEGATRON_LM=/opt/mlm", "planner/data/profiles/calibration.csv",
                                  'hostPath: {path: "/home/kubernetes/bin/gib"}',
                                  "tests/data/reference/hardware.md s2.2", "shared_experts"])
def test_the_pattern_allows_repository_and_user_paths(line, tmp_path):
    (tmp_path / "x.py").write_text(line + "\n")
    assert offending_lines(["x.py"], tmp_path) == []
