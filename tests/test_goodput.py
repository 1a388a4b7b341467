"""Goodput (planner/cost/goodput.py, docs/resilience.md) against independent oracles: Llama 3's
published interruption figures, hand calculations, brute-force minimisation of the lost-time
formulas (Young's and Daly's), scipy's Poisson tail, and Kokolis et al.'s MTTF projections."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import poisson

from planner.cli.goodput_options import resilience
from planner.config import Training
from planner.cost.failures import RATES_FILE
from planner.cost.goodput import (JobShape, Resilience, checkpoint_bytes, daly_interval, goodput, job_shape,
                                  p_no_spare, waste, young_interval)
from planner.errors import InputError
from planner.model.spec import load_model
from topologies.cluster import Cluster
from topologies.loader import load_job

# Llama 3 (Dubey et al. 2024, arXiv:2407.21783), section 3.3.4 and Table 5
LLAMA3_GPUS, LLAMA3_DAYS, LLAMA3_UNEXPECTED = 16384, 54, 419
TABLE5 = {"faulty_gpu": 148, "gpu_hbm3_memory": 72, "software_bug": 54, "network_switch_cable": 35,
          "host_maintenance_unplanned": 32, "gpu_sram_memory": 19, "gpu_system_processor": 17, "nic": 7,
          "nccl_watchdog_timeout": 7, "silent_data_corruption": 6, "gpu_thermal_interface_sensor": 6, "ssd": 3,
          "power_supply": 3, "server_chassis": 2, "io_expansion_board": 2, "dependency": 2, "cpu": 2,
          "system_memory": 2}


def _llama3_shape(spare_hosts: int = 256) -> JobShape:
    """16,384 H100 in 2,048 hosts of 8; the NVLink domain is the host (spares pooled)."""
    return JobShape(tuple([8] * 2048), 8, 8, (spare_hosts,), True)


def test_rate_file_holds_table5_by_component():
    doc = yaml.safe_load(RATES_FILE.read_text())
    comps = doc["sets"]["llama3"]["components"]
    causes = {k: v for c in comps.values() for k, v in (c.get("causes") or {}).items()}
    assert causes == TABLE5
    assert sum(c["count"] for c in comps.values() if "count" in c) == LLAMA3_UNEXPECTED
    for c in comps.values():   # each component's count is the sum of its causes
        if "count" in c:
            assert c["count"] == sum(c["causes"].values())


def test_llama3_interruptions_reproduced():
    """419 interruptions in 54 days on 16,384 GPUs: the per-GPU rate, and the model's count for that job."""
    per_gpu_hour = LLAMA3_UNEXPECTED / (LLAMA3_GPUS * LLAMA3_DAYS * 24)
    assert per_gpu_hour == pytest.approx(1.9733e-5, rel=1e-4)
    g = goodput(1.0, _llama3_shape(), 1e12, Resilience(rates="llama3"), "h100")
    assert g.interruptions_per_day * LLAMA3_DAYS == pytest.approx(LLAMA3_UNEXPECTED, rel=1e-9)
    assert g.mtbf_h == pytest.approx(1 / (per_gpu_hour * LLAMA3_GPUS), rel=1e-9)   # ~3.09 h: "every three hours"
    assert 3.0 < g.mtbf_h < 3.2
    assert not g.carried_over


def test_llama3_effective_training_time_over_90_percent():
    """Llama 3 405B with its own storage (2 TB/s sustained, the default per GPU) and the default restart:
    the effective share lies in the paper's '>90%' (and below 100%)."""
    model = load_model("llama3.1-405b")
    ck = checkpoint_bytes(model, Training(seq_len=8192, global_batch=2048, precision="bf16"))
    assert ck == pytest.approx(405e9 * 14, rel=0.02)   # bf16 weights + fp32 master + two fp32 moments
    g = goodput(1.0, _llama3_shape(), ck, Resilience(rates="llama3"), "h100")
    assert g.checkpoint_write_s == pytest.approx(ck / 2e12, rel=0.01)   # 2 TB/s over the job
    assert 0.90 < g.effective_fraction < 0.95
    # and the share falls below 90% once a restart takes over 16 minutes: the restart is the lever
    slow = goodput(1.0, _llama3_shape(), ck, Resilience(rates="llama3", restart_min=17), "h100")
    assert slow.effective_fraction < 0.90


@pytest.fixture()
def round_rates(tmp_path):
    """A rate file with round numbers: 1e-4 hardware interruptions per GPU-hour, nothing else."""
    p = tmp_path / "rates.yaml"
    p.write_text(yaml.safe_dump({"default": "round", "switch_trays_per_domain": {},
                                 "sets": {"round": {"source": "test", "components": {
                                     "gpu": {"per": "gpu", "effect": "hardware", "rate_per_hour": 1e-4}}}}}))
    return str(p)


