"""Emitters without the trainers: file layout, atomic writes, the CLI, shell syntax read back by bash,
the Slurm rank order read back the way Slurm and torchrun assign ranks, MaxText's mesh rules, and
Bridge overrides against the Megatron arguments. (tests/test_emit_trainers.py runs the trainers.)"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Training
from planner.output.emit import ALL, EMITTERS, emit_plan, load_context, parse_trainers, render_files
from planner.output.emit import slurm
from planner.trainers.maxtext import emit as maxtext
from planner.trainers.megatron import bridge
from planner.trainers.megatron import emit as megatron
from planner.errors import InputError
from planner.rules import violations
from topologies.cluster import Cluster
from trainers.plans import hgx_cluster, nvl72_cluster, plan_doc
from trainers.maxtext_rules import maxtext_mesh_errors
from trainers.sites import bash_words, srun_sites, torchrun_sites

DSV3 = ("deepseek-v3", lambda: nvl72_cluster("gb300", 4),
        ParallelConfig(tp=1, pp=2, vpp=8, ep=32, mbs=1, recompute="mla_up_proj+moe_act", dispatcher="flex-hybridep"),
        Training(seq_len=4096, global_batch=4096, precision="mxfp8"), 256)


@pytest.fixture(scope="module")
def dsv3_doc():
    m, cl, c, t, w = DSV3
    return plan_doc(m, cl(), c, t, world=w)


def _sites_from_plan(doc):
    gpus = Cluster.model_validate(doc["cluster"]).gpus()
    return [(gpus[g].node, gpus[g].local) for g in doc["plans"][0]["placement"]["rank_to_gpu"]]


# --- Megatron argument pieces ---------------------------------------------------------------

def test_moe_layer_freq_dsv3_matches_megatron_recipe():
    # trainers.md 1.3: DeepSeek-V3's first three layers are dense
    pattern = tuple([False] * 3 + [True] * 58)
    assert megatron.moe_layer_freq(pattern) == "([0]*3+[1]*58)"
    assert megatron.moe_layer_freq((True,) * 94) == "1"


@given(st.lists(st.booleans(), min_size=1, max_size=80))
@settings(max_examples=60, deadline=None)
def test_moe_layer_freq_evaluates_to_the_pattern(flags):
    expr = megatron.moe_layer_freq(flags)
    if all(flags):
        assert expr == "1"
    else:  # Megatron evaluates the string as a Python list expression
        assert eval(expr) == [int(f) for f in flags]  # noqa: S307 - the oracle is Python's own evaluation


def test_window_skip_freq_gpt_oss_alternation():
    # GPT-OSS: layer i is sliding when i is even; Megatron: full attention where (i + 1) % n == 0
    swa = tuple(i % 2 == 0 for i in range(36))
    assert megatron.window_skip_freq(swa) == 2
    assert megatron.window_skip_freq((True,) * 8) is None


@given(st.lists(st.text(alphabet="ab'\" ()*|[]$-=,\\x", min_size=1, max_size=8), min_size=1, max_size=12))
@settings(max_examples=40, deadline=None)
def test_args_file_round_trips_through_bash(tmp_path_factory, words):
    args = ["--flag"] + words
    text = megatron.render_args(args)
    assert megatron.parse_args_file(text) == args
    p = tmp_path_factory.mktemp("args") / "args.txt"
    p.write_text(text)
    assert bash_words(p) == args


def test_megatron_env_asserted_connections_rule():
    # validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP>1 on sm<100, FSDP asserts it is not 1
    h100 = hgx_cluster("h100", 4)
    t = Training(seq_len=4096, global_batch=64)
    ctx = load_context(plan_doc("llama3-70b", h100, ParallelConfig(tp=8, pp=1), t))
    assert megatron.megatron_env(ctx)["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    ctx = load_context(plan_doc("llama3-70b", h100, ParallelConfig(tp=8, pp=1, fsdp=True), t))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in megatron.megatron_env(ctx)
    ctx = load_context(plan_doc("llama3-70b", h100, ParallelConfig(tp=1, pp=1), t))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in megatron.megatron_env(ctx)
    gb = nvl72_cluster("gb300", 1)
    ctx = load_context(plan_doc("llama3-70b", gb, ParallelConfig(tp=8, pp=1), t, world=64))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in megatron.megatron_env(ctx)


def test_dsv3_args_carry_the_model_and_layout(dsv3_doc):
    ctx = load_context(dsv3_doc)
    a = megatron.megatron_args(ctx)
    pairs = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--") and not a[i + 1].startswith("--")}
    assert pairs["--num-layers"] == "61" and pairs["--num-experts"] == "256" and pairs["--moe-router-topk"] == "8"
    assert pairs["--q-lora-rank"] == "1536" and pairs["--kv-lora-rank"] == "512" and pairs["--mtp-num-layers"] == "1"
    assert pairs["--moe-router-num-groups"] == "8" and pairs["--moe-router-group-topk"] == "4"
    assert pairs["--expert-model-parallel-size"] == "32" and pairs["--fp8-recipe"] == "mxfp8"
    layout = pairs["--pipeline-model-parallel-layout"]
    # 61 decoder layers, one MTP layer, 2 * 8 virtual stages (the stage separators)
    expanded = _expand_layout(layout)
    assert expanded.count("t") == 61 and expanded.count("m") == 1 and expanded.count("|") == 15
    assert a[a.index("--recompute-modules") + 1: a.index("--recompute-modules") + 3] == ["mla_up_proj", "moe_act"]
    assert pairs["--moe-token-dispatcher-type"] == "flex" and pairs["--moe-flex-dispatcher-backend"] == "hybridep"


def _expand_layout(s: str) -> str:
    """Expand Megatron's layout shorthand (``x*n``, ``(..)*n``) by hand: an independent reader."""
    import re

    while "(" in s:
        s = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return re.sub(r"([a-zA-Z])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)


# --- files, atomicity, CLI ------------------------------------------------------------------

def test_emit_writes_every_file_atomically(tmp_path, dsv3_doc):
    out = tmp_path / "out"
    # MaxText cannot run this PP2 DeepSeek plan (its deepseek block leaves the dense layers out of the
    # pipeline): "all" refuses it whole, naming the rule, and writes nothing
    with pytest.raises(InputError, match="maxtext_pipeline_layout"):
        emit_plan(dsv3_doc, "all", out)
    assert not out.exists() or not any(out.iterdir())
    paths = emit_plan(dsv3_doc, [t for t in ALL if t != "maxtext"], out)
    rel = sorted(str(p.relative_to(out)) for p in paths)
    assert rel == ["bridge/overrides.txt", "megatron/args.txt", "megatron/env.sh",
                   "plan.json", "slurm/domains.txt", "slurm/hostfile", "slurm/local_gpus", "slurm/place.py",
                   "slurm/sbatch.sh", "slurm/shape.json", "slurm/task.sh", "torchtitan/command.txt",
                   "torchtitan/job.toml", "torchtitan/topoplan_config.py"]   # MXFP8 converters: a registry of its own
    assert json.loads((out / "plan.json").read_text()) == dsv3_doc
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_failed_emit_leaves_directory_untouched(tmp_path):
    # mixtral has no TorchTitan model: the torchtitan emitter refuses after megatron rendered fine
    doc = plan_doc("mixtral-8x7b", hgx_cluster("h100", 2), ParallelConfig(tp=2, ep=8),
                   Training(seq_len=4096, global_batch=64))
    out = tmp_path / "out"
    emit_plan(doc, ["slurm"], out)   # the same plan's files already there (another plan's are refused first)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(InputError, match="torchtitan"):
        emit_plan(doc, ["megatron", "torchtitan"], out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not [p for p in tmp_path.iterdir() if p.name != "out"]


def test_parse_trainers():
    assert parse_trainers("all") == list(ALL) == [e for e in EMITTERS if not e.startswith("k8s")]
    assert parse_trainers("slurm, Megatron,slurm") == ["slurm", "megatron"]
    with pytest.raises(InputError, match="--trainer 'nemo'"):
        parse_trainers("megatron,nemo")


def _cli(*argv):
    """The CLI's main in this process, as the console script runs it: (exit code, stdout, stderr)."""
    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_cli_emit(tmp_path, dsv3_doc):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(dsv3_doc))
    rc, out, err = _cli("emit", str(plan), "--trainer", "megatron,slurm", "--out", str(tmp_path / "o"), "--json")
    assert rc == 0, err
    files = json.loads(out)["files"]
    assert any(f.endswith("megatron/args.txt") for f in files) and any(f.endswith("slurm/hostfile") for f in files)
    rc, _, err = _cli("emit", str(plan), "--trainer", "megatron", "--out", str(tmp_path / "p"), "--index", "3")
    assert rc == 2 and err.startswith("error: --index 3") and "Traceback" not in err
    assert not (tmp_path / "p").exists()
    rc, _, err = _cli("emit", str(tmp_path / "missing.json"), "--trainer", "megatron", "--out", str(tmp_path / "q"))
    assert rc == 2 and "missing.json" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"plans": [{}], "model": {"spec": {}}}))
    rc, _, err = _cli("emit", str(bad), "--trainer", "megatron", "--out", str(tmp_path / "r"))
    assert rc == 2 and "plan.json" in err and len(err.strip().splitlines()) == 1


