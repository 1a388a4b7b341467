"""The HTML report and the terminal explanations: figures written, referenced and non-empty, the page
opens in a headless browser, explanations add up, rank arithmetic matches Megatron's RankGenerator.

The plan documents here are real ``PlanDocument``s (the model spec, cluster and training setup as the
planner writes them, validated) whose plans carry hand-set figures, so that these tests do not depend
on the planner's own numbers.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from matplotlib.image import imread
from rich.console import Console

from planner.output import explain
from planner.errors import InputError
from planner.output.report import write_report
from planner.output.report import figures as fg

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------ fixtures

def _bd(**seconds) -> dict:
    """A breakdown in the step-time model's own terms (``planner.cost.steptime.TERMS``; checked against
    a real prediction by ``test_fixture_terms_are_the_step_time_models``): the given terms, zero for
    the rest."""
    from planner.cost.steptime import TERMS

    assert set(seconds) <= set(TERMS), set(seconds) - set(TERMS)
    return {t: float(seconds.get(t, 0.0)) for t in TERMS}


@functools.lru_cache(maxsize=None)
def _parts() -> str:
    """The model, cluster (four full GB300 NVL72 racks) and training parts, as JSON."""
    from planner.config import Training
    from planner.model.spec import load_model
    from topologies.loader import load_cluster

    model = load_model("deepseek-v3")
    return json.dumps({
        "model": {"name": model.name, "spec": model.model_dump(mode="json")},
        "cluster": load_cluster("gb300-nvl72", gpus=288).model_dump(mode="json"),
        "training": Training(seq_len=4096, global_batch=4096, precision="mxfp8").model_dump(mode="json")})


def _entry(cfg, tflops, step, breakdown, mem, domains, rank_to_gpu):
    world = len(rank_to_gpu)
    cfg = {**cfg, "edp": world // (cfg["etp"] * cfg["ep"] * cfg["pp"]), "world": world}
    components = {"weights": 0.25 * mem, "grads": 0.1 * mem, "optimizer": 0.15 * mem, "activations": 0.5 * mem}
    pred = {"tflops_per_gpu": tflops, "tokens_per_s_per_gpu": tflops * 3.85, "tokens_per_s": tflops * 3.85 * world,
            "step_time_s": step, "memory_gib_per_gpu": mem, "hbm_gib": 288.0, "fits": mem <= 288.0,
            "breakdown": breakdown, "memory": components}
    hosts = [f"gb300-r{g // 72 + 1:02d}-t{g % 72 // 4 + 1:02d}" for g in rank_to_gpu]
    return {"label": "", "config": cfg, "prediction": pred,
            "placement": {"order": "tp-cp-ep-dp-pp", "gpus_per_domain": 64, "rank_to_gpu": rank_to_gpu,
                          "hosts": hosts, "local_ranks": [g % 4 for g in rank_to_gpu], "domains": domains,
                          "domains_used": len({g // 72 for g in rank_to_gpu})}}


def plan_doc() -> dict:
    """DeepSeek-V3-like plan on four NVL72 racks run with 64 of 72 GPUs each (256 GPUs)."""
    r2g = [d * 72 + j for d in range(4) for j in range(64)]
    base = dict(tp=1, pp=2, vpp=8, cp=1, ep=32, etp=1, dp=128, mbs=1, gbs=4096, fsdp=False,
                recompute="none", dispatcher="flex-deepep", pp_first=None, pp_last=None)
    p1 = _entry(base, 1650, 10.2, _bd(compute=8.0, ep_a2a=0.9, pp_bubble=0.6, dp_comm=0.3, optimizer=0.4),
                188.5, {"tp": 1, "ep": 1, "pp": 2}, r2g)
    p2 = _entry({**base, "pp": 4, "vpp": 4, "dp": 64}, 1560, 10.8,
                _bd(compute=8.0, ep_a2a=0.9, pp_bubble=1.2, dp_comm=0.3, optimizer=0.4),
                150.0, {"ep": 1, "pp": 4}, r2g)
    p3 = _entry({**base, "ep": 64}, 1500, 11.2,
                _bd(compute=8.0, ep_a2a=2.0, pp_bubble=0.6, dp_comm=0.2, optimizer=0.4),
                170.0, {"ep": 2, "pp": 2}, r2g)
    for p in (p1, p2, p3):
        p["label"] = explain.config_label(p["config"])
    return {"version": 1, **json.loads(_parts()), "plans": [p1, p2, p3],
            "solver": {"status": "OPTIMAL", "wall_s": 1.3, "objective": 1650.0 * 3.85 * 256,
                       "objective_name": "tokens_per_s", "bound": 1650.0 * 3.85 * 256, "method": "enumerate"}}


def test_the_fixture_is_a_plan_document():
    from planner.search.document import PlanDocument

    doc = plan_doc()
    assert PlanDocument.model_validate(doc).dump() == doc


def scale_doc() -> dict:
    """A ``scale --json`` document (``ScaleDocument``) with hand-set figures."""
    rows = []
    for gpus, tfl in ((256, 1650.0), (512, 1640.0), (1024, 1625.0)):
        rows.append({"gpus": gpus, "world": gpus, "layout": "TP1 PP2 VPP8 EP32 MBS1", "gbs": 4096,
                     "tokens_per_s": tfl * 3.85 * gpus, "tokens_per_s_per_gpu": tfl * 3.85, "tflops_per_gpu": tfl,
                     "step_time_s": 9.6, "breakdown": _bd(compute=8.0, ep_a2a=1.0, pp_bubble=0.6),
                     "status": "OPTIMAL", "wall_s": 1.0, "retention": tfl / 1650.0})
    return {"model": "deepseek-v3", "cluster": "gb300-nvl72", "rows": rows,
            "header": {"stack": "megatron-26.08", "trainer": "megatron", "model": "deepseek-v3",
                       "cluster": "gb300-nvl72", "gpus_offered": [256, 512, 1024], "gpus_used": [256, 512, 1024],
                       "precision": "mxfp8", "seq_len": 4096, "global_batch": 4096}}


def experts_doc(layers=6, ranks=16, k=2, experts=24) -> dict:
    import random

    rng = random.Random(3)
    out = []
    for i in range(layers):
        slots = list(range(experts)) + [rng.randrange(experts) for _ in range(ranks * k - experts)]
        out.append({"physical_to_logical": slots, "ep_rank_domain": [r // 8 for r in range(ranks)],
                    "metrics": {"balance": 1.02 + 0.01 * i, "remote_domains_per_token": 0.8 + 0.02 * i}})
    eplb = {"hierarchical": {"layers": [{"metrics": {"balance": 1.5 + 0.05 * i, "remote_domains_per_token": 0.9}}
                                        for i in range(layers)]},
            "global": {"layers": [{"metrics": {"balance": 1.01, "remote_domains_per_token": 1.3}}
                                  for i in range(layers)]}}
    return {"model": {"name": "deepseek-v3"}, "cluster": {"name": "dgx-h100"}, "slots_per_gpu": k,
            "layers": out, "eplb": eplb, "metrics": {"solve_s": 1.5}}


# ------------------------------------------------------------------------------------------ explain

@pytest.fixture(scope="module")
def real_breakdowns():
    """Breakdowns of real predictions whose every term is non-zero between them: a pipelined MoE layout
    with CP on two HGX nodes, the same with FSDP, and a dense layout offloading activations to the CPU."""
    import planner
    from planner import ParallelConfig, Training
    from topologies.loader import load_cluster

    model = planner.load_model("qwen3-30b-a3b")
    cluster = load_cluster("dgx-h100", gpus=32)
    training = Training(seq_len=8192, global_batch=64, precision="bf16")
    out = []
    for fsdp in (False, True):
        cfg = ParallelConfig(tp=2, pp=2, vpp=2, cp=2, ep=8, etp=1, fsdp=fsdp)
        p = planner.predict(model, cluster, cfg, training)
        out.append((dict(p.breakdown), p.step_time_s))
    # a dense model offloading half its layers' activations over PCIe (the offload term)
    dense = planner.load_model("llama3-8b")
    offload = Training(seq_len=8192, global_batch=64, precision="bf16", recipe={"cpu_offload_layers": 16})
    p = planner.predict(dense, load_cluster("dgx-h100", gpus=8), ParallelConfig(fsdp=True), offload)
    out.append((dict(p.breakdown), p.step_time_s))
    # half the optimizer on the host (the cpu_optimizer term)
    host = Training(seq_len=8192, global_batch=64, precision="bf16", recipe={"optimizer_offload_fraction": 0.5})
    p = planner.predict(dense, load_cluster("dgx-h100", gpus=8), ParallelConfig(), host)
    out.append((dict(p.breakdown), p.step_time_s))
    # FP8 delayed scaling across two nodes: the amax all-reduce of each micro-batch (the fp8_amax term)
    delayed = Training(seq_len=8192, global_batch=64, precision="fp8", recipe={"fp8_recipe": "delayed"})
    p = planner.predict(dense, load_cluster("dgx-h100", gpus=16), ParallelConfig(tp=2), delayed)
    out.append((dict(p.breakdown), p.step_time_s))
    return out


def test_every_step_time_term_has_one_category():
    """One mapping, complete: each term the step-time model emits is drawn in exactly one category."""
    from planner.cost.steptime import TERMS

    assert set(explain.TERM_CATEGORY) == set(TERMS)
    assert set(explain.TERM_CATEGORY.values()) == set(explain.CATEGORIES)  # no category is unreachable
    assert set(explain.CATEGORY_LABELS) == set(explain.CATEGORY_COLORS) == set(explain.CATEGORIES)


def test_fixture_terms_are_the_step_time_models(real_breakdowns):
    for bd, step in real_breakdowns:
        assert set(bd) == set(plan_doc()["plans"][0]["prediction"]["breakdown"])
        assert all(bd[t] >= 0 for t in bd)
    assert all(any(bd[t] > 0 for bd, _ in real_breakdowns) for t in real_breakdowns[0][0])


def test_categorize_a_real_breakdown_by_hand(real_breakdowns):
    """Each category is the sum of its terms, summed by hand here; the categories add up to the step."""
    for bd, step in real_breakdowns:
        cats = explain.categorize(bd, step_time_s=step)
        assert cats["compute"] == pytest.approx(bd["compute"])
        assert cats["tp"] == pytest.approx(bd["tp_comm"])
        assert cats["cp"] == pytest.approx(bd["cp_comm"])
        assert cats["ep"] == pytest.approx(bd["ep_a2a"])
        assert cats["imbalance"] == pytest.approx(bd["imbalance"])
        assert cats["bubble"] == pytest.approx(bd["pp_bubble"] + bd["pp_p2p"])
        assert cats["dp"] == pytest.approx(bd["dp_comm"])
        assert cats["optimizer"] == pytest.approx(bd["optimizer"] + bd["cpu_optimizer"])
        assert cats["other"] == pytest.approx(bd["other"] + bd["offload"])
        assert sum(cats.values()) == pytest.approx(step)


def test_categorize_puts_the_unexplained_remainder_into_other():
    cats = explain.categorize(_bd(compute=5.0, tp_comm=0.5, imbalance=0.25, optimizer=0.3), step_time_s=10.0)
    assert cats["compute"] == 5.0 and cats["tp"] == 0.5 and cats["imbalance"] == 0.25
    assert cats["optimizer"] == 0.3 and cats["bubble"] == 0.0
    assert cats["other"] == pytest.approx(10.0 - 6.05)
    assert sum(cats.values()) == pytest.approx(10.0)


def test_categorize_refuses_a_term_the_model_does_not_emit():
    with pytest.raises(InputError, match="'pipeline_bubble'.*compute, tp_comm"):
        explain.categorize({"compute": 1.0, "pipeline_bubble": 0.5})


@pytest.mark.parametrize("width", [10, 40, 73])
def test_breakdown_bar_cells_add_up_and_are_proportional(width):
    text = explain.breakdown_bar(_bd(compute=6.0, ep_a2a=2.0, imbalance=1.0, pp_bubble=0.5, pp_p2p=0.5),
                                 width=width)
    bar = text.plain
    cells = bar.split("\n")[0].split(" ")[0]
    assert cells == "█" * width
    # each category's run of cells is its share of the step, within one cell of rounding
    runs = {str(s.style): s.end - s.start for s in text.spans if s.end <= width}
    assert abs(runs[explain.CATEGORY_COLORS["compute"]] - 0.6 * width) < 1
    assert abs(runs[explain.CATEGORY_COLORS["ep"]] - 0.2 * width) < 1
    assert abs(runs[explain.CATEGORY_COLORS["imbalance"]] - 0.1 * width) < 1
    assert abs(runs[explain.CATEGORY_COLORS["bubble"]] - 0.1 * width) < 1
    assert sum(runs.values()) == width
    legend = bar.split("\n")[1]
    assert "compute 6.00 s (60%)" in legend and "exposed EP all-to-all 2.00 s (20%)" in legend
    assert "expert imbalance 1.00 s (10%)" in legend
    assert "pipeline bubble and P2P 1.00 s (10%)" in legend and "exposed TP" not in legend


def test_memory_bar_marks_overflow():
    assert "does not fit" not in explain.memory_bar(100, 186).plain
    over = explain.memory_bar(200, 186).plain
    assert "does not fit: 14.0 GiB over" in over and "(108%)" in over


def test_rank_coords_match_megatron_rank_generator_by_hand():
    # tp2 pp2 dp2, order tp-cp-ep-dp-pp: Megatron's pipeline groups are [0,4],[1,5],[2,6],[3,7]
    cfg = {"tp": 2, "pp": 2, "cp": 1, "ep": 1}
    groups: dict[tuple, list[int]] = {}
    for r in range(8):
        c = explain.rank_coords(r, cfg, 8)
        groups.setdefault((c["tp"], c["dp"]), []).append(r)
    assert sorted(groups.values()) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # expert grid ep4 etp1 pp2 on 8 ranks: EP groups [0..3] and [4..7]
    ecfg = {"tp": 2, "pp": 2, "ep": 4, "etp": 1}
    assert [explain.ep_group(r, ecfg, 8) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    # order tp-dp-pp with cp2: cp varies right after tp
    cfg2 = {"tp": 2, "cp": 2, "pp": 2}
    assert explain.rank_coords(3, cfg2, 16) == {"tp": 1, "cp": 1, "ep": 0, "dp": 0, "pp": 0}
    assert explain.rank_coords(9, cfg2, 16)["pp"] == 1


def test_placement_map_rows_glyphs_and_collapse():
    doc = plan_doc()
    text = explain.placement_map(doc["plans"][0], [72] * 4).plain
    lines = text.splitlines()
    assert lines[0].startswith("racks 0-1") and lines[1].startswith("racks 2-3")
    glyphs = lines[0].split()[2]
    assert glyphs == "0" * 64 + "." * 8
    assert lines[1].split()[2] == "1" * 64 + "." * 8
    assert "EP 1" in lines[-1]


def test_placement_map_hgx_word_and_unused_gpus():
    plan = {"config": {"tp": 8, "pp": 1}, "placement": {"rank_to_gpu": list(range(8, 16))}}
    text = explain.placement_map(plan, [8, 8]).plain
    assert text.splitlines()[0].split()[:3] == ["node", "0", "........"]
    assert text.splitlines()[1].split()[:3] == ["node", "1", "00000000"]


def test_why_not_names_the_cause():
    doc = plan_doc()
    lines = explain.why_not_lines(doc, n=5)
    assert lines[0].startswith("TP1 PP4 VPP4 EP32 MBS1: 5% slower, larger pipeline bubble with PP4 VPP4")
    assert lines[1].startswith("TP1 PP2 VPP8 EP64 MBS1: 9% slower, EP all-to-all crosses racks")
    rej = [{"config": {"tp": 2, "pp": 8, "ep": 32}, "prediction": {"memory_gib_per_gpu": 300.0}},
           {"config": {"tp": 4, "pp": 1}, "reason": "breaks a rule: heads not divisible"}]
    more = explain.why_not_lines(doc, n=5, rejected=rej)
    assert more[2] == "TP2 PP8 EP32: does not fit, 300 GiB per GPU > 288 GiB HBM"
    assert more[3] == "TP4 PP1: breaks a rule: heads not divisible"


def test_render_plan_prints_everything():
    console = Console(record=True, width=140, force_terminal=False)
    explain.render_plan(plan_doc(), console=console)
    out = console.export_text()
    for needle in ("TP1 PP2 VPP8 EP32 MBS1", "1,650", "exposed EP all-to-all", "188.5 / 288 GiB",
                   "racks gb300-r[01-02]", "why not", "solver: OPTIMAL"):
        assert needle in out


def test_render_plan_refuses_a_document_that_is_not_a_plan_document():
    doc = plan_doc()
    del doc["plans"][1]["prediction"]["breakdown"]
    with pytest.raises(InputError, match="field 'plans.1.prediction.breakdown'"):
        explain.render_plan(doc, console=Console(record=True))


# ------------------------------------------------------------------------------------------ report

def _check_report(out: Path, paths: list[Path], expect: set[str]) -> str:
    assert paths[0] == out / "index.html"
    page = (out / "index.html").read_text()
    refs = set(re.findall(r'<img src="([^"]+)"', page))
    pngs = {p.name for p in out.glob("*.png")}
    assert refs == pngs == expect, (refs, pngs)  # every figure referenced, every reference present
    for name in pngs:
        raw = (out / name).read_bytes()
        assert raw[:8] == PNG_MAGIC and len(raw) > 5000
        img = imread(out / name)
        assert img.shape[0] > 100 and img.shape[1] > 200
        assert img[..., :3].std() > 0.05  # not a blank canvas
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched from the network
    assert not list(out.parent.glob(f".{out.name}.staging.*"))
    return page


def test_plan_report_files(tmp_path):
    out = tmp_path / "rep"
    paths = write_report("plan", plan_doc(), out)
    page = _check_report(out, paths, {"breakdown.png", "memory.png", "placement.png"})
    assert json.loads((out / "data.json").read_text()) == plan_doc()
    assert "TP1 PP2 VPP8 EP32 MBS1" in page and "EP all-to-all crosses racks" in page


def test_scale_report_files(tmp_path):
    out = tmp_path / "scale"
    page = _check_report(out, write_report("scale", scale_doc(), out), {"scaling.png", "breakdown.png"})
    # retention against 256 GPUs: 1625/1650 = 98.5%
    assert "98.5%" in page and "100.0%" in page


def test_scale_rows_are_the_planners(tmp_path):
    """A real ``scale()`` result is a ScaleDocument, and its report draws each size's breakdown."""
    import planner
    from planner.config import Training
    from planner.search.document import ScaleDocument
    from planner.search.plan import scale
    from topologies.loader import load_cluster

    rows = scale(planner.load_model("llama3-8b"), lambda n: load_cluster("dgx-h100", gpus=n), [16, 8],
                 Training(seq_len=4096, global_batch=64))
    doc = {"model": "llama3-8b", "cluster": "dgx-h100", "rows": json.loads(json.dumps(rows))}
    assert ScaleDocument.model_validate(doc).dump() == doc
    assert [r["gpus"] for r in rows] == [8, 16] and rows[0]["retention"] == 1.0
    for r in rows:
        assert sum(r["breakdown"].values()) == pytest.approx(r["step_time_s"])
    _check_report(tmp_path / "s", write_report("scale", doc, tmp_path / "s"), {"scaling.png", "breakdown.png"})


