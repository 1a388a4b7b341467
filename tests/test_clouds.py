"""Cloud presets, fabric kinds and the dispatchers each fabric runs (issue 21 item 2, docs/cloud.md).

Oracles: the clouds' published network figures (per-GPU line rate), published nccl-tests sweeps on
EFA (bench/data/clouds/efa_nccl_tests.csv) and published A/B training sweeps on EFA (bench/data/clouds/ab_efa.csv).
"""

from __future__ import annotations

import itertools
import json

import pytest
from cli_run import run_cli

from bench.ab_efa import pair_orders, rows as ab_rows
from bench.fabrics import model as fabric_model, rows as nccl_rows
from planner import predict
from planner.config import ParallelConfig, Training
from planner.cost.dispatch_fabric import dispatcher_problem
from planner.errors import InputError
from planner.model.spec import load_model
from planner.search.plan import plan
from topologies.collectives import PARAMS, Fabric, GroupShape
from topologies.fabrics import FABRIC_KINDS, fabric_kind
from topologies.loader import load_cluster
from topologies.presets import CLOUD_PRESETS, PRESETS

# per-GPU scale-out Gb/s each cloud publishes (instance bandwidth / GPUs), fabric kind
PUBLISHED = {
    "aws-p5": (3200 / 8, "efa"), "aws-p5en": (3200 / 8, "efa"), "aws-p6-b200": (3200 / 8, "efa"),
    "aws-p6-b300": (6400 / 8, "efa"), "aws-p6e-gb200": (28800 / 72, "efa"),
    "gcp-a3-mega": (1600 / 8, "tcpxo"), "gcp-a3-ultra": (3200 / 8, "roce"), "gcp-a4": (3200 / 8, "roce"),
    "gcp-a4x": (1600 / 4, "roce"), "azure-nd-h100-v5": (8 * 400 / 8, "infiniband"),
    "azure-nd-gb200-v6": (4 * 400 / 4, "infiniband"), "oci-h100": (16 * 200 / 8, "roce"),
    "oci-b200": (8 * 400 / 8, "roce"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_cloud_preset_carries_the_published_line_rate_and_fabric(name):
    gbps, kind = PUBLISHED[name]
    c = load_cluster(name, gpus=PRESETS[name].su_gpus)
    assert c.fabric_tiers[0].gbps_per_gpu == pytest.approx(gbps)
    assert (c.fabric or "infiniband") == kind
    assert fabric_kind(c.fabric).name == kind


def test_every_cloud_preset_is_listed_with_its_source():
    assert {p.name for p in CLOUD_PRESETS} == set(PUBLISHED)
    r = run_cli("topology", "list", "--json")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    listed = {p["name"]: p for p in json.loads(out)["presets"]}
    domains = {"aws": "aws.amazon.com", "gcp": "cloud.google.com", "azure": "learn.microsoft.com",
               "oci": "docs.oracle.com"}
    for name, (gbps, kind) in PUBLISHED.items():
        assert listed[name]["fabric"] == kind and listed[name]["nic_gbps"] == pytest.approx(gbps)
        assert domains[name.split("-")[0]] in listed[name]["source"]


def test_infiniband_kind_keeps_the_model_as_it_was():
    """A preset without a fabric is InfiniBand and prices with PARAMS' own figures."""
    ib = fabric_kind(None)
    assert ib.name == "infiniband" and ib.gpu_initiated_rdma
    for k, v in ib.latency_us.items():
        assert v == PARAMS[k] or (k == "a2a_net_us" and v == PARAMS["a2a_base_us"])


@pytest.mark.parametrize("row", [r for r in nccl_rows() if r[0] == "p6-b200.48xlarge"],
                         ids=lambda r: f"{r[1]}x{int(r[2])}")
def test_efa_all_reduce_meets_published_nccl_tests_within_2x(row):
    """The fitted EFA figures price every P6-B200 EFA nccl-tests row (the fitted sweep) within a factor
    of 2 (the largest miss is -48% at 1 MiB, docs/cloud.md), and nearer than InfiniBand's figures at the
    latency-bound sizes. p5's 2-node 8-byte row (4x below p6-b200's) is a check in bench/fabrics.py."""
    _, n, S, measured = row
    efa = fabric_model(None, "aws-p6-b200", n, S)
    assert 0.5 < efa / measured < 2.0
    if 2**20 <= S <= 16 * 2**20:   # the latency-bound mid sizes (at 8 B on 2 nodes the fit is +48%, IB -26%)
        assert abs(efa / measured - 1) < abs(fabric_model(None, "dgx-b200", n, S) / measured - 1)


def test_efa_costs_more_at_small_messages_and_converges_at_large():
    """Same GPUs and line rate: EFA's latency dominates small transfers, the bandwidth large ones."""
    shape = GroupShape(size=16, per_domain=8, domains=2, tier=0)
    efa, ib = Fabric(load_cluster("aws-p6-b200", gpus=16)), Fabric(load_cluster("dgx-b200", gpus=16))
    for kind in ("all_reduce", "all_to_all"):
        small = efa.time(kind, shape, 64 * 1024) / ib.time(kind, shape, 64 * 1024)
        large = efa.time(kind, shape, 8 * 2**30) / ib.time(kind, shape, 8 * 2**30)
        assert small > 1.5 and 1.0 <= large < 1.2 and small > large


def _dispatch_case(cluster, ep, dispatcher):
    model = load_model("qwen3-30b-a3b")
    c = load_cluster(cluster, gpus=16)
    cfg = ParallelConfig(tp=1, ep=ep, dp=16, mbs=1, dispatcher=dispatcher)
    return model, c, cfg, Training(seq_len=4096, global_batch=64)


@pytest.mark.parametrize("dispatcher", ["flex-deepep", "flex-hybridep"])
def test_deepep_across_efa_nodes_is_refused_in_one_line(dispatcher):
    model, c, cfg, tr = _dispatch_case("aws-p5", 16, dispatcher)
    with pytest.raises(InputError) as err:
        predict(model, c, cfg, tr)
    msg = str(err.value)
    assert "\n" not in msg and dispatcher in msg and "efa" in msg and "--dispatcher alltoall" in msg


@pytest.mark.parametrize("cluster,ep,runs", [("aws-p5", 8, True), ("gcp-a3-mega", 8, True),
                                             ("gcp-a3-mega", 16, False), ("gcp-a3-ultra", 16, True),
                                             ("oci-h100", 16, True), ("azure-nd-h100-v5", 16, True)])
def test_flex_dispatchers_run_where_the_fabric_or_nvlink_carries_them(cluster, ep, runs):
    """Inside one NVLink domain DeepEP needs no RDMA; across domains only IB / RoCE carry it."""
    model, c, cfg, tr = _dispatch_case(cluster, ep, "flex-deepep")
    if runs:
        assert predict(model, c, cfg, tr).step_time_s > 0
    else:
        with pytest.raises(InputError):
            predict(model, c, cfg, tr)


def test_stack_default_dispatcher_falls_back_to_nccl_on_efa():
    model, c, cfg, tr = _dispatch_case("aws-p5", 16, None)
    assert predict(model, c, cfg, tr).config.dispatcher == "alltoall"


def test_plan_on_efa_never_sends_deepep_between_nodes():
    """EP16 on 8-GPU nodes crosses nodes: on RoCE the search takes the stack's HybridEP there, on EFA it
    must fall back to NCCL's all-to-all (and its notes say why)."""
    model = load_model("qwen3-30b-a3b")
    picked = {}
    for name in ("aws-p5", "gcp-a3-ultra"):
        c = load_cluster(name, gpus=32)
        res = plan(model, c, Training(seq_len=4096, global_batch=256), top=3, time_limit=60, restrict={"ep": [16]})
        assert res.plans
        gpus = c.gpus()
        for e in res.plans:
            doms = [gpus[g].domain for g in e.placement.rank_to_gpu]
            assert dispatcher_problem(c, e.config, e.world, e.placement.order, doms) is None
        picked[name] = {e.config.dispatcher for e in res.plans}
        assert any("GPU-initiated RDMA" in n for n in res.solver["notes"]) == (name == "aws-p5")
    assert picked["aws-p5"] == {"alltoall"} and picked["gcp-a3-ultra"] & {"flex-deepep", "flex-hybridep"}


def test_published_efa_ab_pairs_are_ordered_as_measured():
    """Issue 21: the latency-bound regime (micro-batch 1 vs 4, EP16 vs EP32, overlap) must order as the
    measured sweeps do: every pair more than 20% apart, and >= 85% of the pairs as the per-group mean (the
    issue's measure; no group below 80%: the 8-node B300 group's one inverted pair is 2.4% apart, under the
    1-4% its source reports between two campaigns of the same cell)."""
    data = ab_rows()
    shares = []
    for name, grp in itertools.groupby(data, key=lambda r: r["group"]):
        pairs = pair_orders(list(grp))
        assert pairs, name
        shares.append(sum(ok for *_, ok in pairs) / len(pairs))
        assert shares[-1] >= 0.8, name
        for a, b, ok in pair_orders([r for r in data if r["group"] == name], min_gap=0.2):
            assert ok, (name, a["mbs"], a["ep"], a["a2a_overlap"], b["mbs"], b["ep"], b["a2a_overlap"])
    assert sum(shares) / len(shares) >= 0.85


def test_efa_micro_batch_magnitude_on_p5():
    """awsome-distributed-ai's p5 sweep: micro-batch 1 is 3.2x (EP16) and 2.9x (EP32) slower than
    micro-batch 4. Priced as the recipes ran (no CUDA graphs, the 30B recipe's full recompute): the host
    launches every kernel of every layer and micro-batch, the recomputed forward again (terms/host.py),
    so the predicted ratio is within 20% of the measured one (it was 1.7-2.0x with CUDA graphs assumed)."""
    from bench.ab_efa import predicted_step

    data = [r for r in ab_rows() if r["group"] == "p5-qwen3-30b" and r["dispatcher"] == "alltoall"
            and r["a2a_overlap"] == "off"]
    for ep in ("16", "32"):
        one, four = (next(r for r in data if r["ep"] == ep and r["mbs"] == m) for m in ("1", "4"))
        measured = float(one["iter_s"]) / float(four["iter_s"])
        predicted = predicted_step(one) / predicted_step(four)
        assert predicted == pytest.approx(measured, rel=0.2), (ep, predicted, measured)
        assert predicted_step(four) == pytest.approx(float(four["iter_s"]), rel=0.15)


def test_fabric_kinds_data_is_complete_and_sourced():
    for name in FABRIC_KINDS:
        k = fabric_kind(name)
        assert k.status in ("measured", "extrapolated") and k.sources.get("latency") and k.sources.get("rdma")
    with pytest.raises(ValueError):
        fabric_kind("myrinet")


def test_cli_refuses_deepep_across_efa_and_plans_on_a_cloud_preset(capsys):
    from planner.cli import main

    args = ["predict", "--model", "qwen3-30b-a3b", "--cluster", "aws-p5", "--gpus", "16", "--gbs", "64",
            "--ep", "16", "--dispatcher", "flex-deepep"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: dispatcher flex-deepep") and "\n" not in err and "Traceback" not in err
    assert main(args[:-2] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dispatcher"] == "alltoall"
    assert main(["topology", "show", "gcp-a3-mega", "--gpus", "16"]) == 0
    assert "fabric: tcpxo (extrapolated" in " ".join(capsys.readouterr().out.split())


def test_ep_overlap_pairs_only_the_steady_1f1b_passes():
    """megatron-core's combined 1F1B hides the all-to-all only in paired passes (compose.unpaired_a2a; the pass
    counts against the schedule in tests/test_unpaired_a2a.py): every overlap-on B300 cell of the EFA sweeps (PP8 /
    PP4 VPP2, m 16: 23 / 11 of 32 chunk passes unpaired on rank 0) is nearer its measured time with the term than
    with the overlap hiding every pass (docs/cloud.md)."""
    import math

    from bench.ab_efa import predicted_step, without_unpaired

    cells = [r for r in ab_rows() if r["a2a_overlap"] == "on" and r["dispatcher"] == "alltoall"
             and r["cluster"] == "aws-p6-b300"]
    assert len(cells) == 3
    for r in cells:
        meas = float(r["iter_s"])
        assert abs(math.log(predicted_step(r) / meas)) < abs(math.log(without_unpaired(r) / meas)), r["group"]


def test_ab_efa_flag_columns_refuse_a_misspelt_value():
    """bench/ab_efa.py's true/false columns (tp_comm_overlap, cuda_graphs): a value other than true, false or empty
    stops with the CSV, the row and the column named (a misspelt 'false' was read as the stack's default before)."""
    from bench.ab_efa import _flag

    r = ab_rows()[0]
    assert _flag(r, "tp_comm_overlap") is False and _flag(dict(r, tp_comm_overlap=""), "tp_comm_overlap") is None
    with pytest.raises(SystemExit, match="ab_efa.csv: row .*'tp_comm_overlap' = 'ture'"):
        _flag(dict(r, tp_comm_overlap="ture"), "tp_comm_overlap")