# --- Slurm rank order ------------------------------------------------------------------------

def test_hostfile_and_task_reproduce_the_placement(tmp_path, dsv3_doc):
    out = tmp_path / "o"
    emit_plan(dsv3_doc, ["slurm"], out)
    want = _sites_from_plan(dsv3_doc)
    assert srun_sites(out) == want
    assert torchrun_sites(out, 4) == want  # whole 4-GPU trays in rank order: torchrun works too
    sb = (out / "slurm" / "sbatch.sh").read_text()
    assert "--distribution=arbitrary" in sb and 'SLURM_HOSTFILE="$TOPOPLAN_DIR/slurm/hostfile"' in sb
    # 64 of 72 GPUs per rack: 16 trays of each of the 4 racks
    assert "#SBATCH --nodes=64" in sb
    subprocess.run(["bash", "-n", str(out / "slurm" / "sbatch.sh")], check=True)
    subprocess.run(["bash", "-n", str(out / "slurm" / "task.sh")], check=True)


def test_failed_gpu_placement_needs_srun_launcher(tmp_path):
    # one failed GPU: its host runs 7 ranks, so torchrun's node_rank * 8 + local_rank cannot express it
    cl = hgx_cluster("h100", 3, failed_gpus=["h100-n0001:3"])
    doc = plan_doc("llama3-8b", cl, ParallelConfig(tp=1, pp=1), Training(seq_len=4096, global_batch=46), world=23)
    out = tmp_path / "o"
    emit_plan(doc, ["slurm"], out)
    want = _sites_from_plan(doc)
    assert ("h100-n0001", 3) not in want
    assert srun_sites(out) == want
    assert torchrun_sites(out, 8) is None


