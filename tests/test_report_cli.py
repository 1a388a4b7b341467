"""``--report DIR`` on plan, scale and place-experts: the command writes the page and its figures
from the same document it prints with ``--json`` (checked against ``write_report`` on that document)."""

from __future__ import annotations

import json
import re

import pytest

from planner.cli import main


def _run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _figures(page_dir):
    page = (page_dir / "index.html").read_text()
    refs = set(re.findall(r'<img src="([^"]+)"', page))
    assert refs and all((page_dir / r).stat().st_size > 0 for r in refs)
    return page, refs


@pytest.fixture(autouse=True)
def _quiet(monkeypatch, tmp_path):
    monkeypatch.setenv("TOPOPLAN_NO_PROGRESS", "1")
    monkeypatch.chdir(tmp_path)


def test_plan_report(tmp_path, capsys):
    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "64"]
    code, out, err = _run([*argv, "--json", "--report", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    doc = json.loads(out)  # --report does not disturb the JSON on stdout
    page, refs = _figures(tmp_path / "rep")
    assert {"breakdown.png", "memory.png", "placement.png"} <= refs
    assert json.loads((tmp_path / "rep" / "data.json").read_text())["plans"] == doc["plans"]
    from planner.output.explain import plan_labels

    assert plan_labels(doc["plans"])[0] in page


def test_scale_report(tmp_path, capsys):
    code, out, err = _run(["scale", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8,16", "--gbs", "64",
                           "--json", "--report", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    doc = json.loads(out)
    page, refs = _figures(tmp_path / "rep")
    assert "scaling.png" in refs
    rows = doc.get("rows") or doc.get("points")
    assert len(rows) == 2 and "100.0%" in page


@pytest.mark.slow
def test_place_experts_report(tmp_path, capsys):
    loads = [[100 + (7 * i + 3 * j) % 50 for j in range(128)] for i in range(48)]
    (tmp_path / "loads.json").write_text(json.dumps({"loads": loads}))
    code, out, err = _run(["place-experts", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
                           "--ep", "16", "--slots-per-gpu", "9", "--loads", "loads.json", "--time-limit", "0.05",
                           "--json", "--report", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    json.loads(out)
    page, refs = _figures(tmp_path / "rep")
    assert "experts.png" in refs
