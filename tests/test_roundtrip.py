"""Emit, read back, predict: the launch files run what the plan priced (issue 11 items 1-3).

``roundtrip_check.assert_round_trip(doc)`` renders a plan's launch files, reads them back with
``planner.output.emit.readback`` (no trainer installed), and checks that the layout, the training
setup with its recipe (as the trainer runs it: ``planner.rules.effective_recipe``) and the predicted
throughput equal the plan's. tests/conftest.py applies it to every plan the test suite makes; here it
runs on the examples' launch files, the README plan, NVIDIA's layout, hypothesis-random feasible
layouts with random recipe switches, TorchTitan plans, and on mutants that drop one flag (each must
fail the check).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Training
from planner.errors import InfeasibleError, InputError
from planner.cost.placement import make_placement
from planner.cost.predict import predict
from planner.model.spec import load_model
from planner.output.emit import load_context
from planner.trainers.megatron.emit import OPTIMIZER_OFFLOAD_FLAGS, RECIPE_FLAGS, megatron_args
from planner.output.emit.readback import read_files
from planner.rules import effective_recipe, violations
from planner.search.plan import plan
from roundtrip_check import assert_round_trip
from topologies.loader import load_cluster


def _doc_for(model_name, preset, gpus, training, config, usable=None):
    """A plan document for one given layout (the plan's own writer, the layout forced by restrict)."""
    model = load_model(model_name)
    cluster = load_cluster(preset, gpus=gpus, usable_per_domain=usable)
    restrict = {"tp": [config.tp], "pp": [config.pp], "vpp": [config.vpp], "cp": [config.cp], "ep": [config.ep],
                "etp": [config.etp], "mbs": [config.mbs], "recompute": [config.recompute], "fsdp": [config.fsdp],
                "dispatcher": [config.dispatcher], "split": [0], "gpd": [None], "dp": [config.dp]}
    if config.dispatcher is None:
        del restrict["dispatcher"]
    # the layout's values join the search space (some, e.g. recompute "moe", are not searched by default)
    include = {k: v for k, v in restrict.items() if k not in ("split", "gpd")}
    return plan(model, cluster, training, top=1, restrict=restrict, include=include, min_world=gpus).to_dict()


@pytest.fixture(scope="module")
def dsv3_doc():
    model = load_model("deepseek-v3")
    cluster = load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    tr = Training(seq_len=4096, global_batch=4096, precision="mxfp8")
    return plan(model, cluster, tr, top=3).to_dict()


def test_the_readme_plan_reads_back_to_its_prediction(dsv3_doc):
    for i in range(len(dsv3_doc["plans"])):
        assert_round_trip(dsv3_doc, i)
    args = megatron_args(load_context(dsv3_doc, 0))
    assert "--cuda-graph-impl" in args and "--moe-router-enable-expert-bias" in args


def test_nvidia_layout_files_run_at_the_planned_speed():
    # TP1 PP2 VPP8 EP32 on 256 GB300 (NVIDIA's layout): the files now switch on what the profile assumes,
    # so they predict the plan's figure, well above the eager recipe the files used to describe
    tr = Training(seq_len=4096, global_batch=4096, precision="mxfp8")
    cfg = ParallelConfig(tp=1, pp=2, vpp=8, ep=32, dp=128, dispatcher="flex-hybridep")
    doc = _doc_for("deepseek-v3", "gb300-nvl72", 256, tr, cfg, usable=64)
    assert_round_trip(doc)
    eager = predict(load_model("deepseek-v3"), load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64), cfg,
                    tr.model_copy(update={"cuda_graphs": False,
                                          "recipe": tr.recipe.model_copy(update={"cuda_graph_impl": "none"})}))
    assert doc["plans"][0]["prediction"]["tflops_per_gpu"] > 1.1 * eager.tflops_per_gpu


@pytest.mark.parametrize("flag", sorted(set(RECIPE_FLAGS.values()) | set(OPTIMIZER_OFFLOAD_FLAGS)
                                        | {"--pipeline-model-parallel-layout", "--moe-flex-dispatcher-backend",
                                           "--fp8-recipe"}))
