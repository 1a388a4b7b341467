"""Step-time terms against hand calculations, and physical monotonicity properties (hypothesis)."""

import math

import pytest
from hypothesis import given, settings, strategies as st

import planner
from planner.config import ParallelConfig, Training
from planner.cost.terms import compute as C
from planner.cost.terms import data_parallel as DP
from planner.cost.terms import exposed
from planner.cost.terms import pipeline as PPL
from planner.cost.placement import group_shapes, make_placement
from planner.cost.predict import predict
from planner.cost.profiles import load_profile
from planner.cost.steptime import TERMS, step_time
from topologies.collectives import fabric_for
from topologies.loader import load_cluster

DS = planner.load_model("deepseek-v3")
LLAMA = planner.load_model("llama3-70b")
QWEN = planner.load_model("qwen3-30b-a3b")
PROF = load_profile("megatron-26.08")


def test_gemm_time_hand_calculation():
    g = C.Gemm("mlp", 4096, 4096, 4096, True)
    t = C.gemm_time(g, peak_lp=1e15, peak_bf16=5e14, eff_lp=0.8, eff_bf16=0.7, dim_half=128, m_half=64)
    assert t == pytest.approx(2 * 4096**3 / (1e15 * 0.8 * 4096 / (4096 + 128)))
    bf = C.Gemm("logits", 4096, 4096, 4096, False)
    assert C.gemm_time(bf, 1e15, 5e14, 0.8, 0.7, 128, 64) == pytest.approx(2 * 4096**3 / (5e14 * 0.7 * 4096 / 4224))
    grouped = C.Gemm("expert", 1024, 4096, 4096, True, grouped_m=256)
    assert C.gemm_time(grouped, 1e15, 5e14, 0.8, 0.7, 128, 64) == pytest.approx(
        2 * 1024 * 4096 * 4096 / (1e15 * 0.8 * (1024 / 1152) * (256 / 320)))


def test_causal_context():
    assert C.causal_context(4096, None) == 2048
    assert C.causal_context(4096, 128) == pytest.approx(128 - 128 * 127 / 8192)
    assert C.causal_context(100, 200) == 50


def test_bubble_and_exposed_formulas():
    assert PPL.bubble_fraction(4, 2, 8) == pytest.approx(3 / 16)
    assert PPL.bubble_time(8, 1, 2.0) == pytest.approx(14.0)
    assert PPL.bubble_time(1, 1, 2.0) == 0.0
    assert exposed(1.0, 0.8, 10.0) == pytest.approx(0.2)   # overlap-limited
    assert exposed(1.0, 0.8, 0.5) == pytest.approx(0.5)    # window-limited
    assert exposed(1.0, 0.0, 10.0) == pytest.approx(1.0)


def _setup(model, cluster, cfg, training, world=None):
    world = world or cluster.num_gpus
    pl = make_placement(cluster, cfg, world)
    return pl, group_shapes(cluster, cfg, pl)


def test_breakdown_adds_up_and_bubble_is_hand_formula():
    cl = load_cluster("gb200-nvl72", gpus=64)
    tr = Training(seq_len=8192, global_batch=64, precision="fp8")
    cfg = ParallelConfig(tp=2, pp=4, vpp=2)
    pl, sh = _setup(LLAMA, cl, cfg, tr)
    stt = step_time(LLAMA, cl, cfg, tr, 64, pl, PROF, sh)
    assert list(stt.breakdown) == list(TERMS)
    assert sum(stt.breakdown.values()) == pytest.approx(stt.step_time_s)
    assert all(v >= 0 for v in stt.breakdown.values())
    # interleaved 1F1B: (pp-1)/vpp micro-batch times of the slowest rank
    assert stt.breakdown["pp_bubble"] == pytest.approx(3 / 2 * stt.details["t_microbatch_max"])
    m = stt.microbatches
    assert m == 64 / (1 * 8)
    assert stt.breakdown["pp_bubble"] / (m * stt.details["t_microbatch_max"]) == pytest.approx(
        PPL.bubble_fraction(4, 2, int(m)))


