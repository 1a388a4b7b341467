"""MaxText's own rules (its orthogonal mesh axes) and its effective recipe: MaxText has no recipe knob
topoplan writes, so every setting is off and XLA fuses the step.
"""

from __future__ import annotations

from planner.config import Recipe
from planner.rules import SHARED_DEGREES, SHARED_SCHEDULE, Rule


def _maxtext_ep_in_dp(m, c, t, world):
    # MaxText's mesh axes are orthogonal: 'expert' sits beside data/fsdp (it cannot borrow TP ranks as
    # Megatron's folded expert grid does), so EP must divide the data-parallel degree.
    if c.ep > 1 and world % (c.tp * c.pp * c.cp) == 0:
        dp = c.dp_for(world)
        if dp % c.ep:
            return (f"maxtext: ici/dcn_expert_parallelism ({c.ep}) must divide the data-parallel degree ({dp}); "
                    "its expert axis cannot borrow tensor-parallel ranks")


def effective_recipe(model, config, training) -> Recipe:
    """MaxText has no recipe knob topoplan writes: every setting off, no CUDA graphs (XLA fuses the step)."""
    return Recipe(
        cuda_graph_impl="none", cuda_graph_modules=(), overlap_moe_expert_parallel_comm=False,
        delay_wgrad_compute=False, tp_comm_overlap=False, moe_permute_fusion=False, moe_router_fusion=False,
        cross_entropy_loss_fusion=False, moe_router_enable_expert_bias=False, fsdp_impl="megatron",
        cpu_offload_layers=None, fp8_param_gather=False, torch_compile=None, fp4_param_gather=False,
    )


RULES: tuple[Rule, ...] = SHARED_DEGREES + SHARED_SCHEDULE + (
    Rule("maxtext_ep_divides_dp", _maxtext_ep_in_dp),
)
