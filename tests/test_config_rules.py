"""ParallelConfig / Training validation and the trainer rules, against the rejections that
megatron-core 0.19.2 (``validate_args``, ``TransformerConfig``, ``initialize_model_parallel``) and torchtitan
0.3.0 (``ParallelDims``) produced on these cases when run on CPU (tests/test_emit_trainers.py runs them again)."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from planner.config import ParallelConfig, Training, normalize_recompute
from planner.errors import InputError
from planner.rules import check, violations

# DeepSeek-V3 as the rules see it (models.json): 61 layers, 128 heads (MLA: kv heads = heads), 256 experts.
DSV3 = SimpleNamespace(num_layers=61, num_attention_heads=128, num_kv_heads=128, num_experts=256, mtp_layers=1)
LLAMA70 = SimpleNamespace(num_layers=80, num_attention_heads=64, num_kv_heads=8, num_experts=0, mtp_layers=0)
T = Training(seq_len=4096, global_batch=4096, precision="mxfp8")


def names(v):
    return {x.rule for x in v}


def test_nvidia_256_h100_recipe_passes():
    # trainers.md 1.3: TP2 PP8 EP32 ETP1 on 256 H100, accepted by validate_args and initialize_model_parallel.
    cfg = ParallelConfig(tp=2, pp=8, ep=32, etp=1, mbs=1, recompute="full")
    assert violations(DSV3, cfg, T, 256) == []
    assert cfg.dp_for(256) == 16 and cfg.edp_for(256) == 1


def test_published_gb300_layout_passes():
    cfg = ParallelConfig(tp=1, pp=2, vpp=8, ep=32, mbs=1)
    assert violations(DSV3, cfg, T, 256) == []
    assert cfg.dp_for(256) == 128 and cfg.edp_for(256) == 4


@pytest.mark.parametrize(
    "cfg, rule",
    [
        (ParallelConfig(tp=2, pp=8, ep=48, etp=1), "experts_div_ep"),  # "Number of experts should be a multiple..."
        (ParallelConfig(tp=2, pp=8, cp=3, ep=32, etp=1), "world_div_model_parallel"),  # 256 % 48
        (ParallelConfig(tp=2, pp=8, ep=32, etp=2), "expert_grid_div_world"),  # 2*32*8 = 512 > 256
    ],
)
def test_megatron_rejections_from_trainers_md(cfg, rule):
    assert rule in names(violations(DSV3, cfg, T, 256))


def test_gqa_groups_must_divide_tp():
    cfg = ParallelConfig(tp=16)
    assert "kv_heads_div_tp" in names(violations(LLAMA70, cfg, T, 256, trainer="torchtitan"))
    assert "kv_heads_div_tp" not in names(violations(LLAMA70, ParallelConfig(tp=8), T, 256, trainer="torchtitan"))


def test_megatron_gqa_groups_multiple_or_divisor_of_tp():
    """megatron-core 0.19.2 (transformer_config.py) takes TP a multiple of the KV groups (each rank
    holds a replica of one group) as well as a divisor; 6 groups on TP4 is neither."""
    assert not names(violations(LLAMA70, ParallelConfig(tp=16), T, 256)) & {"kv_heads_tp_megatron"}
    six = SimpleNamespace(**{**vars(LLAMA70), "num_kv_heads": 6})
    assert "kv_heads_tp_megatron" in names(violations(six, ParallelConfig(tp=4), T, 256))
    assert "kv_heads_tp_megatron" not in names(violations(six, ParallelConfig(tp=2), T, 256))


def test_seq_must_divide_by_2cp():
    t = Training(seq_len=4100, global_batch=64)
    assert "seq_div_2cp" in names(violations(LLAMA70, ParallelConfig(cp=4), t, 64))


def test_gbs_divisibility_uses_derived_dp():
    # 256 GPUs, TP1 PP2 -> DP128; GBS 4096 % (MBS 2 * 128) == 0 but GBS 4000 is not.
    assert "gbs_div_mbs_dp" in names(violations(DSV3, ParallelConfig(pp=2, vpp=8, ep=32, mbs=2),
                                                Training(global_batch=4000), 256))


def test_torchtitan_ep_must_divide_dp_shard_cp_tp():
    # trainers.md 2.5: pp8, 256 GPUs -> dp_shard 32; ep=64 does not divide 32*1*1.
    cfg = ParallelConfig(pp=8, ep=64)
    assert "torchtitan_ep_divides" in names(violations(DSV3, cfg, T, 256, trainer="torchtitan"))
    assert "torchtitan_ep_divides" not in names(violations(DSV3, ParallelConfig(pp=8, ep=32), T, 256,
                                                           trainer="torchtitan"))


def test_check_raises_one_line_input_error():
    with pytest.raises(InputError) as e:
        check(DSV3, ParallelConfig(ep=48), T, 256)
    assert "\n" not in str(e.value) and "expert" in str(e.value)


def test_vpp_needs_pp():
    with pytest.raises(ValidationError):
        ParallelConfig(pp=1, vpp=2)


def test_recompute_normalisation():
    assert normalize_recompute("moe_act, mla_up_proj") == "mla_up_proj+moe_act"
    assert normalize_recompute("selective") == "core_attn"
    assert ParallelConfig(recompute="FULL").recompute == "full"
    with pytest.raises(ValidationError):
        ParallelConfig(recompute="everything")


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4, 8, 16]), cp=st.sampled_from([1, 2, 4]),
       ep=st.sampled_from([1, 2, 4, 8, 16, 32, 64]), nodes=st.integers(1, 64))
def test_accepted_layouts_tile_the_world(tp, pp, cp, ep, nodes):
    """Whenever the Megatron rules accept a layout, both grids tile the world exactly."""
    world = 8 * nodes
    cfg = ParallelConfig(tp=tp, pp=pp, cp=cp, ep=ep, etp=1)
    t = Training(seq_len=4096, global_batch=world * 64)
    if not violations(DSV3, cfg, t, world):
        assert cfg.tp * cfg.cp * cfg.pp * cfg.dp_for(world) == world
        assert cfg.etp_eff * cfg.ep * cfg.pp * cfg.edp_for(world) == world
        assert DSV3.num_experts % ep == 0


def test_torchtitan_experts_run_without_tensor_parallel():
    # torchtitan 0.3.0 has no ETP: EP borrows TP ranks, so TP2 EP8 means experts at ETP 1.
    assert "torchtitan_no_etp" in names(violations(DSV3, ParallelConfig(tp=2, pp=8, ep=8), T, 256,
                                                   trainer="torchtitan"))
    assert "torchtitan_no_etp" not in names(violations(DSV3, ParallelConfig(tp=2, pp=8, ep=8, etp=1), T, 256,
                                                       trainer="torchtitan"))


def test_interleaved_schedule_needs_pp_microbatch_groups():
    # Issue 11: DeepSeek-V3 PP6 VPP8 CP2 TP8 on 768 GPUs at GBS 8 -> DP8, M = 1 < PP6: megatron-core's
    # interleaved schedule raises "should range in [PP=6 , M=1]" at the first step.
    cfg = ParallelConfig(tp=8, pp=6, vpp=8, cp=2, ep=128, etp=1, mbs=1)
    v = violations(DSV3, cfg, Training(global_batch=8), 768)
    assert names(v) == {"megatron_interleaved_microbatches"} and "[PP=6 , M=1]" in v[0].message
    # M = 48: a multiple of PP6, accepted; M = 12 * 6 + 3 = 75 leaves a last group of 3 < PP: refused
    assert violations(DSV3, cfg, Training(global_batch=8 * 48), 768) == []
    assert "remainder" in violations(DSV3, cfg, Training(global_batch=8 * 75), 768)[0].message
    # the plain 1F1B schedule runs any M >= 1 in megatron-core; torchtitan's 1F1B needs M >= PP
    plain = cfg.model_copy(update={"vpp": 1})
    assert violations(DSV3, plain, Training(global_batch=8), 768) == []
    assert "torchtitan_pipeline_microbatches" in names(violations(DSV3, plain, Training(global_batch=8), 768,
                                                                  trainer="torchtitan"))


# --- recipe settings (issue 11 item 1): megatron-core 0.19.2's rules as named predicates --------

from planner.config import Recipe  # noqa: E402
from planner.rules import effective_recipe  # noqa: E402
from planner.trainers.megatron.rules import RECIPE_RULES  # noqa: E402


def _req(**kw) -> Training:
    return T.model_copy(update={"recipe": Recipe(**kw)})


def _model(name):
    from planner.model.spec import load_model

    return load_model(name)


@pytest.mark.parametrize("name, cfg, recipe, rule", [
    # TransformerConfig: "full recompute is only supported with full iteration CUDA graph."
    ("deepseek-v3", ParallelConfig(pp=2, vpp=8, ep=32, recompute="full"), dict(cuda_graph_impl="transformer_engine"),
     "cuda_graphs_vs_recompute"),
    # "moe cuda graph is only supported with drop-padding MoE." (topoplan emits dropless MoE)
    ("deepseek-v3", ParallelConfig(pp=2, vpp=8, ep=32), dict(cuda_graph_modules=("attn", "moe")), "cuda_graph_modules"),
    # "moe recompute is not supported with moe_router CUDA graph with: --cuda-graph-impl transformer_engine."
    ("deepseek-v3", ParallelConfig(pp=2, vpp=8, ep=32, recompute="moe"),
     dict(cuda_graph_modules=("attn", "moe_router", "moe_preprocess")), "cuda_graph_modules"),
    # "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified ..."
    ("deepseek-v3", ParallelConfig(pp=4, ep=32), dict(overlap_moe_expert_parallel_comm=True), "moe_a2a_overlap_layout"),
    # "disable full recomputation when enabling overlap_moe_expert_parallel_comm"
    ("deepseek-v3", ParallelConfig(pp=2, vpp=8, ep=32, recompute="full"),
     dict(overlap_moe_expert_parallel_comm=True, cuda_graph_impl="none"), "moe_a2a_overlap_layout"),
    # "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute"
    ("deepseek-v3", ParallelConfig(pp=2, vpp=8, ep=32), dict(overlap_moe_expert_parallel_comm=False,
                                                            delay_wgrad_compute=True), "delay_wgrad_needs_a2a_overlap"),
    # validate_args: "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled"
    ("llama3-8b", ParallelConfig(tp=1, pp=1), dict(tp_comm_overlap=True), "tp_comm_overlap_needs_sp"),
    # "Expert bias for aux-loss-free routing only supports 'sigmoid' and 'sqrtsoftplus' score functions."
    ("qwen3-30b-a3b", ParallelConfig(ep=8), dict(moe_router_enable_expert_bias=True), "expert_bias_needs_sigmoid_router"),
    # "--use-torch-fsdp2 is not supported with pipeline parallelism"
    ("llama3-8b", ParallelConfig(pp=2, fsdp=True), dict(fsdp_impl="torch"), "torch_fsdp2_layout"),
])
def test_required_recipe_settings_break_megatron_rules(name, cfg, recipe, rule):
    m = _model(name)
    world = 256 if m.num_experts else 8 * cfg.model_parallel
    tr = _req(**recipe)
    assert rule in names(violations(m, cfg, tr, world))
    # auto (the default) never refuses: the setting is switched off for this layout instead
    assert not {r for r in names(violations(m, cfg, T, world)) if r in {r.name for r in RECIPE_RULES}}


def test_defaults_follow_the_trainer_and_the_model():
    assert Training(global_batch=8, trainer="torchtitan").stack == "torchtitan"
    assert Training(global_batch=8, trainer="maxtext").stack == "maxtext"
    assert Training(global_batch=8).stack == "megatron-26.08"
    assert Training(global_batch=8, cuda_graphs=False).recipe.cuda_graph_impl == "none"
    assert Training(global_batch=8, recipe={"cuda_graph_impl": "none"}).cuda_graphs is False
    with pytest.raises(ValidationError, match="contradicts"):
        Training(global_batch=8, cuda_graphs=False, recipe={"cuda_graph_impl": "transformer_engine"})
    ds, qwen, llama = _model("deepseek-v3"), _model("qwen3-30b-a3b"), _model("llama3-8b")
    e = effective_recipe(ds, ParallelConfig(pp=2, vpp=8, ep=32, dispatcher="flex-hybridep"), T)
    # NVIDIA's DeepSeek-V3 perf recipes: TE graphs over attn + moe_router + moe_preprocess, the 1F1B
    # all-to-all overlap with delayed wgrad, fused permute/router/loss; noaux_tc routing: expert bias
    assert (e.cuda_graph_impl, e.cuda_graph_modules) == ("transformer_engine", ("attn", "moe_router", "moe_preprocess"))
    assert e.overlap_moe_expert_parallel_comm and e.delay_wgrad_compute and e.moe_router_enable_expert_bias
    assert not e.tp_comm_overlap   # TP = 1
    assert not effective_recipe(qwen, ParallelConfig(ep=8), T).moe_router_enable_expert_bias
    d = effective_recipe(llama, ParallelConfig(tp=2), T)
    assert d.cuda_graph_modules == ("attn", "mlp") and d.tp_comm_overlap and not d.moe_permute_fusion
    # TorchTitan: graphs only without PP and EP; the Megatron-only knobs are off
    tt = T.model_copy(update={"trainer": "torchtitan"})
    assert effective_recipe(llama, ParallelConfig(pp=2), tt).cuda_graph_impl == "none"
    assert effective_recipe(llama, ParallelConfig(tp=2), tt).tp_comm_overlap is False


LAYOUTS = st.builds(
    lambda tp, pp, vpp, ep, rc, disp, fsdp: ParallelConfig(tp=tp, pp=pp, vpp=vpp if pp > 1 else 1, ep=ep, recompute=rc,
                                                           dispatcher=disp, fsdp=fsdp),
    st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 8, 32]),
    st.sampled_from(["none", "core_attn", "moe", "moe_act", "full", "mla_up_proj+moe_act"]),
    st.sampled_from(["alltoall", "allgather", "flex-hybridep"]), st.booleans())
RECIPES = st.fixed_dictionaries({}, optional={
    "cuda_graph_impl": st.sampled_from(["none", "transformer_engine", "local", "full_iteration"]),
    "cuda_graph_modules": st.sampled_from([(), ("attn",), ("attn", "moe_router", "moe_preprocess"), ("attn", "mlp")]),
    "overlap_moe_expert_parallel_comm": st.sampled_from([None, False]),
    "delay_wgrad_compute": st.sampled_from([None, False]),
    "tp_comm_overlap": st.sampled_from([None, False]),
    "moe_permute_fusion": st.booleans(),
    "moe_router_enable_expert_bias": st.sampled_from([None, False]),
})


@settings(max_examples=150, deadline=None)
@given(cfg=LAYOUTS, recipe=RECIPES, name=st.sampled_from(["deepseek-v3", "qwen3-30b-a3b", "llama3-8b", "gpt-oss-20b"]),
       trainer=st.sampled_from(["megatron", "torchtitan", "maxtext"]))
def test_effective_recipe_is_idempotent_and_never_breaks_a_recipe_rule(cfg, recipe, name, trainer):
    m = _model(name)
    if not m.num_experts:
        cfg = cfg.model_copy(update={"ep": 1})
    tr = T.model_copy(update={"trainer": trainer, "recipe": Recipe(**recipe)})
    world = cfg.model_parallel * 8
    recipe_rules = {r.name for r in RECIPE_RULES}
    given_broken = names(violations(m, cfg, tr, world)) & recipe_rules
    e = effective_recipe(m, cfg, tr)
    fixed = tr.model_copy(update={"recipe": e})
    assert effective_recipe(m, cfg, fixed) == e                          # idempotent: files read back price the same
    # switched-on settings are legal for the layout unless the user forced an illegal graph setting
    forced = {"cuda_graphs_vs_recompute", "cuda_graph_modules"} & given_broken
    assert names(violations(m, cfg, fixed, world)) & recipe_rules <= forced | (
        {"torch_fsdp2_layout"} & given_broken)
    if e.overlap_moe_expert_parallel_comm:   # the megatron-core conditions, restated
        assert trainer == "megatron" and cfg.ep > 1 and cfg.recompute != "full" and "moe" not in cfg.recompute_modules
        assert cfg.pp == 1 or cfg.vpp > 1
        assert cfg.dispatcher in ("alltoall", "flex-hybridep")
    if e.delay_wgrad_compute:
        assert e.overlap_moe_expert_parallel_comm
    if e.tp_comm_overlap:
        assert cfg.tp > 1 and trainer == "megatron"


@settings(max_examples=8, deadline=None)
@given(recipe=st.fixed_dictionaries({}, optional={
    "cuda_graph_impl": st.sampled_from(["transformer_engine", "none"]),
    "overlap_moe_expert_parallel_comm": st.sampled_from([True, False]),
    "delay_wgrad_compute": st.just(True), "tp_comm_overlap": st.just(True),
    "fsdp_impl": st.just("torch")}), data=st.data())
def test_recipe_rule_tables_equal_the_rules_for_required_settings(recipe, data):
    # the search's tables (planner.search.space.RULE_VARS) admit exactly the layouts the rules accept
    # when the user requires settings, so the search never combines what Megatron refuses
    from planner.search.space import build_space, rule_tables
    from space_layouts import allowed, drawn_layouts

    m = _model("qwen3-30b-a3b")
    tr = Training(seq_len=4096, global_batch=64, precision="mxfp8", recipe=Recipe(**recipe))
    space = build_space(m, tr, 16, [8, 8], trainer="megatron", dispatchers=("alltoall", "flex-hybridep"))
    tables = rule_tables(space, m, tr)
    for idx, cfg, world, t in drawn_layouts(space, tr, data, 60):
        assert allowed(tables, idx) == (not violations(m, cfg, t, world)), (cfg, violations(m, cfg, t, world))
