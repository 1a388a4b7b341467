"""topoplan topology calibrate: nccl-tests and DeepEP output read as the programs print it, the fabric fit,
and the cluster file that carries the fitted figures into Fabric and plans.

Fixtures (tests/data/nccl/README.md): measured figures of tests/data/reference/hardware.md s2.2/s2.3
(stas00/ml-engineering nccl-tests runs; deepseek-ai/DeepEP docs/legacy.md)
written in nccl-tests' and DeepEP's exact print formats. Oracles: hardware.md's figures (what the parser
must read back), the printf formats quoted below from nccl-tests' source, hand calculations of the
calibrated Fabric, and a known ("truth") calibration that synthetic runs are generated from and the fit
must recover.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest

from planner.cli import main
from topologies.calibrate import TARGET, fit_fabric, observations
from topologies.cluster import cluster_from_dict
from topologies.collectives import GroupShape, fabric_for, shape_of
from topologies.errors import InputError
from topologies.importers.deepep import parse_deepep
from topologies.importers.nccl_tests import parse_nccl_tests, read_nccl_tests
from topologies.loader import load_cluster

DATA = Path(__file__).parent / "data" / "nccl"
sys.path.insert(0, str(DATA))
from nccl_format import get_float_str, nccl_tests_output  # noqa: E402

SIZES = [32768, 1048576, 16777216, 134217728, 1073741824, 17179869184]
# hardware.md s2.2: all-reduce busbw (GB/s) of the two nccl-tests runs the fixtures hold
H200_BUSBW = [3.20, 72.45, 242.45, 411.21, 464.00, 480.70]
B200_BUSBW = [0.65, 12.47, 71.80, 260.50, 365.99, 376.71]


# ---- the nccl-tests parser ------------------------------------------------------------------------

def test_reads_hardware_md_figures_back_from_the_new_format():
    (run,) = read_nccl_tests(DATA / "h200x8_all_reduce_perf.txt")
    assert run.test == "all_reduce" and run.kind == "all_reduce"
    assert run.nccl_version == "2.30.7" and run.tests_version == "2.17.6"   # nccl-library=23007
    assert (run.nthreads, run.ngpus) == (1, 1)
    assert run.hosts == ["h200-node01"] and [r[2] for r in run.ranks] == list(range(8))
    assert {r[3] for r in run.ranks} == {"NVIDIA H200"}
    assert [r.size for r in run.rows] == SIZES
    assert [r.busbw for r in run.rows] == H200_BUSBW
    assert [r.wrong for r in run.rows] == [0] * 6
    # algbw = size / time, busbw = algbw * 2(n-1)/n (nccl-tests src/all_reduce.cu AllReduceGetBw)
    for r in run.rows:
        assert r.algbw == pytest.approx(r.size / (r.time_us * 1e-6) / 1e9, rel=2e-3)
        assert r.busbw == pytest.approx(r.algbw * 2 * 7 / 8, abs=0.011)


def test_reads_the_old_format_under_mpirun_prefixes():
    """Before Feb 2025 (nccl-tests b4300cc) the device is '[0x%02x]', the time '%7.0f/%7.1f/%7.2f' and
    the bandwidths '%6.2f'; mpirun --tag-output puts '[1,0]<stdout>:' before every line."""
    (run,) = read_nccl_tests(DATA / "b200x32_all_reduce_perf.txt")
    assert run.test == "all_reduce"                     # from the file name: no program line before 2.17
    assert run.nccl_version is None
    assert run.hosts == [f"b200-{i:02d}" for i in range(1, 5)] and len(run.ranks) == 32
    assert [r.busbw for r in run.rows] == B200_BUSBW
    assert run.rows[-1].time_us == 88360.0             # "%7.0f" above 10 ms


def test_tells_the_program_by_busbw_over_algbw_when_nothing_names_it(tmp_path):
    text = (DATA / "b200x32_all_reduce_perf.txt").read_text()
    (tmp_path / "run.txt").write_text(text)
    (run,) = read_nccl_tests(tmp_path / "run.txt")
    assert run.test == "all_reduce"                    # 2(n-1)/n = 1.9375 for 32 ranks
    ranks = [("h1", d, "NVIDIA H100 80GB HBM3") for d in range(8)]
    rows = [(1 << 20, 40.0), (1 << 24, 200.0)]
    for test in ("sendrecv", "reduce_scatter"):
        (tmp_path / "x.txt").write_text(nccl_tests_output(test, ranks, rows, new=False))
        assert read_nccl_tests(tmp_path / "x.txt")[0].test == test
    (tmp_path / "y.txt").write_text(nccl_tests_output("alltoall", ranks, rows, new=False))
    with pytest.raises(InputError, match=r"y.txt:1: cannot tell which nccl-tests program.*all_gather or alltoall"):
        read_nccl_tests(tmp_path / "y.txt")


def test_getfloatstr_widths_and_the_row_printf():
    """util.cu: getFloatStr tries %.2f, %.1f, %.0f, then %.1e to fit the width; the row is
    "%12li  %12li  %8s  %6s  %6s" then "  %7s  %6s  %6s  %6g" out-of-place and in-place."""
    assert get_float_str(62543.7, 7) == "62543.7"
    assert get_float_str(1234567.0, 7) == "1234567"
    assert get_float_str(12345678.0, 7) == "1.2e+07"
    assert get_float_str(1234.5, 6) == "1234.5"
    line = ("%12d  %12d  %8s  %6s  %6s" % (4, 1, "float", "sum", "%6i" % -1)
            + "  %7s  %6s  %6s  %6g" % ("1.2e+07", "0.00", "0.00", 0)
            + "  %7s  %6s  %6s  %6g" % ("1.1e+07", "0.00", "0.00", 0))
    text = "#  Rank  0 Group  0 Pid   1234 on      node1 device  0 [0000:18:00] NVIDIA H100\n" \
           "#  Rank  1 Group  0 Pid   1235 on      node1 device  1 [0000:2a:00] NVIDIA H100\n" + line + "\n"
    (run,) = parse_nccl_tests(text, "all_reduce_perf.out")
    assert run.rows[0].time_us == 1.2e7 and run.rows[0].time_us_inplace == 1.1e7


def test_several_runs_in_one_file_and_nccl_info_lines():
    ranks = [("h1", d, "NVIDIA H100 80GB HBM3") for d in range(8)]
    a = nccl_tests_output("all_gather", ranks, [(1 << 20, 30.0)])
    b = nccl_tests_output("alltoall", ranks, [(1 << 20, 35.0), (1 << 22, 60.0)])
    info = "h1:123:123 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
    runs = parse_nccl_tests(info + a + info + b, "mixed.log")
    assert [r.test for r in runs] == ["all_gather", "alltoall"]
    assert [len(r.rows) for r in runs] == [1, 2]
    assert [r.kind for r in runs] == ["all_gather", "all_to_all"]


@pytest.mark.parametrize("mutate, match", [
    (lambda t: t.replace("  242.45  ", "  24x.45  ", 1), r"bad.txt:20: busbw '24x.45' is not a number"),
    (lambda t: "\n".join(" ".join(ln.split()[:9]) if ln.startswith("    16777216") else ln for ln in t.splitlines()),
     r"bad.txt:20: a result row has 9 columns, nccl-tests prints 13"),
    (lambda t: "\n".join(ln for ln in t.splitlines() if "Rank" not in ln), r"bad.txt:1: the run has no '#  Rank"),
    (lambda t: "\n".join(ln for ln in t.splitlines() if not ln.startswith(" ")),
     r"bad.txt: no nccl-tests result rows"),
])
def test_unreadable_nccl_tests_output_is_one_line_naming_file_and_line(tmp_path, mutate, match):
    text = (DATA / "h200x8_all_reduce_perf.txt").read_text()
    (tmp_path / "bad.txt").write_text(mutate(text))
    with pytest.raises(InputError, match=match):
        read_nccl_tests(tmp_path / "bad.txt")


# ---- the DeepEP parser ----------------------------------------------------------------------------

def test_deepep_lines_in_every_release_format():
    """The f-strings of DeepEP tests/legacy/test_internode.py (notify + kernel time) and of the first
    release (tests/test_internode.py, ebfe47e: no times), and of test_intranode.py."""
    text = "\n".join([
        "[config] num_tokens=4096, hidden=7168, num_topk_groups=4, num_topk=8",
        "[tuning] SMs 24, NVL chunk 4, RDMA chunk 4: 31 + 2001 us, 40.01 GB/s (RDMA), 130.00 GB/s (NVL) ",
        "[tuning] Best dispatch (FP8): SMs 24, NVL chunk 8, RDMA chunk 16: 35 + 1887 us, 58.00 GB/s (RDMA), "
        "116.62 GB/s (NVL)",
        "[tuning] Best dispatch (BF16): SMs 24, NVL chunk 8, RDMA chunk 16: 44.10 GB/s (RDMA), 144.08 GB/s (NVL)",
        "[tuning] Best combine: SMs 24, NVL chunk 1, RDMA chunk 12, 12.34 + 3723.29 us, 57.00 GB/s (RDMA), "
        "114.61 GB/s (NVL)",
        "[config] num_tokens=4096, hidden=7168, num_topk=8",
        "[tuning] Best dispatch (FP8): SMs 24, NVL chunk 8, 153.00 GB/s (NVL), t: 1047.77 us",
        "[tuning] Best combine: SMs 24, NVL chunk 8: 158.00 GB/s (NVL)",
    ])
    got = parse_deepep(text, "ep.log")
    assert [(r.phase, r.dtype, r.internode) for r in got] == [
        ("dispatch", "FP8", True), ("dispatch", "BF16", True), ("combine", "BF16", True),
        ("dispatch", "FP8", False), ("combine", "BF16", False)]
    assert [r.rdma_gbps for r in got] == [58.0, 44.10, 57.0, None, None]
    assert [r.nvl_gbps for r in got] == [116.62, 144.08, 114.61, 153.0, 158.0]
    assert [r.time_us for r in got] == [1887.0, None, 3723.29, 1047.77, None]
    assert got[0].topk_groups == 4 and got[3].topk_groups is None
    assert got[0].element_bytes == 1 + 4 / 128 and got[1].element_bytes == 2.0
    with pytest.raises(InputError, match=r"x.log:2: a '\[tuning\] Best ...' line in a form"):
        parse_deepep("[config] num_tokens=1, hidden=2, num_topk=1\n[tuning] Best dispatch (FP8): fast", "x.log")
    with pytest.raises(InputError, match=r"x.log:1: no '\[config\]"):
        parse_deepep("[tuning] Best combine: SMs 24, NVL chunk 8: 158.00 GB/s (NVL)", "x.log")


# ---- Fabric reads a calibration -------------------------------------------------------------------

def _hgx(gpu: str, nodes: int, calibration: dict | None = None):
    data = {"name": f"{gpu}x{nodes}", "gpu": gpu, "nodes": [{"name": f"n{i:02d}", "gpus": 8} for i in range(nodes)],
            "tiers": [{"name": "leaf", "gbps_per_gpu": 400, "latency_us": 0.6}]}
    if calibration:
        data["calibration"] = calibration
    return cluster_from_dict(data, "test")


def test_fabric_uses_the_calibrated_figures_by_hand():
    us = 1e-6
    c = _hgx("h100", 2, {"nvlink": {"busbw_gbps": 200, "base_us": 10, "pipe_us": 0},
                         "tiers": [{"tier": "leaf", "busbw_gbps": 30, "step_us": 20, "pipe_us": 0}]})
    fab = fabric_for(c)
    S = 2**30
    # all-gather in one domain: base + (n-1) ring steps of 0.47 us + (n-1)/n S / B (no pipeline fill)
    assert fab.all_gather(GroupShape.local(8), S) == pytest.approx(10 * us + 7 * 0.47 * us + 7 / 8 * S / 200e9)
    assert fab.net_bw(0) == 30e9 and fab.net_bw(0, eff=0.9) == pytest.approx(0.9 * 50e9)   # DeepEP not fitted
    # across 2 domains: net base 14 us + 7 nvl steps + 1 phase x 1 tree step x 20 us, then x_out = (k-1)/k S/g / B
    shape = shape_of(c, range(16))
    x_out = 0.5 * (S / 8) / 30e9
    t = 14 * us + 7 * 0.47 * us + 20 * us + x_out
    assert fab.all_gather(shape, S) == pytest.approx(max(t, fab.all_gather(GroupShape.local(16), S)) + 20 * us)
    assert fab.p2p(S, 0) == pytest.approx(5 * us + 20 * us + S / 30e9)
    # uncalibrated: the catalog figures
    plain = fabric_for(_hgx("h100", 2))
    assert plain.net_bw(0) == pytest.approx(0.74 * 50e9) and plain.b_ring == pytest.approx(370e9)


def test_the_low_latency_branch_is_the_faster_of_two_lines():
    c = _hgx("h100", 1, {"nvlink": {"ll_base_us": 5, "ll_busbw_gbps": 20}})
    fab, plain = fabric_for(c), fabric_for(_hgx("h100", 1))
    shape = GroupShape.local(8)
    for S in (1024, 2**16, 2**20, 2**26, 2**30):
        ll = 5e-6 + 2 * 7 / 8 * S / 20e9
        assert fab.all_reduce(shape, S) == pytest.approx(min(plain.all_reduce(shape, S), ll))
    assert fab.all_reduce(shape, 1024) < plain.all_reduce(shape, 1024)     # small: the LL line wins
    assert fab.all_reduce(shape, 2**30) == plain.all_reduce(shape, 2**30)  # large: the main line


def test_calibration_tier_names_are_checked():
    with pytest.raises(InputError, match=r"calibration\.tiers\[0\]\.tier: 'spine' is not a tier"):
        _hgx("h100", 2, {"tiers": [{"tier": "spine", "busbw_gbps": 30}]})
    with pytest.raises(InputError, match=r"calibration.*busbw_gbps"):
        _hgx("h100", 2, {"nvlink": {"busbw_gbps": -1}})


# ---- the fit --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cluster, results, busbw", [
    ("h200-1node.yaml", "h200x8_all_reduce_perf.txt", H200_BUSBW),
    ("b200-4nodes.yaml", "b200x32_all_reduce_perf.txt", B200_BUSBW),
])
def test_fit_reproduces_every_measured_row_within_target(cluster, results, busbw):
    c = load_cluster(str(DATA / cluster))
    obs, notes = observations(c, [str(DATA / results)])
    assert notes == []
    assert [round(ob.gbps(ob.seconds), 2) for ob in obs] == pytest.approx(busbw, abs=0.011)
    fit = fit_fabric(c, obs)
    before, after = fit.errors("before"), fit.errors("after")
    assert max(map(abs, before)) > TARGET          # the catalog figures miss some row by more than 10%
    assert max(map(abs, after)) <= TARGET          # the fitted ones reproduce every row
    assert abs(fit.worst_error) == max(map(abs, after))


def test_fit_recovers_a_known_fabric_from_all_five_programs(tmp_path):
    """Runs generated from a known calibration (2 x 8 H100) in nccl-tests' format, every program on one
    node and on both: the fit must give back the figures the rows depend on and reproduce every row."""
    truth = {"nvlink": {"busbw_gbps": 300.0, "nvls_busbw_gbps": 420.0, "base_us": 12.0, "pipe_us": 3.0},
             "tiers": [{"tier": "leaf", "busbw_gbps": 30.0, "step_us": 25.0, "pipe_us": 20.0}]}
    true_c = _hgx("h100", 2, truth)
    fab = fabric_for(true_c)
    c = _hgx("h100", 2)
    files = []
    sizes = [2**k for k in range(16, 34, 2)]
    for test in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv"):
        for nodes in (1, 2):
            ranks = [(f"n{h:02d}", d, "NVIDIA H100 80GB HBM3") for h in range(nodes) for d in range(8)]
            shape = shape_of(true_c, range(8 * nodes))
            kind = {"alltoall": "all_to_all", "sendrecv": "p2p"}.get(test, test)
            if kind == "p2p":
                rows = [(s, fab.p2p(s, 0 if nodes > 1 else -1) * 1e6) for s in sizes]
            else:
                rows = [(s, fab.time(kind, shape, s) * 1e6) for s in sizes]
            path = tmp_path / f"{test}_{nodes}n.txt"
            path.write_text(nccl_tests_output(test, ranks, rows))
            files.append(str(path))
    obs, notes = observations(c, files)
    assert len(obs) == 10 * len(sizes) and not notes
    fit = fit_fabric(c, obs)
    assert max(abs(e) for e in fit.errors()) < 0.01       # only the printed digits differ
    got = {name: after for name, _, after in fit.parameters}
    assert got["nvlink.busbw_gbps"] == pytest.approx(300, rel=0.02)
    assert got["nvlink.nvls_busbw_gbps"] == pytest.approx(420, rel=0.02)
    assert got["leaf.busbw_gbps"] == pytest.approx(30, rel=0.02)
    assert got["leaf.step_us"] == pytest.approx(25, rel=0.1)


def test_fit_holds_a_noisy_sweep_with_a_low_latency_protocol(tmp_path):
    """nccl-tests' usual sweep (-b 8 -e 8G -f 2) on 1 and 4 nodes, generated from a truth that has a
    low-latency line on NVLink and on the network, with +-3% noise on every time: every row within the
    target, the bandwidths and the LL lines recovered."""
    import random

    truth = {"nvlink": {"busbw_gbps": 340.0, "nvls_busbw_gbps": 470.0, "base_us": 15.0, "pipe_us": 3.0,
                        "ll_base_us": 12.0, "ll_busbw_gbps": 60.0},
             "tiers": [{"tier": "leaf", "busbw_gbps": 36.0, "step_us": 40.0, "pipe_us": 10.0,
                        "ll_base_us": 30.0, "ll_busbw_gbps": 8.0}]}
    true_c = _hgx("h100", 4, truth)
    fab = fabric_for(true_c)
    rng = random.Random(1)
    files = []
    for test in ("all_reduce", "all_gather", "alltoall", "sendrecv"):
        kind = {"alltoall": "all_to_all", "sendrecv": "p2p"}.get(test, test)
        for nodes in (1, 4):
            shape = shape_of(true_c, range(8 * nodes))
            rows = []
            for k in range(3, 34):
                s = 2**k
                if test in ("all_gather", "alltoall") and s < 16 * 8 * nodes:
                    continue        # nccl-tests prints size 0 there: fewer bytes than ranks x 16
                t = fab.p2p(s, 0 if nodes > 1 else -1) if kind == "p2p" else fab.time(kind, shape, s)
                rows.append((s, t * 1e6 * (1 + rng.uniform(-0.03, 0.03))))
            ranks = [(f"n{h:02d}", d, "NVIDIA H100 80GB HBM3") for h in range(nodes) for d in range(8)]
            path = tmp_path / f"{test}_{nodes}n.txt"
            path.write_text(nccl_tests_output(test, ranks, rows))
            files.append(str(path))
    obs, _ = observations(_hgx("h100", 4), files)
    fit = fit_fabric(_hgx("h100", 4), obs)
    assert max(abs(e) for e in fit.errors("before")) > 1.0
    assert max(abs(e) for e in fit.errors()) <= 0.05
    got = {name: after for name, _, after in fit.parameters}
    assert got["nvlink.busbw_gbps"] == pytest.approx(340, rel=0.05)
    assert got["leaf.busbw_gbps"] == pytest.approx(36, rel=0.05)
    assert got["leaf.ll_busbw_gbps"] == pytest.approx(8, rel=0.2)
    assert got["nvlink.ll_base_us"] == pytest.approx(12, rel=0.2)


def test_deepep_rows_fit_only_the_deepep_bandwidths():
    c = load_cluster(str(DATA / "h800-8nodes.yaml"))
    specs = [str(DATA / "deepep_h800_intranode.log")] + [
        f"{DATA / f'deepep_h800_internode_ep{ep}.log'}@{ep}" for ep in (16, 32, 64)]
    obs, notes = observations(c, specs)
    assert len(obs) == 8 and any("8 ranks assumed" in n for n in notes)
    assert [ob.shape.domains for ob in obs] == [1, 1, 2, 2, 4, 4, 8, 8]
    fit = fit_fabric(c, obs)
    assert {name for name, _, _ in fit.parameters} == {"nvlink.deepep_gbps", "leaf.deepep_gbps"}
    assert max(abs(e) for e in fit.errors()) < 0.10
    assert fit.worst is None                                 # the target is held on nccl-tests rows


# ---- the command ----------------------------------------------------------------------------------

def test_cli_writes_a_cluster_that_plans_use(tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    src = str(DATA / "b200x32_all_reduce_perf.txt")
    assert main(["topology", "calibrate", str(DATA / "b200-4nodes.yaml"), src, "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["rows"]) == 6 and doc["within_target"] is True
    assert doc["worst"]["source"].startswith(src + ":")
    assert abs(doc["worst"]["after_error"]) == max(abs(r["after_error"]) for r in doc["rows"])
    assert {p["name"] for p in doc["parameters"]} >= {"leaf.busbw_gbps", "leaf.step_us"}
    # the file loads with --cluster and Fabric prices each measured row as the fit did
    c = load_cluster(str(out))
    assert c.calibration is not None and c.calibration.sources == [src]
    fab = fabric_for(c)
    shape = shape_of(c, range(32))
    for row, size, busbw in zip(doc["rows"], SIZES, B200_BUSBW):
        model = size * 2 * 31 / 32 / fab.all_reduce(shape, size) / 1e9
        assert model == pytest.approx(row["after_gbps"], rel=1e-3)
        assert abs(model / busbw - 1) <= TARGET
    # a plan's prediction moves with it: the data-parallel all-reduce is priced on the fitted fabric
    dp = []
    for cl in (str(DATA / "b200-4nodes.yaml"), str(out)):
        assert main(["predict", "--model", "llama3-8b", "--cluster", cl, "--gbs", "256", "--json"]) == 0
        dp.append(json.loads(capsys.readouterr().out)["breakdown"]["dp_comm"])
    assert dp[0] > 0 and dp[1] != pytest.approx(dp[0], rel=1e-3)


def test_cli_table_names_the_worst_row(tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    assert main(["topology", "calibrate", str(DATA / "h200-1node.yaml"),
                 str(DATA / "h200x8_all_reduce_perf.txt"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"worst nccl-tests row: {DATA / 'h200x8_all_reduce_perf.txt'}:" in text
    assert "within the 10% target" in text
    assert "nvlink.nvls_busbw_gbps" in text


@pytest.mark.parametrize("files, match", [
    (["nothing.txt"], r"nothing.txt: cannot read"),
    (["notes.txt"], r"notes.txt:1: neither nccl-tests output"),
    (["deepep_h800_internode_ep32.log"], r"does not print how many ranks ran; give .*@RANKS"),
    (["deepep_h800_internode_ep32.log@12"], r"@12: DeepEP's internode test runs 8 ranks per node"),
    (["h200x8_all_reduce_perf.txt@8"], r"@RANKS is for DeepEP logs"),
    (["mixed_hosts.txt"], r"mixed_hosts.txt:1: host 'elsewhere' ran but is not a node of b200-4nodes"),
])
def test_cli_bad_results_are_one_line_and_write_nothing(tmp_path, capsys, files, match):
    for name in ("h200x8_all_reduce_perf.txt", "deepep_h800_internode_ep32.log"):
        shutil.copy(DATA / name, tmp_path / name)
    (tmp_path / "notes.txt").write_text("the run went fine\n")
    text = (DATA / "b200x32_all_reduce_perf.txt").read_text().replace("b200-04", "elsewhere")
    (tmp_path / "mixed_hosts.txt").write_text(text)
    out = tmp_path / "cal.yaml"
    args = [str(tmp_path / f) for f in files]
    assert main(["topology", "calibrate", str(DATA / "b200-4nodes.yaml"), *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert re.search(match, err), err
    assert not out.exists()


def test_hosts_not_in_the_file_are_placed_in_order_and_said(tmp_path, capsys):
    """A preset's host names are not the run's: the run's hosts go on the first hosts, with a note."""
    out = tmp_path / "cal.yaml"
    assert main(["topology", "calibrate", "dgx-b200", "--gpus", "32", str(DATA / "b200x32_all_reduce_perf.txt"),
                 "-o", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    assert "assumed: " in cap.err and "placed on its first hosts" in cap.err
    assert json.loads(cap.out)["within_target"] is True
    assert math.isfinite(load_cluster(str(out)).calibration.worst_error)
