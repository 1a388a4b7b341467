"""``--gbs-range A:B`` without ``--gbs`` (issue 23 item 4): the tool's own hint for a batch that cannot split
("try --gbs X or Y, or --gbs-range X:Y to let the planner choose") must be runnable as written. Oracle: the
same request with ``--gbs A`` added (the batch the range starts from) gives the same plans."""

from __future__ import annotations

import json
import re

from planner.cli import main

BASE = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--top", "2", "--json"]


def _plans(argv, capsys):
    assert main(argv) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    doc = json.loads(out)
    return [(p["config"], p["placement"]["rank_to_gpu"]) for p in doc["plans"]], err


def test_the_hint_runs_as_written(monkeypatch, capsys):
    monkeypatch.setenv("TOPOPLAN_NO_PROGRESS", "1")
    _, err = _plans([*BASE, "--gbs", "127"], capsys)     # 127 is prime: the hint offers a range
    m = re.search(r"--gbs-range (\d+):(\d+) to let the planner choose", err)
    assert m, err
    lo, hi = int(m.group(1)), int(m.group(2))
    alone, _ = _plans([*BASE, "--gbs-range", f"{lo}:{hi}"], capsys)
    assert all(lo <= cfg["gbs"] <= hi for cfg, _ in alone)
    with_gbs, _ = _plans([*BASE, "--gbs", str(lo), "--gbs-range", f"{lo}:{hi}"], capsys)
    assert alone == with_gbs


def test_neither_gbs_nor_range_names_both(capsys):
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --gbs") and "--gbs-range" in err and "\n" not in err