def test_dp_reduce_scatter_and_all_gather_priced_by_the_fabric():
    # Llama3-70B, PP1, 16 DP ranks on two HGX nodes: one micro-batch per rank, so the gradient
    # reduce-scatter hides only behind that micro-batch's backward, the all-gather behind its forward.
    from planner.model.flops import layer_costs

    cl = load_cluster("dgx-h100", gpus=16)
    tr = Training(seq_len=4096, global_batch=16, precision="bf16")
    cfg = ParallelConfig()
    pl, sh = _setup(LLAMA, cl, cfg, tr)
    stt = step_time(LLAMA, cl, cfg, tr, 16, pl, PROF, sh)
    params = sum(c.dense_params for c in layer_costs(LLAMA, 4096)) + 2 * LLAMA.hidden_size * LLAMA.padded_vocab(1)
    fab = fabric_for(cl)
    # BF16 gradients: Megatron-Bridge's perf recipes set ddp.grad_reduce_in_fp32=False (2 bytes),
    # the same 2 bytes planner.cost.memory counts for the gradient buffer
    assert PROF.param("dp.grad_bytes", "hopper") == 2.0 == DP.GRAD_BYTES
    # megatron-core's buckets of max(40M, 1M x dp) parameters, each paying NCCL's ring latency over 16
    # ranks on 2 nodes (tuning.cc, by hand): 8.4 + 14 NVLink steps x 3.4 + 1 network step x 14 = 70.0 us
    lat = math.ceil(params / 40e6) * 70.0e-6
    assert DP.bucket_latency(sh["dp"], params) == pytest.approx((lat, lat))
    rs = fab.reduce_scatter(sh["dp"], params * 2.0) + lat
    ag = fab.all_gather(sh["dp"], params * DP.PARAM_BYTES) + lat
    assert stt.details["dp_raw_s"] == pytest.approx(rs + ag, rel=1e-9)
    assert sh["dp"].domains == 2 and sh["dp"].tier >= 0
    assert stt.details["dp_rs_s"] == pytest.approx(rs) and stt.details["dp_ag_s"] == pytest.approx(ag)
    ov = PROF.param("dp.overlap", "hopper")
    # exposed = max((1-o) RS, RS - t_bwd) + max((1-o) AG, AG - t_fwd), by hand
    t_b, t_f = stt.details["t_bwd_mb"], stt.details["t_fwd_mb"]
    hand = max((1 - ov) * rs, rs - t_b) + max((1 - ov) * ag, ag - t_f)
    assert stt.breakdown["dp_comm"] == pytest.approx(hand, rel=1e-9)
    assert t_b == pytest.approx(2 * t_f, rel=0.35)   # backward about twice the forward
    # a stack that reduces in FP32 (TorchTitan's FSDP2 default, MaxText) moves 4 bytes per gradient
    fp32 = step_time(LLAMA, cl, cfg, tr, 16, pl, PROF.with_values({"dp.grad_bytes": 4.0}), sh)
    assert fp32.details["dp_rs_s"] == pytest.approx(fab.reduce_scatter(sh["dp"], params * 4.0) + lat)
    assert fp32.details["dp_ag_s"] == pytest.approx(ag)
    assert load_profile("torchtitan").param("dp.grad_bytes") == 4.0


def test_optimizer_and_attention_terms_are_positive_and_small():
    cl = load_cluster("dgx-b200", gpus=8)
    tr = Training(seq_len=4096, global_batch=64, precision="mxfp8")
    p = predict(QWEN, cl, ParallelConfig(ep=8, mbs=4), tr)
    assert 0 < p.breakdown["optimizer"] < 0.05 * p.step_time_s
    assert p.breakdown["tp_comm"] == 0 and p.breakdown["cp_comm"] == 0 and p.breakdown["pp_bubble"] == 0
    assert p.breakdown["ep_a2a"] > 0