def test_experts_report_files(tmp_path):
    out = tmp_path / "ex"
    page = _check_report(out, write_report("place-experts", experts_doc(), out), {"experts.png", "expert_slots.png"})
    assert "EPLB hierarchical" in page and "EPLB global" in page
    # mean balance of topoplan: 1.02 + .01 * mean(0..5) = 1.045
    assert "1.045" in page


def _without(path):
    doc = plan_doc()
    *head, last = path
    cur = doc
    for k in head:
        cur = cur[k]
    del cur[last]
    return doc


@pytest.mark.parametrize("kind,doc,needle", [
    ("plan", {"plans": []}, "field 'model'"),
    ("plan", _without(("plans", 0, "prediction")), "field 'plans.0.prediction'"),
    ("plan", _without(("cluster",)), "field 'cluster'"),
    ("scale", {"model": "m", "cluster": "c", "rows": [{"gpus": 8}]}, "field 'rows.0.world'"),
    ("scale", {"foo": 1}, "field 'model'"),
    ("place-experts", {"layers": [{}]}, "no per-layer 'balance'"),
    ("bogus", {}, "report kind 'bogus' is unknown"),
])
def test_bad_documents_are_refused_before_writing(tmp_path, kind, doc, needle):
    out = tmp_path / "rep"
    with pytest.raises(InputError) as exc:
        write_report(kind, doc, out)
    assert needle in str(exc.value)
    assert not out.exists()


