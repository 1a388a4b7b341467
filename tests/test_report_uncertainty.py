"""The HTML plan report shows the uncertainty bands and extrapolation notes the terminal shows (issue 23
item 5). Oracle: the terminal output of the same ``topoplan plan`` run (a MaxText plan, whose regime has
fewer measured runs than the band needs, so every plan carries an extrapolation note)."""

from __future__ import annotations

import html
import json
import re

from planner.cli import main

PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64", "--trainer", "maxtext",
        "--top", "3"]


def _text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_report_has_the_terminals_bands_and_notes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("TOPOPLAN_NO_PROGRESS", "1")
    assert main([*PLAN, "--report", str(tmp_path / "r"), "--save-plan", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    bands = [ln.strip() for ln in out.splitlines() if re.match(r"#\d+ .*TFLOP/s/GPU, band ", ln.strip())]
    doc = json.loads((tmp_path / "plan.json").read_text())
    # the extrapolation notes (the terminal prints other notes too: goodput's assumed inputs)
    extrapolated = {f"note: {p['prediction']['extrapolated']}" for p in doc["plans"] if p["prediction"]["extrapolated"]}
    notes = [ln.strip() for ln in out.splitlines() if ln.strip() in extrapolated]
    assert len(bands) == len(doc["plans"]) and len(notes) == len(doc["plans"])   # the control: the terminal has them
    page = _text((tmp_path / "r" / "index.html").read_text())
    for line in bands + notes:
        assert " ".join(line.split()) in page, line
    for p in doc["plans"]:   # the table's band column, with * for the extrapolated regime
        pr = p["prediction"]
        assert f"{pr['tflops_per_gpu_low']:,.0f}-{pr['tflops_per_gpu_high']:,.0f}*" in page
