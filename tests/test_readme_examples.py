"""The README's `validate` and `calibrate` commands run as written on the shipped examples/runs.csv
(rows copied from planner/data/profiles/calibration.csv). Oracles: the CSV's own measured column, the
row count, and the fitted profile loading back and scoring its rows."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = ROOT / "planner" / "data" / "profiles" / "calibration.csv"   # NVIDIA's published runs


def _readme_commands(verb: str) -> list[list[str]]:
    """`topoplan VERB ...` lines of the README's bash blocks, comments dropped."""
    text = (ROOT / "README.md").read_text()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith(f"topoplan {verb} "):
                cmds.append(shlex.split(line)[1:])
    return cmds


def _run(argv, cwd):
    return subprocess.run([sys.executable, "-m", "planner.cli", *argv], cwd=cwd, capture_output=True, text=True)


def test_example_csv_rows_come_from_the_reference():
    import csv

    mine = list(csv.DictReader((ROOT / "examples" / "runs.csv").open()))
    assert len(mine) >= 5
    ref = {r["id"]: r for r in csv.DictReader(CALIBRATION.open())}
    for r in mine:
        assert r == ref[r["id"]], r["id"]


@pytest.mark.slow
def test_readme_validate_and_calibrate_run(tmp_path):
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "runs.csv").write_text((ROOT / "examples" / "runs.csv").read_text())
    rows = (ROOT / "examples" / "runs.csv").read_text().strip().splitlines()[1:]
    validate = _readme_commands("validate")
    calibrate = _readme_commands("calibrate")
    assert validate and calibrate, "the README lost its validate / calibrate examples"
    for argv in validate:
        r = _run(argv, tmp_path)
        assert r.returncode == 0, r.stderr
        if "--json" in argv:
            doc = json.loads(r.stdout)
            assert [x["id"] for x in doc["rows"]] == [line.split(",")[0] for line in rows]
            measured = {line.split(",")[0]: float(line.split(",")[18]) for line in rows}
            for x in doc["rows"]:
                assert x["measured_tflops_per_gpu"] == measured[x["id"]]
                assert abs(x["error_pct"] - 100 * (x["predicted_tflops_per_gpu"] / measured[x["id"]] - 1)) < 0.1
    for argv in calibrate:
        r = _run(argv, tmp_path)
        assert r.returncode == 0, r.stderr
        out = tmp_path / argv[argv.index("-o") + 1]
        prof = yaml.safe_load(out.read_text())
        assert f"{len(rows)} rows" in prof["fit_rows"]
        # the fitted profile is a --stack for validate
        r = _run(["validate", "examples/runs.csv", "--stack", str(out), "--json"], tmp_path)
        assert r.returncode == 0, r.stderr
        assert len(json.loads(r.stdout)["rows"]) == len(rows)
