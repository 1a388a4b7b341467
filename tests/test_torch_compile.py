"""TorchTitan's model compile (``Recipe.torch_compile``: ``--compile.enable`` with "model" in
``--compile.components``), separate from its CUDA graphs: the default each TorchTitan 0.3.0 registry function
runs (read from the functions themselves), the elementwise regime the step time prices (the profile's
``mem.elementwise`` compiled, ``mem.elementwise_eager`` eager), the emitted and read-back flags, TorchTitan's own
parser on the emitted command (tests/trainers/torchtitan_check.py), the CSV column, and the refusal by the
other trainers.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.config import ParallelConfig, Recipe, Training
from planner.cost.predict import predict
from planner.cost.profiles import load_profile
from planner.cost.steptime import efficiencies
from planner.calibration.validate import row_case
from planner.errors import InputError
from planner.model.spec import load_model
from planner.output.emit import load_context
from planner.trainers.torchtitan.readback import torchtitan_setup
from planner.trainers.torchtitan.emit import (
    BASE_COMPILE,
    BASE_CONFIG,
    DEFAULT_COMPILE,
    MODELS,
    USER_FAMILIES,
    command_args,
    compile_setting,
    custom_registry,
)
from planner.rules import effective_recipe
from planner.trainers.torchtitan.rules import TORCHTITAN_COMPILED, torch_compile_on
from planner.search.plan import plan
from topologies.gpus import get_gpu
from topologies.loader import load_cluster

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "trainers"
PROFILE_ROWS = ROOT / "planner" / "data" / "profiles" / "torchtitan-h100-2024-12.csv"
LLAMA8 = ParallelConfig(tp=1, pp=1, fsdp=True, mbs=2, recompute="mlp")


def _tt(value=None, **kw):
    return Training(seq_len=8192, global_batch=16, trainer="torchtitan", recipe={"torch_compile": value}, **kw)


# ------------------------------------------------------------------------------------ the registry

_REGISTRY_SCRIPT = """
import json, sys, importlib
sys.argv = ['x']
sys.path.insert(0, {harness!r})
import torchtitan_check  # noqa: F401  (its shims: no triton, a fake SM90 GPU for the float8 converters)
out = {{}}
for module, fn in {functions!r}:
    cfg = getattr(importlib.import_module(f"torchtitan.models.{{module}}.config_registry"), fn)()
    c = cfg.compile
    out[fn] = [c.enable, list(c.components), c.enable_async_tensor_parallel]