class _Scaled:
    """A fabric whose every collective is ``k`` times faster (more bandwidth, lower latency)."""

    def __init__(self, fab, k):
        self.fab, self.k = fab, k

    def __getattr__(self, name):
        f = getattr(self.fab, name)
        return lambda *a, **kw: f(*a, **kw) / self.k


CONFIGS = st.sampled_from([
    (DS, "gb300-nvl72", 256, dict(pp=2, vpp=8, ep=32), 4096, "mxfp8"),
    (DS, "dgx-h100", 256, dict(tp=2, pp=8, ep=32, etp=1), 4096, "bf16"),
    (QWEN, "dgx-h100", 16, dict(ep=16), 1024, "fp8"),
    (LLAMA, "gb200-nvl72", 64, dict(tp=4, pp=2, cp=2), 256, "fp8"),
    (LLAMA, "dgx-b200", 32, dict(fsdp=True, mbs=2), 256, "bf16"),
])


@settings(max_examples=20, deadline=None)
@given(case=CONFIGS, k=st.floats(1.0, 8.0))
def test_more_bandwidth_is_never_slower(case, k):
    import planner.cost.steptime as S

    model, preset, gpus, kw, gbs, prec = case
    cl = load_cluster(preset, gpus=gpus)
    tr = Training(seq_len=4096, global_batch=gbs, precision=prec)
    cfg = ParallelConfig(**kw)
    pl, sh = _setup(model, cl, cfg, tr)
    base = step_time(model, cl, cfg, tr, gpus, pl, PROF, sh).step_time_s
    orig = S.fabric_for
    try:
        S.fabric_for = lambda c: _Scaled(orig(c), k)
        fast = step_time(model, cl, cfg, tr, gpus, pl, PROF, sh).step_time_s
    finally:
        S.fabric_for = orig
    assert fast <= base * (1 + 1e-12)


