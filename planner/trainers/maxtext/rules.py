"""MaxText's own rules (its orthogonal mesh axes) and its effective recipe: MaxText has no recipe knob
topoplan writes, so every setting is off and XLA fuses the step.
"""

from __future__ import annotations

from planner.config import Recipe
from planner.rules import KV_HEADS_DIV_TP, SHARED_DEGREES, SHARED_HEADS_EXPERTS, SHARED_SCHEDULE, Rule
from planner.trainers import RECIPE_OFF


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
    return Recipe(**RECIPE_OFF)


RULES: tuple[Rule, ...] = SHARED_DEGREES + (KV_HEADS_DIV_TP,) + SHARED_HEADS_EXPERTS + SHARED_SCHEDULE + (
    Rule("maxtext_ep_divides_dp", _maxtext_ep_in_dp),
)
