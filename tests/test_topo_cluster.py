"""Cluster schema, presets, load_cluster and `topoplan topology show`."""

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.errors import InputError
from topologies.cluster import cluster_from_dict
from topologies.loader import load_cluster


def _doc(**over):
    doc = {
        "name": "t", "gpu": "gb300",
        "nodes": [{"name": "r1-t[01-18]", "gpus": 4}, {"name": "r2-t[01-18]", "gpus": 4}],
        "domains": [{"name": "r1", "nodes": "r1-t[01-18]"}, {"name": "r2", "nodes": "r2-t[01-18]"}],
    }
    doc.update(over)
    return doc


def test_basic_nvl72_file():
    c = cluster_from_dict(_doc(), "c.yaml")
    assert c.num_gpus == 144 and c.domain_sizes() == [72, 72]
    g = c.gpus()
    assert [x.index for x in g] == list(range(144))
    assert g[0] == (0, "r1-t01", 0, 0) and g[4] == (4, "r1-t02", 0, 0) and g[72] == (72, "r2-t01", 0, 1)


def test_health_excludes_and_domain_sizes():
    c = cluster_from_dict(_doc(health={"failed_trays": "r1-t[17-18]", "failed_gpus": ["r2-t03:1"]}), "c.yaml")
    assert c.domain_sizes() == [64, 71]
    assert c.num_gpus == 135
    assert ("r2-t03", 1) not in {(x.node, x.local) for x in c.gpus()}
    assert c.node_healthy_gpus("r1-t17") == 0 and c.node_healthy_gpus("r2-t03") == 3


def test_spare_trays_are_left_out_like_failed_trays_and_round_trip():
    """spare_trays and failed_trays leave the same GPUs out of planning (domain sizes, gpus()); the
    YAML dump keeps each list under its own name."""
    spare = cluster_from_dict(_doc(health={"spare_trays": "r1-t[17-18]", "failed_trays": "r2-t01"}), "c.yaml")
    broken = cluster_from_dict(_doc(health={"failed_trays": ["r1-t[17-18]", "r2-t01"]}), "c.yaml")
    assert spare.domain_sizes() == broken.domain_sizes() == [64, 68]
    assert spare.gpus() == broken.gpus()
    assert spare.health.broken_hosts() == {"r2-t01"} and set(spare.health.out_of_plan()) == {
        "r1-t17", "r1-t18", "r2-t01"}
    h = yaml.safe_load(spare.to_yaml())["health"]
    assert h == {"failed_trays": "r2-t01", "spare_trays": "r1-t[17-18]"}
    again = cluster_from_dict(yaml.safe_load(spare.to_yaml()), "again.yaml")
    assert again.health == spare.health and again.gpus() == spare.gpus()


@pytest.mark.parametrize("other", ["failed_trays", "failed_nodes"])
def test_a_tray_both_spare_and_broken_is_refused_naming_both_fields(other):
    with pytest.raises(InputError) as exc:
        cluster_from_dict(_doc(health={other: "r1-t[16-17]", "spare_trays": "r1-t[17-18]"}), "c.yaml")
    msg = str(exc.value)
    assert msg.startswith("c.yaml: ") and "\n" not in msg
    assert "health.spare_trays" in msg and f"health.{other}" in msg and "'r1-t17'" in msg


def test_unknown_spare_tray_is_named():
    with pytest.raises(InputError, match=r"health\.spare_trays: 'r9-t01' is not a node of this cluster"):
        cluster_from_dict(_doc(health={"spare_trays": "r9-t01"}), "c.yaml")


def test_domain_with_no_healthy_gpu_is_dropped():
    c = cluster_from_dict(_doc(health={"failed_nodes": "r1-t[01-18]"}), "c.yaml")
    assert c.domain_sizes() == [72]
    assert c.node_domain("r1-t01") is None and c.node_domain("r2-t01") == 0
    assert {x.domain for x in c.gpus()} == {0}