def test_srun_task_runs_the_emitted_megatron_argv(tmp_path, dsv3_doc):
    """task.sh as srun starts it, with a stand-in pretrain_gpt.py that records its argv and env."""
    out = tmp_path / "o"
    emit_plan(dsv3_doc, ["megatron", "slurm"], out)
    fake = tmp_path / "mlm"
    fake.mkdir()
    (fake / "pretrain_gpt.py").write_text(
        "import json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in "
        "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'NVLINK_DOMAIN_SIZE')}}, open(sys.argv[0] + '.out', 'w'))\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "TOPOPLAN_DIR": str(out), "MEGATRON_LM": str(fake),
           "SLURM_PROCID": "37"}
    subprocess.run(["bash", str(out / "slurm" / "task.sh")], env=env, check=True, capture_output=True)
    got = json.loads((fake / "pretrain_gpt.py.out").read_text())
    assert got["argv"] == megatron.megatron_args(load_context(dsv3_doc))
    host, local = _sites_from_plan(dsv3_doc)[37]
    assert got["env"] == {"RANK": "37", "LOCAL_RANK": str(local), "WORLD_SIZE": "256",
                          "MASTER_ADDR": "gb300-r01-t01", "NVLINK_DOMAIN_SIZE": "72"}


# --- MaxText mesh rules ----------------------------------------------------------------------

