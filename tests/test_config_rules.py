"""ParallelConfig / Training validation and the trainer rules, against the rejections that
megatron-core 0.19.2 and torchtitan 0.3.0 produced on the cases recorded in
../shared/reference/trainers.md (sections 1.4 and 2.5)."""

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
    assert "kv_heads_div_tp" in names(violations(LLAMA70, cfg, T, 256))
    assert "kv_heads_div_tp" not in names(violations(LLAMA70, ParallelConfig(tp=8), T, 256))


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
