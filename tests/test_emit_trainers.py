"""The emitted launch configs, checked by the trainers' own code (megatron-core 0.19.2, torchtitan 0.3.0).

For each example plan (the issue's DeepSeek-V3 on 256 GB300, Llama 3.1 405B on 1,024 H100 and
Qwen3-235B-A22B on 256 GB200, plus a few more) and for random feasible plans (hypothesis), the
emitted files go through, in ONE subprocess per trainer (tests/trainers/*_check.py):

* Megatron: ``parse_args`` + ``validate_args`` + ``core_transformer_config_from_args`` +
  ``initialize_model_parallel`` on torch's fake process group, with the argv bash makes of
  megatron/args.txt and the environment of megatron/env.sh;
* TorchTitan: ``ConfigManager().parse_args`` + ``ParallelDims`` + ``build_mesh`` on the fake process
  group, with the arguments of torchtitan/command.txt.

Then every TP, CP, DP, PP, EP (and ETP, EDP) group the trainer built is mapped through
slurm/hostfile and slurm/task.sh (rank -> host, GPU) and compared with the planner's placement, and
every EP group must sit inside one NVLink domain where the plan says so. A line per check goes to
the terminal (``trainer check ...``) so CI logs show what ran. megatron-core needs Python 3.12 per
its metadata, so its wheel is downloaded once into .cache/ and unpacked onto PYTHONPATH
(it runs on 3.11 with the shims in tests/trainers/megatron_check.py: ``typing.override``, a stub for
the one triton module, a fake sm_90 device).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Training
from planner.errors import InfeasibleError, InputError
from planner.output.emit import emit_plan, load_context
from planner.model.spec import load_model
from planner.cost.placement import Placement, group_shapes, rank_groups
from planner.rules import violations
from topologies.cluster import Cluster
from trainers.plans import hgx_cluster, nvl72_cluster, plan_doc
from trainers.maxtext_rules import maxtext_mesh_errors
from trainers.mcore import ensure_mcore
from trainers.sites import bash_words, srun_sites

pytestmark = pytest.mark.trainers

REPO = Path(__file__).resolve().parents[1]
HARNESS = Path(__file__).resolve().parent / "trainers"
from trainers.mcore import MCORE  # noqa: E402  (the version the harnesses check)


@dataclass(frozen=True)
class Example:
    model: str
    cluster: tuple           # ("nvl72", gpu, racks) or ("hgx", gpu, nodes)
    config: ParallelConfig
    training: Training
    world: int
    gpus_per_domain: int | None = None
    ep_in_one_domain: bool | None = None   # the claim the test must prove (None: not an MoE claim)

    def doc(self) -> dict:
        kind, gpu, n = self.cluster
        cl = nvl72_cluster(gpu, n) if kind == "nvl72" else hgx_cluster(gpu, n)
        return plan_doc(self.model, cl, self.config, self.training, world=self.world,
                        gpus_per_domain=self.gpus_per_domain)


EXAMPLES = {
    # DEVELOPERS.md reference: Megatron Core, DeepSeek-V3 on 256 GB300 (TP1 PP2 VPP8 EP32, MXFP8), 64 GPUs per rack
    "deepseek-v3@256xGB300": Example(
        "deepseek-v3", ("nvl72", "gb300", 4),
        ParallelConfig(tp=1, pp=2, vpp=8, ep=32, mbs=1, recompute="mla_up_proj+moe_act", dispatcher="flex-hybridep"),
        Training(seq_len=4096, global_batch=4096, precision="mxfp8"), 256, 64, True),
    # Megatron-Bridge's Llama 3.1 405B recipe layout (TP8 PP8 VPP2 CP4) on 128 HGX H100 nodes
    "llama3.1-405b@1024xH100": Example(
        "llama3.1-405b", ("hgx", "h100", 128), ParallelConfig(tp=8, pp=8, vpp=2, cp=4, mbs=1),
        Training(seq_len=8192, global_batch=512, precision="fp8"), 1024),
    "qwen3-235b-a22b@256xGB200": Example(
        "qwen3-235b-a22b", ("nvl72", "gb200", 4), ParallelConfig(tp=2, pp=4, ep=32, etp=1, mbs=1, recompute="full"),
        Training(seq_len=4096, global_batch=2048, precision="mxfp8"), 256, 64, True),
    # trainers.md 1.3: the verified 256 x H100 DeepSeek-V3 recipe; EP32 spans four 8-GPU hosts
    "deepseek-v3@256xH100-recipe": Example(
        "deepseek-v3", ("hgx", "h100", 32),
        ParallelConfig(tp=2, pp=8, ep=32, etp=1, mbs=1, recompute="full"),
        Training(seq_len=4096, global_batch=4096, precision="bf16"), 256, None, False),
    "qwen3-30b-a3b@64xB200-fsdp": Example(
        "qwen3-30b-a3b", ("hgx", "b200", 8), ParallelConfig(tp=1, pp=1, ep=8, mbs=2, fsdp=True, recompute="moe_act"),
        Training(seq_len=4096, global_batch=512, precision="nvfp4"), 64, None, True),
    # expert biases: megatron-core allows them only with ETP = 1 (rule moe_bias_needs_etp1)
    # optimizer CPU offload (the plan topoplan makes for DeepSeek-V3 on 64 H100: nothing fits without it)
    "deepseek-v3@64xH100-offload": Example(
        "deepseek-v3", ("hgx", "h100", 8),
        ParallelConfig(tp=4, pp=2, ep=32, etp=1, mbs=1, recompute="mla_up_proj+moe_act"),
        Training(seq_len=4096, global_batch=1024, precision="bf16",
                 recipe={"optimizer_offload_fraction": 1.0}), 64, None, False),
    "gpt-oss-120b@64xH100": Example(
        "gpt-oss-120b", ("hgx", "h100", 8), ParallelConfig(tp=2, pp=2, ep=8, etp=1, mbs=1),
        Training(seq_len=4096, global_batch=256, precision="fp8"), 64, None, True),
}
TITAN_EXAMPLES = [k for k in EXAMPLES if not k.endswith(("fsdp", "offload"))]   # Megatron-only recipes

# plan.json documents written by the real planner (topoplan plan --save-plan), one check per plan entry
REAL_PLAN_FILES = sorted((HARNESS / "data").glob("plan_*.json"))


def _real_plans() -> dict[str, dict]:
    out = {}
    for f in REAL_PLAN_FILES:
        doc = json.loads(f.read_text())
        for i, entry in enumerate(doc["plans"]):
            out[f"plan():{f.stem[5:]}#{i}"] = {**doc, "plans": [entry]}
    return out


REAL_PLANS = _real_plans()

# Layouts megatron-core must refuse: proof that the harness can fail (trainers.md 1.4 rejections).
MEGATRON_NEGATIVE = {
    "neg:experts%EP": ("--expert-model-parallel-size", "48", "Number of experts"),
    "neg:world%TP*PP*CP": ("--context-parallel-size", "3", "not divisible"),
    "neg:moe-bias-etp2": ("--expert-tensor-parallel-size", "2", "Bias in Moe is only supported when ETP==1"),
}


# megatron-core's optimizer CPU offload checks (arguments.py:1803-1811), which planner.trainers.megatron.rules
# replicates: the offload example without the precision-aware optimizer, and with FP8 parameters of a current-scaling
# recipe. id -> (flag dropped, flags added, words of megatron's message).
OFFLOAD_NEGATIVE = {
    "neg:offload-needs-precision-aware": ("--use-precision-aware-optimizer", (), "use-precision-aware-optimizer"),
    "neg:offload-fp8-param-gather": (None, ("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"),
                                     "--fp8-recipe delayed"),
}


# megatron-core's interleaved schedule must refuse these at the first step (step 5 of megatron_check.py):
# the Llama 3.1 405B example (PP8 VPP2, DP4, MBS1) with GBS 4 (M = 1 < PP) and GBS 48 (M = 12, last
# group 12 % 8 = 4 < PP). id -> (global batch, words of megatron's message).
MEGATRON_SCHEDULE_NEGATIVE = {
    "neg:schedule-M<PP": ("4", "should range in [PP=8 , M=1]"),
    "neg:schedule-remainder": ("48", "The remainder of M"),
}


def _plan_requests():
    """Small random requests (hypothesis, derandomized) planned by plan(): its winners go through
    megatron-core's schedule too. Small global batches make the micro-batch rule bind."""
    from planner.search.plan import plan

    docs: list[dict] = []

    @settings(max_examples=6, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(model=st.sampled_from(["llama3-8b", "qwen3-30b-a3b", "mixtral-8x7b"]), nodes=st.sampled_from([2, 4, 8]),
           gbs=st.sampled_from([4, 8, 12, 16, 24, 32]))
    def collect(model, nodes, gbs):
        cluster = hgx_cluster("h100", nodes)
        try:
            res = plan(load_model(model), cluster, Training(global_batch=gbs, precision="bf16"), top=1)
        except (InfeasibleError, InputError):   # nothing fits: nothing to emit
            return
        doc = res.to_dict()
        docs.append({**doc, "plans": doc["plans"][:1]})

    collect()
    return docs


def _say(request, line: str) -> None:
    """Write a line to the terminal even under output capture (so CI logs show every check)."""
    tr = request.config.pluginmanager.getplugin("terminalreporter")
    cm = request.config.pluginmanager.getplugin("capturemanager")
    if tr is None or cm is None:  # pragma: no cover - xdist workers have no terminal
        print(line)
        return
    with cm.global_and_fixture_disabled():
        tr.write_line(line)


# --- random feasible plans -------------------------------------------------------------------

MODELS = ["deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "llama3-70b", "llama3-8b", "mixtral-8x7b", "gpt-oss-20b"]
TITAN_MODELS = ["deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "llama3-70b", "llama3-8b"]


@st.composite
def random_plans(draw, trainer: str):
    model = draw(st.sampled_from(MODELS if trainer == "megatron" else TITAN_MODELS))
    spec = load_model(model)
    kind = draw(st.sampled_from(["hgx-h100", "hgx-b200", "nvl72-gb200", "nvl72-gb300"]))
    if kind.startswith("hgx"):
        gpu = kind.split("-")[1]
        nodes = draw(st.sampled_from([2, 4, 8, 16]))
        cluster, per, usable = hgx_cluster(gpu, nodes), None, nodes * 8
    else:
        gpu = kind.split("-")[1]
        racks = draw(st.integers(1, 2))
        per = draw(st.sampled_from([None, 64, 48, 32]))
        cluster, usable = nvl72_cluster(gpu, racks), racks * (per or 72)
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    cp = draw(st.sampled_from([1, 1, 2]))
    moe = spec.num_experts > 0
    ep = draw(st.sampled_from([1, 2, 4, 8, 16, 32])) if moe else 1
    etp = draw(st.sampled_from([None, 1])) if moe else None
    mbs = draw(st.sampled_from([1, 2]))
    mp = tp * cp * pp
    world = usable - usable % (mp * ep * (etp or tp))
    assume(world >= mp)
    precisions = ["bf16", "fp8", "fp8-block"] + (["mxfp8", "nvfp4"] if gpu != "h100" else [])
    recomputes = ["none", "full", "core_attn"] + (["mla_up_proj+moe_act"] if spec.attention == "mla" else []) + (
        ["moe_act"] if moe else ["mlp"])
    cfg = ParallelConfig(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs=mbs,
                         fsdp=draw(st.booleans()) if trainer == "megatron" else False,
                         recompute=draw(st.sampled_from(recomputes)),
                         dispatcher=draw(st.sampled_from(["alltoall", "allgather", "flex-deepep", "flex-hybridep"]))
                         if moe else "alltoall")
    dp = world // mp
    training = Training(seq_len=draw(st.sampled_from([2048, 4096])), global_batch=dp * mbs * draw(st.integers(1, 4)),
                        precision=draw(st.sampled_from(precisions)), trainer=trainer)
    assume(not violations(spec, cfg, training, world, trainer))
    return plan_doc(model, cluster, cfg, training, world=world, gpus_per_domain=per)


def draw_plans(trainer: str, n: int) -> list[dict]:
    docs: list[dict] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(random_plans(trainer))
    def collect(doc):
        docs.append(doc)

    collect()
    return docs[:n]


# --- emitted files and the trainers' verdicts ------------------------------------------------

@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """id -> (plan doc, output directory) for every example and random plan."""
    root = tmp_path_factory.mktemp("emit")
    out = {}
    for name, ex in EXAMPLES.items():
        doc = ex.doc()
        d = root / name.replace("@", "_")
        emit_plan(doc, ["megatron", "bridge", "slurm"] + (["torchtitan"] if name in TITAN_EXAMPLES else []), d)
        out[name] = (doc, d)
    from planner.trainers.torchtitan.emit import MODELS as TITAN_MODELS_KNOWN

    for name, doc in REAL_PLANS.items():
        d = root / name.replace(":", "_").replace("#", "_").replace("()", "")
        titan = doc["model"]["name"] in TITAN_MODELS_KNOWN
        emit_plan(doc, ["megatron", "bridge", "slurm"] + (["torchtitan"] if titan else []), d)
        out[name] = (doc, d)
    for i, doc in enumerate(_plan_requests()):
        d = root / f"plan-request-{i}"
        emit_plan(doc, ["megatron", "slurm"], d)
        out[f"plan-request-{i}"] = (doc, d)
    for trainer, n in (("megatron", 12), ("torchtitan", 12)):
        for i, doc in enumerate(draw_plans(trainer, n)):
            name = f"random-{trainer}-{i}"
            d = root / name
            emit_plan(doc, [trainer if trainer == "torchtitan" else "megatron", "slurm"], d)
            out[name] = (doc, d)
    return out


@pytest.fixture(scope="session")
def mcore_dir() -> Path:
    """megatron-core 0.19.2 unpacked (tests/trainers/mcore.py: cached in .cache/; TOPOPLAN_MCORE_DIR overrides)."""
    return ensure_mcore()


def _run(script: str, jobs: list[dict], tmp: Path, extra_path: str | None = None) -> dict:
    jobs_file, res_file = tmp / f"{script}.jobs.json", tmp / f"{script}.results.json"
    jobs_file.write_text(json.dumps(jobs))
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = extra_path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, str(HARNESS / script), str(jobs_file), str(res_file)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0 and res_file.exists(), p.stderr[-3000:]
    return json.loads(res_file.read_text())


def _megatron_env(out: Path) -> dict:
    env = {}
    for line in (out / "megatron" / "env.sh").read_text().splitlines():
        if line.startswith("export "):
            k, _, v = line[7:].partition("=")
            env[k] = v
    return env


@pytest.fixture(scope="module")
def megatron_results(emitted, mcore_dir, tmp_path_factory):
    jobs = []
    for name, (doc, out) in emitted.items():
        if (out / "megatron").exists():
            ctx = load_context(doc)
            jobs.append({"id": name, "args": bash_words(out / "megatron" / "args.txt"), "env": _megatron_env(out),
                         "sm": ctx.sm})
    for name, (flag, value, _) in MEGATRON_NEGATIVE.items():
        base = next(j for j in jobs if j["id"] == ("gpt-oss-120b@64xH100" if "bias" in name else
                                                   "deepseek-v3@256xH100-recipe"))
        args = list(base["args"])
        args[args.index(flag) + 1] = value
        jobs.append({**base, "id": name, "args": args})
    base = next(j for j in jobs if j["id"] == "deepseek-v3@64xH100-offload")
    for name, (drop, add, _) in OFFLOAD_NEGATIVE.items():
        jobs.append({**base, "id": name, "args": [a for a in base["args"] if a != drop] + list(add)})
    for name, (gbs, _) in MEGATRON_SCHEDULE_NEGATIVE.items():
        base = next(j for j in jobs if j["id"] == "llama3.1-405b@1024xH100")
        args = list(base["args"])
        args[args.index("--global-batch-size") + 1] = gbs
        jobs.append({**base, "id": name, "args": args})
    data = _run("megatron_check.py", jobs, tmp_path_factory.mktemp("mcore"), str(mcore_dir))
    return {"fields": data["fields"], **{r["id"]: r for r in data["results"]}}


@pytest.fixture(scope="module")
def titan_results(emitted, tmp_path_factory):
    jobs = []
    for name, (doc, out) in emitted.items():
        if (out / "torchtitan").exists():
            from planner.trainers.torchtitan.emit import parse_command

            ctx = load_context(doc)
            reg = out / "torchtitan" / "topoplan_config.py"
            jobs.append({"id": name, "args": parse_command((out / "torchtitan" / "command.txt").read_text()),
                         "world": ctx.world, "sm": ctx.sm, "path": str(reg.parent) if reg.exists() else None})
    bad = dict(next(j for j in jobs if j["id"] == "deepseek-v3@256xGB300"))
    bad["id"], bad["world"] = "neg:world-mismatch", bad["world"] - 8
    jobs.append(bad)
    data = _run("torchtitan_check.py", jobs, tmp_path_factory.mktemp("titan"))
    return {r["id"]: r for r in data}


# --- the group checks ------------------------------------------------------------------------

def check_groups(doc: dict, out: Path, groups: dict, axes: dict[str, str], config: ParallelConfig) -> dict:
    """Trainer groups == planner groups, mapped through the emitted hostfile to the same hosts and
    NVLink domains as the placement. Returns {axis: domains of the worst group}."""
    cluster = Cluster.model_validate(doc["cluster"])
    gpus = cluster.gpus()
    placement = doc["plans"][0]["placement"]
    r2g = placement["rank_to_gpu"]
    world = len(r2g)
    domain_of = {(g.node, g.local): g.domain for g in gpus}
    sites = srun_sites(out)
    assert len(sites) == world
    worst = {}
    for axis, planner_axis in axes.items():
        got = groups.get(axis)
        assert got, f"trainer built no {axis} groups"
        want = rank_groups(config, world, planner_axis, placement["order"])
        assert sorted(sorted(g) for g in got) == sorted(sorted(g) for g in want), f"{axis} groups differ"
        for g in got:
            emitted_domains = {domain_of[sites[r]] for r in g}
            assert emitted_domains == {gpus[r2g[r]].domain for r in g}, f"{axis} group {g[:4]}.. lands elsewhere"
            assert {sites[r][0] for r in g} == {gpus[r2g[r]].node for r in g}
            worst[axis] = max(worst.get(axis, 0), len(emitted_domains))
    return worst


MEGATRON_AXES = {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp", "ep": "ep", "etp": "etp", "edp": "edp"}
TITAN_AXES = {"tp": "tp", "cp": "cp", "pp": "pp", "dp_shard": "dp", "ep": "ep"}


def _plan_says_ep_in_one_domain(doc: dict) -> bool:
    cluster = Cluster.model_validate(doc["cluster"])
    p = doc["plans"][0]["placement"]
    cfg = load_context(doc).config
    placement = Placement(world=len(p["rank_to_gpu"]), order=p["order"], gpus_per_domain=p["gpus_per_domain"],
                          rank_to_gpu=tuple(p["rank_to_gpu"]))
    return group_shapes(cluster, cfg, placement)["ep"].domains == 1


def _megatron_verdict(name, megatron_results, emitted):
    r = megatron_results[name]
    assert r["ok"], f"megatron-core refused {name} at {r['stage']}: {r['error']}"
    doc, out = emitted[name]
    ctx = load_context(doc)
    m, c = ctx.model, ctx.config
    cfg = r["config"]
    assert r["dp"] == ctx.dp
    assert (cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"], cfg["context_parallel_size"]) == (
        c.tp, c.pp, c.cp)
    assert (r["vpp"] or 1) == c.vpp
    assert (cfg["num_layers"], cfg["hidden_size"], cfg["num_attention_heads"]) == (
        m.num_layers, m.hidden_size, m.num_attention_heads)
    if m.num_experts:
        assert (cfg["num_moe_experts"], cfg["moe_router_topk"], cfg["expert_model_parallel_size"],
                cfg["expert_tensor_parallel_size"]) == (m.num_experts, m.top_k, c.ep, c.etp_eff)
        freq = cfg["moe_layer_freq"]
        assert (freq == [int(x) for x in m.moe_layers]) if isinstance(freq, list) else all(m.moe_layers)
    worst = check_groups(doc, out, r["groups"], MEGATRON_AXES, c)
    if _plan_says_ep_in_one_domain(doc):
        assert worst["ep"] == 1, "an EP group spans NVLink domains although the plan keeps it in one"
    return worst


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_megatron_core_accepts_example(name, megatron_results, emitted, request):
    worst = _megatron_verdict(name, megatron_results, emitted)
    ex = EXAMPLES[name]
    if ex.ep_in_one_domain is not None:
        assert (worst["ep"] == 1) == ex.ep_in_one_domain
    _say(request, f"megatron-core {MCORE} check {name}: OK (parse_args, validate_args, TransformerConfig, "
                  f"initialize_model_parallel); tp/cp/dp/pp/ep/etp/edp groups match the hostfile; "
                  f"NVLink domains per group: " + " ".join(f"{k}={v}" for k, v in worst.items()))


@pytest.mark.parametrize("name", list(REAL_PLANS))
def test_megatron_core_accepts_real_plan(name, megatron_results, emitted, request):
    worst = _megatron_verdict(name, megatron_results, emitted)
    doc = emitted[name][0]
    said = doc["plans"][0]["placement"].get("domains", {})
    for axis in ("tp", "cp", "dp", "pp", "ep"):  # the plan's own account of domains per group
        if axis in said and axis in worst:
            assert worst[axis] == said[axis], (axis, worst[axis], said[axis])
    _say(request, f"megatron-core {MCORE} check {name} ({load_context(doc).config.short()}): OK; groups match "
                  f"the hostfile; domains per group as the plan says: {said}")


@pytest.mark.parametrize("name", [n for n in REAL_PLANS if REAL_PLANS[n]["model"]["name"] in (
    "deepseek-v3", "llama3.1-405b", "llama3-70b", "llama3-8b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b",
    "gpt-oss-20b")])
def test_torchtitan_accepts_real_plan(name, titan_results, emitted, request):
    worst = _titan_verdict(name, titan_results, emitted)
    _say(request, f"torchtitan 0.3.0 check {name}: OK; mesh groups match the hostfile; domains "
                  + " ".join(f"{k}={v}" for k, v in worst.items()))


def test_megatron_core_accepts_random_plans(megatron_results, emitted, request):
    names = [n for n in emitted if n.startswith("random-megatron-")]
    assert len(names) >= 10
    for name in names:
        worst = _megatron_verdict(name, megatron_results, emitted)
        doc = emitted[name][0]
        _say(request, f"megatron-core {MCORE} check {name} ({doc['model']['name']}, "
                      f"{load_context(doc).config.short()}, {len(doc['plans'][0]['placement']['rank_to_gpu'])} x "
                      f"{doc['cluster']['gpu']}, {doc['training']['precision']}): OK; ep domains={worst['ep']}")


def test_megatron_core_rejects_broken_layouts(megatron_results, request):
    for name, (_, _, words) in MEGATRON_NEGATIVE.items():
        r = megatron_results[name]
        assert not r["ok"] and words in r["error"], r
        _say(request, f"megatron-core {MCORE} check {name}: REJECTED as expected ({r['error'][:90]})")


def test_megatron_core_takes_the_optimizer_offload(megatron_results, request):
    """The offloaded plan's args.txt builds megatron-core's OptimizerConfig (training.py:1962-1969) with the
    offload on, the fraction planned, the precision-aware optimizer and the overlap; without the precision-aware
    flag, or with FP8 parameters of a current-scaling recipe, megatron-core refuses it, as topoplan's rules do."""
    from planner.config import ParallelConfig as PC
    from planner.trainers.megatron.rules import OPTIMIZER_OFFLOAD_FP8_MESSAGE

    r = megatron_results["deepseek-v3@64xH100-offload"]
    assert r["ok"], f"megatron-core refused the offload plan at {r['stage']}: {r['error']}"
    o = r["optimizer"]
    assert (o["optimizer_cpu_offload"], o["optimizer_offload_fraction"], o["use_precision_aware_optimizer"],
            o["overlap_cpu_optimizer_d2h_h2d"], o["use_distributed_optimizer"]) == (True, 1.0, True, True, True)
    assert r["args"]["fp8_param_gather"] is False
    for name, (_, _, words) in OFFLOAD_NEGATIVE.items():
        bad = megatron_results[name]
        assert not bad["ok"] and words in bad["error"], bad
        _say(request, f"megatron-core {MCORE} check {name}: REJECTED as expected ({bad['error'][:90]})")
    # topoplan's rule says the same of the FP8 case
    tr = Training(seq_len=4096, global_batch=1024, precision="fp8",
                  recipe={"optimizer_offload_fraction": 1.0, "fp8_param_gather": True})
    v = violations(load_model("deepseek-v3"), PC(tp=4, pp=2, ep=32, etp=1), tr, 64)
    assert [x.rule for x in v] == ["fp8_param_gather_recipe"] and OPTIMIZER_OFFLOAD_FP8_MESSAGE in v[0].message


def test_megatron_schedule_accepts_what_planner_rules_accept(megatron_results, emitted, request):
    """Every emitted plan reached megatron-core's first forward step (step 5), with M and N equal to
    the planner's (M = GBS / (MBS * DP), N = PP); the search's own plans included."""
    from planner import rules
    from planner.trainers.megatron import rules as megatron_rules

    names = [n for n in emitted if megatron_results.get(n)]
    assert any(n.startswith("plan-request-") for n in names)
    for name in names:
        r = megatron_results[name]
        assert r["ok"], f"megatron-core refused {name} at {r['stage']}: {r['error']}"
        ctx = load_context(emitted[name][0])
        c = ctx.config
        assert r["num_microbatches"] == rules.num_microbatches(c, ctx.training, ctx.world)
        if c.pp > 1 and c.vpp > 1:
            assert r["schedule"] == "forward_backward_pipelining_with_interleaving"
            assert r["microbatch_group"] == c.pp
            assert megatron_rules.megatron_interleaved_problem(c.pp, r["num_microbatches"], r["microbatch_group"]) is None
        if name.startswith("plan-request-"):
            _say(request, f"megatron-core {MCORE} schedule check {name} ({ctx.model.name}, {c.short()}, "
                          f"GBS {ctx.training.global_batch}): OK, {r['schedule']} with M={r['num_microbatches']}")


def test_megatron_schedule_refuses_what_planner_rules_refuse(megatron_results, emitted, request):
    from planner import rules
    from planner.trainers.megatron import rules as megatron_rules

    ctx = load_context(emitted["llama3.1-405b@1024xH100"][0])
    for name, (gbs, words) in MEGATRON_SCHEDULE_NEGATIVE.items():
        r = megatron_results[name]
        assert not r["ok"] and r["stage"] == "pipeline schedule" and words in r["error"], r
        tr = ctx.training.model_copy(update={"global_batch": int(gbs)})
        assert [v.rule for v in violations(ctx.model, ctx.config, tr, ctx.world)] == [
            "megatron_interleaved_microbatches"]
        assert megatron_rules.megatron_interleaved_problem(ctx.config.pp, r["num_microbatches"], r["microbatch_group"])
        _say(request, f"megatron-core {MCORE} schedule check {name}: REJECTED as expected ({r['error'][:90]})")


def test_bridge_overrides_are_megatron_fields(megatron_results, emitted):
    """Every model.* / ddp.* override names a real megatron-core config field, and the model.* values
    equal the TransformerConfig megatron-core built from megatron/args.txt."""
    from planner.trainers.megatron.bridge import parse_overrides

    fields = megatron_results["fields"]
    # GPTModelProvider fields (Bridge) and MLATransformerConfig's, not TransformerConfig's
    bridge_only = {"seq_length", "rotary_base", "rotary_percent", "rope_scaling", "rope_scaling_factor",
                   "rotary_scaling_factor", "mscale", "mscale_all_dim", "original_max_position_embeddings",
                   "beta_fast", "beta_slow"}
    for name in EXAMPLES:
        doc, out = emitted[name]
        cfg = megatron_results[name]["config"]
        for key, val in parse_overrides((out / "bridge" / "overrides.txt").read_text()).items():
            section, _, field = key.partition(".")
            if section == "model":
                assert field in fields["model"] or field in bridge_only, key
                if field in cfg and field != "recompute_modules" and (field in fields["model"] or cfg[field] is not None):
                    want = cfg[field]
                    shown = "null" if want is None else (str(want).lower() if isinstance(want, bool) else str(want))
                    assert val.strip("'") == shown, (name, key, val, want)
            elif section == "ddp":
                assert field in fields["ddp"], key
            elif section == "optimizer":   # megatron-core's OptimizerConfig, with the values args.txt gives it
                assert field in fields["optimizer"], key
                want = megatron_results[name]["optimizer"][field]
                assert val.strip("'") == (str(want).lower() if isinstance(want, bool) else str(want)), (name, key)


def _titan_verdict(name, titan_results, emitted):
    r = titan_results[name]
    assert r["ok"], f"torchtitan refused {name} at {r['stage']}: {r['error']}"
    doc, out = emitted[name]
    ctx = load_context(doc)
    c = ctx.config
    p = r["parallelism"]
    assert (p["tensor_parallel_degree"], p["pipeline_parallel_degree"], p["context_parallel_degree"],
            p["data_parallel_shard_degree"]) == (c.tp, c.pp, c.cp, ctx.dp)
    assert r["training"]["global_batch_size"] == ctx.training.global_batch
    # TorchTitan has no ETP: EP borrows from dp_shard * cp * tp, i.e. Megatron's expert grid with ETP = 1
    titan_cfg = c.model_copy(update={"etp": 1})
    axes = dict(TITAN_AXES)
    if not (ctx.model.num_experts and c.ep > 1):
        axes.pop("ep")
    worst = check_groups(doc, out, r["groups"], axes, titan_cfg)
    if "ep" in axes:
        cluster = Cluster.model_validate(doc["cluster"])
        pl = doc["plans"][0]["placement"]
        placement = Placement(world=ctx.world, order=pl["order"], gpus_per_domain=pl["gpus_per_domain"],
                              rank_to_gpu=tuple(pl["rank_to_gpu"]))
        if group_shapes(cluster, titan_cfg, placement)["ep"].domains == 1:
            assert worst["ep"] == 1
    return worst


@pytest.mark.parametrize("name", TITAN_EXAMPLES)
def test_torchtitan_accepts_example(name, titan_results, emitted, request):
    worst = _titan_verdict(name, titan_results, emitted)
    ex = EXAMPLES[name]
    if ex.ep_in_one_domain and "ep" in worst:
        assert worst["ep"] == 1
    _say(request, f"torchtitan 0.3.0 check {name}: OK (ConfigManager.parse_args, ParallelDims, build_mesh); "
                  f"mesh groups match the hostfile; NVLink domains per group: "
                  + " ".join(f"{k}={v}" for k, v in worst.items()))


def test_torchtitan_accepts_random_plans(titan_results, emitted, request):
    names = [n for n in emitted if n.startswith("random-torchtitan-")]
    assert len(names) >= 10
    for name in names:
        worst = _titan_verdict(name, titan_results, emitted)
        doc = emitted[name][0]
        _say(request, f"torchtitan 0.3.0 check {name} ({doc['model']['name']}, {load_context(doc).config.short()}, "
                      f"{len(doc['plans'][0]['placement']['rank_to_gpu'])} x {doc['cluster']['gpu']}): OK")


def test_torchtitan_rejects_world_mismatch(titan_results, request):
    r = titan_results["neg:world-mismatch"]
    assert not r["ok"] and "WORLD_SIZE" in r["error"], r
    _say(request, f"torchtitan 0.3.0 check neg:world-mismatch: REJECTED as expected ({r['error'][:90]})")


MAXTEXT_EXAMPLES = ["deepseek-v3@256xGB300", "llama3.1-405b@1024xH100", "qwen3-235b-a22b@256xGB200"]


@pytest.mark.parametrize("name", MAXTEXT_EXAMPLES)
def test_maxtext_example_obeys_mesh_rules(name, request):
    from planner.trainers.maxtext import emit as maxtext

    from dataclasses import replace

    ctx = load_context(EXAMPLES[name].doc())
    if ctx.config.recompute not in maxtext.REMAT_POLICY:   # DeepSeek-V3's mla_up_proj+moe_act: no MaxText policy
        with pytest.raises(InputError, match="remat_policy"):
            maxtext.overrides(ctx)
        ctx = replace(ctx, config=ctx.config.model_copy(update={"recompute": "full"}))
    o = maxtext.overrides(ctx)
    assert maxtext_mesh_errors(o, ctx.world) == []
    _say(request, f"maxtext mesh-rule check {name}: OK (num_slices={o['num_slices']}, ICI "
                  + " ".join(f"{k[4:-12]}={v}" for k, v in o.items() if k.startswith("ici_") and v > 1) + ", DCN "
                  + " ".join(f"{k[4:-12]}={v}" for k, v in o.items() if k.startswith("dcn_") and v > 1) + ")")


# The dot outputs each MaxText remat policy saves (AI-Hypercomputer/maxtext e591f30 src/maxtext/layers/decoders.py,
# get_remat_policy / minimal_policy; "full" saves none), and the module of the price each name belongs to
# (planner/cost/terms/compute.py: core_attn = the attention core, mlp = the three MLP GEMMs).
MAXTEXT_SAVES = {
    "minimal_with_context": {"query_proj", "key_proj", "value_proj", "out_proj", "context", "mlpwi_0", "mlpwi_1", "mlpwo"},
    "minimal": {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo"},
    "save_dot_except_mlp": {"query_proj", "key_proj", "value_proj", "out_proj"},
    "save_dot_except_mlpwi": {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwo"},
    "save_qkv_proj": {"query_proj", "key_proj", "value_proj"},
    "full": set(),
}
PRICED_MODULE = {"context": "core_attn", "mlpwi_0": "mlp", "mlpwi_1": "mlp", "mlpwo": "mlp", "out_proj": "out_proj",
                 "query_proj": "qkv_proj", "key_proj": "qkv_proj", "value_proj": "qkv_proj"}


@pytest.mark.parametrize("recompute", ["none", "core_attn", "core_attn+mlp", "full"])
def test_maxtext_remat_policy_recomputes_what_the_price_recomputes(recompute):
    from planner.trainers.maxtext import emit as maxtext

    recomputed = {PRICED_MODULE[n] for n in PRICED_MODULE if n not in MAXTEXT_SAVES[maxtext.remat_policy(recompute)]}
    priced = set(PRICED_MODULE.values()) if recompute == "full" else set(ParallelConfig(recompute=recompute).recompute_modules)
    assert recomputed == priced


def test_maxtext_remat_policy_refuses_what_it_cannot_recompute_and_reaches_the_file():
    from dataclasses import replace

    from planner.trainers.maxtext import emit as maxtext

    with pytest.raises(InputError, match="remat_policy"):
        maxtext.remat_policy("mlp")
    ctx = load_context(EXAMPLES["llama3.1-405b@1024xH100"].doc())
    for rc, policy in (("core_attn", "minimal"), ("none", "minimal_with_context")):
        ctx2 = replace(ctx, config=ctx.config.model_copy(update={"recompute": rc}))
        assert maxtext.overrides(ctx2)["remat_policy"] == policy


def _mesh(slices: int, ici: dict, dcn: dict) -> dict:
    axes = ("data", "fsdp", "tensor", "expert", "pipeline")
    return {"num_slices": slices, **{f"ici_{a}_parallelism": ici.get(a, 1) for a in axes},
            **{f"dcn_{a}_parallelism": dcn.get(a, 1) for a in axes}}


# What MaxText 0.2.5's own loader did with these meshes (pyconfig.initialize and
# max_utils.fill_unspecified_mesh_axes / maxtext_utils.create_device_mesh, run on CPU and recorded in
# tests/data/reference/trainers.md 3.2-3.3). MaxText needs Python 3.12 and jax, so it is not
# installed here; the re-stated rules the emitter tests rely on must agree with those outcomes.
MAXTEXT_RECORDED = [
    # 256 fake CPU devices, one slice: create_device_mesh gives fsdp=8, expert=32
    (_mesh(1, {"fsdp": 8, "expert": 32}, {}), 256, None),
    # the same with ici_fsdp_parallelism=3: "Number of devices per slice 256 does not match the product
    # of the ICI parallelism 96"
    (_mesh(1, {"fsdp": 3, "expert": 32}, {}), 256, "ICI product 96 != 256"),
    # AOT, 32 A3 slices of 8 H100: ICI expert=8, DCN data=8 (the -1 resolved) x expert=4
    (_mesh(32, {"expert": 8}, {"data": 8, "expert": 4}), 256, None),
    # MaxTextConfig: "DCN parallelism requested but only one slice available"
    (_mesh(1, {"fsdp": 4}, {"data": 2}), 8, "DCN parallelism requested but only one slice available"),
]


@pytest.mark.parametrize("mesh,devices,error", MAXTEXT_RECORDED)
def test_maxtext_rules_agree_with_the_real_loader(mesh, devices, error):
    errs = maxtext_mesh_errors(mesh, devices)
    if error is None:
        assert errs == []
    else:
        assert error in errs, errs


# --- read back (issue 11 item 3): megatron-core's parse_args and torchtitan's ConfigManager read
# what topoplan's own reader reads ------------------------------------------------------------

def _norm_modules(v):
    return tuple(str(x).split(".")[-1] for x in (v or ()))


def test_megatron_parse_args_reads_what_topoplan_reads(megatron_results, emitted, request):
    from planner.trainers.megatron.emit import PRECISION_FLAGS
    from planner.trainers.megatron.readback import read_megatron

    checked = 0
    for name, (doc, out) in emitted.items():
        r = megatron_results.get(name)
        if not isinstance(r, dict) or not r.get("ok"):
            continue
        ctx = load_context(doc)
        cfg, tr, order = read_megatron(out / "megatron", ctx.model)
        a, rec = r["args"], tr.recipe
        fl = PRECISION_FLAGS[tr.precision]
        want_prec = dict(zip(fl[0::2], fl[1::2]))
        assert (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"], a["context_parallel_size"],
                a["micro_batch_size"], a["global_batch_size"], a["seq_length"]) == (
                    cfg.tp, cfg.pp, cfg.cp, cfg.mbs, tr.global_batch, tr.seq_len), name
        assert (a["virtual_pipeline_model_parallel_size"] or 1) == cfg.vpp, name
        if ctx.model.num_experts:
            assert (a["expert_model_parallel_size"], a["expert_tensor_parallel_size"]) == (cfg.ep, cfg.etp_eff), name
            disp = a["moe_token_dispatcher_type"] + ("-" + a["moe_flex_dispatcher_backend"]
                                                     if a["moe_token_dispatcher_type"] == "flex" else "")
            assert disp == cfg.dispatcher, name
        gran = {"full": "full", "none": None}.get(cfg.recompute, "selective")
        assert a["recompute_granularity"] == gran, name
        if gran == "selective":
            assert tuple(sorted(a["recompute_modules"])) == cfg.recompute_modules, name
        assert bool(a["use_megatron_fsdp"] or a["use_torch_fsdp2"]) == cfg.fsdp, name
        assert (a["fp8"], a["fp8_recipe"] if a["fp8"] else None, a["fp4"]) == (
            want_prec.get("--fp8-format"), want_prec.get("--fp8-recipe"), want_prec.get("--fp4-format")), name
        assert a["cuda_graph_impl"] == rec.cuda_graph_impl, name
        assert _norm_modules(a["cuda_graph_modules"]) == rec.cuda_graph_modules, name
        for field in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "tp_comm_overlap",
                      "moe_permute_fusion", "moe_router_fusion", "cross_entropy_loss_fusion",
                      "moe_router_enable_expert_bias"):
            assert bool(a[field]) == getattr(rec, field), (name, field)
        assert bool(a["use_tp_pp_dp_mapping"]) == (order == "tp-cp-ep-pp-dp"), name
        # what the plan priced is what runs: the recipe as Megatron runs the plan's layout
        from planner.rules import effective_recipe

        assert rec == effective_recipe(ctx.model, ctx.config, ctx.training), name
        checked += 1
    assert checked >= 10
    _say(request, f"megatron-core parse_args == topoplan readback on {checked} emitted plans")


def test_torchtitan_files_train_in_the_plan_precision(titan_results, emitted, request):
    from planner.trainers.torchtitan.emit import cuda_graphs

    checked = 0
    for name, (doc, out) in emitted.items():
        r = titan_results.get(name)
        if not r or not r.get("ok"):
            continue
        ctx = load_context(doc)
        lp = r["precision"]
        prec = ctx.training.precision
        if prec == "bf16":
            assert lp["linear"]["float8"] == lp["linear"]["mxfp8"] == 0, name
        elif prec in ("fp8", "fp8-block"):
            assert lp["linear"]["float8"] > lp["linear"]["bf16"], name
            assert lp["float8_recipes"] == ["tensorwise" if prec == "fp8" else "rowwise"], name
            if ctx.model.num_experts:
                assert lp["experts"]["bf16"] == 0, name
        elif prec == "mxfp8":
            assert lp["linear"]["mxfp8"] > 0 and (not ctx.model.num_experts or lp["experts"]["bf16"] == 0), name
        assert r["cuda_graphs"] == cuda_graphs(ctx), name
        checked += 1
    assert checked >= 5
    _say(request, f"torchtitan ConfigManager: plan precision and CUDA graphs as emitted on {checked} plans")


# --- a user's config.json of a family TorchTitan builds (issue 15) ----------------------------

def _user_configs(root: Path) -> dict[str, Path]:
    """config.json files as a user brings them: catalog shapes renamed, and a dense Qwen3 that the
    catalog does not have (Qwen3-8B's published shape)."""
    from planner.model.spec import catalog_entry

    out = {}
    for name, edit in (("llama3-8b", {}), ("qwen3-30b-a3b", {}),
                       ("deepseek-v3", {"num_hidden_layers": 6, "first_k_dense_replace": 1, "n_routed_experts": 64}),
                       ("gpt-oss-20b", {"num_hidden_layers": 6, "num_local_experts": 16, "num_attention_heads": 32}),
                       ("qwen3-30b-a3b", {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                                          "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
                                          "num_key_value_heads": 8, "intermediate_size": 12288,
                                          "num_experts": None, "num_experts_per_tok": None,
                                          "moe_intermediate_size": None})):
        cfg = {k: v for k, v in catalog_entry(name).items() if k != "source"}
        cfg.update({k: v for k, v in edit.items() if v is not None})
        for k in [k for k, v in edit.items() if v is None]:
            cfg.pop(k, None)
        tag = f"acme-{cfg['model_type']}"
        cfg["_name_or_path"] = f"acme/{tag}"
        d = root / tag
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        out[tag] = d / "config.json"
    return out


def test_torchtitan_builds_a_user_config_json(tmp_path, request):
    """TorchTitan files for a user's Llama, Qwen3, Qwen3-MoE, DeepSeek-V3- and GPT-OSS-shaped config.json
    (the last two cut to 6 layers, 64 / 16 experts, GPT-OSS with 32 heads where torchtitan's own
    builder fixes 64): torchtitan's ConfigManager
    parses them, its mesh has the plan's degrees, and the model it builds (meta device) has exactly
    the parameters topoplan counts for the config.json."""
    from planner.model.flops import param_counts
    from planner.trainers.torchtitan.emit import parse_command

    cases = [("acme-llama", ParallelConfig(tp=2, pp=2, mbs=1), "bf16", 16),
             ("acme-qwen3", ParallelConfig(tp=2, pp=1, mbs=1), "fp8", 16),
             ("acme-qwen3_moe", ParallelConfig(tp=1, pp=2, ep=8, etp=1, mbs=1), "mxfp8", 16),
             ("acme-deepseek_v3", ParallelConfig(tp=1, pp=2, ep=8, etp=1, mbs=1), "mxfp8", 16),
             ("acme-gpt_oss", ParallelConfig(tp=2, pp=2, ep=4, etp=1, mbs=1), "bf16", 16)]
    paths = _user_configs(tmp_path)
    jobs, expect = [], {}
    for tag, cfg, prec, world in cases:
        training = Training(seq_len=4096, global_batch=64, precision=prec, trainer="torchtitan")
        cluster = hgx_cluster("b200", world // 8)
        doc = plan_doc(str(paths[tag]), cluster, cfg, training, world=world)
        out = tmp_path / f"emit-{tag}"
        emit_plan(doc, ["torchtitan"], out)
        # TorchTitan 0.2: job.toml with the config's flavour module where 0.2 can build it (test_torchtitan02.py);
        # not for GPT-OSS (no 0.2.0 model) or DeepSeek-V3's group-limited routing (n_group 8)
        assert (out / "torchtitan" / "job.toml").exists() == (tag not in ("acme-gpt_oss", "acme-deepseek_v3"))
        jobs.append({"id": tag, "args": parse_command((out / "torchtitan" / "command.txt").read_text()),
                     "world": world, "sm": 100, "path": str(out / "torchtitan")})
        expect[tag] = (cfg, world, param_counts(load_model(str(paths[tag]))).total)
    results = {r["id"]: r for r in _run("torchtitan_check.py", jobs, tmp_path)}
    for tag, (cfg, world, params) in expect.items():
        r = results[tag]
        assert r["ok"], f"torchtitan refused {tag} at {r['stage']}: {r['error']}"
        par = r["parallelism"]
        assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["expert_parallel_degree"],
                par["data_parallel_shard_degree"]) == (cfg.tp, cfg.pp, cfg.ep, world // cfg.model_parallel)
        assert r["params"] == params, (tag, r["params"], params)
        _say(request, f"torchtitan 0.3.0 check {tag} (user config.json): OK, {params:,} parameters as topoplan counts")


def test_torchtitan_refuses_a_user_config_it_cannot_build(tmp_path):
    from planner.model.spec import catalog_entry

    cfg = {k: v for k, v in catalog_entry("mixtral-8x7b").items() if k != "source"}
    p = tmp_path / "mixtral" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(cfg))
    doc = plan_doc(str(p), hgx_cluster("h100", 2), ParallelConfig(tp=2, ep=8, etp=1, mbs=1),
                   Training(seq_len=4096, global_batch=64, precision="bf16", trainer="torchtitan"), world=16)
    with pytest.raises(InputError, match="model_type 'mixtral'.*llama \\(llama3\\)"):
        emit_plan(doc, ["torchtitan"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- Llama 4 and GLM-4.5 on Megatron (issue 15) ------------------------------------------------

def test_megatron_builds_llama4_and_glm45(mcore_dir, tmp_path, request):
    """megatron-core's parse_args, validate_args and TransformerConfig accept the emitted args of Llama 4
    Scout / Maverick and GLM-4.5, and the config megatron builds has their architecture: GLM's RoPE on
    half of each head (partial_rotary_factor 0.5), Llama 4's NoPE layer every 4th, interleaved MoE
    (Maverick), shared expert, sigmoid routing applied to the expert input, L2 q/k norm where the
    config has use_qk_norm."""
    from planner.trainers.megatron.emit import hf_extras

    cases = {"glm-4.5": ParallelConfig(tp=2, pp=4, ep=8, etp=1, mbs=1),
             "llama4-scout": ParallelConfig(tp=2, pp=2, ep=8, etp=1, mbs=1),
             "llama4-maverick": ParallelConfig(tp=2, pp=4, ep=16, etp=1, mbs=1)}
    jobs = []
    for name, cfg in cases.items():
        training = Training(seq_len=4096, global_batch=256, precision="bf16")
        doc = plan_doc(name, hgx_cluster("b200", 8), cfg, training, world=64)
        out = tmp_path / name
        emit_plan(doc, ["megatron"], out)
        jobs.append({"id": name, "args": bash_words(out / "megatron" / "args.txt"), "env": _megatron_env(out),
                     "sm": 100})
    data = _run("megatron_check.py", jobs, tmp_path, str(mcore_dir))
    res = {r["id"]: r for r in data["results"]}
    for name in cases:
        r = res[name]
        assert r["ok"], f"megatron-core refused {name} at {r['stage']}: {r['error']}"
        m, hf, c = load_model(name), hf_extras(load_model(name)), r["config"]
        assert c["num_moe_experts"] == m.num_experts and c["moe_shared_expert_intermediate_size"] == m.shared_ffn_hidden_size
        assert [int(x) for x in c["moe_layer_freq"]] == [int(x) for x in m.moe_layers] if isinstance(
            c["moe_layer_freq"], list) else all(m.moe_layers)
        assert r["args"]["rotary_base"] == int(hf.get("rope_theta"))
        if name == "glm-4.5":
            assert r["args"]["rotary_percent"] == 0.5 == hf["partial_rotary_factor"]
        else:
            n = len(m.moe_layers)
            # HF Llama 4: layer i has no RoPE when (i + 1) % 4 == 0
            assert c["no_rope_freq"] == [int((i + 1) % 4 == 0) for i in range(n)]
            assert c["qk_l2_norm"] is bool(hf["use_qk_norm"])
            assert c["moe_router_score_function"] == "sigmoid" and c["moe_apply_probs_on_input"] is True
            assert c["rotary_interleaved"] is True
        _say(request, f"megatron-core {MCORE} check {name}: OK (rotary {r['args']['rotary_percent']}, "
                      f"moe_layer_freq as the spec)")


def test_torchtitan_builds_the_planned_model(titan_results, emitted, request):
    """Every emitted TorchTitan plan (examples, real plans, random plans) builds, on the meta device,
    a model with exactly the parameters topoplan prices (without MTP: torchtitan's registry functions
    build none)."""
    from planner.model.flops import param_counts
    from planner.model.spec import ModelSpec

    checked = set()
    for name, (doc, out) in emitted.items():
        r = titan_results.get(name)
        if r is None or not r["ok"]:
            continue
        m = ModelSpec.model_validate(doc["model"]["spec"])
        want = param_counts(m).total
        assert r["params"] == want, (name, r["params"], want)
        checked.add(m.name)
    assert len(checked) >= 4, checked
    _say(request, f"torchtitan 0.3.0 meta-device build: parameters as topoplan counts for {sorted(checked)}")
