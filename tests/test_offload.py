"""CPU activation offloading (``Recipe.cpu_offload_layers``, Megatron's --cpu-offloading-num-layers).

Oracles: the offload term and the memory worked by hand (Llama 3 70B's saved bytes per token written out
from its config), NVIDIA's published runs mb174 / mb177 (they ran without recompute, so they fit), the
program against ``predict``, and megatron-core 0.19.2's own checks (TransformerConfig.__post_init__, run
by tests/trainers/megatron_check.py on the emitted arguments and on mutants of them).
"""

from __future__ import annotations

import csv

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.config import ParallelConfig, Recipe, Training
from planner.cost.memory import GIB, memory_per_gpu, offloaded_layer_bytes
from planner.cost.predict import predict
from planner.cost.profiles import CALIBRATION_CSV
from planner.cost.terms import offload as OFF
from planner.calibration.validate import predict_case, row_case
from planner.cost.terms.sync import sync_factor
from planner.errors import InputError
from planner.model.spec import load_model
from planner.output.emit import load_context
from planner.trainers.megatron.emit import megatron_args
from planner.rules import effective_recipe, violations
from planner.search.plan import plan
from roundtrip_check import assert_round_trip
from topologies.gpus import GPUS
from topologies.loader import load_cluster

CALIBRATION = str(CALIBRATION_CSV)


# ----------------------------------------------------------------------------------------- the term

def test_copy_time_and_exposure_by_hand():
    # 3.6 GB over NVLink-C2C's 450 GB/s per direction: 8 ms
    assert OFF.copy_time(3.6e9, 450.0) == pytest.approx(0.008)
    # 40 of 80 layers, 8 ms copies beside 18 ms layers: the side stream keeps up
    assert OFF.pass_exposed(40, 80, 0.008, 0.018) == 0.0
    # over PCIe (57 ms a copy): the 40 copies (2.28 s) outrun the 78 layers they run beside (1.404 s)
    assert OFF.pass_exposed(40, 80, 0.057, 0.018) == pytest.approx(40 * 0.057 - 78 * 0.018)
    # k = L - 1: the last copy has no window (TE warns it 'prevents overlapping'); 10 ms exposed
    assert OFF.pass_exposed(79, 80, 0.010, 0.018) == pytest.approx(0.010)
    # one copy longer than its own window of L-k-1 = 1 layer: 50 - 18 ms
    assert OFF.pass_exposed(2, 4, 0.050, 0.018) == pytest.approx(max(2 * 0.050 - 2 * 0.018, 0.050 - 0.018))
    assert OFF.offload_exposed(0, 80, 3.6e9, 64.0, 0.018, 0.036) == 0.0
    # forward and backward passes add: 3.6 GB / 64 GB/s = 56.25 ms a copy
    c = 3.6e9 / 64e9
    assert OFF.offload_exposed(40, 80, 3.6e9, 64.0, 0.018, 0.036) == pytest.approx(
        (40 * c - 78 * 0.018) + max(0.0, 40 * c - 78 * 0.036))


def test_host_links_have_sources():
    assert GPUS["gb200"].host_link_gbps_uni == GPUS["gb300"].host_link_gbps_uni == 450.0   # C2C 900 bidir
    assert all(GPUS[g].host_link_gbps_uni == 64.0 for g in ("h100", "h200", "b200", "b300"))   # PCIe Gen5 x16
    assert "C2C" in GPUS["gb200"].sources["host_link_gbps_uni"]


# --------------------------------------------------------------------------------------- the memory

# Llama 3 70B, TP1 CP1, FP8 (1-byte GEMM inputs): saved bytes per token of one layer (memory.py docstring)
H, HEADS, KV, D, F = 8192, 64, 8, 128, 28672
PER_TOKEN = (2 * H * 2            # the two RMSNorm inputs
             + H * 1              # QKV GEMM input
             + (HEADS * D + 2 * KV * D) * 2   # q, k, v kept by flash attention
             + HEADS * D * 1 + HEADS * 4      # o-proj input, softmax statistics
             + H * 1              # fc1 input
             + 2 * F * 2 + F * 1)  # fc1 output (gated), fc2 input
