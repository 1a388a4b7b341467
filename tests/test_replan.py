"""``topoplan replan`` (issue 20 item 1): spare hosts take a failed host's ranks, or a new plan.

Oracles: the healthy plan itself (every rank not on a failed host keeps its host and local GPU),
Megatron's rank groups (``rank_groups``, checked against megatron-core elsewhere) mapped to NVLink
domains by the cluster file's own domain list, and a brute force over every assignment of failed
hosts to spare hosts (the minimal move exists exactly when the matching finds one).
"""

from __future__ import annotations

import io
import itertools
import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from rich.console import Console

import planner
from planner.cli import main
from planner.cli.replan import render
from planner.config import ParallelConfig, Training
from planner.cost.memory import usable_hbm_gib
from planner.cost.placement import make_placement, rank_groups
from planner.launch.replan import failed_hosts, replan
from planner.launch.spares import assign_spares, domain_of_hosts, rank_hosts, relocate
from planner.search.document import load_document
from topologies.cluster import Cluster
from topologies.loader import load_job
from topologies.presets import build_preset


def _job_plan(model: str, cluster: str, gpus: int, gbs: int, precision: str = "bf16", per_rack: int | None = 64):
    training = Training(seq_len=4096, global_batch=gbs, precision=precision)
    res = planner.plan(planner.load_model(model), load_job(cluster, gpus=gpus, usable_per_domain=per_rack),
                       training, top=1)
    return res.to_dict()


@pytest.fixture(scope="module")
def gb200_plan():
    """DeepSeek-V3 on 4 GB200 NVL72 racks used 64 of 72 (2 spare trays a rack)."""
    return _job_plan("deepseek-v3", "gb200-nvl72", 256, 4096, "mxfp8")


def _sites(doc) -> list[tuple[str, int]]:
    c = load_document(doc).cluster
    return rank_hosts(c, doc["plans"][0]["placement"]["rank_to_gpu"])


def _domain_local(doc, axes=("tp", "cp", "ep", "etp"), groups_only=False) -> dict[str, bool]:
    """Axis -> every group of Megatron's rank order on one NVLink domain (by the cluster file's domains);
    ``groups_only``: leave out axes of degree 1."""
    d = load_document(doc)
    e = d.plans[0]
    dom = domain_of_hosts(d.cluster)
    site = [dom[h] for h, _ in _sites(doc)]
    cfg = e.config.parallel_config()
    out = {}
    for ax in axes:
        groups = rank_groups(cfg, e.config.world, ax, e.placement.order)
        if not (groups_only and len(groups[0]) == 1):
            out[ax] = all(len({site[r] for r in g}) == 1 for g in groups)
    return out


# --- the two done-when cases --------------------------------------------------------------

@pytest.mark.slow
def test_one_failed_tray_moves_exactly_its_four_ranks_to_a_spare_tray_of_its_rack(gb200_plan, tmp_path):
    before = _sites(gb200_plan)
    failed = "gb200-r02-t07"
    mine = [r for r, (h, _) in enumerate(before) if h == failed]
    assert len(mine) == 4
    res = replan(gb200_plan, failed)
    assert res.case == "spares"
    assert res.moved_ranks == mine
    (move,) = res.moves
    assert move.host == failed and move.domain == "gb200-r02" and move.spare.startswith("gb200-r02-")
    after = _sites(res.document)
    changed = [r for r in range(len(before)) if before[r] != after[r]]
    assert changed == mine
    assert all(after[r] == (move.spare, before[r][1]) for r in mine)          # local index kept
    new = load_document(res.document)
    assert failed in new.cluster.health.failed_trays and move.spare not in new.cluster.health.spare_trays
    assert new.plans[0].config == load_document(gb200_plan).plans[0].config   # the layout is kept
    assert res.after["tokens_per_s"] == pytest.approx(res.before["tokens_per_s"], rel=1e-6)
    # the CLI writes the files an operator launches with
    out = tmp_path / "out"
    assert main(["replan", str(_save(gb200_plan, tmp_path)), "--failed", failed, "--out", str(out)]) == 0
    hostfile = (out / "hostfile").read_text().split()
    assert hostfile == [h for h, _ in after] and failed not in hostfile
    assert (out / "megatron" / "args.txt").exists() and (out / "slurm" / "hostfile").read_text().split() == hostfile
    assert json.loads((out / "replan.json").read_text())["moved_ranks"] == 4
    compile((out / "resilience" / "inprocess_rank_assignment.py").read_text(), "ra", "exec")