def test_a_flag_the_reader_cannot_see_fails_the_round_trip(dsv3_doc, flag):
    # mutant: the emitted text without one flag (and its values) must not pass the round trip, while
    # the text as emitted does (the control)
    if flag == "--pipeline-model-parallel-layout":
        doc = _doc_for("deepseek-v3", "gb300-nvl72", 256, Training(seq_len=4096, global_batch=4096, precision="mxfp8"),
                       ParallelConfig(tp=1, pp=2, vpp=8, ep=32, dp=128, dispatcher="flex-hybridep"), usable=64)
    elif flag == "--cpu-offloading-num-layers":   # dense, pp 1, over PCIe: the offload is priced
        doc = _doc_for("llama3-8b", "dgx-h100", 8, Training(seq_len=8192, global_batch=64, precision="bf16",
                                                            recipe={"cpu_offload_layers": 16}),
                       ParallelConfig(fsdp=True, dp=8))
    elif flag == "--fp4-param-gather":   # NVFP4 parameters: an nvfp4 plan (the README plan is MXFP8)
        doc = _doc_for("llama3-8b", "gb200-nvl72", 8, Training(seq_len=8192, global_batch=64, precision="nvfp4"),
                       ParallelConfig(dp=8))
    elif flag in OPTIMIZER_OFFLOAD_FLAGS or "optimizer" in flag:   # half the optimizer on the host
        doc = _doc_for("llama3-8b", "dgx-h100", 8, Training(seq_len=4096, global_batch=64, precision="bf16",
                                                            recipe={"optimizer_offload_fraction": 0.5}),
                       ParallelConfig(dp=8, recompute="full"))
    elif flag == "--tp-comm-overlap":
        doc = _doc_for("qwen3-30b-a3b", "gb200-nvl72", 64, Training(seq_len=4096, global_batch=512, precision="mxfp8"),
                       ParallelConfig(tp=2, pp=1, ep=8, etp=1, dp=32, dispatcher="alltoall"))
    else:   # the README plan: graphs, the all-to-all overlap, the fusions, expert bias, MXFP8, HybridEP
        doc = dsv3_doc
    args = megatron_args(load_context(doc, 0))
    assert flag in args, f"{flag} is not written for this plan"
    assert_round_trip(doc, 0, args)   # control
    i = args.index(flag)
    j = i + 1
    while j < len(args) and not args[j].startswith("--"):
        j += 1
    mutant = args[:i] + args[j:]
    with pytest.raises((AssertionError, InputError)):
        assert_round_trip(doc, 0, mutant)


MOE_CASES = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2]), "pp": st.sampled_from([1, 2, 4]), "vpp": st.sampled_from([1, 2]),
    "ep": st.sampled_from([8, 16, 32]), "recompute": st.sampled_from(["none", "moe_act", "moe", "full", "core_attn"]),
    "dispatcher": st.sampled_from(["alltoall", "flex-hybridep"]), "fsdp": st.booleans(),
    "cuda_graphs": st.booleans(), "a2a": st.sampled_from([None, False]), "tpo": st.sampled_from([None, False]),
})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MOE_CASES)
def test_random_feasible_layouts_round_trip(case):
    assume(not (case["vpp"] > 1 and case["pp"] < 2))   # VPP needs PP > 1: not a layout
    tp, pp = case["tp"], case["pp"]
    dp = 64 // (tp * pp)
    recipe = {"overlap_moe_expert_parallel_comm": case["a2a"], "tp_comm_overlap": case["tpo"]}
    tr = Training(seq_len=4096, global_batch=512, precision="mxfp8", cuda_graphs=case["cuda_graphs"], recipe=recipe)
    cfg = ParallelConfig(tp=tp, pp=pp, vpp=case["vpp"], ep=case["ep"], dp=dp, recompute=case["recompute"],
                         dispatcher=case["dispatcher"], fsdp=case["fsdp"], etp=1 if tp > 1 else None)
    model = load_model("qwen3-30b-a3b")
    assume(not violations(model, cfg, tr, 64))   # a trainer refuses it: not a plan
    try:
        doc = _doc_for("qwen3-30b-a3b", "gb200-nvl72", 64, tr, cfg)
    except InfeasibleError as e:   # only "does not fit in memory" is not a plan; any other error fails the test
        assert "GiB" in str(e), e
        assume(False)
    assert_round_trip(json.loads(json.dumps(doc)))


def test_required_setting_a_layout_refuses_is_a_rule_and_auto_switches_it_off():
    model = load_model("deepseek-v3")
    cfg = ParallelConfig(tp=1, pp=4, vpp=1, ep=32, dispatcher="alltoall")
    auto = Training(global_batch=4096, precision="mxfp8")
    required = auto.model_copy(update={"recipe": auto.recipe.model_copy(
        update={"overlap_moe_expert_parallel_comm": True})})
    assert effective_recipe(model, cfg, auto).overlap_moe_expert_parallel_comm is False   # PP > 1 without VPP
    assert [v.rule for v in violations(model, cfg, required, 256)] == ["moe_a2a_overlap_layout"]
    ok = cfg.model_copy(update={"vpp": 2})
    assert effective_recipe(model, ok, auto).overlap_moe_expert_parallel_comm is True
    assert not violations(model, ok, required, 256)