@settings(max_examples=20, deadline=None)
@given(ep=st.sampled_from([8, 16, 32]), mbs=st.sampled_from([1, 2]), prec=st.sampled_from(["bf16", "mxfp8"]))
def test_ep_spanning_two_domains_is_never_faster(ep, mbs, prec):
    # the same layout (PP2, EP=ep, world 2*ep) inside one NVL72 rack (64 GPUs per rack) and with
    # every EP group split over two racks (ep/2 GPUs per rack): only the placement differs.
    cl = load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    tr = Training(seq_len=4096, global_batch=256, precision=prec)
    world = 2 * ep
    cfg = ParallelConfig(pp=2, vpp=4, ep=ep, mbs=mbs, dp=ep)
    within = make_placement(cl, cfg, world, gpus_per_domain=64)
    split = make_placement(cl, cfg, world, gpus_per_domain=ep // 2)
    assert group_shapes(cl, cfg, split)["ep"].domains == 2
    assert group_shapes(cl, cfg, within)["ep"].domains == 1
    a = predict(DS, cl, cfg, tr, placement=within)
    b = predict(DS, cl, cfg, tr, placement=split)
    assert b.breakdown["ep_a2a"] > a.breakdown["ep_a2a"]
    assert b.step_time_s >= a.step_time_s * (1 - 1e-12)


EFF_PARAMS = ["gemm.bf16", "gemm.fp8", "gemm.mxfp8", "gemm.nvfp4", "attn.eff", "tp.overlap", "ep.overlap",
              "dp.overlap", "pp.overlap", "cp.overlap", "mem.hbm_eff", "gpu.speed@blackwell-ultra",
              "gpu.speed@hopper"]


@settings(max_examples=30, deadline=None)
@given(case=CONFIGS, name=st.sampled_from(EFF_PARAMS), up=st.floats(1.0, 1.5))
def test_higher_efficiency_is_never_slower(case, name, up):
    model, preset, gpus, kw, gbs, prec = case
    cl = load_cluster(preset, gpus=gpus)
    tr = Training(seq_len=4096, global_batch=gbs, precision=prec)
    cfg = ParallelConfig(**kw)
    pl, sh = _setup(model, cl, cfg, tr)
    p0 = PROF.params[name]
    better = PROF.with_values({name: min(p0.max, p0.value * up)})
    t0 = step_time(model, cl, cfg, tr, gpus, pl, PROF, sh).step_time_s
    t1 = step_time(model, cl, cfg, tr, gpus, pl, better, sh).step_time_s
    assert t1 <= t0 * (1 + 1e-12)


def test_expert_balance_scales_expert_work_and_cross_domain_traffic():
    from types import SimpleNamespace

    cl = load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    tr = Training(seq_len=4096, global_batch=4096, precision="mxfp8")
    cfg = ParallelConfig(pp=2, vpp=8, ep=32)
    even = predict(DS, cl, cfg, tr)
    skew = predict(DS, cl, cfg, tr, expert_balance=SimpleNamespace(balance=1.5, cross_domain_fraction=0.0,
                                                                   remote_domains_per_token=0.0))
    assert skew.breakdown["imbalance"] > even.breakdown["imbalance"]
    assert skew.step_time_s > even.step_time_s
    # EP64 split over two racks: more cross-domain traffic than uniform costs more
    cfg64 = ParallelConfig(pp=2, vpp=8, ep=64, dp=64)
    split = make_placement(cl, cfg64, 128, gpus_per_domain=32)
    assert group_shapes(cl, cfg64, split)["ep"].domains == 2
    lo = predict(DS, cl, cfg64, tr, placement=split,
                 expert_balance=SimpleNamespace(balance=1.0, cross_domain_fraction=0.1, remote_domains_per_token=0.2))
    hi = predict(DS, cl, cfg64, tr, placement=split,
                 expert_balance=SimpleNamespace(balance=1.0, cross_domain_fraction=0.5, remote_domains_per_token=1.0))
    assert hi.breakdown["ep_a2a"] > lo.breakdown["ep_a2a"]


def test_recompute_costs_time():
    cl = load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    tr = Training(seq_len=4096, global_batch=4096, precision="mxfp8")
    base = predict(DS, cl, ParallelConfig(pp=2, vpp=8, ep=32), tr)
    sel = predict(DS, cl, ParallelConfig(pp=2, vpp=8, ep=32, recompute="mla_up_proj+moe_act"), tr)
    full = predict(DS, cl, ParallelConfig(pp=2, vpp=8, ep=32, recompute="full"), tr)
    assert base.step_time_s < sel.step_time_s < full.step_time_s
    # full recompute repeats the forward: about a third more compute, with the CUDA-graph regime held
    # fixed (Megatron refuses per-layer graphs with full recompute, so the default recipe runs it eagerly)
    eager = tr.model_copy(update={"cuda_graphs": False, "recipe": tr.recipe.model_copy(update={"cuda_graph_impl": "none"})})
    base_e = predict(DS, cl, ParallelConfig(pp=2, vpp=8, ep=32), eager)
    assert full.breakdown["compute"] == pytest.approx(predict(DS, cl, ParallelConfig(pp=2, vpp=8, ep=32, recompute="full"),
                                                              eager).breakdown["compute"])
    assert 1.2 < full.breakdown["compute"] / base_e.breakdown["compute"] < 1.4


def test_dense_gradients_are_reduced_over_data_times_context_parallel():
    # Megatron reduces dense gradients (and, with FSDP, gathers parameters) over the dp x cp ranks
    # that hold the same weights. CP8 with DP1 on one node: the group is all 8 GPUs, not one.
    model = planner.load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", gpus=8)
    tr = Training(seq_len=8192, global_batch=32, precision="bf16")
    cfg = ParallelConfig(tp=1, cp=8, mbs=1, fsdp=True)
    pl = make_placement(cluster, cfg, 8)
    shapes = group_shapes(cluster, cfg, pl)
    assert shapes["dp"].size == 1 and shapes["dp-cp"].size == 8
    p = predict(model, cluster, cfg, tr, placement=pl)
    assert p.breakdown["dp_comm"] > 0
    # the same exposure as a DP8 run of the same parameters over the same 8 GPUs
    fab = fabric_for(cluster)
    rs, ag = DP.dp_time(fab, shapes["dp-cp"], 8.03e9, grad_bytes=2.0)
    rs8, ag8 = DP.dp_time(fab, group_shapes(cluster, ParallelConfig(tp=1), make_placement(cluster, ParallelConfig(tp=1), 8))["dp"],
                          8.03e9, grad_bytes=2.0)
    assert (rs, ag) == pytest.approx((rs8, ag8))


# ---- host floor (planner/cost/terms/host.py) --------------------------------------------------
def test_host_time_by_hand():
    from planner.cost.terms import host as HOST

    # 12 launches per local expert and 150 for the rest of an eager layer, 25 us each (hardware.md s2.4)
    assert HOST.host_time("moe", 16, True, True) == pytest.approx(25e-6 * (12 * 16 + 150))
    assert HOST.host_time("moe", 16, (), True) == pytest.approx(25e-6 * (12 * 16 + 150))        # no graphs
    assert HOST.host_time("moe", 16, False, False) == 0.0                                   # full-iteration graph
    assert HOST.host_time("moe", 16, HOST.WHOLE_LAYER, False) == 0.0
    assert HOST.host_time("dense", 16, True, True) == pytest.approx(25e-6 * 150)
    # partial graphs: the default scope (attn, moe_router, moe_preprocess) leaves dispatch, permute,
    # combine and the shared expert (48 calls) and 3 modules x 2 replays; the router-only scope of the
    # Qwen3 HGX recipes also leaves the attention block (60)
    assert HOST.layer_calls("moe", ("attn", "moe_router", "moe_preprocess")) == 48 + 3 * 2
    assert HOST.layer_calls("moe", ("moe_router", "moe_preprocess")) == 60 + 48 + 2 * 2
    assert HOST.layer_calls("moe", ("attn", "moe")) == 2 * 2          # the whole MoE block in its graph
    assert HOST.layer_calls("dense", ("attn", "mlp")) == 2 * 2
    assert HOST.layer_calls("dense", ("attn", "moe_router", "moe_preprocess")) == 90 + 2   # a dense layer of a MoE model
    assert HOST.host_time("moe", 16, ("attn", "moe_router", "moe_preprocess"), True, 30.0) == pytest.approx(
        30e-6 * (12 * 16 + 54))
    assert HOST.host_exposed(3e-3, 5e-3) == 0.0 and HOST.host_exposed(5e-3, 3e-3) == pytest.approx(2e-3)


def test_recomputed_forward_is_launched_again_by_hand():
    """Full recompute re-runs the forward in the backward pass: the host launches the forward's third of the
    eager layer's 150 calls (50) and the experts' forward (4 per local expert) once more; a recomputed MoE
    block its block's (moe_router 24 + moe_preprocess 18 + rest 48 = 90, a third: 30) and the experts."""
    from planner.cost.terms import host as HOST

    eager = 25e-6 * (12 * 8 + 150)
    assert HOST.host_time("moe", 8, (), True, 25.0, "full") == pytest.approx(eager + 25e-6 * (50 + 4 * 8))
    assert HOST.host_time("moe", 8, (), True, 25.0, ("moe",)) == pytest.approx(eager + 25e-6 * (30 + 4 * 8))
    assert HOST.host_time("moe", 8, (), True, 25.0, ("core_attn",)) == pytest.approx(eager)
    assert HOST.host_time("dense", 8, (), True, 25.0, "full") == pytest.approx(25e-6 * (150 + 50))
    assert HOST.host_time("dense", 8, (), True, 25.0, ("moe",)) == pytest.approx(25e-6 * 150)
    # what a graph captures is replayed, not relaunched; a whole-layer graph launches nothing
    part = ("attn", "moe_router", "moe_preprocess")
    assert HOST.host_time("moe", 8, part, True, 25.0, "full") == pytest.approx(
        25e-6 * (12 * 8 + 54 + 54 / 3 + 4 * 8))
    assert HOST.host_time("moe", 8, HOST.WHOLE_LAYER, False, 25.0, "full") == 0.0


def test_host_regime_follows_the_recipe():
    from planner.config import Recipe
    from planner.cost.steptime import host_regime
    from planner.cost.terms import host as HOST

    m = planner.load_model("qwen3-30b-a3b")
    cfg = ParallelConfig(ep=8)
    base = dict(seq_len=4096, global_batch=64, precision="mxfp8")
    assert host_regime(m, cfg, Training(**base, recipe=Recipe(cuda_graph_impl="none"))) == ((), True)
    assert host_regime(m, cfg, Training(**base, cuda_graphs=False)) == ((), True)
    # the default partial graphs: experts launched, the rest of the MoE block too
    assert host_regime(m, cfg, Training(**base)) == (("attn", "moe_router", "moe_preprocess"), True)
    assert host_regime(m, cfg, Training(**base, recipe=Recipe(cuda_graph_modules=("moe_router", "moe_preprocess")))) \
        == (("moe_router", "moe_preprocess"), True)
    assert host_regime(m, cfg, Training(**base, recipe=Recipe(cuda_graph_impl="full_iteration",
                                                              cuda_graph_modules=()))) == (HOST.WHOLE_LAYER, False)
    assert host_regime(m, cfg, Training(**base, trainer="torchtitan", stack="torchtitan")) == (HOST.WHOLE_LAYER, False)


def test_cuda_graph_scope_column_prices_the_host_calls_it_leaves():
    # Qwen3-30B-A3B on 8 B200 at MBS 1, the 26.02 recipe: graphs of the router only, NCCL all-to-all:
    # the attention block stays on the host, so the layer is slower than with the default scope
    from planner.calibration.validate import row_case, predict_case
    from planner.errors import InputError

    row = dict(id="x", stack="megatron-26.04", model="qwen3-30b-a3b", gpu="B200", num_gpus="8", precision="mxfp8",
               seq_len="4096", gbs="512", mbs="1", tp="1", pp="1", vpp="1", cp="1", ep="8", etp="", fsdp="0",
               recompute="", dispatcher="alltoall")
    router = row_case(dict(row, cuda_graph_scope="moe_router+moe_preprocess"))
    assert router.training.recipe.cuda_graph_modules == ("moe_router", "moe_preprocess")
    default = row_case(row)
    assert predict_case(router).step_time_s > predict_case(default).step_time_s
    full = row_case(dict(row, cuda_graph_scope="full_iteration"))
    assert full.training.recipe.cuda_graph_impl == "full_iteration"
    assert predict_case(full).step_time_s < predict_case(default).step_time_s
    with pytest.raises(InputError, match="cuda_graph_scope"):
        row_case(dict(row, cuda_graph_scope="attn+mystery"))
    with pytest.raises(InputError, match="cuda_graphs is false"):
        row_case(dict(row, cuda_graph_scope="attn", cuda_graphs="false"))


def test_host_floor_binds_only_where_the_host_is_slower():
    # Qwen3-30B-A3B on 8 B200, EP8: 16 experts per GPU. At MBS 1 in an eager recipe a MoE layer's host
    # time (25 us x (12 x 16 + 150) = 8.55 ms) exceeds its GPU time, so every MoE layer costs at least
    # that; at MBS 8 the GPU work covers it and only the 25 us launch term remains.
    from planner.cost.terms import host as HOST

    m = planner.load_model("qwen3-30b-a3b")
    cl = load_cluster("dgx-b200", gpus=8)
    call_us = load_profile("megatron-26.08").param("host.launch_us")
    host = HOST.host_time("moe", 16, True, True, call_us)
    launch = load_profile("megatron-26.08").param("other.layer_us", "blackwell") * 1e-6
    eager = dict(seq_len=4096, global_batch=64, precision="mxfp8", cuda_graphs=False)
    small = predict(m, cl, ParallelConfig(ep=8, mbs=1), Training(**eager))
    assert small.details["t_microbatch_max"] >= m.num_layers * host
    assert small.breakdown["other"] > small.details["microbatches"] * m.num_layers * launch * 10
    big = predict(m, cl, ParallelConfig(ep=8, mbs=8), Training(**eager))
    assert big.breakdown["other"] == pytest.approx(big.details["microbatches"] * m.num_layers * launch, rel=1e-9)
    # graph-captured (the default recipe): the expert launches and the rest of the MoE block count,
    # still above the MBS-1 GPU work; the floor is what separates the two regimes at MBS 1
    graphs = predict(m, cl, ParallelConfig(ep=8, mbs=1), Training(seq_len=4096, global_batch=64, precision="mxfp8"))
    default = ("attn", "moe_router", "moe_preprocess")
    assert graphs.details["t_microbatch_max"] >= m.num_layers * HOST.host_time("moe", 16, default, True, call_us)
    assert graphs.step_time_s < small.step_time_s


def test_plan_program_prices_the_host_floor_as_predict_does():
    # a layout space where the floor binds (EP1: all 128 experts on every GPU, 38 ms of launches per
    # MoE layer): the solver's program (planner/search/program.py, tabulating steptime.kind_host_time) must equal it
    from planner.cost.terms import host as HOST
    from planner.search.plan import plan

    m = planner.load_model("qwen3-30b-a3b")
    cl = load_cluster("dgx-h100", gpus=8)
    tr = Training(seq_len=4096, global_batch=16, precision="bf16", cuda_graphs=False)
    res = plan(m, cl, tr, top=3, restrict=dict(tp=[1, 2], cp=[1], pp=[1, 2], vpp=[1], ep=[1, 2], mbs=[1],
                                              recompute=["full"], fsdp=[False]))
    assert res.plans
    for e in res.plans:
        assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)
        per_layer = HOST.host_time("moe", 128 / e.config.ep, True, True, load_profile("megatron-26.08").param("host.launch_us"))
        assert e.prediction.details["t_microbatch_max"] >= per_layer * m.num_layers / e.config.pp * 0.99


