"""``topoplan compare``: the arithmetic recomputed by hand from the JSON, each candidate's plan equal to
``plan``'s own, the inputs refused with the option named, and the issue's done-when (DeepSeek-V3 on
256 GB300 vs 1,024 H100: days, $ and kWh per million tokens with goodput, consistent with its own
tokens/s) through the CLI, at 80 columns and as an HTML page."""

from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.cli.compare import parse_tokens
from planner.config import Training
from planner.cost.economics import Prices, prices_for, run_cost
from planner.errors import InputError
from planner.model.spec import load_model
from planner.search.compare import compare, parse_candidate
from planner.search.plan import plan
from topologies.loader import load_job

TOKENS = 2e12
TRAINING = Training(seq_len=4096, global_batch=576)


def test_parse_candidate():
    c = parse_candidate("gb300-nvl72:256:usd_per_gpu_hour=6.5:kw_per_gpu=1.9:precision=mxfp8")
    assert (c.cluster, c.gpus, c.usd_per_gpu_hour, c.kw_per_gpu, c.precision) == ("gb300-nvl72", 256, 6.5, 1.9, "mxfp8")
    assert parse_candidate("dgx-h100:1024").usd_per_gpu_hour is None
    for bad, word in (("gb300-nvl72", "CLUSTER:GPUS"), ("gb300-nvl72:many", "not an integer"),
                      ("dgx-h100:8:price=3", "key=value"), ("dgx-h100:8:usd_per_gpu_hour=x", "not a number"),
                      ("dgx-h100:8:precision=fp7", "precision"), ("dgx-h100:0", "at least 1"),
                      ("dgx-h100:8:kw_per_gpu=-1", "positive")):
        with pytest.raises(InputError, match=word):
            parse_candidate(bad)


def test_parse_tokens():
    assert parse_tokens("15T") == 15e12 and parse_tokens("800B") == 800e9 and parse_tokens("2.5e12") == 2.5e12
    with pytest.raises(InputError, match="--tokens"):
        parse_tokens("lots")


def test_run_cost_by_hand():
    """1e12 tokens at 1e6 tokens/s on 100 GPUs at $2/GPU-h, 1.5 kW/GPU, PUE 1.2:
    a million tokens takes 1/3600 h; $ = 2 * 100 / 3600 = 0.0556; kWh = 1.5 * 1.2 * 100 / 3600 = 0.05;
    days = 1e12 / 1e6 / 86400 = 11.574."""
    p = Prices(2.0, "user", 1.5, "user", 1.2, "user")
    r = run_cost(1e12, 1e6, 100, p)
    assert r["usd_per_million_tokens"] == pytest.approx(2 * 100 / 3600)
    assert r["kwh_per_million_tokens"] == pytest.approx(0.05)
    assert r["days"] == pytest.approx(11.574074, rel=1e-6)
    assert r["gpu_hours"] == pytest.approx(100 * 1e6 / 3600)
    assert r["total_usd"] == pytest.approx(2 * 100 / 3600 * 1e6)
    assert r["total_mwh"] == pytest.approx(0.05 * 1e6 / 1e3)


def test_default_prices_are_flagged():
    p = prices_for("h100")
    assert p.usd_source == "assumed" and p.pue_source == "assumed" and p.pue == 1.2
    assert p.kw_per_gpu == pytest.approx(10.2 / 8)            # DGX H100: 10.2 kW for 8 GPUs
    assert p.gpu_kw == 0.7 and p.host_share == pytest.approx(10.2 / 8 / 0.7 - 1)   # 700 W TDP, 82% more
    assert prices_for("gb200").kw_per_gpu == pytest.approx(120 / 72)
    p = prices_for("h100", usd_per_gpu_hour=2.0, kw_per_gpu=1.0, pue=1.1)
    assert (p.usd_source, p.kw_source, p.pue_source) == ("user", "user", "user")
    with pytest.raises(InputError, match="--pue"):
        prices_for("h100", pue=0.9)


@pytest.fixture(scope="module")
def small():
    """Llama 3 8B on one GB200 rack (priced by the user) against 64 H100 (default prices)."""
    return compare(load_model("llama3-8b"), ["gb200-nvl72:72:usd_per_gpu_hour=5", "dgx-h100:64"], TRAINING, TOKENS)