def test_hgx_default_one_domain_per_node():
    c = cluster_from_dict({"gpu": "H100", "nodes": [{"name": "n[1-3]"}]}, "c.yaml")
    assert c.domain_sizes() == [8, 8, 8] and c.gpu == "h100"


@pytest.mark.parametrize("over,match", [
    ({"gpu": "a100"}, r"c.yaml: field 'gpu': unknown GPU type 'a100'"),
    ({"nodes": []}, r"c.yaml: .*no nodes"),
    ({"nodes": [{"name": "r1-t[01-18]", "gpus": 4}, {"name": "r1-t05", "gpus": 4}]}, r"'r1-t05' is named twice"),
    ({"domains": [{"name": "a", "nodes": "r1-t[01-18]"}, {"name": "b", "nodes": "r1-t18,r2-t[01-18]"}]},
     r"node 'r1-t18' is in two domains"),
    ({"domains": [{"name": "a", "nodes": "r1-t[01-18],r2-t01"}, {"name": "b", "nodes": "r2-t[02-18]"}]},
     r"domain 'a' has 76 GPUs but a gb300 NVLink domain holds at most 72"),
    ({"domains": [{"name": "a", "nodes": "r1-t[01-18]"}]}, r"node 'r2-t01' is in no domain"),
    ({"domains": [{"name": "a", "nodes": "r1-t[01-18]"}, {"name": "b", "nodes": "r3-t01"}]}, r"'r3-t01' is not in 'nodes'"),
    ({"health": {"failed_gpus": ["r1-t01:4"]}}, r"health.failed_gpus"),
    ({"health": {"failed_nodes": "zz1"}}, r"health.failed_nodes: 'zz1'"),
    ({"health": {"failed_nodes": "r[1-2]-t[01-18]"}}, r"every GPU is marked failed"),
    ({"nodes": [{"name": "r1-t[01-", "gpus": 4}]}, r"nodes\[0\].name"),
    ({"bogus": 1}, r"field 'bogus': unknown field"),
    ({"tiers": [{"name": "leaf", "gbps_per_gpu": -1, "latency_us": 1}]}, r"field 'tiers.0.gbps_per_gpu'"),
])
def test_rejects_inconsistent_files(over, match):
    with pytest.raises(InputError, match=match) as ei:
        cluster_from_dict(_doc(**over), "c.yaml")
    assert "\n" not in str(ei.value)


def test_hgx_node_larger_than_domain():
    with pytest.raises(InputError, match=r"nodes\[0\].gpus: 16 GPUs"):
        cluster_from_dict({"gpu": "h100", "nodes": [{"name": "n1", "gpus": 16}]}, "c.yaml")


# ---- presets -------------------------------------------------------------------------------
def test_gb300_288_is_four_racks():
    c = load_cluster("gb300-nvl72", gpus=288)
    assert c.num_gpus == 288 and c.domain_sizes() == [72] * 4
    hosts = c.hosts()
    assert hosts[0] == "gb300-r01-t01" and hosts[-1] == "gb300-r04-t18" and len(hosts) == 72


def test_usable_per_rack_and_partial_rack():
    c = load_cluster("gb200-nvl72", gpus=256, usable_per_domain=64)
    assert c.domain_sizes() == [64] * 4
    # the spares are healthy trays held back (spare_trays), not broken ones (failed_trays)
    assert c.health.spare_trays == [f"gb200-r{r:02d}-t{t}" for r in range(1, 5) for t in (17, 18)]
    assert c.health.failed_trays == [] and c.num_gpus == 256
    c = load_cluster("gb200-nvl72", gpus=256)
    assert c.domain_sizes() == [72, 72, 72, 40]
    c = load_cluster("gb200-nvl72", gpus=100, usable_per_domain=64)
    assert c.domain_sizes() == [64, 36]