def test_switched_off_overlap_is_priced_without_overlap():
    # ep.overlap of the profile hides part of the all-to-all; with the overlap off, the term is whole
    model = load_model("deepseek-v3")
    cl = load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    cfg = ParallelConfig(tp=1, pp=2, vpp=8, ep=32, dispatcher="flex-hybridep")
    on = Training(global_batch=4096, precision="mxfp8")
    off = on.model_copy(update={"recipe": on.recipe.model_copy(update={"overlap_moe_expert_parallel_comm": False})})
    p_on, p_off = predict(model, cl, cfg, on), predict(model, cl, cfg, off)
    raw = p_on.details["a2a_layer_s"]
    assert raw > 0 and p_off.breakdown["ep_a2a"] > p_on.breakdown["ep_a2a"]
    moe_layers = sum(model.moe_layers) + model.mtp_layers
    # exposed = raw per layer and micro-batch, for every MoE layer of the mean pipeline rank
    assert p_off.breakdown["ep_a2a"] == pytest.approx(p_off.details["microbatches"] * raw * moe_layers / cfg.pp,
                                                      rel=1e-9)


def test_trainer_picks_its_own_profile_and_torchtitan_files_carry_fp8(tmp_path):
    model = load_model("llama3.1-405b")
    cluster = load_cluster("dgx-h100", gpus=1024)
    tr = Training(seq_len=8192, global_batch=2048, precision="fp8", trainer="torchtitan")
    assert tr.stack == "torchtitan"
    doc = plan(model, cluster, tr, top=1).to_dict()
    assert doc["training"]["stack"] == "torchtitan"
    from planner.output.emit import render_files

    files = render_files(load_context(doc, 0), ["torchtitan"])
    reg = files["torchtitan/topoplan_config.py"]
    assert 'Float8LinearConverter.Config(recipe_name="tensorwise"' in reg
    assert "--module topoplan_config --config llama3_1_405b_fp8" in files["torchtitan/command.txt"]
    bf = copy.deepcopy(doc)
    bf["training"]["precision"] = "bf16"
    reg_bf = render_files(load_context(bf, 0), ["torchtitan"])["torchtitan/topoplan_config.py"]
    assert "converters=None" in reg_bf   # llama3_405b's built-in float8 converter is dropped for a BF16 plan


@pytest.mark.parametrize("model_name,preset,gpus,gbs,seq,precision", [
    ("llama3.1-405b", "dgx-h100", 1024, 2048, 8192, "fp8"),
    ("llama3-70b", "dgx-h100", 64, 256, 4096, "bf16"),
    ("deepseek-v3", "dgx-h100", 256, 1024, 4096, "fp8"),
])
def test_torchtitan_plans_read_back_to_their_prediction(model_name, preset, gpus, gbs, seq, precision):
    tr = Training(seq_len=seq, global_batch=gbs, precision=precision, trainer="torchtitan")
    doc = plan(load_model(model_name), load_cluster(preset, gpus=gpus), tr, top=2).to_dict()
    for i in range(len(doc["plans"])):
        assert_round_trip(doc, i)


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("script,files", [("deepseek_v3_gb300_megatron.py", "megatron/args.txt"),
                                          ("llama405b_h100_torchtitan.py", "torchtitan/command.txt"),
                                          ("launcher_api.py", "megatron/args.txt")])