def test_compare_arithmetic_by_hand(small):
    """Every figure recomputed from the JSON with the stated formulas."""
    doc = json.loads(json.dumps(small))
    assert [c["candidate"] for c in doc["candidates"]] == ["gb200-nvl72:72", "dgx-h100:64"]
    for c in doc["candidates"]:
        g = c["goodput"]
        gp = c["tokens_per_s"] * c["effective_fraction"]
        assert c["goodput_tokens_per_s"] == pytest.approx(gp)
        assert c["effective_fraction"] == pytest.approx(1 - g["checkpoint_share"] - g["failure_share"])
        assert c["days"] == pytest.approx(TOKENS / gp / 86400)
        assert c["usd_per_million_tokens"] == pytest.approx(c["usd_per_gpu_hour"] * c["gpus"] / (gp * 3600) * 1e6)
        assert c["kwh_per_million_tokens"] == pytest.approx(c["kw_per_gpu"] * c["pue"] * c["gpus"] / (gp * 3600) * 1e6)
        assert c["total_usd"] == pytest.approx(c["usd_per_million_tokens"] * TOKENS / 1e6)
        assert c["gpu_hours"] == pytest.approx(c["gpus"] * c["days"] * 24)
        # the band: goodput scaled by the plan's TFLOP/s band
        lo, hi = c["tokens_per_s_low"] / c["tokens_per_s"], c["tokens_per_s_high"] / c["tokens_per_s"]
        assert lo < 1 < hi
        assert c["days_low"] == pytest.approx(TOKENS / (gp * hi) / 86400)
        assert c["days_high"] == pytest.approx(TOKENS / (gp * lo) / 86400)
        assert c["usd_per_million_tokens_low"] == pytest.approx(c["usd_per_million_tokens"] / hi)
        assert c["kwh_per_million_tokens_high"] == pytest.approx(c["kwh_per_million_tokens"] / lo)
    gb, h = doc["candidates"]
    assert (gb["usd_per_gpu_hour"], gb["usd_per_gpu_hour_source"]) == (5.0, "user")
    assert h["usd_per_gpu_hour_source"] == "assumed" and h["pue_source"] == "assumed"


def test_each_candidate_has_its_own_optimal_plan(small):
    c = small["candidates"][1]
    best = plan(load_model("llama3-8b"), load_job("dgx-h100", gpus=64), TRAINING, top=1).plans[0]
    assert c["layout"] == best.label and c["world"] == best.world
    assert c["tokens_per_s"] == pytest.approx(best.prediction.tokens_per_s)


# ------------------------------------------------------------------------------- the done-when, CLI

DONE = ["compare", "--model", "deepseek-v3", "--tokens", "15T", "--gbs", "4096",
        "--candidate", "gb300-nvl72:256:precision=mxfp8", "--candidate", "dgx-h100:1024:precision=fp8"]


@pytest.fixture(scope="module")
def done_json():
    import io
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(DONE + ["--json"])
    assert rc in (0, None)
    return json.loads(buf.getvalue())


@pytest.mark.slow
def test_done_when_deepseek_v3_gb300_vs_h100(done_json):
    cands = {c["candidate"]: c for c in done_json["candidates"]}
    assert set(cands) == {"gb300-nvl72:256", "dgx-h100:1024"}
    for c in cands.values():
        for key in ("layout", "tokens_per_s", "goodput_tokens_per_s", "days", "usd_per_million_tokens",
                    "kwh_per_million_tokens", "tokens_per_s_low", "tokens_per_s_high"):
            assert key in c
        gp = c["goodput_tokens_per_s"]
        assert 0.8 * c["tokens_per_s"] < gp < c["tokens_per_s"]
        assert c["days"] * 86400 * gp == pytest.approx(15e12)       # consistent with its own tokens/s
        assert c["usd_per_million_tokens"] * gp * 3600 / 1e6 == pytest.approx(c["usd_per_gpu_hour"] * c["gpus"])
        assert c["kwh_per_million_tokens"] * gp * 3600 / 1e6 == pytest.approx(c["kw_per_gpu"] * c["pue"] * c["gpus"])
    assert cands["gb300-nvl72:256"]["precision"] == "mxfp8" and cands["dgx-h100:1024"]["precision"] == "fp8"


@pytest.mark.slow
def test_done_when_terminal_and_html(done_json, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "80")
    page = tmp_path / "compare.html"
    assert main(DONE + ["--html", str(page)]) in (0, None)
    out = capsys.readouterr().out
    assert "…" not in out and all(len(line) <= 80 for line in out.splitlines())
    for c in done_json["candidates"]:
        assert c["candidate"] in out and f"{c['days']:,.1f}" in out and f"{c['goodput_tokens_per_s']:,.0f}" in out
    text = page.read_text()
    assert "data:image/png;base64," in text and "gb300-nvl72:256" in text and "usd_per_million_tokens" in text
    assert main(["compare", "--model", "deepseek-v3", "--tokens", "15T", "--candidate", "dgx-h100"]) == 2
    assert "--candidate" in capsys.readouterr().err