TOKENS = 2 * 8192                  # MBS 2 x 8192


def _l70(k, recompute="none"):
    cfg = ParallelConfig(mbs=2, fsdp=True, recompute=recompute)
    tr = Training(seq_len=8192, global_batch=256, precision="fp8", cuda_graphs=False,
                  recipe={"cpu_offload_layers": k})
    return load_model("llama3-70b"), cfg, tr


def test_offloaded_bytes_and_memory_by_hand():
    assert PER_TOKEN == 221440
    model, cfg, tr = _l70(40)
    per_layer = offloaded_layer_bytes(model, cfg, tr)
    assert per_layer == tuple([PER_TOKEN * TOKENS] * 40)
    off = memory_per_gpu(model, cfg, tr, 64).per_stage[0]
    on = memory_per_gpu(model, cfg, _l70(None)[2], 64).per_stage[0]
    # TE's bound: the saved activations of the 80 - 40 layers left on the GPU (pp 1: one micro-batch)
    assert on.activations == pytest.approx(80 * PER_TOKEN * TOKENS / GIB)
    assert off.activations == pytest.approx(40 * PER_TOKEN * TOKENS / GIB)
    # fragmentation is 5 % of what stays (the default options); nothing else moves
    assert on.reserve - off.reserve == pytest.approx(0.05 * 40 * PER_TOKEN * TOKENS / GIB)
    assert (on.weights, on.optimizer, on.fsdp_buffers, on.logits) == (off.weights, off.optimizer, off.fsdp_buffers,
                                                                      off.logits)
    assert offloaded_layer_bytes(model, cfg, _l70(0)[2]) == ()


def test_graph_buffers_are_not_counted_beside_offloading():
    model, cfg, _ = _l70(None)
    graphs = Training(seq_len=8192, global_batch=256, precision="fp8")
    offl = Training(seq_len=8192, global_batch=256, precision="fp8", recipe={"cpu_offload_layers": 20})
    assert memory_per_gpu(model, cfg, graphs, 64).components["cuda_graphs"] > 0
    assert memory_per_gpu(model, cfg, offl, 64).components["cuda_graphs"] == 0
    assert effective_recipe(model, cfg, offl).cuda_graph_impl == "none"   # auto: off, as megatron requires


@pytest.mark.parametrize("rid,k,gpu", [("mb174", 20, "GB300"), ("mb177", 40, "GB200")])
def test_published_offload_runs_fit_without_recompute(rid, k, gpu):
    """NVIDIA ran them with no recompute (their recipes set none): with the recorded offload they fit."""
    row = next(r for r in csv.DictReader(open(CALIBRATION)) if r["id"] == rid)
    case = row_case(row)
    assert case.training.recipe.cpu_offload_layers == k and row["gpu"] == gpu
    p = predict_case(case)
    assert p.config.recompute == "none" and p.fits, (p.memory_gib_per_gpu, p.hbm_gib)
    # the control: without the offload the same layout does not fit
    tr = case.training.model_copy(update={"recipe": Recipe()})
    assert not predict(case.model, case.cluster, case.config, tr).fits


def test_csv_column_is_read_and_checked():
    row = next(r for r in csv.DictReader(open(CALIBRATION)) if r["id"] == "mb176")
    assert row_case(dict(row, cpu_offload_layers="")).training.recipe.cpu_offload_layers is None
    with pytest.raises(InputError, match="column 'cpu_offload_layers' = 'x'"):
        row_case(dict(row, cpu_offload_layers="x"))


# ---------------------------------------------------------------------------------------- step time

def _l8(preset, k, **cfg):
    tr = Training(seq_len=8192, global_batch=64, precision="bf16", cuda_graphs=False,
                  recipe={"cpu_offload_layers": k})
    return load_model("llama3-8b"), load_cluster(preset, gpus=8), ParallelConfig(fsdp=True, **cfg), tr


