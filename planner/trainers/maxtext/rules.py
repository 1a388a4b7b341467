"""MaxText's own rules (its orthogonal mesh axes) and its effective recipe: MaxText has no recipe knob
topoplan writes, so every setting is off and XLA fuses the step.
"""

from __future__ import annotations

from planner.config import Recipe
from planner.rules import KV_HEADS_DIV_TP, SHARED_DEGREES, SHARED_HEADS_EXPERTS, SHARED_SCHEDULE, Rule
from planner.trainers import RECIPE_OFF
from planner.trainers.maxtext.model_keys import BLOCKS


def _maxtext_ep_in_dp(m, c, t, world):
    # MaxText's mesh axes are orthogonal: 'expert' sits beside data/fsdp (it cannot borrow TP ranks as
    # Megatron's folded expert grid does), so EP must divide the data-parallel degree.
    if c.ep > 1 and world % (c.tp * c.pp * c.cp) == 0:
        dp = c.dp_for(world)
        if dp % c.ep:
            return (f"maxtext: ici/dcn_expert_parallelism ({c.ep}) must divide the data-parallel degree ({dp}); "
                    "its expert axis cannot borrow tensor-parallel ranks")


def _maxtext_pipeline(m, c, t, world):
    # MaxText's pipeline (src/maxtext/configs/types.py:3565-3615 at AI-Hypercomputer/maxtext e591f30): stages x
    # num_pipeline_repeats x num_layers_per_pipeline_stage equal layers make pipeline_parallel_layers, the
    # micro-batches divide by the stages, and a DeepSeek decoder block pipelines only its MoE layers (its
    # first dense layers run outside the pipeline, layers/decoders.py:904-912), which the plan does not price
    if c.pp < 2:
        return None
    if c.pp_first is not None or c.pp_last is not None:
        return (f"maxtext: pipeline stages hold equal layer counts (num_layers_per_pipeline_stage); the uneven "
                f"split pp_first={c.pp_first} pp_last={c.pp_last} cannot be written")
    if BLOCKS.get(m.family) == "deepseek" and m.num_dense_layers:
        return (f"maxtext: its deepseek decoder block pipelines only the MoE layers and runs the first "
                f"{m.num_dense_layers} dense layers outside the pipeline; use pp 1 with MaxText")
    if m.num_layers % (c.pp * c.vpp):
        return (f"maxtext: the {m.num_layers} decoder layers do not split into pp*vpp ({c.pp}*{c.vpp}) equal chunks "
                "(num_layers_per_pipeline_stage)")
    if world % (c.tp * c.pp * c.cp) == 0:
        micro = t.global_batch // (c.mbs * c.dp_for(world))
        if micro % c.pp:
            return (f"maxtext: num_pipeline_microbatches ({micro}) must be divisible by the pipeline stages "
                    f"({c.pp})")
    return None


def effective_recipe(model, config, training) -> Recipe:
    """MaxText has no recipe knob topoplan writes: every setting off, no CUDA graphs (XLA fuses the step)."""
    return Recipe(**RECIPE_OFF)


RULES: tuple[Rule, ...] = SHARED_DEGREES + (KV_HEADS_DIV_TP,) + SHARED_HEADS_EXPERTS + SHARED_SCHEDULE + (
    Rule("maxtext_ep_divides_dp", _maxtext_ep_in_dp),
    Rule("maxtext_pipeline_layout", _maxtext_pipeline),
)