@pytest.mark.parametrize("name,gpu,host,nic", [
    ("dgx-h100", "h100", "h100-n0001", 400), ("dgx-h200", "h200", "h200-n0001", 400),
    ("h800", "h800", "h800-n0001", 400), ("dgx-b200", "b200", "b200-n0001", 400),
    ("dgx-b300", "b300", "b300-n0001", 800), ("gb200-nvl72", "gb200", "gb200-r01-t01", 400),
    ("gb300-nvl72", "gb300", "gb300-r01-t01", 800),
])
def test_presets(name, gpu, host, nic):
    c = load_cluster(name, gpus=576)
    assert c.gpu == gpu and c.hosts()[0] == host and c.num_gpus == 576
    t = c.fabric_tiers
    assert t[0].gbps_per_gpu == nic and t[0].oversubscription == 1.0
    assert t[0].unit_gpus == (576 if name in ("dgx-b300", "gb200-nvl72", "gb300-nvl72") else 256)
    assert sum(c.domain_sizes()) == 576


def test_preset_oversubscription_above_su():
    c = load_cluster("dgx-h100", gpus=1024, oversubscription=7)
    assert [t.oversubscription for t in c.fabric_tiers] == [1.0, 7.0, 1.0]


@pytest.mark.parametrize("kw,match", [
    ({"gpus": 100}, r"--gpus 100: dgx-h100 is sized in whole 8-GPU nodes; use 96 or 104"),
    ({"gpus": 0}, r"--gpus 0"),
    ({"usable_per_domain": 4}, r"--usable-per-rack"),
])
def test_preset_bad_sizes(kw, match):
    with pytest.raises(InputError, match=match):
        load_cluster("dgx-h100", **kw)


def test_nvl72_bad_usable():
    with pytest.raises(InputError, match="multiple of 4"):
        load_cluster("gb300-nvl72", gpus=144, usable_per_domain=70)
    with pytest.raises(InputError, match="whole 4-GPU trays; use 140 or 144"):
        load_cluster("gb300-nvl72", gpus=142)


def test_unknown_preset():
    with pytest.raises(InputError, match="unknown cluster 'gb400'.*gb300-nvl72"):
        load_cluster("gb400")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["gb200-nvl72", "gb300-nvl72"]), st.integers(1, 150), st.integers(1, 18))
def test_nvl72_sizes_sum(preset, trays, usable_trays):
    c = load_cluster(preset, gpus=4 * trays, usable_per_domain=4 * usable_trays)
    sizes = c.domain_sizes()
    assert sum(sizes) == c.num_gpus == len(c.gpus()) == 4 * trays
    assert all(s <= 4 * usable_trays for s in sizes) and all(s == 4 * usable_trays for s in sizes[:-1])
    # canonical order: domain indices non-decreasing, indices consecutive
    doms = [g.domain for g in c.gpus()]
    assert doms == sorted(doms)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 8)), min_size=1, max_size=12))
def test_domain_sizes_sum_to_healthy(nodes):
    # hgx nodes with g GPUs, f of them failed (f may exceed g: then none fail beyond g)
    doc = {"gpu": "h100", "nodes": [{"name": f"n{i}", "gpus": g} for i, (g, _) in enumerate(nodes)],
           "health": {"failed_gpus": [f"n{i}:{j}" for i, (g, f) in enumerate(nodes) for j in range(min(f, g))]}}
    healthy = sum(max(g - f, 0) for g, f in nodes)
    if healthy == 0:
        with pytest.raises(InputError):
            cluster_from_dict(doc, "x")
        return
    c = cluster_from_dict(doc, "x")
    assert sum(c.domain_sizes()) == c.num_gpus == healthy
    assert c.domain_sizes() == [g - f for g, f in nodes if g - f > 0]


# ---- files and load_cluster ---------------------------------------------------------------
def test_yaml_round_trip(tmp_path):
    c = load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    p = tmp_path / "c.yaml"
    p.write_text(c.to_yaml())
    d = load_cluster(str(p))
    assert d.gpus() == c.gpus() and d.domain_sizes() == c.domain_sizes()
    assert d.to_yaml() == c.to_yaml()