def test_report_is_atomic_on_failure(tmp_path, monkeypatch):
    out = tmp_path / "rep"
    write_report("plan", plan_doc(), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(fg, "placement_figure", boom)
    doc = plan_doc()
    doc["model"]["name"] = "changed"
    with pytest.raises(RuntimeError):
        write_report("plan", doc, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]  # no staging left behind


# ------------------------------------------------------------------------------------------ browser

def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    exe = _chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    return subprocess.run([exe, *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install -y chromium); "
                    "the headless-browser check of the report did not run")
@pytest.mark.parametrize("kind,doc,color", [
    ("plan", plan_doc, "#4c78a8"),
    # a browser start is 2-5 CPU s: the quick loop opens the plan page, CI's full run all three
    pytest.param("scale", scale_doc, "#e45756", marks=pytest.mark.slow),
    pytest.param("place-experts", experts_doc, "#4c78a8", marks=pytest.mark.slow)])
def test_report_opens_in_headless_chromium(tmp_path, kind, doc, color):
    import numpy as np

    out = tmp_path / "rep"
    write_report(kind, doc(), out)
    url = (out / "index.html").resolve().as_uri()
    dom = _run_chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    srcs = re.findall(r'<img src="([^"]+)"', dom.stdout)
    assert srcs and all((out / s).stat().st_size > 0 for s in srcs)
    assert "<h1>topoplan" in dom.stdout
    shot = tmp_path / "shot.png"
    res = _run_chromium(tmp_path, "--window-size=1200,2400", f"--screenshot={shot}", url)
    assert res.returncode == 0 and shot.stat().st_size > 0, res.stderr[-2000:]
    img = imread(shot)[..., :3]
    # the page itself uses no saturated colour: pixels of the figures' series colour prove that the
    # browser loaded and drew the PNGs
    rgb = np.array([int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    hits = (np.abs(img - rgb).max(axis=2) < 0.03).sum()
    assert hits > 200, f"figure colour {color} found in only {hits} screenshot pixels"


def test_domain_sizes_from_a_real_cluster_dump():
    """A plan document carries Cluster.model_dump(); the domain sizes come back through the schema
    (a failed tray leaves 68 GPUs in the first rack)."""
    topologies = pytest.importorskip("topologies.loader")
    from topologies.cluster import cluster_from_dict

    c = topologies.load_cluster("gb200-nvl72", gpus=256)
    data = c.model_dump(exclude_none=True)
    data.setdefault("health", {})["failed_trays"] = [c.nodes[0].name]
    dumped = cluster_from_dict(data, "test").model_dump()
    assert explain.domain_sizes_of({"cluster": dumped, "plans": []}) == [68, 72, 72, 40]
    assert explain.domain_sizes_of(plan_doc()) == [72] * 4
    assert explain.hbm_of(plan_doc()) == 288.0


def test_expert_series_accepts_a_flat_per_layer_metrics_list():
    from planner.output.report.data import expert_series

    doc = {"physical_to_logical": [[0, 1, 2, 0], [2, 1, 0, 1]], "slots_per_gpu": 2, "rank_domain": [0, 1],
           "metrics": [{"balance": 1.1, "remote_domains_per_token": 0.5}, {"balance": 1.3, "remote_domains_per_token": 0.7}],
           "eplb": {"global": {"metrics": [{"balance": 1.0}, {"balance": 1.05}]}}}
    s = expert_series(doc)
    assert s["balance"] == [1.1, 1.3] and s["remote"] == [0.5, 0.7]
    assert s["baselines"]["EPLB global"]["balance"] == [1.0, 1.05]
    assert s["ep_rank_domain"] == [0, 1] and s["slots"] == doc["physical_to_logical"]


def test_vectorised_grids_agree_with_the_scalar_rank_arithmetic():
    import random

    rng = random.Random(5)
    for _ in range(20):
        tp, cp, pp, ep = rng.choice([1, 2, 4]), rng.choice([1, 2]), rng.choice([1, 2, 3]), rng.choice([1, 2, 4, 8])
        etp = rng.choice([1, tp])
        world = tp * cp * pp * 8
        if world % (etp * ep * pp):
            continue
        cfg = {"tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp}
        gpus = list(range(world))
        rng.shuffle(gpus)
        plan = {"config": cfg, "placement": {"rank_to_gpu": gpus}}
        sizes = [8] * (world // 8)
        flat_stage = sum(explain.gpu_stage_grid(plan, sizes), [])
        flat_ep = sum(explain.gpu_ep_grid(plan, sizes), [])
        for r, g in enumerate(gpus):
            assert flat_stage[g] == explain.pipeline_stage(r, cfg, world)
            assert flat_ep[g] == explain.ep_group(r, cfg, world)
        # every EP group has exactly ep members
        from collections import Counter

        assert set(Counter(flat_ep).values()) == {ep}


def test_plan_labels_tell_apart_plans_with_equal_degrees():
    doc = plan_doc()
    a, b = doc["plans"][0], json.loads(json.dumps(doc["plans"][0]))
    b["config"]["dispatcher"] = "alltoall"
    c = json.loads(json.dumps(doc["plans"][0]))
    c["placement"]["gpus_per_domain"] = None
    labels = explain.plan_labels([a, b, c, doc["plans"][1]])
    assert len(set(labels)) == 4
    assert labels[0] == "TP1 PP2 VPP8 EP32 MBS1 (flex-deepep, 64 GPUs per domain)"
    assert labels[1] == "TP1 PP2 VPP8 EP32 MBS1 (alltoall, 64 GPUs per domain)"
    assert labels[2] == "TP1 PP2 VPP8 EP32 MBS1 (flex-deepep, domains filled)"
    assert labels[3] == "TP1 PP4 VPP4 EP32 MBS1"  # unique: left alone


def test_why_not_names_recompute_when_compute_grew():
    doc = plan_doc()
    alt = json.loads(json.dumps(doc["plans"][0]))
    alt["config"]["recompute"] = "moe_act"
    alt["prediction"]["breakdown"]["compute"] = 8.3
    alt["prediction"]["step_time_s"] = 10.5
    alt["prediction"]["tokens_per_s_per_gpu"] *= 10.2 / 10.5
    line = explain.why_not(doc["plans"][0], alt, "racks")
    assert line == "TP1 PP2 VPP8 EP32 MBS1 RC:moe_act: 3% slower, recompute (moe_act) adds 300.0 ms of compute per step"


@pytest.mark.parametrize("term, cfg, reason", [
    ("imbalance", {}, "more expert imbalance"),
    ("cp_comm", {"cp": 4}, "more exposed context-parallel exchange with CP4"),
    ("optimizer", {}, "longer optimizer step"),
])
def test_why_not_names_the_terms_outside_the_old_six(term, cfg, reason):
    """Expert imbalance, CP and the optimizer are causes of their own (they used to be read as a
    pipeline bubble or as unexplained time)."""
    doc = plan_doc()
    alt = json.loads(json.dumps(doc["plans"][0]))
    alt["config"].update(cfg)
    alt["prediction"]["breakdown"][term] += 1.0
    alt["prediction"]["step_time_s"] += 1.0
    alt["prediction"]["tokens_per_s_per_gpu"] *= 10.2 / 11.2
    assert reason in explain.why_not(doc["plans"][0], alt, "racks")