def test_offload_is_its_own_term_and_only_term_it_moves():
    model, cl, cfg, tr = _l8("dgx-h100", 16)
    p = predict(model, cl, cfg, tr)
    base = predict(model, cl, cfg, tr.model_copy(update={"recipe": Recipe(cuda_graph_impl="none")}))
    assert p.breakdown["offload"] > 0 and base.breakdown["offload"] == 0
    # the step grows by the offload wait and the slowest-GPU share of it (terms/sync.py)
    assert p.step_time_s - base.step_time_s == pytest.approx(p.breakdown["offload"] * (1 + sync_factor(8)))
    assert {t: v for t, v in p.breakdown.items() if t not in ("offload", "sync")} == pytest.approx(
        {t: v for t, v in base.breakdown.items() if t not in ("offload", "sync")})
    # by hand: 8 micro-batches of 32 layers (16 offloaded), 8192 tokens of 4096-wide BF16 layers over PCIe
    m8 = load_model("llama3-8b")
    per_tok = (4 * m8.hidden_size + 2 * m8.hidden_size + (32 * 128 + 2 * 8 * 128) * 2 + 32 * 128 * 2 + 32 * 4
               + 2 * m8.hidden_size + 2 * m8.ffn_hidden_size * 2 + m8.ffn_hidden_size * 2)
    nbytes = per_tok * 8192
    assert offloaded_layer_bytes(m8, cfg, tr) == tuple([nbytes] * 16)
    # the wait never exceeds the copies themselves: 8 micro-batches x 2 passes x 16 copies of 17.8 ms
    assert 0 < p.breakdown["offload"] <= 8 * 2 * 16 * nbytes / 64e9
    # on GB200 the same copies take 2.5 ms over NVLink-C2C and hide
    model, cl, cfg, tr = _l8("gb200-nvl72", 16)
    assert predict(model, cl, cfg, tr).breakdown["offload"] == 0.0


def test_program_equals_predict_with_offload():
    model, cl, cfg, tr = _l8("dgx-h100", 16)
    res = plan(model, cl, tr, top=3)
    assert res.plans
    for e in res.plans:
        assert e.config.pp == 1 and e.config.recompute == "none"   # megatron-core's rules
        assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)
        assert e.prediction.breakdown["offload"] > 0
    assert res.solver["program_vs_predict_max_rel_err"] < 1e-6


def test_round_trip_and_a_missing_flag_fails_it():
    model, cl, cfg, tr = _l8("dgx-h100", 16)
    doc = plan(model, cl, tr, top=1).to_dict()
    args = megatron_args(load_context(doc, 0))
    i = args.index("--cpu-offloading-num-layers")
    assert args[i + 1] == "16"
    assert_round_trip(doc, 0, args)
    with pytest.raises(AssertionError):
        assert_round_trip(doc, 0, args[:i] + args[i + 2:])


def test_bridge_overrides_set_the_model_fields():
    from planner.trainers.megatron.bridge import overrides

    model, cl, cfg, tr = _l8("dgx-h100", 16)
    o = overrides(load_context(plan(model, cl, tr, top=1).to_dict(), 0))
    assert (o["model.cpu_offloading"], o["model.cpu_offloading_num_layers"], o["model.cpu_offloading_activations"],
            o["model.cpu_offloading_weights"]) == (True, 16, True, False)


# ---------------------------------------------------------------------------------------------- rules

# megatron-core 0.19.2 megatron/core/transformer/transformer_config.py, in order (file:line):
MCORE_WORDS = {
    "bound": "CPU offloading can be done only for layers less than",                  # 1707-1712
    "pp": "Currently there is no support for Pipeline parallelism with CPU offloading",  # 1714-1717
    "recompute": "CPU offloading does not work when activation recomputation is enabled",  # 1719-1722
    "graphs": "CUDA graphs not supported with CPU offloading.",                        # 2465-2468
}


@settings(max_examples=60, deadline=None)
@given(k=st.integers(0, 40), pp=st.sampled_from([1, 2, 4]), rc=st.sampled_from(["none", "full", "core_attn"]),
       impl=st.sampled_from([None, "none", "transformer_engine", "local", "full_iteration"]))