LAYOUTS = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2, 4, 8]), "pp": st.sampled_from([1, 2, 4]), "cp": st.sampled_from([1, 2]),
    "ep": st.sampled_from([1, 2, 4, 8, 16, 32, 64]), "mbs": st.sampled_from([1, 2]),
})


@given(layout=LAYOUTS, racks=st.integers(1, 4), model=st.sampled_from(["deepseek-v3", "qwen3-30b-a3b", "llama3-70b"]),
       per=st.sampled_from([None, 64, 32]))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_maxtext_overrides_obey_maxtext_mesh_rules(layout, racks, model, per):
    cl = nvl72_cluster("gb200", racks)
    from planner.model.spec import load_model

    spec = load_model(model)
    usable = racks * (per or 72)
    mp = layout["tp"] * layout["cp"] * layout["pp"]
    world = usable - usable % mp
    assume(world > 0)
    cfg = ParallelConfig(**{**layout, "ep": layout["ep"] if spec.num_experts else 1})
    dp = world // mp
    gbs = dp * cfg.mbs * 4
    t = Training(seq_len=4096, global_batch=gbs)
    assume(not violations(spec, cfg, t, world, "maxtext"))
    doc = plan_doc(model, cl, cfg, t, world=world, gpus_per_domain=per)
    ctx = load_context(doc)
    try:
        o = maxtext.overrides(ctx)
    except InputError as exc:  # the refusals are the documented ones, never a silent wrong mesh
        assert "MaxText" in str(exc)
        return
    assert maxtext_mesh_errors(o, world) == []
    deg = {"tensor": cfg.tp, "context": cfg.cp, "expert": cfg.ep, "pipeline": cfg.pp,
           "fsdp": dp // cfg.ep}
    for axis, d in deg.items():
        assert o[f"ici_{axis}_parallelism"] * o[f"dcn_{axis}_parallelism"] == d
    # MaxText: global batch = int(devices * per_device_batch_size) * gradient_accumulation_steps
    ga = o.get("gradient_accumulation_steps", 1)
    assert int(world * o["per_device_batch_size"]) * ga == gbs


def test_maxtext_dsv3_mesh(dsv3_doc):
    from dataclasses import replace

    ctx = load_context(dsv3_doc)
    with pytest.raises(InputError, match="no MaxText remat_policy"):   # mla_up_proj+moe_act: MaxText has none
        maxtext.overrides(ctx)
    o = maxtext.overrides(replace(ctx, config=ctx.config.model_copy(update={"recompute": "full"})))
    # four racks of 64: EP32 inside a rack (ICI), PP2 across racks (DCN)
    assert o["num_slices"] == 4 and o["ici_expert_parallelism"] == 32 and o["dcn_expert_parallelism"] == 1
    assert o["dcn_pipeline_parallelism"] == 2 and o["model_name"] == "deepseek3-671b"


# --- Bridge ----------------------------------------------------------------------------------

FLAG_OF = {
    "model.tensor_model_parallel_size": "--tensor-model-parallel-size",
    "model.pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "model.context_parallel_size": "--context-parallel-size",
    "model.expert_model_parallel_size": "--expert-model-parallel-size",
    "model.expert_tensor_parallel_size": "--expert-tensor-parallel-size",
    "model.pipeline_model_parallel_layout": "--pipeline-model-parallel-layout",
    "model.moe_token_dispatcher_type": "--moe-token-dispatcher-type",
    "model.moe_flex_dispatcher_backend": "--moe-flex-dispatcher-backend",
    "train.global_batch_size": "--global-batch-size",
    "train.micro_batch_size": "--micro-batch-size",
    "model.seq_length": "--seq-length",
}


def test_bridge_overrides_agree_with_megatron_args(dsv3_doc):
    ctx = load_context(dsv3_doc)
    files = render_files(ctx, ["bridge", "megatron"])
    o = bridge.parse_overrides(files["bridge/overrides.txt"])
    a = megatron.parse_args_file(files["megatron/args.txt"])
    for key, flag in FLAG_OF.items():
        if key in o:
            assert o[key].strip("'") == a[a.index(flag) + 1], key
    assert o["model.sequence_parallel"] == ("true" if "--sequence-parallel" in a else "false")
    assert o["mixed_precision"] == "bf16_with_mxfp8_mixed"
    assert "# recipe: deepseek_v3_pretrain_config" in files["bridge/overrides.txt"]


def test_torchtitan_refuses_models_it_lacks():
    doc = plan_doc("mixtral-8x7b", hgx_cluster("h100", 1), ParallelConfig(tp=1, ep=8),
                   Training(seq_len=4096, global_batch=8))
    with pytest.raises(InputError, match="no model definition"):
        render_files(load_context(doc), ["torchtitan"])


def test_slurm_node_blocks_follow_the_plan(dsv3_doc):
    ctx = load_context(dsv3_doc)
    blocks = slurm.node_blocks(ctx)
    assert len(blocks) == 64 and all(g == [0, 1, 2, 3] for _, g in blocks)
    assert [h for h, _ in blocks][:17][-1] == "gb300-r02-t01"  # rack 1 contributes 16 trays (64 GPUs)


def test_maxtext_rule_matches_the_emitter():
    # the 256 x H100 DeepSeek-V3 recipe folds EP32 over TP2 x DP16: Megatron can, MaxText cannot
    doc = plan_doc("deepseek-v3", hgx_cluster("h100", 32), ParallelConfig(tp=2, pp=8, ep=32, etp=1),
                   Training(seq_len=4096, global_batch=4096, trainer="maxtext"), world=256)
    ctx = load_context(doc)
    v = violations(ctx.model, ctx.config, ctx.training, ctx.world, "maxtext")
    assert [x.rule for x in v] == ["maxtext_ep_divides_dp", "maxtext_pipeline_layout"]   # PP8 with dense layers
    assert not violations(ctx.model, ctx.config, ctx.training, ctx.world, "megatron")
    with pytest.raises(InputError, match="EP \\(32\\) must divide data parallelism \\(16\\)"):
        maxtext.overrides(ctx)


def test_torchtitan_toml_matches_the_command_line(dsv3_doc):
    import tomllib

    from planner.trainers.torchtitan.emit import parse_command

    files = render_files(load_context(dsv3_doc), ["torchtitan"])
    job = tomllib.loads(files["torchtitan/job.toml"])
    args = parse_command(files["torchtitan/command.txt"])
    flags = {args[i][2:]: args[i + 1] for i in range(len(args) - 1)
             if args[i].startswith("--") and not args[i + 1].startswith("--")}
    for key, value in job["parallelism"].items():
        if key == "module_fqns_per_model_part":   # one stage per word on the command line
            i = args.index(f"--parallelism.{key}")
            assert [",".join(stage) for stage in value] == args[i + 1:i + 1 + len(value)]
            assert len(value) == 2 * 8   # PP2 VPP8: the plan's stages, not TorchTitan's default 2 per rank
        elif f"parallelism.{key}" in flags:
            assert str(value) == flags[f"parallelism.{key}"], key
    assert job["parallelism"]["expert_parallel_degree"] == 32 and job["parallelism"]["pipeline_parallel_degree"] == 2
    assert job["parallelism"]["data_parallel_shard_degree"] == 128  # 256 / (TP1 * CP1 * PP2)
    assert job["training"]["global_batch_size"] == int(flags["training.global_batch_size"]) == 4096
    assert job["model"] == {"name": "deepseek_v3", "flavor": "671B"}
    assert job["activation_checkpoint"]["mode"] == "selective" and args[-1] == "activation-checkpoint:selective"


def test_plan_entry_batch_overrides_the_training_batch(dsv3_doc):
    # with --gbs-range the solver picks the batch per plan: config.gbs wins over training.global_batch
    doc = json.loads(json.dumps(dsv3_doc))
    doc["plans"][0]["config"]["gbs"] = 2048
    a = megatron.megatron_args(load_context(doc))
    assert a[a.index("--global-batch-size") + 1] == "2048"


@pytest.mark.parametrize("pp,vpp", [(2, 1), (4, 2), (4, 4), (8, 2)])
def test_maxtext_pipeline_is_the_plans_chunks(pp, vpp):
    # MaxText's own derivation (re-stated in tests/trainers/maxtext_rules.py) of the emitted keys gives the
    # plan's pp stages x vpp repeats of num_layers / (pp vpp) layers; without the keys (MaxText's defaults,
    # one layer per stage) the repeats would be layers / pp, not the plan's vpp
    from trainers.maxtext_rules import maxtext_pipeline
    doc = plan_doc("llama3-70b", hgx_cluster("h100", 8), ParallelConfig(tp=8, pp=pp, vpp=vpp),
                   Training(seq_len=4096, global_batch=64, trainer="maxtext"), world=64)
    ctx = load_context(doc)
    assert not violations(ctx.model, ctx.config, ctx.training, ctx.world, "maxtext")
    o = maxtext.overrides(ctx)
    layers, repeats, micro, errs = maxtext_pipeline(o, 80, 0, False)
    assert not errs and (layers, repeats) == (80, vpp) and o["num_layers_per_pipeline_stage"] * pp * vpp == 80
    assert micro == 64 // (ctx.config.mbs * ctx.dp)
    defaults = {k: v for k, v in o.items() if k not in ("num_layers_per_pipeline_stage", "num_pipeline_repeats",
                                                        "pipeline_parallel_layers")}
    assert maxtext_pipeline(defaults, 80, 0, False)[1] == 80 // pp != vpp


def test_maxtext_pipeline_rule_refuses_what_maxtext_cannot_run():
    from planner.model.spec import load_model
    llama, dsv3 = load_model("llama3-70b"), load_model("deepseek-v3")
    t = Training(seq_len=4096, global_batch=96, trainer="maxtext")

    def pipeline_rule(m, cfg, world):
        return [x.message for x in violations(m, cfg, t, world, "maxtext") if x.rule == "maxtext_pipeline_layout"]

    # 80 layers do not make 3 x 2 equal chunks (MaxText: stages x repeats x layers per stage = layers)
    assert "equal chunks" in pipeline_rule(llama, ParallelConfig(tp=8, pp=3, vpp=2), 96)[0]
    # an uneven first / last stage has no MaxText key
    assert "uneven split" in pipeline_rule(llama, ParallelConfig(tp=8, pp=4, pp_first=17, pp_last=21), 64)[0]
    # TP4 PP16 on 64 GPUs: dp 1, so gbs 40 is 40 micro-batches, not a multiple of the 16 stages
    t40 = Training(seq_len=4096, global_batch=40, trainer="maxtext")
    msgs = [x.message for x in violations(llama, ParallelConfig(tp=4, pp=16), t40, 64, "maxtext")
            if x.rule == "maxtext_pipeline_layout"]
    assert "num_pipeline_microbatches (40) must be divisible by the pipeline stages (16)" in msgs[0]
    # the DeepSeek block runs its dense layers outside the pipeline: pp > 1 refused, pp 1 not
    assert "3 dense layers" in pipeline_rule(dsv3, ParallelConfig(tp=1, pp=4, ep=64), 256)[0]
    assert not pipeline_rule(dsv3, ParallelConfig(tp=1, pp=1, ep=64), 256)
    assert not pipeline_rule(llama, ParallelConfig(tp=8, pp=4, vpp=4), 64)