print(json.dumps(out))
"""


@pytest.mark.trainers
def test_base_compile_is_what_torchtitans_registry_functions_do():
    """BASE_COMPILE / DEFAULT_COMPILE and planner.trainers.torchtitan.rules.TORCHTITAN_COMPILED against torchtitan 0.3.0's own
    registry functions (every function a launch starts from)."""
    functions = sorted({(m, f) for m, f, _ in MODELS.values() if f} | set(USER_FAMILIES.values())
                       | {(m, f) for m, f in BASE_CONFIG.items()})
    script = _REGISTRY_SCRIPT.format(harness=str(HARNESS), functions=functions)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(HARNESS)))
    assert p.returncode == 0, p.stderr[-3000:]
    real = json.loads(p.stdout.strip().splitlines()[-1])
    for fn, (enable, components, async_tp) in real.items():
        assert BASE_COMPILE.get(fn, DEFAULT_COMPILE) == (enable, tuple(components), async_tp), fn
    compiled = {name for name, (_, fn, _) in MODELS.items() if fn and real[fn][0] and "model" in real[fn][1]}
    assert compiled == set(TORCHTITAN_COMPILED)


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(sorted(MODELS)), value=st.sampled_from([None, True, False]),
       graphs=st.booleans())
def test_default_follows_the_registry_and_explicit_values_win(model, value, graphs):
    m = load_model(model)
    cfg = ParallelConfig(tp=1, pp=1, fsdp=True, mbs=1)
    tr = _tt(value, cuda_graphs=graphs)
    on = torch_compile_on(m, cfg, tr)
    assert on == (model in TORCHTITAN_COMPILED if value is None else value)
    assert effective_recipe(m, cfg, tr).torch_compile is on
    # other trainers never compile this way, and their effective recipe leaves the setting unset
    mega = Training(seq_len=8192, global_batch=16)
    assert not torch_compile_on(m, cfg, mega) and effective_recipe(m, cfg, mega).torch_compile is None


def test_megatron_and_maxtext_refuse_an_explicit_value(capsys):
    for stack, word in (("megatron-26.08", "Transformer Engine"), ("maxtext", "XLA always compiles")):
        for flag in ("--torch-compile", "--no-torch-compile"):
            code = main(["predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64",
                         "--fsdp", "--stack", stack, flag])
            err = capsys.readouterr().err
            assert code == 2 and "recipe.torch_compile=" in err and word in err and "leave it unset" in err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ------------------------------------------------------------------------------------------ step time

def test_compile_prices_the_fused_factor_and_eager_the_eager_one():
    """The eager regime is the compiled one with mem.elementwise replaced by mem.elementwise_eager
    (an independent profile edit), and the CUDA graph switch moves nothing for TorchTitan."""
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    prof = load_profile("torchtitan")
    eager_f, fused_f = prof.param("mem.elementwise_eager"), prof.param("mem.elementwise")
    assert eager_f > fused_f
    on = predict(m, cl, LLAMA8, _tt(True))
    off = predict(m, cl, LLAMA8, _tt(False))
    assert off.step_time_s > on.step_time_s
    params = dict(prof.params)
    params["mem.elementwise"] = params["mem.elementwise"].model_copy(update={"value": eager_f})
    as_eager = prof.model_copy(update={"params": params})
    assert predict(m, cl, LLAMA8, _tt(True), profile=as_eager).step_time_s == pytest.approx(off.step_time_s,
                                                                                             rel=1e-12)
    for value in (True, False):
        a = predict(m, cl, LLAMA8, _tt(value, cuda_graphs=True))
        b = predict(m, cl, LLAMA8, _tt(value, cuda_graphs=False))
        assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    # the default of llama3_8b (no compile) is the eager regime; llama3_405b's compiles
    assert predict(m, cl, LLAMA8, _tt(None)).step_time_s == pytest.approx(off.step_time_s, rel=1e-12)
    gpu = get_gpu("H100")
    assert efficiencies(gpu, "bf16", prof, False).elem_factor == eager_f
    assert efficiencies(gpu, "bf16", prof, True).elem_factor == fused_f


def test_the_fitted_rows_order_the_compile_pairs_as_measured():
    """ttx1 vs tt1 and ttx2 vs tt3 (the TorchTitan team's H100 Tables 1 and 3, without and with
    torch.compile): in-sample since the refit, the compiled run predicted faster as measured."""
    rows = {r["id"]: r for r in csv.DictReader(open(PROFILE_ROWS))}
    prof = load_profile("torchtitan")
    for eager, compiled in (("ttx1", "tt1"), ("ttx2", "tt3")):
        a, b = row_case(rows[eager], profile=prof), row_case(rows[compiled], profile=prof)
        assert a.training.recipe.torch_compile is False and b.training.recipe.torch_compile is True
        pa = predict(a.model, a.cluster, a.config, a.training, profile=prof)
        pb = predict(b.model, b.cluster, b.config, b.training, profile=prof)
        assert (pb.tflops_per_gpu > pa.tflops_per_gpu) == (b.measured_tflops > a.measured_tflops)


def test_program_equals_predict_with_and_without_compile():
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=16)
    for value in (True, False):
        res = plan(m, cl, Training(seq_len=8192, global_batch=64, trainer="torchtitan",
                                   recipe={"torch_compile": value}), top=4)
        assert res.plans
        for e in res.plans:
            assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)
        assert res.solver["program_vs_predict_max_rel_err"] < 1e-6


# ------------------------------------------------------------------------------------------------ CSV

def test_csv_column_is_read_and_checked():
    rows = {r["id"]: r for r in csv.DictReader(open(PROFILE_ROWS))}
    row = rows["tt1"]
    assert row_case(row).training.recipe.torch_compile is True
    assert row_case(dict(row, torch_compile="")).training.recipe.torch_compile is None
    with pytest.raises(InputError, match="column 'torch_compile' = 'x'"):
        row_case(dict(row, torch_compile="x"))
    with pytest.raises(InputError, match="recipe.torch_compile=True"):
        row_case(dict(row, stack="megatron-26.08", torch_compile="true"))


# ----------------------------------------------------------------------------------------------- emit

def _doc(model, gpus, precision, value, restrict, preset="dgx-h100"):
    tr = Training(seq_len=8192 if preset == "dgx-h100" else 4096, global_batch=2 * gpus, precision=precision,
                  trainer="torchtitan", recipe={"torch_compile": value})
    res = plan(load_model(model), load_cluster(preset, gpus=gpus), tr, top=1, restrict=restrict, min_world=gpus)
    assert res.plans, (model, value)
    return res.to_dict()


CASES = {   # id: (model, GPUs, precision, torch_compile, layout)
    "8b-default": ("llama3-8b", 8, "bf16", None, {"tp": [1], "pp": [1], "fsdp": [True]}),
    "8b-compiled": ("llama3-8b", 8, "bf16", True, {"tp": [1], "pp": [1], "fsdp": [True]}),
    "8b-fp8-compiled": ("llama3-8b", 8, "fp8", True, {"tp": [1], "pp": [1], "fsdp": [True]}),
    "405b-default": ("llama3.1-405b", 512, "fp8-block", None, {"tp": [8], "pp": [8], "cp": [1], "fsdp": [True]}),
    "405b-eager": ("llama3.1-405b", 512, "fp8-block", False, {"tp": [8], "pp": [8], "cp": [1], "fsdp": [True]}),
    "dsv3-compiled": ("deepseek-v3", 256, "mxfp8", True, {"tp": [1], "fsdp": [True]}),
    "dsv3-default": ("deepseek-v3", 256, "mxfp8", None, {"tp": [1], "fsdp": [True]}),
}


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    from planner.output.emit import emit_plan
    from planner.trainers.torchtitan.emit import parse_command

    out, jobs = {}, []
    for cid, (model, gpus, prec, value, restrict) in CASES.items():
        doc = _doc(model, gpus, prec, value, restrict, "gb300-nvl72" if model == "deepseek-v3" else "dgx-h100")
        d = tmp_path_factory.mktemp(cid)
        emit_plan(doc, ["torchtitan"], d)
        args = parse_command((d / "torchtitan" / "command.txt").read_text())
        reg = d / "torchtitan" / "topoplan_config.py"
        out[cid] = (doc, args, reg.read_text() if reg.exists() else None)
        jobs.append({"id": cid, "args": args, "world": gpus, "sm": 100 if model == "deepseek-v3" else 90,
                     "path": str(reg.parent) if reg.exists() else None})
    tmp = tmp_path_factory.mktemp("titan-compile")
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    p = subprocess.run([sys.executable, str(HARNESS / "torchtitan_check.py"), str(tmp / "jobs.json"),
                        str(tmp / "results.json")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    results = {r["id"]: r for r in json.loads((tmp / "results.json").read_text())}
    return out, results


@pytest.mark.trainers
@pytest.mark.parametrize("cid", sorted(CASES))
def test_torchtitan_parses_the_compile_the_plan_prices_and_it_reads_back(emitted, cid):
    out, results = emitted
    doc, args, registry = out[cid]
    model, gpus, prec, value, _ = CASES[cid]
    ctx = load_context(doc, 0)
    m = load_model(model)
    want = torch_compile_on(m, ctx.config, ctx.training)
    assert want == (model in TORCHTITAN_COMPILED if value is None else value)
    r = results[cid]
    assert r["ok"], f"torchtitan refused {cid} at {r['stage']}: {r['error']}"
    comp = r["compile"]
    assert (comp["enable"] and "model" in comp["components"]) == want   # torchtitan's own test (parallelize.py)
    assert (comp["enable"], tuple(comp["components"]), comp["async_tp"]) == compile_setting(ctx)
    if model == "llama3.1-405b" and not want:
        assert comp["async_tp"] is False    # CompileConfig.__post_init__ refuses async TP without compile
    if model == "deepseek-v3":
        assert "loss" in comp["components"]  # the registry function's loss compile is kept
    if registry is not None:                 # the written registry sets the same compile before its converters
        assert f"config.compile.enable = {comp['enable']}" in registry
        assert f"config.compile.components = {comp['components']!r}" in registry
    _, training, _ = torchtitan_setup(args, m, gpus, registry_text=registry)
    assert torch_compile_on(m, ctx.config, training) == want
    assert training.recipe.torch_compile is want


def test_readback_without_compile_flags_is_the_registry_default():
    m = load_model("llama3-8b")
    doc = _doc("llama3-8b", 8, "bf16", True, {"tp": [1], "pp": [1], "fsdp": [True]})
    args = command_args(load_context(doc, 0))
    assert "--compile.enable" in args and "--compile.no_enable" not in args
    i = args.index("--compile.components")
    assert args[i + 1] == "model,loss"
    bare = [a for a in args[:i] + args[i + 2:] if not a.startswith("--compile.")]
    _, tr, _ = torchtitan_setup(bare, m, 8)
    assert tr.recipe.torch_compile is None and not torch_compile_on(m, LLAMA8, tr)
    _, tr, _ = torchtitan_setup(bare + ["--compile.no_enable"], m, 8)
    assert tr.recipe.torch_compile is False
    # a catalog model in BF16 gets no converters; its registry is written only because torchtitan's 8B flavour
    # has Llama 3.1's RoPE scaling where Llama 3's config has none (planner.trainers.torchtitan.emit.model_fixes)
    reg = custom_registry(load_context(doc, 0))
    assert "converters=None" in reg and "'scaling': 'none'" in reg


def test_recipe_field_is_documented_and_independent_of_cuda_graphs():
    f = Recipe.model_fields["torch_compile"]
    assert f.default is None and "mem.elementwise_eager" in f.description
    tr = _tt(True, cuda_graphs=False)
    assert tr.recipe.cuda_graph_impl == "none" and tr.recipe.torch_compile is True