def test_dropless_sync_by_hand_and_in_the_program():
    # Qwen3-30B-A3B on 8 B200, EP8 (16 experts per GPU), graph-captured recipe: after the router's
    # host sync the host launches 4 x 16 + 8 = 72 kernels of the MoE forward while the GPU waits, until
    # the routed experts' forward covers them (terms/host.py sync_exposed); recomputing the MoE syncs twice
    from planner.cost.steptime import kind_sync_time, kind_time, efficiencies
    from planner.cost.terms import host as HOST
    from planner.search.plan import plan
    from topologies.gpus import get_gpu

    m = planner.load_model("qwen3-30b-a3b")
    prof = load_profile("megatron-26.08")
    call_us = prof.param("host.launch_us")
    eff = efficiencies(get_gpu("B200"), "mxfp8", prof, True)
    lt = kind_time(eff, m, ("moe", False), 4096, 2, 1, 1, 8, 1, True, ())
    assert HOST.sync_exposed(16, 1, 0.0, 25.0) == pytest.approx(72 * 25e-6)
    hand = max(0.0, 72 * call_us * 1e-6 - lt.expert / 3)
    assert hand > 0   # binds at MBS 2
    assert kind_sync_time(m, ("moe", False), 8, lt, True, (), call_us) == pytest.approx(hand)
    assert kind_sync_time(m, ("moe", False), 8, lt, False, (), call_us) == 0.0   # experts in a graph
    assert kind_sync_time(m, ("dense", False), 8, lt, True, (), call_us) == 0.0
    lt_moe = kind_time(eff, m, ("moe", False), 4096, 2, 1, 1, 8, 1, True, ("moe",))
    assert kind_sync_time(m, ("moe", False), 8, lt_moe, True, ("moe",), call_us) == pytest.approx(
        2 * max(0.0, 72 * call_us * 1e-6 - lt_moe.expert / 4))
    # the program tabulates the same function: its step time equals predict's where the sync binds
    cl = load_cluster("dgx-b200", gpus=8)
    tr = Training(seq_len=4096, global_batch=256, precision="mxfp8")
    res = plan(m, cl, tr, top=8, restrict=dict(tp=[1], cp=[1], pp=[1], vpp=[1], ep=[4, 8], mbs=[1, 2, 4, 8],
                                              recompute=["none"], fsdp=[False]))
    assert any(e.config.mbs == 2 and e.config.ep == 8 for e in res.plans)
    for e in res.plans:
        assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)