def test_file_cut_to_gpus(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(load_cluster("dgx-h100", gpus=64).to_yaml())
    c = load_cluster(str(p), gpus=16)
    assert c.num_gpus == 16 and c.hosts() == ["h100-n0001", "h100-n0002"]
    with pytest.raises(InputError, match="whole nodes"):
        load_cluster(str(p), gpus=12)


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("gpu: h100\nnodes: [ {name: a\n")
    with pytest.raises(InputError, match=r"bad.yaml: line \d+ column \d+"):
        load_cluster(str(p))
    p.write_text("")
    with pytest.raises(InputError, match="empty file"):
        load_cluster(str(p))
    with pytest.raises(InputError, match="no such file"):
        load_cluster(str(tmp_path / "missing.yaml"))


# ---- CLI ------------------------------------------------------------------------------------
def test_cli_show_json(capsys):
    assert main(["topology", "show", "gb300-nvl72", "--gpus", "288", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu"] == "gb300" and doc["num_gpus"] == 288 and doc["nvlink_domains"] == [72, 72, 72, 72]
    assert doc["nodes"][0] == {"name": "gb300-r01-t01", "domain": 0, "gpus": 4}
    assert doc["nodes"][-1] == {"name": "gb300-r04-t18", "domain": 3, "gpus": 4}
    assert [t["name"] for t in doc["tiers"]] == ["leaf", "spine", "core"]


def test_cli_show_counts_spare_and_failed_trays(capsys, tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(_doc(health={"spare_trays": "r1-t[17-18]", "failed_trays": "r2-t01"})))
    assert main(["topology", "show", str(f), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["health_counts"] == {"failed_nodes": 0, "failed_trays": 1, "spare_trays": 2, "failed_gpus": 0}
    assert doc["health"]["spare_trays"] == ["r1-t17", "r1-t18"] and doc["num_gpus"] == 144 - 12
    assert main(["topology", "show", str(f)]) == 0
    assert "0 failed nodes, 1 failed trays, 2 spare trays" in " ".join(capsys.readouterr().out.split())
    assert main(["topology", "show", "gb200-nvl72", "--gpus", "128", "--usable-per-rack", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["health_counts"]["spare_trays"] == 4


def test_cli_show_yaml_and_table(capsys):
    assert main(["topology", "show", "dgx-h100", "--gpus", "16", "--yaml"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["gpu"] == "h100" and doc["nodes"] == [{"name": "h100-n[0001-0002]", "gpus": 8}]
    assert main(["topology", "show", "h800", "--gpus", "16"]) == 0
    assert "16 healthy H800" in capsys.readouterr().out
    assert main(["topology", "list", "--json"]) == 0
    presets = {p["name"] for p in json.loads(capsys.readouterr().out)["presets"]}
    assert len(presets) == 20 and {"dgx-h100", "gb300-nvl72", "aws-p5", "oci-b200"} <= presets   # 7 DGX + 13 cloud


@pytest.mark.parametrize("args,match", [
    (["topology", "show", "nope"], "unknown cluster 'nope'"),
    (["topology", "show", "dgx-h100", "--gpus", "7"], "--gpus 7"),
    (["topology", "show", "missing.yaml"], "missing.yaml: no such file"),
])
def test_cli_errors_one_line(capsys, args, match):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and match in err and err.count("\n") == 1


# ----- issue 11 item 5: one meaning of --cluster/--gpus/--usable-per-rack ---------------------------

@pytest.mark.parametrize("gpus,racks", [(256, 4), (288, 4), (8, 1), (72, 1), (76, 2), (1024, 15)])
def test_nvl72_job_is_whole_racks(gpus, racks):
    from topologies.loader import load_job

    job = load_job("gb300-nvl72", gpus)
    assert job.gpus == gpus and job.per_domain is None
    assert job.cluster.domain_sizes() == [72] * racks          # ceil(N / 72) whole, healthy racks
    assert job.racks_gpus == 72 * racks >= gpus


def test_usable_per_rack_fixes_the_gpus_per_rack():
    from topologies.loader import load_job

    job = load_job("gb300-nvl72", 256, usable_per_domain=64)
    assert job.per_domain == 64 and job.gpus == 256
    assert job.cluster.domain_sizes() == [64] * 4
    assert len(job.cluster.health.spare_trays) == 8           # two spare trays per rack keep their ports
    assert not job.cluster.health.failed_trays
    # the same cluster load_cluster builds for these arguments
    assert job.cluster == load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)


def test_hgx_presets_and_files_are_unchanged_by_jobs(tmp_path):
    from topologies.loader import load_job

    for name, n in (("dgx-h100", 64), ("dgx-b200", 16), ("h800", 2048)):
        job = load_job(name, n)
        assert job.cluster == load_cluster(name, gpus=n) and job.gpus == n and job.per_domain is None
        assert job.cluster.domain_sizes() == [8] * (n // 8)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_doc()))
    job = load_job(str(path), 68)
    assert job.cluster.num_gpus == job.gpus == 68          # a file is cut to whole nodes, as it was


@pytest.mark.parametrize("gpus,match", [(254, "whole 4-GPU trays"), (0, "positive")])
def test_nvl72_job_bad_sizes(gpus, match):
    from topologies.loader import load_job

    with pytest.raises(InputError, match=match):
        load_job("gb300-nvl72", gpus)


def test_gpd_options_offer_the_even_split():
    from planner.search.plan import even_per_domain, gpd_options
    from topologies.loader import load_job

    assert gpd_options(load_job("gb300-nvl72", 256)) == [None, 64]
    assert even_per_domain([72] * 3, 200, 4) == 68            # ceil(200/3) = 67 -> 17 trays
    assert 68 in gpd_options(load_job("gb300-nvl72", 200))
    assert gpd_options(load_job("gb300-nvl72", 256, usable_per_domain=64)) == [None]
    assert gpd_options(load_job("dgx-h100", 64)) == [None]   # 8-GPU domains: nothing to choose


def test_topology_show_says_what_the_racks_hold_and_the_job_uses(capsys):
    assert main(["topology", "show", "gb300-nvl72", "--gpus", "256", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["num_gpus"], doc["racks_gpus"], doc["job_gpus"]) == (288, 288, 256)
    assert doc["nvlink_domains"] == [72] * 4 and doc["gpus_per_domain_options"] == [None, 64]
    assert main(["topology", "show", "gb300-nvl72", "--gpus", "256", "--usable-per-rack", "64"]) == 0
    out = capsys.readouterr().out
    assert "hold 256 GPUs; the job uses 256" in out and "64 GPUs per NVLink domain" in " ".join(out.split())


def test_validate_usable_per_rack_column_and_option():
    # a CSV row's usable_per_rack (or validate --usable-per-rack) builds load_job's cluster for it
    from planner.cost.validate import row_case
    from topologies.loader import load_job

    row = {"id": "r", "model": "deepseek-v3", "gpu": "GB300", "num_gpus": "256", "precision": "mxfp8",
           "seq_len": "4096", "gbs": "4096", "mbs": "1", "tp": "1", "pp": "2", "vpp": "8", "ep": "32"}
    assert row_case(dict(row)).cluster.domain_sizes() == [64] * 4                # inner groups whole
    fixed = row_case(dict(row, usable_per_rack="72")).cluster
    assert fixed.domain_sizes() == [72, 72, 72, 40]
    assert fixed == load_job("gb300-nvl72", 256, usable_per_domain=72).cluster
    assert row_case(dict(row), usable_per_rack=72).cluster == fixed
    assert row_case(dict(row, usable_per_rack="64"), usable_per_rack=72).cluster.domain_sizes() == [64] * 4
