"""MaxText (JAX/XLA): rules, emitter (overrides.yml, with the config's model in MaxText's keys: model_keys),
log parser. MaxText has no recipe knobs topoplan writes.

Parts (loaded on first use, :class:`planner.trainers.base.Trainer`): ``rules``, ``families``, ``emit``, ``logs``.
"""

from __future__ import annotations

from planner.trainers.base import Launch, Pricing, Search, Trainer, foreign_knob, no_layer_offload, no_optimizer_offload

NAME = "maxtext"


def refuse_recipe(recipe) -> str | None:
    if why := no_layer_offload(recipe, NAME):
        return why
    if why := no_optimizer_offload(recipe, NAME, "its optimizer_memory_host_offload keeps the optimizer state in "
                                   "host memory but runs the update on the accelerator, a different setting topoplan "
                                   "does not price"):
        return why
    if recipe.fp8_param_gather:
        return foreign_knob("fp8_param_gather", True, "Megatron", "--fp8-param-gather", NAME,
                            "it has no FP8 parameter gather")
    if recipe.torch_compile is not None:
        return foreign_knob("torch_compile", recipe.torch_compile, "TorchTitan", "model compile", NAME,
                            "XLA always compiles and fuses the step")
    if recipe.fp4_param_gather:
        return foreign_knob("fp4_param_gather", True, "Megatron", "--fp4-param-gather", NAME,
                            "it has no NVFP4 parameter gather")
    if recipe.fp8_recipe is not None:
        return foreign_knob("fp8_recipe", recipe.fp8_recipe, "Megatron", "--fp8-recipe", NAME,
                            "its FP8 quantization is set by MaxText's own quantization option")
    return None


TRAINER = Trainer(
    name=NAME, title="MaxText", default_stack="maxtext",
    knobs=(),
    # FP32 weights and gradients, sharded; XLA always fuses (its eager factor equals the fused one).
    pricing=Pricing(grad_bytes=4.0, master_weights=False, fusion="xla", host_floor=False, graph_buffers=False),
    # its mesh axes are orthogonal (no expert TP), it shards with FSDP, and every slice must be equal
    search=Search(selective_recompute=False, flex_dispatchers=False, expert_tp=False, fsdp=(True,),
                  equal_slices=True),
    emitters={"maxtext": "emit"},
    refuse_recipe=refuse_recipe,
    parts=("rules", "families", "emit", "logs"),
    launch={"maxtext": Launch(
        home=("MAXTEXT_TRAIN", "MaxText's train command up to its base config, e.g. "
                               "'python3 -m maxtext.trainers.pre_train.train /path/to/configs/base.yml'"),
        per_host=True, mock_data="dataset_type=synthetic",
        # MaxText's GPU initialisation (max_utils.initialize_jax_for_gpu)
        node_env='export JAX_COORDINATOR_IP="$MASTER_ADDR" JAX_COORDINATOR_PORT="$MASTER_PORT" NNODES NODE_RANK')},
)
