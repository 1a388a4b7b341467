"""Goodput in plans: every plan entry carries it, ``--objective goodput`` chooses GPUs per rack and
spares with it (64/72 with spares when repairs are long, 72/72 when they are short), and ``scale``
reports it next to TFLOP/s retention."""

from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.config import Training
from planner.cost.goodput import Resilience, plan_goodput
from planner.model.spec import load_model
from planner.search.document import PlanDocument
from planner.search.plan import plan, scale
from topologies.loader import load_job

MODEL = "llama3-8b"
TRAINING = Training(seq_len=4096, global_batch=576)   # 576 = 72 x 8 = 64 x 9: both GPU counts divide it


def _model():
    return load_model(MODEL)


@pytest.fixture(scope="module")
def long_repair():
    """One GB200 rack; a failed tray takes a week to come back."""
    return plan(_model(), load_job("gb200-nvl72", gpus=72), TRAINING, top=2, objective="goodput",
                resilience=Resilience(repair_hours=168))


@pytest.fixture(scope="module")
def short_repair():
    return plan(_model(), load_job("gb200-nvl72", gpus=72), TRAINING, top=2, objective="goodput",
                resilience=Resilience(repair_hours=1))


def test_long_repairs_make_spares_pay(long_repair):
    best = long_repair.plans[0]
    assert best.world == 64 and best.goodput.spare_hosts_per_domain == 2
    opts = {o["gpus_per_domain"]: o for o in long_repair.solver["goodput_options"]}
    assert set(opts) == {None, 64}
    full, spared = opts[None], opts[64]
    assert full["world"] == 72 and full["spare_hosts_per_domain"] == 0
    assert full["tokens_per_s"] > spared["tokens_per_s"]               # 72/72 is faster ...
    assert full["goodput_tokens_per_s"] < spared["goodput_tokens_per_s"]  # ... until failures are counted
    assert long_repair.solver["objective"] == pytest.approx(max(o["goodput_tokens_per_s"] for o in opts.values()))
    assert long_repair.solver["objective_name"] == "goodput_tokens_per_s"


def test_short_repairs_keep_every_gpu(short_repair):
    best = short_repair.plans[0]
    assert best.world == 72 and best.goodput.spare_hosts_per_domain == 0
    gp = [e.goodput.goodput_tokens_per_s for e in short_repair.plans]
    assert gp == sorted(gp, reverse=True)


def test_goodput_of_a_plan_is_its_formula(long_repair):
    """The entry's goodput is plan_goodput of its own tokens/s and placement, and the throughput
    objective finds the same best tokens/s as the best option of the goodput search."""
    e = long_repair.plans[0]
    again = plan_goodput(long_repair.model, long_repair.cluster, TRAINING.model_copy(update={"global_batch": e.gbs}),
                         e.prediction.tokens_per_s, e.placement.rank_to_gpu, Resilience(repair_hours=168))
    assert again == e.goodput
    g = e.goodput
    assert g.goodput_tokens_per_s == pytest.approx(g.tokens_per_s * g.effective_fraction)
    assert g.effective_fraction == pytest.approx(1 - g.checkpoint_share - g.failure_share)


def test_plan_document_carries_goodput(long_repair):
    doc = long_repair.to_dict()
    assert doc["plans"][0]["goodput"]["goodput_tokens_per_s"] == long_repair.plans[0].goodput.goodput_tokens_per_s
    back = PlanDocument.model_validate(doc).dump()
    assert back["plans"][0]["goodput"] == doc["plans"][0]["goodput"]
    assert back["solver"]["goodput_options"] == doc["solver"]["goodput_options"]


def test_scale_reports_goodput():
    rows = scale(_model(), lambda n: load_job("dgx-h100", gpus=n), [8, 16], TRAINING.model_copy(update={"global_batch": 256}))
    for r in rows:
        assert 0 < r["effective_fraction"] < 1
        assert r["goodput_tokens_per_s"] == pytest.approx(r["tokens_per_s"] * r["effective_fraction"])
    base = rows[0]["goodput_tokens_per_s"] / rows[0]["world"]
    assert rows[1]["goodput_retention"] == pytest.approx(rows[1]["goodput_tokens_per_s"] / rows[1]["world"] / base)
    assert rows[0]["goodput_retention"] == 1.0


@pytest.mark.slow
def test_cli_objective_goodput(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    argv = ["plan", "--model", MODEL, "--cluster", "gb200-nvl72", "--gpus", "72", "--gbs", "576", "--top", "1",
            "--objective", "goodput", "--repair-hours", "168"]
    assert main(argv) in (0, None)
    out = capsys.readouterr().out
    assert "kept as spares" in out and "--objective goodput" in out and "goodput" in out
    assert all(len(line) <= 80 for line in out.splitlines())
    assert main(argv + ["--json"]) in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["plans"][0]["config"]["world"] == 64
    assert doc["solver"]["objective_name"] == "goodput_tokens_per_s"
    assert main(argv[:-2] + ["--repair-hours", "-1"]) == 2
    assert "--repair-hours" in capsys.readouterr().err


def test_usable_per_rack_spares_count_as_before():
    """--usable-per-rack 64 holds (72 - 64) / 4 = 2 trays per rack under health.spare_trays: a plan
    counts them as its spares (what the fixed held-back count gave before spare_trays existed)."""
    res = plan(_model(), load_job("gb200-nvl72", gpus=128, usable_per_domain=64), TRAINING, top=1)
    assert res.cluster.health.spare_trays and not res.cluster.health.failed_trays
    assert res.plans[0].world == 128 and res.plans[0].goodput.spare_hosts_per_domain == 2