def test_examples_launch_files_read_back_to_their_plan(tmp_path, script, files):
    # the example writes plan.json and the files; reading the files back predicts plan #1's figure
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(EXAMPLES / script), "--out", str(out)], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path, env={**os.environ, "TOPOPLAN_NO_PROGRESS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    plan_json = next(out.rglob("plan.json"))
    doc = json.loads(plan_json.read_text())
    ctx = load_context(doc, 0)
    cfg, tr, order = read_files(plan_json.parent / files, ctx.model, ctx.world)
    assert tr.recipe == effective_recipe(ctx.model, ctx.config, ctx.training)
    assert (cfg.tp, cfg.pp, cfg.vpp, cfg.cp, cfg.ep, cfg.mbs, cfg.recompute) == (
        ctx.config.tp, ctx.config.pp, ctx.config.vpp, ctx.config.cp, ctx.config.ep, ctx.config.mbs, ctx.config.recompute)
    tr = tr.model_copy(update={"memory_headroom": ctx.training.memory_headroom})
    placement = make_placement(ctx.cluster, cfg, ctx.world, doc["plans"][0]["placement"].get("gpus_per_domain"),
                               order=order)
    pred = predict(ctx.model, ctx.cluster, cfg, tr, placement=placement)
    assert pred.tflops_per_gpu == pytest.approx(doc["plans"][0]["prediction"]["tflops_per_gpu"], rel=1e-9)


@pytest.mark.parametrize("drop", ["--parallelism.module_fqns_per_model_part", "--training.no_disable_cuda_graphs",
                                  "converters", "--parallelism.expert_parallel_degree"])
def test_torchtitan_files_without_a_setting_fail_the_round_trip(drop):
    from planner.output.emit import render_files
    from planner.trainers.torchtitan.readback import torchtitan_setup
    from planner.trainers.torchtitan.emit import parse_command

    if drop == "--training.no_disable_cuda_graphs":   # graphs run only without PP and EP
        tr = Training(seq_len=4096, global_batch=64, precision="fp8", trainer="torchtitan")
        doc = _doc_for("llama3-8b", "dgx-h100", 16, tr, ParallelConfig(tp=2, pp=1, dp=8, fsdp=True))
    else:
        tr = Training(seq_len=4096, global_batch=256, precision="fp8", trainer="torchtitan")
        doc = _doc_for("qwen3-30b-a3b", "dgx-h100", 64, tr,
                       ParallelConfig(tp=1, pp=2, vpp=4, ep=8, dp=32, fsdp=True, dispatcher="alltoall"))
    ctx = load_context(doc, 0)
    files = render_files(ctx, ["torchtitan"])
    args = parse_command(files["torchtitan/command.txt"])
    reg = files.get("torchtitan/topoplan_config.py")
    assert_round_trip(doc, 0)   # control
    if drop == "converters":
        # the registry no longer applies the float8 converters
        reg = "\n".join(ln if "converters=" not in ln else ln.split("converters=")[0] + "converters=None)"
                        for ln in reg.splitlines())
        mutant = args
    else:
        assert drop in args
        i = args.index(drop)
        j = i + 1
        while j < len(args) and not args[j].startswith("-") and ":" not in args[j]:
            j += 1
        mutant = args[:i] + args[j:]
    cfg_b, tr_b, _ = torchtitan_setup(mutant, ctx.model, ctx.world, registry_text=reg)
    same = (cfg_b.vpp, cfg_b.ep, tr_b.precision, tr_b.recipe) == (
        ctx.config.vpp, ctx.config.ep, ctx.training.precision, effective_recipe(ctx.model, ctx.config, ctx.training))
    assert not same, drop


def test_cli_predict_from_files_and_its_refusals(tmp_path, capsys):
    from planner.cli import main

    out = tmp_path / "launch"
    assert main(["plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "128",
                 "--precision", "fp8", "--top", "1", "--emit", "megatron,torchtitan", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = doc["plans"][0]["prediction"]["tflops_per_gpu"]
    assert doc["header"] == {"stack": "megatron-26.08", "trainer": "megatron", "model": "qwen3-30b-a3b",
                             "cluster": doc["cluster"]["name"], "gpus_offered": 16,
                             "gpus_used": doc["plans"][0]["config"]["world"], "precision": "fp8", "seq_len": 4096,
                             "global_batch": 128}
    gpd = doc["plans"][0]["placement"]["gpus_per_domain"]
    base = ["predict", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16", "--json"] + (
        ["--gpus-per-domain", str(gpd)] if gpd else [])
    assert main(base + ["--from", str(out / "megatron" / "args.txt")]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tflops_per_gpu"] == pytest.approx(want, rel=1e-9)
    assert got["header"]["trainer"] == "megatron"
    # the same layout as TorchTitan runs it is priced with TorchTitan's own profile
    assert main(base + ["--from", str(out / "torchtitan")]) == 0
    assert json.loads(capsys.readouterr().out)["header"]["stack"] == "torchtitan"
    # refusals: one line, exit 2
    for args, words in ((["--from", str(tmp_path / "nothing.txt")], "cannot read"),
                        (["--model", "llama3-8b", "--from", str(out / "megatron" / "args.txt")], "--num-layers")):
        argv = list(base)
        if "--model" in args:
            argv[argv.index("--model") + 1] = args[args.index("--model") + 1]
            args = args[2:]
        assert main(argv + args) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1