@pytest.mark.slow
def test_three_failed_trays_in_one_rack_give_a_new_plan_that_fits_with_rack_local_groups(gb200_plan):
    failed = ["gb200-r03-t02", "gb200-r03-t05", "gb200-r03-t11"]        # the rack has 2 spares
    res = replan(gb200_plan, ",".join(failed))
    assert res.case == "replan"
    new = load_document(res.document)
    pred = new.plans[0].prediction
    assert pred.fits and pred.memory_gib_per_gpu <= usable_hbm_gib(pred.hbm_gib, new.training)
    assert not set(failed) & {h for h, _ in _sites(res.document)}
    assert all(_domain_local(res.document).values())
    assert all(_domain_local(gb200_plan).values())
    assert res.after["tokens_per_s"] < res.before["tokens_per_s"]      # less hardware, less throughput
    d = res.to_dict()
    assert d["change"]["tokens_per_s"] == pytest.approx(d["after"]["tokens_per_s"] / d["before"]["tokens_per_s"] - 1)
    assert d["experts"]["resharded"] == (new.plans[0].config.ep != 32 or new.plans[0].config.pp != 2)


def _save(doc, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    return p


# --- bad input --------------------------------------------------------------------------------------

def test_unknown_host_is_named_and_exits_2(tmp_path, capsys):
    doc = _job_plan("llama3-8b", "dgx-h100", 8, 64, per_rack=None)
    out = tmp_path / "out"
    assert main(["replan", str(_save(doc, tmp_path)), "--failed", "h100-n0002", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --failed: host 'h100-n0002' is not in the plan's cluster") and not out.exists()
    # (the errors corpus, tests/test_errors_corpus.py, has the other refusals and exit 3 when nothing fits)


def test_failed_hosts_read_a_file_one_host_per_line(tmp_path):
    c = build_preset("gb200-nvl72", gpus=128, usable_per_domain=64)
    f = tmp_path / "failed.txt"
    f.write_text("gb200-r02-t07\n# drained\n\ngb200-r01-t[02-03]\n")
    assert failed_hosts(str(f), c) == ["gb200-r01-t02", "gb200-r01-t03", "gb200-r02-t07"]


# --- properties: random failures on random clusters ------------------------------------------------

def _cluster_nvl72(racks: int, per_rack: int) -> Cluster:
    return build_preset("gb200-nvl72", gpus=racks * per_rack, usable_per_domain=per_rack)


def _cluster_hgx(nodes: int, spare: int) -> Cluster:
    return build_preset("dgx-h100", gpus=8 * (nodes + spare))


@st.composite
def scenarios(draw):
    """(cluster, config, world, placed sites, failed hosts): an NVL72 job on K of 72 per rack (the
    preset's spare trays under health.spare_trays) or an HGX job leaving some nodes idle, a few hosts
    truly broken (failed_trays on NVL72, taken from the spares or the trays in use; failed_nodes on
    HGX) and a few single GPUs broken (so hosts differ in the local indices they run and the spares
    they can take); the layout's inner groups sized to fit a domain."""
    if draw(st.booleans()):
        racks, per_rack = draw(st.integers(1, 3)), draw(st.sampled_from([56, 60, 64, 68]))
        cluster = _cluster_nvl72(racks, per_rack)
        tp = draw(st.sampled_from([1, 2, 4]))
        ep = draw(st.sampled_from([d for d in (1, 2, 4) if per_rack % (tp * d) == 0]))
    else:
        nodes, spare = draw(st.integers(1, 6)), draw(st.integers(0, 3))
        cluster = _cluster_hgx(nodes, spare)
        tp = draw(st.sampled_from([1, 2, 4, 8]))
        ep = draw(st.sampled_from([d for d in (1, 2, 4, 8) if tp * d <= 8]))
    hosts = cluster.hosts()
    gpus = {n.name: n.gpus for n in cluster.nodes}
    broken = draw(st.lists(st.sampled_from(hosts).flatmap(lambda h: st.integers(0, gpus[h] - 1).map(
        lambda i: f"{h}:{i}")), max_size=3, unique=True))
    dead = draw(st.lists(st.sampled_from(hosts), max_size=3, unique=True))
    assume(len(dead) < len(hosts))
    data = cluster.model_dump(mode="json", exclude_none=True)
    data["health"]["failed_gpus"] = broken
    data["health"]["failed_trays" if cluster.gpu_spec.nvlink_domain_max > 8 else "failed_nodes"] = dead
    data["health"]["spare_trays"] = [h for h in cluster.health.spare_trays if h not in dead]
    cluster = Cluster.model_validate(data)
    cfg = ParallelConfig(tp=tp, ep=ep)
    block = tp * ep
    world = (min(cluster.num_gpus, 8 * len(hosts)) // block) * block
    if not draw(st.booleans()) and world > block:      # sometimes leave healthy GPUs idle
        world -= block
    assume(world >= block)
    placement = make_placement(cluster, cfg, world)
    placed = rank_hosts(cluster, placement.rank_to_gpu)
    failed = draw(st.lists(st.sampled_from(hosts), min_size=1, max_size=3, unique=True))
    return cluster, cfg, world, placed, failed


def _brute_force_feasible(cluster: Cluster, placed, failed) -> bool:
    """Is there any assignment of the failed hosts that run ranks to distinct spares that keeps every
    rank's NVLink domain (multi-host domains) or puts a whole single-host domain on one, each spare
    idle, not failed, of the same size and healthy at every local index the failed host runs?"""
    dom = domain_of_hosts(cluster)
    size = {n.name: n.gpus for n in cluster.nodes}
    used = {h for h, _ in placed}
    need = [h for h in dict.fromkeys(h for h, _ in placed) if h in failed]
    local = {h: {l for g, l in placed if g == h} for h in need}
    bad = {tuple(x.rsplit(":", 1)) for x in cluster.health.failed_gpus}
    members = {}
    for h, d in dom.items():
        members.setdefault(d, []).append(h)
    idle = [h for h in cluster.hosts() if h not in used and h not in failed
            and h not in cluster.health.failed_nodes and h not in cluster.health.failed_trays]

    def ok(f, s):
        if size[f] != size[s] or any((s, str(l)) in bad for l in local[f]):
            return False
        single = len(members[dom[f]]) == 1
        return (len(members[dom[s]]) == 1) if single else dom[s] == dom[f]

    return any(all(ok(f, s) for f, s in zip(need, pick)) for pick in itertools.permutations(idle, len(need)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_spares_move_only_the_failed_hosts_ranks_and_keep_groups_domain_local(case):
    cluster, cfg, world, placed, failed = case
    moves, short = assign_spares(cluster, placed, failed)
    assert (not short) == _brute_force_feasible(cluster, placed, failed)   # minimal move exists iff found
    if short:
        return
    new, r2g = relocate(cluster, placed, failed, moves)
    after = rank_hosts(new, r2g)
    assert not {h for h, _ in after} & set(failed)                        # no failed host used
    assert not {h for h, _ in after} & cluster.health.broken_hosts()      # nor a broken tray or node
    assert set(moves.values()) <= (set(cluster.health.spare_trays) | set(cluster.hosts())) - cluster.health.broken_hosts()
    assert set(failed) <= new.health.broken_hosts() and not set(moves.values()) & set(new.health.spare_trays)
    assert cluster.health.broken_hosts() <= new.health.broken_hosts()     # broken stays broken
    assert len(set(r2g)) == world
    for r, ((h0, l0), (h1, l1)) in enumerate(zip(placed, after)):
        if h0 in failed:
            assert (h1, l1) == (moves[h0], l0)
        else:
            assert (h1, l1) == (h0, l0)                                     # only the failed hosts' ranks move
    dom0, dom1 = domain_of_hosts(cluster), domain_of_hosts(new)
    for axis in ("tp", "ep"):
        for g in rank_groups(cfg, world, axis):
            if len({dom0[placed[r][0]] for r in g}) == 1:
                assert len({dom1[after[r][0]] for r in g}) == 1              # domain-local stays domain-local


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rack=st.integers(1, 2), trays=st.lists(st.integers(1, 16), min_size=3, max_size=4, unique=True))
def test_replan_without_spares_fits_uses_no_failed_host_and_stays_domain_local(small_moe_plan, rack, trays):
    failed = [f"gb200-r{rack:02d}-t{t:02d}" for t in trays]
    res = replan(small_moe_plan, failed)
    assert res.case == "replan"
    new = load_document(res.document)
    pred = new.plans[0].prediction
    assert pred.fits and pred.memory_gib_per_gpu <= usable_hbm_gib(pred.hbm_gib, new.training)
    assert not set(failed) & {h for h, _ in _sites(res.document)}
    local_before = {ax for ax, ok in _domain_local(small_moe_plan, groups_only=True).items() if ok}
    local_after = {ax for ax, ok in _domain_local(res.document).items() if ok}
    assert local_before <= local_after or any(n.startswith("warning") for n in res.notes)


@pytest.fixture(scope="module")
def small_moe_plan():
    return _job_plan("qwen3-30b-a3b", "gb200-nvl72", 128, 512)


def test_a_spare_only_one_failed_host_can_use_is_left_to_it():
    """t01 has a bad GPU 3 (its ranks run on GPUs 0-2); spare t04 has a bad GPU 3 too, so only t01 can
    use it. Taking spares first come first served would give t01 the healthy t03 and leave t02 none;
    the matching moves t01 to t04 and t02 to t03 (a brute force over the 2 assignments agrees)."""
    c = Cluster.model_validate({
        "name": "rack", "gpu": "gb200",
        "nodes": [{"name": f"r1-t0{i}", "gpus": 4} for i in range(1, 5)],
        "domains": [{"name": "r1", "nodes": [f"r1-t0{i}" for i in range(1, 5)]}],
        "health": {"failed_gpus": ["r1-t01:3", "r1-t04:3"]}})
    cfg = ParallelConfig()
    placed = rank_hosts(c, make_placement(c, cfg, 7, gpus_per_domain=7).rank_to_gpu)
    assert {h for h, _ in placed} == {"r1-t01", "r1-t02"}
    moves, short = assign_spares(c, placed, ["r1-t01", "r1-t02"])
    assert short == [] and moves == {"r1-t01": "r1-t04", "r1-t02": "r1-t03"}
    assert _brute_force_feasible(c, placed, ["r1-t01", "r1-t02"])


def _old_style(doc):
    """``doc`` as written before health.spare_trays: the preset's spare trays under failed_trays."""
    old = json.loads(json.dumps(doc))
    h = old["cluster"]["health"]
    h["failed_trays"], h["spare_trays"] = h.pop("spare_trays"), []
    return old


def test_spares_option_marks_listed_failed_trays_as_spares(small_moe_plan):
    """An old plan.json lists the spare trays under failed_trays; --spares says t18 of rack 2 is one, so
    the failed tray's ranks go there; every other listed tray stays broken (failed_trays)."""
    old = _old_style(small_moe_plan)
    res = replan(old, "gb200-r02-t03", spares="gb200-r02-t18")
    assert [(m.host, m.spare) for m in res.moves] == [("gb200-r02-t03", "gb200-r02-t18")]
    health = load_document(res.document).cluster.health
    listed = load_document(old).cluster.health.failed_trays
    assert set(health.failed_trays) == (set(listed) - {"gb200-r02-t18"}) | {"gb200-r02-t03"}
    assert health.spare_trays == [] and "gb200-r02-t17" in health.failed_trays
    with pytest.raises(planner.InputError, match="--spares: host 'gb200-r09-t01'"):
        replan(old, "gb200-r02-t03", spares="gb200-r09-t01")
    with pytest.raises(planner.InputError, match="--spares: host 'gb200-r02-t05' is not under health.failed_trays"):
        replan(old, "gb200-r02-t03", spares="gb200-r02-t05")


def test_old_failed_trays_are_broken_by_default(small_moe_plan):
    """Without --spares an old plan.json's failed_trays are broken: a failed tray finds no spare (the
    matching's own candidates), and replan says how to mark them."""
    old = load_document(_old_style(small_moe_plan))
    placed = rank_hosts(old.cluster, old.plans[0].placement.rank_to_gpu)
    moves, short = assign_spares(old.cluster, placed, ["gb200-r02-t03"])
    assert moves == {} and short == ["gb200-r02-t03"]
    new = load_document(small_moe_plan)
    moves, short = assign_spares(new.cluster, placed, ["gb200-r02-t03"])
    assert moves == {"gb200-r02-t03": "gb200-r02-t17"} and short == []
    # a failure that moves nothing (a host with no rank): the note says how to mark the old spares
    res = replan(_old_style(small_moe_plan), "gb200-r01-t17")
    assert res.case == "spares" and res.moves == []
    assert any("--spares" in n and "health.failed_trays" in n for n in res.notes)
    assert not any("--spares" in n for n in replan(small_moe_plan, "gb200-r01-t17").notes)


def test_a_broken_tray_is_never_a_spare(small_moe_plan):
    """Rack 2 holds t17 broken (failed_trays) and t18 spare (spare_trays): a failed tray's ranks go to
    t18; a second failure finds no spare left (t17 is broken) and the rack re-plans."""
    doc = json.loads(json.dumps(small_moe_plan))
    h = doc["cluster"]["health"]
    h["spare_trays"].remove("gb200-r02-t17")
    h["failed_trays"] = ["gb200-r02-t17"]
    res = replan(doc, "gb200-r02-t03")
    assert res.case == "spares" and [(m.host, m.spare) for m in res.moves] == [("gb200-r02-t03", "gb200-r02-t18")]
    health = load_document(res.document).cluster.health
    assert health.failed_trays == ["gb200-r02-t03", "gb200-r02-t17"] and "gb200-r02-t18" not in health.spare_trays
    assert health.failed_nodes == [] and not any("--spares" in n for n in res.notes)
    c = load_document(doc)
    _, short = assign_spares(c.cluster, rank_hosts(c.cluster, c.plans[0].placement.rank_to_gpu),
                             ["gb200-r02-t03", "gb200-r02-t04"])
    assert short == ["gb200-r02-t04"]


def test_hgx_node_lost_without_spare_replans_on_the_other_nodes():
    """Llama 3 8B on 8 HGX H100 nodes (every node used): a node fails, the plan shrinks to the nodes
    left; a degree-1 axis of the healthy plan (PP1) may become a group that spans nodes."""
    doc = _job_plan("llama3-8b", "dgx-h100", 64, 256, per_rack=None)
    res = replan(doc, "h100-n0003")
    assert res.case == "replan" and not any(n.startswith("warning") for n in res.notes)
    used = {h for h, _ in _sites(res.document)}
    assert "h100-n0003" not in used and res.after["world"] <= 56
    assert res.after["tokens_per_s"] < res.before["tokens_per_s"]
    assert _domain_local(res.document, axes=("tp",))["tp"]                 # a TP group inside one node


@pytest.fixture(scope="module")
def small_replanned(small_moe_plan):
    return replan(small_moe_plan, "gb200-r01-t[02-04]")


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 160])
def test_terminal_view_keeps_figures_whole(small_replanned, tmp_path, width):
    """The view ``topoplan replan`` prints (its own render function on a console of that width)."""
    console = Console(width=width, record=True, file=io.StringIO())
    render(small_replanned, tmp_path, ["plan.json", "hostfile"], console)
    text = console.export_text()
    d = small_replanned.to_dict()
    assert "…" not in text
    flat = " ".join(text.split())
    for f in (d["before"], d["after"]):
        assert f"{f['tflops_per_gpu']:,.0f}" in flat and f"{f['tokens_per_s']:,.0f}" in flat
    assert f"{d['change']['tokens_per_s']:+.1%}" in flat


@pytest.fixture(scope="module")
def hgx_plan():
    """Llama 3 70B on 64 H100: its TP groups sit inside a node."""
    doc = _job_plan("llama3-70b", "dgx-h100", 64, 256, per_rack=None)
    assert doc["plans"][0]["config"]["tp"] > 1
    return doc


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(nodes=st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True))
def test_hgx_replan_fits_uses_no_failed_host_and_keeps_groups_in_nodes(hgx_plan, nodes):
    failed = [f"h100-n{n:04d}" for n in nodes]
    res = replan(hgx_plan, failed)
    new = load_document(res.document)
    pred = new.plans[0].prediction
    assert pred.fits and pred.memory_gib_per_gpu <= usable_hbm_gib(pred.hbm_gib, new.training)
    assert not set(failed) & {h for h, _ in _sites(res.document)}
    local_before = {ax for ax, ok in _domain_local(hgx_plan, groups_only=True).items() if ok}
    assert "tp" in local_before
    local_after = {ax for ax, ok in _domain_local(res.document).items() if ok}   # a degree of 1 is local
    assert local_before <= local_after or any(n.startswith("warning") for n in res.notes)


def test_the_examples_broken_tray_is_no_spare():
    """examples/qwen3_gb200_failed_tray.py marks tray 5 of rack 1 broken under health.failed_trays. On
    that cluster with 64 GPUs used in rack 1 (t01-t04, t06-t17; t18 idle), a failed tray's ranks go to
    the idle t18, and with t18 failed too the second failure finds no spare: t05 is never one."""
    healthy = build_preset("gb200-nvl72", gpus=144)
    data = healthy.model_dump(exclude_none=True)
    data.setdefault("health", {}).setdefault("failed_trays", []).append(healthy.nodes[4].name)   # as the example
    c = Cluster.model_validate(data)
    assert c.health.failed_trays == ["gb200-r01-t05"] and c.domain_sizes() == [68, 72]
    cfg = ParallelConfig(tp=4)
    placed = rank_hosts(c, make_placement(c, cfg, 128, gpus_per_domain=64).rank_to_gpu)
    rack1 = sorted({h for h, _ in placed if h.startswith("gb200-r01-")})
    assert len(rack1) == 16 and "gb200-r01-t05" not in rack1 and "gb200-r01-t18" not in rack1
    moves, short = assign_spares(c, placed, ["gb200-r01-t02"])
    assert moves == {"gb200-r01-t02": "gb200-r01-t18"} and short == []
    new, r2g = relocate(c, placed, ["gb200-r01-t02"], moves)
    assert "gb200-r01-t05" not in {h for h, _ in rank_hosts(new, r2g)}
    assert new.health.failed_trays == ["gb200-r01-t02", "gb200-r01-t05"]
    moves, short = assign_spares(c, placed, ["gb200-r01-t02", "gb200-r01-t18"])
    assert moves == {} and short == ["gb200-r01-t02"]