# ---- expert dispatch as the dispatchers move bytes (planner/cost/terms/expert_a2a.py) ------------
def test_dispatch_copies_by_hand():
    from planner.cost.terms import expert_a2a as EA
    from topologies.collectives import distinct_destinations

    ds = planner.load_model("deepseek-v3")
    R = distinct_destinations(256, 8, 8, 4, 8)
    # EP32 over 4 HGX nodes: RDMA once per remote node (22/7 nodes reached: a node holds 2 of the 8
    # groups and misses the 4 kept ones with probability C(6,4)/C(8,4) = 3/14; 3/4 of them remote),
    # NVLink forwarding to the reached ranks other than the entry GPU
    nvl, net = EA.copies(ds, 32, 8, 4, "flex-deepep")
    assert net == pytest.approx(22 / 7 * 3 / 4, rel=1e-12)
    assert nvl == pytest.approx(R * 7 / 8, rel=1e-12)
    # inside one NVLink domain (EP8, one node): once per reached rank but itself
    R8 = distinct_destinations(256, 8, 8, 4, 32)
    assert EA.copies(ds, 8, 8, 1, "flex-hybridep") == (pytest.approx(R8 * 7 / 8), 0.0)
    # NCCL all-to-all: one copy per token-expert pair; the fabric splits them over the links
    assert EA.copies(ds, 32, 8, 4, "alltoall") == (8.0, 0.0)
    # node-limited routing is what keeps the NIC copies low: without it a token reaches more nodes
    free = ds.model_copy(update={"n_group": 1, "topk_group": 1})
    assert EA.copies(free, 32, 8, 4, "flex-deepep")[1] > net * 1.1