def test_hand_computed_with_spares(round_rates):
    """Two racks used 64/72 (2 spare trays each), repair instant: no failure lacks a spare.
    lambda = 128 * 1e-4 / 3600 = 3.5556e-6 /s; delta = 1.28e12 / (1e9 * 128) = 10 s; tau = 3600 s;
    waste = 10/3600 + 3.5556e-6 * (1800 + 600) = 0.0027778 + 0.0085333 = 0.0113111."""
    shape = JobShape((64, 64), 72, 4, (2, 2), False)
    s = Resilience(rates=round_rates, storage_gb_s_per_gpu=1.0, restart_min=10, repair_hours=0, interval="60")
    g = goodput(1e6, shape, 1.28e12, s, "gb200")
    assert g.checkpoint_write_s == pytest.approx(10.0)
    assert g.interval_s == 3600.0 and g.interval_rule == "fixed"
    assert g.interruptions_per_day == pytest.approx(128 * 1e-4 * 24)
    assert g.effective_fraction == pytest.approx(1 - 0.0113111, abs=1e-6)
    assert g.goodput_tokens_per_s == pytest.approx(1e6 * (1 - 0.0113111), rel=1e-6)
    assert g.lost_per_failure_s == pytest.approx(2400.0)
    assert g.spare_hosts_per_domain == 2 and g.no_spare_share == 0.0


def test_hand_computed_without_spares(round_rates):
    """Two racks used 72/72, repair 10 h: every hardware failure costs the rack (half the job) for the
    repair and one more restart: 36000 * 72/144 + 600 = 18600 s. lambda = 144e-4 / 3600 = 4e-6 /s;
    delta = 1.44e12 / (1e9 * 144) = 10 s; waste = 10/3600 + 4e-6 * 2400 + 4e-6 * 18600 = 0.0867778."""
    shape = JobShape((72, 72), 72, 4, (0, 0), False)
    s = Resilience(rates=round_rates, storage_gb_s_per_gpu=1.0, restart_min=10, repair_hours=10, interval="60")
    g = goodput(1e6, shape, 1.44e12, s, "gb200")
    assert g.effective_fraction == pytest.approx(1 - 0.0867778, abs=1e-6)
    assert g.lost_per_failure_s == pytest.approx(1800 + 600 + 18600)
    assert g.no_spare_share == 1.0


def test_spares_pay_when_repairs_are_long(round_rates):
    """The same two racks: 64/72 beats 72/72 in goodput at equal tokens/s per GPU once repairs are
    long, and loses when they are short (72/72 has 12.5% more GPUs)."""
    def eff(used, spares, repair):
        s = Resilience(rates=round_rates, storage_gb_s_per_gpu=1.0, restart_min=10, repair_hours=repair)
        return goodput(used * 2 * 1000.0, JobShape((used, used), 72, 4, (spares, spares), False), 1e12, s,
                       "gb200").goodput_tokens_per_s
    assert eff(64, 2, 168) > eff(72, 0, 168)
    assert eff(64, 2, 1) < eff(72, 0, 1)


@pytest.mark.parametrize("delta,mtbf", [(10.0, 3600.0 * 3), (181.0, 3600.0 * 160), (3.0, 11000.0), (600.0, 7200.0)])
def test_young_interval_minimises_the_lost_time(delta, mtbf):
    """Young's sqrt(2 delta M) against a brute-force minimisation of waste(tau) = delta/tau + tau/(2M) + ..."""
    taus = np.linspace(1.0, 20 * math.sqrt(2 * delta * mtbf), 400001)
    best = taus[np.argmin(waste(taus, delta, 1 / mtbf, 600.0))]
    assert young_interval(delta, mtbf) == pytest.approx(best, rel=2e-3)


@pytest.mark.parametrize("delta,mtbf,restart", [(10.0, 3600.0 * 3, 600.0), (300.0, 3600.0 * 4, 600.0),
                                                (60.0, 3600.0, 300.0)])
def test_daly_interval_minimises_his_expected_wall_time(delta, mtbf, restart):
    """Daly's higher-order interval against the brute-force minimiser of his exact expected wall time
    per unit of work, M e^(R/M) (e^((tau+delta)/M) - 1) / tau (Daly 2006, eq. 13); closer than Young."""
    taus = np.linspace(1.0, 5 * math.sqrt(2 * delta * mtbf), 400001)
    wall = mtbf * math.exp(restart / mtbf) * (np.exp((taus + delta) / mtbf) - 1) / taus
    best = taus[np.argmin(wall)]
    assert daly_interval(delta, mtbf) == pytest.approx(best, rel=0.01)
    assert abs(daly_interval(delta, mtbf) - best) <= abs(young_interval(delta, mtbf) - best)


def test_daly_interval_at_large_delta():
    assert daly_interval(5000.0, 2000.0) == 2000.0   # delta >= 2M: checkpoint every M


