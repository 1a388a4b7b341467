"""TorchTitan 0.3.0: rules, recipe, emitter (command.txt; 0.2's job.toml with its flavour module: toml02),
read-back, log parser.

Parts (loaded on first use, :class:`planner.trainers.base.Trainer`): ``recipe``, ``rules``, ``families``, ``emit``,
``readback``, ``logs``.
"""

from __future__ import annotations

from planner.trainers.base import Launch, Pricing, Search, Trainer, foreign_knob, no_layer_offload, no_optimizer_offload
from planner.trainers.torchtitan.recipe import FIELDS, OFF

NAME = "torchtitan"


def refuse_recipe(recipe) -> str | None:
    if why := no_layer_offload(recipe, NAME):
        return why
    if why := no_optimizer_offload(recipe, NAME, "its training.enable_cpu_offload (torchtitan 0.3.0 config/configs.py:61) "
                                   "is FSDP2's CPUOffloadPolicy, which moves the parameters and gradients to the host "
                                   "too, a different setting topoplan does not price"):
        return why
    if recipe.fp8_param_gather:
        return foreign_knob("fp8_param_gather", True, "Megatron", "--fp8-param-gather", NAME,
                            "torchao's enable_fsdp_float8_all_gather casts FP32 shards to FP8 for the FSDP all-gather "
                            "but keeps FP32 parameters, a different setting topoplan does not model")
    if recipe.fp4_param_gather:
        return foreign_knob("fp4_param_gather", True, "Megatron", "--fp4-param-gather", NAME,
                            "it has no NVFP4 parameter gather")
    if recipe.fp8_recipe is not None:
        return foreign_knob("fp8_recipe", recipe.fp8_recipe, "Megatron", "--fp8-recipe", NAME,
                            "torchao's Float8 recipes (tensorwise, rowwise) scale from the current tensor")
    return None


TRAINER = Trainer(
    name=NAME, title="TorchTitan", default_stack="torchtitan",
    # training.disable_cuda_graphs and compile.enable. Its MoE routers always carry the aux-loss-free
    # expert bias (MoE.Config.load_balance_coeff = 1e-3 in every flavour), with no switch to write.
    knobs=("cuda_graph_impl", "torch_compile"),
    # FP32 weights and gradients, sharded (FSDP2); torch.compile of the blocks fuses the elementwise ops.
    pricing=Pricing(grad_bytes=4.0, master_weights=False, fusion="torch_compile", host_floor=False,
                    graph_buffers=False),
    search=Search(selective_recompute=False, flex_dispatchers=False, expert_tp=True, fsdp=(True,),
                  equal_slices=False),
    emitters={"torchtitan": "emit"},
    refuse_recipe=refuse_recipe,
    parts=("recipe", "rules", "families", "emit", "readback", "logs"),
    recipe_fields=FIELDS, recipe_off=OFF,
    aliases={"titan": "torchtitan"},
    launch={"torchtitan": Launch()},   # a pip package: no installation to name
)
