"""place-experts with --previous / --max-moves: progress per layer, and the EPLB baseline printed
beside a move-capped placement says that EPLB was not held to the cap (and how many moves it needs).
Oracles: a hand-written per-GPU multiset difference for the moves, EPLB re-run independently."""

import json
from collections import Counter

import numpy as np
import pytest

from planner.cli import main
from planner.search.eplb import rebalance_experts
from planner.search.experts import place

L, E = 32, 8          # mixtral-8x7b: 32 MoE layers of 8 experts, top-2


def _moves_by_hand(prev, new, K):
    """Expert copies ``new`` needs that ``prev`` lacks, GPU by GPU (slot order free)."""
    total = 0
    for g in range(len(new) // K):
        before = Counter(prev[g * K:(g + 1) * K].tolist())
        after = Counter(new[g * K:(g + 1) * K].tolist())
        total += sum((after - before).values())
    return total


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("px")
    rng = np.random.default_rng(1)
    np.save(tmp / "a.npy", rng.gamma(0.7, 1, (L, E)) * 100)
    np.save(tmp / "b.npy", rng.gamma(0.7, 1, (L, E)) * 100)
    base = ["place-experts", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "16", "--ep", "16",
            "--time-limit", "0.01", "--workers", "1"]
    assert main(base + ["--loads", str(tmp / "a.npy"), "-o", str(tmp / "first")]) == 0
    return tmp, base


def test_eplb_beside_a_capped_placement_says_it_is_not_capped(runs, capsys):
    tmp, base = runs
    capsys.readouterr()
    assert main(base + ["--loads", str(tmp / "b.npy"), "--previous", str(tmp / "first"), "--max-moves", "2",
                        "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    prev = np.load(tmp / "first" / "physical_to_logical.npy")
    K = doc["slots_per_gpu"]
    assert doc["summary"]["moves"] <= 2 * L
    rank_domain = np.array(doc["ep_rank_domain"])
    loads = np.load(tmp / "b.npy")
    checked = 0
    for policy, entry in doc["eplb"].items():
        if "skipped" in entry:
            continue
        p2l, _, _ = rebalance_experts(loads, 16 * K, 1, int(rank_domain.max()) + 1, 16, policy)
        assert entry["moves_capped"] is False and "--max-moves 2" in entry["note"]
        assert entry["moves"] == sum(_moves_by_hand(prev[i], p2l[i], K) for i in range(L))
        assert entry["moves"] > 2 * L          # EPLB here needs far more moves than the cap allows
        checked += 1
    assert checked
    # the text output says the same
    assert main(base + ["--loads", str(tmp / "b.npy"), "--previous", str(tmp / "first"), "--max-moves", "2"]) == 0
    out = capsys.readouterr().out
    assert "(rebuilt from scratch, not move-capped: " in out and " moves vs --previous)" in out


def test_without_previous_eplb_carries_no_move_figures(runs, capsys):
    tmp, base = runs
    capsys.readouterr()
    assert main(base + ["--loads", str(tmp / "b.npy"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all("moves" not in e and "moves_capped" not in e for e in doc["eplb"].values())


@pytest.mark.parametrize("workers", [1, 2])
def test_place_reports_each_layer(workers):
    rng = np.random.default_rng(0)
    loads = rng.gamma(0.7, 1, (5, E))
    calls = []
    pl = place(loads, np.repeat(np.arange(2), 4), 3, top_k=2, time_limit=0.01, workers=workers,
               on_layer=lambda: calls.append(1))
    assert len(calls) == 5 and pl.physical_to_logical.shape == (5, 8 * 3)


def test_progress_bar_on_stderr_when_stdout_is_a_pipe(runs, capsys, monkeypatch):
    """A person watching stderr sees the layers go by although stdout is piped (not a terminal)."""
    import sys

    tmp, base = runs
    monkeypatch.delenv("TOPOPLAN_NO_PROGRESS", raising=False)
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    seen = []
    import planner.cli.progress as prog

    real = prog.progress

    def spy(description, total=None, json_output=False, stream=None):
        seen.append((description, total, prog.enabled(json_output, stream)))
        return real(description, total, json_output, stream)

    monkeypatch.setattr("planner.cli.experts.progress", spy)   # the name the command calls
    assert main(base + ["--loads", str(tmp / "b.npy"), "--json"]) == 0
    assert seen == [(f"placing {L} MoE layers", L, True)]
    json.loads(capsys.readouterr().out)          # stdout is still one clean JSON document