@pytest.mark.parametrize("spares,mu", [(0, 0.3), (1, 0.3), (2, 0.1536), (3, 2.0), (5, 0.01)])
def test_p_no_spare_is_the_poisson_tail(spares, mu):
    expected = 1.0 if spares == 0 else poisson.sf(spares - 1, mu)
    assert p_no_spare(spares, mu) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_kokolis_projections():
    """Kokolis et al.: MTTF = 1 / (nodes * r_f); RSC-1's r_f projects 1.8 h at 16,384 GPUs, 0.23 h at 131,072."""
    for gpus, hours in ((16384, 1.8), (131072, 0.23)):
        shape = JobShape(tuple([8] * (gpus // 8)), 8, 8, (0,), True)
        g = goodput(1.0, shape, 1e12, Resilience(rates="kokolis-rsc1"), "a100")
        assert g.mtbf_h == pytest.approx(hours, rel=0.03)


def test_job_shape_of_presets():
    """Spares per rack: 64 of 72 used leaves 2 trays; --usable-per-rack 64 lists them as out of service."""
    job = load_job("gb200-nvl72", gpus=288)
    c = job.cluster
    gpus = c.gpus()
    by_rack = {}
    for g in gpus:
        by_rack.setdefault(g.domain, []).append(g.index)
    used = [i for d in sorted(by_rack) for i in by_rack[d][:64]]
    shape = job_shape(c, used)
    assert shape.used == (64, 64, 64, 64) and shape.spares == (2, 2, 2, 2) and not shape.pooled
    full = job_shape(c, [g.index for g in gpus])
    assert full.spares == (0, 0, 0, 0) and full.hosts == 72
    fixed = load_job("gb200-nvl72", gpus=256, usable_per_domain=64)
    shape = job_shape(fixed.cluster, [g.index for g in fixed.cluster.gpus()])
    assert shape.used == (64, 64, 64, 64) and shape.spares == (2, 2, 2, 2)   # (72 - 64) / 4 from spare_trays
    # the same trays marked broken (failed_trays) are no spares; a spare tray with a failed GPU is none either
    data = fixed.cluster.model_dump(mode="json", exclude_none=True)
    data["health"] = {"failed_trays": data["health"]["spare_trays"]}
    assert job_shape(Cluster.model_validate(data), [g.index for g in fixed.cluster.gpus()]).spares == (0, 0, 0, 0)
    data["health"] = {"spare_trays": fixed.cluster.health.spare_trays, "failed_gpus": ["gb200-r02-t18:1"]}
    assert job_shape(Cluster.model_validate(data), [g.index for g in fixed.cluster.gpus()]).spares == (2, 1, 2, 2)
    hgx = load_job("dgx-h100", gpus=64).cluster
    shape = job_shape(hgx, [g.index for g in hgx.gpus()][:56])
    assert shape.pooled and shape.spares == (1,)


def test_bad_settings_name_the_option(tmp_path):
    with pytest.raises(InputError, match="--checkpoint-interval"):
        resilience(None, None, None, None, "hourly")
    with pytest.raises(InputError, match="--storage-bw"):
        resilience(None, 0.0, None, None, "young")
    with pytest.raises(InputError, match="unknown rate set"):
        resilience("nope", None, None, None, "young")
    bad = tmp_path / "r.yaml"
    bad.write_text("sets: {x: {components: {gpu: {per: gpu, effect: explode, rate_per_hour: 1}}}}\n")
    with pytest.raises(InputError, match="effect"):
        resilience(str(bad), None, None, None, "young")


@settings(max_examples=60, deadline=None)
@given(racks=st.integers(1, 8), used=st.sampled_from([56, 64, 68, 72]), repair=st.floats(0.0, 400.0),
       restart=st.floats(0.0, 60.0), bw=st.floats(0.01, 10.0), extra_spare=st.integers(1, 3))
def test_goodput_rules(racks, used, repair, restart, bw, extra_spare):
    """Rules any failure model must keep: the effective share lies in [0, 1]; a spare tray more never
    lowers goodput; a longer repair or restart never raises it; Young's interval beats any other."""
    spares = (72 - used) // 4

    def g(sp=spares, rep=repair, rs=restart, interval="young"):
        s = Resilience(storage_gb_s_per_gpu=bw, restart_min=rs, repair_hours=rep, interval=interval)
        return goodput(1e6, JobShape((used,) * racks, 72, 4, (sp,) * racks, False), 9.4e12, s, "gb300")

    base = g()
    assert 0.0 <= base.effective_fraction <= 1.0
    assert g(sp=spares + extra_spare).goodput_tokens_per_s >= base.goodput_tokens_per_s - 1e-6
    assert g(rep=repair + 24).goodput_tokens_per_s <= base.goodput_tokens_per_s + 1e-6
    assert g(rs=restart + 5).goodput_tokens_per_s <= base.goodput_tokens_per_s + 1e-6
    for minutes in (5, 30, 120, 600):
        assert g(interval=str(minutes)).goodput_tokens_per_s <= base.goodput_tokens_per_s + 1e-6 or \
            base.effective_fraction == 0.0