def test_flex_dispatch_across_nodes_is_cheaper_than_the_nccl_all_to_all():
    from planner.cost.terms import expert_a2a as EA
    from topologies.collectives import GroupShape, fabric_for

    ds = planner.load_model("deepseek-v3")
    fab = fabric_for(load_cluster("dgx-b200", gpus=32))
    shape = GroupShape(32, 8, 4, 0)
    b = EA.dispatch_bytes(True, True)
    assert b == pytest.approx(1 + 4 / 128)   # FP8 and one FP32 scale per 128 elements
    flex = EA.a2a_time(fab, shape, ds, 4096, "flex-deepep", b)
    nccl = EA.a2a_time(fab, shape, ds, 4096, "alltoall", b)
    assert 0 < flex < nccl / 2
    # by hand: forward + backward of (dispatch + combine), each bound by its RDMA stream
    nvl, net = EA.copies(ds, 32, 8, 4, "flex-deepep")
    one = 4096 * 7168
    want = 2 * (fab.ep_dispatch(shape, one * nvl * b, one * net * b) + fab.ep_dispatch(shape, one * nvl * 2, one * net * 2))
    assert flex == pytest.approx(want, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1), st.floats(0, 0.98), st.floats(0, 2), st.floats(0, 0.5))
def test_sm_share_is_the_hidden_part_slowing_the_gemms(t, o, w, f):
    # the all-to-all's exposed time with the SMs it holds: what does not hide, x = exposed(t, o, w), plus
    # the compute slowed by f of the hidden seconds, x + (t - x) f -- the form steptime and the plan
    # program price as exposed(t, o (1 - f), (1 - f) w)
    from planner.cost.terms import expert_a2a as EA

    x = exposed(t, o, w)
    assert EA.a2a_exposed(t, o, w, f) == pytest.approx(x + (t - x) * f, abs=1e-12)
    assert EA.a2a_exposed(t, o, w, 0.0) == pytest.approx(x, abs=1e-15)
    assert x - 1e-12 <= EA.a2a_exposed(t, o, w, f) <= t + 1e-12