def test_rules_are_megatron_cores_conditions(k, pp, rc, impl):
    model = load_model("llama3-8b")   # 32 layers
    cfg = ParallelConfig(pp=pp, recompute=rc, mbs=1)
    tr = Training(seq_len=4096, global_batch=64, recipe={"cpu_offload_layers": k, "cuda_graph_impl": impl})
    got = {v.rule: v.message for v in violations(model, cfg, tr, 64)}
    msg = got.get("cpu_offloading_layout")
    want = None
    if k and k >= 32:
        want = "bound"
    elif k and pp > 1:
        want = "pp"
    elif k and rc != "none":
        want = "recompute"
    assert (msg is None) == (want is None)
    if want:
        assert MCORE_WORDS[want] in msg
    graphs = got.get("cuda_graphs_vs_recompute")
    if k and impl in ("transformer_engine", "local"):
        assert graphs == MCORE_WORDS["graphs"]
    if impl is None:   # auto never breaks the graph rule: it turns graphs off beside offloading
        assert graphs is None
        if k:
            assert effective_recipe(model, cfg, tr).cuda_graph_impl == "none"


def test_other_trainers_refuse_offloading(capsys):
    for stack in ("torchtitan", "maxtext"):
        code = main(["predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64",
                     "--fsdp", "--stack", stack, "--cpu-offload-layers", "8"])
        err = capsys.readouterr().err
        assert code == 2 and "cpu_offload_layers=8" in err and "leave it unset" in err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.trainers
def test_megatron_core_accepts_the_flags_and_refuses_what_the_rules_refuse(tmp_path):
    from test_emit_trainers import _megatron_env, _run, mcore_dir  # noqa: F401

    root = mcore_dir.__wrapped__()
    model, cl, cfg, tr = _l8("dgx-h100", 16)
    doc = plan(model, cl, tr, top=1).to_dict()
    ctx = load_context(doc, 0)
    args = megatron_args(ctx)
    from planner.trainers.megatron.emit import megatron_env

    env = megatron_env(ctx)

    def with_(a, flag, *vals):
        a = list(a)
        if flag in a:
            i = a.index(flag)
            j = i + 1
            while j < len(a) and not a[j].startswith("--"):
                j += 1
            a[i:j] = [flag, *vals]
        else:
            a += [flag, *vals]
        return a

    jobs = {
        "ok": args,
        "bound": with_(args, "--cpu-offloading-num-layers", "32"),
        "pp": with_(with_(args, "--pipeline-model-parallel-size", "2"), "--global-batch-size", "64"),
        "recompute": with_(with_(args, "--recompute-granularity", "selective"), "--recompute-modules", "core_attn"),
        "graphs": with_(args, "--cuda-graph-impl", "transformer_engine"),
    }
    data = _run("megatron_check.py", [{"id": k, "args": a, "env": env, "sm": ctx.sm} for k, a in jobs.items()],
                tmp_path, str(root))
    res = {r["id"]: r for r in data["results"]}
    assert res["ok"]["ok"], res["ok"]
    assert res["ok"]["config"]["cpu_offloading"] is True and res["ok"]["config"]["cpu_offloading_num_layers"] == 16
    for name in ("bound", "pp", "recompute", "graphs"):
        assert not res[name]["ok"] and MCORE_WORDS[name] in res[name]["error"], res[name]
    # the planner's rules refuse the same layouts with the same words
    assert MCORE_WORDS["bound"] in violations(model, cfg, tr.model_copy(
        update={"recipe": Recipe(cpu_offload_layers=32)}), 8)[0].message
    assert MCORE_WORDS["pp"] in violations(model, cfg.model_copy(update={"pp": 2}), tr, 8)[0].message
    assert MCORE_WORDS["recompute"] in violations(model, cfg.model_copy(update={"recompute": "core_attn"}), tr,
                                                  8)[0].message
    assert violations(model, cfg, tr.model_copy(update={"recipe": Recipe(cpu_offload_layers=16,
                                                                         cuda_graph_impl="transformer_engine")}),
                      8)[0].message == MCORE_WORDS["graphs"]
